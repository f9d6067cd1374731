/* SPDX-License-Identifier: MIT */
/*
 * USDT probes of the pager (provider "kvmem"). Each fires where the event
 * happens, with scalar arguments only, so bpftrace/libbpf read them easily:
 *
 *   hit(page, tier, bytes)              fetch found the page (tier 2 = host,
 *                                       0 = stage-out buffer / memory)
 *   miss(page, bytes)                   a fetched page was not in the host pool
 *                                       (one per host_misses count; it comes
 *                                       from staging, a read in flight or NVMe)
 *   tier_move(page, from, to, bytes, ns) bytes moved between tiers
 *                                       (KVMEM_TIER_* bits; 0 = staging memory)
 *   page_in(first_page, n_pages, bytes, ns)  an NVMe read request completed
 *   page_in_batch(requests, pages, bytes, ns, lat)  reads completed in a
 *                                       reap pass (at most
 *                                       KVMEM_PROBE_BATCH_MAX of them): the
 *                                       sums of their page_in probes (ns:
 *                                       their latencies added up) and lat,
 *                                       the address of each one's latency
 *                                       (u64 ns, `requests` of them)
 *   evict(page, slot, bytes)            a page left the host pool
 *   stage_out(block, bytes, ns)         a block's extent is on NVMe
 *   backpressure(block, ns)             append waited for stage-out buffer
 *   prefetch(page, bytes)               a read was started ahead of use
 *   io_error(page, err)                 a read or write failed (-errno)
 *   commit(tokens, blocks, ns)          the committed count advanced
 *   step(step, hits, misses, bytes_in, ns)  step boundary: the previous
 *                                       step's counts and its duration
 *   fetch(n_pages, hits, misses, staging_hits, ns)  a fetch call ended:
 *                                       its pages and counts, its duration
 *   reclaim(want, evicted)              room was made: pages evicted
 *   prefetch_batch(asked, started)      a prefetch call: pages started
 *   hint(block, score_ppm)              selector feedback (score x 1e6)
 *   open(dir, layers, page_bytes, ws_id) a workspace was opened (dir: the
 *                                       path as given; ws_id: its inode)
 *   close(ws_id)                        the workspace is about to close
 *
 * hit, miss, tier_move, evict and prefetch fire once per page; fetch,
 * reclaim, prefetch_batch and page_in once per call or request, and
 * page_in_batch once per reap of completions, with the same counts, so a
 * tool can follow the traffic at a fraction of the cost (a probe with a
 * BPF program attached costs about 0.6 us here).
 * The BPF tools in bpf/ rely on these; change an argument there too.
 */
#ifndef KVMEM_PAGER_PROBES_H
#define KVMEM_PAGER_PROBES_H

/* Arguments in registers or as constants only: libbpf before 1.3 (Debian
 * 12 has 1.1) cannot read an argument that gcc leaves as a scaled-index
 * memory operand such as 8@(%r12,%rdx,8), and refuses the whole probe. */
#ifndef STAP_SDT_ARG_CONSTRAINT
#define STAP_SDT_ARG_CONSTRAINT nr
#endif
#include <sys/sdt.h>

#define PROBE_HIT(pg, tier, bytes) DTRACE_PROBE3(kvmem, hit, pg, tier, bytes)
#define PROBE_MISS(pg, bytes) DTRACE_PROBE2(kvmem, miss, pg, bytes)
#define PROBE_TIER_MOVE(pg, from, to, bytes, ns) \
	DTRACE_PROBE5(kvmem, tier_move, pg, from, to, bytes, ns)
#define PROBE_PAGE_IN(pg, n, bytes, ns) DTRACE_PROBE4(kvmem, page_in, pg, n, bytes, ns)
/* Requests one page_in_batch carries at most: a longer pass fires it more
 * than once. bpf/kvmemlat.bpf.c reads up to this many latencies. */
#define KVMEM_PROBE_BATCH_MAX 64
#define PROBE_PAGE_IN_BATCH(reqs, n, bytes, ns, lat) \
	DTRACE_PROBE5(kvmem, page_in_batch, reqs, n, bytes, ns, lat)
#define PROBE_EVICT(pg, slot, bytes) DTRACE_PROBE3(kvmem, evict, pg, slot, bytes)
#define PROBE_STAGE_OUT(blk, bytes, ns) DTRACE_PROBE3(kvmem, stage_out, blk, bytes, ns)
#define PROBE_BACKPRESSURE(blk, ns) DTRACE_PROBE2(kvmem, backpressure, blk, ns)
#define PROBE_PREFETCH(pg, bytes) DTRACE_PROBE2(kvmem, prefetch, pg, bytes)
#define PROBE_IO_ERROR(pg, err) DTRACE_PROBE2(kvmem, io_error, pg, err)
#define PROBE_COMMIT(tok, blk, ns) DTRACE_PROBE3(kvmem, commit, tok, blk, ns)
#define PROBE_STEP(n, hits, misses, bytes, ns) \
	DTRACE_PROBE5(kvmem, step, n, hits, misses, bytes, ns)
#define PROBE_FETCH(n, hits, misses, staged, ns) \
	DTRACE_PROBE5(kvmem, fetch, n, hits, misses, staged, ns)
#define PROBE_RECLAIM(want, evicted) DTRACE_PROBE2(kvmem, reclaim, want, evicted)
#define PROBE_PREFETCH_BATCH(asked, started) DTRACE_PROBE2(kvmem, prefetch_batch, asked, started)
#define PROBE_HINT(blk, ppm) DTRACE_PROBE2(kvmem, hint, blk, ppm)
#define PROBE_OPEN(dir, layers, bytes, id) DTRACE_PROBE4(kvmem, open, dir, layers, bytes, id)
#define PROBE_CLOSE(id) DTRACE_PROBE1(kvmem, close, id)

#endif
