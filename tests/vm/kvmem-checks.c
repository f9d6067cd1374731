// SPDX-License-Identifier: GPL-2.0
/*
 * kvmem.ko refuses what it must refuse, before it changes anything: a
 * status array it cannot write (CLAIM, FILLED, EVICT act on nothing), files
 * the caller may only append to, a device opened read-only, executable
 * mappings of the table or the window.
 */
#include <linux/fs.h>
#include <sys/ioctl.h>

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

TEST_HARNESS_MAIN
