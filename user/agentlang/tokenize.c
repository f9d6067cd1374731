// SPDX-License-Identifier: MIT
/*
 * Text <-> ids for agentlang. Words are split at blanks; a newline is a token
 * of its own. In each word the longest start piece is taken, then the
 * longest glue pieces, so "api2.conf" is api + 2 + .conf and "5432" is
 * 54 + 32. The generator only makes splits this greedy rule finds again.
 */
#include <string.h>

#include "kvmem/kvmem.h"
#include "agentlang/lang.h"

#define LONGEST 23	/* longest piece, in bytes */

static int longest(const char *w, size_t n, int glue, size_t *len)
{
	char buf[LONGEST + 1];

	for (size_t l = n < LONGEST ? n : LONGEST; l > 0; l--) {
		memcpy(buf, w, l);
		buf[l] = 0;
		int id = agentlang_lookup(buf, glue);
		if (id >= 0) {
			*len = l;
			return id;
		}
	}
	return -1;
}

static int is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

int agentlang_encode(const char *text, int32_t *ids, size_t cap)
{
	size_t n = 0;
	const char *p = text;

	al_roles();
	while (*p) {
		if (is_blank(*p)) {
			p++;
			continue;
		}
		if (*p == '\n') {
			if (n >= cap)
				return kvmem_error(EINVAL, "agentlang: encode: more than %zu tokens", cap);
			ids[n++] = AGENTLANG_NL;
			p++;
			continue;
		}
		const char *e = p;
		while (*e && *e != '\n' && !is_blank(*e))
			e++;
		const char *w = p;
		int first = 1;
		while (w < e) {
			size_t len = 0;
			int id = longest(w, (size_t)(e - w), !first, &len);
			/* A word may begin with a glue piece where a view cut a
			 * line ("...\n.port = 80"). */
			if (id < 0 && first)
				id = longest(w, (size_t)(e - w), 1, &len);
			if (id < 0)
				return kvmem_error(EINVAL, "agentlang: encode: no piece for '%.*s' in word '%.*s'",
						 (int)(e - w), w, (int)(e - p), p);
			if (n >= cap)
				return kvmem_error(EINVAL, "agentlang: encode: more than %zu tokens", cap);
			ids[n++] = id;
			w += len;
			first = 0;
		}
		p = e;
	}
	return (int)n;
}

long agentlang_decode(const int32_t *ids, size_t n, char *buf, size_t cap)
{
	size_t len = 0;
	int line_start = 1;
	int size = agentlang_vocab_size();

	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= size)
			return kvmem_error(EINVAL, "agentlang: decode: id %d at %zu is not in the vocabulary",
					 (int)ids[i], i);
		const char *s = agentlang_piece(ids[i]);
		size_t sl = strlen(s);
		int space = !line_start && !agentlang_is_glue(ids[i]) && ids[i] != AGENTLANG_NL;

		if (space) {
			if (len + 1 < cap)
				buf[len] = ' ';
			len++;
		}
		for (size_t j = 0; j < sl; j++, len++)
			if (len + 1 < cap)
				buf[len] = s[j];
		line_start = ids[i] == AGENTLANG_NL;
	}
	if (cap)
		buf[len < cap ? len : cap - 1] = 0;
	return (long)len;
}
