/* SPDX-License-Identifier: MIT */
/*
 * What the server's parts share (not for programs that only run it:
 * serve.h). One `struct serve` is the app: serve_start makes it, every part
 * gets it (libmicrohttpd's closure pointers carry it), serve_stop frees it.
 *
 *   serve_app.c      start and stop: the model, the backend, the parts
 *   serve_http.c     the socket and the daemon, routing, the bearer token,
 *                    CORS, OpenAI-shaped errors
 *   serve_screen.c   each connection's request head screened before
 *                    libmicrohttpd reads it
 *   serve_parse.c    a request body into jobs (strict JSON, every field)
 *   serve_answer.c   answers: whole, and server-sent events
 *   serve_api.c      conversations listed, read, deleted; tokenize
 *   serve_engine.c   the engine thread: admission (a fair queue) and rounds
 *   serve_batch.c    the batch runner (serve_batch.h): a round's units
 *   serve_job.c      jobs: made, cloned (n choices), counted, failed
 *   serve_turn.c     a turn: match, render, sample, stop, close, commit
 *   serve_sample.c   sampling (min_p, top_k, ...), log probabilities, JSON
 *   serve_pool.c     open conversations: open, close, evict, idle, delete
 *   serve_conv.c     a conversation's record beside its workspace
 *   serve_metrics.c  /metrics
 *   serve_tojson.c   JSON as the chat template's tojson writes it
 *
 * Threads: libmicrohttpd's (one per connection) make jobs and wait for
 * them; the engine thread owns the model, the backend, the tokenizer's use
 * in turns, every session and conversation. `mu` guards what both see: the
 * admission queue, a job's published output, the counters.
 */
#ifndef KVMEM_TOOLS_SERVE_INT_H
#define KVMEM_TOOLS_SERVE_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvmem/model.h"
#include "kvmem/pager.h"
#include "kvmem/session.h"
#include "kvmem/store.h"
#include "serve.h"
#include "serve_batch.h"
#include "tok_cli.h"

#define SERVE_STOP_MAX 4		/* stop strings of a request */
#define SERVE_TOP_LOGPROBS_MAX 20	/* top_logprobs, as OpenAI allows */

enum job_kind { JOB_CHAT = 0, JOB_TEXT = 1, JOB_DELETE = 2 };

struct serve_sampling {
	float temperature;		/* <= 0: greedy */
	float top_p, min_p;
	int top_k;			/* 0: no cut */
	uint64_t seed;			/* the request's, or a fresh random one */
};

/* One generated token's log probabilities (the model's distribution at
 * temperature 1, before any cut). */
struct tok_lp {
	int32_t id;
	float lp;
	int n_top;
	int32_t top_id[SERVE_TOP_LOGPROBS_MAX];
	float top_lp[SERVE_TOP_LOGPROBS_MAX];
};

/* Incremental JSON checker for response_format json_object (serve_sample.c). */
struct json_prefix {
	char stack[64];			/* '{' or '[' per open level */
	int depth;
	int state;			/* where in the grammar */
	int done;			/* the top-level object is complete */
	int lit;			/* literal being matched (true/false/null) */
	int lit_at;
	int esc;			/* \u digits left, or -1 after a backslash */
	int num;			/* number state */
	int ws;				/* blanks in a row */
};

/*
 * A request on its way through the engine (one per choice when n > 1).
 * Fields above `mu-guarded` are set by the HTTP thread before submit and
 * read-only after; the rest are guarded by sv->mu, or the engine's own.
 */
struct job {
	struct serve *sv;
	int refs;			/* mu: the HTTP side, the queue, the engine */
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
	struct serve_sampling samp;
	char *stop[SERVE_STOP_MAX];	/* stop strings */
	int n_stop;
	int logprobs;			/* 1: log probabilities of the tokens */
	int top_logprobs;		/* alternatives each, 0..SERVE_TOP_LOGPROBS_MAX */
	int json_object;		/* response_format json_object: constrained */
	int ignore_eos;			/* stops are never drawn (vLLM's extension) */
	int index;			/* the choice's index */
	int n_choices;			/* of the request */
	struct job *lead;		/* the request's choice 0 (itself for it) */
	pthread_cond_t news;		/* the lead's: any choice has news */
	double t_submit;

