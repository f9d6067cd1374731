// SPDX-License-Identifier: MIT
/*
 * Batched attention over many sequences' own views (kernels_cuda_batch.h).
 * CPU twin: kvmem_attention_bf16 of each sequence alone:
 *
 *   for sequence s, its query i, head h (KV head g = h / group):
 *     s_j = scale * q_i . k_j  for keys j of s with kv_pos[j] <= q_pos[i]
 *     out = sum_j softmax(s)_j v_j
 *
 * Version 2 (the main one): the sequences whose rows (queries x the GQA
 * group) fit one 16-row tile, head_dim 64 or 128, run the main path's
 * decode kernel (attention.cu, v5) in one launch, a sequence per
 * blockIdx.z (kvmem_cuda_att_dec_batch): a CTA per (split, KV head,
 * sequence), the group's query heads packed into the tile's rows so each
 * K/V tile is loaded once into shared memory (cp.async ring) for all of
 * them, S and P.V on the tensor cores, online softmax in fp32, the splits
 * combined in order by the last CTA of each (sequence, KV head). A
 * sequence's split count comes from its own key count and the SM count
 * (as the one-sequence decode splits it), so long views split and short
 * ones do not, and its bits are those of the one-sequence decode call:
 * alone, beside others and in any order.
 *
 * Version 1 (the rest: more rows per KV head, other head sizes): work
 * items are (sequence, query, head, split), a split being a run of
 * KVMEM_CUDA_ATT_BATCH_KEYS keys of that sequence. One warp per item
 * running attention v1's loop over its keys (attention_warp.cuh), the
 * partial (o, max, sum) written to scratch; a second kernel, one warp per
 * (sequence, query, head), combines the splits in split order and writes
 * bf16. A sequence's split count and every sum's order depend on its own
 * key count only. Items of all sequences are numbered in one list (a
 * prefix per sequence, found by binary search), so short and long views
 * share one launch without padding. Which version a sequence takes depends
 * on its own shape only.
 *
 * tests/gpu/check_attn_batch.c checks both against the twin and times the
 * batch against one main-path decode call per sequence.
 */
#include <string.h>

#include "cuda_int.h"
#include "attention_warp.cuh"
#include "kernels/kernels_cuda_batch.h"

#define AB_MAX_HD WARP_ATT_MAX_HD
#define AB_WARPS 4	/* warps (items) per block */

/* What the kernels read per sequence, made on the host. */
struct ab_seq {
	kvmem_cuda_att_seq s;
	long long item0;	/* its first work item */
	long long part0;	/* its first partial row (item order) */
	int splits;		/* ceil(n_kv / KEYS), at least 1 */
};

