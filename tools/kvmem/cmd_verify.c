// SPDX-License-Identifier: MIT
/* Placeholder until the subcommand lands; replace this whole file. */
#include <stdio.h>
#include "cmd.h"

int cmd_verify(int argc, char **argv)
{
	fprintf(stderr, "kvmem verify: not built yet\n");
	return 1;
}
