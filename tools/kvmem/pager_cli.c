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
#include "pager_cli.h"

static kvmem_workspace *g_ws;
static int g_state_warned;
static uint32_t g_dtype;
static const char *g_reader;

void pager_cli_dtype(uint32_t dtype)
{
	g_dtype = dtype;
}

void pager_cli_reader(const char *pager)
{
	g_reader = pager;
}

int pager_cli_open(const char *dir, const kvmem_model *m, int block, uint64_t host_cap,
		   const char *cache_policy, const kvmem_page_source **src)
{
	kvmem_workspace_opts wo = { .block = block, .host_cap = host_cap,
				    .cache_policy = cache_policy, .dtype = g_dtype,
				    .pager = g_reader };

	*src = NULL;
	if (g_ws)
		return kvmem_error(EINVAL, "--workspace %s: one workspace per process", dir);
	if (kvmem_workspace_open(dir, m, &wo, &g_ws) < 0)
		return kvmem_error_prefix("--workspace");
	*src = kvmem_workspace_source(g_ws);
	return 0;
}

kvmem_pager *pager_cli_pager(void)
{
	return g_ws ? kvmem_workspace_pager(g_ws) : NULL;
}

int64_t pager_cli_tokens(void)
{
	return g_ws ? kvmem_workspace_tokens(g_ws) : 0;
}

int pager_cli_adopt(kvmem_session *s)
{
	int rc;

	if (!g_ws)
		return 0;
	rc = kvmem_workspace_adopt(g_ws, s);
	if (rc == 1)
		fprintf(stderr, "kvmem run: warning: --workspace %s: %s; the view starts from a fresh "
			"selection, so what follows may differ from an uninterrupted run\n",
			kvmem_workspace_dir(g_ws), kvmem_last_error());
	return rc < 0 ? rc : 0;
}

int pager_cli_commit(const kvmem_session *s)
{
	int rc;

	if (!g_ws)
		return 0;
	rc = kvmem_workspace_commit(g_ws, s);
	if (rc == 1 && !g_state_warned++)
		fprintf(stderr, "kvmem run: warning: %s; a reopen will start from a fresh selection\n",
			kvmem_last_error());
	return rc < 0 ? rc : 0;
}

int pager_cli_close(FILE *f)
{
	struct kvmem_ioc_stats ks;
	kvmem_pager_stats st;
	kvmem_pager *p;
	int rc;

	if (!g_ws)
		return 0;
	p = kvmem_workspace_pager(g_ws);
	kvmem_pager_stats_get(p, &st);
	fprintf(f, "workspace %s: %" PRIu64 " tokens committed; host pool %" PRIu64 " hits, %" PRIu64
		" misses, %" PRIu64 " pages read, %" PRIu64 " evictions; %" PRIu64
		" blocks staged out\n", kvmem_pager_dir(p),
		kvmem_pager_committed_tokens(p), st.host_hits, st.host_misses, st.pages_in,
		st.evictions, st.blocks_out);
	if (kvmem_page_source_kmod_client(kvmem_workspace_source(g_ws)) &&
	    kvmem_page_source_kmod_stats(kvmem_workspace_source(g_ws), &ks) == 0)
		fprintf(f, "kernel module %s: %llu faults, %llu hits, %llu pages read (%llu bytes), "
			"%llu prefetched, %llu evictions, %llu checksum errors\n",
			"/dev/kvmem", (unsigned long long)ks.faults, (unsigned long long)ks.hits,
			(unsigned long long)ks.fills, (unsigned long long)ks.fill_bytes,
			(unsigned long long)ks.prefetches, (unsigned long long)ks.evictions,
			(unsigned long long)ks.checksum_errors);
	rc = kvmem_workspace_close(g_ws);
	g_ws = NULL;
	return rc;
}
