// SPDX-License-Identifier: MIT
/*
 * The NVMe store: create, append, commit, reopen and read back through real
 * io_uring on real files; what lies past a commit is ignored; a workspace
 * of another model is refused naming both fingerprints; verify finds a
 * flipped byte; a torn or truncated committed state is refused.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager_fixture.h"
#include "kvmem/store.h"

static uint64_t g_seed;

static kvmem_pager *open_ws(const char *dir, const kvmem_page_geom *g, uint64_t cap, int flags)
{
	return fx_open(dir, g, cap, 1 << 20, flags, 0);
}

/* Several sessions of appends and commits with reopens between: every
 * committed token, index record, page and the tail read back exactly. */
static void test_roundtrip_reopen(void **state)
{
	uint64_t rng = g_seed;

	for (int round = 0; round < 4; round++) {
		kvmem_page_geom g = fx_geom(&rng);
		uint64_t seed = fx_mix(rng++), cap;
		char dir[256];
		kvmem_pager *p;

		assert_non_null(fx_tmpdir(dir, sizeof(dir)));
		strcat(dir, "/ws");
		/* A pool far smaller than the workspace: evictions and re-reads. */
		cap = kvmem_page_stride(&g) * (g.n_layers + test_rng_int(&rng, 0, 5));
		for (int part = 0; part < 4; part++) {
			uint64_t before;
			uint32_t len;
			char app[64];

			p = open_ws(dir, &g, cap, KVMEM_PAGER_CREATE);
			assert_non_null(p);
			before = kvmem_pager_tokens(p);
			if (part) {
				const char *got = kvmem_pager_app_state(p, &len);

				snprintf(app, sizeof(app), "part %d", part - 1);
				assert_int_equal(len, strlen(app) + 1);
				assert_string_equal(got, app);
			}
			assert_int_equal(fx_check(p, seed, 1), 0);
			assert_int_equal(fx_append(p, seed, test_rng_int(&rng, 1, 300)), 0);
			assert_int_equal(fx_check(p, seed, 0), 0);
			snprintf(app, sizeof(app), "part %d", part);
			assert_int_equal(fx_commit(p, seed, app, strlen(app) + 1), 0);
			assert_int_equal(kvmem_pager_committed_tokens(p), kvmem_pager_tokens(p));
			assert_true(kvmem_pager_tokens(p) > before);
			assert_int_equal(fx_check(p, seed, 1), 0);
			assert_int_equal(kvmem_pager_close(p), 0);
		}
		assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
		*strrchr(dir, '/') = 0;
		fx_rmtree(dir);
	}
}

/* Appends without a commit vanish on reopen, and the first write after it
 * cuts the files back (the open alone changes nothing). */
static void test_uncommitted_ignored(void **state)
{
	uint64_t rng = g_seed ^ 1, seed = fx_mix(g_seed);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], path[300];
	uint64_t committed, before;
	struct stat sb;
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, 1 << 20, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 3 * g.block_tokens + 5), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	committed = kvmem_pager_tokens(p);
	assert_int_equal(fx_append(p, seed, 4 * g.block_tokens + 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	before = fx_dir_digest(dir);

	p = open_ws(dir, &g, 1 << 20, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_tokens(p), committed);
	assert_int_equal(kvmem_pager_blocks(p), committed / g.block_tokens);
	assert_int_equal(fx_check(p, seed, 1), 0);
	/* The open and the reads change nothing (lock names this process
	 * both times)... */
	assert_int_equal(fx_dir_digest(dir), before);
	/* ...appending goes on from the commit, and its first write cuts
	 * off what lay past it. */
	assert_int_equal(fx_append(p, seed, 2 * g.block_tokens), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	committed += 2 * g.block_tokens;
	snprintf(path, sizeof(path), "%s/tokens", dir);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_size, committed * 4);
	snprintf(path, sizeof(path), "%s/pages", dir);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_size, committed / g.block_tokens * g.n_layers * kvmem_page_stride(&g));
	fx_rmtree(dir);
}

/* Another model's workspace is refused naming both fingerprints, and so is
 * another geometry; nothing in the directory changes. */
