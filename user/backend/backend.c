// SPDX-License-Identifier: MIT
/* The backend registry: open a backend by name, or the best one here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>

#include "backend/backend_impl.h"
#include "kvmem/kvmem.h"

extern const kvmem_backend_ops kvmem_backend_cpu_ops;
/* Defined in libkvmem_cuda.a (user/backend/cuda.c) when kvmem is built with
 * nvcc and a program links it; weak, so without it the list ends after cpu. */
extern const kvmem_backend_ops kvmem_backend_cuda_ops __attribute__((weak));

const kvmem_backend_ops *const kvmem_backends[] = {
	&kvmem_backend_cpu_ops,
	&kvmem_backend_cuda_ops,	/* NULL when not linked: the end of the list */
	NULL,
};

#define CHUNK_DEFAULT 128

static const kvmem_backend_ops *find(const char *name)
{
	char known[256] = "";

	for (int i = 0; kvmem_backends[i]; i++)
		if (!strcmp(kvmem_backends[i]->name, name))
			return kvmem_backends[i];
	for (int i = 0; kvmem_backends[i]; i++)
		snprintf(known + strlen(known), sizeof(known) - strlen(known), "%s%s", i ? ", " : "",
			 kvmem_backends[i]->name);
	if (!strcmp(name, "cuda"))
		kvmem_error(ENODEV, "backend cuda: this kvmem was built without CUDA (nvcc was not "
			    "found at build time); backends here: %s", known);
	else
		kvmem_error(EINVAL, "unknown backend '%s'; backends here: %s", name, known);
	return NULL;
}

int kvmem_backend_open(const char *name, const kvmem_model *m, const kvmem_backend_opts *o,
		       kvmem_backend **out)
{
	const kvmem_backend_ops *ops = NULL;
	kvmem_backend *b;
	int rc;

	*out = NULL;
	if (!name || !strcmp(name, "auto")) {
		/* The last backend that can run here: the GPU one when there is a GPU. */
		for (int i = 0; kvmem_backends[i]; i++)
			if (!kvmem_backends[i]->available || !kvmem_backends[i]->available())
				ops = kvmem_backends[i];
	} else if (!(ops = find(name))) {
		return kvmem_fail();
	} else if (ops->available && (rc = ops->available()) < 0) {
		return kvmem_error_prefix("backend %s", ops->name);
	}
	b = calloc(1, sizeof(*b));
	if (!b)
		return kvmem_error(ENOMEM, "backend %s: out of memory", ops->name);
	b->ops = ops;
	b->model = m;
	if (o)
		b->opts = *o;
	if (!b->opts.max_chunk)
		b->opts.max_chunk = CHUNK_DEFAULT;
	if ((rc = kvmem_backend_tp_check(ops, m, &b->opts)) < 0) {
		free(b);
		return rc;
	}
	if (b->opts.max_chunk < 0) {
		rc = kvmem_error(EINVAL, "backend %s: chunk %d is not positive", ops->name,
				 b->opts.max_chunk);
		free(b);
		return rc;
	}
	if ((rc = ops->create(m, &b->opts, &b->ctx)) < 0) {
		free(b);
		return kvmem_error_prefix("backend %s", ops->name);
	}
	*out = b;
	return 0;
}

void kvmem_backend_close(kvmem_backend *b)
{
	if (!b)
		return;
	b->ops->destroy(b->ctx);
	free(b);
}

kvmem_backend *kvmem_backend_cpu(const kvmem_model *m, int max_chunk)
{
	kvmem_backend_opts o = { .max_chunk = max_chunk };
	kvmem_backend *b;

	if (max_chunk <= 0) {
		kvmem_error(EINVAL, "backend cpu: chunk %d is not positive", max_chunk);
		return NULL;
	}
	return kvmem_backend_open("cpu", m, &o, &b) < 0 ? NULL : b;
}

int kvmem_backend_append_out(kvmem_backend *b, kvmem_view *v, const int32_t *tokens, int n,
			     float *logits, int all_logits, const kvmem_fwd_out *out)
{
	int64_t need = b->ops->length(b->ctx, v) + n, cap = b->ops->capacity(b->ctx, v);

	if (need > cap) {
		cap = cap ? cap : 1024;
		while (cap < need)
			cap *= 2;
		if (b->ops->reserve(b->ctx, v, cap) < 0)
			return kvmem_fail();
	}
	return b->ops->forward(b->ctx, v, tokens, n, logits, all_logits, out);
}

int kvmem_backend_forward_batch(kvmem_backend *b, const kvmem_fwd_item *items, int n)
{
	if (!b->ops->forward_batch)
		return kvmem_error(ENOTSUP, "the %s backend has no batched forward", b->ops->name);
	return b->ops->forward_batch(b->ctx, items, n);
}

int kvmem_backend_append(kvmem_backend *b, kvmem_view *v, const int32_t *tokens, int n,
			 float *logits, int all_logits)
{
	return kvmem_backend_append_out(b, v, tokens, n, logits, all_logits, NULL);
}

const char *kvmem_backend_at(int i, const char **what)
{
	for (int k = 0; kvmem_backends[k]; k++)
		if (k == i) {
			if (what)
				*what = kvmem_backends[k]->what;
			return kvmem_backends[k]->name;
		}
	return NULL;
}

const char *kvmem_backend_name(const kvmem_backend *b)
{
	return b->ops->name;
}

const kvmem_model *kvmem_backend_model(const kvmem_backend *b)
{
	return b->model;
}

const kvmem_backend_opts *kvmem_backend_options(const kvmem_backend *b)
{
	return &b->opts;
}

int kvmem_backend_view_new(kvmem_backend *b, int64_t slots, kvmem_view **out)
{
	kvmem_view *v = NULL;

	*out = NULL;
	if (slots < 0)
		return kvmem_error(EINVAL, "backend %s: a view of %lld slots", b->ops->name,
				   (long long)slots);
	if (b->ops->view_create(b->ctx, &v) < 0)
		return kvmem_fail();
	if (slots > 0 && b->ops->reserve(b->ctx, v, slots) < 0) {
		int rc = kvmem_fail();

		b->ops->view_destroy(b->ctx, v);
		return rc;
	}
	*out = v;
	return 0;
}

void kvmem_backend_view_free(kvmem_backend *b, kvmem_view *v)
{
	if (v)
		b->ops->view_destroy(b->ctx, v);
}

int64_t kvmem_backend_view_len(kvmem_backend *b, const kvmem_view *v)
{
	return b->ops->length(b->ctx, v);
}

int kvmem_backend_view_clear(kvmem_backend *b, kvmem_view *v)
{
	return b->ops->set_length(b->ctx, v, 0);
}

int kvmem_backend_ceilings(kvmem_backend *b, kvmem_ceilings *out)
{
	if (!b->ops->ceilings)
		return kvmem_error(ENOTSUP, "the %s backend cannot measure its ceilings",
				   b->ops->name);
	return b->ops->ceilings(b->ctx, out);
}

uint64_t kvmem_backend_mem_used(kvmem_backend *b)
{
	return b->ops->mem_used ? b->ops->mem_used(b->ctx) : 0;
}

void kvmem_backend_place_stats(kvmem_backend *b, kvmem_place_stats *st)
{
	*st = (kvmem_place_stats){ 0 };
	if (b->ops->place_stats)
		b->ops->place_stats(b->ctx, st);
}

int kvmem_backend_set(kvmem_backend *b, const char *key, const char *value)
{
	if (!b->ops->set)
		return kvmem_error(ENOTSUP, "the %s backend has no settings", b->ops->name);
	return b->ops->set(b->ctx, key, value);
}
