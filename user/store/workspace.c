// SPDX-License-Identifier: MIT
/*
 * A session's history in a workspace directory: the pager, the page source
 * over it, the stored token ids, and the session state each commit carries.
 * Public API only: the pager and the session know nothing of each other.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/store.h"

struct kvmem_workspace {
	kvmem_pager *p;
	kvmem_page_source src;
	int32_t *ids;		/* the history's token ids when opened */
	int64_t n_ids;
	uint64_t step;		/* commits made: the pager's step counter */
};

void kvmem_page_geom_model(kvmem_page_geom *g, const kvmem_model *m, int block)
{
	memset(g, 0, sizeof(*g));
	g->fingerprint = m->fingerprint ? m->fingerprint : kvmem_config_fingerprint(&m->cfg);
	g->n_layers = m->cfg.n_layers;
	g->n_heads = m->cfg.n_heads;
	g->n_kv_heads = m->cfg.n_kv_heads;
	g->head_dim = m->cfg.head_dim;
	g->block_tokens = block;
	g->dtype = KVMEM_DTYPE_F32;
}

int kvmem_workspace_open(const char *dir, const kvmem_model *m, const kvmem_workspace_opts *o,
			 kvmem_workspace **out)
{
	kvmem_workspace_opts def = { 0 };
	kvmem_pager_opts po;
	kvmem_page_geom g;
	kvmem_workspace *w;
	int rc;

	*out = NULL;
	if (!o)
		o = &def;
	/* Refuse a reader that cannot be had before the directory is made. */
	if (o->pager && strcmp(o->pager, "uring") && strcmp(o->pager, "kmod"))
		return kvmem_error(EINVAL, "%s: pager '%s': pages are read back by 'uring' (the "
				   "userspace pager) or 'kmod' (the kernel module)", dir, o->pager);
	if (o->pager && !strcmp(o->pager, "kmod") && !strncmp(dir, "rados://", 8))
		return kvmem_error(EINVAL, "%s: pager 'kmod' reads a workspace directory's files; a "
				   "RADOS workspace is read back by 'uring'", dir);
	if (o->pager && !strcmp(o->pager, "kmod") && kvmem_kmod_probe(NULL) < 0)
		return kvmem_error_prefix("%s: pager 'kmod'", dir);
	w = calloc(1, sizeof(*w));
	if (!w)
		return kvmem_error(ENOMEM, "%s: out of memory", dir);
	kvmem_pager_opts_default(&po);
	po.flags = o->flags | KVMEM_PAGER_CREATE;
	if (o->host_cap)
		po.host_cap = o->host_cap;
	if (o->cache_policy)
		po.policy = o->cache_policy;
	if (o->stage_bytes)
		po.stage_bytes = o->stage_bytes;
	po.pool = o->pool;
	kvmem_page_geom_model(&g, m, o->block ? o->block : KVMEM_BLOCK_DEFAULT);
	if (o->dtype && o->dtype != KVMEM_DTYPE_F32 && o->dtype != KVMEM_DTYPE_BF16 &&
	    o->dtype != KVMEM_DTYPE_F16 && o->dtype != KVMEM_DTYPE_FP8) {
		free(w);
		return kvmem_error(EINVAL, "%s: page dtype %u", dir, o->dtype);
	}
	if (o->dtype == KVMEM_DTYPE_FP8 && o->pager && !strcmp(o->pager, "kmod")) {
		free(w);
		return kvmem_error(ENOTSUP, "%s: pager 'kmod' reads f32, bf16 and f16 pages; an fp8 "
				   "workspace is read back by 'uring'", dir);
	}
	if (o->dtype)
		g.dtype = o->dtype;
	{
		/* An existing workspace keeps the dtype it was written in (one
		 * format: f32 from the CPU, bf16 from a GPU, both open on both);
		 * everything else must match as before. fp8 is another
		 * computation (attention reads the quantised K/V), fixed when
		 * the workspace is made: opening one as the other is refused,
		 * like another model's. */
		kvmem_workspace_info wi;

		if (kvmem_workspace_info_read(dir, &wi) == 0) {
			const int have = wi.geom.dtype == KVMEM_DTYPE_FP8;

			if (have != (g.dtype == KVMEM_DTYPE_FP8)) {
				free(w);
				return kvmem_error(ESTALE, "%s: the workspace's KV is %s, this open asks "
						   "for %s; the KV dtype is fixed when a workspace is "
						   "created (--kv-dtype): refusing to open it", dir,
						   have ? "fp8" : kvmem_dtype_name(wi.geom.dtype),
						   have ? kvmem_dtype_name(g.dtype) : "fp8");
			}
			if (wi.geom.dtype == KVMEM_DTYPE_F32 || wi.geom.dtype == KVMEM_DTYPE_BF16 ||
			    wi.geom.dtype == KVMEM_DTYPE_F16)
				g.dtype = wi.geom.dtype;
		}
	}
	if ((rc = kvmem_pager_open(dir, &g, &po, &w->p)) < 0) {
		free(w);
		return rc;
	}
	if (o->pager && !strcmp(o->pager, "kmod")) {
		kvmem_kmod_opts ko;

		kvmem_kmod_opts_default(&ko);
		if (o->host_cap)
			ko.host_cap = o->host_cap;
		rc = kvmem_page_source_kmod(&w->src, w->p, &ko);
	} else {
		rc = kvmem_page_source_pager(&w->src, w->p);
	}
	if (rc < 0)
		goto fail;
	w->n_ids = (int64_t)kvmem_pager_tokens(w->p);
	w->ids = malloc((size_t)(w->n_ids ? w->n_ids : 1) * sizeof(int32_t));
	if (!w->ids) {
		rc = kvmem_error(ENOMEM, "%s: out of memory for %" PRId64 " token ids", dir, w->n_ids);
		goto fail;
	}
	if (w->n_ids && (rc = kvmem_pager_read_tokens(w->p, 0, w->n_ids, w->ids)) < 0)
		goto fail;
	*out = w;
	return 0;
fail:
	kvmem_workspace_close(w);
	return rc;
}

