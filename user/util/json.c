// SPDX-License-Identifier: MIT
/*
 * A strict JSON reader: recursive descent over a length-bounded buffer into
 * a tree whose nodes, strings and arrays live in one arena per document.
 * See json.h for the rules it enforces.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "util/json.h"
#include "util/grow.h"

struct jkey {
	const char *s;
	size_t len;
};

struct kvmem_json {
	uint8_t type;
	uint8_t is_int;
	int line, col;
	union {
		int b;
		struct {
			int64_t i;
			double d;
		} num;
		struct jkey str;
		struct {
			size_t n;
			kvmem_json **items;
			struct jkey *keys;	/* objects: keys[i] names items[i] */
			uint32_t *sorted;	/* objects: member indices by key */
		} c;
	} u;
};

/* ---- arena ---------------------------------------------------------- */
struct chunk {
	struct chunk *next;
	size_t used, cap;
	_Alignas(16) unsigned char mem[];
};

struct doc {
	struct chunk *chunks;
	kvmem_json root;
};

static void *arena_alloc(struct doc *d, size_t n)
{
	struct chunk *c = d->chunks;

	n = (n + 15) & ~(size_t)15;
	if (!c || c->cap - c->used < n) {
		size_t cap = n > 65536 ? n : 65536;

		c = malloc(sizeof(*c) + cap);
		if (!c)
			return NULL;
		c->cap = cap;
		c->used = 0;
		c->next = d->chunks;
		d->chunks = c;
	}
	c->used += n;
	return c->mem + c->used - n;
}

static void doc_free(struct doc *d)
{
	while (d->chunks) {
		struct chunk *c = d->chunks;

		d->chunks = c->next;
		free(c);
	}
	free(d);
}

/* ---- parser state ---------------------------------------------------- */
struct entry {			/* a container member while its container is open */
	struct jkey key;
	kvmem_json *val;
};

struct parser {
	const char *p, *end, *start;
	const char *name;
	int line;
	const char *line_start;
	int depth;
	struct doc *doc;
	struct entry *stack;	/* members of every open container, innermost last */
	size_t top, cap;
	bool failed;
};

static int col_of(const struct parser *ps, const char *at)
{
	return (int)(at - ps->line_start) + 1;
}

/* Set the error once (the first problem found is the one reported). */
__attribute__((format(printf, 3, 4)))
static void fail_at(struct parser *ps, const char *at, const char *fmt, ...)
{
	char what[400];
	va_list ap;

	if (ps->failed)
		return;
	ps->failed = true;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	kvmem_error(EINVAL, "%s:%d:%d: %s", ps->name, ps->line, col_of(ps, at), what);
}

/* Describe the byte at p for "... but found X" messages. */
static const char *found(const struct parser *ps, const char *p, char *buf, size_t len)
{
	unsigned char ch;

	if (p >= ps->end)
		return "the end of the text";
	ch = (unsigned char)*p;
	if (ch >= 0x21 && ch < 0x7f)
		snprintf(buf, len, "'%c'", ch);
	else
		snprintf(buf, len, "byte 0x%02x", ch);
	return buf;
}

static void skip_ws(struct parser *ps)
{
	while (ps->p < ps->end) {
		char ch = *ps->p;

		if (ch == '\n') {
			ps->line++;
			ps->line_start = ps->p + 1;
		} else if (ch != ' ' && ch != '\t' && ch != '\r') {
			return;
		}
		ps->p++;
	}
}

static kvmem_json *new_node(struct parser *ps, int type, const char *at)
{
	kvmem_json *v = arena_alloc(ps->doc, sizeof(*v));

	if (!v) {
		fail_at(ps, at, "out of memory");
		return NULL;
	}
	memset(v, 0, sizeof(*v));
	v->type = type;
	v->line = ps->line;
	v->col = col_of(ps, at);
	return v;
}

static kvmem_json *parse_value(struct parser *ps);

