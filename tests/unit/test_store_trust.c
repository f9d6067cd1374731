// SPDX-License-Identifier: MIT
/*
 * Storage you can trust (issue 9): what the store does with a directory a
 * careless or hostile user has touched. Each test is named after what it
 * checks: a missing manifest is refused, never reset; a second writer is
 * refused naming the holder while readers go on; symbolic links, FIFOs and
 * other files are never followed, opened in a blocking way or overwritten;
 * sizes in a forged manifest are checked before anything is allocated or
 * cut; counters saturate; error codes say what happened.
 */
#include <errno.h>
#include <fcntl.h>
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
#include "pager/faults.h"
#include "kvmem/store.h"

static uint64_t g_seed;
static int g_down = -1;		/* the pipe a child waits on; closed on failure */

static int close_pipe_teardown(void **state)
{
	if (g_down >= 0)
		close(g_down);
	g_down = -1;
	return 0;
}

/* A test that blocks (a FIFO opened for reading) is killed by SIGALRM and
 * counts as failed. */
#define HANG_LIMIT_S 60

static kvmem_pager *open_ws(const char *dir, const kvmem_page_geom *g, int flags)
{
	return fx_open(dir, g, 1 << 20, 256 << 10, flags, 1);
}

static int try_open(const char *dir, const kvmem_page_geom *g, int flags)
{
	kvmem_pager_opts o;
	kvmem_pager *p = NULL;
	int rc;

	kvmem_pager_opts_default(&o);
	o.host_cap = 1 << 20;
	o.stage_bytes = 256 << 10;
	o.flags = flags;
	rc = kvmem_pager_open(dir, g, &o, &p);
	if (rc == 0)
		kvmem_pager_close(p);
	return rc;
}

