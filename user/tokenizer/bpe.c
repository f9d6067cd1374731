// SPDX-License-Identifier: MIT
/*
 * Byte-level BPE from a Hugging Face tokenizer.json (Qwen2/Qwen3, GPT-2
 * style): added tokens matched first, then NFC (libunistring), the Split
 * pre-tokenizer's regex (PCRE2, Unicode properties), byte-level, and merges
 * by rank. Vocabulary entries are kept as the raw bytes they stand for, so
 * merging runs on bytes and decoding is a copy.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <uninorm.h>
#include <unistr.h>

#include "kvmem/kvmem.h"
#include "model/modelfile.h"
#include "tokenizer/tok_int.h"
#include "util/grow.h"
#include "util/json.h"

/* The ByteLevel pre-tokenizer's own split when use_regex is true (GPT-2). */
#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

struct added {
	char *text;
	size_t len;
	int32_t id;
	int special;
};

struct merge_slot {
	uint64_t key;		/* (left id << 32 | right id) + 1; 0 empty */
	int32_t rank, id;
};

struct bpe {
	int vocab;		/* one past the largest id */
	char **piece;		/* [vocab] raw bytes of each id (NULL: unused id) */
	uint32_t *piece_len;
	uint8_t *is_added;	/* [vocab] 1 added, 2 added and special */
	struct kvmem_strmap map;	/* raw bytes -> id (vocabulary and added) */
	int32_t byte_id[256];	/* the id of each single byte (-1: none) */
	struct merge_slot *merges;
	size_t merge_mask;
	struct added *added;	/* sorted by first byte, then longer first */
	int n_added;
	int nfc;
	int ignore_merges;
	pcre2_code *re;		/* NULL: no split */
	int has_template;
	int32_t stop[4];
	int n_stop;
};

/* ---- byte-level alphabet ---------------------------------------------- */
/* GPT-2's map of bytes to printable code points: printable Latin-1 bytes
 * stand for themselves, the others take 256, 257, ... in byte order. */
static void byte_alphabet(uint32_t cp_of[256])
{
	int n = 0;

	for (int b = 0; b < 256; b++) {
		int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);

		cp_of[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
	}
}

/* A vocabulary key in the byte-level alphabet -> raw bytes (out holds len
 * bytes at most). -1 when a character is not of the alphabet. */
static long unbyte(const char *k, size_t len, const int16_t *byte_of, char *out)
{
	const uint8_t *p = (const uint8_t *)k, *e = p + len;
	long n = 0;

	while (p < e) {
		ucs4_t c;
		int l = u8_mbtouc(&c, p, (size_t)(e - p));

		if (l <= 0 || c >= 512 || byte_of[c] < 0)
			return -1;
		out[n++] = (char)byte_of[c];
		p += l;
	}
	return n;
}

/* ---- merges ------------------------------------------------------------- */
static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static struct merge_slot *merge_find(const struct bpe *b, int32_t l, int32_t r)
{
	uint64_t key = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;

	for (size_t j = mix(key) & b->merge_mask;; j = (j + 1) & b->merge_mask) {
		if (b->merges[j].key == key)
			return &b->merges[j];
		if (!b->merges[j].key)
			return NULL;
	}
}

static void merge_put(struct bpe *b, int32_t l, int32_t r, int32_t rank, int32_t id)
{
	uint64_t key = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
	size_t j = mix(key) & b->merge_mask;

	/* A repeated merge takes its later rank, as Hugging Face's tokenizers
	 * (BpeBuilder::build collects the ranks into a hash map) and
	 * transformers.js (a Map) do. */
	while (b->merges[j].key && b->merges[j].key != key)
		j = (j + 1) & b->merge_mask;
	b->merges[j] = (struct merge_slot){ key, rank, id };
}

/* ---- loading ------------------------------------------------------------ */
static int fail(const char *path, int err, const char *what)
{
	return kvmem_error(err, "%s: %s", path, what);
}

static int set_piece(struct bpe *b, int32_t id, const char *bytes, size_t len)
{
	char *p;

	if (id < 0 || id >= b->vocab)
		return -EINVAL;
	p = malloc(len + 1);
	if (!p)
		return -ENOMEM;
	memcpy(p, bytes, len);
	p[len] = 0;
	free(b->piece[id]);
	b->piece[id] = p;
	b->piece_len[id] = (uint32_t)len;
	return 0;
}

