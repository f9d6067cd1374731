// SPDX-License-Identifier: MIT
/* Placeholder until the benchmark lands; replace this whole file. */
#include <stdio.h>
#include "cmd.h"

int bench_pager(int argc, char **argv)
{
	fprintf(stderr, "kvmem bench pager: not built yet\n");
	return 1;
}
