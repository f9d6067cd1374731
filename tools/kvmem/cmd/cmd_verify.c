// SPDX-License-Identifier: MIT
/* kvmem verify DIR: check every checksum of a workspace directory;
 * --salvage DEST copies what checks out into a new workspace. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <getopt.h>

#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "cli_util.h"
#include "cmd.h"
#include "kvmem/store.h"

#define WHO "kvmem verify"

static void usage(FILE *f)
{
	fprintf(f, "usage: kvmem verify [-q] DIR\n"
		   "       kvmem verify --salvage DEST DIR\n\n"
		   "Check every checksum of the workspace DIR (a directory, or rados://POOL/NAME\n"
		   "in a Ceph pool): the manifest, the\n"
		   "committed tokens, the page checksum file, every page, every index record\n"
		   "and the partial last block. Each bad page or file is named on its own\n"
		   "line. Nothing is modified, and no lock is taken: a writer may go on.\n\n"
		   "  -q, --quiet      print only what is bad (not the summary of a good\n"
		   "                   workspace, nor the note on bytes past the last commit)\n"
		   "  --salvage DEST   write the longest prefix of DIR that checks out (every\n"
		   "                   full block up to the first bad one, the partial block\n"
		   "                   when all of them are good) as a new workspace DEST\n"
		   "                   (absent or empty) and say what was dropped; DIR is only\n"
		   "                   read. The session state goes along only when nothing\n"
		   "                   is dropped. DEST may be in another store.\n"
		   CLI_CEPH_CONF_HELP "\n"
		   "exit status: 0 all good (with --salvage: DEST holds everything), 1 something\n"
		   "is bad or unreadable (with --salvage: something was dropped, if only the\n"
		   "partial block, and DEST holds a prefix, or, with a message on stderr,\n"
		   "nothing could be written), 2 bad usage\n\n"
		   "examples:\n"
		   "  kvmem verify ~/agent/ws\n"
		   "  kvmem verify -q ~/agent/ws && echo intact\n"
		   "  kvmem verify --salvage ~/agent/ws.saved ~/agent/ws\n"
		   "  kvmem verify --ceph-conf /etc/ceph/ceph.conf rados://kvmem/agent-7\n");
}

static int salvage(const char *dir, const char *dest)
{
	kvmem_salvage_report r;
	uint64_t dropped;

	if (kvmem_workspace_salvage(dir, dest, &r) < 0) {
		fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
		return 1;
	}
	dropped = r.tokens - r.tokens_kept;
	printf("salvaged %s into %s\n", dir, dest);
	printf("  kept:    %" PRIu64 " of %" PRIu64 " tokens (%" PRIu64 " of %" PRIu64
	       " full blocks; ", r.tokens_kept, r.tokens, r.blocks_kept, r.blocks);
	if (!r.tail_tokens)
		printf("no partial block)\n");
	else
		printf("the partial block of %u tokens %s)\n", r.tail_tokens,
		       r.tail_kept ? "kept" : "dropped");
	if (!dropped) {
		printf("  nothing was lost; the session state was kept\n");
		return 0;
	}
	if (r.blocks > r.blocks_kept)
		printf("  dropped: %" PRIu64 " tokens (%" PRIu64 " full blocks%s)\n", dropped,
		       r.blocks - r.blocks_kept,
		       r.tail_tokens && !r.tail_kept ? " and the partial block" : "");
	else
		printf("  dropped: %" PRIu64 " tokens (the partial block)\n", dropped);
	if (!r.tokens_ok)
		printf("  the token ids failed their checksum: none could be kept\n");
	printf("  first bad: %s\n", r.first_bad[0] ? r.first_bad : "(unknown)");
	printf("  session state: dropped (it describes the whole history); a run on %s\n"
	       "  starts from a fresh selection over the %" PRIu64 " tokens kept\n", dest,
	       r.tokens_kept);
	/* DEST holds less than DIR, if only the partial block: never the
	 * status of a clean verify. */
	return 1;
}

int cmd_verify(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "quiet", no_argument, NULL, 'q' },
		{ "salvage", required_argument, NULL, 's' },
		{ "ceph-conf", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *dir, *dest = NULL;
	int quiet = 0, c;
	long bad;

	cli_getopt_reset();
	while ((c = cli_getopt_short(WHO, argc, argv, "q", opts)) != -1)
		switch (c) {
		case 'h': usage(stdout); return 0;
		case 'q': quiet = 1; break;
		case 's': dest = optarg; break;
		case 'c': cli_ceph_conf(optarg); break;
		default: return EXIT_USAGE;
		}
	if (optind != argc - 1) {
		fprintf(stderr, "%s: give one workspace directory (%s --help)\n", WHO, WHO);
		return EXIT_USAGE;
	}
	dir = argv[optind];
	if (dest && !*dest) {
		fprintf(stderr, "%s: --salvage wants a directory (%s --help)\n", WHO, WHO);
		return EXIT_USAGE;
	}
	if (dest)
		return salvage(dir, dest);
	bad = kvmem_workspace_verify(dir, stdout, !quiet);
	if (bad < 0)
		fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
	return bad == 0 ? 0 : 1;
}
