// SPDX-License-Identifier: MIT
/* Placeholder until the benchmark lands; replace this whole file. */
#include <stdio.h>
#include "cmd.h"

int bench_select(int argc, char **argv)
{
	fprintf(stderr, "kvmem bench select: not built yet\n");
	return 1;
}
