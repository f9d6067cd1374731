// SPDX-License-Identifier: MIT
/*
 * Token sampling on the GPU (twin: kvmem_sample_token -> kvmem_sample in
 * kernels/cpu/sample.c), with the twin's rules so the same logits and RNG
 * state give the same token:
 *
 *   rank      higher logit first, ties to the lower id, NaN as -inf (rank
 *             keys: -0 and +0 are one key, as they compare equal in C)
 *   greedy    temperature <= 0: the best-ranked id; the RNG is not touched
 *   top-k     the k best (k = top_k in (0, vocab), else all), in rank order
 *   softmax   p_i = exp((l_i - l_0) / T) in double; a non-finite l_0 picks
 *             id 0 of the order without touching the RNG
 *   top-p     the shortest prefix whose running sum reaches top_p * sum
 *   draw      u = uniform (splitmix64, one step) * the kept sum; the first i
 *             with u < running sum_i, else the last kept
 *
 * The candidates come from a radix select plus a bitonic sort in one block
 * (k <= 1024) or from a stable single-block radix sort of the vocabulary
 * (larger k: a rare setting, about 0.2 ms). The running sums are the twin's
 * sequential double sums when k <= 1024 (one candidate per thread, prefix by
 * one thread in order); past 1024 each thread sums a run of candidates
 * first. exp in double differs from glibc's by at most an ulp, so the token
 * is the twin's unless u falls within about 1e-15 of a boundary between two
 * candidates' running sums.
 */
#include "cuda_int.h"
#include "select.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_KMAX 1024
#define SORT_THREADS 512
#define GOLDEN 0x9e3779b97f4a7c15ull

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ---- greedy --------------------------------------------------------------- */
/*
 * The block's best (rank key, id): the highest key, ties to the lowest id
 * (INT_MAX: a thread that saw none). Every thread brings its own; thread 0
 * returns the block's id. sk, si: one slot a warp in shared memory.
 */
__device__ int block_best(uint32_t bk, int bi, uint32_t *sk, int *si)
{
	for (int o = 16; o > 0; o >>= 1) {
		uint32_t k2 = __shfl_xor_sync(0xffffffffu, bk, o);
		int i2 = __shfl_xor_sync(0xffffffffu, bi, o);

		if (i2 != INT_MAX && (bi == INT_MAX || k2 > bk || (k2 == bk && i2 < bi))) {
			bk = k2;
			bi = i2;
		}
	}
	if ((threadIdx.x & 31) == 0) {
		sk[threadIdx.x >> 5] = bk;
		si[threadIdx.x >> 5] = bi;
	}
	__syncthreads();
	if (threadIdx.x == 0)
		for (int w = 1; w < (int)(blockDim.x >> 5); w++)
			if (si[w] != INT_MAX && (sk[w] > bk || (sk[w] == bk && si[w] < bi))) {
				bk = sk[w];
				bi = si[w];
			}
	return bi;
}

__global__ void argmax_kernel(int32_t *token, const float *logits, int vocab)
{
	__shared__ uint32_t sk[32];
	__shared__ int si[32];
	uint32_t bk = 0;
	int bi = INT_MAX;

	for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
		uint32_t k = rank_key(logits[i]);

		if (bi == INT_MAX || k > bk) {	/* ids ascend per thread: strict keeps the lowest */
			bk = k;
			bi = i;
		}
	}
	bi = block_best(bk, bi, sk, si);
	if (threadIdx.x == 0)
		*token = bi;
}

/*
 * Rows of a batched decode (kvmem_cuda_argmax_rows): block i reads row i
 * once, copying it to dst[i] where there is one, and keeps the best rank
 * key with the lowest id (the twin's first of the highest: -0 and +0 are
 * one key, as they compare equal) and whether any logit is NaN or
 * infinite, which the twin answers with -1.
 */
#define ROWS_THREADS 512

