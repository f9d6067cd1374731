// SPDX-License-Identifier: MIT
/*
 * JSON as a chat template's tojson writes it. transformers renders chat
 * templates with its own tojson filter, Python's json.dumps(x,
 * ensure_ascii=False): ", " and ": " between items, keys in their order,
 * text other than ASCII as UTF-8, control characters as \n, \t, ... or a
 * lowercase \u00xx, and floats as Python's repr (the shortest digits that
 * read back, exponent form below 1e-4 and from 1e16 on). jansson's
 * json_dumps differs on the last two (0.1 as 0.10000000000000001, \u001F),
 * so the tools and a tool call's object arguments are written here.
 */
#ifndef KVMEM_NO_SERVE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_int.h"

struct out {
	char *s;
	size_t n, cap;
	int oom;
};

static void put(struct out *o, const char *s, size_t len)
{
	if (o->oom)
		return;
	if (o->n + len + 1 > o->cap) {
		size_t cap = (o->n + len + 1) * 2;
		char *p = realloc(o->s, cap);

		if (!p) {
			o->oom = 1;
			return;
		}
		o->s = p;
		o->cap = cap;
	}
	memcpy(o->s + o->n, s, len);
	o->n += len;
	o->s[o->n] = 0;
}

static void puts_(struct out *o, const char *s)
{
	put(o, s, strlen(s));
}

static void put_string(struct out *o, const char *s, size_t len)
{
	size_t from = 0;

	puts_(o, "\"");
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[8];

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		put(o, s + from, i - from);
		from = i + 1;
		switch (c) {
		case '"': puts_(o, "\\\""); break;
		case '\\': puts_(o, "\\\\"); break;
		case '\n': puts_(o, "\\n"); break;
		case '\r': puts_(o, "\\r"); break;
		case '\t': puts_(o, "\\t"); break;
		case '\b': puts_(o, "\\b"); break;
		case '\f': puts_(o, "\\f"); break;
		default:
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			puts_(o, esc);
		}
	}
	put(o, s + from, len - from);
	puts_(o, "\"");
}

/*
 * The shortest digits that read back as x (x > 0), the closest to x among
 * them, as Python's repr finds them: at each precision the correctly
 * rounded digits, else their neighbour on the other side of x, which the
 * lopsided rounding interval of a power of two can hold when they do not.
 * digits without trailing zeros; *exp10 the power of ten of the first.
 */
static int shortest(double x, char digits[24], int *exp10)
{
	char e[48];

	for (int prec = 1; prec <= 17; prec++) {
		unsigned long long d = 0;
		const char *p;
		int ex;

		snprintf(e, sizeof(e), "%.*e", prec - 1, x);
		for (p = e; *p != 'e'; p++)
			if (*p != '.')
				d = d * 10 + (unsigned)(*p - '0');
		ex = atoi(p + 1) - (prec - 1);	/* x ~ d * 10^ex */
		for (int k = 0; k < 3; k++) {
			unsigned long long c = k == 0 ? d : k == 1 ? d - 1 : d + 1;
			int n;

			snprintf(e, sizeof(e), "%llue%d", c, ex);
			if (!c || strtod(e, NULL) != x)
				continue;
			n = snprintf(digits, 24, "%llu", c);
			*exp10 = ex + n - 1;
			while (n > 1 && digits[n - 1] == '0')
				digits[--n] = 0;
			return n;
		}
	}
	/* Not reached: 17 significant digits always read back. */
	snprintf(digits, 24, "0");
	*exp10 = 0;
	return 1;
}

/* Python's repr of a finite double. */
static void put_real(struct out *o, double x)
{
	char digits[24], tail[16];
	int nd, exp10, decpt;

	if (x == 0) {
		puts_(o, signbit(x) ? "-0.0" : "0.0");
		return;
	}
	nd = shortest(fabs(x), digits, &exp10);
	decpt = exp10 + 1;	/* digits before the point */
	if (x < 0)
		puts_(o, "-");
	if (decpt > 16 || decpt <= -4) {
		put(o, digits, 1);
		if (nd > 1) {
			puts_(o, ".");
			put(o, digits + 1, (size_t)nd - 1);
		}
		snprintf(tail, sizeof(tail), "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
		puts_(o, tail);
	} else if (decpt <= 0) {
		puts_(o, "0.");
		for (int i = 0; i < -decpt; i++)
			puts_(o, "0");
		put(o, digits, (size_t)nd);
	} else if (decpt >= nd) {
		put(o, digits, (size_t)nd);
		for (int i = nd; i < decpt; i++)
			puts_(o, "0");
		puts_(o, ".0");
	} else {
		put(o, digits, (size_t)decpt);
		puts_(o, ".");
		put(o, digits + decpt, (size_t)(nd - decpt));
	}
}

static void put_value(struct out *o, const json_t *v)
{
	char num[32];

	switch (json_typeof(v)) {
	case JSON_OBJECT: {
		const char *k;
		json_t *x;
		int first = 1;

		puts_(o, "{");
		/* jansson iterates an object in the order its keys came. */
		json_object_foreach((json_t *)v, k, x) {
			puts_(o, first ? "" : ", ");
			first = 0;
			put_string(o, k, strlen(k));
			puts_(o, ": ");
			put_value(o, x);
		}
		puts_(o, "}");
		break;
	}
	case JSON_ARRAY:
		puts_(o, "[");
		for (size_t i = 0; i < json_array_size(v); i++) {
			puts_(o, i ? ", " : "");
			put_value(o, json_array_get(v, i));
		}
		puts_(o, "]");
		break;
	case JSON_STRING:
		put_string(o, json_string_value(v), json_string_length(v));
		break;
	case JSON_INTEGER:
		snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		puts_(o, num);
		break;
	case JSON_REAL:
		put_real(o, json_real_value(v));
		break;
	case JSON_TRUE: puts_(o, "true"); break;
	case JSON_FALSE: puts_(o, "false"); break;
	case JSON_NULL: puts_(o, "null"); break;
	}
}

char *serve_tojson(const json_t *v)
{
	struct out o = { 0 };

	put_value(&o, v);
	if (o.oom) {
		free(o.s);
		return NULL;
	}
	return o.s;
}
#endif
