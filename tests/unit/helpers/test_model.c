// SPDX-License-Identifier: MIT
/* Test helpers: seeds, a small RNG, random in-memory Qwen3 models. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "test_model.h"

uint64_t test_rng_fresh_seed(const char *what)
{
	const char *env = getenv("KVMEM_TEST_SEED");
	uint64_t seed = 0;

	if (env && *env) {
		seed = strtoull(env, NULL, 0);
	} else {
		FILE *f = fopen("/dev/urandom", "rb");

		if (!f || fread(&seed, sizeof(seed), 1, f) != 1) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			seed = (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec;
		}
		if (f)
			fclose(f);
	}
	printf("%s: seed %" PRIu64 " (replay with KVMEM_TEST_SEED=%" PRIu64 ")\n", what, seed,
	       seed);
	fflush(stdout);
	return seed;
}

uint64_t test_rng_next(uint64_t *s)
{
	return kvmem_rng_next(s);
}

double test_rng_uniform(uint64_t *s)
{
	return (double)(test_rng_next(s) >> 11) * 0x1p-53;
}

double test_rng_range(uint64_t *s, double lo, double hi)
{
	return lo + (hi - lo) * test_rng_uniform(s);
}

int test_rng_int(uint64_t *s, int lo, int hi)
{
	return lo + (int)(test_rng_uniform(s) * (hi - lo + 1));
}

uint64_t test_rng_named(uint64_t seed, const char *name)
{
	uint64_t h = seed;

	for (const char *p = name; *p; p++)
		h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
	return h;
}

float *test_rand_floats(uint64_t *s, size_t n, double lo, double hi)
{
	float *p = malloc(sizeof(float) * (n ? n : 1));

	if (!p)
		abort();
	for (size_t i = 0; i < n; i++)
		p[i] = (float)test_rng_range(s, lo, hi);
	return p;
}

const char *test_backend_name(void)
{
	const char *name = getenv("KVMEM_TEST_BACKEND");

	return name && *name ? name : "cpu";
}

kvmem_config test_model_config(int layers, int hidden, int heads, int kv_heads, int head_dim,
			     int intermediate, int vocab, int tied)
{
	kvmem_config c;

	memset(&c, 0, sizeof(c));
	snprintf(c.arch, sizeof(c.arch), "Qwen3ForCausalLM");
	snprintf(c.dtype, sizeof(c.dtype), "float32");
	c.n_layers = layers;
	c.hidden = hidden;
	c.n_heads = heads;
	c.n_kv_heads = kv_heads;
	c.head_dim = head_dim;
	c.intermediate = intermediate;
	c.vocab = vocab;
	c.max_position = 4096;
	c.rope_theta = 10000.0;
	c.rms_eps = 1e-6f;
	c.tie_embeddings = tied;
	c.bos_id = -1;
	c.eos_id = -1;
	return c;
}

struct test_store {
	float *w;
	size_t used, cap;
	uint64_t rng;
};

static float *take(struct test_store *st, size_t n, double lo, double hi)
{
	float *p = st->w + st->used;

	st->used += n;
	if (st->used > st->cap)
		abort();	/* a sizing bug in this helper */
	for (size_t i = 0; i < n; i++)
		p[i] = (float)test_rng_range(&st->rng, lo, hi);
	return p;
}

/* Uniform with variance 1/fan_in. */
static float *proj(struct test_store *st, size_t rows, size_t fan_in)
{
	double a = sqrt(3.0 / (double)fan_in);

	return take(st, rows * fan_in, -a, a);
}

kvmem_model *test_model_random(const kvmem_config *c, uint64_t seed)
{
	size_t hd = c->hidden, qw = (size_t)c->n_heads * c->head_dim;
	size_t kw = (size_t)c->n_kv_heads * c->head_dim, im = c->intermediate;
	size_t per_layer = 2 * hd + 2 * (size_t)c->head_dim + qw * hd + 2 * kw * hd + hd * qw +
			   3 * im * hd;
	size_t total = (size_t)c->vocab * hd * (c->tie_embeddings ? 1 : 2) + hd +
		       per_layer * c->n_layers;
	kvmem_model *m = calloc(1, sizeof(*m));
	struct test_store *st = calloc(1, sizeof(*st));

	if (!m || !st)
		abort();
	st->w = malloc(sizeof(float) * total);
	st->cap = total;
	st->rng = seed;
	m->layers = calloc(c->n_layers, sizeof(kvmem_layer));
	if (!st->w || !m->layers)
		abort();
	m->cfg = *c;
	snprintf(m->dir, sizeof(m->dir), "(in-memory test model)");
	m->priv = st;
	m->embed = take(st, (size_t)c->vocab * hd, -1.0, 1.0);
	for (int l = 0; l < c->n_layers; l++) {
		kvmem_layer *L = &m->layers[l];

		L->attn_norm = take(st, hd, 0.5, 1.5);
		L->wq = proj(st, qw, hd);
		L->wk = proj(st, kw, hd);
		L->wv = proj(st, kw, hd);
		L->wo = proj(st, hd, qw);
		L->q_norm = take(st, c->head_dim, 0.5, 1.5);
		L->k_norm = take(st, c->head_dim, 0.5, 1.5);
		L->mlp_norm = take(st, hd, 0.5, 1.5);
		L->w_gate = proj(st, im, hd);
		L->w_up = proj(st, im, hd);
		L->w_down = proj(st, hd, im);
	}
	m->final_norm = take(st, hd, 0.5, 1.5);
	m->lm_head = c->tie_embeddings ? m->embed : proj(st, (size_t)c->vocab, hd);
	return m;
}

void test_model_free(kvmem_model *m)
{
	struct test_store *st;

	if (!m)
		return;
	st = m->priv;
	if (st)
		free(st->w);
	free(st);
	free(m->layers);
	free(m);
}
