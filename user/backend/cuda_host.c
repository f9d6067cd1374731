// SPDX-License-Identifier: MIT
/*
 * Pinned host memory for the sessions' typed rows (host_alloc / host_free),
 * kept when a session lets it go and handed to the next session that asks
 * for the same size.
 *
 * A session at Qwen3-8B with chunks of 1024 holds four 75 MB buffers of
 * bf16 rows (raw K and V, and the writer thread's second set), all pinned:
 * cudaMallocHost faults and pins them at about 6 GB/s on the H200's host,
 * 25 ms a pair, and the writer's pair was made inside the first append's
 * timed prefill. A server opens a session per conversation and a benchmark
 * one per run, all with the same geometry, so the sizes repeat: kept here,
 * only a process's first sessions pay for pinning.
 *
 * Up to KEEP_MAX buffers are tracked and at most KEEP_BYTES of them kept
 * idle; beyond that a freed buffer is unpinned at once. Freed with the
 * backend. KVMEM_CUDA_HOST_KEEP=0 keeps nothing (a measurement's peer).
 * test_ws_append's rows_kept checks it on a GPU (tests/gpu/prefill24.sh).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"
#include "kvmem/kvmem.h"
#include "backend/cuda_backend.h"

#define KEEP_MAX 16
#define KEEP_BYTES (1ull << 30)

struct cuda_rows {
	pthread_mutex_t mu;
	int keep;		/* 0: KVMEM_CUDA_HOST_KEEP=0 */
	int n;
	size_t idle;		/* bytes kept, not in use */
	struct host_buf {
		void *p;
		size_t bytes;
		int used;
	} e[KEEP_MAX];
};

int cuda_rows_create(struct cuda *b)
{
	const char *e = getenv("KVMEM_CUDA_HOST_KEEP");
	struct cuda_rows *h = calloc(1, sizeof(*h));

	if (!h)
		return kvmem_error(ENOMEM, "out of memory");
	if (pthread_mutex_init(&h->mu, NULL)) {
		free(h);
		return kvmem_error(ENOMEM, "cuda host memory: cannot make a mutex");
	}
	h->keep = !(e && !strcmp(e, "0"));
	b->rows = h;
	return 0;
}

void cuda_rows_destroy(struct cuda *b)
{
	struct cuda_rows *h = b->rows;

	if (!h)
		return;
	for (int i = 0; i < h->n; i++)
		cudaFreeHost(h->e[i].p);
	pthread_mutex_destroy(&h->mu);
	free(h);
	b->rows = NULL;
}

int cuda_rows_alloc(struct cuda *b, size_t bytes, void **p)
{
	struct cuda_rows *h = b->rows;
	int rc;

	*p = NULL;
	pthread_mutex_lock(&h->mu);
	for (int i = 0; i < h->n; i++)
		if (!h->e[i].used && h->e[i].bytes == bytes) {
			h->e[i].used = 1;
			h->idle -= bytes;
			*p = h->e[i].p;
			break;
		}
	pthread_mutex_unlock(&h->mu);
	if (*p)
		return 0;
	if ((rc = cuda_pinned(p, bytes)) < 0)
		return rc;
	pthread_mutex_lock(&h->mu);
	if (h->keep && h->n < KEEP_MAX)
		h->e[h->n++] = (struct host_buf){ .p = *p, .bytes = bytes, .used = 1 };
	pthread_mutex_unlock(&h->mu);
	return 0;
}

void cuda_rows_free(struct cuda *b, void *p)
{
	struct cuda_rows *h = b->rows;
	int i;

	if (!p)
		return;
	pthread_mutex_lock(&h->mu);
	for (i = 0; i < h->n && h->e[i].p != p; i++)
		;
	if (i < h->n && h->idle + h->e[i].bytes <= KEEP_BYTES) {
		h->e[i].used = 0;	/* kept for the next session */
		h->idle += h->e[i].bytes;
		pthread_mutex_unlock(&h->mu);
		return;
	}
	if (i < h->n)	/* tracked, but too much is kept idle already */
		h->e[i] = h->e[--h->n];
	pthread_mutex_unlock(&h->mu);
	cudaFreeHost(p);
}
