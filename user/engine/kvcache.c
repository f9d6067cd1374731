// SPDX-License-Identifier: MIT
/* The plain KV cache / execution view: head-major K and V per layer. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kvmem/kvmem.h"

int kvmem_kvcache_init(kvmem_kvcache *kv, const kvmem_config *c, int cap)
{
	memset(kv, 0, sizeof(*kv));
	if (c->n_layers <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 || cap <= 0)
		return kvmem_error(EINVAL, "kv cache: bad geometry (layers %d, kv heads %d, head_dim %d, "
				 "capacity %d)", c->n_layers, c->n_kv_heads, c->head_dim, cap);
	size_t elems = (size_t)c->n_layers * c->n_kv_heads * cap * c->head_dim;

	kv->k = malloc(sizeof(float) * elems);
	kv->v = malloc(sizeof(float) * elems);
	if (!kv->k || !kv->v) {
		free(kv->k);
		free(kv->v);
		kv->k = kv->v = NULL;
		return kvmem_error(ENOMEM, "kv cache: out of memory for %d tokens (%zu MiB)", cap,
				 2 * sizeof(float) * elems >> 20);
	}
	kv->n_layers = c->n_layers;
	kv->n_kv_heads = c->n_kv_heads;
	kv->head_dim = c->head_dim;
	kv->cap = cap;
	kv->len = 0;
	return 0;
}

void kvmem_kvcache_free(kvmem_kvcache *kv)
{
	if (!kv)
		return;
	free(kv->k);
	free(kv->v);
	memset(kv, 0, sizeof(*kv));
}
