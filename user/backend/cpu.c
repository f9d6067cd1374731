// SPDX-License-Identifier: MIT
/*
 * The cpu backend: the reference engine (user/engine/) over a host kvcache.
 *
 * A view is a kvmem_kvcache: per layer and KV head a run of `cap` slots,
 * K rotated at the slot index. place() rotates a copy of raw K at the slot
 * with kvmem_rope_ang, whose bits are kvmem_rope's (the call the engine
 * makes for a new token) from angles made once for an item's heads and the
 * layers after it at the same slots, so a token placed at the slot the
 * engine gave it holds the same bits.
 *
 * fp8 KV (kv_dtype): the engine rounds each new token's raw K and V
 * through e4m3 before rotating and storing them; place() dequantises an
 * fp8 page (exact), or rounds the rows of any other page the same way,
 * so the view holds the same values either way; the raw K kept beside
 * the view (keep_raw) is the rounded one, so move() keeps the bits too.
 *
 * KVMEM_CPU_KV_ROUND (a research knob, Documentation/cli.md): the same
 * emulation over the backend's own fp32 KV with another rounding (bf16,
 * fp8 on K or V alone, fp8 with a scale per group of channels;
 * kernels_fp8.h, enum kvmem_kv_round), to tell where fp8 loses recall. The
 * pages stay f32 and place() rounds their rows as the engine does. The
 * centred modes (fp8-kc, fp8-kc-k) round K by blocks: the engine centres
 * the blocks of KVMEM_BLOCK_DEFAULT slots a forward holds whole, place()
 * a page placed whole; a part of either is rounded as fp8 a row.
 *
 * With --tp 1 (opts.tp == 1) the forward pass is the tensor-parallel one
 * (user/tp/) with its one rank over the same kvcache: the split code,
 * bit-identical to the engine's (tests/cli/test_tp.sh holds it to that).
 */
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "kernels/kernels.h"
#include "kernels/kernels_bf16.h"	/* kvmem_rope_angles */
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "kvmem/session.h"	/* KVMEM_BLOCK_DEFAULT: the centred modes' block */
#include "tp/tp.h"
#include "util/clock.h"

struct kvmem_view {
	kvmem_kvcache kv;
	float *rk;		/* raw K [L][H][cap][D] when kept (keep_raw), else NULL */
	int keep;
	/* Logits a batched decode left here (kvmem_fwd_item.argmax): two
	 * rows, lg_cur the last forward's; the other is the next one's, so
	 * that a forward that fails leaves the last ones whole. */
	float *lg;
	int lg_cur, lg_have;
};

struct cpu {
	const kvmem_config *c;
	kvmem_engine *e;	/* weights are the model's; scratch for one chunk */
	kvmem_tp_engine *tp;	/* --tp 1: the split forward's one rank, else NULL */
	float *scratch;		/* one page's K or V in f32: H * B * D, grown on demand */
	size_t scratch_n;
	int32_t *pos;		/* positions of one item's tokens */
	int pos_cap;
	double *ang;		/* their rotary angles (kvmem_rope_angles), pos_cap rows */
	int64_t ang_slot;	/* the slots ang holds: ang_slot.. ang_n of them */
	int ang_n;
	double *tab;		/* every slot's angles, slots 0..tab_n-1 (angles_at) */
	int64_t tab_n;
	float *rows;		/* raw K of a forward pass [L][tokens][H][D], for views
				 * that keep it when the caller asks for none */
	size_t rows_n;
	int fp8;		/* views hold fp8 KV */
	int round;		/* how new K/V rows are rounded (enum kvmem_kv_round) */
	uint64_t mem_cap;	/* bytes the views may take (opts.mem_cap); 0: no cap */
	uint64_t view_bytes;	/* what the views hold now */
};

