// SPDX-License-Identifier: MIT
/* kvmem verify DIR: check every checksum of a workspace directory. */
#include <stdio.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "cmd.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: kvmem verify [-q] DIR\n\n"
		   "Check every checksum of the workspace directory DIR: the manifest, the\n"
		   "committed tokens, the page checksum file, every page, every index record\n"
		   "and the partial last block. Each bad page or file is named on its own\n"
		   "line. Nothing is modified.\n\n"
		   "  -q   print only what is bad\n\n"
		   "exit status: 0 all good, 1 something is bad or unreadable, 2 bad usage\n");
}

int cmd_verify(int argc, char **argv)
{
	const char *dir = NULL;
	int quiet = 0;
	long bad;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "-q")) {
			quiet = 1;
		} else if (argv[i][0] == '-' || dir) {
			usage(stderr);
			return EXIT_USAGE;
		} else {
			dir = argv[i];
		}
	}
	if (!dir) {
		usage(stderr);
		return EXIT_USAGE;
	}
	bad = kvmem_workspace_verify(dir, stdout, !quiet);
	if (bad < 0)
		fprintf(stderr, "kvmem verify: %s\n", kvmem_last_error());
	return bad == 0 ? 0 : 1;
}
