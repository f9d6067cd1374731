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
#include <unistd.h>
#include <cmocka.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
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
	assert_int_equal(kvmem_kmod_open(&f, &o, &k), -ENOENT);
	assert_null(k);
	assert_int_equal(kvmem_last_errno(), ENOENT);
	assert_non_null(strstr(kvmem_last_error(), "/nonexistent/kvmem"));
	assert_non_null(strstr(kvmem_last_error(), "kvmem.ko loaded"));
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
		cmocka_unit_test(test_verdict_pick),
	};

	g_seed = test_rng_fresh_seed("test_kmod_client");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
