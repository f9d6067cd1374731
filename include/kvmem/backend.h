/* SPDX-License-Identifier: MIT */
/*
 * Compute backends: where a session's forward passes and views live.
 *
 * A backend owns the model's weights in its own form and its views. A view
 * is one session's execution view: per layer, the K (rotated at compact slot
 * positions) and V the next tokens attend to. A session drives its view
 * through the backend's internal ops (user/backend/backend_impl.h); what a
 * program does here is open a backend, hand it to kvmem_session_create()
 * (kvmem/session.h), and, when it wants a plain full-context run beside a
 * session (the exactness check), grow a view of its own with
 * kvmem_backend_append(). Calls on one backend come from one thread at a
 * time.
 *
 * Backends: "cpu" (the reference engine: fp32, bit-exact, OpenBLAS) and,
 * when built with nvcc, "cuda" (bf16 views, cuBLASLt and kvmem's kernels).
 */
#ifndef KVMEM_BACKEND_H
#define KVMEM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

typedef struct kvmem_backend_opts {
	int max_chunk;		/* most tokens in one forward call; 0: 128 */
	int device;		/* GPU ordinal (cuda); ignored by cpu */
	uint64_t mem_cap;	/* device bytes the backend may take (cpu: its views'
				 * bytes); past it a view does not grow (ENOMEM);
				 * 0: no cap */
	uint64_t page_pool;	/* device page pool bytes (cuda); 0: the default
				 * (twice the view's pages at the first placement, at
				 * least 64 MiB; under a cap within half of what the
				 * cap leaves; without a cap or a size, a session's
				 * pool_fill grows it within half of the device
				 * memory free, so that an H200 keeps a 256K
				 * workspace of Qwen3-8B pages) */
	uint64_t index_mem;	/* device bytes a session's index copy may take
				 * (cuda, see score below); 0: the default (1/8
				 * of the cap; 4 GiB without a cap); past it the
				 * session scores on the host */
	/* The KV the views hold: 0, the backend's own (cpu fp32, cuda bf16);
	 * KVMEM_DTYPE_FP8: every new token's raw K and V are quantised to
	 * e4m3 (a scale per token and KV head) before they are rotated,
	 * stored and attended to, and pages are placed from fp8, so a full
	 * context run and a paged session read the same fp8 KV (cpu: fp32
	 * views of the fp8 values; cuda: e4m3 views with row scales;
	 * -ENOTSUP with --tp). */
	uint32_t kv_dtype;
	int tp;			/* tensor parallel ranks (GPUs), the model split by
				 * KV heads (Documentation/architecture.md, "Tensor
				 * parallelism"): 0, today's path; 1, the split code
				 * with one rank (cpu: bit-exact with 0); N > 1
				 * refused (-ENODEV) without N GPUs, and (-ENOTSUP)
				 * until the multi-GPU forward is built; -EINVAL
				 * when the model's KV heads or intermediate size
				 * do not divide by N */
	/* 1: prefill chunks of several views may share one forward pass
	 * (kvmem_session_append_batch, kvmem serve's prompts), each view's
	 * rows with the bits they get alone. The cpu backend always does; the
	 * cuda backend then runs every GEMM of 2+ rows of a shape on one
	 * cuBLASLt algorithm, whatever the rows (that invariance's price: a
	 * lone chunk's GEMMs about 10% slower, Documentation/benchmarks.md;
	 * KVMEM_CUDA_GEMM_PIN=0 refuses it). 0: each chunk alone. */
	int batch_prefill;
} kvmem_backend_opts;

/* What the device can do at most, measured when asked: the ceilings the
 * benchmarks put their figures against. */
typedef struct kvmem_ceilings {
	char device[128];	/* "NVIDIA H200", "x86-64, 2 threads" */
	double matmul_tflops;	/* a large GEMM in the backend's compute type, the
				 * best of a short burst */
	const char *matmul_type;	/* "bf16 (cuBLASLt)", "fp32 (OpenBLAS)" */
	double copy_gbps;	/* a large copy in device memory: bytes read plus
				 * bytes written per second (the rate a stream of
				 * reads, such as decode's weights, can reach) */
	uint64_t mem_bytes;	/* device memory, total */
	/* One large copy (1 GiB) from pinned host memory to the device and
	 * back: the peak rematerialisation and stage-out are held against
	 * (0: the backend has no separate device memory). */
	double h2d_gbps, d2h_gbps;
	/* The same GEMM back to back for a second after the device has
	 * warmed to its power limit: the rate a long prefill can hold, where
	 * a burst's clocks no longer last (0: not measured). */
	double matmul_held_tflops;
} kvmem_ceilings;