static void test_wrong_model_refused(void **state)
{
	uint64_t rng = g_seed ^ 2, seed = fx_mix(g_seed ^ 2);
	kvmem_page_geom g = fx_geom(&rng), other = g, geo = g;
	char dir[256], a[32], b[32];
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, 1 << 20, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 2 * g.block_tokens + 3), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);

	other.fingerprint ^= 0x1234567ull << 20;
	assert_true(kvmem_pager_open(dir, &other, NULL, &p) < 0);
	assert_null(p);
	snprintf(a, sizeof(a), "%016" PRIx64, g.fingerprint);
	snprintf(b, sizeof(b), "%016" PRIx64, other.fingerprint);
	assert_non_null(strstr(kvmem_last_error(), a));
	assert_non_null(strstr(kvmem_last_error(), b));
	assert_non_null(strstr(kvmem_last_error(), "manifest"));

	geo.head_dim *= 2;
	assert_true(kvmem_pager_open(dir, &geo, NULL, &p) < 0);
	assert_non_null(strstr(kvmem_last_error(), "geometry"));

	p = open_ws(dir, &g, 1 << 20, 0);
	assert_non_null(p);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

/* A byte flipped in a page: verify names the page and the file, fetch of
 * that page fails (never returns bad bytes), the other pages still read. */
static void test_flipped_byte(void **state)
{
	uint64_t rng = g_seed ^ 3, seed = fx_mix(g_seed ^ 3), victim, blocks;
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], path[300], want[128], *report = NULL;
	size_t rlen = 0;
	const void *ptr;
	FILE *rep;
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, 1 << 20, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 5 * g.block_tokens + 7), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	blocks = kvmem_pager_blocks(p);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);

	victim = test_rng_int(&rng, 0, blocks * g.n_layers - 1);
	snprintf(path, sizeof(path), "%s/pages", dir);
	assert_int_equal(fx_flip(path, victim * kvmem_page_stride(&g) +
				 test_rng_int(&rng, 0, kvmem_page_bytes(&g) - 1)), 0);
	rep = open_memstream(&report, &rlen);
	assert_int_equal(kvmem_workspace_verify(dir, rep, 0), 1);
	fclose(rep);
	snprintf(want, sizeof(want), "page %" PRIu64 " ", victim);
	assert_non_null(strstr(report, want));
	assert_non_null(strstr(report, "/pages"));
	free(report);

	p = open_ws(dir, &g, 1 << 20, 0);
	assert_non_null(p);
	assert_true(kvmem_pager_fetch(p, &victim, 1, &ptr) < 0);
	assert_non_null(strstr(kvmem_last_error(), "checksum"));
	assert_non_null(strstr(kvmem_last_error(), want));
	assert_true(kvmem_pager_pte(p, victim)->flags & KVMEM_PTE_BAD);
	for (uint64_t pg = 0; pg < blocks * g.n_layers; pg++) {
		if (pg == victim)
			continue;
		assert_int_equal(kvmem_pager_fetch(p, &pg, 1, &ptr), 0);
		kvmem_pager_release(p, &pg, 1);
	}
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

/* Damage to the committed state itself is refused at open, naming the file:
 * the manifest, the tokens, a truncated pages file. */
static void test_torn_refused(void **state)
{
	uint64_t rng = g_seed ^ 4, seed = fx_mix(g_seed ^ 4);
	kvmem_page_geom g = fx_geom(&rng);
	static const char *const files[] = { "manifest", "tokens", "sums" };
	kvmem_pager *p;

	for (int i = 0; i < 4; i++) {
		char dir[256], path[300];
		struct stat sb;

		assert_non_null(fx_tmpdir(dir, sizeof(dir)));
		p = open_ws(dir, &g, 1 << 20, KVMEM_PAGER_CREATE);
		assert_non_null(p);
		assert_int_equal(fx_append(p, seed, 3 * g.block_tokens + 2), 0);
		assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
		assert_int_equal(kvmem_pager_close(p), 0);
		if (i < 3) {
			snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
			assert_int_equal(stat(path, &sb), 0);
			assert_int_equal(fx_flip(path, test_rng_int(&rng, 0, sb.st_size - 1)), 0);
		} else {
			snprintf(path, sizeof(path), "%s/pages", dir);
			assert_int_equal(stat(path, &sb), 0);
			assert_int_equal(truncate(path, sb.st_size - 4096), 0);
		}
		assert_true(kvmem_pager_open(dir, &g, NULL, &p) < 0);
		assert_non_null(strstr(kvmem_last_error(), i < 3 ? files[i] : "pages"));
		assert_true(kvmem_workspace_verify(dir, stderr, 0) != 0);
		/* Refusing touches nothing: the damage is still there. */
		assert_true(kvmem_pager_open(dir, &g, NULL, &p) < 0);
		fx_rmtree(dir);
	}
}

