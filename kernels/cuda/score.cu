// SPDX-License-Identifier: MIT
/*
 * Selection scorers on the GPU (twins in kernels/cpu/score.c, which hold the
 * workspace policies' arithmetic): group and per-head queries, meank,
 * subblock, quest, refine's per-key pass, and the top-k over block scores.
 *
 * The estimated-mass pipeline, per pair (layer, head[, token]):
 *   logits  z for every item, and each 4096-item chunk's max (one block a
 *           chunk), dots in the twin's order: 16 lanes, four chains over
 *           64-element steps, the same folding tree, __fmul_rn/__fadd_rn so
 *           nothing is contracted: bit for bit the twin's z;
 *   exp     e = expf(z - max) in place and each chunk's sum in double;
 *   inv     1 / (the chunk sums added in order), rounded to fp32;
 *   shares  per (row, block) the items' e summed in order, times inv, added
 *           over the row's pairs in order, in fp32 as the twin.
 * Only expf (CUDA's vs glibc's, each within 2 ulp) and the order of the
 * double chunk sums differ from the twin, so scores agree to a few fp32
 * ulps. The z and e arrays live in the context's scratch
 * (4 bytes per pair and item).
 *
 * quest's bound is a sequential sum per (pair, block), as the twin's, by
 * one thread; refine's per-key pass sums its shares in double as the twin.
 * The top-k is a radix select in one block: the set is exactly the twin's.
 */
#include "cuda_int.h"
#include "select.cuh"

#define CHUNK 4096
#define SC_THREADS 256
#define SUBS 4

template <typename T> __device__ __forceinline__ float ld(const T *p);
template <> __device__ __forceinline__ float ld<float>(const float *p)
{
	return *p;
}
template <> __device__ __forceinline__ float ld<uint16_t>(const uint16_t *p)
{
	return bf2f(*p);
}

/*
 * q . row in the twin's order (dot_fixed), by the 16 lanes of a half warp;
 * every lane of the warp must call it (shuffles), `ok` false for a lane
 * group with no row. The result is valid in lane 0 of each half.
 */
template <typename T>
__device__ __forceinline__ float dot16(const float *q, const T *row, int d, bool ok)
{
	const int u = threadIdx.x & 15;
	float s = 0.0f;

	if (ok) {
		float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
		int j = 0;

		for (; j + 64 <= d; j += 64) {
			a0 = __fadd_rn(a0, __fmul_rn(q[j + u], ld(row + j + u)));
			a1 = __fadd_rn(a1, __fmul_rn(q[j + 16 + u], ld(row + j + 16 + u)));
			a2 = __fadd_rn(a2, __fmul_rn(q[j + 32 + u], ld(row + j + 32 + u)));
			a3 = __fadd_rn(a3, __fmul_rn(q[j + 48 + u], ld(row + j + 48 + u)));
		}
		s = __fadd_rn(__fadd_rn(a0, a1), __fadd_rn(a2, a3));
		for (; j + 16 <= d; j += 16)
			s = __fadd_rn(s, __fmul_rn(q[j + u], ld(row + j + u)));
		if (j + u < d)
			s = __fadd_rn(s, __fmul_rn(q[j + u], ld(row + j + u)));
	}
	/* s[u] += s[u+8]; then ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)). */
	s = __fadd_rn(s, __shfl_down_sync(0xffffffffu, s, 8, 16));
	s = __fadd_rn(s, __shfl_down_sync(0xffffffffu, s, 4, 16));
	s = __fadd_rn(s, __shfl_down_sync(0xffffffffu, s, 2, 16));
	s = __fadd_rn(s, __shfl_down_sync(0xffffffffu, s, 1, 16));
	return s;
}

__device__ __forceinline__ float block_max(float v)
{
	__shared__ float w[32];

	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		w[threadIdx.x >> 5] = v;
	__syncthreads();
	v = -INFINITY;
	for (int i = 0; i < (int)(blockDim.x >> 5); i++)
		v = fmaxf(v, w[i]);
	return v;
}

__device__ __forceinline__ double block_sum_d(double v)
{
	__shared__ double w[32];

	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		w[threadIdx.x >> 5] = v;
	__syncthreads();
	v = 0.0;
	for (int i = 0; i < (int)(blockDim.x >> 5); i++)
		v += w[i];
	return v;
}

/* ---- queries --------------------------------------------------------------- */

