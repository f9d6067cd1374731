/* SPDX-License-Identifier: MIT */
/*
 * The baseline a user would pick instead of paging: retrieve text and
 * prefill it again. `kvmem bench recall --policies rag` answers each
 * question from the workspace's lines that BM25 ranks best for the
 * question's words (its token ids), as many as fill the same token budget
 * kvmem's view has, in the order they were written, prefilled into a fresh
 * window with the question after them.
 */
#ifndef KVMEM_TOOLS_RECALL_RAG_H
#define KVMEM_TOOLS_RECALL_RAG_H

#include <stdint.h>

/* BM25 over the lines of a token history (lines end with `nl`). */
struct rag_index {
	int64_t n_lines;
	int64_t *start;		/* [n_lines] first token of each line */
	int32_t *len;		/* [n_lines] tokens, the newline included */
	double avg_len;
	int vocab;
	int64_t *post_off;	/* [vocab + 1] postings of term t: post_off[t]..[t+1] */
	int64_t *post_line;	/* lines holding the term, ascending */
	int32_t *post_tf;	/* how often it is there */
};

/* Index ids[0..n) (a history of n tokens, ids < vocab): 0 or -ENOMEM. */
int rag_index_build(struct rag_index *x, const int32_t *ids, int64_t n, int vocab, int32_t nl);
void rag_index_free(struct rag_index *x);

/*
 * The lines that answer the query terms q[0..nq) best, as many as fit in
 * budget tokens, in history order: written into out (at most budget
 * tokens); returns the tokens written, or -ENOMEM. A line no term matches
 * is never taken; ties go to the later line (the newer fact).
 */
int64_t rag_retrieve(const struct rag_index *x, const int32_t *ids, const int32_t *q, int nq,
		     int64_t budget, int32_t *out);

#endif
