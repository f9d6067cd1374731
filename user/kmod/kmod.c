// SPDX-License-Identifier: MIT
/*
 * The client of /dev/kvmem (include/kvmem/kmod.h): open, set up, map the
 * page table and the window, and thin wrappers over the ioctls that split
 * long page lists and turn errno values into kvmem errors naming the page.
 * kmod_files.c opens one over a workspace directory; kmod_fill.c fills
 * pages with io_uring O_DIRECT reads into the window.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kmod/kmod_int.h"

void kvmem_kmod_opts_default(kvmem_kmod_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->host_cap = 256ull << 20;
	o->numa_node = -1;
}

static const char *why_open(int err)
{
	switch (err) {
	case EACCES:
	case EPERM:
		return " (root, or the group given to the module's group= parameter)";
	default:
		return "";
	}
}

/* The device's descriptor, or -errno with a message: -ENODEV when no
 * driver is behind the name (no node, or a stale one). */
static int open_dev(const char *dev)
{
	int fd = open(dev, O_RDWR | O_CLOEXEC), err;

	if (fd >= 0)
		return fd;
	err = errno;
	if (err == ENOENT || err == ENXIO || err == ENODEV)
		return kvmem_error(ENODEV, "%s: no such device: the kernel module is not loaded "
				   "(insmod kvmem.ko; Documentation/kmod.md)", dev);
	return kvmem_error(err, "%s: cannot open: %s%s", dev, strerror(err), why_open(err));
}

int kvmem_kmod_probe(const char *dev)
{
	int fd = open_dev(dev ? dev : "/dev/kvmem");

	if (fd < 0)
		return fd;
	close(fd);
	return 0;
}

int kvmem_kmod_open(const kvmem_kmod_files *f, const kvmem_kmod_opts *o, kvmem_kmod **out)
{
	kvmem_kmod_opts def;
	struct kvmem_ioc_setup s;
	kvmem_kmod *k;
	int prot, err;

	*out = NULL;
	if (!o) {
		kvmem_kmod_opts_default(&def);
		o = &def;
	}
	k = calloc(1, sizeof(*k));
	if (!k)
		return kvmem_error(ENOMEM, "kvmem_kmod_open: out of memory");
	k->fd_lock = -1;
	k->fd_direct = -1;
	snprintf(k->dev, sizeof(k->dev), "%s", o->dev ? o->dev : "/dev/kvmem");
	k->fd = open_dev(k->dev);
	if (k->fd < 0) {
		err = -k->fd;
		free(k);
		return -err;
	}
	memset(&s, 0, sizeof(s));
	s.pages_fd = f->pages_fd;
	s.sums_fd = f->sums_fd;
	s.page_bytes = f->page_bytes;
	s.page_stride = f->page_stride;
	s.n_layers = f->n_layers;
	s.numa_node = o->numa_node;
	s.page_count = f->page_count;
	s.page_max = o->page_max;
	s.host_cap = o->host_cap ? o->host_cap : 256ull << 20;
	s.flags = (o->flags & KVMEM_KMOD_RDONLY) ? KVMEM_SETUP_RDONLY : 0;
	if (ioctl(k->fd, KVMEM_IOC_SETUP, &s) < 0) {
		err = errno;
		kvmem_error(err, "%s: setup (%llu pages of %u bytes, stride %u, %u layers, "
			    "host cap %llu bytes, node %d) refused: %s", k->dev,
			    (unsigned long long)s.page_count, s.page_bytes, s.page_stride,
			    s.n_layers, (unsigned long long)s.host_cap, s.numa_node,
			    strerror(err));
		goto fail;
	}
	k->page_bytes = f->page_bytes;
	k->page_stride = f->page_stride;
	k->n_layers = f->n_layers;
	k->page_max = o->page_max ? o->page_max : f->page_count;
	k->table_len = sizeof(struct kvmem_pt_header) + k->page_max * sizeof(struct kvmem_pte);
	k->table = mmap(NULL, k->table_len, PROT_READ, MAP_SHARED, k->fd, KVMEM_MMAP_PAGE_TABLE);
	if (k->table == MAP_FAILED) {
		err = errno;
		k->table = NULL;
		kvmem_error(err, "%s: mapping the page table: %s", k->dev, strerror(err));
		goto fail;
	}
	if (k->table->magic != KVMEM_PT_MAGIC || k->table->version != KVMEM_PT_VERSION ||
	    k->table->entry_size != sizeof(struct kvmem_pte)) {
		err = ESTALE;
		kvmem_error(err, "%s: page table version %u, entry size %u: this library "
			    "reads version %u, entry size %zu", k->dev, k->table->version,
			    k->table->entry_size, KVMEM_PT_VERSION, sizeof(struct kvmem_pte));
		goto fail;
	}
	k->window_len = k->page_max * k->page_stride;
	prot = PROT_READ | ((o->flags & KVMEM_KMOD_RDONLY) ? 0 : PROT_WRITE);
	k->window = mmap(NULL, k->window_len, prot, MAP_SHARED, k->fd, KVMEM_MMAP_PAGE_WINDOW);
	if (k->window == MAP_FAILED) {
		err = errno;
		k->window = NULL;
		kvmem_error(err, "%s: mapping the window (%zu bytes): %s", k->dev, k->window_len,
			    strerror(err));
		goto fail;
	}
	/* Userspace fills (kmod_fill.c) where the file takes O_DIRECT reads. */
	kmod_fill_setup(k, f->pages_fd, !!(o->flags & KVMEM_KMOD_RDONLY));
	*out = k;
	return 0;
fail:
	kvmem_kmod_close(k);
	return -err;
}

