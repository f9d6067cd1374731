/* SPDX-License-Identifier: MIT */
/*
 * A small, strict JSON reader (RFC 8259) that builds a read-only tree.
 *
 *   kvm_json *doc = kvm_json_parse(text, len, "config.json");
 *   if (!doc)
 *           return -1;      // kvm_last_error(): "config.json:3:14: expected ..."
 *   int64_t h = kvm_json_int(kvm_json_get(doc, "hidden_size"), -1);
 *   kvm_json_free(doc);
 *
 * Strictness, because the files we read come from other programs and a
 * silently misread size is worse than a refusal:
 *  - exactly one value, surrounded only by whitespace; never reads past len
 *    (the text need not be NUL-terminated);
 *  - strings must be valid UTF-8 without raw control characters; escapes
 *    include \uXXXX with surrogate pairs (a lone surrogate is an error);
 *  - numbers follow the JSON grammar (no NaN, no leading '+' or zeros, no
 *    hex); a number too large for a double is an error;
 *  - an object may not repeat a key;
 *  - nesting deeper than KVM_JSON_MAX_DEPTH is an error (bounded stack).
 * Errors go to kvm_error() as "<name>:<line>:<column>: <what was expected or
 * wrong>", lines and columns counted from 1 (columns in bytes).
 *
 * Every node belongs to the document: one kvm_json_free() of the root frees
 * them all; pointers into a freed document dangle. The accessors accept NULL
 * and nodes of the wrong type, and then return "absent" (NULL, 0 or the given
 * default), so lookups chain without checks:
 *   kvm_json_str(kvm_json_at(kvm_json_get(doc, "architectures"), 0), "")
 */
#ifndef KVMEM_UTIL_JSON_H
#define KVMEM_UTIL_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVM_JSON_MAX_DEPTH 64

typedef enum kvm_json_type {
	KVM_JSON_NULL,
	KVM_JSON_BOOL,
	KVM_JSON_NUMBER,
	KVM_JSON_STRING,
	KVM_JSON_ARRAY,
	KVM_JSON_OBJECT,
} kvm_json_type;

typedef struct kvm_json kvm_json;

/* Parse len bytes of text; `name` (a file name) starts each error message.
 * Returns the root, or NULL with kvm_last_error() set. */
kvm_json *kvm_json_parse(const char *text, size_t len, const char *name);
/* Read a whole file and parse it (errors name the path). */
kvm_json *kvm_json_parse_file(const char *path);
/* Free a document given its root; NULL is fine. */
void kvm_json_free(kvm_json *root);

kvm_json_type kvm_json_typeof(const kvm_json *v);	/* NULL counts as KVM_JSON_NULL */
/* "null", "boolean", "number", "string", "array", "object"; "nothing" for NULL. */
const char *kvm_json_type_name(const kvm_json *v);
/* Where v began in the text (for messages about values, not syntax). */
int kvm_json_line(const kvm_json *v);
int kvm_json_column(const kvm_json *v);

/* ---- containers ---------------------------------------------------- */
/* Members of an object or items of an array; 0 for anything else. */
size_t kvm_json_len(const kvm_json *v);
/* The value under key (exact byte comparison), NULL if absent or not an
 * object. Logarithmic in the member count. */
const kvm_json *kvm_json_get(const kvm_json *obj, const char *key);
/* Item i of an array, or member i of an object in document order; NULL
 * when out of range. */
const kvm_json *kvm_json_at(const kvm_json *v, size_t i);
/* The key of member i of an object in document order; NULL otherwise. */
const char *kvm_json_key(const kvm_json *obj, size_t i);

/* ---- scalars --------------------------------------------------------- */
/* 1 if v is a number written as an integer (no fraction or exponent) that
 * fits int64_t. */
int kvm_json_is_int(const kvm_json *v);
/* The integer (if kvm_json_is_int), else def. */
int64_t kvm_json_int(const kvm_json *v, int64_t def);
/* Any number as a double (integers converted), else def. */
double kvm_json_num(const kvm_json *v, double def);
/* true -> 1, false -> 0, anything else -> def. */
int kvm_json_bool(const kvm_json *v, int def);
/* A string's UTF-8 bytes, NUL-terminated; def for anything else. A string
 * may hold "\u0000": kvm_json_str_len() gives the full length. */
const char *kvm_json_str(const kvm_json *v, const char *def);
size_t kvm_json_str_len(const kvm_json *v);

/* ---- writing --------------------------------------------------------- */
/* Write s as a JSON string literal (quotes and escapes) to f. Bytes >= 0x80
 * pass through as they are (the caller supplies UTF-8). Returns 0, or -1 on
 * a write error. */
int kvm_json_write_str(FILE *f, const char *s);

#endif
