/* SPDX-License-Identifier: MIT */
/*
 * kvmem — a tiered KV-state pager for long-running LLM agents.
 *
 * Conventions of the whole library:
 *  - functions that can fail return 0 (or a count) on success and -1 on
 *    failure; kvm_last_error() then holds a message that names the file,
 *    the object and what is wrong. The message is per thread.
 *  - all public names start with kvm_ / KVM_.
 */
#ifndef KVMEM_KVMEM_H
#define KVMEM_KVMEM_H

#include <stddef.h>
#include <stdint.h>

#define KVM_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* The last error set on this thread ("" if none). */
const char *kvm_last_error(void);

/* Set the error message (printf-style); returns -1 so callers can
 * `return kvm_error("...")`. */
int kvm_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prefix the current message: "<prefix>: <old message>". Returns -1. */
int kvm_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Where kvmem keeps its data when the user names no directory:
 * $KVMEM_HOME, else $XDG_DATA_HOME/kvmem, else ~/.local/share/kvmem.
 * Writes into buf; returns buf or NULL if it does not fit. */
char *kvm_data_dir(char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
