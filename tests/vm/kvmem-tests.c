// SPDX-License-Identifier: GPL-2.0
/*
 * kvmem.ko selftests (kselftest harness, run in qemu by tests/vm/run.sh):
 * the page table and window mappings, faults that fill the right bytes,
 * prefetch, eviction with write-back, many threads, I/O errors and bad
 * checksums as SIGBUS on that page alone, userspace fills, the ioctls'
 * argument checks, and that closing or exiting frees everything.
 *
 * Every TEST_F runs once per workspace variant (FIXTURE_VARIANT_ADD): one
 * whose pages fill a 4 KiB stride exactly, one whose 10 KiB pages sit in a
 * padded 12 KiB stride, as hmm-tests runs one body per device.
 */
#include <liburing.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "vmtest.h"

FIXTURE(kv) {
	struct vt_ws w;
	kvmem_kmod *k;
	uint64_t seed;
};

FIXTURE_VARIANT(kv) {
	const char *src;
};

FIXTURE_VARIANT_ADD(kv, small) {
	.src = VT_WS_SMALL,
};

FIXTURE_VARIANT_ADD(kv, wide) {
	.src = VT_WS_WIDE,
};

FIXTURE_SETUP(kv)
{
	ASSERT_EQ(0, vt_ws_open(&self->w, variant->src));
	self->k = NULL;
	self->seed = vt_seed(variant->src);
}

FIXTURE_TEARDOWN(kv)
{
	kvmem_kmod_close(self->k);
	vt_ws_close(&self->w);
}

static unsigned char *page_ref(struct vt_ws *w, uint64_t p)
{
	return w->ref + p * w->page_stride;
}

/* The page's window bytes equal the file's and match the sums file. */
static int page_ok(struct vt_ws *w, kvmem_kmod *k, uint64_t p)
{
	unsigned char *buf = malloc(w->page_stride);
	int ok;

	ok = vt_read(kvmem_kmod_page_addr(k, p), buf, w->page_stride) == 0 &&
	     !memcmp(buf, page_ref(w, p), w->page_stride) &&
	     kvmem_xxh3_64(buf, w->page_bytes) == w->sums[p];
	free(buf);
	return ok;
}

TEST_F(kv, table_and_window_mmap)
{
	const struct kvmem_pt_header *h;
	int fd;
	void *m;

	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	fd = kvmem_kmod_fd(self->k);
	h = kvmem_kmod_table(self->k);
	ASSERT_EQ(KVMEM_PT_MAGIC, h->magic);
	ASSERT_EQ(KVMEM_PT_VERSION, h->version);
	ASSERT_EQ(sizeof(struct kvmem_pte), h->entry_size);
	ASSERT_EQ(self->w.n_layers, h->n_layers);
	ASSERT_EQ(self->w.pages, h->n_entries);
	for (uint64_t p = 0; p < self->w.pages; p++) {
		const struct kvmem_pte *e = kvmem_kmod_pte(self->k, p);

		ASSERT_EQ(p, e->page_id);
		ASSERT_EQ(KVMEM_TIER_NVME, e->tiers);
		ASSERT_EQ(KVMEM_SLOT_NONE, e->host_slot);
		ASSERT_EQ(KVMEM_SLOT_NONE, e->gpu_slot);
		ASSERT_EQ(0, e->flags);
		ASSERT_EQ(0, e->access_count);
	}
	/* The table is read-only, and stays so. */
	m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, KVMEM_MMAP_PAGE_TABLE);
	ASSERT_EQ(MAP_FAILED, m);
	ASSERT_EQ(EPERM, errno);
	ASSERT_NE(0, mprotect((void *)h, 4096, PROT_READ | PROT_WRITE));
	/* Window: shared only, inside the window, at a known offset. */
	m = mmap(NULL, self->w.page_stride, PROT_READ, MAP_PRIVATE, fd, KVMEM_MMAP_PAGE_WINDOW);
	ASSERT_EQ(MAP_FAILED, m);
	m = mmap(NULL, (self->w.pages + 1) * self->w.page_stride, PROT_READ, MAP_SHARED, fd,
		 KVMEM_MMAP_PAGE_WINDOW);
	ASSERT_EQ(MAP_FAILED, m);
	ASSERT_EQ(EINVAL, errno);
	m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, KVMEM_MMAP_PAGE_WINDOW - 4096);
	ASSERT_EQ(MAP_FAILED, m);
	m = mmap(NULL, 2 * 1024 * 1024 * 1024ul, PROT_READ, MAP_SHARED, fd, KVMEM_MMAP_PAGE_TABLE);
	ASSERT_EQ(MAP_FAILED, m);
	/* A second mapping of the last page alone, at its own offset, sees
	 * the same bytes as the whole window. */
	m = mmap(NULL, self->w.page_stride, PROT_READ, MAP_SHARED, fd,
		 KVMEM_MMAP_PAGE_WINDOW + (self->w.pages - 1) * self->w.page_stride);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ(0, memcmp(m, page_ref(&self->w, self->w.pages - 1), self->w.page_stride));
	ASSERT_TRUE(page_ok(&self->w, self->k, self->w.pages - 1));
	munmap(m, self->w.page_stride);
}

/* Every page, touched in random order, holds the file's bytes; the table
 * says resident with distinct slots; each first touch was a major fault.
 * (120 s: the debug kernel on the loaded build machine took more than the
 * harness's default 30 s for the wide workspace's 288 faults, 2026-12-02.) */
TEST_F_TIMEOUT(kv, faults_fill_right_bytes, 120)
{
	uint64_t n = self->w.pages, rng = self->seed, *order = malloc(n * 8);
	unsigned char *seen;
	struct kvmem_ioc_stats st;
	long maj0;

	self->k = vt_kmod(&self->w, n);
	ASSERT_NE(NULL, self->k);
	for (uint64_t i = 0; i < n; i++)
		order[i] = i;
	for (uint64_t i = n - 1; i > 0; i--) {
		uint64_t j = vt_rng(&rng) % (i + 1), t = order[i];

		order[i] = order[j];
		order[j] = t;
	}
	maj0 = vt_majflt();
	for (uint64_t i = 0; i < n; i++) {
		ASSERT_TRUE(page_ok(&self->w, self->k, order[i])) TH_LOG("page %llu",
								  (unsigned long long)order[i]);
	}
	ASSERT_GE(vt_majflt() - maj0, (long)n);
	seen = calloc(n, 1);
	for (uint64_t p = 0; p < n; p++) {
		const struct kvmem_pte *e = kvmem_kmod_pte(self->k, p);

		ASSERT_EQ(KVMEM_TIER_NVME | KVMEM_TIER_HOST, e->tiers);
		ASSERT_LT(e->host_slot, n);
		ASSERT_EQ(0, seen[e->host_slot]);
		seen[e->host_slot] = 1;
		ASSERT_EQ(0, e->flags);
		/* One fault per 4 KiB page of the stride. */
		ASSERT_EQ(self->w.page_stride / 4096, e->access_count);
	}
	st = vt_stats(self->k);
	ASSERT_EQ(n, st.fills);
	ASSERT_EQ(n, st.resident);
	ASSERT_EQ(0, st.evictions);
	ASSERT_EQ(0, st.read_errors + st.checksum_errors);
	/* Read again: no new fill. */
	ASSERT_TRUE(page_ok(&self->w, self->k, order[0]));
	ASSERT_EQ(n, vt_stats(self->k).fills);
	free(seen);
	free(order);
}

/* Prefetch (waiting, then asynchronous): the touches that follow find every
 * page resident and take no major fault. */
TEST_F(kv, prefetch_then_touch_no_fault)
{
	uint64_t n = self->w.pages, half = n / 2, *ids = malloc(n * 8);
	long maj0;

	self->k = vt_kmod(&self->w, n);
	ASSERT_NE(NULL, self->k);
	ASSERT_EQ(0, kvmem_kmod_step(self->k, 42));
	for (uint64_t i = 0; i < n; i++)
		ids[i] = i;
	ASSERT_EQ(0, kvmem_kmod_prefetch(self->k, ids, half, 1));
	for (uint64_t p = 0; p < half; p++) {
		ASSERT_TRUE(kvmem_kmod_resident(self->k, p));
		ASSERT_EQ(KVMEM_PTE_PREFETCHED, kvmem_kmod_pte(self->k, p)->flags);
	}
	ASSERT_FALSE(kvmem_kmod_resident(self->k, half));
	/* The rest without waiting: poll the table, no system call. */
	ASSERT_EQ(0, kvmem_kmod_prefetch(self->k, ids + half, n - half, 0));
	for (int tries = 0; tries < 2000; tries++) {
		uint64_t r = 0;

		for (uint64_t p = 0; p < n; p++)
			r += kvmem_kmod_resident(self->k, p);
		if (r == n)
			break;
		usleep(5000);
	}
	maj0 = vt_majflt();
	for (uint64_t p = 0; p < n; p++) {
		ASSERT_TRUE(page_ok(&self->w, self->k, p));
	}
	ASSERT_EQ(0, vt_majflt() - maj0);
	ASSERT_EQ(n, vt_stats(self->k).fills);
	ASSERT_EQ(n, vt_stats(self->k).prefetches);
	for (uint64_t p = 0; p < n; p++) {
		ASSERT_EQ(0, kvmem_kmod_pte(self->k, p)->flags & KVMEM_PTE_PREFETCHED);
		ASSERT_EQ(42, kvmem_kmod_pte(self->k, p)->last_step);
	}
	free(ids);
}

