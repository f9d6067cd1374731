// SPDX-License-Identifier: MIT
/*
 * The block registry: fixed-size blocks over the token history and the
 * pinned spans. Block b holds positions [b*B, min((b+1)*B, n_tokens)); only
 * the last block can be partial. Pins are kept as a sorted list of disjoint
 * spans so that membership and totals cost O(pins), not O(blocks).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "select/select.h"
#include "util/grow.h"

int kvmem_blocks_init(kvmem_blocks *r, int block)
{
	memset(r, 0, sizeof(*r));
	if (block == 0)
		block = KVMEM_BLOCK_DEFAULT;
	if (block < KVMEM_BLOCK_MIN || block > KVMEM_BLOCK_MAX || (block & (block - 1)))
		return kvmem_error(EINVAL, "workspace: block size %d is not a power of two from %d to %d",
				 block, KVMEM_BLOCK_MIN, KVMEM_BLOCK_MAX);
	r->block = block;
	while ((1 << r->shift) < block)
		r->shift++;
	return 0;
}

void kvmem_blocks_free(kvmem_blocks *r)
{
	free(r->pins);
	memset(r, 0, sizeof(*r));
}

static int spans_room(kvmem_blocks *r, int need)
{
	size_t cap = (size_t)r->cap_pins;

	if (need > INT_MAX / 2 || kvmem_grow(&r->pins, sizeof(*r->pins), (size_t)need, &cap, 8))
		return kvmem_error(ENOMEM, "workspace: out of memory for %d pinned spans", need);
	r->cap_pins = (int)cap;
	return 0;
}

static int check_span(int64_t start, int64_t end)
{
	if (start < 0 || end < start)
		return kvmem_error(EINVAL, "workspace: bad span [%lld, %lld)", (long long)start,
				 (long long)end);
	return 0;
}

int kvmem_blocks_pin(kvmem_blocks *r, int64_t start, int64_t end)
{
	int i, j, k;

	if (check_span(start, end))
		return kvmem_fail();
	if (start == end)
		return 0;
	if (spans_room(r, r->n_pins + 1))
		return kvmem_fail();
	/* First span that touches or follows [start, end), last that touches it. */
	for (i = 0; i < r->n_pins && r->pins[i].end < start; i++)
		;
	for (j = i; j < r->n_pins && r->pins[j].start <= end; j++) {
		if (r->pins[j].start < start)
			start = r->pins[j].start;
		if (r->pins[j].end > end)
			end = r->pins[j].end;
	}
	/* Spans i..j-1 merge into one at i. */
	k = j - i;
	if (k == 0)
		memmove(r->pins + i + 1, r->pins + i, (size_t)(r->n_pins - i) * sizeof(kvmem_span));
	else if (k > 1)
		memmove(r->pins + i + 1, r->pins + j, (size_t)(r->n_pins - j) * sizeof(kvmem_span));
	r->n_pins += 1 - k;
	r->pins[i].start = start;
	r->pins[i].end = end;
	return 0;
}

int kvmem_blocks_unpin(kvmem_blocks *r, int64_t start, int64_t end)
{
	int i, n = 0;
	kvmem_span *out;

	if (check_span(start, end))
		return kvmem_fail();
	if (start == end)	/* nothing to cut: do not split a span at a point */
		return 0;
	/* Cutting a hole in one span can add one span. */
	if (spans_room(r, r->n_pins + 1))
		return kvmem_fail();
	out = malloc((size_t)(r->n_pins + 1) * sizeof(*out));
	if (!out)
		return kvmem_error(ENOMEM, "workspace: out of memory unpinning");
	for (i = 0; i < r->n_pins; i++) {
		kvmem_span s = r->pins[i];

		if (s.end <= start || s.start >= end) {
			out[n++] = s;
			continue;
		}
		if (s.start < start)
			out[n++] = (kvmem_span){ s.start, start };
		if (s.end > end)
			out[n++] = (kvmem_span){ end, s.end };
	}
	memcpy(r->pins, out, (size_t)n * sizeof(*out));
	r->n_pins = n;
	free(out);
	return 0;
}

int64_t kvmem_blocks_pinned_tokens(const kvmem_blocks *r, int64_t n_tokens)
{
	int64_t total = 0, last_block = -1;
	int i;

	if (n_tokens <= 0)
		return 0;
	for (i = 0; i < r->n_pins; i++) {
		int64_t s = r->pins[i].start, e = r->pins[i].end;
		int64_t b0, b1;

		if (s >= n_tokens)
			break;
		if (e > n_tokens)
			e = n_tokens;
		b0 = s >> r->shift;
		b1 = (e - 1) >> r->shift;
		/* Two spans may share a block: count it once. */
		if (b0 <= last_block)
			b0 = last_block + 1;
		if (b1 < b0)
			continue;
		total += ((b1 - b0 + 1) << r->shift);
		if ((b1 + 1) << r->shift > n_tokens)
			total -= ((b1 + 1) << r->shift) - n_tokens;
		last_block = b1;
	}
	return total;
}
