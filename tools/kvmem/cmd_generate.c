// SPDX-License-Identifier: MIT
/* kvmem generate: write a random Qwen3-shaped model directory from a preset. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "cli_util.h"
#include "cmd.h"

/* Big presets show progress; tiny ones finish before it would matter. */
#define PROGRESS_FROM (256ull << 20)

static void usage(FILE *f)
{
	fprintf(f, "usage: kvmem generate --preset NAME --out DIR [--seed N] [--dry-run] [--force]\n"
		   "                      [--dtype bf16|f16|f32] [--shard-mb N]\n\n"
		   "Write a Qwen3-shaped Hugging Face model directory with random weights:\n"
		   "config.json, generation_config.json and model.safetensors (bf16). The same\n"
		   "preset and seed give the same bytes. Weights are scaled so activations keep\n"
		   "a sane size through every layer; the model computes, but says nothing useful.\n\n"
		   "presets:\n");
	for (const kvmem_preset *p = kvmem_presets; p->name; p++) {
		uint64_t params = kvmem_config_params(&p->cfg);

		uint64_t bytes = kvmem_model_generate_bytes(&p->cfg, NULL);

		if (params < 100000000)
			fprintf(f, "  %-5s %-46s %6.2fM params %7.1f MB\n", p->name, p->what,
				params / 1e6, bytes / 1e6);
		else
			fprintf(f, "  %-5s %-46s %6.2fB params %7.2f GB\n", p->name, p->what,
				params / 1e9, bytes / 1e9);
	}
	fprintf(f, "\noptions:\n"
		   "  --preset NAME   one of the presets above\n"
		   "  --out DIR       where to write (created if missing)\n"
		   "  --seed N        random seed (default 0)\n"
		   "  --dry-run       print the geometry and sizes, write nothing\n"
		   "  --force         write into a DIR that is not empty, replacing its model files\n"
		   "  --dtype T       bf16 (default), f16 or f32\n"
		   "  --shard-mb N    split the weights into shards of at most N MB with\n"
		   "                  model.safetensors.index.json, as large checkpoints come\n"
		   "  --help          this text\n");
}

static void print_geometry(const kvmem_preset *p, const kvmem_gen_opts *o, uint64_t bytes)
{
	const kvmem_config *c = &p->cfg;
	char b[32];

	printf("preset        %s (%s)\n", p->name, p->what);
	cli_print_geometry(c);
	printf("file size     %llu bytes (%s) of %s safetensors%s\n", (unsigned long long)bytes,
	       cli_fmt_bytes(b, sizeof(b), (double)bytes), o->dtype ? o->dtype : "bf16",
	       o->shard_bytes ? ", sharded" : "");
	cli_print_kv(c);
}

struct shown {
	int last;	/* last percentage shown */
	bool tty;
};

static void show_progress(uint64_t done, uint64_t total, void *arg)
{
	struct shown *s = arg;
	int pct = total ? (int)(100 * done / total) : 100;

	if (pct == s->last || (!s->tty && pct / 10 == s->last / 10 && pct != 100))
		return;
	s->last = pct;
	if (s->tty)
		fprintf(stderr, "\rwriting weights: %3d%% (%.2f of %.2f GB)", pct, done / 1e9,
			total / 1e9);
	else
		fprintf(stderr, "writing weights: %3d%% (%.2f of %.2f GB)\n", pct, done / 1e9,
			total / 1e9);
	if (s->tty && pct == 100)
		fputc('\n', stderr);
}

/* 1 if dir exists and holds anything, 0 if missing or empty, -1 if unusable. */
static int dir_nonempty(const char *dir)
{
	struct stat st;
	struct dirent *e;
	DIR *d;
	int found = 0;

	if (stat(dir, &st))
		return errno == ENOENT ? 0 : -1;
	if (!S_ISDIR(st.st_mode)) {
		errno = ENOTDIR;
		return -1;
	}
	d = opendir(dir);
	if (!d)
		return -1;
	while (!found && (e = readdir(d)))
		found = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return found;
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (!s || !*s || *s == '-')
		return -1;
	errno = 0;
	*out = strtoull(s, &end, 0);
	return errno || *end ? -1 : 0;
}

