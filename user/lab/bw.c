// SPDX-License-Identifier: MIT
/*
 * The bandwidths a replay's step time is modelled with, measured here:
 * memory copies (the best of a few passes over 64 MiB, so the caches do not
 * flatter it) and reads of a workspace's pages file in 1 MiB requests, with
 * O_DIRECT where the file system takes it (else through the page cache,
 * which then flatters it: a cold NVMe figure needs O_DIRECT).
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "kvmem/lab.h"
#include "util/clock.h"

#define COPY_BYTES (64u << 20)
#define READ_REQ (1u << 20)

static double copy_bw(void)
{
	char *a = malloc(COPY_BYTES), *b = malloc(COPY_BYTES);
	double best = 0;

	if (!a || !b) {
		free(a), free(b);
		return 0;
	}
	memset(a, 1, COPY_BYTES);
	memset(b, 2, COPY_BYTES);
	for (int i = 0; i < 4; i++) {
		double t0 = kvmem_now_s(), dt;

		memcpy(i % 2 ? a : b, i % 2 ? b : a, COPY_BYTES);
		dt = kvmem_now_s() - t0;
		if (dt > 0 && COPY_BYTES / dt > best)
			best = COPY_BYTES / dt;
	}
	/* Keep the copies from being optimised away. */
	if (a[7] == 3)
		best = 0;
	free(a), free(b);
	return best;
}

static double read_bw(const char *file, uint64_t max_bytes)
{
	int fd = open(file, O_RDONLY | O_DIRECT | O_CLOEXEC);
	void *buf = NULL;
	uint64_t done = 0;
	double t0;

	if (fd < 0)
		fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || posix_memalign(&buf, 4096, READ_REQ)) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	t0 = kvmem_now_s();
	while (done < max_bytes) {
		ssize_t r = pread(fd, buf, READ_REQ, (off_t)done);

		if (r <= 0)
			break;
		done += (uint64_t)r;
	}
	t0 = kvmem_now_s() - t0;
	close(fd);
	free(buf);
	return done && t0 > 0 ? done / t0 : 0;
}

int kvmem_lab_measure_bw(const char *file, uint64_t max_bytes, kvmem_lab_bw *bw)
{
	memset(bw, 0, sizeof(*bw));
	bw->mem = copy_bw();
	bw->link = bw->mem;
	if (file)
		bw->nvme = read_bw(file, max_bytes ? max_bytes : 256ull << 20);
	if (!bw->mem)
		return kvmem_error(ENOMEM, "lab: out of memory measuring the copy bandwidth");
	return 0;
}
