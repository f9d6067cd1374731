// SPDX-License-Identifier: MIT
/*
 * A request body into a job (serve_int.h), strictly: every field is known
 * (an unknown one is 400 unknown_field, as OpenAI's API answers), of its
 * type and range; malformed JSON, duplicate keys and NUL in strings were
 * refused by the reader (jansson). Fields SDKs send that change nothing
 * here (store, metadata, service_tier, user, parallel_tool_calls) are
 * checked as OpenAI checks them and accepted.
 */
#ifndef KVMEM_NO_SERVE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "serve_int.h"

int bad(struct bad *b, const char *param, const char *fmt, ...)
{
	va_list ap;

	snprintf(b->param, sizeof(b->param), "%s", param ? param : "");
	va_start(ap, fmt);
	vsnprintf(b->msg, sizeof(b->msg), fmt, ap);
	va_end(ap);
	if (!b->code[0])
		snprintf(b->code, sizeof(b->code), "invalid_request");
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

static int want_enum(json_t *v, const char *name, const char *const *ok, struct bad *b)
{
	const char *s = json_string_value(v);
	char list[200] = "";

	if (json_is_null(v))
		return 0;
	for (int i = 0; s && ok[i]; i++)
		if (!strcmp(s, ok[i]))
			return 0;
	for (int i = 0; ok[i]; i++)
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s\"%s\"", i ? ", " : "",
			 ok[i]);
	return bad(b, name, "'%s' must be one of %s", name, list);
}

/* Text content: a string, or an array of {"type": "text", "text": ...};
 * null only where OpenAI allows it (an assistant's message). */
static json_t *content_text(json_t *v, size_t i, int null_ok, struct bad *b)
{
	char param[48];

	snprintf(param, sizeof(param), "messages[%zu].content", i);
	if (!v || json_is_null(v)) {
		if (null_ok)
			return json_string("");
		bad(b, param, "'%s' is required: a string or an array of text parts (only an "
		    "assistant's message may have none)", param);
		return NULL;
	}
	if (json_is_string(v))
		return json_incref(v);
	if (json_is_array(v)) {
		size_t n = 0, k;
		json_t *part, *s;
		char *all = NULL;

		json_array_foreach(v, k, part) {
			json_t *t = json_object_get(part, "text");
			const char *ty = json_string_value(json_object_get(part, "type"));
			char *p;

			if (!json_is_object(part) || !ty || strcmp(ty, "text") || !json_is_string(t) ||
			    json_object_size(part) != 2) {
				free(all);
				bad(b, param, "%s[%zu] must be {\"type\": \"text\", \"text\": ...}: this "
				    "server takes text only", param, k);
				return NULL;
			}
			if (!(p = realloc(all, n + json_string_length(t) + 1))) {
				free(all);
				bad(b, param, "out of memory");
				return NULL;
			}
			all = p;
			memcpy(all + n, json_string_value(t), json_string_length(t));
			n += json_string_length(t);
			all[n] = 0;
		}
		s = json_stringn(all ? all : "", n);
		free(all);
		return s;
	}
	bad(b, param, "'%s' must be a string or an array of text parts", param);
	return NULL;
}

static json_t *tool_calls(json_t *v, const char *param, struct bad *b)
{
	json_t *calls = json_array(), *tc;
	size_t k;

	if (!json_is_array(v))
		return json_decref(calls), bad(b, param, "%s.tool_calls must be an array", param), NULL;
	json_array_foreach(v, k, tc) {
		json_t *fn = json_object_get(tc, "function");
		json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
		char *text = NULL;

		if (!json_is_string(name) || !(json_is_string(args) || json_is_object(args)))
			return json_decref(calls), bad(b, param, "%s.tool_calls[%zu].function must hold a "
						       "name (a string) and arguments (a JSON text, or an "
						       "object)", param, k), NULL;
		/* Arguments given as an object (transformers takes them so) are
		 * held and rendered as the template's tojson writes them. */
		if (json_is_object(args) && !(text = serve_tojson(args)))
			return json_decref(calls), bad(b, param, "out of memory"), NULL;
		json_array_append_new(calls, text ? json_pack("{sOss}", "name", name, "arguments", text)
						  : json_pack("{sOsO}", "name", name, "arguments", args));
		free(text);
	}
	return calls;
}

