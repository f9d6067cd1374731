// SPDX-License-Identifier: MIT
/*
 * The index's summaries of a forward pass's tokens, made on the device
 * (kvmem_fwd_out.index): kernels/cuda/index.cu, the twin of the host
 * index's arithmetic (fp32 sums in token order, one IEEE division per
 * mean; kvmem_gpu_check's index case holds it to the CPU twin bit for
 * bit), over the raw K the forward left in b->ok ([L][n][H][D] bf16). Raw
 * K then need not come down for the host to sum (75 MB a 1024-token chunk
 * at Qwen3-8B, and the writer thread's longest job: round three's writer
 * was busy 0.284 s of a 0.606 s prefill on the H200).
 *
 * The kernel runs over a window of the chunk's nb blocks ([L*H][nb][D],
 * block 0 the first token's), not the whole index: the summaries go down
 * into the session's pinned buffers in one copy each, and the session's
 * writer thread copies them into its index. The running state between
 * calls stays here: the open sums and, when a call ends inside a block,
 * that block's min/max so far, which the next call's window starts from.
 * A call marked fresh takes the state from the host instead (the session's
 * first chunk, or after tokens the host summed); a call that is not fresh
 * must continue the key's last one, else it fails before anything runs.
 * Everything is queued on the compute stream after the layers, which the
 * forward's final synchronisation waits for.
 */
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "backend/backend_impl.h"
#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "backend/cuda_backend.h"

struct cuda_fwd_index {
	float *win;		/* meank, kmin, kmax, sub windows for nb_max blocks */
	float *st;		/* open_sum, open_sub, the partial block's min, max */
	int nb_max;		/* blocks the window holds */
	uint32_t key;		/* whose state st holds (0: nobody's) */
	int64_t upto;		/* the token after the last one it covers */
};

void cuda_fwd_index_destroy(struct cuda *b)
{
	struct cuda_fwd_index *x = b->fix;

	if (!x)
		return;
	kvmem_cuda_free(x->win);
	kvmem_cuda_free(x->st);
	free(x);
	b->fix = NULL;
}

