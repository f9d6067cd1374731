// SPDX-License-Identifier: MIT
/*
 * A prefill chunk's raw K/V go to the page source on their own thread while
 * the next chunk computes.
 *
 * Writing a chunk's pages (narrowing rows to the page type, the pager's copy
 * into its stage-out extents, checksums, the io_uring writes) took longer
 * than the chunk's forward pass on a GPU; on the session's thread it added
 * to every chunk. Here it overlaps the next chunk's forward pass instead:
 * after a forward, the session hands its raw K/V buffers to the worker and
 * the next forward writes into a second pair. One job at a time, in token
 * order (a source takes a block's tokens in order). Nothing else touches the
 * source meanwhile: ws_stage_wait comes first in everything that does
 * (selection and rematerialisation, the end of an append, freeing), and a
 * source with a sync op (a commit per forward) is written in line. Small
 * writes (a decode step's token) stay in line too: a hand-off costs more
 * than the write. The history's commit rule is unchanged: a block reaches
 * the pager (and later the disk) only after its rows were written, and
 * nothing is reported committed before the wait.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "workspace/session_int.h"

/* Chunks of fewer tokens are written in line. */
#define STAGE_MIN_TOKENS 64

enum { IDLE, POSTED, DONE };

struct ws_stage {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int state, quit;
	kvmem_session *s;
	int64_t p0;
	int n;
	float *k, *v;		/* the job's rows: one of the two pairs */
	float *spare_k, *spare_v;	/* the pair the session does not hold */
	int rc, err;
	char msg[512];
};

static void *worker(void *arg)
{
	struct ws_stage *g = arg;

	pthread_mutex_lock(&g->mu);
	for (;;) {
		while (g->state != POSTED && !g->quit)
			pthread_cond_wait(&g->cv, &g->mu);
		if (g->quit)
			break;
		pthread_mutex_unlock(&g->mu);
		int rc = ws_store_pages(g->s, g->p0, g->n, g->k, g->v);

		pthread_mutex_lock(&g->mu);
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

/* The worker and the second buffer pair, made at the first large chunk. */
static int stage_start(kvmem_session *s)
{
	const size_t rows = (size_t)s->cfg.n_layers * s->o.chunk * s->cfg.n_kv_heads *
			    s->cfg.head_dim;
	struct ws_stage *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	g->s = s;
	g->spare_k = malloc(rows * sizeof(float));
	g->spare_v = malloc(rows * sizeof(float));
	if (!g->spare_k || !g->spare_v || pthread_mutex_init(&g->mu, NULL)) {
		free(g->spare_k);
		free(g->spare_v);
		free(g);
		return -ENOMEM;
	}
	pthread_cond_init(&g->cv, NULL);
	if (pthread_create(&g->th, NULL, worker, g)) {
		pthread_cond_destroy(&g->cv);
		pthread_mutex_destroy(&g->mu);
		free(g->spare_k);
		free(g->spare_v);
		free(g);
		return -EAGAIN;
	}
	s->stage = g;
	return 0;
}

/* Wait for the job in flight: its rc (0 when there was none). */
static int drain(kvmem_session *s)
{
	struct ws_stage *g = s->stage;
	int rc;

	if (!g)
		return 0;
	pthread_mutex_lock(&g->mu);
	while (g->state == POSTED)
		pthread_cond_wait(&g->cv, &g->mu);
	rc = g->state == DONE ? g->rc : 0;
	g->state = IDLE;
	pthread_mutex_unlock(&g->mu);
	if (rc)
		s->broken = 1;	/* the view holds tokens the history lacks */
	return rc;
}

int ws_stage_wait(kvmem_session *s)
{
	if (drain(s))
		return kvmem_error(s->stage->err, "%s", s->stage->msg);
	return 0;
}

void ws_stage_drain(kvmem_session *s)
{
	drain(s);
}

int ws_stage_rows(kvmem_session *s, int64_t p0, int n)
{
	struct ws_stage *g;
	float *k, *v;

	if (n < STAGE_MIN_TOKENS || s->src->ops->sync || (!s->stage && stage_start(s)))
		return ws_stage_wait(s) || ws_store_pages(s, p0, n, s->raw_k, s->v) ? kvmem_fail() : 0;
	if (ws_stage_wait(s))
		return kvmem_fail();
	g = s->stage;
	/* The job takes the rows just computed; the next forward writes into
	 * the other pair. */
	k = s->raw_k, v = s->v;
	s->raw_k = g->spare_k, s->v = g->spare_v;
	g->spare_k = k, g->spare_v = v;
	pthread_mutex_lock(&g->mu);
	g->p0 = p0;
	g->n = n;
	g->k = k;
	g->v = v;
	g->state = POSTED;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	return 0;
}

void ws_stage_free(kvmem_session *s)
{
	struct ws_stage *g = s->stage;

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
	free(g->spare_k);
	free(g->spare_v);
	free(g);
	s->stage = NULL;
}