	/* ---- mu-guarded ------------------------------------------------ */
	int done, cancelled;
	uint64_t seq;			/* mu: taken at admission; a whole answer's id counts with it */
	int http;			/* 0 while fine; else the HTTP error status */
	char code[48], msg[640];
	int retry_after;		/* seconds, with a 429 or a 503 */
	char *out;			/* content decoded so far: a stable prefix */
	size_t out_len, out_cap;
	char *reasoning;		/* chat, Qwen3: the thinking, when split off */
	int finish_length;		/* finished on max_tokens, not on a stop */
	int replayed;			/* the answer was stored: nothing ran */
	int restored;			/* the conversation was reopened from disk */
	int64_t prompt_tokens, completion_tokens, ws_tokens;
	double t_first, t_end;
	struct tok_lp *lps;		/* logprobs: one per generated token */
	size_t n_lps, cap_lps;

	/* ---- the engine's own ------------------------------------------ */
	struct job *next;		/* in its lane, then in the run list */
	struct lane *lane;
	struct conv *cv;
	kvmem_session *s;		/* the conversation's, or one of its own */
	kvmem_session_stats st0;	/* s's counters when the turn started */
	/* The next token drawn ahead of its unit (turn_predraw), beside the
	 * other turns' draws: its id and logprobs, or the failure. */
	int drawn, drawn_rc;
	int32_t drawn_id;
	float *masked;			/* [vocab]: the logits a masked draw reads */
	struct tok_lp drawn_lp;
	char drawn_err[256];
	kvmem_ids ids;			/* to append */
	size_t appended;
	uint64_t prefill_round;		/* the last round that ran a chunk of its prompt */
	int64_t prefill_rounds;		/* rounds that did (the answer's kvmem.prefill_rounds) */
	kvmem_ids gen;			/* generated (the content's ids) */
	char *text;			/* gen decoded, cut at a stop string */
	size_t text_len;
	int stopped;			/* ended on a stop token (stop_id) or string */
	int32_t stop_id;
	int32_t tok;			/* this round's decode token */
	int phase;
	/* The first token, sampled when the prompt's prefill ended (and sent
	 * at once), waits for the selection to be appended: pending, and the
	 * phase its sampling left (PH_DECODE, or PH_CLOSE when it ended the
	 * turn). */
	int pending, after_first;
	char short_of[512];		/* a parked turn: what ran out (turn_after) */
	int64_t msgs_total;		/* chat: messages after this turn (without the answer) */
	uint64_t rng;			/* the request's sampler state */
	struct json_prefix jp;
};

/* A conversation open in the engine (serve_pool.c); its record (serve_conv.c). */
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
	json_t *turns;			/* [{"messages"|"text": n, "tokens": t, ...}] */
	int busy, restored;
	double last_used;
	int view_away;			/* its view given up (pool_views) */
	double restore_s;		/* seconds its layout has taken so far (pool_view_back_step) */
	struct conv *next;
};

/* The requests of one conversation waiting (FIFO), or of one request of
 * no conversation; lanes are served round-robin. */
struct lane {
	char conv[SERVE_ID_MAX + 1];	/* "" for a request of no conversation */
	struct job *head, *tail;	/* waiting */
	int64_t n;			/* waiting */
	struct job *running;		/* admitted, not finished */
	struct lane *next;
};

/* The round-time histogram's upper bounds in seconds (serve_metrics.c);
 * the last bucket is +Inf. */
#define SERVE_ROUND_BUCKETS 11
extern const double serve_round_le[SERVE_ROUND_BUCKETS];

