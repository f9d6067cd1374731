// SPDX-License-Identifier: MIT
/*
 * kvmem serve's completions: a request body into jobs (one per choice),
 * into the engine, and the answer back, whole or as server-sent events.
 *
 * A client that goes away stops a request of no conversation: a stream
 * notices when its next write fails, a whole answer's wait polls the
 * connection. A conversation's turn goes on to its commit either way, so
 * that the request sent again replays it. A stream that outlives
 * --request-timeout ends with an error event and [DONE], as any stream
 * that fails does.
 */
#ifndef KVMEM_NO_SERVE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvmem/kvmem.h"
#include "serve_http.h"

/* ---- pieces of answers --------------------------------------------------------- */
static json_t *usage_doc(struct job *const *js, int n)
{
	int64_t completion = 0;

	for (int i = 0; i < n; i++)
		completion += js[i]->completion_tokens;
	return json_pack("{sIsIsI}", "prompt_tokens", (json_int_t)js[0]->prompt_tokens,
			 "completion_tokens", (json_int_t)completion, "total_tokens",
			 (json_int_t)(js[0]->prompt_tokens + completion));
}

static json_t *kvmem_doc(const struct job *j)
{
	return json_pack("{sosIsbsbsI}", "conversation",
			 j->conv[0] ? json_string(j->conv) : json_null(), "workspace_tokens",
			 (json_int_t)j->ws_tokens, "replayed", j->replayed, "restored", j->restored,
			 "prefill_rounds", (json_int_t)j->prefill_rounds);
}

static json_t *bytes_of(const char *s, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_integer((unsigned char)s[i]));
	return a;
}

/* A token's text alone (a character cut between tokens shows as U+FFFD). */
static json_t *tok_entry(struct serve *sv, int32_t id, float lp, int with_bytes)
{
	char *t = NULL;
	size_t n = 0;
	json_t *e;

	if (kvmem_tokenizer_decode(sv->tok.tok, &id, 1, 0, &t, &n)) {
		t = NULL;
		n = 0;
	}
	e = json_pack("{ss%sf}", "token", t ? t : "", n, "logprob", (double)lp);
	if (with_bytes)
		json_object_set_new(e, "bytes", bytes_of(t ? t : "", n));
	free(t);
	return e;
}

/* Log probabilities of tokens [from, to) of j: chat's shape, or the
 * completions' (tokens, token_logprobs, top_logprobs, text_offset). */
static json_t *logprobs_doc(struct job *j, size_t from, size_t to, size_t *offset)
{
	struct serve *sv = j->sv;

	if (!j->logprobs)
		return json_null();
	if (j->kind == JOB_CHAT) {
		json_t *content = json_array();

		for (size_t i = from; i < to; i++) {
			const struct tok_lp *lp = &j->lps[i];
			json_t *e = tok_entry(sv, lp->id, lp->lp, 1), *top = json_array();

			for (int k = 0; k < lp->n_top; k++)
				json_array_append_new(top, tok_entry(sv, lp->top_id[k], lp->top_lp[k], 1));
			json_object_set_new(e, "top_logprobs", top);
			json_array_append_new(content, e);
		}
		return json_pack("{soso}", "content", content, "refusal", json_null());
	}
	json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();

	for (size_t i = from; i < to; i++) {
		const struct tok_lp *lp = &j->lps[i];
		json_t *e = tok_entry(sv, lp->id, lp->lp, 0), *top = json_object();
		const char *t = json_string_value(json_object_get(e, "token"));

		json_array_append(toks, json_object_get(e, "token"));
		json_array_append_new(lps, json_real(lp->lp));
		json_array_append_new(offs, json_integer((json_int_t)*offset));
		*offset += strlen(t);
		for (int k = 0; k < lp->n_top; k++) {
			json_t *o = tok_entry(sv, lp->top_id[k], lp->top_lp[k], 0);

			json_object_set_new(top, json_string_value(json_object_get(o, "token")),
					    json_real(lp->top_lp[k]));
			json_decref(o);
		}
		json_array_append_new(tops, top);
		json_decref(e);
	}
	return json_pack("{soso so so}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops,
			 "text_offset", offs);
}

static enum MHD_Result answer_whole(struct MHD_Connection *con, struct job **js, int n)
{
	struct serve *sv = js[0]->sv;
	json_t *choices = json_array(), *doc;
	char id[64];

