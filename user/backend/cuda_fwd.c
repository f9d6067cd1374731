// SPDX-License-Identifier: MIT
/*
 * The cuda backend's forward pass (cuda.c holds the weights, create and
 * the ops table; cuda_view.c the views and place()). Per layer:
 *
 *   h = rmsnorm(x)              qkv = h.[Wq;Wk;Wv]   (one GEMM, bf16 out;
 *                               one kernel with the norm in a decode step
 *                               when "fuse" is on)
 *   q/k norm + rope             q normalised and rotated into b->q, k
 *                               normalised in place, raw q / raw K / V
 *                               copied out for the session (one kernel)
 *   K, V scattered into the view: K rotated at its slot from raw K, exactly
 *                               what place() does (inside the q/k kernel in
 *                               a fused decode step, the same bits)
 *   att = attention(q, view)    x += att.Wo
 *   h = rmsnorm(x)              gu = h.[Wgate;Wup]   x += swiglu(gu).Wdown
 *                               (norm, gate|up and SwiGLU one kernel in a
 *                               fused decode step, act written directly)
 *
 * The inputs of a call (token ids, positions, the key count, one scatter
 * item per layer) go up in one asynchronous copy into one device buffer.
 *
 * Decode as a CUDA graph: a one-token step is captured once and replayed.
 * Everything a replay must know about the step is in that input buffer,
 * read by the kernels on the device: the attention takes the key count
 * from it (kvmem_cuda_attention_decode_bf16), the scatter its slot. A
 * graph is keyed by every device pointer it holds that can move (the
 * view's K and V and its capacity, the ops' scratch, the logits buffer)
 * and by what it copies down (logits, the session's outputs); up to
 * GRAPHS of them are kept (a session beside its full-context twin uses
 * two). A one-token step runs the same kernels with the same arguments
 * with or without a graph, so the bits are the same.
 *
 * A graph must never outlive the device memory it names, even when a new
 * allocation lands at the same address and the key matches again: the
 * driver keeps its own record of a copy node's source allocation, and a
 * replay after that allocation was freed segfaulted inside cudaGraphLaunch
 * (H200, 2026-11-30: test_ws_session on cuda, where all-rows logits grow
 * the logits buffer between decodes). So freeing a view's K/V or the
 * logits buffer first drops the graphs that hold it (cuda_fwd_forget).
 *
 * Graphs are on by default (4-6% of decode speed); KVMEM_CUDA_GRAPH=0
 * turns them off, =2 also makes a failed capture an error (else the
 * backend falls back to plain launches for good).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"
#include "kernels/kernels_cuda.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "backend/cuda_backend.h"

#define GRAPHS 4

struct graph_key {
	const uint16_t *vk, *vv;
	int64_t cap;
	uint64_t scratch_gen;
	const float *logits;	/* the device logits buffer */
	int want_out, has_logits;
};

struct graph {
	cudaGraphExec_t exec;	/* NULL: an empty slot */
	struct graph_key key;
	uint64_t used;
};

struct cuda_fwd {
	uint16_t *qkv;		/* [C][qw + 2 kw] */
	/* The inputs: [n_kv, 3 pad][items: L][ids: n][pos: n], device and
	 * pinned host. */
	char *in, *host_in;
	size_t items_off, ids_off;
	float *host_logits;	/* pinned [vocab]: a graph's logits */
	uint16_t *host_out;	/* pinned [L][qw + 2 kw]: a graph's raw q, raw K, V */
	uint16_t *dout;		/* the same on the device: a graph's outputs go down
				 * in one copy (three cost a decode step 0.06 ms) */
	double *ang;		/* [C][head_dim/2] (cos, sin): the call's RoPE angles,
				 * worked out once for every layer's q/k kernel */
	/* Typed rows (kvmem_fwd_out.raw_k_bf16 / v_bf16): each layer's raw K
	 * and V go down on their own stream as soon as its q/k kernel wrote
	 * them (ev[l]), while the later layers compute. */
	cudaStream_t down;
	cudaEvent_t *ev;	/* [L] */
	/* Pages (kvmem_fwd_out.pages): one layer's pages laid out on the
	 * device, then copied down from there on the rows' stream, which
	 * reuses it layer after layer in order. */
	uint16_t *stage;
	size_t cap_stage;	/* bytes */
	int mode;		/* 0 off, 1 on, 2 on and failures are errors */
	int broken;		/* mode 1 after a failed capture: plain launches */
	struct graph g[GRAPHS];
	uint64_t tick;
};

