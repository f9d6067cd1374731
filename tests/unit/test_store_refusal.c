// SPDX-License-Identifier: MIT
/*
 * Issue 23: an open that is refused modifies no file of the workspace.
 * Every check an existing workspace can fail (another model or geometry,
 * a torn manifest, corrupt tokens or sums, a truncated file, another
 * writer, an unknown replacement policy) comes before DIR/lock is created
 * or written, before anything past the commit is cut, before a dead
 * writer's temporary files go and before the counters are saved. A writer
 * that opens and closes without writing changes nothing but the pid in
 * DIR/lock.
 *
 * "Nothing" is judged strictly: every entry of the directory (and the
 * directory itself) by name, type, inode, size, mtime, ctime and bytes. The
 * workspace is set up to show any change: bytes past the commit in every
 * data file, a dead writer's temporary files, a counters file, and a lock
 * that names another process (or no lock at all).
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager_fixture.h"
#include "kvmem/store.h"

static uint64_t g_seed;

static kvmem_pager *open_ws(const char *dir, const kvmem_page_geom *g, int flags)
{
	return fx_open(dir, g, 1 << 20, 256 << 10, flags, 1);
}

static int try_open(const char *dir, const kvmem_page_geom *g, const char *policy)
{
	kvmem_pager_opts o;
	kvmem_pager *p = NULL;
	int rc;

	kvmem_pager_opts_default(&o);
	o.host_cap = 1 << 20;
	o.stage_bytes = 256 << 10;
	if (policy)
		o.policy = policy;
	rc = kvmem_pager_open(dir, g, &o, &p);
	if (rc == 0)
		kvmem_pager_close(p);
	return rc;
}

/* One line per entry, sorted: name, type, inode, size, mtime, ctime,
 * bytes' hash; then the directory's own. Caller frees. */
static char *snapshot(const char *dir)
{
	struct dirent **list = NULL;
	int n = scandir(dir, &list, NULL, alphasort);
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	struct stat sb;

	assert_true(n > 0);
	assert_non_null(f);
	for (int i = 0; i < n; i++) {
		char path[4096];
		uint64_t h = 0;

		snprintf(path, sizeof(path), "%s/%s", dir, list[i]->d_name);
		if (strcmp(list[i]->d_name, ".") && strcmp(list[i]->d_name, "..") &&
		    lstat(path, &sb) == 0) {
			if (S_ISREG(sb.st_mode)) {
				FILE *in = fopen(path, "rb");
				XXH3_state_t *st = XXH3_createState();
				char buf[65536];
				size_t got;

				XXH3_64bits_reset(st);
				while (in && (got = fread(buf, 1, sizeof(buf), in)) > 0)
					XXH3_64bits_update(st, buf, got);
				if (in)
					fclose(in);
				h = XXH3_64bits_digest(st);
				XXH3_freeState(st);
			}
			fprintf(f, "%s %o ino %ju size %jd mtime %jd.%09ld ctime %jd.%09ld %016" PRIx64
				"\n", list[i]->d_name, (unsigned)(sb.st_mode & S_IFMT),
				(uintmax_t)sb.st_ino, (intmax_t)sb.st_size, (intmax_t)sb.st_mtim.tv_sec,
				sb.st_mtim.tv_nsec, (intmax_t)sb.st_ctim.tv_sec, sb.st_ctim.tv_nsec, h);
		}
		free(list[i]);
	}
	free(list);
	assert_int_equal(stat(dir, &sb), 0);
	fprintf(f, ". mtime %jd.%09ld ctime %jd.%09ld\n", (intmax_t)sb.st_mtim.tv_sec,
		sb.st_mtim.tv_nsec, (intmax_t)sb.st_ctim.tv_sec, sb.st_ctim.tv_nsec);
	fclose(f);
	/* A change made after this moment gets a later time stamp, even on a
	 * file system whose clock ticks coarsely. */
	nanosleep(&(struct timespec){ .tv_nsec = 20000000 }, NULL);
	return text;
}