/* A copy of dir at copy (cp -a), replacing what was there. */
static void copy_dir(const char *from, const char *to)
{
	char cmd[1200];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -a '%s' '%s'", to, from, to);
	assert_int_equal(system(cmd), 0);
}

/* A byte flipped in one index record: verify names the record, and reading
 * it fails with -EBADMSG (never the bad bytes); the other records read. */
static void test_index_corruption_detected(void **state)
{
	uint64_t rng = g_seed ^ 8, seed = fx_mix(g_seed ^ 8), blocks, victim;
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], path[300], want[96], *report = NULL;
	size_t rlen = 0;
	uint8_t *buf;
	FILE *rep;
	kvmem_pager *p;

	assert_true(g.index_bytes > 0);
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, 1 << 20, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 6 * g.block_tokens + 5), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	blocks = kvmem_pager_blocks(p);
	assert_int_equal(kvmem_pager_close(p), 0);

	victim = test_rng_int(&rng, 0, blocks - 1);
	snprintf(path, sizeof(path), "%s/index", dir);
	assert_int_equal(fx_flip(path, victim * g.index_bytes +
				 test_rng_int(&rng, 0, g.index_bytes - 1)), 0);
	rep = open_memstream(&report, &rlen);
	assert_int_equal(kvmem_workspace_verify(dir, rep, 0), 1);
	fclose(rep);
	snprintf(want, sizeof(want), "/index: record of block %" PRIu64 " ", victim);
	if (!strstr(report, want))
		fail_msg("verify did not name %s: %s", want, report);
	free(report);

	p = open_ws(dir, &g, 1 << 20, 0);
	assert_non_null(p);
	buf = malloc(g.index_bytes);
	for (uint64_t b = 0; b < blocks; b++) {
		int rc = kvmem_pager_read_index(p, b, 1, buf);

		if (b == victim) {
			assert_int_equal(rc, -EBADMSG);
			assert_non_null(strstr(kvmem_last_error(), want));
		} else {
			uint8_t *ref = malloc(g.index_bytes);

			assert_int_equal(rc, 0);
			fx_index(&g, seed, b, ref);
			assert_memory_equal(ref, buf, g.index_bytes);
			free(ref);
		}
	}
	/* A range that covers it fails too. */
	free(buf);
	buf = malloc(g.index_bytes * blocks);
	assert_int_equal(kvmem_pager_read_index(p, 0, blocks, buf), -EBADMSG);
	free(buf);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

/* A byte flipped in each record of the partial block in turn (every layer's
 * page, the index record): verify names it, and reading the tail fails with
 * -EBADMSG. */