int cuda_fwd_create(struct cuda *b)
{
	const kvmem_config *c = b->c;
	const size_t C = (size_t)b->max_chunk, L = c->n_layers, ld = b->qw + 2 * b->kw;
	struct cuda_fwd *f = calloc(1, sizeof(*f));
	const char *e = getenv("KVMEM_CUDA_GRAPH");
	size_t bytes;
	int rc;

	if (!f)
		return kvmem_error(ENOMEM, "out of memory");
	b->fwd = f;
	f->mode = e && e[0] == '0' ? 0 : (e && e[0] == '2' ? 2 : 1);
	f->items_off = 16;
	f->ids_off = (f->items_off + L * sizeof(kvmem_scatter_item) + 15) / 16 * 16;
	bytes = f->ids_off + 2 * C * sizeof(int32_t);
	if ((rc = cuda_dev_alloc(&f->qkv, C * ld * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&f->in, bytes, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_pinned(&f->host_in, bytes)) < 0 ||
	    (rc = cuda_pinned(&f->host_logits, (size_t)c->vocab * sizeof(float))) < 0 ||
	    (rc = cuda_pinned(&f->host_out, L * ld * 2)) < 0 ||
	    (rc = cuda_dev_alloc(&f->dout, L * ld * 2, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_dev_alloc(&f->ang, C * c->head_dim * sizeof(double), &b->scratch_bytes)) < 0)
		return rc;
	memset(f->host_in, 0, bytes);
	if (!(f->ev = calloc(L, sizeof(*f->ev))))
		return kvmem_error(ENOMEM, "out of memory");
	if (cudaStreamCreateWithFlags(&f->down, cudaStreamNonBlocking) != cudaSuccess)
		return kvmem_error(EIO, "cuda forward: cannot create the rows' stream");
	for (size_t l = 0; l < L; l++)
		if (cudaEventCreateWithFlags(&f->ev[l], cudaEventDisableTiming) != cudaSuccess)
			return kvmem_error(EIO, "cuda forward: cannot create an event");
	return 0;
}

static void graph_drop(struct graph *g)
{
	if (g->exec)
		cudaGraphExecDestroy(g->exec);
	memset(g, 0, sizeof(*g));
}

void cuda_fwd_destroy(struct cuda *b)
{
	struct cuda_fwd *f = b->fwd;

	cuda_fwdb_destroy(b);
	if (!f)
		return;
	for (int i = 0; i < GRAPHS; i++)
		graph_drop(&f->g[i]);
	for (int l = 0; f->ev && l < b->c->n_layers; l++)
		if (f->ev[l])
			cudaEventDestroy(f->ev[l]);
	free(f->ev);
	if (f->down)
		cudaStreamDestroy(f->down);
	kvmem_cuda_free(f->qkv);
	kvmem_cuda_free(f->dout);
	kvmem_cuda_free(f->ang);
	kvmem_cuda_free(f->stage);
	kvmem_cuda_free(f->in);
	cudaFreeHost(f->host_in);
	cudaFreeHost(f->host_logits);
	cudaFreeHost(f->host_out);
	free(f);
	b->fwd = NULL;
}

void cuda_fwd_forget(struct cuda *b, const void *dev)
{
	struct cuda_fwd *f = b->fwd;

	for (int i = 0; f && dev && i < GRAPHS; i++) {
		const struct graph_key *k = &f->g[i].key;

		if (f->g[i].exec && (dev == k->vk || dev == k->vv || dev == k->logits))
			graph_drop(&f->g[i]);
	}
}

/* Decode attention takes at most 16 rows: one token of a GQA group. */
static int decode_ok(const struct cuda *b)
{
	return b->c->n_heads / b->c->n_kv_heads <= 16;
}

/* Layer l's raw K and V rows ([n][kw] bf16 at p->ok / p->ov) to the host
 * rows, and into the host pages when asked (laid out as pages on the
 * device first: kernels/cuda/pages.cu), on the rows' stream once the
 * compute stream has written them. The next call's q/k kernel may
 * overwrite them only after cuda_forward waited for this stream, which it
 * does before it returns. */
int cuda_fwd_rows_down(struct cuda *b, int l, int n, const struct fwd_ptrs *p)
{
	struct cuda_fwd *f = b->fwd;
	const size_t bytes = (size_t)n * b->kw * 2;
	int rc;

	if (cudaEventRecord(f->ev[l], kvmem_cuda_stream(b->ctx)) != cudaSuccess ||
	    cudaStreamWaitEvent(f->down, f->ev[l], 0) != cudaSuccess ||
	    (p->hk && cudaMemcpyAsync(p->hk + (size_t)l * n * b->kw, p->ok + l * p->sk, bytes,
				      cudaMemcpyDeviceToHost, f->down) != cudaSuccess) ||
	    (p->hv && cudaMemcpyAsync(p->hv + (size_t)l * n * b->kw, p->ov + l * p->sk, bytes,
				      cudaMemcpyDeviceToHost, f->down) != cudaSuccess)) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda forward: copying layer %d's rows down", l);
	}
	if (!p->pages)
		return 0;
	if (p->p8)	/* quantised on the device: the stage's bf16 room holds them */
		rc = kvmem_cuda_rows_to_pages_fp8(b->ctx, f->down, f->stage,
						  p->pages + (size_t)l * p->pnb, p->pt0, n,
						  p->ok + l * p->sk, p->ov + l * p->sk,
						  b->c->n_kv_heads, p->pb, b->c->head_dim);
	else
		rc = kvmem_cuda_rows_to_pages_bf16(b->ctx, f->down, f->stage,
						   p->pages + (size_t)l * p->pnb, p->pt0, n,
						   p->ok + l * p->sk, p->ov + l * p->sk,
						   b->c->n_kv_heads, p->pb, b->c->head_dim);
	if (rc < 0)
		return kvmem_error_prefix("cuda forward: layer %d's pages", l);
	return 0;
}

/* Layer l's first part over n rows: h = rmsnorm(x), qkv = h.[Wq;Wk;Wv]
 * (one kernel with the norm in a decode step when "fuse" is on, else
 * rmsnorm then GEMM, the same bits: kernels/cuda/gemv.cu). Row by row
 * (the GEMM pinned, c->gemm_pin), so a batched prefill runs it over
 * several views' rows at once. */
int cuda_fwd_qkv(struct cuda *b, int l, int n)
{
	const kvmem_config *c = b->c;
	const struct layer_w *w = &b->L[l];

	return kvmem_cuda_norm_gemv_bf16(b->ctx, b->fwd->qkv, KVMEM_GEMM_BF16, b->x, w->attn_norm,
					 c->rms_eps, w->wq, b->h, n, c->hidden,
					 b->qw + 2 * b->kw);
}

/* Its middle over one view's n rows at r: q/k norm and rope, K and V into
 * the view, the rows down, the attention. */
int cuda_fwd_attend(struct cuda *b, kvmem_view *v, int l, int n, int want_out,
		    const struct fwd_ptrs *p, const struct fwd_rows *r)
{
	const kvmem_config *c = b->c;
	const struct layer_w *w = &b->L[l];
	const int D = c->head_dim, ld = b->qw + 2 * b->kw;
	const size_t vl = (size_t)c->n_kv_heads * v->cap * D;	/* one layer of the view */
	const float scale = (float)(1.0 / sqrt((double)D));
	int rc;

	if (v->fp8) {	/* K and V into the view as fp8, then attention: cuda_view_fp8.c */
		uint16_t *q = b->q, *att = b->att;

		if ((rc = kvmem_cuda_qk_norm_rope_bf16(
			     b->ctx, r->qkv, ld, w->q_norm, w->k_norm, n, c->n_heads, c->n_kv_heads, D,
			     c->rms_eps, p->pos, c->rope_theta, r->q,
			     want_out ? p->oq + l * p->sq : NULL, want_out ? p->ok + l * p->sk : NULL,
			     want_out ? p->ov + l * p->sk : NULL)) ||
		    ((p->hk || p->hv || p->pages) && (rc = cuda_fwd_rows_down(b, l, n, p)) < 0))
			return rc;
		/* cuda_fp8_layer reads q and writes att at the backend's
		 * buffers: this view's rows for the call. */
		b->q = r->q;
		b->att = r->att;
		rc = cuda_fp8_layer(b, v, l, n, r->qkv, ld, p->items + l, p->pos, p->n_kv);
		b->q = q;
		b->att = att;
		return rc < 0 ? rc : 0;
	}
	/* The new tokens' K and V go into the view through the very scatter
	 * place() uses (or, in a fused decode step, the same rotation inside
	 * the q/k kernel), so K at a slot is always rotated the same way: from
	 * qkv's K (normalised, not rotated) and V columns. */
	if ((rc = kvmem_cuda_qk_norm_rope_scatter_bf16(
		     b->ctx, r->qkv, ld, w->q_norm, w->k_norm, n, c->n_heads, c->n_kv_heads, D,
		     c->rms_eps, p->pos, c->rope_theta, r->q, want_out ? p->oq + l * p->sq : NULL,
		     want_out ? p->ok + l * p->sk : NULL, want_out ? p->ov + l * p->sk : NULL, v->k,
		     v->v, v->rk, p->items + l, c->n_layers, (int)v->cap, r->ang)) ||
	    ((p->hk || p->hv || p->pages) && (rc = cuda_fwd_rows_down(b, l, n, p)) < 0))
		return rc;
	if (n == 1 && decode_ok(b))
		return kvmem_cuda_attention_decode_bf16(b->ctx, 0, r->att, r->q, p->pos, 1,
							v->k + l * vl, v->v + l * vl, p->n_kv,
							(int)v->cap, (size_t)v->cap, c->n_heads,
							c->n_kv_heads, D, scale);
	return kvmem_cuda_attention_bf16(b->ctx, r->att, r->q, p->pos, n, v->k + l * vl,
					 v->v + l * vl, NULL, (int)(v->len + n), (size_t)v->cap,
					 c->n_heads, c->n_kv_heads, D, scale);
}

/* Its end over n rows: x += att.Wo; h = rmsnorm(x); gu = h.[Wgate;Wup];
 * x += swiglu(gu).Wdown (norm, gate|up and SwiGLU one kernel in a fused
 * decode step, act written directly). Row by row, as cuda_fwd_qkv. */
int cuda_fwd_mlp(struct cuda *b, int l, int n)
{
	const kvmem_config *c = b->c;
	const struct layer_w *w = &b->L[l];
	const int H = c->hidden, I = c->intermediate;
	int rc;

	if ((rc = kvmem_cuda_gemm_bf16(b->ctx, b->x, KVMEM_GEMM_F32_ADD, b->att, w->wo, n, b->qw,
				       H)) ||
	    (rc = kvmem_cuda_norm_gemv_swiglu_bf16(b->ctx, b->act, b->x, w->mlp_norm, c->rms_eps,
						   w->w_gateup, b->h, b->gu, n, H, I)) ||
	    (rc = kvmem_cuda_gemm_bf16(b->ctx, b->x, KVMEM_GEMM_F32_ADD, b->act, w->w_down, n, I,
				       H)))
		return rc;
	return 0;
}

void cuda_fwd_rows_at(struct cuda *b, int a, struct fwd_rows *r)
{
	r->qkv = b->fwd->qkv + (size_t)a * (b->qw + 2 * b->kw);
	r->q = b->q + (size_t)a * b->qw;
	r->att = b->att + (size_t)a * b->qw;
	r->ang = b->fwd->ang + (size_t)a * b->c->head_dim;	/* (cos, sin) pairs */
}

int cuda_fwd_embed(struct cuda *b, const int32_t *ids, const int32_t *pos, int n)
{
	const kvmem_config *c = b->c;
	int rc;

	if ((rc = kvmem_cuda_embedding_bf16(b->ctx, b->x, b->embed, ids, n, c->hidden)) < 0 ||
	    (rc = kvmem_cuda_rope_angles(b->ctx, b->fwd->ang, pos, n, c->head_dim, c->rope_theta)) < 0)
		return rc;
	return 0;
}

int cuda_fwd_rows_wait(struct cuda *b)
{
	if (cudaStreamSynchronize(b->fwd->down) != cudaSuccess)
		return kvmem_error(EIO, "cuda forward: copying the rows down: %s",
				   cudaGetErrorString(cudaGetLastError()));
	return 0;
}

int cuda_fwd_logit_rows(struct cuda *b, int rows)
{
	if (rows <= b->logit_rows)
		return 0;
	cuda_fwd_forget(b, b->logits);
	kvmem_cuda_free(b->logits);
	b->logits = NULL;
	b->logit_rows = 0;
	if (cuda_dev_alloc(&b->logits, (size_t)rows * b->c->vocab * 4, NULL) < 0)
		return kvmem_fail();
	b->logit_rows = rows;
	return 0;
}

static int layer(struct cuda *b, kvmem_view *v, int l, int n, int want_out, const struct fwd_ptrs *p)
{
	struct fwd_rows r;
	int rc;

	cuda_fwd_rows_at(b, 0, &r);
	if ((rc = cuda_fwd_qkv(b, l, n)) || (rc = cuda_fwd_attend(b, v, l, n, want_out, p, &r)) ||
	    (rc = cuda_fwd_mlp(b, l, n)))
		return rc;
	return 0;
}

int cuda_fwd_wants_out(const kvmem_fwd_out *out)
{
	return out && (out->raw_k || out->v || out->q_raw || out->raw_k_bf16 || out->v_bf16 ||
		       out->pages || out->index);
}

void cuda_fwd_out_ptrs(struct fwd_ptrs *p, const kvmem_fwd_out *out, int n)
{
	p->hk = out ? out->raw_k_bf16 : NULL;
	p->hv = out ? out->v_bf16 : NULL;
	p->pages = out ? out->pages : NULL;
	p->pt0 = out ? out->page_t0 : 0;
	p->pb = out ? out->page_block : 0;
	p->pnb = out && out->pages ? (out->page_t0 + n - 1) / out->page_block + 1 : 0;
	p->p8 = out && out->page_dtype == KVMEM_DTYPE_FP8;
}

void cuda_fwd_view_in(const struct cuda *b, const kvmem_view *v, int n, int32_t *n_kv,
		      kvmem_scatter_item *items)
{
	*n_kv = (int32_t)(v->len + n);
	for (int l = 0; l < b->c->n_layers; l++)
		items[l] = (kvmem_scatter_item){ .layer = l, .slot = (int32_t)v->len, .n = n,
						 .tok_stride = b->qw + 2 * b->kw, .src = 0,
						 .head_stride = b->c->head_dim };
}

/* Queue one call's work (n tokens, `rows` logits rows: 0, 1 or n). In a
 * graph (n == 1) the results also go down into the pinned buffers. */
static int enqueue(struct cuda *b, kvmem_view *v, int n, int want_out, int rows, int in_graph,
		   const kvmem_fwd_out *out)
{
	const kvmem_config *c = b->c;
	struct cuda_fwd *f = b->fwd;
	const int32_t *ids = (const int32_t *)(f->in + f->ids_off);
	const size_t L = c->n_layers;
	/* In a graph (one token) the outputs go into one buffer laid out as
	 * host_out, copied down at once; otherwise [L][n] per output. */
	struct fwd_ptrs p = {
		.ids = ids, .pos = ids + n, .n_kv = (const int32_t *)f->in,
		.items = (const kvmem_scatter_item *)(f->in + f->items_off),
		.oq = in_graph ? f->dout : b->oq,
		.ok = in_graph ? f->dout + L * b->qw : b->ok,
		.ov = in_graph ? f->dout + L * (b->qw + b->kw) : b->ov,
		.sq = (size_t)n * b->qw, .sk = (size_t)n * b->kw,
	};
	cudaStream_t st = kvmem_cuda_stream(b->ctx);
	int rc;

	cuda_fwd_out_ptrs(&p, out, n);
	if (in_graph)	/* a graph's rows come down in one copy after it */
		p.hk = p.hv = NULL, p.pages = NULL;

	if ((rc = cuda_fwd_embed(b, p.ids, p.pos, n)) < 0)
		return rc;
	for (int l = 0; l < c->n_layers; l++)
		if ((rc = layer(b, v, l, n, want_out, &p)) < 0)
			return kvmem_error_prefix("cuda forward, layer %d", l);
	/* Logits of every row only when asked: [C][vocab] is 2.5 GB for a
	 * 4K chunk of a 152K vocabulary. */
	if (rows && (rc = kvmem_cuda_logits_bf16(b->ctx, b->logits,
						 b->x + (size_t)(rows == n ? 0 : n - 1) * c->hidden,
						 b->final_norm, b->lm_head, b->tmp, rows, c->hidden,
						 c->vocab, c->rms_eps)) < 0)
		return rc;
	if (!in_graph)
		return 0;
	if (rows && cudaMemcpyAsync(f->host_logits, b->logits, (size_t)c->vocab * sizeof(float),
				    cudaMemcpyDeviceToHost, st) != cudaSuccess)
		return kvmem_error(EIO, "cuda forward: copying the logits down");
	if (want_out && cudaMemcpyAsync(f->host_out, f->dout, L * (b->qw + 2 * b->kw) * 2,
					cudaMemcpyDeviceToHost, st) != cudaSuccess)
		return kvmem_error(EIO, "cuda forward: copying the outputs down");
	return 0;
}

/* Capture a one-token step for key k into slot g. */
static int graph_capture(struct cuda *b, kvmem_view *v, struct graph *g, const struct graph_key *k)
{
	cudaStream_t st = kvmem_cuda_stream(b->ctx);
	cudaGraph_t graph = NULL;
	cudaError_t e;
	int rc;

	graph_drop(g);
	if ((e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal)) != cudaSuccess)
		return kvmem_error(EIO, "cuda decode graph: begin capture: %s", cudaGetErrorString(e));
	rc = enqueue(b, v, 1, k->want_out, k->has_logits, 1, NULL);
	e = cudaStreamEndCapture(st, &graph);
	if (rc < 0 || e != cudaSuccess) {
		if (graph)
			cudaGraphDestroy(graph);
		cudaGetLastError();
		return rc < 0 ? kvmem_error_prefix("cuda decode graph: capture")
			      : kvmem_error(EIO, "cuda decode graph: end capture: %s",
					    cudaGetErrorString(e));
	}
	e = cudaGraphInstantiate(&g->exec, graph, 0);
	cudaGraphDestroy(graph);
	if (e != cudaSuccess) {
		g->exec = NULL;
		cudaGetLastError();
		return kvmem_error(EIO, "cuda decode graph: instantiate: %s", cudaGetErrorString(e));
	}
	g->key = *k;
	return 0;
}

