// SPDX-License-Identifier: MIT
/*
 * The CPU reference of a TP=N forward pass (tp.h): N simulated ranks in one
 * thread of control, each with its weight slices and its own KV cache, and
 * a sum all-reduce between them.
 *
 * Per layer, per rank r: q/k/v from its rows of q_proj/k_proj/v_proj, the
 * per-head norms, RoPE, its KV heads written into kv[r], attention over its
 * query heads, then a partial o_proj over its columns: p_r [n][hidden].
 * All-reduce: p_0 += p_1, += p_2, ... in rank order; x += p_0. Then the
 * same for the MLP over its intermediate units. The residual stream x, the
 * normed input h and the logits are replicated state, identical on every
 * rank by construction (each rank adds the same all-reduced sum), so they
 * are kept once here.
 *
 * Each step is the engine's own kernel call (engine.c) on the rank's slice;
 * with one rank the slices are the whole tensors and the all-reduce is
 * p_0 alone, so the pass is the engine's, bit for bit.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "tp/tp.h"

struct rank {
	kvmem_tp_rank p;
	/* Per layer: q/k/v/gate/up point into the model (contiguous rows);
	 * o and down are packed [hidden][cols] copies when split (owned),
	 * the model's own with one rank. */
	const float **wq, **wk, **wv, **wo, **gate, **up, **down;
	float *owned;		/* the packed copies, one allocation */
	float *q, *k, *v, *att, *g, *u, *part;	/* scratch for max_chunk tokens */
};

struct kvmem_tp_engine {
	const kvmem_model *m;
	int n_ranks, max_chunk;
	struct rank *r;
	float *x, *h;		/* replicated: residual stream, normed input */
	int32_t *q_pos, *kv_pos;
	int kv_pos_cap;
};

static void rank_free(struct rank *r)
{
	free(r->wq);
	free(r->owned);
	free(r->q);
	free(r->k);
	free(r->v);
	free(r->att);
	free(r->g);
	free(r->u);
	free(r->part);
}

void kvmem_tp_engine_free(kvmem_tp_engine *e)
{
	if (!e)
		return;
	for (int i = 0; e->r && i < e->n_ranks; i++)
		rank_free(&e->r[i]);
	free(e->r);
	free(e->x);
	free(e->h);
	free(e->q_pos);
	free(e->kv_pos);
	free(e);
}

/* dst [rows][cols] = columns col0..col0+cols-1 of src [rows][stride]. */
static void pack_cols(float *dst, const float *src, int rows, int stride, int col0, int cols)
{
	for (int i = 0; i < rows; i++)
		memcpy(dst + (size_t)i * cols, src + (size_t)i * stride + col0,
		       sizeof(float) * cols);
}