/* A token id's value (0..2^24-1), else -1. */
static int64_t id_of(const json_t *v)
{
	json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;

	return id >= 0 && id < (1 << 24) ? id : -1;
}

static int max_id(json_t *vocab, const json_t *added, int64_t *max)
{
	const char *key;
	json_t *v;

	*max = -1;
	json_object_foreach(vocab, key, v) {
		if (id_of(v) < 0)
			return -EINVAL;
		if (id_of(v) > *max)
			*max = id_of(v);
	}
	for (size_t i = 0; i < json_array_size(added); i++) {
		int64_t id = id_of(json_object_get(json_array_get(added, i), "id"));

		if (id < 0 || id >= (1 << 24))
			return -EINVAL;
		if (id > *max)
			*max = id;
	}
	return 0;
}

static int added_cmp(const void *pa, const void *pb)
{
	const struct added *a = pa, *b = pb;

	if ((unsigned char)a->text[0] != (unsigned char)b->text[0])
		return (unsigned char)a->text[0] - (unsigned char)b->text[0];
	return a->len < b->len ? 1 : a->len > b->len ? -1 : 0;
}

/* A string member's value, or def when it is absent or not a string. */
static const char *str_of(const json_t *obj, const char *key, const char *def)
{
	const char *s = json_string_value(json_object_get(obj, key));

	return s ? s : def;
}

static int load_pretok(struct bpe *b, const json_t *pt, const char *path, const char **pat)
{
	const char *type = str_of(pt, "type", "");
	int rc;

	if (!pt || json_is_null(pt))
		return 0;
	if (!strcmp(type, "Sequence")) {
		const json_t *list = json_object_get(pt, "pretokenizers");

		for (size_t i = 0; i < json_array_size(list); i++)
			if ((rc = load_pretok(b, json_array_get(list, i), path, pat)))
				return rc;
		return 0;
	}
	if (!strcmp(type, "Split")) {
		const char *beh = str_of(pt, "behavior", "");
		const char *re = str_of(json_object_get(pt, "pattern"), "Regex", NULL);

		if (!re || strcmp(beh, "Isolated") || json_is_true(json_object_get(pt, "invert")))
			return kvmem_error(ENOTSUP, "%s: a Split pre-tokenizer other than an isolated "
					   "regex split (behavior '%s')", path, beh);
		if (*pat)
			return kvmem_error(ENOTSUP, "%s: more than one splitting pre-tokenizer", path);
		*pat = re;
		return 0;
	}
	if (!strcmp(type, "ByteLevel")) {
		if (json_is_true(json_object_get(pt, "add_prefix_space")))
			return kvmem_error(ENOTSUP, "%s: ByteLevel with add_prefix_space", path);
		if (!json_is_false(json_object_get(pt, "use_regex"))) {
			if (*pat)
				return kvmem_error(ENOTSUP, "%s: more than one splitting pre-tokenizer",
						   path);
			*pat = GPT2_PATTERN;
		}
		return 0;
	}
	return kvmem_error(ENOTSUP, "%s: pre-tokenizer '%s' is not supported (Split, ByteLevel)",
			   path, type);
}

static int load_normalizer(struct bpe *b, const json_t *nm, const char *path)
{
	const char *type = str_of(nm, "type", "");
	int rc;

	if (!nm || json_is_null(nm))
		return 0;
	if (!strcmp(type, "NFC")) {
		b->nfc = 1;
		return 0;
	}
	if (!strcmp(type, "Sequence")) {
		const json_t *list = json_object_get(nm, "normalizers");

		for (size_t i = 0; i < json_array_size(list); i++)
			if ((rc = load_normalizer(b, json_array_get(list, i), path)))
				return rc;
		return 0;
	}
	return kvmem_error(ENOTSUP, "%s: normalizer '%s' is not supported (NFC or none)", path, type);
}

