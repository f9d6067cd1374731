/* SPDX-License-Identifier: MIT */
/* The tokenizer's private parts: the handle, the BPE tables, byte-level. */
#ifndef KVMEM_TOKENIZER_INT_H
#define KVMEM_TOKENIZER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem/tokenizer.h"

struct kvmem_tokenizer {
	const kvmem_tokenizer_ops *ops;
	void *ctx;
	/* The id of a piece's text, for kvmem_tokenizer_token_id (NULL: none). */
	int32_t (*lookup)(void *ctx, const char *piece, size_t len);
};

/* The BPE tokenizer's ops (bpe.c) and its piece lookup. */
extern const kvmem_tokenizer_ops kvmem_bpe_ops;
int32_t kvmem_bpe_lookup(void *ctx, const char *piece, size_t len);
/* Render for the BPE tokenizer: the Qwen3 template, tokenized (chat_qwen3.c). */
int kvmem_bpe_render(void *ctx, const kvmem_chat_msg *msgs, size_t n, size_t from,
		     const kvmem_chat_opts *o, kvmem_ids *out);
int kvmem_bpe_has_template(void *ctx);

/* Bytes that are not valid UTF-8 replaced by U+FFFD, one for each maximal
 * invalid subpart (the Unicode standard's practice, what from_utf8_lossy
 * and TextDecoder do). Appends to *out (malloc'd, grown). */
int kvmem_utf8_lossy(const unsigned char *in, size_t n, char **out, size_t *len, size_t *cap);

/* A byte string -> int32 map (open addressing; keys copied). */
struct kvmem_strmap {
	uint32_t *slot;		/* index + 1 into keys, 0 empty */
	size_t mask;
	char **key;
	uint32_t *klen;
	int32_t *val;
	size_t n, cap;
};
int kvmem_strmap_put(struct kvmem_strmap *m, const char *k, size_t len, int32_t v);
/* -1 when absent. */
int32_t kvmem_strmap_get(const struct kvmem_strmap *m, const char *k, size_t len);
void kvmem_strmap_free(struct kvmem_strmap *m);

#endif
