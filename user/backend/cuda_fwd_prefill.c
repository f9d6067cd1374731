// SPDX-License-Identifier: MIT
/*
 * The cuda backend's batched prefill: prefill chunks of several views in
 * one forward pass (kvmem_backend_opts.batch_prefill; issue #26). kvmem
 * serve ran each new prompt's chunk through its own pass, one after
 * another, so 16 prompts arriving together waited for 16 passes, each
 * reading every weight. Per layer:
 *
 *   h = rmsnorm(x); qkv = h.[Wq;Wk;Wv]       every item's rows, one GEMM
 *   for each item: q/k norm and rope, K and V into its own view, its raw
 *             rows down, its attention over its own view: the lone pass's
 *             calls on its own rows (cuda_fwd_attend)
 *   x += att.Wo; h = rmsnorm(x); gu = h.[Wgate;Wup]; x += swiglu(gu).Wdown
 *                                             every item's rows, one GEMM each
 *
 * then each item's last row's logits, alone (the one-row GEMM a lone
 * chunk's logits take).
 *
 * Batch invariance: an item gets the bits of cuda_forward() on it alone.
 * The embedding, the norms and SwiGLU work row by row; the middle is the
 * lone call's on the item's rows; the GEMMs of 2+ rows take one cuBLASLt
 * algorithm for every row count of a shape (c->gemm_pin, kernels/cuda/
 * gemm.cu), so a row's sums do not depend on the rows beside it
 * (kvmem_gpu_check --gemm-pin). Without that pin the backend does not
 * batch prefill at all (each chunk through cuda_forward(), as before).
 *
 * KVMEM_CUDA_BATCH_PROFILE=1 prints the passes, items and rows when the
 * backend closes. The inputs go up in one copy: [ids: N][pos: N], then for each item its
 * key count (padded to 16 bytes) and its scatter item per layer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"
#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "backend/cuda_backend.h"

struct cuda_fwdp {
	char *in, *host_in;	/* device and pinned host */
	size_t items_at;	/* where the first item's part begins */
	size_t item_bytes;	/* one item's part */
	int max_items;
	long passes, items, rows;	/* printed at the end with KVMEM_CUDA_BATCH_PROFILE=1 */
};

static size_t align16(size_t x)
{
	return (x + 15) / 16 * 16;
}

/* The input buffers, for max_chunk rows in items of 2 rows or more. */
static int fwdp_make(struct cuda *b)
{
	struct cuda_fwdp *p = calloc(1, sizeof(*p));
	const size_t C = (size_t)b->max_chunk;
	size_t bytes;
	int rc;

	if (!p)
		return kvmem_error(ENOMEM, "cuda batched prefill: out of memory");
	p->items_at = align16(2 * C * sizeof(int32_t));
	p->item_bytes = 16 + align16((size_t)b->c->n_layers * sizeof(kvmem_scatter_item));
	p->max_items = (int)(C / 2);
	bytes = p->items_at + (size_t)p->max_items * p->item_bytes;
	if ((rc = cuda_dev_alloc(&p->in, bytes, &b->scratch_bytes)) < 0 ||
	    (rc = cuda_pinned(&p->host_in, bytes)) < 0) {
		kvmem_cuda_free(p->in);
		free(p);
		return rc;
	}
	b->fwdp = p;
	return 0;
}

void cuda_fwdp_destroy(struct cuda *b)
{
	struct cuda_fwdp *p = b->fwdp;

	if (!p)
		return;
	if (getenv("KVMEM_CUDA_BATCH_PROFILE") && !strcmp(getenv("KVMEM_CUDA_BATCH_PROFILE"), "1"))
		fprintf(stderr, "cuda batched prefill: %ld passes, %.1f items and %.0f rows a pass\n",
			p->passes, p->passes ? (double)p->items / p->passes : 0.0,
			p->passes ? (double)p->rows / p->passes : 0.0);
	kvmem_cuda_free(p->in);
	cudaFreeHost(p->host_in);
	free(p);
	b->fwdp = NULL;
}

/* Item i's device pointers: its inputs and its regions of the raw rows
 * (each item's [L][n_i] at L * a rows in). */
static void item_ptrs(struct cuda *b, const kvmem_fwd_item *it, int a, int N, int i,
		      struct fwd_ptrs *p)
{
	const struct cuda_fwdp *fp = b->fwdp;
	const char *part = fp->in + fp->items_at + (size_t)i * fp->item_bytes;
	const size_t L = b->c->n_layers;

