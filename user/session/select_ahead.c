// SPDX-License-Identifier: MIT
/*
 * Selecting for tokens not yet appended.
 *
 * A question's retrieval happens at its last token (for agentlang, the '='
 * after the key): that token's query is the one that looks for the fact.
 * Selecting after appending it is too late — its logits, which give the
 * first answer token, were computed over the old view. So the tokens are run
 * once over the current view only to read their queries (their K/V are
 * dropped: the view's length is put back), the session selects with those
 * queries, and the caller then appends the tokens for real over the new view.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"

int kvmem_session_select_ahead(kvmem_session *s, const int32_t *tokens, int n)
{
	const size_t qw = (size_t)s->cfg.n_heads * s->cfg.head_dim;
	const int T = s->o.query_tokens, want_all = s->o.tap && s->o.tap->ahead;
	kvmem_fwd_out out;
	float *q_all = NULL;
	int keep, rc = 0;
	int64_t len;

	if (s->broken)
		return kvmem_error(EINVAL, "session: unusable after an earlier failure (see the first error)");
	/* The ring below is the stage-out job's until it is done. */
	if (ws_writer_wait(s))
		return kvmem_fail();
	if (n <= 0 || n > s->o.chunk)
		return kvmem_error(EINVAL, "session: select ahead takes 1..%d tokens (the chunk), not %d",
				 s->o.chunk, n);
	if (ws_view_len(s) + (int64_t)n > s->cap_limit && ws_select(s, 1))
		return kvmem_fail();
	if (ws_view_reserve(s, ws_view_len(s) + (int64_t)n))
		return kvmem_fail();
	len = ws_view_len(s);
	/* The selection sees only the last keep tokens' queries, the rows the
	 * session keeps; a tap that wants all n gets a buffer for them. */
	keep = n < T ? n : T;
	if (ws_scratch_alloc(s))	/* given back by kvmem_session_idle */
		return kvmem_fail();
	out = ws_fwd_out(s, keep);
	if (want_all) {
		q_all = malloc(sizeof(float) * s->cfg.n_layers * (size_t)n * qw);
		if (!q_all)
			return kvmem_error(ENOMEM, "session: select ahead: out of memory for the "
					   "tap's queries of %d tokens", n);
		out.q_raw = q_all;
		out.q_last = 0;
	}
	if (s->be->ops->forward(s->be->ctx, s->view, tokens, n, NULL, 0, &out))
		rc = kvmem_error_prefix("session: select ahead");
	/* The slots past len are scratch again. */
	else if (s->be->ops->set_length(s->be->ctx, s->view, len)) {
		s->broken = 1;
		rc = kvmem_error_prefix("session: select ahead");
	}
	if (rc) {
		free(q_all);
		return rc;
	}
	s->st.forwards++;
	if (want_all)
		s->o.tap->ahead(s->o.tap->arg, s, q_all, n, s->blocks.n_tokens);

	/* At the positions the tokens will take; the rows are [L][rows][qw],
	 * the last rows of each layer (rows: keep, or n for the tap). */
	for (int l = 0; l < s->cfg.n_layers; l++) {
		const int rows = want_all ? n : keep;
		const float *src = want_all ? q_all : s->q_raw;

		for (int i = 0; i < keep; i++)
			memcpy(ws_qrow(s, l, i), src + ((size_t)l * rows + (rows - keep + i)) * qw,
			       qw * sizeof(float));
	}
	free(q_all);
	for (int i = 0; i < keep; i++)
		s->qpos[i] = s->blocks.n_tokens + (n - keep) + i;
	s->q_head = 0;
	s->n_q = keep;
	if (ws_select_text(s, 0, tokens, n))
		return kvmem_fail();
	/* The append that follows brings the same tokens' queries back. */
	s->n_q = 0;
	s->q_head = 0;
	return 0;
}

/*
 * The same with another policy scoring (bench recall's --query-view): pol
 * chooses this view, so that the session's own policy, selecting ahead for
 * the same tokens next, reads its queries over what pol brought into view.
 * A diagnostic, not a session mode: the index was built for the session's
 * policy, so pol may need nothing it lacks, and it must be global when the
 * session's is (the plan's block sets are the session's).
 */
int kvmem_session_select_ahead_with(kvmem_session *s, const kvmem_policy_ops *pol,
				    const int32_t *tokens, int n)
{
	const kvmem_policy_ops *own = s->pol;
	const unsigned have = kvmem_index_sums(&s->index) | KVMEM_NEED_TEXT;
	int rc;

	if (!pol)
		return kvmem_error(EINVAL, "session: select ahead with no policy");
	if (pol->per_layer != own->per_layer)
		return kvmem_error(EINVAL, "session: select ahead with %s: it is %s and the "
				   "session's %s is not", pol->name,
				   pol->per_layer ? "per layer" : "global", own->name);
	if (pol->needs & ~have)
		return kvmem_error(EINVAL, "session: select ahead with %s: it needs summaries "
				   "the session's index (for %s) does not keep", pol->name, own->name);
	s->pol = pol;
	rc = kvmem_session_select_ahead(s, tokens, n);
	s->pol = own;
	return rc;
}
