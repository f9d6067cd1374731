// SPDX-License-Identifier: MIT
/* The strict JSON reader: values, escapes, errors with line:column, bounds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "util/json.h"
#include "helpers/test_model.h"

static uint64_t rng_state;

static uint64_t rnd(void)
{
	return kvmem_rng_next(&rng_state);
}

/* Parse from an exact-size heap copy, so ASan sees any read past len. */
static kvmem_json *parse_exact(const char *text, size_t len)
{
	char *copy = malloc(len ? len : 1);
	kvmem_json *v;

	memcpy(copy, text, len);
	v = kvmem_json_parse(copy, len, "t.json");
	free(copy);	/* the tree owns copies of everything it needs */
	return v;
}

static kvmem_json *parse(const char *text)
{
	return parse_exact(text, strlen(text));
}

static void expect_error(const char *text, const char *want)
{
	kvmem_json *v = parse(text);

	if (v || !strstr(kvmem_last_error(), want))
		fail_msg("input <%s>: want error containing <%s>, got %s <%s>", text, want,
			 v ? "success" : "error", kvmem_last_error());
	kvmem_json_free(v);
}

static void test_values(void **state)
{
	kvmem_json *v = parse(" {\"a\": 1, \"b\": -2.5e3, \"c\": [true, false, null],\n"
			    "  \"d\": \"x\", \"e\": {}, \"f\": [], \"big\": 9223372036854775807,\n"
			    "  \"over\": 9223372036854775808, \"neg\": -9223372036854775808, \"z\": -0 }\t\n");

	assert_non_null(v);
	assert_int_equal(kvmem_json_typeof(v), KVMEM_JSON_OBJECT);
	assert_int_equal(kvmem_json_len(v), 10);
	assert_true(kvmem_json_is_int(kvmem_json_get(v, "a")));
	assert_int_equal(kvmem_json_int(kvmem_json_get(v, "a"), 0), 1);
	assert_false(kvmem_json_is_int(kvmem_json_get(v, "b")));
	assert_true(kvmem_json_num(kvmem_json_get(v, "b"), 0) == -2500.0);
	assert_int_equal(kvmem_json_int(kvmem_json_get(v, "b"), 77), 77);
	assert_int_equal(kvmem_json_len(kvmem_json_get(v, "c")), 3);
	assert_int_equal(kvmem_json_bool(kvmem_json_at(kvmem_json_get(v, "c"), 0), -1), 1);
	assert_int_equal(kvmem_json_bool(kvmem_json_at(kvmem_json_get(v, "c"), 1), -1), 0);
	assert_int_equal(kvmem_json_typeof(kvmem_json_at(kvmem_json_get(v, "c"), 2)), KVMEM_JSON_NULL);
	assert_null(kvmem_json_at(kvmem_json_get(v, "c"), 3));
	assert_string_equal(kvmem_json_str(kvmem_json_get(v, "d"), NULL), "x");
	assert_string_equal(kvmem_json_str(kvmem_json_get(v, "a"), "def"), "def");
	assert_int_equal(kvmem_json_typeof(kvmem_json_get(v, "e")), KVMEM_JSON_OBJECT);
	assert_int_equal(kvmem_json_len(kvmem_json_get(v, "f")), 0);
	assert_int_equal(kvmem_json_int(kvmem_json_get(v, "big"), 0), INT64_MAX);
	assert_false(kvmem_json_is_int(kvmem_json_get(v, "over")));
	assert_true(kvmem_json_num(kvmem_json_get(v, "over"), 0) == 9223372036854775808.0);
	assert_int_equal(kvmem_json_int(kvmem_json_get(v, "neg"), 0), INT64_MIN);
	assert_int_equal(kvmem_json_int(kvmem_json_get(v, "z"), 5), 0);
	assert_null(kvmem_json_get(v, "missing"));
	assert_null(kvmem_json_get(kvmem_json_get(v, "c"), "a"));	/* not an object */
	assert_string_equal(kvmem_json_key(v, 1), "b");
	assert_null(kvmem_json_key(v, 10));
	assert_string_equal(kvmem_json_type_name(kvmem_json_get(v, "c")), "array");
	assert_string_equal(kvmem_json_type_name(NULL), "nothing");
	/* positions of values, for messages about them */
	assert_int_equal(kvmem_json_line(kvmem_json_get(v, "d")), 2);
	assert_int_equal(kvmem_json_column(kvmem_json_get(v, "d")), 8);
	kvmem_json_free(v);

	/* scalars at the top level, and NULL-safety of every accessor */
	v = parse("42");
	assert_int_equal(kvmem_json_int(v, 0), 42);
	kvmem_json_free(v);
	assert_int_equal(kvmem_json_len(NULL), 0);
	assert_int_equal(kvmem_json_int(NULL, 3), 3);
	assert_true(kvmem_json_num(NULL, 1.5) == 1.5);
	kvmem_json_free(NULL);
}

