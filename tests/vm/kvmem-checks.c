// SPDX-License-Identifier: GPL-2.0
/*
 * kvmem.ko refuses what it must refuse, before it changes anything: a
 * status array it cannot write (CLAIM, FILLED, EVICT act on nothing), files
 * the caller may only append to, a device opened read-only, executable
 * mappings of the table or the window. The client library splits a list of
 * more than KVMEM_IOC_PAGES_MAX ids into calls with the status array
 * advanced along with the ids. PREFETCH's tracepoint reports the list the
 * caller gave, read before the list goes to the worker that frees it.
 */
#include <linux/fs.h>
#include <pthread.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

#include "kselftest_harness.h"
#include "vmtest.h"

static struct kvmem_ioc_setup setup_of(const struct vt_ws *w, int pages_fd, int sums_fd)
{
	struct kvmem_ioc_setup s;

	memset(&s, 0, sizeof(s));
	s.pages_fd = pages_fd;
	s.sums_fd = sums_fd;
	s.page_bytes = w->page_bytes;
	s.page_stride = w->page_stride;
	s.n_layers = w->n_layers;
	s.numa_node = -1;
	s.page_count = w->pages;
	s.host_cap = 8 * (uint64_t)w->page_stride;
	return s;
}

static int pages_call(kvmem_kmod *k, unsigned long cmd, const uint64_t *ids, uint32_t n,
		      void *status, uint32_t flags)
{
	struct kvmem_ioc_pages a;

	memset(&a, 0, sizeof(a));
	a.pages = (uintptr_t)ids;
	a.status = (uintptr_t)status;
	a.n_pages = n;
	a.flags = flags;
	return ioctl(kvmem_kmod_fd(k), cmd, &a) < 0 ? -errno : 0;
}

static int claimed(kvmem_kmod *k, uint64_t p)
{
	const struct kvmem_pte *e = kvmem_kmod_pte(k, p);

	return (e->flags & KVMEM_PTE_IN_FLIGHT) && !(e->tiers & KVMEM_TIER_HOST);
}

/* A status array that ends in a PROT_NONE page (or lies in one): EFAULT,
 * and not one page was claimed, marked filled or evicted. */
TEST(status_is_checked_before_anything_is_done)
{
	uint64_t ids[4] = { 5, 6, 7, 8 };
	int32_t st[4];
	unsigned char *edge;
	struct vt_ws w;
	kvmem_kmod *k;

	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));
	k = vt_kmod(&w, 16);
	ASSERT_NE(NULL, k);
	edge = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, edge);
	ASSERT_EQ(0, mprotect(edge + 4096, 4096, PROT_NONE));
	/* Two entries writable, two not. */
	ASSERT_EQ(-EFAULT, pages_call(k, KVMEM_IOC_CLAIM, ids, 4, edge + 4096 - 8, 0));
	for (int i = 0; i < 4; i++) {
		ASSERT_FALSE(claimed(k, ids[i])) TH_LOG("page %llu claimed by a refused CLAIM",
							(unsigned long long)ids[i]);
	}
	ASSERT_EQ(4, kvmem_kmod_claim(k, ids, 4, st));
	for (int i = 0; i < 4; i++)
		ASSERT_EQ((ssize_t)w.page_stride, pread(w.pages_fd, kvmem_kmod_page_addr(k, ids[i]),
							w.page_stride, ids[i] * w.page_stride));
	ASSERT_EQ(-EFAULT, pages_call(k, KVMEM_IOC_FILLED, ids, 4, edge + 4096, KVMEM_PAGES_VERIFY));
	for (int i = 0; i < 4; i++)
		ASSERT_TRUE(claimed(k, ids[i]));
	ASSERT_EQ(0, kvmem_kmod_filled(k, ids, 4, 1, st));
	ASSERT_EQ(-EFAULT, pages_call(k, KVMEM_IOC_EVICT, ids, 4, edge + 4096 - 4, 0));
	for (int i = 0; i < 4; i++)
		ASSERT_TRUE(kvmem_kmod_resident(k, ids[i]));
	ASSERT_EQ(0, vt_stats(k).evictions);
	ASSERT_EQ(0, kvmem_kmod_evict(k, ids, 4, st));
	kvmem_kmod_close(k);
	munmap(edge, 8192);
	vt_ws_close(&w);
}

