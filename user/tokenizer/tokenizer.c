// SPDX-License-Identifier: MIT
/*
 * The tokenizer interface (kvmem/tokenizer.h): a handle over an ops table,
 * the id arrays, a byte-string map and lossy UTF-8, shared by the BPE
 * tokenizer and tokenizers of one's own.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "tokenizer/tok_int.h"
#include "util/grow.h"

int kvmem_ids_push(kvmem_ids *a, const int32_t *ids, size_t n)
{
	if (!n)
		return 0;
	if (kvmem_grow(&a->v, sizeof(int32_t), a->n + n, &a->cap, 256))
		return kvmem_error(ENOMEM, "out of memory for %zu token ids", a->n + n);
	memcpy(a->v + a->n, ids, n * sizeof(int32_t));
	a->n += n;
	return 0;
}

void kvmem_ids_free(kvmem_ids *a)
{
	free(a->v);
	a->v = NULL;
	a->n = a->cap = 0;
}

kvmem_tokenizer *kvmem_tokenizer_custom(const kvmem_tokenizer_ops *ops, void *ctx)
{
	kvmem_tokenizer *t;

	if (!ops || !ops->encode || !ops->decode || !ops->vocab) {
		kvmem_error(EINVAL, "tokenizer: ops without encode, decode or vocab");
		return NULL;
	}
	t = calloc(1, sizeof(*t));
	if (!t) {
		kvmem_error(ENOMEM, "tokenizer: out of memory");
		return NULL;
	}
	t->ops = ops;
	t->ctx = ctx;
	return t;
}

void kvmem_tokenizer_free(kvmem_tokenizer *t)
{
	if (!t)
		return;
	if (t->ops->free)
		t->ops->free(t->ctx);
	free(t);
}

const char *kvmem_tokenizer_name(const kvmem_tokenizer *t)
{
	return t->ops->name;
}

int kvmem_tokenizer_vocab(const kvmem_tokenizer *t)
{
	return t->ops->vocab(t->ctx);
}

int32_t kvmem_tokenizer_token_id(const kvmem_tokenizer *t, const char *piece)
{
	kvmem_ids ids = { 0 };
	int32_t id = -1;

	if (t->lookup)
		return t->lookup(t->ctx, piece, strlen(piece));
	/* A tokenizer of one's own: the piece is a token when it encodes to one. */
	if (!t->ops->encode(t->ctx, piece, strlen(piece), KVMEM_TOK_SPECIAL, &ids) && ids.n == 1)
		id = ids.v[0];
	kvmem_ids_free(&ids);
	return id;
}

int kvmem_tokenizer_encode(const kvmem_tokenizer *t, const char *text, size_t len,
			   unsigned flags, kvmem_ids *out)
{
	return t->ops->encode(t->ctx, text, len, flags, out);
}

int kvmem_tokenizer_decode(const kvmem_tokenizer *t, const int32_t *ids, size_t n,
			   unsigned flags, char **text, size_t *len)
{
	return t->ops->decode(t->ctx, ids, n, flags, text, len);
}

int kvmem_tokenizer_has_chat(const kvmem_tokenizer *t)
{
	if (t->ops == &kvmem_bpe_ops)
		return kvmem_bpe_has_template(t->ctx);
	return t->ops->render != NULL;
}

int kvmem_chat_render(const kvmem_tokenizer *t, const kvmem_chat_msg *msgs, size_t n,
		      size_t from, const kvmem_chat_opts *o, kvmem_ids *out)
{
	static const kvmem_chat_opts dflt = { .add_generation_prompt = 1, .thinking = -1 };

	if (from > n)
		return kvmem_error(EINVAL, "chat: turns from %zu of %zu", from, n);
	if (!kvmem_tokenizer_has_chat(t))
		return kvmem_error(ENOTSUP, "chat: the %s tokenizer has no chat template",
				   t->ops->name);
	for (size_t i = 0; i < n; i++)
		if (!msgs[i].role)
			return kvmem_error(EINVAL, "chat: message %zu has no role", i);
	return t->ops->render(t->ctx, msgs, n, from, o ? o : &dflt, out);
}

int kvmem_tokenizer_stop_ids(const kvmem_tokenizer *t, int32_t *ids, int cap)
{
	return t->ops->stop_ids ? t->ops->stop_ids(t->ctx, ids, cap) : 0;
}

/* ---- lossy UTF-8 ------------------------------------------------------- */
/* Length of the valid sequence at p (1..4), or 0 with *bad the length of
 * the maximal invalid subpart (at least 1). */