/* kvmem_rope_mean on x[0..d) in shared memory, by the block; syncs. */
__device__ void rope_mean_block(float *x, int d, double theta, long long span)
{
	const int half = d / 2;
	const double n = (double)span;

	__syncthreads();
	if (span > 0)
		for (int i = threadIdx.x; i < half; i += blockDim.x) {
			double w = pow(theta, -2.0 * i / d), h = sin(w / 2), C, S;
			double a = x[i], b = x[i + half];

			if (fabs(h) < 1e-12) {
				C = n;
				S = 0.0;
			} else {
				C = __dmul_rn(__ddiv_rn(sin(__dmul_rn(n, w) / 2), h), cos(__dmul_rn(n - 1, w) / 2));
				S = __dmul_rn(__ddiv_rn(sin(__dmul_rn(n, w) / 2), h), sin(__dmul_rn(n - 1, w) / 2));
			}
			C = __ddiv_rn(C, n);
			S = __ddiv_rn(S, n);
			x[i] = (float)__dsub_rn(__dmul_rn(C, a), __dmul_rn(S, b));
			x[i + half] = (float)__dadd_rn(__dmul_rn(C, b), __dmul_rn(S, a));
		}
	__syncthreads();
}

__global__ void group_query_kernel(float *gq, const float *q, int n_q, int n_heads, int n_kv, int d,
				   double theta, long long span)
{
	extern __shared__ float xs[];
	const int l = blockIdx.x / n_kv, g = blockIdx.x % n_kv, group = n_heads / n_kv;
	const float inv = 1.0f / (float)(group * (n_q > 0 ? n_q : 1));

	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		float acc = 0.0f;

		for (int t = 0; t < n_q; t++)
			for (int h = g * group; h < (g + 1) * group; h++)
				acc = __fadd_rn(acc, q[(((size_t)l * n_q + t) * n_heads + h) * d + i]);
		xs[i] = __fmul_rn(acc, inv);
	}
	rope_mean_block(xs, d, theta, span);
	for (int i = threadIdx.x; i < d; i += blockDim.x)
		gq[(size_t)blockIdx.x * d + i] = xs[i];
}

extern "C" int kvmem_cuda_group_queries(kvmem_cuda_ctx *c, float *gq, const float *q, int n_layers,
					int n_q, int n_heads, int n_kv_heads, int head_dim,
					double theta, int64_t span)
{
	if (n_layers <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
	    head_dim > 1024 || n_q < 0)
		return kvmem_error(EINVAL, "group queries: bad geometry");
	group_query_kernel<<<n_layers * n_kv_heads, 128, head_dim * sizeof(float), c->stream>>>(
		gq, q, n_q, n_heads, n_kv_heads, head_dim, theta, (long long)span);
	return kvmem_cuda_launched("group queries");
}

/* Pair p = h * n_q + t of one layer. */
__global__ void head_query_kernel(float *hq, const float *q, int layer, int n_q, int n_heads, int d,
				  double theta, long long span)
{
	extern __shared__ float xs[];
	const int p = blockIdx.x;

	for (int i = threadIdx.x; i < d; i += blockDim.x)
		xs[i] = q[(((size_t)layer * n_q + p % n_q) * n_heads + p / n_q) * d + i];
	rope_mean_block(xs, d, theta, span);
	for (int i = threadIdx.x; i < d; i += blockDim.x)
		hq[(size_t)p * d + i] = xs[i];
}

extern "C" int kvmem_cuda_head_queries(kvmem_cuda_ctx *c, float *hq, const float *q, int layer,
				       int n_q, int n_heads, int head_dim, double theta,
				       int64_t span)
{
	if (layer < 0 || n_q < 0 || n_heads <= 0 || head_dim <= 0 || head_dim > 1024)
		return kvmem_error(EINVAL, "head queries: bad geometry");
	if (!n_q)
		return 0;
	head_query_kernel<<<n_heads * n_q, 128, head_dim * sizeof(float), c->stream>>>(
		hq, q, layer, n_q, n_heads, head_dim, theta, (long long)span);
	return kvmem_cuda_launched("head queries");
}

/* ---- the mass pipeline ---------------------------------------------------- */

/* Items [c*CHUNK, ...) of pair p: z = s * q.row + w (w = -inf: -inf). */
template <typename T>
__global__ void __launch_bounds__(SC_THREADS)
mean_logits_kernel(float *z, float *cmax, const T *rows, const float *gq, int d,
		   long long cap_items, long long n_items, int per, long long n_blocks, float scale,
		   float full, float4 last, int n_chunks)
{
	extern __shared__ float qs[];
	const int p = blockIdx.y, c = blockIdx.x, grp = threadIdx.x >> 4;
	const long long a = (long long)c * CHUNK, b = min(n_items, a + CHUNK);
	const float lastw[4] = { last.x, last.y, last.z, last.w };
	float mx = -INFINITY;

	for (int i = threadIdx.x; i < d; i += blockDim.x)
		qs[i] = gq[(size_t)p * d + i];
	__syncthreads();
	for (long long i0 = a; i0 < b; i0 += SC_THREADS / 16) {
		const long long i = i0 + grp;
		const bool ok = i < b;
		const float dt = dot16(qs, rows + ((size_t)p * cap_items + (ok ? i : a)) * d, d, ok);

		if (ok && (threadIdx.x & 15) == 0) {
			const long long blk = i / per;
			const float w = blk == n_blocks - 1 ? lastw[i % per] : full;
			const float v = w == -INFINITY ? -INFINITY : __fadd_rn(__fmul_rn(dt, scale), w);

			z[(size_t)p * n_items + i] = v;
			mx = fmaxf(mx, v);
		}
	}
	mx = block_max(mx);
	if (threadIdx.x == 0)
		cmax[(size_t)p * n_chunks + c] = mx;
}

