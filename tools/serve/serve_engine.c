// SPDX-License-Identifier: MIT
/*
 * kvmem serve's engine: one thread owns the model, the backend (one view per
 * session), the tokenizer and every conversation, and runs the requests
 * interleaved at step boundaries: each turn in the run queue does one unit
 * (a prefill chunk, the selection, one decoded token, the closing and the
 * commit) before the next turn has its go. Sessions never share a view, so a
 * request never sees another conversation's tokens, and each one's results
 * are what it would compute alone.
 *
 * A turn of a conversation: the request's messages must begin with every
 * message the conversation holds (else 409), the new ones are rendered by
 * the chat template and appended, a selection is made, the answer decoded,
 * the turn closed in the history (a newline, or <|im_end|>), the record
 * written and the workspace committed. A request that repeats a turn whose
 * answer is held (the client lost the answer, e.g. the server died before
 * sending it) gets the stored answer back without running anything.
 */
#ifndef KVMEM_NO_SERVE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvmem/backend.h"
#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "serve.h"
#include "util/fs.h"

enum { PH_PREFILL = 0, PH_SELECT, PH_DECODE, PH_CLOSE };

static struct engine {
	pthread_mutex_t mu;
	pthread_cond_t work, news;
	pthread_t thread;
	int running, started;
	const struct serve_cfg *cfg;
	kvmem_model *m;
	kvmem_backend *be;
	struct tok_cli tok;
	char name[256];
	struct job *queue, *queue_tail;	/* submitted, not yet taken */
	int64_t queued;			/* submitted and not finished */
	struct conv *convs;		/* open conversations */
	int64_t n_open;
	/* counters (mu) */
	uint64_t requests, failed, replays, prompt_tokens, completion_tokens, turns;
	uint64_t selections, forced, restores, fresh_views, evictions;
	double prefill_s, decode_s, select_s, commit_s, ttft_s, ttft_n;
	kvmem_pager_stats closed;	/* pagers of conversations since closed */
	int64_t fault_records;		/* turns recorded, for KVMEM_SERVE_FAULT (engine thread) */
} E = { .mu = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER,
	 .news = PTHREAD_COND_INITIALIZER };

double serve_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

void serve_lock(void)
{
	pthread_mutex_lock(&E.mu);
}

void serve_unlock(void)
{
	pthread_mutex_unlock(&E.mu);
}

const char *serve_model_name(void)
{
	return E.name;
}

int64_t serve_model_window(void)
{
	return E.m ? E.m->cfg.max_position : 0;
}

int serve_id_ok(const char *s)
{
	size_t n = strlen(s);

	if (!n || n > SERVE_ID_MAX || strstr(s, ".."))
		return 0;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		int alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');

		if (!alnum && (i == 0 || (ch != '.' && ch != '_' && ch != '-')))
			return 0;
	}
	return 1;
}

/* ---- jobs ----------------------------------------------------------------- */
void serve_job_put(struct job *j)
{
	int last;

	if (!j)
		return;
	pthread_mutex_lock(&E.mu);
	last = --j->refs == 0;
	pthread_mutex_unlock(&E.mu);
	if (!last)
		return;
	json_decref(j->messages);
	for (int i = 0; i < j->n_tools; i++)
		free(j->tools[i]);
	free(j->tools);
	free(j->prompt);
	free(j->out);
	free(j->reasoning);
	kvmem_ids_free(&j->ids);
	kvmem_ids_free(&j->gen);
	free(j);
}

int serve_engine_submit(struct job *j)
{
	pthread_mutex_lock(&E.mu);
	if (E.queued >= E.cfg->max_queue) {
		pthread_mutex_unlock(&E.mu);
		return -EBUSY;
	}
	j->refs++;
	j->next = NULL;
	if (E.queue_tail)
		E.queue_tail->next = j;
	else
		E.queue = j;
	E.queue_tail = j;
	E.queued++;
	E.requests++;
	pthread_cond_signal(&E.work);
	pthread_mutex_unlock(&E.mu);
	return 0;
}