static json_t *one_message(json_t *m, size_t i, struct bad *b)
{
	static const char *roles[] = { "system", "user", "assistant", "tool", "developer", NULL };
	const char *role = json_string_value(json_object_get(m, "role")), *key;
	json_t *out, *v, *content;
	char param[48];
	int ok = 0, asst;

	snprintf(param, sizeof(param), "messages[%zu]", i);
	if (!json_is_object(m))
		return bad(b, param, "'%s' must be an object", param), NULL;
	for (int r = 0; role && roles[r]; r++)
		ok |= !strcmp(role, roles[r]);
	if (!ok)
		return bad(b, param, "%s.role must be system, developer, user, assistant or tool",
			   param), NULL;
	asst = !strcmp(role, "assistant");
	json_object_foreach(m, key, v) {
		if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "name") &&
		    !(asst && (!strcmp(key, "tool_calls") || !strcmp(key, "reasoning_content") ||
			       !strcmp(key, "refusal"))) &&
		    !(!strcmp(role, "tool") && !strcmp(key, "tool_call_id"))) {
			snprintf(b->code, sizeof(b->code), "unknown_field");
			return bad(b, param, "unknown field '%s' in %s (a %s message)", key, param, role),
			       NULL;
		}
	}
	if (!(content = content_text(json_object_get(m, "content"), i, asst, b)))
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
		json_t *calls = tool_calls(v, param, b);

		if (!calls)
			return json_decref(out), NULL;
		if (json_array_size(calls))
			json_object_set_new(out, "tool_calls", calls);
		else
			json_decref(calls);
	}
	return out;
}

json_t *serve_parse_messages(json_t *v, struct bad *b)
{
	json_t *out, *m;
	size_t i;

	if (!json_is_array(v) || !json_array_size(v))
		return bad(b, "messages", "'messages' must be a non-empty array"), NULL;
	out = json_array();
	json_array_foreach(v, i, m) {
		json_t *one = one_message(m, i, b);

		if (!one) {
			json_decref(out);
			return NULL;
		}
		json_array_append_new(out, one);
	}
	return out;
}

static int stop_field(json_t *v, struct job *j, struct bad *b)
{
	json_t *one = v;
	size_t n = json_is_array(v) ? json_array_size(v) : 1;

	if (json_is_null(v))
		return 0;
	if (!json_is_string(v) && (!json_is_array(v) || n > SERVE_STOP_MAX))
		return bad(b, "stop", "'stop' must be a string or an array of at most %d strings",
			   SERVE_STOP_MAX);
	for (size_t i = 0; i < n; i++) {
		if (json_is_array(v))
			one = json_array_get(v, i);
		if (!json_is_string(one) || !json_string_length(one) || json_string_length(one) > 256)
			return bad(b, "stop", "each stop sequence must be a string of 1..256 bytes");
		if (!(j->stop[j->n_stop] = strdup(json_string_value(one))))
			return bad(b, "stop", "out of memory");
		j->n_stop++;
	}
	return 0;
}

/* OpenAI's metadata: at most 16 pairs, keys up to 64 characters, values
 * strings up to 512. */
static int metadata_field(json_t *v, struct bad *b)
{
	const char *k;
	json_t *x;

	if (json_is_null(v))
		return 0;
	if (!json_is_object(v) || json_object_size(v) > 16)
		return bad(b, "metadata", "'metadata' must be an object of at most 16 pairs");
	json_object_foreach(v, k, x)
		if (strlen(k) > 64 || !json_is_string(x) || json_string_length(x) > 512)
			return bad(b, "metadata", "metadata keys are at most 64 characters and values "
				   "strings of at most 512");
	return 0;
}

static int response_format(json_t *v, struct job *j, struct bad *b)
{
	const char *t = json_string_value(json_object_get(v, "type"));

	if (json_is_null(v))
		return 0;
	if (!json_is_object(v) || !t)
		return bad(b, "response_format", "'response_format' must be {\"type\": \"text\"} or "
			   "{\"type\": \"json_object\"}");
	if (!strcmp(t, "json_object") && json_object_size(v) == 1)
		j->json_object = 1;
	else if (strcmp(t, "text") || json_object_size(v) != 1)
		return bad(b, "response_format", "response_format type '%s' is not supported: "
			   "\"text\" or \"json_object\" (decoding is constrained to one JSON object)", t);
	return 0;
}