struct serve_counters {
	uint64_t requests, failed, rejected, cancelled, replays, turns, deletes;
	uint64_t prompt_tokens, completion_tokens, selections;
	uint64_t restores, fresh_views, evictions, idle_closes;
	/* Views given up by idle conversations and laid out again
	 * (serve_pool.c); views_away: open conversations without one now. */
	uint64_t view_releases, view_restores, view_restore_tokens, view_restore_steps;
	int64_t views_away;
	double view_restore_s;
	double prefill_s, decode_s, select_s, commit_s, ttft_s, ttft_n, turn_s;
	/* Turns undone short of memory to wait again (serve_engine.c, park). */
	uint64_t parked;
	uint64_t rounds, units, batch_max;
	int64_t batch_last;
	/* Each round's wall time, what every running stream waited for a
	 * token in it (serve_engine.c): a histogram over SERVE_ROUND_BUCKETS,
	 * the sum and the longest. */
	uint64_t round_hist[SERVE_ROUND_BUCKETS + 1];
	double round_s, round_max_s;
	/* The draws made ahead of a round's units (turn_predraw): how many,
	 * and the round's wall time they took, side by side. */
	uint64_t predraws;
	double predraw_s;
	uint64_t device_bytes;		/* the backend's, after the last round */
	/* The sessions' own time, summed over turns as each ends (turn_end):
	 * where a unit's seconds went inside the session (/metrics'
	 * kvmem_session_seconds_total). */
	kvmem_session_stats sess;
	struct serve_batch_stats batch;	/* the runner's, after the last round */
};

struct serve_http;

struct serve {
	struct serve_cfg cfg;
	char model_dir[3800], data_dir[3800];	/* room for what is built on them */
	/* read-only after start */
	kvmem_model *m;
	kvmem_backend *be;
	/* The conversations' pages, one host pool for all (--host-cap): an
	 * open conversation holds slots while its pages are in use, not a
	 * pool of its own. NULL where it could not be made: each has its own. */
	kvmem_pager_pool *pool;
	kvmem_page_geom pool_geom;	/* what fits in it */
	/* The pool pinned for the backend at start (host_register; NULL: it
	 * has no device or refused), and what that took. */
	void *pinned;
	uint64_t pinned_bytes;
	double pin_s;
	struct tok_cli tok;
	char name[256];
	/* the engine */
	pthread_mutex_t mu;
	pthread_cond_t work;
	pthread_t thread;
	int running, started;
	struct lane *lanes, *lanes_tail, *cursor;	/* mu: admission */
	int64_t waiting, inflight;			/* mu: jobs in lanes / admitted */
	/* mu: while memory is short (a turn was parked and others run), a new
	 * turn is admitted only for one that ended: mem_slots counts them;
	 * mem_parked: a turn was parked since the last one ended. */
	int mem_short, mem_parked;
	int64_t mem_slots;
	struct conv *convs;		/* open (engine; the list under mu for /metrics) */
	int64_t n_open;
	struct serve_counters c;	/* mu */
	struct serve_batch_stats bs;	/* the engine's; copied under mu */
	kvmem_pager_stats closed;	/* mu: pagers of conversations since closed */
	int64_t fault_records;		/* turns recorded, for KVMEM_SERVE_FAULT */
	uint64_t id_counter;		/* mu */
	char **piece_text;		/* the engine's: each id's text (json_object) */
	size_t *piece_len;
	double disk_t;			/* mu: the data directory's disk walk, cached */
	uint64_t disk_bytes;
	uint64_t disk_pending;		/* mu: --max-disk: turns' estimates since the walk */
	struct serve_http *http;
};

/* ---- the engine (serve_engine.c) ------------------------------------------- */
int serve_engine_start(struct serve *sv);
void serve_engine_stop(struct serve *sv);
/* Queue the jobs of one request (n choices; takes a reference each). 0, or
 * an HTTP status (429, 503) with the job's code, msg and retry_after set. */
