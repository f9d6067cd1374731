// SPDX-License-Identifier: MIT
/*
 * The CUDA context: device, stream, cuBLASLt handle and workspace, scratch
 * for the ops; device memory and copies; CUDA errors as kvmem errors.
 *
 * Scratch only grows, and never during a stream capture: a captured graph
 * keeps the pointers it was built with, so growing (freeing the old block)
 * would leave it pointing at freed memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.h"

int kvmem_cuda_err(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	cudaGetLastError();	/* clear a sticky launch error */
	if (e == cudaErrorMemoryAllocation)
		return kvmem_error(ENOMEM, "cuda: %s: %s", what, cudaGetErrorString(e));
	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
		return kvmem_error(ENOTSUP, "cuda: %s: %s", what, cudaGetErrorString(e));
	return kvmem_error(EIO, "cuda: %s: %s", what, cudaGetErrorString(e));
}

int kvmem_cuda_launched(const char *what)
{
	return kvmem_cuda_err(cudaGetLastError(), what);
}

int kvmem_cuda_device_count(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return n;
}

int kvmem_cuda_ctx_create(kvmem_cuda_ctx **out, int device)
{
	kvmem_cuda_ctx *c;
	cudaDeviceProp p;
	const char *why;
	int rc;

	*out = NULL;
	if (device < 0 || device >= kvmem_cuda_device_count())
		return kvmem_error(ENOTSUP, "cuda: no device %d (%d found)", device,
				   kvmem_cuda_device_count());
	c = (kvmem_cuda_ctx *)calloc(1, sizeof(*c));
	if (!c)
		return kvmem_error(ENOMEM, "cuda: out of memory for a context");
	c->device = device;
	{	/* KVMEM_CUDA_GEMV=0: one-row GEMMs through cuBLASLt */
		const char *e = getenv("KVMEM_CUDA_GEMV");

		c->no_gemv = e && e[0] == '0';
		/* The split-K GEMV (gemv.cu) unless KVMEM_CUDA_GEMV_SPLIT=0: 1.04-1.18x
		 * the first one at every decode shape on the H200. */
		e = getenv("KVMEM_CUDA_GEMV_SPLIT");
		c->gemv_split = !(e && e[0] == '0');
		/* Decode's fused ops (gemv.cu, the forward pass's one-token layer):
		 * KVMEM_CUDA_FUSE=0/1, else KVMEM_CUDA_FUSE_DEFAULT. */
		e = getenv("KVMEM_CUDA_FUSE");
		c->fuse = e && (e[0] == '0' || e[0] == '1') ? e[0] == '1' : KVMEM_CUDA_FUSE_DEFAULT;
		/* Decode's GEMMs on tensor cores (gemm_tc.cu): KVMEM_CUDA_GEMM_TC=0/1,
		 * else KVMEM_CUDA_GEMM_TC_DEFAULT. */
		e = getenv("KVMEM_CUDA_GEMM_TC");
		c->gemm_tc = e && (e[0] == '0' || e[0] == '1') ? e[0] == '1'
							       : KVMEM_CUDA_GEMM_TC_DEFAULT;
		/* The flash attention's split combine a block a row, as before
		 * 2026-12-06: KVMEM_CUDA_COMBINE_BLOCK=1 (comparisons; the same bits). */
		e = getenv("KVMEM_CUDA_COMBINE_BLOCK");
		c->combine_block = e && !strcmp(e, "1");
		/* GEMMs of 2+ rows on one algorithm (gemm.cu): KVMEM_CUDA_GEMM_PIN=N
		 * (the rows it is picked for; 0: off), else the default. */
		e = getenv("KVMEM_CUDA_GEMM_PIN");
		c->gemm_pin = e ? atoi(e) : KVMEM_CUDA_GEMM_PIN_DEFAULT;
		if (c->gemm_pin < 0 || c->gemm_pin > 65536)
			c->gemm_pin = KVMEM_CUDA_GEMM_PIN_DEFAULT;
		/* The main path's attention versions, for comparisons: prefill 2,
		 * 3, 4 or 6 (wgmma), decode 2, 3 or 5 (0: attention.cu's choice). */
		e = getenv("KVMEM_CUDA_PREFILL");
		c->att_prefill = e && (!strcmp(e, "2") || !strcmp(e, "3") || !strcmp(e, "4") ||
				       !strcmp(e, "6")) ? e[0] - '0' : 0;
		e = getenv("KVMEM_CUDA_DECODE");
		c->att_decode = e && (!strcmp(e, "2") || !strcmp(e, "3") || !strcmp(e, "5")) ? e[0] - '0' : 0;
		/* Decode attention v5's least stages a split, for comparisons
		 * (1: the rule before 2026-12-02); 0: attention.cu's default. */
		e = getenv("KVMEM_CUDA_DEC_MIN_TILES");
		c->dec_min_tiles = e ? atoi(e) : 0;
		if (c->dec_min_tiles < 0 || c->dec_min_tiles > 64)
			c->dec_min_tiles = 0;
		/* v5 over fp8 K: the scores on the f16 MMA (e4m3 -> f16 is one
		 * instruction for two values and exact; Q goes to f16 when every
		 * value of the block's Q converts exactly, else the bf16 path).
		 * Both switches on by default since 2026-12-03: kvmem_gpu_check
		 * --fp8 found the bits of v5 over the dequantised rows on the
		 * H200, 0.57 -> 0.75 of bf16's speed at 32K keys (=0: off). */
		e = getenv("KVMEM_CUDA_FP8_F16K");
		c->fp8_f16k = !(e && !strcmp(e, "0"));	/* on: the same bits, faster */
		/* ... and its e4m3 -> bf16 by byte permutes, shifts and one
		 * multiply instead of cvt (e4m3x4_bf16_int). */
		e = getenv("KVMEM_CUDA_FP8_INT");
		c->fp8_int = !(e && !strcmp(e, "0"));
		/* ... or, by default since 2026-12-04, the register form
		 * (attention_fp8.cu: no K/V tiles in shared memory, not v5's bits;
		 * 1.32x / 1.47x bf16's speed at 32K / 128K keys where the tile form
		 * ran at 0.76 / 0.72; up to 8 rows). KVMEM_CUDA_FP8_REG=0: the
		 * tile form, v5's bits. */
		e = getenv("KVMEM_CUDA_FP8_REG");
		c->fp8_reg = !(e && !strcmp(e, "0"));
		e = getenv("KVMEM_CUDA_FP8_REG_BLOCKS");	/* 2 (default) or 3 a multiprocessor */
		c->fp8_reg_blocks = e && atoi(e) == 3 ? 3 : 2;
		/* The tensor-core GEMM's x loads issued with the weights': by
		 * rows (unset), always (1) or never (0). */
		e = getenv("KVMEM_CUDA_GEMM_TC_XPRE");
		c->gemm_tc_xpre = !e ? 0 : e[0] == '1' ? 1 : e[0] == '0' ? 2 : 0;
		/* The fp8 gather's conversions by cvt, by default since
		 * 2026-12-04 (the same bits, checked against the twin; 1.35x
		 * the field decode's speed from device pages). =0: the field
		 * decode. */
		e = getenv("KVMEM_CUDA_FP8_GATHER_CVT");
		c->fp8_gather_cvt = !(e && !strcmp(e, "0"));
	}
	if ((rc = kvmem_cuda_err(cudaSetDevice(device), "selecting the device")) ||
	    (rc = kvmem_cuda_err(cudaGetDeviceProperties(&p, device), "reading the device")))
		goto fail;
	c->sms = p.multiProcessorCount;
	snprintf(c->name, sizeof(c->name), "%s", p.name);
	if ((rc = kvmem_cuda_err(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
				 "creating a stream")))
		goto fail;
	if ((why = kvmem_cuda_lt_load())) {
		rc = kvmem_error(ENOENT, "cuda: cannot load cuBLASLt: %s", why);
		goto fail;
	}
	if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
		rc = kvmem_error(EIO, "cuda: cuBLASLt would not start");
		goto fail;
	}
	/* Hopper's cuBLASLt kernels want up to 32 MiB. */
	c->lt_ws_bytes = 32u << 20;
	if ((rc = kvmem_cuda_err(cudaMalloc(&c->lt_ws, c->lt_ws_bytes), "cuBLASLt workspace")) ||
	    (rc = kvmem_cuda_attention_setup(c)))
		goto fail;
	*out = c;
	return 0;
