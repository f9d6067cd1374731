// SPDX-License-Identifier: MIT
/*
 * kvmem serve's HTTP side on libmicrohttpd (a thread per connection):
 * the listener, routing, the bearer token, the body limit, CORS, and
 * OpenAI-shaped errors for everything.
 *
 * The listener is the server's own: each accepted connection's request
 * head is read ahead (peeked, not consumed) and screened before
 * libmicrohttpd sees it, because libmicrohttpd answers a request line too
 * long (414), headers too large (431) or a Content-Length it cannot read
 * (400) with HTML of its own, and takes the first of two conflicting
 * Content-Lengths. Such a request gets an OpenAI error here and the
 * connection closes; a head that passes is handed over with
 * MHD_add_connection. Every answer carries "Connection: close", so each
 * request on the server's sockets is screened this way (a second request
 * on a kept-alive connection would reach libmicrohttpd unscreened).
 */
#ifndef KVMEM_NO_SERVE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "serve_http.h"

#define URL_MAX (16 << 10)	/* bytes of a request line */
#define HEAD_MAX (64 << 10)	/* bytes of a request head */
#define SCREENS_MAX 64		/* connections whose head is being read */

struct serve_http {
	struct MHD_Daemon *d;
	int lfd, port;
	pthread_t acceptor;
	int acceptor_started;
	pthread_mutex_t mu;
	pthread_cond_t idle;
	int screening;
	_Atomic int stop;
};

/* ---- answers ------------------------------------------------------------------- */
void http_cors(struct MHD_Response *r, const struct serve *sv)
{
	if (!sv->cfg.cors)
		return;
	MHD_add_response_header(r, "Access-Control-Allow-Origin", sv->cfg.cors);
	MHD_add_response_header(r, "Access-Control-Expose-Headers", "Retry-After");
	if (strcmp(sv->cfg.cors, "*"))
		MHD_add_response_header(r, "Vary", "Origin");
}

enum MHD_Result http_text(struct MHD_Connection *con, struct serve *sv, unsigned status,
			  const char *type, char *text, int retry_after)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text,
								  MHD_RESPMEM_MUST_FREE);
	enum MHD_Result ret;

	if (!r) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", type);
	MHD_add_response_header(r, "Connection", "close");
	if (status == 401)
		MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
	if (retry_after > 0) {
		char s[16];

		snprintf(s, sizeof(s), "%d", retry_after);
		MHD_add_response_header(r, "Retry-After", s);
	}
	http_cors(r, sv);
	ret = MHD_queue_response(con, status, r);
	MHD_destroy_response(r);
	return ret;
}

enum MHD_Result http_json(struct MHD_Connection *con, struct serve *sv, unsigned status, json_t *doc)
{
	char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;

	json_decref(doc);
	if (!text)
		return MHD_NO;
	return http_text(con, sv, status, "application/json", text, 0);
}

const char *http_error_type(unsigned status)
{
	switch (status) {
	case 401: return "authentication_error";
	case 404: return "not_found_error";
	case 409: return "conflict_error";
	case 429: return "rate_limit_error";
	default: return status >= 500 ? "server_error" : "invalid_request_error";
	}
}

json_t *http_error_doc(unsigned status, const char *code, const char *param, const char *msg)
{
	return json_pack("{s{sssssoss}}", "error", "message", msg, "type", http_error_type(status),
			 "param", param ? json_string(param) : json_null(), "code", code);
}

enum MHD_Result http_error(struct MHD_Connection *con, struct serve *sv, unsigned status,
			   const char *code, const char *param, int retry_after, const char *fmt, ...)
{
	char msg[1024], *text;
	json_t *doc;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	doc = http_error_doc(status, code, param, msg);
	text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
	json_decref(doc);
	if (!text)
		return MHD_NO;
	return http_text(con, sv, status, "application/json", text, retry_after);
}

int http_client_gone(struct MHD_Connection *con)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
	struct pollfd p;

	if (!ci)
		return 0;
	p.fd = ci->connect_fd;
	p.events = POLLRDHUP;
	p.revents = 0;
	return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* ---- small shared things -------------------------------------------------------------- */
