/* SPDX-License-Identifier: MIT */
/* A scratch directory for a test program's files. */
#ifndef KVMEM_TEST_TMPDIR_H
#define KVMEM_TEST_TMPDIR_H

#include <stddef.h>

/* Create a fresh /tmp/kvmem-<name>.XXXXXX and write its path into dir
 * (len bytes); 0, or -1 when it does not fit or cannot be made. */
int test_tmpdir_make(char *dir, size_t len, const char *name);
/* Remove dir and everything below it; 0 on success. */
int test_tmpdir_remove(const char *dir);

#endif
