// SPDX-License-Identifier: MIT
/*
 * kvmem_cuda_rows_to_pages_bf16 and _fp8 (kernels/cuda/pages.cu) against
 * their CPU twins (kernels/cpu/pages.c), bit for bit, on
 * fresh random rows and pages: the pages hold random bytes first, the same
 * for both, so a byte either side writes that it should not (another
 * token, another block's page, past a partial page) shows. Rows that start
 * inside a block and end inside another, within one block, whole blocks;
 * pages in pinned host memory (cudaMallocHost), in malloc'd memory
 * registered with cudaHostRegister (as the pager's host pool is) and in
 * plain malloc'd memory; each page at its own address, as pool slots are.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kernels/kernels_cuda.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "check_pages.h"
#include "check_util.h"

enum where { PINNED, REGISTERED, PLAIN };
static const char *where_name[] = { "pinned", "registered", "malloc'd" };

static void one(int H, int B, int D, int t0, int n, enum where w, int fp8)
{
	const int nb = (t0 + n - 1) / B + 1;
	/* a page's bytes: bf16 K and V, or their e4m3 bytes and fp32 scales */
	const size_t page = fp8 ? (size_t)2 * H * B * D + (size_t)8 * H * B : (size_t)4 * H * B * D;
	const size_t kw = (size_t)H * D;
	/* One pool-like area: page i at slot perm[i], slots in scrambled order. */
	const size_t slots = (size_t)nb + 3, area = slots * page;
	char *mem = NULL, *ref = malloc(area);
	uint16_t *k = rand_bf16((size_t)n * kw, -3, 3), *v = rand_bf16((size_t)n * kw, -3, 3);
	void *dk, *dv, *stage = dpoison((size_t)nb * page);
	int rc;

	if (fp8) {	/* an infinity and a NaN: the scale counts neither, NaN keeps its code */
		k[(size_t)n * kw / 2] = 0xff80;
		v[(size_t)n * kw - 1] = 0x7fc0;
	}
	dk = dput(k, (size_t)n * kw * 2);
	dv = dput(v, (size_t)n * kw * 2);
	void **pg = malloc(nb * sizeof(void *)), **pr = malloc(nb * sizeof(void *));
	int ok = 0;

	if (w == PINNED) {
		if (cudaMallocHost((void **)&mem, area) != cudaSuccess)
			mem = NULL;
	} else {
		mem = malloc(area);
		if (mem && w == REGISTERED && cudaHostRegister(mem, area, cudaHostRegisterMapped) !=
						    cudaSuccess) {
			free(mem);
			mem = NULL;
		}
	}
	if (!mem || !ref || !pg || !pr) {
		report(0, "rows to pages: %d heads x %d, block %d: no memory", H, D, B);
		goto out;
	}
	for (size_t i = 0; i < area; i++)
		mem[i] = ref[i] = (char)rnext();
	for (int i = 0; i < nb; i++) {
		size_t s = ((size_t)i * 7 + 2) % slots;	/* scattered, each its own */

		pg[i] = mem + s * page;
		pr[i] = ref + s * page;
	}
	if (fp8) {
		kvmem_rows_to_pages_fp8(pr, t0, n, k, v, H, B, D);
		rc = kvmem_cuda_rows_to_pages_fp8(g_c, NULL, stage, pg, t0, n, dk, dv, H, B, D);
	} else {
		kvmem_rows_to_pages_bf16(pr, t0, n, k, v, H, B, D);
		rc = kvmem_cuda_rows_to_pages_bf16(g_c, NULL, stage, pg, t0, n, dk, dv, H, B, D);
	}
	if (rc < 0 || kvmem_cuda_sync(g_c) < 0) {
		report(0, "rows to %s pages: %d heads x %d, block %d: %s", fp8 ? "fp8" : "bf16", H,
		       D, B, kvmem_last_error());
		goto out;
	}
	ok = !memcmp(mem, ref, area);
	report(ok, "rows to %s pages: %d heads x %d, block %d, rows %d from token %d (%d pages), "
	       "pages %s", fp8 ? "fp8" : "bf16", H, D, B, n, t0, nb, where_name[w]);
