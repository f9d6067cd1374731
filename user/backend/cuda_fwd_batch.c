// SPDX-License-Identifier: MIT
/*
 * The cuda backend's batched forward (forward_batch): one decode token of
 * each of n conversations, each on its own view, in one pass. Per layer:
 *
 *   h = rmsnorm(x[0..n))          qkv = h.[Wq;Wk;Wv]      one GEMM, n rows
 *   q/k norm + rope, each row's K and V into its own view: the lone
 *             forward's fused kernel, one launch, a view and item per row
 *             (kvmem_cuda_qk_norm_rope_scatter_rows_bf16; a launch per
 *             item when "fuse" is off)
 *   att = attention of every item over its own view   one launch
 *             (kvmem_cuda_attention_batch: the v5 decode kernel, a CTA
 *             per split, KV head and item)
 *   x += att.Wo; h = rmsnorm(x); gu = h.[Wgate;Wup]; act = swiglu(gu);
 *   x += act.Wdown                                    one GEMM each
 *
 * then the logits of the n rows in one GEMM.
 *
 * Over fp8 views (the backend's kv_dtype) the middle of a layer is the
 * lone fp8 forward's (cuda_view_fp8.c): q/k norm and q's rotation over
 * every row in one launch (kvmem_cuda_qk_norm_rope_bf16), each row's K
 * rotated from its e4m3 bytes and V into its own view, one launch
 * (kvmem_cuda_fp8_view_put_rows), and the register form of the fp8 decode
 * over every view in one launch (kvmem_cuda_att_dec_batch with the views'
 * scales). A GQA group over 8 or KVMEM_CUDA_FP8_REG=0 (where a lone step
 * takes another form): -ENOTSUP, one by one.
 *
 * Batch invariance: every item gets the bits of cuda_forward() on it alone
 * (a one-token step, graph or not). The GEMMs are the project's own
 * (kvmem_cuda_gemv_rows_bf16): each row summed exactly as the one-row GEMV
 * of a lone decode step sums it, each weight chunk read once for up to 8
 * rows. cuBLASLt is not used here: it picks its kernel by M, and even with
 * the algorithm pinned its tensor-core sums would not be the GEMV's, so an
 * item would differ from the same conversation decoding alone. The norms,
 * SwiGLU and the attention split per row or per item, never by n. So the
 * price is CUDA-core GEMMs (Documentation/benchmarks.md, #26).
 *
 * Taken only when it can give those bits: the main decode attention v5,
 * the GEMV on (decode items go in passes of at most the chunk size);
 * otherwise -ENOTSUP and the session runs the items one by one
 * (user/session/batch.c). Prefill chunks in a batch run in passes of
 * several views (cuda_fwd_prefill.c) when the backend was opened with
 * batch_prefill, else through the lone forward one after another; the
 * decode items beside them batched. KVMEM_CUDA_BATCH=0 (read at the first call)
 * turns it off, for comparisons.
 *
 * KVMEM_CUDA_BATCH_PROFILE=1 (read at the first call) says where a pass's
 * time goes, for issue #26's levers (nsys does not run on the GPU machine):
 * events between the ops on the stream, the host's time to queue a pass
 * and its wait in the sync, summed over passes and printed to stderr when
 * the backend closes. An event interval holds the GPU's idle time too, so
 * a queueing time near the GPU's span says the launches are the bound.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"
#include "kernels/kernels_cuda.h"
#include "kernels/kernels_cuda_batch.h"
#include "kernels/kernels_cuda_fp8.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "backend/cuda_backend.h"
#include "util/clock.h"

/* KVMEM_CUDA_BATCH_PROFILE's parts of a pass, in the order they run. */
enum { P_START, P_IN, P_NORM1, P_QKV, P_QK, P_ATT, P_WO, P_NORM2, P_GU, P_SWIGLU, P_DOWN,
       P_LOGITS, P_COPY, P_PARTS };
static const char *const part_name[P_PARTS] = {
	"", "inputs up, embedding, angles", "attention rmsnorm", "qkv GEMM",
	"q/k norm, rope, scatter", "attention", "o GEMM", "mlp rmsnorm", "gate|up GEMM",
	"swiglu", "down GEMM", "final norm, lm_head", "logits down" };
#define PROF_EVENTS 1024

struct fwdb_prof {
	cudaEvent_t ev[PROF_EVENTS];
	unsigned char part[PROF_EVENTS];
	int n_ev, made;
	long passes, items;
	double ms[P_PARTS], queue_ms, rows_ms, sync_ms, out_ms, span_ms;
};

struct cuda_fwdb {
	int rows;		/* room for this many items */
	int off;		/* KVMEM_CUDA_BATCH=0 */
	int per_item;		/* the q/k kernel a launch per item ("fuse" off) */
	uint16_t *qkv;		/* [rows][qw + 2 kw] */
	double *ang;		/* [rows][head_dim / 2] (cos, sin) */
	/* inputs: [ids: rows][pos: rows][items: rows][L][views: L][rows],
	 * device and pinned */
	char *in, *host_in;
	float *logits, *host_logits;	/* [rows][vocab] */
	int32_t *amax, *host_amax;	/* [rows]: the lazy items' greedy draws */
	uint16_t *host_rows;	/* pinned: raw q [L][rows][qw], raw K and V [L][rows][kw] */
	/* A layer's rows go down on their own stream as soon as its q/k
	 * kernel has made them (ev_qk), and the host copies them out to the
	 * items while later layers run (ev_rows): the items' outputs were
	 * 2.1 ms after a 64-item pass's sync, half of it q widened to fp32.
	 * The events are made before the stream: down set means all are. */
	cudaStream_t down;
	cudaEvent_t *ev_qk, *ev_rows;	/* [n_layers] */
	kvmem_cuda_att_seq *seqs;	/* host [rows] */
	const kvmem_cuda_att_seq **seqp;	/* host [rows]: &seqs[i] (fp8's call) */
	struct fwdb_prof *prof;		/* KVMEM_CUDA_BATCH_PROFILE=1 */
};

