// SPDX-License-Identifier: MIT
/*
 * Helpers of the kvmem BPF tools: common options, sources and attach,
 * one-line errors, histograms, time and JSON. See kvmem_helpers.h.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <bpf/libbpf.h>

#include "kvmem_helpers.h"
#include "kvmem_tp.h"

volatile sig_atomic_t kt_exiting;
struct kt_env *kt_common_env;

static bool verbose;

/* ---- common options ------------------------------------------------------ */
static const struct argp_option common_opts[] = {
	{ "pid", 'p', "PID", 0, "Trace this process only", 1 },
	{ "binary", 'b', "PATH", 0,
	  "The kvmem binary or libkvmem.so holding the USDT probes (default: the one "
	  "PID runs, else ../kvmem next to this tool, else kvmem on PATH)", 1 },
	{ "module", 'm', NULL, 0, "Only the kernel module's tracepoints (fails if it is not loaded)", 1 },
	{ "usdt", 'u', NULL, 0, "Only the userspace pager's USDT probes", 1 },
	{ "timestamp", 'T', NULL, 0, "Include a timestamp on output", 1 },
	{ "json", 'j', NULL, 0, "JSON lines on stdout, one object per record", 1 },
	{ "verbose", 'v', NULL, 0, "Verbose debug output (libbpf)", 1 },
	{ NULL, 'h', NULL, OPTION_HIDDEN, "Show the full help", 1 },
	{},
};

int kt_parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

void kt_interval_count_arg(struct argp_state *state, const char *arg, long *interval,
			   long *count)
{
	if (state->arg_num == 0) {
		if (kt_parse_long(arg, 1, 1L << 30, interval) < 0)
			argp_error(state, "invalid interval: %s", arg);
	} else if (state->arg_num == 1) {
		if (kt_parse_long(arg, 1, LONG_MAX, count) < 0)
			argp_error(state, "invalid count: %s", arg);
	} else {
		argp_error(state, "unexpected argument: %s", arg);
	}
}

static error_t common_parse(int key, char *arg, struct argp_state *state)
{
	struct kt_env *env = kt_common_env;
	long v;

	switch (key) {
	case 'p':
		if (kt_parse_long(arg, 1, INT_MAX, &v) < 0)
			argp_error(state, "invalid PID: %s", arg);
		env->pid = (pid_t)v;
		break;
	case 'b':
		env->binary = arg;
		break;
	case 'm':
		if (env->source == KT_SRC_USDT)
			argp_error(state, "-m and -u exclude each other");
		env->source = KT_SRC_MODULE;
		break;
	case 'u':
		if (env->source == KT_SRC_MODULE)
			argp_error(state, "-m and -u exclude each other");
		env->source = KT_SRC_USDT;
		break;
	case 'T':
		env->timestamp = true;
		break;
	case 'j':
		env->json = true;
		break;
	case 'v':
		env->verbose = true;
		break;
	case 'h':
		argp_state_help(state, stdout, ARGP_HELP_STD_HELP);
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

const struct argp kt_common_argp = { .options = common_opts, .parser = common_parse };

/* ---- set-up -------------------------------------------------------------- */
static int libbpf_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	if (!verbose)
		return 0;
	return vfprintf(stderr, fmt, ap);
}

static void on_signal(int sig)
{
	kt_exiting = 1;
}

void kt_init(struct kt_env *env)
{
	struct sigaction sa = { .sa_handler = on_signal };

	verbose = env->verbose;
	libbpf_set_print(libbpf_print);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

int kt_start(const struct argp *argp, int argc, char **argv, struct kt_env *env)
{
	kt_common_env = env;
	if (argp_parse(argp, argc, argv, 0, NULL, NULL))
		return 1;
	kt_init(env);
	return 0;
}

int kt_open_failed(const struct kt_env *env)
{
	fprintf(stderr, "%s: cannot open the BPF object: %s\n", env->tool, strerror(errno));
	return 1;
}

bool kt_pid_alive(pid_t pid)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d", (int)pid);
	return access(path, F_OK) == 0;
}

bool kt_module_loaded(void)
{
	return access("/sys/module/kvmem", F_OK) == 0 || access(KVMEM_TP_DIR, F_OK) == 0 ||
	       access(KVMEM_TP_DIR_DEBUGFS, F_OK) == 0;
}

/* The first mapped file of pid whose name has "/libkvmem.so" in it. */
static bool find_lib(pid_t pid, char *out, size_t len)
{
	char path[64], line[4096 + 128];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f)) {
		char *name = strchr(line, '/');

		if (!name || !strstr(name, "/libkvmem.so"))
			continue;
		name[strcspn(name, "\n")] = 0;
		snprintf(out, len, "%s", name);
		found = true;
	}
	fclose(f);
	return found;
}

