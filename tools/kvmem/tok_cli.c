// SPDX-License-Identifier: MIT
/*
 * The tokenizer a model directory speaks (tok_cli.h): tokenizer.json's BPE,
 * or agentlang's word-level tokenizer behind the same ops.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "agentlang/agentlang.h"
#include "kvmem/kvmem.h"
#include "kvmem/tokenizer.h"
#include "tok_cli.h"

/* ---- agentlang behind kvmem_tokenizer_ops ---------------------------------- */
/*
 * A text that is not agentlang. agentlang has no byte fallback, and one
 * would not help: the model never saw such tokens in training, so English
 * in, noise out. The message says what the model speaks instead, with a
 * prompt it answers (tests/cli/test_serve_api.sh sends this very one).
 */
#define AL_EXAMPLE "$ cat api.conf\napi.conf db.port = 5432\n? api.conf db.port ="

static int not_agentlang(const char *text)
{
	const char *w = text;
	size_t n = 0;
	int32_t ids[64];

	/* The first word with no piece (each word alone encodes alike). */
	while (*w) {
		w += strspn(w, " \t\r\n\v\f");
		n = strcspn(w, " \t\r\n\v\f");
		if (!n)
			break;
		char word[64];

		snprintf(word, sizeof(word), "%.*s", (int)(n < 63 ? n : 63), w);
		if (n >= 63 || agentlang_encode(word, ids, 64) < 0)
			break;
		w += n;
	}
	return kvmem_error(EINVAL, "agentlang: '%.*s' is not agentlang, the language the embedded "
			   "model speaks: a synthetic language of config files, shell commands "
			   "and their output (Documentation/agentlang.md), not English. A prompt "
			   "it answers: \"%s\" (its answer: 5432)", (int)(n < 40 ? n : 40), w,
			   AL_EXAMPLE);
}

static int al_encode(void *ctx, const char *text, size_t len, unsigned flags, kvmem_ids *out)
{
	char *copy;
	int32_t *ids;
	int n, rc;

	if (memchr(text, 0, len))
		return kvmem_error(EINVAL, "agentlang: the text holds a NUL character");
	copy = malloc(len + 1);
	ids = malloc((len + 1) * sizeof(int32_t));
	if (!copy || !ids) {
		free(copy);
		free(ids);
		return kvmem_error(ENOMEM, "agentlang: out of memory for %zu bytes of text", len);
	}
	memcpy(copy, text, len);
	copy[len] = 0;
	n = agentlang_encode(copy, ids, len + 1);
	rc = n >= 0 ? kvmem_ids_push(out, ids, (size_t)n)
	     : strstr(kvmem_last_error(), "no piece") ? not_agentlang(copy) : kvmem_fail();
	free(copy);
	free(ids);
	return rc;
}

static int al_decode(void *ctx, const int32_t *ids, size_t n, unsigned flags, char **text,
		     size_t *len)
{
	long need = agentlang_decode(ids, n, NULL, 0);

	*text = NULL;
	*len = 0;
	if (need < 0)
		return kvmem_fail();
	*text = malloc((size_t)need + 1);
	if (!*text)
		return kvmem_error(ENOMEM, "agentlang: out of memory for decoded text");
	agentlang_decode(ids, n, *text, (size_t)need + 1);
	*len = (size_t)need;
	return 0;
}

static int ends_nl(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	return n && s[n - 1] == '\n';
}

/* <bos> first; a newline between messages unless the previous one ended a
 * line; an assistant's message is its answer, <end> and a newline (what a
 * generated turn leaves in the history). */
static int al_render(void *ctx, const kvmem_chat_msg *m, size_t n, size_t from,
		     const kvmem_chat_opts *o, kvmem_ids *out)
{
	static const int32_t bos = AGENTLANG_BOS, nl = AGENTLANG_NL;
	static const int32_t close[2] = { AGENTLANG_END, AGENTLANG_NL };

	for (size_t i = from; i < n; i++) {
		const char *c = m[i].content ? m[i].content : "";
		int asst = !strcmp(m[i].role, "assistant");
		int rc = 0;

		if (i == 0)
			rc = kvmem_ids_push(out, &bos, 1);
		else if (strcmp(m[i - 1].role, "assistant") && !ends_nl(m[i - 1].content))
			rc = kvmem_ids_push(out, &nl, 1);
		if (!rc)
			rc = al_encode(ctx, c, strlen(c), 0, out);
		if (!rc && asst)
			rc = kvmem_ids_push(out, close, 2);
		if (rc)
			return kvmem_error_prefix("message %zu (%s)", i, m[i].role);
	}
	return 0;
}

