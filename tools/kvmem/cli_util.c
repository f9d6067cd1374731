// SPDX-License-Identifier: MIT
/* Small helpers the kvmem subcommands share (cli_util.h). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvmem/model.h"
#include "kvmem/session.h"
#include "cli_util.h"

const char *cli_fmt_sci(char *buf, size_t len, double v)
{
	int e = 0;

	while (v >= 10) {
		v /= 10;
		e++;
	}
	snprintf(buf, len, "%.2fe%d", v, e);
	return buf;
}

const char *cli_fmt_bytes(char *buf, size_t len, double v)
{
	static const char *const unit[] = { "bytes", "kB", "MB", "GB", "TB" };
	int u = 0;

	while (v >= 1000 && u < 4) {
		v /= 1000;
		u++;
	}
	snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
	return buf;
}

double cli_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- options ---------------------------------------------------------- */
void cli_getopt_reset(void)
{
	optind = 0;	/* GNU: 0 re-initialises everything, permutation included */
	opterr = 0;	/* our messages, not getopt's */
}

char cli_optname[64];

int cli_getopt(const char *who, int argc, char **argv, const struct option *opts)
{
	return cli_getopt_short(who, argc, argv, "", opts);
}

int cli_getopt_short(const char *who, int argc, char **argv, const char *shorts,
		     const struct option *opts)
{
	char spec[64];
	const char *arg;
	int idx = -1, c;

	snprintf(spec, sizeof(spec), ":h%s", shorts);
	c = getopt_long(argc, argv, spec, opts, &idx);
	arg = optind > 0 && optind <= argc ? argv[optind - 1] : "?";

	if (idx >= 0)
		snprintf(cli_optname, sizeof(cli_optname), "--%s", opts[idx].name);
	else
		snprintf(cli_optname, sizeof(cli_optname), "-%c", c > 0 && c < 128 ? c : '?');

	if (c == ':') {
		fprintf(stderr, "%s: %s needs a value (%s --help)\n", who, arg, who);
		return '?';
	}
	if (c != '?')
		return c;
	if (optopt && !strncmp(arg, "--", 2)) {	/* "--json=1" for a flag */
		fprintf(stderr, "%s: %.*s takes no value\n", who, (int)strcspn(arg, "="), arg);
		return '?';
	}
	if (optopt)
		fprintf(stderr, "%s: unknown option '-%c' (%s --help)\n", who, optopt, who);
	else
		fprintf(stderr, "%s: unknown option '%.*s' (%s --help)\n", who,
			(int)strcspn(arg, "="), arg, who);
	return '?';
}

int cli_no_operands(const char *who, int argc, char **argv)
{
	if (optind >= argc)
		return 0;
	fprintf(stderr, "%s: unexpected argument '%s' (%s --help)\n", who, argv[optind], who);
	return -1;
}

/* ---- values ----------------------------------------------------------- */
static int bad_value(const char *who, const char *opt, const char *s, const char *want)
{
	fprintf(stderr, "%s: %s wants %s, not '%s'\n", who, opt, want, s);
	return -1;
}

