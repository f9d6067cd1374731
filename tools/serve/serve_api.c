// SPDX-License-Identifier: MIT
/*
 * kvmem serve's endpoints besides the completions:
 *
 *   GET    /v1/conversations[?limit=N&after=ID]   the conversations, by id
 *   GET    /v1/conversations/ID                   one: what it holds (the
 *          messages or the text), its turns, its committed tokens
 *   DELETE /v1/conversations/ID                   removes it (its workspace
 *          and record); 409 while a request of it waits or runs
 *   POST   /tokenize    {"prompt": TEXT} or {"messages": [...]} -> ids
 *   POST   /detokenize  {"tokens": [ids]} -> text   (also under /v1/)
 *
 * Reads come from the disk (the record is replaced atomically, and trimmed
 * here as a reopen would trim it to the committed tokens); a delete goes
 * through the engine, which owns the open conversations.
 */
#ifndef KVMEM_NO_SERVE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "serve_http.h"

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_open(struct serve *sv, const char *id)
{
	int open = 0;

	pthread_mutex_lock(&sv->mu);
	for (struct conv *c = sv->convs; c && !open; c = c->next)
		open = !strcmp(c->id, id);
	pthread_mutex_unlock(&sv->mu);
	return open;
}

/* A conversation's summary, or with what it holds (full). NULL: none. */
static json_t *conv_doc(struct serve *sv, const char *id, int full, char *err, size_t errlen)
{
	char dir[4300], ws[4400];
	kvmem_workspace_info wi = { 0 };
	json_t *rec, *turns, *doc, *kept = json_array();
	const char *kind;
	size_t keep = 0;

	snprintf(dir, sizeof(dir), "%s/conversations/%s", sv->data_dir, id);
	snprintf(ws, sizeof(ws), "%s/ws", dir);
	if (!(rec = conv_read(dir, err, errlen))) {
		json_decref(kept);
		return NULL;
	}
	kvmem_workspace_info_read(ws, &wi);
	turns = json_object_get(rec, "turns");
	/* The turns the workspace committed (a record may be one ahead). */
	for (size_t i = 0; i < json_array_size(turns); i++) {
		json_t *t = json_array_get(turns, i);

		if ((uint64_t)json_integer_value(json_object_get(t, "tokens")) > wi.tokens)
			break;
		json_array_append(kept, t);
		keep = i + 1;
	}
	kind = json_string_value(json_object_get(rec, "kind"));
	doc = json_pack("{sssssssIsIsb}", "id", id, "object", "conversation", "kind", kind ? kind : "",
			"turns", (json_int_t)keep, "workspace_tokens", (json_int_t)wi.tokens, "open",
			is_open(sv, id));
	if (full && keep) {
		json_t *last = json_array_get(kept, keep - 1);

		if (kind && !strcmp(kind, "text")) {
			json_t *t = json_object_get(rec, "text");
			size_t n = (size_t)json_integer_value(json_object_get(last, "text"));

			if (n > json_string_length(t))
				n = json_string_length(t);
			json_object_set_new(doc, "text", json_stringn(json_string_value(t), n));
		} else {
			json_t *ms = json_object_get(rec, "messages"), *out = json_array();
			size_t n = (size_t)json_integer_value(json_object_get(last, "messages"));

			for (size_t i = 0; i < n && i < json_array_size(ms); i++)
				json_array_append(out, json_array_get(ms, i));
			json_object_set_new(doc, "messages", out);
		}
	} else if (full) {
		json_object_set_new(doc, kind && !strcmp(kind, "text") ? "text" : "messages",
				    kind && !strcmp(kind, "text") ? json_string("") : json_array());
	}
	json_decref(kept);
	json_decref(rec);
	return doc;
}

static enum MHD_Result list(struct MHD_Connection *con, struct serve *sv)
{
	const char *lim = MHD_lookup_connection_value(con, MHD_GET_ARGUMENT_KIND, "limit");
	const char *after = MHD_lookup_connection_value(con, MHD_GET_ARGUMENT_KIND, "after");
	char dir[4200], **names = NULL, *end, err[256];
	long limit = 100;
	size_t n = 0, cap = 0, i;
	json_t *data = json_array();
	int more = 0;
	DIR *d;
	struct dirent *e;

