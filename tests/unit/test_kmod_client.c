// SPDX-License-Identifier: MIT
/*
 * The kernel module's client library (user/kmod) where no module is loaded,
 * as on the build machine: every failure is an error code with a message
 * naming the device or directory, nothing crashes, nothing leaks (ASan).
 * The library against the real module runs in the VM (tests/vm/).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "kvmem/store.h"
#include "helpers/test_model.h"
#include "helpers/test_tmpdir.h"

static uint64_t g_seed;

static kvmem_kmod_files some_files(void)
{
	kvmem_kmod_files f = { .pages_fd = -1, .sums_fd = -1, .page_bytes = 4096,
			       .page_stride = 4096, .n_layers = 2, .page_count = 8 };
	return f;
}

static void test_no_device(void **state)
{
	kvmem_kmod_files f = some_files();
	kvmem_kmod_opts o;
	kvmem_kmod *k = (kvmem_kmod *)&f;

	(void)state;
	kvmem_kmod_opts_default(&o);
	assert_int_equal(o.numa_node, -1);
	assert_true(o.host_cap > 0);
	o.dev = "/nonexistent/kvmem";
	assert_int_equal(kvmem_kmod_open(&f, &o, &k), -ENODEV);
	assert_null(k);
	assert_int_equal(kvmem_last_errno(), ENODEV);
	assert_non_null(strstr(kvmem_last_error(), "/nonexistent/kvmem"));
	assert_non_null(strstr(kvmem_last_error(), "the kernel module is not loaded"));
	assert_int_equal(kvmem_kmod_probe("/nonexistent/kvmem"), -ENODEV);
	assert_non_null(strstr(kvmem_last_error(), "the kernel module is not loaded"));
	/* A node that is there but not openable is not "not loaded". */
	assert_true(kvmem_kmod_probe("/") < 0);
	assert_int_not_equal(kvmem_last_errno(), ENODEV);
}

/* A character device that is not kvmem: the setup ioctl is refused. */
static void test_not_kvmem(void **state)
{
	kvmem_kmod_files f = some_files();
	kvmem_kmod_opts o;
	kvmem_kmod *k = NULL;
	int err;

	(void)state;
	kvmem_kmod_opts_default(&o);
	o.dev = "/dev/null";
	err = kvmem_kmod_open(&f, &o, &k);
	assert_true(err < 0);
	assert_null(k);
	assert_non_null(strstr(kvmem_last_error(), "/dev/null: setup"));
	assert_non_null(strstr(kvmem_last_error(), "8 pages of 4096 bytes"));
}

