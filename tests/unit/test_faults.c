// SPDX-License-Identifier: MIT
/*
 * Faults: a read error injected into the io_uring path, a failed write, a
 * full disk (a 2 MiB tmpfs the test mounts), a missing or unwritable
 * directory. Each gives a clear error naming the file; the in-memory state
 * stays usable; committed data stays intact.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/loop.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager_fixture.h"
#include "pager/faults.h"
#include "kvmem/store.h"

static uint64_t g_seed;
static char g_mnt[256];		/* mounted by a test; undone even when it fails */
static int g_loop = -1;		/* the loop device under it, if any */

static int unmount_teardown(void **state)
{
	if (g_mnt[0]) {
		umount2(g_mnt, MNT_DETACH);
		fx_rmtree(g_mnt);
		g_mnt[0] = 0;
	}
	if (g_loop >= 0) {
		ioctl(g_loop, LOOP_CLR_FD, 0);
		close(g_loop);
		g_loop = -1;
	}
	return 0;
}

/*
 * Mounting needs root and a kernel that has the file system (and loop
 * devices for ext4). Only those are reasons to skip: any other failure of
 * a mount the test could make is a failure of the test. 0 or -1 (skip).
 */
static int missing_facility(int err)
{
	return err == EPERM || err == EACCES || err == ENODEV || err == ENOSYS || err == ENXIO ||
	       err == ENOENT;
}

static int mount_failed(const char *what, int err)
{
	if (missing_facility(err)) {
		print_message("cannot mount %s (%s): no privilege or no such facility here: "
			      "skipped\n", what, strerror(err));
		return -1;
	}
	fail_msg("cannot mount %s as root: %s", what, strerror(err));
	return -1;
}

/* Mount a tmpfs of `size` on a fresh directory; 0, or -1 to skip. */
static int mount_tmpfs(const char *size, char *mnt, size_t len)
{
	char opt[64];

	if (geteuid() != 0) {
		print_message("not root: cannot mount a tmpfs: skipped\n");
		return -1;
	}
	assert_non_null(fx_tmpdir(mnt, len));
	snprintf(opt, sizeof(opt), "size=%s", size);
	if (mount("kvmem-test", mnt, "tmpfs", 0, opt) < 0) {
		int err = errno;

		fx_rmtree(mnt);
		return mount_failed("a tmpfs", err);
	}
	snprintf(g_mnt, sizeof(g_mnt), "%s", mnt);
	return 0;
}

/* Make an ext4 file system of `mib` MiB in a file and mount it through a
 * loop device on a fresh directory; 0, or -1 to skip. */
static int mount_ext4(int mib, char *mnt, size_t len)
{
	char img[300], cmd[600], dev[64];
	struct loop_config lc;
	int ctl, fd, n, rc;

	if (geteuid() != 0) {
		print_message("not root: cannot mount ext4: skipped\n");
		return -1;
	}
	assert_non_null(fx_tmpdir(mnt, len));
	snprintf(img, sizeof(img), "%s.img", mnt);
	fd = open(img, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)mib << 20), 0);
	/* mkfs.ext4 is e2fsprogs, in every Debian (tools/deps.sh). */
	snprintf(cmd, sizeof(cmd), "mkfs.ext4 -q -F %s >/dev/null 2>&1", img);
	rc = system(cmd);
	if (rc != 0) {
		close(fd);
		unlink(img);
		fail_msg("mkfs.ext4 failed (status %d): is e2fsprogs installed?", rc);
	}
	ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
	n = ctl >= 0 ? ioctl(ctl, LOOP_CTL_GET_FREE) : -1;
	rc = n < 0 ? errno : 0;
	if (ctl >= 0)
		close(ctl);
	if (n >= 0) {
		snprintf(dev, sizeof(dev), "/dev/loop%d", n);
		g_loop = open(dev, O_RDWR | O_CLOEXEC);
		rc = g_loop < 0 ? errno : 0;
	}
	if (!rc) {
		memset(&lc, 0, sizeof(lc));
		lc.fd = fd;
		lc.info.lo_flags = LO_FLAGS_AUTOCLEAR;
		if (ioctl(g_loop, LOOP_CONFIGURE, &lc) < 0 && ioctl(g_loop, LOOP_SET_FD, fd) < 0)
			rc = errno;
	}
	close(fd);
	unlink(img);	/* the loop device holds it */
	if (rc) {
		if (g_loop >= 0)
			close(g_loop);
		g_loop = -1;
		fx_rmtree(mnt);
		return mount_failed("a loop device", rc);
	}
	if (mount(dev, mnt, "ext4", 0, NULL) < 0) {
		int err = errno;

		ioctl(g_loop, LOOP_CLR_FD, 0);
		close(g_loop);
		g_loop = -1;
		fx_rmtree(mnt);
		return mount_failed("ext4 on a loop device", err);
	}
	snprintf(g_mnt, sizeof(g_mnt), "%s", mnt);
	return 0;
}