/* A window of 4 pages: writing more pages than fit evicts, writes back,
 * and every page reads back as written, from the window and from the file,
 * with a checksum that matches. */
TEST_F(kv, eviction_writeback_reread)
{
	uint64_t n = self->w.pages < 24 ? self->w.pages : 24, rng = self->seed;
	uint32_t stride = self->w.page_stride;
	unsigned char *want = malloc(n * stride), *buf = malloc(stride);
	struct kvmem_ioc_stats st;
	uint64_t sum;

	self->k = vt_kmod(&self->w, 4);
	ASSERT_NE(NULL, self->k);
	for (uint64_t i = 0; i < n * stride; i += 8) {
		uint64_t v = vt_rng(&rng);

		memcpy(want + i, &v, 8);
	}
	for (uint64_t p = 0; p < n; p++) {
		ASSERT_EQ(0, vt_write(kvmem_kmod_page_addr(self->k, p), want + p * stride, stride));
		ASSERT_LE(vt_stats(self->k).resident, 4);
	}
	st = vt_stats(self->k);
	ASSERT_GE(st.evictions, n - 4);
	ASSERT_GE(st.writebacks, n - 4);
	for (uint64_t p = 0; p < n; p++) {
		ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(self->k, p), buf, stride));
		ASSERT_EQ(0, memcmp(buf, want + p * stride, stride)) TH_LOG("page %llu",
									(unsigned long long)p);
	}
	ASSERT_EQ(0, kvmem_kmod_sync(self->k));
	for (uint64_t p = 0; p < n; p++) {
		ASSERT_EQ(0, vt_pread_all(self->w.pages_fd, buf, stride, p * stride));
		ASSERT_EQ(0, memcmp(buf, want + p * stride, stride));
		ASSERT_EQ(8, pread(self->w.sums_fd, &sum, 8,
				   ((p / self->w.n_layers) * (self->w.n_layers + 1) +
				    p % self->w.n_layers) * 8));
		ASSERT_EQ(kvmem_xxh3_64(want + p * stride, self->w.page_bytes), sum);
		ASSERT_EQ(0, kvmem_kmod_pte(self->k, p)->flags & KVMEM_PTE_DIRTY);
	}
	free(want);
	free(buf);
}

/* Sync writes back and cleans; the next write is tracked again. Reading
 * never dirties. */
TEST_F(kv, sync_and_dirty_tracking)
{
	uint32_t stride = self->w.page_stride;
	unsigned char *buf = malloc(stride);
	unsigned char *p0, *p1;

	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	p0 = kvmem_kmod_page_addr(self->k, 0);
	p1 = kvmem_kmod_page_addr(self->k, 1);
	ASSERT_TRUE(page_ok(&self->w, self->k, 1));
	ASSERT_EQ(0, kvmem_kmod_pte(self->k, 1)->flags & KVMEM_PTE_DIRTY);
	ASSERT_EQ(0, vt_write(p0 + 100, "kvmem", 5));
	ASSERT_EQ(KVMEM_PTE_DIRTY, kvmem_kmod_pte(self->k, 0)->flags & KVMEM_PTE_DIRTY);
	ASSERT_EQ(0, kvmem_kmod_sync(self->k));
	ASSERT_EQ(0, kvmem_kmod_pte(self->k, 0)->flags & KVMEM_PTE_DIRTY);
	ASSERT_EQ(1, vt_stats(self->k).writebacks);
	ASSERT_EQ(0, vt_pread_all(self->w.pages_fd, buf, stride, 0));
	ASSERT_EQ(0, memcmp(buf + 100, "kvmem", 5));
	/* A second write after the sync is seen (the pte was write-protected). */
	ASSERT_EQ(0, vt_write(p0 + 200, "again", 5));
	ASSERT_EQ(KVMEM_PTE_DIRTY, kvmem_kmod_pte(self->k, 0)->flags & KVMEM_PTE_DIRTY);
	ASSERT_EQ(0, kvmem_kmod_sync(self->k));
	ASSERT_EQ(0, vt_pread_all(self->w.pages_fd, buf, stride, 0));
	ASSERT_EQ(0, memcmp(buf + 200, "again", 5));
	ASSERT_EQ(2, vt_stats(self->k).writebacks);
	ASSERT_EQ(0, kvmem_kmod_pte(self->k, 1)->flags & KVMEM_PTE_DIRTY);
	(void)p1;
	free(buf);
}

struct thr {
	struct vt_ws *w;
	kvmem_kmod *k;
	pthread_barrier_t *bar;
	uint64_t first, n, rounds, seed;
	int bad;
};

static void *thr_touch(void *arg)
{
	struct thr *t = arg;
	uint64_t rng = t->seed;

	pthread_barrier_wait(t->bar);
	for (uint64_t r = 0; r < t->rounds; r++) {
		uint64_t p = t->first + vt_rng(&rng) % t->n;

		if (!page_ok(t->w, t->k, p))
			t->bad++;
	}
	return NULL;
}

/* The page through a mapping of the thread's own, so every thread takes
 * its own fault however the others are doing. */
static void *thr_own_mapping(void *arg)
{
	struct thr *t = arg;
	uint32_t stride = t->w->page_stride;
	unsigned char *m, *buf = malloc(stride);

	m = mmap(NULL, stride, PROT_READ, MAP_SHARED, kvmem_kmod_fd(t->k),
		 KVMEM_MMAP_PAGE_WINDOW + t->first * stride);
	pthread_barrier_wait(t->bar);
	if (m == MAP_FAILED || vt_read(m, buf, stride) ||
	    memcmp(buf, page_ref(t->w, t->first), stride))
		t->bad++;
	if (m != MAP_FAILED)
		munmap(m, stride);
	free(buf);
	return NULL;
}

static int run_threads(struct vt_ws *w, kvmem_kmod *k, int nthr, int same, uint64_t rounds,
		       uint64_t seed)
{
	pthread_t tid[16];
	struct thr t[16];
	pthread_barrier_t bar;
	int bad = 0;

	pthread_barrier_init(&bar, NULL, nthr);
	for (int i = 0; i < nthr; i++) {
		t[i] = (struct thr){ .w = w, .k = k, .bar = &bar, .rounds = rounds,
				     .seed = seed + i };
		t[i].first = same ? 0 : (w->pages / nthr) * i;
		t[i].n = same ? 1 : w->pages / nthr;
		pthread_create(&tid[i], NULL, same ? thr_own_mapping : thr_touch, &t[i]);
	}
	for (int i = 0; i < nthr; i++) {
		pthread_join(tid[i], NULL);
		bad += t[i].bad;
	}
	pthread_barrier_destroy(&bar);
	return bad;
}

/* Eight threads fault one page, each through its own mapping, at once:
 * one fill, and every thread sees the right bytes. */
TEST_F(kv, threads_same_page)
{
	struct kvmem_ioc_stats st;

	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	ASSERT_EQ(0, run_threads(&self->w, self->k, 8, 1, 1, self->seed));
	st = vt_stats(self->k);
	ASSERT_EQ(1, st.fills);
	ASSERT_GE(st.faults, 8 * (self->w.page_stride / 4096));
}

/* Eight threads on their own pages with a window of a quarter of them:
 * constant eviction under contention, never a wrong byte. */
TEST_F_TIMEOUT(kv, threads_different_pages_small_window, 120)
{
	struct kvmem_ioc_stats st;

	self->k = vt_kmod(&self->w, self->w.pages / 4);
	ASSERT_NE(NULL, self->k);
	ASSERT_EQ(0, run_threads(&self->w, self->k, 8, 0, 60, self->seed));
	st = vt_stats(self->k);
	ASSERT_GT(st.evictions, 0);
	ASSERT_LE(st.resident, self->w.pages / 4);
	ASSERT_EQ(0, st.read_errors + st.checksum_errors);
}

/* The file loses its last block: touching one of its pages is SIGBUS at
 * that page, marked BAD; the other pages are fine; once the bytes are back
 * the same page fills. */