static void test_workspace_errors(void **state)
{
	char dir[256], sub[300];
	kvmem_kmod *k = NULL;
	kvmem_pager *p;
	kvmem_pager_opts po;
	kvmem_page_geom g = { .fingerprint = 77, .n_layers = 2, .n_heads = 1, .n_kv_heads = 1,
			      .head_dim = 16, .block_tokens = 16, .dtype = KVMEM_DTYPE_F32 };

	(void)state;
	assert_int_equal(test_tmpdir_make(dir, sizeof(dir), "kmod-client"), 0);
	/* Not a workspace. */
	assert_true(kvmem_kmod_open_workspace(dir, NULL, &k) < 0);
	assert_null(k);
	assert_non_null(strstr(kvmem_last_error(), dir));
	/* A workspace with no committed block has nothing to serve. */
	snprintf(sub, sizeof(sub), "%s/ws", dir);
	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_CREATE;
	po.host_cap = 1 << 20;
	po.stage_bytes = 1 << 20;
	assert_int_equal(kvmem_pager_open(sub, &g, &po, &p), 0);
	assert_int_equal(kvmem_pager_commit(p, NULL, NULL, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(kvmem_kmod_open_workspace(sub, NULL, &k), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "no committed block"));
	assert_int_equal(test_tmpdir_remove(dir), 0);
}

/* A workspace of `blocks` committed blocks at dir (its pager closed). */
static void make_ws(const char *dir, int blocks)
{
	kvmem_page_geom g = { .fingerprint = 78, .n_layers = 2, .n_heads = 1, .n_kv_heads = 1,
			      .head_dim = 16, .block_tokens = 16, .dtype = KVMEM_DTYPE_F32 };
	static char page[2 * 16 * 16 * 4];
	const void *layers[2] = { page, page };
	kvmem_pager_opts po;
	kvmem_pager *p;

	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_CREATE;
	po.host_cap = 1 << 20;
	po.stage_bytes = 1 << 20;
	assert_int_equal(kvmem_pager_open(dir, &g, &po, &p), 0);
	for (int b = 0; b < blocks; b++) {
		int32_t ids[16] = { 0 };

		assert_int_equal(kvmem_pager_append_tokens(p, ids, 16), 0);
		assert_int_equal(kvmem_pager_append_block(p, b, layers, NULL), 0);
	}
	assert_int_equal(kvmem_pager_commit(p, NULL, NULL, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
}

/* The workspace's files are opened as the pager opens them: a symbolic
 * link in place of pages or sums is refused naming it (not followed), before
 * the device is even opened. */
static void test_workspace_files_not_followed(void **state)
{
	const char *names[] = { "pages", "sums" };
	char dir[256], ws[300], path[400], other[400];
	kvmem_kmod_opts o;
	kvmem_kmod *k = NULL;

	(void)state;
	kvmem_kmod_opts_default(&o);
	o.dev = "/nonexistent/kvmem";
	assert_int_equal(test_tmpdir_make(dir, sizeof(dir), "kmod-client"), 0);
	snprintf(ws, sizeof(ws), "%s/ws", dir);
	make_ws(ws, 3);
	for (int i = 0; i < 2; i++) {
		for (int rdonly = 0; rdonly < 2; rdonly++) {
			o.flags = rdonly ? KVMEM_KMOD_RDONLY : 0;
			snprintf(path, sizeof(path), "%s/%s", ws, names[i]);
			snprintf(other, sizeof(other), "%s/%s.real", dir, names[i]);
			assert_int_equal(rename(path, other), 0);
			assert_int_equal(symlink(other, path), 0);
			assert_int_equal(kvmem_kmod_open_workspace(ws, &o, &k), -EBADMSG);
			assert_null(k);
			assert_non_null(strstr(kvmem_last_error(), path));
			assert_non_null(strstr(kvmem_last_error(), "symbolic link"));
			/* The real file back: on to the device, which is absent. */
			assert_int_equal(unlink(path), 0);
			assert_int_equal(rename(other, path), 0);
			assert_int_equal(kvmem_kmod_open_workspace(ws, &o, &k), -ENODEV);
		}
	}
	assert_int_equal(test_tmpdir_remove(dir), 0);
}

/* One writer at a time (DIR/lock): a writable open of a workspace a pager
 * writes is refused (-EBUSY naming the holder); a read-only open takes no
 * lock and gets as far as the device; the kmod page source over the
 * writer's pager is refused only for the absent module. */
static void test_workspace_lock(void **state)
{
	kvmem_page_geom g = { .fingerprint = 78, .n_layers = 2, .n_heads = 1, .n_kv_heads = 1,
			      .head_dim = 16, .block_tokens = 16, .dtype = KVMEM_DTYPE_F32 };
	char dir[256], ws[300];
	kvmem_page_source src = { 0 };
	kvmem_pager_opts po;
	kvmem_kmod_opts o;
	kvmem_kmod *k = NULL;
	kvmem_pager *p;

	(void)state;
	kvmem_kmod_opts_default(&o);
	o.dev = "/nonexistent/kvmem";
	assert_int_equal(test_tmpdir_make(dir, sizeof(dir), "kmod-client"), 0);
	snprintf(ws, sizeof(ws), "%s/ws", dir);
	make_ws(ws, 2);
	kvmem_pager_opts_default(&po);
	po.host_cap = 1 << 20;
	po.stage_bytes = 1 << 20;
	assert_int_equal(kvmem_pager_open(ws, &g, &po, &p), 0);
	assert_int_equal(kvmem_kmod_open_workspace(ws, &o, &k), -EBUSY);
	assert_non_null(strstr(kvmem_last_error(), "another writer"));
	o.flags = KVMEM_KMOD_RDONLY;
	assert_int_equal(kvmem_kmod_open_workspace(ws, &o, &k), -ENODEV);
	assert_int_equal(kvmem_kmod_open_pager(p, &o, &k), -ENODEV);
	assert_int_equal(kvmem_page_source_kmod(&src, p, &o), -ENODEV);
	assert_null(src.ops);
	assert_non_null(strstr(kvmem_last_error(), "the kernel module is not loaded"));
	/* The pager still writes: the refused opens took nothing from it. */
	assert_int_equal(kvmem_pager_commit(p, NULL, NULL, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	/* Without the writer, a writable open gets as far as the device too. */
	o.flags = 0;
	assert_int_equal(kvmem_kmod_open_workspace(ws, &o, &k), -ENODEV);
	assert_int_equal(test_tmpdir_remove(dir), 0);
}

/* kvmem_workspace_open with pager "kmod" where no module is loaded: -ENODEV
 * and nothing created; an unknown pager: -EINVAL. */
static void test_workspace_pager_kmod(void **state)
{
	kvmem_config c = test_model_config(2, 32, 2, 1, 16, 64, 100, 0);
	kvmem_model *m = test_model_random(&c, g_seed);
	kvmem_workspace_opts wo = { .pager = "kmod" };
	kvmem_workspace *w = NULL;
	char dir[256], ws[300];
	struct stat sb;

	(void)state;
	assert_non_null(m);
	assert_int_equal(test_tmpdir_make(dir, sizeof(dir), "kmod-client"), 0);
	snprintf(ws, sizeof(ws), "%s/ws", dir);
	if (kvmem_kmod_probe(NULL) == 0) {
		print_message("/dev/kvmem opens here: the refusal is not tested\n");
	} else {
		assert_int_equal(kvmem_workspace_open(ws, m, &wo, &w), -ENODEV);
		assert_null(w);
		assert_non_null(strstr(kvmem_last_error(), "the kernel module is not loaded"));
		assert_non_null(strstr(kvmem_last_error(), ws));
		assert_int_equal(stat(ws, &sb), -1);
	}
	wo.pager = "nvme";
	assert_int_equal(kvmem_workspace_open(ws, m, &wo, &w), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "'nvme'"));
	assert_int_equal(stat(ws, &sb), -1);
	wo.pager = "uring";
	assert_int_equal(kvmem_workspace_open(ws, m, &wo, &w), 0);
	assert_string_equal(kvmem_workspace_source(w)->ops->name, "pager");
	assert_null(kvmem_page_source_kmod_client(kvmem_workspace_source(w)));
	{
		struct kvmem_ioc_stats st;

		assert_int_equal(kvmem_page_source_kmod_stats(kvmem_workspace_source(w), &st),
				 -EINVAL);
	}
	assert_int_equal(kvmem_workspace_close(w), 0);
	test_model_free(m);
	assert_int_equal(test_tmpdir_remove(dir), 0);
}

/* The verdict rule the module applies, on random contexts. */
static void test_verdict_pick(void **state)
{
	uint64_t rng = g_seed;

	(void)state;
	for (int i = 0; i < 2000; i++) {
		struct kvmem_reclaim_ctx c;
		uint32_t want;

		memset(&c, 0, sizeof(c));
		c.n_candidates = 1 + test_rng_next(&rng) % KVMEM_RECLAIM_MAX;
		switch (test_rng_next(&rng) % 3) {
		case 0:
			c.verdict = KVMEM_VERDICT_DEFAULT;
			want = 0;
			break;
		case 1:
			c.verdict = test_rng_next(&rng) % c.n_candidates;
			want = c.verdict;
			break;
		default:
			c.verdict = c.n_candidates + test_rng_next(&rng) % 1000;
			want = 0;
			break;
		}
		assert_int_equal(kvmem_kmod_verdict_pick(&c), want);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_device),
		cmocka_unit_test(test_not_kvmem),
		cmocka_unit_test(test_workspace_errors),
		cmocka_unit_test(test_workspace_files_not_followed),
		cmocka_unit_test(test_workspace_lock),
		cmocka_unit_test(test_workspace_pager_kmod),
		cmocka_unit_test(test_verdict_pick),
	};

	g_seed = test_rng_fresh_seed("test_kmod_client");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