/* ---- strings ---------------------------------------------------------- */
static int hex4(const char *p)
{
	int v = 0;

	for (int i = 0; i < 4; i++) {
		char ch = p[i];

		v <<= 4;
		if (ch >= '0' && ch <= '9')
			v |= ch - '0';
		else if (ch >= 'a' && ch <= 'f')
			v |= ch - 'a' + 10;
		else if (ch >= 'A' && ch <= 'F')
			v |= ch - 'A' + 10;
		else
			return -1;
	}
	return v;
}

static char *put_utf8(char *o, uint32_t cp)
{
	if (cp < 0x80) {
		*o++ = (char)cp;
	} else if (cp < 0x800) {
		*o++ = (char)(0xc0 | cp >> 6);
		*o++ = (char)(0x80 | (cp & 0x3f));
	} else if (cp < 0x10000) {
		*o++ = (char)(0xe0 | cp >> 12);
		*o++ = (char)(0x80 | (cp >> 6 & 0x3f));
		*o++ = (char)(0x80 | (cp & 0x3f));
	} else {
		*o++ = (char)(0xf0 | cp >> 18);
		*o++ = (char)(0x80 | (cp >> 12 & 0x3f));
		*o++ = (char)(0x80 | (cp >> 6 & 0x3f));
		*o++ = (char)(0x80 | (cp & 0x3f));
	}
	return o;
}

/* Length of the valid UTF-8 sequence at p (first byte >= 0x80), 0 if invalid.
 * Rejects overlong forms, surrogates and code points past U+10FFFF. */
