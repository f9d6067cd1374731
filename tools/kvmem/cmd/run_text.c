// SPDX-License-Identifier: MIT
/*
 * kvmem run --prompt-text TEXT / --chat FILE: a plain run's prompt as text,
 * through the model directory's tokenizer (tok_cli.h: tokenizer.json's BPE,
 * or agentlang's), and the generated ids as text. A chat file is JSON: an
 * array of messages, or {"messages": [...]} (as an OpenAI request writes
 * them), each {"role": ..., "content": "..."}; it is rendered by the chat
 * template with the assistant's turn opened.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/tokenizer.h"
#include "run.h"
#include "tok_cli.h"

static struct tok_cli T;
static int opened;

static int open_tok(const struct run_opts *o, const kvmem_config *c)
{
	if (opened)
		return 0;
	if (tok_cli_open(o->model, c, &T))
		return -1;
	opened = 1;
	return 0;
}

static int chat_ids(const char *path, kvmem_ids *ids)
{
	json_error_t err;
	json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &err), *ms;
	kvmem_chat_msg *m;
	size_t n;
	int rc;

	if (!doc)
		return kvmem_error(EINVAL, "%s:%d:%d: %s", path, err.line, err.column, err.text);
	ms = json_is_array(doc) ? doc : json_object_get(doc, "messages");
	n = json_array_size(ms);
	if (!n) {
		json_decref(doc);
		return kvmem_error(EINVAL, "%s: no messages (an array of {\"role\", \"content\"}, or "
				   "{\"messages\": [...]})", path);
	}
	m = calloc(n, sizeof(*m));
	if (!m) {
		json_decref(doc);
		return kvmem_error(ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		json_t *x = json_array_get(ms, i);

		m[i].role = json_string_value(json_object_get(x, "role"));
		m[i].content = json_string_value(json_object_get(x, "content"));
		if (!m[i].role || (!m[i].content && !json_is_null(json_object_get(x, "content")))) {
			free(m);
			json_decref(doc);
			return kvmem_error(EINVAL, "%s: message %zu needs a \"role\" and a \"content\" "
					   "string", path, i);
		}
	}
	rc = kvmem_chat_render(T.tok, m, n, 0, NULL, ids);
	free(m);
	json_decref(doc);
	return rc ? kvmem_error_prefix("%s", path) : 0;
}

int run_text_prompt(const struct run_opts *o, const kvmem_config *c, int32_t **out, int *n)
{
	kvmem_ids ids = { 0 };
	int rc;

	if (open_tok(o, c))
		return -1;
	if (o->chat)
		rc = chat_ids(o->chat, &ids);
	else
		rc = kvmem_tokenizer_encode(T.tok, o->prompt_text, strlen(o->prompt_text),
					    KVMEM_TOK_SPECIAL, &ids);
	if (!rc && !ids.n)
		rc = kvmem_error(EINVAL, "the prompt holds no tokens");
	if (!rc && T.agentlang && !o->chat && ids.v[0] != 1) {
		/* An agentlang sequence begins with <bos>, as the chat does. */
		kvmem_ids x = { 0 };
		int32_t bos = 1;

		rc = kvmem_ids_push(&x, &bos, 1);
		if (!rc)
			rc = kvmem_ids_push(&x, ids.v, ids.n);
		kvmem_ids_free(&ids);
		ids = x;
	}
	if (rc) {
		kvmem_ids_free(&ids);
		return -1;
	}
	*out = ids.v;
	*n = (int)ids.n;
	return 0;
}

int run_text_print(const struct run_opts *o, const kvmem_config *c, const int32_t *gen, long n)
{
	char *text;
	size_t len;
	long k = 0;

	if (open_tok(o, c))
		return -1;
	while (k < n && !tok_cli_is_stop(&T, gen[k]))
		k++;
	if (kvmem_tokenizer_decode(T.tok, gen, (size_t)k, KVMEM_TOK_SKIP_SPECIAL, &text, &len))
		return -1;
	printf("text: ");
	fwrite(text, 1, len, stdout);
	printf("%s\n", k < n ? " [stop]" : "");
	free(text);
	return 0;
}

void run_text_close(void)
{
	if (opened)
		tok_cli_close(&T);
	opened = 0;
}
