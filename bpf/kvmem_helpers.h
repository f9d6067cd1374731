/* SPDX-License-Identifier: MIT */
/*
 * Userspace helpers every kvmem BPF tool shares (the role bcc's
 * trace_helpers.c plays for libbpf-tools): the common options (-p, -b, -m,
 * -u, -T, -j, -v) as an argp child, finding the binary that holds the USDT
 * probes, loading and attaching a tool's programs by their names (usdt_*,
 * tp_*: see kvmem.bpf.h), one-line errors, log2 histograms, timestamps and
 * JSON strings.
 *
 * Errors: functions that can fail print one line "TOOL: what is wrong" on
 * stderr and return a negative errno value; a tool then exits 1.
 */
#ifndef KVMEM_BPF_HELPERS_H
#define KVMEM_BPF_HELPERS_H

#include <argp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include <linux/types.h>

struct bpf_object;
struct bpf_link;

enum kt_source {
	KT_SRC_AUTO,	/* USDT, plus the module's tracepoints when it is loaded */
	KT_SRC_USDT,	/* -u: the userspace pager's USDT probes only */
	KT_SRC_MODULE,	/* -m: the module's tracepoints only */
};

struct kt_env {
	const char *tool;	/* for messages: "kvmemtop" */
	pid_t pid;		/* -p: 0 = every process */
	const char *binary;	/* -b: kvmem binary or libkvmem.so (NULL: find it) */
	enum kt_source source;
	bool timestamp;		/* -T */
	bool json;		/* -j */
	bool verbose;		/* -v: libbpf's debug output */
	/* Filled by kt_open_sources(): */
	char target[4096 + 64];	/* the binary the USDT programs attach to ("" = none) */
	bool use_usdt, use_module;
	bool check;		/* KVMEM_BPF_CHECK set: load everything, attach nothing */
};

/* The common options; add as a child of the tool's argp:
 *   { &kt_common_argp, 0, NULL, 0 }. The tool sets kt_common_env first. */
extern const struct argp kt_common_argp;
extern struct kt_env *kt_common_env;

/* Set libbpf's message printer (quiet unless -v) and SIGINT/SIGTERM to
 * set kt_exiting. */
void kt_init(struct kt_env *env);
/* A tool's start: kt_common_env = env, its options parsed (argp's child
 * fills env), kt_init. 0, or 1 (the exit status) when the options were
 * refused (argp said why). */
int kt_start(const struct argp *argp, int argc, char **argv, struct kt_env *env);
/* The skeleton's open failed (errno says why): one line; returns 1. */
int kt_open_failed(const struct kt_env *env);
extern volatile sig_atomic_t kt_exiting;

/*
 * Decide the sources before load: check -p names a live process, find the
 * USDT binary (-b; else the one -p runs, a libkvmem.so it maps first; else
 * ../kvmem next to this tool; else kvmem on PATH), see whether the module
 * is loaded, refuse -m without it; then switch off autoload of the usdt_*
 * or tp_* programs not used (tp_* includes the module's writable
 * tracepoint programs).
 * With KVMEM_BPF_CHECK=1 in the environment (tests), the module's programs
 * load even without the module and kt_attach() exits 0 after the load: a
 * verifier check of every program on this kernel.
 */
int kt_open_sources(struct kt_env *env, struct bpf_object *obj);
/* Switch loading of the named programs off (NULL-terminated list). */
void kt_skip(struct bpf_object *obj, const char *const *names);
/* After bpf_object__load failed with err: one line, saying so plainly when
 * the cause is privileges. Returns 1 (the exit status). */
int kt_load_failed(const struct kt_env *env, int err);

/* Attach every loaded usdt_* program to its probe in env->target and every
 * loaded tp_* program to its tracepoint. Links are kept for kt_detach. */
int kt_attach(struct kt_env *env, struct bpf_object *obj);
void kt_detach(void);
/* One line on stderr (stdout when not -j) saying what is traced. */
void kt_print_tracing(const struct kt_env *env, const char *what);

/* 1 when the kvmem module is loaded (its tracepoints exist). */
bool kt_module_loaded(void);
/* 1 when pid names a live process. */
bool kt_pid_alive(pid_t pid);

/* "HH:MM:SS" of now into buf (at least 9 bytes). */
const char *kt_clock(char *buf, size_t len);
/* Seconds since the epoch, with fraction; monotonic nanoseconds. */
double kt_wall(void);
__u64 kt_mono_ns(void);

/* A log2 histogram of n slots (slot i: [2^i, 2^(i+1)) of `unit`, slot 0
 * also 0), bcc's layout: value range, count, stars. Nothing for empty. */
void kt_print_log2_hist(FILE *f, const __u64 *slots, int n, const char *unit);
/* The same as a JSON array of the counts up to the last non-zero one. */
void kt_json_hist(FILE *f, const __u64 *slots, int n);
/* The last `width` characters of s, "..." in front when cut (buf holds
 * at least width + 1 bytes). */
const char *kt_tail(const char *s, size_t width, char *buf, size_t len);
/* s as a JSON string (quotes and escapes). */
void kt_json_str(FILE *f, const char *s);

/* Parse a non-negative integer option; -EINVAL on junk. */
int kt_parse_long(const char *s, long min, long max, long *out);
/* The tools' positional arguments "[INTERVAL [COUNT]]", for ARGP_KEY_ARG:
 * seconds 1..2^30, then a count >= 1; argp_error on junk or a third. */
void kt_interval_count_arg(struct argp_state *state, const char *arg, long *interval,
			   long *count);

#endif