int serve_id_ok(const char *s, size_t n)
{
	if (!n || n > SERVE_ID_MAX || memmem(s, n, "..", 2))
		return 0;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		int alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');

		if (!alnum && (i == 0 || (ch != '.' && ch != '_' && ch != '-')))
			return 0;
	}
	return 1;
}

void serve_new_id(struct serve *sv, char *buf, size_t len, const char *prefix)
{
	uint64_t n;

	pthread_mutex_lock(&sv->mu);
	n = ++sv->id_counter;
	pthread_mutex_unlock(&sv->mu);
	snprintf(buf, len, "%s-%" PRIx64 "%06" PRIx64, prefix, (uint64_t)time(NULL), n);
}

/* ---- the bearer token --------------------------------------------------------------------- */
/* The token against the key, in a time that depends on the key's length
 * alone: every byte is compared (no exit at the first difference), and a
 * token of another length fails, so neither a prefix of the key nor the key
 * with more after it passes. The scheme is case-insensitive (RFC 9110,
 * 11.1): "bearer KEY" is as good as "Bearer KEY". */
static int authorised(struct MHD_Connection *con, const struct serve *sv)
{
	const char *h, *key = sv->cfg.api_key;
	size_t n, hn;
	unsigned diff;

	if (!key)
		return 1;
	h = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Authorization");
	if (!h || strncasecmp(h, "Bearer ", 7))
		return 0;
	h += 7;
	while (*h == ' ')
		h++;
	n = strlen(key);
	hn = strlen(h);
	diff = hn != n;
	for (size_t i = 0; i < n; i++)
		diff |= (unsigned char)(h[i < hn ? i : hn] ^ key[i]);
	return diff == 0;
}