int cmd_generate(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "preset", required_argument, NULL, 'p' }, { "out", required_argument, NULL, 'o' },
		{ "seed", required_argument, NULL, 's' },   { "dry-run", no_argument, NULL, 'n' },
		{ "force", no_argument, NULL, 'f' },	    { "dtype", required_argument, NULL, 't' },
		{ "shard-mb", required_argument, NULL, 'm' }, { "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *preset = NULL, *out = NULL;
	bool dry = false, force = false;
	kvmem_gen_opts o = { 0 };
	struct shown shown = { .last = -1, .tty = isatty(2) };
	const kvmem_preset *p;
	uint64_t bytes, mb;
	char a[32], b[32];
	int c, ne;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'p': preset = optarg; break;
		case 'o': out = optarg; break;
		case 'n': dry = true; break;
		case 'f': force = true; break;
		case 't': o.dtype = optarg; break;
		case 's':
			if (parse_u64(optarg, &o.seed)) {
				fprintf(stderr, "kvmem generate: --seed '%s' is not a number\n", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'm':
			if (parse_u64(optarg, &mb) || !mb || mb > (1ull << 30)) {
				fprintf(stderr, "kvmem generate: --shard-mb '%s' is not a positive number\n",
					optarg);
				return EXIT_USAGE;
			}
			o.shard_bytes = mb << 20;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvmem generate: unexpected argument '%s'\n\n", argv[optind]);
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!preset) {
		fprintf(stderr, "kvmem generate: --preset is required\n\n");
		usage(stderr);
		return EXIT_USAGE;
	}
	p = kvmem_preset_find(preset);
	if (!p) {
		fprintf(stderr, "kvmem generate: unknown preset '%s' (presets:", preset);
		for (const kvmem_preset *q = kvmem_presets; q->name; q++)
			fprintf(stderr, " %s", q->name);
		fprintf(stderr, ")\n");
		return EXIT_USAGE;
	}
	bytes = kvmem_model_generate_bytes(&p->cfg, &o);
	if (!bytes) {
		fprintf(stderr, "kvmem generate: %s\n", kvmem_last_error());
		return EXIT_USAGE;
	}
	if (dry) {
		print_geometry(p, &o, bytes);
		printf("(dry run: nothing written)\n");
		return 0;
	}
	if (!out) {
		fprintf(stderr, "kvmem generate: --out DIR is required (or --dry-run)\n");
		return EXIT_USAGE;
	}
	ne = dir_nonempty(out);
	if (ne < 0) {
		fprintf(stderr, "kvmem generate: %s: %s\n", out, strerror(errno));
		return 1;
	}
	if (ne && !force) {
		fprintf(stderr, "kvmem generate: %s is not empty; use --force to write the model "
				"into it anyway\n", out);
		return 1;
	}
	if (bytes >= PROGRESS_FROM) {
		o.progress = show_progress;
		o.arg = &shown;
		fprintf(stderr, "generating preset %s (%s) into %s\n", p->name,
			cli_fmt_bytes(a, sizeof(a), (double)bytes), out);
	}
	if (kvmem_model_generate_opts(&p->cfg, out, &o)) {
		if (shown.tty && shown.last >= 0 && shown.last < 100)
			fputc('\n', stderr);
		fprintf(stderr, "kvmem generate: %s\n", kvmem_last_error());
		return 1;
	}
	printf("wrote %s: preset %s, seed %llu, %s parameters, %s\n", out, p->name,
	       (unsigned long long)o.seed,
	       cli_fmt_sci(a, sizeof(a), (double)kvmem_config_params(&p->cfg)),
	       cli_fmt_bytes(b, sizeof(b), (double)bytes));
	return 0;
}