__global__ void argmax_rows_kernel(int32_t *out, float *const *dst, const float *logits,
				   int vocab)
{
	__shared__ uint32_t sk[ROWS_THREADS / 32];
	__shared__ int si[ROWS_THREADS / 32];
	const float *row = logits + (size_t)blockIdx.x * vocab;
	float *copy = dst ? dst[blockIdx.x] : NULL;
	uint32_t bk = 0;
	int bi = INT_MAX, bad = 0;

	for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
		const float f = row[i];
		const uint32_t k = rank_key(f);

		if (copy)
			copy[i] = f;
		bad |= !isfinite(f);
		if (bi == INT_MAX || k > bk) {
			bk = k;
			bi = i;
		}
	}
	bad = __syncthreads_or(bad);
	bi = block_best(bk, bi, sk, si);
	if (threadIdx.x == 0)
		out[blockIdx.x] = bad ? -1 : bi;
}

int kvmem_cuda_argmax_rows(kvmem_cuda_ctx *c, int32_t *out, float *const *dst,
			   const float *logits, int n, int vocab)
{
	if (vocab <= 0 || n < 0)
		return kvmem_error(EINVAL, "argmax rows: %d rows of %d logits", n, vocab);
	if (!n)
		return 0;
	argmax_rows_kernel<<<n, ROWS_THREADS, 0, c->stream>>>(out, dst, logits, vocab);
	return kvmem_cuda_launched("argmax rows");
}

/* ---- the draw over ranked candidates -------------------------------------- */
/*
 * keys[0..n): rank keys, best first; ids the token ids; p: n doubles of
 * scratch. Run by the whole block.
 */
__device__ void finish_draw(const uint32_t *keys, const int *ids, int n, double *p, float temp,
			    float top_p, uint64_t *rng, int32_t *token)
{
	__shared__ double part[SAMPLE_THREADS];
	__shared__ double s_total, s_sum, s_u;
	__shared__ int s_first, s_pick;
	const int tid = threadIdx.x, nt = blockDim.x;
	const double top = key_value(keys[0]);
	const int chunk = (n + nt - 1) / nt, lo = tid * chunk, hi = min(n, lo + chunk);
	int keep = n;
	double sum;

	if (!isfinite(top)) {	/* inf wins outright; all -inf: the first */
		if (tid == 0)
			*token = ids[0];
		return;
	}
	for (int i = tid; i < n; i += nt)
		p[i] = exp(__ddiv_rn(__dsub_rn((double)key_value(keys[i]), top), (double)temp));
	__syncthreads();
	{
		double loc = 0.0;

		for (int i = lo; i < hi; i++)
			loc = __dadd_rn(loc, p[i]);
		part[tid] = loc;
	}
	__syncthreads();
	if (tid == 0) {
		double run = 0.0;

		for (int t = 0; t < nt; t++) {
			double v = part[t];

			part[t] = run;	/* exclusive: the running sum before thread t's run */
			run = __dadd_rn(run, v);
		}
		s_total = run;
		s_first = n;
	}
	__syncthreads();
	const double base = part[tid];

	sum = s_total;
	if (top_p > 0.0f && top_p < 1.0f) {
		const double want = (double)top_p * sum;
		double c = base;

		for (int i = lo; i < hi; i++) {
			c = __dadd_rn(c, p[i]);
			if (c >= want) {
				atomicMin(&s_first, i);
				break;
			}
		}
		__syncthreads();
		keep = s_first < n ? s_first + 1 : n;
		if (lo <= keep - 1 && keep - 1 < hi) {
			c = base;
			for (int i = lo; i <= keep - 1; i++)
				c = __dadd_rn(c, p[i]);
			s_sum = c > 0.0 ? c : p[0];
		}
		__syncthreads();
		sum = s_sum;
	}
	if (tid == 0) {
		*rng += GOLDEN;
		s_u = (double)(mix64(*rng) >> 11) * 0x1p-53 * sum;
		s_pick = keep - 1;
	}
	__syncthreads();
	{
		const double u = s_u;
		double c = base;

		for (int i = lo; i < hi && i < keep; i++) {
			c = __dadd_rn(c, p[i]);
			if (u < c) {
				atomicMin(&s_pick, i);
				break;
			}
		}
	}
	__syncthreads();
	if (tid == 0)
		*token = ids[s_pick];
}

