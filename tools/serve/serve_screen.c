// SPDX-License-Identifier: MIT
/*
 * kvmem serve's listener and its screen. Each accepted connection's
 * request head is read ahead (peeked, not consumed) and screened before
 * libmicrohttpd sees it, because libmicrohttpd answers a request line too
 * long (414), headers too large (431) or a Content-Length it cannot read
 * (400) with HTML of its own, and takes the first of two conflicting
 * Content-Lengths (RFC 9112, 6.3 says the framing is then unknown). Such a
 * request gets an OpenAI error here and the connection closes; a head that
 * passes is handed over with MHD_add_connection.
 */
#ifndef KVMEM_NO_SERVE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "serve_http.h"

#define URL_MAX (16 << 10)	/* bytes of a request line */
#define SCREENS_MAX 64		/* connections whose head is being read */

/* ---- the screen ------------------------------------------------------------------------------ */
struct screen {
	struct serve *sv;
	int fd;
	struct sockaddr_storage addr;
	socklen_t addr_len;
};

/* Answer a refused head on the raw socket and close it. */
static void refuse(struct screen *s, unsigned status, const char *reason, const char *code,
		   const char *msg)
{
	json_t *doc = http_error_doc(status, code, NULL, msg);
	char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL, head[512], drain[4096];
	const char *cors = s->sv->cfg.cors;
	int n;

	json_decref(doc);
	if (body) {
		/* A busy server (503) says when to come back, as its 429s do. */
		n = snprintf(head, sizeof(head), "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\n"
			     "Content-Length: %zu\r\nConnection: close\r\n%s%s%s%s\r\n", status, reason,
			     strlen(body), status == 503 ? "Retry-After: 1\r\n" : "",
			     cors ? "Access-Control-Allow-Origin: " : "", cors ? cors : "",
			     cors ? "\r\n" : "");
		if (send(s->fd, head, (size_t)n, MSG_NOSIGNAL) == n)
			send(s->fd, body, strlen(body), MSG_NOSIGNAL);
		free(body);
	}
	/* What the client still sends is read and dropped for a moment, so
	 * that closing does not reset the connection before it reads the
	 * answer. */
	shutdown(s->fd, SHUT_WR);
	for (int i = 0; i < 64; i++) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };

		if (poll(&p, 1, 100) != 1 || recv(s->fd, drain, sizeof(drain), 0) <= 0)
			break;
	}
	close(s->fd);
}

