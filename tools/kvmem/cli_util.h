/* SPDX-License-Identifier: MIT */
/* Small helpers the kvmem subcommands share: numbers in and out, a clock. */
#ifndef KVMEM_TOOLS_CLI_UTIL_H
#define KVMEM_TOOLS_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* 8190735360 -> "8.19e9"; returns buf. */
const char *cli_fmt_sci(char *buf, size_t len, double v);
/* 5253456 -> "5.25 MB" (decimal units); returns buf. */
const char *cli_fmt_bytes(char *buf, size_t len, double v);

struct kvmem_config;
/* The geometry lines `kvmem generate --dry-run` and `kvmem info` share:
 * layers .. parameters, then (second call) the KV bytes per token and at
 * the window. */
void cli_print_geometry(const struct kvmem_config *c);
void cli_print_kv(const struct kvmem_config *c);

/* Seconds on the monotonic clock, for timing. */
double cli_now_s(void);

/*
 * Option values. Each parses all of s or fails: -1 after one line on
 * stderr, "<who>: <opt> wants ..., not '<s>'" (who: "kvmem run").
 */
int cli_parse_i64(const char *who, const char *opt, const char *s, int64_t lo, int64_t hi,
		  int64_t *out);
int cli_parse_long(const char *who, const char *opt, const char *s, long lo, long hi,
		   long *out);
/* Decimal, 0x hex or 0 octal; a leading '-' is refused. */
int cli_parse_u64(const char *who, const char *opt, const char *s, uint64_t *out);
/* A float; NaN and values out of float range are refused. */
int cli_parse_float(const char *who, const char *opt, const char *s, float *out);

#endif