/* An event on the stream closing `part` (when profiling). */
static void mark(struct cuda_fwdb *f, const struct cuda *b, int part)
{
	struct fwdb_prof *p = f->prof;

	if (!p || p->n_ev >= PROF_EVENTS)
		return;
	if (p->n_ev >= p->made) {
		if (cudaEventCreate(&p->ev[p->n_ev]) != cudaSuccess) {
			cudaGetLastError();
			return;
		}
		p->made++;
	}
	p->part[p->n_ev] = (unsigned char)part;
	cudaEventRecord(p->ev[p->n_ev++], (cudaStream_t)kvmem_cuda_stream(b->ctx));
}

/* After the pass's sync: the intervals between its events to their parts. */
static void prof_pass(struct fwdb_prof *p, int n, double queue_ms, double rows_ms,
		      double sync_ms, double out_ms)
{
	float t;

	for (int i = 1; i < p->n_ev; i++)
		if (cudaEventElapsedTime(&t, p->ev[i - 1], p->ev[i]) == cudaSuccess)
			p->ms[p->part[i]] += t;
	if (p->n_ev > 1 && cudaEventElapsedTime(&t, p->ev[0], p->ev[p->n_ev - 1]) == cudaSuccess)
		p->span_ms += t;
	cudaGetLastError();
	p->n_ev = 0;
	p->passes++;
	p->items += n;
	p->queue_ms += queue_ms;
	p->rows_ms += rows_ms;
	p->sync_ms += sync_ms;
	p->out_ms += out_ms;
}

static void prof_print(struct fwdb_prof *p)
{
	const double k = p->passes ? 1.0 / (double)p->passes : 0.0;

	if (!p->passes)
		return;
	fprintf(stderr, "cuda batched forward profile: %ld passes, %.1f items a pass; "
		"ms a pass: host queueing %.3f, rows out as layers finish %.3f, then waiting in "
		"the sync %.3f, logits out %.3f; GPU span %.3f:\n", p->passes,
		(double)p->items * k, p->queue_ms * k, p->rows_ms * k, p->sync_ms * k,
		p->out_ms * k, p->span_ms * k);
	for (int i = 1; i < P_PARTS; i++)
		fprintf(stderr, "  %-30s %8.3f ms\n", part_name[i], p->ms[i] * k);
}

static size_t items_off(int rows)
{
	return (size_t)rows * 8;
}

static size_t views_off(const struct cuda *b, int rows)
{
	size_t at = items_off(rows) + (size_t)rows * b->c->n_layers * sizeof(kvmem_scatter_item);

	return (at + 15) & ~(size_t)15;
}

/* A row's view record for a layer: the q/k kernel's (bf16 views) or the
 * fp8 put's. */
static size_t view_rec(const struct cuda *b)
{
	return b->fp8 ? sizeof(kvmem_fp8_put_view) : sizeof(kvmem_qk_view);
}

/* Then each row's device row for its logits (the view's, kvmem_fwd_item
 * .argmax), or NULL. */
static size_t dst_off(const struct cuda *b, int rows)
{
	size_t at = views_off(b, rows) + (size_t)rows * b->c->n_layers * view_rec(b);

	return (at + 15) & ~(size_t)15;
}

/* Then each row's draw at a temperature (kvmem_fwd_item.draw), whose
 * temperature is 0 where it has none. */
static size_t draws_off(const struct cuda *b, int rows)
{
	size_t at = dst_off(b, rows) + (size_t)rows * sizeof(float *);

	return (at + 15) & ~(size_t)15;
}

static size_t in_bytes(const struct cuda *b, int rows)
{
	return draws_off(b, rows) + (size_t)rows * sizeof(kvmem_draw_spec);
}

void cuda_fwdb_destroy(struct cuda *b)
{
	struct cuda_fwdb *f = b->fwdb;

	if (!f)
		return;
	if (f->prof) {
		prof_print(f->prof);
		for (int i = 0; i < f->prof->made; i++)
			cudaEventDestroy(f->prof->ev[i]);
		free(f->prof);
	}
	kvmem_cuda_free(f->qkv);
	kvmem_cuda_free(f->ang);
	kvmem_cuda_free(f->in);
	kvmem_cuda_free(f->logits);
	kvmem_cuda_free(f->amax);
	cudaFreeHost(f->host_in);
	cudaFreeHost(f->host_logits);
	cudaFreeHost(f->host_amax);
	cudaFreeHost(f->host_rows);
	for (int l = 0; l < b->c->n_layers; l++) {
		if (f->ev_qk && f->ev_qk[l])
			cudaEventDestroy(f->ev_qk[l]);
		if (f->ev_rows && f->ev_rows[l])
			cudaEventDestroy(f->ev_rows[l]);
	}
	free(f->ev_qk);
	free(f->ev_rows);
	if (f->down)
		cudaStreamDestroy(f->down);
	free(f->seqs);
	free(f->seqp);
	free(f);
	b->fwdb = NULL;
}

/* The rows' stream and its per-layer events, what of them is not made
 * yet (a call after a failure here tries again). */
