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
	int rc;

	*out = NULL;
	if (device < 0 || device >= kvmem_cuda_device_count())
		return kvmem_error(ENOTSUP, "cuda: no device %d (%d found)", device,
				   kvmem_cuda_device_count());
	c = (kvmem_cuda_ctx *)calloc(1, sizeof(*c));
	if (!c)
		return kvmem_error(ENOMEM, "cuda: out of memory for a context");
	c->device = device;
	if ((rc = kvmem_cuda_err(cudaSetDevice(device), "selecting the device")) ||
	    (rc = kvmem_cuda_err(cudaGetDeviceProperties(&p, device), "reading the device")))
		goto fail;
	c->sms = p.multiProcessorCount;
	snprintf(c->name, sizeof(c->name), "%s", p.name);
	if ((rc = kvmem_cuda_err(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
				 "creating a stream")))
		goto fail;
	if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
		rc = kvmem_error(EIO, "cuda: cuBLASLt would not start");
		goto fail;
	}
	/* Hopper's cuBLASLt kernels want up to 32 MiB. */
	c->lt_ws_bytes = 32u << 20;
	if ((rc = kvmem_cuda_err(cudaMalloc(&c->lt_ws, c->lt_ws_bytes), "cuBLASLt workspace")))
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
	for (int i = 0; i < KVMEM_GEMM_CACHE; i++) {
		struct gemm_plan *g = &c->plans[i];

		if (!g->n)
			continue;
		cublasLtMatrixLayoutDestroy(g->a);
		cublasLtMatrixLayoutDestroy(g->b);
		cublasLtMatrixLayoutDestroy(g->c);
		cublasLtMatmulDescDestroy(g->desc);
	}
	if (c->lt)
		cublasLtDestroy(c->lt);
	cudaFree(c->lt_ws);
	cudaFree(c->scratch);
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
	*p = c->scratch;
	return 0;
}

int kvmem_cuda_sync(kvmem_cuda_ctx *c)
{
	return kvmem_cuda_err(cudaStreamSynchronize(c->stream), "running the queued ops");
}

int kvmem_cuda_malloc(void **p, size_t bytes)
{
	*p = NULL;
	return kvmem_cuda_err(cudaMalloc(p, bytes ? bytes : 1), "allocating device memory");
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
