// SPDX-License-Identifier: MIT
/*
 * The retrieval baseline of kvmem bench recall (tools/kvmem/bench/
 * recall_rag.c): BM25 over a history's lines. Lines that share the query's
 * terms are taken best first while they fit the budget, then given back in
 * history order; rarer terms weigh more; equal scores go to the newer line;
 * a line with no query term is never taken.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../tools/kvmem/bench/recall_rag.c"

#define NL 6
#define V 64

/* Five lines: ids 10.. are words. Line 2 and line 4 both say "20 21";
 * line 3 says "20" alone; the others share nothing with the query. */
static const int32_t hist[] = {
	10, 11, 12, NL,		/* line 0 */
	13, 14, NL,		/* line 1 */
	20, 21, 30, NL,		/* line 2: the older value */
	20, 15, 16, 17, NL,	/* line 3: one term */
	20, 21, 31, NL,		/* line 4: the newer value */
};
#define N_HIST ((int64_t)(sizeof(hist) / sizeof(hist[0])))

static void test_index_lines(void **state)
{
	struct rag_index x;

	(void)state;
	assert_int_equal(rag_index_build(&x, hist, N_HIST, V, NL), 0);
	assert_int_equal(x.n_lines, 5);
	assert_int_equal(x.start[2], 7);
	assert_int_equal(x.len[3], 5);
	/* term 20 is in lines 2, 3, 4, once each */
	assert_int_equal(x.post_off[21] - x.post_off[20], 3);
	assert_int_equal(x.post_line[x.post_off[20]], 2);
	assert_int_equal(x.post_line[x.post_off[20] + 2], 4);
	rag_index_free(&x);
}

static void test_retrieve_order_and_budget(void **state)
{
	const int32_t q[] = { 20, 21 };
	int32_t out[64];
	struct rag_index x;

	(void)state;
	assert_int_equal(rag_index_build(&x, hist, N_HIST, V, NL), 0);
	/* Room for everything that matches: lines 2, 3, 4, in history order. */
	assert_int_equal(rag_retrieve(&x, hist, q, 2, 64, out), 13);
	assert_memory_equal(out, hist + 7, sizeof(int32_t) * 13);
	/* Room for one line of 4: the two full matches tie and the newer
	 * (line 4) wins; line 3 (one term, 5 tokens) does not fit after it. */
	assert_int_equal(rag_retrieve(&x, hist, q, 2, 4, out), 4);
	assert_memory_equal(out, hist + 16, sizeof(int32_t) * 4);
	/* Room for two lines of 4: both full matches, older first. */
	assert_int_equal(rag_retrieve(&x, hist, q, 2, 8, out), 8);
	assert_memory_equal(out, hist + 7, sizeof(int32_t) * 4);
	assert_memory_equal(out + 4, hist + 16, sizeof(int32_t) * 4);
	/* No term in common: nothing, whatever the budget. */
	const int32_t none[] = { 40, 41 };
	assert_int_equal(rag_retrieve(&x, hist, none, 2, 64, out), 0);
	rag_index_free(&x);
}

static void test_rare_terms_weigh_more(void **state)
{
	/* 30 is in one line, 20 in three: a query of both prefers line 2. */
	const int32_t q[] = { 20, 30, 20 };	/* a repeated term counts once */
	int32_t out[64];
	struct rag_index x;

	(void)state;
	assert_int_equal(rag_index_build(&x, hist, N_HIST, V, NL), 0);
	assert_int_equal(rag_retrieve(&x, hist, q, 3, 4, out), 4);
	assert_memory_equal(out, hist + 7, sizeof(int32_t) * 4);
	rag_index_free(&x);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_index_lines),
		cmocka_unit_test(test_retrieve_order_and_budget),
		cmocka_unit_test(test_rare_terms_weigh_more),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
