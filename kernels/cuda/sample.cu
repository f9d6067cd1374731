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
 *   weights   W_i = trunc(e^((l_i - l_0) / T) 2^52), kvmem's own e^x in
 *             double; a non-finite l_0 picks id 0 of the order without
 *             touching the RNG
 *   top-p     the shortest prefix whose running sum reaches (S q) >> 32
 *   draw      t = (S u) >> 53, u the 53 top bits of one splitmix64 step;
 *             the first i whose running sum passes t
 *
 * (kernels/draw_fixed.h: the sums are integers, the same in any order.)
 *
 * The candidates come from a radix select plus a bitonic sort in one block
 * (k <= 1024) or from a stable single-block radix sort of the vocabulary
 * (larger k: a rare setting, about 0.2 ms). Each thread sums a run of the
 * candidates, thread 0 the runs: the twin's token and RNG state, always.
 * The rows of a batched step drawn at once: kvmem_cuda_draw_rows below.
 */
#include <float.h>

#include "cuda_int.h"
#include "select.cuh"
#include "kernels/draw_fixed.h"

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
 * keys[0..n): rank keys, best first (n >= 1; keys[0]'s logit finite); ids
 * the token ids; w: n weights of scratch; u53 the draw's random bits. Run
 * by the whole block (NT threads at most); thread 0 writes *token. The
 * weights and sums are kernels/draw_fixed.h's integers: each thread sums a
 * run of the order and thread 0 the runs, and integer sums are the twin's
 * in any order; kvmem_draw_place is the sequential form of what follows.
 */
template <int NT>
__device__ void finish_draw(const uint32_t *keys, const int *ids, int n, uint64_t *w, float temp,
			    float top_p, uint64_t u53, int32_t *token)
{
	__shared__ unsigned long long plo[NT], phi[NT];
	__shared__ unsigned long long s_lo, s_hi;
	__shared__ int s_first, s_pick;
	const int tid = threadIdx.x, nt = blockDim.x;
	const double top = key_value(keys[0]);
	const int chunk = (n + nt - 1) / nt, lo = min(n, tid * chunk), hi = min(n, lo + chunk);
	kvmem_u128 run = { 0, 0 }, base, sum, c;
	int keep = n;

	for (int i = lo; i < hi; i++) {
		w[i] = kvmem_draw_weight_of(kvmem_draw_x(key_value(keys[i]), top, temp));
		run = kvmem_u128_add64(run, w[i]);
	}
	plo[tid] = run.lo;
	phi[tid] = run.hi;
	__syncthreads();
	if (tid == 0) {
		kvmem_u128 at = { 0, 0 };

		for (int t = 0; t < nt; t++) {
			const kvmem_u128 v = { plo[t], phi[t] };

			plo[t] = at.lo;	/* exclusive: the sum before thread t's run */
			phi[t] = at.hi;
			at = kvmem_u128_add(at, v);
		}
		s_lo = at.lo;
		s_hi = at.hi;
		s_first = n - 1;
	}
	__syncthreads();
	base.lo = plo[tid];
	base.hi = phi[tid];
	sum.lo = s_lo;
	sum.hi = s_hi;
	if (kvmem_draw_has_top_p(top_p)) {
		const kvmem_u128 bar = kvmem_draw_bar(sum, top_p);

		c = base;
		for (int i = lo; i < hi; i++) {
			c = kvmem_u128_add64(c, w[i]);
			if (!kvmem_u128_lt(c, bar)) {	/* sums only grow: the first here */
				atomicMin(&s_first, i);
				break;
			}
		}
		__syncthreads();
		keep = s_first + 1;
		if (lo <= keep - 1 && keep - 1 < hi) {
			c = base;
			for (int i = lo; i < keep; i++)
				c = kvmem_u128_add64(c, w[i]);
			s_lo = c.lo;
			s_hi = c.hi;
		}
		__syncthreads();
		sum.lo = s_lo;
		sum.hi = s_hi;
	}
	if (tid == 0)
		s_pick = keep - 1;
	__syncthreads();
	{
		const kvmem_u128 t = kvmem_draw_target(sum, u53);

		c = base;
		for (int i = lo; i < hi && i < keep; i++) {
			c = kvmem_u128_add64(c, w[i]);
			if (kvmem_u128_lt(t, c)) {
				atomicMin(&s_pick, i);
				break;
			}
		}
	}
	__syncthreads();
	if (tid == 0)
		*token = ids[s_pick];
}

/* The draw's random bits from the device state *rng, which advances by one
 * value: after every thread has read it. */
__device__ uint64_t take_bits(uint64_t *rng)
{
	const uint64_t u53 = mix64(*rng + GOLDEN) >> 11;

	__syncthreads();
	if (threadIdx.x == 0)
		*rng += GOLDEN;
	return u53;
}

/* ---- k <= 1024: radix select + bitonic sort in one block ------------------ */
/* The k <= 1024 best of logits[0..vocab) drawn from: *token. A non-finite
 * best logit gives its id (an inf wins outright; all -inf: the first), or
 * -1 when the host is to draw (ask_host); else *rng (shared or device
 * memory) advances by one value. Run by the whole block (SAMPLE_THREADS). */
__device__ void small_draw(const float *logits, int vocab, int k, float temp, float top_p,
			  uint64_t *rng, int32_t *token, bool ask_host)
{
	__shared__ unsigned long long cand[SAMPLE_KMAX];	/* key << 32 | ~id: larger is better */
	__shared__ uint32_t skey[SAMPLE_KMAX];
	__shared__ int sid[SAMPLE_KMAX];
	__shared__ uint64_t sw[SAMPLE_KMAX];
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
	if (!isfinite(key_value(skey[0]))) {	/* an inf wins outright; all -inf: the first */
		if (tid == 0)
			*token = ask_host ? -1 : sid[0];
		return;
	}
	finish_draw<SAMPLE_THREADS>(skey, sid, k, sw, temp, top_p, take_bits(rng), token);
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_small_kernel(int32_t *token, const float *logits, int vocab, int k, float temp, float top_p,
		    uint64_t *rng)
{
	small_draw(logits, vocab, k, temp, top_p, rng, token, false);
}

/* ---- larger k: stable radix sort of the whole vocabulary, one block ------- */
/*
 * Ascending on ~rank_key (so best first), 4 bits a pass, 8 passes; each
 * thread keeps a contiguous run, counts its digits, and after a scan in
 * (digit, thread) order writes its run in order: stable, so ties keep
 * ascending ids. Ends in (ka, ia).
 */
/* The stable sort of (ka, ia)[0..n) by ka, ascending, 4 bits a pass, 8
 * passes through (kb, ib): ends in (ka, ia). Run by the whole block
 * (SORT_THREADS). */
__device__ void block_sort_keys(uint32_t *ka, int *ia, uint32_t *kb, int *ib, int n)
{
	__shared__ int cnt[16][SORT_THREADS];
	const int tid = threadIdx.x;
	const int chunk = (n + SORT_THREADS - 1) / SORT_THREADS;
	const int lo = min(n, tid * chunk), hi = min(n, lo + chunk);

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
	__syncthreads();	/* (ka, ia) whole for every thread */
}

__global__ void __launch_bounds__(SORT_THREADS)
sort_vocab_kernel(const float *logits, int vocab, uint32_t *ka, int *ia, uint32_t *kb, int *ib)
{
	const int chunk = (vocab + SORT_THREADS - 1) / SORT_THREADS;
	const int lo = min(vocab, (int)threadIdx.x * chunk), hi = min(vocab, lo + chunk);

	for (int i = lo; i < hi; i++) {
		ka[i] = ~rank_key(logits[i]);
		ia[i] = i;
	}
	block_sort_keys(ka, ia, kb, ib, vocab);
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_sorted_kernel(int32_t *token, uint32_t *keys, const int *ids, int k, uint64_t *w, float temp,
		     float top_p, uint64_t *rng)
{
	for (int i = threadIdx.x; i < k; i += blockDim.x)
		keys[i] = ~keys[i];	/* back to rank keys, best first */
	__syncthreads();
	if (!isfinite(key_value(keys[0]))) {	/* an inf wins outright; all -inf: the first */
		if (threadIdx.x == 0)
			*token = ids[0];
		return;
	}
	finish_draw<SAMPLE_THREADS>(keys, ids, k, w, temp, top_p, take_bits(rng), token);
}

/* ---- the rows of a batched step, drawn at a temperature ------------------- */
/*
 * kvmem_cuda_draw_rows runs after kvmem_cuda_argmax_rows over the same rows,
 * which copied each beside its view and set -1 for a row holding NaN or an
 * infinity. A row whose spec has a temperature gets what kvmem_sample draws
 * from it with the spec's banned ids at -inf, from the state spec.rng (one
 * value taken: the host advances its own copy); -1 where the host is to
 * draw (a row of -1 already, or one whose every logit is banned). Three
 * kernels: the banned ids put to -inf in the pass's own rows; the rows of a
 * top-k of 1024 or less as sample_small_kernel draws; the rest by narrowing
 * ranges of their rank keys (draw_desc_rows_kernel), a block a row.
 */

__device__ __forceinline__ int draw_k(const kvmem_draw_spec *d, int vocab)
{
	return d->top_k > 0 && d->top_k < vocab ? d->top_k : vocab;
}

__device__ __forceinline__ bool draw_small(const kvmem_draw_spec *d, int vocab)
{
	return kvmem_draw_top_k_small(d->top_k, vocab);	/* k <= SAMPLE_KMAX */
}

__global__ void draw_mask_kernel(float *logits, int vocab, const kvmem_draw_spec *specs,
				 const int32_t *out)
{
	const kvmem_draw_spec *d = &specs[blockIdx.x];
	const int t = threadIdx.x;

	if (d->temperature > 0.0f && out[blockIdx.x] >= 0 && t < d->n_banned &&
	    t < KVMEM_DRAW_BANNED_MAX &&
	    d->banned[t] >= 0 && d->banned[t] < vocab)
		logits[(size_t)blockIdx.x * vocab + d->banned[t]] = -INFINITY;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
draw_small_rows_kernel(int32_t *out, const float *logits, int vocab, const kvmem_draw_spec *specs)
{
	__shared__ uint64_t s_rng;
	const kvmem_draw_spec *d = &specs[blockIdx.x];

	if (!(d->temperature > 0.0f) || !draw_small(d, vocab) || out[blockIdx.x] < 0)
		return;
	if (threadIdx.x == 0)
		s_rng = d->rng;
	__syncthreads();
	small_draw(logits + (size_t)blockIdx.x * vocab, vocab, draw_k(d, vocab), d->temperature,
		   d->top_p, &s_rng, &out[blockIdx.x], true);
}

/*
 * A row with no top-k of 1024 or less, without sorting it: the rank
 * positions a draw needs (the top-k's last, the nucleus's end, the drawn
 * one) are found by narrowing a range of rank keys, a block a row. The
 * first level is made once, in the pass that weighs every candidate: its
 * DESC_BUCKETS buckets (by the weight's x, best first) hold each bucket's
 * count and weight sum, and every position sought starts from them. The
 * bucket the running sum (or count) crosses in is the next range: its keys
 * found by bisecting the (monotone) bucket of a key, then buckets of key
 * bits over the range's members, until at most DESC_SORT keys are left,
 * sorted in shared memory (key, then id) and walked; one of many equal
 * keys is found by arithmetic (equal keys weigh the same) and its id by
 * counting in id order. The answer is the twin's: the same positions,
 * weights and sums (draw_fixed.h's integers, exact in any order).
 *
 * The sums are kept in 32-bit words added by the shared memory's native
 * atomics, a word's overflow carried by the thread whose add wrapped it: a
 * 64-bit add to shared memory is a compare-and-swap loop, and a row's
 * candidates crowd a few buckets, so those loops waited on each other.
 * Block scans are warp shuffles (a thread's serial walk over the others'
 * sums was the other wait).
 */
#define DESC_BUCKETS 1024
#define DESC_SORT 2048
#define DESC_PER (DESC_BUCKETS / SORT_THREADS)	/* buckets a thread walks */

struct desc_row {	/* a row's draw: read by every thread */
	const float *l;
	int vocab;
	uint32_t klo, best;	/* the candidates' keys: [klo, best] */
	double top;
	float temp;
	double xscale;	/* DESC_BUCKETS over -x of klo (the first level's span) */
	bool by_x;	/* the first level by x (else by key bits: a span of 0 or inf) */
};

/* A level's buckets: counts and weight sums, s0 + 2^32 s1 + 2^64 s2. */
struct desc_hist {
	unsigned int cnt[DESC_BUCKETS], s0[DESC_BUCKETS], s1[DESC_BUCKETS], s2[DESC_BUCKETS];
};

struct desc_shared {
	desc_hist top;	/* the first level: kept for every position sought */
	union {
		desc_hist lvl;	/* a deeper level */
		unsigned long long buf[DESC_SORT];	/* (~key << 32 | id), sorted */
	} u;
	unsigned long long wlo[SORT_THREADS / 32], whi[SORT_THREADS / 32];
	unsigned long long r_lo, r_hi;		/* a result's sum */
	int r_id, r_at, n_buf;
};

/* The first level's bucket of a candidate by its x, not its key's bits: a
 * row's logits share few exponents, so buckets of key bits put most of them
 * in a few buckets. Monotone in the key (x is), which is all a level needs. */
__device__ __forceinline__ int desc_xbucket(double x, double scale)
{
	const double b = -x * scale;

	return b < DESC_BUCKETS - 1 ? (int)b : DESC_BUCKETS - 1;
}

__device__ __forceinline__ int desc_key_xbucket(const desc_row &r, uint32_t k)
{
	return desc_xbucket(kvmem_draw_x(key_value(k), r.top, r.temp), r.xscale);
}

/* The bucket of key k among [klo, khi] by key bits, best first. */
__device__ __forceinline__ int desc_kbucket(uint32_t k, uint32_t klo, uint32_t khi)
{
	const unsigned long long R = (unsigned long long)(khi - klo) + 1;

	return (int)((unsigned long long)(khi - k) * DESC_BUCKETS / R);
}

__device__ __forceinline__ uint64_t desc_weight(const desc_row &r, uint32_t key)
{
	return kvmem_draw_weight_of(kvmem_draw_x(key_value(key), r.top, r.temp));
}

/* One candidate into bucket b: exact with 32-bit atomics (w < 2^53). */
__device__ __forceinline__ void desc_add(desc_hist *h, int b, uint64_t w)
{
	const uint32_t lo = (uint32_t)w;
	uint32_t carry = 0, up;

	atomicAdd(&h->cnt[b], 1u);
	if (lo) {
		const uint32_t old = atomicAdd(&h->s0[b], lo);

		carry = old + lo < old;
	}
	up = (uint32_t)(w >> 32) + carry;
	if (up) {
		const uint32_t old = atomicAdd(&h->s1[b], up);

		if (old + up < old)
			atomicAdd(&h->s2[b], 1u);
	}
}

__device__ __forceinline__ kvmem_u128 desc_sum(const desc_hist *h, int b)
{
	const uint64_t mid = (uint64_t)h->s1[b] << 32;
	kvmem_u128 r = { mid + h->s0[b], h->s2[b] };

	r.hi += r.lo < mid;
	return r;
}

__device__ void desc_clear(desc_hist *h)
{
	for (int b = threadIdx.x; b < DESC_BUCKETS; b += blockDim.x)
		h->cnt[b] = h->s0[b] = h->s1[b] = h->s2[b] = 0;
}

__device__ __forceinline__ kvmem_u128 shfl_up128(kvmem_u128 v, int o)
{
	kvmem_u128 r = { __shfl_up_sync(0xffffffffu, v.lo, o), __shfl_up_sync(0xffffffffu, v.hi, o) };

	return r;
}

/* Exclusive sums over the block's threads of v (thread order; integers, so
 * any order gives the same); *total the whole. Synchronises the block. */
__device__ kvmem_u128 desc_scan(desc_shared *sh, kvmem_u128 v, kvmem_u128 *total)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	kvmem_u128 x = v, ex, w = { 0, 0 };

	for (int o = 1; o < 32; o <<= 1) {
		const kvmem_u128 y = shfl_up128(x, o);

		if (lane >= o)
			x = kvmem_u128_add(x, y);
	}
	ex = shfl_up128(x, 1);
	if (!lane)
		ex = (kvmem_u128){ 0, 0 };
	__syncthreads();	/* wlo may still be read by a previous call */
	if (lane == 31) {
		sh->wlo[warp] = x.lo;
		sh->whi[warp] = x.hi;
	}
	__syncthreads();
	if (warp == 0) {
		kvmem_u128 t = { 0, 0 };

		if (lane < nw)
			t = (kvmem_u128){ sh->wlo[lane], sh->whi[lane] };
		for (int o = 1; o < 32; o <<= 1) {
			const kvmem_u128 y = shfl_up128(t, o);

			if (lane >= o)
				t = kvmem_u128_add(t, y);
		}
		if (lane < nw) {	/* inclusive over warps */
			sh->wlo[lane] = t.lo;
			sh->whi[lane] = t.hi;
		}
	}
	__syncthreads();
	total->lo = sh->wlo[nw - 1];
	total->hi = sh->whi[nw - 1];
	if (warp)
		w = (kvmem_u128){ sh->wlo[warp - 1], sh->whi[warp - 1] };
	return kvmem_u128_add(ex, w);
}

/* Whether a position with running sum c (inclusive) at count pos is the one
 * sought: by count (kk >= 0: position kk) or by sum (the first whose sum
 * passes thr). */
__device__ __forceinline__ bool desc_hit(kvmem_u128 c, long long pos, long long kk, kvmem_u128 thr)
{
	return kk >= 0 ? pos >= kk : kvmem_u128_lt(thr, c);
}

/* The range's keys sorted (at most DESC_SORT of them) and walked: sh->r_*. */
__device__ void desc_sorted(const desc_row &r, desc_shared *sh, uint32_t klo, uint32_t khi,
			    kvmem_u128 before, long long cbefore, int members, long long kk,
			    kvmem_u128 thr)
{
	const int tid = threadIdx.x, nt = blockDim.x, per = DESC_SORT / SORT_THREADS;
	kvmem_u128 run = { 0, 0 }, base, total, c;

	for (int i = tid; i < DESC_SORT; i += nt)
		sh->u.buf[i] = ~0ull;
	if (tid == 0)
		sh->n_buf = 0;
	__syncthreads();
	for (int i = tid; i < r.vocab; i += nt) {
		const uint32_t k = rank_key(r.l[i]);

		if (k >= klo && k <= khi) {
			const int at = atomicAdd(&sh->n_buf, 1);

			if (at < DESC_SORT)	/* always: members <= DESC_SORT */
				sh->u.buf[at] = ((unsigned long long)~k << 32) | (uint32_t)i;
		}
	}
	for (int size = 2; size <= DESC_SORT; size <<= 1)
		for (int stride = size >> 1; stride > 0; stride >>= 1) {
			__syncthreads();
			for (int p = tid; p < DESC_SORT / 2; p += nt) {
				const int i = 2 * stride * (p / stride) + p % stride, j = i + stride;
				const unsigned long long x = sh->u.buf[i], y = sh->u.buf[j];

				if (((i & size) == 0) == (x > y)) {
					sh->u.buf[i] = y;
					sh->u.buf[j] = x;
				}
			}
		}
	__syncthreads();
	for (int q = 0; q < per; q++) {
		const int at = tid * per + q;

		if (at < members)
			run = kvmem_u128_add64(run, desc_weight(r, ~(uint32_t)(sh->u.buf[at] >> 32)));
	}
	if (tid == 0)
		sh->r_at = members - 1;
	base = desc_scan(sh, run, &total);	/* synchronises: r_at set */
	c = kvmem_u128_add(before, base);
	for (int q = 0; q < per; q++) {
		const int at = tid * per + q;

		if (at >= members)
			break;
		c = kvmem_u128_add64(c, desc_weight(r, ~(uint32_t)(sh->u.buf[at] >> 32)));
		if (desc_hit(c, cbefore + at, kk, thr)) {
			atomicMin(&sh->r_at, at);
			break;
		}
	}
	__syncthreads();
	if (tid == sh->r_at / per) {	/* its owner: the sum up to it */
		const int at = sh->r_at;

		c = kvmem_u128_add(before, base);
		for (int q = tid * per; q <= at; q++)
			c = kvmem_u128_add64(c, desc_weight(r, ~(uint32_t)(sh->u.buf[q] >> 32)));
		sh->r_lo = c.lo;
		sh->r_hi = c.hi;
		sh->r_id = (int)(uint32_t)sh->u.buf[at];
	}
	__syncthreads();
}

/* Many candidates of one key k: the j-th by arithmetic, its id in id order. */
__device__ void desc_equal(const desc_row &r, desc_shared *sh, uint32_t k, kvmem_u128 before,
			   long long cbefore, int members, long long kk, kvmem_u128 thr)
{
	__shared__ long long s_j;
	const int tid = threadIdx.x, nt = blockDim.x;
	const uint64_t w = desc_weight(r, k);
	int mine = 0, at;

	if (tid == 0) {
		long long j;

		if (kk >= 0) {
			j = kk - cbefore;
		} else {	/* the largest j with before + j w <= thr */
			long long lo = 0, hi = members - 1;

			while (lo < hi) {
				const long long mid = (lo + hi + 1) / 2;
				const kvmem_u128 x = kvmem_u128_add(
					before, kvmem_u128_mul64((kvmem_u128){ (uint64_t)mid, 0 }, w));

				if (kvmem_u128_lt(thr, x))
					hi = mid - 1;
				else
					lo = mid;
			}
			j = lo;
		}
		s_j = j;
		{
			const kvmem_u128 c = kvmem_u128_add(
				before, kvmem_u128_mul64((kvmem_u128){ (uint64_t)(j + 1), 0 }, w));

			sh->r_lo = c.lo;
			sh->r_hi = c.hi;
		}
	}
	{	/* the j-th id holding the key, in id order: a run a thread */
		const int chunk = (r.vocab + nt - 1) / nt, lo = min(r.vocab, tid * chunk),
			  hi = min(r.vocab, lo + chunk);

		for (int i = lo; i < hi; i++)
			mine += rank_key(r.l[i]) == k;
		at = block_exclusive_scan<int>(mine, NULL);	/* synchronises: s_j */
		if (at <= s_j && s_j < at + mine)
			for (int i = lo; i < hi; i++)
				if (rank_key(r.l[i]) == k && at++ == s_j) {
					sh->r_id = i;
					break;
				}
	}
	__syncthreads();
}

/*
 * The rank position sought among the row's candidates: by count (kk >= 0:
 * the position kk) or by weight (kk < 0: the first whose running sum passes
 * thr). Every thread returns with sh->r_id and r_lo/r_hi (the running
 * sum up to it, inclusive).
 */
__device__ void desc_find(const desc_row &r, desc_shared *sh, long long kk, kvmem_u128 thr, int m)
{
	__shared__ uint32_t s_klo, s_khi;
	__shared__ unsigned long long s_blo, s_bhi;	/* the sum before the range */
	__shared__ long long s_before;			/* the count before it */
	__shared__ int s_m, s_b;
	const int tid = threadIdx.x;
	bool first = true;

	if (tid == 0) {
		s_klo = r.klo;
		s_khi = r.best;
		s_blo = s_bhi = 0;
		s_before = 0;
		s_m = m;
	}
	__syncthreads();
	for (;;) {
		const uint32_t klo = s_klo, khi = s_khi;
		const kvmem_u128 before = { s_blo, s_bhi };
		const long long cbefore = s_before;
		const int members = s_m;
		const bool by_x = first && r.by_x;
		const desc_hist *h = first ? &sh->top : &sh->u.lvl;
		kvmem_u128 run = { 0, 0 }, base, total, c;
		long long cnt_run = 0, cnt_base;

		if (members <= DESC_SORT) {
			desc_sorted(r, sh, klo, khi, before, cbefore, members, kk, thr);
			return;
		}
		if (klo == khi) {
			desc_equal(r, sh, klo, before, cbefore, members, kk, thr);
			return;
		}
		if (!first) {	/* a level: the range's keys into buckets of key bits */
			desc_clear(&sh->u.lvl);
			__syncthreads();
			for (int i = tid; i < r.vocab; i += blockDim.x) {
				const uint32_t k = rank_key(r.l[i]);

				if (k >= klo && k <= khi)
					desc_add(&sh->u.lvl, desc_kbucket(k, klo, khi), desc_weight(r, k));
			}
		}
		if (tid == 0)
			s_b = DESC_BUCKETS - 1;
		__syncthreads();
		for (int q = 0; q < DESC_PER; q++) {
			const int b = tid * DESC_PER + q;

			run = kvmem_u128_add(run, desc_sum(h, b));
			cnt_run += h->cnt[b];
		}
		cnt_base = block_exclusive_scan<long long>(cnt_run, NULL);
		base = desc_scan(sh, run, &total);
		c = kvmem_u128_add(before, base);
		{
			long long n = cbefore + cnt_base;

			for (int q = 0; q < DESC_PER; q++) {
				const int b = tid * DESC_PER + q;

				c = kvmem_u128_add(c, desc_sum(h, b));
				n += h->cnt[b];
				if (h->cnt[b] && desc_hit(c, n - 1, kk, thr)) {
					atomicMin(&s_b, b);
					break;
				}
			}
		}
		__syncthreads();
		if (tid == s_b / DESC_PER) {	/* its owner: the range and what comes before it */
			const int bb = s_b;
			long long n = cbefore + cnt_base;

			c = kvmem_u128_add(before, base);
			for (int q = tid * DESC_PER; q < bb; q++) {
				c = kvmem_u128_add(c, desc_sum(h, q));
				n += h->cnt[q];
			}
			s_blo = c.lo;
			s_bhi = c.hi;
			s_before = n;
			s_m = (int)h->cnt[bb];
			if (by_x) {	/* bucket bb's keys: bisected (a key's bucket falls as it rises) */
				uint64_t lo = klo, hi = khi;

				while (lo < hi) {	/* the highest key of a bucket >= bb */
					const uint64_t mid = lo + (hi - lo + 1) / 2;

					if (desc_key_xbucket(r, (uint32_t)mid) >= bb)
						lo = mid;
					else
						hi = mid - 1;
				}
				s_khi = (uint32_t)lo;
				lo = klo;
				while (lo < hi) {	/* the lowest key of a bucket <= bb */
					const uint64_t mid = lo + (hi - lo) / 2;

					if (desc_key_xbucket(r, (uint32_t)mid) <= bb)
						hi = mid;
					else
						lo = mid + 1;
				}
				s_klo = (uint32_t)lo;
			} else {
				const unsigned long long R = (unsigned long long)(khi - klo) + 1;

				/* bucket bb: khi - k in [ceil(bb R / B), ceil((bb + 1) R / B) - 1] */
				s_khi = khi - (uint32_t)((bb * R + DESC_BUCKETS - 1) / DESC_BUCKETS);
				s_klo = khi - (uint32_t)(((bb + 1) * R + DESC_BUCKETS - 1) / DESC_BUCKETS - 1);
			}
		}
		first = false;
		__syncthreads();
	}
}

__global__ void __launch_bounds__(SORT_THREADS)
draw_desc_rows_kernel(int32_t *out, const float *logits, int vocab, const kvmem_draw_spec *specs)
{
	__shared__ desc_shared sh;
	__shared__ uint32_t s_best[SORT_THREADS / 32], s_low[SORT_THREADS / 32];
	const int row = blockIdx.x, tid = threadIdx.x;
	const kvmem_draw_spec *d = &specs[row];
	desc_row r;
	uint32_t best = 0, low = 0xffffffffu, kcut = 0;
	int mine = 0, m;

	if (!(d->temperature > 0.0f) || draw_small(d, vocab) || out[row] < 0)
		return;
	r.l = logits + (size_t)row * vocab;
	r.vocab = vocab;
	r.temp = d->temperature;
	for (int i = tid; i < vocab; i += SORT_THREADS) {
		const uint32_t k = rank_key(r.l[i]);

		best = max(best, k);
		low = min(low, k);
	}
	for (int o = 16; o > 0; o >>= 1) {
		best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
		low = min(low, __shfl_xor_sync(0xffffffffu, low, o));
	}
	if ((tid & 31) == 0) {
		s_best[tid >> 5] = best;
		s_low[tid >> 5] = low;
	}
	desc_clear(&sh.top);
	__syncthreads();
	for (int j = 0; j < SORT_THREADS / 32; j++) {
		best = max(best, s_best[j]);
		low = min(low, s_low[j]);
	}
	r.best = best;
	r.top = key_value(best);
	if (!isfinite(r.top)) {	/* every logit banned (or -inf): the host draws */
		if (tid == 0)
			out[row] = -1;
		return;
	}
	{	/* keys at least the cut's: logits at least cf (kvmem_sample's cut) */
		const double cf = r.top + KVMEM_DRAW_CUT * (double)d->temperature;

		if (cf > -FLT_MAX) {
			float f = (float)cf;

			if ((double)f > cf)
				f = nextafterf(f, -INFINITY);
			kcut = rank_key(f);
		}
	}
	/* Every candidate is at least klo: the first level's span. */
	r.klo = max(kcut, low);
	{
		const double span = -kvmem_draw_x(key_value(r.klo), r.top, r.temp);

		r.by_x = span > 0.0 && isfinite(span);
		r.xscale = r.by_x ? DESC_BUCKETS / span : 0.0;
	}
	/* The candidates weighed once, into the first level. */
	for (int i = tid; i < vocab; i += SORT_THREADS) {
		const uint32_t k = rank_key(r.l[i]);

		if (k >= kcut) {
			const double x = kvmem_draw_x(key_value(k), r.top, r.temp);

			mine++;
			desc_add(&sh.top, r.by_x ? desc_xbucket(x, r.xscale) : desc_kbucket(k, r.klo, best),
				 kvmem_draw_weight_of(x));
		}
	}
	(void)block_exclusive_scan<int>(mine, &m);	/* synchronises: sh.top complete */
	{
		const int k = draw_k(d, vocab);
		const kvmem_u128 none = { 0, 0 };
		kvmem_u128 run = { 0, 0 }, sum;

		for (int q = 0; q < DESC_PER; q++)
			run = kvmem_u128_add(run, desc_sum(&sh.top, tid * DESC_PER + q));
		(void)desc_scan(&sh, run, &sum);
		if (k < m) {	/* the k best: the sum up to the k-th */
			desc_find(r, &sh, k - 1, none, m);
			sum.lo = sh.r_lo;
			sum.hi = sh.r_hi;
		}
		if (kvmem_draw_has_top_p(d->top_p)) {
			const kvmem_u128 bar = kvmem_draw_bar(sum, d->top_p);

			if (bar.lo == 0 && bar.hi == 0) {	/* the best alone */
				desc_find(r, &sh, 0, none, m);
			} else {	/* the first whose sum reaches bar: passes bar - 1 */
				kvmem_u128 b1 = bar;

				b1.hi -= b1.lo == 0;
				b1.lo -= 1;
				desc_find(r, &sh, -1, b1, m);
			}
			sum.lo = sh.r_lo;
			sum.hi = sh.r_hi;
		}
		desc_find(r, &sh, -1, kvmem_draw_target(sum, mix64(d->rng + GOLDEN) >> 11), m);
		if (tid == 0)
			out[row] = sh.r_id;
	}
}

extern "C" int kvmem_cuda_draw_rows(kvmem_cuda_ctx *c, int32_t *out, float *logits, int n,
				    int vocab, const kvmem_draw_spec *specs, int small, int narrowed)
{
	int rc;

	if (vocab <= 0 || vocab > KVMEM_DRAW_VOCAB_MAX || n < 0)
		return kvmem_error(EINVAL, "draw rows: %d rows of %d logits", n, vocab);
	if (!n || (!small && !narrowed))
		return 0;
	draw_mask_kernel<<<n, 32, 0, c->stream>>>(logits, vocab, specs, out);
	if ((rc = kvmem_cuda_launched("draw rows: the banned ids")))
		return rc;
	if (small) {
		draw_small_rows_kernel<<<n, SAMPLE_THREADS, 0, c->stream>>>(out, logits, vocab, specs);
		if ((rc = kvmem_cuda_launched("draw rows: top-k")))
			return rc;
	}
	if (narrowed) {
		draw_desc_rows_kernel<<<n, SORT_THREADS, 0, c->stream>>>(out, logits, vocab, specs);
		if ((rc = kvmem_cuda_launched("draw rows")))
			return rc;
	}
	return 0;
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
			token, (uint32_t *)b, (const int *)(b + v4), k, (uint64_t *)(b + 4 * v4),
			s->temperature, s->top_p, rng);
		return kvmem_cuda_launched("sample");
	}
}
