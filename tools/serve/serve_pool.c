// SPDX-License-Identifier: MIT
/*
 * The conversations kvmem serve holds open (the engine's thread alone
 * opens and closes them): each a workspace (its pager and page source) and
 * a session with a view on the backend. Up to --max-open stay open; the
 * least recently used idle one is closed to make room, and one idle longer
 * than --idle-close is closed anyway, so its view leaves the device and its
 * host pool is given back. A closed conversation comes back by adopting its
 * stored session state (kvmem_workspace_adopt): its history is never
 * prefilled again.
 *
 * Before that, an open conversation idle --idle-release seconds gives its
 * view up (kvmem_session_release_view: the view's memory, host or device,
 * and the session's forward buffers; its pages stay in the shared pool and
 * on disk), and so do the least recently used idle ones while more than
 * --max-views would hold one. Its next turn lays the view out again from
 * the pages, slot for slot (kvmem_session_restore_view), and goes on bit
 * for bit as if it had kept it. A reopened conversation comes back the same
 * way: its state adopted with the view given up, laid out by its turn.
 */
#ifndef KVMEM_NO_SERVE
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvmem/backend.h"
#include "kvmem/kvmem.h"
#include "serve_int.h"
#include "util/fs.h"

int64_t pool_count_dirs(const struct serve *sv)
{
	char dir[4200];
	DIR *d;
	struct dirent *e;
	int64_t n = 0;

	snprintf(dir, sizeof(dir), "%s/conversations", sv->data_dir);
	d = opendir(dir);
	if (!d)
		return 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static void pager_add(kvmem_pager_stats *a, const kvmem_pager_stats *b)
{
#define ADD(name, what) a->name += b->name;
	KVMEM_PAGER_STATS(ADD)
#undef ADD
}

void pool_close(struct serve *sv, struct conv *c)
{
	kvmem_pager_stats st;

	pthread_mutex_lock(&sv->mu);
	for (struct conv **p = &sv->convs; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			sv->n_open--;
			break;
		}
	if (c->ws) {
		kvmem_pager_stats_get(kvmem_workspace_pager(c->ws), &st);
		pager_add(&sv->closed, &st);
	}
	sv->c.views_away -= c->view_away;
	pthread_mutex_unlock(&sv->mu);
	kvmem_session_free(c->s);
	if (c->ws && kvmem_workspace_close(c->ws) < 0 && !sv->cfg.quiet)
		fprintf(stderr, "%s: conversation %s: %s\n", SERVE_WHO, c->id, kvmem_last_error());
	conv_free_record(c);
	free(c);
}

void pool_close_all(struct serve *sv)
{
	while (sv->convs)
		pool_close(sv, sv->convs);
}

void pool_idle(struct serve *sv)
{
	double now = serve_now();

	pool_views(sv, 0);
	if (!sv->cfg.idle_close)
		return;
	for (struct conv *c = sv->convs, *next; c; c = next) {
		next = c->next;
		if (c->busy || now - c->last_used < sv->cfg.idle_close)
			continue;
		pool_close(sv, c);
		pthread_mutex_lock(&sv->mu);
		sv->c.idle_closes++;
		pthread_mutex_unlock(&sv->mu);
	}
}

/* c gives its view up; a session that cannot (broken) is closed: it
 * reopens at its last commit. */
static void release_view(struct serve *sv, struct conv *c)
{
	if (kvmem_session_release_view(c->s)) {
		if (!sv->cfg.quiet)
			fprintf(stderr, "%s: conversation %s: %s; closed\n", SERVE_WHO, c->id,
				kvmem_last_error());
		pool_close(sv, c);
		return;
	}
	c->view_away = 1;
	pthread_mutex_lock(&sv->mu);
	sv->c.view_releases++;
	sv->c.views_away++;
	sv->c.device_bytes = kvmem_backend_mem_used(sv->be);	/* what left the device */
	pthread_mutex_unlock(&sv->mu);
}

/* Every idle conversation's view given up when it has been idle `idle_for`
 * seconds or more (0: every idle one). How many were. */
static int release_idle(struct serve *sv, double idle_for)
{
	const double now = serve_now();
	int released = 0;

	for (struct conv *c = sv->convs, *next; c; c = next) {
		next = c->next;
		if (!c->busy && !c->view_away && now - c->last_used >= idle_for) {
			release_view(sv, c);
			released++;
		}
	}
	return released;
}

/* glibc keeps what a view freed in the engine thread's arena: without this
 * an idle 1.2K-token conversation whose view was given up still held 7.75
 * MB resident (0.55-1.1 MB with it; test_serve_memory.sh). */
static void trim(int released)
{
#ifdef __GLIBC__
	if (released)
		malloc_trim(0);
#endif
}

void pool_views(struct serve *sv, int extra)
{
	const double after = sv->cfg.idle_release;
	int64_t held = 0;
	int released = after > 0 ? release_idle(sv, after) : 0;

	for (struct conv *c = sv->convs; c; c = c->next)
		held += !c->view_away;
	while (held + extra > sv->cfg.max_views) {
		struct conv *lru = NULL;

		for (struct conv *x = sv->convs; x; x = x->next)
			if (!x->busy && !x->view_away && (!lru || x->last_used < lru->last_used))
				lru = x;
		if (!lru)
			break;
		release_view(sv, lru);
		released = 1;
		held--;
	}
	trim(released);
}

int pool_views_idle(struct serve *sv)
{
	int released = release_idle(sv, 0);

	trim(released);
	return released;
}

int pool_view_back_begin(struct serve *sv, struct conv *c)
{
	pool_views(sv, c->view_away);	/* room for c's under --max-views */
	c->restore_s = 0;
	return c->view_away;
}

int pool_view_back_step(struct serve *sv, struct conv *c)
{
	const int layers = sv->m->cfg.n_layers;
	double t0 = serve_now();
	int64_t n;
	int rc;

	/* Slices until --view-slice is spent, at least one. */
	do
		rc = kvmem_session_restore_view_step(c->s, (layers + 7) / 8);
	while (rc == 1 && serve_now() - t0 < sv->cfg.view_slice_ms / 1e3);
	c->restore_s += serve_now() - t0;
	n = rc ? 0 : kvmem_session_view_len(c->s);
	c->view_away = rc != 0;
	pthread_mutex_lock(&sv->mu);
	sv->c.view_restore_steps++;
	if (!rc) {
		sv->c.view_restores++;
		sv->c.view_restore_tokens += (uint64_t)n;
		sv->c.view_restore_s += c->restore_s;
		sv->c.views_away--;
	}
	pthread_mutex_unlock(&sv->mu);
	return rc < 0 ? -1 : rc;
}

/* Room for one more: close the least recently used idle conversation. */
static void make_room(struct serve *sv)
{
	while (sv->n_open >= sv->cfg.max_open) {
		struct conv *lru = NULL;

		for (struct conv *x = sv->convs; x; x = x->next)
			if (!x->busy && (!lru || x->last_used < lru->last_used))
				lru = x;
		if (!lru)
			break;
		pool_close(sv, lru);
		pthread_mutex_lock(&sv->mu);
		sv->c.evictions++;
		pthread_mutex_unlock(&sv->mu);
	}
}

/* The server's pool, unless the workspace in dir was written with pages
 * of another size (another dtype): then it gets a pool of its own. */
static kvmem_pager_pool *shared_pool_for(const struct serve *sv, const char *dir)
{
	kvmem_workspace_info wi;

	if (!sv->pool)
		return NULL;
	if (kvmem_workspace_info_read(dir, &wi) == 0 &&
	    kvmem_page_stride(&wi.geom) != kvmem_page_stride(&sv->pool_geom))
		return NULL;
	return sv->pool;
}

static struct conv *find(struct serve *sv, const char *id)
{
	for (struct conv *c = sv->convs; c; c = c->next)
		if (!strcmp(c->id, id))
			return c;
	return NULL;
}

struct conv *pool_get(struct serve *sv, struct job *j)
{
	const struct serve_cfg *cfg = &sv->cfg;
	struct conv *c = find(sv, j->conv);
	char ws[4300];
	struct stat st;
	kvmem_session_opts so;
	kvmem_workspace_opts wo = { 0 };
	int r;

	if (c)
		return c;
	c = calloc(1, sizeof(*c));
	if (!c) {
		job_fail(j, 500, "server_error", "out of memory");
		return NULL;
	}
	c->kind = -1;
	snprintf(c->id, sizeof(c->id), "%s", j->conv);
	c->shared = cfg->store != NULL;
	if (c->shared)
		snprintf(c->dir, sizeof(c->dir), "%s/conv.%s", cfg->store, j->conv);
	else
		snprintf(c->dir, sizeof(c->dir), "%s/conversations/%s", sv->data_dir, j->conv);
	/* A pool's conversations are not counted here (the cluster holds
	 * them, other servers make them too). */
	if (!c->shared && stat(c->dir, &st) && pool_count_dirs(sv) >= cfg->max_conversations) {
		free(c);
		job_fail(j, 429, "too_many_conversations", "the server holds %lld conversations, its "
			 "limit (--max-conversations): conversation '%s' cannot be created (DELETE "
			 "/v1/conversations/ID removes one)", (long long)cfg->max_conversations, j->conv);
		return NULL;
	}
	make_room(sv);
	snprintf(ws, sizeof(ws), c->shared ? "%s" : "%s/ws", c->dir);
	wo.block = cfg->block;
	wo.host_cap = cfg->host_cap;
	wo.dtype = cfg->kv_dtype;	/* fp8: new ones fp8, the others refused (ESTALE) */
	wo.pool = shared_pool_for(sv, ws);
	if ((!c->shared && kvmem_mkdir_p(c->dir)) || kvmem_workspace_open(ws, sv->m, &wo, &c->ws) < 0)
		goto fail;
	kvmem_session_opts_default(&so);
	so.block = cfg->block;
	so.budget = cfg->budget;
	so.chunk = cfg->chunk;
	so.policy = cfg->policy;
	so.source = kvmem_workspace_source(c->ws);
	if (!(c->s = kvmem_session_create(sv->be, &so)))
		goto fail;
	/* A stored history's view is not laid out here, in one go, while
	 * every other stream waits: the session adopts its state with the
	 * view given up, and the turn lays it out a few layers a round
	 * (PH_RESTORE), as for a view given up when idle. A fresh selection
	 * (no usable state) still lays its view out here. */
	if (kvmem_workspace_tokens(c->ws) && kvmem_session_release_view(c->s))
		goto fail;
	r = kvmem_workspace_adopt(c->ws, c->s);
	if (r < 0)
		goto fail;
	if (kvmem_workspace_tokens(c->ws)) {
		c->restored = 1;
		c->view_away = kvmem_session_view_released(c->s);
		pthread_mutex_lock(&sv->mu);
		sv->c.restores++;
		sv->c.fresh_views += r == 1;
		sv->c.views_away += c->view_away;
		pthread_mutex_unlock(&sv->mu);
		if (r == 1)
			fprintf(stderr, "%s: conversation %s: the session state was not restored (%s); "
				"a fresh selection laid out the view\n", SERVE_WHO, c->id,
				kvmem_last_error());
	}
	if (conv_load(c, kvmem_workspace_tokens(c->ws)))
		goto fail;
	c->last_used = serve_now();
	pthread_mutex_lock(&sv->mu);
	c->next = sv->convs;
	sv->convs = c;
	sv->n_open++;
	pthread_mutex_unlock(&sv->mu);
	return c;
fail:
	/* Another server of a shared store writes it now (a turn at a time). */
	if (kvmem_last_errno() == EBUSY)
		job_fail(j, 409, "conversation_locked", "conversation '%s' is in use elsewhere: %s",
			 j->conv, kvmem_last_error());
	/* A conversation this server cannot open: another model's, or fp8
	 * against --kv-dtype (the message names both). */
	else if (kvmem_last_errno() == ESTALE)
		job_fail(j, 409, "conversation_incompatible", "conversation '%s' (%s): %s", j->conv,
			 c->dir, kvmem_last_error());
	else if (kvmem_last_errno() == ENOSPC || kvmem_last_errno() == EDQUOT)
		job_fail(j, 507, "insufficient_storage", "conversation '%s' (%s): %s", j->conv,
			 c->dir, kvmem_last_error());
	else
		job_fail(j, 500, "conversation_unavailable", "conversation '%s' (%s): %s", j->conv,
			 c->dir, kvmem_last_error());
	pthread_mutex_lock(&sv->mu);
	sv->c.views_away -= c->view_away;
	pthread_mutex_unlock(&sv->mu);
	kvmem_session_free(c->s);
	if (c->ws)
		kvmem_workspace_close(c->ws);
	conv_free_record(c);
	free(c);
	return NULL;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *f)
{
	(void)st;
	(void)f;
	return (flag == FTW_DP ? rmdir(path) : unlink(path)) ? -1 : 0;
}

void pool_delete(struct serve *sv, struct job *j)
{
	struct conv *c = find(sv, j->conv);
	char dir[4200];
	struct stat st;

	if (c)
		pool_close(sv, c);
	snprintf(dir, sizeof(dir), "%s/conversations/%s", sv->data_dir, j->conv);
	if (lstat(dir, &st)) {
		job_fail(j, 404, "conversation_not_found", "no conversation '%s'", j->conv);
		return;
	}
	if (nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS)) {
		job_fail(j, 500, "server_error", "conversation '%s': cannot remove %s: %s", j->conv,
			 dir, strerror(errno));
		return;
	}
	pthread_mutex_lock(&sv->mu);
	sv->c.deletes++;
	j->done = 1;
	j->t_end = serve_now();
	serve_news(j);
	pthread_mutex_unlock(&sv->mu);
}
#endif