/*
 * The same logits over a bf16 index of head_dim 64 * STEPS with 16-byte
 * loads: an octet of lanes per row, lane v loading 8 elements (chunks v,
 * v + 8, ...). In dot16's order the element e = 64 step + 16 chain + u
 * goes to chain accumulator a[chain][u]; chunk v + 8 step holds chain v / 2,
 * u = 8 (v % 2) + 0..7 of step `step`, so lane v keeps those 8
 * accumulators, summed over the steps in order. Then (a0 + a1) + (a2 + a3)
 * per u (shuffles by 2 and 4 within the octet), s[u] + s[u + 8] (by 1) and
 * the same folding tree in registers: every rounding is dot16's, so z has
 * the same bits. Two rows per octet per pass keep loads in flight.
 */
template <int STEPS>
__global__ void __launch_bounds__(SC_THREADS)
mean_logits_bf16x8_kernel(float *z, float *cmax, const uint16_t *rows, const float *gq,
			  long long cap_items, long long n_items, int per, long long n_blocks,
			  float scale, float full, float4 last, int n_chunks)
{
	constexpr int D = 64 * STEPS, ROWS_PER_PASS = SC_THREADS / 8 * 2;
	const int p = blockIdx.y, c = blockIdx.x, oct = threadIdx.x >> 3, v = threadIdx.x & 7;
	const long long a = (long long)c * CHUNK, b = min(n_items, a + CHUNK);
	const float lastw[4] = { last.x, last.y, last.z, last.w };
	const uint16_t *base = rows + (size_t)p * cap_items * D;
	float q[STEPS][8], mx = -INFINITY;

#pragma unroll
	for (int st = 0; st < STEPS; st++)
#pragma unroll
		for (int i = 0; i < 8; i++)
			q[st][i] = gq[(size_t)p * D + 8 * (v + 8 * st) + i];
	for (long long i0 = a; i0 < b; i0 += ROWS_PER_PASS) {
		long long it[2];
		uint4 x[2][STEPS];
		float acc[2][8];

#pragma unroll
		for (int r = 0; r < 2; r++) {
			it[r] = i0 + oct + r * (SC_THREADS / 8);
			const long long at = it[r] < b ? it[r] : a;

#pragma unroll
			for (int st = 0; st < STEPS; st++)
				x[r][st] = __ldcs((const uint4 *)(base + (size_t)at * D) + v + 8 * st);
		}
#pragma unroll
		for (int r = 0; r < 2; r++) {
#pragma unroll
			for (int i = 0; i < 8; i++)
				acc[r][i] = 0.0f;
#pragma unroll
			for (int st = 0; st < STEPS; st++) {
				const uint32_t w4[4] = { x[r][st].x, x[r][st].y, x[r][st].z, x[r][st].w };

#pragma unroll
				for (int i = 0; i < 8; i++) {
					const uint32_t h = i & 1 ? w4[i >> 1] & 0xffff0000u : w4[i >> 1] << 16;

					acc[r][i] = __fadd_rn(acc[r][i], __fmul_rn(q[st][i], __uint_as_float(h)));
				}
			}
			/* (a0 + a1), (a2 + a3): lanes v and v + 2 of chains 0/1, 2/3 */
#pragma unroll
			for (int i = 0; i < 8; i++)
				acc[r][i] = __fadd_rn(acc[r][i], __shfl_down_sync(0xffffffffu, acc[r][i], 2, 8));
			/* (a0 + a1) + (a2 + a3): lanes 0/1 take lanes 4/5 */
#pragma unroll
			for (int i = 0; i < 8; i++)
				acc[r][i] = __fadd_rn(acc[r][i], __shfl_down_sync(0xffffffffu, acc[r][i], 4, 8));
			/* s[u] + s[u + 8]: lane 0 holds u = 0..7, lane 1 u = 8..15 */
#pragma unroll
			for (int i = 0; i < 8; i++)
				acc[r][i] = __fadd_rn(acc[r][i], __shfl_down_sync(0xffffffffu, acc[r][i], 1, 8));
		}
		if (v == 0)
#pragma unroll
			for (int r = 0; r < 2; r++) {
				if (it[r] >= b)
					continue;
				const float f0 = __fadd_rn(acc[r][0], acc[r][4]), f1 = __fadd_rn(acc[r][1], acc[r][5]);
				const float f2 = __fadd_rn(acc[r][2], acc[r][6]), f3 = __fadd_rn(acc[r][3], acc[r][7]);
				const float dt = __fadd_rn(__fadd_rn(f0, f2), __fadd_rn(f1, f3));
				const long long blk = it[r] / per;
				const float w = blk == n_blocks - 1 ? lastw[it[r] % per] : full;
				const float val = w == -INFINITY ? -INFINITY : __fadd_rn(__fmul_rn(dt, scale), w);

				z[(size_t)p * n_items + it[r]] = val;
				mx = fmaxf(mx, val);
			}
	}
	mx = block_max(mx);
	if (threadIdx.x == 0)
		cmax[(size_t)p * n_chunks + c] = mx;
}