/* ---- k <= 1024: radix select + bitonic sort in one block ------------------ */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_small_kernel(int32_t *token, const float *logits, int vocab, int k, float temp, float top_p,
		    uint64_t *rng)
{
	__shared__ unsigned long long cand[SAMPLE_KMAX];	/* key << 32 | ~id: larger is better */
	__shared__ uint32_t skey[SAMPLE_KMAX];
	__shared__ int sid[SAMPLE_KMAX];
	__shared__ double sp[SAMPLE_KMAX];
	__shared__ int s_gt;
	const int tid = threadIdx.x;
	int64_t need;
	auto key = [&](int64_t i) { return rank_key(logits[i]); };
	const uint32_t T = block_radix_select(key, vocab, k, &need);
	const int n_gt = k - (int)need;
	const int chunk = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
	const int lo = tid * chunk, hi = min(vocab, lo + chunk);
	int ties = 0;

	for (int i = tid; i < SAMPLE_KMAX; i += SAMPLE_THREADS)
		cand[i] = 0;	/* below every real candidate (its id part is ~id >= 1) */
	if (tid == 0)
		s_gt = 0;
	for (int i = lo; i < hi; i++)
		ties += key(i) == T;
	/* The ties taken are the `need` lowest ids: ranks in id order. */
	int tie_rank = block_exclusive_scan<int>(ties, NULL);	/* synchronises: cand, s_gt ready */

	for (int i = lo; i < hi; i++) {
		uint32_t x = key(i);
		unsigned long long c = ((unsigned long long)x << 32) | (uint32_t)~(uint32_t)i;

		if (x > T)
			cand[atomicAdd(&s_gt, 1)] = c;	/* any slot: sorted below */
		else if (x == T) {
			if (tie_rank < need)
				cand[n_gt + tie_rank] = c;
			tie_rank++;
		}
	}
	/* Bitonic sort, descending. */
	for (int size = 2; size <= SAMPLE_KMAX; size <<= 1)
		for (int stride = size >> 1; stride > 0; stride >>= 1) {
			__syncthreads();
			int j = tid ^ stride;

			if (j > tid) {
				unsigned long long x = cand[tid], y = cand[j];
				bool desc = (tid & size) == 0;

				if (desc ? x < y : x > y) {
					cand[tid] = y;
					cand[j] = x;
				}
			}
		}
	__syncthreads();
	if (tid < k) {
		skey[tid] = (uint32_t)(cand[tid] >> 32);
		sid[tid] = (int)~(uint32_t)cand[tid];
	}
	__syncthreads();
	finish_draw(skey, sid, k, sp, temp, top_p, rng, token);
}

/* ---- larger k: stable radix sort of the whole vocabulary, one block ------- */
/*
 * Ascending on ~rank_key (so best first), 4 bits a pass, 8 passes; each
 * thread keeps a contiguous run, counts its digits, and after a scan in
 * (digit, thread) order writes its run in order: stable, so ties keep
 * ascending ids. Ends in (ka, ia).
 */