static bool usable(const char *path)
{
	return access(path, R_OK) == 0;
}

/* Where the USDT probes are: see kt_open_sources. 0: env->target is set;
 * 1: none found; < 0: an error, already said. */
static int find_target(struct kt_env *env)
{
	char self[PATH_MAX], cand[PATH_MAX + 16];
	const char *path = getenv("PATH");
	ssize_t n;

	if (env->binary) {
		if (!usable(env->binary)) {
			int err = errno;

			fprintf(stderr, "%s: %s: %s\n", env->tool, env->binary, strerror(err));
			return -err;
		}
		snprintf(env->target, sizeof(env->target), "%s", env->binary);
		return 0;
	}
	if (env->pid) {
		if (find_lib(env->pid, env->target, sizeof(env->target)))
			return 0;
		snprintf(cand, sizeof(cand), "/proc/%d/exe", (int)env->pid);
		n = readlink(cand, self, sizeof(self) - 1);
		if (n > 0) {
			self[n] = 0;
			/* A binary replaced since it started: keep the magic link,
			 * which still reaches the running inode. */
			snprintf(env->target, sizeof(env->target), "%s",
				 strstr(self, " (deleted)") ? cand : self);
			return 0;
		}
		n = errno;
		fprintf(stderr, "%s: pid %d: cannot read its executable: %s\n", env->tool,
			(int)env->pid, strerror((int)n));
		return -(int)n;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		char *slash;

		self[n] = 0;
		slash = strrchr(self, '/');
		if (slash) {
			*slash = 0;
			snprintf(cand, sizeof(cand), "%s/../kvmem", self);
			if (usable(cand) && realpath(cand, env->target))
				return 0;
		}
	}
	while (path && *path) {
		size_t len = strcspn(path, ":");

		snprintf(cand, sizeof(cand), "%.*s/kvmem", (int)len, path);
		if (len && usable(cand)) {
			snprintf(env->target, sizeof(env->target), "%s", cand);
			return 0;
		}
		path += len + (path[len] == ':');
	}
	env->target[0] = 0;
	return 1;	/* none found (nothing said yet) */
}

