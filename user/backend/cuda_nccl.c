// SPDX-License-Identifier: MIT
/* NCCL opened on first use, and its self-test: nccl_dl.h says why. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "backend/nccl_dl.h"
#include "kvmem/kvmem.h"

#define NCCL_STR_(x) #x
#define NCCL_STR(x) NCCL_STR_(x)
#define NCCL_SONAME "libnccl.so." NCCL_STR(NCCL_MAJOR)

static kvmem_nccl_api api;
static int api_ok;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int once_rc;
static char once_err[768];

static int open_into(const char *path, kvmem_nccl_api *t, int *version)
{
	const char *where = path ? path : getenv("KVMEM_NCCL_LIBRARY");
	void *h;

	/* Before NCCL can read its environment: multicast off, always. */
	setenv("NCCL_NVLS_ENABLE", "0", 1);
	if (where && *where) {
		if (!(h = dlopen(where, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)))
			return kvmem_error(ENOPKG, "NCCL: cannot open %s (%s)%s", where, dlerror(),
					   path ? "" : ", named by KVMEM_NCCL_LIBRARY");
	} else {
		where = NCCL_SONAME;
		h = dlopen(NCCL_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
#ifdef KVMEM_CUDA_LIBDIR
		if (!h)
			h = dlopen(KVMEM_CUDA_LIBDIR "/" NCCL_SONAME,
				   RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
#define NCCL_ALSO ", then in " KVMEM_CUDA_LIBDIR
#else
#define NCCL_ALSO ""
#endif
		if (!h)
			return kvmem_error(ENOPKG, "NCCL: cannot open %s (%s); looked for it through "
					   "LD_LIBRARY_PATH, the run path and the system's library "
					   "folders" NCCL_ALSO "; KVMEM_NCCL_LIBRARY names another file",
					   where, dlerror());
#undef NCCL_ALSO
	}
#define NCCL_SYM(fn)                                                                  \
	if (!(*(void **)&t->fn = dlsym(h, #fn)))                                       \
		return kvmem_error(ENOPKG, "NCCL: %s has no %s: NCCL %d or newer is needed", \
				   where, #fn, NCCL_MAJOR);
	KVMEM_NCCL_FUNCS(NCCL_SYM)
#undef NCCL_SYM
	if (t->ncclGetVersion(version) != ncclSuccess)
		return kvmem_error(ENOPKG, "NCCL: %s: ncclGetVersion failed", where);
	if (*version / 10000 != NCCL_MAJOR)
		return kvmem_error(ENOPKG, "NCCL: %s is version %d, kvmem was built against %d.x",
				   where, *version, NCCL_MAJOR);
	return 0;
}

int kvmem_nccl_open(const char *path, int *version)
{
	kvmem_nccl_api t;

	return open_into(path, &t, version);
}

static void load_once(void)
{
	int v;

	once_rc = open_into(NULL, &api, &v);
	if (once_rc)
		snprintf(once_err, sizeof(once_err), "%s", kvmem_last_error());
	else
		api_ok = 1;
}

int kvmem_nccl_load(void)
{
	pthread_once(&once, load_once);
	return once_rc ? kvmem_error(-once_rc, "%s", once_err) : 0;
}

const kvmem_nccl_api *kvmem_nccl(void)
{
	return api_ok ? &api : NULL;
}

/* ---- the self-test ------------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

struct rankbuf {
	ncclComm_t comm;
	cudaStream_t st;
	float *d;
};

#define NCCL_TRY(call)                                                                   \
	do {                                                                             \
		ncclResult_t r_ = (call);                                                \
		if (r_ != ncclSuccess && r_ != ncclInProgress) {                         \
			rc = kvmem_error(EIO, "NCCL all-reduce self-test: %s: %s", #call, \
					 n->ncclGetErrorString(r_));                     \
			goto out;                                                        \
		}                                                                        \
	} while (0)
#define CUDA_TRY(call)                                                                   \
	do {                                                                             \
		cudaError_t e_ = (call);                                                 \
		if (e_ != cudaSuccess) {                                                 \
			rc = kvmem_error(EIO, "NCCL all-reduce self-test: %s: %s", #call, \
					 cudaGetErrorString(e_));                        \
			goto out;                                                        \
		}                                                                        \
	} while (0)

/* One grouped all-reduce over every rank, in place. */
static int allreduce(const kvmem_nccl_api *n, struct rankbuf *rb, int ranks, size_t count)
{
	int rc = 0;

	NCCL_TRY(n->ncclGroupStart());
	for (int r = 0; r < ranks; r++)
		NCCL_TRY(n->ncclAllReduce(rb[r].d, rb[r].d, count, ncclFloat32, ncclSum, rb[r].comm,
					  rb[r].st));
	NCCL_TRY(n->ncclGroupEnd());
	for (int r = 0; r < ranks; r++) {
		CUDA_TRY(cudaSetDevice(r));
		CUDA_TRY(cudaStreamSynchronize(rb[r].st));
	}
out:
	return rc;
}

int kvmem_nccl_selftest(int ranks, size_t count, kvmem_nccl_result *res)
{
	const kvmem_nccl_api *n;
	struct rankbuf rb[64];
	int devs[64], have = 0, rc = 0;
	float *host = NULL;
	double t[20];

	memset(res, 0, sizeof(*res));
	memset(rb, 0, sizeof(rb));
	if (ranks < 1 || ranks > 64 || count == 0)
		return kvmem_error(EINVAL, "NCCL self-test: %d ranks of %zu floats; 1..64 ranks, at "
				   "least one float", ranks, count);
	if (cudaGetDeviceCount(&have) != cudaSuccess)
		have = 0;
	if (have < ranks)
		return kvmem_error(ENODEV, "NCCL self-test: %d GPUs asked for, %d here", ranks, have);
	if (kvmem_nccl_load())
		return kvmem_fail();
	n = kvmem_nccl();
	n->ncclGetVersion(&res->version);
	res->ranks = ranks;
	if (!(host = malloc(count * sizeof(float))))
		return kvmem_error(ENOMEM, "NCCL self-test: out of memory");
	ncclComm_t comms[64];

	for (int r = 0; r < ranks; r++)
		devs[r] = r;
	double t0 = now_s();
	{
		ncclResult_t r0 = n->ncclCommInitAll(comms, ranks, devs);

		if (r0 != ncclSuccess) {
			rc = kvmem_error(EIO, "NCCL self-test: ncclCommInitAll over %d GPUs: %s", ranks,
					 n->ncclGetErrorString(r0));
			free(host);
			return rc;
		}
	}
	res->init_s = now_s() - t0;
	for (int r = 0; r < ranks; r++) {
		rb[r].comm = comms[r];
		CUDA_TRY(cudaSetDevice(r));
		CUDA_TRY(cudaStreamCreateWithFlags(&rb[r].st, cudaStreamNonBlocking));
		CUDA_TRY(cudaMalloc((void **)&rb[r].d, count * sizeof(float)));
		for (size_t i = 0; i < count; i++)
			host[i] = (float)(r + 1) * (float)(1 + i % 7);
		CUDA_TRY(cudaMemcpy(rb[r].d, host, count * sizeof(float), cudaMemcpyHostToDevice));
	}
	if ((rc = allreduce(n, rb, ranks, count)))
		goto out;
	for (int r = 0; r < ranks; r++) {
		CUDA_TRY(cudaSetDevice(r));
		CUDA_TRY(cudaMemcpy(host, rb[r].d, count * sizeof(float), cudaMemcpyDeviceToHost));
		for (size_t i = 0; i < count; i++) {
			float want = (float)(ranks * (ranks + 1) / 2) * (float)(1 + i % 7);

			if (host[i] != want) {
				rc = kvmem_error(EIO, "NCCL self-test: after the all-reduce over %d GPUs, "
						 "element %zu on rank %d is %g, want %g", ranks, i, r,
						 (double)host[i], (double)want);
				goto out;
			}
		}
	}
	for (int k = 0; k < 20; k++) {
		double a = now_s();

		if ((rc = allreduce(n, rb, ranks, count)))
			goto out;
		t[k] = now_s() - a;
	}
	qsort(t, 20, sizeof(t[0]), cmp_double);
	res->us = t[10] * 1e6;
	/* One rank moves nothing (NCCL returns at once): no bandwidth. */
	res->busbw_gbps = ranks > 1 ? (double)count * sizeof(float) * 2.0 * (ranks - 1) / ranks /
				      t[10] / 1e9 : 0;
out:
	for (int r = 0; r < ranks; r++) {
		cudaSetDevice(r);
		if (rb[r].d)
			cudaFree(rb[r].d);
		if (rb[r].st)
			cudaStreamDestroy(rb[r].st);
		n->ncclCommDestroy(comms[r]);
	}
	free(host);
	return rc;
}