static kvmem_pager *open_ws(const char *dir, const kvmem_page_geom *g, int flags)
{
	return fx_open(dir, g, 1 << 20, 256 << 10, flags, 0);
}

static kvmem_page_geom geom(uint64_t *rng)
{
	kvmem_page_geom g = fx_geom(rng);

	g.n_layers = 2;
	return g;
}

/* The Nth read completion fails with EIO: fetch fails naming the page and
 * the file, returns nothing; the next fetch reads it fine. */
static void test_read_eio(void **state)
{
	uint64_t rng = g_seed, seed = fx_mix(g_seed), pages[4], bad, good;
	kvmem_page_geom g = geom(&rng);
	const void *ptr[4];
	kvmem_pager_stats st;
	char dir[256];
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 6 * g.block_tokens), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);

	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	/* Four pages in two separate runs: two read requests; the 2nd fails. */
	pages[0] = 0;
	pages[1] = 1;
	pages[2] = 6;
	pages[3] = 7;
	kvmem_pager_fault_inject(KVMEM_FAULT_READ, 2);
	assert_true(kvmem_pager_fetch(p, pages, 4, ptr) < 0);
	assert_non_null(strstr(kvmem_last_error(), "Input/output error"));
	/* The second completion fails: O_DIRECT reads complete in any order,
	 * so either run may be the one. */
	bad = strstr(kvmem_last_error(), "/pages: page 6 ") ? 6 : 0;
	good = 6 - bad;
	assert_non_null(strstr(kvmem_last_error(), bad ? "/pages: page 6 " : "/pages: page 0 "));
	assert_true(kvmem_pager_pte(p, bad)->flags & KVMEM_PTE_BAD);
	assert_false(kvmem_pager_pte(p, bad)->tiers & KVMEM_TIER_HOST);
	/* Pages that did arrive are resident but not pinned: all can leave. */
	assert_true(kvmem_pager_pte(p, good)->tiers & KVMEM_TIER_HOST);
	kvmem_pager_stats_get(p, &st);
	assert_int_equal(st.read_errors, 2);
	/* The session goes on: the same fetch now succeeds with the right bytes. */
	assert_int_equal(kvmem_pager_fetch(p, pages, 4, ptr), 0);
	for (int i = 0; i < 4; i++) {
		uint8_t want[1 << 16];

		fx_page(&g, seed, pages[i], want);
		assert_memory_equal(want, ptr[i], kvmem_page_bytes(&g));
	}
	kvmem_pager_release(p, pages, 4);
	assert_false(kvmem_pager_pte(p, bad)->flags & KVMEM_PTE_BAD);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

/* A stage-out write fails: appends go on, pages are served from memory,
 * commit is refused with the cause, and the last commit survives. */
static void test_write_eio(void **state)
{
	uint64_t rng = g_seed ^ 1, seed = fx_mix(g_seed ^ 1), committed;
	kvmem_page_geom g = geom(&rng);
	kvmem_pager_stats st;
	char dir[256];
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 3 * g.block_tokens + 4), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	committed = kvmem_pager_tokens(p);
	kvmem_pager_fault_inject(KVMEM_FAULT_WRITE, 2);
	assert_int_equal(fx_append(p, seed, 5 * g.block_tokens), 0);
	assert_true(fx_commit(p, seed, NULL, 0) < 0);
	assert_non_null(strstr(kvmem_last_error(), "Input/output error"));
	assert_non_null(strstr(kvmem_last_error(), "/pages"));
	assert_non_null(strstr(kvmem_last_error(), "last commit"));
	kvmem_pager_stats_get(p, &st);
	assert_int_equal(st.write_errors, 1);
	/* Everything appended, the failed block included, still reads. */
	assert_int_equal(fx_append(p, seed, 2 * g.block_tokens), 0);
	assert_int_equal(fx_check(p, seed, 0), 0);
	assert_int_equal(kvmem_pager_committed_tokens(p), committed);
	assert_true(kvmem_pager_close(p) < 0);

	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_tokens(p), committed);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