/* quest: grid (G * n_q, chunks, L * H); thread per block, sequential bound. */
template <typename T>
__global__ void __launch_bounds__(SC_THREADS)
quest_logits_kernel(float *z, float *cmax, const T *kmin, const T *kmax, const float *q, int n_q,
		    int n_heads, int n_kv, int d, long long cap, long long nb, float scale,
		    float full, float last, int n_chunks)
{
	extern __shared__ float qs[];
	const int G = n_heads / n_kv, x = blockIdx.x, lg = blockIdx.z;
	const int l = lg / n_kv, g = lg % n_kv, h = g * G + x / n_q, t = x % n_q;
	const int p = (l * n_heads + h) * n_q + t, c = blockIdx.y;
	const long long a = (long long)c * CHUNK, b = min(nb, a + CHUNK);
	const size_t base = ((size_t)l * n_kv + g) * cap;
	float mx = -INFINITY;

	for (int i = threadIdx.x; i < d; i += blockDim.x)
		qs[i] = q[(((size_t)l * n_q + t) * n_heads + h) * d + i];
	__syncthreads();
	for (long long blk = a + threadIdx.x; blk < b; blk += blockDim.x) {
		const T *lo = kmin + (base + blk) * d, *hi = kmax + (base + blk) * d;
		float u = 0.0f;

		for (int i = 0; i < d; i++) {
			float xa = __fmul_rn(qs[i], ld(lo + i)), xb = __fmul_rn(qs[i], ld(hi + i));

			u = __fadd_rn(u, xa > xb ? xa : xb);
		}
		u = __fadd_rn(__fmul_rn(u, scale), blk == nb - 1 ? last : full);
		z[(size_t)p * nb + blk] = u;
		mx = fmaxf(mx, u);
	}
	mx = block_max(mx);
	if (threadIdx.x == 0)
		cmax[(size_t)p * n_chunks + c] = mx;
}

__global__ void __launch_bounds__(SC_THREADS)
mass_exp_kernel(float *z, const float *cmax, double *csum, long long n_items, int n_chunks)
{
	const int p = blockIdx.y, c = blockIdx.x;
	const long long a = (long long)c * CHUNK, b = min(n_items, a + CHUNK);
	float m = -INFINITY;
	double s = 0.0;

	for (int i = threadIdx.x; i < n_chunks; i += blockDim.x)
		m = fmaxf(m, cmax[(size_t)p * n_chunks + i]);
	m = block_max(m);
	for (long long i = a + threadIdx.x; i < b; i += blockDim.x) {
		float *zi = z + (size_t)p * n_items + i;
		/* A pair with no weight anywhere adds nothing. */
		float e = m == -INFINITY ? 0.0f : expf(__fsub_rn(*zi, m));

		*zi = e;
		s += e;
	}
	s = block_sum_d(s);
	if (threadIdx.x == 0)
		csum[(size_t)p * n_chunks + c] = s;
}

__global__ void mass_inv_kernel(float *inv, const double *csum, int n_pairs, int n_chunks)
{
	const int p = blockIdx.x * blockDim.x + threadIdx.x;
	double total = 0.0;

	if (p >= n_pairs)
		return;
	for (int c = 0; c < n_chunks; c++)
		total += csum[(size_t)p * n_chunks + c];
	inv[p] = total > 0 ? (float)(1.0 / total) : 0.0f;
}

/* scores[row][blk] = sum over the row's pairs, in order, of (its items' e
 * summed in order) * inv. */
