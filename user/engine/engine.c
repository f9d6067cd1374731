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
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kernels/cpu/bits.h"
#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"	/* kvmem_rope_angles */
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "kvmem/session.h"	/* KVMEM_BLOCK_DEFAULT: the centred modes' block */

/* A layer's matmul weights as panels (make_panels), bf16 or fp32: [Wq; Wk;
 * Wv] and [Wgate; Wup] are one matrix each, one product a step (a row's bits
 * are the same in a product of more columns: kernels/cpu/matmul.c), one pass
 * over its columns and one wait for the threads where there were three or
 * two. */
struct layer_panels {
	const void *wqkv, *wo, *w_gate_up, *w_down;
};

struct kvmem_engine {
	const kvmem_model *m;
	int max_chunk;
	int rows_cap;	/* rows the scratch below holds: max_chunk, more for a batch */
	float *x;	/* [rows][hidden] residual stream */
	float *h;	/* [rows][hidden] normed input, then o_proj / down outputs */
	float *q;	/* [rows][n_heads * head_dim] */
	float *k;	/* [rows][n_kv_heads * head_dim] */
	float *v;	/* [rows][n_kv_heads * head_dim] */
	float *att;	/* [rows][n_heads * head_dim] attention output */
	float *gate;	/* [rows][intermediate] */
	float *up;	/* [rows][intermediate] */
	float *wide;	/* [rows][qkv or gate|up]: a fused projection's output */
	float *last;	/* [rows][hidden]: the normed rows whose logits are wanted */
	int32_t *q_pos;	/* [rows] each row's slot in its own view */
	double *ang;	/* [rows][head_dim / 2][2] their RoPE cos, sin: made once a
			 * pass for q and K of every layer (kvmem_rope's bits) */
	int32_t *kv_pos;/* [kv_pos_cap] = 0, 1, 2, ... */
	int kv_pos_cap;
	/* The model's matmul weights as panels (make_panels), lp and lm_p
	 * pointing into wp; none: the products read the model's row-major
	 * weights (the same bits, slower). */
	struct layer_panels *lp;
	const void *lm_p;
	void *wp;
	int wp_b16;	/* wp holds bf16 panels, else fp32 */
	int w16_state;	/* 0: not tried, 1: made, -1: the weights are not bf16 */
	int kv_round;	/* how new K and V are rounded (enum kvmem_kv_round):
			 * fp8 KV, or the cpu backend's research knob */
	/* A batch's per-sequence scratch: its first row and its attention. */
	int *r0;
	kvmem_att_seq *att_seqs;
	int seqs_cap;
	float *lbuf;	/* [lbuf_n] logits of the batch's last-token rows */
	size_t lbuf_n;
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
	free(e->wide);
	free(e->last);
	free(e->q_pos);
	free(e->ang);
	free(e->kv_pos);
	free(e->r0);
	free(e->att_seqs);
	free(e->lbuf);
	free(e->wp);
	free(e->lp);
	free(e);
}

/* Scratch for `rows` rows at once (a chunk, or a batch's rows). */
static int grow_rows(kvmem_engine *e, int rows)
{
	const kvmem_config *c = &e->m->cfg;
	const size_t qw = (size_t)c->n_heads * c->head_dim, kw = (size_t)c->n_kv_heads * c->head_dim;
	const size_t I = (size_t)c->intermediate;
	struct { float **p; size_t width; } f[] = {
		{ &e->x, (size_t)c->hidden }, { &e->h, (size_t)c->hidden }, { &e->q, qw },
		{ &e->k, kw }, { &e->v, kw }, { &e->att, qw }, { &e->gate, I }, { &e->up, I },
		{ &e->wide, qw + 2 * kw > 2 * I ? qw + 2 * kw : 2 * I },
		{ &e->last, (size_t)c->hidden },
	};
	int32_t *qp;
	double *ang;

	if (rows <= e->rows_cap)
		return 0;
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		float *p = realloc(*f[i].p, sizeof(float) * f[i].width * (size_t)rows);

		if (!p)
			return kvmem_error(ENOMEM, "engine: out of memory for %d rows", rows);
		*f[i].p = p;
	}
	if (!(qp = realloc(e->q_pos, sizeof(int32_t) * (size_t)rows)))
		return kvmem_error(ENOMEM, "engine: out of memory for %d rows", rows);
	e->q_pos = qp;
	if (!(ang = realloc(e->ang, sizeof(double) * (size_t)c->head_dim * (size_t)rows)))
		return kvmem_error(ENOMEM, "engine: out of memory for %d rows", rows);
	e->ang = ang;
	e->rows_cap = rows;
	return 0;
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
	kvmem_engine_use_bf16_weights(e, 1);
	if (grow_rows(e, max_chunk)) {
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

/* w as bf16 into dst, if every value is a bf16 widened (its low 16 bits
 * zero): then the bf16 matmul has the fp32 one's bits. */
static bool narrow_exact(uint16_t *dst, const float *w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t u = f32_bits(w[i]);

		if (u & 0xffff)
			return false;
		dst[i] = (uint16_t)(u >> 16);
	}
	return true;
}