/* The module writes the pages file at any offset: a caller who may only
 * append to it (O_APPEND, or an append-only file) cannot hand it over for
 * writing. Reading it is fine. */
TEST(append_only_files_are_refused_for_writing)
{
	kvmem_kmod_files f;
	kvmem_kmod_opts o;
	kvmem_kmod *k = NULL;
	char path[128];
	struct stat root, ext;
	struct vt_ws w;
	int fd, flags;

	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));
	snprintf(path, sizeof(path), "%s/pages", w.dir);
	fd = open(path, O_RDWR | O_APPEND);
	ASSERT_LE(0, fd);
	f = vt_files(&w);
	f.pages_fd = fd;
	kvmem_kmod_opts_default(&o);
	o.host_cap = 8 * w.page_stride;
	ASSERT_EQ(-EPERM, kvmem_kmod_open(&f, &o, &k));
	o.flags = KVMEM_KMOD_RDONLY;
	ASSERT_EQ(0, kvmem_kmod_open(&f, &o, &k));
	kvmem_kmod_close(k);
	close(fd);
	vt_ws_close(&w);

	if (stat("/", &root) || stat("/mnt/ext", &ext) || root.st_dev == ext.st_dev)
		SKIP(return, "no file system with chattr +a at /mnt/ext");
	ASSERT_EQ(0, vt_ws_open_at(&w, VT_WS_SMALL, "/mnt/ext"));
	flags = FS_APPEND_FL;
	ASSERT_EQ(0, ioctl(w.pages_fd, FS_IOC_SETFLAGS, &flags));
	snprintf(path, sizeof(path), "%s/pages", w.dir);
	ASSERT_EQ(-1, open(path, O_RDWR));	/* what the file system says */
	fd = open(path, O_RDWR | O_APPEND);
	ASSERT_LE(0, fd);
	f = vt_files(&w);
	f.pages_fd = fd;
	o.flags = 0;
	ASSERT_EQ(-EPERM, kvmem_kmod_open(&f, &o, &k));
	flags = 0;
	ASSERT_EQ(0, ioctl(w.pages_fd, FS_IOC_SETFLAGS, &flags));
	close(fd);
	vt_ws_close(&w);
}

/* /dev/kvmem opened O_RDONLY: nothing that changes a workspace. */
TEST(readonly_device_fd_changes_nothing)
{
	struct kvmem_ioc_setup s;
	struct vt_ws w;
	uint64_t v = 1;
	int fd;

	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));
	fd = open(VT_DEV, O_RDONLY);
	ASSERT_LE(0, fd);
	s = setup_of(&w, w.pages_fd, w.sums_fd);
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_SETUP, &s));
	ASSERT_EQ(EBADF, errno);
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_STEP, &v));
	ASSERT_EQ(EBADF, errno);
	ASSERT_EQ(-1, ioctl(fd, KVMEM_IOC_SYNC));
	ASSERT_EQ(EBADF, errno);
	close(fd);
	vt_ws_close(&w);
}

