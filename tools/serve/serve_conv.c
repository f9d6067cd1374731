// SPDX-License-Identifier: MIT
/*
 * A conversation's record, conversation.json beside its workspace (ws/),
 * or with --store the workspace's record app.conversation.json in the
 * shared store (kvmem_workspace_record_*): the messages (or text) the
 * workspace holds, and where each turn ended in tokens. The workspace is committed after the record is written, so after
 * a crash the record may hold one turn more than the workspace; loading
 * trims it to the workspace's committed count, which is always a turn's
 * end.
 *
 *   {"version": 1, "kind": "chat", "messages": [...],
 *    "turns": [{"messages": 2, "tokens": 31, "prompt_tokens": 27,
 *               "completion_tokens": 3, "length": false}, ...]}
 *   {"version": 1, "kind": "text", "text": "...",
 *    "turns": [{"text": 120, "answer": 8, "tokens": 40, ...}, ...]}
 *
 * A turn's usage and finish ("length": cut at max_tokens) are kept so that
 * a replay reports what the turn had, and the last turn's "logprobs" when
 * it was asked for them ([[id, lp, [top ids], [top lps]], ...]); "answer"
 * (text) is the completion's bytes at the end of "text", so that a
 * request repeating the turn's prompt gets it back. Records written before
 * these fields have none: a replay then reports 0 and a text turn cannot
 * be replayed.
 */
#ifndef KVMEM_NO_SERVE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "serve_int.h"
#include "util/fs.h"

void conv_free_record(struct conv *c)
{
	json_decref(c->messages);
	json_decref(c->turns);
	free(c->text);
	c->messages = c->turns = NULL;
	c->text = NULL;
	c->text_len = 0;
	c->kind = -1;
}

static int fresh(struct conv *c)
{
	conv_free_record(c);
	c->messages = json_array();
	c->turns = json_array();
	if (!c->messages || !c->turns)
		return kvmem_error(ENOMEM, "out of memory");
	return 0;
}

#define SHARED_RECORD "app.conversation.json"

/* A shared conversation's record, parsed (NULL: err says why; *absent
 * when there is none). */
static json_t *load_shared(struct conv *c, json_error_t *err, int *absent)
{
	char *text;
	size_t len;
	json_t *doc;

	*absent = 0;
	memset(err, 0, sizeof(*err));
	if (kvmem_workspace_record_read(c->ws, SHARED_RECORD, &text, &len) < 0) {
		*absent = kvmem_last_errno() == ENOENT;
		snprintf(err->text, sizeof(err->text), "%s", kvmem_last_error());
		return NULL;
	}
	doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, err);
	free(text);
	return doc;
}

int conv_load(struct conv *c, int64_t ws_tokens)
{
	char path[4200];
	json_error_t err;
	json_t *doc, *turns;
	const char *kind;
	size_t keep = 0, i;
	int64_t at = 0;
	int absent = 0;

	snprintf(path, sizeof(path), "%s/%s", c->dir, c->shared ? SHARED_RECORD : "conversation.json");
	if (fresh(c))
		return -1;
	doc = c->shared ? load_shared(c, &err, &absent) :
			  json_load_file(path, JSON_REJECT_DUPLICATES, &err);
	if (!doc) {
		if (c->shared ? absent : access(path, F_OK) && errno == ENOENT) {
			if (ws_tokens)
				return kvmem_error(EBADMSG, "%s: missing, but the workspace holds %lld "
						   "tokens", path, (long long)ws_tokens);
			return 0;
		}
		return kvmem_error(EBADMSG, "%s:%d: %s", path, err.line, err.text);
	}
	kind = json_string_value(json_object_get(doc, "kind"));
	turns = json_object_get(doc, "turns");
	if (!kind || !json_is_array(turns) || json_integer_value(json_object_get(doc, "version")) != 1) {
		json_decref(doc);
		return kvmem_error(EBADMSG, "%s: not a conversation record of version 1", path);
	}
	/* The turns the workspace committed: every one ending at or before
	 * its token count, and the last of them ends exactly there. */
	for (i = 0; i < json_array_size(turns); i++) {
		json_int_t t = json_integer_value(json_object_get(json_array_get(turns, i), "tokens"));

		if (t > ws_tokens)
			break;
		at = t;
		keep = i + 1;
	}
	if (at != ws_tokens) {
		json_decref(doc);
		return kvmem_error(EBADMSG, "%s: no turn ends at the workspace's %lld committed tokens",
				   path, (long long)ws_tokens);
	}
	c->kind = !strcmp(kind, "text") ? JOB_TEXT : JOB_CHAT;
	if (keep) {
		json_t *last = json_array_get(turns, keep - 1);

		if (c->kind == JOB_CHAT) {
			json_t *m = json_object_get(doc, "messages");
			size_t n = (size_t)json_integer_value(json_object_get(last, "messages"));

			if (!json_is_array(m) || n > json_array_size(m)) {
				json_decref(doc);
				return kvmem_error(EBADMSG, "%s: fewer messages than its turns say", path);
			}
			for (size_t k = 0; k < n; k++)
				json_array_append(c->messages, json_array_get(m, k));
		} else {
			const char *t = json_string_value(json_object_get(doc, "text"));
			size_t n = (size_t)json_integer_value(json_object_get(last, "text"));

			if (!t || n > json_string_length(json_object_get(doc, "text"))) {
				json_decref(doc);
				return kvmem_error(EBADMSG, "%s: less text than its turns say", path);
			}
			c->text = malloc(n + 1);
			if (!c->text) {
				json_decref(doc);
				return kvmem_error(ENOMEM, "out of memory");
			}
			memcpy(c->text, t, n);
			c->text[n] = 0;
			c->text_len = n;
		}
		for (size_t k = 0; k < keep; k++)
			json_array_append(c->turns, json_array_get(turns, k));
	} else {
		c->kind = -1;
	}
	json_decref(doc);
	return 0;
}

