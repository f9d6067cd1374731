// SPDX-License-Identifier: MIT
/*
 * kvmem serve's HTTP side on libmicrohttpd (a thread per connection):
 * the listening socket (its connections are screened first,
 * serve_screen.c, then handed to libmicrohttpd), routing, the bearer
 * token, the body limit, CORS, and OpenAI-shaped errors for everything.
 * Every answer carries "Connection: close", so every request on the
 * server's sockets is screened (a second request on a kept-alive
 * connection would reach libmicrohttpd unscreened).
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

void serve_new_id(struct serve *sv, char *buf, size_t len, const char *prefix, uint64_t seq)
{
	uint64_t n = seq;

	if (!n) {
		pthread_mutex_lock(&sv->mu);
		n = ++sv->id_counter;
		pthread_mutex_unlock(&sv->mu);
	}
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

/* A connection libmicrohttpd closes gives back its place (serve_screen.c
 * took it before the hand-over). */
static void notify_conn(void *cls, struct MHD_Connection *con, void **socket_ctx,
			enum MHD_ConnectionNotificationCode code)
{
	struct serve_http *h = ((struct serve *)cls)->http;

	(void)con;
	(void)socket_ctx;
	if (code != MHD_CONNECTION_NOTIFY_CLOSED)
		return;
	pthread_mutex_lock(&h->mu);
	h->conns--;
	pthread_mutex_unlock(&h->mu);
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
	h->conn_limit = (int)(cfg->max_queue + 16);
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->idle, NULL);
	sv->http = h;
	if (listen_on(sv))
		return -1;
	h->d = MHD_start_daemon(flags, 0, NULL, NULL, handler, sv,
				MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
				MHD_OPTION_NOTIFY_CONNECTION, notify_conn, sv,
				/* A backstop above the screen's count (serve_http.h):
				 * room for every connection it hands over and more. */
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)(2 * h->conn_limit + 64),
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
	if (pthread_create(&h->acceptor, NULL, serve_accept_main, sv))
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