/* Neither mapping can be executable, now or later. */
TEST(no_executable_mappings)
{
	struct vt_ws w;
	kvmem_kmod *k;
	void *m;
	int fd;

	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));
	k = vt_kmod(&w, 8);
	ASSERT_NE(NULL, k);
	fd = kvmem_kmod_fd(k);
	m = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_SHARED, fd, KVMEM_MMAP_PAGE_TABLE);
	ASSERT_EQ(MAP_FAILED, m);
	ASSERT_EQ(EPERM, errno);
	m = mmap(NULL, w.page_stride, PROT_READ | PROT_EXEC, MAP_SHARED, fd,
		 KVMEM_MMAP_PAGE_WINDOW);
	ASSERT_EQ(MAP_FAILED, m);
	ASSERT_EQ(EPERM, errno);
	ASSERT_NE(0, mprotect((void *)kvmem_kmod_table(k), 4096, PROT_READ | PROT_EXEC));
	ASSERT_NE(0, mprotect(kvmem_kmod_page_addr(k, 0), 4096, PROT_READ | PROT_EXEC));
	kvmem_kmod_close(k);
	vt_ws_close(&w);
}

/* More ids than one ioctl takes: the library's calls each get their own
 * part of the status array (issue 23: a client writing every chunk's
 * results at the start of the array passed its own tests). */
TEST(client_splits_long_lists_with_their_status)
{
	size_t n = KVMEM_IOC_PAGES_MAX + 8;
	uint64_t *ids = malloc(n * sizeof(*ids));
	int32_t *st = malloc(n * sizeof(*st));
	struct vt_ws w;
	kvmem_kmod *k;
	unsigned char b;

	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));
	k = vt_kmod(&w, 16);
	ASSERT_NE(NULL, k);
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, 1), &b, 1));
	for (size_t i = 0; i < KVMEM_IOC_PAGES_MAX; i++)
		ids[i] = 1;	/* resident: not claimed, status 0 */
	for (size_t j = 0; j < 8; j++)
		ids[KVMEM_IOC_PAGES_MAX + j] = 2 + j;
	memset(st, 0x7f, n * sizeof(*st));
	ASSERT_EQ(8, kvmem_kmod_claim(k, ids, n, st));
	for (size_t i = 0; i < KVMEM_IOC_PAGES_MAX; i++) {
		ASSERT_EQ(0, st[i]) TH_LOG("status %zu", i);
	}
	for (size_t j = 0; j < 8; j++) {
		uint64_t p = ids[KVMEM_IOC_PAGES_MAX + j];

		ASSERT_EQ(1, st[KVMEM_IOC_PAGES_MAX + j]) TH_LOG("status of page %llu",
								 (unsigned long long)p);
		ASSERT_EQ((ssize_t)w.page_stride, pread(w.pages_fd, kvmem_kmod_page_addr(k, p),
							w.page_stride, p * w.page_stride));
	}
	ASSERT_EQ(0, kvmem_kmod_filled(k, ids + KVMEM_IOC_PAGES_MAX, 8, 1, st));
	/* EVICT with a list as long: every page absent afterwards, status 0. */
	memset(st, 0x7f, n * sizeof(*st));
	ASSERT_EQ(0, kvmem_kmod_evict(k, ids, n, st));
	for (size_t i = 0; i < n; i++) {
		ASSERT_EQ(0, st[i]) TH_LOG("status %zu", i);
	}
	for (uint64_t p = 1; p < 10; p++)
		ASSERT_FALSE(kvmem_kmod_resident(k, p));
	kvmem_kmod_close(k);
	vt_ws_close(&w);
	free(ids);
	free(st);
}

/* ---- whole entries of the page table ------------------------------------ */

struct churn {
	kvmem_kmod *k;
	uint64_t pages, seed;
	volatile int stop;
};

static void *churner(void *arg)
{
	struct churn *c = arg;
	uint64_t rng = c->seed;
	unsigned char b;

	while (!c->stop) {
		uint64_t p = vt_rng(&rng) % c->pages;

		if (vt_read(kvmem_kmod_page_addr(c->k, p), &b, 1))
			break;
		if (!(vt_rng(&rng) % 4))
			kvmem_kmod_evict(c->k, &p, 1, &(int32_t){ 0 });
	}
	return NULL;
}

/* A consistent entry: resident means a slot and no transfer; neither
 * resident nor in flight means no slot. */