	if (lim) {
		limit = strtol(lim, &end, 10);
		if (*end || limit < 1 || limit > 1000) {
			json_decref(data);
			return http_error(con, sv, 400, "invalid_request", "limit", 0, "'limit' must be "
					  "an integer in 1..1000");
		}
	}
	snprintf(dir, sizeof(dir), "%s/conversations", sv->data_dir);
	if ((d = opendir(dir))) {
		while ((e = readdir(d))) {
			if (!serve_id_ok(e->d_name, strlen(e->d_name)) || (after && strcmp(e->d_name, after) <= 0))
				continue;
			if (n == cap) {
				size_t nc = cap ? 2 * cap : 64;
				char **p = realloc(names, nc * sizeof(*names));

				if (!p)
					break;
				names = p;
				cap = nc;
			}
			if (!(names[n] = strdup(e->d_name)))
				break;
			n++;
		}
		closedir(d);
	}
	if (n)
		qsort(names, n, sizeof(*names), by_name);
	for (i = 0; i < n; i++) {
		json_t *c;

		if ((long)json_array_size(data) == limit) {
			more = 1;
			break;
		}
		if ((c = conv_doc(sv, names[i], 0, err, sizeof(err))))
			json_array_append_new(data, c);
	}
	for (i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return http_json(con, sv, 200, json_pack("{sssosb}", "object", "list", "data", data, "has_more",
						 more));
}

static enum MHD_Result delete_one(struct MHD_Connection *con, struct serve *sv, const char *id)
{
	struct job *j = job_new(sv, JOB_DELETE);
	enum MHD_Result ret;
	int rc;

	if (!j)
		return http_error(con, sv, 500, "server_error", NULL, 0, "out of memory");
	snprintf(j->conv, sizeof(j->conv), "%s", id);
	rc = serve_engine_submit(sv, &j, 1);
	if (!rc) {
		pthread_mutex_lock(&sv->mu);
		while (!j->done)
			serve_wait(j, serve_now() + 1);
		pthread_mutex_unlock(&sv->mu);
		rc = j->http;
	}
	ret = rc ? http_error(con, sv, (unsigned)rc, j->code, NULL, j->retry_after, "%s", j->msg)
		 : http_json(con, sv, 200, json_pack("{sssssb}", "id", id, "object",
						     "conversation.deleted", "deleted", 1));
	job_put(j);
	return ret;
}

enum MHD_Result api_conversations(struct MHD_Connection *con, struct serve *sv, const char *url,
				  const char *method)
{
	const char *id = url[17] == '/' ? url + 18 : NULL;
	char err[256] = "";
	json_t *doc;

	if (!id) {
		if (strcmp(method, "GET"))
			return http_error(con, sv, 405, "method_not_allowed", NULL, 0, "%s takes GET", url);
		return list(con, sv);
	}
	if (!serve_id_ok(id, strlen(id)))
		return http_error(con, sv, 400, "invalid_conversation_id", NULL, 0, "'%s' is not a "
				  "conversation id", id);
	if (!strcmp(method, "DELETE"))
		return delete_one(con, sv, id);
	if (strcmp(method, "GET"))
		return http_error(con, sv, 405, "method_not_allowed", NULL, 0, "%s takes GET or DELETE",
				  url);
	if (!(doc = conv_doc(sv, id, 1, err, sizeof(err))))
		return http_error(con, sv, 404, "conversation_not_found", NULL, 0, "no conversation "
				  "'%s' (or it holds no turn yet)", id);
	return http_json(con, sv, 200, doc);
}

/* ---- tokenize ------------------------------------------------------------------------------ */
static enum MHD_Result tokenize(struct MHD_Connection *con, struct serve *sv, json_t *req)
{
	json_t *prompt = json_object_get(req, "prompt"), *msgs = json_object_get(req, "messages"), *v;
	int special = 1, gen = 1;
	kvmem_ids ids = { 0 };
	struct bad b = { "", "", "" };
	const char *key;
	json_t *arr;
	int rc;