	/* Numbered at admission, so ids count up in the order turns were
	 * admitted, not in the order the HTTP threads got to answer. */
	serve_new_id(sv, id, sizeof(id), js[0]->kind == JOB_CHAT ? "chatcmpl" : "cmpl",
		     js[0]->seq);
	for (int i = 0; i < n; i++) {
		struct job *j = js[i];
		const char *finish = j->finish_length ? "length" : "stop";
		size_t off = 0;
		json_t *lp = logprobs_doc(j, 0, j->n_lps, &off), *choice;

		if (j->kind == JOB_CHAT) {
			json_t *msg = json_pack("{ss ss%}", "role", "assistant", "content",
						j->out ? j->out : "", j->out_len);

			if (j->reasoning)
				json_object_set_new(msg, "reasoning_content", json_string(j->reasoning));
			choice = json_pack("{sisososs}", "index", i, "message", msg, "logprobs", lp,
					   "finish_reason", finish);
		} else {
			choice = json_pack("{si ss% so ss}", "index", i, "text", j->out ? j->out : "",
					   j->out_len, "logprobs", lp, "finish_reason", finish);
		}
		json_array_append_new(choices, choice);
	}
	doc = json_pack("{sssssIsssososo}", "id", id, "object",
			js[0]->kind == JOB_CHAT ? "chat.completion" : "text_completion", "created",
			(json_int_t)time(NULL), "model", sv->name, "choices", choices, "usage",
			usage_doc(js, n), "kvmem", kvmem_doc(js[0]));
	return http_json(con, sv, 200, doc);
}

/* ---- streams -------------------------------------------------------------------- */
struct stream {
	struct serve *sv;
	struct job **js;
	int n;
	char id[64];
	size_t *sent;		/* content bytes sent, per choice */
	size_t *sent_lps;	/* log probabilities sent, per choice */
	size_t *offset;		/* completions: text_offset so far */
	int *state;		/* per choice: 0 role, 1 content, 2 finished */
	int phase;		/* 0 choices, 1 usage, 2 [DONE], 3 over */
	char *pend;		/* an event being written */
	size_t pend_len, pend_off;
	double until;
	double last;		/* when something was last written */
	int64_t created;
};

static void event(struct stream *st, json_t *doc)
{
	char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;

	json_decref(doc);
	free(st->pend);
	st->pend = NULL;
	st->pend_len = st->pend_off = 0;
	if (!text)
		return;
	if (asprintf(&st->pend, "data: %s\n\n", text) >= 0)
		st->pend_len = strlen(st->pend);
	free(text);
}

static void raw_event(struct stream *st, const char *text)
{
	free(st->pend);
	st->pend = strdup(text);
	st->pend_len = st->pend ? strlen(st->pend) : 0;
	st->pend_off = 0;
}

static json_t *chunk(struct stream *st, int i, json_t *delta, const char *finish, const char *text,
		     size_t len, json_t *lp)
{
	const struct job *j = st->js[i];
	json_t *choice;

	if (j->kind == JOB_CHAT)
		choice = json_pack("{siso so so}", "index", i, "delta", delta ? delta : json_object(),
				   "logprobs", lp ? lp : json_null(), "finish_reason",
				   finish ? json_string(finish) : json_null());
	else
		choice = json_pack("{sis s% so so}", "index", i, "text", text ? text : "", len,
				   "logprobs", lp ? lp : json_null(), "finish_reason",
				   finish ? json_string(finish) : json_null());
	return json_pack("{sssssIsss[o]}", "id", st->id, "object",
			 j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			 (json_int_t)st->created, "model", st->sv->name, "choices", choice);
}

/* One choice's next event, mu held: 0 made, 1 nothing now. */
static int choice_event(struct stream *st, int i)
{
	struct job *j = st->js[i];

	if (st->state[i] == 0) {
		st->state[i] = 1;
		if (j->kind == JOB_CHAT) {
			event(st, chunk(st, i, json_pack("{ssss}", "role", "assistant", "content", ""),
					NULL, NULL, 0, NULL));
			return 0;
		}
	}
	if (st->state[i] != 1)
		return 1;
	if (j->out_len > st->sent[i] || (j->logprobs && j->n_lps > st->sent_lps[i] && j->done)) {
		const char *t = j->out + st->sent[i];
		size_t n = j->out_len - st->sent[i];
		json_t *lp = j->logprobs ? logprobs_doc(j, st->sent_lps[i], j->n_lps, &st->offset[i]) : NULL;

		event(st, chunk(st, i, j->kind == JOB_CHAT ? json_pack("{ss%}", "content", t, n) : NULL,
				NULL, t, n, lp));
		st->sent[i] = j->out_len;
		st->sent_lps[i] = j->n_lps;
		return 0;
	}
	if (!j->done || j->http)
		return 1;
	st->state[i] = 2;
	event(st, chunk(st, i, NULL, j->finish_length ? "length" : "stop", NULL, 0, NULL));
	return 0;
}