static size_t utf8_seq(const unsigned char *p, const unsigned char *end)
{
	size_t n;
	uint32_t min, cp;

	if (p[0] >= 0xc2 && p[0] <= 0xdf) {
		n = 2; min = 0x80; cp = p[0] & 0x1f;
	} else if (p[0] >= 0xe0 && p[0] <= 0xef) {
		n = 3; min = 0x800; cp = p[0] & 0x0f;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		n = 4; min = 0x10000; cp = p[0] & 0x07;
	} else {
		return 0;
	}
	if ((size_t)(end - p) < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* Parse the string starting at the opening quote into the arena. */
static int parse_string(struct parser *ps, struct jkey *out)
{
	const char *q = ps->p + 1, *s;
	char *buf, *o;

	/* Find the closing quote first: the decoded text is never longer. */
	for (s = q; s < ps->end && *s != '"'; s++)
		if (*s == '\\' && ++s == ps->end)
			break;
	if (s >= ps->end) {
		fail_at(ps, ps->p, "unterminated string");
		return -1;
	}
	buf = arena_alloc(ps->doc, (size_t)(s - q) + 1);
	if (!buf) {
		fail_at(ps, ps->p, "out of memory");
		return -1;
	}
	o = buf;
	while (q < s) {
		unsigned char ch = (unsigned char)*q;

		if (ch < 0x20) {
			fail_at(ps, q, "raw control character 0x%02x in a string (write it as an escape)", ch);
			return -1;
		}
		if (ch >= 0x80) {
			size_t n = utf8_seq((const unsigned char *)q, (const unsigned char *)s);

			if (!n) {
				fail_at(ps, q, "invalid UTF-8 in a string");
				return -1;
			}
			memcpy(o, q, n);
			o += n;
			q += n;
			continue;
		}
		if (ch != '\\') {
			*o++ = (char)ch;
			q++;
			continue;
		}
		/* An escape; q + 1 < s holds since the scan skipped past it. */
		switch (q[1]) {
		case '"': *o++ = '"'; break;
		case '\\': *o++ = '\\'; break;
		case '/': *o++ = '/'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'u': {
			int hi = s - q >= 6 ? hex4(q + 2) : -1, lo;
			uint32_t cp;

			if (hi < 0) {
				fail_at(ps, q, "expected 4 hex digits after \\u");
				return -1;
			}
			cp = (uint32_t)hi;
			if (hi >= 0xdc00 && hi <= 0xdfff) {
				fail_at(ps, q, "lone low surrogate \\u%04x", hi);
				return -1;
			}
			if (hi >= 0xd800 && hi <= 0xdbff) {
				lo = (s - q >= 12 && q[6] == '\\' && q[7] == 'u') ? hex4(q + 8) : -1;
				if (lo < 0xdc00 || lo > 0xdfff) {
					fail_at(ps, q, "high surrogate \\u%04x not followed by a low surrogate", hi);
					return -1;
				}
				cp = 0x10000 + (((uint32_t)hi - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
				q += 6;
			}
			o = put_utf8(o, cp);
			q += 6;
			continue;
		}
		default:
			if ((unsigned char)q[1] >= 0x21 && (unsigned char)q[1] < 0x7f)
				fail_at(ps, q, "invalid escape '\\%c'", q[1]);
			else
				fail_at(ps, q, "invalid escape (byte 0x%02x after '\\')", (unsigned char)q[1]);
			return -1;
		}
		q += 2;
	}
	*o = 0;
	out->s = buf;
	out->len = (size_t)(o - buf);
	ps->p = s + 1;
	return 0;
}

/* ---- numbers ---------------------------------------------------------- */
static bool is_digit(const struct parser *ps, const char *p)
{
	return p < ps->end && *p >= '0' && *p <= '9';
}

static kvmem_json *parse_number(struct parser *ps)
{
	const char *b = ps->p, *p = b;
	bool integral = true;
	char small[64], *txt;
	size_t n;
	kvmem_json *v;
	char tmp[16];

	if (p < ps->end && *p == '-')
		p++;
	if (!is_digit(ps, p)) {
		fail_at(ps, p, "expected a digit but found %s", found(ps, p, tmp, sizeof(tmp)));
		return NULL;
	}
	if (*p == '0') {
		p++;
		if (is_digit(ps, p)) {
			fail_at(ps, b, "numbers may not have leading zeros");
			return NULL;
		}
	} else {
		while (is_digit(ps, p))
			p++;
	}
	if (p < ps->end && *p == '.') {
		integral = false;
		p++;
		if (!is_digit(ps, p)) {
			fail_at(ps, p, "expected a digit after '.' but found %s",
				found(ps, p, tmp, sizeof(tmp)));
			return NULL;
		}
		while (is_digit(ps, p))
			p++;
	}
	if (p < ps->end && (*p == 'e' || *p == 'E')) {
		integral = false;
		p++;
		if (p < ps->end && (*p == '+' || *p == '-'))
			p++;
		if (!is_digit(ps, p)) {
			fail_at(ps, p, "expected a digit in the exponent but found %s",
				found(ps, p, tmp, sizeof(tmp)));
			return NULL;
		}
		while (is_digit(ps, p))
			p++;
	}
	/* strtod needs a terminated copy; the text itself may not be. */
	n = (size_t)(p - b);
	txt = n < sizeof(small) ? small : malloc(n + 1);
	if (!txt) {
		fail_at(ps, b, "out of memory");
		return NULL;
	}
	memcpy(txt, b, n);
	txt[n] = 0;
	v = new_node(ps, KVMEM_JSON_NUMBER, b);
	if (v) {
		errno = 0;
		v->u.num.d = strtod(txt, NULL);
		if (errno == ERANGE && (v->u.num.d > 1 || v->u.num.d < -1)) {
			fail_at(ps, b, "number %.40s%s is out of range", txt, n > 40 ? "..." : "");
			v = NULL;
		} else if (integral) {
			errno = 0;
			v->u.num.i = strtoll(txt, NULL, 10);
			v->is_int = errno != ERANGE;
		}
	}
	if (txt != small)
		free(txt);
	ps->p = p;
	return v;
}

/* ---- containers -------------------------------------------------------- */
static int push(struct parser *ps, struct jkey key, kvmem_json *val)
{
	if (kvmem_grow(&ps->stack, sizeof(*ps->stack), ps->top + 1, &ps->cap, 64)) {
		fail_at(ps, ps->p, "out of memory");
		return -1;
	}
	ps->stack[ps->top].key = key;
	ps->stack[ps->top].val = val;
	ps->top++;
	return 0;
}

static int key_cmp(const struct jkey *a, const struct jkey *b)
{
	size_t n = a->len < b->len ? a->len : b->len;
	int c = memcmp(a->s, b->s, n);

	if (c)
		return c;
	return (a->len > b->len) - (a->len < b->len);
}

static int sorted_cmp(const void *a, const void *b, void *arg)
{
	const struct jkey *keys = arg;
	uint32_t ia = *(const uint32_t *)a, ib = *(const uint32_t *)b;
	int c = key_cmp(&keys[ia], &keys[ib]);

	/* Equal keys stay in document order so the later one is reported. */
	return c ? c : (ia > ib) - (ia < ib);
}

/* Move the members above `base` on the stack into container v. */
static int close_container(struct parser *ps, kvmem_json *v, size_t base, bool object)
{
	size_t n = ps->top - base;

	if (n > UINT32_MAX) {
		fail_at(ps, ps->p, "too many members");
		return -1;
	}
	v->u.c.n = n;
	ps->top = base;
	if (!n)
		return 0;
	v->u.c.items = arena_alloc(ps->doc, n * sizeof(kvmem_json *));
	if (object) {
		v->u.c.keys = arena_alloc(ps->doc, n * sizeof(struct jkey));
		v->u.c.sorted = arena_alloc(ps->doc, n * sizeof(uint32_t));
	}
	if (!v->u.c.items || (object && (!v->u.c.keys || !v->u.c.sorted))) {
		fail_at(ps, ps->p, "out of memory");
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		v->u.c.items[i] = ps->stack[base + i].val;
		if (object) {
			v->u.c.keys[i] = ps->stack[base + i].key;
			v->u.c.sorted[i] = (uint32_t)i;
		}
	}
	if (!object)
		return 0;
	qsort_r(v->u.c.sorted, n, sizeof(uint32_t), sorted_cmp, v->u.c.keys);
	for (size_t i = 1; i < n; i++) {
		uint32_t a = v->u.c.sorted[i - 1], b = v->u.c.sorted[i];

		if (!key_cmp(&v->u.c.keys[a], &v->u.c.keys[b])) {
			const kvmem_json *dup = v->u.c.items[b];

			/* Report at the second occurrence, which we know by its value. */
			if (!ps->failed) {
				ps->failed = true;
				kvmem_error(EINVAL, "%s:%d:%d: duplicate key '%.100s' (first at %d:%d)", ps->name,
					  dup->line, dup->col, v->u.c.keys[b].s,
					  v->u.c.items[a]->line, v->u.c.items[a]->col);
			}
			return -1;
		}
	}
	return 0;
}

static kvmem_json *parse_array(struct parser *ps)
{
	kvmem_json *v = new_node(ps, KVMEM_JSON_ARRAY, ps->p);
	size_t base = ps->top;
	char tmp[16];

	if (!v)
		return NULL;
	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == ']') {
		ps->p++;
		return v;
	}
	for (;;) {
		kvmem_json *item = parse_value(ps);

		if (!item || push(ps, (struct jkey){ 0 }, item))
			return NULL;
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == ',') {
			ps->p++;
			continue;
		}
		if (ps->p < ps->end && *ps->p == ']') {
			ps->p++;
			break;
		}
		fail_at(ps, ps->p, "expected ',' or ']' in an array but found %s",
			found(ps, ps->p, tmp, sizeof(tmp)));
		return NULL;
	}
	return close_container(ps, v, base, false) ? NULL : v;
}

static kvmem_json *parse_object(struct parser *ps)
{
	kvmem_json *v = new_node(ps, KVMEM_JSON_OBJECT, ps->p);
	size_t base = ps->top;
	char tmp[16];

	if (!v)
		return NULL;
	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '}') {
		ps->p++;
		return v;
	}
	for (;;) {
		struct jkey key;
		kvmem_json *val;

		if (ps->p >= ps->end || *ps->p != '"') {
			fail_at(ps, ps->p, "expected a string key but found %s",
				found(ps, ps->p, tmp, sizeof(tmp)));
			return NULL;
		}
		if (parse_string(ps, &key))
			return NULL;
		skip_ws(ps);
		if (ps->p >= ps->end || *ps->p != ':') {
			fail_at(ps, ps->p, "expected ':' after key '%.100s' but found %s", key.s,
				found(ps, ps->p, tmp, sizeof(tmp)));
			return NULL;
		}
		ps->p++;
		val = parse_value(ps);
		if (!val || push(ps, key, val))
			return NULL;
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == ',') {
			ps->p++;
			skip_ws(ps);
			continue;
		}
		if (ps->p < ps->end && *ps->p == '}') {
			ps->p++;
			break;
		}
		fail_at(ps, ps->p, "expected ',' or '}' in an object but found %s",
			found(ps, ps->p, tmp, sizeof(tmp)));
		return NULL;
	}
	return close_container(ps, v, base, true) ? NULL : v;
}