/* Decimal digits (after an optional '-' when neg_ok) into *v; *end after them. */
static int digits(const char *s, int neg_ok, uint64_t *v, int *neg, const char **end)
{
	uint64_t x = 0;

	*neg = neg_ok && *s == '-';
	s += *neg;
	if (*s < '0' || *s > '9')
		return -1;
	for (; *s >= '0' && *s <= '9'; s++) {
		if (x > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return -1;	/* overflow */
		x = x * 10 + (uint64_t)(*s - '0');
	}
	*v = x;
	*end = s;
	return 0;
}

int cli_parse_i64(const char *who, const char *opt, const char *s, int64_t lo, int64_t hi,
		  int64_t *out)
{
	const char *end;
	uint64_t v;
	int neg;
	char want[96];

	snprintf(want, sizeof(want), "an integer in %lld..%lld", (long long)lo, (long long)hi);
	if (digits(s, 1, &v, &neg, &end) || *end || v > (uint64_t)INT64_MAX + neg)
		return bad_value(who, opt, s, want);
	*out = neg ? (int64_t)(0 - v) : (int64_t)v;
	if (*out < lo || *out > hi)
		return bad_value(who, opt, s, want);
	return 0;
}

int cli_parse_int(const char *who, const char *opt, const char *s, int lo, int hi, int *out)
{
	int64_t v;

	if (cli_parse_i64(who, opt, s, lo, hi, &v))
		return -1;
	*out = (int)v;
	return 0;
}

int cli_parse_layout(const char *who, const char *opt, const char *s, int *out)
{
	if (!strcmp(s, "compact") || !strcmp(s, "stable")) {
		*out = strcmp(s, "stable") ? KVMEM_LAYOUT_COMPACT : KVMEM_LAYOUT_STABLE;
		return 0;
	}
	fprintf(stderr, "%s: %s wants compact (chronological) or stable (a kept block keeps "
		"its slot), not '%s'\n", who, opt, s);
	return -1;
}

int cli_parse_kv_dtype(const char *who, const char *opt, const char *s, uint32_t *out)
{
	if (!strcmp(s, "bf16") || !strcmp(s, "fp8")) {
		*out = strcmp(s, "fp8") ? 0 : KVMEM_DTYPE_FP8;
		return 0;
	}
	fprintf(stderr, "%s: %s wants bf16 or fp8, not '%s'\n", who, opt, s);
	return -1;
}

int cli_parse_long(const char *who, const char *opt, const char *s, long lo, long hi,
		   long *out)
{
	int64_t v;

	if (cli_parse_i64(who, opt, s, lo, hi, &v))
		return -1;
	*out = (long)v;
	return 0;
}

int cli_parse_u64(const char *who, const char *opt, const char *s, uint64_t *out)
{
	const char *end;
	uint64_t v = 0;
	int neg;

	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		const char *p = s + 2;

		for (; *p; p++) {
			int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 :
				*p >= 'A' && *p <= 'F' ? *p - 'A' + 10 : -1;

			if (d < 0 || v >> 60)
				return bad_value(who, opt, s, "an unsigned 64-bit integer (decimal or 0x hex)");
			v = v << 4 | (uint64_t)d;
		}
		if (p == s + 2)
			return bad_value(who, opt, s, "an unsigned 64-bit integer (decimal or 0x hex)");
		*out = v;
		return 0;
	}
	if (digits(s, 0, &v, &neg, &end) || *end)
		return bad_value(who, opt, s, "an unsigned 64-bit integer (decimal or 0x hex)");
	*out = v;
	return 0;
}

/* digits, then at most one suffix from `suffixes`, each worth base^(i+1). */
static int scaled(const char *s, const char *suffixes, uint64_t base, uint64_t *out)
{
	const char *end, *at;
	uint64_t v, mul = 1;
	int neg;

	if (digits(s, 0, &v, &neg, &end))
		return -1;
	if (*end) {
		if (end[1] || !(at = strchr(suffixes, *end)))
			return -1;
		for (long i = 0; i <= (at - suffixes) / 2; i++)
			mul *= base;	/* suffixes come in pairs: "kKmMgGtT" */
	}
	if (v && mul > UINT64_MAX / v)
		return -1;
	*out = v * mul;
	return 0;
}

int cli_parse_size(const char *who, const char *opt, const char *s, uint64_t lo, uint64_t hi,
		   uint64_t *out)
{
	char want[160];
	uint64_t v;

	snprintf(want, sizeof(want), "a size in bytes from %llu to %llu (k, M, G, T: powers of 1024)",
		 (unsigned long long)lo, (unsigned long long)hi);
	if (scaled(s, "kKmMgGtT", 1024, &v) || v < lo || v > hi)
		return bad_value(who, opt, s, want);
	*out = v;
	return 0;
}