fail:
	kvmem_cuda_ctx_destroy(c);
	return rc;
}

void kvmem_cuda_ctx_destroy(kvmem_cuda_ctx *c)
{
	if (!c)
		return;
	if (c->stream)
		cudaStreamSynchronize(c->stream);
	for (int i = 0; i < KVMEM_GEMM_CACHE; i++)
		kvmem_cuda_gemm_plan_free(&c->plans[i]);
	if (c->lt)
		cublasLtDestroy(c->lt);
	cudaFree(c->lt_ws);
	cudaFree(c->scratch);
	cudaFree(c->att_cnt);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	cudaGetLastError();
	free(c);
}

void *kvmem_cuda_stream(const kvmem_cuda_ctx *c)
{
	return (void *)c->stream;
}

int kvmem_cuda_sm_count(const kvmem_cuda_ctx *c)
{
	return c->sms;
}

const char *kvmem_cuda_device_name(const kvmem_cuda_ctx *c)
{
	return c->name;
}

int kvmem_cuda_reserve(kvmem_cuda_ctx *c, size_t bytes)
{
	void *p;

	return kvmem_cuda_scratch(c, bytes, &p);
}

int kvmem_cuda_scratch(kvmem_cuda_ctx *c, size_t bytes, void **p)
{
	cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
	int rc;

	if (bytes <= c->scratch_bytes) {
		*p = c->scratch;
		return 0;
	}
	if (cudaStreamIsCapturing(c->stream, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone) {
		cudaGetLastError();
		return kvmem_error(EBUSY, "cuda: an op needs %zu bytes of scratch (has %zu) during a "
				   "stream capture; reserve it before capturing", bytes,
				   c->scratch_bytes);
	}
	/* The old block may still be in use by queued work. */
	if ((rc = kvmem_cuda_err(cudaStreamSynchronize(c->stream), "growing scratch")))
		return rc;
	cudaFree(c->scratch);
	c->scratch = NULL;
	c->scratch_bytes = 0;
	bytes = kvmem_align_up(bytes + bytes / 4, 1u << 20);
	if ((rc = kvmem_cuda_err(cudaMalloc(&c->scratch, bytes), "scratch")))
		return rc;
	c->scratch_bytes = bytes;
	c->scratch_gen++;
	*p = c->scratch;
	return 0;
}

uint64_t kvmem_cuda_scratch_gen(const kvmem_cuda_ctx *c)
{
	return c->scratch_gen;
}

/* The settings that are plain switches, on when set (kvmem_cuda_tune). */
static int *tune_switch(kvmem_cuda_ctx *c, const char *what)
{
	return !strcmp(what, "gemv_split") ? &c->gemv_split
	     : !strcmp(what, "fuse")	   ? &c->fuse
	     : !strcmp(what, "gemm_tc")	   ? &c->gemm_tc
	     : !strcmp(what, "fp8_f16k")   ? &c->fp8_f16k
	     : !strcmp(what, "fp8_int")	   ? &c->fp8_int
	     : !strcmp(what, "fp8_reg")	   ? &c->fp8_reg
	     : !strcmp(what, "fp8_gather_cvt") ? &c->fp8_gather_cvt
	     : !strcmp(what, "combine_block") ? &c->combine_block
					   : NULL;
}

extern "C" int kvmem_cuda_gemm_pin(const kvmem_cuda_ctx *c)
{
	return c->gemm_pin;
}

int kvmem_cuda_tune(kvmem_cuda_ctx *c, const char *what, int on)
{
	int *flag = tune_switch(c, what), was;

	if (flag) {
		was = *flag;
		*flag = !!on;
		return was;
	}
	if (!strcmp(what, "gemv_ks")) {	/* a value, not a switch */
		if (!kvmem_cuda_gemv_check_ks(on))
			return kvmem_error(EINVAL, "cuda: gemv_ks %d (0, 1, 2, 4 or 8)", on);
		was = c->gemv_ks;
		c->gemv_ks = on;
		return was;
	}
	if (!strcmp(what, "gemm_tc_ks")) {	/* a value, not a switch */
		if (!kvmem_cuda_gemm_tc_check_ks(on))
			return kvmem_error(EINVAL, "cuda: gemm_tc_ks %d (0, 1, 2, 4 or 8)", on);
		was = c->gemm_tc_ks;
		c->gemm_tc_ks = on;
		return was;
	}
	if (!strcmp(what, "gemm_pin_all")) {	/* a switch, only with gemm_pin */
		if (on && !c->gemm_pin)
			return kvmem_error(EINVAL, "cuda: gemm_pin_all without gemm_pin");
		was = c->gemm_pin_all;
		c->gemm_pin_all = !!on;
		return was;
	}
	if (!strcmp(what, "gemm_pin")) {	/* a value: the rows, 0 (off) .. 65536 */
		if (on < 0 || on > 65536)
			return kvmem_error(EINVAL, "cuda: gemm_pin %d (0 .. 65536 rows)", on);
		was = c->gemm_pin;
		if (on != was)	/* the kept algorithms were picked the other way */
			for (int i = 0; i < KVMEM_GEMM_CACHE; i++)
				kvmem_cuda_gemm_plan_free(&c->plans[i]);
		c->gemm_pin = on;
		if (!on)
			c->gemm_pin_all = 0;
		return was;
	}
	if (!strcmp(what, "gemm_tc_mt")) {	/* a value: 0 (by n), 1 or 2 */
		if (on < 0 || on > 2)
			return kvmem_error(EINVAL, "cuda: gemm_tc_mt %d (0, 1 or 2)", on);
		was = c->gemm_tc_mt;
		c->gemm_tc_mt = on;
		return was;
	}
	if (!strcmp(what, "gemm_tc_u")) {	/* a value: 0 (the default), 4 or 8 */
		if (on != 0 && on != 4 && on != 8)
			return kvmem_error(EINVAL, "cuda: gemm_tc_u %d (0, 4 or 8)", on);
		was = c->gemm_tc_u;
		c->gemm_tc_u = on;
		return was;
	}
	if (!strcmp(what, "gemm_tc_xpre")) {	/* a value: 0 (by rows), 1 (on), 2 (off) */
		if (on < 0 || on > 2)
			return kvmem_error(EINVAL, "cuda: gemm_tc_xpre %d (0 by rows, 1 on, 2 off)",
					   on);
		was = c->gemm_tc_xpre;
		c->gemm_tc_xpre = on;
		return was;
	}
	if (!strcmp(what, "fp8_reg_blocks")) {	/* a value: 2 or 3 */
		if (on != 2 && on != 3)
			return kvmem_error(EINVAL, "cuda: fp8_reg_blocks %d (2 or 3)", on);
		was = c->fp8_reg_blocks;
		c->fp8_reg_blocks = on;
		return was;
	}
	if (!strcmp(what, "gemv"))
		flag = &c->no_gemv;
	else if (!strcmp(what, "fast_scores"))
		flag = &c->slow_scores;
	else
		return kvmem_error(EINVAL, "cuda: no setting '%s' (gemv, gemv_split, gemv_ks, "
				   "gemm_tc, gemm_tc_ks, gemm_tc_mt, gemm_tc_u, gemm_tc_xpre, "
				   "fast_scores, fuse, fp8_f16k, fp8_int, fp8_reg, "
				   "fp8_reg_blocks, fp8_gather_cvt)", what);
	was = !*flag;
	*flag = !on;
	return was;
}

int kvmem_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
	return kvmem_cuda_err(cudaMemGetInfo(free_bytes, total_bytes), "reading device memory");
}

