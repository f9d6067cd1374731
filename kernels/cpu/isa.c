// SPDX-License-Identifier: MIT
/* The CPU kernels' instruction sets by name (isa.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/isa.h"

const char *const kvmem_isa_names[3] = { "c", "avx2", "avx512" };

int kvmem_isa_pick(int (*supported)(int level), const char *isa, int *chosen)
{
	for (int i = 0; i < 3; i++)
		if (isa && !strcmp(isa, kvmem_isa_names[i])) {
			if (!supported(i))
				return -ENOTSUP;
			*chosen = i;
			return 0;
		}
	return -EINVAL;
}

int kvmem_isa_best(int (*supported)(int level), const char *env)
{
	const char *e = getenv(env);
	int level = supported(KVMEM_ISA_AVX512) ? KVMEM_ISA_AVX512
		    : supported(KVMEM_ISA_AVX2) ? KVMEM_ISA_AVX2 : KVMEM_ISA_C;

	if (e && *e)
		kvmem_isa_pick(supported, e, &level);
	return level;
}