static int rows_stream(struct cuda *b)
{
	struct cuda_fwdb *f = b->fwdb;
	const int L = b->c->n_layers;

	if ((!f->ev_qk && !(f->ev_qk = calloc((size_t)L, sizeof(*f->ev_qk)))) ||
	    (!f->ev_rows && !(f->ev_rows = calloc((size_t)L, sizeof(*f->ev_rows)))))
		return kvmem_error(ENOMEM, "cuda batched forward: out of memory");
	for (int l = 0; l < L; l++)
		if ((!f->ev_qk[l] &&
		     cudaEventCreateWithFlags(&f->ev_qk[l], cudaEventDisableTiming) != cudaSuccess) ||
		    (!f->ev_rows[l] &&
		     cudaEventCreateWithFlags(&f->ev_rows[l], cudaEventDisableTiming) != cudaSuccess)) {
			cudaGetLastError();
			return kvmem_error(EIO, "cuda batched forward: cannot create an event");
		}
	if (cudaStreamCreateWithFlags(&f->down, cudaStreamNonBlocking) != cudaSuccess) {
		f->down = NULL;
		cudaGetLastError();
		return kvmem_error(EIO, "cuda batched forward: cannot create the rows' stream");
	}
	return 0;
}

/* Room for n items (buffers grow, never shrink). */
static int room(struct cuda *b, int n)
{
	const kvmem_config *c = b->c;
	struct cuda_fwdb *f = b->fwdb;
	const size_t ld = (size_t)b->qw + 2 * b->kw;
	int rc;

	if (!f) {
		const char *e = getenv("KVMEM_CUDA_BATCH");

		if (!(f = b->fwdb = calloc(1, sizeof(*f))))
			return kvmem_error(ENOMEM, "cuda batched forward: out of memory");
		f->off = e && !strcmp(e, "0");
		e = getenv("KVMEM_CUDA_BATCH_PROFILE");
		if (e && !strcmp(e, "1") && !(f->prof = calloc(1, sizeof(*f->prof))))
			return kvmem_error(ENOMEM, "cuda batched forward: out of memory");
	}
	if (!f->down && (rc = rows_stream(b)) < 0)	/* until it is made */
		return rc;
	if (n <= f->rows)
		return 0;
	if ((rc = kvmem_cuda_sync(b->ctx)) < 0)	/* queued work may use the old ones */
		return rc;
	kvmem_cuda_free(f->qkv);
	kvmem_cuda_free(f->ang);
	kvmem_cuda_free(f->in);
	kvmem_cuda_free(f->logits);
	kvmem_cuda_free(f->amax);
	cudaFreeHost(f->host_in);
	cudaFreeHost(f->host_logits);
	cudaFreeHost(f->host_amax);
	cudaFreeHost(f->host_rows);
	free(f->seqs);
	free(f->seqp);
	f->seqp = NULL;
	f->host_rows = NULL;
	f->qkv = NULL;
	f->ang = NULL;
	f->in = f->host_in = NULL;
	f->logits = f->host_logits = NULL;
	f->amax = f->host_amax = NULL;
	f->seqs = NULL;
	f->rows = 0;
	if ((rc = cuda_dev_alloc(&f->qkv, (size_t)n * ld * 2, NULL)) < 0 ||
	    (rc = cuda_dev_alloc(&f->ang, (size_t)n * c->head_dim * sizeof(double), NULL)) < 0 ||
	    (rc = cuda_dev_alloc(&f->in, in_bytes(b, n), NULL)) < 0 ||
	    (rc = cuda_dev_alloc(&f->logits, (size_t)n * c->vocab * 4, NULL)) < 0 ||
	    (rc = cuda_dev_alloc(&f->amax, (size_t)n * sizeof(int32_t), NULL)) < 0 ||
	    (rc = cuda_pinned(&f->host_amax, (size_t)n * sizeof(int32_t))) < 0 ||
	    (rc = cuda_pinned(&f->host_in, in_bytes(b, n))) < 0 ||
	    (rc = cuda_pinned(&f->host_logits, (size_t)n * c->vocab * 4)) < 0 ||
	    (rc = cuda_pinned(&f->host_rows, (size_t)n * c->n_layers * ld * 2)) < 0)
		return rc;
	if (!(f->seqs = calloc((size_t)n, sizeof(*f->seqs))) ||
	    !(f->seqp = calloc((size_t)n, sizeof(*f->seqp))))
		return kvmem_error(ENOMEM, "cuda batched forward: out of memory for %d items", n);
	for (int i = 0; i < n; i++)
		f->seqp[i] = &f->seqs[i];
	f->rows = n;
	return 0;
}

static int wants_out(const kvmem_fwd_out *o)
{
	return o && (o->raw_k || o->v || o->q_raw || o->raw_k_bf16 || o->v_bf16);
}

/* Whether the pass can give every item a lone step's bits; the reason
 * otherwise (-ENOTSUP: the caller goes one by one; -EINVAL: an item is
 * wrong, as the lone forward would say). */
static int check(struct cuda *b, const kvmem_fwd_item *items, int n)
{
	const kvmem_config *c = b->c;

	if (b->fwdb->off)
		return kvmem_error(ENOTSUP, "cuda batched forward: off (KVMEM_CUDA_BATCH=0)");
	if (!kvmem_cuda_att_decode_is_v5(b->ctx) || c->n_heads / c->n_kv_heads > 16)
		return kvmem_error(ENOTSUP, "cuda batched forward: the decode attention is not v5 "
				   "or the GQA group is over 16");
	if (b->fp8 && !kvmem_cuda_att_decode_fp8_reg(b->ctx, c->n_heads / c->n_kv_heads))
		return kvmem_error(ENOTSUP, "cuda batched forward: fp8 views decode in registers "
				   "only (KVMEM_CUDA_FP8_REG=0, or a GQA group over 8)");
	for (int i = 0; i < n; i++) {
		const kvmem_fwd_item *it = &items[i];

		/* What cuda_forward() would refuse, refused before anything
		 * runs (its items run through it: see cuda_forward_batch). */
		if (it->n <= 0 || it->n > b->max_chunk)
			return kvmem_error(EINVAL, "cuda forward: item %d runs %d tokens; the backend "
					   "takes 1..%d", i, it->n, b->max_chunk);
		for (int t = 0; t < it->n; t++)
			if (it->tokens[t] < 0 || it->tokens[t] >= c->vocab)
				return kvmem_error(EINVAL, "cuda forward: token %d at index %d of item %d "
						   "is outside the vocabulary (0..%d)", it->tokens[t], t,
						   i, c->vocab - 1);
		if (it->v->len + it->n > it->v->cap)
			return kvmem_error(EINVAL, "cuda forward: item %d's view holds %lld of %lld "
					   "slots, no room for %d more", i, (long long)it->v->len,
					   (long long)it->v->cap, it->n);
		if (it->out && it->out->q_last < 0)
			return kvmem_error(EINVAL, "cuda forward: item %d: q_last %d is negative", i,
					   it->out->q_last);
		if (it->n > 1 && it->out && !it->out->raw_k_bf16 != !it->out->v_bf16)
			return kvmem_error(ENOTSUP, "cuda batched forward: item %d: typed rows of "
					   "raw K or V alone", i);
	}
	return 0;
}

