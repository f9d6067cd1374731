// SPDX-License-Identifier: MIT
/*
 * Userspace fills of the module's window (kvmem_kmod_fill): CLAIM the absent
 * pages, read each with io_uring from the pages file opened O_DIRECT
 * straight into its window page (the device writes the module's memory: no
 * page cache, no copy), then FILLED with VERIFY (the module checks each
 * page's XXH3-64 against the sums file and drops a page that fails). The
 * module's own fill, on a fault or a PREFETCH, is a buffered read: a copy
 * out of the page cache, counted in its `fills`; these count in
 * `user_fills`.
 *
 * Every page claimed here is handed back with FILLED before the call
 * returns, whatever happened to its read: a claimed page is mapped zeroed
 * and nobody else may fill it until then. A read that failed or came back
 * short is handed back too, and the check drops it (the module counts it
 * as a checksum error); the caller then lets the module read it
 * (kvmem_kmod_get), which says what is wrong with the page.
 *
 * A read-only workspace's window is mapped a second time, writable, for
 * the reads: the module lets only claimed pages take writes.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kmod/kmod_int.h"

/* Reads in flight at once. */
#define FILL_DEPTH 64

void kmod_fill_setup(kvmem_kmod *k, int pages_fd, int rdonly)
{
	char path[64];
	void *m;
	int fd;

	/* The caller's descriptor may have been opened without O_DIRECT, and
	 * setting it there would change the caller's file: open the same
	 * file again. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", pages_fd);
	fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0)
		return;	/* tmpfs (no O_DIRECT in 6.1), or no /proc: the module reads */
	if (!rdonly) {
		k->fill_window = k->window;
	} else {
		m = mmap(NULL, k->window_len, PROT_READ | PROT_WRITE, MAP_SHARED, k->fd,
			 KVMEM_MMAP_PAGE_WINDOW);
		if (m == MAP_FAILED) {	/* a module older than writable read-only windows */
			close(fd);
			return;
		}
		k->fill_window = m;
	}
	pthread_mutex_init(&k->ring_lock, NULL);
	k->fd_direct = fd;
}

void kmod_fill_close(kvmem_kmod *k)
{
	if (k->fd_direct < 0)
		return;
	if (k->ring) {
		io_uring_queue_exit(k->ring);
		free(k->ring);
	}
	pthread_mutex_destroy(&k->ring_lock);
	if (k->fill_window != k->window)
		munmap(k->fill_window, k->window_len);
	close(k->fd_direct);
	k->fd_direct = -1;
}

int kvmem_kmod_direct(const kvmem_kmod *k)
{
	return k->fd_direct >= 0;
}

static struct io_uring *ring_get(kvmem_kmod *k)
{
	struct io_uring *r;

	if (k->ring)
		return k->ring;
	r = calloc(1, sizeof(*r));
	if (!r || io_uring_queue_init(FILL_DEPTH, r, 0) < 0) {
		free(r);
		return NULL;
	}
	return k->ring = r;
}

/*
 * Read the m claimed pages ids[] into the window; res[j] gets each read's
 * result (bytes, or -errno; -ECANCELED when it was never submitted,
 * -EINPROGRESS when it was and the ring failed before it ended). Under
 * ring_lock.
 */
static void read_claimed(kvmem_kmod *k, const uint64_t *ids, size_t m, int *res)
{
	struct io_uring *ring = ring_get(k);
	struct io_uring_cqe *cqe;
	size_t sub = 0, done = 0;
	int r;

	for (size_t j = 0; j < m; j++)
		res[j] = -ECANCELED;
	if (!ring)
		return;
	while (done < m) {
		while (sub < m && sub - done < FILL_DEPTH) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

			if (!sqe)
				break;
			io_uring_prep_read(sqe, k->fd_direct, k->fill_window + ids[sub] * k->page_stride,
					   k->page_stride, ids[sub] * k->page_stride);
			io_uring_sqe_set_data(sqe, (void *)(uintptr_t)sub);
			sub++;
		}
		r = io_uring_submit_and_wait(ring, 1);
		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
			break;
		while (io_uring_peek_cqe(ring, &cqe) == 0) {
			res[(uintptr_t)io_uring_cqe_get_data(cqe)] = cqe->res;
			io_uring_cqe_seen(ring, cqe);
			done++;
		}
	}
	if (done < m) {
		/* Reads submitted and not reaped may still land: their pages
		 * stay claimed (until close), never handed back. The ring is
		 * dropped; the next fill makes another. */
		for (size_t j = done; j < sub; j++)
			if (res[j] == -ECANCELED)
				res[j] = -EINPROGRESS;
		io_uring_queue_exit(ring);
		free(ring);
		k->ring = NULL;
	}
}