static int pte_consistent(const struct kvmem_pte *e)
{
	if (e->seq & 1)
		return 0;
	if (e->tiers & KVMEM_TIER_HOST)
		return e->host_slot != KVMEM_SLOT_NONE && !(e->flags & KVMEM_PTE_IN_FLIGHT);
	if (!(e->flags & KVMEM_PTE_IN_FLIGHT))
		return e->host_slot == KVMEM_SLOT_NONE;
	return 1;
}

/* One thread faults and evicts pages through a window of 8 while this one
 * copies whole entries with kvmem_kmod_pte_read: every copy is an entry as
 * it was at one moment (the module writes each entry inside its sequence
 * count; a copy that ignores it mixes old and new fields). */
TEST(pte_reads_are_consistent)
{
	struct churn c;
	struct vt_ws w;
	struct kvmem_pte e;
	pthread_t tid;
	uint64_t rng;
	long reads = 0, bad = 0;
	time_t start;

	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));
	c = (struct churn){ .pages = 64, .seed = vt_seed("pte reads") };
	rng = c.seed + 1;
	c.k = vt_kmod(&w, 8);
	ASSERT_NE(NULL, c.k);
	pthread_create(&tid, NULL, churner, &c);
	/* At least 4 s and 200 fills (the debug kernel fills slowly), at
	 * most 30 s. */
	start = time(NULL);
	while (time(NULL) < start + 4 ||
	       (vt_stats(c.k).fills < 200 && time(NULL) < start + 30)) {
		for (int i = 0; i < 1000; i++) {
			ASSERT_EQ(0, kvmem_kmod_pte_read(c.k, vt_rng(&rng) % c.pages, &e));
			reads++;
			if (!pte_consistent(&e)) {
				if (!bad)
					TH_LOG("page %llu: tiers 0x%x flags 0x%x slot %u seq %u",
					       (unsigned long long)e.page_id, e.tiers, e.flags,
					       e.host_slot, e.seq);
				bad++;
			}
		}
	}
	c.stop = 1;
	pthread_join(tid, NULL);
	TH_LOG("%ld entries read, %ld torn; %llu fills meanwhile", reads, bad,
	       (unsigned long long)vt_stats(c.k).fills);
	ASSERT_GT(vt_stats(c.k).fills, 100);
	ASSERT_EQ(0, bad);
	ASSERT_EQ(-EINVAL, kvmem_kmod_pte_read(c.k, w.pages, &e));
	kvmem_kmod_close(c.k);
	vt_ws_close(&w);
}

/* ---- PREFETCH's tracepoint and the batch it hands away ------------------ */

#define TR "/sys/kernel/tracing"
#define WQ_MASK "/sys/devices/virtual/workqueue/cpumask"

static int put_str(const char *path, const char *v)
{
	int fd = open(path, O_WRONLY | O_TRUNC), ok;

	if (fd < 0)
		return -1;
	ok = write(fd, v, strlen(v)) == (ssize_t)strlen(v);
	close(fd);
	return ok ? 0 : -1;
}

static char *slurp(const char *path, size_t *len)
{
	size_t cap = 1 << 20, n = 0;
	char *buf = malloc(cap + 1);
	ssize_t r;
	int fd = open(path, O_RDONLY);

	if (fd < 0 || !buf)
		return NULL;
	while ((r = read(fd, buf + n, cap - n)) > 0) {
		n += r;
		if (n == cap) {
			cap *= 2;
			buf = realloc(buf, cap + 1);
		}
	}
	close(fd);
	buf[n] = 0;
	*len = n;
	return buf;
}

struct pf_thread {
	kvmem_kmod *k;
	uint64_t pages, seed;
	int calls;
};