void kvmem_kmod_close(kvmem_kmod *k)
{
	if (!k)
		return;
	kmod_fill_close(k);
	if (k->window)
		munmap(k->window, k->window_len);
	if (k->table)
		munmap((void *)k->table, k->table_len);
	if (k->fd >= 0)
		close(k->fd);
	if (k->fd_lock >= 0)
		close(k->fd_lock);	/* releases the writer's lock, last */
	free(k);
}

void kmod_keep_lock(kvmem_kmod *k, int fd)
{
	k->fd_lock = fd;
}

int kvmem_kmod_fd(const kvmem_kmod *k)
{
	return k->fd;
}

uint64_t kvmem_kmod_pages(const kvmem_kmod *k)
{
	return __atomic_load_n(&k->table->n_entries, __ATOMIC_ACQUIRE);
}

uint32_t kvmem_kmod_page_bytes(const kvmem_kmod *k)
{
	return k->page_bytes;
}

uint32_t kvmem_kmod_page_stride(const kvmem_kmod *k)
{
	return k->page_stride;
}

const struct kvmem_pt_header *kvmem_kmod_table(const kvmem_kmod *k)
{
	return k->table;
}

const struct kvmem_pte *kvmem_kmod_pte(const kvmem_kmod *k, uint64_t page)
{
	if (page >= k->page_max)
		return NULL;
	return (const struct kvmem_pte *)(k->table + 1) + page;
}

/* The module's writes of an entry sit between two increments of its
 * sequence count (include/uapi/linux/kvmem.h): copy it while the count is
 * even and the same before and after. */
int kvmem_kmod_pte_read(const kvmem_kmod *k, uint64_t page, struct kvmem_pte *out)
{
	const struct kvmem_pte *e = kvmem_kmod_pte(k, page);

	if (!e)
		return kvmem_error(EINVAL, "%s: page %llu is past the window (%llu pages)", k->dev,
				   (unsigned long long)page, (unsigned long long)k->page_max);
	for (unsigned tries = 0;; tries++) {
		uint16_t seq = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);

		if (!(seq & 1)) {
			out->page_id = __atomic_load_n(&e->page_id, __ATOMIC_RELAXED);
			out->host_slot = __atomic_load_n(&e->host_slot, __ATOMIC_RELAXED);
			out->gpu_slot = __atomic_load_n(&e->gpu_slot, __ATOMIC_RELAXED);
			out->tiers = __atomic_load_n(&e->tiers, __ATOMIC_RELAXED);
			out->flags = __atomic_load_n(&e->flags, __ATOMIC_RELAXED);
			out->access_count = __atomic_load_n(&e->access_count, __ATOMIC_RELAXED);
			out->last_step = __atomic_load_n(&e->last_step, __ATOMIC_RELAXED);
			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			if (__atomic_load_n(&e->seq, __ATOMIC_RELAXED) == seq) {
				out->seq = seq;
				return 0;
			}
		}
		/* The writer may have been preempted inside its update. */
		if (tries % 64 == 63)
			sched_yield();
	}
}

int kvmem_kmod_resident(const kvmem_kmod *k, uint64_t page)
{
	const struct kvmem_pte *e = kvmem_kmod_pte(k, page);

	return e && (__atomic_load_n(&e->tiers, __ATOMIC_ACQUIRE) & KVMEM_TIER_HOST);
}