/* Host bytes of a view of cap slots: fp32 K and V, and the raw K when
 * kept, every layer. Under a cap (kvmem_backend_opts.mem_cap: on this
 * backend the views' memory, the weights being the model's) a view grows
 * only while all views stay under it, so that a server can tell a turn
 * that does not fit beside the others (ENOMEM) as it can on a GPU. */
static uint64_t view_bytes(const struct cpu *b, int64_t cap, int keep)
{
	return (uint64_t)cap * b->c->n_layers * b->c->n_kv_heads * b->c->head_dim *
	       sizeof(float) * (keep ? 3 : 2);
}

/* Raw K of layer l, KV head h, slot t of a view that keeps it. */
static float *raw_at(const struct cpu *b, const kvmem_view *v, int l, int h, int64_t t)
{
	return v->rk + (((size_t)l * b->c->n_kv_heads + h) * v->kv.cap + t) * b->c->head_dim;
}

/* b->round: fp8's for fp8 KV, else what KVMEM_CPU_KV_ROUND names. The
 * knob rounds the backend's own fp32 KV only: fp8 KV rounds already, and
 * the split forward (--tp 1) rounds nothing. */
static int kv_round_knob(struct cpu *b, const kvmem_backend_opts *o)
{
	const char *e = getenv("KVMEM_CPU_KV_ROUND");
	int mode = kvmem_kv_round_parse(e);

	if (mode < 0)
		return mode;
	if (mode != KVMEM_KV_ROUND_NONE && (b->fp8 || o->tp == 1))
		return kvmem_error(EINVAL, "KVMEM_CPU_KV_ROUND=%s rounds the cpu backend's own fp32 "
				   "KV: not with %s", e, b->fp8 ? "--kv-dtype fp8" : "--tp 1");
	b->round = b->fp8 ? KVMEM_KV_ROUND_FP8 : mode;
	return 0;
}

/* KVMEM_MATMUL and KVMEM_ATTENTION name the matmul's and the attention's
 * instruction sets (kernels.h); a name the kernel does not know, or one
 * this CPU lacks, refuses the backend rather than leave the best one in
 * use unsaid. */
static int isa_knob(const char *var, int (*use)(const char *), const char *(*isa)(void),
		    const char *what)
{
	const char *e = getenv(var);
	int rc;

	if (!e || !*e || !(rc = use(e)))
		return 0;
	if (rc == -ENOTSUP)
		return kvmem_error(ENOTSUP, "%s=%s: this CPU lacks it (unset it for the best it "
				   "has, %s)", var, e, isa());
	return kvmem_error(EINVAL, "%s=%s: not an instruction set of the cpu %s (c, avx2 or "
			   "avx512)", var, e, what);
}

static int isa_knobs(void)
{
	if (isa_knob("KVMEM_MATMUL", kvmem_matmul_use, kvmem_matmul_isa, "matmul"))
		return -1;
	return isa_knob("KVMEM_ATTENTION", kvmem_attention_use, kvmem_attention_isa, "attention");
}

/* KVMEM_CPU_WEIGHTS=fp32 multiplies by fp32 panels of a bf16 model's
 * weights (the same bits, twice the bytes: the engine's bytes before
 * 2026-12-05, for a benchmark; the engine's bf16 panels are freed); bf16 or unset: by
 * the engine's bf16 copies, where every matmul weight is a bf16 value. */
static int weights_knob(kvmem_engine *e)
{
	const char *v = getenv("KVMEM_CPU_WEIGHTS");

	if (!v || !*v || !strcmp(v, "bf16"))
		return 0;
	if (strcmp(v, "fp32"))
		return kvmem_error(EINVAL, "KVMEM_CPU_WEIGHTS=%s: not fp32 or bf16", v);
	kvmem_engine_use_bf16_weights(e, 0);
	return 0;
}