static void add_bytes(const char *dir, const char *name, size_t n)
{
	char path[400];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "ab");
	assert_non_null(f);
	for (size_t i = 0; i < n; i++)
		fputc((int)(i * 37 + 11), f);
	assert_int_equal(fclose(f), 0);
}

/* A committed workspace as a killed writer leaves it: bytes past the
 * commit in every data file, its temporary files, a counters file, and a
 * lock naming it (or, with !lock, no lock file). */
static void make_ws(const char *dir, const kvmem_page_geom *g, uint64_t seed, int lock)
{
	static const char *const temps[] = { "manifest.tmp.99999.7", "stats.tmp.99999" };
	kvmem_pager *p = open_ws(dir, g, KVMEM_PAGER_CREATE);
	char path[400];

	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 3 * g->block_tokens + 5), 0);
	assert_int_equal(fx_commit(p, seed, "state", 6), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	add_bytes(dir, "pages", kvmem_page_stride(g) * g->n_layers);
	add_bytes(dir, "tokens", 4 * 9);
	add_bytes(dir, "index", g->index_bytes);
	add_bytes(dir, "sums", 8 * (g->n_layers + 1));
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, temps[i]);
		assert_int_equal(fx_write_file(path, "junk", 4), 0);
	}
	snprintf(path, sizeof(path), "%s/lock", dir);
	if (lock)
		assert_int_equal(fx_write_file(path, "99999\n", 6), 0);
	else
		assert_int_equal(unlink(path), 0);
}

static void flip_in(const char *dir, const char *name, uint64_t off)
{
	char path[400];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	assert_int_equal(fx_flip(path, off), 0);
}

enum refusal { WRONG_MODEL, WRONG_GEOMETRY, TORN_MANIFEST, BAD_TOKENS, BAD_SUMS, TRUNCATED,
	       UNKNOWN_POLICY, N_REFUSALS };
static const char *const refusal_name[] = { "another model", "another geometry",
					    "a torn manifest", "corrupt tokens", "corrupt sums",
					    "a truncated pages file", "an unknown policy" };

/* Each refusal, with and without a lock file: the open fails with its code
 * and the directory is as it was, to the inode and the nanosecond. */
static void test_refused_open_modifies_nothing(void **state)
{
	uint64_t rng = g_seed, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], path[400];

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	for (int lock = 0; lock < 2; lock++)
		for (int k = 0; k < N_REFUSALS; k++) {
			kvmem_page_geom other = g;
			const char *policy = NULL;
			char *before, *after;
			int want = -EBADMSG, rc;

			fx_rmtree(dir);
			make_ws(dir, &g, seed, lock);
			switch (k) {
			case WRONG_MODEL:
				other.fingerprint ^= 1ull << 40;
				want = -ESTALE;
				break;
			case WRONG_GEOMETRY:
				other.block_tokens *= 2;
				want = -ESTALE;
				break;
			case TORN_MANIFEST:
				flip_in(dir, "manifest", 40);
				break;
			case BAD_TOKENS:
				flip_in(dir, "tokens", 4 * 7 + 1);
				break;
			case BAD_SUMS:
				flip_in(dir, "sums", 8 * (g.n_layers + 1) + 3);
				break;
			case TRUNCATED:
				snprintf(path, sizeof(path), "%s/pages", dir);
				assert_int_equal(truncate(path, kvmem_page_stride(&g) * g.n_layers), 0);
				break;
			case UNKNOWN_POLICY:
				policy = "mru";
				want = -EINVAL;
				break;
			}
			before = snapshot(dir);
			rc = try_open(dir, &other, policy);
			print_message("%s, %s: %s\n", refusal_name[k], lock ? "lock" : "no lock",
				      kvmem_last_error());
			assert_int_equal(rc, want);
			after = snapshot(dir);
			if (strcmp(before, after)) {
				print_message("before:\n%safter:\n%s", before, after);
				fail_msg("refused for %s (%s), the directory changed", refusal_name[k],
					 lock ? "with a lock file" : "no lock file");
			}
			free(before);
			free(after);
		}
	fx_rmtree(dir);
}

