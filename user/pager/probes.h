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
 *   evict(page, slot, bytes)            a page left the host pool
 *   stage_out(block, bytes, ns)         a block's extent is on NVMe
 *   backpressure(block, ns)             append waited for stage-out buffer
 *   prefetch(page, bytes)               a read was started ahead of use
 *   io_error(page, err)                 a read or write failed (-errno)
 *   commit(tokens, blocks, ns)          the committed count advanced
 *   step(step, hits, misses, bytes_in, ns)  step boundary: the previous
 *                                       step's counts and its duration
 *   hint(block, score_ppm)              selector feedback (score x 1e6)
 *   open(dir, layers, page_bytes, ws_id) a workspace was opened (dir: the
 *                                       path as given; ws_id: its inode)
 *   close(ws_id)                        the workspace is about to close
 *
 * The BPF tools in bpf/ rely on these; change an argument there too.
 */
#ifndef KVMEM_PAGER_PROBES_H
#define KVMEM_PAGER_PROBES_H

#include <sys/sdt.h>

#define PROBE_HIT(pg, tier, bytes) DTRACE_PROBE3(kvmem, hit, pg, tier, bytes)
#define PROBE_MISS(pg, bytes) DTRACE_PROBE2(kvmem, miss, pg, bytes)
#define PROBE_TIER_MOVE(pg, from, to, bytes, ns) \
	DTRACE_PROBE5(kvmem, tier_move, pg, from, to, bytes, ns)
#define PROBE_PAGE_IN(pg, n, bytes, ns) DTRACE_PROBE4(kvmem, page_in, pg, n, bytes, ns)
#define PROBE_EVICT(pg, slot, bytes) DTRACE_PROBE3(kvmem, evict, pg, slot, bytes)
#define PROBE_STAGE_OUT(blk, bytes, ns) DTRACE_PROBE3(kvmem, stage_out, blk, bytes, ns)
#define PROBE_BACKPRESSURE(blk, ns) DTRACE_PROBE2(kvmem, backpressure, blk, ns)
#define PROBE_PREFETCH(pg, bytes) DTRACE_PROBE2(kvmem, prefetch, pg, bytes)
#define PROBE_IO_ERROR(pg, err) DTRACE_PROBE2(kvmem, io_error, pg, err)
#define PROBE_COMMIT(tok, blk, ns) DTRACE_PROBE3(kvmem, commit, tok, blk, ns)
#define PROBE_STEP(n, hits, misses, bytes, ns) \
	DTRACE_PROBE5(kvmem, step, n, hits, misses, bytes, ns)
#define PROBE_HINT(blk, ppm) DTRACE_PROBE2(kvmem, hint, blk, ppm)
#define PROBE_OPEN(dir, layers, bytes, id) DTRACE_PROBE4(kvmem, open, dir, layers, bytes, id)
#define PROBE_CLOSE(id) DTRACE_PROBE1(kvmem, close, id)

#endif
