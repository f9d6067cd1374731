// SPDX-License-Identifier: MIT
/*
 * Selection scoring on the GPU: a session's index mirrored in device memory
 * and scored there by the twins of the host scorers (kernels/cuda/score.cu).
 *
 * The mirror keeps the host index's layout and type ([L][H][cap][per][D]
 * fp32, cap its own), so the scores are the host scorer's to a few fp32
 * ulps (score.cu: the same z bits, only expf and the order of the chunk
 * sums differ) and a session picks the same blocks on either side but for
 * near-ties. Each call copies the blocks appended since the last one, and
 * that one's last block again (it may have grown): one 2D copy per array,
 * a row per (layer, KV head). Growing the capacity doubles it with a
 * device-to-device copy. The mirror's bytes count against the GPU cap and
 * against index_mem (the index's share). Past either, the mirror frees its
 * device copy and streams instead: the host index's own arrays are
 * registered (pinned, mapped) and the scorer reads them over PCIe where
 * they are, with no copy and no device memory that grows with the
 * workspace (re-registered when the index re-lays them to grow). Where
 * that fails too, -ENOTSUP from then on: the session scores on the host.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda_backend.h"
#include "kvmem/kvmem.h"

/* One summary array of the index: meank (per 1) or sub (per 4). */
struct mirror_arr {
	float *d;		/* [L * H][cap][per][D] */
	int64_t synced;		/* blocks copied at the last call */
};

struct cuda_mirror {
	struct mirror_arr meank, sub;
	int64_t cap;		/* blocks per (layer, KV head) row */
	float *gq;		/* [L * H][D] */
	float *scores;		/* [cap] */
	uint64_t bytes;		/* all of the above */
	int mapped;		/* past the share or the cap: read the host's arrays */
	void *reg[2];		/* mapped: the host arrays registered (meank, sub) */
	size_t reg_len[2];
	int gave_up;		/* mapping failed too: -ENOTSUP from then on */
};

#define MIRROR_MIN_BLOCKS 1024

/* The capacity for n_blocks: the mirror's, doubled until they fit. */
static int64_t cap_for(const struct cuda_mirror *m, int64_t n_blocks)
{
	int64_t cap = m->cap ? m->cap : MIRROR_MIN_BLOCKS;

	while (cap < n_blocks)
		cap *= 2;
	return cap;
}

static uint64_t index_share(const struct cuda *b)
{
	if (b->index_mem)
		return b->index_mem;
	return b->mem_cap ? b->mem_cap / 8 : 4ull << 30;
}

int cuda_mirror_create(void *ctx, void **out)
{
	struct cuda_mirror *m = calloc(1, sizeof(*m));

	(void)ctx;
	if (!m)
		return kvmem_error(ENOMEM, "cuda score: out of memory");
	*out = m;
	return 0;
}

static void mirror_unmap(struct cuda_mirror *m)
{
	for (int i = 0; i < 2; i++) {
		if (m->reg[i])
			cudaHostUnregister(m->reg[i]);
		m->reg[i] = NULL;
		m->reg_len[i] = 0;
	}
}

/* The device copy (and the small buffers) freed; mapped arrays stay. */
static void mirror_release(struct cuda *b, struct cuda_mirror *m)
{
	kvmem_cuda_free(m->meank.d);
	kvmem_cuda_free(m->sub.d);
	kvmem_cuda_free(m->gq);
	kvmem_cuda_free(m->scores);
	b->index_bytes -= m->bytes;
	m->meank = m->sub = (struct mirror_arr){ 0 };
	m->gq = m->scores = NULL;
	m->bytes = 0;
	m->cap = 0;
}

void cuda_mirror_destroy(void *ctx, void *mirror)
{
	struct cuda_mirror *m = mirror;

	if (!m)
		return;
	mirror_release(ctx, m);
	mirror_unmap(m);
	free(m);
}

uint64_t cuda_mirror_bytes(void *ctx, const void *mirror)
{
	const struct cuda_mirror *m = mirror;

	(void)ctx;
	return m ? m->bytes : 0;
}

static size_t row_floats(const kvmem_score_input *ix, int per, int64_t blocks)
{
	return (size_t)blocks * per * ix->head_dim;
}

