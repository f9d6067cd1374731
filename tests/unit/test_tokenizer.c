// SPDX-License-Identifier: MIT
/*
 * The byte-level BPE tokenizer on a small tokenizer.json written here:
 * merges by rank (leftmost first among equals; a merge listed twice at
 * its later rank), the Split regex, added
 * tokens found only when asked, NFC, lossy decoding, the round trip on
 * random text, refusals; and the Qwen3 template's text for a few turns.
 * (tests/unit/test_tokenizer_ref.c holds it against Qwen3's real files.)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "kvmem/tokenizer.h"
#include "helpers/test_model.h"
#include "helpers/test_tmpdir.h"
#include "util/json.h"

static char dir[512];
static const char *merges[][2] = {
	{ "h", "e" }, { "l", "l" }, { "he", "ll" }, { "hell", "o" }, { "Ġ", "w" }, { "o", "r" },
	{ "Ġw", "or" }, { "Ġwor", "l" }, { "Ġworl", "d" }, { "a", "a" }, { "aa", "aa" },
};

/* GPT-2's byte alphabet, written out independently of the library's. */
static void byte_char(int b, char *out)
{
	int n = 0, cp = b;

	if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
		for (int x = 0; x < b; x++)
			n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
		out[2] = 0;
	}
}

static void json_str(FILE *f, const char *s)
{
	kvmem_json_write_str(f, s);
}

/* A tokenizer.json whose merges are mg[0, n) in that order (a merge may be
 * listed twice; its result joins the vocabulary once). */
static void write_bpe(const char *path, const char *model_type, const char *(*mg)[2], size_t n)
{
	FILE *f = fopen(path, "w");
	int id = 0;

	assert_non_null(f);
	fprintf(f, "{\"version\": \"1.0\", \"added_tokens\": ["
		   "{\"id\": 300, \"content\": \"<|im_start|>\", \"special\": true},"
		   "{\"id\": 301, \"content\": \"<|im_end|>\", \"special\": true},"
		   "{\"id\": 302, \"content\": \"<think>\", \"special\": false}],"
		   "\"normalizer\": {\"type\": \"NFC\"},"
		   "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
		   "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
		   " \"behavior\": \"Isolated\", \"invert\": false},"
		   "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
		   "\"model\": {\"type\": \"%s\", \"byte_fallback\": false, \"vocab\": {", model_type);
	for (int b = 0; b < 256; b++, id++) {
		char c[4];

		byte_char(b, c);
		fprintf(f, "%s", b ? ", " : "");
		json_str(f, c);
		fprintf(f, ": %d", id);
	}
	for (size_t i = 0; i < n; i++) {
		char both[32];
		size_t k = 0;

		while (k < i && (strcmp(mg[k][0], mg[i][0]) || strcmp(mg[k][1], mg[i][1])))
			k++;
		if (k < i)
			continue;
		snprintf(both, sizeof(both), "%s%s", mg[i][0], mg[i][1]);
		fprintf(f, ", ");
		json_str(f, both);
		fprintf(f, ": %d", id++);
	}
	fprintf(f, "}, \"merges\": [");
	for (size_t i = 0; i < n; i++) {
		/* Both spellings of a merge: "a b" and ["a", "b"]. */
		if (i % 2) {
			fprintf(f, "%s[", i ? ", " : "");
			json_str(f, mg[i][0]);
			fprintf(f, ", ");
			json_str(f, mg[i][1]);
			fprintf(f, "]");
		} else {
			char both[32];

			snprintf(both, sizeof(both), "%s %s", mg[i][0], mg[i][1]);
			fprintf(f, "%s", i ? ", " : "");
			json_str(f, both);
		}
	}
	fprintf(f, "]}}\n");
	fclose(f);
}

static void write_tokenizer(const char *path, const char *model_type)
{
	write_bpe(path, model_type, merges, sizeof(merges) / sizeof(merges[0]));
}

