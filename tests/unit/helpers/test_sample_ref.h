/* SPDX-License-Identifier: MIT */
/* kvmem_sample's draw as it ran before 2026-12-06, every id put in rank
 * order by qsort (higher logit first, NaN as -inf, ties to the lower id),
 * then the same softmax (its weights kvmem_sample_weight's, as kvmem_sample's
 * since they replaced libm's exp) and draw, one weight at a time: the
 * reference its radix-sorted order and vectorised weights are held to
 * (test_kernels' test_sample_full_order) and timed against
 * (tools/bench/sample_cost.c). Not thread-safe (qsort has no context). */
#ifndef KVMEM_TEST_SAMPLE_REF_H
#define KVMEM_TEST_SAMPLE_REF_H

#include <stdint.h>

#include "kvmem/sample.h"

int test_sample_qsort(const float *logits, int vocab, const kvmem_sampler *s, uint64_t *rng);

#endif
