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
 * At most an eighth of the host's memory (and at least 1 GiB) is kept idle;
 * beyond that a freed buffer is unpinned at once. A server's 16 running
 * turns hold 64 such buffers (4.8 GB at 8B): the first version kept 16
 * buffers and 1 GiB, so under load a new session's writer pinned its pair
 * again, 41-45 ms of each one-off request's first chunk on the H100 host
 * (issue #26: benchmarks.md, "kvmem serve's rounds"). Freed with the
 * backend. KVMEM_CUDA_HOST_KEEP=0 keeps nothing (a measurement's peer), a
 * size (512M, 8G) caps what is kept idle. test_ws_append's rows_kept
 * checks it on a GPU (tests/gpu/prefill24.sh).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"
#include "kvmem/kvmem.h"
#include "backend/cuda_backend.h"

struct cuda_rows {
	pthread_mutex_t mu;
	size_t keep;		/* bytes kept idle at most (0: KVMEM_CUDA_HOST_KEEP=0) */
	int n, cap;
	size_t idle;		/* bytes kept, not in use */
	struct host_buf {
		void *p;
		size_t bytes;
		int used;
	} *e;
};

/* KVMEM_CUDA_HOST_KEEP: a size with K, M or G, or 0; else (unset, or not
 * a size) an eighth of the host's memory, at least 1 GiB. */
static size_t keep_bytes(void)
{
	const char *e = getenv("KVMEM_CUDA_HOST_KEEP");
	const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	size_t def = pages > 0 && page > 0 ? (size_t)pages * (size_t)page / 8 : 0;
	char *end;
	unsigned long long v;

	if (def < (1ull << 30))
		def = 1ull << 30;
	if (!e || !*e)
		return def;
	v = strtoull(e, &end, 10);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	return *end || end == e ? def : (size_t)v;
}

int cuda_rows_create(struct cuda *b)
{
	struct cuda_rows *h = calloc(1, sizeof(*h));

	if (!h)
		return kvmem_error(ENOMEM, "out of memory");
	if (pthread_mutex_init(&h->mu, NULL)) {
		free(h);
		return kvmem_error(ENOMEM, "cuda host memory: cannot make a mutex");
	}
	h->keep = keep_bytes();
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
	free(h->e);
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
	if (h->keep && h->n == h->cap) {	/* untracked: unpinned when freed */
		int cap = h->cap ? 2 * h->cap : 16;
		struct host_buf *e = realloc(h->e, sizeof(*e) * (size_t)cap);

		if (e) {
			h->e = e;
			h->cap = cap;
		}
	}
	if (h->keep && h->n < h->cap)
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
	if (i < h->n && h->idle + h->e[i].bytes <= h->keep) {
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
