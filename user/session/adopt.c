// SPDX-License-Identifier: MIT
/*
 * Adopting a stored history: a session starts over pages that are already
 * in its page source (a reopened workspace). Token ids come from the
 * caller, raw K from the pages; the index is rebuilt block by block and a
 * first selection lays out the view.
 */
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"

/* Raw K of block b, all layers, in the index's [L][len][H][D] layout. */
static int gather_block(kvmem_session *s, int64_t b, int len, float *out)
{
	const int H = s->cfg.n_kv_heads, d = s->cfg.head_dim, B = s->blocks.block;

	for (int l = 0; l < s->cfg.n_layers; l++) {
		const float *k;
		kvmem_page pg;

		if (s->src->ops->get(s->src->ctx, b, l, &pg))
			return kvmem_error_prefix("session: adopting block %lld", (long long)b);
		if (!(k = kvmem_page_f32(&pg, 0, (size_t)H * B * d, s->page_f32))) {
			s->src->ops->put(s->src->ctx, b, l);
			return kvmem_error_prefix("session: adopting block %lld", (long long)b);
		}
		for (int t = 0; t < len; t++)
			for (int h = 0; h < H; h++)
				memcpy(out + (((size_t)l * len + t) * H + h) * d,
				       k + ((size_t)h * B + t) * d, (size_t)d * sizeof(float));
		s->src->ops->put(s->src->ctx, b, l);
	}
	return 0;
}

/* Blocks asked ahead while adopting. */
#define ADOPT_AHEAD 32

/* Token ids from the caller, the index from the pages' raw K. */
int ws_adopt_history(kvmem_session *s, const int32_t *tokens, int64_t n)
{
	const int B = s->blocks.block;
	float *buf;
	int rc = 0;

	s->tokens = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
	buf = malloc(sizeof(float) * s->cfg.n_layers * B * s->cfg.n_kv_heads * s->cfg.head_dim);
	if (!s->tokens || !buf) {
		free(buf);
		return kvmem_error(ENOMEM, "session: out of memory adopting %lld tokens", (long long)n);
	}
	s->cap_tokens = n ? n : 1;
	memcpy(s->tokens, tokens, (size_t)n * sizeof(int32_t));
	for (int64_t b = 0; b * B < n && !rc; b++) {
		int len = n - b * B < B ? (int)(n - b * B) : B;

		/* Read ahead: a workspace on NVMe is read in batches, the next
		 * one while this one is taken in (a hint; a source may ignore
		 * it). */
		if (b % ADOPT_AHEAD == 0 && s->src->ops->prefetch) {
			int64_t ahead[2 * ADOPT_AHEAD];
			int m = 0;

			for (int64_t a = b ? b + ADOPT_AHEAD : 0; a < b + 2 * ADOPT_AHEAD && a * B < n; a++)
				ahead[m++] = a;
			if (m)
				s->src->ops->prefetch(s->src->ctx, ahead, m);
		}

		rc = gather_block(s, b, len, buf) || kvmem_index_append(&s->index, buf, len);
	}
	free(buf);
	if (rc) {
		s->broken = 1;
		return kvmem_fail();
	}
	s->blocks.n_tokens = n;
	return 0;
}

/* Only a fresh session adopts, and only ids of its vocabulary. */
int ws_adopt_check(const kvmem_session *s, const int32_t *tokens, int64_t n)
{
	if (s->broken || s->blocks.n_tokens || s->st.forwards || s->tokens)
		return kvmem_error(EINVAL, "session: adopt needs a fresh session");
	if (n < 0)
		return kvmem_error(EINVAL, "session: cannot adopt %lld tokens", (long long)n);
	for (int64_t i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= s->cfg.vocab)
			return kvmem_error(EINVAL, "session: adopted token %lld is %d, outside the vocabulary (0..%d)",
					 (long long)i, tokens[i], s->cfg.vocab - 1);
	return 0;
}

int kvmem_session_adopt(kvmem_session *s, const int32_t *tokens, int64_t n)
{
	if (ws_adopt_check(s, tokens, n) || ws_adopt_history(s, tokens, n))
		return kvmem_fail();
	/* The history is "before the last selection" and in no view yet. */
	s->sel_tokens = n;
	s->view_len = 0;
	s->plan.ws_blocks = kvmem_blocks_count(&s->blocks);
	s->plan.n_sets = 1;
	s->plan.n_tokens = n;
	return ws_select(s, 0);
}
