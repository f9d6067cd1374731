// SPDX-License-Identifier: MIT
/*
 * Adopting a stored history: a session starts over pages that are already
 * in its page source (a reopened workspace). Token ids come from the
 * caller, raw K from the pages; the index is rebuilt block by block and a
 * first selection lays out the view. A session whose view was given up
 * takes the index in later, a group of blocks a restore step (state.c,
 * release.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"

struct group;
static int append_group(kvmem_session *s, struct group *g);

/* Raw K of block b, all layers, in rows [L][rows][H][D] of buf from row
 * r on (rows: the group's length, rows_dtype: bf16 when every page of
 * the group is, else f32). */
struct group {
	void *buf;
	uint32_t dtype;
	int rows, at;		/* rows in the group, the next one */
	int64_t first;		/* its first token */
};

static int gather_block(kvmem_session *s, int64_t b, int len, struct group *g)
{
	const int H = s->cfg.n_kv_heads, d = s->cfg.head_dim, B = s->blocks.block;
	const int bf16 = g->dtype == KVMEM_DTYPE_BF16;

	for (int l = 0; l < s->cfg.n_layers; l++) {
		const void *k;
		kvmem_page pg;

		if (s->src->ops->get(s->src->ctx, b, l, &pg))
			return kvmem_error_prefix("session: adopting block %lld", (long long)b);
		k = bf16 ? pg.k : kvmem_page_f32(&pg, 0, (size_t)H * B * d, s->page_f32);
		if (!k || (bf16 && (pg.dtype != KVMEM_DTYPE_BF16 || pg.mem != KVMEM_MEM_HOST))) {
			s->src->ops->put(s->src->ctx, b, l);
			return kvmem_error(EINVAL, "session: adopting block %lld: a page of dtype %u",
					   (long long)b, pg.dtype);
		}
		for (int t = 0; t < len; t++)
			for (int h = 0; h < H; h++) {
				size_t to = (((size_t)l * g->rows + g->at + t) * H + h) * d;
				size_t from = ((size_t)h * B + t) * d;

				if (bf16)
					memcpy((uint16_t *)g->buf + to, (const uint16_t *)k + from,
					       (size_t)d * 2);
				else
					memcpy((float *)g->buf + to, (const float *)k + from,
					       (size_t)d * sizeof(float));
			}
		s->src->ops->put(s->src->ctx, b, l);
	}
	g->at += len;
	return 0;
}

/* Blocks asked ahead while adopting, and taken into the index at once. */
#define ADOPT_AHEAD 32

/* The dtype of block b's first page: the group's rows stay in it when
 * every page is bf16 in host memory (a GPU's workspace: nothing widened),
 * else f32. */
static uint32_t block_dtype(kvmem_session *s, int64_t b)
{
	kvmem_page pg;
	uint32_t dt = KVMEM_DTYPE_F32;

	if (s->src->ops->get(s->src->ctx, b, 0, &pg) == 0) {
		if (pg.dtype == KVMEM_DTYPE_BF16 && pg.mem == KVMEM_MEM_HOST)
			dt = KVMEM_DTYPE_BF16;
		s->src->ops->put(s->src->ctx, b, 0);
	}
	return dt;
}

/* An intake under way (ws_adopt_history_begin .. _step): the group being
 * filled and the next block. */
struct ws_adopting {
	struct group g;
	int64_t b, n;
};

/* Token ids from the caller, now; the index from the pages' raw K by
 * ws_adopt_history_step, a group of ADOPT_AHEAD blocks at a time (one index
 * append each: the layers of a group on the OpenMP threads). */
int ws_adopt_history_begin(kvmem_session *s, const int32_t *tokens, int64_t n)
{
	const int G = ADOPT_AHEAD * s->blocks.block;
	struct ws_adopting *a = calloc(1, sizeof(*a));

	s->tokens = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
	if (a)
		a->g.buf = malloc(sizeof(float) * s->cfg.n_layers * G * s->cfg.n_kv_heads *
				  s->cfg.head_dim);
	if (!s->tokens || !a || !a->g.buf) {
		if (a)
			free(a->g.buf);
		free(a);
		return kvmem_error(ENOMEM, "session: out of memory adopting %lld tokens", (long long)n);
	}
	s->cap_tokens = n ? n : 1;
	memcpy(s->tokens, tokens, (size_t)n * sizeof(int32_t));
	a->n = n;
	s->adopting = a;
	s->blocks.n_tokens = n;
	return 0;
}