/* A workspace at dir (created) with `tokens` committed tokens. */
static void make_ws(const char *dir, const kvmem_page_geom *g, uint64_t seed, uint64_t tokens)
{
	kvmem_pager *p = open_ws(dir, g, KVMEM_PAGER_CREATE);

	if (!p)
		fail_msg("create %s: %s", dir, kvmem_last_error());
	assert_int_equal(fx_append(p, seed, tokens), 0);
	assert_int_equal(fx_commit(p, seed, "app", 4), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
}

static void path_of(char *buf, size_t len, const char *dir, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

static void assert_error_names(const char *what)
{
	if (!strstr(kvmem_last_error(), what))
		fail_msg("expected \"%s\" in: %s", what, kvmem_last_error());
}

/* Item 1: a directory holding workspace files without a readable manifest
 * is refused, with or without KVMEM_PAGER_CREATE, and nothing in it
 * changes: a deleted manifest, a symbolic link loop, a directory in its
 * place. */
static void test_missing_manifest_refused(void **state)
{
	uint64_t rng = g_seed ^ 0x101, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], path[400];
	uint64_t before;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	make_ws(dir, &g, seed, 390);
	path_of(path, sizeof(path), dir, "manifest");

	assert_int_equal(unlink(path), 0);
	before = fx_dir_digest(dir);
	assert_int_equal(try_open(dir, &g, KVMEM_PAGER_CREATE), -ENOENT);
	assert_error_names("manifest");
	assert_int_equal(kvmem_last_errno(), ENOENT);
	assert_int_equal(try_open(dir, &g, 0), -ENOENT);
	assert_int_equal(try_open(dir, NULL, KVMEM_PAGER_RDONLY), -ENOENT);
	assert_true(kvmem_workspace_verify(dir, stderr, 0) < 0);
	assert_int_equal(fx_dir_digest(dir), before);

	/* A link to itself: a loop. */
	assert_int_equal(symlink("manifest", path), 0);
	before = fx_dir_digest(dir);
	assert_int_equal(try_open(dir, &g, KVMEM_PAGER_CREATE), -EBADMSG);
	assert_error_names("/manifest");
	assert_error_names("symbolic link");
	assert_true(kvmem_workspace_verify(dir, stderr, 0) < 0);
	assert_int_equal(fx_dir_digest(dir), before);
	assert_int_equal(unlink(path), 0);

	/* A directory in its place. */
	assert_int_equal(mkdir(path, 0755), 0);
	before = fx_dir_digest(dir);
	assert_int_equal(try_open(dir, &g, KVMEM_PAGER_CREATE), -EBADMSG);
	assert_error_names("/manifest");
	assert_int_equal(fx_dir_digest(dir), before);
	fx_rmtree(dir);
}

/* Item 1, the other side: an empty directory, an absent one, and one left
 * by a creation cut short (empty data files, no manifest) become a new
 * workspace. */
static void test_empty_dir_created(void **state)
{
	uint64_t rng = g_seed ^ 0x102, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	static const char *const files[] = { "pages", "tokens", "index", "sums", "tail" };
	char dir[256], ws[300], path[400];
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	make_ws(dir, &g, seed, 50);	/* the empty directory itself */
	snprintf(ws, sizeof(ws), "%s/absent", dir);
	make_ws(ws, &g, seed, 20);
	p = open_ws(ws, &g, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_tokens(p), 20);
	kvmem_pager_close(p);

	snprintf(ws, sizeof(ws), "%s/cut", dir);
	assert_int_equal(mkdir(ws, 0755), 0);
	for (int i = 0; i < 5; i++) {
		path_of(path, sizeof(path), ws, files[i]);
		assert_int_equal(fx_write_file(path, "", 0), 0);
	}
	make_ws(ws, &g, seed, 33);
	p = open_ws(ws, &g, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_tokens(p), 33);
	assert_int_equal(fx_check(p, seed, 1), 0);
	kvmem_pager_close(p);
	fx_rmtree(dir);
}

/* Item 3: a directory that holds anything but a workspace is refused and
 * left as it was: a user's notes, a user's file that happens to be named
 * `tokens`. */
static void test_nonempty_dir_refused(void **state)
{
	uint64_t rng = g_seed ^ 0x103;
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], path[400];
	uint64_t before;
	int rc;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	path_of(path, sizeof(path), dir, "notes.txt");
	assert_int_equal(fx_write_file(path, "my notes\n", 9), 0);
	before = fx_dir_digest(dir);
	rc = try_open(dir, &g, KVMEM_PAGER_CREATE);
	assert_true(rc == -EEXIST || rc == -ENOENT);
	assert_error_names("notes.txt");
	assert_int_equal(fx_dir_digest(dir), before);
	assert_int_equal(unlink(path), 0);

	path_of(path, sizeof(path), dir, "tokens");
	assert_int_equal(fx_write_file(path, "precious data\n", 14), 0);
	before = fx_dir_digest(dir);
	rc = try_open(dir, &g, KVMEM_PAGER_CREATE);
	assert_true(rc == -EEXIST || rc == -ENOENT);
	assert_error_names("tokens");
	assert_int_equal(fx_dir_digest(dir), before);
	fx_rmtree(dir);
}

/* Item 3: symbolic links are never followed, neither when creating nor
 * when reopening: the files they point to keep every byte. */