TEST_F(kv, io_error_sigbus_that_page_only)
{
	uint64_t bad = self->w.pages - 1, good = 0;
	uint32_t stride = self->w.page_stride;
	unsigned char *buf = malloc(stride);
	const void *pp;
	char *addr;

	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	ASSERT_EQ(0, ftruncate(self->w.pages_fd, (self->w.pages - self->w.n_layers) * stride));
	addr = kvmem_kmod_page_addr(self->k, bad);
	ASSERT_EQ(-1, vt_read(addr + 8, buf, 8));
	ASSERT_EQ(addr + 8, (char *)vt_bus_addr);
	ASSERT_EQ(KVMEM_PTE_BAD, kvmem_kmod_pte(self->k, bad)->flags & KVMEM_PTE_BAD);
	ASSERT_EQ(0, kvmem_kmod_pte(self->k, bad)->tiers & KVMEM_TIER_HOST);
	ASSERT_EQ(1, vt_stats(self->k).read_errors);
	ASSERT_TRUE(page_ok(&self->w, self->k, good));
	/* The library's get reports it as an error, not a signal. */
	ASSERT_EQ(-EBADMSG, kvmem_kmod_get(self->k, bad, &pp));
	ASSERT_EQ(0, kvmem_kmod_prefetch(self->k, &bad, 1, 1));
	ASSERT_EQ(0, kvmem_kmod_pte(self->k, bad)->tiers & KVMEM_TIER_HOST);
	/* Put the block back: the page reads fine, BAD is gone. */
	ASSERT_EQ((ssize_t)(self->w.n_layers * stride),
		  pwrite(self->w.pages_fd, page_ref(&self->w, self->w.pages - self->w.n_layers),
			 self->w.n_layers * stride, (self->w.pages - self->w.n_layers) * stride));
	ASSERT_TRUE(page_ok(&self->w, self->k, bad));
	ASSERT_EQ(0, kvmem_kmod_pte(self->k, bad)->flags & KVMEM_PTE_BAD);
	free(buf);
}

/* One flipped byte in a page of the file: that page is SIGBUS (checksum),
 * never the wrong bytes; its neighbours are fine. */
TEST_F(kv, corrupt_page_sigbus)
{
	uint64_t p = self->w.pages / 2, rng = self->seed;
	uint32_t off = vt_rng(&rng) % self->w.page_bytes;
	unsigned char c = page_ref(&self->w, p)[off] ^ (1u << (vt_rng(&rng) % 8)), buf[64];
	const void *pp;

	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	ASSERT_EQ(1, pwrite(self->w.pages_fd, &c, 1, p * self->w.page_stride + off));
	ASSERT_EQ(-1, vt_read(kvmem_kmod_page_addr(self->k, p), buf, 1));
	ASSERT_EQ(KVMEM_PTE_BAD, kvmem_kmod_pte(self->k, p)->flags & KVMEM_PTE_BAD);
	ASSERT_EQ(1, vt_stats(self->k).checksum_errors);
	ASSERT_EQ(-EBADMSG, kvmem_kmod_get(self->k, p, &pp));
	ASSERT_TRUE(page_ok(&self->w, self->k, p - 1));
	ASSERT_TRUE(page_ok(&self->w, self->k, p + 1));
	ASSERT_EQ(0, vt_stats(self->k).evictions);
	/* Repaired on disk: the page comes back. */
	ASSERT_EQ(1, pwrite(self->w.pages_fd, page_ref(&self->w, p) + off, 1,
			    p * self->w.page_stride + off));
	ASSERT_EQ(0, kvmem_kmod_get(self->k, p, &pp));
	ASSERT_EQ(0, memcmp(pp, page_ref(&self->w, p), self->w.page_stride));
}

/* Userspace fills claimed pages itself (pread here; io_uring O_DIRECT in
 * the pager): verified pages become resident without a module read; a
 * wrongly filled page is refused and later comes from the file. */
TEST_F(kv, claim_and_filled)
{
	uint64_t ids[3] = { 1, 2, 3 };
	int32_t st[3];
	uint32_t stride = self->w.page_stride;

	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	ASSERT_TRUE(page_ok(&self->w, self->k, 3));	/* resident: not claimed */
	ASSERT_EQ(2, kvmem_kmod_claim(self->k, ids, 3, st));
	ASSERT_EQ(1, st[0]);
	ASSERT_EQ(1, st[1]);
	ASSERT_EQ(0, st[2]);
	ASSERT_EQ(KVMEM_PTE_IN_FLIGHT, kvmem_kmod_pte(self->k, 1)->flags & KVMEM_PTE_IN_FLIGHT);
	ASSERT_EQ((ssize_t)stride, pread(self->w.pages_fd, kvmem_kmod_page_addr(self->k, 1), stride,
					 1 * stride));
	memset(kvmem_kmod_page_addr(self->k, 2), 0x5a, stride);	/* wrong bytes */
	ASSERT_EQ(-EBADMSG, kvmem_kmod_filled(self->k, ids, 2, 1, st));
	ASSERT_EQ(0, st[0]);
	ASSERT_EQ(-EBADMSG, st[1]);
	ASSERT_TRUE(kvmem_kmod_resident(self->k, 1));
	ASSERT_FALSE(kvmem_kmod_resident(self->k, 2));
	ASSERT_EQ(KVMEM_PTE_BAD, kvmem_kmod_pte(self->k, 2)->flags & KVMEM_PTE_BAD);
	ASSERT_EQ(1, vt_stats(self->k).user_fills);
	ASSERT_EQ(1, vt_stats(self->k).fills);	/* page 3 only */
	ASSERT_TRUE(page_ok(&self->w, self->k, 1));
	ASSERT_TRUE(page_ok(&self->w, self->k, 2));	/* from the file now */
	ASSERT_EQ(2, vt_stats(self->k).fills);
	/* FILLED of a page that was not claimed is refused. */
	ASSERT_EQ(-EINVAL, kvmem_kmod_filled(self->k, ids, 1, 0, st));
	/* A page filled by userspace is not dirty: nothing to write back. */
	ASSERT_EQ(0, kvmem_kmod_sync(self->k));
	ASSERT_EQ(0, vt_stats(self->k).writebacks);
}

static int filled_raw(kvmem_kmod *k, uint64_t id, uint32_t flags, int32_t *st)
{
	struct kvmem_ioc_pages a = { .pages = (uintptr_t)&id, .status = (uintptr_t)st,
				     .n_pages = 1, .flags = flags };

	return ioctl(kvmem_kmod_fd(k), KVMEM_IOC_FILLED, &a) < 0 ? -errno : 0;
}

/* FILLED with FAILED: userspace's fill failed (its read's error), so the
 * page is dropped and counted as a read error, not a checksum error,
 * whatever bytes it holds; FAILED with VERIFY is refused with nothing
 * done. */
TEST_F(kv, filled_failed_is_a_read_error)
{
	uint64_t id = 5;
	int32_t st = 7;
	uint32_t stride = self->w.page_stride;

	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	ASSERT_EQ(1, kvmem_kmod_claim(self->k, &id, 1, &st));
	/* Good bytes, but the fill says it failed: dropped all the same. */
	ASSERT_EQ((ssize_t)stride, pread(self->w.pages_fd, kvmem_kmod_page_addr(self->k, id),
					 stride, id * stride));
	ASSERT_EQ(-EINVAL, filled_raw(self->k, id, KVMEM_PAGES_FAILED | KVMEM_PAGES_VERIFY, &st));
	ASSERT_EQ(KVMEM_PTE_IN_FLIGHT, kvmem_kmod_pte(self->k, id)->flags & KVMEM_PTE_IN_FLIGHT);
	ASSERT_EQ(-EIO, filled_raw(self->k, id, KVMEM_PAGES_FAILED, &st));
	ASSERT_EQ(-EIO, st);
	ASSERT_FALSE(kvmem_kmod_resident(self->k, id));
	ASSERT_EQ(KVMEM_PTE_BAD, kvmem_kmod_pte(self->k, id)->flags & KVMEM_PTE_BAD);
	ASSERT_EQ(1, vt_stats(self->k).read_errors);
	ASSERT_EQ(0, vt_stats(self->k).checksum_errors);
	ASSERT_EQ(0, vt_stats(self->k).user_fills);
	/* The module reads it itself now. */
	ASSERT_TRUE(page_ok(&self->w, self->k, id));
	ASSERT_EQ(1, vt_stats(self->k).fills);
	ASSERT_EQ(-EINVAL, filled_raw(self->k, id, KVMEM_PAGES_FAILED, &st));	/* not claimed */
}

static int hint_raw(kvmem_kmod *k, struct kvmem_ioc_hint *h)
{
	return ioctl(kvmem_kmod_fd(k), KVMEM_IOC_HINT, h) < 0 ? -errno : 0;
}

/* The step's selection (HINT): reclaim lets the selected pages go last,
 * then the runners-up, so a full window gives up a page the next view does
 * not need (the clock alone evicts page 0 here); with PREFETCH the absent
 * selected pages come in. A malformed HINT is refused. */
