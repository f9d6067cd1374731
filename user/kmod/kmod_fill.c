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
 * Every page claimed here is handed back with FILLED, whatever happened to
 * its read: by kvmem_kmod_fill before it returns; for kvmem_kmod_fill_start
 * (the reads go on while the caller computes) by kvmem_kmod_fill_wait, the
 * next kvmem_kmod_fill or kvmem_kmod_get, or close. Until then a claimed
 * page is mapped zeroed and nobody else may fill it: kvmem_kmod_get waits
 * for the started fills before it hands out a page. A read that failed or came back
 * short is handed back too, with FILLED's FAILED flag: the module drops it
 * and counts a read error (not a checksum error: the bytes were never
 * there); the caller then lets the module read it (kvmem_kmod_get), which
 * says what is wrong with the page.
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
	/* The reads write the module's pages: they end before it frees them. */
	kvmem_kmod_fill_wait(k);
	if (k->ring) {
		io_uring_queue_exit(k->ring);
		free(k->ring);
	}
	free(k->pending.ids);
	free(k->pending.res);
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

/* Add the m claimed pages ids[] to b, reads not yet submitted. */
static int batch_add(struct kmod_batch *b, const uint64_t *ids, size_t m)
{
	if (b->n + m > b->cap) {
		size_t cap = (b->n + m) * 2;
		uint64_t *i = realloc(b->ids, cap * sizeof(*i));

		if (!i)
			return -ENOMEM;
		b->ids = i;
		int *r = realloc(b->res, cap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		b->res = r;
		b->cap = cap;
	}
	for (size_t j = 0; j < m; j++) {
		b->ids[b->n + j] = ids[j];
		b->res[b->n + j] = -ECANCELED;
	}
	b->n += m;
	return 0;
}

/*
 * Submit b's reads (FILL_DEPTH in flight at most) and reap what has ended;
 * with wait, until every read has ended. res[j] gets each read's result
 * (bytes, or -errno; -ECANCELED when it was never submitted, -EINPROGRESS
 * when it was and the ring failed before it ended). Only one batch is on
 * the ring at a time. Under ring_lock.
 */
static void batch_pump(kvmem_kmod *k, struct kmod_batch *b, int wait)
{
	struct io_uring *ring = ring_get(k);
	struct io_uring_cqe *cqe;
	int r;

	if (!ring)
		return;	/* the reads stay -ECANCELED */
	while (b->done < b->n) {
		while (b->sub < b->n && b->sub - b->done < FILL_DEPTH) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
			uint64_t id = b->ids[b->sub];

			if (!sqe)
				break;
			io_uring_prep_read(sqe, k->fd_direct, k->fill_window + id * k->page_stride,
					   k->page_stride, id * k->page_stride);
			io_uring_sqe_set_data(sqe, (void *)(uintptr_t)b->sub);
			b->sub++;
		}
		r = wait ? io_uring_submit_and_wait(ring, 1) : io_uring_submit(ring);
		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
			break;
		while (io_uring_peek_cqe(ring, &cqe) == 0) {
			b->res[(uintptr_t)io_uring_cqe_get_data(cqe)] = cqe->res;
			io_uring_cqe_seen(ring, cqe);
			b->done++;
		}
		if (!wait)
			return;
	}
	if (b->done < b->n) {
		/* Reads submitted and not reaped may still land: their pages
		 * stay claimed (until close), never handed back. The ring is
		 * dropped; the next fill makes another. */
		for (size_t j = 0; j < b->sub; j++)
			if (b->res[j] == -ECANCELED)
				b->res[j] = -EINPROGRESS;
		io_uring_queue_exit(ring);
		free(ring);
		k->ring = NULL;
	}
}

/* A read that brought the whole page (its checksum still to be checked). */
static int read_whole(const kvmem_kmod *k, int r)
{
	return r >= 0 && (uint32_t)r >= k->page_bytes;
}

