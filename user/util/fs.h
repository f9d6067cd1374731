/* SPDX-License-Identifier: MIT */
/* File-system helpers the library and the in-tree programs share (private:
 * not exported by libkvmem.so). */
#ifndef KVMEM_UTIL_FS_H
#define KVMEM_UTIL_FS_H

#include <stddef.h>
#include <stdint.h>

/* Write all len bytes of buf to fd at off (off < 0: at the file position),
 * through short writes and EINTR. 0, or -errno (errno set too; -ENOSPC when
 * the disk takes nothing). No message: the caller names the file. */
int kvmem_write_all(int fd, const void *buf, size_t len, int64_t off);
/* Read all len bytes at off into buf, through short reads and EINTR. 0, or
 * -errno (-ENODATA when the file ends first). No message either. */
int kvmem_read_all(int fd, void *buf, size_t len, uint64_t off);

/* mkdir -p: create dir and its parents (0755); fails, naming the part that
 * could not be made, or when dir exists and is not a directory. */
int kvmem_mkdir_p(const char *dir);

#endif