static void bpe_free(void *ctx)
{
	struct bpe *b = ctx;

	if (!b)
		return;
	for (int i = 0; b->piece && i < b->vocab; i++)
		free(b->piece[i]);
	free(b->piece);
	free(b->piece_len);
	free(b->is_added);
	kvmem_strmap_free(&b->map);
	free(b->merges);
	for (int i = 0; i < b->n_added; i++)
		free(b->added[i].text);
	free(b->added);
	if (b->re)
		pcre2_code_free(b->re);
	free(b);
}

static int load_merges(struct bpe *b, const json_t *merges, const char *path,
		       const int16_t *byte_of)
{
	size_t n = json_array_size(merges), slots = 16;
	char *l = NULL, *r = NULL;
	int rc = 0;

	while (slots < 2 * n + 2)
		slots *= 2;
	b->merges = calloc(slots, sizeof(*b->merges));
	if (!b->merges)
		return kvmem_error(ENOMEM, "%s: out of memory for %zu merges", path, n);
	b->merge_mask = slots - 1;
	for (size_t i = 0; i < n && !rc; i++) {
		const json_t *m = json_array_get(merges, i);
		const char *a, *c;
		size_t al, cl;
		long la, lc;
		int32_t ia, ic, im;
		char *both;

		if (json_is_string(m)) {
			const char *s = json_string_value(m), *sp = strchr(s, ' ');

			if (!sp || strchr(sp + 1, ' ')) {	/* break: l and r are freed below */
				rc = kvmem_error(EINVAL, "%s: merge %zu is not \"a b\"", path, i);
				break;
			}
			a = s;
			al = (size_t)(sp - s);
			c = sp + 1;
			cl = strlen(c);
		} else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
			   json_is_string(json_array_get(m, 1))) {
			a = json_string_value(json_array_get(m, 0));
			al = json_string_length(json_array_get(m, 0));
			c = json_string_value(json_array_get(m, 1));
			cl = json_string_length(json_array_get(m, 1));
		} else {
			rc = kvmem_error(EINVAL, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]",
					 path, i);
			break;
		}
		l = realloc(l, al + 1);
		r = realloc(r, cl + 1);
		both = malloc(al + cl + 1);
		if (!l || !r || !both) {
			free(both);
			rc = kvmem_error(ENOMEM, "%s: out of memory", path);
			break;
		}
		la = unbyte(a, al, byte_of, l);
		lc = unbyte(c, cl, byte_of, r);
		if (la < 0 || lc < 0) {
			free(both);
			rc = kvmem_error(EINVAL, "%s: merge %zu holds a character outside the byte-level "
					 "alphabet", path, i);
			break;
		}
		memcpy(both, l, (size_t)la);
		memcpy(both + la, r, (size_t)lc);
		ia = kvmem_strmap_get(&b->map, l, (size_t)la);
		ic = kvmem_strmap_get(&b->map, r, (size_t)lc);
		im = kvmem_strmap_get(&b->map, both, (size_t)(la + lc));
		free(both);
		if (ia < 0 || ic < 0 || im < 0) {
			rc = kvmem_error(EINVAL, "%s: merge %zu names a token not in the vocabulary",
					 path, i);
			break;
		}
		merge_put(b, ia, ic, (int32_t)i, im);
	}
	free(l);
	free(r);
	return rc;
}

