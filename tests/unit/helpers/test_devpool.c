// SPDX-License-Identifier: MIT
/* A device page pool for the cpu backend: see test_devpool.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend/pool_watch.h"
#include "test_devpool.h"

struct dslot {
	int used, ref;
	uint32_t owner;
	int64_t block;
	int layer;
	uint32_t dtype;
	uint64_t call;		/* the place() call that last read it */
	char *bytes;		/* K then V, half bytes each */
	size_t half;
};

static struct {
	int on;
	kvmem_backend_ops ops;
	const kvmem_backend_ops *in;
	const kvmem_model *m;
	const char *region;
	size_t len;
	int refs;
	struct dslot *s;
	int slots, hand;
	uint64_t call;
	kvmem_pool_watches watch;
	kvmem_place *tmp;
	int cap_tmp;
	test_devpool_stats st;
} dp;

static int find(uint32_t owner, int64_t block, int layer)
{
	for (int i = 0; i < dp.slots; i++)
		if (dp.s[i].used && dp.s[i].owner == owner && dp.s[i].block == block &&
		    dp.s[i].layer == layer)
			return i;
	return -1;
}

static void drop(int i)
{
	struct dslot *d = &dp.s[i];

	kvmem_pool_note(&dp.watch, dp.region, d->owner, d->block, d->layer, KVMEM_DEVICE_NONE);
	free(d->bytes);
	memset(d, 0, sizeof(*d));
	dp.st.drops++;
	dp.st.held--;
}

/* Bytes of an element of the dtypes a page pool keeps (not fp8: its
 * scales follow the page). */
static size_t elem_of(uint32_t dtype)
{
	return dtype == KVMEM_DTYPE_FP8 ? 0 : kvmem_dtype_bytes(dtype);
}

/* A slot for a page: a free one, else the clock's victim, never one this
 * call reads; -1 when every slot is. */
static int take(void)
{
	for (int tries = 0; tries < 2 * dp.slots + 1; tries++) {
		int c = dp.hand;

		dp.hand = (dp.hand + 1) % dp.slots;
		if (dp.s[c].used && dp.s[c].call == dp.call)
			continue;
		if (dp.s[c].used && dp.s[c].ref) {
			dp.s[c].ref = 0;
			continue;
		}
		if (dp.s[c].used)
			drop(c);
		return c;
	}
	return -1;
}

static int dp_host_register(void *ctx, void *base, size_t len)
{
	(void)ctx;
	if (dp.refs && (base != dp.region || len != dp.len))
		return -ENOTSUP;	/* one region at a time is enough here */
	dp.region = base;
	dp.len = len;
	dp.refs++;
	return 0;
}

static void dp_host_unregister(void *ctx, void *base)
{
	(void)ctx;
	if (!dp.refs || base != dp.region || --dp.refs)
		return;
	for (int i = 0; i < dp.slots; i++)
		if (dp.s[i].used)
			drop(i);
	kvmem_pool_flush(&dp.watch);
	dp.region = NULL;
	dp.len = 0;
}

static int dp_host_pinned(void *ctx, const void *base)
{
	(void)ctx;
	return dp.refs && base == dp.region;
}

static int dp_page_cached(void *ctx, const void *region, uint32_t owner, int64_t block, int layer,
			  uint64_t *token)
{
	(void)ctx;
	(void)token;
	return dp.refs && region == dp.region && find(owner, block, layer) >= 0;
}

static int dp_pool_watch(void *ctx, const void *region, uint32_t owner, kvmem_pool_report_fn fn,
			 void *arg)
{
	(void)ctx;
	return kvmem_pool_watch_set(&dp.watch, region, owner, fn, arg);
}