__global__ void mass_share_kernel(float *scores, const float *e, const float *inv,
				  long long n_items, int per, int pairs_per_row, int n_rows,
				  long long nb)
{
	const long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x;

	if (x >= (long long)n_rows * nb)
		return;
	const int row = (int)(x / nb);
	const long long blk = x % nb;
	float acc = 0.0f;

	for (int j = 0; j < pairs_per_row; j++) {
		const int p = row * pairs_per_row + j;
		const float *ej = e + (size_t)p * n_items + blk * per;
		float s = 0.0f;

		for (int k = 0; k < per; k++)
			s = __fadd_rn(s, ej[k]);
		acc = __fadd_rn(acc, __fmul_rn(s, inv[p]));
	}
	scores[x] = acc;
}

struct mass_bufs {
	float *z, *cmax, *inv;
	double *csum;
	int n_chunks;
};

static int mass_scratch(kvmem_cuda_ctx *c, long long n_items, int pairs, struct mass_bufs *m)
{
	const size_t zb = kvmem_align_up((size_t)pairs * n_items * 4, 256);
	void *p;

	m->n_chunks = (int)((n_items + CHUNK - 1) / CHUNK);
	const size_t cb = kvmem_align_up((size_t)pairs * m->n_chunks * 4, 256);
	const size_t sb = kvmem_align_up((size_t)pairs * m->n_chunks * 8, 256);

	if (kvmem_cuda_scratch(c, zb + cb + sb + (size_t)pairs * 4, &p))
		return kvmem_fail();
	m->z = (float *)p;
	m->cmax = (float *)((char *)p + zb);
	m->csum = (double *)((char *)p + zb + cb);
	m->inv = (float *)((char *)p + zb + cb + sb);
	return 0;
}

/* After the logits: exp, totals, shares. */
static int mass_finish(kvmem_cuda_ctx *c, struct mass_bufs *m, float *scores, long long n_items,
		       int per, int pairs, int pairs_per_row, int n_rows)
{
	const long long nb = n_items / per, cells = (long long)n_rows * nb;
	int rc;

	mass_exp_kernel<<<dim3(m->n_chunks, pairs), SC_THREADS, 0, c->stream>>>(m->z, m->cmax, m->csum,
										 n_items, m->n_chunks);
	if ((rc = kvmem_cuda_launched("scores: exp")))
		return rc;
	mass_inv_kernel<<<(pairs + 127) / 128, 128, 0, c->stream>>>(m->inv, m->csum, pairs, m->n_chunks);
	if ((rc = kvmem_cuda_launched("scores: totals")))
		return rc;
	mass_share_kernel<<<(unsigned)((cells + 255) / 256), 256, 0, c->stream>>>(
		scores, m->z, m->inv, n_items, per, pairs_per_row, n_rows, nb);
	return kvmem_cuda_launched("scores: shares");
}

static int check_geom(const kvmem_score_geom *g, const char *who)
{
	if (g->n_layers <= 0 || g->n_kv_heads <= 0 || g->n_heads < g->n_kv_heads ||
	    g->n_heads % g->n_kv_heads || g->head_dim <= 0 || g->head_dim > 1024 || g->block < SUBS ||
	    g->n_blocks < 0 || g->cap_blocks < g->n_blocks ||
	    (g->n_blocks > 0 && (g->last_len < 1 || g->last_len > g->block)) ||
	    (g->index_dtype != KVMEM_DTYPE_F32 && g->index_dtype != KVMEM_DTYPE_BF16))
		return kvmem_error(EINVAL, "%s: bad geometry", who);
	return 0;
}

static float log_len(int len)
{
	return len > 0 ? logf((float)len) : -INFINITY;
}