void *kvmem_kmod_window(const kvmem_kmod *k, size_t *len)
{
	if (len)
		*len = k->window_len;
	return k->window;
}

void *kvmem_kmod_page_addr(const kvmem_kmod *k, uint64_t page)
{
	return page < k->page_max ? k->window + page * k->page_stride : NULL;
}

int kvmem_kmod_get(kvmem_kmod *k, uint64_t page, const void **out)
{
	const struct kvmem_pte *e;
	void *addr;

	*out = NULL;
	if (k->fd_direct >= 0)
		kmod_fill_drain(k);	/* no page out while reads still land in the window */
	if (page >= kvmem_kmod_pages(k))
		return kvmem_error(EINVAL, "%s: page %llu is past the last page (%llu pages)",
				   k->dev, (unsigned long long)page,
				   (unsigned long long)kvmem_kmod_pages(k));
	addr = kvmem_kmod_page_addr(k, page);
	if (madvise(addr, k->page_stride, MADV_POPULATE_READ) < 0) {
		int err = errno;

		e = kvmem_kmod_pte(k, page);
		if (err == EFAULT && (e->flags & KVMEM_PTE_BAD))
			return kvmem_error(EBADMSG, "%s: page %llu (block %llu, layer %llu) could "
					   "not be read or does not match its checksum", k->dev,
					   (unsigned long long)page,
					   (unsigned long long)(page / k->n_layers),
					   (unsigned long long)(page % k->n_layers));
		return kvmem_error(err == EFAULT ? EIO : err, "%s: page %llu: faulting it in "
				   "failed: %s", k->dev, (unsigned long long)page, strerror(err));
	}
	*out = addr;
	return 0;
}

/* One ioctl per KVMEM_IOC_PAGES_MAX ids; status may be NULL. Returns the
 * first error the module reported (the status array says which page). */
static int pages_ioctl(kvmem_kmod *k, unsigned long cmd, const char *what,
		       const uint64_t *pages, size_t n, uint32_t flags, int32_t *status)
{
	int first = 0;

	for (size_t done = 0; done < n;) {
		struct kvmem_ioc_pages a;
		size_t m = n - done;

		if (m > KVMEM_IOC_PAGES_MAX)
			m = KVMEM_IOC_PAGES_MAX;
		memset(&a, 0, sizeof(a));
		a.pages = (uintptr_t)(pages + done);
		a.status = status ? (uintptr_t)(status + done) : 0;
		a.n_pages = (uint32_t)m;
		a.flags = flags;
		if (ioctl(k->fd, cmd, &a) < 0 && !first) {
			first = errno;
			kvmem_error(first, "%s: %s of %zu pages (from page %llu): %s", k->dev, what,
				    m, (unsigned long long)pages[done], strerror(first));
		}
		done += m;
	}
	return -first;
}

int kvmem_kmod_prefetch(kvmem_kmod *k, const uint64_t *pages, size_t n, int wait)
{
	if (!n)
		return 0;
	return pages_ioctl(k, KVMEM_IOC_PREFETCH, "prefetch", pages, n,
			   wait ? KVMEM_PAGES_WAIT : 0, NULL);
}

int kvmem_kmod_claim(kvmem_kmod *k, const uint64_t *pages, size_t n, int32_t *claimed)
{
	int err, count = 0;

	if (!n)
		return 0;
	err = pages_ioctl(k, KVMEM_IOC_CLAIM, "claim", pages, n, 0, claimed);
	for (size_t i = 0; i < n; i++) {
		if (claimed[i] < 0 && !err)
			err = kvmem_error(-claimed[i], "%s: claiming page %llu: %s", k->dev,
					  (unsigned long long)pages[i], strerror(-claimed[i]));
		count += claimed[i] == 1;
	}
	return err < 0 ? err : count;
}

int kvmem_kmod_filled(kvmem_kmod *k, const uint64_t *pages, size_t n, int verify,
		      int32_t *status)
{
	int err;

	if (!n)
		return 0;
	err = pages_ioctl(k, KVMEM_IOC_FILLED, "filled", pages, n,
			  verify ? KVMEM_PAGES_VERIFY : 0, status);
	if (err == -EBADMSG && status) {
		for (size_t i = 0; i < n; i++)
			if (status[i] == -EBADMSG)
				return kvmem_error(EBADMSG, "%s: page %llu (block %llu, layer %llu) "
						   "filled by userspace does not match its "
						   "checksum: dropped", k->dev,
						   (unsigned long long)pages[i],
						   (unsigned long long)(pages[i] / k->n_layers),
						   (unsigned long long)(pages[i] % k->n_layers));
	}
	return err;
}