static int bpe_load_json(struct bpe *b, const json_t *doc, const char *path)
{
	const json_t *model = json_object_get(doc, "model");
	json_t *vocab = json_object_get(model, "vocab"), *v;
	const json_t *added = json_object_get(doc, "added_tokens");
	const char *pat = NULL, *k;
	size_t entry = 0;
	int rc;
	uint32_t cp_of[256];
	int16_t byte_of[512];
	int64_t top;
	char *raw = NULL;
	size_t raw_cap = 0;

	if (strcmp(str_of(model, "type", ""), "BPE"))
		return fail(path, ENOTSUP, "the model is not BPE (model.type)");
	if (!json_is_object(vocab))
		return fail(path, EINVAL, "model.vocab is not an object");
	if (json_is_true(json_object_get(model, "byte_fallback")) ||
	    *str_of(model, "continuing_subword_prefix", "") || *str_of(model, "end_of_word_suffix", ""))
		return fail(path, ENOTSUP, "BPE with byte fallback or subword affixes (not byte-level)");
	if (json_number_value(json_object_get(model, "dropout")) > 0)
		return fail(path, ENOTSUP, "BPE dropout");
	b->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
	if (max_id(vocab, added, &top))
		return fail(path, EINVAL, "a token id that is not an integer in 0..2^24-1");
	b->vocab = (int)top + 1;
	b->piece = calloc((size_t)b->vocab, sizeof(char *));
	b->piece_len = calloc((size_t)b->vocab, sizeof(uint32_t));
	b->is_added = calloc((size_t)b->vocab, 1);
	if (!b->piece || !b->piece_len || !b->is_added)
		return fail(path, ENOMEM, "out of memory for the vocabulary");
	byte_alphabet(cp_of);
	memset(byte_of, 0xff, sizeof(byte_of));
	for (int i = 0; i < 256; i++)
		byte_of[cp_of[i]] = (int16_t)i;
	for (int i = 0; i < 256; i++)
		b->byte_id[i] = -1;
	json_object_foreach(vocab, k, v) {
		size_t kl = strlen(k);	/* keys hold no "\u0000" (util/json.h) */
		int32_t id = (int32_t)id_of(v);
		long n;

		if (kvmem_grow(&raw, 1, kl + 1, &raw_cap, 64)) {
			free(raw);
			return fail(path, ENOMEM, "out of memory");
		}
		n = unbyte(k, kl, byte_of, raw);
		if (n < 0) {
			free(raw);
			return kvmem_error(EINVAL, "%s: vocabulary entry %zu (id %d) holds a character "
					   "outside the byte-level alphabet", path, entry, id);
		}
		if (b->piece[id]) {
			free(raw);
			return kvmem_error(EINVAL, "%s: id %d appears twice in the vocabulary", path, id);
		}
		if (set_piece(b, id, raw, (size_t)n) || kvmem_strmap_put(&b->map, raw, (size_t)n, id)) {
			free(raw);
			return fail(path, ENOMEM, "out of memory for the vocabulary");
		}
		if (n == 1)
			b->byte_id[(unsigned char)raw[0]] = id;
		entry++;
	}
	free(raw);
	b->added = calloc(json_array_size(added) + 1, sizeof(*b->added));
	if (!b->added)
		return fail(path, ENOMEM, "out of memory");
	for (size_t i = 0; i < json_array_size(added); i++) {
		const json_t *a = json_array_get(added, i);
		const json_t *c = json_object_get(a, "content");
		int32_t id = (int32_t)id_of(json_object_get(a, "id"));
		size_t len = json_string_length(c);
		struct added *ad = &b->added[b->n_added];

		if (!len)	/* not a string, or empty */
			return kvmem_error(EINVAL, "%s: added token %zu has no text", path, i);
		ad->text = malloc(len + 1);
		if (!ad->text)
			return fail(path, ENOMEM, "out of memory");
		memcpy(ad->text, json_string_value(c), len + 1);
		ad->len = len;
		ad->id = id;
		ad->special = json_is_true(json_object_get(a, "special"));
		b->n_added++;
		if (set_piece(b, id, ad->text, len) || kvmem_strmap_put(&b->map, ad->text, len, id))
			return fail(path, ENOMEM, "out of memory");
		b->is_added[id] = ad->special ? 2 : 1;
	}
	qsort(b->added, (size_t)b->n_added, sizeof(*b->added), added_cmp);
	if ((rc = load_merges(b, json_object_get(model, "merges"), path, byte_of)) ||
	    (rc = load_normalizer(b, json_object_get(doc, "normalizer"), path)) ||
	    (rc = load_pretok(b, json_object_get(doc, "pre_tokenizer"), path, &pat)))
		return rc;
	if (pat) {
		int err;
		PCRE2_SIZE off;

		b->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
				      &err, &off, NULL);
		if (!b->re) {
			PCRE2_UCHAR msg[256];

			pcre2_get_error_message(err, msg, sizeof(msg));
			return kvmem_error(EINVAL, "%s: the pre-tokenizer's regex does not compile at "
					   "offset %zu: %s", path, (size_t)off, (char *)msg);
		}
		/* JIT when the platform has it; the interpreter otherwise. */
		pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE);
	}
	{
		int32_t s = kvmem_strmap_get(&b->map, "<|im_start|>", 12);
		int32_t e = kvmem_strmap_get(&b->map, "<|im_end|>", 10);
		int32_t eot = kvmem_strmap_get(&b->map, "<|endoftext|>", 13);

		b->has_template = s >= 0 && e >= 0;
		if (e >= 0)
			b->stop[b->n_stop++] = e;
		if (eot >= 0)
			b->stop[b->n_stop++] = eot;
	}
	return 0;
}

