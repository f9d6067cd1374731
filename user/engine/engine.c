// SPDX-License-Identifier: MIT
/*
 * The CPU reference engine: one Qwen3 decoder forward pass over a KV view.
 *
 * Per layer: x -> rmsnorm -> q, k, v projections -> per-head q/k RMSNorm ->
 * (raw q, raw K, V handed to the caller) -> RoPE at the slot positions ->
 * K and V written into the view -> causal GQA attention over the view ->
 * o_proj -> residual; then rmsnorm -> down(silu(gate) * up) -> residual.
 * Finally the model norm and lm_head.
 *
 * The K written into the view is kvmem_rope() of a copy of the raw K at the
 * token's slot: rotating a stored raw K at the same slot later (what the
 * workspace layer does) gives the very same bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"

struct kvmem_engine {
	const kvmem_model *m;
	int max_chunk;
	float *x;	/* [C][hidden] residual stream */
	float *h;	/* [C][hidden] normed input, then o_proj / down outputs */
	float *q;	/* [C][n_heads * head_dim] */
	float *k;	/* [C][n_kv_heads * head_dim] */
	float *v;	/* [C][n_kv_heads * head_dim] */
	float *att;	/* [C][n_heads * head_dim] attention output */
	float *gate;	/* [C][intermediate] */
	float *up;	/* [C][intermediate] */
	int32_t *q_pos;	/* [C] */
	int32_t *kv_pos;/* [kv_pos_cap] = 0, 1, 2, ... */
	int kv_pos_cap;
};

static int check_config(const kvmem_config *c)
{
	if (c->n_layers <= 0 || c->hidden <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
	    c->head_dim <= 0 || c->intermediate <= 0 || c->vocab <= 0)
		return kvmem_error(EINVAL, "engine: model geometry has a non-positive size");
	if (c->n_heads % c->n_kv_heads)
		return kvmem_error(EINVAL, "engine: %d attention heads are not a multiple of %d KV heads",
				 c->n_heads, c->n_kv_heads);
	if (c->head_dim % 2)
		return kvmem_error(EINVAL, "engine: head_dim %d is odd; RoPE needs pairs", c->head_dim);
	if (!(c->rope_theta > 0.0))
		return kvmem_error(EINVAL, "engine: rope_theta %g is not positive", c->rope_theta);
	return 0;
}

void kvmem_engine_free(kvmem_engine *e)
{
	if (!e)
		return;
	free(e->x);
	free(e->h);
	free(e->q);
	free(e->k);
	free(e->v);
	free(e->att);
	free(e->gate);
	free(e->up);
	free(e->q_pos);
	free(e->kv_pos);
	free(e);
}

static float *alloc_rows(int rows, int width)
{
	return malloc(sizeof(float) * (size_t)rows * width);
}

kvmem_engine *kvmem_engine_create(const kvmem_model *m, int max_chunk)
{
	const kvmem_config *c = &m->cfg;
	kvmem_engine *e;

	if (check_config(c))
		return NULL;
	if (max_chunk <= 0) {
		kvmem_error(EINVAL, "engine: chunk size %d is not positive", max_chunk);
		return NULL;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		kvmem_error(ENOMEM, "engine: out of memory");
		return NULL;
	}
	e->m = m;
	e->max_chunk = max_chunk;
	int qw = c->n_heads * c->head_dim, kw = c->n_kv_heads * c->head_dim;

	e->x = alloc_rows(max_chunk, c->hidden);
	e->h = alloc_rows(max_chunk, c->hidden);
	e->q = alloc_rows(max_chunk, qw);
	e->k = alloc_rows(max_chunk, kw);
	e->v = alloc_rows(max_chunk, kw);
	e->att = alloc_rows(max_chunk, qw);
	e->gate = alloc_rows(max_chunk, c->intermediate);
	e->up = alloc_rows(max_chunk, c->intermediate);
	e->q_pos = malloc(sizeof(int32_t) * max_chunk);
	if (!e->x || !e->h || !e->q || !e->k || !e->v || !e->att || !e->gate || !e->up ||
	    !e->q_pos) {
		kvmem_engine_free(e);
		kvmem_error(ENOMEM, "engine: out of memory for chunks of %d tokens", max_chunk);
		return NULL;
	}
	return e;
}

const kvmem_model *kvmem_engine_model(const kvmem_engine *e)
{
	return e->m;
}

/* kv_pos[t] = t for every slot the attention may read. */
static int ensure_kv_pos(kvmem_engine *e, int n)
{
	if (n <= e->kv_pos_cap)
		return 0;
	int cap = n > 2 * e->kv_pos_cap ? n : 2 * e->kv_pos_cap;
	int32_t *p = realloc(e->kv_pos, sizeof(int32_t) * cap);

	if (!p)
		return kvmem_error(ENOMEM, "engine: out of memory for %d positions", cap);
	for (int t = e->kv_pos_cap; t < cap; t++)
		p[t] = t;
	e->kv_pos = p;
	e->kv_pos_cap = cap;
	return 0;
}

