// SPDX-License-Identifier: MIT
/*
 * The cost of one pager probe hit, for tools/bench/bpf_overhead.sh: fires
 * the named probe of user/pager/probes.h N times and prints the CPU time
 * per hit in nanoseconds (the calling thread's, kernel time included, so
 * the uprobe trap and the BPF program are in it and other processes on the
 * machine mostly are not). Every probe of the pager is in this binary, so a
 * tool attaches to it as to kvmem (-b PATH).
 *
 *   usdt_cost PROBE N      PROBE: page_in, page_in_batch, fetch, evict, hit,
 *                          miss, tier_move
 *
 * page_in_batch fires with a full batch (KVMEM_PROBE_BATCH_MAX requests),
 * so its cost with kvmemlat attached is an upper bound for a pass.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pager/probes.h"

static double cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Every probe once, behind a condition the compiler cannot see through,
 * so all are in the binary and none fires. */
static void all_probes(volatile int never)
{
	if (!never)
		return;
	PROBE_HIT(1, 2, 3);
	PROBE_MISS(1, 2);
	PROBE_TIER_MOVE(1, 4, 2, 3, 4);
	PROBE_PAGE_IN(1, 2, 3, 4);
	PROBE_PAGE_IN_BATCH(1, 2, 3, 4, (uint64_t *)0);
	PROBE_EVICT(1, 2, 3);
	PROBE_STAGE_OUT(1, 2, 3);
	PROBE_BACKPRESSURE(1, 2);
	PROBE_PREFETCH(1, 2);
	PROBE_IO_ERROR(1, 2);
	PROBE_COMMIT(1, 2, 3);
	PROBE_STEP(1, 2, 3, 4, 5);
	PROBE_FETCH(1, 2, 3, 4, 5);
	PROBE_RECLAIM(1, 2);
	PROBE_PREFETCH_BATCH(1, 2);
	PROBE_HINT(1, 2);
	PROBE_CLOSE(1);
}

int main(int argc, char **argv)
{
	const char *dir = "/usdt_cost";
	long n = argc > 2 ? atol(argv[2]) : 0;
	/* page_in_batch: a full batch, an upper bound on a pass's cost */
	uint64_t lat[KVMEM_PROBE_BATCH_MAX];
	double t;

	for (int i = 0; i < KVMEM_PROBE_BATCH_MAX; i++)
		lat[i] = 20000 + 997 * (uint64_t)i;

	if (argc != 3 || n <= 0) {
		fprintf(stderr, "usage: usdt_cost PROBE N\n");
		return 2;
	}
	all_probes(getenv("KVMEM_USDT_COST_ALL") != NULL);
	PROBE_OPEN(dir, 16, 65536, 1);	/* the tools' workspace record */
	t = cpu_ns();
	for (long i = 0; i < n; i++) {
		uint64_t pg = (uint64_t)i;

		if (!strcmp(argv[1], "page_in"))
			PROBE_PAGE_IN(pg, 1, 65536, 50000);
		else if (!strcmp(argv[1], "page_in_batch"))
			PROBE_PAGE_IN_BATCH(KVMEM_PROBE_BATCH_MAX, KVMEM_PROBE_BATCH_MAX,
					    KVMEM_PROBE_BATCH_MAX * 65536, KVMEM_PROBE_BATCH_MAX * 50000, lat);
		else if (!strcmp(argv[1], "fetch"))
			PROBE_FETCH(64, 60, 4, 0, 200000);
		else if (!strcmp(argv[1], "evict"))
			PROBE_EVICT(pg, 7, 65536);
		else if (!strcmp(argv[1], "hit"))
			PROBE_HIT(pg, 2, 65536);
		else if (!strcmp(argv[1], "miss"))
			PROBE_MISS(pg, 65536);
		else if (!strcmp(argv[1], "tier_move"))
			PROBE_TIER_MOVE(pg, 4, 2, 65536, 50000);
		else
			return fprintf(stderr, "usdt_cost: unknown probe %s\n", argv[1]), 2;
	}
	printf("%.1f\n", (cpu_ns() - t) / n);
	return 0;
}