/* One product's matrix into panels at *p (moved past it), *dst pointing at
 * them: its parts (fp32, [rows][in] each) one after another into tmp, as
 * bf16 when b16 (false if a weight is not a bf16 value) or fp32, then
 * packed. */
static bool pack_product(char **p, void *tmp, const void **dst, int in, int out,
			 const float *const part[3], const int rows[3], int b16)
{
	size_t at = 0;

	for (int j = 0; j < 3 && part[j]; j++) {
		const size_t n = (size_t)rows[j] * in;

		if (b16 && !narrow_exact((uint16_t *)tmp + at, part[j], n))
			return false;
		if (!b16)
			memcpy((float *)tmp + at, part[j], n * sizeof(float));
		at += n;
	}
	if (b16)
		kvmem_panels_pack((uint16_t *)*p, tmp, in, out);
	else
		kvmem_panels_pack_f32((float *)*p, tmp, in, out);
	*dst = *p;
	*p += kvmem_panels_count(in, out) * (b16 ? sizeof(uint16_t) : sizeof(float));
	return true;
}

/* The matmul weights packed in panels (kernels/cpu/matmul_panels.c): bf16
 * when b16, where every one is a bf16 value (a bf16 checkpoint's fp32
 * copies are): decode reads every weight once a step, and half the bytes
 * is most of its time (the embedded model's 22.8 MB as fp32, 11.4 MB as
 * bf16); else fp32. Either gives the row-major product's bits in under
 * half its time. [Wq; Wk; Wv] and [Wgate; Wup] are one matrix each, one
 * product a step. Left out (-1) when the copies would take more than an
 * eighth of the machine's memory, or b16 and a weight is not bf16. */
static int make_panels(kvmem_engine *e, int b16)
{
	const kvmem_config *c = &e->m->cfg;
	const int H = c->hidden, Q = c->n_heads * c->head_dim, K = c->n_kv_heads * c->head_dim;
	const int I = c->intermediate;
	const size_t per_layer = kvmem_panels_count(H, Q + 2 * K) + kvmem_panels_count(Q, H) +
				 kvmem_panels_count(H, 2 * I) + kvmem_panels_count(I, H);
	const size_t total = per_layer * (size_t)c->n_layers + kvmem_panels_count(H, c->vocab);
	const size_t sizes[] = { (size_t)(Q + 2 * K) * H, (size_t)H * Q, (size_t)2 * I * H,
				 (size_t)H * I, (size_t)c->vocab * H };
	const size_t esz = b16 ? sizeof(uint16_t) : sizeof(float);
	size_t tmp_n = 0;
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	char *p;
	void *tmp;
	bool ok = true;

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		tmp_n = sizes[i] > tmp_n ? sizes[i] : tmp_n;
	if (!e->m->layers || !e->m->lm_head)	/* a geometry with no weights */
		return -1;
	if (pages > 0 && page > 0 && (total + tmp_n) * esz > (size_t)pages * (size_t)page / 8)
		return -1;
	e->wp = malloc(total * esz);
	e->lp = calloc((size_t)c->n_layers, sizeof(*e->lp));
	e->wp_b16 = b16;
	tmp = malloc(tmp_n * esz);	/* one matrix row-major, then packed */
	if (!e->wp || !e->lp || !tmp) {
		free(tmp);
		return -1;
	}
	p = e->wp;
	for (int l = 0; ok && l < c->n_layers; l++) {
		const kvmem_layer *L = &e->m->layers[l];
		struct layer_panels *B = &e->lp[l];

		ok = pack_product(&p, tmp, &B->wqkv, H, Q + 2 * K,
				  (const float *const[3]){ L->wq, L->wk, L->wv }, (const int[3]){ Q, K, K },
				  b16) &&
		     pack_product(&p, tmp, &B->wo, Q, H, (const float *const[3]){ L->wo },
				  (const int[3]){ H }, b16) &&
		     pack_product(&p, tmp, &B->w_gate_up, H, 2 * I,
				  (const float *const[3]){ L->w_gate, L->w_up }, (const int[3]){ I, I },
				  b16) &&
		     pack_product(&p, tmp, &B->w_down, I, H, (const float *const[3]){ L->w_down },
				  (const int[3]){ H }, b16);
	}
	ok = ok && pack_product(&p, tmp, &e->lm_p, H, c->vocab,
				(const float *const[3]){ e->m->lm_head }, (const int[3]){ c->vocab }, b16);
	free(tmp);
	return ok ? 1 : -1;
}

