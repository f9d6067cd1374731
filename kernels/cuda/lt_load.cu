// SPDX-License-Identifier: MIT
/*
 * cuBLASLt, loaded when the first CUDA context is made instead of linked.
 *
 * Linking libcublasLt.so (540 MB in CUDA 13) cost every kvmem process
 * 0.07-0.15 s and 210 MB of resident memory at start, spent in the
 * library's static initialisers: `kvmem --version` took 0.15 s and 220 MB
 * against 0.01 s and 8 MB without it, on a machine with no GPU at all. So
 * kvmem defines the dozen cuBLASLt entry points it calls (gemm.cu, ctx.cu),
 * each forwarding to the real one, which is found by dlopen/dlsym once, on
 * first use. kvmem_cuda_lt_load() says why when that fails.
 *
 * The library is looked up by its soname (the CUDA major version kvmem was
 * built against), through LD_LIBRARY_PATH and the program's run path, then
 * in the toolkit's lib64 of the build (KVMEM_CUDA_LIBDIR).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include <cublasLt.h>

#include "cuda_int.h"

#define LT_STR_(x) #x
#define LT_STR(x) LT_STR_(x)
#define LT_SONAME "libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR)

/* The entry points kvmem uses: add one here when the code calls another. */
#define LT_FUNCS(X)                                                                               \
	X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic) \
	X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)                                 \
	X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate)                      \
	X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)               \
	X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                             \
	X(cublasLtMatmulAlgoCheck) X(cublasLtMatmulAlgoConfigSetAttribute)

static struct {
#define LT_PTR(name) decltype(&::name) p_##name;
	LT_FUNCS(LT_PTR)
#undef LT_PTR
} lt;
static int lt_ok;
static char lt_err[512];
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;

static void lt_open(void)
{
	void *h = dlopen(LT_SONAME, RTLD_NOW | RTLD_LOCAL);

#ifdef KVMEM_CUDA_LIBDIR
	if (!h)
		h = dlopen(KVMEM_CUDA_LIBDIR "/" LT_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
	if (!h) {
		snprintf(lt_err, sizeof(lt_err), "%s", dlerror());
		return;
	}
#define LT_SYM(name)                                                                     \
	if (!(lt.p_##name = (decltype(lt.p_##name))dlsym(h, #name))) {                   \
		snprintf(lt_err, sizeof(lt_err), "%s has no %s", LT_SONAME, #name);      \
		return;                                                                  \
	}
	LT_FUNCS(LT_SYM)
#undef LT_SYM
	lt_ok = 1;
}

const char *kvmem_cuda_lt_load(void)
{
	pthread_once(&lt_once, lt_open);
	return lt_ok ? NULL : lt_err;
}

/* Each forwarder: the real function once the library is loaded, else
 * CUBLAS_STATUS_NOT_INITIALIZED (ctx.cu loads it first and says why). */
#define LT_FWD(name, params, args)                                      \
	extern "C" cublasStatus_t CUBLASWINAPI name params              \
	{                                                               \
		return kvmem_cuda_lt_load() ? CUBLAS_STATUS_NOT_INITIALIZED \
					    : lt.p_##name args;         \
	}

LT_FWD(cublasLtCreate, (cublasLtHandle_t *h), (h))
LT_FWD(cublasLtDestroy, (cublasLtHandle_t h), (h))
LT_FWD(cublasLtMatmul,
       (cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
	cublasLtMatrixLayout_t ad, const void *B, cublasLtMatrixLayout_t bd, const void *beta,
	const void *C, cublasLtMatrixLayout_t cd, void *D, cublasLtMatrixLayout_t dd,
	const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t st),
       (h, d, alpha, A, ad, B, bd, beta, C, cd, D, dd, algo, ws, ws_bytes, st))
LT_FWD(cublasLtMatmulAlgoGetHeuristic,
       (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
	cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
	cublasLtMatmulPreference_t pref, int want, cublasLtMatmulHeuristicResult_t res[], int *got),
       (h, d, a, b, c, dl, pref, want, res, got))
LT_FWD(cublasLtMatmulDescCreate,
       (cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType_t st), (d, ct, st))
LT_FWD(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))
LT_FWD(cublasLtMatmulDescSetAttribute,
       (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void *buf, size_t n),
       (d, attr, buf, n))
LT_FWD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t *p), (p))
LT_FWD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))
LT_FWD(cublasLtMatmulPreferenceSetAttribute,
       (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
	size_t n),
       (p, attr, buf, n))
LT_FWD(cublasLtMatrixLayoutCreate,
       (cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
       (l, type, rows, cols, ld))
LT_FWD(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))
LT_FWD(cublasLtMatmulAlgoCheck,
       (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
	cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
	const cublasLtMatmulAlgo_t *algo, cublasLtMatmulHeuristicResult_t *res),
       (h, d, a, b, c, dl, algo, res))
LT_FWD(cublasLtMatmulAlgoConfigSetAttribute,
       (cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t attr, const void *buf,
	size_t n),
       (algo, attr, buf, n))
