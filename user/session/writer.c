// SPDX-License-Identifier: MIT
/*
 * A forward's rows go to the history on their own thread while the next
 * forward computes: raw K/V to the index and the page source, the raw
 * queries to the session's query ring.
 *
 * Writing a chunk's pages (narrowing rows to the page type, the pager's copy
 * into its stage-out extents, checksums, the io_uring writes) took longer
 * than the chunk's forward pass on a GPU; on the session's thread it added
 * to every chunk. Here it overlaps the next chunk's forward pass instead:
 * after a forward, the session hands its raw K, V and query buffers to the
 * worker and the next forward writes into a second set. One job at a time,
 * in token order (a source takes a block's tokens in order, the index and
 * the ring too). Nothing else touches the source, the index or the ring
 * meanwhile: ws_writer_wait comes first in everything that does (the next
 * job's hand-off, selection and rematerialisation, select-ahead, the end
 * of an append, giving the view up, the state saved (so a workspace
 * commit), kvmem_session_index, kvmem_session_sync, freeing), and a source
 * with a sync op (a commit per forward) is written in line. The history's
 * commit rule is unchanged: a block reaches the pager (and later the disk)
 * only after its rows were written, and nothing is reported committed
 * before the wait.
 *
 * A decode step (kvmem_session_decode, the batched calls) returns with its
 * last job still in flight: the wait then falls in the next step, after
 * its forward (ws_run_end hands the next job over), so a step's rows are
 * put away while the next step's forward computes instead of after every
 * step (7.0 of a 37 ms step of 64 sessions at the 8B geometry on the H200
 * were these waits). The next forward writes into the other set of
 * buffers, so it needs no wait. A job that fails breaks the session at
 * that wait; the call that finds it reports the writer's message
 * (ws_usable). An append still waits at its end: what follows a prompt
 * is often a commit, and its last chunk is one wait a turn, not a token.
 * KVMEM_WRITER_DEFER=0 makes a decode step wait at its end again (the
 * peer of a measurement).
 *
 * Small jobs (a decode step's one token) go to the worker only when the
 * backend computes on a device of its own (it has host_register): there
 * the host's cores wait on the GPU during the next forward, and a decode
 * step's share (36 layers' index sums and 590 KB of queries each token, a
 * block's pages copied and checksummed every 32) would otherwise add to
 * every token: 0.18 ms of 7.7 at 36 layers on the H200's host. On the cpu
 * backend the forward itself needs those cores, and they stay in line.
 * KVMEM_WRITER_MIN=N overrides the smallest job the worker takes.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"

/* Chunks of fewer tokens are written in line (host backends). */
#define STAGE_MIN_TOKENS 64

/* The smallest job the worker takes, decided once per session. */
static int writer_min(kvmem_session *s)
{
	if (!s->writer_min) {
		const char *e = getenv("KVMEM_WRITER_MIN");
		long v = e ? strtol(e, NULL, 10) : 0;

		s->writer_min = v >= 1 && v <= (1 << 30) ? (int)v :
			       s->be->ops->host_register ? 1 : STAGE_MIN_TOKENS;
	}
	return s->writer_min;
}

/* In line, on the session's thread (timed: kvmem_session_stats.store_ns). */
static int put_inline(kvmem_session *s, const struct ws_rows *r)
{
	int64_t t0 = (int64_t)kvmem_now_ns();
	int rc = ws_put_rows(s, r, NULL);

	s->st.store_ns += (int64_t)kvmem_now_ns() - t0;
	return rc;
}

enum { IDLE, POSTED, DONE };

struct ws_writer {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int state, quit;
	kvmem_session *s;
	struct ws_rows job;	/* its rows: one of the two sets */
	void *spare_k, *spare_v;	/* the set the session does not hold */
	float *spare_q, *spare_ix;
	int rc, err;
	int told;		/* a call reported the failed job's error */
	char msg[512];
	int64_t ns;		/* time spent on jobs */
	int64_t part_ns[2];	/* of which the index, the pages */
};

