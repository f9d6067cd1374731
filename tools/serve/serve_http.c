// SPDX-License-Identifier: MIT
/*
 * kvmem serve's HTTP side on libmicrohttpd (a thread per connection):
 * routing, the bearer token, the body limit, strict JSON (jansson: no
 * duplicate keys, no NUL in strings, integers where integers are meant,
 * unknown fields refused), OpenAI-shaped answers and errors, and
 * server-sent events for streams. Requests become jobs for the engine
 * (serve_engine.c); a connection thread waits for its job's news.
 */
#ifndef KVMEM_NO_SERVE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kvmem/kvmem.h"
#include "serve.h"

static struct MHD_Daemon *D;
static const struct serve_cfg *C;
static uint64_t id_counter;
static pthread_mutex_t id_mu = PTHREAD_MUTEX_INITIALIZER;

/* A request's state between calls of the access handler. */
struct req {
	char *body;
	size_t len, cap;
	int too_big;
};

/* ---- answers ------------------------------------------------------------------- */
static enum MHD_Result send_text(struct MHD_Connection *con, unsigned status, const char *type,
				 char *text)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text,
								  MHD_RESPMEM_MUST_FREE);
	enum MHD_Result ret;

	if (!r) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", type);
	if (status == 401)
		MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
	ret = MHD_queue_response(con, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *con, unsigned status, json_t *doc)
{
	char *text = json_dumps(doc, JSON_COMPACT);

	json_decref(doc);
	if (!text)
		return MHD_NO;
	return send_text(con, status, "application/json", text);
}

static const char *type_of(unsigned status)
{
	switch (status) {
	case 401: return "authentication_error";
	case 404: return "not_found_error";
	case 409: return "conflict_error";
	case 413: case 400: case 405: return "invalid_request_error";
	case 429: return "rate_limit_error";
	default: return status >= 500 ? "server_error" : "invalid_request_error";
	}
}

static json_t *error_doc(unsigned status, const char *code, const char *param, const char *msg)
{
	return json_pack("{s{sssssoss}}", "error", "message", msg, "type", type_of(status), "param",
			 param ? json_string(param) : json_null(), "code", code);
}