static int tchar(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The verdict on a complete head (len bytes, ending in a blank line): 0,
 * or an error answered here. */
static int judge(struct screen *s, const char *h, size_t len)
{
	const char *line = h, *end = h + len, *eol;
	char cl[32] = "", msg[300];
	int have_cl = 0, have_te = 0;

	if (memchr(h, 0, len)) {
		const char *nul = memchr(h, 0, len), *ls = nul;

		while (ls > h && ls[-1] != '\n')
			ls--;
		snprintf(msg, sizeof(msg), "a NUL byte in the request's head (in '%.*s'): header values "
			 "cannot hold one", (int)((nul - ls) < 60 ? nul - ls : 60), ls);
		refuse(s, 400, "Bad Request", !strncasecmp(ls, "X-Kvmem-Conversation:", 21)
					      ? "invalid_conversation_id" : "invalid_header", msg);
		return -1;
	}
	eol = memchr(line, '\n', (size_t)(end - line));
	{
		/* METHOD SP target SP HTTP/1.x */
		const char *sp1 = memchr(line, ' ', (size_t)(eol - line));
		const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
		size_t vl = sp2 ? (size_t)(eol - sp2 - 1) - (eol[-1] == '\r') : 0;

		if (!sp1 || !sp2 || sp1 == line || sp2 == sp1 + 1 || vl != 8 || strncmp(sp2 + 1, "HTTP/1.", 7)) {
			refuse(s, 400, "Bad Request", "invalid_request",
			       "the request line is not 'METHOD TARGET HTTP/1.x'");
			return -1;
		}
		for (const char *p = line; p < sp1; p++)
			if (!tchar(*p)) {
				refuse(s, 400, "Bad Request", "invalid_request", "the request's method is "
				       "not a token");
				return -1;
			}
	}
	for (line = eol + 1; line < end; line = eol + 1) {
		const char *colon, *v, *ve;

		eol = memchr(line, '\n', (size_t)(end - line));
		if (!eol || eol == line || (eol == line + 1 && line[0] == '\r'))
			break;
		colon = memchr(line, ':', (size_t)(eol - line));
		if (!colon || colon == line || line[0] == ' ' || line[0] == '\t') {
			refuse(s, 400, "Bad Request", "invalid_header", "a header line that is not "
			       "'Name: value' (or a folded line, which HTTP/1.1 no longer allows)");
			return -1;
		}
		for (const char *p = line; p < colon; p++)
			if (!tchar(*p)) {
				refuse(s, 400, "Bad Request", "invalid_header", "a header name that is "
				       "not a token");
				return -1;
			}
		for (v = colon + 1; v < eol && (*v == ' ' || *v == '\t'); v++)
			;
		for (ve = eol; ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'); ve--)
			;
		if (colon - line == 17 && !strncasecmp(line, "Transfer-Encoding", 17))
			have_te = 1;
		if (colon - line == 14 && !strncasecmp(line, "Content-Length", 14)) {
			/* RFC 9112, 6.3: a Content-Length that is not a number, or
			 * two that differ, leave the framing unknown. */
			size_t n = (size_t)(ve - v);
			int digits = n > 0 && n < sizeof(cl);

			for (const char *p = v; digits && p < ve; p++)
				digits = *p >= '0' && *p <= '9';
			if (!digits) {
				snprintf(msg, sizeof(msg), "Content-Length '%.*s' is not a number of "
					 "bytes", (int)(n < 40 ? n : 40), v);
				refuse(s, 400, "Bad Request", "invalid_content_length", msg);
				return -1;
			}
			if (have_cl && (strlen(cl) != n || memcmp(cl, v, n))) {
				snprintf(msg, sizeof(msg), "two Content-Length headers that differ "
					 "(%s and %.*s): the body's length is unknown", cl, (int)n, v);
				refuse(s, 400, "Bad Request", "invalid_content_length", msg);
				return -1;
			}
			memcpy(cl, v, n);
			cl[n] = 0;
			have_cl = 1;
		}
	}
	/* libmicrohttpd answers a length past 64 bits with HTML of its own
	 * (and its head twice); any length over --max-body is refused here. */
	if (have_cl && (strlen(cl) > 19 || strtoull(cl, NULL, 10) > s->sv->cfg.max_body)) {
		snprintf(msg, sizeof(msg), "the request body is larger than %" PRIu64 " bytes "
			 "(--max-body)", s->sv->cfg.max_body);
		refuse(s, 413, "Content Too Large", "body_too_large", msg);
		return -1;
	}
	if (have_cl && have_te) {
		refuse(s, 400, "Bad Request", "invalid_content_length", "both Content-Length and "
		       "Transfer-Encoding: the body's length is ambiguous");
		return -1;
	}
	return 0;
}

/* Read the head ahead (MSG_PEEK: libmicrohttpd reads it again) until its
 * blank line, a limit, the client's end or a minute. */
static void *screen_main(void *arg)
{
	struct screen *s = arg;
	struct serve_http *h = s->sv->http;
	char *buf = malloc(HEAD_MAX + 1);
	double until = serve_now() + 60;
	int one = 1, verdict = -1;
	ssize_t have = 0;

	while (buf) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN | POLLRDHUP };
		int want = (int)have + 1;
		ssize_t n;
		char *e, *nl;

		/* Wake only when more than what was seen has come. */
		setsockopt(s->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want));
		if (h->stop || serve_now() > until || poll(&p, 1, 250) < 0)
			break;
		if (!(p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)))
			continue;
		n = recv(s->fd, buf, HEAD_MAX, MSG_PEEK | MSG_DONTWAIT);
		if (n <= 0 && !(n < 0 && errno == EAGAIN))
			break;
		if (n < 0)
			n = have;
		buf[n] = 0;
		nl = memchr(buf, '\n', (size_t)n);
		if ((nl ? nl - buf : n) > URL_MAX) {
			refuse(s, 414, "URI Too Long", "uri_too_long", "the request line is longer than "
			       "the 16 KiB this server reads");
			s->fd = -1;
			break;
		}
		e = memmem(buf, (size_t)n, "\r\n\r\n", 4);
		if (!e && (e = memmem(buf, (size_t)n, "\n\n", 2)))
			e -= 2;
		if (e) {
			verdict = judge(s, buf, (size_t)(e + 4 - buf));
			if (verdict)
				s->fd = -1;
			break;
		}
		if (n >= HEAD_MAX) {
			refuse(s, 431, "Request Header Fields Too Large", "headers_too_large", "the "
			       "request's headers are larger than the 64 KiB this server reads");
			s->fd = -1;
			break;
		}
		if (p.revents & (POLLRDHUP | POLLHUP | POLLERR) && n == have)
			break;	/* the client ended with half a head */
		have = n;
	}
	free(buf);
	if (s->fd >= 0 && verdict) {
		close(s->fd);
	} else if (s->fd >= 0) {
		int full;

		setsockopt(s->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));
		pthread_mutex_lock(&h->mu);
		full = h->conns >= h->conn_limit;
		h->conns += !full;
		pthread_mutex_unlock(&h->mu);
		if (full) {
			refuse(s, 503, "Service Unavailable", "server_busy", "the server holds as many "
			       "connections as it serves (--max-queue + 16): try again shortly");
		} else if (MHD_add_connection(h->d, s->fd, (struct sockaddr *)&s->addr,
					      s->addr_len) != MHD_YES) {
			/* It closed the socket, and will never say so. */
			pthread_mutex_lock(&h->mu);
			h->conns--;
			pthread_mutex_unlock(&h->mu);
		}
	}
	free(s);
	pthread_mutex_lock(&h->mu);
	h->screening--;
	pthread_cond_broadcast(&h->idle);
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

void *serve_accept_main(void *arg)
{
	struct serve *sv = arg;
	struct serve_http *h = sv->http;

	while (!h->stop) {
		struct pollfd p = { .fd = h->lfd, .events = POLLIN };
		struct screen *s;
		pthread_t t;
		pthread_attr_t at;
		int busy;

		if (poll(&p, 1, 250) != 1)
			continue;
		s = calloc(1, sizeof(*s));
		if (!s)
			continue;
		s->sv = sv;
		s->addr_len = sizeof(s->addr);
		s->fd = accept4(h->lfd, (struct sockaddr *)&s->addr, &s->addr_len, SOCK_CLOEXEC);
		if (s->fd < 0) {
			free(s);
			continue;
		}
		pthread_mutex_lock(&h->mu);
		busy = h->screening >= SCREENS_MAX;
		h->screening += !busy;
		pthread_mutex_unlock(&h->mu);
		if (busy) {
			refuse(s, 503, "Service Unavailable", "server_busy", "too many connections are "
			       "sending their request: try again shortly");
			free(s);
			continue;
		}
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &at, screen_main, s)) {
			close(s->fd);
			free(s);
			pthread_mutex_lock(&h->mu);
			h->screening--;
			pthread_mutex_unlock(&h->mu);
		}
		pthread_attr_destroy(&at);
	}
	return NULL;
}

#endif
