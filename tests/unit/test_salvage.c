// SPDX-License-Identifier: MIT
/*
 * Recovery (kvmem_workspace_salvage): from a workspace with one bad item,
 * the longest good prefix is written as a new workspace beside it, which
 * verifies and reopens with exactly that prefix's tokens, pages and index
 * records; the report says what was kept and the first bad item; the
 * damaged workspace is not modified.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager_fixture.h"
#include "kvmem/store.h"

static uint64_t g_seed;

static kvmem_pager *open_ws(const char *dir, const kvmem_page_geom *g, int flags)
{
	return fx_open(dir, g, 1 << 20, 256 << 10, flags, 0);
}

/* A workspace of `blocks` full blocks and a partial one of `tail` tokens,
 * committed with session state "state <tokens>". */
static void make_ws(const char *dir, const kvmem_page_geom *g, uint64_t seed, uint64_t blocks,
		    uint32_t tail)
{
	kvmem_pager *p = open_ws(dir, g, KVMEM_PAGER_CREATE);
	char app[64];

	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, blocks * g->block_tokens + tail), 0);
	snprintf(app, sizeof(app), "state %" PRIu64, kvmem_pager_tokens(p));
	assert_int_equal(fx_commit(p, seed, app, strlen(app) + 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
}

/* dest verifies and reopens holding `tokens` tokens, all as written. */
static void check_dest(const char *dest, const kvmem_page_geom *g, uint64_t seed, uint64_t tokens,
		       int app_kept)
{
	kvmem_pager *p;
	uint32_t len;
	const char *app;

	assert_int_equal(kvmem_workspace_verify(dest, stderr, 0), 0);
	p = open_ws(dest, g, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_tokens(p), tokens);
	assert_int_equal(kvmem_pager_committed_tokens(p), tokens);
	assert_int_equal(fx_check(p, seed, 1), 0);
	app = kvmem_pager_app_state(p, &len);
	if (app_kept) {
		char want[64];

		snprintf(want, sizeof(want), "state %" PRIu64, tokens);
		assert_int_equal(len, strlen(want) + 1);
		assert_string_equal(app, want);
	} else {
		assert_int_equal(len, 0);
	}
	/* The copy is a workspace like any other: it goes on. */
	assert_int_equal(fx_append(p, seed, g->block_tokens + 1), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
}

/* One page corrupt in the middle: every block before it is kept, the rest
 * (that block, the later ones, the partial block, the session state) is
 * dropped and named; the damaged workspace keeps every byte. */
static void test_salvage_keeps_good_prefix(void **state)
{
	uint64_t rng = g_seed, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	uint64_t blocks = test_rng_int(&rng, 6, 12), victim = test_rng_int(&rng, 1, blocks - 2);
	uint32_t layer = test_rng_int(&rng, 0, g.n_layers - 1), tail = test_rng_int(&rng, 1, 9);
	uint64_t page = victim * g.n_layers + layer, before;
	char dir[256], dest[300], path[400], want[128];
	kvmem_salvage_report r;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(dest, sizeof(dest), "%s.salvaged", dir);
	make_ws(dir, &g, seed, blocks, tail);
	snprintf(path, sizeof(path), "%s/pages", dir);
	assert_int_equal(fx_flip(path, page * kvmem_page_stride(&g) +
				 test_rng_int(&rng, 0, kvmem_page_bytes(&g) - 1)), 0);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 1);
	before = fx_dir_digest(dir);

	assert_int_equal(kvmem_workspace_salvage(dir, dest, &r), 0);
	print_message("kept %" PRIu64 "/%" PRIu64 " tokens, %" PRIu64 "/%" PRIu64
		      " blocks; first bad: %s\n", r.tokens_kept, r.tokens, r.blocks_kept, r.blocks,
		      r.first_bad);
	assert_int_equal(r.tokens, blocks * g.block_tokens + tail);
	assert_int_equal(r.blocks, blocks);
	assert_int_equal(r.blocks_kept, victim);
	assert_int_equal(r.tokens_kept, victim * g.block_tokens);
	assert_int_equal(r.tail_tokens, tail);
	assert_int_equal(r.tail_kept, 0);
	assert_true(r.tokens_ok);
	assert_false(r.app_kept);
	snprintf(want, sizeof(want), "/pages: page %" PRIu64 " (block %" PRIu64 ", layer %u)", page,
		 victim, layer);
	if (!strstr(r.first_bad, want))
		fail_msg("first bad item \"%s\" does not name %s", r.first_bad, want);
	assert_int_equal(fx_dir_digest(dir), before);
	check_dest(dest, &g, seed, victim * g.block_tokens, 0);
	fx_rmtree(dir);
	fx_rmtree(dest);
}

/* A bad index record, a bad partial block, bad token ids, and no damage at
 * all: each keeps what it should and names what it dropped. */
static void test_salvage_each_kind_of_damage(void **state)
{
	uint64_t rng = g_seed ^ 1, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], dest[300], path[400];
	kvmem_salvage_report r;
	const uint64_t blocks = 5;
	const uint32_t tail = 3;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(dest, sizeof(dest), "%s.salvaged", dir);
	for (int kind = 0; kind < 4; kind++) {
		uint64_t keep = 0;

		fx_rmtree(dir);
		fx_rmtree(dest);
		make_ws(dir, &g, seed, blocks, tail);
		switch (kind) {
		case 0:	/* nothing wrong */
			keep = blocks * g.block_tokens + tail;
			break;
		case 1:	/* index record of block 3 */
			snprintf(path, sizeof(path), "%s/index", dir);
			assert_int_equal(fx_flip(path, 3 * g.index_bytes + 1), 0);
			keep = 3 * g.block_tokens;
			break;
		case 2:	/* the partial block (slot 1 after the one commit) */
			snprintf(path, sizeof(path), "%s/tail", dir);
			assert_int_equal(fx_flip(path, kvmem_page_stride(&g) * g.n_layers +
						 (g.index_bytes + 4095) / 4096 * 4096 + 7), 0);
			keep = blocks * g.block_tokens;
			break;
		case 3:	/* one token id */
			snprintf(path, sizeof(path), "%s/tokens", dir);
			assert_int_equal(fx_flip(path, 4 * 17 + 2), 0);
			keep = 0;
			break;
		}
		assert_int_equal(kvmem_workspace_salvage(dir, dest, &r), 0);
		print_message("damage %d: kept %" PRIu64 " of %" PRIu64 " tokens: %s\n", kind,
			      r.tokens_kept, r.tokens, r.first_bad);
		assert_int_equal(r.tokens_kept, keep);
		assert_int_equal(r.app_kept, kind == 0);
		assert_int_equal(r.tail_kept, kind == 0 ? tail : 0);
		assert_int_equal(r.tokens_ok, kind != 3);
		assert_true(kind == 0 ? !r.first_bad[0] :
			    kind == 1 ? strstr(r.first_bad, "/index: record of block 3") != NULL :
			    kind == 2 ? strstr(r.first_bad, "/tail: slot 1") != NULL :
			    strstr(r.first_bad, "/tokens") != NULL);
		check_dest(dest, &g, seed, keep, kind == 0);
	}
	fx_rmtree(dir);
	fx_rmtree(dest);
}

