/* SPDX-License-Identifier: MIT */
/*
 * The instruction sets a CPU kernel chooses among, once per process (the
 * matmul's, KVMEM_MATMUL; the attention's, KVMEM_ATTENTION). What a level
 * needs of the CPU is the kernel's own: its supported(level). Neither
 * function calls pthread_once: a kernel's once-only choice calls them from
 * inside its own (KVMEM_MATMUL once hung the first matmul that way).
 */
#ifndef KVMEM_KERNELS_CPU_ISA_H
#define KVMEM_KERNELS_CPU_ISA_H

enum { KVMEM_ISA_C, KVMEM_ISA_AVX2, KVMEM_ISA_AVX512 };

/* "c", "avx2", "avx512", by level. */
extern const char *const kvmem_isa_names[3];

/* The level isa names into *chosen: 0, -ENOTSUP (supported() says the CPU
 * lacks it) or -EINVAL (no such name; *chosen unchanged either way). */
int kvmem_isa_pick(int (*supported)(int level), const char *isa, int *chosen);

/* The best level supported() allows, or $env's where it names one the CPU
 * has (the cpu backend refuses a name that does not: user/backend/cpu.c). */
int kvmem_isa_best(int (*supported)(int level), const char *env);

#endif