int kvmem_tokenizer_load_file(const char *path, kvmem_tokenizer **out)
{
	struct bpe *b = calloc(1, sizeof(*b));
	json_t *doc;
	kvmem_tokenizer *t;
	char *text;
	size_t len;
	int rc;

	*out = NULL;
	if (!b)
		return kvmem_error(ENOMEM, "%s: out of memory", path);
	/* Qwen3's is 11 MB; the cap only keeps a stray huge file out. */
	if ((rc = kvmem_mf_read(path, 1u << 30, &text, &len)) < 0) {
		free(b);
		return rc;
	}
	rc = kvmem_json_load(text, len, path, &doc);
	free(text);
	if (rc < 0) {
		free(b);
		return rc;
	}
	if ((rc = bpe_load_json(b, doc, path))) {
		json_decref(doc);
		bpe_free(b);
		return rc;
	}
	json_decref(doc);
	t = kvmem_tokenizer_custom(&kvmem_bpe_ops, b);
	if (!t) {
		bpe_free(b);
		return kvmem_fail();
	}
	t->lookup = kvmem_bpe_lookup;
	*out = t;
	return 0;
}

int kvmem_tokenizer_load(const char *dir, kvmem_tokenizer **out)
{
	char path[4200];

	if (snprintf(path, sizeof(path), "%s/tokenizer.json", dir) >= (int)sizeof(path))
		return kvmem_error(EINVAL, "%s: path too long", dir);
	return kvmem_tokenizer_load_file(path, out);
}

int32_t kvmem_bpe_lookup(void *ctx, const char *piece, size_t len)
{
	return kvmem_strmap_get(&((struct bpe *)ctx)->map, piece, len);
}

int kvmem_bpe_has_template(void *ctx)
{
	return ((struct bpe *)ctx)->has_template;
}

/* ---- encoding ---------------------------------------------------------- */
struct heap_item {
	int32_t rank;
	int32_t pos;		/* left symbol */
	int32_t left_id, right_id;
};

