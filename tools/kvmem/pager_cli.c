// SPDX-License-Identifier: MIT
/*
 * `kvmem run --workspace DIR`: open or create the workspace directory, hand
 * the session a page source over the pager, commit after every script line,
 * and report the tier counters at the end.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "pager_cli.h"

static kvmem_pager *g_pager;
static uint64_t g_step;
static int g_state_warned;

int pager_cli_open(const char *dir, const kvmem_model *m, int block, uint64_t host_cap,
		   const char *cache_policy, kvmem_page_source *src, int32_t **ids, int64_t *n_ids)
{
	kvmem_pager_opts po;
	kvmem_page_geom g;
	int64_t n;

	*ids = NULL;
	*n_ids = 0;
	memset(src, 0, sizeof(*src));
	if (g_pager)
		return kvmem_error(EINVAL, "--workspace %s: one workspace per process", dir);
	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_CREATE;
	if (host_cap)
		po.host_cap = host_cap;
	if (cache_policy)
		po.policy = cache_policy;
	kvmem_page_geom_model(&g, m, block);
	if (kvmem_pager_open(dir, &g, &po, &g_pager) < 0)
		return kvmem_error_prefix("--workspace");
	if (kvmem_page_source_pager(src, g_pager) < 0)
		goto fail;
	n = (int64_t)kvmem_pager_tokens(g_pager);
	if (n) {
		*ids = malloc((size_t)n * sizeof(int32_t));
		if (!*ids) {
			kvmem_error(ENOMEM, "--workspace %s: out of memory for %" PRId64 " token ids", dir, n);
			goto fail;
		}
		if (kvmem_pager_read_tokens(g_pager, 0, n, *ids) < 0)
			goto fail;
		*n_ids = n;
	}
	return 0;
fail:
	free(*ids);
	*ids = NULL;
	kvmem_page_source_destroy(src);
	kvmem_pager_close(g_pager);
	g_pager = NULL;
	return -1;
}

int pager_cli_adopt(kvmem_session *s, const int32_t *ids, int64_t n)
{
	uint32_t len = 0;
	const void *state = g_pager ? kvmem_pager_app_state(g_pager, &len) : NULL;
	int rc;

	if (!n)
		return 0;
	if (state && len) {
		rc = kvmem_session_adopt_state(s, ids, n, state, len);
		/* A refusal (-ESTALE) leaves the session fresh; a page that
		 * could not be read does not, and there is nothing to fall
		 * back to. */
		if (rc != -ESTALE)
			return rc;
	}
	fprintf(stderr, "kvmem run: warning: --workspace %s: %s; the view starts from a fresh "
		"selection, so what follows may differ from an uninterrupted run\n",
		kvmem_pager_dir(g_pager), len ? kvmem_last_error() :
		"the last commit holds no session state");
	return kvmem_session_adopt(s, ids, n);
}

int pager_cli_commit(kvmem_page_source *src, const kvmem_session *s)
{
	void *state;
	size_t len;
	int rc;

	if (!g_pager)
		return 0;
	if (kvmem_session_save_state(s, &state, &len) < 0)
		return -1;
	if (len > KVMEM_PAGER_APP_MAX) {
		/* The history is still worth committing; a reopen then makes a
		 * fresh selection (and says so). */
		if (!g_state_warned++)
			fprintf(stderr, "kvmem run: warning: --workspace %s: the session state is %zu "
				"bytes, a commit holds at most %u: committing without it\n",
				kvmem_pager_dir(g_pager), len, KVMEM_PAGER_APP_MAX);
		len = 0;
	}
	rc = kvmem_page_source_pager_commit(src, kvmem_session_token_ids(s), kvmem_session_tokens(s),
					  len ? state : NULL, (uint32_t)len);
	free(state);
	if (rc < 0)
		return -1;
	return kvmem_pager_step(g_pager, ++g_step);
}

int pager_cli_close(FILE *f)
{
	kvmem_pager_stats st;
	int rc;

	if (!g_pager)
		return 0;
	kvmem_pager_stats_get(g_pager, &st);
	fprintf(f, "workspace %s: %" PRIu64 " tokens committed; host pool %" PRIu64 " hits, %" PRIu64
		" misses, %" PRIu64 " pages read, %" PRIu64 " evictions; %" PRIu64
		" blocks staged out\n", kvmem_pager_dir(g_pager),
		kvmem_pager_committed_tokens(g_pager), st.host_hits, st.host_misses, st.pages_in,
		st.evictions, st.blocks_out);
	rc = kvmem_pager_close(g_pager);
	g_pager = NULL;
	return rc;
}
