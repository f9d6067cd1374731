/* SPDX-License-Identifier: MIT */
/*
 * The contract between kvmempolicy (the loader, which feeds page history)
 * and a victim policy (bpf/policies/NAME.bpf.c, which decides). Both
 * include this header, so the maps below have one definition: the loader
 * creates them and hands their descriptors to the policy object before it
 * is loaded (bpf_map__reuse_fd), so the policy reads what the loader's
 * feeders wrote.
 *
 * A policy defines
 *	static __always_inline int decide(__u64 ws, __u64 page, __u64 step)
 * returning POL_DEFAULT (no opinion: the default order goes on), POL_EVICT
 * or POL_KEEP (kvmempolicy.h) for a candidate victim of workspace ws at
 * agent step `step`, then KVMEM_POLICY(name) to make its two entry points:
 *	choose		SEC("raw_tp"), ctx = (ws, page, step), returns the
 *			answer: run with BPF_PROG_TEST_RUN by the offline
 *			replay (kvmempolicy --replay / --synthetic);
 *	tp_reclaim	SEC("raw_tp.w/kvmem_reclaim"), the module's writable
 *			tracepoint (kvmem_tp.h): asks about the candidates in
 *			the module's order and names the first one not kept
 *			(none named: the module's own choice). Loaded only
 *			with the module.
 * Parameters: pol_param(i, default), set with kvmempolicy -o VALUE
 * (the i-th -o).
 */
#ifndef KVMEM_POLICY_BPF_H
#define KVMEM_POLICY_BPF_H

#include "kvmem_trace.h"
#include "kvmem_tp.h"
#include "kvmempolicy.h"

#define POL_PARAMS	8
#define POL_WINDOW	64	/* steps of access history kept per page */

struct pol_key {
	__u64 ws;
	__u64 id;		/* page (pol_pages) or block (pol_blocks) */
};

struct pol_page {
	__u64 last_step;	/* step of the last access */
	__u64 recent;		/* bit i: accessed in step last_step - i */
	__u64 count;		/* accesses seen */
};

struct pol_block {
	__u64 score_ppm;	/* selector hints, halving every 4 steps, x 1e6 */
	__u64 step;		/* step of the last update */
};

struct pol_ws {
	__u64 step;		/* the workspace's current agent step */
	__u64 layers;		/* pages per block */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 18);
	__type(key, struct pol_key);
	__type(value, struct pol_page);
} pol_pages SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct pol_key);
	__type(value, struct pol_block);
} pol_blocks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u64);
	__type(value, struct pol_ws);
} pol_wss SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, POL_PARAMS);
	__type(key, __u32);
	__type(value, __u64);
} pol_params SEC(".maps");

/* Answers given, by enum pol_verdict (the loader prints them). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, POL_VERDICTS);
	__type(key, __u32);
	__type(value, __u64);
} pol_verdicts SEC(".maps");

static __always_inline __u64 pol_param(__u32 i, __u64 dflt)
{
	__u64 *v = bpf_map_lookup_elem(&pol_params, &i);

	return v && *v ? *v : dflt;
}

static __always_inline __u64 pol_popcount(__u64 x)
{
	x = x - ((x >> 1) & 0x5555555555555555ull);
	x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
	return (x * 0x0101010101010101ull) >> 56;
}

/* Accesses of the page in the `window` steps up to and including `step`. */
static __always_inline __u64 pol_recent_uses(__u64 ws, __u64 page, __u64 step, __u64 window)
{
	struct pol_key k = { .ws = ws, .id = page };
	struct pol_page *p = bpf_map_lookup_elem(&pol_pages, &k);
	__u64 age, bits;

	if (!p || step < p->last_step)
		return 0;
	age = step - p->last_step;
	if (age >= window || window > POL_WINDOW)
		return 0;
	bits = p->recent << age;	/* bit i: accessed in step `step` - i */
	if (window < 64)
		bits &= (1ull << window) - 1;
	return pol_popcount(bits);
}

/* The block's hint score at `step` (x 1e6), halving every 4 steps. */
static __always_inline __u64 pol_block_score(__u64 ws, __u64 block, __u64 step)
{
	struct pol_key k = { .ws = ws, .id = block };
	struct pol_block *b = bpf_map_lookup_elem(&pol_blocks, &k);
	__u64 halvings;

	if (!b || step < b->step)
		return b ? b->score_ppm : 0;
	halvings = (step - b->step) / 4;
	return halvings >= 64 ? 0 : b->score_ppm >> halvings;
}