static void test_strings(void **state)
{
	kvmem_json *v = parse("[\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\", \"\\u00e9\\u20AC\", \"\\ud83d\\ude00\","
			    " \"nul\\u0000byte\", \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"]");

	assert_non_null(v);
	assert_string_equal(kvmem_json_str(kvmem_json_at(v, 0), ""), "a\"b\\c/d\b\f\n\r\t");
	assert_string_equal(kvmem_json_str(kvmem_json_at(v, 1), ""), "\xc3\xa9\xe2\x82\xac");
	assert_string_equal(kvmem_json_str(kvmem_json_at(v, 2), ""), "\xf0\x9f\x98\x80");
	assert_int_equal(kvmem_json_str_len(kvmem_json_at(v, 3)), 8);
	assert_memory_equal(kvmem_json_str(kvmem_json_at(v, 3), ""), "nul\0byte", 9);
	assert_string_equal(kvmem_json_str(kvmem_json_at(v, 4), ""),
			    "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
	kvmem_json_free(v);
}

/* A key may hold "\u0000" too: kvmem_json_key stops there, kvmem_json_key_len
 * does not (the model loader refuses such names with it). */
static void test_key_with_nul(void **state)
{
	kvmem_json *v = parse("{\"a\\u0000b\": 1, \"plain\": 2}");

	assert_non_null(v);
	assert_string_equal(kvmem_json_key(v, 0), "a");
	assert_int_equal(kvmem_json_key_len(v, 0), 3);
	assert_memory_equal(kvmem_json_key(v, 0), "a\0b", 4);
	assert_int_equal(kvmem_json_key_len(v, 1), 5);
	assert_int_equal(kvmem_json_key_len(v, 2), 0);			/* out of range */
	assert_int_equal(kvmem_json_key_len(kvmem_json_at(v, 0), 0), 0);	/* not an object */
	assert_null(kvmem_json_get(v, "a"));		/* lookups compare every byte */
	kvmem_json_free(v);
}

static void test_errors(void **state)
{
	expect_error("", "t.json:1:1: expected a value");
	expect_error("   \n  ", "t.json:2:3: expected a value");
	expect_error("{\n  \"a\": 1,\n  \"b\" 2\n}", "t.json:3:7: expected ':' after key 'b'");
	expect_error("{\"a\": 1,}", "t.json:1:9: expected a string key but found '}'");
	expect_error("[1, 2,]", "expected a value");
	expect_error("[1 2]", "t.json:1:4: expected ',' or ']'");
	expect_error("{\"a\": 1 \"b\": 2}", "expected ',' or '}'");
	expect_error("{\"a\": 1} x", "t.json:1:10: unexpected 'x' after the value");
	expect_error("{\"a\": 1}}", "unexpected '}'");
	expect_error("\"abc", "unterminated string");
	expect_error("\"abc\\", "unterminated string");
	expect_error("\"a\nb\"", "raw control character 0x0a");
	expect_error("\"\\x\"", "invalid escape '\\x'");
	expect_error("\"\\u12g4\"", "expected 4 hex digits");
	expect_error("\"\\u12\"", "expected 4 hex digits");
	expect_error("\"\\ud83d\"", "high surrogate \\ud83d not followed");
	expect_error("\"\\ud83d\\u0041\"", "not followed by a low surrogate");
	expect_error("\"\\ude00\"", "lone low surrogate");
	expect_error("\"\xc0\x80\"", "invalid UTF-8");		/* overlong */
	expect_error("\"\xed\xa0\x80\"", "invalid UTF-8");	/* encoded surrogate */
	expect_error("\"\xf4\x90\x80\x80\"", "invalid UTF-8");	/* past U+10FFFF */
	expect_error("\"\xe2\x82\"", "invalid UTF-8");		/* cut short */
	expect_error("\"\x80\"", "invalid UTF-8");
	expect_error("012", "leading zeros");
	expect_error("-", "expected a digit");
	expect_error("1.", "expected a digit after '.'");
	expect_error("1.5e", "expected a digit in the exponent");
	expect_error("+1", "expected a value");
	expect_error("NaN", "expected a value");
	expect_error("0x10", "unexpected 'x'");
	expect_error("1e400", "out of range");
	expect_error("tru", "expected a value");
	expect_error("nul", "expected a value");
	expect_error("{\"k\": 1, \"j\": 2, \"k\": 3}", "t.json:1:23: duplicate key 'k' (first at 1:7)");
	expect_error("{1: 2}", "expected a string key but found '1'");
	expect_error("[\x01]", "found byte 0x01");
}

static void test_depth(void **state)
{
	char buf[2 * (KVMEM_JSON_MAX_DEPTH + 1) + 1];
	int d;
	kvmem_json *v;

	for (d = 0; d < KVMEM_JSON_MAX_DEPTH; d++) {
		buf[d] = '[';
		buf[2 * KVMEM_JSON_MAX_DEPTH - 1 - d] = ']';
	}
	v = parse_exact(buf, 2 * KVMEM_JSON_MAX_DEPTH);
	assert_non_null(v);
	kvmem_json_free(v);

	for (d = 0; d <= KVMEM_JSON_MAX_DEPTH; d++) {
		buf[d] = '[';
		buf[2 * KVMEM_JSON_MAX_DEPTH + 1 - d] = ']';
	}
	v = parse_exact(buf, 2 * KVMEM_JSON_MAX_DEPTH + 2);
	assert_null(v);
	assert_non_null(strstr(kvmem_last_error(), "nesting deeper than 64"));
}

/* A document with many random keys: every key found, absent keys not. */
static void test_large_object(void **state)
{
	enum { N = 2000 };
	char (*keys)[24] = malloc(N * sizeof(*keys));
	char *text;
	size_t len;
	FILE *f = open_memstream(&text, &len);
	kvmem_json *v;

	fputc('{', f);
	for (int i = 0; i < N; i++) {
		snprintf(keys[i], sizeof(keys[i]), "k%d_%llx", i, (unsigned long long)(rnd() >> 20));
		fprintf(f, "%s\"%s\": %d", i ? ", " : "", keys[i], i * 7 - 3);
	}
	fputc('}', f);
	fclose(f);
	v = parse_exact(text, len);
	assert_non_null(v);
	assert_int_equal(kvmem_json_len(v), N);
	for (int i = 0; i < N; i++) {
		assert_int_equal(kvmem_json_int(kvmem_json_get(v, keys[i]), -999), i * 7 - 3);
		assert_string_equal(kvmem_json_key(v, i), keys[i]);
	}
	assert_null(kvmem_json_get(v, "k"));
	assert_null(kvmem_json_get(v, "zzz"));
	kvmem_json_free(v);
	free(text);
	free(keys);
}

/* Every prefix of a valid document, and random byte changes: an answer or
 * an error, never a crash or a read past the end (ASan watches). */
static void test_truncation_and_mutation(void **state)
{
	const char *doc = "{\"name\": \"q\\u00e9n\\ud83d\\ude00\", \"shape\": [1, 2.5e-3, -7],\n"
			  " \"nested\": {\"t\": true, \"f\": false, \"n\": null}, \"s\": \"\\\"\"}";
	size_t len = strlen(doc);
	char *buf = malloc(len);
	kvmem_json *v;

	for (size_t n = 0; n < len; n++) {
		v = parse_exact(doc, n);
		assert_null(v);	/* no proper prefix of an object is a document */
		assert_non_null(strstr(kvmem_last_error(), "t.json:"));
	}
	v = parse_exact(doc, len);
	assert_non_null(v);
	kvmem_json_free(v);

	for (int round = 0; round < 20000; round++) {
		memcpy(buf, doc, len);
		for (int k = 0; k < 3; k++)
			buf[rnd() % len] = (char)rnd();
		v = parse_exact(buf, len);
		if (!v)
			assert_true(strlen(kvmem_last_error()) > 0);
		kvmem_json_free(v);
	}
	free(buf);
}

/* kvmem_json_write_str produces literals the parser reads back unchanged. */
static void test_write_roundtrip(void **state)
{
	for (int round = 0; round < 500; round++) {
		char s[64], *text;
		size_t n = 1 + rnd() % 60, len;
		FILE *f = open_memstream(&text, &len);
		kvmem_json *v;

		for (size_t i = 0; i < n; i++)
			s[i] = (char)(1 + rnd() % 127);	/* ASCII incl. controls */
		s[n] = 0;
		assert_int_equal(kvmem_json_write_str(f, s), 0);
		fclose(f);
		v = parse_exact(text, len);
		assert_non_null(v);
		assert_string_equal(kvmem_json_str(v, ""), s);
		kvmem_json_free(v);
		free(text);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_strings),
		cmocka_unit_test(test_key_with_nul),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_depth),
		cmocka_unit_test(test_large_object),
		cmocka_unit_test(test_truncation_and_mutation),
		cmocka_unit_test(test_write_roundtrip),
	};

	rng_state = test_rng_fresh_seed("test_json");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
