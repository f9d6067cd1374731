// SPDX-License-Identifier: MIT
/*
 * The NCCL loader (user/backend/cuda_nccl.c, nccl_dl.h): opened on first
 * use, a refusal naming the library when it is absent or is not NCCL,
 * NVLink multicast forced off, and on a machine with GPUs a sum all-reduce
 * over them from one process, every element checked.
 *
 * The loader lives in libkvmem_cuda.a: in a build without CUDA (no nvcc,
 * or the sanitizer build) its symbols are absent and the test skips.
 * KVMEM_TEST_TP_RANKS=N runs the all-reduce over N GPUs (default: every
 * GPU here); without a GPU it checks the refusal instead.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/nccl_dl.h"
#include "kvmem/kvmem.h"

/* Weak: present only when libkvmem_cuda.a is linked. */
extern int kvmem_nccl_open(const char *path, int *version) __attribute__((weak));
extern int kvmem_nccl_load(void) __attribute__((weak));
extern int kvmem_nccl_selftest(int ranks, size_t count, kvmem_nccl_result *out)
	__attribute__((weak));
extern int kvmem_cuda_device_count(void) __attribute__((weak));

static int have_loader(void)
{
	if (kvmem_nccl_open && kvmem_nccl_selftest && kvmem_cuda_device_count)
		return 1;
	print_message("built without CUDA: no NCCL loader to test\n");
	return 0;
}

static void test_absent_library(void **state)
{
	int v = -1;

	if (!have_loader())
		skip();
	setenv("NCCL_NVLS_ENABLE", "1", 1);
	assert_int_equal(kvmem_nccl_open("/nonexistent/libnccl.so.2", &v), -ENOPKG);
	if (!strstr(kvmem_last_error(), "cannot open /nonexistent/libnccl.so.2"))
		fail_msg("message: %s", kvmem_last_error());
	/* Forced off even when the open fails and the caller said 1. */
	assert_string_equal(getenv("NCCL_NVLS_ENABLE"), "0");
	/* A library that is not NCCL. */
	assert_int_equal(kvmem_nccl_open("libm.so.6", &v), -ENOPKG);
	if (!strstr(kvmem_last_error(), "libm.so.6 has no ncclGetVersion"))
		fail_msg("message: %s", kvmem_last_error());
	/* The environment's choice is taken the same way. */
	setenv("KVMEM_NCCL_LIBRARY", "/nonexistent/x.so", 1);
	assert_int_equal(kvmem_nccl_open(NULL, &v), -ENOPKG);
	if (!strstr(kvmem_last_error(), "cannot open /nonexistent/x.so") ||
	    !strstr(kvmem_last_error(), "named by KVMEM_NCCL_LIBRARY"))
		fail_msg("message: %s", kvmem_last_error());
	unsetenv("KVMEM_NCCL_LIBRARY");
	/* The default lookup's refusal says where it looked: only checkable
	 * where there is no NCCL, which the loader cannot fake. */
}

static void test_load(void **state)
{
	int v = 0;

	if (!have_loader())
		skip();
	setenv("NCCL_NVLS_ENABLE", "1", 1);
	if (kvmem_nccl_open(NULL, &v)) {
		print_message("NCCL not found here: %s\n", kvmem_last_error());
		skip();
	}
	print_message("NCCL %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
	assert_true(v >= 20000 && v < 30000);
	assert_string_equal(getenv("NCCL_NVLS_ENABLE"), "0");
	assert_int_equal(kvmem_nccl_load(), 0);
	assert_int_equal(kvmem_nccl_load(), 0);	/* once */
}

static void test_allreduce(void **state)
{
	kvmem_nccl_result r;
	const char *e = getenv("KVMEM_TEST_TP_RANKS");
	int gpus, ranks;

	if (!have_loader())
		skip();
	gpus = kvmem_cuda_device_count();
	if (gpus <= 0) {
		assert_int_equal(kvmem_nccl_selftest(1, 1024, &r), -ENODEV);
		assert_non_null(strstr(kvmem_last_error(), "1 GPUs asked for, 0 here"));
		print_message("no GPU here: the all-reduce runs on a GPU machine\n");
		return;
	}
	ranks = e && *e ? atoi(e) : gpus;
	assert_int_equal(kvmem_nccl_selftest(gpus + 1, 1024, &r), -ENODEV);
	assert_non_null(strstr(kvmem_last_error(), "GPUs asked for"));
	for (size_t count = 1; count <= (64u << 20); count *= 64) {
		if (kvmem_nccl_selftest(ranks, count, &r))
			fail_msg("%s", kvmem_last_error());
		print_message("NCCL %d, %d GPUs: all-reduce of %zu floats %.1f us, bus %.1f GB/s "
			      "(init %.2f s)\n", r.version, r.ranks, count, r.us, r.busbw_gbps,
			      r.init_s);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_absent_library),
		cmocka_unit_test(test_load),
		cmocka_unit_test(test_allreduce),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