static void drop_panels(kvmem_engine *e)
{
	free(e->wp);
	free(e->lp);
	e->wp = NULL;
	e->lp = NULL;
	e->lm_p = NULL;
}

/* on: bf16 panels where every weight is a bf16 value, else fp32 panels;
 * off: fp32 panels (KVMEM_CPU_WEIGHTS=fp32: twice the bytes, the same
 * bits); either left out when memory is short: the row-major product. */
int kvmem_engine_use_bf16_weights(kvmem_engine *e, int on)
{
	if (on && !e->w16_state) {
		drop_panels(e);
		if ((e->w16_state = make_panels(e, 1)) < 0)
			drop_panels(e);
	}
	if (!on && e->wp && e->wp_b16) {	/* bf16 panels unused: their memory back */
		drop_panels(e);
		e->w16_state = 0;
	}
	if (!e->wp && make_panels(e, 0) < 0)
		drop_panels(e);
	return kvmem_engine_bf16_weights(e);
}

int kvmem_engine_bf16_weights(const kvmem_engine *e)
{
	return e->wp && e->wp_b16;
}

/* y[n][out] = x[n][in] . w^T, by the panels p where the engine has them,
 * else by w as the model holds it (the same bits). */
static void proj(const kvmem_engine *e, float *y, const float *x, const float *w, const void *p,
		 int n, int in, int out)
{
	if (p && e->wp_b16)
		kvmem_matmul_panels(y, x, p, n, in, out);
	else if (p)
		kvmem_matmul_panels_f32(y, x, p, n, in, out);
	else
		kvmem_matmul(y, x, w, n, in, out);
}

