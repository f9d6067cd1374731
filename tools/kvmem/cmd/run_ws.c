// SPDX-License-Identifier: MIT
/*
 * `kvmem run --workspace DIR`: the session's history in a workspace
 * directory (kvmem/store.h does the work), the warnings a person should see,
 * and the tier counters at the end.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "run_ws.h"

int run_ws_open(struct run_ws *r, const char *dir, const kvmem_model *m,
		const kvmem_workspace_opts *wo)
{
	if (r->w)
		return kvmem_error(EINVAL, "--workspace %s: a workspace is open already", dir);
	if (kvmem_workspace_open(dir, m, wo, &r->w) < 0)
		return kvmem_error_prefix("--workspace");
	return 0;
}

const kvmem_page_source *run_ws_source(const struct run_ws *r)
{
	return r->w ? kvmem_workspace_source(r->w) : NULL;
}

kvmem_pager *run_ws_pager(const struct run_ws *r)
{
	return r->w ? kvmem_workspace_pager(r->w) : NULL;
}

int64_t run_ws_tokens(const struct run_ws *r)
{
	return r->w ? kvmem_workspace_tokens(r->w) : 0;
}

int run_ws_adopt(struct run_ws *r, kvmem_session *s)
{
	int rc;

	if (!r->w)
		return 0;
	rc = kvmem_workspace_adopt(r->w, s);
	if (rc == 1)
		fprintf(stderr, "kvmem run: warning: --workspace %s: %s; the view starts from a fresh "
			"selection, so what follows may differ from an uninterrupted run\n",
			kvmem_workspace_dir(r->w), kvmem_last_error());
	return rc < 0 ? rc : 0;
}

int run_ws_commit(struct run_ws *r, const kvmem_session *s)
{
	int rc;

	if (!r->w)
		return 0;
	rc = kvmem_workspace_commit(r->w, s);
	if (rc == 1 && !r->state_warned++)
		fprintf(stderr, "kvmem run: warning: %s; a reopen will start from a fresh selection\n",
			kvmem_last_error());
	return rc < 0 ? rc : 0;
}

int run_ws_close(struct run_ws *r, FILE *f)
{
	struct kvmem_ioc_stats ks;
	kvmem_pager_stats st;
	kvmem_pager *p;
	int rc;

	if (!r->w)
		return 0;
	p = kvmem_workspace_pager(r->w);
	kvmem_pager_stats_get(p, &st);
	fprintf(f, "workspace %s: %" PRIu64 " tokens committed; host pool %" PRIu64 " hits, %" PRIu64
		" misses, %" PRIu64 " pages read, %" PRIu64 " evictions; %" PRIu64
		" blocks staged out\n", kvmem_pager_dir(p),
		kvmem_pager_committed_tokens(p), st.host_hits, st.host_misses, st.pages_in,
		st.evictions, st.blocks_out);
	if (kvmem_page_source_kmod_client(kvmem_workspace_source(r->w)) &&
	    kvmem_page_source_kmod_stats(kvmem_workspace_source(r->w), &ks) == 0)
		/* "pages read" are the module's own (buffered: page-cache
		 * copies); "filled by O_DIRECT" the source's reads straight
		 * into the window (no copy). */
		/* (The first six numbers keep their places: bpf/vm-observe.sh
		 * reads them by position.) */
		fprintf(f, "kernel module %s: %llu faults, %llu hits, %llu pages read (%llu bytes), "
			"%llu prefetched, %llu evictions, %llu filled by O_DIRECT, %llu read "
			"errors, %llu checksum errors\n",
			"/dev/kvmem", (unsigned long long)ks.faults, (unsigned long long)ks.hits,
			(unsigned long long)ks.fills, (unsigned long long)ks.fill_bytes,
			(unsigned long long)ks.prefetches, (unsigned long long)ks.evictions,
			(unsigned long long)ks.user_fills, (unsigned long long)ks.read_errors,
			(unsigned long long)ks.checksum_errors);
	rc = kvmem_workspace_close(r->w);
	r->w = NULL;
	return rc;
}