static enum MHD_Result send_error(struct MHD_Connection *con, unsigned status, const char *code,
				  const char *param, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error(struct MHD_Connection *con, unsigned status, const char *code,
				  const char *param, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return send_json(con, status, error_doc(status, code, param, msg));
}

/* ---- request validation ----------------------------------------------------------- */
struct bad {
	char msg[600], param[64];
};

static int bad(struct bad *b, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int bad(struct bad *b, const char *param, const char *fmt, ...)
{
	va_list ap;

	snprintf(b->param, sizeof(b->param), "%s", param ? param : "");
	va_start(ap, fmt);
	vsnprintf(b->msg, sizeof(b->msg), fmt, ap);
	va_end(ap);
	return -1;
}

static int want_int(json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out, struct bad *b)
{
	if (json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return bad(b, name, "'%s' must be an integer in %lld..%lld", name, (long long)lo,
			   (long long)hi);
	*out = json_integer_value(v);
	return 0;
}

static int want_num(json_t *v, const char *name, double lo, double hi, int lo_open, double *out,
		    struct bad *b)
{
	double x;

	if (json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return bad(b, name, "'%s' must be a number", name);
	x = json_number_value(v);
	if (x < lo || x > hi || (lo_open && x <= lo))
		return bad(b, name, "'%s' must be in %s%g, %g]", name, lo_open ? "(" : "[", lo, hi);
	*out = x;
	return 0;
}

static int want_bool(json_t *v, const char *name, int *out, struct bad *b)
{
	if (json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return bad(b, name, "'%s' must be true or false", name);
	*out = json_is_true(v);
	return 0;
}

/* Text content: a string, null, or an array of {"type": "text", "text": ...}. */
static json_t *content_text(json_t *v, size_t i, struct bad *b)
{
	char param[48];

	snprintf(param, sizeof(param), "messages[%zu].content", i);
	if (!v || json_is_null(v))
		return json_string("");
	if (json_is_string(v))
		return json_incref(v);
	if (json_is_array(v)) {
		size_t n = 0, k;
		json_t *part;
		char *all = NULL;

		json_array_foreach(v, k, part) {
			json_t *t = json_object_get(part, "text");
			const char *ty = json_string_value(json_object_get(part, "type"));

			if (!json_is_object(part) || !ty || strcmp(ty, "text") || !json_is_string(t) ||
			    json_object_size(part) != 2) {
				free(all);
				bad(b, param, "%s[%zu] must be {\"type\": \"text\", \"text\": ...}: this "
				    "server takes text only", param, k);
				return NULL;
			}
			char *p = realloc(all, n + json_string_length(t) + 1);

			if (!p) {
				free(all);
				bad(b, param, "out of memory");
				return NULL;
			}
			all = p;
			memcpy(all + n, json_string_value(t), json_string_length(t));
			n += json_string_length(t);
			all[n] = 0;
		}
		json_t *s = json_stringn(all ? all : "", n);

		free(all);
		return s;
	}
	bad(b, param, "'%s' must be a string, null or an array of text parts", param);
	return NULL;
}

static json_t *one_message(json_t *m, size_t i, struct bad *b)
{
	static const char *roles[] = { "system", "user", "assistant", "tool", "developer", NULL };
	const char *role = json_string_value(json_object_get(m, "role")), *key;
	json_t *out, *v, *content;
	char param[48];
	int ok = 0;

	snprintf(param, sizeof(param), "messages[%zu]", i);
	if (!json_is_object(m))
		return bad(b, param, "'%s' must be an object", param), NULL;
	for (int r = 0; role && roles[r]; r++)
		ok |= !strcmp(role, roles[r]);
	if (!ok)
		return bad(b, param, "%s.role must be system, user, assistant or tool", param), NULL;
	json_object_foreach(m, key, v) {
		if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "name") &&
		    !(!strcmp(role, "assistant") && (!strcmp(key, "tool_calls") ||
						     !strcmp(key, "reasoning_content") ||
						     !strcmp(key, "refusal"))) &&
		    !(!strcmp(role, "tool") && !strcmp(key, "tool_call_id")))
			return bad(b, param, "unknown field '%s' in %s (a %s message)", key, param, role),
			       NULL;
	}
	if (!(content = content_text(json_object_get(m, "content"), i, b)))
		return NULL;
	/* "developer" is the newer name of "system". */
	out = json_pack("{ssso}", "role", !strcmp(role, "developer") ? "system" : role, "content",
			content);
	v = json_object_get(m, "reasoning_content");
	if (json_is_string(v))
		json_object_set(out, "reasoning", v);
	else if (v && !json_is_null(v))
		return json_decref(out), bad(b, param, "%s.reasoning_content must be a string", param),
		       NULL;
	v = json_object_get(m, "tool_calls");
	if (v && !json_is_null(v)) {
		json_t *calls = json_array(), *tc;
		size_t k;

		if (!json_is_array(v))
			return json_decref(out), json_decref(calls),
			       bad(b, param, "%s.tool_calls must be an array", param), NULL;
		json_array_foreach(v, k, tc) {
			json_t *fn = json_object_get(tc, "function");
			json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
			char *text = NULL;

			if (!json_is_string(name) || !(json_is_string(args) || json_is_object(args)))
				return json_decref(out), json_decref(calls),
				       bad(b, param, "%s.tool_calls[%zu].function must hold a name (a "
					   "string) and arguments (a JSON text, or an object)", param, k), NULL;
			/* Arguments given as an object (transformers takes them so) are
			 * held and rendered as the template's tojson writes them. */
			if (json_is_object(args) && !(text = serve_tojson(args)))
				return json_decref(out), json_decref(calls),
				       bad(b, param, "out of memory"), NULL;
			json_array_append_new(calls, text ? json_pack("{sOss}", "name", name, "arguments", text)
							  : json_pack("{sOsO}", "name", name, "arguments", args));
			free(text);
		}
		if (json_array_size(calls))
			json_object_set_new(out, "tool_calls", calls);
		else
			json_decref(calls);
	}
	return out;
}

/* Fields of both endpoints. 1: taken, 0: not one of them, -1: bad. */
static int common_field(const char *key, json_t *v, struct job *j, struct bad *b)
{
	int64_t n = 1;
	double x;

	if (!strcmp(key, "model")) {
		if (!json_is_string(v))
			return bad(b, key, "'model' must be a string");
		if (strcmp(json_string_value(v), serve_model_name()))
			return bad(b, key, "model '%s' is not served here; this server serves '%s' "
				   "(GET /v1/models)", json_string_value(v), serve_model_name());
		return 1;
	}
	if (!strcmp(key, "max_tokens") || !strcmp(key, "max_completion_tokens"))
		return want_int(v, key, 0, C->max_request_tokens, &j->max_tokens, b) ? -1 : 1;
	if (!strcmp(key, "temperature")) {
		x = j->sampler.temperature;
		if (want_num(v, key, 0, 2, 0, &x, b))
			return -1;
		j->sampler.temperature = (float)x;
		return 1;
	}
	if (!strcmp(key, "top_p")) {
		x = j->sampler.top_p;
		if (want_num(v, key, 0, 1, 1, &x, b))
			return -1;
		j->sampler.top_p = (float)x;
		return 1;
	}
	if (!strcmp(key, "seed")) {
		int64_t s = 0;

		if (want_int(v, key, INT64_MIN, INT64_MAX, &s, b))
			return -1;
		j->sampler.seed = (uint64_t)s;
		return 1;
	}
	if (!strcmp(key, "stream"))
		return want_bool(v, key, &j->stream, b) ? -1 : 1;
	if (!strcmp(key, "stream_options")) {
		const char *k2;
		json_t *v2;

		if (json_is_null(v))
			return 1;
		if (!json_is_object(v))
			return bad(b, key, "'stream_options' must be an object");
		json_object_foreach(v, k2, v2) {
			if (strcmp(k2, "include_usage"))
				return bad(b, key, "unknown field '%s' in stream_options", k2);
			if (want_bool(v2, "stream_options.include_usage", &j->include_usage, b))
				return -1;
		}
		return 1;
	}
	if (!strcmp(key, "n")) {
		if (want_int(v, key, 1, 1, &n, b))
			return bad(b, key, "'n' must be 1: this server makes one choice per request");
		return 1;
	}
	if (!strcmp(key, "user"))
		return json_is_string(v) || json_is_null(v) ? 1 : bad(b, key, "'user' must be a string");
	if (!strcmp(key, "conversation")) {
		if (json_is_null(v))
			return 1;
		if (!json_is_string(v) || !serve_id_ok(json_string_value(v)))
			return bad(b, key, "'conversation' must be an id of 1..%d letters, digits, '.', "
				   "'_' and '-', beginning with a letter or digit, without '..'",
				   SERVE_ID_MAX);
		if (j->conv[0] && strcmp(j->conv, json_string_value(v)))
			return bad(b, key, "the body's conversation '%s' is not the header's '%s'",
				   json_string_value(v), j->conv);
		snprintf(j->conv, sizeof(j->conv), "%s", json_string_value(v));
		return 1;
	}
	if (!strcmp(key, "frequency_penalty") || !strcmp(key, "presence_penalty")) {
		x = 0;
		if (want_num(v, key, -2, 2, 0, &x, b))
			return -1;
		return x == 0 ? 1 : bad(b, key, "'%s' is not supported: give 0 or leave it out", key);
	}
	if (!strcmp(key, "logprobs") || !strcmp(key, "echo")) {
		if (json_is_null(v) || json_is_false(v) || (json_is_integer(v) && !json_integer_value(v)))
			return 1;
		return bad(b, key, "'%s' is not supported: leave it out", key);
	}
	if (!strcmp(key, "stop") || !strcmp(key, "suffix") || !strcmp(key, "logit_bias") ||
	    !strcmp(key, "top_logprobs")) {
		if (json_is_null(v))
			return 1;
		return bad(b, key, "'%s' is not supported: leave it out", key);
	}
	return 0;
}

static int parse_chat(json_t *req, struct job *j, struct bad *b)
{
	const char *key;
	json_t *v;
	int got = 0;

	json_object_foreach(req, key, v) {
		int r = common_field(key, v, j, b);

		if (r < 0)
			return -1;
		if (r)
			continue;
		if (!strcmp(key, "messages")) {
			size_t i;
			json_t *m;

			if (!json_is_array(v) || !json_array_size(v))
				return bad(b, key, "'messages' must be a non-empty array");
			j->messages = json_array();
			json_array_foreach(v, i, m) {
				json_t *one = one_message(m, i, b);

				if (!one)
					return -1;
				json_array_append_new(j->messages, one);
			}
			got = 1;
		} else if (!strcmp(key, "tools")) {
			size_t i;
			json_t *t;

			if (json_is_null(v))
				continue;
			if (!json_is_array(v) || json_array_size(v) > 128)
				return bad(b, key, "'tools' must be an array of at most 128 tools");
			j->tools = calloc(json_array_size(v) + 1, sizeof(char *));
			if (!j->tools)
				return bad(b, key, "out of memory");
			json_array_foreach(v, i, t) {
				if (!json_is_object(t))
					return bad(b, key, "tools[%zu] must be an object", i);
				/* As the template's tojson writes it (serve_tojson.c). */
				if (!(j->tools[j->n_tools] = serve_tojson(t)))
					return bad(b, key, "out of memory");
				j->n_tools++;
			}
		} else if (!strcmp(key, "tool_choice")) {
			const char *s = json_string_value(v);

			if (!json_is_null(v) && (!s || (strcmp(s, "auto") && strcmp(s, "none"))))
				return bad(b, key, "'tool_choice' must be \"auto\" or \"none\"");
		} else if (!strcmp(key, "parallel_tool_calls")) {
			if (!json_is_boolean(v) && !json_is_null(v))
				return bad(b, key, "'parallel_tool_calls' must be true or false");
		} else if (!strcmp(key, "chat_template_kwargs")) {
			const char *k2;
			json_t *v2;
			int th = -1;

			if (!json_is_object(v))
				return bad(b, key, "'chat_template_kwargs' must be an object");
			json_object_foreach(v, k2, v2) {
				if (strcmp(k2, "enable_thinking"))
					return bad(b, key, "unknown template argument '%s' (enable_thinking)",
						   k2);
				if (want_bool(v2, "chat_template_kwargs.enable_thinking", &th, b))
					return -1;
			}
			j->thinking = th;
		} else {
			return bad(b, key, "unknown field '%s'", key);
		}
	}
	if (!got)
		return bad(b, "messages", "'messages' is required");
	return 0;
}

static int parse_text(json_t *req, struct job *j, struct bad *b)
{
	const char *key;
	json_t *v;

	json_object_foreach(req, key, v) {
		int r = common_field(key, v, j, b);

		if (r < 0)
			return -1;
		if (r)
			continue;
		if (!strcmp(key, "prompt")) {
			if (json_is_array(v) && json_array_size(v) == 1)
				v = json_array_get(v, 0);
			if (!json_is_string(v))
				return bad(b, key, "'prompt' must be a string (or an array of one)");
			j->prompt_len = json_string_length(v);
			j->prompt = malloc(j->prompt_len + 1);
			if (!j->prompt)
				return bad(b, key, "out of memory");
			memcpy(j->prompt, json_string_value(v), j->prompt_len + 1);
		} else {
			return bad(b, key, "unknown field '%s'", key);
		}
	}
	if (!j->prompt)
		return bad(b, "prompt", "'prompt' is required");
	return 0;
}

/* ---- answers to jobs ---------------------------------------------------------- */
static void new_id(char *buf, size_t len, const char *prefix)
{
	uint64_t n;

	pthread_mutex_lock(&id_mu);
	n = ++id_counter;
	pthread_mutex_unlock(&id_mu);
	snprintf(buf, len, "%s-%" PRIx64 "%06" PRIx64, prefix, (uint64_t)time(NULL), n);
}

static json_t *usage_doc(const struct job *j)
{
	return json_pack("{sIsIsI}", "prompt_tokens", (json_int_t)j->prompt_tokens,
			 "completion_tokens", (json_int_t)j->completion_tokens, "total_tokens",
			 (json_int_t)(j->prompt_tokens + j->completion_tokens));
}

static json_t *kvmem_doc(const struct job *j)
{
	return json_pack("{sosIsbsb}", "conversation", j->conv[0] ? json_string(j->conv) : json_null(),
			 "workspace_tokens", (json_int_t)j->ws_tokens, "replayed", j->replayed,
			 "restored", j->restored);
}

static enum MHD_Result answer_whole(struct MHD_Connection *con, struct job *j, const char *id)
{
	json_t *doc, *choice;
	const char *finish = j->finish_length ? "length" : "stop";

	if (j->kind == JOB_CHAT) {
		json_t *msg = json_pack("{ss ss%}", "role", "assistant", "content", j->out ? j->out : "",
					j->out_len);

		if (j->reasoning)
			json_object_set_new(msg, "reasoning_content", json_string(j->reasoning));
		choice = json_pack("{sisososs}", "index", 0, "message", msg, "logprobs", json_null(),
				   "finish_reason", finish);
	} else {
		choice = json_pack("{si ss% so ss}", "index", 0, "text", j->out ? j->out : "", j->out_len,
				   "logprobs", json_null(), "finish_reason", finish);
	}
	doc = json_pack("{sssssIsss[o]soso}", "id", id, "object",
			j->kind == JOB_CHAT ? "chat.completion" : "text_completion", "created",
			(json_int_t)time(NULL), "model", serve_model_name(), "choices", choice, "usage",
			usage_doc(j), "kvmem", kvmem_doc(j));
	return send_json(con, 200, doc);
}

/* ---- streams -------------------------------------------------------------------- */
struct stream {
	struct job *j;
	char id[64];
	size_t sent;		/* content bytes sent */
	char *pend;		/* an event being written */
	size_t pend_len, pend_off;
	int state;		/* 0 role, 1 content, 2 finish, 3 usage, 4 done, 5 over */
	double until;
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

static json_t *chunk(struct stream *st, json_t *delta, const char *finish, const char *text,
		     size_t len)
{
	json_t *choice;
	const struct job *j = st->j;

	if (j->kind == JOB_CHAT)
		choice = json_pack("{siso so so}", "index", 0, "delta", delta ? delta : json_object(),
				   "logprobs", json_null(), "finish_reason",
				   finish ? json_string(finish) : json_null());
	else
		choice = json_pack("{sis s% so so}", "index", 0, "text", text ? text : "", len,
				   "logprobs", json_null(), "finish_reason",
				   finish ? json_string(finish) : json_null());
	return json_pack("{sssssIsss[o]}", "id", st->id, "object",
			 j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			 (json_int_t)st->created, "model", serve_model_name(), "choices", choice);
}

/* Make the next event, with the engine lock held. 0: made; 1: nothing yet. */
static int next_event(struct stream *st)
{
	struct job *j = st->j;

	if (st->state == 0) {
		st->state = 1;
		if (j->kind == JOB_CHAT) {
			event(st, chunk(st, json_pack("{ssss}", "role", "assistant", "content", ""), NULL,
					NULL, 0));
			return 0;
		}
	}
	if (st->state == 1) {
		if (j->out_len > st->sent) {
			const char *t = j->out + st->sent;
			size_t n = j->out_len - st->sent;

			event(st, chunk(st, j->kind == JOB_CHAT ? json_pack("{ss%}", "content", t, n) : NULL,
					NULL, t, n));
			st->sent = j->out_len;
			return 0;
		}
		if (!j->done)
			return 1;
		if (j->http) {
			event(st, error_doc((unsigned)j->http, j->code, NULL, j->msg));
			st->state = 4;
			return 0;
		}
		st->state = 2;
	}
	if (st->state == 2) {
		event(st, chunk(st, NULL, j->finish_length ? "length" : "stop", NULL, 0));
		st->state = 3;
		return 0;
	}
	if (st->state == 3) {
		st->state = 4;
		if (j->include_usage) {
			json_t *doc = json_pack("{sssssIsss[]soso}", "id", st->id, "object",
						j->kind == JOB_CHAT ? "chat.completion.chunk"
								    : "text_completion",
						"created", (json_int_t)st->created, "model",
						serve_model_name(), "choices", "usage", usage_doc(j),
						"kvmem", kvmem_doc(j));

			event(st, doc);
			return 0;
		}
	}
	if (st->state == 4) {
		free(st->pend);
		st->pend = strdup("data: [DONE]\n\n");
		st->pend_len = st->pend ? strlen(st->pend) : 0;
		st->pend_off = 0;
		st->state = 5;
		return 0;
	}
	return 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *st = cls;
	size_t n;

	while (st->pend_off == st->pend_len) {
		if (st->state == 5)
			return MHD_CONTENT_READER_END_OF_STREAM;
		serve_lock();
		while (next_event(st)) {
			if (serve_now() > st->until) {
				serve_unlock();
				return MHD_CONTENT_READER_END_WITH_ERROR;
			}
			/* A comment line now and then keeps proxies from
			 * closing a quiet stream. */
			if (serve_wait(st->j, st->sent, serve_now() + 10) == -ETIMEDOUT) {
				serve_unlock();
				n = (size_t)snprintf(buf, max, ": waiting\n\n");
				return (ssize_t)(n < max ? n : max);
			}
		}
		serve_unlock();
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
	serve_lock();
	st->j->cancelled = 1;
	serve_unlock();
	serve_job_put(st->j);
	free(st->pend);
	free(st);
}

static enum MHD_Result answer_stream(struct MHD_Connection *con, struct job *j)
{
	struct stream *st = calloc(1, sizeof(*st));
	struct MHD_Response *r;
	enum MHD_Result ret;

	if (!st)
		return MHD_NO;
	st->j = j;
	st->until = j->t_submit + C->request_timeout;
	st->created = time(NULL);
	new_id(st->id, sizeof(st->id), j->kind == JOB_CHAT ? "chatcmpl" : "cmpl");
	r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
					      stream_free);
	if (!r) {
		serve_job_put(j);
		free(st);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "text/event-stream");
	MHD_add_response_header(r, "Cache-Control", "no-cache");
	ret = MHD_queue_response(con, 200, r);
	MHD_destroy_response(r);
	return ret;
}

/* ---- the endpoints ------------------------------------------------------------------ */
static enum MHD_Result completions(struct MHD_Connection *con, struct req *rq, int kind)
{
	json_error_t err;
	json_t *doc;
	struct job *j;
	struct bad b = { "", "" };
	const char *hdr = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "X-Kvmem-Conversation");
	int rc;

	doc = json_loadb(rq->body ? rq->body : "", rq->len, JSON_REJECT_DUPLICATES, &err);
	if (!doc)
		return send_error(con, 400, "invalid_json", NULL, "the body is not valid JSON: %s "
				  "(line %d, column %d)", err.text, err.line, err.column);
	if (!json_is_object(doc)) {
		json_decref(doc);
		return send_error(con, 400, "invalid_json", NULL, "the body must be a JSON object");
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		json_decref(doc);
		return send_error(con, 500, "server_error", NULL, "out of memory");
	}
	j->refs = 1;
	j->kind = kind;
	j->thinking = -1;
	j->max_tokens = C->default_max_tokens;
	j->sampler.top_p = 1.0f;
	j->t_submit = serve_now();
	if (hdr) {
		if (!serve_id_ok(hdr)) {
			json_decref(doc);
			serve_job_put(j);
			return send_error(con, 400, "invalid_conversation_id", "X-Kvmem-Conversation",
					  "X-Kvmem-Conversation must be an id of 1..%d letters, digits, "
					  "'.', '_' and '-', beginning with a letter or digit, without '..'",
					  SERVE_ID_MAX);
		}
		snprintf(j->conv, sizeof(j->conv), "%s", hdr);
	}
	rc = kind == JOB_CHAT ? parse_chat(doc, j, &b) : parse_text(doc, j, &b);
	json_decref(doc);
	if (rc) {
		serve_job_put(j);
		return send_error(con, !strncmp(b.msg, "model '", 7) ? 404 : 400,
				  !strncmp(b.msg, "model '", 7) ? "model_not_found"
				  : !strncmp(b.msg, "unknown field", 13) ? "unknown_field"
				  : !strcmp(b.param, "conversation") ? "invalid_conversation_id"
				  : "invalid_request", b.param[0] ? b.param : NULL, "%s", b.msg);
	}
	j->sampled = j->sampler.temperature > 0;
	if (serve_engine_submit(j)) {
		serve_job_put(j);
		return send_error(con, 503, "server_busy", NULL, "%lld requests are waiting or running, "
				  "the server's limit (--max-queue): try again shortly",
				  (long long)C->max_queue);
	}
	if (j->stream)
		return answer_stream(con, j);	/* the stream holds the reference */
	serve_lock();
	rc = 0;
	while (!rc && !j->done)
		rc = serve_wait(j, j->out_len, j->t_submit + C->request_timeout);
	serve_unlock();
	if (rc || !j->done) {
		serve_lock();
		j->cancelled = 1;
		serve_unlock();
		serve_job_put(j);
		return send_error(con, 504, "timeout", NULL, "the request did not finish in %d s "
				  "(--request-timeout)", C->request_timeout);
	}
	{
		enum MHD_Result ret;
		char id[64];

		if (j->http) {
			ret = send_error(con, (unsigned)j->http, j->code, NULL, "%s", j->msg);
		} else {
			new_id(id, sizeof(id), kind == JOB_CHAT ? "chatcmpl" : "cmpl");
			ret = answer_whole(con, j, id);
		}
		serve_job_put(j);
		return ret;
	}
}

/* The bearer token against the key, in a time that depends on the key's
 * length alone: every byte is compared (no exit at the first difference),
 * and a token of another length fails, so neither a prefix of the key nor
 * the key with more after it passes. */
static int authorised(struct MHD_Connection *con)
{
	const char *h;
	size_t n, hn;
	unsigned diff;

	if (!C->api_key)
		return 1;
	h = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Authorization");
	if (!h || strncmp(h, "Bearer ", 7))
		return 0;
	h += 7;
	n = strlen(C->api_key);
	hn = strlen(h);
	diff = hn != n;
	for (size_t i = 0; i < n; i++)
		diff |= (unsigned char)(h[i < hn ? i : hn] ^ C->api_key[i]);
	return diff == 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *con, const char *url,
			       const char *method, const char *version, const char *upload,
			       size_t *upload_size, void **con_cls)
{
	struct req *rq = *con_cls;
	int post = !strcmp(method, "POST"), get = !strcmp(method, "GET");

	if (!rq) {
		const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Content-Length");
		const char *te = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Transfer-Encoding");

		rq = calloc(1, sizeof(*rq));
		if (!rq)
			return MHD_NO;
		*con_cls = rq;
		/* A body whose end only a closed connection would tell (a coding
		 * other than chunked): refuse it at once rather than wait. */
		if (te && strcasecmp(te, "chunked"))
			return send_error(con, 400, "invalid_request", "Transfer-Encoding", "Transfer-Encoding "
					  "'%s' is not supported: send the body as it is, or chunked", te);
		/* Refuse a body said to be too large before reading it. */
		if (cl && strtoull(cl, NULL, 10) > C->max_body)
			rq->too_big = 1;
		else
			return MHD_YES;
	}
	if (*upload_size) {
		size_t n = *upload_size;

		if (!rq->too_big && rq->len + n > C->max_body)
			rq->too_big = 1;
		if (!rq->too_big) {
			if (rq->len + n + 1 > rq->cap) {
				size_t cap = (rq->len + n + 1) * 2;
				char *p = realloc(rq->body, cap < C->max_body + 1 ? cap : C->max_body + 1);

				if (!p)
					return MHD_NO;
				rq->body = p;
				rq->cap = cap < C->max_body + 1 ? cap : C->max_body + 1;
			}
			memcpy(rq->body + rq->len, upload, n);
			rq->len += n;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (rq->too_big)
		return send_error(con, 413, "body_too_large", NULL, "the request body is larger than "
				  "%" PRIu64 " bytes (--max-body)", C->max_body);
	if (!strcmp(url, "/health")) {
		if (!get)
			return send_error(con, 405, "method_not_allowed", NULL, "%s takes GET", url);
		return send_json(con, 200, json_pack("{sssssI}", "status", "ok", "model",
						     serve_model_name(), "window",
						     (json_int_t)serve_model_window()));
	}
	if (!authorised(con))
		return send_error(con, 401, "invalid_api_key", NULL, "a bearer token is required "
				  "(Authorization: Bearer KEY, the server's --api-key)");
	if (!strcmp(url, "/metrics")) {
		char *m;

		if (!get)
			return send_error(con, 405, "method_not_allowed", NULL, "%s takes GET", url);
		m = serve_metrics();
		return m ? send_text(con, 200, "text/plain; version=0.0.4", m) : MHD_NO;
	}
	if (!strcmp(url, "/v1/models")) {
		if (!get)
			return send_error(con, 405, "method_not_allowed", NULL, "%s takes GET", url);
		return send_json(con, 200, json_pack("{sss[{sssssiss}]}", "object", "list", "data", "id",
						     serve_model_name(), "object", "model", "created",
						     0, "owned_by", "kvmem"));
	}
	if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions")) {
		if (!post)
			return send_error(con, 405, "method_not_allowed", NULL, "%s takes POST", url);
		return completions(con, rq, !strcmp(url, "/v1/chat/completions") ? JOB_CHAT : JOB_TEXT);
	}
	return send_error(con, 404, "not_found", NULL, "no such endpoint: %s %s (the server has "
			  "/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics)",
			  method, url);
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

int serve_http_start(const struct serve_cfg *cfg)
{
	struct sockaddr_in a4;
	struct sockaddr_in6 a6;
	struct sockaddr *sa;
	unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD;

	C = cfg;
	memset(&a4, 0, sizeof(a4));
	memset(&a6, 0, sizeof(a6));
	if (inet_pton(AF_INET, cfg->host, &a4.sin_addr) == 1) {
		a4.sin_family = AF_INET;
		a4.sin_port = htons((uint16_t)cfg->port);
		sa = (struct sockaddr *)&a4;
	} else if (inet_pton(AF_INET6, cfg->host, &a6.sin6_addr) == 1) {
		a6.sin6_family = AF_INET6;
		a6.sin6_port = htons((uint16_t)cfg->port);
		sa = (struct sockaddr *)&a6;
		flags |= MHD_USE_IPv6;
	} else {
		return kvmem_error(EINVAL, "--host %s is not an IPv4 or IPv6 address", cfg->host);
	}
	D = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handler, NULL,
			     MHD_OPTION_SOCK_ADDR, sa,
			     MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
			     MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_queue + 16),
			     /* Idle connections (a client that sends half a request)
			      * go after a minute; a request the engine works on is
			      * not idle (its handler or stream is running). */
			     MHD_OPTION_CONNECTION_TIMEOUT,
			     (unsigned)(cfg->request_timeout < 60 ? cfg->request_timeout : 60),
			     MHD_OPTION_END);
	if (!D)
		return kvmem_error(EADDRINUSE, "cannot listen on %s port %d (in use, or not an address "
				   "of this machine)", cfg->host, cfg->port);
	return 0;
}

int serve_http_port(void)
{
	const union MHD_DaemonInfo *i = D ? MHD_get_daemon_info(D, MHD_DAEMON_INFO_BIND_PORT) : NULL;

	return i ? (int)i->port : -1;
}

void serve_http_stop(void)
{
	if (D)
		MHD_stop_daemon(D);
	D = NULL;
}
#endif