/* Replay (capturing first if needed) a one-token step. */
static int graph_run(struct cuda *b, kvmem_view *v, int want_out, int has_logits)
{
	struct cuda_fwd *f = b->fwd;
	const kvmem_config *c = b->c;
	struct graph_key k;
	struct graph *g = NULL;
	cudaError_t e;
	int rc;

	/* The attention's scratch, grown now: a capture cannot grow it. */
	if ((rc = kvmem_cuda_reserve(b->ctx, kvmem_cuda_attention_scratch(b->ctx, 1, c->n_heads,
									 c->n_kv_heads,
									 c->head_dim))) < 0)
		return rc;
	memset(&k, 0, sizeof(k));	/* compared with memcmp */
	k.vk = v->fp8 ? (const uint16_t *)v->k8 : v->k;	/* fp8: its bytes, freed with its scales */
	k.vv = v->fp8 ? (const uint16_t *)v->v8 : v->v;
	k.cap = v->cap;
	k.scratch_gen = kvmem_cuda_scratch_gen(b->ctx);
	k.logits = b->logits;
	k.want_out = want_out;
	k.has_logits = has_logits;
	for (int i = 0; i < GRAPHS; i++)
		if (f->g[i].exec && f->g[i].key.scratch_gen != k.scratch_gen)
			graph_drop(&f->g[i]);	/* its scratch is freed */
		else if (!g && f->g[i].exec && !memcmp(&f->g[i].key, &k, sizeof(k)))
			g = &f->g[i];
	if (!g) {
		g = &f->g[0];
		for (int i = 1; i < GRAPHS; i++)
			if (!f->g[i].exec || (g->exec && f->g[i].used < g->used))
				g = &f->g[i];
		if ((rc = graph_capture(b, v, g, &k)) < 0)
			return rc;
	}
	g->used = ++f->tick;
	if ((e = cudaGraphLaunch(g->exec, kvmem_cuda_stream(b->ctx))) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda decode graph: launch: %s", cudaGetErrorString(e));
	}
	return 0;
}

