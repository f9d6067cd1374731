// SPDX-License-Identifier: MIT
/* Placeholder until the subcommand lands; replace this whole file. */
#include <stdio.h>
#include "cmd.h"

int cmd_generate(int argc, char **argv)
{
	fprintf(stderr, "kvmem generate: not built yet\n");
	return 1;
}