TEST_F(kv, hint_keeps_the_selection)
{
	uint64_t sel[3] = { 1, 0, 2 }, ids[2] = { 6, 7 }, bad = self->w.pages;
	struct kvmem_ioc_hint h;
	unsigned char b;

	self->k = vt_kmod(&self->w, 4);
	ASSERT_NE(NULL, self->k);
	memset(&h, 0, sizeof(h));
	h.pages = (uintptr_t)sel;
	h.n_pages = 1;
	h.n_selected = 2;
	ASSERT_EQ(-EINVAL, hint_raw(self->k, &h));	/* more selected than pages */
	h.n_selected = 1;
	h.flags = 2;
	ASSERT_EQ(-EINVAL, hint_raw(self->k, &h));
	h.flags = 0;
	h.reserved[1] = 1;
	ASSERT_EQ(-EINVAL, hint_raw(self->k, &h));
	h.reserved[1] = 0;
	h.n_pages = KVMEM_IOC_PAGES_MAX + 1;
	ASSERT_EQ(-EINVAL, hint_raw(self->k, &h));
	h.pages = (uintptr_t)&bad;
	h.n_pages = 1;
	ASSERT_EQ(-EINVAL, hint_raw(self->k, &h));	/* past the last page */
	h.pages = 8;
	ASSERT_EQ(-EFAULT, hint_raw(self->k, &h));
	h.n_pages = h.n_selected = 0;
	ASSERT_EQ(0, hint_raw(self->k, &h));		/* no hint at all */

	for (uint64_t p = 0; p < 4; p++)
		ASSERT_TRUE(page_ok(&self->w, self->k, p));
	ASSERT_EQ(0, kvmem_kmod_hint(self->k, 9, sel, 3, 2, 0));	/* 1, 0 view; 2 runner-up */
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(self->k, 4), &b, 1));
	ASSERT_EQ(1, vt_stats(self->k).evictions);
	ASSERT_FALSE(kvmem_kmod_resident(self->k, 3));
	for (uint64_t p = 0; p < 3; p++) {
		ASSERT_TRUE(kvmem_kmod_resident(self->k, p)) TH_LOG("page %d", (int)p);
	}
	ASSERT_EQ(9, kvmem_kmod_pte(self->k, 4)->last_step);	/* the hint's step is the step */
	/* Again: a page not in the view leaves, never 0 or 1. */
	ASSERT_TRUE(page_ok(&self->w, self->k, 3));
	ASSERT_TRUE(kvmem_kmod_resident(self->k, 0));
	ASSERT_TRUE(kvmem_kmod_resident(self->k, 1));
	/* PREFETCH: the absent selected pages are read by the module. */
	ASSERT_EQ(0, kvmem_kmod_hint(self->k, 10, ids, 2, 2, KVMEM_KMOD_HINT_PREFETCH));
	for (int i = 0; i < 400 && !(kvmem_kmod_resident(self->k, 6) &&
				     kvmem_kmod_resident(self->k, 7)); i++)
		usleep(5000);
	ASSERT_TRUE(kvmem_kmod_resident(self->k, 6));
	ASSERT_TRUE(kvmem_kmod_resident(self->k, 7));
	ASSERT_EQ(2, vt_stats(self->k).prefetches);
	ASSERT_TRUE(page_ok(&self->w, self->k, 6));
}

static int gpu_raw(kvmem_kmod *k, struct kvmem_ioc_gpu *g)
{
	return ioctl(kvmem_kmod_fd(k), KVMEM_IOC_GPU, g) < 0 ? -errno : 0;
}

/* The GPU tier: the engine's GPU slots of pages reach the table (gpu_slot,
 * KVMEM_TIER_GPU, one consistent entry), stay while the host copy comes and
 * goes, and leave with KVMEM_SLOT_NONE; a malformed call changes nothing. */
TEST_F(kv, gpu_tier_in_the_table)
{
	uint64_t ids[2] = { 2, 5 }, bad[2] = { 2, self->w.pages };
	uint32_t slots[2] = { 7, 0 }, none[2] = { KVMEM_SLOT_NONE, KVMEM_SLOT_NONE };
	struct kvmem_ioc_gpu g;
	struct kvmem_pte e;

	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	ASSERT_TRUE(page_ok(&self->w, self->k, 2));
	ASSERT_EQ(0, kvmem_kmod_gpu(self->k, ids, slots, 2));
	ASSERT_EQ(0, kvmem_kmod_pte_read(self->k, 2, &e));
	ASSERT_EQ(7, e.gpu_slot);
	ASSERT_EQ(KVMEM_TIER_GPU | KVMEM_TIER_HOST | KVMEM_TIER_NVME, e.tiers);
	ASSERT_EQ(0, kvmem_kmod_pte_read(self->k, 5, &e));
	ASSERT_EQ(0, e.gpu_slot);
	ASSERT_EQ(KVMEM_TIER_GPU | KVMEM_TIER_NVME, e.tiers);	/* on the GPU, not in the window */
	/* The host copy leaves and comes back: the GPU tier stays. */
	ASSERT_EQ(0, kvmem_kmod_evict(self->k, ids, 1, NULL));
	ASSERT_EQ(0, kvmem_kmod_pte_read(self->k, 2, &e));
	ASSERT_EQ(KVMEM_TIER_GPU | KVMEM_TIER_NVME, e.tiers);
	ASSERT_EQ(KVMEM_SLOT_NONE, e.host_slot);
	ASSERT_TRUE(page_ok(&self->w, self->k, 5));
	ASSERT_EQ(0, kvmem_kmod_pte_read(self->k, 5, &e));
	ASSERT_EQ(KVMEM_TIER_GPU | KVMEM_TIER_HOST | KVMEM_TIER_NVME, e.tiers);
	ASSERT_EQ(0, e.gpu_slot);
	/* Refused, nothing recorded: an id past the end (after a good one),
	 * flags, reserved, no pages, an unreadable slot array. */
	memset(&g, 0, sizeof(g));
	g.pages = (uintptr_t)bad;
	g.slots = (uintptr_t)none;
	g.n_pages = 2;
	ASSERT_EQ(-EINVAL, gpu_raw(self->k, &g));
	ASSERT_EQ(7, kvmem_kmod_pte(self->k, 2)->gpu_slot);
	g.pages = (uintptr_t)ids;
	g.flags = 1;
	ASSERT_EQ(-EINVAL, gpu_raw(self->k, &g));
	g.flags = 0;
	g.reserved = 1;
	ASSERT_EQ(-EINVAL, gpu_raw(self->k, &g));
	g.reserved = 0;
	g.n_pages = 0;
	ASSERT_EQ(-EINVAL, gpu_raw(self->k, &g));
	g.n_pages = 2;
	g.slots = 8;
	ASSERT_EQ(-EFAULT, gpu_raw(self->k, &g));
	ASSERT_EQ(7, kvmem_kmod_pte(self->k, 2)->gpu_slot);
	/* Both leave the GPU. */
	ASSERT_EQ(0, kvmem_kmod_gpu(self->k, ids, none, 2));
	ASSERT_EQ(0, kvmem_kmod_pte_read(self->k, 2, &e));
	ASSERT_EQ(KVMEM_SLOT_NONE, e.gpu_slot);
	ASSERT_EQ(KVMEM_TIER_NVME, e.tiers);
	ASSERT_EQ(0, kvmem_kmod_pte_read(self->k, 5, &e));
	ASSERT_EQ(KVMEM_TIER_HOST | KVMEM_TIER_NVME, e.tiers);
}

/* EVICT drops pages (absent ones are fine), writing dirty ones back. */
TEST_F(kv, evict_ioctl)
{
	uint64_t ids[3] = { 0, 1, 2 };
	int32_t st[3] = { 7, 7, 7 };
	uint32_t stride = self->w.page_stride;
	unsigned char *buf = malloc(stride);
	uint64_t fills0;
	long maj0;

	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	ASSERT_TRUE(page_ok(&self->w, self->k, 0));
	ASSERT_EQ(0, vt_write(kvmem_kmod_page_addr(self->k, 1), "dirty", 5));
	ASSERT_EQ(0, kvmem_kmod_evict(self->k, ids, 3, st));
	ASSERT_EQ(0, st[0]);
	ASSERT_EQ(0, st[1]);
	ASSERT_EQ(0, st[2]);
	for (int i = 0; i < 3; i++) {
		ASSERT_FALSE(kvmem_kmod_resident(self->k, i));
	}
	ASSERT_EQ(2, vt_stats(self->k).evictions);
	ASSERT_EQ(1, vt_stats(self->k).writebacks);
	ASSERT_EQ(0, vt_pread_all(self->w.pages_fd, buf, stride, stride));
	ASSERT_EQ(0, memcmp(buf, "dirty", 5));
	/* The pages are really gone from the process: touching one again is a
	 * major fault and a new fill, and brings the written bytes back. */
	maj0 = vt_majflt();
	fills0 = vt_stats(self->k).fills;
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(self->k, 1), buf, stride));
	ASSERT_EQ(1, vt_majflt() - maj0);
	ASSERT_EQ(fills0 + 1, vt_stats(self->k).fills);
	ASSERT_EQ(0, memcmp(buf, "dirty", 5));
	ASSERT_TRUE(kvmem_kmod_resident(self->k, 1));
	free(buf);
}

struct stress {
	struct vt_ws *w;
	kvmem_kmod *k;
	uint64_t first, n, seed;
	uint32_t *version;	/* per page: the last pattern written */
	volatile int *stop;
	int bad;
};

static void pattern(unsigned char *buf, uint32_t len, uint64_t page, uint32_t v)
{
	for (uint32_t i = 0; i < len; i += 8) {
		uint64_t x = page * 0x9e3779b97f4a7c15ull ^ ((uint64_t)v << 32) ^ i;

		memcpy(buf + i, &x, 8);
	}
}

