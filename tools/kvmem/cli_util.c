// SPDX-License-Identifier: MIT
/* Small helpers the kvmem subcommands share (cli_util.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kvmem/model.h"
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

int cli_parse_i64(const char *who, const char *opt, const char *s, int64_t lo, int64_t hi,
		  int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, "%s: %s wants an integer in %lld..%lld, not '%s'\n", who, opt,
			(long long)lo, (long long)hi, s);
		return -1;
	}
	*out = v;
	return 0;
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
	char *end;

	errno = 0;
	*out = strtoull(s, &end, 0);
	if (errno || end == s || *end || *s == '-') {
		fprintf(stderr, "%s: %s wants an unsigned integer, not '%s'\n", who, opt, s);
		return -1;
	}
	return 0;
}

int cli_parse_float(const char *who, const char *opt, const char *s, float *out)
{
	char *end;

	errno = 0;
	*out = strtof(s, &end);
	if (errno || end == s || *end || *out != *out) {
		fprintf(stderr, "%s: %s wants a number, not '%s'\n", who, opt, s);
		return -1;
	}
	return 0;
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