static int item_less(const struct heap_item *a, const struct heap_item *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct heap_item *h, size_t *n, struct heap_item it)
{
	size_t i = (*n)++;

	while (i > 0) {
		size_t p = (i - 1) / 2;

		if (!item_less(&it, &h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = it;
}

static struct heap_item heap_pop(struct heap_item *h, size_t *n)
{
	struct heap_item top = h[0], last = h[--(*n)];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= *n)
			break;
		if (c + 1 < *n && item_less(&h[c + 1], &h[c]))
			c++;
		if (!item_less(&h[c], &last))
			break;
		h[i] = h[c];
		i = c;
	}
	h[i] = last;
	return top;
}

struct scratch {
	int32_t *id, *next, *prev;
	struct heap_item *heap;
	size_t cap, heap_cap;
};

static void try_pair(const struct bpe *b, struct scratch *s, size_t *hn, int32_t l)
{
	int32_t r = s->next[l];
	const struct merge_slot *m;

	if (r < 0)
		return;
	m = merge_find(b, s->id[l], s->id[r]);
	if (m)
		heap_push(s->heap, hn, (struct heap_item){ m->rank, l, s->id[l], s->id[r] });
}

/* BPE over one pre-token's raw bytes. */
static int bpe_word(const struct bpe *b, struct scratch *s, const unsigned char *w, size_t n,
		    kvmem_ids *out)
{
	size_t hn = 0;
	int rc;

	if (b->ignore_merges) {
		int32_t id = kvmem_strmap_get(&b->map, (const char *)w, n);

		if (id >= 0 && !b->is_added[id])
			return kvmem_ids_push(out, &id, 1);
	}
	if (n > s->cap) {
		size_t cap = n < 64 ? 64 : n;

		free(s->id);
		free(s->next);
		free(s->prev);
		s->id = malloc(cap * sizeof(int32_t));
		s->next = malloc(cap * sizeof(int32_t));
		s->prev = malloc(cap * sizeof(int32_t));
		s->cap = s->id && s->next && s->prev ? cap : 0;
		if (!s->cap)
			return kvmem_error(ENOMEM, "out of memory for a word of %zu bytes", n);
	}
	/* Every merge adds at most two candidates to the n - 1 at the start. */
	if (3 * n > s->heap_cap) {
		free(s->heap);
		s->heap_cap = 3 * n < 192 ? 192 : 3 * n;
		s->heap = malloc(s->heap_cap * sizeof(*s->heap));
		if (!s->heap) {
			s->heap_cap = 0;
			return kvmem_error(ENOMEM, "out of memory for a word of %zu bytes", n);
		}
	}
	for (size_t i = 0; i < n; i++) {
		s->id[i] = b->byte_id[w[i]];
		if (s->id[i] < 0)
			return kvmem_error(EINVAL, "tokenizer: byte 0x%02x has no token", w[i]);
		s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
		s->prev[i] = (int32_t)i - 1;
	}
	for (size_t i = 0; i + 1 < n; i++)
		try_pair(b, s, &hn, (int32_t)i);
	while (hn) {
		struct heap_item it = heap_pop(s->heap, &hn);
		int32_t l = it.pos, r = s->next[l];
		const struct merge_slot *m;

		/* Stale: a side was merged away or changed since it was queued. */
		if (s->id[l] != it.left_id || r < 0 || s->id[r] != it.right_id)
			continue;
		m = merge_find(b, it.left_id, it.right_id);
		s->id[l] = m->id;
		s->id[r] = -1;
		s->next[l] = s->next[r];
		if (s->next[r] >= 0)
			s->prev[s->next[r]] = l;
		if (s->prev[l] >= 0)
			try_pair(b, s, &hn, s->prev[l]);
		try_pair(b, s, &hn, l);
	}
	for (int32_t i = 0; i >= 0; i = s->next[i])
		if ((rc = kvmem_ids_push(out, &s->id[i], 1)))
			return rc;
	return 0;
}

/* Plain text (no added tokens in it): NFC, split, BPE. */
static int encode_plain(const struct bpe *b, struct scratch *s, const char *text, size_t len,
			kvmem_ids *out)
{
	uint8_t *norm = NULL;
	const uint8_t *t = (const uint8_t *)text;
	size_t n = len;
	pcre2_match_data *md = NULL;
	pcre2_match_context *mc = NULL;
	pcre2_jit_stack *js = NULL;
	int rc = 0;

	if (!len)
		return 0;
	if (b->nfc) {
		norm = u8_normalize(UNINORM_NFC, t, len, NULL, &n);
		if (!norm)
			return kvmem_error(errno == ENOMEM ? ENOMEM : EINVAL,
					   "tokenizer: cannot normalize the text (NFC)");
		t = norm;
	}
	if (!b->re) {
		rc = bpe_word(b, s, t, n, out);
		free(norm);
		return rc;
	}
	md = pcre2_match_data_create_from_pattern(b->re, NULL);
	mc = pcre2_match_context_create(NULL);
	js = pcre2_jit_stack_create(32 * 1024, 4 << 20, NULL);
	if (!md || !mc || !js) {
		rc = kvmem_error(ENOMEM, "tokenizer: out of memory for the regex");
		goto out;
	}
	pcre2_jit_stack_assign(mc, NULL, js);
	for (size_t at = 0, gap = 0; at <= n && !rc;) {
		int m = at < n ? pcre2_match(b->re, t, n, at, PCRE2_NO_UTF_CHECK, md, mc)
			       : PCRE2_ERROR_NOMATCH;
		PCRE2_SIZE *ov;

		if (m == PCRE2_ERROR_NOMATCH) {
			/* The rest is a gap: Isolated keeps it as a piece. */
			if (gap < n)
				rc = bpe_word(b, s, t + gap, n - gap, out);
			break;
		}
		if (m < 0) {
			PCRE2_UCHAR msg[256];

			pcre2_get_error_message(m, msg, sizeof(msg));
			rc = kvmem_error(m == PCRE2_ERROR_NOMEMORY ? ENOMEM : EINVAL,
					 "tokenizer: the pre-tokenizer's regex failed: %s", (char *)msg);
			break;
		}
		ov = pcre2_get_ovector_pointer(md);
		if (ov[0] > gap)
			rc = bpe_word(b, s, t + gap, ov[0] - gap, out);
		if (!rc && ov[1] > ov[0])
			rc = bpe_word(b, s, t + ov[0], ov[1] - ov[0], out);
		if (ov[1] == ov[0]) {
			/* An empty match: step over one character. */
			size_t k = ov[0] + 1;

			while (k < n && (t[k] & 0xC0) == 0x80)
				k++;
			at = k;
		} else {
			at = gap = ov[1];
		}
	}
out:
	pcre2_jit_stack_free(js);
	pcre2_match_context_free(mc);
	pcre2_match_data_free(md);
	free(norm);
	return rc;
}

/* The added token that starts at p (the longest), or NULL. */
static const struct added *added_at(const struct bpe *b, const char *p, size_t left)
{
	for (int i = 0; i < b->n_added; i++) {
		const struct added *a = &b->added[i];

		if ((unsigned char)a->text[0] > (unsigned char)p[0])
			break;
		if (a->text[0] == p[0] && a->len <= left && !memcmp(a->text, p, a->len))
			return a;
	}
	return NULL;
}

static int bpe_encode(void *ctx, const char *text, size_t len, unsigned flags, kvmem_ids *out)
{
	const struct bpe *b = ctx;
	struct scratch s = { 0 };
	size_t start = 0, i = 0;
	int rc = 0;

	if (u8_check((const uint8_t *)text, len))
		return kvmem_error(EINVAL, "tokenizer: the text is not valid UTF-8 (byte %zu)",
				   (size_t)((const char *)u8_check((const uint8_t *)text, len) - text));
	while (i < len && !rc) {
		const struct added *a = (flags & KVMEM_TOK_SPECIAL) ? added_at(b, text + i, len - i)
								    : NULL;

		if (!a) {
			i++;
			continue;
		}
		rc = encode_plain(b, &s, text + start, i - start, out);
		if (!rc)
			rc = kvmem_ids_push(out, &a->id, 1);
		i += a->len;
		start = i;
	}
	if (!rc)
		rc = encode_plain(b, &s, text + start, len - start, out);
	free(s.id);
	free(s.next);
	free(s.prev);
	free(s.heap);
	return rc;
}

static int bpe_decode(void *ctx, const int32_t *ids, size_t n, unsigned flags, char **text,
		      size_t *len)
{
	const struct bpe *b = ctx;
	unsigned char *raw = NULL;
	size_t rn = 0, rcap = 0, cap = 0;
	int rc;

	*text = NULL;
	*len = 0;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];

		if (id < 0 || id >= b->vocab || !b->piece[id]) {
			free(raw);
			return kvmem_error(EINVAL, "tokenizer: id %d at %zu is not a token (vocabulary "
					   "0..%d)", id, i, b->vocab - 1);
		}
		if ((flags & KVMEM_TOK_SKIP_SPECIAL) && b->is_added[id] == 2)
			continue;
		if (kvmem_grow(&raw, 1, rn + b->piece_len[id] + 1, &rcap, 256)) {
			free(raw);
			return kvmem_error(ENOMEM, "out of memory for decoded text");
		}
		memcpy(raw + rn, b->piece[id], b->piece_len[id]);
		rn += b->piece_len[id];
	}
	rc = kvmem_utf8_lossy(raw, rn, text, len, &cap);
	free(raw);
	return rc;
}

static int bpe_stop_ids(void *ctx, int32_t *ids, int cap)
{
	const struct bpe *b = ctx;
	int n = b->n_stop < cap ? b->n_stop : cap;

	memcpy(ids, b->stop, (size_t)n * sizeof(int32_t));
	return n;
}

static int bpe_vocab(void *ctx)
{
	return ((struct bpe *)ctx)->vocab;
}

const kvmem_tokenizer_ops kvmem_bpe_ops = {
	.name = "bpe",
	.encode = bpe_encode,
	.decode = bpe_decode,
	.render = kvmem_bpe_render,
	.stop_ids = bpe_stop_ids,
	.vocab = bpe_vocab,
	.free = bpe_free,
};