int kmod_filled_failed(kvmem_kmod *k, const uint64_t *pages, size_t n, int32_t *status)
{
	return n ? pages_ioctl(k, KVMEM_IOC_FILLED, "filled", pages, n, KVMEM_PAGES_FAILED,
			       status) : 0;
}

int kvmem_kmod_evict(kvmem_kmod *k, const uint64_t *pages, size_t n, int32_t *status)
{
	if (!n)
		return 0;
	return pages_ioctl(k, KVMEM_IOC_EVICT, "evict", pages, n, 0, status);
}

int kvmem_kmod_sync(kvmem_kmod *k)
{
	if (ioctl(k->fd, KVMEM_IOC_SYNC) < 0)
		return kvmem_error(errno, "%s: writing back dirty pages (sync): %s", k->dev,
				   strerror(errno));
	return 0;
}

int kvmem_kmod_step(kvmem_kmod *k, uint64_t step)
{
	if (ioctl(k->fd, KVMEM_IOC_STEP, &step) < 0)
		return kvmem_error(errno, "%s: step %llu: %s", k->dev, (unsigned long long)step,
				   strerror(errno));
	return 0;
}

int kvmem_kmod_hint(kvmem_kmod *k, uint64_t step, const uint64_t *pages, size_t n,
		    size_t n_selected, int flags)
{
	struct kvmem_ioc_hint a;

	if (n_selected > n)
		return kvmem_error(EINVAL, "%s: hint for step %llu: %zu selected of %zu pages",
				   k->dev, (unsigned long long)step, n_selected, n);
	/* One list: the view's pages first, so a cut keeps them. */
	if (n > KVMEM_IOC_PAGES_MAX)
		n = KVMEM_IOC_PAGES_MAX;
	if (n_selected > n)
		n_selected = n;
	memset(&a, 0, sizeof(a));
	a.step = step;
	a.pages = (uintptr_t)pages;
	a.n_pages = (uint32_t)n;
	a.n_selected = (uint32_t)n_selected;
	a.flags = flags & KVMEM_KMOD_HINT_PREFETCH ? KVMEM_HINT_PREFETCH : 0;
	if (ioctl(k->fd, KVMEM_IOC_HINT, &a) < 0)
		return kvmem_error(errno, "%s: hint for step %llu (%zu pages, %zu selected): %s",
				   k->dev, (unsigned long long)step, n, n_selected,
				   strerror(errno));
	return 0;
}

int kvmem_kmod_gpu(kvmem_kmod *k, const uint64_t *pages, const uint32_t *slots, size_t n)
{
	for (size_t done = 0; done < n;) {
		struct kvmem_ioc_gpu a;
		size_t m = n - done < KVMEM_IOC_PAGES_MAX ? n - done : KVMEM_IOC_PAGES_MAX;

		memset(&a, 0, sizeof(a));
		a.pages = (uintptr_t)(pages + done);
		a.slots = (uintptr_t)(slots + done);
		a.n_pages = (uint32_t)m;
		if (ioctl(k->fd, KVMEM_IOC_GPU, &a) < 0)
			return kvmem_error(errno, "%s: recording the GPU slots of %zu pages (from page "
					   "%llu): %s", k->dev, m, (unsigned long long)pages[done],
					   strerror(errno));
		done += m;
	}
	return 0;
}

int kvmem_kmod_set_count(kvmem_kmod *k, uint64_t pages)
{
	if (ioctl(k->fd, KVMEM_IOC_SET_COUNT, &pages) < 0)
		return kvmem_error(errno, "%s: growing to %llu pages (window sized for %llu, "
				   "a multiple of %u layers, the files must hold them): %s",
				   k->dev, (unsigned long long)pages,
				   (unsigned long long)k->page_max, k->n_layers, strerror(errno));
	return 0;
}

int kvmem_kmod_stats(kvmem_kmod *k, struct kvmem_ioc_stats *st)
{
	if (ioctl(k->fd, KVMEM_IOC_STATS, st) < 0)
		return kvmem_error(errno, "%s: reading counters: %s", k->dev, strerror(errno));
	return 0;
}

uint32_t kvmem_kmod_verdict_pick(const struct kvmem_reclaim_ctx *c)
{
	if (c->verdict != KVMEM_VERDICT_DEFAULT && c->verdict < c->n_candidates &&
	    c->n_candidates <= KVMEM_RECLAIM_MAX)
		return c->verdict;
	return 0;
}
