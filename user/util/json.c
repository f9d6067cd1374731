// SPDX-License-Identifier: MIT
/*
 * Strict JSON reading over jansson (json.h): jansson's parser with the flags
 * that refuse duplicate keys and "\u0000", the two checks it does not make
 * (a raw NUL byte, nesting deeper than kvmem allows), and its errors put as
 * "<name>:<line>:<column>: ..." with the column in bytes. Also the public
 * string writer, through jansson's encoder.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistr.h>

#include "kvmem/kvmem.h"
#include "util/json.h"

/* Line and byte column (both from 1) of text[at]. */
static void place(const char *text, size_t at, int *line, int *col)
{
	const char *p = text, *end = text + at, *start = text;
	int l = 1;

	while ((p = memchr(p, '\n', (size_t)(end - p)))) {
		l++;
		start = ++p;
	}
	*line = l;
	*col = (int)(end - start) + 1;
}

static int fail_at(const char *text, size_t at, const char *name, const char *what)
{
	int line, col;

	place(text, at, &line, &col);
	return kvmem_error(EBADMSG, "%s:%d:%d: %s", name, line, col, what);
}

/*
 * The first '[' or '{' that opens a level past KVMEM_JSON_MAX_DEPTH, or -1.
 * Exact on text jansson accepted (and on the prefix it got through before
 * its own, deeper limit): brackets inside strings are skipped.
 */
static ptrdiff_t too_deep(const char *text, size_t len)
{
	int depth = 0;

	for (size_t i = 0; i < len; i++) {
		switch (text[i]) {
		case '"':
			/* To the closing quote: one not escaped by an odd run of
			 * backslashes (memchr: strings are most of a tokenizer.json). */
			for (;;) {
				const char *q = memchr(text + i + 1, '"', len - i - 1);
				size_t bs = 0;

				if (!q)
					return -1;
				i = (size_t)(q - text);
				while (text[i - 1 - bs] == '\\')
					bs++;
				if (bs % 2 == 0)
					break;
			}
			break;
		case '[':
		case '{':
			if (++depth > KVMEM_JSON_MAX_DEPTH)
				return (ptrdiff_t)i;
			break;
		case ']':
		case '}':
			depth--;
			break;
		}
	}
	return -1;
}

/*
 * The string token that ends with the quote at text[end], as written (at
 * most 80 bytes of it), into buf: jansson names a token only when it is
 * short, and a refused key is worth naming whatever its length.
 */
static const char *token_at(const char *text, size_t end, char *buf, size_t cap)
{
	size_t start = end;

	while (start > 0) {
		size_t bs = 0;

		start--;
		while (bs < start && text[start - 1 - bs] == '\\')
			bs++;
		if (text[start] == '"' && bs % 2 == 0)
			break;
	}
	if (end - start + 1 > 80)
		snprintf(buf, cap, "%.76s...\"", text + start);
	else
		snprintf(buf, cap, "%.*s", (int)(end - start + 1), text + start);
	return buf;
}

/* jansson's error, placed at the byte where it was found, in kvmem's own
 * words where jansson's would name a flag ("without JSON_ALLOW_NUL"). */
static int parse_error(const char *text, size_t len, const char *name, const json_error_t *e)
{
	size_t at = e->position > 0 ? (size_t)e->position - 1 : 0;
	char what[sizeof(e->text) + 96], tok[96];
	ptrdiff_t deep;

	if (at >= len)
		at = len ? len - 1 : 0;
	switch (json_error_code(e)) {
	case json_error_out_of_memory:
		return kvmem_error(ENOMEM, "%s: out of memory parsing %zu bytes of JSON", name, len);
	case json_error_stack_overflow:
		/* Past jansson's own limit, so past ours: say where ours was crossed. */
		deep = too_deep(text, len);
		if (deep >= 0)
			at = (size_t)deep;
		snprintf(what, sizeof(what), "nesting deeper than %d levels", KVMEM_JSON_MAX_DEPTH);
		break;
	case json_error_invalid_utf8:
		at = (size_t)e->position < len ? (size_t)e->position : at;	/* the bad byte itself */
		snprintf(what, sizeof(what), "%s", e->text);
		break;
	case json_error_null_byte_in_key:
	case json_error_null_character:
		/* at is the string's closing quote */
		snprintf(what, sizeof(what), "a %s holds \"\\u0000\": %s",
			 json_error_code(e) == json_error_null_byte_in_key ? "key" : "string",
			 token_at(text, at, tok, sizeof(tok)));
		break;
	default:
		/* These two are found before the byte is taken: point at it. */
		if (!strncmp(e->text, "unexpected newline", 18) ||
		    !strncmp(e->text, "control character", 17))
			at = (size_t)e->position < len ? (size_t)e->position : at;
		snprintf(what, sizeof(what), "%s", e->text);
	}
	return fail_at(text, at, name, what);
}

int kvmem_json_load(const char *text, size_t len, const char *name, json_t **out)
{
	const char *nul;
	json_error_t e;
	ptrdiff_t deep;
	json_t *v;

	*out = NULL;
	if (!name)
		name = "json";
	if (!text) {
		text = "";
		len = 0;
	}
	/* No JSON text holds a raw NUL byte; jansson would take it for the end. */
	if ((nul = memchr(text, 0, len)))
		return fail_at(text, (size_t)(nul - text), name, "a NUL byte: not JSON text");
	v = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
	if (!v)
		return parse_error(text, len, name, &e);
	deep = too_deep(text, len);
	if (deep >= 0) {
		char what[64];

		json_decref(v);
		snprintf(what, sizeof(what), "nesting deeper than %d levels", KVMEM_JSON_MAX_DEPTH);
		return fail_at(text, (size_t)deep, name, what);
	}
	*out = v;
	return 0;
}

const char *kvmem_json_type_name(const json_t *v)
{
	if (!v)
		return "nothing";
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "object";
	case JSON_ARRAY: return "array";
	case JSON_STRING: return "string";
	case JSON_INTEGER:
	case JSON_REAL: return "number";
	case JSON_TRUE:
	case JSON_FALSE: return "boolean";
	case JSON_NULL: return "null";
	}
	return "nothing";
}

int kvmem_json_write_str(FILE *f, const char *s)
{
	size_t n = strlen(s);
	json_t *v;
	int rc;

	/* Checked first, so nothing is written of a string JSON cannot hold. */
	if (u8_check((const uint8_t *)s, n)) {
		errno = EILSEQ;
		return -EILSEQ;
	}
	v = json_stringn_nocheck(s, n);
	if (!v) {
		errno = ENOMEM;
		return -ENOMEM;
	}
	errno = 0;
	rc = json_dumpf(v, f, JSON_ENCODE_ANY);
	json_decref(v);
	if (rc) {
		if (!errno)
			errno = EIO;
		return -errno;
	}
	return 0;
}
