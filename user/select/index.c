// SPDX-License-Identifier: MIT
/*
 * The index: per (block, layer, KV head) summaries of raw K.
 *
 * Mean-K is kept for every block, including the partial last one, whose
 * mean is recomputed from a running fp32 sum at every token: a summary is
 * never stale. Completed blocks keep their final mean. Per-dimension
 * min/max and quarter-block means are kept only when asked for.
 *
 * Layout is layer-major ([L][H][blocks][D]): one (layer, KV head) is a
 * contiguous run, which is what scoring streams through. Growing the block
 * capacity re-lays the arrays (amortised by doubling).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "select/select.h"

int kvmem_index_init(kvmem_index *ix, int n_layers, int n_kv_heads, int head_dim, int block,
		   unsigned sums)
{
	memset(ix, 0, sizeof(*ix));
	if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0)
		return kvmem_error(EINVAL, "index: bad geometry %d layers, %d KV heads, head_dim %d",
				 n_layers, n_kv_heads, head_dim);
	if (block < KVMEM_BLOCK_MIN || block > KVMEM_BLOCK_MAX || (block & (block - 1)))
		return kvmem_error(EINVAL, "index: block size %d is not a power of two from %d to %d",
				 block, KVMEM_BLOCK_MIN, KVMEM_BLOCK_MAX);
	ix->n_layers = n_layers;
	ix->n_kv_heads = n_kv_heads;
	ix->head_dim = head_dim;
	ix->block = block;
	ix->sub_len = block / KVMEM_SUBBLOCKS;
	ix->sums = (sums & (KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK)) | KVMEM_SUM_MEANK;
	ix->open_sum = calloc((size_t)n_layers * n_kv_heads * head_dim, sizeof(float));
	ix->open_sub = calloc((size_t)n_layers * n_kv_heads * head_dim, sizeof(float));
	if (!ix->open_sum || !ix->open_sub) {
		kvmem_index_free(ix);
		return kvmem_error(ENOMEM, "index: out of memory");
	}
	return 0;
}

void kvmem_index_free(kvmem_index *ix)
{
	free(ix->meank);
	free(ix->kmin);
	free(ix->kmax);
	free(ix->sub);
	free(ix->open_sum);
	free(ix->open_sub);
	memset(ix, 0, sizeof(*ix));
}

/* Re-lay one [L*H][old][per] array as [L*H][cap][per]. Summaries not yet
 * written read as zeros, never as garbage: calloc's, which for arrays this
 * large are fresh pages the kernel zeroes as they are first written (by the
 * threads appending tokens), not a memset here. At Qwen3-8B a 16K prefill's
 * index is 226 MB with min/max; zeroing it at each doubling on the writer
 * thread made the session wait for the writer. */
static float *relay(float *old, size_t runs, int64_t old_cap, int64_t cap, size_t per)
{
	float *n = calloc(runs * (size_t)cap * per, sizeof(float));

	if (!n)
		return NULL;
	for (size_t r = 0; old && r < runs; r++)
		memcpy(n + r * cap * per, old + r * old_cap * per,
		       (size_t)old_cap * per * sizeof(float));
	return n;
}

int kvmem_index_reserve(kvmem_index *ix, int64_t n_blocks)
{
	size_t runs = (size_t)ix->n_layers * ix->n_kv_heads, d = ix->head_dim;
	float *m = NULL, *lo = NULL, *hi = NULL, *sb = NULL;
	int64_t cap;

	if (n_blocks <= ix->cap_blocks)
		return 0;
	cap = ix->cap_blocks ? ix->cap_blocks : 64;
	while (cap < n_blocks)
		cap *= 2;
	m = relay(ix->meank, runs, ix->cap_blocks, cap, d);
	if (ix->sums & KVMEM_SUM_MINMAX) {
		lo = relay(ix->kmin, runs, ix->cap_blocks, cap, d);
		hi = relay(ix->kmax, runs, ix->cap_blocks, cap, d);
	}
	if (ix->sums & KVMEM_SUM_SUBBLOCK)
		sb = relay(ix->sub, runs, ix->cap_blocks, cap, d * KVMEM_SUBBLOCKS);
	if (!m || ((ix->sums & KVMEM_SUM_MINMAX) && (!lo || !hi)) ||
	    ((ix->sums & KVMEM_SUM_SUBBLOCK) && !sb)) {
		free(m);
		free(lo);
		free(hi);
		free(sb);
		return kvmem_error(ENOMEM, "index: out of memory for %lld blocks (%d layers x %d KV heads x %d)",
				 (long long)cap, ix->n_layers, ix->n_kv_heads, ix->head_dim);
	}
	free(ix->meank);
	free(ix->kmin);
	free(ix->kmax);
	free(ix->sub);
	ix->meank = m;
	ix->kmin = lo;
	ix->kmax = hi;
	ix->sub = sb;
	ix->cap_blocks = cap;
	return 0;
}

int kvmem_index_block_len(const kvmem_index *ix, int64_t b)
{
	int64_t left = ix->n_tokens - b * ix->block;

	return left >= ix->block ? ix->block : (left > 0 ? (int)left : 0);
}