/* Issue 23: one byte of the partial block's index record (the last record
 * of its tail slot, after the L layers) flipped: every full block is kept,
 * the partial block and the session state are dropped, and the first bad
 * place is named by file, slot and byte offset, as verify names it. */
static void test_salvage_tail_index_record(void **state)
{
	uint64_t rng = g_seed ^ 3, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	uint64_t blocks = test_rng_int(&rng, 1, 6), stride = kvmem_page_stride(&g);
	uint32_t tail = test_rng_int(&rng, 1, g.block_tokens - 1);
	/* The first commit writes the partial block to slot 1. */
	uint64_t slot_bytes = stride * g.n_layers + (g.index_bytes + 4095) / 4096 * 4096;
	uint64_t at = slot_bytes + g.n_layers * stride;
	char dir[256], dest[300], path[400], want[160], *report = NULL;
	kvmem_salvage_report r;
	size_t rlen = 0;
	uint64_t before;
	FILE *rep;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(dest, sizeof(dest), "%s.salvaged", dir);
	make_ws(dir, &g, seed, blocks, tail);
	snprintf(path, sizeof(path), "%s/tail", dir);
	assert_int_equal(fx_flip(path, at + test_rng_int(&rng, 0, g.index_bytes - 1)), 0);
	snprintf(want, sizeof(want), "/tail: slot 1, index %u at offset %" PRIu64 " ", g.n_layers,
		 at);
	rep = open_memstream(&report, &rlen);
	assert_int_equal(kvmem_workspace_verify(dir, rep, 0), 1);
	fclose(rep);
	if (!strstr(report, want))
		fail_msg("verify did not name \"%s\": %s", want, report);
	free(report);
	before = fx_dir_digest(dir);

	assert_int_equal(kvmem_workspace_salvage(dir, dest, &r), 0);
	print_message("kept %" PRIu64 " of %" PRIu64 " tokens; first bad: %s\n", r.tokens_kept,
		      r.tokens, r.first_bad);
	assert_int_equal(r.blocks_kept, blocks);
	assert_int_equal(r.tail_tokens, tail);
	assert_int_equal(r.tail_kept, 0);
	assert_int_equal(r.tokens_kept, blocks * g.block_tokens);
	assert_true(r.tokens_ok);
	assert_false(r.app_kept);
	if (!strstr(r.first_bad, want))
		fail_msg("first bad item \"%s\" does not name \"%s\"", r.first_bad, want);
	assert_int_equal(fx_dir_digest(dir), before);
	check_dest(dest, &g, seed, blocks * g.block_tokens, 0);
	fx_rmtree(dir);
	fx_rmtree(dest);
}