static void *stress_writer(void *arg)
{
	struct stress *t = arg;
	uint32_t stride = t->w->page_stride;
	unsigned char *buf = malloc(stride);
	uint64_t rng = t->seed;

	for (int i = 0; i < 150; i++) {
		uint64_t p = t->first + vt_rng(&rng) % t->n;
		uint32_t v = t->version[p] + 1;

		pattern(buf, stride, p, v);
		if (vt_write(kvmem_kmod_page_addr(t->k, p), buf, stride))
			t->bad++;
		t->version[p] = v;
	}
	free(buf);
	return NULL;
}

static void *stress_syncer(void *arg)
{
	struct stress *t = arg;

	while (!*t->stop) {
		if (kvmem_kmod_sync(t->k))
			t->bad++;
		usleep(500);
	}
	return NULL;
}

static void *stress_evictor(void *arg)
{
	struct stress *t = arg;
	uint64_t rng = t->seed;

	while (!*t->stop) {
		uint64_t p[4];
		int32_t st[4];

		for (int i = 0; i < 4; i++)
			p[i] = vt_rng(&rng) % t->w->pages;
		kvmem_kmod_evict(t->k, p, 4, st);
		for (int i = 0; i < 4; i++)
			if (st[i] && st[i] != -EBUSY)
				t->bad++;
		usleep(200);
	}
	return NULL;
}

/* Four writers on their own pages, a thread syncing and one evicting, all
 * at once over a window a quarter the size of the workspace: afterwards
 * every page holds its last write, in the window, in the file and in the
 * sums file. */
TEST_F_TIMEOUT(kv, concurrent_writes_sync_evict, 180)
{
	uint64_t n = self->w.pages;
	uint32_t stride = self->w.page_stride, *version = calloc(n, 4);
	unsigned char *buf = malloc(stride), *want = malloc(stride);
	struct stress t[6];
	pthread_t tid[6];
	volatile int stop = 0;
	int bad = 0;
	uint64_t sum;

	self->k = vt_kmod(&self->w, n / 4);
	ASSERT_NE(NULL, self->k);
	for (int i = 0; i < 6; i++) {
		t[i] = (struct stress){ .w = &self->w, .k = self->k, .first = (n / 4) * (i % 4),
					.n = n / 4, .seed = self->seed + i, .version = version,
					.stop = &stop };
		pthread_create(&tid[i], NULL, i < 4 ? stress_writer : i == 4 ? stress_syncer :
			       stress_evictor, &t[i]);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(tid[i], NULL);
	stop = 1;
	for (int i = 0; i < 6; i++) {
		if (i >= 4)
			pthread_join(tid[i], NULL);
		bad += t[i].bad;
	}
	ASSERT_EQ(0, bad);
	ASSERT_EQ(0, kvmem_kmod_sync(self->k));
	for (uint64_t p = 0; p < n; p++) {
		if (version[p])
			pattern(want, stride, p, version[p]);
		else
			memcpy(want, page_ref(&self->w, p), stride);
		ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(self->k, p), buf, stride));
		ASSERT_EQ(0, memcmp(buf, want, stride)) TH_LOG("window page %llu", (unsigned long long)p);
		ASSERT_EQ(0, vt_pread_all(self->w.pages_fd, buf, stride, p * stride));
		ASSERT_EQ(0, memcmp(buf, want, stride)) TH_LOG("file page %llu", (unsigned long long)p);
		ASSERT_EQ(8, pread(self->w.sums_fd, &sum, 8,
				   ((p / self->w.n_layers) * (self->w.n_layers + 1) +
				    p % self->w.n_layers) * 8));
		ASSERT_EQ(kvmem_xxh3_64(want, self->w.page_bytes), sum);
	}
	ASSERT_GT(vt_stats(self->k).evictions, 0);
	ASSERT_GT(vt_stats(self->k).writebacks, 0);
	free(version);
	free(buf);
	free(want);
}

/* The window can be sized past the pages present; the file grows and
 * SET_COUNT makes the new pages valid. */
TEST_F(kv, set_count_grows)
{
	kvmem_kmod_files f = vt_files(&self->w);
	uint64_t last = self->w.pages - 1;
	kvmem_kmod_opts o;
	unsigned char b;

	kvmem_kmod_opts_default(&o);
	o.host_cap = 8 * self->w.page_stride;
	o.page_max = self->w.pages;
	f.page_count = self->w.pages - self->w.n_layers;
	ASSERT_EQ(0, kvmem_kmod_open(&f, &o, &self->k));
	ASSERT_EQ(f.page_count, kvmem_kmod_table(self->k)->n_entries);
	ASSERT_EQ(0, kvmem_kmod_pte(self->k, last)->tiers);
	ASSERT_EQ(-1, vt_read(kvmem_kmod_page_addr(self->k, last), &b, 1));
	ASSERT_EQ(-EINVAL, kvmem_kmod_set_count(self->k, self->w.pages + self->w.n_layers));
	ASSERT_EQ(-EINVAL, kvmem_kmod_set_count(self->k, self->w.pages - 1));
	ASSERT_EQ(0, kvmem_kmod_set_count(self->k, self->w.pages));
	ASSERT_EQ(self->w.pages, kvmem_kmod_pages(self->k));
	ASSERT_EQ(KVMEM_TIER_NVME, kvmem_kmod_pte(self->k, last)->tiers);
	ASSERT_TRUE(page_ok(&self->w, self->k, last));
}

/* A workspace opened read-only: no writable window, sync is a no-op. */
TEST_F(kv, read_only_workspace)
{
	kvmem_kmod_files f = vt_files(&self->w);
	kvmem_kmod_opts o;
	char path[128];
	int rfd;
	void *m;

	snprintf(path, sizeof(path), "%s/pages", self->w.dir);
	rfd = open(path, O_RDONLY);
	ASSERT_LE(0, rfd);
	f.pages_fd = rfd;
	kvmem_kmod_opts_default(&o);
	o.host_cap = 8 * self->w.page_stride;
	/* Read-write use of a read-only descriptor is refused. */
	ASSERT_EQ(-EBADF, kvmem_kmod_open(&f, &o, &self->k));
	o.flags = KVMEM_KMOD_RDONLY;
	ASSERT_EQ(0, kvmem_kmod_open(&f, &o, &self->k));
	/* The window may be mapped writable (for userspace fills), but a
	 * page that is not claimed takes no write: SIGBUS. */
	m = mmap(NULL, 3 * self->w.page_stride, PROT_READ | PROT_WRITE, MAP_SHARED,
		 kvmem_kmod_fd(self->k), KVMEM_MMAP_PAGE_WINDOW);
	ASSERT_NE(MAP_FAILED, m) TH_LOG("writable map of a read-only window: %s",
					strerror(errno));
	ASSERT_TRUE(page_ok(&self->w, self->k, 0));
	ASSERT_EQ(-1, vt_write(m, "no", 2));
	ASSERT_EQ(-1, vt_write((char *)m + self->w.page_stride, "no", 2));	/* absent */
	ASSERT_EQ(0, kvmem_kmod_pte(self->k, 0)->flags & KVMEM_PTE_DIRTY);
	/* A claimed page takes its bytes (a read of the file into it), and
	 * FILLED checks them; after FILLED it is read-only again. */
	uint64_t id = 2;
	int32_t st;

	ASSERT_EQ(1, kvmem_kmod_claim(self->k, &id, 1, &st));
	ASSERT_EQ((ssize_t)self->w.page_stride,
		  pread(rfd, (char *)m + 2 * self->w.page_stride, self->w.page_stride,
			2 * self->w.page_stride));
	ASSERT_EQ(0, kvmem_kmod_filled(self->k, &id, 1, 1, &st));
	ASSERT_EQ(0, st);
	ASSERT_TRUE(page_ok(&self->w, self->k, 2));
	ASSERT_EQ(1, vt_stats(self->k).user_fills);
	ASSERT_EQ(-1, vt_write((char *)m + 2 * self->w.page_stride, "no", 2));
	ASSERT_TRUE(page_ok(&self->w, self->k, 2));
	ASSERT_EQ(0, munmap(m, 3 * self->w.page_stride));
	ASSERT_EQ(0, kvmem_kmod_sync(self->k));
	close(rfd);
}

/* A child maps, faults everything, dirties a page and exits without
 * closing; another closes explicitly. Afterwards the module holds no page
 * and no workspace, the dirty page reached the file, and thirty such
 * children leave MemFree and Slab where they were. (Over 120 s on the
 * debug kernel with the build machine loaded.) */
