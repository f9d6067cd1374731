// SPDX-License-Identifier: MIT
/*
 * The cuda backend's pinned rows kept for reuse (user/backend/cuda_host.c):
 * a buffer a session frees is handed, still pinned, to the next request of
 * its size; two buffers in use are never the same; another size gets its
 * own; no more than 1 GiB is kept idle (a third 384 MiB buffer freed is
 * unpinned, and asked for again it is pinned anew); a kept buffer still
 * takes an asynchronous copy from the device (it is pinned memory). With
 * KVMEM_CUDA_HOST_KEEP=0 nothing is kept and the reuse cases fail (what
 * the backend did before: every session pinned its buffers anew).
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda_backend.h"
#include "check_host.h"
#include "check_util.h"

/* Host memory the runtime knows as pinned. */
static int is_pinned(const void *p)
{
	struct cudaPointerAttributes a;

	if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return a.type == cudaMemoryTypeHost;
}

/* bytes copied from the device into p, asynchronously, arrive. */
static int takes_copy(void *p, size_t bytes)
{
	uint8_t *want = hmalloc(bytes);
	void *d;
	cudaStream_t st;
	int ok;

	for (size_t i = 0; i < bytes; i++)
		want[i] = (uint8_t)rnext();
	d = dput(want, bytes);
	memset(p, 0, bytes);
	ok = cudaStreamCreate(&st) == cudaSuccess &&
	     cudaMemcpyAsync(p, d, bytes, cudaMemcpyDeviceToHost, st) == cudaSuccess &&
	     cudaStreamSynchronize(st) == cudaSuccess && !memcmp(p, want, bytes);
	cudaStreamDestroy(st);
	cudaFree(d);
	free(want);
	return ok;
}

void check_host(void)
{
	const size_t n = (size_t)8 << 20, big = (size_t)384 << 20;
	struct cuda b;
	void *a = NULL, *c = NULL, *a2 = NULL, *d = NULL, *g[3] = { NULL }, *g2[3] = { NULL };
	uint64_t pinned, reused, p0, r0;
	int got = 0;

	memset(&b, 0, sizeof(b));
	if (cuda_host_create(&b) < 0)
		die("cuda_host_create");
	if (cuda_host_alloc(&b, n, &a) < 0 || cuda_host_alloc(&b, n, &c) < 0)
		die("cuda_host_alloc");
	report(a && c && a != c && is_pinned(a) && is_pinned(c),
	       "host keep: two buffers of 8 MiB in use are distinct and pinned");
	cuda_host_free(&b, a);
	if (cuda_host_alloc(&b, n, &a2) < 0 || cuda_host_alloc(&b, n + 4096, &d) < 0)
		die("cuda_host_alloc");
	report(a2 == a, "host keep: a freed buffer goes to the next request of its size "
	       "(%p, then %p)", a, a2);
	report(d != a2 && d != c && is_pinned(a2) && takes_copy(a2, n),
	       "host keep: another size gets its own; the kept one still takes a copy from the "
	       "device");
	cuda_host_counts(&b, &pinned, &reused);
	report(pinned == 3 && reused == 1, "host keep: 3 pinned, 1 handed again (%llu, %llu)",
	       (unsigned long long)pinned, (unsigned long long)reused);
	/* The idle bound: two 384 MiB buffers kept, the third unpinned. */
	cuda_host_free(&b, a2);
	cuda_host_free(&b, c);
	cuda_host_free(&b, d);
	cuda_host_counts(&b, &p0, &r0);
	for (int i = 0; i < 3; i++)
		if (cuda_host_alloc(&b, big, &g[i]) < 0)
			die("cuda_host_alloc");
	for (int i = 0; i < 3; i++)
		cuda_host_free(&b, g[i]);
	for (int i = 0; i < 3; i++)
		if (cuda_host_alloc(&b, big, &g2[i]) < 0)
			die("cuda_host_alloc");
	cuda_host_counts(&b, &pinned, &reused);
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 3; j++)
			got += g2[i] == g[j];
	report(pinned - p0 == 4 && reused - r0 == 2 && got == 2,
	       "host keep: at most 1 GiB idle: of three 384 MiB buffers freed two were kept "
	       "(pinned %llu, handed again %llu, the same addresses %d)",
	       (unsigned long long)(pinned - p0), (unsigned long long)(reused - r0), got);
	for (int i = 0; i < 3; i++)
		cuda_host_free(&b, g2[i]);
	cuda_host_destroy(&b);
}