/* Layer l's raw q, raw K and V of the n items ([L][n][w] each, device)
 * down to host_rows on the rows' stream, after the layer's q/k kernel
 * (which wrote them) and beside the layers after it; ev_rows[l] says when
 * they are there. */
static int layer_rows_down(struct cuda *b, int n, int l)
{
	struct cuda_fwdb *f = b->fwdb;
	const size_t L = b->c->n_layers, q = L * n * b->qw, k = L * n * b->kw;
	const size_t lq = (size_t)l * n * b->qw, lk = (size_t)l * n * b->kw;
	uint16_t *h = f->host_rows;

	if (cudaEventRecord(f->ev_qk[l], kvmem_cuda_stream(b->ctx)) != cudaSuccess ||
	    cudaStreamWaitEvent(f->down, f->ev_qk[l], 0) != cudaSuccess ||
	    cudaMemcpyAsync(h + lq, b->oq + lq, (size_t)n * b->qw * 2, cudaMemcpyDeviceToHost,
			    f->down) != cudaSuccess ||
	    cudaMemcpyAsync(h + q + lk, b->ok + lk, (size_t)n * b->kw * 2, cudaMemcpyDeviceToHost,
			    f->down) != cudaSuccess ||
	    cudaMemcpyAsync(h + q + k + lk, b->ov + lk, (size_t)n * b->kw * 2,
			    cudaMemcpyDeviceToHost, f->down) != cudaSuccess ||
	    cudaEventRecord(f->ev_rows[l], f->down) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda batched forward: copying layer %d's rows down", l);
	}
	return 0;
}

/* Layer l's q rotated into b->q and each row's K and V into its own bf16
 * view (oq, ok, ov: the raw rows' destinations, or NULL); the attention's
 * sequences in f->seqs. */
static int layer_kv(struct cuda *b, const kvmem_fwd_item *items, int n, int l, uint16_t *oq,
		    uint16_t *ok, uint16_t *ov)
{
	const kvmem_config *c = b->c;
	const struct layer_w *w = &b->L[l];
	struct cuda_fwdb *f = b->fwdb;
	const int D = c->head_dim, L = c->n_layers, ld = b->qw + 2 * b->kw;
	const int32_t *pos = (const int32_t *)f->in + n;
	const kvmem_scatter_item *sc = (const kvmem_scatter_item *)(f->in + items_off(n));
	const kvmem_qk_view *views = (const kvmem_qk_view *)(f->in + views_off(b, n));
	int rc;

	/* The q/k kernel over every row, each into its own view: one launch
	 * (the fused kernel), else one per item (the lone call's path). */
	if (!f->per_item) {
		rc = kvmem_cuda_qk_norm_rope_scatter_rows_bf16(
			b->ctx, f->qkv, ld, w->q_norm, w->k_norm, n, c->n_heads, c->n_kv_heads, D,
			c->rms_eps, pos, c->rope_theta, b->q, oq, ok, ov, views + (size_t)l * n, L,
			f->ang);
		if (rc == -ENOTSUP)
			f->per_item = 1;
		else if (rc)
			return rc;
	}
	for (int i = 0; i < n; i++) {
		kvmem_view *v = items[i].v;
		const size_t vl = (size_t)c->n_kv_heads * v->cap * D;

		if (f->per_item && (rc = kvmem_cuda_qk_norm_rope_scatter_bf16(
			     b->ctx, f->qkv + (size_t)i * ld, ld, w->q_norm, w->k_norm, 1, c->n_heads,
			     c->n_kv_heads, D, c->rms_eps, pos + i, c->rope_theta,
			     b->q + (size_t)i * b->qw, oq ? oq + (size_t)i * b->qw : NULL,
			     ok ? ok + (size_t)i * b->kw : NULL, ov ? ov + (size_t)i * b->kw : NULL,
			     v->k, v->v, v->rk, sc + (size_t)i * L + l, L, (int)v->cap,
			     f->ang + (size_t)i * D)))
			return rc;
		f->seqs[i] = (kvmem_cuda_att_seq){ .q0 = i, .n_q = 1, .q_pos = pos + i,
						   .k = v->k + l * vl, .v = v->v + l * vl,
						   .kv_pos = NULL, .n_kv = (int)(v->len + 1),
						   .kv_stride = (long long)v->cap };
	}
	return 0;
}

/* The same over fp8 views, as the lone forward's fp8 layer does it
 * (cuda_fwd.c, cuda_view_fp8.c): q and k normalised and q rotated over
 * every row in one launch, then each row's K (rotated from its e4m3 bytes)
 * and V into its own view's fp8 slot, one launch for all
 * (kvmem_cuda_fp8_view_put_rows). */
