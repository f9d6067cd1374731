// SPDX-License-Identifier: MIT
/*
 * kvmem_host_writable: what a backend asks before it pins host memory (the
 * cuda backend pins a read-only mapping, such as the kernel module's
 * window, with cudaHostRegisterReadOnly). Writable, read-only, partly
 * read-only, not mapped, and ranges over several mappings.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "util/hostmem.h"

/* The unmapped checks need holes nothing else maps while the test looks at
 * them: a mapping the kernel places for us goes at the top of the mmap area,
 * where the next mapping anyone in the process makes (the sanitizer's, most
 * likely, while the check reads /proc/self/maps) lands in the hole just
 * freed (seen once in an ASan run: the hole mapped again before the check,
 * 1 in place of -ENOENT). Far below that area (48 TiB, above
 * ASan's shadow and below its allocator), the kernel's top-down search never
 * reaches the hole. A hint, not MAP_FIXED: where it is taken, the test still
 * runs. */
#define FAR_HINT ((void *)(uintptr_t)0x300000000000ull)

static void test_writable_and_read_only(void **state)
{
	const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	char *m = mmap(FAR_HINT, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		       0);
	int on_heap;

	(void)state;
	assert_true(m != MAP_FAILED);
	assert_int_equal(kvmem_host_writable(m, 4 * pg), 1);
	assert_int_equal(kvmem_host_writable(m + 10, 1), 1);
	assert_int_equal(kvmem_host_writable(m, 0), 1);
	/* The second page read-only: the kernel splits the mapping in three;
	 * any range touching that page is not writable. */
	assert_int_equal(mprotect(m + pg, pg, PROT_READ), 0);
	assert_int_equal(kvmem_host_writable(m, pg), 1);
	assert_int_equal(kvmem_host_writable(m + pg, pg), 0);
	assert_int_equal(kvmem_host_writable(m + pg - 1, 2), 0);
	assert_int_equal(kvmem_host_writable(m, 4 * pg), 0);
	assert_int_equal(kvmem_host_writable(m + 2 * pg, 2 * pg), 1);
	/* The last page unmapped: a range reaching it is not all mapped. */
	assert_int_equal(munmap(m + 3 * pg, pg), 0);
	assert_int_equal(kvmem_host_writable(m + 2 * pg, 2 * pg), -ENOENT);
	assert_int_equal(kvmem_host_writable(m + 3 * pg, 1), -ENOENT);
	assert_int_equal(munmap(m, 3 * pg), 0);
	assert_int_equal(kvmem_host_writable(m, 1), -ENOENT);
	/* Ordinary memory of the process. */
	on_heap = kvmem_host_writable(&on_heap, sizeof(on_heap));
	assert_int_equal(on_heap, 1);
	/* The program's text is mapped read-only (and executable). */
	assert_int_equal(kvmem_host_writable((const void *)(uintptr_t)test_writable_and_read_only,
					     1), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_writable_and_read_only),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
