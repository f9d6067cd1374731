// SPDX-License-Identifier: MIT
/*
 * Crash safety: a child process appends and stages out and commits; the
 * parent kills it with SIGKILL at a random moment, many times over the same
 * workspace. After each kill the workspace must reopen consistent: at least
 * every commit the child saw succeed, every committed token, page, index
 * record and partial block exactly as written, all checksums good.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager_fixture.h"
#include "kvmem/store.h"

#define KILLS 60
#define MAX_TOKENS 20000

static uint64_t g_seed;

static kvmem_pager *open_ws(const char *dir, const kvmem_page_geom *g)
{
	return fx_open(dir, g, 4 << 20, 1 << 20, KVMEM_PAGER_CREATE, 0);
}

/* The child: append random runs, commit after some, report each commit. */
static void child(const char *dir, const kvmem_page_geom *g, uint64_t seed, uint64_t rng, int fd)
{
	kvmem_pager *p = open_ws(dir, g);

	if (!p)
		_exit(2);
	while (kvmem_pager_tokens(p) < MAX_TOKENS) {
		uint64_t n;

		if (fx_append(p, seed, test_rng_int(&rng, 1, 4 * g->block_tokens)) < 0)
			_exit(3);
		if (test_rng_int(&rng, 0, 2))
			continue;
		if (fx_commit(p, seed, &(uint64_t){ kvmem_pager_tokens(p) }, 8) < 0)
			_exit(4);
		n = kvmem_pager_committed_tokens(p);
		if (write(fd, &n, sizeof(n)) != sizeof(n))
			_exit(5);
	}
	kvmem_pager_close(p);
	_exit(0);
}

/* Tokens, tail and the last `n` committed blocks' pages and index records. */
static int check_newest(kvmem_pager *p, uint64_t seed, uint64_t n)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	uint64_t blocks = kvmem_pager_blocks(p), tokens = kvmem_pager_tokens(p);
	size_t pb = kvmem_page_bytes(g);
	uint8_t *want = malloc(pb + g->index_bytes), *got = malloc(pb * g->n_layers + g->index_bytes);
	int32_t *tok = malloc((tokens + 1) * 4);
	void *layers[64];
	int bad = kvmem_pager_read_tokens(p, 0, tokens, tok) < 0;

	for (uint64_t i = 0; i < tokens && !bad; i++)
		bad += tok[i] != fx_token(seed, i);
	for (uint64_t b = blocks > n ? blocks - n : 0; b < blocks; b++) {
		fx_index(g, seed, b, want);
		bad += kvmem_pager_read_index(p, b, 1, got) < 0 || memcmp(want, got, g->index_bytes);
		for (uint32_t l = 0; l < g->n_layers; l++) {
			uint64_t pg = kvmem_page_id(g, b, l);
			const void *ptr;

			if (kvmem_pager_fetch(p, &pg, 1, &ptr) < 0) {
				bad++;
				continue;
			}
			fx_page(g, seed, pg, want);
			bad += memcmp(want, ptr, pb) != 0;
			kvmem_pager_release(p, &pg, 1);
		}
	}
	if (tokens % g->block_tokens) {
		for (uint32_t l = 0; l < g->n_layers; l++)
			layers[l] = got + l * pb;
		if (kvmem_pager_read_tail(p, layers, got + g->n_layers * pb) !=
		    (int)(tokens % g->block_tokens)) {
			bad++;
		} else {
			for (uint32_t l = 0; l < g->n_layers; l++) {
				fx_tail(g, seed, tokens, l, want);
				bad += memcmp(want, got + l * pb, pb) != 0;
			}
		}
	}
	free(want);
	free(got);
	free(tok);
	return bad;
}

static void test_kill9(void **state)
{
	uint64_t rng = g_seed, seed = fx_mix(g_seed + 77), seen = 0;
	kvmem_page_geom g = fx_geom(&rng);
	int kills = 0, finished = 0;
	char dir[256];

	/* Pages of 32 KiB so that writes take a while and kills land in them. */
	g.n_kv_heads = 1;
	g.head_dim = 64;
	g.block_tokens = 32;
	g.dtype = KVMEM_DTYPE_F32;
	g.index_bytes = g.n_layers * g.n_kv_heads * g.head_dim * 4;
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	strcat(dir, "/ws");
	for (int it = 0; it < KILLS && !finished; it++) {
		struct timespec ts = { 0, test_rng_int(&rng, 0, 100) * 1000000L };
		int fds[2], status;
		uint64_t n, before = seen, after;
		uint32_t len;
		kvmem_pager *p;
		pid_t pid;

		assert_int_equal(pipe(fds), 0);
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			close(fds[0]);
			child(dir, &g, seed, fx_mix(rng + it), fds[1]);
		}
		close(fds[1]);
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		if (WIFEXITED(status)) {
			assert_int_equal(WEXITSTATUS(status), 0);
			finished = 1;
		} else {
			kills++;
		}
		while (read(fds[0], &n, sizeof(n)) == sizeof(n)) {
			assert_true(n >= seen);
			seen = n;
		}
		close(fds[0]);

		/* Whatever was committed is there; nothing torn is used. */
		p = open_ws(dir, &g);
		assert_non_null(p);
		after = kvmem_pager_committed_tokens(p);
		assert_true(after >= seen);
		assert_true(after >= before);
		assert_int_equal(kvmem_pager_tokens(p), after);
		if (after) {
			const uint64_t *app = kvmem_pager_app_state(p, &len);

			assert_int_equal(len, 8);
			assert_int_equal(*app, after);
		}
		/* The newest data is where a tear would be; all of it now and then. */
		if (it % 10 == 9 || finished) {
			assert_int_equal(fx_check(p, seed, 1), 0);
			assert_int_equal(kvmem_pager_close(p), 0);
			assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
		} else {
			assert_int_equal(check_newest(p, seed, 4), 0);
			assert_int_equal(kvmem_pager_close(p), 0);
		}
		seen = after;
		/* A fast machine may finish the workload before enough kills
		 * landed: start again on a fresh workspace. */
		if (finished && kills < 10) {
			fx_rmtree(dir);
			finished = 0;
			seen = 0;
		}
	}
	print_message("%d kills, workspace at %" PRIu64 " committed tokens\n", kills, seen);
	assert_true(kills >= 10);
	*strrchr(dir, '/') = 0;
	fx_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill9),
	};

	g_seed = test_rng_fresh_seed("test_crash");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