static int layer_fp8_kv(struct cuda *b, const kvmem_fwd_item *items, int n, int l,
			uint16_t *oq, uint16_t *ok, uint16_t *ov)
{
	const kvmem_config *c = b->c;
	const struct layer_w *w = &b->L[l];
	struct cuda_fwdb *f = b->fwdb;
	const int D = c->head_dim, ld = b->qw + 2 * b->kw;
	const int32_t *pos = (const int32_t *)f->in + n;
	const kvmem_fp8_put_view *views = (const kvmem_fp8_put_view *)(f->in + views_off(b, n));
	const uint16_t *rk = f->qkv + (size_t)c->n_heads * D;
	int rc;

	if ((rc = kvmem_cuda_qk_norm_rope_bf16(b->ctx, f->qkv, ld, w->q_norm, w->k_norm, n,
					       c->n_heads, c->n_kv_heads, D, c->rms_eps, pos,
					       c->rope_theta, b->q, oq, ok, ov)) ||
	    (rc = kvmem_cuda_fp8_view_put_rows(b->ctx, views + (size_t)l * n, rk, rk + b->kw, ld, n,
					       c->n_kv_heads, D, c->rope_theta)))
		return rc;
	for (int i = 0; i < n; i++) {
		kvmem_view *v = items[i].v;
		const size_t sl = (size_t)c->n_kv_heads * v->cap, vl = sl * D;

		f->seqs[i] = (kvmem_cuda_att_seq){
			.q0 = i, .n_q = 1, .q_pos = pos + i,
			.k = (const uint16_t *)(v->k8 + l * vl), .v = (const uint16_t *)(v->v8 + l * vl),
			.kv_pos = NULL, .n_kv = (int)(v->len + 1), .kv_stride = (long long)v->cap,
			.k_scale = v->ks + l * sl, .v_scale = v->vs + l * sl };
	}
	return 0;
}

/* One layer over the n rows. */
static int layer(struct cuda *b, const kvmem_fwd_item *items, int n, int l, int want_out)
{
	const kvmem_config *c = b->c;
	const struct layer_w *w = &b->L[l];
	struct cuda_fwdb *f = b->fwdb;
	const int H = c->hidden, I = c->intermediate, D = c->head_dim;
	const int ld = b->qw + 2 * b->kw;
	const float scale = (float)(1.0 / sqrt((double)D));
	uint16_t *oq = b->oq + (size_t)l * n * b->qw, *ok = b->ok + (size_t)l * n * b->kw;
	uint16_t *ov = b->ov + (size_t)l * n * b->kw;
	int rc;

	if ((rc = kvmem_cuda_rmsnorm_bf16(b->ctx, b->h, b->x, w->attn_norm, n, H, c->rms_eps)))
		return rc;
	mark(f, b, P_NORM1);
	if ((rc = kvmem_cuda_gemv_rows_bf16(b->ctx, f->qkv, KVMEM_GEMM_BF16, b->h, w->wq, n, H, ld)))
		return rc;
	mark(f, b, P_QKV);
	if (b->fp8)
		rc = layer_fp8_kv(b, items, n, l, want_out ? oq : NULL, want_out ? ok : NULL,
				  want_out ? ov : NULL);
	else
		rc = layer_kv(b, items, n, l, want_out ? oq : NULL, want_out ? ok : NULL,
			      want_out ? ov : NULL);
	if (rc < 0)
		return rc;
	mark(f, b, P_QK);
	if (want_out && (rc = layer_rows_down(b, n, l)) < 0)
		return rc;
	rc = b->fp8 ? kvmem_cuda_att_dec_batch(b->ctx, b->att, b->q, f->seqp, n, c->n_heads,
					       c->n_kv_heads, D, scale)
		    : kvmem_cuda_attention_batch(b->ctx, b->att, b->q, f->seqs, n, c->n_heads,
						 c->n_kv_heads, D, scale);
	if (rc)
		return rc;
	mark(f, b, P_ATT);
	if ((rc = kvmem_cuda_gemv_rows_bf16(b->ctx, b->x, KVMEM_GEMM_F32_ADD, b->att, w->wo, n,
					    b->qw, H)))
		return rc;
	mark(f, b, P_WO);
	if ((rc = kvmem_cuda_rmsnorm_bf16(b->ctx, b->h, b->x, w->mlp_norm, n, H, c->rms_eps)))
		return rc;
	mark(f, b, P_NORM2);
	if ((rc = kvmem_cuda_gemv_rows_bf16(b->ctx, b->gu, KVMEM_GEMM_BF16, b->h, w->w_gateup, n,
					    H, 2 * I)))
		return rc;
	mark(f, b, P_GU);
	if ((rc = kvmem_cuda_swiglu_bf16(b->ctx, b->act, b->gu, b->gu + I, n, I, 2 * I)))
		return rc;
	mark(f, b, P_SWIGLU);
	if ((rc = kvmem_cuda_gemv_rows_bf16(b->ctx, b->x, KVMEM_GEMM_F32_ADD, b->act, w->w_down, n,
					    I, H)))
		return rc;
	mark(f, b, P_DOWN);
	return 0;
}

/* One row of w values out of host_rows: copied as bf16, or widened. */
static void row_out(const uint16_t *src, void *dst, int bf16, int l, size_t w)
{
	if (bf16)
		memcpy((uint16_t *)dst + (size_t)l * w, src, w * 2);
	else
		kvmem_bf16_to_f32_n((float *)dst + (size_t)l * w, src, w);
}

/*
 * Layer l of item i's raw q, raw K and V, as it asked, out of host_rows
 * ([L][n][w] each) once the layer's rows are down: about 40 KB an item and
 * layer at the 8B geometry, mostly q widened to fp32, copied while the
 * later layers run on the GPU.
 */
