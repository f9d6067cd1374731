// SPDX-License-Identifier: MIT
/* What the policies hand the scorers of kernels/cpu/score.c. */
#include <errno.h>
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "select/score.h"

void ws_score_geom(const kvmem_select_ctx *c, kvmem_score_geom *g)
{
	const int64_t last = c->n_blocks - 1;

	*g = (kvmem_score_geom){
		.n_layers = c->n_layers, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
		.head_dim = c->head_dim, .block = c->block, .n_blocks = c->n_blocks,
		.cap_blocks = c->index->cap_blocks,
		.last_len = kvmem_index_block_len(c->index, last),
		.index_dtype = KVMEM_DTYPE_F32,
	};
	for (int s = 0; s < KVMEM_SUBBLOCKS; s++)
		g->last_sub[s] = kvmem_index_sub_len(c->index, last, s);
}

int ws_device_score(const kvmem_select_ctx *c, const char *scorer, const float *gq,
		    const kvmem_score_geom *g, float *scores)
{
	if (!c->device)
		return -ENOTSUP;
	return c->device->score(c->device->arg, scorer, gq, g, scores);
}

float *ws_group_queries(const kvmem_select_ctx *c)
{
	float *gq = malloc(sizeof(float) * c->n_layers * c->n_kv_heads * c->head_dim);

	if (!gq) {
		kvmem_error(ENOMEM, "out of memory for the group queries");
		return NULL;
	}
	kvmem_group_queries(gq, c->q, c->n_layers, c->n_q, c->n_heads, c->n_kv_heads, c->head_dim,
			    c->rope_theta, c->span);
	return gq;
}
