// SPDX-License-Identifier: MIT
/*
 * The batch runner (serve_batch.h): a round's selections one session at a
 * time (each its own cost), then every prefill chunk and decode step of
 * the round in one forward pass over the sessions' views
 * (kvmem_session_append_batch, kvmem/session.h), which is batch invariant:
 * each session gets the bits the loop of its own calls would give it.
 * A decode unit is an append of the one sampled token, which is what
 * kvmem_session_decode does after it samples.
 */
#ifndef KVMEM_NO_SERVE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kvmem/kvmem.h"
#include "serve_batch.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void count(struct serve_batch_stats *st, struct serve_unit *u, int *failed)
{
	if (u->rc)
		(*failed)++;
	st->units[u->kind]++;
	st->seconds[u->kind] += u->seconds;
	if (u->kind != SERVE_UNIT_SELECT)
		st->tokens += (uint64_t)u->n;
}

/*
 * A server that batches (--max-batch above 1) runs decode's GEMMs on the
 * tensor-core kernel for few rows unless KVMEM_CUDA_GEMM_TC says otherwise:
 * batch invariance needs the lone step and the batched one on the same
 * GEMM, and the CUDA-core rows kernel the default would give a batch is
 * 4x slower at 64 conversations (788 against 3364 tok/s at the 8B
 * geometry, benchmarks.md), where a lone stream gives up about 5% (0.957x
 * the GEMV's decode in the run that measured it). Only
 * the cuda backend reads it, when its context is made (so before the
 * backend opens); set here, not in the library, so that `kvmem run`
 * keeps the lone decode's GEMV.
 *
 * Over fp8 views the same kind of trade on the decode attention: a split
 * of at least 8 stages of 64 keys (4 by default: attention_dec.cuh), for
 * the lone and the batched step alike, so still batch invariant, gave 16
 * conversations of 32K tokens 2.7-4.2% more tokens and 64 of 8K 6.1%,
 * where a stream alone over a view under ~8.4K keys gave up 1.8-3.5% (an
 * H100, 2026-12-06, benchmarks.md "The decode split at 8 stages"); over
 * bf16 views the batch gained nothing, so they keep the default.
 */
void serve_batch_knobs(int64_t max_batch, uint32_t kv_dtype)
{
	if (max_batch <= 1)
		return;
	setenv("KVMEM_CUDA_GEMM_TC", "1", 0);
	if (kv_dtype == KVMEM_DTYPE_FP8)
		setenv("KVMEM_CUDA_DEC_MIN_TILES", "8", 0);
}

/* A unit alone, with the per-session calls. */
static void run_one(struct serve_unit *u)
{
	double t0 = now_s();

	u->more = 0;
	if (u->kind == SERVE_UNIT_SELECT && u->n > 0) {
		do
			u->rc = kvmem_session_select_step(u->s, u->n);
		while (u->rc == 1 && now_s() - t0 < u->slice_s);
		u->more = u->rc == 1;
		u->rc = u->rc < 0 ? u->rc : 0;
	} else if (u->kind == SERVE_UNIT_SELECT)
		u->rc = kvmem_session_select(u->s);
	else
		u->rc = kvmem_session_append(u->s, u->tokens, u->n, 0);
	if (u->rc)
		snprintf(u->err, sizeof(u->err), "%s", kvmem_last_error());
	u->seconds = now_s() - t0;
}

int serve_batch_run(kvmem_backend *be, struct serve_unit *units, int n,
		    struct serve_batch_stats *st)
{
	kvmem_batch_item *items = calloc((size_t)(n > 0 ? n : 1), sizeof(*items));
	int *at = calloc((size_t)(n > 0 ? n : 1), sizeof(*at));
	int failed = 0, m = 0, tokens = 0;
	double t0, dt;

	(void)be;	/* every unit's session is on it */
	st->calls++;
	for (int i = 0; i < n; i++) {
		struct serve_unit *u = &units[i];

		u->err[0] = 0;
		u->rc = 0;
		/* Selections first, each alone; a token run of one forward
		 * joins the batch (without memory for the batch, all alone). */
		if (u->kind == SERVE_UNIT_SELECT || !items || !at || u->n <= 0 ||
		    u->n > kvmem_session_options(u->s)->chunk) {
			run_one(u);
			count(st, u, &failed);
			continue;
		}
		items[m] = (kvmem_batch_item){ .s = u->s, .tokens = u->tokens, .n = u->n };
		at[m++] = i;
		tokens += u->n;
	}
	if (m) {
		t0 = now_s();
		if (kvmem_session_append_batch(items, m) < 0) {
			/* The call itself was refused (no unit ran): each alone. */
			for (int k = 0; k < m; k++)
				run_one(&units[at[k]]);
		} else {
			dt = now_s() - t0;
			for (int k = 0; k < m; k++) {
				struct serve_unit *u = &units[at[k]];

				u->rc = items[k].rc;
				snprintf(u->err, sizeof(u->err), "%s", items[k].err);
				/* The forward's time, shared by tokens. */
				u->seconds = dt * u->n / tokens;
			}
		}
		for (int k = 0; k < m; k++)
			count(st, &units[at[k]], &failed);
	}
	free(items);
	free(at);
	return failed;
}
#endif