/* Widen n bf16 values into fp32 on the host's threads when there are many
 * (a chunk's K at Qwen3-8B width is 38M values; a decode step's outputs,
 * 0.2M, stay on this thread). Each value is converted alone, so the bits
 * do not depend on the split. */
static void widen(float *dst, const uint16_t *src, size_t n)
{
	const size_t piece = (size_t)1 << 16;
	const long pieces = (long)((n + piece - 1) / piece);

	#pragma omp parallel for schedule(static) if (n >= ((size_t)1 << 20))
	for (long i = 0; i < pieces; i++) {
		size_t at = (size_t)i * piece;

		kvmem_bf16_to_f32_n(dst + at, src + at, n - at < piece ? n - at : piece);
	}
}

/*
 * Download the last `rows` of each layer's n rows of w values ([L][n][w]
 * bf16 on the device) and widen them into dst ([L][rows][w] fp32): one
 * strided copy through the pinned host_o, which holds [L][C][w] of the
 * widest output, so any rows <= n <= C fit.
 */
int cuda_fwd_download_f32(struct cuda *b, float *dst, const uint16_t *src, int L, int n, int rows,
			size_t w)
{
	const size_t row_bytes = w * 2, total = (size_t)L * rows * w;
	cudaError_t e;
	int rc;

	if (rows == n)
		e = cudaMemcpyAsync(b->host_o, src, total * 2, cudaMemcpyDeviceToHost,
				    kvmem_cuda_stream(b->ctx));
	else
		e = cudaMemcpy2DAsync(b->host_o, rows * row_bytes, src + (size_t)(n - rows) * w,
				      n * row_bytes, rows * row_bytes, (size_t)L,
				      cudaMemcpyDeviceToHost, kvmem_cuda_stream(b->ctx));
	if (e != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda forward: copying the outputs down: %s",
				   cudaGetErrorString(e));
	}
	if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
		return rc;
	widen(dst, b->host_o, total);
	return 0;
}