int cli_parse_count(const char *who, const char *opt, const char *s, int64_t lo, int64_t hi,
		    int64_t *out)
{
	char want[160];
	uint64_t v;

	snprintf(want, sizeof(want), "a count from %lld to %lld (k, M, G: powers of 1000)",
		 (long long)lo, (long long)hi);
	if (scaled(s, "kKmMgG", 1000, &v) || v > (uint64_t)INT64_MAX || (int64_t)v < lo ||
	    (int64_t)v > hi)
		return bad_value(who, opt, s, want);
	*out = (int64_t)v;
	return 0;
}

int cli_parse_double(const char *who, const char *opt, const char *s, double lo, double hi,
		     double *out)
{
	char want[96], *end;
	double v;

	snprintf(want, sizeof(want), "a number from %g to %g", lo, hi);
	errno = 0;
	/* strtod reads "nan", "inf" and hex floats: only plain decimals here. */
	if (strspn(s, "0123456789.eE+-") != strlen(s))
		return bad_value(who, opt, s, want);
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
		return bad_value(who, opt, s, want);
	*out = v;
	return 0;
}

int cli_parse_float(const char *who, const char *opt, const char *s, float lo, float hi,
		    float *out)
{
	double v;

	if (cli_parse_double(who, opt, s, lo, hi, &v))
		return -1;
	*out = (float)v;
	return 0;
}

/* ---- stdout --------------------------------------------------------------- */
void cli_guard_stdio(void)
{
	for (int fd = 0; fd <= 2; fd++)
		if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
			/* Read-only: output to a closed stdout or stderr must fail,
			 * not vanish into /dev/null. */
			int n = open("/dev/null", O_RDONLY);

			if (n >= 0 && n != fd) {
				dup2(n, fd);
				close(n);
			}
		}
}

static int stdout_reported;	/* cli_stdout_ok said it: exit quietly */

int cli_stdout_ok(const char *who)
{
	errno = 0;
	if (fflush(stdout) == 0 && !ferror(stdout))
		return 0;
	if (!stdout_reported++)
		fprintf(stderr, "%s: write error on standard output: %s\n", who,
			errno ? strerror(errno) : "unknown error");
	return -1;
}

void cli_close_stdout(void)
{
	int e;

	errno = 0;
	if (fflush(stdout) == 0 && !ferror(stdout) && fclose(stdout) == 0)
		return;
	e = errno;
	if (!stdout_reported)
		fprintf(stderr, "kvmem: write error on standard output: %s\n",
			e ? strerror(e) : "unknown error");
	_exit(1);
}

void cli_print_geometry(const kvmem_config *c)
{
	uint64_t params = kvmem_config_params(c);
	char a[32];

	printf("layers        %d\n", c->n_layers);
	printf("hidden        %d\n", c->hidden);
	printf("heads         %d query, %d KV (%d queries per KV head), head_dim %d\n", c->n_heads,
	       c->n_kv_heads, c->n_heads / c->n_kv_heads, c->head_dim);
	printf("intermediate  %d\n", c->intermediate);
	printf("vocab         %d (bos %d, eos %d)\n", c->vocab, c->bos_id, c->eos_id);
	printf("window        %d tokens (max_position_embeddings)\n", c->max_position);
	printf("rope_theta    %.17g\n", c->rope_theta);
	printf("rms_norm_eps  %g\n", (double)c->rms_eps);
	printf("embeddings    %s\n", c->tie_embeddings ? "tied (lm_head is embed_tokens)" : "untied");
	printf("parameters    %llu (%s, embeddings included)\n", (unsigned long long)params,
	       cli_fmt_sci(a, sizeof(a), (double)params));
}

void cli_print_kv(const kvmem_config *c)
{
	uint64_t kv16 = kvmem_config_kv_bytes_per_token(c, 2), kv32 = kvmem_config_kv_bytes_per_token(c, 4);
	char a[32];

	printf("KV per token  %llu bytes bf16, %llu bytes fp32\n", (unsigned long long)kv16,
	       (unsigned long long)kv32);
	printf("KV at window  %s bf16 for %d tokens\n",
	       cli_fmt_bytes(a, sizeof(a), (double)kv16 * c->max_position), c->max_position);
}

void cli_ceph_conf(const char *path)
{
	setenv("CEPH_CONF", path, 1);
}
