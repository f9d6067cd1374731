/* SPDX-License-Identifier: MIT */
/*
 * Replays a fuzz target's committed inputs as a cmocka test, in make test
 * (plain and ASan/UBSan builds): every seed of tests/fuzz/corpus/<target>/
 * and every crash ever found, tests/fuzz/crashes/<target>/. Included by
 * tests/unit/test_fuzz_<target>.c after the target's source, with
 * FUZZ_TARGET its name. Run from the repository root (tests/run.sh does).
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

/* Every file of dir through the target; how many. */
static int replay_dir(const char *path_dir)
{
	struct dirent **names;
	int n = scandir(path_dir, &names, NULL, alphasort), done = 0;

	for (int i = 0; i < n; i++) {
		char path[4096];
		uint8_t *buf = NULL;
		size_t len = 0, cap = 0;
		FILE *f;

		if (names[i]->d_name[0] == '.' || !strcmp(names[i]->d_name, "README")) {
			free(names[i]);
			continue;
		}
		snprintf(path, sizeof(path), "%s/%s", path_dir, names[i]->d_name);
		free(names[i]);
		if (!(f = fopen(path, "rb")))
			fail_msg("%s: cannot open", path);
		for (;;) {
			if (len == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 4096)))
				fail_msg("out of memory");
			size_t r = fread(buf + len, 1, cap - len, f);

			if (!r)
				break;
			len += r;
		}
		fclose(f);
		LLVMFuzzerTestOneInput(buf, len);
		free(buf);
		done++;
	}
	free(n > 0 ? names : NULL);
	return done;
}

static void test_corpus(void **state)
{
	int n = replay_dir("tests/fuzz/corpus/" FUZZ_TARGET);

	print_message("%d seeds of %s replayed\n", n, FUZZ_TARGET);
	assert_true(n > 0);	/* the committed corpus is there */
}

static void test_crashes(void **state)
{
	print_message("%d crashes of %s replayed\n", replay_dir("tests/fuzz/crashes/" FUZZ_TARGET),
		      FUZZ_TARGET);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_corpus),
		cmocka_unit_test(test_crashes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