__device__ __forceinline__ int find_seq(const ab_seq *sq, int n, long long item)
{
	int lo = 0, hi = n - 1;

	while (lo < hi) {	/* the last sequence whose item0 <= item */
		int mid = (lo + hi + 1) / 2;

		if (sq[mid].item0 <= item)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

__global__ void __launch_bounds__(32 * AB_WARPS)
ab_split_kernel(const ab_seq *sq, int n_seqs, long long n_items, const uint16_t *q, float *part_o,
		float *part_m, float *part_l, int n_heads, int group, int hd, float scale)
{
	__shared__ float qs_all[AB_WARPS][AB_MAX_HD];
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, per = hd / 32;
	const long long item = (long long)blockIdx.x * AB_WARPS + warp;
	float *qs = qs_all[warp];

	if (item >= n_items)
		return;
	const ab_seq *a = &sq[find_seq(sq, n_seqs, item)];
	const long long local = item - a->item0;
	const int sp = (int)(local % a->splits);
	const long long row = local / a->splits;	/* i * n_heads + h */
	const int i = (int)(row / n_heads), h = (int)(row % n_heads), g = h / group;
	const int qp = a->s.q_pos[i];
	const int j_end = min(a->s.n_kv, (sp + 1) * KVMEM_CUDA_ATT_BATCH_KEYS);
	const uint16_t *kh = a->s.k + (size_t)g * a->s.kv_stride * hd;
	const uint16_t *vh = a->s.v + (size_t)g * a->s.kv_stride * hd;
	const size_t prow = (size_t)(a->part0 + local);
	float o[AB_MAX_HD / 32], m = -INFINITY, l = 0.0f;

	for (int d = lane; d < hd; d += 32)
		qs[d] = bf2f(q[((size_t)(a->s.q0 + i) * n_heads + h) * hd + d]);
	for (int c = 0; c < AB_MAX_HD / 32; c++)
		o[c] = 0.0f;
	__syncwarp();
	warp_attend(qs, kh, vh, a->s.kv_pos, qp, sp * KVMEM_CUDA_ATT_BATCH_KEYS, j_end, hd, scale,
		    lane, o, &m, &l);
	for (int c = 0; c < per; c++)
		part_o[prow * hd + lane + 32 * c] = o[c];
	if (lane == 0) {
		part_m[prow] = m;
		part_l[prow] = l;
	}
}

/* One warp per (sequence, query, head): the splits in order. */
__global__ void __launch_bounds__(32 * AB_WARPS)
ab_combine_kernel(const ab_seq *sq, int n_seqs, long long n_rows_all, const long long *row0,
		  uint16_t *out, const float *part_o, const float *part_m, const float *part_l,
		  int n_heads, int hd)
{
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, per = hd / 32;
	const long long r = (long long)blockIdx.x * AB_WARPS + warp;
	int lo = 0, hi = n_seqs - 1;

	if (r >= n_rows_all)
		return;
	while (lo < hi) {	/* the last sequence whose first row <= r */
		int mid = (lo + hi + 1) / 2;

		if (row0[mid] <= r)
			lo = mid;
		else
			hi = mid - 1;
	}
	const ab_seq *a = &sq[lo];
	const long long row = r - row0[lo];	/* i * n_heads + h */
	const size_t p0 = (size_t)(a->part0 + row * a->splits);
	float mx = -INFINITY, l = 0.0f, o[AB_MAX_HD / 32];

	for (int sp = 0; sp < a->splits; sp++)
		mx = fmaxf(mx, part_m[p0 + sp]);
	for (int c = 0; c < AB_MAX_HD / 32; c++)
		o[c] = 0.0f;
	if (mx != -INFINITY)
		for (int sp = 0; sp < a->splits; sp++) {
			const float ms = part_m[p0 + sp];
			const float w = ms == -INFINITY ? 0.0f : expf(ms - mx);

			l += part_l[p0 + sp] * w;
			for (int c = 0; c < per; c++)
				o[c] += part_o[(p0 + sp) * hd + lane + 32 * c] * w;
		}
	const float inv = l > 0.0f ? 1.0f / l : 0.0f;
	uint16_t *dst = out + ((size_t)a->s.q0 * n_heads + row) * hd;

	for (int c = 0; c < per; c++)
		dst[lane + 32 * c] = f2bf(o[c] * inv);
}

static int batch_v1(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
		    const kvmem_cuda_att_seq *seqs, int n_seqs, int n_heads, int n_kv_heads,
		    int head_dim, float scale)
{
	const int K = KVMEM_CUDA_ATT_BATCH_KEYS;
	long long items = 0, rows = 0;
	size_t meta, bytes;
	ab_seq *h;
	long long *row0;
	char *scratch;
	int rc;

	if (n_seqs < 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads ||
	    head_dim <= 0 || head_dim % 32 || head_dim > AB_MAX_HD)
		return kvmem_error(EINVAL, "cuda attention batch: bad shape (%d sequences, %d/%d "
				   "heads, head_dim %d: a multiple of 32 up to %d)", n_seqs, n_heads,
				   n_kv_heads, head_dim, AB_MAX_HD);
	if (!n_seqs)
		return 0;
	h = (ab_seq *)malloc(sizeof(*h) * n_seqs);
	row0 = (long long *)malloc(sizeof(*row0) * n_seqs);
	if (!h || !row0) {
		free(h);
		free(row0);
		return kvmem_error(ENOMEM, "cuda attention batch: out of memory for %d sequences",
				   n_seqs);
	}
	for (int s = 0; s < n_seqs; s++) {
		const kvmem_cuda_att_seq *x = &seqs[s];

		if (x->k_scale || x->v_scale)
			return kvmem_error(EINVAL, "cuda attention batch: sequence %d is fp8 (bf16 "
					   "views only; fp8 ones: kvmem_cuda_att_dec_batch)", s);
		if (x->n_q < 0 || x->q0 < 0 || x->n_kv < 0 || x->kv_stride < x->n_kv ||
		    (x->n_kv && (!x->k || !x->v)) || (x->n_q && !x->q_pos)) {
			free(h);
			free(row0);
			return kvmem_error(EINVAL, "cuda attention batch: sequence %d: bad shape (%d "
					   "queries at row %d, %d keys of stride %lld)", s, x->n_q,
					   x->q0, x->n_kv, x->kv_stride);
		}
		h[s].s = *x;
		h[s].splits = x->n_kv ? (x->n_kv + K - 1) / K : 1;
		h[s].item0 = items;
		h[s].part0 = items;	/* one partial row per item */
		row0[s] = rows;
		items += (long long)x->n_q * n_heads * h[s].splits;
		rows += (long long)x->n_q * n_heads;
	}
	meta = kvmem_align_up(sizeof(*h) * n_seqs + sizeof(*row0) * n_seqs, 256);
	bytes = meta + (size_t)items * sizeof(float) * (head_dim + 2);
	if ((rc = kvmem_cuda_scratch(c, bytes, (void **)&scratch)))
		goto out;
	/* Pageable source: the copy is staged before the call returns, so
	 * h and row0 may be freed. */
	if ((rc = kvmem_cuda_err(cudaMemcpyAsync(scratch, h, sizeof(*h) * n_seqs,
						 cudaMemcpyHostToDevice, c->stream),
				 "cuda attention batch: sequences")) ||
	    (rc = kvmem_cuda_err(cudaMemcpyAsync(scratch + sizeof(*h) * n_seqs, row0,
						 sizeof(*row0) * n_seqs, cudaMemcpyHostToDevice,
						 c->stream),
				 "cuda attention batch: rows")))
		goto out;
	if (items) {
		float *po = (float *)(scratch + meta);
		float *pm = po + (size_t)items * head_dim, *pl = pm + items;
		const ab_seq *dsq = (const ab_seq *)scratch;

		ab_split_kernel<<<(unsigned)((items + AB_WARPS - 1) / AB_WARPS), 32 * AB_WARPS, 0,
				  c->stream>>>(dsq, n_seqs, items, q, po, pm, pl, n_heads,
					       n_heads / n_kv_heads, head_dim, scale);
		if ((rc = kvmem_cuda_launched("cuda attention batch: splits")))
			goto out;
		ab_combine_kernel<<<(unsigned)((rows + AB_WARPS - 1) / AB_WARPS), 32 * AB_WARPS, 0,
				    c->stream>>>(dsq, n_seqs, rows,
						 (const long long *)(scratch + sizeof(*h) * n_seqs),
						 out, po, pm, pl, n_heads, head_dim);
		rc = kvmem_cuda_launched("cuda attention batch: combine");
	}
out:
	free(h);
	free(row0);
	return rc;
}

/* Version 2's sequences: rows per KV head within one tile, head_dim 64 or
 * 128, and keys to attend. */
static int takes_v2(const kvmem_cuda_att_seq *x, int group, int head_dim)
{
	return (head_dim == 64 || head_dim == 128) && (long long)x->n_q * group <= 16;
}

extern "C" int kvmem_cuda_attention_batch(kvmem_cuda_ctx *c, uint16_t *out, const uint16_t *q,
					  const kvmem_cuda_att_seq *seqs, int n_seqs, int n_heads,
					  int n_kv_heads, int head_dim, float scale)
{
	const kvmem_cuda_att_seq **two = NULL;
	kvmem_cuda_att_seq *one = NULL;
	int n1 = 0, n2 = 0, rc = 0, group;

	if (n_seqs < 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads ||
	    head_dim <= 0 || head_dim % 32 || head_dim > AB_MAX_HD || (n_seqs && !seqs))
		return kvmem_error(EINVAL, "cuda attention batch: bad shape (%d sequences, %d/%d "
				   "heads, head_dim %d: a multiple of 32 up to %d)", n_seqs, n_heads,
				   n_kv_heads, head_dim, AB_MAX_HD);
	if (!n_seqs)
		return 0;
	group = n_heads / n_kv_heads;
	for (int s = 0; s < n_seqs; s++) {
		const kvmem_cuda_att_seq *x = &seqs[s];

		if (x->k_scale || x->v_scale)
			return kvmem_error(EINVAL, "cuda attention batch: sequence %d is fp8 (bf16 "
					   "views only; fp8 ones: kvmem_cuda_att_dec_batch)", s);
		if (x->n_q < 0 || x->q0 < 0 || x->n_kv < 0 || x->kv_stride < x->n_kv ||
		    (x->n_kv && (!x->k || !x->v)) || (x->n_q && !x->q_pos))
			return kvmem_error(EINVAL, "cuda attention batch: sequence %d: bad shape (%d "
					   "queries at row %d, %d keys of stride %lld)", s, x->n_q,
					   x->q0, x->n_kv, x->kv_stride);
	}
	one = (kvmem_cuda_att_seq *)malloc(sizeof(*one) * (size_t)n_seqs);
	two = (const kvmem_cuda_att_seq **)malloc(sizeof(*two) * (size_t)n_seqs);
	if (!one || !two) {
		rc = kvmem_error(ENOMEM, "cuda attention batch: out of memory for %d sequences",
				 n_seqs);
		goto out;
	}
	for (int s = 0; s < n_seqs; s++)
		if (!seqs[s].n_q)
			continue;	/* nothing to compute */
		else if (takes_v2(&seqs[s], group, head_dim))
			two[n2++] = &seqs[s];
		else
			one[n1++] = seqs[s];
	if (n2 && (rc = kvmem_cuda_att_dec_batch(c, out, q, two, n2, n_heads, n_kv_heads, head_dim,
						 scale)))
		goto out;
	if (n1)
		rc = batch_v1(c, out, q, one, n1, n_heads, n_kv_heads, head_dim, scale);
out:
	free(one);
	free(two);
	return rc;
}
