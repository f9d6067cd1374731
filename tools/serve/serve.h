/* SPDX-License-Identifier: MIT */
/*
 * kvmem serve: an OpenAI-compatible HTTP server in which every conversation
 * is a workspace. cmd_serve.c reads the options and starts the parts;
 * serve_http.c speaks HTTP (libmicrohttpd) and JSON (jansson); serve_engine.c
 * owns the model, the backend and every session, and runs the requests'
 * steps interleaved on one thread; serve_conv.c keeps a conversation's
 * record beside its workspace. Documentation/serve.md tells the API.
 */
#ifndef KVMEM_TOOLS_SERVE_H
#define KVMEM_TOOLS_SERVE_H

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "kvmem/model.h"
#include "kvmem/pager.h"
#include "kvmem/store.h"
#include "kvmem/session.h"
#include "tok_cli.h"

#define SERVE_WHO "kvmem serve"
#define SERVE_ID_MAX 128	/* bytes of a conversation id */

struct serve_cfg {
	const char *model_dir, *model_name, *data_dir, *host, *api_key, *backend, *policy;
	const char *store;		/* rados://POOL: conversations shared there */
	int port;
	uint64_t max_body;		/* bytes of a request body */
	int64_t max_request_tokens;	/* new prompt tokens + max_tokens of one request */
	int64_t default_max_tokens;	/* max_tokens when a request gives none */
	int64_t max_conversations;	/* conversation directories */
	int64_t max_open;		/* conversations held open (sessions, pagers) */
	int64_t max_queue;		/* requests waiting or running */
	int64_t budget;			/* view budget of a session (0: unlimited) */
	int block, chunk, threads;
	uint64_t host_cap;		/* host pool of each conversation's pager */
	int request_timeout;		/* seconds a request may wait or run */
	int quiet;
	/* Test only (KVMEM_SERVE_FAULT=record:N): end the process at the N-th
	 * turn between its record and its commit, as a crash there would. */
	int64_t fault_record;
};

enum job_kind { JOB_CHAT = 0, JOB_TEXT = 1 };

/* A request on its way through the engine. Fields above `mu-guarded` are
 * set by the HTTP thread before submit and read-only after; the rest are
 * guarded by the engine lock. */
struct job {
	int refs;			/* the HTTP side and the engine */
	int kind;
	int stream, include_usage;
	char conv[SERVE_ID_MAX + 1];	/* "" for no conversation */
	/* chat: the request's messages, each {role, content, reasoning?,
	 * tool_calls?: [{name, arguments}]}, normalised; text: the prompt */
	json_t *messages;
	char **tools;			/* tools as the template writes them */
	int n_tools;
	int thinking;			/* -1 default, 0, 1 */
	char *prompt;
	size_t prompt_len;
	int64_t max_tokens;
	kvmem_sampler sampler;
	int sampled;			/* temperature > 0 */
	double t_submit;

	/* ---- mu-guarded ------------------------------------------------ */
	int done, cancelled;
	int http;			/* 0 while fine; else the HTTP error status */
	char code[48], msg[640];
	char *out;			/* content decoded so far: a stable prefix */
	size_t out_len, out_cap;
	char *reasoning;		/* chat, Qwen3: the thinking, when split off */
	int finish_length;		/* finished on max_tokens, not on a stop */
	int replayed;			/* the answer was stored: nothing ran */
	int restored;			/* the conversation was reopened from disk */
	int64_t prompt_tokens, completion_tokens, ws_tokens;
	double t_first, t_end;

	/* ---- the engine's own ------------------------------------------ */
	struct job *next;
	struct conv *cv;
	kvmem_session *s;		/* the conversation's, or one of its own */
	kvmem_ids ids;			/* to append */
	size_t appended;
	kvmem_ids gen;			/* generated (the content's ids) */
	int stopped;			/* ended on a stop token, stop_id */
	int32_t stop_id;
	int phase;
	int64_t msgs_total;		/* chat: messages after this turn (without the answer) */
};

/* The engine (serve_engine.c). */
int serve_engine_start(const struct serve_cfg *cfg);
void serve_engine_stop(void);
/* Queue a job (takes a reference). -EBUSY when the queue is full. */
int serve_engine_submit(struct job *j);
void serve_job_put(struct job *j);
/* Wait until the job has news (more output, done) or `until` (monotonic
 * seconds) passes; with the engine lock held by the caller. */
void serve_lock(void);
void serve_unlock(void);
int serve_wait(struct job *j, size_t have, double until);
/* Prometheus text of the engine's counters, malloc'd. */
char *serve_metrics(void);
const char *serve_model_name(void);
int64_t serve_model_window(void);
double serve_now(void);
/* 1 when s is a conversation id: [A-Za-z0-9], then [A-Za-z0-9._-], at most
 * SERVE_ID_MAX bytes, no "..". */
int serve_id_ok(const char *s);

/* v as JSON text the way transformers' tojson filter writes it (Python's
 * json.dumps with ensure_ascii=False; serve_tojson.c). malloc'd, NULL when
 * out of memory. */
char *serve_tojson(const json_t *v);

/* The HTTP side (serve_http.c). */
int serve_http_start(const struct serve_cfg *cfg);
/* The port listened on (what --port 0 was given). */
int serve_http_port(void);
void serve_http_stop(void);

/* A conversation's record beside its workspace (serve_conv.c). */
struct conv {
	char id[SERVE_ID_MAX + 1];
	char dir[4096];			/* <data>/conversations/<id>, or its
					 * workspace rados://POOL/conv.<id> */
	int shared;			/* in --store: the record is in the store */
	kvmem_workspace *ws;
	kvmem_session *s;
	int kind;			/* -1: none yet, JOB_CHAT, JOB_TEXT */
	json_t *messages;		/* chat: every message held, answers included */
	char *text;			/* text: the prompts and completions held */
	size_t text_len;
	json_t *turns;			/* [{"messages"|"text": n, "tokens": t}] */
	int busy, restored;
	double last_used;
	struct conv *next;
};

/* Read <dir>/conversation.json (absent: a new conversation), or a shared
 * conversation's record beside its workspace, and trim it to the
 * workspace's committed token count. */
int conv_load(struct conv *c, int64_t ws_tokens);
/* Write it (atomically, synced) with a new turn ending at `tokens`. */
int conv_save(struct conv *c, int64_t tokens);
void conv_free_record(struct conv *c);

#endif