static void test_tail_corruption_detected(void **state)
{
	uint64_t rng = g_seed ^ 9, seed = fx_mix(g_seed ^ 9);
	kvmem_page_geom g = fx_geom(&rng);
	size_t pb = kvmem_page_bytes(&g), stride = kvmem_page_stride(&g);
	size_t slot_bytes = stride * g.n_layers + (g.index_bytes + 4095) / 4096 * 4096;
	char dir[256], good[300], path[400], want[96], *report = NULL;
	uint32_t slot;
	size_t rlen = 0;
	uint8_t *buf;
	void *layers[64];
	FILE *f, *rep;
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(good, sizeof(good), "%s.good", dir);
	p = open_ws(dir, &g, 1 << 20, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	/* Two commits: one slot holds the current tail, the other an old one. */
	assert_int_equal(fx_append(p, seed, 2 * g.block_tokens + 3), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(fx_append(p, seed, 4), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	snprintf(path, sizeof(path), "%s/manifest", dir);
	f = fopen(path, "rb");
	assert_non_null(f);
	assert_int_equal(fseek(f, 104, SEEK_SET), 0);
	assert_int_equal(fread(&slot, 4, 1, f), 1);
	fclose(f);
	assert_true(slot <= 1);
	copy_dir(dir, good);
	buf = malloc(pb * g.n_layers + g.index_bytes + 1);
	for (uint32_t l = 0; l < g.n_layers; l++)
		layers[l] = buf + l * pb;

	for (uint32_t l = 0; l <= g.n_layers; l++) {
		size_t len = l < g.n_layers ? pb : g.index_bytes;

		copy_dir(good, dir);
		snprintf(path, sizeof(path), "%s/tail", dir);
		assert_int_equal(fx_flip(path, slot * slot_bytes + l * stride +
					 test_rng_int(&rng, 0, len - 1)), 0);
		rep = open_memstream(&report, &rlen);
		assert_int_equal(kvmem_workspace_verify(dir, rep, 0), 1);
		fclose(rep);
		snprintf(want, sizeof(want), "/tail: slot %u, %s %u ", slot,
			 l < g.n_layers ? "layer" : "index", l);
		if (!strstr(report, want))
			fail_msg("verify did not name %s: %s", want, report);
		free(report);
		report = NULL;

		p = open_ws(dir, &g, 1 << 20, 0);
		assert_non_null(p);
		assert_int_equal(kvmem_pager_read_tail(p, layers, buf + g.n_layers * pb), -EBADMSG);
		assert_non_null(strstr(kvmem_last_error(), "checksum mismatch"));
		assert_int_equal(kvmem_pager_close(p), 0);
	}
	/* The old slot is not the committed state: damage there is harmless. */
	copy_dir(good, dir);
	assert_int_equal(fx_flip(path, (1 - slot) * slot_bytes + 5), 0);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
	p = open_ws(dir, &g, 1 << 20, 0);
	assert_non_null(p);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	free(buf);
	fx_rmtree(dir);
	fx_rmtree(good);
}

struct stage_acc {
	uint64_t seed, seen;
	const kvmem_page_geom *g;
	int bad;
};

static int check_page(void *arg, uint64_t page, const void *data)
{
	struct stage_acc *acc = arg;
	uint8_t *buf = malloc(kvmem_page_bytes(acc->g));

	fx_page(acc->g, acc->seed, page, buf);
	acc->bad += memcmp(buf, data, kvmem_page_bytes(acc->g)) != 0;
	acc->seen++;
	free(buf);
	return 0;
}

/* A plan larger than the pool streams through it; prefetch is counted. */
static void test_stage_in_small_pool(void **state)
{
	uint64_t rng = g_seed ^ 5, seed = fx_mix(g_seed ^ 5), n_pages, *plan;
	kvmem_page_geom g = fx_geom(&rng);
	kvmem_pager_stats st;
	char dir[256];
	kvmem_pager *p;
	struct stage_acc acc = { seed, 0, &g, 0 };
	uint64_t want = 0;
	const void *ptr;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, kvmem_page_stride(&g) * 3, KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 20 * g.block_tokens), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	n_pages = kvmem_pager_blocks(p) * g.n_layers;
	plan = malloc(n_pages * sizeof(*plan));
	for (uint64_t i = 0; i < n_pages; i++)
		plan[i] = (i * 7 + 3) % n_pages;
	assert_int_equal(kvmem_pager_stage_in(p, plan, n_pages, check_page, &acc), 0);
	assert_int_equal(acc.seen, n_pages);
	assert_int_equal(acc.bad, 0);
	kvmem_pager_stats_get(p, &st);
	assert_true(st.pages_in >= n_pages - 3);
	assert_true(st.evictions > 0);

	/* Prefetch a page, then fetch it: counted as used. */
	assert_int_equal(kvmem_pager_step(p, 1), 0);
	for (uint64_t pg = 0; pg < n_pages; pg++)
		if (!(kvmem_pager_pte(p, pg)->tiers & KVMEM_TIER_HOST)) {
			want = pg;
			break;
		}
	assert_int_equal(kvmem_pager_prefetch(p, &want, 1), 1);
	assert_int_equal(kvmem_pager_fetch(p, &want, 1, &ptr), 0);
	kvmem_pager_release(p, &want, 1);
	kvmem_pager_stats_get(p, &st);
	assert_int_equal(st.prefetch_pages, 1);
	assert_int_equal(st.prefetch_used, 1);
	free(plan);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

/* Buffered I/O (KVMEM_PAGER_NO_DIRECT) stores the same bytes. */
static void test_buffered_mode(void **state)
{
	uint64_t rng = g_seed ^ 6, seed = fx_mix(g_seed ^ 6);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256];
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, 1 << 20, KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_DIRECT);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_direct(p), 0);
	assert_int_equal(fx_append(p, seed, 4 * g.block_tokens + 9), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	p = open_ws(dir, &g, 1 << 20, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_direct(p), 1);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	fx_rmtree(dir);
}

/* Run `kvmem ARGS` from the build under test; output into buf. Returns the
 * exit status, or -1 when the binary is not there. */
static int run_cli(const char *args, char *buf, size_t len)
{
	const char *b = getenv("KVMEM_BUILD");
	char cmd[1024], bin[512];
	size_t n = 0;
	FILE *f;
	int st;

	snprintf(bin, sizeof(bin), "%s/kvmem", b && *b ? b : "build");
	if (access(bin, X_OK) < 0)
		return -1;
	snprintf(cmd, sizeof(cmd), "%s %s 2>&1", bin, args);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	while (n + 1 < len && fgets(buf + n, len - n, f))
		n += strlen(buf + n);
	buf[n] = 0;
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* kvmem verify and kvmem stat on a real workspace: exit 0 and the counts;
 * after a flipped byte, exit 1 naming the page and the file. */
static void test_cli_verify_stat(void **state)
{
	uint64_t rng = g_seed ^ 7, seed = fx_mix(g_seed ^ 7);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], args[512], out[16384], want[64];
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	p = open_ws(dir, &g, 1 << 20, KVMEM_PAGER_CREATE);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 4 * g.block_tokens + 3), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);

	snprintf(args, sizeof(args), "verify %s", dir);
	if (run_cli(args, out, sizeof(out)) < 0) {
		fx_rmtree(dir);
		skip();
	}
	assert_int_equal(run_cli(args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "all good"));
	snprintf(args, sizeof(args), "stat %s", dir);
	assert_int_equal(run_cli(args, out, sizeof(out)), 0);
	snprintf(want, sizeof(want), "%u tokens", 4 * g.block_tokens + 3);
	assert_non_null(strstr(out, want));
	assert_non_null(strstr(out, "host_hits"));
	assert_non_null(strstr(out, "blocks_out"));

	snprintf(args, sizeof(args), "%s/pages", dir);
	assert_int_equal(fx_flip(args, 2 * g.n_layers * kvmem_page_stride(&g) + 5), 0);
	snprintf(args, sizeof(args), "verify -q %s", dir);
	assert_int_equal(run_cli(args, out, sizeof(out)), 1);
	snprintf(want, sizeof(want), "page %u (block 2, layer 0)", 2 * g.n_layers);
	assert_non_null(strstr(out, want));
	assert_non_null(strstr(out, "/pages:"));
	assert_int_equal(run_cli("verify", out, sizeof(out)), 2);
	fx_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_reopen),
		cmocka_unit_test(test_uncommitted_ignored),
		cmocka_unit_test(test_wrong_model_refused),
		cmocka_unit_test(test_flipped_byte),
		cmocka_unit_test(test_torn_refused),
		cmocka_unit_test(test_index_corruption_detected),
		cmocka_unit_test(test_tail_corruption_detected),
		cmocka_unit_test(test_stage_in_small_pool),
		cmocka_unit_test(test_buffered_mode),
		cmocka_unit_test(test_cli_verify_stat),
	};

	g_seed = test_rng_fresh_seed("test_store");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