int serve_wait(struct job *j, size_t have, double until)
{
	while (!j->done && j->out_len == have) {
		struct timespec ts;
		double t = serve_now();

		if (t >= until)
			return -ETIMEDOUT;
		/* news is signalled on the monotonic clock's behalf: wait in
		 * short slices of real time. */
		clock_gettime(CLOCK_REALTIME, &ts);
		double w = until - t < 0.25 ? until - t : 0.25;
		ts.tv_sec += (time_t)w;
		ts.tv_nsec += (long)((w - (time_t)w) * 1e9);
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&E.news, &E.mu, &ts);
	}
	return 0;
}

/* Finish a job with an error (engine side). */
static void job_fail(struct job *j, int http, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void job_fail(struct job *j, int http, const char *code, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&E.mu);
	j->http = http;
	snprintf(j->code, sizeof(j->code), "%s", code);
	va_start(ap, fmt);
	vsnprintf(j->msg, sizeof(j->msg), fmt, ap);
	va_end(ap);
	j->done = 1;
	j->t_end = serve_now();
	E.failed++;
	pthread_cond_broadcast(&E.news);
	pthread_mutex_unlock(&E.mu);
	if (!E.cfg->quiet)
		fprintf(stderr, "%s: request failed (%d %s): %s\n", SERVE_WHO, http, code, j->msg);
}

