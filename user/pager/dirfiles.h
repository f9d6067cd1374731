/* SPDX-License-Identifier: MIT */
/*
 * A workspace directory's file rules, for the readers that work on the
 * directory without a pager of their own (the kernel module's client, the
 * store's tools): how its files are opened, the writer's lock, the
 * manifest summed up. Private to the library.
 */
#ifndef KVMEM_PAGER_DIRFILES_H
#define KVMEM_PAGER_DIRFILES_H

#include "kvmem/pager.h"

/* Open DIR/name (under dirfd) without following a link or blocking: fd, or
 * -EBADMSG naming what it is when not a regular file, -errno otherwise. */
int ws_open_file(int dirfd, const char *dir, const char *name, int flags);
/* Take the writer's lock (DIR/lock, pid inside): its fd, or -EBUSY naming
 * the holder's pid. ws_lock_take only takes it (creating DIR/lock when
 * absent, writing nothing); ws_lock_claim then writes this process's pid
 * into it; ws_lock does both. */
int ws_lock(int dirfd, const char *dir);
int ws_lock_take(int dirfd, const char *dir);
int ws_lock_claim(int fd, const char *dir);
/* The manifest of the workspace under dirfd, summed up (no data file is
 * read); -errno with a message naming the file. */
int mf_info_at(int dirfd, const char *dir, kvmem_workspace_info *wi);

#endif