/* The next event, mu held. 0: made; 1: nothing yet. */
static int next_event(struct stream *st)
{
	int all = 1;

	if (st->phase == 0) {
		for (int i = 0; i < st->n; i++)
			if (st->js[i]->http && st->js[i]->done) {
				struct job *j = st->js[i];

				event(st, http_error_doc((unsigned)j->http, j->code, NULL, j->msg));
				st->phase = 2;
				return 0;
			}
		for (int i = 0; i < st->n; i++)
			if (!choice_event(st, i))
				return 0;
		for (int i = 0; i < st->n; i++)
			all &= st->state[i] == 2;
		if (!all)
			return 1;
		st->phase = 1;
	}
	if (st->phase == 1) {
		st->phase = 2;
		if (st->js[0]->include_usage) {
			const struct job *j = st->js[0];

			event(st, json_pack("{sssssIsss[]soso}", "id", st->id, "object",
					    j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion",
					    "created", (json_int_t)st->created, "model", st->sv->name,
					    "choices", "usage", usage_doc(st->js, st->n), "kvmem",
					    kvmem_doc(j)));
			return 0;
		}
	}
	if (st->phase == 2) {
		raw_event(st, "data: [DONE]\n\n");
		st->phase = 3;
		return 0;
	}
	return 1;
}

static void cancel(struct job **js, int n)
{
	struct serve *sv = js[0]->sv;

	pthread_mutex_lock(&sv->mu);
	for (int i = 0; i < n; i++)
		js[i]->cancelled = 1;
	pthread_mutex_unlock(&sv->mu);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *st = cls;
	struct serve *sv = st->sv;
	size_t n;

	while (st->pend_off == st->pend_len) {
		if (st->phase == 3)
			return MHD_CONTENT_READER_END_OF_STREAM;
		pthread_mutex_lock(&sv->mu);
		while (next_event(st)) {
			double now = serve_now();

			if (now > st->until) {
				/* Out of time: say so, then [DONE]. */
				for (int i = 0; i < st->n; i++)
					st->js[i]->cancelled = 1;
				event(st, http_error_doc(504, "timeout", NULL, "the request did not finish "
							 "in time (--request-timeout)"));
				st->phase = 2;
				break;
			}
			/* A comment line after 10 quiet seconds keeps proxies
			 * from closing the stream. */
			if (now - st->last >= 10) {
				pthread_mutex_unlock(&sv->mu);
				st->last = now;
				n = (size_t)snprintf(buf, max, ": waiting\n\n");
				return (ssize_t)(n < max ? n : max);
			}
			serve_wait(st->js[0], st->last + 10 < st->until ? st->last + 10 : st->until);
		}
		pthread_mutex_unlock(&sv->mu);
		st->last = serve_now();
	}
	n = st->pend_len - st->pend_off;
	n = n < max ? n : max;
	memcpy(buf, st->pend + st->pend_off, n);
	st->pend_off += n;
	return (ssize_t)n;
}

static void stream_free(void *cls)
{
	struct stream *st = cls;

	/* The client may have gone: a request of no conversation stops. */
	cancel(st->js, st->n);
	for (int i = 0; i < st->n; i++)
		job_put(st->js[i]);
	free(st->js);
	free(st->sent);
	free(st->sent_lps);
	free(st->offset);
	free(st->state);
	free(st->pend);
	free(st);
}

/* Takes the jobs' references. */
static enum MHD_Result answer_stream(struct MHD_Connection *con, struct job **js, int n)
{
	struct serve *sv = js[0]->sv;
	struct stream *st = calloc(1, sizeof(*st));
	struct MHD_Response *r;
	enum MHD_Result ret;

	if (!st || !(st->sent = calloc((size_t)n, sizeof(size_t))) ||
	    !(st->sent_lps = calloc((size_t)n, sizeof(size_t))) ||
	    !(st->offset = calloc((size_t)n, sizeof(size_t))) || !(st->state = calloc((size_t)n, sizeof(int)))) {
		if (st) {
			free(st->sent);
			free(st->sent_lps);
			free(st->offset);
		}
		free(st);
		for (int i = 0; i < n; i++)
			job_put(js[i]);
		free(js);
		return MHD_NO;
	}
	st->sv = sv;
	st->js = js;
	st->n = n;
	st->until = js[0]->t_submit + sv->cfg.request_timeout;
	st->last = serve_now();
	st->created = time(NULL);
	serve_new_id(sv, st->id, sizeof(st->id), js[0]->kind == JOB_CHAT ? "chatcmpl" : "cmpl", 0);
	r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
					      stream_free);
	if (!r) {
		stream_free(st);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "text/event-stream");
	MHD_add_response_header(r, "Cache-Control", "no-cache");
	MHD_add_response_header(r, "Connection", "close");
	http_cors(r, sv);
	ret = MHD_queue_response(con, 200, r);
	MHD_destroy_response(r);
	return ret;
}

/* ---- the endpoint ------------------------------------------------------------------ */
static void put_all(struct job **js, int n)
{
	for (int i = 0; i < n; i++)
		job_put(js[i]);
	free(js);
}

