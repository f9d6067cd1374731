// SPDX-License-Identifier: GPL-2.0
/*
 * kvmem-vm-scan SRC STEPS HOT SCAN CAP: the workload of tests/vm/policy.sh,
 * a hot set beside a scan. A private copy of the workspace SRC, through a
 * window of CAP pages; each step: KVMEM_IOC_STEP, every pte of the window
 * dropped (MADV_DONTNEED: each touch below faults, so the module sees every
 * access, a hit or a miss), pages 0 .. HOT-1 touched, then the next SCAN
 * pages of a scan over the others (wrapping). The hot pages are worth
 * keeping; a scan page is never used again before the scan comes round.
 * Prints one JSON line: the module's faults, hits and hit rate, how often a
 * hot page was still resident when touched, evictions, verdicts taken and
 * refused, and the workspace id the tracepoints carry.
 */
#include <sys/stat.h>

#include "vmtest.h"

int main(int argc, char **argv)
{
	uint64_t steps, hot, scan, cap, cursor, hot_hits = 0;
	struct kvmem_ioc_stats st;
	struct stat sb;
	struct vt_ws w;
	kvmem_kmod *k;
	size_t len;
	void *win;
	unsigned char b;

	if (argc != 6) {
		fprintf(stderr, "usage: kvmem-vm-scan SRC STEPS HOT SCAN CAP\n");
		return 2;
	}
	steps = strtoull(argv[2], NULL, 0);
	hot = strtoull(argv[3], NULL, 0);
	scan = strtoull(argv[4], NULL, 0);
	cap = strtoull(argv[5], NULL, 0);
	if (vt_ws_open(&w, argv[1]) || hot + scan >= w.pages || !cap) {
		fprintf(stderr, "kvmem-vm-scan: %s: cannot copy the workspace, or it is too small\n",
			argv[1]);
		return 1;
	}
	k = vt_kmod(&w, cap);
	if (!k)
		return 1;
	win = kvmem_kmod_window(k, &len);
	cursor = hot;
	for (uint64_t s = 1; s <= steps; s++) {
		if (kvmem_kmod_step(k, s) || madvise(win, len, MADV_DONTNEED)) {
			fprintf(stderr, "kvmem-vm-scan: step %llu: %s\n", (unsigned long long)s,
				kvmem_last_error());
			return 1;
		}
		for (uint64_t h = 0; h < hot; h++) {
			hot_hits += kvmem_kmod_resident(k, h);
			if (vt_read(kvmem_kmod_page_addr(k, h), &b, 1))
				return 1;
		}
		for (uint64_t j = 0; j < scan; j++) {
			if (vt_read(kvmem_kmod_page_addr(k, cursor), &b, 1))
				return 1;
			cursor = cursor + 1 < w.pages ? cursor + 1 : hot;
		}
	}
	st = vt_stats(k);
	fstat(w.pages_fd, &sb);
	printf("{\"ws_id\":%llu,\"steps\":%llu,\"faults\":%llu,\"hits\":%llu,\"hit_rate\":%.4f,"
	       "\"hot_hits\":%llu,\"hot_touches\":%llu,\"evictions\":%llu,\"verdicts\":%llu,"
	       "\"bad_verdicts\":%llu}\n", (unsigned long long)sb.st_ino,
	       (unsigned long long)steps, (unsigned long long)st.faults,
	       (unsigned long long)st.hits, st.faults ? (double)st.hits / st.faults : 0.0,
	       (unsigned long long)hot_hits, (unsigned long long)(steps * hot),
	       (unsigned long long)st.evictions, (unsigned long long)st.verdicts,
	       (unsigned long long)st.bad_verdicts);
	kvmem_kmod_close(k);
	vt_ws_close(&w);
	return 0;
}
