// SPDX-License-Identifier: MIT
/*
 * BM25 over blocks with unigram and bigram terms (lexical.h says what and
 * why). One pass over the history: each token (and the pair it ends) is
 * looked up in a small open-addressing table of the query's terms; a
 * block's counts go to a list of (term, tf) entries when the block ends,
 * and its terms' block counts (df) go up. Then idf, then each block's sum
 * over its entries, in entry order: the same bits on every run.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "select/lexical.h"

#define K1 1.2
#define BB 0.75
#define EMPTY UINT64_MAX
#define BIGRAM (1ull << 63)

struct terms {
	uint64_t *key;		/* [cap] EMPTY or a term */
	int32_t *id;		/* [cap] its index */
	uint32_t mask;
	int n;
};

static uint32_t slot_of(const struct terms *t, uint64_t key)
{
	uint64_t h = key * 0x9e3779b97f4a7c15ull;

	return (uint32_t)(h >> 40) & t->mask;
}

/* The term's index, or -1. */
static int find(const struct terms *t, uint64_t key)
{
	for (uint32_t s = slot_of(t, key);; s = (s + 1) & t->mask) {
		if (t->key[s] == key)
			return t->id[s];
		if (t->key[s] == EMPTY)
			return -1;
	}
}

static void add(struct terms *t, uint64_t key)
{
	uint32_t s = slot_of(t, key);

	for (; t->key[s] != EMPTY; s = (s + 1) & t->mask)
		if (t->key[s] == key)
			return;
	t->key[s] = key;
	t->id[s] = t->n++;
}

static uint64_t unigram(int32_t a)
{
	return (uint32_t)a;
}

