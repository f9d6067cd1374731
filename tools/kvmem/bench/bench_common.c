// SPDX-License-Identifier: MIT
/* The model and backend options the benchmarks share, and their rooflines'
 * arithmetic (bench_common.h). */
#include <stdio.h>

#include <string.h>

#include "backend/backend_impl.h"
#include "bench_common.h"
#include "kvmem/kvmem.h"

int bench_model_opt(struct bench_model *bm, int c, const char *arg)
{
	switch (c) {
	case BENCH_OPT_BACKEND: bm->backend = arg; return 1;
	case BENCH_OPT_PRESET: bm->preset = arg; return 1;
	case BENCH_OPT_MODEL: bm->dir = arg; return 1;
	}
	return 0;
}

const kvmem_model *bench_model_open(struct bench_model *bm, const char *who,
				    const char *dflt_preset, int layers, int *usage)
{
	const kvmem_preset *p;

	*usage = 0;
	if (bm->dir && bm->preset) {
		fprintf(stderr, "%s: --model or --preset, not both\n", who);
		*usage = 1;
		return NULL;
	}
	if (bm->dir) {
		if (kvmem_model_load(bm->dir, &bm->loaded) < 0) {
			fprintf(stderr, "%s: %s\n", who, kvmem_last_error());
			return NULL;
		}
		return bm->loaded;
	}
	p = kvmem_preset_find(bm->preset ? bm->preset : dflt_preset);
	if (!p) {
		fprintf(stderr, "%s: unknown preset '%s' (kvmem generate --help)\n", who,
			bm->preset);
		*usage = 1;
		return NULL;
	}
	bm->geo.cfg = p->cfg;	/* no weights: the backend makes random ones */
	if (layers > 0)
		bm->geo.cfg.n_layers = layers;
	snprintf(bm->geo.dir, sizeof(bm->geo.dir), "preset %s", p->name);
	return &bm->geo;
}

void bench_model_close(struct bench_model *bm)
{
	kvmem_model_free(bm->loaded);
	bm->loaded = NULL;
}

double bench_flops_per_token(const kvmem_config *c)
{
	double qw = (double)c->n_heads * c->head_dim, kw = (double)c->n_kv_heads * c->head_dim;
	double per_layer = c->hidden * (qw + 2 * kw) + qw * c->hidden +
			   3.0 * c->intermediate * c->hidden;

	return 2.0 * c->n_layers * per_layer;
}

double bench_decode_bytes(const kvmem_config *c, int64_t ctx, int w_elem, double kv_elem)
{
	double w = bench_flops_per_token(c) / 2 + (double)c->vocab * c->hidden + c->hidden;
	double kv = 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * (double)ctx;

	return w * w_elem + kv * kv_elem;
}

int bench_weight_elem(const struct kvmem_backend *b)
{
	return b->ops->weight_bytes ? b->ops->weight_bytes(b->ctx) : 2;
}

double bench_kv_elem(const struct kvmem_backend *b, uint32_t kv_dtype, int head_dim)
{
	if (!strcmp(b->ops->name, "cpu"))
		return 4;	/* fp32 views (its fp8 a rounding of them) */
	if (kv_dtype == KVMEM_DTYPE_FP8)
		return 1 + 4.0 / head_dim;	/* e4m3 and a 4-byte scale a row */
	return 2;
}