static int setup(void **state)
{
	char path[600];

	assert_int_equal(test_tmpdir_make(dir, sizeof(dir), "tokenizer"), 0);
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	write_tokenizer(path, "BPE");
	return 0;
}

static int teardown(void **state)
{
	test_tmpdir_remove(dir);
	return 0;
}

static kvmem_tokenizer *load(void)
{
	kvmem_tokenizer *t = NULL;

	if (kvmem_tokenizer_load(dir, &t))
		fail_msg("%s", kvmem_last_error());
	return t;
}

/* The pieces of text's encoding, joined with '|' (ids 0..255 as bytes). */
static void pieces(kvmem_tokenizer *t, const char *text, unsigned flags, char *out, size_t cap)
{
	kvmem_ids ids = { 0 };
	size_t n = 0;

	assert_int_equal(kvmem_tokenizer_encode(t, text, strlen(text), flags, &ids), 0);
	out[0] = 0;
	for (size_t i = 0; i < ids.n; i++) {
		char *s;
		size_t len;

		assert_int_equal(kvmem_tokenizer_decode(t, &ids.v[i], 1, 0, &s, &len), 0);
		n += (size_t)snprintf(out + n, cap - n, "%s%s", i ? "|" : "", s);
		free(s);
	}
	kvmem_ids_free(&ids);
}

static void test_merges(void **state)
{
	kvmem_tokenizer *t = load();
	char got[512];

	pieces(t, "hello", 0, got, sizeof(got));
	assert_string_equal(got, "hello");
	pieces(t, "hellhe", 0, got, sizeof(got));
	assert_string_equal(got, "hell|he");
	pieces(t, "hello world", 0, got, sizeof(got));
	assert_string_equal(got, "hello| world");
	/* aaaaa: a+a merges left to right, then aa+aa: "aaaa" then "a". */
	pieces(t, "aaaaa", 0, got, sizeof(got));
	assert_string_equal(got, "aaaa|a");
	/* Digits one at a time; punctuation runs; whitespace before a word. */
	pieces(t, "x 123!!\n\n  hello", 0, got, sizeof(got));
	assert_string_equal(got, "x| |1|2|3|!|!|\n|\n| | |hello");
	kvmem_tokenizer_free(t);
}

/*
 * A merge listed twice ranks where it is listed last, as Hugging Face's
 * tokenizers and transformers.js rank it (both keep the last rank a map is
 * given; transformers.js, run on these two files: "a|bc" and "ab|c"). Each
 * file's two ranks give different encodings of "abc".
 */
static void test_repeated_merge(void **state)
{
	static const char *ab_twice[][2] = { { "a", "b" }, { "b", "c" }, { "a", "b" } };
	static const char *bc_twice[][2] = { { "b", "c" }, { "a", "b" }, { "b", "c" } };
	char sub[600], path[700], got[64];
	kvmem_tokenizer *t = NULL;

	snprintf(sub, sizeof(sub), "%s/repeated", dir);
	assert_int_equal(mkdir(sub, 0755), 0);
	snprintf(path, sizeof(path), "%s/tokenizer.json", sub);
	/* "a b" at ranks 0 and 2: "b c" (rank 1) goes first. */
	write_bpe(path, "BPE", ab_twice, 3);
	assert_int_equal(kvmem_tokenizer_load(sub, &t), 0);
	pieces(t, "abc", 0, got, sizeof(got));
	assert_string_equal(got, "a|bc");
	kvmem_tokenizer_free(t);
	/* "b c" at ranks 0 and 2: "a b" (rank 1) goes first. */
	write_bpe(path, "BPE", bc_twice, 3);
	assert_int_equal(kvmem_tokenizer_load(sub, &t), 0);
	pieces(t, "abc", 0, got, sizeof(got));
	assert_string_equal(got, "ab|c");
	kvmem_tokenizer_free(t);
}