static void *worker(void *arg)
{
	struct ws_writer *g = arg;

	pthread_mutex_lock(&g->mu);
	for (;;) {
		while (g->state != POSTED && !g->quit)
			pthread_cond_wait(&g->cv, &g->mu);
		if (g->quit)
			break;
		pthread_mutex_unlock(&g->mu);
		int64_t t0 = (int64_t)kvmem_now_ns();
		int64_t part[2] = { 0, 0 };
		int rc = ws_put_rows(g->s, &g->job, part);

		pthread_mutex_lock(&g->mu);
		g->ns += (int64_t)kvmem_now_ns() - t0;
		g->part_ns[0] += part[0];
		g->part_ns[1] += part[1];
		g->rc = rc;
		if (rc) {
			g->err = kvmem_last_errno() ? kvmem_last_errno() : EIO;
			snprintf(g->msg, sizeof(g->msg), "%s", kvmem_last_error());
		}
		g->state = DONE;
		pthread_cond_broadcast(&g->cv);
	}
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

static void spares_free(struct ws_writer *g)
{
	ws_rows_free(g->s, g->spare_k);
	ws_rows_free(g->s, g->spare_v);
	ws_ix_free(g->s, g->spare_ix);
	free(g->spare_q);
	free(g);
}

/* The worker and the second buffer set (the sizes of the session's own),
 * made at the first job it takes. */
static int writer_start(kvmem_session *s)
{
	struct ws_writer *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	g->s = s;
	g->spare_k = ws_rows_alloc(s);
	g->spare_v = ws_rows_alloc(s);
	g->spare_q = ws_q_alloc(s);
	if (!g->spare_k || !g->spare_v || !g->spare_q || pthread_mutex_init(&g->mu, NULL)) {
		spares_free(g);
		return -ENOMEM;
	}
	pthread_cond_init(&g->cv, NULL);
	if (pthread_create(&g->th, NULL, worker, g)) {
		pthread_cond_destroy(&g->cv);
		pthread_mutex_destroy(&g->mu);
		spares_free(g);
		return -EAGAIN;
	}
	s->writer = g;
	return 0;
}

/* Wait for the job in flight: its rc (0 when there was none). */
static int drain(kvmem_session *s)
{
	struct ws_writer *g = s->writer;
	int64_t t0 = (int64_t)kvmem_now_ns();
	int rc;

	if (!g)
		return 0;
	pthread_mutex_lock(&g->mu);
	while (g->state == POSTED)
		pthread_cond_wait(&g->cv, &g->mu);
	rc = g->state == DONE ? g->rc : 0;
	g->state = IDLE;
	s->st.writer_ns = g->ns;
	s->st.writer_index_ns = g->part_ns[0];
	s->st.writer_pages_ns = g->part_ns[1];
	pthread_mutex_unlock(&g->mu);
	s->st.writer_wait_ns += (int64_t)kvmem_now_ns() - t0;
	if (rc)
		s->broken = 1;	/* the view holds tokens the history lacks */
	return rc;
}

int ws_writer_wait(kvmem_session *s)
{
	if (drain(s)) {
		s->writer->told = 1;
		return kvmem_error(s->writer->err, "%s", s->writer->msg);
	}
	return 0;
}

void ws_writer_drain(kvmem_session *s)
{
	drain(s);
}

int ws_step_end(kvmem_session *s)
{
	if (!s->defer) {
		const char *e = getenv("KVMEM_WRITER_DEFER");

		s->defer = e && !strcmp(e, "0") ? -1 : 1;
	}
	return s->defer > 0 ? 0 : ws_writer_wait(s);
}

/* For the readers of a const session (save_state, kvmem_session_index):
 * the wait changes nothing they can see but the time it takes (and the
 * timers), so their const stays; a session is always malloc'd, so the
 * cast writes to an object that is not const. */
int ws_writer_settle(const kvmem_session *s)
{
	return ws_writer_wait((kvmem_session *)s);
}

/* Said once: the calls after it find the session unusable (ws_usable). */
int ws_writer_failed(const kvmem_session *s)
{
	struct ws_writer *g = s->writer;
	char msg[sizeof(g->msg)];
	int err = 0;

	if (!g)
		return 0;
	pthread_mutex_lock(&g->mu);
	if (g->state != POSTED && g->rc && !g->told) {
		err = g->err;
		memcpy(msg, g->msg, sizeof(msg));
		g->told = 1;
	}
	pthread_mutex_unlock(&g->mu);
	return err ? kvmem_error(err, "session: an earlier step's rows could not be put "
				 "away: %s", msg) : 0;
}

int ws_writer_rows(kvmem_session *s, int64_t p0, int n, int q_rows)
{
	struct ws_rows r = { .p0 = p0, .n = n, .q_rows = q_rows, .k = s->raw_k, .v = s->v,
			     .q = s->q_raw, .in_pages = s->in_pages, .upto = s->append_upto,
			     .ixw = s->in_index ? s->ixw : NULL };
	struct ws_writer *g;

	s->in_pages = 0;	/* the job has it */
	s->in_index = 0;
	if (!s->writer && n >= writer_min(s) && !s->src->ops->sync) {
		int64_t t0 = (int64_t)kvmem_now_ns();

		if (writer_start(s))
			s->writer_min = INT_MAX;	/* no thread or no room: in line from now on */
		s->st.writer_start_ns += (int64_t)kvmem_now_ns() - t0;
	}
	if (n < writer_min(s) || s->src->ops->sync || !s->writer)
		return ws_writer_wait(s) || put_inline(s, &r) ? kvmem_fail() : 0;
	if (ws_writer_wait(s))
		return kvmem_fail();
	g = s->writer;
	/* The index's summaries have a second set too, made at the first
	 * job that brings them; without it, this job is put away in line. */
	if (r.ixw && !g->spare_ix && !(g->spare_ix = ws_ix_alloc(s)))
		return put_inline(s, &r) ? kvmem_fail() : 0;
	/* The job takes the rows just computed; the next forward writes into
	 * the other set. */
	s->raw_k = g->spare_k, s->v = g->spare_v, s->q_raw = g->spare_q;
	g->spare_k = (void *)r.k, g->spare_v = (void *)r.v, g->spare_q = (float *)r.q;
	if (r.ixw) {	/* the index's summaries likewise */
		s->ixw = g->spare_ix;
		g->spare_ix = (float *)r.ixw;
	}
	pthread_mutex_lock(&g->mu);
	g->job = r;
	g->state = POSTED;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	return 0;
}

void ws_writer_free(kvmem_session *s)
{
	struct ws_writer *g = s->writer;

	if (!g)
		return;
	drain(s);
	pthread_mutex_lock(&g->mu);
	g->quit = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	pthread_join(g->th, NULL);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	spares_free(g);
	s->writer = NULL;
}