static int mean_scores(kvmem_cuda_ctx *c, float *scores, const void *rows, const float *gq,
		       const kvmem_score_geom *g, int per, const char *who)
{
	const int pairs = g->n_layers * g->n_kv_heads, d = g->head_dim;
	const long long n_items = g->n_blocks * per;
	const float scale = 1.0f / sqrtf((float)d);
	const float full = logf((float)(g->block / per));
	float4 last;
	struct mass_bufs m;
	int rc;

	if (check_geom(g, who))
		return kvmem_fail();
	if (!g->n_blocks)
		return 0;
	if (per == 1)
		last = make_float4(log_len(g->last_len), 0, 0, 0);
	else
		last = make_float4(log_len(g->last_sub[0]), log_len(g->last_sub[1]),
				   log_len(g->last_sub[2]), log_len(g->last_sub[3]));
	if (mass_scratch(c, n_items, pairs, &m))
		return kvmem_error_prefix("%s", who);
	dim3 grid(m.n_chunks, pairs);
	size_t sm = d * sizeof(float);

	if (g->index_dtype == KVMEM_DTYPE_BF16 && (d == 64 || d == 128) &&
	    !((uintptr_t)rows & 15) && !c->slow_scores) {
		if (d == 128)
			mean_logits_bf16x8_kernel<2><<<grid, SC_THREADS, 0, c->stream>>>(
				m.z, m.cmax, (const uint16_t *)rows, gq, (long long)g->cap_blocks * per,
				n_items, per, g->n_blocks, scale, full, last, m.n_chunks);
		else
			mean_logits_bf16x8_kernel<1><<<grid, SC_THREADS, 0, c->stream>>>(
				m.z, m.cmax, (const uint16_t *)rows, gq, (long long)g->cap_blocks * per,
				n_items, per, g->n_blocks, scale, full, last, m.n_chunks);
	} else if (g->index_dtype == KVMEM_DTYPE_BF16)
		mean_logits_kernel<uint16_t><<<grid, SC_THREADS, sm, c->stream>>>(
			m.z, m.cmax, (const uint16_t *)rows, gq, d, (long long)g->cap_blocks * per,
			n_items, per, g->n_blocks, scale, full, last, m.n_chunks);
	else
		mean_logits_kernel<float><<<grid, SC_THREADS, sm, c->stream>>>(
			m.z, m.cmax, (const float *)rows, gq, d, (long long)g->cap_blocks * per, n_items,
			per, g->n_blocks, scale, full, last, m.n_chunks);
	if ((rc = kvmem_cuda_launched(who)))
		return rc;
	return mass_finish(c, &m, scores, n_items, per, pairs, pairs, 1);
}

extern "C" int kvmem_cuda_score_meank(kvmem_cuda_ctx *c, float *scores, const void *meank,
				      const float *gq, const kvmem_score_geom *g)
{
	return mean_scores(c, scores, meank, gq, g, 1, "meank");
}

extern "C" int kvmem_cuda_score_subblock(kvmem_cuda_ctx *c, float *scores, const void *sub,
					 const float *gq, const kvmem_score_geom *g)
{
	return mean_scores(c, scores, sub, gq, g, SUBS, "subblock");
}

extern "C" int kvmem_cuda_score_quest(kvmem_cuda_ctx *c, float *scores, const void *kmin,
				      const void *kmax, const float *q, int n_q,
				      const kvmem_score_geom *g)
{
	const int pairs = g->n_layers * g->n_heads * n_q, d = g->head_dim;
	const float scale = 1.0f / sqrtf((float)d), full = logf((float)g->block);
	struct mass_bufs m;
	int rc;

	if (check_geom(g, "quest"))
		return kvmem_fail();
	if (!g->n_blocks)
		return 0;
	if (n_q <= 0)
		return kvmem_cuda_err(cudaMemsetAsync(scores, 0, sizeof(float) * g->n_layers * g->n_blocks,
						      c->stream), "quest");
	if (mass_scratch(c, g->n_blocks, pairs, &m))
		return kvmem_error_prefix("quest");
	dim3 grid((g->n_heads / g->n_kv_heads) * n_q, m.n_chunks, g->n_layers * g->n_kv_heads);
	size_t sm = d * sizeof(float);

	if (g->index_dtype == KVMEM_DTYPE_BF16)
		quest_logits_kernel<uint16_t><<<grid, SC_THREADS, sm, c->stream>>>(
			m.z, m.cmax, (const uint16_t *)kmin, (const uint16_t *)kmax, q, n_q, g->n_heads,
			g->n_kv_heads, d, g->cap_blocks, g->n_blocks, scale, full, log_len(g->last_len),
			m.n_chunks);
	else
		quest_logits_kernel<float><<<grid, SC_THREADS, sm, c->stream>>>(
			m.z, m.cmax, (const float *)kmin, (const float *)kmax, q, n_q, g->n_heads,
			g->n_kv_heads, d, g->cap_blocks, g->n_blocks, scale, full, log_len(g->last_len),
			m.n_chunks);
	if ((rc = kvmem_cuda_launched("quest")))
		return rc;
	return mass_finish(c, &m, scores, g->n_blocks, 1, pairs, g->n_heads * n_q, g->n_layers);
}

/* ---- refine's per-key pass ----------------------------------------------- */

