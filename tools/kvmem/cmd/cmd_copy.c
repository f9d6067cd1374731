// SPDX-License-Identifier: MIT
/* kvmem copy SRC DST: a workspace, whole, between a directory and a RADOS
 * pool (either way, or directory to directory, pool to pool). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <getopt.h>

#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "cli_util.h"
#include "cmd.h"

#define WHO "kvmem copy"

static void usage(FILE *f)
{
	fprintf(f, "usage: kvmem copy [--ceph-conf PATH] SRC DST\n\n"
		   "Copy the workspace SRC whole into a new workspace DST (absent or empty).\n"
		   "Either may be a directory or rados://POOL/NAME (a namespace of a Ceph pool),\n"
		   "so a conversation moves between a machine's disk and a cluster both ways.\n"
		   "Every page, index record, the partial block and the token ids are checked\n"
		   "against their checksums on the way, and the session state goes along: a\n"
		   "session reopened on DST goes on exactly as it would on SRC. All or nothing:\n"
		   "when something in SRC is bad, DST is left an empty workspace (kvmem verify\n"
		   "names what is bad; kvmem verify --salvage keeps what is good). SRC is only\n"
		   "read and its writer may go on meanwhile; DST is written under its own lock.\n\n"
		   CLI_CEPH_CONF_HELP
		   "\nexit status: 0 copied, 1 not copied (the message says why), 2 bad usage\n\n"
		   "examples:\n"
		   "  kvmem copy ~/agent/ws rados://kvmem/agent-7\n"
		   "  CEPH_ARGS='--id kvmem-a' kvmem copy rados://kvmem/agent-7 /var/tmp/agent-7\n");
}

int cmd_copy(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "ceph-conf", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	kvmem_salvage_report r;
	int c;

	cli_getopt_reset();
	while ((c = cli_getopt(WHO, argc, argv, opts)) != -1)
		switch (c) {
		case 'h': usage(stdout); return 0;
		case 'c': cli_ceph_conf(optarg); break;
		default: return EXIT_USAGE;
		}
	if (optind != argc - 2 || !*argv[optind] || !*argv[optind + 1]) {
		fprintf(stderr, "%s: give a source and a destination workspace (%s --help)\n", WHO, WHO);
		return EXIT_USAGE;
	}
	if (kvmem_workspace_copy(argv[optind], argv[optind + 1], &r) < 0) {
		fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
		return 1;
	}
	printf("copied %s to %s: %" PRIu64 " tokens (%" PRIu64 " full blocks%s), session state %s\n",
	       argv[optind], argv[optind + 1], r.tokens_kept, r.blocks_kept,
	       r.tail_kept ? " and the partial block" : "", r.app_kept ? "kept" : "none");
	return 0;
}