static void test_symlinks_never_followed(void **state)
{
	uint64_t rng = g_seed ^ 0x104, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	static const char *const names[] = { "tokens", "index", "pages", "sums", "tail", "stats",
					     "manifest.tmp", "stats.tmp", "lock" };
	char top[256], dir[300], victim[400], path[400];
	uint64_t before, vbefore;
	int rc;

	assert_non_null(fx_tmpdir(top, sizeof(top)));
	snprintf(victim, sizeof(victim), "%s/victim", top);
	assert_int_equal(fx_write_file(victim, "a user's file, not ours\n", 24), 0);

	/* A new workspace in a directory holding a link: refused. */
	snprintf(dir, sizeof(dir), "%s/new", top);
	assert_int_equal(mkdir(dir, 0755), 0);
	path_of(path, sizeof(path), dir, "tokens");
	assert_int_equal(symlink(victim, path), 0);
	vbefore = fx_dir_digest(top);
	rc = try_open(dir, &g, KVMEM_PAGER_CREATE);
	assert_true(rc < 0);
	assert_error_names("tokens");
	assert_int_equal(fx_dir_digest(top), vbefore);
	assert_int_equal(unlink(path), 0);

	/* An existing workspace with one of its files replaced by a link:
	 * refused naming it, for writing and reading; the target intact. */
	snprintf(dir, sizeof(dir), "%s/ws", top);
	make_ws(dir, &g, seed, 5 * g.block_tokens + 3);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char saved[400];

		path_of(path, sizeof(path), dir, names[i]);
		snprintf(saved, sizeof(saved), "%s/saved", top);
		if (access(path, F_OK) == 0)
			assert_int_equal(rename(path, saved), 0);
		else
			saved[0] = 0;
		assert_int_equal(symlink(victim, path), 0);
		before = fx_dir_digest(top);
		rc = try_open(dir, &g, 0);
		if (i < 5 || i == 8) {
			/* Data files and the lock: refused, nothing touched. */
			if (rc >= 0)
				fail_msg("a link as %s was accepted", names[i]);
			assert_error_names(names[i]);
			assert_error_names("symbolic link");
			assert_int_equal(fx_dir_digest(top), before);
		}
		if (i < 5) {
			assert_true(try_open(dir, NULL, KVMEM_PAGER_RDONLY) < 0);
			assert_true(kvmem_workspace_verify(dir, stderr, 0) != 0);
		}
		/* Whatever happened, the target keeps every byte. */
		{
			char buf[64] = { 0 };
			FILE *f = fopen(victim, "rb");

			assert_non_null(f);
			assert_int_equal(fread(buf, 1, sizeof(buf), f), 24);
			fclose(f);
			assert_memory_equal(buf, "a user's file, not ours\n", 24);
		}
		if (unlink(path) < 0)
			assert_int_equal(errno, ENOENT);
		if (saved[0])
			assert_int_equal(rename(saved, path), 0);
	}
	/* Put back, the workspace is whole. */
	{
		kvmem_pager *p = open_ws(dir, &g, 0);

		assert_non_null(p);
		assert_int_equal(fx_check(p, seed, 1), 0);
		kvmem_pager_close(p);
	}
	fx_rmtree(top);
}

/* Items 3 and 6: a FIFO, a directory or a device where a workspace file
 * belongs is refused naming it, and nothing blocks: open (for writing and
 * reading), verify, the manifest reader and the counters reader all return
 * at once. */
static void test_fifo_does_not_hang(void **state)
{
	uint64_t rng = g_seed ^ 0x105, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	static const char *const names[] = { "stats", "manifest", "tokens", "pages", "index", "sums",
					     "tail", "lock" };
	char dir[256], path[400], saved[400];
	kvmem_workspace_info wi;
	kvmem_pager_stats st;

	alarm(HANG_LIMIT_S);
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	make_ws(dir, &g, seed, 3 * g.block_tokens + 1);
	snprintf(saved, sizeof(saved), "%s.saved", dir);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		for (int kind = 0; kind < 2; kind++) {
			int rc;

			path_of(path, sizeof(path), dir, names[i]);
			assert_int_equal(rename(path, saved), 0);
			if (kind == 0)
				assert_int_equal(mkfifo(path, 0644), 0);
			else
				assert_int_equal(mkdir(path, 0755), 0);
			if (i == 0) {
				/* The counters are advisory: reading them fails, the
				 * workspace still opens. */
				assert_true(kvmem_workspace_stats(dir, &st) < 0);
				assert_error_names("stats");
				assert_int_equal(try_open(dir, &g, 0), 0);
				assert_int_equal(try_open(dir, NULL, KVMEM_PAGER_RDONLY), 0);
				assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
			} else {
				rc = try_open(dir, &g, 0);
				if (rc >= 0)
					fail_msg("%s as %s was accepted", kind ? "a directory" : "a FIFO",
						 names[i]);
				assert_error_names(names[i]);
				if (i < 7) {
					assert_true(try_open(dir, NULL, KVMEM_PAGER_RDONLY) < 0);
					assert_true(kvmem_workspace_verify(dir, stderr, 0) != 0);
				}
				if (i == 1)
					assert_true(kvmem_workspace_info_read(dir, &wi) < 0);
			}
			if (kind == 0)
				assert_int_equal(unlink(path), 0);
			else
				assert_int_equal(rmdir(path), 0);
			assert_int_equal(rename(saved, path), 0);
		}
	}
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
	alarm(0);
	fx_rmtree(dir);
}