/* ---- routing ------------------------------------------------------------------------------ */
static enum MHD_Result preflight(struct MHD_Connection *con, struct serve *sv)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ret;

	if (!r)
		return MHD_NO;
	http_cors(r, sv);
	MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
	MHD_add_response_header(r, "Access-Control-Allow-Headers",
				"Authorization, Content-Type, X-Kvmem-Conversation");
	MHD_add_response_header(r, "Access-Control-Max-Age", "600");
	MHD_add_response_header(r, "Connection", "close");
	ret = MHD_queue_response(con, MHD_HTTP_NO_CONTENT, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result route(struct MHD_Connection *con, struct req *rq, const char *url,
			     const char *method)
{
	struct serve *sv = rq->sv;
	int post = !strcmp(method, "POST"), get = !strcmp(method, "GET");

	if (!strcmp(method, "OPTIONS") && sv->cfg.cors)
		return preflight(con, sv);
	if (!strcmp(url, "/health")) {
		if (!get)
			return http_error(con, sv, 405, "method_not_allowed", NULL, 0, "%s takes GET", url);
		return http_json(con, sv, 200, json_pack("{sssssIss}", "status", "ok", "model", sv->name,
							 "window", (json_int_t)sv->m->cfg.max_position,
							 "backend", kvmem_backend_name(sv->be)));
	}
	if (!authorised(con, sv))
		return http_error(con, sv, 401, "invalid_api_key", NULL, 0, "a bearer token is "
				  "required (Authorization: Bearer KEY, the server's --api-key)");
	if (!strcmp(url, "/metrics")) {
		char *m;

		if (!get)
			return http_error(con, sv, 405, "method_not_allowed", NULL, 0, "%s takes GET", url);
		m = serve_metrics(sv);
		return m ? http_text(con, sv, 200, "text/plain; version=0.0.4", m, 0) : MHD_NO;
	}
	if (!strcmp(url, "/v1/models") || (!strncmp(url, "/v1/models/", 11) && !strcmp(url + 11, sv->name))) {
		json_t *model = json_pack("{sssssiss}", "id", sv->name, "object", "model", "created", 0,
					  "owned_by", "kvmem");

		if (!get) {
			json_decref(model);
			return http_error(con, sv, 405, "method_not_allowed", NULL, 0, "%s takes GET", url);
		}
		return http_json(con, sv, 200, url[10] ? model
					       : json_pack("{sss[o]}", "object", "list", "data", model));
	}
	if (!strncmp(url, "/v1/models/", 11))
		return http_error(con, sv, 404, "model_not_found", NULL, 0, "model '%s' is not served "
				  "here; this server serves '%s'", url + 11, sv->name);
	if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions")) {
		if (!post)
			return http_error(con, sv, 405, "method_not_allowed", NULL, 0, "%s takes POST", url);
		return answer_completion(con, rq, !strcmp(url, "/v1/chat/completions") ? JOB_CHAT
											: JOB_TEXT);
	}
	if (!strcmp(url, "/v1/conversations") || !strncmp(url, "/v1/conversations/", 18))
		return api_conversations(con, sv, url, method);
	if (!strcmp(url, "/tokenize") || !strcmp(url, "/v1/tokenize") || !strcmp(url, "/detokenize") ||
	    !strcmp(url, "/v1/detokenize")) {
		if (!post)
			return http_error(con, sv, 405, "method_not_allowed", NULL, 0, "%s takes POST", url);
		return api_tokenize(con, rq, strstr(url, "detokenize") != NULL);
	}
	return http_error(con, sv, 404, "not_found", NULL, 0, "no such endpoint: %s %s (the server "
			  "has /v1/chat/completions, /v1/completions, /v1/models, /v1/conversations, "
			  "/tokenize, /detokenize, /health, /metrics)", method, url);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *con, const char *url,
			       const char *method, const char *version, const char *upload,
			       size_t *upload_size, void **con_cls)
{
	struct serve *sv = cls;
	struct req *rq = *con_cls;
	uint64_t max = sv->cfg.max_body;

	if (!rq) {
		const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Content-Length");
		const char *te = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Transfer-Encoding");

		rq = calloc(1, sizeof(*rq));
		if (!rq)
			return MHD_NO;
		rq->sv = sv;
		*con_cls = rq;
		/* A body whose end only a closed connection would tell (a coding
		 * other than chunked): refuse it at once rather than wait. */
		if (te && strcasecmp(te, "chunked"))
			return http_error(con, sv, 400, "invalid_request", "Transfer-Encoding", 0,
					  "Transfer-Encoding '%s' is not supported: send the body as it "
					  "is, or chunked", te);
		/* Refuse a body said to be too large before reading it. */
		if (cl && strtoull(cl, NULL, 10) > max)
			rq->too_big = 1;
		else
			return MHD_YES;
	}
	if (*upload_size) {
		size_t n = *upload_size;

		if (!rq->too_big && rq->len + n > max)
			rq->too_big = 1;
		if (!rq->too_big) {
			if (rq->len + n + 1 > rq->cap) {
				size_t cap = (rq->len + n + 1) * 2;
				char *p;

				cap = cap < max + 1 ? cap : max + 1;
				if (!(p = realloc(rq->body, cap)))
					return MHD_NO;
				rq->body = p;
				rq->cap = cap;
			}
			memcpy(rq->body + rq->len, upload, n);
			rq->len += n;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (rq->too_big)
		return http_error(con, sv, 413, "body_too_large", NULL, 0, "the request body is larger "
				  "than %" PRIu64 " bytes (--max-body)", max);
	return route(con, rq, url, method);
}

static void completed(void *cls, struct MHD_Connection *con, void **con_cls,
		      enum MHD_RequestTerminationCode toe)
{
	struct req *rq = *con_cls;

	if (rq) {
		free(rq->body);
		free(rq);
	}
	*con_cls = NULL;
}

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
		n = snprintf(head, sizeof(head), "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\n"
			     "Content-Length: %zu\r\nConnection: close\r\n%s%s%s\r\n", status, reason,
			     strlen(body), cors ? "Access-Control-Allow-Origin: " : "", cors ? cors : "",
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
	if (s->fd >= 0) {
		setsockopt(s->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));
		/* MHD_add_connection closes the socket itself when it fails. */
		if (verdict)
			close(s->fd);
		else
			MHD_add_connection(h->d, s->fd, (struct sockaddr *)&s->addr, s->addr_len);
	}
	free(s);
	pthread_mutex_lock(&h->mu);
	h->screening--;
	pthread_cond_broadcast(&h->idle);
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

static void *accept_main(void *arg)
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

/* ---- start and stop ----------------------------------------------------------------------------- */
static int listen_on(struct serve *sv)
{
	const struct serve_cfg *cfg = &sv->cfg;
	struct sockaddr_in a4 = { 0 };
	struct sockaddr_in6 a6 = { 0 };
	struct sockaddr_storage got;
	socklen_t got_len = sizeof(got);
	struct sockaddr *sa;
	socklen_t len;
	int one = 1, fd;

	if (inet_pton(AF_INET, cfg->host, &a4.sin_addr) == 1) {
		a4.sin_family = AF_INET;
		a4.sin_port = htons((uint16_t)cfg->port);
		sa = (struct sockaddr *)&a4;
		len = sizeof(a4);
	} else if (inet_pton(AF_INET6, cfg->host, &a6.sin6_addr) == 1) {
		a6.sin6_family = AF_INET6;
		a6.sin6_port = htons((uint16_t)cfg->port);
		sa = (struct sockaddr *)&a6;
		len = sizeof(a6);
	} else {
		return kvmem_error(EINVAL, "--host %s is not an IPv4 or IPv6 address", cfg->host);
	}
	fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kvmem_error(errno, "cannot make a socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, sa, len) || listen(fd, 128) || getsockname(fd, (struct sockaddr *)&got, &got_len)) {
		int e = errno;

		close(fd);
		return kvmem_error(e, "cannot listen on %s port %d: %s", cfg->host, cfg->port, strerror(e));
	}
	sv->http->lfd = fd;
	sv->http->port = ntohs(got.ss_family == AF_INET ? ((struct sockaddr_in *)&got)->sin_port
						       : ((struct sockaddr_in6 *)&got)->sin6_port);
	return 0;
}

int serve_http_start(struct serve *sv)
{
	const struct serve_cfg *cfg = &sv->cfg;
	struct serve_http *h = calloc(1, sizeof(*h));
	unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
			 MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;

	if (!h)
		return kvmem_error(ENOMEM, "out of memory");
	h->lfd = -1;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->idle, NULL);
	sv->http = h;
	if (listen_on(sv))
		return -1;
	h->d = MHD_start_daemon(flags, 0, NULL, NULL, handler, sv,
				MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_queue + 16),
				/* The screened head fits with room for the body's
				 * first reads. */
				MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(2 * HEAD_MAX),
				/* Idle connections (a client that sends half a
				 * body) go after a minute; a request the engine works
				 * on is not idle (its handler or stream is running). */
				MHD_OPTION_CONNECTION_TIMEOUT,
				(unsigned)(cfg->request_timeout < 60 ? cfg->request_timeout : 60),
				MHD_OPTION_END);
	if (!h->d)
		return kvmem_error(EIO, "cannot start the HTTP daemon (libmicrohttpd)");
	if (pthread_create(&h->acceptor, NULL, accept_main, sv))
		return kvmem_error(EAGAIN, "cannot start the listener thread");
	h->acceptor_started = 1;
	return 0;
}

int serve_http_port(const struct serve *sv)
{
	return sv->http ? sv->http->port : -1;
}

void serve_http_stop(struct serve *sv)
{
	struct serve_http *h = sv->http;

	if (!h)
		return;
	h->stop = 1;
	if (h->acceptor_started)
		pthread_join(h->acceptor, NULL);
	pthread_mutex_lock(&h->mu);
	while (h->screening)
		pthread_cond_wait(&h->idle, &h->mu);
	pthread_mutex_unlock(&h->mu);
	if (h->lfd >= 0)
		close(h->lfd);
	if (h->d)
		MHD_stop_daemon(h->d);
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->idle);
	free(h);
	sv->http = NULL;
}
#endif