/* Fields of both endpoints. 1: taken, 0: not one of them, -1: bad. */
static int common_field(const char *key, json_t *v, struct job *j, struct bad *b)
{
	static const char *const tiers[] = { "auto", "default", "flex", "scale", "priority", NULL };
	const struct serve_cfg *cfg = &j->sv->cfg;
	int64_t n;
	double x;

	if (!strcmp(key, "model")) {
		if (!json_is_string(v))
			return bad(b, key, "'model' must be a string");
		if (strcmp(json_string_value(v), j->sv->name)) {
			snprintf(b->code, sizeof(b->code), "model_not_found");
			return bad(b, key, "model '%s' is not served here; this server serves '%s' "
				   "(GET /v1/models)", json_string_value(v), j->sv->name);
		}
		return 1;
	}
	if (!strcmp(key, "max_tokens") || !strcmp(key, "max_completion_tokens"))
		return want_int(v, key, 0, cfg->max_request_tokens, &j->max_tokens, b) ? -1 : 1;
	if (!strcmp(key, "temperature") || !strcmp(key, "top_p") || !strcmp(key, "min_p")) {
		/* temperature in [0, 2], top_p in (0, 1], min_p in [0, 1] */
		int temp = !strcmp(key, "temperature"), top_p = !strcmp(key, "top_p");
		float *f = temp ? &j->samp.temperature : top_p ? &j->samp.top_p : &j->samp.min_p;

		x = *f;
		if (want_num(v, key, 0, temp ? 2 : 1, top_p, &x, b))
			return -1;
		*f = (float)x;
		return 1;
	}
	if (!strcmp(key, "top_k")) {
		n = 0;
		if (want_int(v, key, -1, 1 << 20, &n, b))
			return -1;
		j->samp.top_k = n > 0 ? (int)n : 0;	/* -1 and 0: no cut */
		return 1;
	}
	if (!strcmp(key, "seed")) {
		int64_t s = 0;

		if (want_int(v, key, INT64_MIN, INT64_MAX, &s, b))
			return -1;
		if (!json_is_null(v))
			j->samp.seed = (uint64_t)s;
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
			if (strcmp(k2, "include_usage")) {
				snprintf(b->code, sizeof(b->code), "unknown_field");
				return bad(b, key, "unknown field '%s' in stream_options", k2);
			}
			if (want_bool(v2, "stream_options.include_usage", &j->include_usage, b))
				return -1;
		}
		return 1;
	}
	if (!strcmp(key, "n")) {
		n = 1;
		if (want_int(v, key, 1, cfg->max_n, &n, b))
			return -1;
		j->n_choices = (int)n;
		return 1;
	}
	if (!strcmp(key, "stop"))
		return stop_field(v, j, b) ? -1 : 1;
	if (!strcmp(key, "user"))
		return json_is_string(v) || json_is_null(v) ? 1 : bad(b, key, "'user' must be a string");
	if (!strcmp(key, "store")) {
		int s = 0;

		return want_bool(v, key, &s, b) ? -1 : 1;
	}
	if (!strcmp(key, "metadata"))
		return metadata_field(v, b) ? -1 : 1;
	if (!strcmp(key, "service_tier"))
		return want_enum(v, key, tiers, b) ? -1 : 1;
	if (!strcmp(key, "conversation")) {
		const char *id = json_string_value(v);

		if (json_is_null(v))
			return 1;
		if (!id || !serve_id_ok(id, json_string_length(v))) {
			snprintf(b->code, sizeof(b->code), "invalid_conversation_id");
			return bad(b, key, "'conversation' must be an id of 1..%d letters, digits, '.', "
				   "'_' and '-', beginning with a letter or digit, without '..'",
				   SERVE_ID_MAX);
		}
		if (j->conv[0] && strcmp(j->conv, id)) {
			snprintf(b->code, sizeof(b->code), "invalid_conversation_id");
			return bad(b, key, "the body's conversation '%s' is not the header's '%s'", id,
				   j->conv);
		}
		snprintf(j->conv, sizeof(j->conv), "%s", id);
		return 1;
	}
	if (!strcmp(key, "frequency_penalty") || !strcmp(key, "presence_penalty")) {
		x = 0;
		if (want_num(v, key, -2, 2, 0, &x, b))
			return -1;
		return x == 0 ? 1 : bad(b, key, "'%s' is not supported: give 0 or leave it out", key);
	}
	if (!strcmp(key, "logit_bias")) {
		if (json_is_null(v) || (json_is_object(v) && !json_object_size(v)))
			return 1;
		return bad(b, key, "'logit_bias' is not supported: leave it out");
	}
	if (!strcmp(key, "response_format"))
		return response_format(v, j, b) ? -1 : 1;
	if (!strcmp(key, "ignore_eos"))
		return want_bool(v, key, &j->ignore_eos, b) ? -1 : 1;
	return 0;
}