/*
 * Hand b's pages back, but those whose reads may still land, and empty b:
 * whole reads with FILLED and VERIFY, failed or short ones with FILLED and
 * FAILED (a read error in the module's counters). st[j] (b->n of them): 1
 * filled, or -errno (the read's error, -EIO for a short or lost read,
 * -EBADMSG). Returns the number filled, or -ENOMEM with nothing handed
 * back.
 */
static int batch_finish(kvmem_kmod *k, struct kmod_batch *b, int32_t *st)
{
	int32_t *fst = calloc(b->n + 1, sizeof(*fst));
	uint64_t *good = calloc(b->n + 1, sizeof(*good)), *bad = calloc(b->n + 1, sizeof(*bad));
	size_t ng = 0, nf = 0;
	int count = 0;

	if (!fst || !good || !bad) {
		free(fst);
		free(good);
		free(bad);
		return -ENOMEM;
	}
	for (size_t j = 0; j < b->n; j++) {
		if (b->res[j] == -EINPROGRESS)
			continue;
		if (read_whole(k, b->res[j]))
			good[ng++] = b->ids[j];
		else
			bad[nf++] = b->ids[j];
	}
	kvmem_kmod_filled(k, good, ng, 1, fst);
	kmod_filled_failed(k, bad, nf, NULL);
	for (size_t j = 0, i = 0; j < b->n; j++) {
		int r = b->res[j];

		if (r == -EINPROGRESS)
			st[j] = -EIO;
		else if (r < 0)
			st[j] = r;
		else if (!read_whole(k, r))
			st[j] = -EIO;	/* short: past the end of the file */
		else
			st[j] = fst[i] < 0 ? fst[i] : 1, i++;
		count += st[j] == 1;
	}
	b->n = b->sub = b->done = 0;
	free(fst);
	free(good);
	free(bad);
	return count;
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

static int fill_error(kvmem_kmod *k, uint64_t p, int32_t s)
{
	return kvmem_error(-s, "%s: filling page %llu (block %llu, layer %llu) with an O_DIRECT "
			   "read: %s", k->dev, (unsigned long long)p,
			   (unsigned long long)(p / k->n_layers),
			   (unsigned long long)(p % k->n_layers), fill_step(-s));
}

/* End the started fills (under ring_lock): the number filled, or the
 * first page's error. */
static int wait_locked(kvmem_kmod *k)
{
	struct kmod_batch *b = &k->pending;
	int32_t *st;
	int count;

	if (!b->n)
		return 0;
	batch_pump(k, b, 1);
	st = calloc(b->n, sizeof(*st));
	if (!st) {	/* hand them back all the same: FILLED checks them */
		int32_t one;

		for (size_t j = 0; j < b->n; j++)
			if (read_whole(k, b->res[j]))
				kvmem_kmod_filled(k, &b->ids[j], 1, 1, &one);
			else if (b->res[j] != -EINPROGRESS)
				kmod_filled_failed(k, &b->ids[j], 1, NULL);
		b->n = b->sub = b->done = 0;
		return kvmem_error(ENOMEM, "%s: ending started fills: out of memory", k->dev);
	}
	{
		uint64_t *ids = b->ids;
		size_t n = b->n;

		count = batch_finish(k, b, st);
		for (size_t j = 0; count >= 0 && j < n; j++)
			if (st[j] < 0) {
				count = fill_error(k, ids[j], st[j]);
				break;
			}
	}
	free(st);
	return count;
}

int kvmem_kmod_fill_wait(kvmem_kmod *k)
{
	int rc;

	if (k->fd_direct < 0)
		return 0;
	pthread_mutex_lock(&k->ring_lock);
	rc = wait_locked(k);
	pthread_mutex_unlock(&k->ring_lock);
	return rc;
}

void kmod_fill_drain(kvmem_kmod *k)
{
	kvmem_kmod_fill_wait(k);	/* a page that failed is absent: the fault reads it */
}

static int check_pages(kvmem_kmod *k, const uint64_t *pages, size_t n)
{
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
	return 0;
}

/* Claim pages[] and add the claimed ones to b; claimed[i] as CLAIM says.
 * Returns CLAIM's error for a whole list refused, else 0. */
static int claim_into(kvmem_kmod *k, struct kmod_batch *b, const uint64_t *pages, size_t n,
		      int32_t *claimed)
{
	int rc = kvmem_kmod_claim(k, pages, n, claimed);

	for (size_t i = 0; i < n; i++)
		if (claimed[i] == 1 && batch_add(b, &pages[i], 1) < 0) {
			/* No room to track it: hand it back now, unread
			 * (a read error in the counters: it never was
			 * read; the module reads it later). */
			kmod_filled_failed(k, &pages[i], 1, NULL);
			claimed[i] = -ENOMEM;
		}
	return rc < 0 ? rc : 0;
}

int kvmem_kmod_fill_start(kvmem_kmod *k, const uint64_t *pages, size_t n)
{
	int32_t *claimed;
	int rc, count = 0;

	if (!n)
		return 0;
	if ((rc = check_pages(k, pages, n)) < 0)
		return rc;
	claimed = calloc(n, sizeof(*claimed));
	if (!claimed)
		return kvmem_error(ENOMEM, "%s: filling %zu pages: out of memory", k->dev, n);
	pthread_mutex_lock(&k->ring_lock);
	rc = claim_into(k, &k->pending, pages, n, claimed);
	batch_pump(k, &k->pending, 0);
	pthread_mutex_unlock(&k->ring_lock);
	for (size_t i = 0; i < n; i++)
		count += claimed[i] == 1;
	free(claimed);
	return count ? count : rc;
}

int kvmem_kmod_fill(kvmem_kmod *k, const uint64_t *pages, size_t n, int32_t *status)
{
	struct kmod_batch b = { 0 };
	int32_t *claimed, *bst, *own = NULL, *st = status;
	size_t first = n;
	int count = 0, claim_rc;

	if (!n)
		return 0;
	if ((count = check_pages(k, pages, n)) < 0)
		return count;
	if (!st)
		st = own = calloc(n, sizeof(*own));
	claimed = calloc(n, sizeof(*claimed));
	bst = calloc(n, sizeof(*bst));
	if (!st || !claimed || !bst) {
		count = kvmem_error(ENOMEM, "%s: filling %zu pages: out of memory", k->dev, n);
		goto out;
	}
	pthread_mutex_lock(&k->ring_lock);
	wait_locked(k);	/* the ring is one batch's at a time */
	/* An error here may leave some pages claimed: those are read and
	 * handed back all the same (the status array says which). */
	claim_rc = claim_into(k, &b, pages, n, claimed);
	batch_pump(k, &b, 1);
	count = batch_finish(k, &b, bst);
	pthread_mutex_unlock(&k->ring_lock);
	if (count < 0) {	/* no memory to hand them back: FILLED checks them */
		int32_t one;

		for (size_t j = 0; j < b.n; j++)
			if (read_whole(k, b.res[j]))
				kvmem_kmod_filled(k, &b.ids[j], 1, 1, &one);
			else if (b.res[j] != -EINPROGRESS)
				kmod_filled_failed(k, &b.ids[j], 1, NULL);
		count = kvmem_error(ENOMEM, "%s: filling %zu pages: out of memory", k->dev, n);
		goto out;
	}
	count = 0;
	for (size_t i = 0, j = 0; i < n; i++) {
		st[i] = claimed[i] == 1 ? bst[j++] : claimed[i];
		count += st[i] == 1;
		if (st[i] < 0 && first == n)
			first = i;
	}
	if (first < n)
		count = fill_error(k, pages[first], st[first]);
	else if (claim_rc < 0)
		count = claim_rc;	/* a whole list refused (its message is set) */
out:
	free(b.ids);
	free(b.res);
	free(own);
	free(claimed);
	free(bst);
	return count;
}
