// SPDX-License-Identifier: MIT
/* The replacement policy registry and the victim scan the scoring ones share. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pager/repl_int.h"

const kvmem_repl_ops *const kvmem_repl_policies[] = {
	&kvmem_repl_lru, &kvmem_repl_lfu, &kvmem_repl_score, NULL,
};

const kvmem_repl_ops *kvmem_repl_find(const char *name)
{
	for (int i = 0; kvmem_repl_policies[i]; i++)
		if (!strcmp(kvmem_repl_policies[i]->name, name))
			return kvmem_repl_policies[i];
	return NULL;
}

double repl_decay(double x, uint64_t steps, double half_life)
{
	return steps ? x * exp2(-(double)steps / half_life) : x;
}

int repl_blockvals_grow(struct repl_blockvals *bv, uint64_t block)
{
	size_t n = bv->n ? bv->n : 1024;
	double *v;
	uint64_t *a;

	if (block < bv->n)
		return 0;
	while (n <= block)
		n *= 2;
	v = realloc(bv->val, n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	bv->val = v;
	a = realloc(bv->at, n * sizeof(*a));
	if (!a)
		return -ENOMEM;
	bv->at = a;
	memset(bv->val + bv->n, 0, (n - bv->n) * sizeof(*v));
	memset(bv->at + bv->n, 0, (n - bv->n) * sizeof(*a));
	bv->n = n;
	return 0;
}

double repl_blockvals_get(const struct repl_blockvals *bv, uint64_t block, uint64_t step,
			  double half_life)
{
	if (block >= bv->n || step < bv->at[block])
		return block < bv->n ? bv->val[block] : 0.0;
	return repl_decay(bv->val[block], step - bv->at[block], half_life);
}

void repl_blockvals_add(struct repl_blockvals *bv, uint64_t block, double x, uint64_t step,
			double half_life)
{
	if (repl_blockvals_grow(bv, block) < 0)
		return;
	if (step < bv->at[block])
		step = bv->at[block];
	bv->val[block] = repl_blockvals_get(bv, block, step, half_life) + x;
	bv->at[block] = step;
}

void repl_blockvals_free(struct repl_blockvals *bv)
{
	free(bv->val);
	free(bv->at);
	memset(bv, 0, sizeof(*bv));
}

struct cand {
	double key;
	uint32_t slot;
};

/* Max-heap on key, so the root is the worst of the kept candidates. */
static void sift_down(struct cand *h, uint32_t n, uint32_t i)
{
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, m = i;
		struct cand t;

		if (l < n && h[l].key > h[m].key)
			m = l;
		if (r < n && h[r].key > h[m].key)
			m = r;
		if (m == i)
			return;
		t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

static void sift_up(struct cand *h, uint32_t i)
{
	while (i) {
		uint32_t p = (i - 1) / 2;
		struct cand t;

		if (h[p].key >= h[i].key)
			return;
		t = h[i];
		h[i] = h[p];
		h[p] = t;
		i = p;
	}
}

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	return (x->key > y->key) - (x->key < y->key);
}

uint32_t repl_lowest(void *st, uint32_t n_slots, const uint8_t *present, repl_key_fn key,
		     uint32_t want, uint32_t *out, uint64_t step, kvmem_slot_pred busy, void *arg)
{
	struct cand *h;
	uint32_t n = 0;

	if (!want)
		return 0;
	h = malloc(sizeof(*h) * want);
	if (!h)
		return 0;
	for (uint32_t s = 0; s < n_slots; s++) {
		double k;

		if (!present[s] || (busy && busy(arg, s)))
			continue;
		k = key(st, s, step);
		if (n < want) {
			h[n] = (struct cand){ k, s };
			sift_up(h, n++);
		} else if (k < h[0].key) {
			h[0] = (struct cand){ k, s };
			sift_down(h, n, 0);
		}
	}
	qsort(h, n, sizeof(*h), cand_cmp);
	for (uint32_t i = 0; i < n; i++)
		out[i] = h[i].slot;
	free(h);
	return n;
}

const char *kvmem_repl_at(int i, const char **what)
{
	for (int k = 0; kvmem_repl_policies[k]; k++)
		if (k == i) {
			if (what)
				*what = kvmem_repl_policies[k]->what;
			return kvmem_repl_policies[k]->name;
		}
	return NULL;
}
