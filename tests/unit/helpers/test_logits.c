// SPDX-License-Identifier: MIT
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "test_logits.h"

void test_logits_record(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct test_logits *r = arg;

	(void)tok, (void)n;
	if (r->n + r->vocab > r->cap) {
		r->cap = 2 * (r->n + r->vocab);
		r->buf = realloc(r->buf, r->cap * sizeof(float));
		assert_non_null(r->buf);
	}
	memcpy(r->buf + r->n, logits, (size_t)r->vocab * sizeof(float));
	r->n += r->vocab;
}
