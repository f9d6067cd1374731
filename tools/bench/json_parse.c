// SPDX-License-Identifier: MIT
/*
 * How fast kvmem reads JSON: kvmem_json_load (user/util/json.c: jansson
 * with its strict flags, plus the NUL and depth checks) against jansson's
 * json_loadb alone, on the session-script path (lines of {"append": [ids]}),
 * the API path (chat requests as kvmem serve takes them) and a large file
 * (a Qwen3 tokenizer.json, when given). Best of 5 runs; MB/s of input.
 * Documentation/benchmarks.md has the figures and the command:
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Iuser tools/bench/json_parse.c \
 *      build/libkvmem.a -lunistring -ljansson -lm -o /tmp/json_parse
 *   /tmp/json_parse [tokenizer.json]
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/json.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct docs {
	char **text;
	size_t *len, n, bytes;
};

static void add(struct docs *d, const char *s, size_t len)
{
	d->text = realloc(d->text, (d->n + 1) * sizeof(char *));
	d->len = realloc(d->len, (d->n + 1) * sizeof(size_t));
	d->text[d->n] = malloc(len + 1);
	memcpy(d->text[d->n], s, len);
	d->text[d->n][len] = 0;
	d->len[d->n++] = len;
	d->bytes += len;
}

static double run(const struct docs *d, int which)
{
	double best = 1e9;

	for (int r = 0; r < 5; r++) {
		double t0 = now();

		for (size_t i = 0; i < d->n; i++) {
			json_t *v;

			if (which == 0) {
				if (kvmem_json_load(d->text[i], d->len[i], "bench", &v))
					abort();
			} else {
				json_error_t e;

				v = json_loadb(d->text[i], d->len[i], JSON_REJECT_DUPLICATES, &e);
				if (!v)
					abort();
			}
			json_decref(v);
		}
		double t = now() - t0;
		best = t < best ? t : best;
	}
	return best;
}

static void report(const char *what, const struct docs *d)
{
	static const char *names[] = { "kvmem_json_load", "json_loadb" };

	printf("%s: %zu documents, %.2f MB\n", what, d->n, d->bytes / 1e6);
	for (int w = 0; w < 2; w++) {
		double t = run(d, w);

		printf("  %-15s %8.2f ms  %8.1f MB/s  %8.2f us/document\n", names[w], t * 1e3,
		       d->bytes / 1e6 / t, t * 1e6 / d->n);
	}
}

int main(int argc, char **argv)
{
	struct docs script = { 0 }, api = { 0 }, big = { 0 };
	uint64_t s = 12345;
	char *buf = malloc(1 << 24);

	/* The session script: 2000 lines of 1024 ids (the vocabulary of Qwen3). */
	for (int l = 0; l < 2000; l++) {
		size_t n = (size_t)sprintf(buf, "{\"append\": [");

		for (int i = 0; i < 1024; i++) {
			s = s * 6364136223846793005ull + 1442695040888963407ull;
			n += (size_t)sprintf(buf + n, "%s%llu", i ? ", " : "",
					     (unsigned long long)((s >> 33) % 151936));
		}
		n += (size_t)sprintf(buf + n, "]%s}", l % 7 ? "" : ", \"pin\": true");
		add(&script, buf, n);
	}
	/* The API: chat requests of 2..40 messages, 200 bytes .. 8 KB of text each. */
	for (int r = 0; r < 2000; r++) {
		size_t n = (size_t)sprintf(buf, "{\"model\": \"qwen3\", \"stream\": true, \"max_tokens\": 64, "
					   "\"temperature\": 0.7, \"messages\": [");
		int msgs = 2 + r % 39;

		for (int m = 0; m < msgs; m++) {
			int len = 200 + (int)((r * 7919 + m * 104729) % 8000);

			n += (size_t)sprintf(buf + n, "%s{\"role\": \"%s\", \"content\": \"", m ? ", " : "",
					     m % 2 ? "assistant" : "user");
			for (int k = 0; k < len; k++) {
				if (k % 61 == 60) {
					buf[n++] = '\\';	/* a newline, escaped */
					buf[n++] = 'n';
				} else if (k % 50 == 49) {
					buf[n++] = '\xc3';	/* e acute: UTF-8 */
					buf[n++] = '\xa9';
				} else {
					buf[n++] = "abcdefghij klmnopqrs tuvwxyz"[k % 28];
				}
			}
			n += (size_t)sprintf(buf + n, "\"}");
		}
		n += (size_t)sprintf(buf + n, "]}");
		add(&api, buf, n);
	}
	report("session script", &script);
	report("API requests", &api);
	if (argc > 1) {
		FILE *f = fopen(argv[1], "rb");
		size_t n = f ? fread(buf, 1, 1 << 24, f) : 0;

		if (f)
			fclose(f);
		if (n) {
			add(&big, buf, n);
			report(argv[1], &big);
		}
	}
	return 0;
}
