// SPDX-License-Identifier: MIT
/* Reading a page's K or V as fp32, whatever dtype its source keeps. */
#include <errno.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kvmem/source.h"

const float *kvmem_page_f32(const kvmem_page *pg, int is_v, size_t n, float *scratch)
{
	const void *p = is_v ? pg->v : pg->k;

	if (pg->mem != KVMEM_MEM_HOST) {
		kvmem_error(ENOTSUP, "page source: the page is in device memory, not readable here");
		return NULL;
	}
	switch (pg->dtype) {
	case KVMEM_DTYPE_F32:
		return p;
	case KVMEM_DTYPE_BF16:
		kvmem_bf16_to_f32_n(scratch, p, n);
		return scratch;
	case KVMEM_DTYPE_F16:
		kvmem_f16_to_f32_n(scratch, p, n);
		return scratch;
	}
	kvmem_error(EINVAL, "page source: unknown page dtype %u", pg->dtype);
	return NULL;
}

int kvmem_page_copy_f32(const kvmem_page *pg, int is_v, size_t off, size_t n, float *dst)
{
	const char *p = is_v ? pg->v : pg->k;

	if (pg->mem != KVMEM_MEM_HOST)
		return kvmem_error(ENOTSUP, "page source: the page is in device memory, not readable here");
	switch (pg->dtype) {
	case KVMEM_DTYPE_F32:
		memcpy(dst, (const float *)p + off, n * sizeof(float));
		return 0;
	case KVMEM_DTYPE_BF16:
		kvmem_bf16_to_f32_n(dst, (const uint16_t *)p + off, n);
		return 0;
	case KVMEM_DTYPE_F16:
		kvmem_f16_to_f32_n(dst, (const uint16_t *)p + off, n);
		return 0;
	}
	return kvmem_error(EINVAL, "page source: unknown page dtype %u", pg->dtype);
}

void kvmem_page_source_destroy(kvmem_page_source *src)
{
	if (src && src->ops && src->ops->destroy)
		src->ops->destroy(src->ctx);
	if (src) {
		src->ops = NULL;
		src->ctx = NULL;
	}
}

int kvmem_page_source_commit(kvmem_page_source *src, const int32_t *ids, int64_t n,
			     const void *app, uint32_t app_len)
{
	if (!src->ops->commit)
		return kvmem_error(ENOTSUP, "page source %s keeps nothing to commit", src->ops->name);
	return src->ops->commit(src->ctx, ids, n, app, app_len);
}