/* One 2D copy on the compute stream: rows of w floats. */
static int copy2d(struct cuda *b, float *dst, size_t dpitch, const float *src, size_t spitch,
		  size_t w, size_t rows, enum cudaMemcpyKind kind)
{
	if (cudaMemcpy2DAsync(dst, dpitch * sizeof(float), src, spitch * sizeof(float),
			      w * sizeof(float), rows, kind, kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
		cudaGetLastError();
		return kvmem_error(EIO, "cuda index: a copy of %zu rows failed", rows);
	}
	return 0;
}

static int copy1d(struct cuda *b, float *dst, const float *src, size_t n, enum cudaMemcpyKind kind)
{
	return copy2d(b, dst, n, src, n, n, 1, kind);
}

int cuda_fwd_index_holds(void *ctx, uint32_t key, int64_t upto)
{
	const struct cuda *b = ctx;

	return b->fix && key && b->fix->key == key && b->fix->upto == upto;
}

int cuda_fwd_index(struct cuda *b, const uint16_t *raw_k, int n, const kvmem_fwd_index *ix)
{
	const kvmem_config *c = b->c;
	const size_t runs = (size_t)c->n_layers * c->n_kv_heads, D = c->head_dim;
	const int B = ix->block, t0 = (int)(ix->first % (B > 0 ? B : 1));
	const int nb = (t0 + n - 1) / (B > 0 ? B : 1) + 1, mm = ix->kmin != NULL;
	const int sub = ix->sub != NULL;
	struct cuda_fwd_index *x = b->fix;
	const kvmem_score_geom g = { .n_layers = c->n_layers, .n_heads = c->n_heads,
				     .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
				     .block = B, .cap_blocks = nb, .index_dtype = KVMEM_DTYPE_F32 };
	float *wm, *wlo, *whi, *wsub, *osum, *osub, *plo, *phi;
	size_t win;
	int rc;

	if (B < 4 || B % 4 || ix->first < 0 || n <= 0 || !ix->meank || !ix->open_sum ||
	    (!ix->kmin != !ix->kmax) || (sub && !ix->open_sub))
		return kvmem_error(EINVAL, "cuda index: %d tokens after %lld, block %d", n,
				   (long long)ix->first, B);
	if (!x) {
		if (!(x = calloc(1, sizeof(*x))))
			return kvmem_error(ENOMEM, "out of memory");
		b->fix = x;
		if ((rc = cuda_dev_alloc(&x->st, runs * D * 4 * sizeof(float), &b->scratch_bytes)) < 0) {
			cuda_fwd_index_destroy(b);
			return rc;
		}
	}
	if (nb > x->nb_max) {	/* the window for the largest chunk of this block size */
		const int want = (B - 1 + b->max_chunk) / B + 1;

		kvmem_cuda_free(x->win);
		b->scratch_bytes -= runs * (size_t)x->nb_max * D * 7 * sizeof(float);
		x->win = NULL;
		x->nb_max = 0;
		if ((rc = cuda_dev_alloc(&x->win, runs * (size_t)(want > nb ? want : nb) * D * 7 *
					 sizeof(float), &b->scratch_bytes)) < 0)
			return rc;
		x->nb_max = want > nb ? want : nb;
	}
	if (!ix->fresh && (x->key != ix->key || x->upto != ix->first))
		return kvmem_error(EINVAL, "cuda index: tokens from %lld continue no summaries kept "
				   "here (key %u, up to %lld)", (long long)ix->first, x->key,
				   (long long)x->upto);
	/* The window, laid out for this call's nb blocks. */
	win = runs * nb * D;
	wm = x->win;
	wlo = wm + win;
	whi = wlo + win;
	wsub = whi + win;
	osum = x->st;
	osub = osum + runs * D;
	plo = osub + runs * D;
	phi = plo + runs * D;
	x->key = 0;	/* until this call is queued whole */
	if (ix->fresh &&
	    ((rc = copy1d(b, osum, ix->in_sum, runs * D, cudaMemcpyHostToDevice)) < 0 ||
	     (sub && (rc = copy1d(b, osub, ix->in_sub, runs * D, cudaMemcpyHostToDevice)) < 0) ||
	     (mm && t0 && ((rc = copy1d(b, plo, ix->in_min, runs * D, cudaMemcpyHostToDevice)) < 0 ||
			   (rc = copy1d(b, phi, ix->in_max, runs * D, cudaMemcpyHostToDevice)) < 0))))
		return rc;
	/* A block begun before: its min/max so far in block 0. */
	if (mm && t0 &&
	    ((rc = copy2d(b, wlo, nb * D, plo, D, D, runs, cudaMemcpyDeviceToDevice)) < 0 ||
	     (rc = copy2d(b, whi, nb * D, phi, D, D, runs, cudaMemcpyDeviceToDevice)) < 0))
		return rc;
	if ((rc = kvmem_cuda_index_append(b->ctx, wm, mm ? wlo : NULL, mm ? whi : NULL,
					  sub ? wsub : NULL, osum, sub ? osub : NULL, raw_k, t0, n,
					  &g)) < 0)
		return kvmem_error_prefix("cuda index");
	/* A block left open: its min/max so far for the next call. */
	if (mm && (t0 + n) % B &&
	    ((rc = copy2d(b, plo, D, wlo + (size_t)(nb - 1) * D, nb * D, D, runs,
			  cudaMemcpyDeviceToDevice)) < 0 ||
	     (rc = copy2d(b, phi, D, whi + (size_t)(nb - 1) * D, nb * D, D, runs,
			  cudaMemcpyDeviceToDevice)) < 0))
		return rc;
	if ((rc = copy1d(b, ix->meank, wm, win, cudaMemcpyDeviceToHost)) < 0 ||
	    (mm && ((rc = copy1d(b, ix->kmin, wlo, win, cudaMemcpyDeviceToHost)) < 0 ||
		    (rc = copy1d(b, ix->kmax, whi, win, cudaMemcpyDeviceToHost)) < 0)) ||
	    (sub && (rc = copy1d(b, ix->sub, wsub, win * 4, cudaMemcpyDeviceToHost)) < 0) ||
	    (rc = copy1d(b, ix->open_sum, osum, runs * D, cudaMemcpyDeviceToHost)) < 0 ||
	    (sub && (rc = copy1d(b, ix->open_sub, osub, runs * D, cudaMemcpyDeviceToHost)) < 0))
		return rc;
	x->key = ix->key;
	x->upto = ix->first + n;
	return 0;
}