void ws_adopt_history_free(kvmem_session *s)
{
	if (s->adopting)
		free(s->adopting->g.buf);
	free(s->adopting);
	s->adopting = NULL;
}

int ws_adopt_history_step(kvmem_session *s, int64_t groups)
{
	struct ws_adopting *a = s->adopting;
	struct group *g;
	const int B = s->blocks.block, G = ADOPT_AHEAD * B;
	int64_t n, done = 0;
	int rc = 0;

	if (!a)
		return 0;
	g = &a->g;
	n = a->n;
	for (; a->b * B < n && !rc; a->b++) {
		const int64_t b = a->b;
		int len = n - b * B < B ? (int)(n - b * B) : B;

		if (b % ADOPT_AHEAD == 0) {
			if (done++ == groups)
				return 1;	/* the next call goes on from here */
			/* Read ahead: a workspace on NVMe is read in batches, the
			 * next one while this one is taken in (a hint; a source
			 * may ignore it). */
			if (s->src->ops->prefetch) {
				int64_t ahead[2 * ADOPT_AHEAD];
				int m = 0;

				for (int64_t x = b ? b + ADOPT_AHEAD : 0;
				     x < b + 2 * ADOPT_AHEAD && x * B < n; x++)
					ahead[m++] = x;
				if (m)
					s->src->ops->prefetch(s->src->ctx, ahead, m);
			}
			g->first = b * B;
			g->rows = n - g->first < G ? (int)(n - g->first) : G;
			g->at = 0;
			g->dtype = block_dtype(s, b);
		}
		rc = gather_block(s, b, len, g);
		/* The group's last block (or a page of another dtype: the rows
		 * so far taken in, the block again in f32). */
		if (rc && g->dtype == KVMEM_DTYPE_BF16 && kvmem_last_errno() == EINVAL) {
			rc = 0;
			if (g->at && (rc = append_group(s, g)) == 0) {
				g->first += g->at;
				g->rows -= g->at;
				g->at = 0;
				g->dtype = KVMEM_DTYPE_F32;
				rc = gather_block(s, b, len, g);
			}
		}
		if (!rc && g->at == g->rows)
			rc = append_group(s, g);
	}
	ws_adopt_history_free(s);
	if (rc) {
		s->broken = 1;
		return kvmem_fail();
	}
	return 0;
}

int ws_adopt_history(kvmem_session *s, const int32_t *tokens, int64_t n)
{
	if (ws_adopt_history_begin(s, tokens, n)) {
		s->broken = 1;
		return kvmem_fail();
	}
	return ws_adopt_history_step(s, INT64_MAX);
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
	/* A fresh selection lays a view out: one given up (see
	 * kvmem_session_adopt_state) comes back first, empty. */
	if (ws_adopt_check(s, tokens, n) || kvmem_session_restore_view(s) ||
	    ws_adopt_history(s, tokens, n))
		return kvmem_fail();
	/* The history is "before the last selection" and in no view yet. */
	s->sel_tokens = n;
	s->view_len = 0;
	s->plan.ws_blocks = kvmem_blocks_count(&s->blocks);
	s->plan.n_sets = 1;
	s->plan.n_tokens = n;
	if (ws_select(s, 0))
		return kvmem_fail();
	/* The history's pages are in host memory now (the index was just
	 * rebuilt from them): the device keeps what it has room for. */
	return ws_pool_fill(s);
}

/* The group's rows into the index. Its rows were laid out for g->rows
 * tokens and the index reads [L][at][H][D]: squeezed first when short. */
static int append_group(kvmem_session *s, struct group *g)
{
	const size_t row = (size_t)s->cfg.n_kv_heads * s->cfg.head_dim *
			   (g->dtype == KVMEM_DTYPE_BF16 ? 2 : 4);

	if (g->at < g->rows)
		for (int l = 1; l < s->cfg.n_layers; l++)
			memmove((char *)g->buf + (size_t)l * g->at * row,
				(char *)g->buf + (size_t)l * g->rows * row, (size_t)g->at * row);
	if (kvmem_index_append_rows(&s->index, g->buf, g->dtype, g->at))
		return kvmem_error_prefix("session: adopting");
	return 0;
}
