/* SPDX-License-Identifier: MIT */
/*
 * NCCL, opened on first use as cuBLASLt is (kernels/cuda/lt_load.cu), for
 * tensor parallelism (user/tp/tp.h). Built into libkvmem_cuda.a only
 * (user/backend/cuda_nccl.c, compiled against the toolkit's nccl.h).
 *
 * Why dlopen: libnccl.so.2 is 210 MB (CUDA 13.0) and starts nothing useful for a
 * process on one GPU; linking it would cost every kvmem process its load
 * time, as cuBLASLt's did (lt_load.cu). Looked up as libnccl.so.2 through
 * LD_LIBRARY_PATH, the run path and the system's library folders, then in
 * the build's CUDA lib folder; $KVMEM_NCCL_LIBRARY names another file
 * (PyTorch's copy, say). On the H200 machine (2026-12-02) the soname
 * finds /usr/lib/x86_64-linux-gnu/libnccl.so.2 (2.28.3; the toolkit's
 * lib64 has none there); here the toolkit's 2.28.9.
 *
 * NVLink multicast stays off: every load sets NCCL_NVLS_ENABLE=0 in the
 * environment, overriding any other value, before NCCL can read it. A
 * program that uses multicast can put a host's GPUs, which others share,
 * out of service for a day or more (the device tool's KINDS.md).
 *
 * The declarations here need no nccl.h, so tests and tools built without
 * CUDA's headers can call them; the function table needs it.
 */
#ifndef KVMEM_NCCL_DL_H
#define KVMEM_NCCL_DL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Open NCCL from `path` (NULL: the default lookup above) into a table of
 * its own, not the one kvmem_nccl_load() fills: for tests of the loader.
 * *version gets ncclGetVersion()'s code (22809: 2.28.9). 0, or -ENOPKG
 * with a message naming the library and where it was looked for (absent,
 * unreadable, or lacking an entry point). Sets NCCL_NVLS_ENABLE=0.
 */
int kvmem_nccl_open(const char *path, int *version);
/* The process's NCCL, opened once: 0 or kvmem_nccl_open's refusal, again
 * on every call after a failed first one. */
int kvmem_nccl_load(void);

/* What kvmem_nccl_selftest measured. */
typedef struct kvmem_nccl_result {
	int version;		/* ncclGetVersion() */
	int ranks;
	double init_s;		/* ncclCommInitAll */
	double us;		/* one all-reduce of `count` floats, median of 20 */
	double busbw_gbps;	/* NCCL's bus bandwidth: bytes * 2(n-1)/n / time
				 * (0 with one rank: nothing moves) */
} kvmem_nccl_result;

/*
 * A sum all-reduce of `count` floats over GPUs 0..ranks-1 from this one
 * process (ncclCommInitAll; one communicator per GPU; the calls grouped),
 * every element checked: rank r contributes (r + 1) * (1 + i % 7), so the
 * sum is exact in fp32. Then 20 timed all-reduces. 0; -ENODEV with fewer
 * GPUs; -ENOPKG without NCCL; -EIO naming the first wrong element or the
 * NCCL call that failed (ncclGetErrorString).
 */
int kvmem_nccl_selftest(int ranks, size_t count, kvmem_nccl_result *out);

#ifdef NCCL_MAJOR
/* The entry points kvmem calls, as nccl.h declares them. */
#define KVMEM_NCCL_FUNCS(X)                                                             \
	X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommInitAll)     \
	X(ncclCommDestroy) X(ncclCommCount) X(ncclCommUserRank) X(ncclAllReduce)        \
	X(ncclGroupStart) X(ncclGroupEnd) X(ncclGetErrorString) X(ncclGetLastError)

typedef struct kvmem_nccl_api {
#define KVMEM_NCCL_PTR(fn) __typeof__(&fn) fn;
	KVMEM_NCCL_FUNCS(KVMEM_NCCL_PTR)
#undef KVMEM_NCCL_PTR
} kvmem_nccl_api;

/* The table kvmem_nccl_load() filled; NULL before a successful load. */
const kvmem_nccl_api *kvmem_nccl(void);
#endif

#ifdef __cplusplus
}
#endif
#endif