out:
	if (w == PINNED)
		cudaFreeHost(mem);
	else if (mem) {
		if (w == REGISTERED)
			cudaHostUnregister(mem);
		free(mem);
	}
	free(ref);
	free(k);
	free(v);
	free(pg);
	free(pr);
	kvmem_cuda_free(dk);
	kvmem_cuda_free(dv);
	kvmem_cuda_free(stage);
}

/* The timing: one layer of a 1024-token chunk at Qwen3-8B (8 KV heads of
 * 128, blocks of 32: 32 pages of 128 KiB) into scattered slots of
 * registered host memory, against one copy of the same bytes. */
struct ptime {
	void **pages, *stage, *dk, *dv, *dst;
	size_t bytes;
};

static int time_pages(void *arg)
{
	struct ptime *t = arg;

	return kvmem_cuda_rows_to_pages_bf16(g_c, NULL, t->stage, t->pages, 0, 1024, t->dk, t->dv, 8,
					     32, 128);
}

static int time_one_copy(void *arg)
{
	struct ptime *t = arg;

	return cudaMemcpyAsync(t->dst, t->stage, t->bytes, cudaMemcpyDeviceToHost,
			       (cudaStream_t)kvmem_cuda_stream(g_c)) == cudaSuccess ? 0 : -1;
}

static void time_layer(void)
{
	const size_t page = (size_t)2 * 8 * 32 * 128 * 2, slots = 64;
	struct ptime t = { .bytes = 32 * page };
	char *mem = malloc(slots * page);
	double ms_pages, ms_copy;

	t.pages = malloc(32 * sizeof(void *));
	if (!mem || !t.pages || cudaHostRegister(mem, slots * page, cudaHostRegisterMapped) !=
				      cudaSuccess) {
		printf("rows to pages timing: no registered memory\n");
		free(mem);
		free(t.pages);
		return;
	}
	memset(mem, 0, slots * page);
	for (int i = 0; i < 32; i++)
		t.pages[i] = mem + ((size_t)i * 37 % slots) * page;
	t.dst = mem;
	t.stage = dpoison(32 * page);
	t.dk = dpoison((size_t)1024 * 8 * 128 * 2);
	t.dv = dpoison((size_t)1024 * 8 * 128 * 2);
	ms_pages = time_ms(time_pages, &t, 3, 20);
	ms_copy = time_ms(time_one_copy, &t, 3, 20);
	printf("rows to pages, one layer of a 1024-token chunk at Qwen3-8B (%.1f MB, 32 pages): "
	       "%.3f ms, %.1f GB/s; one copy of the same bytes %.3f ms, %.1f GB/s (%.2f of it)\n",
	       t.bytes / 1e6, ms_pages, t.bytes / ms_pages / 1e6, ms_copy, t.bytes / ms_copy / 1e6,
	       ms_copy / ms_pages);
	cudaHostUnregister(mem);
	free(mem);
	free(t.pages);
	kvmem_cuda_free(t.stage);
	kvmem_cuda_free(t.dk);
	kvmem_cuda_free(t.dv);
}

void check_pages(void)
{
	/* Qwen3-8B's KV heads at kvmem's block, the agentlang model's, odd ones. */
	static const int geo[][3] = { { 8, 32, 128 }, { 4, 16, 32 }, { 3, 7, 40 } };

	for (int f = 0; f < 2; f++)	/* bf16 pages, fp8 pages */
		for (int g = 0; g < 3; g++) {
			const int H = geo[g][0], B = geo[g][1], D = geo[g][2];

			one(H, B, D, 0, 32 * B, PINNED, f);	/* whole blocks */
			one(H, B, D, rint_in(1, B - 1), rint_in(2, 5) * B, REGISTERED, f);	/* both ends partial */
			one(H, B, D, rint_in(0, B - 2), 1, PLAIN, f);	/* one token */
			one(H, B, D, 1, B - 2 > 0 ? B - 2 : 1, PINNED, f);	/* inside one block */
			one(H, B, D, rint_in(0, B - 1), rint_in(1, 40 * B), rint_in(0, 2), f);
		}
	if (!g_quick)
		time_layer();
}
