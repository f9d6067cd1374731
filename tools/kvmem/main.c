// SPDX-License-Identifier: MIT
/* kvmem: the command line. Each subcommand lives in cmd_<name>.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "cli_util.h"
#include "cmd.h"

static const struct subcommand {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *what;
} subcommands[] = {
	{ "demo", cmd_demo, "the main job: a multi-step agent session on an embedded default model" },
	{ "generate", cmd_generate, "write a random Qwen3-shaped model directory (presets tiny..32b)" },
	{ "info", cmd_info, "geometry, parameter count and KV bytes per token of a model directory" },
	{ "run", cmd_run, "prefill tokens and decode, plainly or as an agent session over a workspace" },
	{ "bench", cmd_bench, "benchmarks: select, pager, recall, engine, step, serve, batch" },
	{ "verify", cmd_verify, "check every checksum of a workspace directory" },
	{ "stat", cmd_stat, "tier counters of a workspace directory, without BPF" },
	{ "copy", cmd_copy, "copy a workspace between a directory and a RADOS pool, either way" },
	{ "synth", cmd_synth, "the synthetic agent-workspace language: corpora, questions, tokenizer" },
	{ "lab", cmd_lab, "replay recorded sessions with any selection and cache policy, offline" },
	{ "serve", cmd_serve, "the OpenAI HTTP API; every conversation a persistent workspace" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: kvmem <command> [options]   (kvmem <command> --help for more)\n\n"
		   "kvmem keeps an LLM agent's history as KV state, paged across GPU, host\n"
		   "memory and NVMe, and brings back only the blocks each step needs.\n\n"
		   "commands:\n");
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
		fprintf(f, "  %-9s %s\n", subcommands[i].name, subcommands[i].what);
	fprintf(f, "\nexamples:\n"
		   "  kvmem demo\n"
		   "  kvmem generate --preset tiny --out /tmp/tiny\n"
		   "  kvmem info /tmp/tiny\n"
		   "  kvmem run --model /tmp/tiny --random 64 --decode 8\n"
		   "\nenvironment: KVMEM_HOME (data directory), KVMEM_API_KEY (serve),\n"
		   "KVMEM_CUDA_GRAPH and others (Documentation/cli.md, \"Environment\")\n"
		   "\nkvmem %s\n", KVMEM_VERSION);
}

int main(int argc, char **argv)
{
	/*
	 * OpenMP's default spin-waiting makes kvmem many times slower whenever
	 * the cores are shared (measured: the demo on 8K tokens took 130 s with
	 * two busy cores, 15 s with passive waiting). libgomp reads the policy
	 * when it loads, before main, so set it and start the program again.
	 */
	if (!getenv("OMP_WAIT_POLICY")) {
		setenv("OMP_WAIT_POLICY", "passive", 1);
		execv("/proc/self/exe", argv);
		/* If that fails, run on with the default. */
	}
	/* Output is the product: a write error on stdout (a full disk, a
	 * closed descriptor) is a failure, checked once at exit. */
	cli_guard_stdio();
	atexit(cli_close_stdout);
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("kvmem %s\n", KVMEM_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
		if (!strcmp(argv[1], subcommands[i].name))
			return subcommands[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "kvmem: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return EXIT_USAGE;
}
