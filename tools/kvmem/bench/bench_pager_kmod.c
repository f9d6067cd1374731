// SPDX-License-Identifier: MIT
/*
 * kvmem bench pager --pager kmod: the page-in through the kernel module
 * (/dev/kvmem), beside the userspace pager's in the same run. The stage-out
 * is the pager's either way (the module never writes a workspace); only
 * the reads differ. Documentation/kmod.md says what the module does.
 */
#include <errno.h>
#include <stdlib.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "bench_pager_kmod.h"
#include "cli_util.h"

uint64_t *bench_pager_order(uint64_t n)
{
	uint64_t *order = malloc((n ? n : 1) * sizeof(*order)), r = 88172645463325252ull;

	if (!order)
		return NULL;
	for (uint64_t i = 0; i < n; i++)
		order[i] = i;
	for (uint64_t i = n ? n - 1 : 0; i > 0; i--) {
		uint64_t j, t;

		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		j = r % (i + 1);
		t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	return order;
}

int bench_kmod_page_in(const char *dir, uint64_t page, const uint64_t *order, uint64_t n_pages,
		       int batch, double *bps, struct kvmem_ioc_stats *st)
{
	uint64_t stride = (page + KVMEM_IO_ALIGN - 1) / KVMEM_IO_ALIGN * KVMEM_IO_ALIGN;
	kvmem_kmod_opts o;
	kvmem_kmod *k;
	double t0;
	int rc, direct;

	kvmem_kmod_opts_default(&o);
	o.flags = KVMEM_KMOD_RDONLY;	/* a reader of committed pages, as the source is */
	o.host_cap = 2 * (uint64_t)batch * stride;
	rc = kvmem_kmod_open_workspace(dir, &o, &k);
	if (rc < 0)
		return rc;
	direct = kvmem_kmod_direct(k);
	t0 = cli_now_s();
	for (uint64_t i = 0; i < n_pages && rc >= 0; i += batch) {
		size_t m = n_pages - i < (uint64_t)batch ? n_pages - i : (uint64_t)batch;
		const void *p;

		if (direct)
			rc = kvmem_kmod_fill(k, order + i, m, NULL);
		for (size_t j = 0; j < m && rc >= 0; j++)
			rc = kvmem_kmod_get(k, order[i + j], &p);
	}
	*bps = n_pages * page / (cli_now_s() - t0);
	if (rc >= 0)
		rc = kvmem_kmod_stats(k, st);
	kvmem_kmod_close(k);
	return rc < 0 ? rc : 0;
}
