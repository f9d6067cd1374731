// SPDX-License-Identifier: MIT
/*
 * A streamed completion over a raw socket (bench_client.h): the request,
 * then server-sent events read as they come. The first event whose text
 * is not empty is the first token; the last chunk's usage gives the
 * tokens; [DONE] ends it well.
 */
#ifndef KVMEM_NO_SERVE
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_client.h"

double bench_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int bench_target_parse(const char *url, struct bench_target *t)
{
	const char *h = strncmp(url, "http://", 7) ? NULL : url + 7, *colon;
	char *end;
	long port;

	if (!h || !(colon = strrchr(h, ':')) || colon == h || (size_t)(colon - h) >= sizeof(t->host))
		return -1;
	port = strtol(colon + 1, &end, 10);
	if (port < 1 || port > 65535 || (*end && strcmp(end, "/") && strcmp(end, "/v1")))
		return -1;
	memcpy(t->host, h, (size_t)(colon - h));
	t->host[colon - h] = 0;
	t->port = (int)port;
	return 0;
}

static int dial(const struct bench_target *t)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai, *a;
	char port[16];
	int fd = -1;

	snprintf(port, sizeof(port), "%d", t->port);
	if (getaddrinfo(t->host, port, &hints, &ai))
		return -1;
	for (a = ai; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* One event's data (NUL-terminated). 1 at [DONE]. */
static int on_event(const char *data, struct bench_sample *s, double t0)
{
	json_t *doc, *choices, *usage;
	const char *text;

	if (!strcmp(data, "[DONE]"))
		return 1;
	if (!(doc = json_loads(data, 0, NULL)))
		return 0;
	if (json_object_get(doc, "error"))
		snprintf(s->err, sizeof(s->err), "%.150s", data);
	choices = json_object_get(doc, "choices");
	text = json_string_value(json_object_get(json_array_get(choices, 0), "text"));
	if (!text)
		text = json_string_value(json_object_get(json_object_get(json_array_get(choices, 0),
									"delta"), "content"));
	if (text && *text) {
		const double t = bench_now() - t0;
		size_t have = s->text ? strlen(s->text) : 0;
		char *p = realloc(s->text, have + strlen(text) + 1);

		if (s->ttft < 0)
			s->ttft = t;
		else if (t - s->t_last > s->gap_max)
			s->gap_max = t - s->t_last;
		s->t_last = t;
		if (p) {
			memcpy(p + have, text, strlen(text) + 1);
			s->text = p;
		}
	}
	if ((usage = json_object_get(doc, "usage")) && json_is_object(usage)) {
		s->prompt_tokens = json_integer_value(json_object_get(usage, "prompt_tokens"));
		s->completion_tokens = json_integer_value(json_object_get(usage, "completion_tokens"));
	}
	json_decref(doc);
	return 0;
}

int bench_post_stream(const struct bench_target *t, const char *path, const char *body,
		      struct bench_sample *s)
{
	char head[1024], *buf = NULL;
	size_t len = 0, cap = 0, used = 0;
	int fd, n, done = 0, status = 0;
	double t0 = bench_now();

	memset(s, 0, sizeof(*s));
	s->t_start = t0;
	s->ttft = -1;
	if ((fd = dial(t)) < 0) {
		snprintf(s->err, sizeof(s->err), "cannot connect to %.100s:%d", t->host, t->port);
		return -1;
	}
	n = snprintf(head, sizeof(head), "POST %s HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\n"
		     "Content-Length: %zu\r\n%s%s%s\r\n", path, t->host, strlen(body),
		     t->api_key ? "Authorization: Bearer " : "", t->api_key ? t->api_key : "",
		     t->api_key ? "\r\n" : "");
	if (send_all(fd, head, (size_t)n) || send_all(fd, body, strlen(body))) {
		snprintf(s->err, sizeof(s->err), "cannot send the request");
		close(fd);
		return -1;
	}
	for (;;) {
		ssize_t k;
		char *ev;

		if (cap - len < 4096) {
			char *p = realloc(buf, cap = cap ? 2 * cap : 16384);

			if (!p)
				break;
			buf = p;
		}
		k = recv(fd, buf + len, cap - len - 1, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		len += (size_t)k;
		buf[len] = 0;
		if (!status) {
			char *e = strstr(buf, "\r\n\r\n");

			if (!e)
				continue;
			status = atoi(buf + 9);
			used = (size_t)(e + 4 - buf);
		}
		/* Events end in a blank line. */
		while ((ev = strstr(buf + used, "\n\n"))) {
			*ev = 0;
			if (!strncmp(buf + used, "data: ", 6))
				done |= on_event(buf + used + 6, s, t0);
			used = (size_t)(ev + 2 - buf);
		}
	}
	close(fd);
	s->latency = bench_now() - t0;
	s->ok = status == 200 && done && !s->err[0];
	if (!s->ok && !s->err[0])
		snprintf(s->err, sizeof(s->err), "HTTP %d%s: %.100s", status, done ? "" : ", no [DONE]",
			 buf && used < len ? buf + used : "");
	free(buf);
	return s->ok ? 0 : -1;
}
#endif
