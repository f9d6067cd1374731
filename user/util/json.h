/* SPDX-License-Identifier: MIT */
/*
 * Strict JSON reading over jansson (Debian's libjansson), the one JSON
 * library of kvmem: the library reads config.json, safetensors headers,
 * shard indexes, tokenizer.json and session scripts with it, kvmem serve
 * its requests. Callers walk the json_t tree with jansson's own calls; this
 * file adds only what every reader of untrusted files needs the same way:
 *
 *   json_t *doc;
 *   int rc = kvmem_json_load(text, len, "config.json", &doc);
 *   if (rc < 0)
 *           return rc;      // -EBADMSG, "config.json:3:14: ':' expected near '2'"
 *   json_int_t h = json_integer_value(json_object_get(doc, "hidden_size"));
 *   json_decref(doc);
 *
 * The rules, because the files come from other programs and a silently
 * misread size is worse than a refusal:
 *  - exactly one value (any type at the top), only whitespace around it;
 *    never reads past len (the text need not be NUL-terminated), and a raw
 *    NUL byte anywhere is an error;
 *  - strings are valid UTF-8 without raw control characters; \u escapes
 *    pair their surrogates; "\u0000" is refused in keys and in strings
 *    (C strings would stop there: "Qwen3ForCausalLM\u0000x" would pass for
 *    the architecture, a tensor "a\u0000b" for "a");
 *  - numbers follow the JSON grammar (no NaN or Infinity, no '+', leading
 *    zeros or hex); a real too large for a double is an error, and so is an
 *    integer outside int64 (json_int_t): it is never read as a nearby double;
 *  - an object may not repeat a key;
 *  - nesting deeper than KVMEM_JSON_MAX_DEPTH is an error.
 * Errors are "<name>:<line>:<column>: <what>", lines and columns from 1,
 * columns in bytes, at the end of the token where the text went wrong.
 *
 * Objects keep their members in document order (json_object_foreach).
 */
#ifndef KVMEM_UTIL_JSON_H
#define KVMEM_UTIL_JSON_H

#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#define KVMEM_JSON_MAX_DEPTH 64

/* Parse len bytes of text into *out (the caller json_decref()s it); name
 * (a file name) starts each message. 0, or -EBADMSG for text that is not
 * JSON or breaks a rule above, -ENOMEM; *out is then NULL. Files are read
 * with kvmem_mf_read() (model/modelfile.h: no FIFO blocks it). */
int kvmem_json_load(const char *text, size_t len, const char *name, json_t **out);

/* "null", "boolean", "number", "string", "array", "object"; "nothing" for
 * NULL (an absent member), for messages. */
const char *kvmem_json_type_name(const json_t *v);

/* Write s as a JSON string literal (quotes and escapes, by jansson) to f.
 * Returns 0, or -EILSEQ when s is not valid UTF-8 (nothing is written), or
 * the write error's -errno (errno set too). No message: the caller names
 * the file. */
int kvmem_json_write_str(FILE *f, const char *s);

#endif