/* Check a call's pages and grow the staging they are laid out in. */
int cuda_fwd_pages_ready(struct cuda *b, const kvmem_fwd_out *out, int n)
{
	struct cuda_fwd *f = b->fwd;
	const int B = out->page_block;
	size_t need;
	int rc;

	if (B < 1 || out->page_t0 < 0 || out->page_t0 >= B)
		return kvmem_error(EINVAL, "cuda forward: pages of %d tokens, the first row at token "
				   "%d", B, out->page_t0);
	need = (size_t)((out->page_t0 + n - 1) / B + 1) * 2 * b->kw * B * 2;
	if (need <= f->cap_stage)
		return 0;
	/* Nothing reads the old one: every call waits for the rows' stream. */
	kvmem_cuda_free(f->stage);
	b->scratch_bytes -= f->cap_stage;
	f->stage = NULL;
	f->cap_stage = 0;
	if ((rc = cuda_dev_alloc(&f->stage, need, &b->scratch_bytes)) < 0)
		return rc;
	f->cap_stage = need;
	return 0;
}

int cuda_forward(void *ctx, kvmem_view *v, const int32_t *tokens, int n, float *logits,
		 int all_logits, const kvmem_fwd_out *out)
{
	struct cuda *b = ctx;
	struct cuda_fwd *f = b->fwd;
	const kvmem_config *c = b->c;
	const int L = c->n_layers;
	const int want_out = cuda_fwd_wants_out(out);
	const int typed = out && (out->raw_k_bf16 || out->v_bf16 || out->pages);
	const int rows = logits ? (all_logits ? n : 1) : 0;
	kvmem_scatter_item *items = (kvmem_scatter_item *)(f->host_in + f->items_off);
	int32_t *ids = (int32_t *)(f->host_in + f->ids_off);
	int rc, graphed = 0;

	if (n <= 0 || n > b->max_chunk)
		return kvmem_error(EINVAL, "cuda forward: %d tokens in one call; the backend takes 1..%d",
				   n, b->max_chunk);
	if (out && out->q_last < 0)
		return kvmem_error(EINVAL, "cuda forward: q_last %d is negative (0: every token's "
				   "queries)", out->q_last);
	if (out && !out->pages && !out->raw_k_bf16 != !out->v_bf16)
		return kvmem_error(EINVAL, "cuda forward: typed rows need both raw K and V");
	if (out && out->pages && (rc = cuda_fwd_pages_ready(b, out, n)) < 0)
		return rc;
	if (v->len + n > v->cap)
		return kvmem_error(EINVAL, "cuda forward: the view holds %lld of %lld slots, no room for "
				   "%d more", (long long)v->len, (long long)v->cap, n);
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= c->vocab)
			return kvmem_error(EINVAL, "cuda forward: token %d at index %d is outside the "
					   "vocabulary (0..%d)", tokens[i], i, c->vocab - 1);
	if ((rc = cuda_fwd_logit_rows(b, rows)) < 0)
		return rc;
	/* The inputs: the previous call synchronised, so the pinned buffer
	 * is free to be rewritten. One scatter item per layer: the new tokens
	 * at slots len.., K and V from qkv's columns. */
	cuda_fwd_view_in(b, v, n, (int32_t *)f->host_in, items);
	for (int i = 0; i < n; i++) {
		ids[i] = tokens[i];
		ids[n + i] = (int32_t)(v->len + i);
	}
	if (cudaMemcpyAsync(f->in, f->host_in, f->ids_off + (size_t)n * 8, cudaMemcpyHostToDevice,
			    kvmem_cuda_stream(b->ctx)) != cudaSuccess)
		return kvmem_error(EIO, "cuda forward: copying the inputs up");
	/* Pages are written by plain launches (a prefill chunk's). */
	if (n == 1 && f->mode && !f->broken && decode_ok(b) && !(out && out->pages)) {
		if ((rc = graph_run(b, v, want_out, rows > 0)) == 0)
			graphed = 1;
		else if (f->mode == 2)
			return rc;
		else
			f->broken = 1;	/* plain launches from now on */
	}
	if (!graphed && (rc = enqueue(b, v, n, want_out, rows, 0, out)) < 0) {
		cudaStreamSynchronize(f->down);	/* nothing left writing into the rows */
		return rc;
	}
	/* The index's summaries from the raw K just written (a graph's in
	 * dout), on the device: cuda_fwd_index.c. */
	if (out && out->index &&
	    (rc = cuda_fwd_index(b, graphed ? f->dout + (size_t)L * b->qw : b->ok, n,
				 out->index)) < 0) {
		kvmem_cuda_sync(b->ctx);
		cudaStreamSynchronize(f->down);
		return rc;
	}
	if (graphed) {
		const size_t oL = (size_t)L;

		/* n == 1: the one token's queries, whatever q_last asks. */
		if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
			return kvmem_error_prefix("cuda forward");
		if (logits)
			memcpy(logits, f->host_logits, (size_t)c->vocab * sizeof(float));
		if (out && out->q_raw)
			widen(out->q_raw, f->host_out, oL * b->qw);
		if (out && out->raw_k)
			widen(out->raw_k, f->host_out + oL * b->qw, oL * b->kw);
		if (out && out->v)
			widen(out->v, f->host_out + oL * (b->qw + b->kw), oL * b->kw);
		if (out && out->raw_k_bf16) {	/* typed rows: as they are */
			memcpy(out->raw_k_bf16, f->host_out + oL * b->qw, oL * b->kw * 2);
			memcpy(out->v_bf16, f->host_out + oL * (b->qw + b->kw), oL * b->kw * 2);
		}
		v->len += n;
		return 0;
	}
	if (logits && (rc = kvmem_cuda_download(b->ctx, logits, b->logits,
						(size_t)rows * c->vocab * sizeof(float))) < 0)
		return rc;
	rc = kvmem_cuda_sync(b->ctx);
	/* The typed rows went down layer by layer meanwhile: only the last
	 * layer's copy is left to wait for. */
	if (typed && cudaStreamSynchronize(f->down) != cudaSuccess && !rc)
		rc = kvmem_error(EIO, "cuda forward: copying the rows down: %s",
				 cudaGetErrorString(cudaGetLastError()));
	if (rc < 0)
		return kvmem_error_prefix("cuda forward");
	/* Only the queries asked for come down: [L][rows] of the device's
	 * [L][n], the last rows of each layer. */
	if (out && out->q_raw &&
	    (rc = cuda_fwd_download_f32(b, out->q_raw, b->oq, L, n, kvmem_fwd_q_rows(out, n), b->qw)) < 0)
		return rc;
	if (out && out->raw_k && (rc = cuda_fwd_download_f32(b, out->raw_k, b->ok, L, n, n, b->kw)) < 0)
		return rc;
	if (out && out->v && (rc = cuda_fwd_download_f32(b, out->v, b->ov, L, n, n, b->kw)) < 0)
		return rc;
	v->len += n;
	return 0;
}
