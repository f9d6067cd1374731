// SPDX-License-Identifier: MIT
/*
 * Item 7 of issue 9, the session's side: the counters saved with a session
 * state (forwards, selections, forced, rebuilt and kept tokens) come from a
 * file and are not trusted. A state whose checksum holds but whose counters
 * are INT64_MAX (or negative) must not make the next forward pass overflow
 * a signed add: it is refused (-ESTALE, naming the counter), and the
 * session falls back to kvmem_session_adopt as for any refused state.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "session/inspect.h"
#include "pager_fixture.h"

static uint64_t g_seed;

/* The counters are the state's last 5 int64; the checksum (bytes 16..24)
 * covers everything after the 24-byte header. */
static void forge(uint8_t *state, size_t len, int which, int64_t v)
{
	uint64_t sum;

	memcpy(state + len - 40 + 8 * which, &v, 8);
	sum = XXH3_64bits(state + 24, len - 24);
	memcpy(state + 16, &sum, 8);
}

static void test_saved_counter_overflow_refused(void **state)
{
	static const char *const names[] = { "forwards", "selections", "forced", "rebuilt", "kept" };
	uint64_t rng = g_seed;
	kvmem_config c = test_model_config(2, 24, 4, 2, 8, 40, 53, 0);
	kvmem_model *m = test_model_random(&c, (uint64_t)test_rng_int(&rng, 1, 1 << 30));
	kvmem_backend *e = kvmem_backend_cpu(m, 32);
	kvmem_page_source src;
	kvmem_session_opts o;
	kvmem_session *s;
	int32_t tok[120], out[4], *ids;
	void *saved;
	size_t len;
	int64_t n;

	kvmem_session_opts_default(&o);
	o.block = 16;
	o.budget = 48;
	o.chunk = 16;
	for (int i = 0; i < 120; i++)
		tok[i] = test_rng_int(&rng, 0, c.vocab - 1);
	assert_int_equal(kvmem_page_source_mem(&src, c.n_layers, c.n_kv_heads, c.head_dim, o.block), 0);
	o.source = &src;
	s = kvmem_session_create(e, &o);
	assert_non_null(s);
	assert_int_equal(kvmem_session_append(s, tok, 120, 0), 0);
	assert_int_equal(kvmem_session_select(s), 0);
	assert_int_equal(kvmem_session_decode(s, 2, NULL, out), 0);
	n = kvmem_session_tokens(s);
	ids = malloc(sizeof(int32_t) * n);
	memcpy(ids, kvmem_session_token_ids(s), sizeof(int32_t) * n);
	assert_int_equal(kvmem_session_save_state(s, &saved, &len), 0);
	kvmem_session_free(s);

	for (int which = 0; which < 5; which++) {
		for (int sign = 0; sign < 2; sign++) {
			uint8_t *bad = malloc(len);
			kvmem_session_stats st;
			int rc;

			memcpy(bad, saved, len);
			forge(bad, len, which, sign ? -5 : INT64_MAX);
			s = kvmem_session_create(e, &o);
			assert_non_null(s);
			rc = kvmem_session_adopt_state(s, ids, n, bad, len);
			if (rc == 0) {
				/* Accepted: then the counters must go on without
				 * wrapping (saturated). */
				assert_int_equal(kvmem_session_decode(s, 2, NULL, out), 0);
				kvmem_session_get_stats(s, &st);
				assert_true(st.forwards >= 0 && st.selections >= 0 && st.forced >= 0 &&
					    st.rebuilt_tokens >= 0 && st.kept_tokens >= 0);
				fail_msg("a state with %s = %s was adopted", names[which],
					 sign ? "-5" : "INT64_MAX");
			}
			assert_int_equal(rc, -ESTALE);
			if (!strstr(kvmem_last_error(), names[which]))
				fail_msg("the refusal does not name %s: %s", names[which],
					 kvmem_last_error());
			/* The usual fallback works. */
			if (kvmem_session_adopt(s, ids, n) < 0)
				fail_msg("adopt after the refusal: %s", kvmem_last_error());
			assert_int_equal(kvmem_session_append(s, tok, 3, 0), 0);
			assert_int_equal(kvmem_session_decode(s, 1, NULL, out), 0);
			kvmem_session_free(s);
			free(bad);
		}
	}
	free(saved);
	free(ids);
	kvmem_page_source_destroy(&src);
	kvmem_backend_close(e);
	test_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_saved_counter_overflow_refused),
	};

	g_seed = test_rng_fresh_seed("test_state_counters");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
