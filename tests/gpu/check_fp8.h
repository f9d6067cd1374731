/* SPDX-License-Identifier: MIT */
/* fp8 KV's checks and timings (check_fp8.c), run by kvmem_gpu_check. */
#ifndef KVMEM_TESTS_GPU_CHECK_FP8_H
#define KVMEM_TESTS_GPU_CHECK_FP8_H

#include <stddef.h>

#include "kernels/kernels_bf16.h"

/* One "ok"/"FAIL" line per case, on check_util.h's context and counts;
 * with bench, then the fp8 / bf16 timing table. */
void check_fp8(int bench);
/* The fp8 views' kernels (check_fp8_view.c): checks, then with bench the
 * view's decode and rematerialisation against bf16's. */
void check_fp8_view(int bench);

/* Prefill attention over an fp8 layer (check_fp8_prefill.c): checks, then
 * with bench a warm step's question over 32K and 128K keys against bf16. */
void check_fp8_prefill(int bench);

/* One random fp8 layer [H][cap][D] with its scales (the rows' magnitudes
 * 2^-4..2^4), on the device and on the host. */
struct flayer {
	void *k8, *v8, *ks, *vs;
	uint8_t *hk8, *hv8;
	float *hks, *hvs;
};
void flayer_make(struct flayer *f, int H, int cap, int D);
void flayer_free(struct flayer *f);

/* A view of L layers x H heads x cap slots x D, on both sides: the host
 * twin's and the device's, every byte 0xff to begin with (check_fp8_view.c).
 * fview_same: the device view equals the twin's, byte for byte. */
struct fview {
	int L, H, D, cap;
	size_t n;		/* rows: L * H * cap */
	uint8_t *k8, *v8, *r8;	/* host twin; r8, rs: the raw K kept beside */
	float *ks, *vs, *rs;
	void *dk8, *dv8, *dks, *dvs, *dr8, *drs;
};
void fview_make(struct fview *v, int L, int H, int D, int cap);
/* n tokens' rows as a forward pass leaves them: [n][ld] bf16 (ld >= 3 H D)
 * with K at column H * D and V at 2 H * D, rows of mixed magnitudes
 * (2^-20..2^20). */
uint16_t *fwd_rows(int n, int H, int D, int ld);
int fview_same(const struct fview *v);
void fview_free(struct fview *v);

/* The batched forward's fp8 kernels (check_fp8_batch.c): the rows' put
 * and the decode over many views against their lone calls, bit for bit;
 * with bench, one layer's batched decode over 16 views, fp8 beside bf16. */
void check_fp8_batch(int bench);

/* Pages of L x NB blocks, fp8 (with scales) or bf16, made from the same
 * random rows; in pinned host memory. */
struct pages {
	int L, H, D, B, NB, dtype;
	size_t page;		/* bytes of one page */
	char *host;		/* pinned */
};
int pages_make(struct pages *p, int L, int H, int D, int B, int NB, int dtype);
/* Block b's page of layer l (at base, laid out as p's), tokens u0..u0+n-1,
 * to slot. */
kvmem_gather_item page_item(const struct pages *p, const char *base, int l, int b, int u0,
			    int n, int slot);

#endif
