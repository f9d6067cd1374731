// SPDX-License-Identifier: MIT
/* Growing arrays by doubling: one copy of the realloc-and-zero dance. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/grow.h"

int kvmem_grow(void *pp, size_t elem, size_t need, size_t *cap, size_t first)
{
	void **p = pp;
	size_t c = *cap ? *cap : (first ? first : 1);
	void *n;

	if (need <= *cap)
		return 0;
	while (c < need) {
		if (c > SIZE_MAX / 2 / elem)
			return -ENOMEM;
		c *= 2;
	}
	if (c > SIZE_MAX / elem || !(n = realloc(*p, c * elem)))
		return -ENOMEM;
	memset((char *)n + *cap * elem, 0, (c - *cap) * elem);
	*p = n;
	*cap = c;
	return 0;
}
