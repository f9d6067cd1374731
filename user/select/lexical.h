/* SPDX-License-Identifier: MIT */
/*
 * Lexical block scores (private to user/select): BM25 over the history's
 * blocks with the step's query text as the query and token ids as terms,
 * for the policies that match tokens (policy_lexical.c).
 *
 * Terms are the query's distinct token ids (unigrams) and its distinct
 * ordered pairs of adjacent tokens (bigrams): a pair scores where the two
 * tokens stand next to each other in that order, so `api .conf db .port`
 * tells a line of api.conf from one of api2.conf (`api 2 .conf`), which
 * holds every unigram too. That is the sequential dependence model of
 * Metzler and Croft ("A Markov random field model for term dependencies",
 * SIGIR 2005) with BM25 as each term's weight (Robertson and Zaragoza, "The
 * Probabilistic Relevance Framework: BM25 and Beyond", 2009):
 *
 *   score(b) = sum over terms t in block b of
 *              idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - bb + bb * len_b / avg_len))
 *   idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))
 *
 * N the history's blocks, df those holding t, tf its count in b, k1 1.2,
 * bb 0.75, len_b the block's tokens. A bigram belongs to the block of its
 * second token (a pair across a boundary counts in the later block). The
 * query is the text's last LEX_MAX_TEXT tokens.
 */
#ifndef KVMEM_SELECT_LEXICAL_H
#define KVMEM_SELECT_LEXICAL_H

#include <stdint.h>

#include "kvmem/session.h"

#define LEX_MAX_TEXT 256

/*
 * score[n_blocks] (double): each block's BM25 against c->text; 0 for a
 * block no term matches (and for every block when the text is empty).
 * -EINVAL with kvmem_error when the context has no token ids, -ENOMEM.
 * One pass over the history's tokens; deterministic (sequential sums).
 */
int ws_lexical(const kvmem_select_ctx *c, double *score);

/*
 * The newest occurrence supersedes the older ones. The query's ending is
 * the longest suffix of the text (its last LEX_MAX_TEXT tokens) that
 * occurs in the history, not counting the text's own place there (a
 * selection after appending has its query tokens in the history; a
 * select-ahead has not). When it is LEX_MIN_ENDING tokens or longer,
 * old[b] = 1 for every block b holding an occurrence of it other than
 * the newest one's block (an earlier `api.conf db.port = 1234` under the
 * question `? api.conf db.port =`), else 0. old[n_blocks]; the length of
 * the ending (0: none), or -EINVAL / -ENOMEM with kvmem_error.
 */
#define LEX_MIN_ENDING 3
int64_t ws_lexical_superseded(const kvmem_select_ctx *c, uint8_t *old);

#endif