/* Item 2: one writer. A child process holds the workspace open for
 * writing: the parent's writable open is refused with EBUSY naming the
 * child's pid, while read-only opens, verify and stat go on; once the child
 * is gone the parent can write. Two writers in one process are refused too. */
static void test_second_writer_refused(void **state)
{
	uint64_t rng = g_seed ^ 0x106, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], pid_s[32];
	int up[2], down[2], status;
	kvmem_workspace_info wi;
	kvmem_pager *p, *q;
	pid_t pid;
	char c;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	make_ws(dir, &g, seed, 4 * g.block_tokens + 2);
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		kvmem_pager *w;

		close(up[0]);
		close(down[1]);
		w = open_ws(dir, &g, 0);
		c = w ? 'y' : 'n';
		if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1)
			_exit(3);
		kvmem_pager_close(w);
		_exit(w ? 0 : 2);
	}
	close(up[1]);
	close(down[0]);
	assert_int_equal(read(up[0], &c, 1), 1);
	assert_int_equal(c, 'y');
	/* Should an assertion below fail, the child sees its pipe close. */
	g_down = down[1];

	assert_int_equal(try_open(dir, &g, 0), -EBUSY);
	snprintf(pid_s, sizeof(pid_s), "%d", (int)pid);
	assert_error_names(pid_s);
	assert_error_names(dir);
	/* Creating over it is the same open. */
	assert_int_equal(try_open(dir, &g, KVMEM_PAGER_CREATE), -EBUSY);
	/* Readers are not disturbed. */
	p = open_ws(dir, NULL, KVMEM_PAGER_RDONLY);
	assert_non_null(p);
	assert_int_equal(fx_check(p, seed, 1), 0);
	kvmem_pager_close(p);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
	assert_int_equal(kvmem_workspace_info_read(dir, &wi), 0);

	assert_int_equal(write(down[1], "x", 1), 1);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	g_down = -1;
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	/* Within one process: the second open is refused as well. */
	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(try_open(dir, &g, 0), -EBUSY);
	snprintf(pid_s, sizeof(pid_s), "%d", (int)getpid());
	assert_error_names(pid_s);
	q = open_ws(dir, NULL, KVMEM_PAGER_RDONLY);
	assert_non_null(q);
	kvmem_pager_close(q);
	assert_int_equal(kvmem_pager_close(p), 0);
	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	kvmem_pager_close(p);
	close(up[0]);
	close(down[1]);
	g_down = -1;
	fx_rmtree(dir);
}

/* Item 2: a writer commits as fast as it can while readers verify the
 * workspace and read its manifest over and over: every reader sees a
 * whole commit, never a torn one. */
