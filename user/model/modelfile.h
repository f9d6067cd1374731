/* SPDX-License-Identifier: MIT */
/*
 * Opening the files of a model directory without trusting what they are.
 *
 * A model directory is often a tree of symlinks (the Hugging Face cache) and
 * sometimes a user's mistake: a FIFO where config.json should be blocks a
 * plain open() forever, a device file is not a model, and a dangling
 * model.safetensors link is not the same thing as a missing file. These
 * helpers open with O_NONBLOCK, check the type with fstat before reading a
 * byte, and name what was found.
 */
#ifndef KVMEM_MODEL_MODELFILE_H
#define KVMEM_MODEL_MODELFILE_H

#include <stddef.h>
#include <sys/stat.h>

/*
 * Open path read-only (close-on-exec, blocking mode restored) and check it
 * is a regular file; *st is its fstat. Errors name the path: -ENOENT when
 * absent ("cannot open: No such file or directory"), -ENOENT "a dangling
 * symbolic link to 'x'",
 * -ELOOP for a symlink loop, -EINVAL "a FIFO, not a regular file" (also a
 * directory, socket or device).
 */
int kvmem_mf_open(const char *path, int *fd, struct stat *st);

/* 1 when something is at path (a dangling symlink counts: opening it then
 * says so), 0 when nothing is. */
int kvmem_mf_exists(const char *path);

/* Read a whole regular file of at most max bytes into a malloc'd buffer
 * (NUL-terminated, *len without the NUL) through kvmem_mf_open. */
int kvmem_mf_read(const char *path, size_t max, char **buf, size_t *len);

#endif