static int rank_init(struct rank *r, const kvmem_model *m, int n_ranks, int rank, int C)
{
	const kvmem_config *c = &m->cfg;
	const int L = c->n_layers, H = c->hidden, qw = c->n_heads * c->head_dim;
	const size_t hid = (size_t)H;

	if (kvmem_tp_plan(c, n_ranks, rank, &r->p))
		return kvmem_fail();
	if (!(r->wq = calloc(7 * (size_t)L, sizeof(*r->wq))))
		return kvmem_error(ENOMEM, "tensor parallel: out of memory");
	r->wk = r->wq + L;
	r->wv = r->wk + L;
	r->wo = r->wv + L;
	r->gate = r->wo + L;
	r->up = r->gate + L;
	r->down = r->up + L;
	if (n_ranks > 1) {
		size_t per = hid * r->p.o_cols + hid * r->p.n_ff;

		if (!(r->owned = malloc(sizeof(float) * per * L)))
			return kvmem_error(ENOMEM, "tensor parallel: out of memory for rank %d's "
					   "o_proj and down_proj slices (%zu MiB)", rank,
					   sizeof(float) * per * L >> 20);
	}
	for (int l = 0; l < L; l++) {
		const kvmem_layer *W = &m->layers[l];

		r->wq[l] = W->wq + (size_t)r->p.q_row0 * hid;
		r->wk[l] = W->wk + (size_t)r->p.kv_row0 * hid;
		r->wv[l] = W->wv + (size_t)r->p.kv_row0 * hid;
		r->gate[l] = W->w_gate + (size_t)r->p.ff0 * hid;
		r->up[l] = W->w_up + (size_t)r->p.ff0 * hid;
		if (n_ranks == 1) {
			r->wo[l] = W->wo;
			r->down[l] = W->w_down;
			continue;
		}
		float *o = r->owned + (size_t)l * (hid * r->p.o_cols + hid * r->p.n_ff);
		float *dn = o + hid * r->p.o_cols;

		pack_cols(o, W->wo, H, qw, r->p.o_col0, r->p.o_cols);
		pack_cols(dn, W->w_down, H, c->intermediate, r->p.ff0, r->p.n_ff);
		r->wo[l] = o;
		r->down[l] = dn;
	}
	r->q = malloc(sizeof(float) * C * r->p.q_rows);
	r->k = malloc(sizeof(float) * C * r->p.kv_rows);
	r->v = malloc(sizeof(float) * C * r->p.kv_rows);
	r->att = malloc(sizeof(float) * C * r->p.q_rows);
	r->g = malloc(sizeof(float) * C * r->p.n_ff);
	r->u = malloc(sizeof(float) * C * r->p.n_ff);
	r->part = malloc(sizeof(float) * C * hid);
	if (!r->q || !r->k || !r->v || !r->att || !r->g || !r->u || !r->part)
		return kvmem_error(ENOMEM, "tensor parallel: out of memory for chunks of %d tokens",
				   C);
	return 0;
}

kvmem_tp_engine *kvmem_tp_engine_create(const kvmem_model *m, int n_ranks, int max_chunk)
{
	kvmem_tp_engine *e;

	if (kvmem_tp_check(&m->cfg, n_ranks))
		return NULL;
	if (!m->layers) {
		kvmem_error(EINVAL, "tensor parallel: the model has no weights (a geometry only)");
		return NULL;
	}
	if (max_chunk <= 0) {
		kvmem_error(EINVAL, "tensor parallel: chunk size %d is not positive", max_chunk);
		return NULL;
	}
	if (!(e = calloc(1, sizeof(*e))) || !(e->r = calloc(n_ranks, sizeof(*e->r)))) {
		free(e);
		kvmem_error(ENOMEM, "tensor parallel: out of memory");
		return NULL;
	}
	e->m = m;
	e->n_ranks = n_ranks;
	e->max_chunk = max_chunk;
	for (int i = 0; i < n_ranks; i++)
		if (rank_init(&e->r[i], m, n_ranks, i, max_chunk)) {
			kvmem_tp_engine_free(e);
			return NULL;
		}
	e->x = malloc(sizeof(float) * max_chunk * m->cfg.hidden);
	e->h = malloc(sizeof(float) * max_chunk * m->cfg.hidden);
	e->q_pos = malloc(sizeof(int32_t) * max_chunk);
	if (!e->x || !e->h || !e->q_pos) {
		kvmem_tp_engine_free(e);
		kvmem_error(ENOMEM, "tensor parallel: out of memory for chunks of %d tokens",
			    max_chunk);
		return NULL;
	}
	return e;
}

int kvmem_tp_engine_ranks(const kvmem_tp_engine *e)
{
	return e->n_ranks;
}

const kvmem_tp_rank *kvmem_tp_engine_rank(const kvmem_tp_engine *e, int r)
{
	return r >= 0 && r < e->n_ranks ? &e->r[r].p : NULL;
}

/* kv_pos[t] = t for every slot the attention may read (engine.c's). */
static int ensure_kv_pos(kvmem_tp_engine *e, int n)
{
	if (n <= e->kv_pos_cap)
		return 0;
	int cap = n > 2 * e->kv_pos_cap ? n : 2 * e->kv_pos_cap;
	int32_t *p = realloc(e->kv_pos, sizeof(int32_t) * cap);

	if (!p)
		return kvmem_error(ENOMEM, "tensor parallel: out of memory for %d positions", cap);
	for (int t = e->kv_pos_cap; t < cap; t++)
		p[t] = t;
	e->kv_pos = p;
	e->kv_pos_cap = cap;
	return 0;
}