static int al_stop_ids(void *ctx, int32_t *ids, int cap)
{
	if (cap < 1)
		return 0;
	ids[0] = AGENTLANG_END;
	return 1;
}

static int al_vocab(void *ctx)
{
	return agentlang_vocab_size();
}

static const kvmem_tokenizer_ops agentlang_ops = {
	.name = "agentlang",
	.encode = al_encode,
	.decode = al_decode,
	.render = al_render,
	.stop_ids = al_stop_ids,
	.vocab = al_vocab,
};

/* ---- choosing ---------------------------------------------------------------- */
int tok_cli_open(const char *dir, const kvmem_config *c, struct tok_cli *t)
{
	char path[4200];
	struct stat st;
	int rc;

	memset(t, 0, sizeof(*t));
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	if (stat(path, &st) == 0) {
		if ((rc = kvmem_tokenizer_load_file(path, &t->tok)))
			return rc;
		if (kvmem_tokenizer_vocab(t->tok) > c->vocab) {
			int top = kvmem_tokenizer_vocab(t->tok) - 1;

			tok_cli_close(t);
			return kvmem_error(ESTALE, "%s: ids up to %d, the model's vocabulary has %d",
					   path, top, c->vocab);
		}
		t->n_stop = kvmem_tokenizer_stop_ids(t->tok, t->stop, 8);
		if (c->eos_id >= 0 && !tok_cli_is_stop(t, c->eos_id) && t->n_stop < 8)
			t->stop[t->n_stop++] = c->eos_id;
		if (kvmem_tokenizer_has_chat(t->tok) &&
		    (kvmem_tokenizer_encode(t->tok, "\n", 1, 0, &t->after_stop) ||
		     kvmem_tokenizer_encode(t->tok, "<|im_end|>\n", 11, KVMEM_TOK_SPECIAL,
					    &t->after_other))) {
			tok_cli_close(t);
			return kvmem_fail();
		}
		return 0;
	}
	if (agentlang_check_model(dir, c) < 0)
		return kvmem_error(ENOENT, "%s: no tokenizer.json, and not an agentlang model: give "
				   "token ids instead of text", dir);
	t->tok = kvmem_tokenizer_custom(&agentlang_ops, NULL);
	if (!t->tok)
		return kvmem_fail();
	t->agentlang = 1;
	t->n_stop = al_stop_ids(NULL, t->stop, 8);
	{
		static const int32_t nl = AGENTLANG_NL, close[2] = { AGENTLANG_END, AGENTLANG_NL };

		if (kvmem_ids_push(&t->after_stop, &nl, 1) || kvmem_ids_push(&t->after_other, close, 2)) {
			tok_cli_close(t);
			return kvmem_fail();
		}
	}
	return 0;
}

int tok_cli_open_bytes(const kvmem_config *c, struct tok_cli *t)
{
	memset(t, 0, sizeof(*t));
	if (!(t->tok = kvmem_tokenizer_bytes(c->vocab)))
		return kvmem_fail();
	if (c->eos_id >= 0)
		t->stop[t->n_stop++] = c->eos_id;
	return 0;
}

void tok_cli_close(struct tok_cli *t)
{
	kvmem_tokenizer_free(t->tok);
	kvmem_ids_free(&t->after_stop);
	kvmem_ids_free(&t->after_other);
	memset(t, 0, sizeof(*t));
}

int tok_cli_is_stop(const struct tok_cli *t, int32_t id)
{
	for (int i = 0; i < t->n_stop; i++)
		if (t->stop[i] == id)
			return 1;
	return 0;
}