static int cpu_create(const kvmem_model *m, const kvmem_backend_opts *o, void **ctx)
{
	struct cpu *b = calloc(1, sizeof(*b));

	if (!b)
		return kvmem_error(ENOMEM, "out of memory");
	b->c = &m->cfg;
	if (isa_knobs() < 0) {
		free(b);
		return kvmem_fail();
	}
	if (!m->layers) {
		free(b);
		return kvmem_error(EINVAL, "the model has no weights (a geometry only): the cpu "
				   "backend computes with real ones");
	}
	if (!(b->e = kvmem_engine_create(m, o->max_chunk))) {
		free(b);
		return kvmem_fail();
	}
	b->fp8 = o->kv_dtype == KVMEM_DTYPE_FP8;
	b->mem_cap = o->mem_cap;
	if (weights_knob(b->e) < 0 || kv_round_knob(b, o) < 0) {
		kvmem_engine_free(b->e);
		free(b);
		return kvmem_fail();
	}
	kvmem_engine_set_kv_round(b->e, b->round);
	if (o->tp == 1 && !(b->tp = kvmem_tp_engine_create(m, 1, o->max_chunk))) {
		kvmem_engine_free(b->e);
		free(b);
		return kvmem_fail();
	}
	*ctx = b;
	return 0;
}

static void cpu_destroy(void *ctx)
{
	struct cpu *b = ctx;

	kvmem_engine_free(b->e);
	kvmem_tp_engine_free(b->tp);
	free(b->scratch);
	free(b->pos);
	free(b->ang);
	free(b->tab);
	free(b->rows);
	free(b);
}

static int cpu_view_create(void *ctx, kvmem_view **v)
{
	if (!(*v = calloc(1, sizeof(**v))))
		return kvmem_error(ENOMEM, "cpu view: out of memory");
	return 0;
}

static void cpu_view_destroy(void *ctx, kvmem_view *v)
{
	if (!v)
		return;
	((struct cpu *)ctx)->view_bytes -= view_bytes(ctx, v->kv.cap, v->keep);
	kvmem_kvcache_free(&v->kv);
	free(v->rk);
	free(v->lg);
	free(v);
}

static int cpu_reserve(void *ctx, kvmem_view *v, int64_t slots)
{
	struct cpu *b = ctx;
	const size_t row = (size_t)b->c->head_dim * sizeof(float);
	kvmem_kvcache nk;

	if (slots <= v->kv.cap)
		return 0;
	if (slots > INT_MAX)
		return kvmem_error(EINVAL, "cpu view: %lld slots, at most %d", (long long)slots,
				   INT_MAX);
	/* While it grows the view holds the old and the new copy at once. */
	if (b->mem_cap && b->view_bytes + view_bytes(b, slots, v->keep) > b->mem_cap)
		return kvmem_error(ENOMEM, "cpu view: %lld slots take %.1f MiB; the %.1f MiB cap "
				   "(--gpu-mem: the views' memory on this backend) leaves %.1f MiB "
				   "beside the views held (%.1f MiB)", (long long)slots,
				   view_bytes(b, slots, v->keep) / 1048576.0, b->mem_cap / 1048576.0,
				   (b->mem_cap > b->view_bytes ? b->mem_cap - b->view_bytes : 0) / 1048576.0,
				   b->view_bytes / 1048576.0);
	if (kvmem_kvcache_init(&nk, b->c, (int)slots))
		return kvmem_fail();
	if (v->keep) {
		float *nr = malloc((size_t)b->c->n_layers * b->c->n_kv_heads * slots * row);

		if (!nr) {
			kvmem_kvcache_free(&nk);
			return kvmem_error(ENOMEM, "cpu view: out of memory for the raw K of %lld slots",
					   (long long)slots);
		}
		for (int l = 0; l < b->c->n_layers && v->kv.len; l++)
			for (int h = 0; h < b->c->n_kv_heads; h++)
				memcpy(nr + (((size_t)l * b->c->n_kv_heads + h) * slots) * b->c->head_dim,
				       raw_at(b, v, l, h, 0), v->kv.len * row);
		free(v->rk);
		v->rk = nr;
	}
	for (int l = 0; l < b->c->n_layers && v->kv.len; l++)
		for (int h = 0; h < b->c->n_kv_heads; h++) {
			memcpy(kvmem_kv_k(&nk, l, h, 0), kvmem_kv_k(&v->kv, l, h, 0), v->kv.len * row);
			memcpy(kvmem_kv_v(&nk, l, h, 0), kvmem_kv_v(&v->kv, l, h, 0), v->kv.len * row);
		}
	nk.len = v->kv.len;
	b->view_bytes += view_bytes(b, slots, v->keep) - view_bytes(b, v->kv.cap, v->keep);
	kvmem_kvcache_free(&v->kv);
	v->kv = nk;
	return 0;
}