/* A device-to-device copy of `bytes` (at least 1 MiB), best of 5 after a
 * warm-up, as bytes read plus bytes written per second. */
double kvmem_cuda_copy_gbps(kvmem_cuda_ctx *c, size_t bytes)
{
	void *a = NULL, *b = NULL;
	double best = 0;
	cudaEvent_t e0 = NULL, e1 = NULL;
	int rc;

	if (bytes < (1u << 20))
		bytes = 1u << 20;
	if ((rc = kvmem_cuda_malloc(&a, bytes)) || (rc = kvmem_cuda_malloc(&b, bytes)) ||
	    (rc = kvmem_cuda_err(cudaMemsetAsync(a, 0x3c, bytes, c->stream), "copy rate")) ||
	    (rc = kvmem_cuda_err(cudaEventCreate(&e0), "copy rate")) ||
	    (rc = kvmem_cuda_err(cudaEventCreate(&e1), "copy rate")))
		goto out;
	for (int r = 0; r < 6; r++) {
		float ms = 0;

		if ((rc = kvmem_cuda_err(cudaEventRecord(e0, c->stream), "copy rate")) ||
		    (rc = kvmem_cuda_err(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream),
					 "copy rate")) ||
		    (rc = kvmem_cuda_err(cudaEventRecord(e1, c->stream), "copy rate")) ||
		    (rc = kvmem_cuda_err(cudaEventSynchronize(e1), "copy rate")) ||
		    (rc = kvmem_cuda_err(cudaEventElapsedTime(&ms, e0, e1), "copy rate")))
			goto out;
		if (r && ms > 0 && 2.0 * bytes / (ms * 1e-3) / 1e9 > best)
			best = 2.0 * bytes / (ms * 1e-3) / 1e9;
	}