/* A second writer is refused (-EBUSY naming the first) and changes
 * nothing; nor does a reader beside the writer. */
static void test_second_writer_modifies_nothing(void **state)
{
	uint64_t rng = g_seed ^ 1, seed = fx_mix(rng);
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], pid_s[32], *before, *after;
	kvmem_pager *first, *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	fx_rmtree(dir);
	make_ws(dir, &g, seed, 1);
	first = open_ws(dir, &g, 0);
	assert_non_null(first);
	before = snapshot(dir);
	assert_int_equal(try_open(dir, &g, NULL), -EBUSY);
	snprintf(pid_s, sizeof(pid_s), "process %d,", (int)getpid());
	assert_non_null(strstr(kvmem_last_error(), pid_s));
	p = open_ws(dir, NULL, KVMEM_PAGER_RDONLY);
	assert_non_null(p);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	after = snapshot(dir);
	assert_string_equal(before, after);
	free(before);
	free(after);
	assert_int_equal(kvmem_pager_close(first), 0);
	fx_rmtree(dir);
}

/* Remove the line that starts with `start` from a snapshot. */
static void drop_line(char *text, const char *start)
{
	char *line = strstr(text, start), *end;

	assert_true(line && (line == text || line[-1] == '\n'));
	end = strchr(line, '\n') + 1;
	memmove(line, end, strlen(end) + 1);
}

/* A writer that reads and closes without writing (a session that refused
 * the history it found) leaves every file as it was but lock, which names
 * it; its first write then cuts what lay past the commit and removes the
 * dead writer's temporary files. */
static void test_writer_that_writes_nothing(void **state)
{
	uint64_t rng = g_seed ^ 2, seed = fx_mix(rng), committed;
	kvmem_page_geom g = fx_geom(&rng);
	char dir[256], path[400], pid_s[32], *before, *after;
	struct stat sb;
	kvmem_pager *p;

	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	fx_rmtree(dir);
	make_ws(dir, &g, seed, 1);
	before = snapshot(dir);
	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	after = snapshot(dir);
	/* All but the lock's line agree (the directory's own line too: the
	 * lock is rewritten in place). */
	drop_line(before, "lock ");
	drop_line(after, "lock ");
	assert_string_equal(before, after);
	free(before);
	free(after);
	snprintf(pid_s, sizeof(pid_s), "%d\n", (int)getpid());
	snprintf(path, sizeof(path), "%s/lock", dir);
	{
		char buf[32] = { 0 };
		FILE *f = fopen(path, "r");

		assert_non_null(f);
		assert_true(fread(buf, 1, sizeof(buf) - 1, f) > 0);
		fclose(f);
		assert_string_equal(buf, pid_s);
	}

	p = open_ws(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 1), 0);
	committed = kvmem_pager_tokens(p);
	snprintf(path, sizeof(path), "%s/manifest.tmp.99999.7", dir);
	assert_int_equal(lstat(path, &sb), -1);
	snprintf(path, sizeof(path), "%s/stats.tmp.99999", dir);
	assert_int_equal(lstat(path, &sb), -1);
	snprintf(path, sizeof(path), "%s/sums", dir);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_size, 3 * 8 * (g.n_layers + 1));
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	snprintf(path, sizeof(path), "%s/tokens", dir);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_size, committed * 4);
	assert_int_equal(kvmem_workspace_verify(dir, stderr, 0), 0);
	fx_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_refused_open_modifies_nothing),
		cmocka_unit_test(test_second_writer_modifies_nothing),
		cmocka_unit_test(test_writer_that_writes_nothing),
	};

	g_seed = test_rng_fresh_seed("test_store_refusal");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