/* z[p][slot] for pair p (head p / n_q, token p % n_q), chunked over slots. */
template <typename T>
__global__ void __launch_bounds__(SC_THREADS)
token_logits_kernel(float *z, float *cmax, const T *keys, const int32_t *len,
		    const int64_t *blocks, long long slots, const float *hq, const int64_t *q_pos,
		    int n_q, int group, int B, int d, float scale, int n_chunks)
{
	extern __shared__ float qs[];
	const int p = blockIdx.y, c = blockIdx.x, grp = threadIdx.x >> 4;
	const int h = p / n_q, tok = p % n_q;
	const long long a = (long long)c * CHUNK, b = min(slots, a + CHUNK), qpos = q_pos[tok];
	const T *kh = keys + (size_t)(h / group) * slots * d;
	float mx = -INFINITY;

	for (int i = threadIdx.x; i < d; i += blockDim.x)
		qs[i] = hq[(size_t)p * d + i];
	__syncthreads();
	for (long long i0 = a; i0 < b; i0 += SC_THREADS / 16) {
		const long long i = i0 + grp;
		const bool ok = i < b;
		const float dt = dot16(qs, kh + (size_t)(ok ? i : a) * d, d, ok);

		if (ok && (threadIdx.x & 15) == 0) {
			const long long blk = i / B;
			const int j = (int)(i % B);
			const float v = j < len[blk] && blocks[blk] * B + j <= qpos ? __fmul_rn(dt, scale)
										  : -INFINITY;

			z[(size_t)p * slots + i] = v;
			mx = fmaxf(mx, v);
		}
	}
	mx = block_max(mx);
	if (threadIdx.x == 0)
		cmax[(size_t)p * n_chunks + c] = mx;
}

/* part[p][i] = sum_j exp((double)z - max) over block i's slots, in order. */
__global__ void token_part_kernel(double *part, const float *z, const float *cmax, long long n,
				  int B, int n_chunks)
{
	const int p = blockIdx.y;
	const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	float m = -INFINITY;

	for (int k = threadIdx.x; k < n_chunks; k += blockDim.x)
		m = fmaxf(m, cmax[(size_t)p * n_chunks + k]);
	m = block_max(m);
	if (i >= n)
		return;
	double s = 0.0;

	if (m != -INFINITY)	/* sees none of them: adds nothing */
		for (int j = 0; j < B; j++)
			s = __dadd_rn(s, exp(__dsub_rn((double)z[((size_t)p * n + i) * B + j], (double)m)));
	part[(size_t)p * n + i] = s;
}

__global__ void token_tot_kernel(double *tot, const double *part, long long n, int pairs)
{
	const int p = blockIdx.x * blockDim.x + threadIdx.x;
	double s = 0.0;

	if (p >= pairs)
		return;
	for (long long i = 0; i < n; i++)
		s = __dadd_rn(s, part[(size_t)p * n + i]);
	tot[p] = s;
}

__global__ void token_mass_kernel(double *mass, const double *part, const double *tot, long long n,
				  int pairs)
{
	const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;

	if (i >= n)
		return;
	double acc = mass[i];

	for (int p = 0; p < pairs; p++) {
		double v = part[(size_t)p * n + i];

		if (tot[p] > 0)
			v = __ddiv_rn(v, tot[p]);
		acc = __dadd_rn(acc, v);
	}
	mass[i] = acc;
}

extern "C" int kvmem_cuda_token_mass(kvmem_cuda_ctx *c, double *mass, const void *keys,
				     const int32_t *len, const int64_t *blocks, int64_t n,
				     const float *hq, const int64_t *q_pos, int n_q,
				     const kvmem_score_geom *g)
{
	const int pairs = g->n_heads * n_q, d = g->head_dim, B = g->block;
	const long long slots = (long long)n * B;
	const int n_chunks = (int)((slots + CHUNK - 1) / CHUNK);
	size_t zb, cb, pb;
	void *p;
	float *z, *cmax;
	double *part, *tot;
	int rc;

	if (check_geom(g, "token mass"))
		return kvmem_fail();
	if (n <= 0 || pairs <= 0)
		return 0;
	zb = kvmem_align_up((size_t)pairs * slots * 4, 256);
	cb = kvmem_align_up((size_t)pairs * n_chunks * 4, 256);
	pb = kvmem_align_up((size_t)pairs * n * 8, 256);
	if ((rc = kvmem_cuda_scratch(c, zb + cb + pb + (size_t)pairs * 8, &p)))
		return kvmem_error_prefix("token mass");
	z = (float *)p;
	cmax = (float *)((char *)p + zb);
	part = (double *)((char *)p + zb + cb);
	tot = (double *)((char *)p + zb + cb + pb);
	dim3 grid(n_chunks, pairs);
	size_t sm = d * sizeof(float);
	const float scale = 1.0f / sqrtf((float)d);
	const int group = g->n_heads / g->n_kv_heads;

	if (g->index_dtype == KVMEM_DTYPE_BF16)
		token_logits_kernel<uint16_t><<<grid, SC_THREADS, sm, c->stream>>>(
			z, cmax, (const uint16_t *)keys, len, blocks, slots, hq, q_pos, n_q, group, B, d,
			scale, n_chunks);
	else
		token_logits_kernel<float><<<grid, SC_THREADS, sm, c->stream>>>(
			z, cmax, (const float *)keys, len, blocks, slots, hq, q_pos, n_q, group, B, d,
			scale, n_chunks);
	if ((rc = kvmem_cuda_launched("token mass")))
		return rc;
	token_part_kernel<<<dim3((unsigned)((n + 255) / 256), pairs), 256, 0, c->stream>>>(
		part, z, cmax, n, B, n_chunks);
	if ((rc = kvmem_cuda_launched("token mass: shares")))
		return rc;
	token_tot_kernel<<<(pairs + 127) / 128, 128, 0, c->stream>>>(tot, part, n, pairs);
	if ((rc = kvmem_cuda_launched("token mass: totals")))
		return rc;
	token_mass_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c->stream>>>(mass, part, tot, n, pairs);
	return kvmem_cuda_launched("token mass: sums");
}