int kvmem_index_sub_len(const kvmem_index *ix, int64_t b, int s)
{
	int left = kvmem_index_block_len(ix, b) - s * ix->sub_len;

	return left >= ix->sub_len ? ix->sub_len : (left > 0 ? left : 0);
}

static inline float *at(float *base, const kvmem_index *ix, int l, int h, int64_t b)
{
	return base + (((size_t)l * ix->n_kv_heads + h) * ix->cap_blocks + b) * ix->head_dim;
}

/*
 * One token at in-block offset t of block b, for layer l and KV head h.
 * The open sums restart at the first token of a block / sub-block. The
 * stored mean is sum / count as of the token that last wrote it: `last`
 * says this token is the last of its run in this append (the end of its
 * block or of the append), the only one whose mean can be read afterwards
 * (nothing reads the index during an append), so it alone divides: the
 * same bits as dividing after every token, at 1/32 of the divisions (a
 * 1024-token chunk at Qwen3-8B: 151M of them were a third of the writer
 * thread's index time).
 */
static void add_token(kvmem_index *ix, const float *k, int l, int h, int64_t b, int t, int last)
{
	const int d = ix->head_dim;
	size_t o = ((size_t)l * ix->n_kv_heads + h) * d;
	float *sum = ix->open_sum + o;
	float inv;
	int i;

	if (t == 0)
		memcpy(sum, k, d * sizeof(float));
	else
		for (i = 0; i < d; i++)
			sum[i] += k[i];
	if (last || t == ix->block - 1) {
		float *mean = at(ix->meank, ix, l, h, b);

		inv = (float)(t + 1);
		for (i = 0; i < d; i++)
			mean[i] = sum[i] / inv;
	}

	if (ix->sums & KVMEM_SUM_MINMAX) {
		float *lo = at(ix->kmin, ix, l, h, b), *hi = at(ix->kmax, ix, l, h, b);

		if (t == 0) {
			memcpy(lo, k, d * sizeof(float));
			memcpy(hi, k, d * sizeof(float));
		} else {
			for (i = 0; i < d; i++) {
				lo[i] = k[i] < lo[i] ? k[i] : lo[i];
				hi[i] = k[i] > hi[i] ? k[i] : hi[i];
			}
		}
	}
	if (ix->sums & KVMEM_SUM_SUBBLOCK) {
		int s = t / ix->sub_len, u = t % ix->sub_len;
		float *ssum = ix->open_sub + o;

		if (u == 0)
			memcpy(ssum, k, d * sizeof(float));
		else
			for (i = 0; i < d; i++)
				ssum[i] += k[i];
		if (last || u == ix->sub_len - 1) {
			float *smean = ix->sub + ((((size_t)l * ix->n_kv_heads + h) * ix->cap_blocks + b) *
						  KVMEM_SUBBLOCKS + s) * d;

			inv = (float)(u + 1);
			for (i = 0; i < d; i++)
				smean[i] = ssum[i] / inv;
		}
	}
}

int kvmem_index_append(kvmem_index *ix, const float *raw_k, int n)
{
	return kvmem_index_append_rows(ix, raw_k, KVMEM_DTYPE_F32, n);
}

int kvmem_index_append_rows(kvmem_index *ix, const void *raw_k, uint32_t dtype, int n)
{
	const int H = ix->n_kv_heads, d = ix->head_dim;
	const int bf16 = dtype == KVMEM_DTYPE_BF16;
	int64_t first = ix->n_tokens;

	if (n < 0)
		return kvmem_error(EINVAL, "index: negative token count %d", n);
	if (dtype != KVMEM_DTYPE_F32 && !bf16)
		return kvmem_error(EINVAL, "index: rows of dtype %u (f32 or bf16)", dtype);
	if (kvmem_index_reserve(ix, (first + n + ix->block - 1) / ix->block))
		return kvmem_fail();
	/* (layer, KV head) runs on the OpenMP threads when there is enough
	 * work (a prefill chunk, not a decode step): a run's summaries and open
	 * sums are its own, and each is still summed in token order, so the
	 * bits do not depend on the threads. Runs, not layers: Qwen3-8B's 36
	 * layers on 16 threads took 3 rounds where 2.25 do the work; its 288
	 * runs divide evenly. */
	#pragma omp parallel for schedule(static) \
		if (ix->n_layers * H > 1 && (size_t)n * ix->n_layers * H * d >= ((size_t)1 << 16))
	for (int lh = 0; lh < ix->n_layers * H; lh++) {
		const int l = lh / H, h = lh % H;
		const size_t kl = (size_t)l * n * H * d;
		float row[d];

		for (int j = 0; j < n; j++) {
			const int64_t p = first + j;
			const size_t at = kl + ((size_t)j * H + h) * d;
			const float *k = (const float *)raw_k + at;

			if (bf16) {
				kvmem_bf16_to_f32_n(row, (const uint16_t *)raw_k + at, (size_t)d);
				k = row;
			}
			add_token(ix, k, l, h, p / ix->block, (int)(p % ix->block), j == n - 1);
		}
	}
	ix->n_tokens = first + n;
	ix->n_blocks = (ix->n_tokens + ix->block - 1) / ix->block;
	return 0;
}