void kvmem_engine_set_kv_round(kvmem_engine *e, int mode)
{
	e->kv_round = mode;
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

/* One batch as the layers see it: n_seqs sequences, T rows in all,
 * sequence i's rows r0[i]..r0[i] + seqs[i].n - 1. */
struct batch {
	const kvmem_fwd_seq *seqs;
	int n_seqs, T;
	const int *r0;
};

/* Rotate x[T][heads][head_dim] by the rows' angles: kvmem_rope's bits,
 * without its sines and cosines again for every layer, q and K (a 58-token
 * prefill of the embedded model made 22K of them). */
static void rope_rows(float *x, const double *ang, int T, int heads, int d)
{
	for (int t = 0; t < T; t++)
		for (int h = 0; h < heads; h++)
			kvmem_rope_ang(x + ((size_t)t * heads + h) * d, 1, d, ang + (size_t)t * d);
}

/* Rotate K at the new tokens' slots and write K and V into each view. */
static void store_kv(kvmem_engine *e, const struct batch *b, int l)
{
	const kvmem_config *c = &e->m->cfg;
	int hk = c->n_kv_heads, d = c->head_dim;

	/* fp8: the values a page of fp8 gives back. K a sequence at a time:
	 * a centred mode's blocks are the view's slots. */
	for (int i = 0; i < b->n_seqs; i++)
		kvmem_kv_round_k_run(e->k + (size_t)b->r0[i] * hk * d, b->seqs[i].n, hk, d,
				     b->seqs[i].kv->len, KVMEM_BLOCK_DEFAULT, e->kv_round);
	kvmem_kv_round_rows(e->v, (size_t)b->T * hk, d, e->kv_round, 1);
	rope_rows(e->k, e->ang, b->T, hk, d);
	for (int i = 0; i < b->n_seqs; i++) {
		kvmem_kvcache *kv = b->seqs[i].kv;

		for (int t = 0; t < b->seqs[i].n; t++)
			for (int g = 0; g < hk; g++) {
				size_t src = ((size_t)(b->r0[i] + t) * hk + g) * d;

				memcpy(kvmem_kv_k(kv, l, g, kv->len + t), e->k + src, sizeof(float) * d);
				memcpy(kvmem_kv_v(kv, l, g, kv->len + t), e->v + src, sizeof(float) * d);
			}
	}
}

/* The rows a sequence's caller asked for: raw queries (its last rows),
 * raw K and V of layer l. */
static void give_rows(kvmem_engine *e, const struct batch *b, int l)
{
	const kvmem_config *c = &e->m->cfg;
	const size_t qw = (size_t)c->n_heads * c->head_dim, kw = (size_t)c->n_kv_heads * c->head_dim;

	for (int i = 0; i < b->n_seqs; i++) {
		const kvmem_fwd_out *out = b->seqs[i].out;
		const int n = b->seqs[i].n;
		const size_t r0 = (size_t)b->r0[i];

		if (!out)
			continue;
		if (out->q_raw) {
			int rows = kvmem_fwd_q_rows(out, n);	/* the last rows tokens' */

			memcpy(out->q_raw + (size_t)l * rows * qw, e->q + (r0 + n - rows) * qw,
			       sizeof(float) * rows * qw);
		}
		if (out->raw_k)
			memcpy(out->raw_k + (size_t)l * n * kw, e->k + r0 * kw, sizeof(float) * n * kw);
		if (out->v)
			memcpy(out->v + (size_t)l * n * kw, e->v + r0 * kw, sizeof(float) * n * kw);
	}
}

static void attention_block(kvmem_engine *e, const struct batch *b, int l)
{
	const kvmem_config *c = &e->m->cfg;
	const kvmem_layer *L = &e->m->layers[l];
	const struct layer_panels *B = e->wp ? &e->lp[l] : NULL;
	int d = c->head_dim, qw = c->n_heads * d, kw = c->n_kv_heads * d, T = b->T;

	kvmem_rmsnorm(e->h, e->x, L->attn_norm, T, c->hidden, c->rms_eps);
	if (B) {	/* q, k and v in one product over [Wq; Wk; Wv] */
		const int w = qw + 2 * kw;

		proj(e, e->wide, e->h, NULL, B->wqkv, T, c->hidden, w);
		for (int t = 0; t < T; t++) {
			const float *r = e->wide + (size_t)t * w;

			memcpy(e->q + (size_t)t * qw, r, sizeof(float) * qw);
			memcpy(e->k + (size_t)t * kw, r + qw, sizeof(float) * kw);
			memcpy(e->v + (size_t)t * kw, r + qw + kw, sizeof(float) * kw);
		}
	} else {
		proj(e, e->q, e->h, L->wq, NULL, T, c->hidden, qw);
		proj(e, e->k, e->h, L->wk, NULL, T, c->hidden, kw);
		proj(e, e->v, e->h, L->wv, NULL, T, c->hidden, kw);
	}
	kvmem_rmsnorm(e->q, e->q, L->q_norm, T * c->n_heads, d, c->rms_eps);
	kvmem_rmsnorm(e->k, e->k, L->k_norm, T * c->n_kv_heads, d, c->rms_eps);
	give_rows(e, b, l);

	rope_rows(e->q, e->ang, T, c->n_heads, d);
	store_kv(e, b, l);
	for (int i = 0; i < b->n_seqs; i++) {
		const kvmem_kvcache *kv = b->seqs[i].kv;

		e->att_seqs[i] = (kvmem_att_seq){
			.q0 = b->r0[i], .n_q = b->seqs[i].n, .q_pos = e->q_pos + b->r0[i],
			.k = kvmem_kv_k(kv, l, 0, 0), .v = kvmem_kv_v(kv, l, 0, 0),
			.kv_pos = e->kv_pos, .n_kv = kv->len + b->seqs[i].n, .kv_stride = (size_t)kv->cap,
		};
	}
	kvmem_attention_batch(e->att, e->q, e->att_seqs, b->n_seqs, c->n_heads, c->n_kv_heads, d,
			      (float)(1.0 / sqrt((double)d)));
	proj(e, e->h, e->att, L->wo, B ? B->wo : NULL, T, qw, c->hidden);
	kvmem_add(e->x, e->h, (size_t)T * c->hidden);
}

static void mlp_block(kvmem_engine *e, int l, int n)
{
	const kvmem_config *c = &e->m->cfg;
	const kvmem_layer *L = &e->m->layers[l];
	const struct layer_panels *B = e->wp ? &e->lp[l] : NULL;

	kvmem_rmsnorm(e->h, e->x, L->mlp_norm, n, c->hidden, c->rms_eps);
	if (B) {	/* gate and up in one product over [Wgate; Wup] */
		const size_t I = (size_t)c->intermediate;

		proj(e, e->wide, e->h, NULL, B->w_gate_up, n, c->hidden, 2 * c->intermediate);
		for (int t = 0; t < n; t++)
			kvmem_swiglu(e->gate + t * I, e->wide + t * 2 * I, e->wide + t * 2 * I + I, I);
	} else {
		proj(e, e->gate, e->h, L->w_gate, NULL, n, c->hidden, c->intermediate);
		proj(e, e->up, e->h, L->w_up, NULL, n, c->hidden, c->intermediate);
		kvmem_swiglu(e->gate, e->gate, e->up, (size_t)n * c->intermediate);
	}
	proj(e, e->h, e->gate, L->w_down, B ? B->w_down : NULL, n, c->intermediate, c->hidden);
	kvmem_add(e->x, e->h, (size_t)n * c->hidden);
}

/* Room for the logits of the batch's last-token rows (before anything
 * changes: logits_out cannot fail). */
static int grow_logits(kvmem_engine *e, const kvmem_fwd_seq *seqs, int n_seqs)
{
	size_t R = 0, V = (size_t)e->m->cfg.vocab;
	float *p;

	for (int i = 0; i < n_seqs; i++)
		R += seqs[i].logits && !seqs[i].all_logits;
	if (R < 2 || R * V <= e->lbuf_n)
		return 0;
	if (!(p = realloc(e->lbuf, sizeof(float) * R * V)))
		return kvmem_error(ENOMEM, "engine: out of memory for %zu rows of logits", R);
	e->lbuf = p;
	e->lbuf_n = R * V;
	return 0;
}

/* Logits: a sequence that wants every row's gets them straight into its
 * buffer; the last rows of the others go through lm_head together. The
 * matmul's rows do not depend on their neighbours, so either way a row
 * has the bits it would have alone. */
static void logits_out(kvmem_engine *e, const struct batch *b)
{
	const kvmem_config *c = &e->m->cfg;
	const size_t H = (size_t)c->hidden, V = (size_t)c->vocab;
	const void *lm_p = e->wp ? e->lm_p : NULL;
	int R = 0, only = -1;

	for (int i = 0; i < b->n_seqs; i++) {
		const kvmem_fwd_seq *q = &b->seqs[i];

		if (!q->logits)
			continue;
		if (q->all_logits) {
			kvmem_rmsnorm(e->h, e->x + (size_t)b->r0[i] * H, e->m->final_norm, q->n,
				      c->hidden, c->rms_eps);
			proj(e, q->logits, e->h, e->m->lm_head, lm_p, q->n, c->hidden, c->vocab);
			continue;
		}
		kvmem_rmsnorm(e->last + (size_t)R * H, e->x + (size_t)(b->r0[i] + q->n - 1) * H,
			      e->m->final_norm, 1, c->hidden, c->rms_eps);
		only = i;
		R++;
	}
	if (R == 1) {	/* one sequence: straight into its buffer */
		proj(e, b->seqs[only].logits, e->last, e->m->lm_head, lm_p, 1, c->hidden, c->vocab);
		return;
	}
	if (!R)
		return;
	proj(e, e->lbuf, e->last, e->m->lm_head, lm_p, R, c->hidden, c->vocab);
	R = 0;
	for (int i = 0; i < b->n_seqs; i++)
		if (b->seqs[i].logits && !b->seqs[i].all_logits)
			memcpy(b->seqs[i].logits, e->lbuf + (size_t)R++ * V, sizeof(float) * V);
}

static int check_out(const kvmem_fwd_out *out)
{
	if (out && out->q_last < 0)
		return kvmem_error(EINVAL, "engine: q_last %d is negative (0: every token's "
				   "queries)", out->q_last);
	if (out && (out->raw_k_bf16 || out->v_bf16))
		return kvmem_error(EINVAL, "engine: the cpu engine's rows are fp32 (raw_k, v), "
				   "not bf16");
	return 0;
}

/* Per-sequence scratch for n sequences. */
static int grow_seqs(kvmem_engine *e, int n)
{
	int *r0;
	kvmem_att_seq *a;

	if (n <= e->seqs_cap)
		return 0;
	if (!(r0 = realloc(e->r0, sizeof(int) * (size_t)n)))
		return kvmem_error(ENOMEM, "engine: out of memory for %d sequences", n);
	e->r0 = r0;
	if (!(a = realloc(e->att_seqs, sizeof(*a) * (size_t)n)))
		return kvmem_error(ENOMEM, "engine: out of memory for %d sequences", n);
	e->att_seqs = a;
	e->seqs_cap = n;
	return 0;
}

int kvmem_forward_batch(kvmem_engine *e, const kvmem_fwd_seq *seqs, int n_seqs)
{
	const kvmem_config *c = &e->m->cfg;
	struct batch b = { .seqs = seqs, .n_seqs = n_seqs, .r0 = NULL };
	int need_pos = 0;

	if (n_seqs <= 0)
		return kvmem_error(EINVAL, "engine: a batch of %d sequences", n_seqs);
	for (int i = 0; i < n_seqs; i++) {
		const kvmem_fwd_seq *q = &seqs[i];

		if (check_call(e, q->kv, q->tokens, q->n) || check_out(q->out))
			return n_seqs > 1 ? kvmem_error_prefix("engine: sequence %d of the batch", i)
					  : kvmem_fail();
		for (int j = 0; j < i; j++)
			if (seqs[j].kv == q->kv)
				return kvmem_error(EINVAL, "engine: sequences %d and %d of the batch "
						   "share one view", j, i);
		if (b.T > INT_MAX - q->n)
			return kvmem_error(EINVAL, "engine: a batch of more than %d rows", INT_MAX);
		b.T += q->n;
		need_pos = q->kv->len + q->n > need_pos ? q->kv->len + q->n : need_pos;
	}
	if (grow_rows(e, b.T) || grow_seqs(e, n_seqs) || ensure_kv_pos(e, need_pos) ||
	    grow_logits(e, seqs, n_seqs))
		return kvmem_fail();
	b.r0 = e->r0;
	for (int i = 0, r = 0; i < n_seqs; r += seqs[i].n, i++) {
		e->r0[i] = r;
		for (int t = 0; t < seqs[i].n; t++)
			e->q_pos[r + t] = seqs[i].kv->len + t;
		kvmem_embedding(e->x + (size_t)r * c->hidden, e->m->embed, seqs[i].tokens, seqs[i].n,
				c->hidden);
	}
	kvmem_rope_angles(e->ang, e->q_pos, b.T, c->head_dim, c->rope_theta);
	for (int l = 0; l < c->n_layers; l++) {
		attention_block(e, &b, l);
		mlp_block(e, l, b.T);
	}
	for (int i = 0; i < n_seqs; i++)
		seqs[i].kv->len += seqs[i].n;
	logits_out(e, &b);
	return 0;
}

int kvmem_forward(kvmem_engine *e, kvmem_kvcache *kv, const int32_t *tokens, int n,
		  float *logits, int all_logits, const kvmem_fwd_out *out)
{
	const kvmem_fwd_seq one = { .kv = kv, .tokens = tokens, .n = n, .logits = logits,
				    .all_logits = all_logits, .out = out };

	return kvmem_forward_batch(e, &one, 1);
}
