/* SPDX-License-Identifier: MIT */
/*
 * What kvmem serve's HTTP files share (serve_http.c the listener and the
 * routing, serve_answer.c the answers, serve_api.c the other endpoints):
 * answers and OpenAI-shaped errors over libmicrohttpd, each carrying the
 * CORS headers when --cors is given.
 */
#ifndef KVMEM_TOOLS_SERVE_HTTP_H
#define KVMEM_TOOLS_SERVE_HTTP_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>

#include "serve_int.h"

#define HEAD_MAX (64 << 10)	/* bytes of a request head the screen reads */

/* The listener and the daemon (serve_http.c). */
struct serve_http {
	struct MHD_Daemon *d;
	int lfd, port;
	pthread_t acceptor;
	int acceptor_started;
	pthread_mutex_t mu;
	pthread_cond_t idle;
	int screening;
	/* Connections handed to libmicrohttpd and not yet closed (counted
	 * from the hand-over to its NOTIFY_CONNECTION_CLOSED), and the most
	 * the listener hands over: past conn_limit a connection gets 503 from
	 * the screen. libmicrohttpd's own limit sits above it, never reached:
	 * its 0.9.75 locks a mutex it holds when a connection added from
	 * another thread finds the limit reached, and every request after
	 * that hangs (and so does stopping). */
	int conns, conn_limit;
	_Atomic int stop;
};

/* The listener's thread: accept, screen, hand over (serve_screen.c). */
void *serve_accept_main(void *arg);

/* A request's body as it arrives (the access handler's closure). */
struct req {
	struct serve *sv;
	char *body;
	size_t len, cap;
	int too_big;
};

/* The error's "type" for an HTTP status. */
const char *http_error_type(unsigned status);
json_t *http_error_doc(unsigned status, const char *code, const char *param, const char *msg);
/* Queue a response (takes text, malloc'd). */
enum MHD_Result http_text(struct MHD_Connection *con, struct serve *sv, unsigned status,
			  const char *type, char *text, int retry_after);
/* Queue doc as JSON (takes the reference). */
enum MHD_Result http_json(struct MHD_Connection *con, struct serve *sv, unsigned status, json_t *doc);
enum MHD_Result http_error(struct MHD_Connection *con, struct serve *sv, unsigned status,
			   const char *code, const char *param, int retry_after, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
/* The CORS headers, when --cors is given (every response). */
void http_cors(struct MHD_Response *r, const struct serve *sv);
/* 1 when the client's side of the connection has closed. */
int http_client_gone(struct MHD_Connection *con);

/* POST /v1/chat/completions and /v1/completions (serve_answer.c). */
enum MHD_Result answer_completion(struct MHD_Connection *con, struct req *rq, int kind);
/* GET /v1/conversations[/ID], DELETE /v1/conversations/ID (serve_api.c). */
enum MHD_Result api_conversations(struct MHD_Connection *con, struct serve *sv, const char *url,
				  const char *method);
/* POST /tokenize, /detokenize (and under /v1). */
enum MHD_Result api_tokenize(struct MHD_Connection *con, struct req *rq, int detokenize);

#endif
