/* SPDX-License-Identifier: MIT */
/* Small helpers the kvmem subcommands share: numbers in and out, a clock. */
#ifndef KVMEM_TOOLS_CLI_UTIL_H
#define KVMEM_TOOLS_CLI_UTIL_H

#include <getopt.h>
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

/* --ceph-conf PATH, for rados://POOL/NAME workspaces: the cluster's
 * configuration, as CEPH_CONF names it for Ceph's own tools (it sets
 * CEPH_CONF); the client's name and keyring come from CEPH_ARGS
 * (--id NAME --keyring FILE), as for those tools. */
#define CLI_CEPH_CONF_HELP \
	"  --ceph-conf PATH    the Ceph cluster of rados://POOL/NAME workspaces (else\n" \
	"                      $CEPH_CONF; client and keyring from $CEPH_ARGS)\n"
void cli_ceph_conf(const char *path);

/* Seconds on the monotonic clock, for timing. */
double cli_now_s(void);

/*
 * Options: every subcommand reads its argv with getopt_long over a table of
 * long options ending in { "help", no_argument, NULL, 'h' } (-h works too),
 * through cli_getopt, so every command spells its errors the same way:
 *
 *	cli_getopt_reset();
 *	while ((c = cli_getopt("kvmem run", argc, argv, opts)) != -1)
 *		switch (c) {
 *		case 'h': usage(stdout); return 0;
 *		case '?': return EXIT_USAGE;	// the message is printed
 *		...
 *		}
 *
 * Returns the option's val; -1 after the last option (operands are moved
 * after the options: argv[optind..argc) are they); '?' after one line on
 * stderr: "<who>: unknown option '--x' (<who> --help)", "<who>: --model
 * needs a value", "<who>: --json takes no value".
 */
void cli_getopt_reset(void);
int cli_getopt(const char *who, int argc, char **argv, const struct option *opts);
/* The same with short options besides -h (getopt's spelling: "q" for -q),
 * for the few a command keeps (kvmem verify -q). */
int cli_getopt_short(const char *who, int argc, char **argv, const char *shorts,
		     const struct option *opts);
/* The option cli_getopt last returned, as "--name" (for value messages). */
extern char cli_optname[64];
/* After the options of a command that takes no operands: 0, or -1 after
 * "<who>: unexpected argument 'x' (<who> --help)" on stderr. */
int cli_no_operands(const char *who, int argc, char **argv);

/*
 * Option values. Each parses all of s or fails: -1 after one line on
 * stderr, "<who>: <opt> wants ..., not '<s>'" (who: "kvmem run"). Numbers
 * are decimal integers unless said otherwise: no fractions, exponents,
 * "nan" or "inf", no sign where a value cannot be negative.
 */
int cli_parse_i64(const char *who, const char *opt, const char *s, int64_t lo, int64_t hi,
		  int64_t *out);
int cli_parse_int(const char *who, const char *opt, const char *s, int lo, int hi, int *out);
int cli_parse_long(const char *who, const char *opt, const char *s, long lo, long hi,
		   long *out);
/* A view layout (--layout): compact or stable, as enum kvmem_layout. */
int cli_parse_layout(const char *who, const char *opt, const char *s, int *out);
/* The KV a backend's views hold (--kv-dtype): bf16 (0: the backend's own) or
 * fp8 (KVMEM_DTYPE_FP8). */
int cli_parse_kv_dtype(const char *who, const char *opt, const char *s, uint32_t *out);
/* A seed: decimal or 0x hex, 0..2^64-1. */
int cli_parse_u64(const char *who, const char *opt, const char *s, uint64_t *out);
/*
 * A size in bytes: an integer with an optional suffix k, M, G or T (either
 * case), powers of 1024: "512M" is 536870912. Anything else after the
 * digits, an overflow, or a value outside lo..hi is refused.
 */
#define CLI_SIZE_HELP "sizes take k, M, G, T (powers of 1024: 512M = 536870912 bytes)"
int cli_parse_size(const char *who, const char *opt, const char *s, uint64_t lo, uint64_t hi,
		   uint64_t *out);
/* A count (tokens, blocks): an integer with an optional suffix k, M or G
 * (either case), powers of 1000: "300M" is 300000000. */
#define CLI_COUNT_HELP "counts take k, M, G (powers of 1000: 4k = 4000)"
int cli_parse_count(const char *who, const char *opt, const char *s, int64_t lo, int64_t hi,
		    int64_t *out);
/* A finite number in lo..hi (a float: also within float range). */
int cli_parse_double(const char *who, const char *opt, const char *s, double lo, double hi,
		     double *out);
int cli_parse_float(const char *who, const char *opt, const char *s, float lo, float hi,
		    float *out);

/*
 * Make stdout's fate the exit status, in one place: main registers this
 * with atexit; it flushes and closes stdout and, on any write error
 * (a full disk, /dev/full, a closed descriptor), prints "kvmem: write
 * error on standard output: ..." and ends the process with status 1.
 * cli_guard_stdio (called first in main) keeps descriptors 0..2 occupied
 * when the caller closed them, so a file kvmem opens never becomes its
 * stdout; a closed stdout is occupied read-only, so writes to it fail.
 */
void cli_guard_stdio(void);
void cli_close_stdout(void);
/* 0 while stdout has taken every byte so far; else -1 with a message. */
int cli_stdout_ok(const char *who);

#endif