static int chat_field(const char *key, json_t *v, struct job *j, struct bad *b, int *got)
{
	static const char *const efforts[] = { "none", "minimal", "low", "medium", "high", NULL };

	if (!strcmp(key, "messages")) {
		if (!(j->messages = serve_parse_messages(v, b)))
			return -1;
		*got = 1;
	} else if (!strcmp(key, "tools")) {
		size_t i;
		json_t *t;

		if (json_is_null(v))
			return 0;
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
	} else if (!strcmp(key, "logprobs")) {
		return want_bool(v, key, &j->logprobs, b);
	} else if (!strcmp(key, "top_logprobs")) {
		int64_t n = 0;

		if (want_int(v, key, 0, SERVE_TOP_LOGPROBS_MAX, &n, b))
			return -1;
		j->top_logprobs = (int)n;
	} else if (!strcmp(key, "reasoning_effort")) {
		const char *s = json_string_value(v);

		if (want_enum(v, key, efforts, b))
			return -1;
		/* The least effort is no thinking (Qwen3's enable_thinking:
		 * false); chat_template_kwargs, when given, decides. */
		if (s && (!strcmp(s, "none") || !strcmp(s, "minimal")) && j->thinking < 0)
			j->thinking = 0;
	} else if (!strcmp(key, "chat_template_kwargs")) {
		const char *k2;
		json_t *v2;
		int th = -1;

		if (!json_is_object(v))
			return bad(b, key, "'chat_template_kwargs' must be an object");
		json_object_foreach(v, k2, v2) {
			if (strcmp(k2, "enable_thinking"))
				return bad(b, key, "unknown template argument '%s' (enable_thinking)", k2);
			if (want_bool(v2, "chat_template_kwargs.enable_thinking", &th, b))
				return -1;
		}
		j->thinking = th;
	} else {
		snprintf(b->code, sizeof(b->code), "unknown_field");
		return bad(b, key, "unknown field '%s'", key);
	}
	return 0;
}

static int text_field(const char *key, json_t *v, struct job *j, struct bad *b)
{
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
	} else if (!strcmp(key, "logprobs")) {
		/* Completions: the number of alternatives, 0..5. */
		int64_t n = -1;

		if (want_int(v, key, 0, 5, &n, b))
			return -1;
		j->logprobs = n >= 0;
		j->top_logprobs = n > 0 ? (int)n : 0;
	} else if (!strcmp(key, "echo")) {
		if (!json_is_null(v) && !json_is_false(v))
			return bad(b, key, "'echo' is not supported: leave it out");
	} else if (!strcmp(key, "suffix")) {
		if (!json_is_null(v))
			return bad(b, key, "'suffix' is not supported: leave it out");
	} else {
		snprintf(b->code, sizeof(b->code), "unknown_field");
		return bad(b, key, "unknown field '%s'", key);
	}
	return 0;
}

int serve_parse(json_t *req, struct job *j, struct bad *b)
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
		if (j->kind == JOB_CHAT ? chat_field(key, v, j, b, &got) : text_field(key, v, j, b))
			return -1;
	}
	if (j->kind == JOB_CHAT && !got)
		return bad(b, "messages", "'messages' is required");
	if (j->kind == JOB_TEXT && !j->prompt)
		return bad(b, "prompt", "'prompt' is required");
	if (j->kind == JOB_CHAT && j->top_logprobs && !j->logprobs)
		return bad(b, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
	if (j->json_object && j->ignore_eos)
		return bad(b, "ignore_eos", "'ignore_eos' cannot go with response_format json_object, "
			   "which ends the answer with its object");
	if (j->conv[0] && j->n_choices > 1)
		return bad(b, "n", "a conversation keeps one answer a turn: 'n' must be 1 with a "
			   "conversation");
	return 0;
}
#endif