static int dp_place(void *ctx, kvmem_view *v, const kvmem_place *items, int n)
{
	const kvmem_config *c = &dp.m->cfg;
	int rc;

	if (n > dp.cap_tmp) {
		kvmem_place *t = realloc(dp.tmp, (size_t)n * sizeof(*t));

		if (!t)
			return -ENOMEM;
		dp.tmp = t;
		dp.cap_tmp = n;
	}
	memcpy(dp.tmp, items, (size_t)n * sizeof(*items));
	dp.call++;
	/* Hits first, stamped with this call: no miss below evicts them. */
	for (int i = 0; i < n; i++) {
		kvmem_place *it = &dp.tmp[i];
		int s;

		if (it->page.mem != KVMEM_MEM_BACKEND)
			continue;
		if (it->page.k != dp.region || (s = find(it->owner, it->block, it->layer)) < 0)
			return -EINVAL;	/* page_cached said yes to a page it has not */
		dp.s[s].call = dp.call;
		dp.s[s].ref = 1;
		kvmem_page_at(&it->page, dp.s[s].bytes, dp.s[s].dtype, c->n_kv_heads, it->stride,
			      c->head_dim);
		dp.st.hits++;
	}
	/* Whole pages of the region join the pool on their way. */
	for (int i = 0; i < n; i++) {
		kvmem_place *it = &dp.tmp[i];
		size_t half = (size_t)c->n_kv_heads * it->stride * c->head_dim * elem_of(it->page.dtype);
		const char *k = it->page.k;
		int s;

		if (it->page.mem != KVMEM_MEM_HOST || !half || !dp.refs || it->u0 || it->n != it->stride ||
		    k < dp.region || k + half > dp.region + dp.len ||
		    find(it->owner, it->block, it->layer) >= 0 || (s = take()) < 0)
			continue;
		if (!(dp.s[s].bytes = malloc(2 * half)))
			return -ENOMEM;
		memcpy(dp.s[s].bytes, it->page.k, half);
		memcpy(dp.s[s].bytes + half, it->page.v, half);
		dp.s[s] = (struct dslot){ .used = 1, .owner = it->owner, .block = it->block,
					  .layer = it->layer, .dtype = it->page.dtype,
					  .call = dp.call, .bytes = dp.s[s].bytes, .half = half };
		dp.st.fills++;
		dp.st.held++;
		kvmem_pool_note(&dp.watch, dp.region, it->owner, it->block, it->layer, (uint32_t)s);
	}
	rc = dp.in->place(ctx, v, dp.tmp, n);
	kvmem_pool_flush(&dp.watch);
	return rc;
}

int test_devpool_wrap(kvmem_backend *out, const kvmem_backend *be, int slots)
{
	if (dp.on)
		return -EBUSY;
	memset(&dp, 0, sizeof(dp));
	if (!(dp.s = calloc((size_t)slots, sizeof(*dp.s))))
		return -ENOMEM;
	dp.on = 1;
	dp.slots = slots;
	dp.in = be->ops;
	dp.m = be->model;
	dp.ops = *be->ops;
	dp.ops.host_register = dp_host_register;
	dp.ops.host_unregister = dp_host_unregister;
	dp.ops.host_pinned = dp_host_pinned;
	dp.ops.page_cached = dp_page_cached;
	dp.ops.pool_watch = dp_pool_watch;
	dp.ops.place = dp_place;
	*out = *be;
	out->ops = &dp.ops;
	return 0;
}

void test_devpool_unwrap(void)
{
	for (int i = 0; i < dp.slots; i++)
		free(dp.s[i].bytes);
	free(dp.s);
	free(dp.tmp);
	kvmem_pool_watches_free(&dp.watch);
	memset(&dp, 0, sizeof(dp));
}

void test_devpool_stats_get(test_devpool_stats *st)
{
	*st = dp.st;
}

uint32_t test_devpool_slot(int64_t block, int layer)
{
	for (int i = 0; dp.refs && i < dp.slots; i++)
		if (dp.s[i].used && dp.s[i].block == block && dp.s[i].layer == layer)
			return (uint32_t)i;
	return UINT32_MAX;
}
