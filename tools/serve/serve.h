/* SPDX-License-Identifier: MIT */
/*
 * kvmem serve: an OpenAI-compatible HTTP server in which every conversation
 * is a workspace. This header is what a program that runs the server needs
 * (cmd_serve.c, `kvmem bench serve`): the options, start, stop. The parts
 * share serve_int.h; Documentation/serve.md tells the API.
 *
 *   struct serve_cfg c; serve_cfg_default(&c); c.model_dir = ...;
 *   struct serve *sv;
 *   serve_start(&c, &sv);          model, backend, engine thread, HTTP
 *   ... serve_port(sv) ...
 *   serve_stop(sv);                HTTP first, then the engine; frees sv
 */
#ifndef KVMEM_TOOLS_SERVE_H
#define KVMEM_TOOLS_SERVE_H

#include <stdint.h>

#define SERVE_WHO "kvmem serve"
#define SERVE_ID_MAX 128	/* bytes of a conversation id */

/* The order prompts take a round's prefill budget in (--prefill-order). */
enum { SERVE_PREFILL_FCFS, SERVE_PREFILL_SHARED };

struct serve_cfg {
	const char *model_dir, *model_name, *data_dir, *host, *api_key, *backend, *policy;
	const char *cors;		/* Access-Control-Allow-Origin; NULL: no CORS */
	const char *store;		/* rados://POOL: conversations shared there */
	/* A published geometry with random weights instead of model_dir (the
	 * cuda backend makes them), for timing it under load; its text goes
	 * through the bytes tokenizer. */
	const char *preset;
	const char *tokenizer;		/* "bytes": kvmem_tokenizer_bytes; NULL: the model's */
	int port;
	uint64_t max_body;		/* bytes of a request body */
	int64_t max_request_tokens;	/* new prompt tokens + max_tokens of one request */
	int64_t default_max_tokens;	/* max_tokens when a request gives none */
	int64_t max_conversations;	/* conversation directories */
	int64_t max_open;		/* conversations held open (sessions, pagers) */
	int64_t max_queue;		/* requests waiting or running */
	int64_t max_inflight;		/* turns running at once (admitted) */
	int64_t max_batch;		/* units in one round of the engine */
	int64_t prefill_budget;		/* prefill tokens in one round (whole chunks; 0:
					 * 4 chunks) */
	int prefill_order;		/* who takes it: SERVE_PREFILL_FCFS (0) or _SHARED */
	int64_t max_conv_queue;		/* requests of one conversation waiting */
	int64_t max_conv_tokens;	/* tokens a conversation may hold (0: no limit) */
	int64_t max_n;			/* choices of one request */
	int idle_close;			/* seconds before an idle conversation closes (0: never) */
	/* An open conversation idle this many seconds gives its view up (0:
	 * never); its next turn lays it out again from its pages. */
	double idle_release;
	int64_t max_views;		/* open conversations holding a view at once */
	/* Milliseconds a round gives one conversation's view work (a
	 * selection's placements, a view laid out again, a reopened history's
	 * index) before the others' units run: slices until they are spent,
	 * at least one (0: one slice a round). */
	double view_slice_ms;
	int64_t budget;			/* view budget of a session (0: unlimited; -1: from the window) */
	int block, chunk, threads;	/* chunk 0: the backend's (128 cpu, 512 a GPU) */
	uint64_t host_cap;		/* the host pool the conversations share */
	uint64_t max_disk;		/* bytes the conversations' files may take (0: no cap) */
	uint64_t gpu_mem;		/* the backend's memory cap (kvmem_backend_opts.mem_cap;
					 * 0: none) */
	/* --kv-dtype: the views' KV and new conversations' pages, 0 (the
	 * backend's own; pages f32) or KVMEM_DTYPE_FP8 (e4m3 with scales:
	 * conversations of the other kind are refused, 409). */
	uint32_t kv_dtype;
	/* --batch-prefill: a round's prompt chunks of up to 256 tokens share
	 * forward passes (kvmem_backend_opts.batch_prefill; the cuda backend
	 * then pins its GEMMs, a short chunk alone ~10% slower in them). */
	int batch_prefill;
	int request_timeout;		/* seconds a request may wait or run */
	int quiet;
	/* Test only (KVMEM_SERVE_FAULT=record:N): end the process at the N-th
	 * turn between its record and its commit, as a crash there would. */
	int64_t fault_record;
};

struct serve;

/* The defaults `kvmem serve` documents (budget -1: from the window). */
void serve_cfg_default(struct serve_cfg *c);
/* --tokenizer NAME of kvmem serve and kvmem bench serve: 0 for the one
 * there is ("bytes"), else -1 after a message on stderr naming `who`. */
int serve_tokenizer_opt(const char *who, const char *name);
/* Load the model, open the backend, start the engine thread and the HTTP
 * listener. cfg is copied. -errno with kvmem_error, nothing left running. */
int serve_start(const struct serve_cfg *cfg, struct serve **out);
/* The port listened on (what --port 0 was given). */
int serve_port(const struct serve *sv);
const char *serve_model_name(const struct serve *sv);
const char *serve_backend_name(const struct serve *sv);
/* The form the backend multiplies its weights in ("bf16", "fp32"), or NULL
 * where it does not say (its ops have no weight_bytes). */
const char *serve_weights_name(const struct serve *sv);
/* The view budget in force (from the window when the options gave -1). */
int64_t serve_budget(const struct serve *sv);
/* The prefill chunk and the prefill tokens of a round in force (the
 * backend's defaults when the options gave 0). */
void serve_prefill(const struct serve *sv, int *chunk, int64_t *round_tokens);
/* --prefill-order's word (fcfs, shared) into *order; -1 with a message
 * naming `who` and the words it takes. */
int serve_parse_prefill_order(const char *who, const char *word, int *order);
/* Its word for order, and what it means as the start-up lines say it. */
const char *serve_prefill_order_name(int order);
const char *serve_prefill_order_says(int order);
/* Bytes of the shared host pool pinned for the backend at start (0: none,
 * the cpu backend) and the seconds that took. */
uint64_t serve_pinned(const struct serve *sv, double *seconds);
/* Turns undone short of memory so far, to run again (serve.md, "Device
 * memory"). */
uint64_t serve_parked(struct serve *sv);
/* Stop listening, finish or fail what runs, close every conversation. */
void serve_stop(struct serve *sv);

#endif