/* ---- conversations ---------------------------------------------------------- */
static int64_t count_conversations(void)
{
	char dir[4200];
	DIR *d;
	struct dirent *e;
	int64_t n = 0;

	snprintf(dir, sizeof(dir), "%s/conversations", E.cfg->data_dir);
	d = opendir(dir);
	if (!d)
		return 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static void pager_add(kvmem_pager_stats *a, const kvmem_pager_stats *b)
{
#define ADD(name, what) a->name += b->name;
	KVMEM_PAGER_STATS(ADD)
#undef ADD
}

static void conv_close(struct conv *c)
{
	kvmem_pager_stats st;

	if (c->ws) {
		kvmem_pager_stats_get(kvmem_workspace_pager(c->ws), &st);
		pthread_mutex_lock(&E.mu);
		pager_add(&E.closed, &st);
		pthread_mutex_unlock(&E.mu);
	}
	kvmem_session_free(c->s);
	if (c->ws && kvmem_workspace_close(c->ws) < 0)
		fprintf(stderr, "%s: conversation %s: %s\n", SERVE_WHO, c->id, kvmem_last_error());
	conv_free_record(c);
	free(c);
}

static void conv_unlink(struct conv *c)
{
	pthread_mutex_lock(&E.mu);
	for (struct conv **p = &E.convs; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			E.n_open--;
			break;
		}
	pthread_mutex_unlock(&E.mu);
}

/* A shared conversation (--store) no turn runs in is let go, and its
 * lease with it: another server may take its next turn. */
static void conv_release_idle(const char *id)
{
	for (struct conv *c = E.convs; c; c = c->next)
		if (c->shared && !c->busy && !strcmp(c->id, id)) {
			conv_unlink(c);
			conv_close(c);
			return;
		}
}

static void session_opts(kvmem_session_opts *so, const kvmem_page_source *src, uint64_t seed)
{
	kvmem_session_opts_default(so);
	so->block = E.cfg->block;
	so->budget = E.cfg->budget;
	so->chunk = E.cfg->chunk;
	so->policy = E.cfg->policy;
	so->seed = seed;
	so->source = src;
}

/* The open conversation `id`, opened (or created) when it is not. */
static struct conv *conv_get(struct job *j)
{
	struct conv *c;
	char ws[4300];
	struct stat st;
	kvmem_session_opts so;
	kvmem_workspace_opts wo = { 0 };
	int r;

	for (c = E.convs; c; c = c->next)
		if (!strcmp(c->id, j->conv))
			return c;
	c = calloc(1, sizeof(*c));
	if (!c) {
		job_fail(j, 500, "server_error", "out of memory");
		return NULL;
	}
	c->kind = -1;
	snprintf(c->id, sizeof(c->id), "%s", j->conv);
	c->shared = E.cfg->store != NULL;
	if (c->shared)
		snprintf(c->dir, sizeof(c->dir), "%s/conv.%s", E.cfg->store, j->conv);
	else
		snprintf(c->dir, sizeof(c->dir), "%s/conversations/%s", E.cfg->data_dir, j->conv);
	if (!c->shared && stat(c->dir, &st) && count_conversations() >= E.cfg->max_conversations) {
		free(c);
		job_fail(j, 429, "too_many_conversations", "the server holds %lld conversations, its "
			 "limit (--max-conversations): conversation '%s' cannot be created",
			 (long long)E.cfg->max_conversations, j->conv);
		return NULL;
	}
	/* Room: close the least recently used idle conversation. */
	while (E.n_open >= E.cfg->max_open) {
		struct conv *lru = NULL;

		for (struct conv *x = E.convs; x; x = x->next)
			if (!x->busy && (!lru || x->last_used < lru->last_used))
				lru = x;
		if (!lru)
			break;
		conv_unlink(lru);
		conv_close(lru);
		E.evictions++;
	}
	snprintf(ws, sizeof(ws), c->shared ? "%s" : "%s/ws", c->dir);
	wo.block = E.cfg->block;
	wo.host_cap = E.cfg->host_cap;
	if ((!c->shared && kvmem_mkdir_p(c->dir)) || kvmem_workspace_open(ws, E.m, &wo, &c->ws) < 0)
		goto fail;
	session_opts(&so, kvmem_workspace_source(c->ws), 0);
	if (!(c->s = kvmem_session_create(E.be, &so)))
		goto fail;
	r = kvmem_workspace_adopt(c->ws, c->s);
	if (r < 0)
		goto fail;
	if (kvmem_workspace_tokens(c->ws)) {
		c->restored = 1;
		pthread_mutex_lock(&E.mu);
		E.restores++;
		E.fresh_views += r == 1;
		pthread_mutex_unlock(&E.mu);
		if (r == 1)
			fprintf(stderr, "%s: conversation %s: the session state was not restored (%s); "
				"a fresh selection laid out the view\n", SERVE_WHO, c->id,
				kvmem_last_error());
	}
	if (conv_load(c, kvmem_workspace_tokens(c->ws)))
		goto fail;
	pthread_mutex_lock(&E.mu);
	c->next = E.convs;
	E.convs = c;
	E.n_open++;
	pthread_mutex_unlock(&E.mu);
	return c;
fail:
	/* Another server of a shared store writes it now (a turn at a time). */
	if (kvmem_last_errno() == EBUSY)
		job_fail(j, 409, "conversation_locked", "conversation '%s' is in use elsewhere: %s",
			 j->conv, kvmem_last_error());
	else
		job_fail(j, 500, "conversation_unavailable", "conversation '%s' (%s): %s", j->conv,
			 c->dir, kvmem_last_error());
	kvmem_session_free(c->s);
	if (c->ws)
		kvmem_workspace_close(c->ws);
	conv_free_record(c);
	free(c);
	return NULL;
}

/* ---- one turn -------------------------------------------------------------------- */
/* json_equal() says 0 when either side is absent. */
static int same(json_t *a, json_t *b)
{
	return (!a && !b) || (a && b && json_equal(a, b));
}

static int msg_same(json_t *a, json_t *b)
{
	return same(json_object_get(a, "role"), json_object_get(b, "role")) &&
	       same(json_object_get(a, "content"), json_object_get(b, "content")) &&
	       same(json_object_get(a, "tool_calls"), json_object_get(b, "tool_calls"));
}

/* kvmem_chat_msg views of the job's messages (valid while they live). */
static kvmem_chat_msg *chat_msgs(json_t *ms, const char ***strs)
{
	size_t n = json_array_size(ms), calls = 0, k = 0;
	kvmem_chat_msg *m;

	for (size_t i = 0; i < n; i++)
		calls += json_array_size(json_object_get(json_array_get(ms, i), "tool_calls"));
	m = calloc(n + 1, sizeof(*m));
	*strs = calloc(2 * calls + 1, sizeof(char *));
	if (!m || !*strs) {
		free(m);
		free(*strs);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *x = json_array_get(ms, i), *tc = json_object_get(x, "tool_calls");

		m[i].role = json_string_value(json_object_get(x, "role"));
		m[i].content = json_string_value(json_object_get(x, "content"));
		m[i].reasoning = json_string_value(json_object_get(x, "reasoning"));
		m[i].call_names = *strs + k;
		m[i].call_args = *strs + k + json_array_size(tc);
		m[i].n_calls = (int)json_array_size(tc);
		for (size_t t = 0; t < json_array_size(tc); t++)
			(*strs)[k + t] = json_string_value(json_object_get(json_array_get(tc, t), "name"));
		for (size_t t = 0; t < json_array_size(tc); t++)
			(*strs)[k + json_array_size(tc) + t] =
				json_string_value(json_object_get(json_array_get(tc, t), "arguments"));
		k += 2 * json_array_size(tc);
	}
	return m;
}

static void publish_text(struct job *j, const char *text, size_t len)
{
	pthread_mutex_lock(&E.mu);
	if (len + 1 > j->out_cap) {
		size_t cap = len + 256;
		char *p = realloc(j->out, cap);

		if (p) {
			j->out = p;
			j->out_cap = cap;
		}
	}
	if (len + 1 <= j->out_cap) {
		memcpy(j->out, text, len);
		j->out[len] = 0;
		j->out_len = len;
	}
	pthread_cond_broadcast(&E.news);
	pthread_mutex_unlock(&E.mu);
}

/* The stable text of what was generated: a trailing U+FFFD may still
 * become a character when the next token comes, so it waits unless final. */
static int refresh_text(struct job *j, int final)
{
	char *text;
	size_t len;

	if (kvmem_tokenizer_decode(E.tok.tok, j->gen.v, j->gen.n, KVMEM_TOK_SKIP_SPECIAL, &text, &len))
		return -1;
	while (!final && len >= 3 && !memcmp(text + len - 3, "\xEF\xBF\xBD", 3))
		len -= 3;
	if (len > j->out_len || final)
		publish_text(j, text, len);
	free(text);
	return 0;
}

/* Start a turn: match, render, tokenize. 0 to run, 1 done (replayed or failed). */
static int turn_start(struct job *j)
{
	kvmem_session_opts so;
	struct conv *c = NULL;
	size_t held = 0;
	int rc = 0;

	if (j->conv[0]) {
		if (!(c = conv_get(j)))
			return 1;
		if (c->busy) {
			job_fail(j, 409, "conversation_busy", "conversation '%s' is answering another "
				 "request: send the next turn when that one is done", j->conv);
			return 1;
		}
		if (c->kind >= 0 && c->kind != j->kind) {
			job_fail(j, 409, "conversation_kind", "conversation '%s' holds %s; it cannot "
				 "continue with %s", j->conv,
				 c->kind == JOB_CHAT ? "chat messages" : "completion text",
				 j->kind == JOB_CHAT ? "chat messages" : "completion text");
			return 1;
		}
		j->cv = c;
		j->s = c->s;
		j->restored = c->restored;
	}
	if (j->kind == JOB_CHAT) {
		size_t n = json_array_size(j->messages);
		const char **strs = NULL;
		kvmem_chat_msg *m;
		kvmem_chat_opts o = { .add_generation_prompt = 1, .thinking = j->thinking,
				      .tools = (const char *const *)j->tools, .n_tools = j->n_tools };

		held = c ? json_array_size(c->messages) : 0;
		for (size_t i = 0; i < held && i < n; i++)
			if (!msg_same(json_array_get(j->messages, i), json_array_get(c->messages, i))) {
				json_t *x = json_array_get(j->messages, i);

				job_fail(j, 409, "conversation_mismatch", "message %zu (%s) differs from what "
					 "conversation '%s' holds: a request sends the %zu messages the "
					 "conversation holds, unchanged, then its new ones", i,
					 json_string_value(json_object_get(x, "role")), j->conv, held);
				return 1;
			}
		if (c && n == held - 1 && held &&
		    !strcmp(json_string_value(json_object_get(json_array_get(c->messages, held - 1),
							      "role")), "assistant")) {
			/* The last turn again: its answer is held. */
			json_t *a = json_array_get(c->messages, held - 1);
			const char *t = json_string_value(json_object_get(a, "content"));

			pthread_mutex_lock(&E.mu);
			j->replayed = 1;
			j->ws_tokens = kvmem_session_tokens(c->s);
			E.replays++;
			pthread_mutex_unlock(&E.mu);
			publish_text(j, t ? t : "", t ? strlen(t) : 0);
			pthread_mutex_lock(&E.mu);
			j->done = 1;
			j->t_end = serve_now();
			pthread_cond_broadcast(&E.news);
			pthread_mutex_unlock(&E.mu);
			return 1;
		}
		if (n <= held) {
			job_fail(j, 409, "conversation_mismatch", "conversation '%s' holds %zu messages; "
				 "the request has %zu: nothing new to answer", j->conv, held, n);
			return 1;
		}
		m = chat_msgs(j->messages, &strs);
		if (!m) {
			job_fail(j, 500, "server_error", "out of memory");
			return 1;
		}
		rc = kvmem_chat_render(E.tok.tok, m, n, held, &o, &j->ids);
		free(m);
		free(strs);
		j->msgs_total = (int64_t)n;
	} else {
		held = c ? c->text_len : 0;
		if (c && held && (j->prompt_len < held || memcmp(j->prompt, c->text, held))) {
			job_fail(j, 409, "conversation_mismatch", "the prompt does not begin with the "
				 "%zu bytes of text conversation '%s' holds (its prompts and "
				 "completions so far): send them unchanged, then the new text", held,
				 j->conv);
			return 1;
		}
		rc = kvmem_tokenizer_encode(E.tok.tok, j->prompt + held, j->prompt_len - held,
					    KVMEM_TOK_SPECIAL, &j->ids);
		if (!rc && !c && E.tok.agentlang && (!j->ids.n || j->ids.v[0] != 1)) {
			/* agentlang sequences begin with <bos>. */
			int32_t bos = 1;
			kvmem_ids x = { 0 };

			rc = kvmem_ids_push(&x, &bos, 1) || kvmem_ids_push(&x, j->ids.v, j->ids.n);
			kvmem_ids_free(&j->ids);
			j->ids = x;
		}
	}
	if (rc) {
		job_fail(j, 400, "invalid_prompt", "%s", kvmem_last_error());
		return 1;
	}
	if (!j->ids.n) {
		job_fail(j, 400, "invalid_prompt", "nothing new to append: the prompt is empty");
		return 1;
	}
	if ((int64_t)j->ids.n + j->max_tokens > E.cfg->max_request_tokens) {
		job_fail(j, 400, "too_many_tokens", "the request's new turns are %zu tokens and "
			 "max_tokens %lld: more than the %lld tokens a request may run "
			 "(--max-request-tokens)", j->ids.n, (long long)j->max_tokens,
			 (long long)E.cfg->max_request_tokens);
		return 1;
	}
	if (!c) {
		session_opts(&so, NULL, j->sampler.seed);
		if (!(j->s = kvmem_session_create(E.be, &so))) {
			job_fail(j, 500, "server_error", "%s", kvmem_last_error());
			return 1;
		}
	} else {
		c->busy = 1;
	}
	pthread_mutex_lock(&E.mu);
	j->prompt_tokens = (int64_t)j->ids.n;
	pthread_mutex_unlock(&E.mu);
	j->phase = PH_PREFILL;
	return 0;
}

/* Split Qwen3's thinking off the answer: "<think>...</think>\n\n" first. */
static void split_thinking(struct job *j)
{
	const char *open = "<think>", *close = "</think>";
	char *e;

	if (E.tok.agentlang || !j->out || strncmp(j->out, open, 7) || !(e = strstr(j->out, close)))
		return;
	j->reasoning = strndup(j->out + 7, (size_t)(e - j->out - 7));
	e += 8;
	while (*e == '\n')
		e++;
	memmove(j->out, e, strlen(e) + 1);
	j->out_len = strlen(j->out);
}

/* Test only (KVMEM_SERVE_FAULT=record:N, serve.h): the N-th turn ends the
 * process after its record is written and before its workspace is
 * committed, the one moment where the two disagree. */
static void fault_after_record(const struct conv *c)
{
	if (!E.cfg->fault_record || ++E.fault_records != E.cfg->fault_record)
		return;
	fprintf(stderr, "%s: KVMEM_SERVE_FAULT: exiting between conversation %s's record and its "
		"commit\n", SERVE_WHO, c->id);
	_exit(75);
}

/* Close and commit a finished turn. */
static int turn_finish(struct job *j)
{
	struct conv *c = j->cv;
	const kvmem_ids *close = j->stopped && j->stop_id == E.tok.stop[0] ? &E.tok.after_stop
									   : &E.tok.after_other;
	double t0;

	if (refresh_text(j, 1))
		return -1;
	if (!c)
		return 0;
	if (j->kind == JOB_CHAT && close->n && kvmem_session_append(c->s, close->v, (int64_t)close->n, 0))
		return -1;
	pthread_mutex_lock(&E.mu);
	if (j->kind == JOB_CHAT)
		split_thinking(j);
	pthread_mutex_unlock(&E.mu);
	/* The record: the new messages and the answer (or the text). */
	if (j->kind == JOB_CHAT) {
		for (size_t i = json_array_size(c->messages); i < json_array_size(j->messages); i++)
			json_array_append(c->messages, json_array_get(j->messages, i));
		json_array_append_new(c->messages, json_pack("{ssss}", "role", "assistant", "content",
							     j->out ? j->out : ""));
	} else {
		size_t n = j->prompt_len + j->out_len;
		char *t = realloc(c->text, n + 1);

		if (!t)
			return kvmem_error(ENOMEM, "out of memory");
		memcpy(t, j->prompt, j->prompt_len);
		memcpy(t + j->prompt_len, j->out ? j->out : "", j->out_len);
		t[n] = 0;
		c->text = t;
		c->text_len = n;
	}
	c->kind = j->kind;
	t0 = serve_now();
	/* The record first: after a crash between the two it holds one turn
	 * more than the workspace, and reopening trims it (serve_conv.c). */
	if (conv_save(c, kvmem_session_tokens(c->s)))
		return -1;
	fault_after_record(c);
	if (kvmem_workspace_commit(c->ws, c->s) < 0)
		return -1;
	pthread_mutex_lock(&E.mu);
	E.commit_s += serve_now() - t0;
	pthread_mutex_unlock(&E.mu);
	return 0;
}

/* One unit of a running turn. 1 when the turn is over. */
static int turn_step(struct job *j)
{
	double t0 = serve_now();
	int rc = 0;

	switch (j->phase) {
	case PH_PREFILL: {
		/* Slices of whole chunks: the forward passes fall where one
		 * append of everything would put them. */
		size_t k = j->ids.n - j->appended, per = (size_t)kvmem_session_options(j->s)->chunk;

		k = k < per ? k : per;
		rc = kvmem_session_append(j->s, j->ids.v + j->appended, (int64_t)k, 0);
		j->appended += k;
		pthread_mutex_lock(&E.mu);
		E.prefill_s += serve_now() - t0;
		E.prompt_tokens += k;
		pthread_mutex_unlock(&E.mu);
		if (!rc && j->appended == j->ids.n)
			j->phase = j->max_tokens ? PH_SELECT : PH_CLOSE;
		break;
	}
	case PH_SELECT:
		rc = kvmem_session_select(j->s);
		pthread_mutex_lock(&E.mu);
		E.select_s += serve_now() - t0;
		E.selections++;
		pthread_mutex_unlock(&E.mu);
		j->phase = PH_DECODE;
		break;
	case PH_DECODE: {
		int32_t id;

		rc = kvmem_session_decode(j->s, 1, &j->sampler, &id);
		pthread_mutex_lock(&E.mu);
		E.decode_s += serve_now() - t0;
		E.completion_tokens += !rc;
		j->completion_tokens += !rc;
		if (!rc && !j->t_first)
			j->t_first = serve_now();
		pthread_mutex_unlock(&E.mu);
		if (rc)
			break;
		if (tok_cli_is_stop(&E.tok, id)) {
			/* The stop token is in the history, not in the content. */
			j->stopped = 1;
			j->stop_id = id;
			j->phase = PH_CLOSE;
			break;
		}
		rc = kvmem_ids_push(&j->gen, &id, 1);
		if (!rc)
			rc = refresh_text(j, 0);
		if ((int64_t)j->gen.n >= j->max_tokens) {
			j->finish_length = 1;
			j->phase = PH_CLOSE;
		}
		/* A client that went away stops a request of no conversation. */
		if (!j->cv && j->cancelled)
			j->phase = PH_CLOSE;
		break;
	}
	case PH_CLOSE:
		rc = turn_finish(j);
		if (!rc) {
			pthread_mutex_lock(&E.mu);
			j->ws_tokens = kvmem_session_tokens(j->s);
			j->done = 1;
			j->t_end = serve_now();
			E.turns++;
			if (j->t_first) {
				E.ttft_s += j->t_first - j->t_submit;
				E.ttft_n++;
			}
			pthread_cond_broadcast(&E.news);
			pthread_mutex_unlock(&E.mu);
			return 1;
		}
		break;
	}
	if (rc) {
		job_fail(j, 500, "server_error", "%s", kvmem_last_error());
		return 1;
	}
	return 0;
}

/* After a turn: release its session or its conversation. A conversation
 * whose turn failed is closed, so the next request reopens it at its last
 * commit; so is a shared one (--store), so its lease goes with it. */
static void turn_end(struct job *j)
{
	if (j->cv) {
		j->cv->busy = 0;
		j->cv->last_used = serve_now();
		/* A shared conversation is let go after each turn: another
		 * server may take the next one. */
		if (j->http >= 500 || j->cv->shared) {
			conv_unlink(j->cv);
			conv_close(j->cv);
		}
	} else {
		kvmem_session_free(j->s);
	}
	j->s = NULL;
	j->cv = NULL;
}

static void *engine_main(void *arg)
{
	struct job *run = NULL;		/* turns in progress, round robin */

	pthread_mutex_lock(&E.mu);
	while (E.running || run || E.queue) {
		struct job *in;

		while (E.running && !run && !E.queue)
			pthread_cond_wait(&E.work, &E.mu);
		in = E.queue;
		E.queue = E.queue_tail = NULL;
		pthread_mutex_unlock(&E.mu);
		/* Newcomers join the round. */
		while (in) {
			struct job *j = in;

			in = in->next;
			j->next = NULL;
			if (!E.running) {
				job_fail(j, 503, "server_shutting_down", "the server is stopping");
			} else if (!j->cancelled || j->conv[0]) {
				if (turn_start(j) == 0) {
					j->next = run;
					run = j;
					continue;
				}
				if (j->conv[0])
					conv_release_idle(j->conv);
			} else {
				job_fail(j, 499, "client_closed", "the client went away before its turn");
			}
			pthread_mutex_lock(&E.mu);
			E.queued--;
			pthread_mutex_unlock(&E.mu);
			serve_job_put(j);
		}
		/* One unit each, then round again. */
		for (struct job **p = &run; *p;) {
			struct job *j = *p;

			if (turn_step(j)) {
				*p = j->next;
				turn_end(j);
				pthread_mutex_lock(&E.mu);
				E.queued--;
				pthread_mutex_unlock(&E.mu);
				serve_job_put(j);
			} else {
				p = &j->next;
			}
		}
		pthread_mutex_lock(&E.mu);
	}
	pthread_mutex_unlock(&E.mu);
	return NULL;
}

/* ---- start and stop -------------------------------------------------------------- */
int serve_engine_start(const struct serve_cfg *cfg)
{
	const char *base;

	E.cfg = cfg;
	if (kvmem_model_load(cfg->model_dir, &E.m))
		return -1;
	if (tok_cli_open(cfg->model_dir, &E.m->cfg, &E.tok))
		return -1;
	if (kvmem_backend_open(cfg->backend, E.m, &(kvmem_backend_opts){ .max_chunk = cfg->chunk },
			       &E.be) < 0)
		return -1;
	base = strrchr(cfg->model_dir, '/');
	base = base && base[1] ? base + 1 : cfg->model_dir;
	snprintf(E.name, sizeof(E.name), "%s", cfg->model_name ? cfg->model_name : base);
	E.running = 1;
	if (pthread_create(&E.thread, NULL, engine_main, NULL)) {
		E.running = 0;
		return kvmem_error(EAGAIN, "cannot start the engine thread");
	}
	E.started = 1;
	return 0;
}

void serve_engine_stop(void)
{
	if (E.started) {
		pthread_mutex_lock(&E.mu);
		E.running = 0;
		pthread_cond_broadcast(&E.work);
		pthread_mutex_unlock(&E.mu);
		pthread_join(E.thread, NULL);
		E.started = 0;
	}
	while (E.convs) {
		struct conv *c = E.convs;

		E.convs = c->next;
		conv_close(c);
	}
	kvmem_backend_close(E.be);
	E.be = NULL;
	tok_cli_close(&E.tok);
	if (E.m)
		kvmem_model_free(E.m);
	E.m = NULL;
}

/* ---- metrics ---------------------------------------------------------------------- */
struct out {
	char *s;
	size_t n, cap;
};

static void outf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int k;

	for (;;) {
		va_start(ap, fmt);
		k = vsnprintf(o->s ? o->s + o->n : NULL, o->s ? o->cap - o->n : 0, fmt, ap);
		va_end(ap);
		if (k < 0)
			return;
		if (o->s && o->n + (size_t)k < o->cap) {
			o->n += (size_t)k;
			return;
		}
		size_t cap = (o->cap + (size_t)k + 1) * 2;
		char *p = realloc(o->s, cap);

		if (!p)
			return;
		o->s = p;
		o->cap = cap;
	}
}

