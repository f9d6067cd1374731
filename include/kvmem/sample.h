/* SPDX-License-Identifier: MIT */
/*
 * Sampling a token from logits, and kvmem's one PRNG (splitmix64): what
 * kvmem_session_decode() takes and what a program that runs its own
 * full-context twin draws with, so both draw the same tokens.
 */
#ifndef KVMEM_SAMPLE_H
#define KVMEM_SAMPLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

typedef struct kvmem_sampler {
	float temperature;	/* <= 0: greedy (argmax, lowest index on ties) */
	int top_k;		/* <= 0: no top-k cut */
	float top_p;		/* >= 1 or <= 0: no nucleus cut */
	uint64_t seed;		/* the RNG state starts from this */
} kvmem_sampler;

/* Draw one token id from logits[vocab]. *rng is the state (splitmix64), advanced
 * by one value per non-greedy draw (greedy leaves it alone); start it with
 * kvmem_rng_seed(s->seed). Deterministic for a seed. Candidates rank by logit,
 * ties to the lower id; top-k keeps the k best, top-p then the shortest prefix
 * holding top_p of their mass. NaN logits are never drawn. A candidate weighs
 * e^((logit - best) / T) as a 52-bit fixed-point integer, and the draw lands
 * on the first whose running sum passes the uniform share of the kept sum
 * (Documentation/kernels.md, "Sampling"): one rule for the CPU and the GPU.
 * Returns the id, or -EINVAL when vocab <= 0 (or, at a temperature, past
 * 2^23) and -ENOMEM when memory runs out. */
int kvmem_sample(const float *logits, int vocab, const kvmem_sampler *s, uint64_t *rng);
uint64_t kvmem_rng_seed(uint64_t seed);
/* Uniform double in [0, 1). */
double kvmem_rng_uniform(uint64_t *rng);
/* The next 64 bits of the stream (splitmix64: the state advances by the
 * golden gamma, the output is kvmem_mix64 of it). kvmem's one PRNG: model
 * weights, workspaces, tests and benchmarks all draw from it. */
uint64_t kvmem_rng_next(uint64_t *rng);
#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