static void test_added(void **state)
{
	kvmem_tokenizer *t = load();
	kvmem_ids ids = { 0 };
	const char *s = "<|im_start|>hello<think><|im_end|>";
	char *back;
	size_t len;

	assert_int_equal(kvmem_tokenizer_encode(t, s, strlen(s), KVMEM_TOK_SPECIAL, &ids), 0);
	assert_int_equal(ids.n, 4);
	assert_int_equal(ids.v[0], 300);
	assert_int_equal(ids.v[2], 302);
	assert_int_equal(ids.v[3], 301);
	assert_int_equal(kvmem_tokenizer_decode(t, ids.v, ids.n, KVMEM_TOK_SKIP_SPECIAL, &back, &len), 0);
	assert_string_equal(back, "hello<think>");
	free(back);
	kvmem_ids_free(&ids);
	/* Without KVMEM_TOK_SPECIAL the markers are plain text. */
	assert_int_equal(kvmem_tokenizer_encode(t, s, strlen(s), 0, &ids), 0);
	for (size_t i = 0; i < ids.n; i++)
		assert_true(ids.v[i] < 300);
	kvmem_ids_free(&ids);
	assert_int_equal(kvmem_tokenizer_token_id(t, "<|im_end|>"), 301);
	assert_int_equal(kvmem_tokenizer_token_id(t, "hello"), 256 + 3);
	assert_int_equal(kvmem_tokenizer_token_id(t, "nope"), -1);
	assert_true(kvmem_tokenizer_has_chat(t));
	kvmem_tokenizer_free(t);
}

static void test_nfc_and_lossy(void **state)
{
	kvmem_tokenizer *t = load();
	kvmem_ids ids = { 0 };
	char *back;
	size_t len;
	/* e + combining acute is é after NFC. */
	const char *s = "e\xCC\x81";
	int32_t cut[1];

	assert_int_equal(kvmem_tokenizer_encode(t, s, strlen(s), 0, &ids), 0);
	assert_int_equal(kvmem_tokenizer_decode(t, ids.v, ids.n, 0, &back, &len), 0);
	assert_string_equal(back, "\xC3\xA9");
	free(back);
	/* The first byte of é alone is not UTF-8: U+FFFD. */
	cut[0] = ids.v[0];
	assert_int_equal(kvmem_tokenizer_decode(t, cut, 1, 0, &back, &len), 0);
	assert_string_equal(back, "\xEF\xBF\xBD");
	free(back);
	kvmem_ids_free(&ids);
	/* Invalid UTF-8 in, and ids out of range, are refused. */
	assert_int_equal(kvmem_tokenizer_encode(t, "a\xFF", 2, 0, &ids), -EINVAL);
	cut[0] = 303;
	assert_int_equal(kvmem_tokenizer_decode(t, cut, 1, 0, &back, &len), -EINVAL);
	kvmem_tokenizer_free(t);
}

/* Random text over an alphabet with every kind of piece: decode(encode(x))
 * gives x back (the alphabet is NFC-stable). */