static void item_layer(struct cuda *b, const kvmem_fwd_item *it, int n, int i, int l)
{
	const int L = b->c->n_layers;
	const size_t q = (size_t)L * n * b->qw, k = (size_t)L * n * b->kw;
	const uint16_t *h = b->fwdb->host_rows;
	const uint16_t *hq = h + ((size_t)l * n + i) * b->qw;
	const uint16_t *hk = h + q + ((size_t)l * n + i) * b->kw, *hv = hk + k;
	const kvmem_fwd_out *o = it->out;

	if (!o)
		return;
	if (o->q_raw && kvmem_fwd_q_rows(o, 1) > 0)
		row_out(hq, o->q_raw, 0, l, b->qw);
	if (o->raw_k)
		row_out(hk, o->raw_k, 0, l, b->kw);
	if (o->raw_k_bf16)
		row_out(hk, o->raw_k_bf16, 1, l, b->kw);
	if (o->v)
		row_out(hv, o->v, 0, l, b->kw);
	if (o->v_bf16)
		row_out(hv, o->v_bf16, 1, l, b->kw);
}

/* The items' rows, layer by layer as each comes down (on this thread: a
 * layer's copies are shorter than the GPU's layer after it). */
static int rows_out(struct cuda *b, const kvmem_fwd_item *items, int n)
{
	struct cuda_fwdb *f = b->fwdb;

	for (int l = 0; l < b->c->n_layers; l++) {
		if (cudaEventSynchronize(f->ev_rows[l]) != cudaSuccess) {
			cudaGetLastError();
			return kvmem_error(EIO, "cuda batched forward: layer %d's rows did not come "
					   "down", l);
		}
		for (int i = 0; i < n; i++)
			item_layer(b, &items[i], n, i, l);
	}
	return 0;
}

/*
 * Item i's logits out of the pinned buffer after the sync: 0.6 MB an item
 * at the 8B geometry, so the items are spread over the kernels' pool from
 * PAR_ITEMS on (its caller starts on them at once, where an OpenMP
 * region's passive workers took ~200 us to wake on the H100 host after
 * the pass: user/session/batch.c's draws).
 */
#define PAR_ITEMS 4

struct logits_out {
	struct cuda *b;
	const kvmem_fwd_item *items;
};

static void item_logits(void *arg, int i)
{
	const struct logits_out *o = arg;
	const kvmem_fwd_item *it = &o->items[i];

	if (it->logits && !kvmem_fwd_lazy(it))
		memcpy(it->logits, o->b->fwdb->host_logits + (size_t)i * o->b->c->vocab,
		       (size_t)o->b->c->vocab * sizeof(float));
}

/* The view's two device rows of logits, made at its first lazy item
 * (1.2 MB at Qwen3's vocabulary, counted with the view). */
static int view_logits(struct cuda *b, kvmem_view *v)
{
	const size_t bytes = 2 * sizeof(float) * (size_t)b->c->vocab;
	int rc;

	if (v->lg)
		return 0;
	if ((rc = kvmem_cuda_malloc((void **)&v->lg, bytes)) < 0)
		return kvmem_error_prefix("cuda batched forward: a view's logits");
	b->view_bytes += bytes;
	return 0;
}

/*
 * The rows' draws beside their logits ([n][vocab] on the device): each
 * row's argmax, its logits copied to the view buffer the inputs' dst region
 * names, the draws at a temperature the draws region asks for, and the n
 * tokens copied down to host_amax (not waited for). A pass's lazy items and
 * a lone item after its graph both draw here, so they get the same token.
 */
static int draws_down(struct cuda *b, float *logits, int n, int small, int narrowed)
{
	struct cuda_fwdb *f = b->fwdb;
	int rc;

	if ((rc = kvmem_cuda_argmax_rows(b->ctx, f->amax, (float *const *)(f->in + dst_off(b, n)),
					 logits, n, b->c->vocab)) < 0 ||
	    (rc = kvmem_cuda_draw_rows(b->ctx, f->amax, logits, n, b->c->vocab,
				       (const kvmem_draw_spec *)(f->in + draws_off(b, n)), small,
				       narrowed)) < 0)
		return rc;
	if (cudaMemcpyAsync(f->host_amax, f->amax, (size_t)n * sizeof(int32_t),
			    cudaMemcpyDeviceToHost, kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "copying the draws down");
	}
	return 0;
}