static void test_readers_never_see_torn_state(void **state)
{
	uint64_t rng = g_seed ^ 0x107, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256];
	int status, reads = 0, stop[2];
	uint64_t last = 0;
	FILE *null = fopen("/dev/null", "w");
	struct timespec t0, t;
	pid_t pid;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	g.n_layers = 2;
	make_ws(dir, &g, seed, g.block_tokens + 1);
	assert_int_equal(pipe(stop), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		kvmem_pager *w = open_ws(dir, &g, 0);
		uint64_t r = rng;
		char c;

		if (!w)
			_exit(2);
		close(stop[1]);
		fcntl(stop[0], F_SETFL, O_NONBLOCK);
		while (read(stop[0], &c, 1) < 0 && kvmem_pager_tokens(w) < 200000)
			if (fx_append(w, seed, test_rng_int(&r, 1, 2 * g.block_tokens)) < 0 ||
			    fx_commit(w, seed, NULL, 0) < 0)
				_exit(3);
		_exit(kvmem_pager_close(w) == 0 ? 0 : 4);
	}
	close(stop[0]);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		kvmem_workspace_info wi;
		long bad = kvmem_workspace_verify(dir, null, 0);

		if (bad != 0)
			fail_msg("verify beside a writer: %ld bad (%s)", bad, kvmem_last_error());
		assert_int_equal(kvmem_workspace_info_read(dir, &wi), 0);
		assert_true(wi.tokens >= last);
		last = wi.tokens;
		reads++;
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 1500);
	close(stop[1]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	print_message("%d verifies beside a writer, last at %" PRIu64 " tokens\n", reads, last);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
	fclose(null);
	fx_rmtree(dir);
}

/* Item 2: temporary files are never followed and a killed writer's are
 * cleaned: links planted under the names a writer uses for its temporary
 * files do not redirect its writes, and stale ones are gone after the
 * next writer's open; a reader leaves them. */
static void test_temp_files_not_followed_and_cleaned(void **state)
{
	uint64_t rng = g_seed ^ 0x108, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	static const char *const stale[] = { "manifest.tmp", "stats.tmp", "manifest.tmp.99999.7",
					     "stats.tmp.4242" };
	char top[256], dir[300], victim[400], path[400];
	uint64_t vdigest;
	kvmem_pager *p;
	struct stat sb;

	assert_non_null(fx_tmpdir(top, sizeof(top)));
	snprintf(dir, sizeof(dir), "%s/ws", top);
	snprintf(victim, sizeof(victim), "%s/victim", top);
	assert_int_equal(fx_write_file(victim, "not ours\n", 9), 0);
	make_ws(dir, &g, seed, 2 * g.block_tokens + 5);
	for (int i = 0; i < 4; i++) {
		path_of(path, sizeof(path), dir, stale[i]);
		if (i < 2)
			assert_int_equal(symlink(victim, path), 0);
		else
			assert_int_equal(fx_write_file(path, "junk", 4), 0);
	}
	/* A user's file that only looks like one stays. */
	path_of(path, sizeof(path), dir, "manifest.tmp.mine");
	assert_int_equal(fx_write_file(path, "mine", 4), 0);
	vdigest = fx_dir_digest(top);
	p = open_ws(dir, NULL, KVMEM_PAGER_RDONLY);
	assert_non_null(p);
	kvmem_pager_close(p);
	assert_int_equal(fx_dir_digest(top), vdigest);

	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, g.block_tokens + 1), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	for (int i = 0; i < 4; i++) {
		path_of(path, sizeof(path), dir, stale[i]);
		if (lstat(path, &sb) == 0)
			fail_msg("%s is still there", stale[i]);
	}
	assert_int_equal(stat(victim, &sb), 0);
	assert_int_equal(sb.st_size, 9);
	path_of(path, sizeof(path), dir, "manifest.tmp.mine");
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_size, 4);
	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(fx_check(p, seed, 1), 0);
	kvmem_pager_close(p);
	fx_rmtree(top);
}

/* Rewrite a manifest's u64 at `off` and fix its checksum: a forgery that
 * passes the manifest's own check. */
