// SPDX-License-Identifier: MIT
/*
 * Gather items for a kernel that may still run when place() returns: two
 * halves of pinned host and device memory, each with an event recorded
 * after the kernel that read it. A place() that reads only device memory
 * (pages of the device pool) does not wait for its kernel, so the host
 * builds the next call's items (the session's walk, the pool's lookups)
 * while the device gathers; the next call writes the other half and waits
 * only for the half it takes. A call that reads host memory waits as
 * before (the session lets those pages go when place() returns).
 */
#include <errno.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda_backend.h"

int cuda_ring_room(struct cuda_ring *r, kvmem_cuda_ctx *c, int n, uint64_t *count)
{
	int cap = r->cap ? r->cap : 256, rc;

	if (n <= r->cap)
		return 0;
	/* What is freed may be read by a kernel still queued. */
	if ((rc = cuda_ring_quiet(r, c)) < 0)
		return rc;
	while (cap < n)
		cap *= 2;
	if (r->dev && count)
		*count -= 2 * (uint64_t)r->cap * sizeof(*r->dev);
	kvmem_cuda_free(r->dev);
	cudaFreeHost(r->host);
	r->dev = r->host = NULL;
	r->cap = 0;
	if ((rc = kvmem_cuda_malloc((void **)&r->dev, 2 * (size_t)cap * sizeof(*r->dev))) < 0 ||
	    (rc = cuda_pinned(&r->host, 2 * (size_t)cap * sizeof(*r->host))) < 0)
		return rc;
	if (count)
		*count += 2 * (uint64_t)cap * sizeof(*r->dev);
	r->cap = cap;
	return 0;
}

/* An event recorded at this point of the stream (made on first use) and
 * armed; with no event to be had, the stream is waited for instead and
 * nothing is armed. */
int cuda_mark(void **ev, int *armed, kvmem_cuda_ctx *c)
{
	cudaEvent_t e = (cudaEvent_t)*ev;

	if (!e && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_cuda_sync(c);	/* no event: wait now, as before */
	}
	*ev = e;
	if (cudaEventRecord(e, (cudaStream_t)kvmem_cuda_stream(c)) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_cuda_sync(c);
	}
	*armed = 1;
	return 0;
}

/* What came before an armed mark is done. */
int cuda_mark_wait(void *ev, int *armed)
{
	if (!*armed)
		return 0;
	*armed = 0;
	return cudaEventSynchronize((cudaEvent_t)ev) == cudaSuccess ? 0 :
	       kvmem_error(EIO, "cuda: waiting for queued work");
}

/* The mark waited for (if armed) and its event given back. */
void cuda_mark_free(void **ev, int *armed)
{
	if (*ev) {
		cuda_mark_wait(*ev, armed);
		cudaEventDestroy((cudaEvent_t)*ev);
	}
	*ev = NULL;
}

kvmem_gather_item *cuda_ring_host(struct cuda_ring *r)
{
	const int h = r->half;

	/* The kernel two calls back: done long since, as a rule. */
	cuda_mark_wait(r->ev[h], &r->armed[h]);
	return r->host + (size_t)h * r->cap;
}

int cuda_ring_upload(struct cuda_ring *r, kvmem_cuda_ctx *c, int n, kvmem_gather_item **dev)
{
	const size_t at = (size_t)r->half * r->cap;

	if (cudaMemcpyAsync(r->dev + at, r->host + at, (size_t)n * sizeof(*r->dev),
			    cudaMemcpyHostToDevice, (cudaStream_t)kvmem_cuda_stream(c)) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda place: uploading %d items", n);
	}
	*dev = r->dev + at;
	return 0;
}

int cuda_ring_queued(struct cuda_ring *r, kvmem_cuda_ctx *c)
{
	const int h = r->half;
	int rc = cuda_mark(&r->ev[h], &r->armed[h], c);

	if (r->armed[h])
		r->half = h ^ 1;
	return rc;
}

int cuda_ring_quiet(struct cuda_ring *r, kvmem_cuda_ctx *c)
{
	if (!r->armed[0] && !r->armed[1])
		return 0;
	r->armed[0] = r->armed[1] = 0;
	return kvmem_cuda_sync(c);
}

int cuda_slot_run(const kvmem_gather_item *it, int n)
{
	int runs = n > 0, r;

	for (int i = 1; i < n; i++)
		runs += it[i].slot != it[i - 1].slot || it[i].n != it[i - 1].n;
	r = runs ? n / runs : 1;
	return r < 1 ? 1 : r > 64 ? 64 : r;
}

void cuda_ring_free(struct cuda_ring *r)
{
	for (int h = 0; h < 2; h++)
		cuda_mark_free(&r->ev[h], &r->armed[h]);
	kvmem_cuda_free(r->dev);
	cudaFreeHost(r->host);
	memset(r, 0, sizeof(*r));
}
