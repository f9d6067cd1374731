// SPDX-License-Identifier: MIT
/*
 * A forward pass's rows into page layout, into host memory: the twin of
 * kvmem_rows_to_pages_bf16 (kernels/cpu/pages.c). One kernel lays a
 * layer's rows out as whole pages in a device staging buffer (a transpose
 * at HBM speed: [n][H][D] rows to [2][H][B][D] pages), then each page goes
 * down in one copy into the pinned host pool slot it lives in: whole pages
 * as one contiguous copy, a page the rows fill only part of as one 2D copy
 * of its 2H head rows (only the tokens the rows bring, so the rest of the
 * page, written by an earlier call, stays). The host then copies nothing:
 * before, the rows came down as rows and the host's cores transposed them
 * into the pages (151 MB a 1024-token chunk at Qwen3-8B).
 */
#include "cuda_int.h"
#include "fp8.cuh"

/* A page's planes: 2H rows of B tokens each, tok[p] bytes a token, the
 * first at byte off[p] of the page (bf16: one plane of K then V rows;
 * fp8: the K and V bytes, then their scales). */
struct page_planes {
	int n;
	size_t off[2], tok[2];
};

/* The stage's pages (page bytes apart) down to pages[], tokens t0..t0+n-1
 * of them: a whole page in one copy, a part each plane's rows from token
 * lo to hi. what names the op in an error. */
static int pages_down(cudaStream_t st, const char *stage, void *const *pages, size_t page,
		      int t0, int n, int H, int B, const struct page_planes *pl, const char *what)
{
	const int nb = (t0 + n - 1) / B + 1;

	for (int i = 0; i < nb; i++) {
		const int lo = i ? 0 : t0, hi = t0 + n - i * B < B ? t0 + n - i * B : B;
		const char *src = stage + (size_t)i * page;
		char *dst = (char *)pages[i];
		cudaError_t e = cudaSuccess;

		if (lo == 0 && hi == B)
			e = cudaMemcpyAsync(dst, src, page, cudaMemcpyDeviceToHost, st);
		else
			for (int p = 0; p < pl->n && e == cudaSuccess; p++) {
				const size_t w = pl->tok[p], pitch = (size_t)B * w;
				const size_t at = pl->off[p] + (size_t)lo * w;

				e = cudaMemcpy2DAsync(dst + at, pitch, src + at, pitch,
						      (size_t)(hi - lo) * w, (size_t)2 * H,
						      cudaMemcpyDeviceToHost, st);
			}
		if (e != cudaSuccess) {
			cudaGetLastError();
			return kvmem_error(EIO, "%s: copying page %d of %d down: %s", what, i, nb,
					   cudaGetErrorString(e));
		}
	}
	return 0;
}

__global__ void rows_to_stage_kernel(uint16_t *stage, const uint16_t *k, const uint16_t *v,
				     int t0, size_t total, int H, int B, int D)
{
	const size_t kw = (size_t)H * D, half = (size_t)H * B * D;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x) {
		const size_t j = i / kw, r = i % kw, at = (size_t)t0 + j;
		const size_t h = r / D, d = r % D, blk = at / B, t = at % B;
		uint16_t *pg = stage + blk * 2 * half + (h * B + t) * D + d;

		pg[0] = k[i];
		pg[half] = v[i];
	}
}

