// SPDX-License-Identifier: MIT
/*
 * The index's summaries made by the backend (kvmem_fwd_out.index; ops
 * index_rows: cuda makes them on the device from its own raw K, the twin
 * of the host index's arithmetic, so the same bits). A prefill chunk's
 * forward writes them into a set of pinned buffers the session holds; the
 * writer thread copies them into the index (kvmem_index_put) instead of
 * summing raw K, which then need not come down when the pages are written
 * by the backend too. Sets alternate like the rows (writer.c); the first
 * is made at the session's first prefill chunk, the writer's at its first
 * job that brings summaries. KVMEM_DEVICE_INDEX=0 sums on the host (the
 * peer of a measurement).
 */
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "session/session_int.h"

/* The blocks a chunk's tokens fall in, at most. */
static int64_t chunk_blocks(const kvmem_session *s)
{
	return (s->o.block - 1 + s->o.chunk) / s->o.block + 1;
}

/* A set of the index's summary buffers: meank, kmin, kmax (when kept),
 * sub (when kept), [runs][nb][D] ([..][4][D]) for nb up to chunk_blocks;
 * then open_sum, open_sub, in_sum, in_sub, in_min, in_max, [runs][D]. */
static size_t ix_floats(const kvmem_session *s)
{
	const size_t runs = (size_t)s->cfg.n_layers * s->cfg.n_kv_heads, D = s->cfg.head_dim;
	const size_t win = runs * (size_t)chunk_blocks(s) * D;

	return win * (1 + (s->index.sums & KVMEM_SUM_MINMAX ? 2 : 0) +
		      (s->index.sums & KVMEM_SUM_SUBBLOCK ? KVMEM_SUBBLOCKS : 0)) + 6 * runs * D;
}

float *ws_ix_alloc(kvmem_session *s)
{
	void *p = NULL;

	return s->be->ops->host_alloc(s->be->ctx, s->ix_floats * sizeof(float), &p) < 0 ? NULL : p;
}

void ws_ix_free(kvmem_session *s, float *p)
{
	if (p)
		s->be->ops->host_free(s->be->ctx, p);
}

void ws_ix_parts(const kvmem_session *s, float *set, kvmem_fwd_index *f)
{
	const size_t runs = (size_t)s->cfg.n_layers * s->cfg.n_kv_heads, D = s->cfg.head_dim;
	const size_t win = runs * (size_t)chunk_blocks(s) * D;
	float *p = set;

	memset(f, 0, sizeof(*f));
	f->meank = p;
	p += win;
	if (s->index.sums & KVMEM_SUM_MINMAX) {
		f->kmin = p;
		f->kmax = p + win;
		p += 2 * win;
	}
	if (s->index.sums & KVMEM_SUM_SUBBLOCK) {
		f->sub = p;
		p += KVMEM_SUBBLOCKS * win;
	}
	f->open_sum = p;
	f->open_sub = s->index.sums & KVMEM_SUM_SUBBLOCK ? p + runs * D : NULL;
	f->in_sum = p + 2 * runs * D;
	f->in_sub = f->open_sub ? p + 3 * runs * D : NULL;
	f->in_min = f->kmin ? p + 4 * runs * D : NULL;
	f->in_max = f->kmin ? p + 5 * runs * D : NULL;
}

/*
 * The index's summaries of a forward over tokens p0..p0+n-1 made by the
 * backend (kvmem_fwd_out.index), a prefill chunk's (a decode step's token
 * is summed on the host: its rows come down anyway, in a CUDA graph). The
 * backend goes on from its own running state when its last summaries
 * ended at p0; else it takes the host index's, which the writer must have
 * finished first. Raw K then stays on the device when the pages are
 * written there too.
 */
int ws_ask_index(kvmem_session *s, int64_t p0, int n, kvmem_fwd_out *out)
{
	kvmem_fwd_index *f = &s->fix;

	if (s->dev_index < 0 || n < s->blocks.block)
		return 0;
	if (!s->dev_index) {	/* decided at the first chunk */
		s->dev_index = -1;
		if (!s->be->ops->index_rows || s->rows_dtype != KVMEM_DTYPE_BF16)
			return 0;
		s->ix_floats = ix_floats(s);
		if (!(s->ixw = ws_ix_alloc(s)))
			return 0;	/* no memory for it: the host sums, as before */
		s->dev_index = 1;
	}
	ws_ix_parts(s, s->ixw, f);
	f->first = p0;
	f->block = s->blocks.block;
	f->key = s->owner;
	/* Fresh (the host index's state goes up) unless the backend's running
	 * state is still this session's, ending here: another session's chunk
	 * on the same backend may have come between (kvmem bench batch, a
	 * server's conversations). */
	f->fresh = s->ix_next != p0 + 1 ||
		   (s->be->ops->index_holds && !s->be->ops->index_holds(s->be->ctx, s->owner, p0));
	if (f->fresh) {
		if (ws_writer_wait(s))
			return kvmem_fail();
		kvmem_index_state(&s->index, (float *)f->in_sum, (float *)f->in_sub,
				  (float *)f->in_min, (float *)f->in_max);
	}
	out->index = f;
	if (out->pages)
		out->raw_k_bf16 = NULL;
	return 0;
}