out:
	if (e0)
		cudaEventDestroy(e0);
	if (e1)
		cudaEventDestroy(e1);
	kvmem_cuda_free(a);
	kvmem_cuda_free(b);
	return rc ? rc : best;
}

int kvmem_cuda_sync(kvmem_cuda_ctx *c)
{
	return kvmem_cuda_err(cudaStreamSynchronize(c->stream), "running the queued ops");
}

int kvmem_cuda_malloc(void **p, size_t bytes)
{
	cudaError_t e;
	size_t free_b = 0, total_b = 0;

	*p = NULL;
	e = cudaMalloc(p, bytes ? bytes : 1);
	if (e != cudaErrorMemoryAllocation)
		return kvmem_cuda_err(e, "allocating device memory");
	/* Out of memory: say how much was asked and how much the device has
	 * left, so that a caller can tell a request too large from a device
	 * filled by what it holds already. */
	cudaGetLastError();
	if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(ENOMEM, "cuda: allocating %.1f MiB of device memory: %s",
				   bytes / 1048576.0, cudaGetErrorString(e));
	}
	return kvmem_error(ENOMEM, "cuda: allocating %.1f MiB of device memory: %s (%.1f of %.1f "
			   "GiB free)", bytes / 1048576.0, cudaGetErrorString(e),
			   free_b / 1073741824.0, total_b / 1073741824.0);
}

void kvmem_cuda_free(void *p)
{
	if (p)
		cudaFree(p);
}

int kvmem_cuda_upload(kvmem_cuda_ctx *c, void *dst, const void *src, size_t bytes)
{
	int rc = kvmem_cuda_err(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream),
				"copying to the device");

	return rc ? rc : kvmem_cuda_sync(c);
}

int kvmem_cuda_download(kvmem_cuda_ctx *c, void *dst, const void *src, size_t bytes)
{
	int rc = kvmem_cuda_err(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream),
				"copying from the device");

	return rc ? rc : kvmem_cuda_sync(c);
}