static void test_round_trip(void **state)
{
	static const char *alpha[] = { "a", "h", "e", "l", "o", " ", "  ", "\n", "\t", "1", "!",
		"\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "<|im_end|>", "<think>", "'s", "'T" };
	uint64_t seed = test_rng_fresh_seed("test_tokenizer round trip");
	kvmem_tokenizer *t = load();

	for (int k = 0; k < 300; k++) {
		char text[2048];
		size_t n = 0;
		int len = test_rng_int(&seed, 0, 60);
		kvmem_ids ids = { 0 };
		char *back;
		size_t blen;

		for (int i = 0; i < len; i++)
			n += (size_t)snprintf(text + n, sizeof(text) - n, "%s",
					      alpha[test_rng_int(&seed, 0, 17)]);
		assert_int_equal(kvmem_tokenizer_encode(t, text, n, KVMEM_TOK_SPECIAL, &ids), 0);
		assert_int_equal(kvmem_tokenizer_decode(t, ids.v, ids.n, 0, &back, &blen), 0);
		assert_int_equal(blen, n);
		assert_memory_equal(back, text, n);
		free(back);
		kvmem_ids_free(&ids);
	}
	kvmem_tokenizer_free(t);
}

static void test_refusals(void **state)
{
	char other[600], path[700];
	kvmem_tokenizer *t = NULL;

	snprintf(other, sizeof(other), "%s/none", dir);
	assert_int_equal(kvmem_tokenizer_load(other, &t), -ENOENT);
	snprintf(path, sizeof(path), "%s/wp.json", dir);
	write_tokenizer(path, "WordPiece");
	assert_int_equal(kvmem_tokenizer_load_file(path, &t), -ENOTSUP);
	assert_non_null(strstr(kvmem_last_error(), "not BPE"));
	assert_null(t);
}

static void test_qwen3_text(void **state)
{
	kvmem_chat_msg m[4] = {
		{ .role = "system", .content = "S" },
		{ .role = "user", .content = "Q" },
		{ .role = "assistant", .content = "<think>\nr\n</think>\n\nA" },
		{ .role = "user", .content = "Q2" },
	};
	kvmem_chat_opts o = { .add_generation_prompt = 1, .thinking = 0 };
	char *text;
	size_t len;

	assert_int_equal(kvmem_chat_qwen3_text(m, 4, 0, &o, &text, &len), 0);
	/* The earlier turn's thinking is dropped, as the template does. */
	assert_string_equal(text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
			    "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
			    "<|im_start|>assistant\n<think>\n\n</think>\n\n");
	free(text);
	/* Only the new turn, as a conversation appends it. */
	assert_int_equal(kvmem_chat_qwen3_text(m, 4, 3, &o, &text, &len), 0);
	assert_string_equal(text, "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n"
			    "<think>\n\n</think>\n\n");
	free(text);
}

/*
 * A tool round trip: a query, an assistant turn with its reasoning and a
 * tool call, the tool's answer, the final answer. The expected texts are
 * what transformers' apply_chat_template writes with Qwen3's template
 * (jinja2 3.1.6 in its sandbox with trim_blocks, lstrip_blocks and its
 * tojson, the way chat_template_utils.py sets it up).
 */
static void test_qwen3_tool_turns(void **state)
{
	static const char *name[] = { "get_weather" }, *args[] = { "{\"city\": \"Oslo\"}" };
	/* The tool's answer sent as a user message: it is not the last query,
	 * so the reasoning of the turn that called the tool is kept. */
	kvmem_chat_msg a[5] = {
		{ .role = "system", .content = "S" },
		{ .role = "user", .content = "Weather in Oslo?" },
		{ .role = "assistant", .content = "", .reasoning = "Need the tool.", .call_names = name,
		  .call_args = args, .n_calls = 1 },
		{ .role = "user", .content = "<tool_response>\n{\"temp\": -3}\n</tool_response>" },
		{ .role = "assistant", .content = "It is -3.", .reasoning = "Cold." },
	};
	/* The same with a tool message, and content of a newline alone before
	 * the call: the template tests the content before it strips it. */
	kvmem_chat_msg b[4] = {
		{ .role = "user", .content = "Weather in Oslo?" },
		{ .role = "assistant", .content = "\n", .reasoning = "Need the tool.", .call_names = name,
		  .call_args = args, .n_calls = 1 },
		{ .role = "tool", .content = "{\"temp\": -3}" },
		{ .role = "assistant", .content = "It is -3.", .reasoning = "Cold." },
	};
	kvmem_chat_opts o = { .add_generation_prompt = 0, .thinking = -1 };
	char *text;
	size_t len;

	assert_int_equal(kvmem_chat_qwen3_text(a, 5, 0, &o, &text, &len), 0);
	assert_string_equal(text, "<|im_start|>system\nS<|im_end|>\n"
			    "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
			    "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n<tool_call>\n"
			    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
			    "</tool_call><|im_end|>\n"
			    "<|im_start|>user\n<tool_response>\n{\"temp\": -3}\n</tool_response><|im_end|>\n"
			    "<|im_start|>assistant\n<think>\nCold.\n</think>\n\nIt is -3.<|im_end|>\n");
	free(text);
	assert_int_equal(kvmem_chat_qwen3_text(b, 4, 0, &o, &text, &len), 0);
	assert_string_equal(text, "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
			    "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n\n<tool_call>\n"
			    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
			    "</tool_call><|im_end|>\n"
			    "<|im_start|>user\n<tool_response>\n{\"temp\": -3}\n</tool_response><|im_end|>\n"
			    "<|im_start|>assistant\n<think>\nCold.\n</think>\n\nIt is -3.<|im_end|>\n");
	free(text);
}

/* The bytes tokenizer (kvmem_tokenizer_bytes): random ids (all of a small
 * vocabulary's range, the printable ones and '<' among them) decode to a
 * text that encodes back to the same ids; a text's bytes are its ids, an
 * escape is one id, and an escape past the vocabulary, a torn one or a
 * bare "<|" stay text; an id outside the vocabulary and a vocabulary
 * below 256 are refused with a message. */
static void test_bytes(void **state)
{
	uint64_t seed = test_rng_fresh_seed("test_tokenizer bytes");
	kvmem_tokenizer *t = kvmem_tokenizer_bytes(300);
	kvmem_ids ids = { 0 };
	char *text;
	size_t len;

	(void)state;
	assert_non_null(t);
	assert_string_equal(kvmem_tokenizer_name(t), "bytes");
	assert_int_equal(kvmem_tokenizer_vocab(t), 300);
	assert_false(kvmem_tokenizer_has_chat(t));
	for (int round = 0; round < 200; round++) {
		int32_t want[64];
		int n = test_rng_int(&seed, 0, 64);

		for (int i = 0; i < n; i++)
			want[i] = test_rng_int(&seed, 0, 3) ? test_rng_int(&seed, 0x20, 0x7e)
							    : test_rng_int(&seed, 0, 299);
		assert_int_equal(kvmem_tokenizer_decode(t, want, (size_t)n, 0, &text, &len), 0);
		assert_int_equal(strlen(text), len);
		ids.n = 0;
		assert_int_equal(kvmem_tokenizer_encode(t, text, len, 0, &ids), 0);
		assert_int_equal(ids.n, (size_t)n);
		if (n)
			assert_memory_equal(ids.v, want, sizeof(int32_t) * (size_t)n);
		free(text);
	}
	{
		static const char in[] = "a<|7|>\xc3\xa9<|300|><|12<|>";
		static const int32_t want[] = { 'a', 7, 0xc3, 0xa9, '<', '|', '3', '0', '0', '|',
						'>', '<', '|', '1', '2', '<', '|', '>' };

		ids.n = 0;
		assert_int_equal(kvmem_tokenizer_encode(t, in, strlen(in), 0, &ids), 0);
		assert_int_equal(ids.n, sizeof(want) / sizeof(want[0]));
		assert_memory_equal(ids.v, want, sizeof(want));
		assert_int_equal(kvmem_tokenizer_decode(t, want, 4, 0, &text, NULL), 0);
		assert_string_equal(text, "a<|7|><|195|><|169|>");
		free(text);
	}
	{
		const int32_t bad[] = { 'x', 300 };

		assert_int_equal(kvmem_tokenizer_decode(t, bad, 2, 0, &text, &len), -EINVAL);
		assert_non_null(strstr(kvmem_last_error(), "id 300 is outside the vocabulary of 300"));
	}
	kvmem_ids_free(&ids);
	kvmem_tokenizer_free(t);
	assert_null(kvmem_tokenizer_bytes(255));
	assert_non_null(strstr(kvmem_last_error(), "at least 256"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_merges),
		cmocka_unit_test(test_repeated_merge),
		cmocka_unit_test(test_added),
		cmocka_unit_test(test_nfc_and_lossy),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_qwen3_text),
		cmocka_unit_test(test_qwen3_tool_turns),
		cmocka_unit_test(test_bytes),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
