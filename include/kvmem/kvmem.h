/* SPDX-License-Identifier: MIT */
/*
 * kvmem — a tiered KV-state pager for long-running LLM agents.
 *
 * Conventions of the whole library:
 *  - a function that can fail returns 0 (or a count) on success and a
 *    negative errno value on failure: -ENOMEM, -EINVAL (a bad argument or
 *    option), -EIO (a read or write failed), -EBADMSG (a checksum or format
 *    check failed: corrupt or torn data), -ENOENT, -EEXIST, -ENOTDIR,
 *    -EBUSY (another process holds the workspace), -ENOSPC, -ESTALE (the
 *    data belongs to another model, geometry or version), -ENOTSUP.
 *    kvmem_last_errno() gives the same code, kvmem_last_error() a message
 *    that names the file, the object and what is wrong. Both are per
 *    thread. Branch on the code, never on the message.
 *  - all public names start with kvmem_ / KVMEM_.
 */
#ifndef KVMEM_KVMEM_H
#define KVMEM_KVMEM_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVMEM_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

/* The last error set on this thread ("" if none). */
const char *kvmem_last_error(void);
/* Its code, a positive errno value (0 if none). */
int kvmem_last_errno(void);

/* Set the error: code err (a positive errno value) and a printf-style
 * message. Returns -err, so callers can `return kvmem_error(EINVAL, "...")`. */
int kvmem_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix the current message: "<prefix>: <old message>". The code stays;
 * returns -code. */
int kvmem_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* -code of the error already set (-EIO if none): how a caller passes on a
 * failure whose message the callee wrote. */
int kvmem_fail(void);
void kvmem_error_clear(void);

/* Element types of KV pages and views (stored in workspace manifests: the
 * values are part of the format). KVMEM_DTYPE_FP8: e4m3 bytes with a
 * power-of-two fp32 scale per row of head_dim values (a token in a KV
 * head; kernels/kernels_fp8.h, Documentation/formats.md "fp8 pages"). */
enum kvmem_dtype { KVMEM_DTYPE_F32 = 1, KVMEM_DTYPE_BF16 = 2, KVMEM_DTYPE_F16 = 3,
		   KVMEM_DTYPE_FP8 = 4 };
size_t kvmem_dtype_bytes(uint32_t dtype);	/* 0 when unknown; fp8: 1, scales aside */
const char *kvmem_dtype_name(uint32_t dtype);	/* "f32", "bf16", "f16", "fp8", "?" */

/* Where kvmem keeps its data when the user names no directory:
 * $KVMEM_HOME, else $XDG_DATA_HOME/kvmem, else ~/.local/share/kvmem.
 * Writes into buf; returns buf or NULL if it does not fit. */
char *kvmem_data_dir(char *buf, size_t len);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