static bool literal(struct parser *ps, const char *word)
{
	size_t n = strlen(word);

	if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n))
		return false;
	ps->p += n;
	return true;
}

static kvmem_json *parse_value(struct parser *ps)
{
	const char *at;
	kvmem_json *v = NULL;
	char tmp[16];

	skip_ws(ps);
	at = ps->p;
	if (at >= ps->end) {
		fail_at(ps, at, "expected a value but found the end of the text");
		return NULL;
	}
	switch (*at) {
	case '{':
	case '[':
		if (++ps->depth > KVMEM_JSON_MAX_DEPTH) {
			fail_at(ps, at, "nesting deeper than %d levels", KVMEM_JSON_MAX_DEPTH);
			return NULL;
		}
		v = *at == '{' ? parse_object(ps) : parse_array(ps);
		ps->depth--;
		return v;
	case '"': {
		struct jkey s;

		v = new_node(ps, KVMEM_JSON_STRING, at);
		if (!v || parse_string(ps, &s))
			return NULL;
		v->u.str = s;
		return v;
	}
	case 't':
	case 'f':
	case 'n':
		if (literal(ps, "true") || literal(ps, "false")) {
			v = new_node(ps, KVMEM_JSON_BOOL, at);
			if (v)
				v->u.b = *at == 't';
			return v;
		}
		if (literal(ps, "null"))
			return new_node(ps, KVMEM_JSON_NULL, at);
		break;
	default:
		if (*at == '-' || (*at >= '0' && *at <= '9'))
			return parse_number(ps);
	}
	fail_at(ps, at, "expected a value (object, array, string, number, true, false or null) but found %s",
		found(ps, at, tmp, sizeof(tmp)));
	return NULL;
}

