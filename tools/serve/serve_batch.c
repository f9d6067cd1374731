// SPDX-License-Identifier: MIT
/*
 * The first batch runner (serve_batch.h): the units of a round one after
 * another, each with the library's calls for one session. A decode unit is
 * an append of the one sampled token, which is what kvmem_session_decode
 * does after it samples: the same forward, the same bits.
 */
#ifndef KVMEM_NO_SERVE
#include <stdio.h>
#include <time.h>

#include "kvmem/kvmem.h"
#include "serve_batch.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int serve_batch_run(kvmem_backend *be, struct serve_unit *units, int n,
		    struct serve_batch_stats *st)
{
	int failed = 0;

	(void)be;	/* the batched forward will run them all on it at once */
	st->calls++;
	for (int i = 0; i < n; i++) {
		struct serve_unit *u = &units[i];
		double t0 = now_s();

		u->err[0] = 0;
		if (u->kind == SERVE_UNIT_SELECT)
			u->rc = kvmem_session_select(u->s);
		else
			u->rc = kvmem_session_append(u->s, u->tokens, u->n, 0);
		if (u->rc) {
			snprintf(u->err, sizeof(u->err), "%s", kvmem_last_error());
			failed++;
		}
		u->seconds = now_s() - t0;
		st->units[u->kind]++;
		st->seconds[u->kind] += u->seconds;
		if (u->kind != SERVE_UNIT_SELECT)
			st->tokens += (uint64_t)u->n;
	}
	return failed;
}
#endif
