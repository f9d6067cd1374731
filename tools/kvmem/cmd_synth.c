// SPDX-License-Identifier: MIT
/* Placeholder until the subcommand lands; replace this whole file. */
#include <stdio.h>
#include "cmd.h"

int cmd_synth(int argc, char **argv)
{
	fprintf(stderr, "kvmem synth: not built yet\n");
	return 1;
}
