// SPDX-License-Identifier: MIT
/*
 * Strict JSON reading over jansson (user/util/json.h): what is read, what is
 * refused with which code and place (line:column in bytes), depth, bounds,
 * and the string writer read back.
 */
#include <errno.h>
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
static int load_exact(const char *text, size_t len, json_t **out)
{
	char *copy = malloc(len ? len : 1);
	int rc;

	memcpy(copy, text, len);
	rc = kvmem_json_load(copy, len, "t.json", out);
	free(copy);	/* the tree owns copies of everything it needs */
	return rc;
}

static json_t *load(const char *text)
{
	json_t *v;

	if (load_exact(text, strlen(text), &v))
		fail_msg("<%s>: %s", text, kvmem_last_error());
	return v;
}

/* Refused with -EBADMSG and a message holding want. */
static void expect_error_n(const char *text, size_t len, const char *want)
{
	json_t *v = (json_t *)1;
	int rc = load_exact(text, len, &v);

	if (rc != -EBADMSG || v || !strstr(kvmem_last_error(), want))
		fail_msg("input <%.*s>: want -EBADMSG and an error containing <%s>, got %d <%s>",
			 (int)len, text, want, rc, rc ? kvmem_last_error() : "");
	assert_int_equal(kvmem_last_errno(), EBADMSG);
}

static void expect_error(const char *text, const char *want)
{
	expect_error_n(text, strlen(text), want);
}

static void test_values(void **state)
{
	json_t *v = load(" {\"a\": 1, \"b\": -2.5e3, \"c\": [true, false, null],\n"
			 "  \"d\": \"x\", \"e\": {}, \"f\": [], \"big\": 9223372036854775807,\n"
			 "  \"neg\": -9223372036854775808, \"z\": -0, \"tiny\": 1e-400 }\t\n");
	static const char *const order[] = { "a", "b", "c", "d", "e", "f", "big", "neg", "z", "tiny" };
	const char *key;
	json_t *m;
	int i = 0;

	assert_true(json_is_object(v));
	assert_int_equal(json_object_size(v), 10);
	assert_true(json_is_integer(json_object_get(v, "a")));
	assert_int_equal(json_integer_value(json_object_get(v, "a")), 1);
	assert_true(json_is_real(json_object_get(v, "b")));
	assert_true(json_number_value(json_object_get(v, "b")) == -2500.0);
	assert_int_equal(json_array_size(json_object_get(v, "c")), 3);
	assert_true(json_is_true(json_array_get(json_object_get(v, "c"), 0)));
	assert_true(json_is_false(json_array_get(json_object_get(v, "c"), 1)));
	assert_true(json_is_null(json_array_get(json_object_get(v, "c"), 2)));
	assert_string_equal(json_string_value(json_object_get(v, "d")), "x");
	assert_int_equal(json_integer_value(json_object_get(v, "big")), INT64_MAX);
	assert_int_equal(json_integer_value(json_object_get(v, "neg")), INT64_MIN);
	assert_true(json_is_integer(json_object_get(v, "z")));
	assert_true(json_number_value(json_object_get(v, "tiny")) == 0.0);	/* underflow: 0 */
	/* document order, which messages that count entries rely on */
	json_object_foreach(v, key, m)
		assert_string_equal(key, order[i++]);
	assert_string_equal(kvmem_json_type_name(json_object_get(v, "c")), "array");
	assert_string_equal(kvmem_json_type_name(json_object_get(v, "a")), "number");
	assert_string_equal(kvmem_json_type_name(json_object_get(v, "b")), "number");
	assert_string_equal(kvmem_json_type_name(json_array_get(json_object_get(v, "c"), 1)), "boolean");
	assert_string_equal(kvmem_json_type_name(json_object_get(v, "missing")), "nothing");
	json_decref(v);

	/* any value at the top, not only objects and arrays */
	v = load("42");
	assert_int_equal(json_integer_value(v), 42);
	json_decref(v);
	v = load("\"s\"");
	assert_string_equal(json_string_value(v), "s");
	json_decref(v);
}