static int cpu_keep_raw(void *ctx, kvmem_view *v)
{
	struct cpu *b = ctx;
	int cap = v->kv.cap;

	if (v->kv.len)
		return kvmem_error(EINVAL, "cpu view: raw K asked for after %d tokens", v->kv.len);
	if (v->keep)
		return 0;
	v->keep = 1;
	if (cap) {	/* room made already: made again, with the raw K */
		b->view_bytes -= view_bytes(b, cap, 0);
		kvmem_kvcache_free(&v->kv);
		if (cpu_reserve(b, v, cap)) {
			v->keep = 0;
			return kvmem_fail();
		}
	}
	return 0;
}

static int64_t cpu_capacity(void *ctx, const kvmem_view *v)
{
	return v->kv.cap;
}

static int64_t cpu_length(void *ctx, const kvmem_view *v)
{
	return v->kv.len;
}

static int cpu_set_length(void *ctx, kvmem_view *v, int64_t len)
{
	if (len < 0 || len > v->kv.cap)
		return kvmem_error(EINVAL, "cpu view: length %lld outside 0..%d", (long long)len,
				   v->kv.cap);
	v->kv.len = (int)len;
	return 0;
}

/* Raw K of a forward's new tokens ([L][n][H][D] rows) beside their slots
 * at..at+n-1 of a view that keeps it. */
static void keep_rows(struct cpu *b, kvmem_view *v, const float *raw_k, int at, int n)
{
	const int H = b->c->n_kv_heads, D = b->c->head_dim;

	for (int l = 0; l < b->c->n_layers; l++)
		for (int j = 0; j < n; j++)
			for (int h = 0; h < H; h++) {
				float *rk = raw_at(b, v, l, h, at + j);

				memcpy(rk, raw_k + (((size_t)l * n + j) * H + h) * D, sizeof(float) * D);
			}
	/* the K the view was rotated from: the engine's rounding of the run */
	for (int l = 0; l < b->c->n_layers; l++)
		for (int h = 0; h < H; h++)
			kvmem_kv_round_k_run(raw_at(b, v, l, h, at), n, 1, D, at, KVMEM_BLOCK_DEFAULT,
					     b->round);
}

/* Room for a forward's raw K rows of `tokens` tokens when the caller asks
 * for none but a view keeps them. */
static float *rows_for(struct cpu *b, size_t tokens)
{
	size_t need = (size_t)b->c->n_layers * tokens * b->c->n_kv_heads * b->c->head_dim;

	if (need > b->rows_n) {
		float *p = realloc(b->rows, sizeof(float) * need);

		if (!p) {
			kvmem_error(ENOMEM, "cpu forward: out of memory");
			return NULL;
		}
		b->rows = p;
		b->rows_n = need;
	}
	return b->rows;
}

/* The engine's batched forward, or with --tp 1 the split forward's one
 * rank over each item's view in turn (the split code has no batched form). */
static int engine_forward_batch(struct cpu *b, const kvmem_fwd_seq *seqs, int n)
{
	if (!b->tp)
		return kvmem_forward_batch(b->e, seqs, n);
	for (int i = 0; i < n; i++)
		if (kvmem_tp_forward(b->tp, &seqs[i].kv, seqs[i].tokens, seqs[i].n, seqs[i].logits,
				     seqs[i].all_logits, seqs[i].out))
			return -1;
	return 0;
}