kvmem_json *kvmem_json_parse(const char *text, size_t len, const char *name)
{
	struct parser ps = { 0 };
	kvmem_json *v;
	char tmp[16];

	ps.name = name ? name : "json";
	ps.doc = calloc(1, sizeof(*ps.doc));
	if (!ps.doc) {
		kvmem_error(ENOMEM, "%s: out of memory", ps.name);
		return NULL;
	}
	if (!text) {
		text = "";
		len = 0;
	}
	ps.p = ps.start = ps.line_start = text;
	ps.end = text + len;
	ps.line = 1;
	v = parse_value(&ps);
	if (v) {
		skip_ws(&ps);
		if (ps.p < ps.end) {
			fail_at(&ps, ps.p, "unexpected %s after the value",
				found(&ps, ps.p, tmp, sizeof(tmp)));
			v = NULL;
		}
	}
	free(ps.stack);
	if (!v) {
		doc_free(ps.doc);
		return NULL;
	}
	ps.doc->root = *v;
	return &ps.doc->root;
}

kvmem_json *kvmem_json_parse_file(const char *path)
{
	struct stat st = { 0 };
	kvmem_json *v = NULL;
	char *buf;
	size_t got = 0;
	/* O_NONBLOCK: a FIFO in the file's place must not block the open. */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);

	if (fd < 0) {
		kvmem_error(errno, "%s: cannot open: %s", path, strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		kvmem_error(EINVAL, "%s: not a regular file%s", path,
			    S_ISFIFO(st.st_mode) ? " (a FIFO)" : S_ISDIR(st.st_mode) ? " (a directory)" : "");
		close(fd);
		return NULL;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		kvmem_error(ENOMEM, "%s: out of memory reading %lld bytes", path, (long long)st.st_size);
		close(fd);
		return NULL;
	}
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			kvmem_error(errno, "%s: read failed: %s", path, r ? strerror(errno) : "file shrank");
			goto out;
		}
		got += (size_t)r;
	}
	v = kvmem_json_parse(buf, got, path);