int serve_engine_submit(struct serve *sv, struct job **jobs, int n);
/* Wait until the lead's request has news or `until` (monotonic seconds)
 * passes; with sv->mu held. -ETIMEDOUT at `until`. */
int serve_wait(struct job *lead, double until);
/* Wake the job's request (mu held). */
void serve_news(struct job *j);
double serve_now(void);

/* ---- jobs (serve_job.c) and turns (serve_turn.c) -------------------------------- */
struct job *job_new(struct serve *sv, int kind);
/* Another choice of the same request (index i). NULL when out of memory. */
struct job *job_clone(struct job *lead, int i);
void job_put(struct job *j);
/* Finish a job with an error (engine side; takes mu). */
void job_fail(struct job *j, int http, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* A unit or a commit failed with err: a full disk is the conversation's own
 * trouble (507 insufficient_storage), anything else the server's (500). */
void job_fail_errno(struct job *j, int err, const char *msg);
/* Start a turn: match, render, tokenize. 0 to run, 1 done (replayed or failed). */
int turn_start(struct job *j);
/* Tokens the turn's next unit would prefill (whole chunks: the round's
 * budget), 0 when it is another kind of unit, -1 when its units are done
 * (turn_close is next). */
int turn_prefill_next(const struct job *j);
/* Prompt tokens the turn has still to prefill (0 past its prefill). */
int64_t turn_prefill_left(const struct job *j);
/* The next unit of a running turn into u (0); 1 when it has none (its units
 * are done: turn_close is next); -1 when it failed (the job is done). */
int turn_unit(struct job *j, struct serve_unit *u);
/* The next tokens of the decode turns among run[0..n) whose draw reads
 * their logits on the host (a temperature, logprobs), drawn ahead of their
 * units and beside each other (OpenMP): a draw at a temperature over
 * Qwen3's 151,936 logits takes the engine thread ~4 ms, one a stream a
 * round. turn_unit takes the token drawn; the same tokens as drawing one
 * by one. */
int turn_predraw(struct job *const *run, int n);
/* After its unit ran: 1 when the turn is over. */
int turn_after(struct job *j, struct serve_unit *u);
/* Close and commit a turn whose units are done: 1 (always over). */
int turn_close(struct job *j);
/* After a turn: release its session or its conversation. */
void turn_end(struct job *j);
/* 1 when the turn ran out of memory before its first token: its start
 * found no room for its view, or a prefill or selection unit ran out
 * (turn_after); short_of says what. */
int turn_parked(const struct job *j);
/* Undo a parked turn: its session goes (a conversation's closes, to reopen
 * at its last commit, as after a failed turn) and the job is as it was
 * before turn_start: nothing of it reached the client. */
void turn_undo(struct job *j);

/* ---- sampling (serve_sample.c) ------------------------------------------------ */
/* Draw a token from logits[vocab]: the request's settings, its rng; fills
 * lp (when not NULL) with the token's log probabilities and top alternatives.
 * When jp is not NULL only tokens that keep the text a prefix of one JSON
 * object are drawn (pieces: each id's text). -errno. */
int serve_sample(struct serve *sv, const float *logits, int vocab, struct job *j,
		 uint64_t *rng, struct json_prefix *jp, int32_t *out, struct tok_lp *lp);
/* Feed text to a JSON checker: 0 while it stays a prefix of one object,
 * -1 when it cannot. */
int json_prefix_feed(struct json_prefix *jp, const char *s, size_t n);
/* 1 when some token of the vocabulary can begin a JSON object. */
int serve_json_possible(struct serve *sv);
/* A fresh seed for a request that gave none. */
uint64_t serve_random_seed(void);

/* ---- open conversations (serve_pool.c) ---------------------------------------- */
/* The open conversation `id`, opened (or created) when it is not; NULL
 * after job_fail. */
struct conv *pool_get(struct serve *sv, struct job *j);
void pool_close(struct serve *sv, struct conv *c);
/* Close idle conversations past --idle-close; idle ones past
 * --idle-release give their views up. */
void pool_idle(struct serve *sv);
/* Views: idle conversations past --idle-release, and the least recently
 * used idle ones while more than --max-views would hold one (counting
 * `extra` views about to be laid out), give theirs up. */
void pool_views(struct serve *sv, int extra);
/* Memory is short (a turn was parked): every idle conversation gives its
 * view up. How many did. */
int pool_views_idle(struct serve *sv);
/* Before c's turn (c busy): room for its view under --max-views; 1 when
 * its view was given up and must be laid out again from its pages (never a
 * prefill), by pool_view_back_step a round until it returns 0 (or -1,
 * the session broken). A step lays out an eighth of the layers (at least
 * one): a view comes back over up to eight rounds, and the rounds between
 * run the other conversations' units (tools/bench/serve_stall.py). */
int pool_view_back_begin(struct serve *sv, struct conv *c);
int pool_view_back_step(struct serve *sv, struct conv *c);
/* JOB_DELETE: remove the conversation's directory (closing it first). */
void pool_delete(struct serve *sv, struct job *j);
void pool_close_all(struct serve *sv);
int64_t pool_count_dirs(const struct serve *sv);

/* ---- the record (serve_conv.c) ----------------------------------------------- */
/* Read <dir>/conversation.json (absent: a new conversation) and trim it to
 * the workspace's committed token count. */
int conv_load(struct conv *c, int64_t ws_tokens);
/* Write it (atomically, synced) with a new turn ending at `tokens`; the
 * turn's usage and answer are kept so that a replay reports them. */
int conv_save(struct conv *c, int64_t tokens, const struct job *j);
void conv_free_record(struct conv *c);
/* Read a conversation's record from disk alone (GET /v1/conversations/ID). */
json_t *conv_read(const char *dir, char *err, size_t errlen);

/* ---- the HTTP side (serve_http.c, serve_answer.c, serve_api.c, serve_parse.c) -- */
int serve_http_start(struct serve *sv);
int serve_http_port(const struct serve *sv);
void serve_http_stop(struct serve *sv);
/* 1 when s (len bytes) is a conversation id: [A-Za-z0-9], then
 * [A-Za-z0-9._-], at most SERVE_ID_MAX bytes, no "..". */
int serve_id_ok(const char *s, size_t len);
/* "chatcmpl-..." ids. */
void serve_new_id(struct serve *sv, char *buf, size_t len, const char *prefix, uint64_t seq);

/* A request's field refused: where and why. */
struct bad {
	char msg[600], param[64], code[48];
};
int bad(struct bad *b, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Parse a chat or completion body into j (kind set). -1 with b filled. */
int serve_parse(json_t *req, struct job *j, struct bad *b);
/* A request's "messages", normalised: [{role, content, reasoning?,
 * tool_calls?: [{name, arguments}]}]; NULL with b filled. */
json_t *serve_parse_messages(json_t *v, struct bad *b);
/* kvmem_chat_msg views of normalised messages (valid while they live);
 * free() both. NULL when out of memory. */
kvmem_chat_msg *serve_chat_msgs(json_t *ms, const char ***strs);

/* ---- metrics (serve_metrics.c) -------------------------------------------------- */
char *serve_metrics(struct serve *sv);
/* Bytes the conversations take on disk, walked at most every max_age
 * seconds (the walk is the slow part of /metrics). */
uint64_t serve_disk_bytes(struct serve *sv, double max_age);

/* v as JSON text the way transformers' tojson filter writes it (Python's
 * json.dumps with ensure_ascii=False; serve_tojson.c). malloc'd, NULL when
 * out of memory. */
char *serve_tojson(const json_t *v);

#endif