/* One pass over n <= max_chunk checked items. */
static int pass_run(struct cuda *b, const kvmem_fwd_item *items, int n)
{
	const kvmem_config *c = b->c;
	const int L = c->n_layers, ld = b->qw + 2 * b->kw;
	struct cuda_fwdb *f = b->fwdb;
	int32_t *ids;
	kvmem_scatter_item *sc;
	kvmem_qk_view *qv;
	kvmem_fp8_put_view *pv;
	float **dst;
	kvmem_draw_spec *draws;
	int rc, want_out = 0, any_logits = 0, host_logits = 0, lazy = 0, small = 0, narrowed = 0;
	uint64_t t0 = kvmem_now_ns(), t1, t2, t3;

	mark(f, b, P_START);
	dst = (float **)(f->host_in + dst_off(b, n));
	draws = (kvmem_draw_spec *)(f->host_in + draws_off(b, n));
	for (int i = 0; i < n; i++) {
		want_out |= wants_out(items[i].out);
		any_logits |= items[i].logits != NULL || kvmem_fwd_lazy(&items[i]);
		dst[i] = NULL;
		draws[i].temperature = 0.0f;
		if (!kvmem_fwd_lazy(&items[i])) {
			host_logits |= items[i].logits != NULL;
			continue;
		}
		if ((rc = view_logits(b, items[i].v)) < 0)
			return rc;
		dst[i] = items[i].v->lg + (size_t)(1 - items[i].v->lg_cur) * c->vocab;
		lazy++;
		if (items[i].draw && items[i].draw->temperature > 0.0f) {
			draws[i] = *items[i].draw;
			small |= kvmem_draw_top_k_small(draws[i].top_k, c->vocab);
			narrowed |= !kvmem_draw_top_k_small(draws[i].top_k, c->vocab);
		}
	}
	/* The inputs: ids, positions, one scatter item per item and layer (the
	 * lone forward's: its token at slot len, from its qkv row). The
	 * previous call synchronised: the pinned buffer is free. */
	ids = (int32_t *)f->host_in;
	sc = (kvmem_scatter_item *)(f->host_in + items_off(n));
	qv = (kvmem_qk_view *)(f->host_in + views_off(b, n));
	pv = (kvmem_fp8_put_view *)(f->host_in + views_off(b, n));	/* fp8's records */
	for (int i = 0; i < n; i++) {
		ids[i] = items[i].tokens[0];
		ids[n + i] = (int32_t)items[i].v->len;
		for (int l = 0; l < L; l++)
			sc[(size_t)i * L + l] = (kvmem_scatter_item){
				.layer = l, .slot = (int32_t)items[i].v->len, .n = 1,
				.tok_stride = ld, .src = 0, .head_stride = c->head_dim };
		for (int l = 0; l < L; l++) {	/* the device's items, above */
			const kvmem_view *v = items[i].v;
			const kvmem_scatter_item *it =
				(const kvmem_scatter_item *)(f->in + items_off(n)) + (size_t)i * L + l;

			if (b->fp8)
				pv[(size_t)l * n + i] = (kvmem_fp8_put_view){
					.k8 = v->k8, .v8 = v->v8, .ks = v->ks, .vs = v->vs,
					.raw_k = v->rk8, .raw_scale = v->rks, .item = it,
					.cap = (int)v->cap };
			else
				qv[(size_t)l * n + i] = (kvmem_qk_view){
					.k = v->k, .v = v->v, .rk = v->rk, .item = it,
					.cap = (int)v->cap };
		}
	}
	if (cudaMemcpyAsync(f->in, f->host_in, in_bytes(b, n), cudaMemcpyHostToDevice,
			    kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda batched forward: copying the inputs up");
	}
	if ((rc = kvmem_cuda_embedding_bf16(b->ctx, b->x, b->embed, (const int32_t *)f->in, n,
					    c->hidden)) < 0 ||
	    (rc = kvmem_cuda_rope_angles(b->ctx, f->ang, (const int32_t *)f->in + n, n,
					 c->head_dim, c->rope_theta)) < 0)
		return kvmem_error_prefix("cuda batched forward");
	mark(f, b, P_IN);
	for (int l = 0; l < L; l++)
		if ((rc = layer(b, items, n, l, want_out)) < 0)
			return kvmem_error_prefix("cuda batched forward, layer %d", l);
	if (any_logits &&
	    ((rc = kvmem_cuda_rmsnorm_bf16(b->ctx, b->tmp, b->x, b->final_norm, n, c->hidden,
					   c->rms_eps)) < 0 ||
	     (rc = kvmem_cuda_gemv_rows_bf16(b->ctx, f->logits, KVMEM_GEMM_F32, b->tmp, b->lm_head,
					     n, c->hidden, c->vocab)) < 0))
		return kvmem_error_prefix("cuda batched forward: logits");
	/* The lazy items' greedy draws, their logits kept beside their views:
	 * only n ints go down for them (a 64-item step of Qwen3's vocabulary
	 * brought 39 MB of logits down before, and the host read them twice). */
	if (lazy && (rc = draws_down(b, f->logits, n, small, narrowed)) < 0)
		return kvmem_error_prefix("cuda batched forward");
	mark(f, b, P_LOGITS);
	if (host_logits && cudaMemcpyAsync(f->host_logits, f->logits, (size_t)n * c->vocab * 4,
					   cudaMemcpyDeviceToHost,
					   kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda batched forward: copying the logits down");
	}
	mark(f, b, P_COPY);
	t1 = kvmem_now_ns();
	if (want_out && (rc = rows_out(b, items, n)) < 0)
		return rc;
	t2 = kvmem_now_ns();
	if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
		return kvmem_error_prefix("cuda batched forward");
	t3 = kvmem_now_ns();
	{
		const struct logits_out o = { b, items };

		if (n >= PAR_ITEMS)
			kvmem_pool_run(n, item_logits, (void *)&o);
		else
			for (int i = 0; i < n; i++)
				item_logits((void *)&o, i);
	}
	if (f->prof)
		prof_pass(f->prof, n, (double)(t1 - t0) * 1e-6, (double)(t2 - t1) * 1e-6,
			  (double)(t3 - t2) * 1e-6, (double)(kvmem_now_ns() - t3) * 1e-6);
	for (int i = 0; i < n; i++) {
		kvmem_view *v = items[i].v;

		v->len += 1;
		if (dst[i]) {	/* host_in is not reused before the next pass */
			v->lg_cur = 1 - v->lg_cur;
			v->lg_have = 1;
			*items[i].argmax = f->host_amax[i];
		}
	}
	return 0;
}

/*
 * A lone decode item's draw at a temperature, after the lone step (its
 * graph) left the logits in b->logits: made on the device as a pass makes
 * its rows' (the same kernels, so the same token), the logits copied beside
 * the view for a later fetch. A lone sampled stream drew on the host,
 * 2.4 ms a token of its 11.2 (H100 host, issue #26).
 */
static int lone_draw(struct cuda *b, const kvmem_fwd_item *it)
{
	struct cuda_fwdb *f = b->fwdb;
	kvmem_view *v = it->v;
	float **dst = (float **)(f->host_in + dst_off(b, 1));
	kvmem_draw_spec *d = (kvmem_draw_spec *)(f->host_in + draws_off(b, 1));
	const int vocab = b->c->vocab, small = kvmem_draw_top_k_small(it->draw->top_k, vocab);
	int rc;

	if ((rc = view_logits(b, v)) < 0)
		return rc;
	dst[0] = v->lg + (size_t)(1 - v->lg_cur) * vocab;
	*d = *it->draw;
	if (cudaMemcpyAsync(f->in + dst_off(b, 1), f->host_in + dst_off(b, 1),
			    in_bytes(b, 1) - dst_off(b, 1), cudaMemcpyHostToDevice,
			    kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda forward: copying a draw up");
	}
	if ((rc = draws_down(b, b->logits, 1, small, !small)) < 0)
		return kvmem_error_prefix("cuda forward: the draw");
	if ((rc = kvmem_cuda_sync(b->ctx)) < 0)
		return kvmem_error_prefix("cuda forward: the draw");
	v->lg_cur = 1 - v->lg_cur;
	v->lg_have = 1;
	*it->argmax = f->host_amax[0];
	return 0;
}

void cuda_view_logits_free(struct cuda *b, kvmem_view *v)
{
	if (!v->lg)
		return;
	kvmem_cuda_sync(b->ctx);	/* a pass may still write them */
	kvmem_cuda_free(v->lg);
	b->view_bytes -= 2 * sizeof(float) * (size_t)b->c->vocab;
	v->lg = NULL;
	v->lg_have = 0;
}

int cuda_logits_fetch(void *ctx, kvmem_view *v, float *dst)
{
	struct cuda *b = ctx;

	if (!v || !v->lg_have)
		return kvmem_error(EINVAL, "cuda backend: no logits were left beside this view");
	if (kvmem_cuda_download(b->ctx, dst, v->lg + (size_t)v->lg_cur * b->c->vocab,
				sizeof(float) * (size_t)b->c->vocab) < 0)
		return kvmem_error_prefix("cuda backend: a view's logits");
	return 0;
}

/* A pass; one that failed midway waits for the rows it had sent down, so
 * that no copy still reads the backend's row buffers after it returns. */
static int pass(struct cuda *b, const kvmem_fwd_item *items, int n)
{
	const int rc = pass_run(b, items, n);

	if (rc < 0 && cudaStreamSynchronize(b->fwdb->down) != cudaSuccess)
		cudaGetLastError();
	return rc;
}

/*
 * Items of more than one token (prefill chunks): with batch_prefill, those
 * of up to the pinned rows in passes of several views up to max_chunk rows
 * (cuda_fwd_prefill.c); a pass of one item, a longer one, or one whose
 * every row's logits are asked, through cuda_forward(); without
 * batch_prefill each through cuda_forward(), one after another. An item's
 * bits are the same either way.
 */
static int prefill_items(struct cuda *b, const kvmem_fwd_item *items, int n)
{
	kvmem_fwd_item *run = malloc(sizeof(*run) * (size_t)(n > 0 ? n : 1));
	int m = 0, rows = 0, rc = 0;

	if (!run)
		return kvmem_error(ENOMEM, "cuda batched forward: out of memory for %d items", n);
	for (int i = 0; i <= n && !rc; i++) {
		const kvmem_fwd_item *it = i < n ? &items[i] : NULL;
		/* Chunks of up to the pinned rows (longer ones are compute-bound
		 * alone: cuda_backend.h, CUDA_PREFILL_PIN_ROWS). */
		const int joins = it && it->n > 1 && it->n <= kvmem_cuda_gemm_pin(b->ctx) &&
				  !it->all_logits && b->prefill_batch;

		/* The pass so far goes when this item cannot join it. */
		if (m && (!joins || rows + it->n > b->max_chunk || m == b->max_chunk / 2)) {
			rc = m > 1 ? cuda_prefill_batch(b, run, m)
				   : cuda_forward(b, run[0].v, run[0].tokens, run[0].n, run[0].logits,
						  0, run[0].out);
			m = rows = 0;
		}
		if (rc || !it || it->n == 1)
			continue;
		if (joins) {
			run[m++] = *it;
			rows += it->n;
		} else {
			rc = cuda_forward(b, it->v, it->tokens, it->n, it->logits, it->all_logits,
					  it->out);
		}
	}
	free(run);
	return rc;
}

/*
 * Prefill chunks first (prefill_items); the decode items then go in passes
 * of at most max_chunk items (an item's bits depend on neither), a pass of
 * one item through cuda_forward() too. Every item is checked first, so a
 * wrong one fails the call with nothing changed.
 */
int cuda_forward_batch(void *ctx, const kvmem_fwd_item *items, int n)
{
	struct cuda *b = ctx;
	const int C = b->max_chunk;
	kvmem_fwd_item *dec;
	int rc = 0, m = 0;

	if (n <= 0)
		return kvmem_error(EINVAL, "cuda batched forward: %d items", n);
	if ((rc = room(b, n < C ? n : C)) < 0 || (rc = check(b, items, n)) < 0)
		return rc;
	if (!(dec = malloc(sizeof(*dec) * (size_t)n)))
		return kvmem_error(ENOMEM, "cuda batched forward: out of memory for %d items", n);
	for (int i = 0; i < n; i++)
		if (items[i].n == 1)
			dec[m++] = items[i];
	rc = prefill_items(b, items, n);
	for (int s = 0; s < m && !rc; s += C) {
		const int k = m - s < C ? m - s : C;

		/* One decode item alone: the lone step (its CUDA graph, the same
		 * bits); a pass of one ran at 0.85x it (2026-12-02, H200: 140
		 * against 166 tok/s at the 8B geometry). */
		rc = k > 1 ? pass(b, dec + s, k)
			   : cuda_forward(ctx, dec[s].v, dec[s].tokens, 1, dec[s].logits,
					  dec[s].all_logits, dec[s].out);
		if (!rc && k == 1 && kvmem_fwd_lazy(&dec[s]) && dec[s].draw &&
		    dec[s].draw->temperature > 0.0f)
			rc = lone_draw(b, &dec[s]);
	}
	free(dec);
	return rc < 0 ? rc : 0;
}