/* Fill the file system under dir with appends and commits: -ENOSPC with a
 * clear "No space left" error, the appended pages still read from memory,
 * the last commit intact. */
static void fill_up(const char *dir, uint64_t rng, uint64_t seed)
{
	kvmem_page_geom g = geom(&rng);
	uint64_t committed = 0;
	int rc = 0;
	kvmem_pager *p;

	p = open_ws(dir, &g, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	for (int i = 0; i < 10000 && rc == 0; i++) {
		rc = fx_append(p, seed, 2 * g.block_tokens + 3);
		if (rc == 0)
			rc = fx_commit(p, seed, NULL, 0);
		if (rc == 0)
			committed = kvmem_pager_committed_tokens(p);
	}
	print_message("full disk: %s\n", kvmem_last_error());
	assert_int_equal(rc, -ENOSPC);
	assert_int_equal(kvmem_last_errno(), ENOSPC);
	assert_non_null(strstr(kvmem_last_error(), "No space left on device"));
	assert_non_null(strstr(kvmem_last_error(), dir));
	assert_true(committed > 0);
	assert_int_equal(kvmem_pager_committed_tokens(p), committed);
	/* Later commits are refused, with the same cause; the in-memory
	 * state goes on. */
	assert_int_equal(fx_commit(p, seed, NULL, 0), -ENOSPC);
	assert_int_equal(fx_check(p, seed, 0), 0);
	assert_int_equal(kvmem_pager_close(p), -ENOSPC);

	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_tokens(p), committed);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
}

/* A 2 MiB tmpfs fills up. */
static void test_full_disk(void **state)
{
	char mnt[256], dir[300];

	if (mount_tmpfs("2M", mnt, sizeof(mnt)) < 0)
		skip();
	snprintf(dir, sizeof(dir), "%s/ws", mnt);
	fill_up(dir, g_seed ^ 2, fx_mix(g_seed ^ 2));
	assert_int_equal(umount(mnt), 0);
	g_mnt[0] = 0;
	fx_rmtree(mnt);
}

/* An 8 MiB ext4 on a loop device fills up: O_DIRECT stage-out, fallocate
 * ahead of the writes, a journal. */
static void test_full_disk_ext4(void **state)
{
	char mnt[256], dir[300];

	if (mount_ext4(8, mnt, sizeof(mnt)) < 0)
		skip();
	snprintf(dir, sizeof(dir), "%s/ws", mnt);
	fill_up(dir, g_seed ^ 6, fx_mix(g_seed ^ 6));
	assert_int_equal(umount(mnt), 0);
	g_mnt[0] = 0;
	fx_rmtree(mnt);
	close(g_loop);	/* autoclear detaches it */
	g_loop = -1;
}

/* A file system that takes O_DIRECT at open but refuses the I/O (EINVAL):
 * the pager goes on with buffered I/O, the same bytes land and read back. */
static void test_direct_refused(void **state)
{
	uint64_t rng = g_seed ^ 5, seed = fx_mix(g_seed ^ 5), pg = 1;
	kvmem_page_geom g = geom(&rng);
	const void *ptr;
	uint8_t want[1 << 16];
	char dir[256];
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP);
	assert_non_null(p);
	if (!kvmem_pager_direct(p)) {
		kvmem_pager_close(p);
		fx_rmtree(dir);
		skip();
	}
	kvmem_pager_fault_inject(KVMEM_FAULT_DIRECT, 1);
	assert_int_equal(fx_append(p, seed, 4 * g.block_tokens + 2), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_direct(p), 0);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);

	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_direct(p), 1);
	kvmem_pager_fault_inject(KVMEM_FAULT_DIRECT, 1);
	assert_int_equal(kvmem_pager_fetch(p, &pg, 1, &ptr), 0);
	assert_int_equal(kvmem_pager_direct(p), 0);
	fx_page(&g, seed, pg, want);
	assert_memory_equal(want, ptr, kvmem_page_bytes(&g));
	kvmem_pager_release(p, &pg, 1);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
	fx_rmtree(dir);
}

/* ---- durability steps ---------------------------------------------------- */
struct trace {
	char ev[64][40];
	int n;
};

