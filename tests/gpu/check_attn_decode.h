/* SPDX-License-Identifier: MIT */
/*
 * Decode attention (kernels/cuda/attention.cu, rows = queries x group <= 16)
 * in kvmem_gpu_check: every decode version (2, 3 and 5, the one-launch
 * kernel) against the CPU twin and against itself, and the timing sweep
 * that tests/gpu/attn_decode.sh runs (--attn-decode).
 */
#ifndef KVMEM_TESTS_GPU_CHECK_ATTN_DECODE_H
#define KVMEM_TESTS_GPU_CHECK_ATTN_DECODE_H

/* Key counts 1 to 32768 (to 700 under --quick), odd capacities, GQA 4, 8
 * and 1, head_dim 64 and 128, 1 to 4 queries, shuffled key positions:
 * each version within the twin's tolerance (Documentation/kernels.md) and
 * a relative L2 error under 1e-2, bit for bit itself when run again and
 * when the key count is read from the device over a view of another
 * capacity; v5 in a captured graph of several launches (the counters
 * reused launch after launch) bit for bit the plain calls. */
void check_attn_decode(void);
struct dshape {
	const char *name;
	int n_q, n_kv, heads, kvh, hd;
	int kv_pos;	/* shuffled key positions (plain calls only) */
	double qa;	/* q in [-qa, qa]: 1, or 4 for sharper softmax */
};
/* One shape's decode checks for each version in vs (0: the main path, as
 * the engine calls it): the twin within tolerance, the same bits when run
 * again and (without kv_pos) with the key count on the device over a view
 * of another capacity. */
void check_decode_shape(const struct dshape *s, const int *vs, int nv);
/* A graph of 4 decode calls of version ver (0: the main path) over 4
 * layers' K/V, replayed at key counts from 1 to the capacity: each layer's
 * output equals a plain call bit for bit; the last layer's at 700 keys
 * the twin within tolerance. */
void check_decode_graph(int ver);
/* check_attn_decode(), then (not under --quick) each version's time per
 * layer in a graph of 36 launches over 36 layers' K/V (Qwen3-8B geometry,
 * a view of 131072 slots) at 4096, 32768 and 131072 keys, and as single
 * launches, against the copy rate measured in the same run; the graphs'
 * outputs checked bit for bit against plain calls. */
void attn_decode_sweep(void);

#endif