out:
	free(buf);
	close(fd);
	return v;
}

void kvmem_json_free(kvmem_json *root)
{
	if (root)
		doc_free((struct doc *)((char *)root - offsetof(struct doc, root)));
}

/* ---- accessors ------------------------------------------------------- */
kvmem_json_type kvmem_json_typeof(const kvmem_json *v)
{
	return v ? (kvmem_json_type)v->type : KVMEM_JSON_NULL;
}

const char *kvmem_json_type_name(const kvmem_json *v)
{
	static const char *const names[] = { "null", "boolean", "number", "string", "array", "object" };

	return v ? names[v->type] : "nothing";
}

int kvmem_json_line(const kvmem_json *v)
{
	return v ? v->line : 0;
}

int kvmem_json_column(const kvmem_json *v)
{
	return v ? v->col : 0;
}

size_t kvmem_json_len(const kvmem_json *v)
{
	return v && (v->type == KVMEM_JSON_ARRAY || v->type == KVMEM_JSON_OBJECT) ? v->u.c.n : 0;
}

const kvmem_json *kvmem_json_get(const kvmem_json *obj, const char *key)
{
	struct jkey k;
	size_t lo = 0, hi;

	if (!obj || obj->type != KVMEM_JSON_OBJECT || !key)
		return NULL;
	k.s = key;
	k.len = strlen(key);
	hi = obj->u.c.n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint32_t i = obj->u.c.sorted[mid];
		int c = key_cmp(&obj->u.c.keys[i], &k);

		if (!c)
			return obj->u.c.items[i];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const kvmem_json *kvmem_json_at(const kvmem_json *v, size_t i)
{
	return i < kvmem_json_len(v) ? v->u.c.items[i] : NULL;
}

const char *kvmem_json_key(const kvmem_json *obj, size_t i)
{
	if (!obj || obj->type != KVMEM_JSON_OBJECT || i >= obj->u.c.n)
		return NULL;
	return obj->u.c.keys[i].s;
}

size_t kvmem_json_key_len(const kvmem_json *obj, size_t i)
{
	if (!obj || obj->type != KVMEM_JSON_OBJECT || i >= obj->u.c.n)
		return 0;
	return obj->u.c.keys[i].len;
}

int kvmem_json_is_int(const kvmem_json *v)
{
	return v && v->type == KVMEM_JSON_NUMBER && v->is_int;
}

int64_t kvmem_json_int(const kvmem_json *v, int64_t def)
{
	return kvmem_json_is_int(v) ? v->u.num.i : def;
}

double kvmem_json_num(const kvmem_json *v, double def)
{
	return v && v->type == KVMEM_JSON_NUMBER ? v->u.num.d : def;
}

int kvmem_json_bool(const kvmem_json *v, int def)
{
	return v && v->type == KVMEM_JSON_BOOL ? v->u.b : def;
}

const char *kvmem_json_str(const kvmem_json *v, const char *def)
{
	return v && v->type == KVMEM_JSON_STRING ? v->u.str.s : def;
}

size_t kvmem_json_str_len(const kvmem_json *v)
{
	return v && v->type == KVMEM_JSON_STRING ? v->u.str.len : 0;
}

int kvmem_json_write_str(FILE *f, const char *s)
{
	if (fputc('"', f) == EOF)
		return -1;
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		int r;

		if (ch == '"' || ch == '\\')
			r = fprintf(f, "\\%c", ch);
		else if (ch == '\n')
			r = fputs("\\n", f);
		else if (ch == '\t')
			r = fputs("\\t", f);
		else if (ch == '\r')
			r = fputs("\\r", f);
		else if (ch < 0x20)
			r = fprintf(f, "\\u%04x", ch);
		else
			r = fputc(ch, f);
		if (r < 0)
			return -1;
	}
	return fputc('"', f) == EOF ? -1 : 0;
}