static int cpu_logits_fetch(void *ctx, kvmem_view *v, float *dst)
{
	const struct cpu *b = ctx;

	if (!v || !v->lg_have)
		return kvmem_error(EINVAL, "cpu backend: no logits were left beside this view");
	memcpy(dst, v->lg + (size_t)v->lg_cur * b->c->vocab, sizeof(float) * (size_t)b->c->vocab);
	return 0;
}

/* The engine's batched forward over the items' views; a view that keeps
 * raw K gets the new rows beside its slots too. A decode item that asks
 * (argmax) gets its logits into the view's own row and its greedy draw (or
 * its draw at a temperature: .draw), as the cuda backend leaves them on the
 * device: nothing is saved here,
 * but sessions take the path they take on a GPU. */
static int cpu_forward_batch(void *ctx, const kvmem_fwd_item *items, int n)
{
	struct cpu *b = ctx;
	kvmem_fwd_seq stack[16] = { 0 }, *seqs = n <= 16 ? stack : malloc(sizeof(*seqs) * (size_t)n);
	kvmem_fwd_out ostack[16], *outs = n <= 16 ? ostack : malloc(sizeof(*outs) * (size_t)n);
	size_t lent = 0, at = 0;
	float *rows = NULL;
	int rc = 0;

	if (!seqs || !outs) {
		rc = kvmem_error(ENOMEM, "cpu forward: out of memory for a batch of %d", n);
		goto out;
	}
	for (int i = 0; i < n; i++)	/* rows to lend to views that keep raw K */
		if (items[i].v->keep && !(items[i].out && items[i].out->raw_k))
			lent += (size_t)(items[i].n > 0 ? items[i].n : 0);
	if (lent && !(rows = rows_for(b, lent))) {
		rc = kvmem_fail();
		goto out;
	}
	for (int i = 0; i < n; i++) {
		const kvmem_fwd_item *it = &items[i];

		outs[i] = it->out ? *it->out : (kvmem_fwd_out){ 0 };
		if (it->v->keep && !outs[i].raw_k) {
			outs[i].raw_k = rows + at;
			at += (size_t)b->c->n_layers * it->n * b->c->n_kv_heads * b->c->head_dim;
		}
		seqs[i] = (kvmem_fwd_seq){ .kv = &it->v->kv, .tokens = it->tokens, .n = it->n,
					   .logits = it->logits, .all_logits = it->all_logits,
					   .out = it->out || it->v->keep ? &outs[i] : NULL };
		if (kvmem_fwd_lazy(it)) {
			if (!it->v->lg &&
			    !(it->v->lg = malloc(2 * sizeof(float) * (size_t)b->c->vocab))) {
				rc = kvmem_error(ENOMEM, "cpu forward: out of memory for logits");
				goto out;
			}
			seqs[i].logits = it->v->lg + (size_t)(1 - it->v->lg_cur) * b->c->vocab;
		}
	}
	if (engine_forward_batch(b, seqs, n)) {
		rc = kvmem_fail();
		goto out;
	}
	for (int i = 0; i < n; i++) {
		kvmem_view *v = items[i].v;
		int bad;

		if (v->keep)
			keep_rows(b, v, outs[i].raw_k, v->kv.len - items[i].n, items[i].n);
		if (kvmem_fwd_lazy(&items[i])) {
			v->lg_cur = 1 - v->lg_cur;
			v->lg_have = 1;
			*items[i].argmax = kvmem_argmax_finite(seqs[i].logits, b->c->vocab, &bad);
			if (*items[i].argmax >= 0 && items[i].draw &&
			    items[i].draw->temperature > 0.0f)	/* as the GPU draws */
				*items[i].argmax = kvmem_sample_spec(seqs[i].logits, b->c->vocab,
								     items[i].draw);
		}
	}
out:
	if (seqs != stack)
		free(seqs);
	if (outs != ostack)
		free(outs);
	return rc;
}

