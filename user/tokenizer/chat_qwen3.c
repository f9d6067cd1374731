// SPDX-License-Identifier: MIT
/*
 * The Qwen3 chat template, written in C from the Jinja template that Qwen3
 * checkpoints ship in tokenizer_config.json: the system header (with the
 * tool list when tools are given), user and system turns, assistant turns
 * with their thinking (kept only after the last real user query, as the
 * template does) and tool calls, tool results grouped into one user turn,
 * and the generation prompt (with an empty thinking block when thinking is
 * off). Messages [from, n) are rendered as they would be within the whole
 * list, so a conversation appends only its new turns.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "tokenizer/tok_int.h"
#include "util/grow.h"

struct sb {
	char *s;
	size_t n, cap;
	int err;
};

static void put(struct sb *b, const char *s, size_t len)
{
	if (b->err)
		return;
	if (kvmem_grow(&b->s, 1, b->n + len + 1, &b->cap, 1024)) {
		b->err = 1;
		return;
	}
	memcpy(b->s + b->n, s, len);
	b->n += len;
	b->s[b->n] = 0;
}

static void puts_(struct sb *b, const char *s)
{
	put(b, s, strlen(s));
}

static const char *str(const char *s)
{
	return s ? s : "";
}

static int starts(const char *s, const char *p)
{
	return !strncmp(s, p, strlen(p));
}

static int ends(const char *s, const char *p)
{
	size_t n = strlen(s), k = strlen(p);

	return n >= k && !strcmp(s + n - k, p);
}

/* Python's s.strip(chars) for '\n': [*a, *e) of s. */
static void strip_nl(const char **a, const char **e, int left, int right)
{
	while (left && *a < *e && **a == '\n')
		(*a)++;
	while (right && *e > *a && (*e)[-1] == '\n')
		(*e)--;
}

/* Last occurrence of needle in [s, e), or NULL. */
static const char *last_of(const char *s, const char *e, const char *needle)
{
	size_t k = strlen(needle);
	const char *hit = NULL;

	for (const char *p = s; p + k <= e; p++)
		if (!memcmp(p, needle, k))
			hit = p;
	return hit;
}

static void assistant(struct sb *b, const kvmem_chat_msg *m, int after_query, int last)
{
	const char *content = str(m->content), *c0 = content, *c1 = content + strlen(content);
	const char *r0 = "", *r1 = r0;
	int has_content;

	if (m->reasoning) {
		r0 = m->reasoning;
		r1 = r0 + strlen(r0);
	} else if (strstr(content, "</think>")) {
		const char *first = strstr(content, "</think>");
		const char *lastc = last_of(content, c1, "</think>");
		const char *open;

		c0 = lastc + 8;
		strip_nl(&c0, &c1, 1, 0);
		r0 = content;
		r1 = first;
		strip_nl(&r0, &r1, 0, 1);
		open = last_of(r0, r1, "<think>");
		if (open)
			r0 = open + 7;
		strip_nl(&r0, &r1, 1, 0);
	}
	/* The template puts a newline before the first call when its content
	 * variable is not empty: tested before the thinking block strips it. */
	has_content = c1 > c0;
	puts_(b, "<|im_start|>assistant\n");
	if (after_query && (last || r1 > r0)) {
		const char *s0 = r0, *s1 = r1;

		strip_nl(&s0, &s1, 1, 1);
		puts_(b, "<think>\n");
		put(b, s0, (size_t)(s1 - s0));
		puts_(b, "\n</think>\n\n");
		strip_nl(&c0, &c1, 1, 0);
	}
	put(b, c0, (size_t)(c1 - c0));
	for (int j = 0; j < m->n_calls; j++) {
		if (j || has_content)
			puts_(b, "\n");
		puts_(b, "<tool_call>\n{\"name\": \"");
		puts_(b, str(m->call_names[j]));
		puts_(b, "\", \"arguments\": ");
		puts_(b, str(m->call_args[j]));
		puts_(b, "}\n</tool_call>");
	}
	puts_(b, "<|im_end|>\n");
}

int kvmem_chat_qwen3_text(const kvmem_chat_msg *msgs, size_t n, size_t from,
			  const kvmem_chat_opts *o, char **text, size_t *len)
{
	struct sb b = { 0 };
	size_t last_query = n ? n - 1 : 0;
	int sys0 = n && !strcmp(msgs[0].role, "system");

	*text = NULL;
	*len = 0;
	if (from == 0 && o->n_tools > 0) {
		puts_(&b, "<|im_start|>system\n");
		if (sys0) {
			puts_(&b, str(msgs[0].content));
			puts_(&b, "\n\n");
		}
		puts_(&b, "# Tools\n\nYou may call one or more functions to assist with the user "
			  "query.\n\nYou are provided with function signatures within <tools></tools> "
			  "XML tags:\n<tools>");
		for (int i = 0; i < o->n_tools; i++) {
			puts_(&b, "\n");
			puts_(&b, str(o->tools[i]));
		}
		puts_(&b, "\n</tools>\n\nFor each function call, return a json object with function "
			  "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
			  "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
			  "</tool_call><|im_end|>\n");
	} else if (from == 0 && sys0) {
		puts_(&b, "<|im_start|>system\n");
		puts_(&b, str(msgs[0].content));
		puts_(&b, "<|im_end|>\n");
	}
	/* The last user message that is a real query, not tool output. */
	for (size_t k = n; k-- > 0;) {
		const char *c = str(msgs[k].content);

		if (!strcmp(msgs[k].role, "user") &&
		    !(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) {
			last_query = k;
			break;
		}
	}
	for (size_t i = 0; i < n; i++) {
		const kvmem_chat_msg *m = &msgs[i];
		const char *role = m->role;

		if (i < from)
			continue;
		if (!strcmp(role, "user") || (!strcmp(role, "system") && i)) {
			puts_(&b, "<|im_start|>");
			puts_(&b, role);
			puts_(&b, "\n");
			puts_(&b, str(m->content));
			puts_(&b, "<|im_end|>\n");
		} else if (!strcmp(role, "assistant")) {
			assistant(&b, m, i > last_query, i + 1 == n);
		} else if (!strcmp(role, "tool")) {
			if (!i || strcmp(msgs[i - 1].role, "tool"))
				puts_(&b, "<|im_start|>user");
			puts_(&b, "\n<tool_response>\n");
			puts_(&b, str(m->content));
			puts_(&b, "\n</tool_response>");
			if (i + 1 == n || strcmp(msgs[i + 1].role, "tool"))
				puts_(&b, "<|im_end|>\n");
		}
	}
	if (o->add_generation_prompt) {
		puts_(&b, "<|im_start|>assistant\n");
		if (o->thinking == 0)
			puts_(&b, "<think>\n\n</think>\n\n");
	}
	put(&b, "", 0);
	if (b.err) {
		free(b.s);
		return kvmem_error(ENOMEM, "chat: out of memory for the rendered turns");
	}
	*text = b.s;
	*len = b.n;
	return 0;
}

int kvmem_bpe_render(void *ctx, const kvmem_chat_msg *msgs, size_t n, size_t from,
		     const kvmem_chat_opts *o, kvmem_ids *out)
{
	char *text;
	size_t len;
	int rc = kvmem_chat_qwen3_text(msgs, n, from, o, &text, &len);

	if (rc)
		return rc;
	rc = kvmem_bpe_ops.encode(ctx, text, len, KVMEM_TOK_SPECIAL, out);
	free(text);
	return rc;
}