static void record(void *arg, const char *event)
{
	struct trace *t = arg;

	if (t->n < 64)
		snprintf(t->ev[t->n++], sizeof(t->ev[0]), "%s", event);
}

static int find_event(const struct trace *t, const char *ev)
{
	for (int i = 0; i < t->n; i++)
		if (!strcmp(t->ev[i], ev))
			return i;
	return -1;
}

static void print_trace(const struct trace *t)
{
	for (int i = 0; i < t->n; i++)
		print_message("  %d: %s\n", i, t->ev[i]);
}

/* Item 12: creating a workspace directory syncs the directory that holds
 * it, so a commit reported durable cannot lose its directory's name. */
static void test_new_workspace_parent_synced(void **state)
{
	uint64_t rng = g_seed ^ 7, seed = fx_mix(rng);
	kvmem_page_geom g = geom(&rng);
	struct trace t = { .n = 0 };
	char top[256], dir[300];
	kvmem_pager *p;
	int parent, mani;

	assert_non_null(fx_tmpdir(top, sizeof(top)));
	snprintf(dir, sizeof(dir), "%s/ws", top);
	kvmem_pager_sync_trace(record, &t);
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, g.block_tokens + 2), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	kvmem_pager_sync_trace(NULL, NULL);
	print_trace(&t);
	parent = find_event(&t, "fsync ..");
	mani = find_event(&t, "rename manifest");
	assert_true(parent >= 0);
	assert_true(mani > parent);
	assert_int_equal(kvmem_pager_close(p), 0);

	/* Reopening an existing workspace creates nothing, syncs no parent. */
	t.n = 0;
	kvmem_pager_sync_trace(record, &t);
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE);
	kvmem_pager_sync_trace(NULL, NULL);
	assert_non_null(p);
	assert_int_equal(find_event(&t, "fsync .."), -1);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(top);
}

/* The crash rule, step by step: a commit syncs every data file, then the
 * manifest's temporary file, then renames it over the manifest, then syncs
 * the directory. (A kill -9 leaves the page cache intact, so test_crash
 * cannot see a missing fdatasync; this can.) */
static void test_commit_sync_order(void **state)
{
	static const char *const data[] = { "pages", "tokens", "index", "sums", "tail" };
	uint64_t rng = g_seed ^ 8, seed = fx_mix(rng);
	kvmem_page_geom g = geom(&rng);
	struct trace t = { .n = 0 };
	char dir[256], ev[64];
	kvmem_pager *p;
	int tmp, ren, dsync;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 3 * g.block_tokens + 5), 0);
	kvmem_pager_sync_trace(record, &t);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	kvmem_pager_sync_trace(NULL, NULL);
	print_trace(&t);
	tmp = find_event(&t, "fsync manifest.tmp");
	ren = find_event(&t, "rename manifest");
	dsync = find_event(&t, "fsync .");
	for (int i = 0; i < 5; i++) {
		int at;

		snprintf(ev, sizeof(ev), "fdatasync %s", data[i]);
		at = find_event(&t, ev);
		if (at < 0)
			fail_msg("the commit did not fdatasync %s", data[i]);
		assert_true(at < tmp);
	}
	assert_true(tmp >= 0 && tmp < ren && ren < dsync);
	assert_int_equal(dsync, t.n - 1);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

/* A sync that fails (each of the commit's seven in turn) fails the commit
 * with -EIO; up to the rename the old manifest stays, so the workspace
 * reopens at the previous commit and verifies; after the rename (the
 * directory's sync) the new commit may stand: either way it is whole. */