int kvmem_index_put(kvmem_index *ix, const float *meank, const float *kmin, const float *kmax,
		    const float *sub, const float *open_sum, const float *open_sub, int n)
{
	const int64_t first = ix->n_tokens, b0 = first / ix->block;
	const int B = ix->block, t0 = (int)(first % B), runs = ix->n_layers * ix->n_kv_heads;
	const size_t D = (size_t)ix->head_dim;
	int64_t nb;
	/* The quarter-block means those tokens wrote: [s0, s1) of the run's
	 * first block's four. */
	int s0, s1;

	if (n <= 0)
		return n ? kvmem_error(EINVAL, "index: negative token count %d", n) : 0;
	if (!meank || !open_sum || ((ix->sums & KVMEM_SUM_MINMAX) && (!kmin || !kmax)) ||
	    ((ix->sums & KVMEM_SUM_SUBBLOCK) && (!sub || !open_sub)))
		return kvmem_error(EINVAL, "index: summaries of %d tokens without the arrays the "
				   "index keeps", n);
	nb = (t0 + n - 1) / B + 1;
	s0 = t0 / ix->sub_len;
	s1 = (t0 + n - 1) / ix->sub_len + 1;
	if (kvmem_index_reserve(ix, b0 + nb))
		return kvmem_fail();
	#pragma omp parallel for schedule(static) if ((size_t)runs * nb * D >= ((size_t)1 << 16))
	for (int r = 0; r < runs; r++) {
		const size_t w = (size_t)r * nb * D, at = ((size_t)r * ix->cap_blocks + b0) * D;

		memcpy(ix->meank + at, meank + w, nb * D * sizeof(float));
		if (ix->sums & KVMEM_SUM_MINMAX) {
			memcpy(ix->kmin + at, kmin + w, nb * D * sizeof(float));
			memcpy(ix->kmax + at, kmax + w, nb * D * sizeof(float));
		}
		if (ix->sums & KVMEM_SUM_SUBBLOCK)
			memcpy(ix->sub + at * KVMEM_SUBBLOCKS + s0 * D,
			       sub + w * KVMEM_SUBBLOCKS + s0 * D, (size_t)(s1 - s0) * D * sizeof(float));
	}
	memcpy(ix->open_sum, open_sum, (size_t)runs * D * sizeof(float));
	if (ix->sums & KVMEM_SUM_SUBBLOCK)
		memcpy(ix->open_sub, open_sub, (size_t)runs * D * sizeof(float));
	ix->n_tokens = first + n;
	ix->n_blocks = (ix->n_tokens + B - 1) / B;
	return 0;
}

void kvmem_index_state(const kvmem_index *ix, float *sum, float *sub, float *lo, float *hi)
{
	const int runs = ix->n_layers * ix->n_kv_heads;
	const size_t D = (size_t)ix->head_dim;
	const int64_t b = ix->n_tokens / ix->block;

	memcpy(sum, ix->open_sum, runs * D * sizeof(float));
	if (sub)
		memcpy(sub, ix->open_sub, runs * D * sizeof(float));
	if (!lo || !hi || !(ix->sums & KVMEM_SUM_MINMAX) || !(ix->n_tokens % ix->block))
		return;
	for (int r = 0; r < runs; r++) {
		memcpy(lo + r * D, ix->kmin + ((size_t)r * ix->cap_blocks + b) * D, D * sizeof(float));
		memcpy(hi + r * D, ix->kmax + ((size_t)r * ix->cap_blocks + b) * D, D * sizeof(float));
	}
}

/* ---- the public accessors (kvmem/session.h: the index is opaque there) ---- */
static size_t run_at(const kvmem_index *ix, int l, int h, int64_t b)
{
	return ((size_t)l * ix->n_kv_heads + h) * ix->cap_blocks + b;
}

int64_t kvmem_index_blocks(const kvmem_index *ix)
{
	return ix->n_blocks;
}

int kvmem_index_block_size(const kvmem_index *ix)
{
	return ix->block;
}

unsigned kvmem_index_sums(const kvmem_index *ix)
{
	return ix->sums;
}

const float *kvmem_index_meank(const kvmem_index *ix, int l, int h, int64_t b)
{
	return ix->meank + run_at(ix, l, h, b) * ix->head_dim;
}

const float *kvmem_index_min(const kvmem_index *ix, int l, int h, int64_t b)
{
	return ix->kmin ? ix->kmin + run_at(ix, l, h, b) * ix->head_dim : NULL;
}

const float *kvmem_index_max(const kvmem_index *ix, int l, int h, int64_t b)
{
	return ix->kmax ? ix->kmax + run_at(ix, l, h, b) * ix->head_dim : NULL;
}

const float *kvmem_index_sub(const kvmem_index *ix, int l, int h, int64_t b, int s)
{
	return ix->sub ? ix->sub + (run_at(ix, l, h, b) * KVMEM_SUBBLOCKS + s) * ix->head_dim :
			 NULL;
}