static const char *fill_step(int err)
{
	switch (err) {
	case EBADMSG:
		return "it does not match its checksum (dropped)";
	case ENOMEM:
		return "no slot to claim (every slot claimed or held), or no memory";
	default:
		return strerror(err);
	}
}

int kvmem_kmod_fill(kvmem_kmod *k, const uint64_t *pages, size_t n, int32_t *status)
{
	int32_t *claimed, *fst, *own = NULL, *st = status;
	uint64_t *ids;
	size_t m = 0, back = 0, first = n;
	int *res, count = 0, claim_rc;

	if (!n)
		return 0;
	if (k->fd_direct < 0)
		return kvmem_error(ENOTSUP, "%s: the pages file takes no O_DIRECT reads here (or "
				   "the window cannot be mapped for them): the module reads "
				   "pages itself (kvmem_kmod_get, kvmem_kmod_prefetch)", k->dev);
	for (size_t i = 0; i < n; i++)
		if (pages[i] >= kvmem_kmod_pages(k))
			return kvmem_error(EINVAL, "%s: filling page %llu: past the last page "
					   "(%llu pages): nothing filled", k->dev,
					   (unsigned long long)pages[i],
					   (unsigned long long)kvmem_kmod_pages(k));
	if (!st)
		st = own = calloc(n, sizeof(*own));
	claimed = calloc(n, sizeof(*claimed));
	fst = calloc(n, sizeof(*fst));
	ids = calloc(n, sizeof(*ids));
	res = calloc(n, sizeof(*res));
	if (!st || !claimed || !fst || !ids || !res) {
		count = kvmem_error(ENOMEM, "%s: filling %zu pages: out of memory", k->dev, n);
		goto out;
	}
	/* An error here may leave some pages claimed: those are read and
	 * handed back all the same (the status array says which). */
	claim_rc = kvmem_kmod_claim(k, pages, n, claimed);
	for (size_t i = 0; i < n; i++)
		if (claimed[i] == 1)
			ids[m++] = pages[i];
	pthread_mutex_lock(&k->ring_lock);
	read_claimed(k, ids, m, res);
	pthread_mutex_unlock(&k->ring_lock);
	/* Every claimed page back, but those whose reads may still land. */
	for (size_t j = 0; j < m; j++)
		if (res[j] != -EINPROGRESS)
			ids[back++] = ids[j];
	kvmem_kmod_filled(k, ids, back, 1, fst);
	for (size_t i = 0, j = 0, b = 0; i < n; i++) {
		int32_t s = claimed[i];

		if (s == 1) {
			int32_t f = res[j] == -EINPROGRESS ? -EIO : fst[b++];

			if (res[j] == -EINPROGRESS)
				s = -EIO;
			else if (res[j] < 0)
				s = res[j];
			else if ((uint32_t)res[j] < k->page_bytes)
				s = -EIO;	/* short: past the end of the file */
			else if (f < 0)
				s = f;
			j++;
			count += s == 1;
		}
		st[i] = s;
		if (s < 0 && first == n)
			first = i;
	}
	if (first < n) {
		uint64_t p = pages[first];

		count = kvmem_error(-st[first], "%s: filling page %llu (block %llu, layer %llu) "
				    "with an O_DIRECT read: %s", k->dev, (unsigned long long)p,
				    (unsigned long long)(p / k->n_layers),
				    (unsigned long long)(p % k->n_layers), fill_step(-st[first]));
	} else if (claim_rc < 0) {
		count = claim_rc;	/* a whole list refused (its message is set) */
	}
out:
	free(own);
	free(claimed);
	free(fst);
	free(ids);
	free(res);
	return count;
}