static void test_failed_sync_keeps_old_manifest(void **state)
{
	uint64_t rng = g_seed ^ 9, seed = fx_mix(rng);
	kvmem_page_geom g = geom(&rng);
	char dir[256];
	uint64_t committed;
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 2 * g.block_tokens + 1), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	committed = kvmem_pager_committed_tokens(p);
	assert_int_equal(kvmem_pager_close(p), 0);
	for (unsigned nth = 1; nth <= 7; nth++) {
		uint64_t now;

		p = open_ws(dir, &g, 0);
		assert_non_null(p);
		assert_int_equal(kvmem_pager_tokens(p), committed);
		assert_int_equal(fx_append(p, seed, g.block_tokens + 3), 0);
		kvmem_pager_fault_inject(KVMEM_FAULT_SYNC, nth);
		assert_int_equal(fx_commit(p, seed, NULL, 0), -EIO);
		kvmem_pager_fault_inject(KVMEM_FAULT_SYNC, 0);
		assert_non_null(strstr(kvmem_last_error(), "sync failed"));
		assert_non_null(strstr(kvmem_last_error(), "last commit"));
		assert_int_equal(kvmem_pager_committed_tokens(p), committed);
		/* Sticky: nothing later can be trusted to be durable. */
		assert_int_equal(fx_commit(p, seed, NULL, 0), -EIO);
		assert_int_equal(fx_check(p, seed, 0), 0);
		assert_int_equal(kvmem_pager_close(p), -EIO);

		p = open_ws(dir, &g, 0);
		assert_non_null(p);
		now = kvmem_pager_tokens(p);
		if (nth < 7)
			assert_int_equal(now, committed);
		else
			assert_true(now == committed || now == committed + g.block_tokens + 3);
		assert_int_equal(fx_check(p, seed, 1), 0);
		assert_int_equal(kvmem_pager_close(p), 0);
		assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
		committed = now;
	}
	fx_rmtree(dir);
}

static void test_missing_dir(void **state)
{
	uint64_t rng = g_seed ^ 3;
	kvmem_page_geom g = geom(&rng);
	char dir[256], path[400];
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(path, sizeof(path), "%s/absent", dir);
	assert_true(kvmem_pager_open(path, &g, NULL, &p) < 0);
	assert_null(p);
	assert_non_null(strstr(kvmem_last_error(), path));
	assert_non_null(strstr(kvmem_last_error(), "No such file"));

	snprintf(path, sizeof(path), "%s/no/parent", dir);
	assert_true(kvmem_pager_open(path, &g, &(kvmem_pager_opts){ .flags = KVMEM_PAGER_CREATE,
								.numa_node = -1 }, &p) < 0);
	assert_non_null(strstr(kvmem_last_error(), "cannot create"));
	assert_non_null(strstr(kvmem_last_error(), path));

	/* An empty directory is not a workspace unless asked to create one. */
	assert_true(kvmem_pager_open(dir, &g, NULL, &p) < 0);
	assert_non_null(strstr(kvmem_last_error(), "not a kvmem workspace"));
	assert_true(kvmem_workspace_verify(dir, stderr, 0) < 0);
	fx_rmtree(dir);
}

/* A read-only file system: creating fails clearly; an existing workspace
 * refuses to open for writing but opens read-only with its data intact. */
static void test_unwritable(void **state)
{
	uint64_t rng = g_seed ^ 4, seed = fx_mix(g_seed ^ 4);
	kvmem_page_geom g = geom(&rng);
	char mnt[256], dir[300];
	kvmem_pager *p;

	if (mount_tmpfs("4M", mnt, sizeof(mnt)) < 0)
		skip();
	snprintf(dir, sizeof(dir), "%s/ws", mnt);
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 2 * g.block_tokens + 1), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL), 0);

	p = open_ws(dir, &g, 0);
	assert_null(p);
	assert_non_null(strstr(kvmem_last_error(), "Read-only file system"));
	assert_non_null(strstr(kvmem_last_error(), dir));
	p = open_ws(dir, &g, KVMEM_PAGER_RDONLY);
	assert_non_null(p);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_true(kvmem_pager_append_tokens(p, (int32_t[]){ 1 }, 1) < 0);
	assert_int_equal(kvmem_pager_close(p), 0);

	snprintf(dir, sizeof(dir), "%s/new", mnt);
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE);
	assert_null(p);
	assert_non_null(strstr(kvmem_last_error(), "Read-only file system"));
	assert_int_equal(umount(mnt), 0);
	g_mnt[0] = 0;
	fx_rmtree(mnt);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_eio),
		cmocka_unit_test(test_write_eio),
		cmocka_unit_test_teardown(test_full_disk, unmount_teardown),
		cmocka_unit_test_teardown(test_full_disk_ext4, unmount_teardown),
		cmocka_unit_test(test_direct_refused),
		cmocka_unit_test(test_new_workspace_parent_synced),
		cmocka_unit_test(test_commit_sync_order),
		cmocka_unit_test(test_failed_sync_keeps_old_manifest),
		cmocka_unit_test(test_missing_dir),
		cmocka_unit_test_teardown(test_unwritable, unmount_teardown),
	};

	g_seed = test_rng_fresh_seed("test_faults");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
