/* SPDX-License-Identifier: MIT */
/*
 * librados, opened at first use (dlopen of librados.so.2), as the CUDA
 * backend opens cuBLASLt: a process that never names a rados:// workspace
 * never loads Ceph's libraries, libkvmem.so does not depend on them, and
 * the static CLI builds without them. The calls are typed from
 * <rados/librados.h> (librados-dev) at build time; without that header the
 * RADOS store is not built and rados:// names are refused, saying why.
 */
#ifndef KVMEM_PAGER_RADOS_DL_H
#define KVMEM_PAGER_RADOS_DL_H

#if defined(__has_include)
#if __has_include(<rados/librados.h>) && !defined(KVMEM_NO_RADOS)
#include <rados/librados.h>
#define KVMEM_HAVE_RADOS 1
#endif
#endif

#ifdef KVMEM_HAVE_RADOS
/* Every librados call the store makes. */
#define KVMEM_RADOS_CALLS(X)							\
	X(rados_create2) X(rados_conf_read_file) X(rados_conf_parse_argv)		\
	X(rados_conf_set) X(rados_conf_get) X(rados_connect) X(rados_shutdown)	\
	X(rados_ioctx_create) X(rados_ioctx_destroy) X(rados_ioctx_set_namespace)	\
	X(rados_read) X(rados_stat) X(rados_getxattr) X(rados_remove)		\
	X(rados_aio_create_completion2) X(rados_aio_release)				\
	X(rados_aio_get_return_value) X(rados_aio_wait_for_complete)		\
	X(rados_aio_read) X(rados_aio_write) X(rados_aio_write_full)		\
	X(rados_lock_exclusive) X(rados_unlock) X(rados_blocklist_add)		\
	X(rados_getaddrs) X(rados_buffer_free) X(rados_wait_for_latest_osdmap)	\
	X(rados_create_write_op) X(rados_release_write_op) X(rados_write_op_exec)	\
	X(rados_write_op_cmpxattr) X(rados_write_op_write_full)			\
	X(rados_write_op_setxattr) X(rados_write_op_rmxattr)			\
	X(rados_write_op_operate) X(rados_version)

struct kvmem_rados_lib {
#define KVMEM_RADOS_FIELD(fn) __typeof__(fn) *fn;
	KVMEM_RADOS_CALLS(KVMEM_RADOS_FIELD)
#undef KVMEM_RADOS_FIELD
};

/* The loaded calls (valid after kvmem_rados_load() returned 0). */
extern struct kvmem_rados_lib kvmem_rados;
/* Load librados.so.2 once; 0, or -ENOPKG with a message naming `who` and
 * the package to install. Thread-safe. */
int kvmem_rados_load(const char *who);
#endif

#endif
