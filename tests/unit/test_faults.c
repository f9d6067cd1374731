// SPDX-License-Identifier: MIT
/*
 * Faults: a read error injected into the io_uring path, a failed write, a
 * full disk (a 2 MiB tmpfs the test mounts), a missing or unwritable
 * directory. Each gives a clear error naming the file; the in-memory state
 * stays usable; committed data stays intact.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager_fixture.h"

static uint64_t g_seed;
static char g_mnt[256];		/* mounted by a test; undone even when it fails */

static int unmount_teardown(void **state)
{
	if (g_mnt[0]) {
		umount2(g_mnt, MNT_DETACH);
		fx_rmtree(g_mnt);
		g_mnt[0] = 0;
	}
	return 0;
}

/* Mount a tmpfs of `size` on a fresh directory; 0, or -1 to skip. */
static int mount_tmpfs(const char *size, char *mnt, size_t len)
{
	char opt[64];

	if (geteuid() != 0 || !fx_tmpdir(mnt, len))
		return -1;
	snprintf(opt, sizeof(opt), "size=%s", size);
	if (mount("kvmem-test", mnt, "tmpfs", 0, opt) < 0) {
		print_message("cannot mount a tmpfs (%s): skipped\n", strerror(errno));
		fx_rmtree(mnt);
		return -1;
	}
	snprintf(g_mnt, sizeof(g_mnt), "%s", mnt);
	return 0;
}

static kvmem_pager *open_ws(const char *dir, const kvmem_page_geom *g, int flags)
{
	kvmem_pager_opts o;
	kvmem_pager *p = NULL;

	kvmem_pager_opts_default(&o);
	o.host_cap = 1 << 20;
	o.stage_bytes = 256 << 10;
	o.flags = flags;
	if (kvmem_pager_open(dir, g, &o, &p) < 0)
		print_message("open %s: %s\n", dir, kvmem_last_error());
	return p;
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
	uint64_t rng = g_seed, seed = fx_mix(g_seed), pages[4];
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
	assert_non_null(strstr(kvmem_last_error(), "/pages: page 6 "));
	assert_true(kvmem_pager_pte(p, 6)->flags & KVMEM_PTE_BAD);
	assert_false(kvmem_pager_pte(p, 6)->tiers & KVMEM_TIER_HOST);
	/* Pages that did arrive are resident but not pinned: all can leave. */
	assert_true(kvmem_pager_pte(p, 0)->tiers & KVMEM_TIER_HOST);
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
	assert_false(kvmem_pager_pte(p, 6)->flags & KVMEM_PTE_BAD);
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

/* A 2 MiB file system fills up: a clear "No space left" error, the
 * appended pages still read from memory, the last commit intact. */
static void test_full_disk(void **state)
{
	uint64_t rng = g_seed ^ 2, seed = fx_mix(g_seed ^ 2), committed = 0;
	kvmem_page_geom g = geom(&rng);
	char mnt[256], dir[300];
	int rc = 0;
	kvmem_pager *p;

	if (mount_tmpfs("2M", mnt, sizeof(mnt)) < 0)
		skip();
	snprintf(dir, sizeof(dir), "%s/ws", mnt);
	p = open_ws(dir, &g, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	for (int i = 0; i < 10000 && rc == 0; i++) {
		rc = fx_append(p, seed, 2 * g.block_tokens + 3);
		if (rc == 0)
			rc = fx_commit(p, seed, NULL, 0);
		if (rc == 0)
			committed = kvmem_pager_committed_tokens(p);
	}
	assert_true(rc < 0);
	print_message("full disk: %s\n", kvmem_last_error());
	assert_non_null(strstr(kvmem_last_error(), "No space left on device"));
	assert_non_null(strstr(kvmem_last_error(), dir));
	assert_true(committed > 0);
	assert_int_equal(kvmem_pager_committed_tokens(p), committed);
	/* Later commits are refused; the in-memory state goes on. */
	assert_true(fx_commit(p, seed, NULL, 0) < 0);
	assert_int_equal(fx_check(p, seed, 0), 0);
	kvmem_pager_close(p);

	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_tokens(p), committed);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
	assert_int_equal(umount(mnt), 0);
	g_mnt[0] = 0;
	fx_rmtree(mnt);
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
		cmocka_unit_test(test_direct_refused),
		cmocka_unit_test(test_missing_dir),
		cmocka_unit_test_teardown(test_unwritable, unmount_teardown),
	};

	g_seed = test_rng_fresh_seed("test_faults");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