/* Re-lay one array at capacity cap (its first `keep` blocks kept). */
static int arr_grow(struct cuda *b, struct mirror_arr *a, const kvmem_score_input *ix, int per,
		    int64_t old_cap, int64_t cap)
{
	const size_t rows = (size_t)ix->n_layers * ix->n_kv_heads;
	float *d;
	int rc;

	if ((rc = kvmem_cuda_malloc((void **)&d, rows * row_floats(ix, per, cap) * 4)) < 0)
		return rc;
	if (a->d && a->synced &&
	    cudaMemcpy2DAsync(d, row_floats(ix, per, cap) * 4, a->d, row_floats(ix, per, old_cap) * 4,
			      row_floats(ix, per, a->synced) * 4, rows, cudaMemcpyDeviceToDevice,
			      kvmem_cuda_stream(b->ctx)) != cudaSuccess) {
		kvmem_cuda_free(d);
		return kvmem_error(EIO, "cuda score: copying the index to a larger mirror failed");
	}
	kvmem_cuda_free(a->d);	/* cudaFree waits for the copy */
	a->d = d;
	return 0;
}

/* Room for n_blocks in every array the scorer reads: 0, -ENOTSUP (no room
 * under the share or the cap: the mirror is emptied), or -errno. */
static int mirror_room(struct cuda *b, struct cuda_mirror *m, const kvmem_score_input *ix,
		       int64_t n_blocks, int want_sub)
{
	const size_t rows = (size_t)ix->n_layers * ix->n_kv_heads;
	const int64_t cap = cap_for(m, n_blocks);
	int sub = want_sub || m->sub.d;
	uint64_t need;
	int rc;

	if (cap == m->cap && (!want_sub || m->sub.d))
		return 0;
	need = rows * row_floats(ix, 1, cap) * 4 * (sub ? 1 + KVMEM_SUBBLOCKS : 1) +
	       rows * ix->head_dim * 4 + (uint64_t)cap * 4;
	if (need > index_share(b) ||
	    (b->mem_cap && cuda_dev_used(b) - m->bytes + need + CUDA_CAP_MARGIN > b->mem_cap)) {
		mirror_release(b, m);
		m->mapped = 1;
		return -ENOTSUP;
	}
	if ((cap != m->cap && (rc = arr_grow(b, &m->meank, ix, 1, m->cap, cap)) < 0) ||
	    (sub && (cap != m->cap || !m->sub.d) &&
	     (rc = arr_grow(b, &m->sub, ix, KVMEM_SUBBLOCKS, m->cap, cap)) < 0))
		goto fail;
	kvmem_cuda_free(m->scores);
	m->scores = NULL;
	if ((!m->gq && (rc = kvmem_cuda_malloc((void **)&m->gq, rows * ix->head_dim * 4)) < 0) ||
	    (rc = kvmem_cuda_malloc((void **)&m->scores, (size_t)cap * 4)) < 0)
		goto fail;
	b->index_bytes += need - m->bytes;
	m->bytes = need;
	m->cap = cap;
	return 0;
fail:
	/* Out of device memory is no room either; anything else is a fault.
	 * Either way the mirror is emptied (its arrays may be half grown). */
	mirror_release(b, m);
	m->mapped = 1;
	return rc == -ENOMEM ? -ENOTSUP : rc;
}

/* Copy blocks [synced - 1, n_blocks) of one host array (stride ix->cap_blocks)
 * into the mirror. */
static int arr_sync(struct cuda *b, struct mirror_arr *a, const float *host,
		    const kvmem_score_input *ix, int per, int64_t cap, int64_t n_blocks)
{
	const int64_t from = a->synced ? a->synced - 1 : 0;
	const size_t rows = (size_t)ix->n_layers * ix->n_kv_heads;

	if (n_blocks > from &&
	    cudaMemcpy2DAsync(a->d + row_floats(ix, per, from), row_floats(ix, per, cap) * 4,
			      host + row_floats(ix, per, from), row_floats(ix, per, ix->cap_blocks) * 4,
			      row_floats(ix, per, n_blocks - from) * 4, rows, cudaMemcpyHostToDevice,
			      kvmem_cuda_stream(b->ctx)) != cudaSuccess)
		return kvmem_error(EIO, "cuda score: copying index blocks %" PRId64 "..%" PRId64
				   " to the device failed", from, n_blocks - 1);
	a->synced = n_blocks;
	return 0;
}

/* Register host array i ([rows][ix->cap_blocks][per][D]) where it is now,
 * and its device address. -ENOTSUP when it cannot be mapped. */
static int map_arr(struct cuda_mirror *m, int i, const float *host, size_t bytes,
		   const float **dev)
{
	if (m->reg[i] != host || m->reg_len[i] != bytes) {
		/* The index re-laid it: the old range goes first (it may
		 * overlap the new one's pages). */
		if (m->reg[i])
			cudaHostUnregister(m->reg[i]);
		m->reg[i] = NULL;
		if (cudaHostRegister((void *)host, bytes,
				     cudaHostRegisterMapped) != cudaSuccess) {
			(void)cudaGetLastError();
			return -ENOTSUP;
		}
		m->reg[i] = (void *)host;
		m->reg_len[i] = bytes;
	}
	if (cudaHostGetDevicePointer((void **)dev, (void *)host, 0) != cudaSuccess) {
		(void)cudaGetLastError();
		return -ENOTSUP;
	}
	return 0;
}