/* A turn's log probabilities for its replay: [[id, lp, [top ids],
 * [top lps]], ...], as the answer had them. */
static json_t *lps_record(const struct job *j)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < j->n_lps; i++) {
		const struct tok_lp *lp = &j->lps[i];
		json_t *ids = json_array(), *lps = json_array();

		for (int k = 0; k < lp->n_top; k++) {
			json_array_append_new(ids, json_integer(lp->top_id[k]));
			json_array_append_new(lps, json_real(lp->top_lp[k]));
		}
		json_array_append_new(a, json_pack("[IfOO]", (json_int_t)lp->id, (double)lp->lp, ids,
						   lps));
		json_decref(ids);
		json_decref(lps);
	}
	return a;
}

int conv_save(struct conv *c, int64_t tokens, const struct job *j)
{
	char path[4200], tmp[4300];
	json_t *doc, *turn;
	char *text;
	int fd, rc;

	snprintf(path, sizeof(path), "%s/conversation.json", c->dir);
	snprintf(tmp, sizeof(tmp), "%s/.conversation.json.tmp", c->dir);
	turn = c->kind == JOB_CHAT
		? json_pack("{sIsI}", "messages", (json_int_t)json_array_size(c->messages), "tokens",
			    (json_int_t)tokens)
		: json_pack("{sIsIsI}", "text", (json_int_t)c->text_len, "answer",
			    (json_int_t)j->out_len, "tokens", (json_int_t)tokens);
	if (!turn || json_object_set_new(turn, "prompt_tokens", json_integer(j->prompt_tokens)) ||
	    json_object_set_new(turn, "completion_tokens", json_integer(j->completion_tokens)) ||
	    json_object_set_new(turn, "length", json_boolean(j->finish_length)) ||
	    (j->logprobs && json_object_set_new(turn, "logprobs", lps_record(j))))
		return kvmem_error(ENOMEM, "out of memory");
	/* Only the last turn can be replayed: the one before keeps no
	 * log probabilities. */
	if (json_array_size(c->turns))
		json_object_del(json_array_get(c->turns, json_array_size(c->turns) - 1), "logprobs");
	if (json_array_append_new(c->turns, turn))
		return kvmem_error(ENOMEM, "out of memory");
	doc = c->kind == JOB_CHAT
		? json_pack("{sisssOsO}", "version", 1, "kind", "chat", "messages", c->messages,
			    "turns", c->turns)
		: json_pack("{si ss ss% sO}", "version", 1, "kind", "text", "text",
			    c->text ? c->text : "", c->text_len, "turns", c->turns);
	text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
	json_decref(doc);
	if (!text)
		return kvmem_error(ENOMEM, "%s: out of memory", path);
	if (c->shared) {
		/* Replaced whole and durably, by this writer only (its lease). */
		rc = kvmem_workspace_record_write(c->ws, SHARED_RECORD, text, strlen(text));
		free(text);
		return rc;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		free(text);
		return kvmem_error(errno, "%s: cannot create: %s", tmp, strerror(errno));
	}
	rc = kvmem_write_all(fd, text, strlen(text), -1);
	free(text);
	if (rc < 0 || fsync(fd)) {
		int e = rc < 0 ? -rc : errno;

		close(fd);
		unlink(tmp);
		return kvmem_error(e, "%s: cannot write: %s", tmp, strerror(e));
	}
	if (close(fd) || rename(tmp, path)) {
		unlink(tmp);
		return kvmem_error(errno, "%s: cannot replace: %s", path, strerror(errno));
	}
	fd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	return 0;
}
json_t *conv_read(const char *dir, char *err, size_t errlen)
{
	char path[4200];
	json_error_t e;
	json_t *doc;

	snprintf(path, sizeof(path), "%s/conversation.json", dir);
	doc = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
	if (!doc)
		snprintf(err, errlen, "%s", e.text);
	return doc;
}
#endif