static int check_call(const kvmem_tp_engine *e, kvmem_kvcache *const *kv, const int32_t *tokens,
		      int n, const kvmem_fwd_out *out)
{
	const kvmem_config *c = &e->m->cfg;

	if (n <= 0 || n > e->max_chunk)
		return kvmem_error(EINVAL, "tensor parallel: %d tokens in one call; 1..%d", n,
				   e->max_chunk);
	for (int i = 0; i < e->n_ranks; i++) {
		const kvmem_kvcache *k = kv[i];

		if (k->n_layers != c->n_layers || k->n_kv_heads != e->r[i].p.n_kv_heads ||
		    k->head_dim != c->head_dim)
			return kvmem_error(EINVAL, "tensor parallel: rank %d's kv cache (%d layers, %d "
					   "KV heads, head_dim %d) is not its share (%d, %d, %d)", i,
					   k->n_layers, k->n_kv_heads, k->head_dim, c->n_layers,
					   e->r[i].p.n_kv_heads, c->head_dim);
		if (k->len != kv[0]->len)
			return kvmem_error(EINVAL, "tensor parallel: rank %d's kv cache holds %d tokens, "
					   "rank 0's %d", i, k->len, kv[0]->len);
		if (k->len < 0 || k->len > k->cap - n)
			return kvmem_error(EINVAL, "tensor parallel: rank %d's kv cache holds %d of %d "
					   "slots, no room for %d more", i, k->len, k->cap, n);
	}
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= c->vocab)
			return kvmem_error(EINVAL, "tensor parallel: token %d at index %d is outside "
					   "the vocabulary (0..%d)", tokens[i], i, c->vocab - 1);
	if (out && out->q_last < 0)
		return kvmem_error(EINVAL, "tensor parallel: q_last %d is negative", out->q_last);
	if (out && (out->raw_k_bf16 || out->v_bf16))
		return kvmem_error(EINVAL, "tensor parallel: the CPU reference's rows are fp32");
	return 0;
}

/* Rank r's rows [n][w] of a tensor go to columns col0.. of the full
 * [n][full] layout (raw K, V, raw queries: heads side by side). */
static void gather_cols(float *full, int full_w, int col0, const float *part, int w, int n)
{
	for (int t = 0; t < n; t++)
		memcpy(full + (size_t)t * full_w + col0, part + (size_t)t * w, sizeof(float) * w);
}

/* The sum all-reduce of the ranks' partials, in rank order, into rank 0's
 * buffer (what every rank then holds), added to the residual stream. */
static void allreduce_add(kvmem_tp_engine *e, int n)
{
	const size_t len = (size_t)n * e->m->cfg.hidden;

	for (int i = 1; i < e->n_ranks; i++)
		kvmem_add(e->r[0].part, e->r[i].part, len);
	kvmem_add(e->x, e->r[0].part, len);
}