static int all_done(struct job **js, int n)
{
	for (int i = 0; i < n; i++)
		if (!js[i]->done)
			return 0;
	return 1;
}

/* Wait for a whole answer. 0, -ETIMEDOUT, or -ECONNRESET when the client
 * went away (then a request of no conversation is stopped). */
static int wait_whole(struct MHD_Connection *con, struct job **js, int n)
{
	struct serve *sv = js[0]->sv;
	double until = js[0]->t_submit + sv->cfg.request_timeout;
	int rc = 0;

	pthread_mutex_lock(&sv->mu);
	while (!rc && !all_done(js, n)) {
		double slice = serve_now() + 0.1;

		rc = serve_wait(js[0], slice < until ? slice : until);
		if (!rc && !all_done(js, n)) {
			pthread_mutex_unlock(&sv->mu);
			if (http_client_gone(con))
				rc = -ECONNRESET;
			pthread_mutex_lock(&sv->mu);
		}
	}
	pthread_mutex_unlock(&sv->mu);
	if (rc)
		cancel(js, n);
	return rc;
}

enum MHD_Result answer_completion(struct MHD_Connection *con, struct req *rq, int kind)
{
	struct serve *sv = rq->sv;
	json_error_t err;
	json_t *doc;
	struct job *j, **js;
	struct bad b = { "", "", "" };
	const char *hdr;
	size_t hdr_len = 0;
	enum MHD_Result ret;
	int rc, n;

	doc = json_loadb(rq->body ? rq->body : "", rq->len, JSON_REJECT_DUPLICATES, &err);
	if (!doc)
		return http_error(con, sv, 400, "invalid_json", NULL, 0, "the body is not valid JSON: "
				  "%s (line %d, column %d)", err.text, err.line, err.column);
	if (!json_is_object(doc)) {
		json_decref(doc);
		return http_error(con, sv, 400, "invalid_json", NULL, 0, "the body must be a JSON object");
	}
	if (!(j = job_new(sv, kind))) {
		json_decref(doc);
		return http_error(con, sv, 500, "server_error", NULL, 0, "out of memory");
	}
	/* With a temperature and no seed, each request draws differently. */
	j->samp.seed = serve_random_seed();
	if (MHD_lookup_connection_value_n(con, MHD_HEADER_KIND, "X-Kvmem-Conversation", 20, &hdr,
					  &hdr_len) == MHD_YES) {
		/* The whole value, NUL bytes included: an id that stops at a
		 * NUL would name another conversation. */
		if (!serve_id_ok(hdr, hdr_len)) {
			json_decref(doc);
			job_put(j);
			return http_error(con, sv, 400, "invalid_conversation_id", "X-Kvmem-Conversation",
					  0, "X-Kvmem-Conversation must be an id of 1..%d letters, "
					  "digits, '.', '_' and '-', beginning with a letter or digit, "
					  "without '..'", SERVE_ID_MAX);
		}
		memcpy(j->conv, hdr, hdr_len);
		j->conv[hdr_len] = 0;
	}
	rc = serve_parse(doc, j, &b);
	json_decref(doc);
	if (rc) {
		job_put(j);
		return http_error(con, sv, !strcmp(b.code, "model_not_found") ? 404 : 400, b.code,
				  b.param[0] ? b.param : NULL, 0, "%s", b.msg);
	}
	n = j->n_choices;
	js = calloc((size_t)n, sizeof(*js));
	if (!js) {
		job_put(j);
		return http_error(con, sv, 500, "server_error", NULL, 0, "out of memory");
	}
	js[0] = j;
	for (int i = 1; i < n; i++)
		if (!(js[i] = job_clone(j, i))) {
			put_all(js, i);
			return http_error(con, sv, 500, "server_error", NULL, 0, "out of memory");
		}
	rc = serve_engine_submit(sv, js, n);
	if (rc) {
		ret = http_error(con, sv, (unsigned)rc, j->code, NULL, j->retry_after, "%s", j->msg);
		put_all(js, n);
		return ret;
	}
	if (j->stream)
		return answer_stream(con, js, n);	/* the stream holds the references */
	rc = wait_whole(con, js, n);
	if (rc == -ECONNRESET) {
		put_all(js, n);
		return MHD_NO;	/* nobody to answer */
	}
	if (rc) {
		ret = http_error(con, sv, 504, "timeout", NULL, 0, "the request did not finish in %d s "
				 "(--request-timeout)", sv->cfg.request_timeout);
	} else {
		struct job *failed = NULL;

		for (int i = 0; i < n && !failed; i++)
			if (js[i]->http)
				failed = js[i];
		ret = failed ? http_error(con, sv, (unsigned)failed->http, failed->code, NULL,
					  failed->retry_after, "%s", failed->msg)
			     : answer_whole(con, js, n);
	}
	put_all(js, n);
	return ret;
}
#endif
