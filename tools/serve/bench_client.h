/* SPDX-License-Identifier: MIT */
/*
 * The client `kvmem bench serve` drives a server with: one streamed
 * completion per call over a fresh TCP connection (HTTP/1.0, so the answer
 * ends when the server closes), timed at its first content, between
 * contents (the longest wait: a stream's stall) and at its end.
 */
#ifndef KVMEM_TOOLS_BENCH_CLIENT_H
#define KVMEM_TOOLS_BENCH_CLIENT_H

#include <stdint.h>

struct bench_target {
	char host[256];
	int port;
	const char *api_key;		/* NULL: none */
};

struct bench_sample {
	double t_start;			/* when the request was sent (monotonic s) */
	double ttft;			/* seconds to the first content, -1: none */
	double latency;			/* seconds to the end of the stream */
	double t_last;			/* the last content's time, from the start */
	double gap_max;			/* the longest wait between two contents, s */
	int64_t prompt_tokens, completion_tokens;
	int ok;				/* 200, a stream that ended with [DONE] */
	char *text;			/* the answer's text (malloc'd; the caller frees) */
	char err[160];
};

/* POST body (a completion request with "stream": true and usage) to path;
 * fills s. 0, or -1 with s->err. */
int bench_post_stream(const struct bench_target *t, const char *path, const char *body,
		      struct bench_sample *s);
/* http://HOST:PORT into t; -1 when it is not such a URL. */
int bench_target_parse(const char *url, struct bench_target *t);
double bench_now(void);

#endif