static void attention_rank(kvmem_tp_engine *e, struct rank *r, kvmem_kvcache *kv, int l, int n,
			   const kvmem_fwd_out *out)
{
	const kvmem_config *c = &e->m->cfg;
	const kvmem_layer *W = &e->m->layers[l];
	const int d = c->head_dim, qw = c->n_heads * d, kw = c->n_kv_heads * d;
	const int hq = r->p.n_heads, hk = r->p.n_kv_heads;

	kvmem_matmul(r->q, e->h, r->wq[l], n, c->hidden, r->p.q_rows);
	kvmem_matmul(r->k, e->h, r->wk[l], n, c->hidden, r->p.kv_rows);
	kvmem_matmul(r->v, e->h, r->wv[l], n, c->hidden, r->p.kv_rows);
	kvmem_rmsnorm(r->q, r->q, W->q_norm, n * hq, d, c->rms_eps);
	kvmem_rmsnorm(r->k, r->k, W->k_norm, n * hk, d, c->rms_eps);

	if (out && out->q_raw) {
		int rows = kvmem_fwd_q_rows(out, n);

		gather_cols(out->q_raw + (size_t)l * rows * qw, qw, r->p.q_row0,
			    r->q + (size_t)(n - rows) * r->p.q_rows, r->p.q_rows, rows);
	}
	if (out && out->raw_k)
		gather_cols(out->raw_k + (size_t)l * n * kw, kw, r->p.kv_row0, r->k, r->p.kv_rows, n);
	if (out && out->v)
		gather_cols(out->v + (size_t)l * n * kw, kw, r->p.kv_row0, r->v, r->p.kv_rows, n);

	kvmem_rope(r->q, e->q_pos, n, hq, d, c->rope_theta);
	kvmem_rope(r->k, e->q_pos, n, hk, d, c->rope_theta);
	for (int t = 0; t < n; t++)
		for (int g = 0; g < hk; g++) {
			size_t src = ((size_t)t * hk + g) * d;

			memcpy(kvmem_kv_k(kv, l, g, kv->len + t), r->k + src, sizeof(float) * d);
			memcpy(kvmem_kv_v(kv, l, g, kv->len + t), r->v + src, sizeof(float) * d);
		}
	kvmem_attention(r->att, r->q, e->q_pos, n, kvmem_kv_k(kv, l, 0, 0), kvmem_kv_v(kv, l, 0, 0),
			e->kv_pos, kv->len + n, (size_t)kv->cap, hq, hk, d,
			(float)(1.0 / sqrt((double)d)));
	kvmem_matmul(r->part, r->att, r->wo[l], n, r->p.o_cols, c->hidden);
}

static void mlp_rank(kvmem_tp_engine *e, struct rank *r, int l, int n)
{
	const kvmem_config *c = &e->m->cfg;

	kvmem_matmul(r->g, e->h, r->gate[l], n, c->hidden, r->p.n_ff);
	kvmem_matmul(r->u, e->h, r->up[l], n, c->hidden, r->p.n_ff);
	kvmem_swiglu(r->g, r->g, r->u, (size_t)n * r->p.n_ff);
	kvmem_matmul(r->part, r->g, r->down[l], n, r->p.n_ff, c->hidden);
}

int kvmem_tp_forward(kvmem_tp_engine *e, kvmem_kvcache *const *kv, const int32_t *tokens,
		     int n, float *logits, int all_logits, const kvmem_fwd_out *out)
{
	const kvmem_config *c = &e->m->cfg;

	if (check_call(e, kv, tokens, n, out) || ensure_kv_pos(e, kv[0]->len + n))
		return kvmem_fail();
	for (int t = 0; t < n; t++)
		e->q_pos[t] = kv[0]->len + t;

	kvmem_embedding(e->x, e->m->embed, tokens, n, c->hidden);
	for (int l = 0; l < c->n_layers; l++) {
		const kvmem_layer *W = &e->m->layers[l];

		kvmem_rmsnorm(e->h, e->x, W->attn_norm, n, c->hidden, c->rms_eps);
		for (int i = 0; i < e->n_ranks; i++)
			attention_rank(e, &e->r[i], kv[i], l, n, out);
		allreduce_add(e, n);
		kvmem_rmsnorm(e->h, e->x, W->mlp_norm, n, c->hidden, c->rms_eps);
		for (int i = 0; i < e->n_ranks; i++)
			mlp_rank(e, &e->r[i], l, n);
		allreduce_add(e, n);
	}
	for (int i = 0; i < e->n_ranks; i++)
		kv[i]->len += n;

	if (!logits)
		return 0;
	if (all_logits) {
		kvmem_rmsnorm(e->h, e->x, e->m->final_norm, n, c->hidden, c->rms_eps);
		kvmem_matmul(logits, e->h, e->m->lm_head, n, c->hidden, c->vocab);
	} else {
		const float *last = e->x + (size_t)(n - 1) * c->hidden;

		kvmem_rmsnorm(e->h, last, e->m->final_norm, 1, c->hidden, c->rms_eps);
		kvmem_matmul(logits, e->h, e->m->lm_head, 1, c->hidden, c->vocab);
	}
	return 0;
}