	json_object_foreach(req, key, v) {
		if (!strcmp(key, "add_special_tokens") || !strcmp(key, "add_generation_prompt")) {
			if (!json_is_boolean(v))
				return http_error(con, sv, 400, "invalid_request", key, 0, "'%s' must be "
						  "true or false", key);
			*(key[4] == 's' ? &special : &gen) = json_is_true(v);
		} else if (strcmp(key, "prompt") && strcmp(key, "messages") && strcmp(key, "model")) {
			return http_error(con, sv, 400, "unknown_field", key, 0, "unknown field '%s'", key);
		}
	}
	if (!prompt == !msgs)
		return http_error(con, sv, 400, "invalid_request", NULL, 0, "give 'prompt' (a string) or "
				  "'messages' (a chat), one of them");
	if (prompt) {
		if (!json_is_string(prompt))
			return http_error(con, sv, 400, "invalid_request", "prompt", 0, "'prompt' must be "
					  "a string");
		rc = kvmem_tokenizer_encode(sv->tok.tok, json_string_value(prompt), json_string_length(prompt),
					    special ? KVMEM_TOK_SPECIAL : 0, &ids);
	} else {
		json_t *ms = serve_parse_messages(msgs, &b);
		const char **strs = NULL;
		kvmem_chat_msg *m;
		kvmem_chat_opts o = { .add_generation_prompt = gen, .thinking = -1 };

		if (!ms)
			return http_error(con, sv, 400, b.code, b.param, 0, "%s", b.msg);
		if (!(m = serve_chat_msgs(ms, &strs))) {
			json_decref(ms);
			return http_error(con, sv, 500, "server_error", NULL, 0, "out of memory");
		}
		rc = kvmem_chat_render(sv->tok.tok, m, json_array_size(ms), 0, &o, &ids);
		free(m);
		free(strs);
		json_decref(ms);
	}
	if (rc) {
		kvmem_ids_free(&ids);
		return http_error(con, sv, 400, "invalid_prompt", NULL, 0, "%s", kvmem_last_error());
	}
	arr = json_array();
	for (size_t i = 0; i < ids.n; i++)
		json_array_append_new(arr, json_integer(ids.v[i]));
	v = json_pack("{sIsIso}", "count", (json_int_t)ids.n, "max_model_len",
		      (json_int_t)sv->m->cfg.max_position, "tokens", arr);
	kvmem_ids_free(&ids);
	return http_json(con, sv, 200, v);
}

static enum MHD_Result detokenize(struct MHD_Connection *con, struct serve *sv, json_t *req)
{
	json_t *toks = json_object_get(req, "tokens"), *v;
	int vocab = sv->m->cfg.vocab;
	const char *key;
	int32_t *ids;
	size_t i, len;
	char *text;
	int rc;

	json_object_foreach(req, key, v)
		if (strcmp(key, "tokens") && strcmp(key, "model"))
			return http_error(con, sv, 400, "unknown_field", key, 0, "unknown field '%s'", key);
	if (!json_is_array(toks))
		return http_error(con, sv, 400, "invalid_request", "tokens", 0, "'tokens' must be an "
				  "array of token ids");
	ids = malloc((json_array_size(toks) + 1) * sizeof(*ids));
	if (!ids)
		return http_error(con, sv, 500, "server_error", NULL, 0, "out of memory");
	json_array_foreach(toks, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
			free(ids);
			return http_error(con, sv, 400, "invalid_request", "tokens", 0, "tokens[%zu] is "
					  "not an id of this model's vocabulary (0..%d)", i, vocab - 1);
		}
		ids[i] = (int32_t)json_integer_value(v);
	}
	rc = kvmem_tokenizer_decode(sv->tok.tok, ids, json_array_size(toks), 0, &text, &len);
	free(ids);
	if (rc)
		return http_error(con, sv, 400, "invalid_request", "tokens", 0, "%s", kvmem_last_error());
	v = json_pack("{ss%}", "prompt", text, len);
	free(text);
	return http_json(con, sv, 200, v);
}

enum MHD_Result api_tokenize(struct MHD_Connection *con, struct req *rq, int detok)
{
	struct serve *sv = rq->sv;
	json_error_t err;
	json_t *doc = json_loadb(rq->body ? rq->body : "", rq->len, JSON_REJECT_DUPLICATES, &err);
	json_t *model;
	enum MHD_Result ret;

	if (!doc || !json_is_object(doc)) {
		json_decref(doc);
		return http_error(con, sv, 400, "invalid_json", NULL, 0, "the body must be a JSON object");
	}
	model = json_object_get(doc, "model");
	if (model && (!json_is_string(model) || strcmp(json_string_value(model), sv->name))) {
		json_decref(doc);
		return http_error(con, sv, 404, "model_not_found", "model", 0, "this server serves '%s'",
				  sv->name);
	}
	ret = detok ? detokenize(con, sv, doc) : tokenize(con, sv, doc);
	json_decref(doc);
	return ret;
}
#endif