/* Salvage never writes over anything: a destination that is not empty, the
 * workspace itself, or a source without a readable manifest is refused. */
static void test_salvage_refuses(void **state)
{
	uint64_t rng = g_seed ^ 2, seed = fx_mix(rng), before;
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], dest[300], path[400];
	kvmem_salvage_report r;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(dest, sizeof(dest), "%s.other", dir);
	make_ws(dir, &g, seed, 3, 1);
	make_ws(dest, &g, seed, 1, 0);
	before = fx_dir_digest(dest);
	assert_int_equal(kvmem_workspace_salvage(dir, dest, &r), -EEXIST);
	assert_int_equal(fx_dir_digest(dest), before);
	fx_rmtree(dest);
	assert_int_equal(mkdir(dest, 0755), 0);
	snprintf(path, sizeof(path), "%s/notes", dest);
	assert_int_equal(fx_write_file(path, "x", 1), 0);
	assert_int_equal(kvmem_workspace_salvage(dir, dest, &r), -EEXIST);
	fx_rmtree(dest);
	before = fx_dir_digest(dir);
	assert_true(kvmem_workspace_salvage(dir, dir, &r) < 0);
	assert_int_equal(fx_dir_digest(dir), before);
	snprintf(path, sizeof(path), "%s/manifest", dir);
	assert_int_equal(fx_flip(path, 30), 0);
	assert_int_equal(kvmem_workspace_salvage(dir, dest, &r), -EBADMSG);
	assert_non_null(strstr(kvmem_last_error(), "manifest"));
	assert_int_equal(access(dest, F_OK), -1);
	fx_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_salvage_keeps_good_prefix),
		cmocka_unit_test(test_salvage_each_kind_of_damage),
		cmocka_unit_test(test_salvage_tail_index_record),
		cmocka_unit_test(test_salvage_refuses),
	};

	g_seed = test_rng_fresh_seed("test_salvage");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