static int cpu_forward(void *ctx, kvmem_view *v, const int32_t *tokens, int n, float *logits,
		       int all_logits, const kvmem_fwd_out *out)
{
	const kvmem_fwd_item one = { .v = v, .tokens = tokens, .n = n, .logits = logits,
				     .all_logits = all_logits, .out = out };

	return cpu_forward_batch(ctx, &one, 1);
}

static int grow(struct cpu *b, size_t page_elems, int n)
{
	if (page_elems > b->scratch_n) {
		float *p = realloc(b->scratch, page_elems * sizeof(float));

		if (!p)
			return kvmem_error(ENOMEM, "cpu view: out of memory for a page");
		b->scratch = p;
		b->scratch_n = page_elems;
	}
	if (n > b->pos_cap) {
		int32_t *p = realloc(b->pos, (size_t)n * sizeof(int32_t));
		double *a = p ? realloc(b->ang, (size_t)n * b->c->head_dim * sizeof(double)) : NULL;

		if (p)
			b->pos = p;
		if (!a)
			return kvmem_error(ENOMEM, "cpu view: out of memory");
		b->ang = a;
		b->pos_cap = n;
	}
	return 0;
}

/*
 * The rotary angles of slots slot..slot+n-1 (kvmem_rope_angles' bits).
 * Made per head and layer, the double sin and cos were most of a place()
 * (a warm step's placements 87-94 of its 105 ms, the embedded model at an
 * 8K view); then a cache of the last item's slots, which a block's layers
 * at the same slots one after another reuse, but a layout layer by layer
 * (a view laid out again, a selection in steps) does not: each item made
 * them again (a selection of 2.4K tokens a layer a call: 2.9 ms of
 * placements against 0.9 whole). So every slot's angles are kept, made once
 * as the views reach them: d doubles a slot, 512 KiB for the embedded
 * model's 2K window, 32 MiB for 32K slots of head_dim 128. Past TAB_MAX
 * slots, the last item's cache as before, its positions in b->pos (grow() first).
 */
#define TAB_MAX ((int64_t)1 << 16)

static const double *angles_at(struct cpu *b, int64_t slot, int n)
{
	const int d = b->c->head_dim;

	if (slot + n <= b->tab_n)
		return b->tab + (size_t)slot * d;
	if (slot + n <= TAB_MAX) {
		int64_t cap = b->tab_n ? 2 * b->tab_n : 256;
		double *t;
		int32_t *pos;

		while (cap < slot + n)
			cap *= 2;
		cap = cap < TAB_MAX ? cap : TAB_MAX;
		t = realloc(b->tab, (size_t)cap * d * sizeof(double));
		pos = malloc((size_t)(cap - b->tab_n) * sizeof(int32_t));
		if (t)
			b->tab = t;
		if (t && pos) {
			for (int64_t i = b->tab_n; i < cap; i++)
				pos[i - b->tab_n] = (int32_t)i;
			kvmem_rope_angles(t + (size_t)b->tab_n * d, pos, (int)(cap - b->tab_n), d,
					  b->c->rope_theta);
			b->tab_n = cap;
			free(pos);
			return b->tab + (size_t)slot * d;
		}
		free(pos);	/* short of memory: the small cache does */
	}
	if (slot != b->ang_slot || n > b->ang_n) {
		for (int i = 0; i < n; i++)
			b->pos[i] = (int32_t)(slot + i);
		kvmem_rope_angles(b->ang, b->pos, n, d, b->c->rope_theta);
		b->ang_slot = slot;
		b->ang_n = n;
	}
	return b->ang;
}