__global__ void __launch_bounds__(SORT_THREADS)
sort_vocab_kernel(const float *logits, int vocab, uint32_t *ka, int *ia, uint32_t *kb, int *ib)
{
	__shared__ int cnt[16][SORT_THREADS];
	const int tid = threadIdx.x;
	const int chunk = (vocab + SORT_THREADS - 1) / SORT_THREADS;
	const int lo = tid * chunk, hi = min(vocab, lo + chunk);

	for (int i = lo; i < hi; i++) {
		ka[i] = ~rank_key(logits[i]);
		ia[i] = i;
	}
	for (int pass = 0; pass < 8; pass++) {
		const int shift = 4 * pass;
		const uint32_t *ks = pass & 1 ? kb : ka;
		const int *is = pass & 1 ? ib : ia;
		uint32_t *kd = pass & 1 ? ka : kb;
		int *id = pass & 1 ? ia : ib;
		int c[16];

		for (int d = 0; d < 16; d++)
			c[d] = 0;
		__syncthreads();	/* the previous pass's writes are visible */
		for (int i = lo; i < hi; i++)
			c[(ks[i] >> shift) & 15]++;
		for (int d = 0; d < 16; d++)
			cnt[d][tid] = c[d];
		__syncthreads();
		/* Exclusive scan of cnt flattened as [digit][thread]: thread t
		 * scans entries t*16 .. t*16+15 of that order. */
		{
			int *flat = &cnt[0][0], loc[16], run = 0;

			for (int e = 0; e < 16; e++) {
				loc[e] = run;
				run += flat[tid * 16 + e];
			}
			int base = block_exclusive_scan<int>(run, NULL);

			for (int e = 0; e < 16; e++)
				flat[tid * 16 + e] = base + loc[e];
		}
		__syncthreads();
		for (int d = 0; d < 16; d++)
			c[d] = cnt[d][tid];
		for (int i = lo; i < hi; i++) {
			int d = (ks[i] >> shift) & 15, at = c[d]++;

			kd[at] = ks[i];
			id[at] = is[i];
		}
	}
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_sorted_kernel(int32_t *token, uint32_t *keys, const int *ids, int k, double *p, float temp,
		     float top_p, uint64_t *rng)
{
	for (int i = threadIdx.x; i < k; i += blockDim.x)
		keys[i] = ~keys[i];	/* back to rank keys, best first */
	__syncthreads();
	finish_draw(keys, ids, k, p, temp, top_p, rng, token);
}

extern "C" int kvmem_cuda_sample_token(kvmem_cuda_ctx *c, int32_t *token, const float *logits,
				       int vocab, const kvmem_sampler *s, uint64_t *rng)
{
	int k, rc;

	if (vocab <= 0)
		return kvmem_error(EINVAL, "sample: vocabulary of %d tokens", vocab);
	if (s->temperature <= 0.0f) {
		argmax_kernel<<<1, SAMPLE_THREADS, 0, c->stream>>>(token, logits, vocab);
		return kvmem_cuda_launched("sample (greedy)");
	}
	k = (s->top_k > 0 && s->top_k < vocab) ? s->top_k : vocab;
	if (k <= SAMPLE_KMAX) {
		sample_small_kernel<<<1, SAMPLE_THREADS, 0, c->stream>>>(token, logits, vocab, k,
									 s->temperature, s->top_p, rng);
		return kvmem_cuda_launched("sample");
	}
	{
		size_t v4 = kvmem_align_up((size_t)vocab * 4, 256);
		void *p;
		char *b;

		if ((rc = kvmem_cuda_scratch(c, 4 * v4 + (size_t)vocab * 8, &p)))
			return kvmem_error_prefix("sample");
		b = (char *)p;
		sort_vocab_kernel<<<1, SORT_THREADS, 0, c->stream>>>(
			logits, vocab, (uint32_t *)b, (int *)(b + v4), (uint32_t *)(b + 2 * v4),
			(int *)(b + 3 * v4));
		if ((rc = kvmem_cuda_launched("sample: sorting")))
			return rc;
		sample_sorted_kernel<<<1, SAMPLE_THREADS, 0, c->stream>>>(
			token, (uint32_t *)b, (const int *)(b + v4), k, (double *)(b + 4 * v4),
			s->temperature, s->top_p, rng);
		return kvmem_cuda_launched("sample");
	}
}