static uint64_t bigram(int32_t a, int32_t b)
{
	return BIGRAM | (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

struct entry {
	int32_t term, tf;
};

int ws_lexical(const kvmem_select_ctx *c, double *score)
{
	const int64_t nb = c->n_blocks, B = c->block;
	const int64_t nt = c->n_text < LEX_MAX_TEXT ? c->n_text : LEX_MAX_TEXT;
	const int32_t *text = c->text ? c->text + (c->n_text - nt) : NULL;
	struct terms t = { 0 };
	struct entry *ent = NULL;
	int64_t *first = NULL, n_ent = 0, cap_ent = 0, *df = NULL;
	int32_t *tf = NULL, *touched = NULL;
	double *idf = NULL, avg;
	uint32_t cap = 16;
	int rc = 0;

	for (int64_t b = 0; b < nb; b++)
		score[b] = 0;
	if (!c->tokens && nb)
		return kvmem_error(EINVAL, "lexical: the selection has no token ids (the caller "
				   "left kvmem_select_ctx.tokens NULL)");
	if (!nb || !text || nt <= 0)
		return 0;
	while (cap < 8 * (uint32_t)nt)
		cap *= 2;
	t.key = malloc(sizeof(*t.key) * cap);
	t.id = malloc(sizeof(*t.id) * cap);
	first = malloc(sizeof(*first) * (size_t)(nb + 1));
	if (!t.key || !t.id || !first)
		goto nomem;
	t.mask = cap - 1;
	for (uint32_t s = 0; s < cap; s++)
		t.key[s] = EMPTY;
	/* Negative ids are nobody's token: left out. */
	for (int64_t i = 0; i < nt; i++) {
		if (text[i] < 0)
			continue;
		add(&t, unigram(text[i]));
		if (i > 0 && text[i - 1] >= 0)
			add(&t, bigram(text[i - 1], text[i]));
	}
	tf = calloc((size_t)t.n, sizeof(*tf));
	touched = malloc(sizeof(*touched) * (size_t)t.n);
	df = calloc((size_t)t.n, sizeof(*df));
	idf = malloc(sizeof(*idf) * (size_t)t.n);
	if (!tf || !touched || !df || !idf)
		goto nomem;
	for (int64_t b = 0; b < nb; b++) {
		int64_t p0 = b * B, p1 = p0 + B < c->n_tokens ? p0 + B : c->n_tokens;
		int n_touched = 0;

		for (int64_t p = p0; p < p1; p++) {
			int32_t a = c->tokens[p];
			int u = a >= 0 ? find(&t, unigram(a)) : -1;
			int g = a >= 0 && p > 0 && c->tokens[p - 1] >= 0 ?
				find(&t, bigram(c->tokens[p - 1], a)) : -1;

			if (u >= 0 && !tf[u]++)
				touched[n_touched++] = u;
			if (g >= 0 && !tf[g]++)
				touched[n_touched++] = g;
		}
		first[b] = n_ent;
		if (n_ent + n_touched > cap_ent) {
			int64_t want = cap_ent ? 2 * cap_ent : 1024;
			struct entry *e;

			while (want < n_ent + n_touched)
				want *= 2;
			if (!(e = realloc(ent, sizeof(*e) * (size_t)want)))
				goto nomem;
			ent = e;
			cap_ent = want;
		}
		for (int i = 0; i < n_touched; i++) {
			int u = touched[i];

			ent[n_ent++] = (struct entry){ u, tf[u] };
			df[u]++;
			tf[u] = 0;
		}
	}
	first[nb] = n_ent;
	for (int i = 0; i < t.n; i++)
		idf[i] = log(1.0 + ((double)nb - df[i] + 0.5) / (df[i] + 0.5));
	avg = (double)c->n_tokens / nb;
	for (int64_t b = 0; b < nb; b++) {
		int64_t len = b * B + B < c->n_tokens ? B : c->n_tokens - b * B;
		double norm = K1 * (1 - BB + BB * len / avg), s = 0;

		for (int64_t e = first[b]; e < first[b + 1]; e++)
			s += idf[ent[e].term] * ent[e].tf * (K1 + 1) / (ent[e].tf + norm);
		score[b] = s;
	}
	goto out;
nomem:
	rc = kvmem_error(ENOMEM, "lexical: out of memory for %lld blocks", (long long)nb);
out:
	free(t.key);
	free(t.id);
	free(first);
	free(ent);
	free(tf);
	free(touched);
	free(df);
	free(idf);
	return rc;
}

/* Where the text lies in the history: the first position of its last nt
 * tokens when the query positions are history (a selection after
 * appending), else n_tokens (a select-ahead: the text is still to come). */
static int64_t text_start(const kvmem_select_ctx *c, int64_t nt)
{
	if (c->n_q > 0 && c->q_pos && c->q_pos[c->n_q - 1] < c->n_tokens &&
	    c->q_pos[c->n_q - 1] - nt + 1 >= 0)
		return c->q_pos[c->n_q - 1] - nt + 1;
	return c->n_tokens;
}

int64_t ws_lexical_superseded(const kvmem_select_ctx *c, uint8_t *old)
{
	const int64_t nb = c->n_blocks, B = c->block;
	const int64_t nt = c->n_text < LEX_MAX_TEXT ? c->n_text : LEX_MAX_TEXT;
	const int32_t *text = c->text ? c->text + (c->n_text - nt) : NULL;
	int64_t end, best = 0, newest = -1;

	for (int64_t b = 0; b < nb; b++)
		old[b] = 0;
	if (!c->tokens && nb)
		return kvmem_error(EINVAL, "lexical: the selection has no token ids (the caller "
				   "left kvmem_select_ctx.tokens NULL)");
	if (!nb || !text || nt <= 0)
		return 0;
	end = text_start(c, nt);
	/* m(p): how much of the text's ending ends at p; the longest, and the
	 * newest place it ends. */
	for (int64_t p = 0; p < end; p++) {
		int64_t m = 0;

		while (m < nt && m <= p && c->tokens[p - m] == text[nt - 1 - m])
			m++;
		if (m >= best && m > 0) {
			best = m;
			newest = p;
		}
	}
	if (best < LEX_MIN_ENDING)
		return 0;
	for (int64_t p = 0; p < newest; p++) {
		int64_t m = 0;

		while (m < best && m <= p && c->tokens[p - m] == text[nt - 1 - m])
			m++;
		if (m == best && p / B != newest / B)
			old[p / B] = 1;
	}
	return best;
}