static int place_one(struct cpu *b, kvmem_view *v, const kvmem_place *it)
{
	const int d = b->c->head_dim, H = b->c->n_kv_heads;
	const size_t page_elems = (size_t)H * it->stride * d, run = (size_t)it->n * d;
	const float *pk, *pv;

	if (it->layer < 0 || it->layer >= b->c->n_layers || it->n <= 0 || it->u0 < 0 ||
	    it->u0 + it->n > it->stride || it->slot < 0 || it->slot + it->n > v->kv.cap)
		return kvmem_error(EINVAL, "cpu view: bad placement (layer %d, tokens %d+%d of %d, "
				   "slot %lld of %d)", it->layer, it->u0, it->n, it->stride,
				   (long long)it->slot, v->kv.cap);
	if (grow(b, page_elems, it->n))
		return kvmem_fail();
	/* K first, through the scratch page when it needs widening; then V. */
	if (!(pk = kvmem_page_f32(&it->page, 0, page_elems, b->scratch)))
		return kvmem_fail();
	/* An fp8 view from a page of another dtype, or a knob's rounding: its
	 * rows rounded as the engine rounds a new token's (an fp8 page is
	 * exact already). */
	const int round = b->round && it->page.dtype != KVMEM_DTYPE_FP8;
	const double *ang = angles_at(b, it->slot, it->n);

	for (int h = 0; h < H; h++) {
		float *dk = kvmem_kv_k(&v->kv, it->layer, h, (int)it->slot);

		memcpy(dk, pk + ((size_t)h * it->stride + it->u0) * d, run * sizeof(float));
		/* a centred mode: the page is the block (centred when placed whole) */
		if (round)
			kvmem_kv_round_k_run(dk, it->n, 1, d, it->u0, it->stride, b->round);
		if (v->keep)
			memcpy(raw_at(b, v, it->layer, h, it->slot), dk, run * sizeof(float));
		kvmem_rope_ang(dk, it->n, d, ang);
	}
	if (!(pv = kvmem_page_f32(&it->page, 1, page_elems, b->scratch)))
		return kvmem_fail();
	for (int h = 0; h < H; h++) {
		float *dv = kvmem_kv_v(&v->kv, it->layer, h, (int)it->slot);

		memcpy(dv, pv + ((size_t)h * it->stride + it->u0) * d, run * sizeof(float));
		if (round)
			kvmem_kv_round_rows(dv, (size_t)it->n, d, b->round, 1);
	}
	return 0;
}

static int cpu_place(void *ctx, kvmem_view *v, const kvmem_place *items, int n)
{
	for (int i = 0; i < n; i++)
		if (place_one(ctx, v, &items[i]))
			return kvmem_fail();
	return 0;
}

/* Every item's raw K and V first copied aside, then written at the new
 * slots: K from that raw K by the very rotation a place() runs. */
static int cpu_move(void *ctx, kvmem_view *v, const kvmem_move *items, int n)
{
	struct cpu *b = ctx;
	const int H = b->c->n_kv_heads, D = b->c->head_dim;
	size_t total = 0, at = 0;
	float *save;

	if (!v->keep)
		return kvmem_error(ENOTSUP, "cpu move: the view keeps no raw K");
	for (int i = 0; i < n; i++) {
		const kvmem_move *m = &items[i];

		if (m->layer < 0 || m->layer >= b->c->n_layers || m->n <= 0 || m->from < 0 ||
		    m->to < 0 || m->from + m->n > v->kv.cap || m->to + m->n > v->kv.cap)
			return kvmem_error(EINVAL, "cpu move: bad move (layer %d, %d tokens from slot "
					   "%lld to %lld of %d)", m->layer, m->n, (long long)m->from,
					   (long long)m->to, v->kv.cap);
		total += (size_t)m->n * H * D;
	}
	if (!n)
		return 0;
	if (!(save = malloc(2 * total * sizeof(float))))
		return kvmem_error(ENOMEM, "cpu move: out of memory for %zu tokens' K and V", total);
	for (int i = 0; i < n; i++)
		for (int h = 0; h < H; h++) {
			size_t len = (size_t)items[i].n * D;

			memcpy(save + at, raw_at(b, v, items[i].layer, h, items[i].from),
			       len * sizeof(float));
			memcpy(save + total + at, kvmem_kv_v(&v->kv, items[i].layer, h, (int)items[i].from),
			       len * sizeof(float));
			at += len;
		}
	at = 0;
	for (int i = 0; i < n; i++) {
		const kvmem_move *m = &items[i];

		if (grow(b, 0, m->n)) {
			free(save);
			return kvmem_fail();
		}
		const double *ang = angles_at(b, m->to, m->n);

		for (int h = 0; h < H; h++) {
			size_t len = (size_t)m->n * D;
			float *dk = kvmem_kv_k(&v->kv, m->layer, h, (int)m->to);

			memcpy(raw_at(b, v, m->layer, h, m->to), save + at, len * sizeof(float));
			memcpy(dk, save + at, len * sizeof(float));
			kvmem_rope_ang(dk, m->n, D, ang);
			memcpy(kvmem_kv_v(&v->kv, m->layer, h, (int)m->to), save + total + at,
			       len * sizeof(float));
			at += len;
		}
	}
	free(save);
	return 0;
}