	*p = (struct fwd_ptrs){
		.ids = (const int32_t *)fp->in + a,
		.pos = (const int32_t *)fp->in + N + a,
		.n_kv = (const int32_t *)part,
		.items = (const kvmem_scatter_item *)(part + 16),
		.oq = b->oq + L * a * b->qw,
		.ok = b->ok + L * a * b->kw,
		.ov = b->ov + L * a * b->kw,
		.sq = (size_t)it->n * b->qw,
		.sk = (size_t)it->n * b->kw,
	};
	cuda_fwd_out_ptrs(p, it->out, it->n);
}

/* The inputs of the n items, rows a[i] .. a[i] + n_i of N, up. */
static int inputs_up(struct cuda *b, const kvmem_fwd_item *items, int n, const int *a, int N)
{
	struct cuda_fwdp *fp = b->fwdp;
	int32_t *ids = (int32_t *)fp->host_in, *pos = ids + N;

	for (int i = 0; i < n; i++) {
		const kvmem_fwd_item *it = &items[i];
		char *part = fp->host_in + fp->items_at + (size_t)i * fp->item_bytes;
		kvmem_scatter_item *si = (kvmem_scatter_item *)(part + 16);

		cuda_fwd_view_in(b, it->v, it->n, (int32_t *)part, si);
		for (int t = 0; t < it->n; t++) {
			ids[a[i] + t] = it->tokens[t];
			pos[a[i] + t] = (int32_t)(it->v->len + t);
		}
	}
	/* The ids, the positions after them and the items' parts: one copy. */
	if (cudaMemcpyAsync(fp->in, fp->host_in, fp->items_at + (size_t)n * fp->item_bytes,
			    cudaMemcpyHostToDevice, kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda batched prefill: copying the inputs up");
	}
	return 0;
}

/* Every layer over the n items' N rows; the GEMMs of the N rows take the
 * pinned algorithm whatever N ("gemm_pin_all", on for the layers alone). */
static int layers(struct cuda *b, const kvmem_fwd_item *items, int n, int N,
		  const struct fwd_ptrs *p, const struct fwd_rows *r)
{
	int rc = kvmem_cuda_tune(b->ctx, "gemm_pin_all", 1);

	for (int l = 0; rc >= 0 && l < b->c->n_layers; l++) {
		if ((rc = cuda_fwd_qkv(b, l, N))) {
			kvmem_error_prefix("cuda batched prefill, layer %d", l);
			break;
		}
		for (int i = 0; i < n && !rc; i++)
			if ((rc = cuda_fwd_attend(b, items[i].v, l, items[i].n,
						  cuda_fwd_wants_out(items[i].out), &p[i], &r[i])))
				kvmem_error_prefix("cuda batched prefill, layer %d, item %d", l, i);
		if (!rc && (rc = cuda_fwd_mlp(b, l, N)))
			kvmem_error_prefix("cuda batched prefill, layer %d", l);
	}
	kvmem_cuda_tune(b->ctx, "gemm_pin_all", 0);
	return rc < 0 ? rc : 0;
}

/* Queue the pass: every layer, then each item's logits and index. p, r:
 * room for the items' pointers. */
static int enqueue(struct cuda *b, const kvmem_fwd_item *items, int n, const int *a, int N,
		   struct fwd_ptrs *p, struct fwd_rows *r)
{
	const kvmem_config *c = b->c;
	int rc;

	for (int i = 0; i < n; i++) {
		item_ptrs(b, &items[i], a[i], N, i, &p[i]);
		cuda_fwd_rows_at(b, a[i], &r[i]);
	}
	if ((rc = cuda_fwd_embed(b, p[0].ids, p[0].pos, N)) < 0 ||
	    (rc = layers(b, items, n, N, p, r)) < 0)
		return rc;
	for (int i = 0; i < n; i++) {
		const kvmem_fwd_item *it = &items[i];

		if (it->logits &&
		    (rc = kvmem_cuda_logits_bf16(b->ctx, b->logits + (size_t)i * c->vocab,
						 b->x + (size_t)(a[i] + it->n - 1) * c->hidden,
						 b->final_norm, b->lm_head, b->tmp, 1, c->hidden,
						 c->vocab, c->rms_eps)) < 0)
			return rc;
		/* The index's summaries from the raw K just written. */
		if (it->out && it->out->index &&
		    (rc = cuda_fwd_index(b, p[i].ok, it->n, it->out->index)) < 0)
			return rc;
	}
	return 0;
}

/* The host's outputs, once the pass is done. */
static int outputs_down(struct cuda *b, const kvmem_fwd_item *items, int n, const int *a)
{
	const int L = b->c->n_layers;
	int rc;

	for (int i = 0; i < n; i++) {
		const kvmem_fwd_item *it = &items[i];
		const kvmem_fwd_out *out = it->out;
		const size_t at = (size_t)L * a[i];

		if (it->logits &&
		    (rc = kvmem_cuda_download(b->ctx, it->logits, b->logits + (size_t)i * b->c->vocab,
					      sizeof(float) * (size_t)b->c->vocab)) < 0)
			return rc;
		if (out && out->q_raw &&
		    (rc = cuda_fwd_download_f32(b, out->q_raw, b->oq + at * b->qw, L, it->n,
						kvmem_fwd_q_rows(out, it->n), b->qw)) < 0)
			return rc;
		if (out && out->raw_k &&
		    (rc = cuda_fwd_download_f32(b, out->raw_k, b->ok + at * b->kw, L, it->n, it->n,
						b->kw)) < 0)
			return rc;
		if (out && out->v &&
		    (rc = cuda_fwd_download_f32(b, out->v, b->ov + at * b->kw, L, it->n, it->n,
						b->kw)) < 0)
			return rc;
	}
	return 0;
}

static int run(struct cuda *b, const kvmem_fwd_item *items, int n, int *a, struct fwd_ptrs *p,
	       struct fwd_rows *r)
{
	int N = 0, rc;

	for (int i = 0; i < n; i++) {
		const kvmem_fwd_item *it = &items[i];

		if (it->n < 2 || it->all_logits)
			return kvmem_error(EINVAL, "cuda batched prefill: item %d runs %d tokens%s", i,
					   it->n, it->all_logits ? " with every row's logits" : "");
		for (int j = 0; j < i; j++)
			if (items[j].v == it->v)
				return kvmem_error(EINVAL, "cuda batched prefill: items %d and %d "
						   "share a view", j, i);
		if (it->out && it->out->pages && (rc = cuda_fwd_pages_ready(b, it->out, it->n)) < 0)
			return rc;
		a[i] = N;
		N += it->n;
	}
	if (N > b->max_chunk)
		return kvmem_error(EINVAL, "cuda batched prefill: %d rows; the backend takes %d a "
				   "pass", N, b->max_chunk);
	if ((rc = cuda_fwd_logit_rows(b, n)) < 0 || (rc = inputs_up(b, items, n, a, N)) < 0)
		return rc;
	if ((rc = enqueue(b, items, n, a, N, p, r)) < 0) {
		kvmem_cuda_sync(b->ctx);
		cuda_fwd_rows_wait(b);	/* nothing left writing into the rows */
		return rc;
	}
	rc = kvmem_cuda_sync(b->ctx);
	/* The typed rows and pages went down layer by layer meanwhile. */
	if (!rc)
		rc = cuda_fwd_rows_wait(b);
	else
		cuda_fwd_rows_wait(b);
	if (rc < 0 || (rc = outputs_down(b, items, n, a)) < 0)
		return kvmem_error_prefix("cuda batched prefill");
	for (int i = 0; i < n; i++)
		items[i].v->len += items[i].n;
	b->fwdp->passes++;
	b->fwdp->items += n;
	b->fwdp->rows += N;
	return 0;
}

int cuda_prefill_batch(struct cuda *b, const kvmem_fwd_item *items, int n)
{
	struct fwd_ptrs *p;
	struct fwd_rows *r;
	int *a, rc;

	if (!b->prefill_batch)
		return kvmem_error(ENOTSUP, "cuda batched prefill: off (kvmem_backend_opts."
				   "batch_prefill, the GEMMs pinned)");
	if (!b->fwdp && (rc = fwdp_make(b)) < 0)
		return rc;
	if (n < 1 || n > b->fwdp->max_items)
		return kvmem_error(EINVAL, "cuda batched prefill: %d items (1..%d)", n,
				   b->fwdp->max_items);
	p = malloc(sizeof(*p) * (size_t)n);
	r = malloc(sizeof(*r) * (size_t)n);
	a = malloc(sizeof(*a) * (size_t)n);
	rc = p && r && a ? run(b, items, n, a, p, r)
			 : kvmem_error(ENOMEM, "cuda batched prefill: out of memory for %d items", n);
	free(p);
	free(r);
	free(a);
	return rc;
}