extern "C" int kvmem_cuda_rows_to_pages_bf16(kvmem_cuda_ctx *c, void *stream, uint16_t *stage,
					     void *const *pages, int t0, int n, const uint16_t *k,
					     const uint16_t *v, int H, int B, int D)
{
	cudaStream_t st = stream ? (cudaStream_t)stream : c->stream;
	const size_t half = (size_t)H * B * D, total = (size_t)n * H * D;
	const struct page_planes planes = { 1, { 0 }, { (size_t)D * 2 } };
	size_t g = (total + 255) / 256, cap = (size_t)c->sms * 32;

	if (n < 0 || t0 < 0 || t0 >= B || H < 1 || D < 1)
		return kvmem_error(EINVAL, "rows to pages: %d rows from token %d of blocks of %d, "
				   "%d heads of %d", n, t0, B, H, D);
	if (!n)
		return 0;
	rows_to_stage_kernel<<<(unsigned)(g > cap ? cap : g), 256, 0, st>>>(stage, k, v, t0, total,
									   H, B, D);
	if (kvmem_cuda_launched("rows to pages") < 0)
		return -EIO;
	return pages_down(st, (const char *)stage, pages, 2 * half * 2, t0, n, H, B, &planes,
			  "rows to pages");
}

/*
 * The same into fp8 pages (formats.md: K bytes [H][B][D], V bytes, then K
 * and V scales [H][B], fp32), twin kvmem_rows_to_pages_fp8: each row
 * quantised as the pager's own copy does (kvmem_fp8_quant_row of the
 * widened bf16; the fp8 views' put does the same on the device), a warp a
 * (token, head, K or V) row. Before, the host's cores quantised a chunk's
 * rows on the writer thread: 1.8-3.8 ms of a 32-token question at
 * Qwen3-8B on the H200's host, which the step waited for.
 */
__global__ void __launch_bounds__(256)
rows_to_stage_fp8_kernel(uint8_t *stage, const uint16_t *k, const uint16_t *v, int t0, int n,
			 int H, int B, int D)
{
	const int lane = threadIdx.x & 31;
	const size_t half = (size_t)H * B * D, page = 2 * half + (size_t)2 * H * B * 4;
	const int rows = 2 * n * H;

	for (int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32; row < rows;
	     row += gridDim.x * blockDim.x / 32) {
		const int isv = row & 1, j = (row >> 1) / H, h = (row >> 1) % H;
		const int at = t0 + j, blk = at / B, t = at % B;
		const uint16_t *x = (isv ? v : k) + ((size_t)j * H + h) * D;
		uint8_t *pg = stage + (size_t)blk * page;
		const float s = fp8_warp_row_scale(x, D, lane), inv = 1.0f / s;	/* exact: s = 2^e */
		uint8_t *q = pg + (isv ? half : 0) + ((size_t)h * B + t) * D;

		for (int i = lane; i < D; i += 32)
			q[i] = f32_to_e4m3(bf2f(x[i]) * inv);
		if (!lane)
			((float *)(pg + 2 * half))[(isv ? (size_t)H * B : 0) + (size_t)h * B + t] = s;
	}
}

extern "C" int kvmem_cuda_rows_to_pages_fp8(kvmem_cuda_ctx *c, void *stream, void *stage,
					    void *const *pages, int t0, int n, const uint16_t *k,
					    const uint16_t *v, int H, int B, int D)
{
	cudaStream_t st = stream ? (cudaStream_t)stream : c->stream;
	const size_t half = (size_t)H * B * D, page = 2 * half + (size_t)2 * H * B * 4;
	const struct page_planes planes = { 2, { 0, 2 * half }, { (size_t)D, 4 } };
	const size_t warps = (size_t)2 * n * H, cap = (size_t)c->sms * 64;

	if (n < 0 || t0 < 0 || t0 >= B || H < 1 || D < 1)
		return kvmem_error(EINVAL, "rows to fp8 pages: %d rows from token %d of blocks of %d, "
				   "%d heads of %d", n, t0, B, H, D);
	if (!n)
		return 0;
	rows_to_stage_fp8_kernel<<<(unsigned)((warps + 7) / 8 > cap ? cap : (warps + 7) / 8), 256,
				   0, st>>>((uint8_t *)stage, k, v, t0, n, H, B, D);
	if (kvmem_cuda_launched("rows to fp8 pages") < 0)
		return -EIO;
	return pages_down(st, (const char *)stage, pages, page, t0, n, H, B, &planes,
			  "rows to fp8 pages");
}
