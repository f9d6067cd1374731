// SPDX-License-Identifier: MIT
/* Placeholder until the benchmark lands; replace this whole file. */
#include <stdio.h>
#include "cmd.h"

int bench_recall(int argc, char **argv)
{
	fprintf(stderr, "kvmem bench recall: not built yet\n");
	return 1;
}