static size_t utf8_valid(const unsigned char *p, const unsigned char *e, size_t *bad)
{
	unsigned c = p[0];
	size_t need;
	unsigned lo = 0x80, hi = 0xBF;

	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		need = 1;
	else if (c >= 0xE0 && c <= 0xEF) {
		need = 2;
		if (c == 0xE0)
			lo = 0xA0;
		else if (c == 0xED)
			hi = 0x9F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		need = 3;
		if (c == 0xF0)
			lo = 0x90;
		else if (c == 0xF4)
			hi = 0x8F;
	} else {
		*bad = 1;
		return 0;
	}
	for (size_t i = 1; i <= need; i++) {
		unsigned b = p + i < e ? p[i] : 0x100;

		if (b < lo || b > hi) {
			*bad = i;
			return 0;
		}
		lo = 0x80;
		hi = 0xBF;
	}
	return need + 1;
}

int kvmem_utf8_lossy(const unsigned char *in, size_t n, char **out, size_t *len, size_t *cap)
{
	const unsigned char *p = in, *e = in + n;

	while (p < e) {
		size_t bad = 0, ok = utf8_valid(p, e, &bad);
		const char *src = ok ? (const char *)p : "\xEF\xBF\xBD";
		size_t k = ok ? ok : 3;

		if (kvmem_grow(out, 1, *len + k + 1, cap, 256))
			return kvmem_error(ENOMEM, "out of memory for decoded text");
		memcpy(*out + *len, src, k);
		*len += k;
		p += ok ? ok : bad;
	}
	if (kvmem_grow(out, 1, *len + 1, cap, 256))
		return kvmem_error(ENOMEM, "out of memory for decoded text");
	(*out)[*len] = 0;
	return 0;
}

/* ---- byte-string map --------------------------------------------------- */
static uint64_t hash_bytes(const char *k, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)k[i]) * 0x100000001b3ull;
	return h ^ (h >> 29);
}

static int rehash(struct kvmem_strmap *m, size_t slots)
{
	uint32_t *s = calloc(slots, sizeof(uint32_t));

	if (!s)
		return -ENOMEM;
	for (size_t i = 0; i < m->n; i++) {
		size_t j = hash_bytes(m->key[i], m->klen[i]) & (slots - 1);

		while (s[j])
			j = (j + 1) & (slots - 1);
		s[j] = (uint32_t)i + 1;
	}
	free(m->slot);
	m->slot = s;
	m->mask = slots - 1;
	return 0;
}

int kvmem_strmap_put(struct kvmem_strmap *m, const char *k, size_t len, int32_t v)
{
	size_t j, cap = m->cap;
	char *copy;

	if (!m->slot || (m->n + 1) * 2 > m->mask + 1) {
		if (rehash(m, m->slot ? (m->mask + 1) * 2 : 1024))
			return kvmem_error(ENOMEM, "out of memory for a token map");
	}
	for (j = hash_bytes(k, len) & m->mask; m->slot[j]; j = (j + 1) & m->mask) {
		size_t i = m->slot[j] - 1;

		if (m->klen[i] == len && !memcmp(m->key[i], k, len)) {
			m->val[i] = v;
			return 0;
		}
	}
	if (kvmem_grow(&m->key, sizeof(char *), m->n + 1, &cap, 1024))
		return kvmem_error(ENOMEM, "out of memory for a token map");
	cap = m->cap;
	if (kvmem_grow(&m->klen, sizeof(uint32_t), m->n + 1, &cap, 1024))
		return kvmem_error(ENOMEM, "out of memory for a token map");
	cap = m->cap;
	if (kvmem_grow(&m->val, sizeof(int32_t), m->n + 1, &cap, 1024))
		return kvmem_error(ENOMEM, "out of memory for a token map");
	m->cap = cap;
	copy = malloc(len + 1);
	if (!copy)
		return kvmem_error(ENOMEM, "out of memory for a token map");
	memcpy(copy, k, len);
	copy[len] = 0;
	m->key[m->n] = copy;
	m->klen[m->n] = (uint32_t)len;
	m->val[m->n] = v;
	m->slot[j] = (uint32_t)++m->n;
	return 0;
}

int32_t kvmem_strmap_get(const struct kvmem_strmap *m, const char *k, size_t len)
{
	if (!m->slot)
		return -1;
	for (size_t j = hash_bytes(k, len) & m->mask; m->slot[j]; j = (j + 1) & m->mask) {
		size_t i = m->slot[j] - 1;

		if (m->klen[i] == len && !memcmp(m->key[i], k, len))
			return m->val[i];
	}
	return -1;
}

void kvmem_strmap_free(struct kvmem_strmap *m)
{
	for (size_t i = 0; i < m->n; i++)
		free(m->key[i]);
	free(m->key);
	free(m->klen);
	free(m->val);
	free(m->slot);
	memset(m, 0, sizeof(*m));
}