/* Room for the queries and n_blocks scores only (mapped mode). */
static int small_room(struct cuda *b, struct cuda_mirror *m, const kvmem_score_input *ix,
		      int64_t n_blocks)
{
	const size_t gq = (size_t)ix->n_layers * ix->n_kv_heads * ix->head_dim * 4;
	const int64_t cap = cap_for(m, n_blocks);
	int rc;

	if (m->gq && cap == m->cap)
		return 0;
	kvmem_cuda_free(m->scores);
	m->scores = NULL;
	if ((!m->gq && (rc = kvmem_cuda_malloc((void **)&m->gq, gq)) < 0) ||
	    (rc = kvmem_cuda_malloc((void **)&m->scores, (size_t)cap * 4)) < 0) {
		mirror_release(b, m);
		return rc;
	}
	b->index_bytes += gq + (uint64_t)cap * 4 - m->bytes;
	m->bytes = gq + (uint64_t)cap * 4;
	m->cap = cap;
	return 0;
}

/* Scoring straight from the host index's arrays. */
static int score_mapped(struct cuda *b, struct cuda_mirror *m, int sub, const kvmem_score_input *ix,
			kvmem_score_geom *dg, const float **rows)
{
	const size_t n = (size_t)ix->n_layers * ix->n_kv_heads * ix->cap_blocks * ix->head_dim * 4;
	int rc;

	if ((rc = small_room(b, m, ix, dg->n_blocks)) < 0 ||
	    (rc = sub ? map_arr(m, 1, ix->sub, n * KVMEM_SUBBLOCKS, rows) :
			map_arr(m, 0, ix->meank, n, rows)) < 0) {
		if (rc == -ENOTSUP || rc == -ENOMEM) {
			mirror_release(b, m);
			mirror_unmap(m);
			m->gave_up = 1;
			return -ENOTSUP;
		}
		return rc;
	}
	dg->cap_blocks = ix->cap_blocks;
	return 0;
}

int cuda_score(void *ctx, void *mirror, const char *scorer, const kvmem_score_input *ix,
	       const float *gq, const kvmem_score_geom *g, float *scores)
{
	struct cuda *b = ctx;
	struct cuda_mirror *m = mirror;
	const int sub = !strcmp(scorer, "subblock");
	const size_t gq_bytes = (size_t)ix->n_layers * ix->n_kv_heads * ix->head_dim * 4;
	kvmem_score_geom dg = *g;
	const float *rows;
	int rc;

	if (m->gave_up || (!sub && strcmp(scorer, "meank")) ||
	    (sub && !ix->sub))
		return -ENOTSUP;
	if (g->n_blocks != ix->n_blocks || g->index_dtype != KVMEM_DTYPE_F32 ||
	    g->n_layers != ix->n_layers || g->n_kv_heads != ix->n_kv_heads ||
	    g->head_dim != ix->head_dim)
		return kvmem_error(EINVAL, "cuda score: the geometry is not the index's");
	if (!g->n_blocks)
		return 0;
	if (!m->mapped && (rc = mirror_room(b, m, ix, g->n_blocks, sub)) < 0 && rc != -ENOTSUP)
		return rc;
	if (m->mapped) {
		if ((rc = score_mapped(b, m, sub, ix, &dg, &rows)) < 0)
			return rc;
	} else {
		if ((rc = arr_sync(b, &m->meank, ix->meank, ix, 1, m->cap, g->n_blocks)) < 0 ||
		    (m->sub.d && (rc = arr_sync(b, &m->sub, ix->sub, ix, KVMEM_SUBBLOCKS, m->cap,
						 g->n_blocks)) < 0))
			return kvmem_error_prefix("cuda score");
		dg.cap_blocks = m->cap;
		rows = sub ? m->sub.d : m->meank.d;
	}
	if ((rc = kvmem_cuda_upload(b->ctx, m->gq, gq, gq_bytes)) < 0)
		return kvmem_error_prefix("cuda score");
	rc = sub ? kvmem_cuda_score_subblock(b->ctx, m->scores, rows, m->gq, &dg) :
		   kvmem_cuda_score_meank(b->ctx, m->scores, rows, m->gq, &dg);
	if (rc < 0 ||
	    (rc = kvmem_cuda_download(b->ctx, scores, m->scores, (size_t)g->n_blocks * 4)) < 0)
		return kvmem_error_prefix("cuda score: %s", scorer);
	return 0;
}