TEST_F_TIMEOUT(kv, close_and_exit_free_everything, 400)
{
	long free0 = 0, slab0 = 0, free1, slab1;
	unsigned char buf[8];

	for (int round = 0; round < 32; round++) {
		pid_t pid = fork();

		if (pid == 0) {
			kvmem_kmod *k = vt_kmod(&self->w, self->w.pages);

			if (!k)
				_exit(1);
			/* Page 0 holds the last round's write. */
			for (uint64_t p = 1; p < self->w.pages; p++)
				if (!page_ok(&self->w, k, p))
					_exit(2);
			if (vt_write(kvmem_kmod_page_addr(k, 0), "exit", 4))
				_exit(3);
			if (round & 1)
				kvmem_kmod_close(k);
			_exit(0);	/* even rounds: the exit tears it down */
		}
		int status;

		ASSERT_EQ(pid, waitpid(pid, &status, 0));
		ASSERT_EQ(0, WEXITSTATUS(status));
		ASSERT_EQ(0, vt_param("pages"));
		ASSERT_EQ(0, vt_param("workspaces"));
		if (round == 1) {
			free0 = vt_meminfo("MemFree");
			slab0 = vt_meminfo("Slab");
		}
	}
	free1 = vt_meminfo("MemFree");
	slab1 = vt_meminfo("Slab");
	TH_LOG("MemFree %ld -> %ld KiB, Slab %ld -> %ld KiB", free0, free1, slab0, slab1);
	/* 30 rounds of the whole workspace is at least 30 MiB if it leaked.
	 * (On the debug kernel, KASAN's quarantine keeps freed objects in
	 * Slab for a while: there kmemleak, checked at the end, says what
	 * leaked.) */
	ASSERT_LT(free0 - free1, 8192);
	if (!vt_debug_kernel()) {
		ASSERT_LT(slab1 - slab0, 2048);
	}
	ASSERT_EQ(0, vt_pread_all(self->w.pages_fd, buf, 4, 0));
	ASSERT_EQ(0, memcmp(buf, "exit", 4));
}

/* The window's memory is on the node SETUP named (the VM has two). */
TEST_F(kv, numa_placement)
{
	kvmem_kmod_files f = vt_files(&self->w);
	kvmem_kmod_opts o;

	for (int node = 0; node < 2; node++) {
		void *addr[8];
		int status[8];

		kvmem_kmod_opts_default(&o);
		o.host_cap = 8 * self->w.page_stride;
		o.numa_node = node;
		ASSERT_EQ(0, kvmem_kmod_open(&f, &o, &self->k));
		for (int i = 0; i < 8; i++) {
			addr[i] = (char *)kvmem_kmod_page_addr(self->k, i) + (i % 2) * 4096 *
				  (self->w.page_stride > 4096);
			ASSERT_TRUE(page_ok(&self->w, self->k, i));
		}
		/* move_pages with no target nodes reports where pages are. */
		ASSERT_EQ(0, syscall(SYS_move_pages, 0, 8, addr, NULL, status, 0));
		for (int i = 0; i < 8; i++) {
			ASSERT_EQ(node, status[i]) TH_LOG("page %d", i);
		}
		kvmem_kmod_close(self->k);
		self->k = NULL;
	}
}

/* Write-back into a full file system (a 256 KiB tmpfs filled up, the
 * workspace's files sparse): SYNC fails with ENOSPC and the page stays
 * dirty; reclaim cannot evict it either (the touch that needed its slot is
 * SIGBUS, the page stays resident and dirty); once there is room, SYNC
 * writes it. */
TEST(writeback_error_keeps_page_dirty)
{
	const char *mnt = "/tmp/full";
	uint64_t id0 = 0;
	kvmem_kmod_files f = { .page_bytes = 4096, .page_stride = 4096, .n_layers = 1,
			       .page_count = 4 };
	kvmem_kmod_opts o;
	kvmem_kmod *k;
	int32_t st;
	unsigned char b = 0, page[4096];
	uint64_t sum;
	char path[64];
	int fill;

	mkdir(mnt, 0700);
	ASSERT_EQ(0, system("mount -t tmpfs -o size=256k tmpfs /tmp/full"));
	snprintf(path, sizeof(path), "%s/pages", mnt);
	f.pages_fd = open(path, O_RDWR | O_CREAT, 0600);
	ASSERT_EQ(0, ftruncate(f.pages_fd, 4 * 4096));
	snprintf(path, sizeof(path), "%s/sums", mnt);
	f.sums_fd = open(path, O_RDWR | O_CREAT, 0600);
	ASSERT_EQ(0, ftruncate(f.sums_fd, 4 * 2 * 8));
	snprintf(path, sizeof(path), "%s/filler", mnt);
	fill = open(path, O_RDWR | O_CREAT, 0600);
	while (write(fill, page, sizeof(page)) == sizeof(page))
		;
	kvmem_kmod_opts_default(&o);
	o.host_cap = 4096;	/* one slot */
	ASSERT_EQ(0, kvmem_kmod_open(&f, &o, &k));
	ASSERT_EQ(1, kvmem_kmod_claim(k, &id0, 1, &st));
	memset(page, 0x77, sizeof(page));
	ASSERT_EQ(0, vt_write(kvmem_kmod_page_addr(k, 0), page, sizeof(page)));
	ASSERT_EQ(0, kvmem_kmod_filled(k, &id0, 1, 0, &st));
	ASSERT_EQ(0, vt_write(kvmem_kmod_page_addr(k, 0), "w", 1));	/* now tracked */
	ASSERT_EQ(KVMEM_PTE_DIRTY, kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_DIRTY);
	ASSERT_EQ(-ENOSPC, kvmem_kmod_sync(k));
	ASSERT_EQ(KVMEM_PTE_DIRTY, kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_DIRTY);
	ASSERT_EQ(1, vt_stats(k).write_errors);
	/* Page 1 needs page 0's slot; page 0 cannot be written: SIGBUS. */
	ASSERT_EQ(-1, vt_read(kvmem_kmod_page_addr(k, 1), &b, 1));
	ASSERT_TRUE(kvmem_kmod_resident(k, 0));
	ASSERT_EQ(KVMEM_PTE_DIRTY, kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_DIRTY);
	ASSERT_LT(1, vt_stats(k).write_errors);
	ASSERT_EQ(0, vt_stats(k).checksum_errors + vt_stats(k).read_errors);
	/* Room again: the page reaches the file with its checksum. */
	ASSERT_EQ(0, ftruncate(fill, 0));
	ASSERT_EQ(0, kvmem_kmod_sync(k));
	ASSERT_EQ(0, kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_DIRTY);
	ASSERT_EQ(1, pread(f.pages_fd, &b, 1, 0));
	ASSERT_EQ('w', b);
	page[0] = 'w';
	ASSERT_EQ(8, pread(f.sums_fd, &sum, 8, 0));
	ASSERT_EQ(kvmem_xxh3_64(page, 4096), sum);
	kvmem_kmod_close(k);
	close(fill);
	close(f.pages_fd);
	close(f.sums_fd);
	ASSERT_EQ(0, system("umount /tmp/full"));
}

/* The fast path of a userspace pager: claim pages, read them with io_uring
 * O_DIRECT straight into the window, FILLED with VERIFY; on ext2 over a loop
 * device (/init mounts it; tmpfs has no O_DIRECT in 6.1). The module's own
 * reads and write-back work on that file system too. */
TEST(odirect_fill_through_io_uring)
{
	struct stat root, ext;
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	uint64_t ids[8];
	int32_t st[8];
	unsigned char b[8];
	char path[128];
	struct vt_ws w;
	kvmem_kmod *k;
	int dfd;

	if (stat("/", &root) || stat("/mnt/ext", &ext) || root.st_dev == ext.st_dev)
		SKIP(return, "no file system with O_DIRECT at /mnt/ext");
	ASSERT_EQ(0, vt_ws_open_at(&w, VT_WS_WIDE, "/mnt/ext"));
	k = vt_kmod(&w, 16);
	ASSERT_NE(NULL, k);
	snprintf(path, sizeof(path), "%s/pages", w.dir);
	dfd = open(path, O_RDONLY | O_DIRECT);
	ASSERT_LE(0, dfd);
	ASSERT_EQ(0, io_uring_queue_init(16, &ring, 0));
	for (int i = 0; i < 8; i++)
		ids[i] = 3 * i + 1;
	ASSERT_EQ(8, kvmem_kmod_claim(k, ids, 8, st));
	for (int i = 0; i < 8; i++) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);

		io_uring_prep_read(sqe, dfd, kvmem_kmod_page_addr(k, ids[i]), w.page_stride,
				   ids[i] * w.page_stride);
	}
	ASSERT_EQ(8, io_uring_submit(&ring));
	for (int i = 0; i < 8; i++) {
		ASSERT_EQ(0, io_uring_wait_cqe(&ring, &cqe));
		ASSERT_EQ((int)w.page_stride, cqe->res);
		io_uring_cqe_seen(&ring, cqe);
	}
	ASSERT_EQ(0, kvmem_kmod_filled(k, ids, 8, 1, st));
	for (int i = 0; i < 8; i++) {
		ASSERT_EQ(0, st[i]);
		ASSERT_TRUE(page_ok(&w, k, ids[i]));
	}
	ASSERT_EQ(8, vt_stats(k).user_fills);
	ASSERT_EQ(0, vt_stats(k).fills);
	/* The module's own read from ext2, and a write-back to it. */
	ASSERT_TRUE(page_ok(&w, k, 0));
	ASSERT_EQ(1, vt_stats(k).fills);
	ASSERT_EQ(0, vt_write(kvmem_kmod_page_addr(k, 0), "ext2", 4));
	ASSERT_EQ(0, kvmem_kmod_sync(k));
	ASSERT_EQ(4, pread(w.pages_fd, b, 4, 0));
	ASSERT_EQ(0, memcmp(b, "ext2", 4));
	io_uring_queue_exit(&ring);
	close(dfd);
	kvmem_kmod_close(k);
	vt_ws_close(&w);
}

