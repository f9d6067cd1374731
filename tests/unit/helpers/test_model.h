/* SPDX-License-Identifier: MIT */
/*
 * Test helpers for the engine: fresh random seeds, a small RNG, and small
 * random Qwen3 models built in memory (no files).
 */
#ifndef KVMEM_TEST_MODEL_H
#define KVMEM_TEST_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem/model.h"

/* A fresh seed from /dev/urandom (or the clock), or $KVMEM_TEST_SEED when
 * set; printed with `what` so a failure can be replayed. */
uint64_t test_rng_fresh_seed(const char *what);
/* splitmix64 stream: the next 64 bits, uniform in [0, 1), in [lo, hi), and an
 * integer in [lo, hi]. */
uint64_t test_rng_next(uint64_t *s);
double test_rng_uniform(uint64_t *s);
double test_rng_range(uint64_t *s, double lo, double hi);
int test_rng_int(uint64_t *s, int lo, int hi);
/* A stream of its own for each named case under one seed (FNV-1a of the
 * name over the seed), so a case's inputs do not shift when others change. */
uint64_t test_rng_named(uint64_t seed, const char *name);
/* n floats uniform in [lo, hi) from stream s, malloc'd (aborts when out of
 * memory: a test cannot go on without its inputs). */
float *test_rand_floats(uint64_t *s, size_t n, double lo, double hi);

/* The backend under test: $KVMEM_TEST_BACKEND, "cpu" when unset or empty
 * (the same checks run on every backend through its ops). */
const char *test_backend_name(void);

/* A config for a small model: the fields tests vary, the rest filled in
 * (rope_theta 10000 unless set, eps 1e-6, arch Qwen3ForCausalLM). */
kvmem_config test_model_config(int layers, int hidden, int heads, int kv_heads, int head_dim,
			     int intermediate, int vocab, int tied);

/* A model with random weights from `seed`: projections uniform with
 * variance 1/fan_in, norm weights in [0.5, 1.5], embeddings in [-1, 1].
 * Free with test_model_free (not kvmem_model_free: nothing here is mapped). */
kvmem_model *test_model_random(const kvmem_config *c, uint64_t seed);
void test_model_free(kvmem_model *m);

#endif