static void *pf_loop(void *arg)
{
	struct pf_thread *t = arg;
	uint64_t rng = t->seed;
	cpu_set_t one;

	CPU_ZERO(&one);
	CPU_SET(1, &one);
	sched_setaffinity(0, sizeof(one), &one);
	for (int i = 0; i < t->calls; i++) {
		uint64_t id = 1 + vt_rng(&rng) % (t->pages - 1);

		pages_call(t->k, KVMEM_IOC_PREFETCH, &id, 1, NULL, 0);
	}
	return NULL;
}


/* A fixture with nothing in it, for the cases that need a longer timeout
 * than TEST's 30 s (the 6.1 harness has no TEST_TIMEOUT). */
FIXTURE(slow) {
	int unused;
};

FIXTURE_SETUP(slow)
{
}

FIXTURE_TEARDOWN(slow)
{
}

/*
 * Four threads and the module's (unbound) workqueue share CPU 1, so the
 * worker, woken when a caller unlocks the workspace, runs before the caller
 * goes on and frees the batch just queued. Every kvmem_prefetch event must
 * name a page a caller asked for (1 .. pages-1; never page 0): a batch read
 * after the worker freed it shows up as a page the test never sent (the VM
 * boots with init_on_free=1, so freed memory reads 0) or, on the debug
 * kernel, as a KASAN report that /init counts. (12-33 s on the stock
 * kernel, 140 s to over 240 s on the debug kernel with the build machine
 * loaded: hence the bound.)
 */
TEST_F_TIMEOUT(slow, prefetch_trace_reads_its_own_batch, 600)
{
	char *old_mask = NULL, *trace, *p;
	struct pf_thread t[4];
	pthread_t tid[4];
	unsigned long long page;
	size_t len;
	struct vt_ws w;
	kvmem_kmod *k;
	uint64_t seed = vt_seed("prefetch trace");
	long events = 0, bad = 0;

	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));
	k = vt_kmod(&w, w.pages);
	ASSERT_NE(NULL, k);
	for (uint64_t p0 = 0; p0 < w.pages; p0++)
		ASSERT_EQ(0, kvmem_kmod_prefetch(k, &p0, 1, 1));
	old_mask = slurp(WQ_MASK, &len);
	if (old_mask)
		put_str(WQ_MASK, "2");
	ASSERT_EQ(0, put_str(TR "/buffer_size_kb", "4096"));
	ASSERT_EQ(0, put_str(TR "/events/kvmem/kvmem_prefetch/enable", "1"));
	for (int round = 0; round < 12; round++) {
		ASSERT_EQ(0, put_str(TR "/trace", ""));
		for (int i = 0; i < 4; i++) {
			t[i] = (struct pf_thread){ .k = k, .pages = w.pages, .calls = 2000,
						   .seed = seed + 4 * round + i };
			pthread_create(&tid[i], NULL, pf_loop, &t[i]);
		}
		for (int i = 0; i < 4; i++)
			pthread_join(tid[i], NULL);
		kvmem_kmod_prefetch(k, &(uint64_t){ 1 }, 1, 1);	/* drain the queue */
		trace = slurp(TR "/trace", &len);
		ASSERT_NE(NULL, trace);
		for (p = strstr(trace, "kvmem_prefetch:"); p; p = strstr(p + 1, "kvmem_prefetch:")) {
			char *q = strstr(p, "page=");

			if (!q || sscanf(q, "page=%llu", &page) != 1)
				continue;
			events++;
			if (page == 0 || page >= w.pages) {
				if (!bad)
					TH_LOG("round %d: an event names page %llu", round, page);
				bad++;
			}
		}
		free(trace);
	}
	put_str(TR "/events/kvmem/kvmem_prefetch/enable", "0");
	put_str(TR "/buffer_size_kb", "1408");
	if (old_mask)
		put_str(WQ_MASK, old_mask);
	free(old_mask);
	TH_LOG("%ld prefetch events, %ld naming a page no caller sent", events, bad);
	ASSERT_GT(events, 1000);
	ASSERT_EQ(0, bad);
	kvmem_kmod_close(k);
	vt_ws_close(&w);
}

TEST_HARNESS_MAIN
