/* SPDX-License-Identifier: MIT */
/*
 * BPF-side pieces every tool includes once (after vmlinux.h and the libbpf
 * headers): the pid filter, the per-process workspace record kept from the
 * pager's open/close probes, and log2 for histograms.
 *
 * Program naming, which the userspace helpers rely on (kvmem_helpers.c):
 *   usdt_<probe>   SEC("usdt"), attached to probe <probe> of provider
 *                  "kvmem" in the target binary;
 *   tp_<event>     SEC("raw_tp/kvmem_<event>"), the module's tracepoints
 *                  (kvmem_tp.h), loaded only when the module is.
 */
#ifndef KVMEM_BPF_H
#define KVMEM_BPF_H

#include "kvmem_trace.h"

/* 0: every process; else only this one (set by -p before load). */
const volatile __u32 targ_tgid = 0;

/* tgid -> the workspace it opened last (open probe); kept after close so
 * the last interval still has a name. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct kt_workspace);
} workspaces SEC(".maps");

/* The calling process's tgid, or -1 when the pid filter rejects it. */
static __always_inline __s64 kt_tgid(void)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (targ_tgid && tgid != targ_tgid)
		return -1;
	return tgid;
}

static __always_inline struct kt_workspace *kt_ws(__u32 tgid)
{
	return bpf_map_lookup_elem(&workspaces, &tgid);
}

SEC("usdt")
int BPF_USDT(usdt_open, void *dir, __u64 layers, __u64 page_bytes, __u64 id)
{
	struct kt_workspace ws = {};
	__s64 tgid = kt_tgid();
	__u32 key;

	if (tgid < 0)
		return 0;
	key = tgid;
	ws.id = id;
	ws.layers = layers;
	ws.page_bytes = page_bytes;
	bpf_probe_read_user_str(ws.dir, sizeof(ws.dir), dir);
	bpf_map_update_elem(&workspaces, &key, &ws, BPF_ANY);
	return 0;
}

/* log2 of v rounded down (0 for 0 and 1), branch-free enough for the
 * verifier. */
static __always_inline __u32 kt_log2(__u64 v)
{
	__u32 r = 0, s;

	s = (v > 0xffffffffull) << 5; v >>= s; r |= s;
	s = (v > 0xffff) << 4; v >>= s; r |= s;
	s = (v > 0xff) << 3; v >>= s; r |= s;
	s = (v > 0xf) << 2; v >>= s; r |= s;
	s = (v > 0x3) << 1; v >>= s; r |= s;
	return r | (__u32)(v >> 1);
}

/* The histogram slot of v: floor(log2(v)) (0 and 1 share slot 0), capped.
 * Debian 6.1's verifier lost the bound when clang compared a copy of the
 * value: the barrier keeps clang from folding the mask away, and the mask
 * gives the verifier the bound (KT_MAX_SLOTS is a power of two). */
static __always_inline __u64 kt_slot(__u64 v)
{
	__u64 s = kt_log2(v);

	if (s >= KT_MAX_SLOTS)
		s = KT_MAX_SLOTS - 1;
	barrier_var(s);
	return s & (KT_MAX_SLOTS - 1);
}
_Static_assert((KT_MAX_SLOTS & (KT_MAX_SLOTS - 1)) == 0, "KT_MAX_SLOTS: a power of two");

#endif