static const kvmem_kvcache *cpu_host_view(void *ctx, const kvmem_view *v)
{
	return &v->kv;
}

/* OpenBLAS sgemm at 1024^3 (best of 3) and memcpy of 256 MiB (best of 3). */
static int cpu_ceilings(void *ctx, kvmem_ceilings *out)
{
	const int n = 1024;
	const size_t bytes = 256u << 20;
	float *a = malloc(sizeof(float) * n * n * 3);
	char *x = malloc(bytes), *y = malloc(bytes);
	double best = 1e30, bestc = 1e30;

	if (!a || !x || !y) {
		free(a);
		free(x);
		free(y);
		return kvmem_error(ENOMEM, "cpu ceilings: out of memory");
	}
	for (size_t i = 0; i < (size_t)n * n * 3; i++)
		a[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	memset(x, 1, bytes);
	memset(y, 2, bytes);
	for (int r = 0; r < 3; r++) {
		double t0 = kvmem_now_s(), t;

		kvmem_matmul_blas(a + 2 * (size_t)n * n, a, a + (size_t)n * n, n, n, n);
		t = kvmem_now_s() - t0;
		best = t < best ? t : best;
		t0 = kvmem_now_s();
		memcpy(y, x, bytes);
		t = kvmem_now_s() - t0;
		bestc = t < bestc ? t : bestc;
	}
	memset(out, 0, sizeof(*out));
	snprintf(out->device, sizeof(out->device), "CPU, %d threads", omp_get_max_threads());
	out->matmul_tflops = 2.0 * n * n * n / best / 1e12;
	out->matmul_type = "fp32 (OpenBLAS sgemm)";
	out->copy_gbps = 2.0 * bytes / bestc / 1e9;
	free(a);
	free(x);
	free(y);
	return 0;
}

static int cpu_weight_bytes(void *ctx)
{
	const struct cpu *b = ctx;

	return kvmem_engine_bf16_weights(b->e) ? 2 : 4;
}

const kvmem_backend_ops kvmem_backend_cpu_ops = {
	.name = "cpu",
	.what = "the reference engine on the CPU (fp32, OpenBLAS, bit-exact)",
	.fp8 = 1,
	.create = cpu_create,
	.destroy = cpu_destroy,
	.view_create = cpu_view_create,
	.view_destroy = cpu_view_destroy,
	.reserve = cpu_reserve,
	.capacity = cpu_capacity,
	.length = cpu_length,
	.set_length = cpu_set_length,
	.forward = cpu_forward,
	.place = cpu_place,
	.host_view = cpu_host_view,
	.ceilings = cpu_ceilings,
	.weight_bytes = cpu_weight_bytes,
	.keep_raw = cpu_keep_raw,
	.move = cpu_move,
	.forward_batch = cpu_forward_batch,
	.logits_fetch = cpu_logits_fetch,
};