static void forge_manifest(const char *dir, size_t off, uint64_t val)
{
	char path[400];
	uint8_t buf[1 << 16];
	uint64_t sum;
	size_t len;
	FILE *f;

	path_of(path, sizeof(path), dir, "manifest");
	f = fopen(path, "rb");
	assert_non_null(f);
	len = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	assert_true(len > off + 8 && len < sizeof(buf));
	memcpy(buf + off, &val, 8);
	sum = XXH3_64bits(buf, len - 8);
	memcpy(buf + len - 8, &sum, 8);
	assert_int_equal(fx_write_file(path, buf, len), 0);
}

/* Item 7: a manifest forged to claim 2^40, 2^52 or 2^56 blocks (checksum
 * fixed up) is refused as corrupt before anything is allocated for it or
 * cut from a file: open (writable and read-only) and verify say so, and the
 * files keep every byte. (2^52 blocks of a 4096-multiple extent wrap a
 * 64-bit byte count to 0.) */
static void test_oversized_counts_refused(void **state)
{
	static const int shifts[] = { 40, 52, 56 };
	uint64_t rng = g_seed ^ 0x109, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], good[320], cmd[1200];

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(good, sizeof(good), "%s.good", dir);
	make_ws(dir, &g, seed, 6 * g.block_tokens + 3);
	snprintf(cmd, sizeof(cmd), "cp -a %s %s", dir, good);
	assert_int_equal(system(cmd), 0);
	for (int i = 0; i < 3; i++) {
		uint64_t blocks = 1ull << shifts[i], before;

		forge_manifest(dir, 80, blocks);
		forge_manifest(dir, 72, blocks * g.block_tokens + 3);
		before = fx_dir_digest(dir);
		assert_int_equal(try_open(dir, &g, 0), -EBADMSG);
		assert_int_equal(try_open(dir, NULL, KVMEM_PAGER_RDONLY), -EBADMSG);
		if (shifts[i] == 40) {
			/* Representable: every file is named truncated. */
			assert_true(kvmem_workspace_verify(dir, stderr, 0) >= 2);
		} else {
			/* No file can hold it: the manifest itself is refused. */
			assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), -EBADMSG);
			assert_error_names("more than any file can hold");
		}
		assert_int_equal(fx_dir_digest(dir), before);
		snprintf(cmd, sizeof(cmd), "rm -rf %s && cp -a %s %s", dir, good, dir);
		assert_int_equal(system(cmd), 0);
	}
	fx_rmtree(dir);
	fx_rmtree(good);
}

/* Item 7: counters saved in the workspace's `stats` file near 2^64
 * saturate when this session's counts are added, never wrap. */
static void test_saved_counters_saturate(void **state)
{
	uint64_t rng = g_seed ^ 0x10a, seed = fx_mix(rng), pg = 0;
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], path[400];
	kvmem_pager_stats st;
	const void *ptr;
	kvmem_pager *p;
	static const char text[] = "host_hits 18446744073709551615\nsteps 18446744073709551610\n"
				   "commits 99999999999999999999999\n";

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	make_ws(dir, &g, seed, 2 * g.block_tokens);
	path_of(path, sizeof(path), dir, "stats");
	assert_int_equal(fx_write_file(path, text, strlen(text)), 0);
	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(kvmem_pager_fetch(p, &pg, 1, &ptr), 0);
		kvmem_pager_release(p, &pg, 1);
	}
	for (int i = 0; i < 20; i++)
		kvmem_pager_step(p, i + 1);
	kvmem_pager_stats_total(p, &st);
	assert_true(st.host_hits == UINT64_MAX);
	assert_true(st.steps == UINT64_MAX);
	assert_true(st.commits == UINT64_MAX);
	assert_int_equal(fx_append(p, seed, 1), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(kvmem_workspace_stats(dir, &st), 0);
	assert_true(st.host_hits == UINT64_MAX);
	assert_true(st.commits == UINT64_MAX);
	fx_rmtree(dir);
}

/* Error codes say what happened: EBADMSG for a failed checksum or format
 * check, ESTALE for another model, geometry or format version, ENOENT for
 * no workspace, EIO for a failed read; kvmem_last_errno() agrees. */
