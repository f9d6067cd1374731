// SPDX-License-Identifier: MIT
/* kvmem bench <name>: benchmarks, separate from the tests. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"

static const struct {
	const char *name;
	int (*fn)(int, char **);
	const char *what;
} benches[] = {
	{ "select", bench_select, "selection + planning time against the number of blocks" },
	{ "pager", bench_pager, "NVMe page-in / stage-out throughput and host hit rates" },
	{ "recall", bench_recall, "needle recall accuracy per policy and workspace size" },
	{ "engine", bench_engine, "prefill and decode speed against the GEMM rate and memory roofline" },
	{ "step", bench_step, "the GPU paging pipeline: rematerialisation, page-in, agent step, stage-out" },
	{ "serve", bench_serve, "kvmem serve under load: aggregate tokens/s, time to first token" },
	{ "batch", bench_batch, "batched decode of many sessions against the loop, in the library" },
};

int cmd_bench(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		FILE *f = argc < 2 ? stderr : stdout;
		fprintf(f, "usage: kvmem bench <name> [options]\n\nbenchmarks:\n");
		for (size_t i = 0; i < sizeof(benches) / sizeof(benches[0]); i++)
			fprintf(f, "  %-7s %s\n", benches[i].name, benches[i].what);
		fprintf(f, "\nkvmem bench <name> --help for its options.\n\n"
			   "examples:\n"
			   "  kvmem bench select --blocks 1k,64k\n"
			   "  kvmem bench pager --size 512M --rounds 5\n"
			   "  kvmem bench recall --model models/agentlang --quick\n"
			   "  kvmem bench engine --backend cuda\n"
			   "  kvmem bench serve --clients 1,8,32\n"
			   "  kvmem bench batch --sessions 1,8,64\n");
		return argc < 2 ? EXIT_USAGE : 0;
	}
	for (size_t i = 0; i < sizeof(benches) / sizeof(benches[0]); i++)
		if (!strcmp(argv[1], benches[i].name))
			return benches[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "kvmem bench: unknown benchmark '%s' (kvmem bench --help)\n", argv[1]);
	return EXIT_USAGE;
}