/* The client's own O_DIRECT fill (kvmem_kmod_fill), the kmod source's path
 * with no copy: claims, io_uring reads into the window, FILLED with VERIFY;
 * counted in user_fills, never in fills (the module's buffered reads). On a
 * read-only open too (a second, writable mapping of its window), a page
 * whose bytes are wrong is refused and left absent, a page already there
 * is left alone, and on tmpfs (no O_DIRECT) it says -ENOTSUP. */
TEST(client_fills_with_odirect)
{
	struct stat root, ext;
	uint64_t ids[9];
	int32_t st[9];
	struct vt_ws w;
	kvmem_kmod_files f;
	kvmem_kmod_opts o;
	kvmem_kmod *k;
	const void *data;
	unsigned char c;
	char path[128];
	int rfd;

	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));	/* tmpfs */
	k = vt_kmod(&w, 8);
	ASSERT_NE(NULL, k);
	ASSERT_EQ(0, kvmem_kmod_direct(k));
	ids[0] = 1;
	ASSERT_EQ(-ENOTSUP, kvmem_kmod_fill(k, ids, 1, st));
	ASSERT_FALSE(kvmem_kmod_resident(k, 1));
	kvmem_kmod_close(k);
	vt_ws_close(&w);

	if (stat("/", &root) || stat("/mnt/ext", &ext) || root.st_dev == ext.st_dev)
		SKIP(return, "no file system with O_DIRECT at /mnt/ext");
	ASSERT_EQ(0, vt_ws_open_at(&w, VT_WS_WIDE, "/mnt/ext"));
	k = vt_kmod(&w, 16);
	ASSERT_NE(NULL, k);
	ASSERT_EQ(1, kvmem_kmod_direct(k));
	ASSERT_TRUE(page_ok(&w, k, 4));	/* the module's read: fills 1 */
	for (int i = 0; i < 8; i++)
		ids[i] = 2 * i;
	ASSERT_EQ(7, kvmem_kmod_fill(k, ids, 8, st));
	for (int i = 0; i < 8; i++) {
		ASSERT_EQ(ids[i] == 4 ? 0 : 1, st[i]) TH_LOG("page %d", (int)ids[i]);
		ASSERT_TRUE(kvmem_kmod_resident(k, ids[i]));
		ASSERT_TRUE(page_ok(&w, k, ids[i]));
	}
	ASSERT_EQ(7, vt_stats(k).user_fills);
	ASSERT_EQ(1, vt_stats(k).fills);
	/* A page past the end: -EINVAL, nothing done. Wrong bytes on disk:
	 * refused, absent, BAD; page 20 beside it fine. */
	ids[0] = 20;
	ids[1] = w.pages;
	ASSERT_EQ(-EINVAL, kvmem_kmod_fill(k, ids, 2, st));
	ASSERT_FALSE(kvmem_kmod_resident(k, 20));
	ASSERT_EQ(1, pread(w.pages_fd, &c, 1, 30 * w.page_stride + 7));
	c ^= 0x40;
	ASSERT_EQ(1, pwrite(w.pages_fd, &c, 1, 30 * w.page_stride + 7));
	ids[0] = 30;
	ids[1] = 20;
	ASSERT_EQ(-EBADMSG, kvmem_kmod_fill(k, ids, 2, st));
	ASSERT_EQ(-EBADMSG, st[0]);
	ASSERT_EQ(1, st[1]);
	ASSERT_FALSE(kvmem_kmod_resident(k, 30));
	ASSERT_TRUE(kvmem_kmod_pte(k, 30)->flags & KVMEM_PTE_BAD);
	ASSERT_TRUE(page_ok(&w, k, 20));
	c ^= 0x40;
	ASSERT_EQ(1, pwrite(w.pages_fd, &c, 1, 30 * w.page_stride + 7));
	ASSERT_EQ(1, kvmem_kmod_fill(k, ids, 1, st));
	ASSERT_TRUE(page_ok(&w, k, 30));
	ASSERT_EQ(1, vt_stats(k).fills);
	/* A read that comes back short (the file cut under the last page):
	 * -EIO, counted by the module as a read error, not a checksum error;
	 * the page absent and BAD, its neighbour fine. */
	ASSERT_EQ(1, vt_stats(k).checksum_errors);
	ASSERT_EQ(0, vt_stats(k).read_errors);
	ASSERT_EQ(0, ftruncate(w.pages_fd, (w.pages - 1) * w.page_stride));
	ids[0] = w.pages - 2;
	ids[1] = w.pages - 1;
	ASSERT_EQ(-EIO, kvmem_kmod_fill(k, ids, 2, st));
	ASSERT_EQ(1, st[0]);
	ASSERT_EQ(-EIO, st[1]);
	ASSERT_FALSE(kvmem_kmod_resident(k, w.pages - 1));
	ASSERT_TRUE(kvmem_kmod_pte(k, w.pages - 1)->flags & KVMEM_PTE_BAD);
	ASSERT_EQ(1, vt_stats(k).read_errors);
	ASSERT_EQ(1, vt_stats(k).checksum_errors);
	ASSERT_TRUE(page_ok(&w, k, w.pages - 2));
	ASSERT_EQ((ssize_t)w.page_stride, pwrite(w.pages_fd, page_ref(&w, w.pages - 1), w.page_stride,
						 (w.pages - 1) * w.page_stride));
	ASSERT_EQ(1, kvmem_kmod_fill(k, ids + 1, 1, st));
	ASSERT_TRUE(page_ok(&w, k, w.pages - 1));
	ASSERT_EQ(1, vt_stats(k).fills);
	kvmem_kmod_close(k);

	/* Read-only, and the caller's descriptor closed after the open. */
	f = vt_files(&w);
	snprintf(path, sizeof(path), "%s/pages", w.dir);
	rfd = open(path, O_RDONLY);
	ASSERT_LE(0, rfd);
	f.pages_fd = rfd;
	kvmem_kmod_opts_default(&o);
	o.host_cap = 16 * w.page_stride;
	o.flags = KVMEM_KMOD_RDONLY;
	ASSERT_EQ(0, kvmem_kmod_open(&f, &o, &k));
	close(rfd);	/* the client keeps what it needs */
	ASSERT_EQ(1, kvmem_kmod_direct(k));
	for (int i = 0; i < 9; i++)
		ids[i] = 3 * i + 1;
	ASSERT_EQ(9, kvmem_kmod_fill(k, ids, 9, NULL));
	for (int i = 0; i < 9; i++)
		ASSERT_TRUE(page_ok(&w, k, ids[i]));
	ASSERT_EQ(9, vt_stats(k).user_fills);
	ASSERT_EQ(0, vt_stats(k).fills);
	/* Started fills: in flight (claimed, not resident) until waited for;
	 * kvmem_kmod_get waits for them before it hands out a page; close
	 * ends them too, and nothing is left behind. */
	for (int i = 0; i < 4; i++)
		ids[i] = 3 * i + 2;
	ASSERT_EQ(4, kvmem_kmod_fill_start(k, ids, 4));
	for (int i = 0; i < 4; i++)
		ASSERT_FALSE(kvmem_kmod_resident(k, ids[i]));
	ASSERT_EQ(4, kvmem_kmod_fill_wait(k));
	ASSERT_EQ(0, kvmem_kmod_fill_wait(k));
	for (int i = 0; i < 4; i++)
		ASSERT_TRUE(page_ok(&w, k, ids[i]));
	for (int i = 0; i < 4; i++)
		ids[i] = 3 * i + 30;
	ASSERT_EQ(4, kvmem_kmod_fill_start(k, ids, 4));
	ASSERT_EQ(0, kvmem_kmod_get(k, ids[3], &data));
	ASSERT_EQ(0, memcmp(data, page_ref(&w, ids[3]), w.page_stride));
	for (int i = 0; i < 4; i++)
		ASSERT_TRUE(kvmem_kmod_resident(k, ids[i]));
	ASSERT_EQ(17, vt_stats(k).user_fills);
	ASSERT_EQ(0, vt_stats(k).fills);
	ids[0] = 50;
	ASSERT_EQ(1, kvmem_kmod_fill_start(k, ids, 1));
	kvmem_kmod_close(k);
	ASSERT_EQ(0, vt_param("pages"));
	ASSERT_EQ(0, vt_param("workspaces"));
	vt_ws_close(&w);
}

/* ---- argument checks (no variant needed, but cheap) --------------------- */

static int raw_setup(struct vt_ws *w, struct kvmem_ioc_setup *s)
{
	int fd = open(VT_DEV, O_RDWR), r;

	if (fd < 0)
		return -1000;
	r = ioctl(fd, KVMEM_IOC_SETUP, s) < 0 ? -errno : 0;
	close(fd);
	return r;
}

static struct kvmem_ioc_setup good_setup(struct vt_ws *w)
{
	struct kvmem_ioc_setup s;

	memset(&s, 0, sizeof(s));
	s.pages_fd = w->pages_fd;
	s.sums_fd = w->sums_fd;
	s.page_bytes = w->page_bytes;
	s.page_stride = w->page_stride;
	s.n_layers = w->n_layers;
	s.numa_node = -1;
	s.page_count = w->pages;
	s.host_cap = 8 * w->page_stride;
	return s;
}

