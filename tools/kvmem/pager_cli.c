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

static kvm_pager *g_pager;
static uint64_t g_step;
static int g_state_warned;

int pager_cli_open(const char *dir, const kvm_model *m, int block, uint64_t host_cap,
		   const char *cache_policy, kvm_page_source *src, int32_t **ids, int64_t *n_ids)
{
	kvm_pager_opts po;
	kvm_page_geom g;
	int64_t n;

	*ids = NULL;
	*n_ids = 0;
	memset(src, 0, sizeof(*src));
	if (g_pager)
		return kvm_error("--workspace %s: one workspace per process", dir);
	kvm_pager_opts_default(&po);
	po.flags = KVM_PAGER_CREATE;
	if (host_cap)
		po.host_cap = host_cap;
	if (cache_policy)
		po.policy = cache_policy;
	kvm_page_geom_model(&g, m, block);
	if (kvm_pager_open(dir, &g, &po, &g_pager) < 0)
		return kvm_error_prefix("--workspace");
	if (kvm_page_source_pager(src, g_pager) < 0)
		goto fail;
	n = (int64_t)kvm_pager_tokens(g_pager);
	if (n) {
		*ids = malloc((size_t)n * sizeof(int32_t));
		if (!*ids) {
			kvm_error("--workspace %s: out of memory for %" PRId64 " token ids", dir, n);
			goto fail;
		}
		if (kvm_pager_read_tokens(g_pager, 0, n, *ids) < 0)
			goto fail;
		*n_ids = n;
	}
	return 0;
fail:
	free(*ids);
	*ids = NULL;
	kvm_page_source_destroy(src);
	kvm_pager_close(g_pager);
	g_pager = NULL;
	return -1;
}

int pager_cli_adopt(kvm_session *s, const int32_t *ids, int64_t n)
{
	uint32_t len = 0;
	const void *state = g_pager ? kvm_pager_app_state(g_pager, &len) : NULL;

	if (!n)
		return 0;
	if (state && len && !kvm_session_adopt_state(s, ids, n, state, len))
		return 0;
	/* A refusal leaves the session fresh; a page that could not be read
	 * does not, and there is nothing to fall back to. */
	if (state && len && strncmp(kvm_last_error(), "session state:", 14))
		return -1;
	fprintf(stderr, "kvmem run: warning: --workspace %s: %s; the view starts from a fresh "
		"selection, so what follows may differ from an uninterrupted run\n",
		kvm_pager_dir(g_pager), len ? kvm_last_error() :
		"the last commit holds no session state");
	return kvm_session_adopt(s, ids, n);
}

int pager_cli_commit(kvm_page_source *src, const kvm_session *s)
{
	void *state;
	size_t len;
	int rc;

	if (!g_pager)
		return 0;
	if (kvm_session_save_state(s, &state, &len) < 0)
		return -1;
	if (len > KVM_PAGER_APP_MAX) {
		/* The history is still worth committing; a reopen then makes a
		 * fresh selection (and says so). */
		if (!g_state_warned++)
			fprintf(stderr, "kvmem run: warning: --workspace %s: the session state is %zu "
				"bytes, a commit holds at most %u: committing without it\n",
				kvm_pager_dir(g_pager), len, KVM_PAGER_APP_MAX);
		len = 0;
	}
	rc = kvm_page_source_pager_commit(src, kvm_session_token_ids(s), kvm_session_tokens(s),
					  len ? state : NULL, (uint32_t)len);
	free(state);
	if (rc < 0)
		return -1;
	return kvm_pager_step(g_pager, ++g_step);
}

int pager_cli_close(FILE *f)
{
	kvm_pager_stats st;
	int rc;

	if (!g_pager)
		return 0;
	kvm_pager_stats_get(g_pager, &st);
	fprintf(f, "workspace %s: %" PRIu64 " tokens committed; host pool %" PRIu64 " hits, %" PRIu64
		" misses, %" PRIu64 " pages read, %" PRIu64 " evictions; %" PRIu64
		" blocks staged out\n", kvm_pager_dir(g_pager),
		kvm_pager_committed_tokens(g_pager), st.host_hits, st.host_misses, st.pages_in,
		st.evictions, st.blocks_out);
	rc = kvm_pager_close(g_pager);
	g_pager = NULL;
	return rc;
}
