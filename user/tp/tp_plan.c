// SPDX-License-Identifier: MIT
/*
 * The split plan: which heads, rows and columns each rank holds (tp.h).
 * Pure arithmetic over the config; no weights are touched.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "tp/tp.h"

/* "1, 2, 4, 8": the rank counts up to KVMEM_TP_MAX that divide both
 * sizes, for the refusal's message. */
static void divisors(char *buf, size_t len, int a, int b)
{
	size_t at = 0;

	buf[0] = 0;
	for (int n = 1; n <= KVMEM_TP_MAX && at < len; n++)
		if (a % n == 0 && b % n == 0)
			at += snprintf(buf + at, len - at, "%s%d", at ? ", " : "", n);
}

int kvmem_tp_check(const kvmem_config *c, int n_ranks)
{
	char ok[256];

	if (c->n_kv_heads <= 0 || c->n_heads <= 0 || c->intermediate <= 0 || c->head_dim <= 0)
		return kvmem_error(EINVAL, "tensor parallel: the model's geometry has a non-positive "
				   "size");
	divisors(ok, sizeof(ok), c->n_kv_heads, c->intermediate);
	if (n_ranks < 1 || n_ranks > KVMEM_TP_MAX)
		return kvmem_error(EINVAL, "tensor parallel: %d ranks; 1..%d (for this model: %s)",
				   n_ranks, KVMEM_TP_MAX, ok);
	if (c->n_kv_heads % n_ranks)
		return kvmem_error(EINVAL, "tensor parallel: the model's %d KV heads do not split "
				   "into %d ranks (the split is by KV heads; for this model: %s)",
				   c->n_kv_heads, n_ranks, ok);
	if (c->intermediate % n_ranks)
		return kvmem_error(EINVAL, "tensor parallel: the model's intermediate size %d does "
				   "not split into %d ranks (for this model: %s)", c->intermediate,
				   n_ranks, ok);
	return 0;
}

int kvmem_tp_plan(const kvmem_config *c, int n_ranks, int rank, kvmem_tp_rank *out)
{
	int rc = kvmem_tp_check(c, n_ranks);

	if (rc)
		return rc;
	if (rank < 0 || rank >= n_ranks)
		return kvmem_error(EINVAL, "tensor parallel: rank %d outside 0..%d", rank,
				   n_ranks - 1);
	const int d = c->head_dim, group = c->n_heads / c->n_kv_heads;
	kvmem_tp_rank *r = out;

	memset(r, 0, sizeof(*r));
	r->rank = rank;
	r->n_ranks = n_ranks;
	r->n_kv_heads = c->n_kv_heads / n_ranks;
	r->kv_head0 = rank * r->n_kv_heads;
	/* GQA: query head h reads KV head h / group, so a contiguous run of
	 * KV heads owns a contiguous run of query heads. */
	r->n_heads = r->n_kv_heads * group;
	r->head0 = r->kv_head0 * group;
	r->q_row0 = r->head0 * d;
	r->q_rows = r->n_heads * d;
	r->kv_row0 = r->kv_head0 * d;
	r->kv_rows = r->n_kv_heads * d;
	r->o_col0 = r->q_row0;
	r->o_cols = r->q_rows;
	r->n_ff = c->intermediate / n_ranks;
	r->ff0 = rank * r->n_ff;

	uint64_t h = (uint64_t)c->hidden, per_layer;

	per_layer = 2 * h + 2 * (uint64_t)d		/* attn/mlp norms, q/k norms */
		    + h * r->q_rows + 2 * h * r->kv_rows	/* q, k, v slices */
		    + h * r->o_cols			/* o slice */
		    + 3 * h * r->n_ff;		/* gate, up, down slices */
	r->params = per_layer * c->n_layers + (uint64_t)c->vocab * h * (c->tie_embeddings ? 1 : 2) +
		    h;
	r->kv_bytes_per_token = kvmem_config_kv_bytes_per_token(c, 2) / n_ranks;
	return 0;
}

kvmem_config kvmem_tp_rank_config(const kvmem_config *c, const kvmem_tp_rank *r)
{
	kvmem_config rc = *c;

	rc.n_heads = r->n_heads;
	rc.n_kv_heads = r->n_kv_heads;
	return rc;
}