static void test_error_codes(void **state)
{
	uint64_t rng = g_seed ^ 0x10b, seed = fx_mix(rng), pg;
	kvmem_page_geom g = fx_geom(&rng), other = g;
	char dir[256], path[400], copy[320], cmd[1200];
	const void *ptr;
	kvmem_pager *p;
	struct stat sb;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(copy, sizeof(copy), "%s.copy", dir);
	assert_int_equal(try_open(dir, &g, 0), -ENOENT);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), -ENOENT);
	make_ws(dir, &g, seed, 5 * g.block_tokens + 7);
	snprintf(cmd, sizeof(cmd), "cp -a %s %s", dir, copy);
	assert_int_equal(system(cmd), 0);

	other.fingerprint ^= 1ull << 33;
	assert_int_equal(try_open(dir, &other, 0), -ESTALE);
	assert_int_equal(kvmem_last_errno(), ESTALE);
	other = g;
	other.block_tokens *= 2;
	assert_int_equal(try_open(dir, &other, 0), -ESTALE);
	forge_manifest(dir, 8, 2 | (120ull << 32));	/* version 2 */
	assert_int_equal(try_open(dir, &g, 0), -ESTALE);
	assert_error_names("version 2");

	static const char *const files[] = { "manifest", "tokens", "sums" };
	for (int i = 0; i < 3; i++) {
		snprintf(cmd, sizeof(cmd), "rm -rf %s && cp -a %s %s", dir, copy, dir);
		assert_int_equal(system(cmd), 0);
		path_of(path, sizeof(path), dir, files[i]);
		assert_int_equal(stat(path, &sb), 0);
		assert_int_equal(fx_flip(path, test_rng_int(&rng, 0, sb.st_size - 1)), 0);
		assert_int_equal(try_open(dir, &g, 0), -EBADMSG);
		assert_int_equal(kvmem_last_errno(), EBADMSG);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s && cp -a %s %s", dir, copy, dir);
	assert_int_equal(system(cmd), 0);
	path_of(path, sizeof(path), dir, "pages");
	assert_int_equal(truncate(path, kvmem_page_stride(&g)), 0);
	assert_int_equal(try_open(dir, &g, 0), -EBADMSG);

	snprintf(cmd, sizeof(cmd), "rm -rf %s && cp -a %s %s", dir, copy, dir);
	assert_int_equal(system(cmd), 0);
	pg = test_rng_int(&rng, 0, 5 * g.n_layers - 1);
	assert_int_equal(fx_flip(path, pg * kvmem_page_stride(&g) + 3), 0);
	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(kvmem_pager_fetch(p, &pg, 1, &ptr), -EBADMSG);
	assert_int_equal(kvmem_last_errno(), EBADMSG);
	pg = (pg + 1) % (5 * g.n_layers);
	kvmem_pager_fault_inject(KVMEM_FAULT_READ, 1);
	assert_int_equal(kvmem_pager_fetch(p, &pg, 1, &ptr), -EIO);
	assert_int_equal(kvmem_last_errno(), EIO);
	kvmem_pager_close(p);
	fx_rmtree(dir);
	fx_rmtree(copy);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_missing_manifest_refused),
		cmocka_unit_test(test_empty_dir_created),
		cmocka_unit_test(test_nonempty_dir_refused),
		cmocka_unit_test(test_symlinks_never_followed),
		cmocka_unit_test(test_fifo_does_not_hang),
		cmocka_unit_test_teardown(test_second_writer_refused, close_pipe_teardown),
		cmocka_unit_test(test_readers_never_see_torn_state),
		cmocka_unit_test(test_temp_files_not_followed_and_cleaned),
		cmocka_unit_test(test_oversized_counts_refused),
		cmocka_unit_test(test_saved_counters_saturate),
		cmocka_unit_test(test_error_codes),
	};

	g_seed = test_rng_fresh_seed("test_store_trust");
	if (getenv("KVMEM_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KVMEM_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
