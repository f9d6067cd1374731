// SPDX-License-Identifier: MIT
/* kvmem stat DIR: what a workspace holds and its tier counters, no BPF. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <getopt.h>

#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "cli_util.h"
#include "cmd.h"
#include "kvmem/store.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: kvmem stat [--ceph-conf PATH] DIR\n\n"
		   "Print what the workspace DIR (a directory, or rados://POOL/NAME in a Ceph\n"
		   "pool) holds (from its manifest) and the\n"
		   "pager's counters: hits, misses, bytes and nanoseconds per tier move,\n"
		   "evictions, stage-out and backpressure, errors. Counters are totals over\n"
		   "every session of the workspace, saved at each commit and close. Reads\n"
		   "only, takes no lock: a writer may go on meanwhile.\n"
		   "Live events: the USDT probes listed in Documentation/pager.md and the\n"
		   "bpf/ tools (Documentation/observability.md).\n\n"
		   CLI_CEPH_CONF_HELP "\n"
		   "examples:\n"
		   "  kvmem stat ~/agent/ws\n"
		   "  watch -n 1 kvmem stat ~/agent/ws\n"
		   "  kvmem stat rados://kvmem/agent-7\n");
}

int cmd_stat(int argc, char **argv)
{
	kvmem_workspace_info wi;
	kvmem_pager_stats st;
	char geom[256];

	static const struct option opts[] = {
		{ "ceph-conf", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *dir;
	int c;

	cli_getopt_reset();
	while ((c = cli_getopt("kvmem stat", argc, argv, opts)) != -1) {
		if (c == 'h') {
			usage(stdout);
			return 0;
		}
		if (c == 'c') {
			cli_ceph_conf(optarg);
			continue;
		}
		return EXIT_USAGE;
	}
	if (optind != argc - 1) {
		fprintf(stderr, "kvmem stat: give one workspace directory (kvmem stat --help)\n");
		return EXIT_USAGE;
	}
	dir = argv[optind];
	if (kvmem_workspace_info_read(dir, &wi) < 0) {
		fprintf(stderr, "kvmem stat: %s\n", kvmem_last_error());
		return 1;
	}
	printf("workspace %s\n", dir);
	printf("  %s\n", kvmem_page_geom_str(&wi.geom, geom, sizeof(geom)));
	printf("  committed: %" PRIu64 " tokens, %" PRIu64 " full blocks + %u tokens, "
	       "%" PRIu64 " pages of %u bytes (%.1f MiB), commit %" PRIu64 "\n",
	       wi.tokens, wi.blocks, wi.tail_tokens, wi.blocks * wi.geom.n_layers, wi.page_bytes,
	       wi.blocks * wi.geom.n_layers * (double)wi.page_stride / (1 << 20), wi.generation);
	/* The counters are advisory: a missing or unusable file (a FIFO, a
	 * link) is said, not waited on or followed, and is no error. */
	if (kvmem_workspace_stats(dir, &st) < 0) {
		if (kvmem_last_errno() == ENOENT)
			printf("counters: none saved yet\n");
		else
			printf("counters: not read (%s)\n", kvmem_last_error());
		return 0;
	}
	printf("counters (all sessions):\n");
	kvmem_pager_stats_print(&st, stdout);
	return 0;
}
