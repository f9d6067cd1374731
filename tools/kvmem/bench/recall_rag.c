// SPDX-License-Identifier: MIT
/*
 * BM25 retrieval over a history's lines (recall_rag.h), after Robertson and
 * Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond" (2009):
 * score(line) = sum over query terms t of
 *     idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len)),
 * idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)), with k1 = 1.2, b = 0.75.
 * Terms are token ids: agentlang's words are its pieces, and a question
 * names the file and the key with the very pieces its fact line has.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "recall_rag.h"

#define K1 1.2
#define B 0.75

void rag_index_free(struct rag_index *x)
{
	free(x->start);
	free(x->len);
	free(x->post_off);
	free(x->post_line);
	free(x->post_tf);
	memset(x, 0, sizeof(*x));
}

int rag_index_build(struct rag_index *x, const int32_t *ids, int64_t n, int vocab, int32_t nl)
{
	int64_t lines = 0, *fill = NULL;
	int32_t *last = NULL;	/* [vocab] the last line that counted the term */

	memset(x, 0, sizeof(*x));
	x->vocab = vocab;
	for (int64_t i = 0; i < n; i++)
		lines += ids[i] == nl || i == n - 1;
	x->start = malloc(sizeof(*x->start) * (lines ? lines : 1));
	x->len = malloc(sizeof(*x->len) * (lines ? lines : 1));
	x->post_off = calloc((size_t)vocab + 1, sizeof(*x->post_off));
	last = malloc(sizeof(*last) * (size_t)vocab);
	fill = malloc(sizeof(*fill) * (size_t)vocab);
	if (!x->start || !x->len || !x->post_off || !last || !fill)
		goto nomem;
	/* Lines, and per term the number of lines holding it. */
	for (int t = 0; t < vocab; t++)
		last[t] = -1;
	for (int64_t i = 0, l = 0, s = 0; i < n; i++) {
		int32_t t = ids[i];

		if (t >= 0 && t < vocab && last[t] != (int32_t)l) {
			last[t] = (int32_t)l;
			x->post_off[t + 1]++;
		}
		if (ids[i] == nl || i == n - 1) {
			x->start[l] = s;
			x->len[l] = (int32_t)(i + 1 - s);
			s = i + 1;
			l++;
		}
	}
	x->n_lines = lines;
	x->avg_len = lines ? (double)n / lines : 1;
	for (int t = 0; t < vocab; t++)
		x->post_off[t + 1] += x->post_off[t];
	x->post_line = malloc(sizeof(*x->post_line) * (size_t)(x->post_off[vocab] + 1));
	x->post_tf = calloc((size_t)x->post_off[vocab] + 1, sizeof(*x->post_tf));
	if (!x->post_line || !x->post_tf)
		goto nomem;
	/* Postings in line order: a term's entry is made at its first
	 * occurrence in a line and counted up after. */
	for (int t = 0; t < vocab; t++)
		fill[t] = x->post_off[t], last[t] = -1;
	for (int64_t l = 0; l < lines; l++)
		for (int64_t i = x->start[l]; i < x->start[l] + x->len[l]; i++) {
			int32_t t = ids[i];

			if (t < 0 || t >= vocab)
				continue;
			if (last[t] != (int32_t)l) {
				last[t] = (int32_t)l;
				x->post_line[fill[t]++] = l;
			}
			x->post_tf[fill[t] - 1]++;
		}
	free(last);
	free(fill);
	return 0;
nomem:
	free(last);
	free(fill);
	rag_index_free(x);
	return -ENOMEM;
}

struct scored {
	int64_t line;
	double score;
};

/* Best first; ties to the later line. */
static int by_score(const void *a, const void *b)
{
	const struct scored *x = a, *y = b;

	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return x->line < y->line ? 1 : x->line > y->line ? -1 : 0;
}

static int by_line(const void *a, const void *b)
{
	const struct scored *x = a, *y = b;

	return x->line < y->line ? -1 : x->line > y->line;
}

int64_t rag_retrieve(const struct rag_index *x, const int32_t *ids, const int32_t *q, int nq,
		     int64_t budget, int32_t *out)
{
	double *score = calloc((size_t)(x->n_lines ? x->n_lines : 1), sizeof(*score));
	struct scored *hit = NULL;
	int64_t n_hit = 0, used = 0, taken = 0;

	if (!score)
		return -ENOMEM;
	for (int i = 0; i < nq; i++) {
		int32_t t = q[i];
		int dup = 0;

		for (int j = 0; j < i; j++)
			dup |= q[j] == t;	/* a term counts once per query */
		if (dup || t < 0 || t >= x->vocab)
			continue;
		int64_t lo = x->post_off[t], hi = x->post_off[t + 1], df = hi - lo;
		double idf = log(1.0 + (x->n_lines - df + 0.5) / (df + 0.5));

		for (int64_t p = lo; p < hi; p++) {
			int64_t l = x->post_line[p];
			double tf = x->post_tf[p];

			score[l] += idf * tf * (K1 + 1) /
				    (tf + K1 * (1 - B + B * x->len[l] / x->avg_len));
		}
	}
	for (int64_t l = 0; l < x->n_lines; l++)
		n_hit += score[l] > 0;
	hit = malloc(sizeof(*hit) * (size_t)(n_hit ? n_hit : 1));
	if (!hit) {
		free(score);
		return -ENOMEM;
	}
	n_hit = 0;
	for (int64_t l = 0; l < x->n_lines; l++)
		if (score[l] > 0)
			hit[n_hit++] = (struct scored){ l, score[l] };
	qsort(hit, (size_t)n_hit, sizeof(*hit), by_score);
	/* The best lines that fit, then back in the order they were written. */
	for (int64_t i = 0; i < n_hit; i++)
		if (used + x->len[hit[i].line] <= budget) {
			used += x->len[hit[i].line];
			hit[taken++] = hit[i];
		}
	qsort(hit, (size_t)taken, sizeof(*hit), by_line);
	used = 0;
	for (int64_t i = 0; i < taken; i++) {
		memcpy(out + used, ids + x->start[hit[i].line], sizeof(*out) * x->len[hit[i].line]);
		used += x->len[hit[i].line];
	}
	free(hit);
	free(score);
	return used;
}