static void test_strings(void **state)
{
	json_t *v = load("[\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\", \"\\u00e9\\u20AC\", \"\\ud83d\\ude00\","
			 " \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"]");

	assert_string_equal(json_string_value(json_array_get(v, 0)), "a\"b\\c/d\b\f\n\r\t");
	assert_string_equal(json_string_value(json_array_get(v, 1)), "\xc3\xa9\xe2\x82\xac");
	assert_string_equal(json_string_value(json_array_get(v, 2)), "\xf0\x9f\x98\x80");
	assert_string_equal(json_string_value(json_array_get(v, 3)),
			    "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
	json_decref(v);
}

/*
 * "\u0000" and raw NUL bytes: C strings stop there, so a key "a\u0000b"
 * would be found as "a" and a value "Qwen3ForCausalLM\u0000x" would pass
 * for the architecture. Refused, in keys and values, with the place.
 */
static void test_nul(void **state)
{
	expect_error("{\"a\\u0000b\": 1, \"plain\": 2}", "t.json:1:11: a key holds \"\\u0000\": \"a\\u0000b\"");
	expect_error("{\"k\": \"nul\\u0000byte\"}", "t.json:1:21: a string holds \"\\u0000\"");
	expect_error("[\"x\",\n \"\\u0000\"]", "t.json:2:9: a string holds \"\\u0000\"");
	/* the key is named however long, cut at 80 bytes; escaped quotes are inside it */
	expect_error("{\"q\\\"\\\\\\u0000\": 1}", "a key holds \"\\u0000\": \"q\\\"\\\\\\u0000\"");
	expect_error("{\"a\": 1, \"0123456789012345678901234567890123456789012345678901234567890123456789"
		     "0123456789\\u0000\": 2}",
		     "t.json:1:97: a key holds \"\\u0000\": \"01234567890123456789012345678901234567890123"
		     "4567890123456789012345678901234...\"");
	expect_error_n("[1, 2]\0", 7, "t.json:1:7: a NUL byte: not JSON text");
	expect_error_n("{\"a\0\": 1}", 9, "t.json:1:4: a NUL byte");
	expect_error_n("\0", 1, "t.json:1:1: a NUL byte");
}

static void test_errors(void **state)
{
	expect_error("", "t.json:1:1: unexpected token near end of file");
	expect_error("   \n  ", "t.json:2:2: unexpected token near end of file");
	expect_error("{\n  \"a\": 1,\n  \"b\" 2\n}", "t.json:3:7: ':' expected near '2'");
	expect_error("{\"a\": 1,}", "t.json:1:9: string or '}' expected near '}'");
	expect_error("[1, 2,]", "t.json:1:7: unexpected token near ']'");
	expect_error("[1 2]", "t.json:1:4: ']' expected near '2'");
	expect_error("{\"a\": 1 \"b\": 2}", "'}' expected near '\"b\"'");
	expect_error("{\"a\": 1} x", "t.json:1:10: end of file expected near 'x'");
	expect_error("{\"a\": 1}}", "t.json:1:9: end of file expected near '}'");
	expect_error("\"abc", "premature end of input");
	expect_error("\"abc\\", "invalid escape");
	expect_error("\"a\nb\"", "t.json:1:3: unexpected newline");
	expect_error("\"a\tb\"", "control character 0x9");
	expect_error("\"\\x\"", "invalid escape near '\"\\x'");
	expect_error("\"\\u12g4\"", "invalid escape");
	expect_error("\"\\u12\"", "invalid escape");
	expect_error("\"\\ud83d\"", "invalid Unicode '\\uD83D'");
	expect_error("\"\\ud83d\\u0041\"", "invalid Unicode '\\uD83D\\u0041'");
	expect_error("\"\\ude00\"", "invalid Unicode '\\uDE00'");
	expect_error("\"\xc0\x80\"", "t.json:1:2: unable to decode byte 0xc0");	/* overlong */
	expect_error("\"\xed\xa0\x80\"", "unable to decode byte 0xed");		/* encoded surrogate */
	expect_error("\"\xf4\x90\x80\x80\"", "unable to decode byte 0xf4");	/* past U+10FFFF */
	expect_error("\"\xe2\x82\"", "unable to decode byte 0xe2");		/* cut short */
	expect_error("\"\x80\"", "unable to decode byte 0x80");
	expect_error("{\"\xc3\xa9\xc3\xa9\": 1, x}", "t.json:1:13: string or '}' expected near 'x'");
	expect_error("012", "invalid token near '0'");
	expect_error("-", "invalid token near '-'");
	expect_error("1.", "invalid token near '1.'");
	expect_error("1.5e", "invalid token near '1.5e'");
	expect_error("+1", "invalid token near '+'");
	expect_error("NaN", "invalid token near 'NaN'");
	expect_error("Infinity", "invalid token");
	expect_error("-Infinity", "invalid token");
	expect_error("0x10", "end of file expected near 'x'");
	expect_error("1e400", "real number overflow near '1e400'");
	expect_error("[1, -1e309]", "real number overflow");
	expect_error("tru", "invalid token near 'tru'");
	expect_error("nul", "invalid token near 'nul'");
	expect_error("{\"k\": 1, \"j\": 2, \"k\": 3}", "t.json:1:20: duplicate object key near '\"k\"'");
	expect_error("{\"o\": {\"k\": 1, \"k\": 1}}", "duplicate object key");
	expect_error("{1: 2}", "string or '}' expected near '1'");
	expect_error("[\x01]", "t.json:1:2: invalid token");
}

/* Integers past int64 are refused where they stand, never read as a nearby
 * double (a size of 2^63 would otherwise become 9.2e18, or a wrong int). */
static void test_big_integers(void **state)
{
	expect_error("{\"n\": 9223372036854775808}", "t.json:1:25: too big integer near '9223372036854775808'");
	expect_error("[-9223372036854775809]", "too big negative integer");
	expect_error("[1, 99999999999999999999999999999999999999999999999999999999999999999999999]",
		     "too big integer");
}

static void test_depth(void **state)
{
	enum { D = KVMEM_JSON_MAX_DEPTH, BIG = 3000 };
	char buf[2 * BIG + 16];
	json_t *v;
	int d;

	/* 64 levels around a string of brackets (which do not count) */
	for (d = 0; d < D; d++) {
		buf[d] = '[';
		buf[2 * D + 3 - d] = ']';
	}
	memcpy(buf + D, "\"[{\"", 4);
	assert_int_equal(load_exact(buf, 2 * D + 4, &v), 0);
	json_decref(v);

	/* 65 levels: refused at the 65th bracket */
	for (d = 0; d <= D; d++) {
		buf[d] = '[';
		buf[2 * D + 1 - d] = ']';
	}
	expect_error_n(buf, 2 * D + 2, "t.json:1:65: nesting deeper than 64 levels");

	/* past jansson's own limit (2048): the place is still ours */
	for (d = 0; d < BIG; d++) {
		buf[d] = '[';
		buf[2 * BIG - 1 - d] = ']';
	}
	expect_error_n(buf, 2 * BIG, "t.json:1:65: nesting deeper than 64 levels");
	/* nested objects count the same */
	{
		char *t = NULL;
		size_t len;
		FILE *f = open_memstream(&t, &len);

		for (d = 0; d <= D; d++)
			fputs("{\"a\":", f);
		fputs("1", f);
		for (d = 0; d <= D; d++)
			fputc('}', f);
		fclose(f);
		expect_error_n(t, len, "t.json:1:321: nesting deeper than 64 levels");
		free(t);
	}
}

/* A document with many random keys: every key found, absent keys not. */
static void test_large_object(void **state)
{
	enum { N = 2000 };
	char (*keys)[24] = malloc(N * sizeof(*keys));
	char *text;
	size_t len;
	FILE *f = open_memstream(&text, &len);
	const char *key;
	json_t *v, *m;
	int i = 0;

	fputc('{', f);
	for (i = 0; i < N; i++) {
		snprintf(keys[i], sizeof(keys[i]), "k%d_%llx", i, (unsigned long long)(rnd() >> 20));
		fprintf(f, "%s\"%s\": %d", i ? ", " : "", keys[i], i * 7 - 3);
	}
	fputc('}', f);
	fclose(f);
	assert_int_equal(load_exact(text, len, &v), 0);
	assert_int_equal(json_object_size(v), N);
	for (i = 0; i < N; i++)
		assert_int_equal(json_integer_value(json_object_get(v, keys[i])), i * 7 - 3);
	i = 0;
	json_object_foreach(v, key, m)
		assert_string_equal(key, keys[i++]);
	assert_null(json_object_get(v, "k"));
	assert_null(json_object_get(v, "zzz"));
	json_decref(v);
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
	json_t *v;

	for (size_t n = 0; n < len; n++) {
		assert_int_equal(load_exact(doc, n, &v), -EBADMSG);	/* no proper prefix is a document */
		assert_null(v);
		assert_non_null(strstr(kvmem_last_error(), "t.json:"));
	}
	assert_int_equal(load_exact(doc, len, &v), 0);
	json_decref(v);

	for (int round = 0; round < 20000; round++) {
		int rc;

		memcpy(buf, doc, len);
		for (int k = 0; k < 3; k++)
			buf[rnd() % len] = (char)rnd();
		rc = load_exact(buf, len, &v);
		if (rc) {
			assert_int_equal(rc, -EBADMSG);
			assert_non_null(strstr(kvmem_last_error(), "t.json:"));
		}
		json_decref(v);
	}
	free(buf);
}

/* kvmem_json_write_str produces literals the reader gives back unchanged;
 * a string that is not UTF-8 is refused and nothing is written. */
static void test_write_roundtrip(void **state)
{
	char *text;
	size_t len;
	FILE *f;

	for (int round = 0; round < 500; round++) {
		char s[64];
		size_t n = 1 + rnd() % 60;
		json_t *v;

		for (size_t i = 0; i < n; i++)
			s[i] = (char)(1 + rnd() % 127);	/* ASCII incl. controls */
		if (round % 5 == 0) {
			memcpy(s, "\xc3\xa9\xf0\x9f\x98\x80", 6);	/* and UTF-8 */
			n = n > 6 ? n : 6;
		}
		s[n] = 0;
		f = open_memstream(&text, &len);
		assert_int_equal(kvmem_json_write_str(f, s), 0);
		fclose(f);
		assert_int_equal(load_exact(text, len, &v), 0);
		assert_string_equal(json_string_value(v), s);
		json_decref(v);
		free(text);
	}
	f = open_memstream(&text, &len);
	assert_int_equal(kvmem_json_write_str(f, "ok \xc3("), -EILSEQ);
	assert_int_equal(errno, EILSEQ);
	fclose(f);
	assert_int_equal(len, 0);
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_strings),
		cmocka_unit_test(test_nul),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_big_integers),
		cmocka_unit_test(test_depth),
		cmocka_unit_test(test_large_object),
		cmocka_unit_test(test_truncation_and_mutation),
		cmocka_unit_test(test_write_roundtrip),
	};

	rng_state = test_rng_fresh_seed("test_json");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