static __always_inline __u64 pol_layers(__u64 ws)
{
	struct pol_ws *w = bpf_map_lookup_elem(&pol_wss, &ws);

	return w && w->layers ? w->layers : 1;
}

static __always_inline int pol_count(int verdict)
{
	__u32 k = verdict >= 0 && verdict < POL_VERDICTS ? verdict : 0;
	__u64 *n = bpf_map_lookup_elem(&pol_verdicts, &k);

	if (n)
		__sync_fetch_and_add(n, 1);
	return verdict;
}

/* The feeders' side (kvmempolicy.bpf.c): what happened, per workspace. */
static __always_inline void pol_setup(__u64 ws, __u64 layers)
{
	struct pol_ws w = { .layers = layers }, *cur = bpf_map_lookup_elem(&pol_wss, &ws);

	if (cur) {
		cur->layers = layers;
		return;
	}
	bpf_map_update_elem(&pol_wss, &ws, &w, BPF_ANY);
}

static __always_inline void pol_step(__u64 ws, __u64 step)
{
	struct pol_ws w = { .step = step }, *cur = bpf_map_lookup_elem(&pol_wss, &ws);

	if (cur) {
		cur->step = step;
		return;
	}
	bpf_map_update_elem(&pol_wss, &ws, &w, BPF_ANY);
}

static __always_inline __u64 pol_now(__u64 ws)
{
	struct pol_ws *w = bpf_map_lookup_elem(&pol_wss, &ws);

	return w ? w->step : 0;
}

static __always_inline void pol_access(__u64 ws, __u64 page, __u64 step)
{
	struct pol_key k = { .ws = ws, .id = page };
	struct pol_page *p = bpf_map_lookup_elem(&pol_pages, &k), fresh = {
		.last_step = step, .recent = 1, .count = 1 };
	__u64 age;

	if (!p) {
		bpf_map_update_elem(&pol_pages, &k, &fresh, BPF_ANY);
		return;
	}
	if (step < p->last_step)
		return;
	age = step - p->last_step;
	p->recent = (age >= 64 ? 0 : p->recent << age) | 1;
	p->last_step = step;
	p->count++;
}

static __always_inline void pol_hint(__u64 ws, __u64 block, __u64 ppm, __u64 step)
{
	struct pol_key k = { .ws = ws, .id = block };
	struct pol_block *b = bpf_map_lookup_elem(&pol_blocks, &k), fresh = {
		.score_ppm = ppm, .step = step };

	if (!b) {
		bpf_map_update_elem(&pol_blocks, &k, &fresh, BPF_ANY);
		return;
	}
	b->score_ppm = pol_block_score(ws, block, step) + ppm;
	b->step = step;
}

/* One candidate of the reclaim buffer, asked while none was named yet. The
 * buffer takes constant offsets only, hence one line per index. */
#define POL_CAND(i)								\
	if ((i) < n && pick == KT_VERDICT_DEFAULT &&				\
	    pol_count(decide(ws, c->page[i], step)) != POL_KEEP)		\
		pick = (i);

/* The two entry points of a policy (see the top of this file). */
#define KVMEM_POLICY(name)							\
	char LICENSE[] SEC("license") = "GPL";					\
	SEC("raw_tp")								\
	int choose(__u64 *ctx)							\
	{									\
		return pol_count(decide(ctx[0], ctx[1], ctx[2]));		\
	}									\
	SEC("raw_tp.w/kvmem_reclaim")						\
	int tp_reclaim(__u64 *ctx)						\
	{									\
		struct kt_reclaim_ctx *c = (struct kt_reclaim_ctx *)ctx[0];	\
		__u64 ws = c->ws_id, step = c->step;				\
		__u32 n = c->n_candidates, pick = KT_VERDICT_DEFAULT;		\
									\
		POL_CAND(0) POL_CAND(1) POL_CAND(2) POL_CAND(3)			\
		POL_CAND(4) POL_CAND(5) POL_CAND(6) POL_CAND(7)			\
		/* 0 is the module's own choice: leave the verdict alone */	\
		if (pick != KT_VERDICT_DEFAULT && pick)				\
			c->verdict = pick;					\
		return 0;							\
	}

_Static_assert(KT_RECLAIM_MAX == 8, "POL_CAND lines: one per candidate");

#endif