static bool starts(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

int kt_open_sources(struct kt_env *env, struct bpf_object *obj)
{
	struct bpf_program *prog;
	bool module = kt_module_loaded();
	int rc;

	if (env->pid && !kt_pid_alive(env->pid)) {
		fprintf(stderr, "%s: pid %d: no such process\n", env->tool, (int)env->pid);
		return -ESRCH;
	}
	if (env->source == KT_SRC_MODULE && !module) {
		fprintf(stderr, "%s: the kvmem kernel module is not loaded (no /sys/module/kvmem): "
			"nothing to trace with -m\n", env->tool);
		return -ENOENT;
	}
	env->check = getenv("KVMEM_BPF_CHECK") && !strcmp(getenv("KVMEM_BPF_CHECK"), "1");
	env->use_module = (module || env->check) && env->source != KT_SRC_USDT;
	env->use_usdt = false;
	if (env->source != KT_SRC_MODULE) {
		rc = find_target(env);
		if (rc < 0)
			return rc;
		if (rc == 0) {
			env->use_usdt = true;
		} else if (!env->use_module) {
			fprintf(stderr, "%s: no kvmem binary found (give -b PATH or -p PID)%s\n",
				env->tool, env->source == KT_SRC_USDT ? "" :
				" and the kvmem module is not loaded");
			return -ENOENT;
		}
	}
	bpf_object__for_each_program(prog, obj) {
		const char *name = bpf_program__name(prog);

		if (starts(name, "usdt_"))
			bpf_program__set_autoload(prog, env->use_usdt);
		else if (starts(name, "tp_"))
			bpf_program__set_autoload(prog, env->use_module);
	}
	return 0;
}

void kt_skip(struct bpf_object *obj, const char *const *names)
{
	for (; *names; names++) {
		struct bpf_program *prog = bpf_object__find_program_by_name(obj, *names);

		if (prog)
			bpf_program__set_autoload(prog, false);
	}
}

int kt_load_failed(const struct kt_env *env, int err)
{
	if (err < 0)
		err = -err;
	/* EACCES is also the verifier's answer, to root as to anyone */
	if (err == EPERM || (err == EACCES && geteuid() != 0))
		fprintf(stderr, "%s: cannot load BPF programs: %s (run as root, or with CAP_BPF "
			"and CAP_PERFMON)\n", env->tool, strerror(err));
	else if (err == EACCES)
		fprintf(stderr, "%s: the kernel's verifier refused a program (-v shows its log)\n",
			env->tool);
	else
		fprintf(stderr, "%s: cannot load BPF programs: %s (-v shows libbpf's log)\n",
			env->tool, strerror(err));
	return 1;
}

/* ---- attach ---------------------------------------------------------------- */
#define MAX_LINKS 64
static struct bpf_link *links[MAX_LINKS];
static int n_links;

int kt_attach(struct kt_env *env, struct bpf_object *obj)
{
	struct bpf_program *prog;

	if (env->check) {
		int n = 0;

		bpf_object__for_each_program(prog, obj)
			n += bpf_program__autoload(prog);
		printf("%s: %d programs loaded, the verifier accepted them (KVMEM_BPF_CHECK: "
		       "nothing attached)\n", env->tool, n);
		exit(0);
	}

	bpf_object__for_each_program(prog, obj) {
		const char *name = bpf_program__name(prog);
		char probe[64] = "";
		struct bpf_link *l;

		if (!bpf_program__autoload(prog))
			continue;
		if (starts(name, "usdt_")) {
			/* usdt_<probe> or usdt_<probe>__<more>: a second program
			 * on the same probe */
			char *cut;

			snprintf(probe, sizeof(probe), "%s", name + 5);
			cut = strstr(probe, "__");
			if (cut)
				*cut = 0;
			l = bpf_program__attach_usdt(prog, env->pid ? env->pid : -1, env->target,
						     "kvmem", probe, NULL);
		}
		else if (starts(name, "tp_"))
			l = bpf_program__attach(prog);
		else
			continue;	/* attached by the tool itself, or run with test_run */
		if (!l) {
			int err = errno;

			if (starts(name, "usdt_") && err == ENOENT)
				fprintf(stderr, "%s: %s: no USDT probe kvmem:%s in it (not a kvmem "
					"binary, or an older one?)\n", env->tool, env->target, probe);
			else if (err == EPERM || err == EACCES)
				fprintf(stderr, "%s: cannot attach %s: %s (run as root)\n", env->tool,
					name, strerror(err));
			else
				fprintf(stderr, "%s: cannot attach %s to %s: %s\n", env->tool, name,
					starts(name, "usdt_") ? env->target : "the module's tracepoint",
					strerror(err));
			kt_detach();
			return -err;
		}
		if (n_links == MAX_LINKS) {
			bpf_link__destroy(l);
			fprintf(stderr, "%s: more than %d programs\n", env->tool, MAX_LINKS);
			kt_detach();
			return -E2BIG;
		}
		links[n_links++] = l;
	}
	return 0;
}

void kt_detach(void)
{
	while (n_links)
		bpf_link__destroy(links[--n_links]);
}

void kt_print_tracing(const struct kt_env *env, const char *what)
{
	FILE *f = env->json ? stderr : stdout;
	char pid[32] = "";

	if (env->pid)
		snprintf(pid, sizeof(pid), ", pid %d", (int)env->pid);
	fprintf(f, "Tracing %s (%s%s%s%s%s)... Hit Ctrl-C to end.\n", what,
		env->use_usdt ? "USDT in " : "", env->use_usdt ? env->target : "",
		env->use_usdt && env->use_module ? " and " : "",
		env->use_module ? "kvmem module tracepoints" : "", pid);
	fflush(f);
}

/* ---- time ------------------------------------------------------------------ */
const char *kt_clock(char *buf, size_t len)
{
	time_t t = time(NULL);
	struct tm tm;

	strftime(buf, len, "%H:%M:%S", localtime_r(&t, &tm));
	return buf;
}

double kt_wall(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

__u64 kt_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (__u64)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* ---- histograms and JSON --------------------------------------------------- */
void kt_print_log2_hist(FILE *f, const __u64 *slots, int n, const char *unit)
{
	const int width = 40;
	__u64 most = 0;
	int last = -1;

	for (int i = 0; i < n; i++) {
		if (slots[i])
			last = i;
		if (slots[i] > most)
			most = slots[i];
	}
	if (last < 0)
		return;
	fprintf(f, "%*s%-*s : count    distribution\n", 5, "", 19, unit);
	for (int i = 0; i <= last; i++) {
		unsigned long long lo = i ? 1ull << i : 0, hi = (2ull << i) - 1;
		int stars = (int)(slots[i] * width / most);

		fprintf(f, "%10llu -> %-10llu : %-8llu |%-*.*s|\n", lo, hi,
			(unsigned long long)slots[i], width, stars,
			"****************************************");
	}
}

void kt_json_hist(FILE *f, const __u64 *slots, int n)
{
	int last = -1;

	for (int i = 0; i < n; i++)
		if (slots[i])
			last = i;
	fputc('[', f);
	for (int i = 0; i <= last; i++)
		fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)slots[i]);
	fputc(']', f);
}

const char *kt_tail(const char *s, size_t width, char *buf, size_t len)
{
	size_t n = strlen(s);

	if (n <= width || width < 4)
		return s;
	snprintf(buf, len, "...%s", s + n - (width - 3));
	return buf;
}

void kt_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}
