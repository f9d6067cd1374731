// SPDX-License-Identifier: MIT
/* Placeholder until the agent-session mode lands; replace this whole file. */
#include <stdio.h>
#include "cmd.h"

int session_main(int argc, char **argv)
{
	fprintf(stderr, "kvmem run: agent sessions are not built yet\n");
	return 1;
}