/* ---- top-k over block scores --------------------------------------------- */
#define TOPK_THREADS 1024

/* The k best (higher score, ties to the later block, NaN lowest) in
 * ascending block order; 1 <= k < n. */
__global__ void __launch_bounds__(TOPK_THREADS)
top_k_kernel(int64_t *out, const float *scores, long long n, long long k)
{
	const int tid = threadIdx.x;
	const long long chunk = (n + TOPK_THREADS - 1) / TOPK_THREADS;
	const long long lo = tid * chunk, hi = min(n, lo + chunk);
	auto key = [&](int64_t i) { return rank_key(scores[i]); };
	int64_t need;
	const uint32_t T = block_radix_select(key, n, k, &need);
	long long ties = 0, n_ties, taken = 0;

	for (long long i = lo; i < hi; i++)
		ties += key(i) == T;
	/* Ties taken: the `need` with the highest block numbers. */
	long long tie_rank = block_exclusive_scan<long long>(ties, &n_ties);
	const long long first_taken = n_ties - need;
	long long r = tie_rank;

	for (long long i = lo; i < hi; i++) {
		uint32_t x = key(i);

		if (x > T)
			taken++;
		else if (x == T)
			taken += r++ >= first_taken;
	}
	long long at = block_exclusive_scan<long long>(taken, NULL);

	r = tie_rank;
	for (long long i = lo; i < hi; i++) {
		uint32_t x = key(i);

		if (x > T || (x == T && r++ >= first_taken))
			out[at++] = i;
	}
}

__global__ void iota_kernel(int64_t *out, long long n)
{
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x)
		out[i] = i;
}

extern "C" int64_t kvmem_cuda_top_k_blocks(kvmem_cuda_ctx *c, int64_t *out, const float *scores,
					   int64_t n, int64_t k)
{
	int rc;

	if (k <= 0 || n <= 0)
		return 0;
	if (k >= n) {
		iota_kernel<<<(unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), 256, 0,
			      c->stream>>>(out, n);
		return (rc = kvmem_cuda_launched("top-k")) ? rc : n;
	}
	top_k_kernel<<<1, TOPK_THREADS, 0, c->stream>>>(out, scores, n, k);
	return (rc = kvmem_cuda_launched("top-k")) ? rc : k;
}

/* ---- the planner's choice of blocks ------------------------------------------ */

__global__ void mark_taken_kernel(float *scores, long long head, long long tail, long long n)
{
	const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;

	if (i < head)
		scores[i] = INFINITY;
	else if (i < head + tail)
		scores[n - tail + (i - head)] = INFINITY;
}

extern "C" int64_t kvmem_cuda_plan_blocks(kvmem_cuda_ctx *c, int64_t *out, float *scores,
					  int64_t n, int64_t head, int64_t tail, int64_t k)
{
	int64_t taken;
	int rc;

	if (n < 0 || head < 0 || tail < 0 || k < 0)
		return kvmem_error(EINVAL, "plan blocks: %lld blocks, %lld + %lld taken, %lld best",
				   (long long)n, (long long)head, (long long)tail, (long long)k);
	head = head < n ? head : n;
	tail = tail < n - head ? tail : n - head;
	taken = head + tail;
	if (taken) {
		mark_taken_kernel<<<(unsigned)((taken + 255) / 256), 256, 0, c->stream>>>(
			scores, (long long)head, (long long)tail, (long long)n);
		if ((rc = kvmem_cuda_launched("plan blocks")))
			return rc;
	}
	return kvmem_cuda_top_k_blocks(c, out, scores, n, taken + k < n ? taken + k : n);
}
