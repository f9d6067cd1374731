// SPDX-License-Identifier: MIT
/*
 * kvmem serve's jobs (serve_int.h): made by the HTTP side, one per choice
 * of a request, counted (the HTTP side, the queue, the engine each hold a
 * reference), failed with an OpenAI error, and the chat messages they
 * carry as the tokenizer's kvmem_chat_msg.
 */
#ifndef KVMEM_NO_SERVE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvmem/kvmem.h"
#include "serve_int.h"

/* ---- jobs -------------------------------------------------------------------- */
struct job *job_new(struct serve *sv, int kind)
{
	struct job *j = calloc(1, sizeof(*j));
	pthread_condattr_t ca;

	if (!j)
		return NULL;
	j->sv = sv;
	j->refs = 1;
	j->kind = kind;
	j->thinking = -1;
	j->max_tokens = sv->cfg.default_max_tokens;
	j->samp.top_p = 1.0f;
	j->n_choices = 1;
	j->lead = j;
	j->t_submit = serve_now();
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&j->news, &ca);
	pthread_condattr_destroy(&ca);
	return j;
}

static char *dup_bytes(const char *s, size_t n)
{
	char *d = malloc(n + 1);

	if (d) {
		memcpy(d, s, n);
		d[n] = 0;
	}
	return d;
}

struct job *job_clone(struct job *lead, int i)
{
	struct job *j = job_new(lead->sv, lead->kind);

	if (!j)
		return NULL;
	j->stream = lead->stream;
	j->include_usage = lead->include_usage;
	memcpy(j->conv, lead->conv, sizeof(j->conv));
	j->messages = json_incref(lead->messages);
	j->thinking = lead->thinking;
	j->max_tokens = lead->max_tokens;
	j->samp = lead->samp;
	/* Each choice draws from a stream of its own. */
	j->samp.seed = lead->samp.seed + (uint64_t)i;
	j->logprobs = lead->logprobs;
	j->top_logprobs = lead->top_logprobs;
	j->json_object = lead->json_object;
	j->ignore_eos = lead->ignore_eos;
	j->index = i;
	j->n_choices = lead->n_choices;
	/* The lead's condition variable is this job's news: it lives as
	 * long as its choices do. */
	pthread_mutex_lock(&lead->sv->mu);
	lead->refs++;
	pthread_mutex_unlock(&lead->sv->mu);
	j->lead = lead;
	j->t_submit = lead->t_submit;
	if (lead->prompt && !(j->prompt = dup_bytes(lead->prompt, lead->prompt_len)))
		goto oom;
	j->prompt_len = lead->prompt_len;
	if (lead->n_tools) {
		j->tools = calloc((size_t)lead->n_tools, sizeof(char *));
		if (!j->tools)
			goto oom;
		for (; j->n_tools < lead->n_tools; j->n_tools++)
			if (!(j->tools[j->n_tools] = strdup(lead->tools[j->n_tools])))
				goto oom;
	}
	for (; j->n_stop < lead->n_stop; j->n_stop++)
		if (!(j->stop[j->n_stop] = strdup(lead->stop[j->n_stop])))
			goto oom;
	return j;
oom:
	job_put(j);
	return NULL;
}

void job_put(struct job *j)
{
	struct serve *sv;
	int last;

	if (!j)
		return;
	sv = j->sv;
	pthread_mutex_lock(&sv->mu);
	last = --j->refs == 0;
	pthread_mutex_unlock(&sv->mu);
	if (!last)
		return;
	json_decref(j->messages);
	for (int i = 0; i < j->n_tools; i++)
		free(j->tools[i]);
	free(j->tools);
	for (int i = 0; i < j->n_stop; i++)
		free(j->stop[i]);
	free(j->prompt);
	free(j->out);
	free(j->reasoning);
	free(j->text);
	free(j->lps);
	free(j->masked);
	kvmem_ids_free(&j->ids);
	kvmem_ids_free(&j->gen);
	pthread_cond_destroy(&j->news);
	if (j->lead != j)
		job_put(j->lead);
	free(j);
}

void job_fail(struct job *j, int http, const char *code, const char *fmt, ...)
{
	struct serve *sv = j->sv;
	va_list ap;

	pthread_mutex_lock(&sv->mu);
	j->http = http;
	snprintf(j->code, sizeof(j->code), "%s", code);
	va_start(ap, fmt);
	vsnprintf(j->msg, sizeof(j->msg), fmt, ap);
	va_end(ap);
	j->done = 1;
	j->t_end = serve_now();
	sv->c.failed++;
	serve_news(j);
	pthread_mutex_unlock(&sv->mu);
	if (!sv->cfg.quiet)
		fprintf(stderr, "%s: request failed (%d %s): %s\n", SERVE_WHO, http, code, j->msg);
}

void job_fail_errno(struct job *j, int err, const char *msg)
{
	if (err == ENOSPC || err == EDQUOT)
		job_fail(j, 507, "insufficient_storage", "conversation '%s' needs disk space the "
			 "data directory does not have (%s); its last committed turn is kept",
			 j->conv[0] ? j->conv : "(none)", msg);
	else
		job_fail(j, 500, "server_error", "%s", msg);
}

kvmem_chat_msg *serve_chat_msgs(json_t *ms, const char ***strs)
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
		size_t nc = json_array_size(tc);

		m[i].role = json_string_value(json_object_get(x, "role"));
		m[i].content = json_string_value(json_object_get(x, "content"));
		m[i].reasoning = json_string_value(json_object_get(x, "reasoning"));
		m[i].call_names = *strs + k;
		m[i].call_args = *strs + k + nc;
		m[i].n_calls = (int)nc;
		for (size_t t = 0; t < nc; t++) {
			json_t *call = json_array_get(tc, t);

			(*strs)[k + t] = json_string_value(json_object_get(call, "name"));
			(*strs)[k + nc + t] = json_string_value(json_object_get(call, "arguments"));
		}
		k += 2 * nc;
	}
	return m;
}

#endif