const kvmem_page_source *kvmem_workspace_source(kvmem_workspace *w)
{
	return &w->src;
}

kvmem_pager *kvmem_workspace_pager(kvmem_workspace *w)
{
	return w->p;
}

const char *kvmem_workspace_dir(const kvmem_workspace *w)
{
	return kvmem_pager_dir(w->p);
}

int64_t kvmem_workspace_tokens(const kvmem_workspace *w)
{
	return w->n_ids;
}

const int32_t *kvmem_workspace_token_ids(const kvmem_workspace *w)
{
	return w->ids;
}

int kvmem_workspace_adopt(kvmem_workspace *w, kvmem_session *s)
{
	uint32_t len = 0;
	const void *state = kvmem_pager_app_state(w->p, &len);
	int rc;

	if (!w->n_ids)
		return 0;
	if (state && len) {
		rc = kvmem_session_adopt_state(s, w->ids, w->n_ids, state, len);
		/* A refusal (-ESTALE) leaves the session fresh; a page that
		 * could not be read does not, and nothing can fall back. */
		if (rc != -ESTALE)
			return rc;
	} else {
		kvmem_error(ENOENT, "%s: the last commit holds no session state",
			    kvmem_pager_dir(w->p));
	}
	{
		char why[1024];

		snprintf(why, sizeof(why), "%s", kvmem_last_error());
		if ((rc = kvmem_session_adopt(s, w->ids, w->n_ids)) < 0)
			return rc;
		/* Say why the view starts from a fresh selection. */
		kvmem_error(len ? ESTALE : ENOENT, "%s", why);
	}
	return 1;
}

int kvmem_workspace_commit(kvmem_workspace *w, const kvmem_session *s)
{
	void *state;
	size_t len;
	int rc, without = 0;

	if ((rc = kvmem_session_save_state(s, &state, &len)) < 0)
		return rc;
	if (len > KVMEM_PAGER_APP_MAX) {
		/* The history is still worth committing; a reopen then makes a
		 * fresh selection. */
		without = 1;
		len = 0;
	}
	rc = kvmem_page_source_commit(&w->src, kvmem_session_token_ids(s),
					    kvmem_session_tokens(s), len ? state : NULL,
					    (uint32_t)len);
	free(state);
	if (rc < 0)
		return rc;
	if ((rc = kvmem_pager_step(w->p, ++w->step)) < 0)
		return rc;
	if (without)
		kvmem_error(EFBIG, "%s: the session state is larger than a commit holds (%u bytes): "
			    "committed without it", kvmem_pager_dir(w->p), KVMEM_PAGER_APP_MAX);
	return without;
}

int kvmem_workspace_close(kvmem_workspace *w)
{
	int rc = 0;

	if (!w)
		return 0;
	kvmem_page_source_destroy(&w->src);
	if (w->p)
		rc = kvmem_pager_close(w->p);
	free(w->ids);
	free(w);
	return rc;
}
