// SPDX-License-Identifier: MIT
/* Page geometry: sizes of a page and its aligned slot on disk. */
#include <inttypes.h>
#include <stdio.h>

#include "pager/pager_int.h"

size_t kvmem_dtype_bytes(uint32_t dtype)
{
	switch (dtype) {
	case KVMEM_DTYPE_F32: return 4;
	case KVMEM_DTYPE_BF16: return 2;
	case KVMEM_DTYPE_F16: return 2;
	case KVMEM_DTYPE_FP8: return 1;
	}
	return 0;
}

const char *kvmem_dtype_name(uint32_t dtype)
{
	switch (dtype) {
	case KVMEM_DTYPE_F32: return "f32";
	case KVMEM_DTYPE_BF16: return "bf16";
	case KVMEM_DTYPE_F16: return "f16";
	case KVMEM_DTYPE_FP8: return "fp8";
	}
	return "?";
}

size_t kvmem_page_bytes(const kvmem_page_geom *g)
{
	const size_t rows = (size_t)g->n_kv_heads * g->block_tokens;

	/* fp8: the K and V bytes, then a 4-byte scale per row of each */
	return 2 * rows * g->head_dim * kvmem_dtype_bytes(g->dtype) +
	       (g->dtype == KVMEM_DTYPE_FP8 ? 2 * rows * sizeof(float) : 0);
}

size_t kvmem_page_stride(const kvmem_page_geom *g)
{
	return round_up(kvmem_page_bytes(g), KVMEM_IO_ALIGN);
}

int kvmem_page_geom_check(const kvmem_page_geom *g, const char *name)
{
	if (!g->n_layers || !g->n_heads || !g->n_kv_heads || !g->head_dim || !g->block_tokens)
		return kvmem_error(EINVAL, "%s: page geometry has a zero size (L=%u Hq=%u Hkv=%u D=%u B=%u)",
				 name, g->n_layers, g->n_heads, g->n_kv_heads, g->head_dim,
				 g->block_tokens);
	if (!kvmem_dtype_bytes(g->dtype))
		return kvmem_error(EINVAL, "%s: unknown page dtype %u", name, g->dtype);
	if (g->n_layers > 4096 || g->n_kv_heads > 4096 || g->head_dim > 65536 ||
	    g->block_tokens > 65536)
		return kvmem_error(EINVAL, "%s: page geometry too large (L=%u Hkv=%u D=%u B=%u)", name,
				 g->n_layers, g->n_kv_heads, g->head_dim, g->block_tokens);
	if (kvmem_page_bytes(g) > (1u << 30))
		return kvmem_error(EINVAL, "%s: a page of %zu bytes is over 1 GiB", name, kvmem_page_bytes(g));
	if (g->index_bytes > (1u << 30))
		return kvmem_error(EINVAL, "%s: index record of %u bytes is over 1 GiB", name,
				 g->index_bytes);
	return 0;
}

char *kvmem_page_geom_str(const kvmem_page_geom *g, char *buf, size_t len)
{
	snprintf(buf, len, "L=%u Hq=%u Hkv=%u D=%u B=%u %s index=%u fingerprint=%016" PRIx64,
		 g->n_layers, g->n_heads, g->n_kv_heads, g->head_dim, g->block_tokens,
		 kvmem_dtype_name(g->dtype), g->index_bytes, g->fingerprint);
	return buf;
}
