/* SPDX-License-Identifier: MIT */
/* File-system helpers (private to kvmem: the library and its command). */
#ifndef KVMEM_UTIL_FS_H
#define KVMEM_UTIL_FS_H

/* mkdir -p: create dir and its parents (0755); fails, naming the part that
 * could not be made, or when dir exists and is not a directory. */
int kvmem_mkdir_p(const char *dir);

#endif
