/* SPDX-License-Identifier: MIT */
/*
 * The batch runner: the one call through which kvmem serve's engine runs a
 * round of work on the backend. The scheduler (serve_engine.c) collects, in
 * each round, one unit from every conversation that has one ready, up to
 * --max-batch units and --prefill-budget prefill tokens, and hands them
 * here in one call:
 *
 *   SERVE_UNIT_PREFILL   append n tokens (a whole prefill chunk, or the
 *                        tokens that close a turn) to the session
 *   SERVE_UNIT_DECODE    append the one token the server sampled from the
 *                        session's last logits (so the logits of the next
 *                        position come back); sampling stays the server's
 *   SERVE_UNIT_SELECT    the step-boundary selection and rematerialisation,
 *                        slices of n layers of its placements
 *                        (kvmem_session_select_step) until slice_s is
 *                        spent, at least one (n 0: all of it at once):
 *                        `more` says whether layers are left for the next
 *                        round's unit
 *
 * Each unit names its own session; two units of one round never share a
 * session. After the call every unit has its result (rc, and the message
 * when it failed), and the session's logits (kvmem_session_logits) are
 * those of its last token. A unit's failure is that unit's alone: the
 * others' results stand.
 *
 * The runner runs the selections one session at a time and every prefill
 * chunk and decode step of the round in one forward pass over the
 * sessions' views (kvmem_session_append_batch, kvmem/session.h). Its
 * contract: every session's tokens and logits equal what a loop of the
 * per-session calls (kvmem_session_append, kvmem_session_select) computes
 * (batch invariance), so answers never depend on what else runs.
 */
#ifndef KVMEM_TOOLS_SERVE_BATCH_H
#define KVMEM_TOOLS_SERVE_BATCH_H

#include <stdint.h>

#include "kvmem/backend.h"
#include "kvmem/session.h"

enum serve_unit_kind { SERVE_UNIT_PREFILL = 0, SERVE_UNIT_DECODE, SERVE_UNIT_SELECT, SERVE_UNIT_KINDS };

struct serve_unit {
	int kind;			/* enum serve_unit_kind */
	kvmem_session *s;
	const int32_t *tokens;		/* PREFILL: n tokens; DECODE: one */
	int n;				/* SELECT: layers placed a slice (0: all) */
	double slice_s;			/* SELECT: slices until this is spent (at least one) */
	/* results */
	int rc;				/* 0, or -errno */
	int more;			/* SELECT: layers left (the next round goes on) */
	char err[512];			/* kvmem_last_error() of a failed unit */
	double seconds;			/* the unit's share of the round's time */
};

/* What the runner did, summed over its calls (the engine's thread only). */
struct serve_batch_stats {
	uint64_t calls, units[SERVE_UNIT_KINDS], tokens;
	double seconds[SERVE_UNIT_KINDS];
};

/* Run units[0..n) on backend be (whose sessions they all are). Returns the
 * number of units that failed (each says why in rc and err). */
int serve_batch_run(kvmem_backend *be, struct serve_unit *units, int n,
		    struct serve_batch_stats *st);

/* Before the backend opens: a server that batches (max_batch above 1)
 * puts decode's GEMMs on tensor cores (KVMEM_CUDA_GEMM_TC=1) and, over fp8
 * views (kv_dtype KVMEM_DTYPE_FP8), gives the decode attention's splits at
 * least 8 stages (KVMEM_CUDA_DEC_MIN_TILES=8), each unless the environment
 * already says; the cuda backend reads them, others ignore them. */
void serve_batch_knobs(int64_t max_batch, uint32_t kv_dtype);

#endif