static void metric(struct out *o, const char *name, const char *type, const char *help, double v)
{
	outf(o, "# HELP %s %s\n# TYPE %s %s\n%s %.9g\n", name, help, name, type, name, v);
}

char *serve_metrics(void)
{
	struct out o = { 0 };
	kvmem_pager_stats st;
	uint64_t hits, misses;

	pthread_mutex_lock(&E.mu);
	st = E.closed;
	/* The pagers of open conversations: their counters are read under
	 * the engine lock, which their turns take to publish. */
	for (struct conv *c = E.convs; c; c = c->next) {
		kvmem_pager_stats x;

		if (!c->ws)
			continue;
		kvmem_pager_stats_get(kvmem_workspace_pager(c->ws), &x);
		pager_add(&st, &x);
	}
	metric(&o, "kvmem_requests_total", "counter", "requests taken by the engine", (double)E.requests);
	metric(&o, "kvmem_requests_failed_total", "counter", "requests answered with an error",
	       (double)E.failed);
	metric(&o, "kvmem_replays_total", "counter", "turns answered from a conversation's record",
	       (double)E.replays);
	metric(&o, "kvmem_turns_total", "counter", "turns run to the end", (double)E.turns);
	metric(&o, "kvmem_prompt_tokens_total", "counter", "tokens appended (prefilled)",
	       (double)E.prompt_tokens);
	metric(&o, "kvmem_completion_tokens_total", "counter", "tokens decoded",
	       (double)E.completion_tokens);
	metric(&o, "kvmem_prefill_seconds_total", "counter", "time in appends", E.prefill_s);
	metric(&o, "kvmem_decode_seconds_total", "counter", "time in decode steps", E.decode_s);
	metric(&o, "kvmem_selections_total", "counter", "step-boundary selections", (double)E.selections);
	metric(&o, "kvmem_selection_seconds_total", "counter", "time in step-boundary selections",
	       E.select_s);
	metric(&o, "kvmem_commit_seconds_total", "counter", "time writing records and committing",
	       E.commit_s);
	metric(&o, "kvmem_time_to_first_token_seconds_sum", "counter",
	       "submit to first content, summed over turns", E.ttft_s);
	metric(&o, "kvmem_time_to_first_token_seconds_count", "counter", "turns in that sum", E.ttft_n);
	metric(&o, "kvmem_queue_depth", "gauge", "requests waiting or running", (double)E.queued);
	metric(&o, "kvmem_conversations_open", "gauge", "conversations held open", (double)E.n_open);
	metric(&o, "kvmem_conversation_restores_total", "counter",
	       "conversations reopened from their workspace", (double)E.restores);
	metric(&o, "kvmem_conversation_fresh_views_total", "counter",
	       "reopens whose session state could not be restored", (double)E.fresh_views);
	metric(&o, "kvmem_conversation_evictions_total", "counter",
	       "idle conversations closed to make room", (double)E.evictions);
#define PAGER_METRIC(name, what) {                                                   \
		char n[96];                                                          \
		snprintf(n, sizeof(n), "kvmem_pager_%s_total", #name);               \
		metric(&o, n, "counter", what, (double)st.name);                     \
	}
	KVMEM_PAGER_STATS(PAGER_METRIC)
#undef PAGER_METRIC
	hits = st.host_hits + st.staging_hits;
	misses = st.host_misses > st.staging_hits ? st.host_misses - st.staging_hits : 0;
	metric(&o, "kvmem_pager_host_hit_ratio", "gauge",
	       "fetched pages found in host memory (pool or staging), of all fetched",
	       hits + misses ? (double)hits / (double)(hits + misses) : 0);
	pthread_mutex_unlock(&E.mu);
	return o.s;
}
#endif