static int check_call(const kvmem_engine *e, const kvmem_kvcache *kv, const int32_t *tokens, int n)
{
	const kvmem_config *c = &e->m->cfg;

	if (n <= 0 || n > e->max_chunk)
		return kvmem_error(EINVAL, "engine: %d tokens in one call; the engine takes 1..%d", n,
				 e->max_chunk);
	if (kv->n_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads ||
	    kv->head_dim != c->head_dim)
		return kvmem_error(EINVAL, "engine: kv cache geometry (%d layers, %d KV heads, head_dim %d) "
				 "is not the model's (%d, %d, %d)", kv->n_layers, kv->n_kv_heads,
				 kv->head_dim, c->n_layers, c->n_kv_heads, c->head_dim);
	if (kv->len < 0 || kv->len > kv->cap - n)
		return kvmem_error(EINVAL, "engine: kv cache holds %d of %d slots, no room for %d more",
				 kv->len, kv->cap, n);
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= c->vocab)
			return kvmem_error(EINVAL, "engine: token %d at index %d is outside the vocabulary "
					 "(0..%d)", tokens[i], i, c->vocab - 1);
	return 0;
}

/* Rotate K at the new tokens' slots and write K and V into the view. */
static void store_kv(kvmem_engine *e, kvmem_kvcache *kv, int l, int n)
{
	const kvmem_config *c = &e->m->cfg;
	int hk = c->n_kv_heads, d = c->head_dim;

	kvmem_rope(e->k, e->q_pos, n, hk, d, c->rope_theta);
	for (int t = 0; t < n; t++)
		for (int g = 0; g < hk; g++) {
			size_t src = ((size_t)t * hk + g) * d;

			memcpy(kvmem_kv_k(kv, l, g, kv->len + t), e->k + src, sizeof(float) * d);
			memcpy(kvmem_kv_v(kv, l, g, kv->len + t), e->v + src, sizeof(float) * d);
		}
}

static void attention_block(kvmem_engine *e, kvmem_kvcache *kv, int l, int n,
			    const kvmem_fwd_out *out)
{
	const kvmem_config *c = &e->m->cfg;
	const kvmem_layer *L = &e->m->layers[l];
	int d = c->head_dim, qw = c->n_heads * d, kw = c->n_kv_heads * d;

	kvmem_rmsnorm(e->h, e->x, L->attn_norm, n, c->hidden, c->rms_eps);
	kvmem_matmul(e->q, e->h, L->wq, n, c->hidden, qw);
	kvmem_matmul(e->k, e->h, L->wk, n, c->hidden, kw);
	kvmem_matmul(e->v, e->h, L->wv, n, c->hidden, kw);
	kvmem_rmsnorm(e->q, e->q, L->q_norm, n * c->n_heads, d, c->rms_eps);
	kvmem_rmsnorm(e->k, e->k, L->k_norm, n * c->n_kv_heads, d, c->rms_eps);

	if (out && out->q_raw) {
		int rows = kvmem_fwd_q_rows(out, n);	/* the last rows tokens' */

		memcpy(out->q_raw + (size_t)l * rows * qw, e->q + (size_t)(n - rows) * qw,
		       sizeof(float) * rows * qw);
	}
	if (out && out->raw_k)
		memcpy(out->raw_k + (size_t)l * n * kw, e->k, sizeof(float) * n * kw);
	if (out && out->v)
		memcpy(out->v + (size_t)l * n * kw, e->v, sizeof(float) * n * kw);

	kvmem_rope(e->q, e->q_pos, n, c->n_heads, d, c->rope_theta);
	store_kv(e, kv, l, n);
	kvmem_attention(e->att, e->q, e->q_pos, n, kvmem_kv_k(kv, l, 0, 0), kvmem_kv_v(kv, l, 0, 0),
		      e->kv_pos, kv->len + n, (size_t)kv->cap, c->n_heads, c->n_kv_heads, d,
		      (float)(1.0 / sqrt((double)d)));
	kvmem_matmul(e->h, e->att, L->wo, n, qw, c->hidden);
	kvmem_add(e->x, e->h, (size_t)n * c->hidden);
}

static void mlp_block(kvmem_engine *e, int l, int n)
{
	const kvmem_config *c = &e->m->cfg;
	const kvmem_layer *L = &e->m->layers[l];

	kvmem_rmsnorm(e->h, e->x, L->mlp_norm, n, c->hidden, c->rms_eps);
	kvmem_matmul(e->gate, e->h, L->w_gate, n, c->hidden, c->intermediate);
	kvmem_matmul(e->up, e->h, L->w_up, n, c->hidden, c->intermediate);
	kvmem_swiglu(e->gate, e->gate, e->up, (size_t)n * c->intermediate);
	kvmem_matmul(e->h, e->gate, L->w_down, n, c->intermediate, c->hidden);
	kvmem_add(e->x, e->h, (size_t)n * c->hidden);
}

int kvmem_forward(kvmem_engine *e, kvmem_kvcache *kv, const int32_t *tokens, int n,
		float *logits, int all_logits, const kvmem_fwd_out *out)
{
	const kvmem_config *c = &e->m->cfg;

	if (check_call(e, kv, tokens, n) || ensure_kv_pos(e, kv->len + n))
		return kvmem_fail();
	if (out && out->q_last < 0)
		return kvmem_error(EINVAL, "engine: q_last %d is negative (0: every token's "
				   "queries)", out->q_last);
	if (out && (out->raw_k_bf16 || out->v_bf16))
		return kvmem_error(EINVAL, "engine: the cpu engine's rows are fp32 (raw_k, v), "
				   "not bf16");
	for (int t = 0; t < n; t++)
		e->q_pos[t] = kv->len + t;

	kvmem_embedding(e->x, e->m->embed, tokens, n, c->hidden);
	for (int l = 0; l < c->n_layers; l++) {
		attention_block(e, kv, l, n, out);
		mlp_block(e, l, n);
	}
	kv->len += n;

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
