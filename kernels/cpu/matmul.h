/* SPDX-License-Identifier: MIT */
/* What matmul.c shares with matmul_panels.c: the chain every element of
 * both is, the chosen instruction set's width and the threads' split. */
#ifndef KVMEM_KERNELS_CPU_MATMUL_H
#define KVMEM_KERNELS_CPU_MATMUL_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/kernels.h"

/* One element: s = fma(x[k], w[k * stride], s) for k = 0 .. in - 1 from
 * s = 0, w fp32 or (b16) bf16 widened. */
float kvmem_matmul_chain(const float *x, const void *w, int b16, size_t stride, int in);
/* Lanes of the chosen instruction set: 16 (AVX-512), 8 (AVX2), 1 (C). */
int kvmem_matmul_level(void);
/* A product with nothing to sum: y zeroed when in <= 0; true (done) when
 * n, out or in is not positive. */
bool kvmem_matmul_empty(float *y, int n, int in, int out);
/* fn(arg, i) for i in 0..items-1 on one thread, the kernels' pool or
 * OpenMP, by the product's multiply-adds. */
void kvmem_matmul_threads(long macs, int items, kvmem_pool_fn fn, void *arg);

#endif