TEST_F(kv, setup_rejects_bad_arguments)
{
	struct kvmem_ioc_setup s;
	int devnull = open("/dev/null", O_RDWR);

#define BAD(field_stmt, err)						\
	do {								\
		s = good_setup(&self->w);				\
		field_stmt;						\
		ASSERT_EQ(-(err), raw_setup(&self->w, &s)) TH_LOG("%s", #field_stmt); \
	} while (0)

	s = good_setup(&self->w);
	ASSERT_EQ(0, raw_setup(&self->w, &s));
	BAD(s.flags = 0x80, EINVAL);
	BAD(s.reserved0 = 1, EINVAL);
	BAD(s.reserved[3] = 1, EINVAL);
	BAD(s.page_stride = 0, EINVAL);
	BAD(s.page_stride += 512, EINVAL);
	BAD(s.page_stride = 128u << 20, EINVAL);
	BAD(s.page_bytes = 0, EINVAL);
	BAD(s.page_bytes = s.page_stride + 1, EINVAL);
	BAD(s.page_bytes = s.page_stride - 4096, EINVAL);
	BAD(s.n_layers = 0, EINVAL);
	BAD(s.n_layers = 5000, EINVAL);
	BAD(s.n_layers = 7, EINVAL);	/* 256 and 96 pages: not a multiple of 7 */
	BAD(s.page_count = 0, EINVAL);
	BAD(s.page_count += s.n_layers, EINVAL);	/* beyond the files */
	BAD(s.page_max = s.page_count - s.n_layers, EINVAL);
	BAD(s.page_max = 1ull << 40, EINVAL);
	BAD(s.host_cap = s.page_stride - 1, EINVAL);
	BAD(s.host_cap = 1ull << 50, EINVAL);
	BAD(s.numa_node = 2, EINVAL);	/* two nodes in this VM */
	BAD(s.numa_node = -2, EINVAL);
	BAD(s.numa_node = 1 << 20, EINVAL);
	BAD(s.pages_fd = -1, EBADF);
	BAD(s.pages_fd = 9999, EBADF);
	BAD(s.sums_fd = devnull, EINVAL);	/* not a regular file */
	BAD(s.sums_fd = s.pages_fd, EINVAL);	/* the same file twice */
	s = good_setup(&self->w);
	s.numa_node = 0;
	ASSERT_EQ(0, raw_setup(&self->w, &s));
#undef BAD
	close(devnull);
}

TEST_F(kv, ioctls_check_state_and_arguments)
{
	struct kvmem_ioc_setup s = good_setup(&self->w);
	struct kvmem_ioc_pages a;
	struct kvmem_ioc_stats st;
	uint64_t ids[2] = { 0, 1 }, v;
	int32_t status[2];
	int fd = open(VT_DEV, O_RDWR);

	ASSERT_LE(0, fd);
	/* Before setup: every ioctl but SETUP is EINVAL, mmap too. */
	memset(&a, 0, sizeof(a));
	a.pages = (uintptr_t)ids;
	a.n_pages = 2;
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_PREFETCH, &a));
	ASSERT_EQ(EINVAL, errno);
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_STATS, &st));
	ASSERT_EQ(EINVAL, errno);
	ASSERT_EQ(MAP_FAILED, mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0));
	/* Unknown commands: ENOTTY, before and after setup. */
	ASSERT_EQ(-1, ioctl(fd, _IO(KVMEM_IOC_MAGIC, 99)));
	ASSERT_EQ(ENOTTY, errno);
	ASSERT_EQ(-1, ioctl(fd, _IOW('k', 1, struct kvmem_ioc_setup), &s));
	ASSERT_EQ(ENOTTY, errno);
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_SETUP, (void *)16));
	ASSERT_EQ(EFAULT, errno);
	ASSERT_EQ(0, ioctl(fd, KVMEM_IOC_SETUP, &s));
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_SETUP, &s));
	ASSERT_EQ(EBUSY, errno);
	ASSERT_EQ(-1, ioctl(fd, _IOR(KVMEM_IOC_MAGIC, 9, struct kvmem_ioc_setup), &s));
	ASSERT_EQ(ENOTTY, errno);

#define BADP(cmd, stmt, err)						\
	do {								\
		memset(&a, 0, sizeof(a));				\
		a.pages = (uintptr_t)ids;				\
		a.status = (uintptr_t)status;				\
		a.n_pages = 2;						\
		stmt;							\
		ASSERT_EQ(-1, ioctl(fd, cmd, &a)) TH_LOG("%s %s", #cmd, #stmt); \
		ASSERT_EQ(err, errno) TH_LOG("%s %s", #cmd, #stmt);	\
	} while (0)

	BADP(KVMEM_IOC_EVICT, a.n_pages = 0, EINVAL);
	BADP(KVMEM_IOC_EVICT, a.n_pages = KVMEM_IOC_PAGES_MAX + 1, EINVAL);
	BADP(KVMEM_IOC_EVICT, a.reserved = 1, EINVAL);
	BADP(KVMEM_IOC_EVICT, a.flags = KVMEM_PAGES_WAIT, EINVAL);
	BADP(KVMEM_IOC_CLAIM, a.flags = KVMEM_PAGES_VERIFY, EINVAL);
	BADP(KVMEM_IOC_CLAIM, a.status = 0, EINVAL);
	BADP(KVMEM_IOC_PREFETCH, (void)0, EINVAL);	/* status must be 0 */
	BADP(KVMEM_IOC_PREFETCH, a.status = 0; a.flags = 0x100, EINVAL);
	BADP(KVMEM_IOC_FILLED, a.flags = KVMEM_PAGES_WAIT, EINVAL);
	BADP(KVMEM_IOC_EVICT, a.pages = 8, EFAULT);
	BADP(KVMEM_IOC_EVICT, a.pages = (uintptr_t)-4096, EFAULT);
	BADP(KVMEM_IOC_EVICT, a.status = (uintptr_t)-4096, EFAULT);
	BADP(KVMEM_IOC_EVICT, ids[1] = self->w.pages, EINVAL);
	BADP(KVMEM_IOC_PREFETCH, a.status = 0; ids[1] = ~0ull, EINVAL);
	ids[1] = 1;
	/* Nothing was done by the refused calls. */
	ASSERT_EQ(0, ioctl(fd, KVMEM_IOC_STATS, &st));
	ASSERT_EQ(0, st.prefetches + st.fills + st.evictions);
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_STATS, (void *)8));
	ASSERT_EQ(EFAULT, errno);
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_STEP, NULL));
	ASSERT_EQ(EFAULT, errno);
	v = self->w.pages + 1;
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_SET_COUNT, &v));
	ASSERT_EQ(EINVAL, errno);
	close(fd);
#undef BADP
}

/* The events are in tracefs (what perf list 'kvmem:*' reads) and fire. */
TEST_F(kv, tracepoints_listed_and_fire)
{
	static const char *const ev[] = { "kvmem_fault", "kvmem_hit", "kvmem_fill_done",
					  "kvmem_prefetch", "kvmem_evict", "kvmem_writeback",
					  "kvmem_error", "kvmem_step", "kvmem_hint", "kvmem_gpu" };
	char path[160], buf[8192];
	struct stat sb;
	uint64_t id = 6;	/* the GPU tier's page and slot, at the end */
	uint32_t slot = 41;
	ssize_t n;

	for (size_t i = 0; i < sizeof(ev) / sizeof(ev[0]); i++) {
		snprintf(path, sizeof(path), "/sys/kernel/tracing/events/kvmem/%s/format", ev[i]);
		ASSERT_EQ(0, stat(path, &sb)) TH_LOG("%s", path);
	}
	/* A bare tracepoint has no event directory. */
	ASSERT_NE(0, stat("/sys/kernel/tracing/events/kvmem/kvmem_reclaim", &sb));
	ASSERT_EQ(0, vt_event_enable("kvmem_fill_done", 1));
	vt_trace_clear();
	self->k = vt_kmod(&self->w, 8);
	ASSERT_NE(NULL, self->k);
	ASSERT_TRUE(page_ok(&self->w, self->k, 3));
	n = vt_trace_read(buf, sizeof(buf));
	ASSERT_GT(n, 0);
	ASSERT_NE(NULL, strstr(buf, "kvmem_fill_done")) TH_LOG("%s", buf);
	ASSERT_NE(NULL, strstr(buf, "page=3 n=1"));
	ASSERT_EQ(0, vt_event_enable("kvmem_fill_done", 0));
	/* The GPU tier's event names the page and its slot. */
	ASSERT_EQ(0, vt_event_enable("kvmem_gpu", 1));
	ASSERT_EQ(0, kvmem_kmod_gpu(self->k, &id, &slot, 1));
	n = vt_trace_read(buf, sizeof(buf));
	ASSERT_GT(n, 0);
	ASSERT_NE(NULL, strstr(buf, "page=6 slot=41")) TH_LOG("%s", buf);
	ASSERT_EQ(0, vt_event_enable("kvmem_gpu", 0));
}

TEST_HARNESS_MAIN