/* What place() has done since the backend was created (counters only
 * grow): the figures `kvmem bench step` and the demo print. */
typedef struct kvmem_place_stats {
	uint64_t calls, items, tokens;	/* place() calls, items, token-layers */
	uint64_t bytes_in;		/* page bytes read from host memory */
	uint64_t bytes_staged;		/* of which first copied into staging
					 * (the page was in memory the device
					 * cannot address) */
	uint64_t pool_hits, pool_misses;	/* items served by the device page pool */
	uint64_t pool_pages, pool_cap;	/* pages in the pool now / its slots */
	uint64_t ns;			/* wall time inside place() */
	/* Tokens moved inside a view (re-rotated on the device from the raw
	 * K it keeps beside the view: no page read) and the time it took. */
	uint64_t moved_tokens, move_ns;
	/* Page bytes read from the device page pool (pool_hits' tokens). */
	uint64_t pool_bytes;
	/* Pages copied into the pool ahead of their use (pool_fill: the
	 * runners-up of a session's first view), their bytes, the time. */
	uint64_t filled_pages, filled_bytes, fill_ns;
	/* Token-layers of the view copied aside by moves (their sources'
	 * slot ranges, read before anything is written over them). */
	uint64_t move_staged_tokens;
} kvmem_place_stats;

typedef struct kvmem_backend kvmem_backend;
/* One execution view, owned by its backend. */
typedef struct kvmem_view kvmem_view;

/*
 * Open a backend for model m (which must outlive it). name: "cpu", "cuda",
 * or NULL / "auto" for the best one that runs here (a GPU when there is
 * one). -EINVAL for an unknown name (the message lists the known ones),
 * -ENODEV when the named backend cannot run here (the message says why).
 */
int kvmem_backend_open(const char *name, const kvmem_model *m, const kvmem_backend_opts *o,
		       kvmem_backend **out);
void kvmem_backend_close(kvmem_backend *b);
/* The backends built in, i from 0 until NULL: name, and a line for --help
 * in *what when what is not NULL. */
const char *kvmem_backend_at(int i, const char **what);

const char *kvmem_backend_name(const kvmem_backend *b);	/* "cpu", "cuda" */
const kvmem_model *kvmem_backend_model(const kvmem_backend *b);
/* The options in force, defaults resolved. */
const kvmem_backend_opts *kvmem_backend_options(const kvmem_backend *b);

/* An empty view on b (freed by kvmem_backend_view_free before b closes).
 * slots > 0 reserves room for that many tokens now; it grows as needed. */
int kvmem_backend_view_new(kvmem_backend *b, int64_t slots, kvmem_view **out);
void kvmem_backend_view_free(kvmem_backend *b, kvmem_view *v);
/* Tokens in the view / empty it (its room stays). */
int64_t kvmem_backend_view_len(kvmem_backend *b, const kvmem_view *v);
int kvmem_backend_view_clear(kvmem_backend *b, kvmem_view *v);
/*
 * A plain full-context run: n tokens forward over the view at positions
 * len..len+n-1, room made as needed. logits: [n][vocab] when all_logits,
 * else the last token's [vocab] (NULL: not wanted).
 */
int kvmem_backend_append(kvmem_backend *b, kvmem_view *v, const int32_t *tokens, int n,
			 float *logits, int all_logits);

/* Measure the device's ceilings now (a second or two); -ENOTSUP when the
 * backend cannot. */
int kvmem_backend_ceilings(kvmem_backend *b, kvmem_ceilings *out);
/* Device memory the backend holds now (weights, views, scratch); 0 when it
 * has none of its own. */
uint64_t kvmem_backend_mem_used(kvmem_backend *b);
/* Rematerialisation's counters since the backend opened (zeros when the
 * backend keeps none). */
void kvmem_backend_place_stats(kvmem_backend *b, kvmem_place_stats *st);
/* A named knob for tools and benchmarks (cuda: "place" = "gather" | "batch"
 * | "stage"; "pool" = device page pool bytes). -ENOTSUP when the backend has
 * none, -EINVAL for an unknown key or value. */
int kvmem_backend_set(kvmem_backend *b, const char *key, const char *value);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
