// SPDX-License-Identifier: MIT
/* kvmem generate: write a random Qwen3-shaped model directory from a preset. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "cli_util.h"
#include "cmd.h"

/* Big presets show progress; tiny ones finish before it would matter. */
#define PROGRESS_FROM (256ull << 20)

static void usage(FILE *f)
{
	fprintf(f, "usage: kvmem generate --preset NAME --out DIR [options]\n"
		   "       kvmem generate --preset NAME --dry-run\n\n"
		   "Write a Qwen3-shaped Hugging Face model directory with random weights:\n"
		   "config.json, generation_config.json and model.safetensors (bf16). The same\n"
		   "preset and seed give the same bytes. Weights are scaled so activations keep\n"
		   "a sane size through every layer; the model computes, but says nothing useful.\n"
		   "Files are written under temporary names (.NAME.kvmem-tmp-PID) and renamed\n"
		   "when complete; an interrupted run removes its own on SIGINT or SIGTERM, and\n"
		   "the next run removes any left by a process that is gone.\n\n"
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
		   "  --preset NAME       one of the presets above\n"
		   "  --out DIR           where to write (created if missing)\n"
		   "  --seed S            random seed (default 0; decimal or 0x hex)\n"
		   "  --dry-run           print the geometry and sizes, write nothing\n"
		   "  --force             write into a DIR that is not empty, replacing its model files\n"
		   "  --dtype T           bf16 (default), f16 or f32\n"
		   "  --shard-size SIZE   split the weights into shards of at most SIZE bytes with\n"
		   "                      model.safetensors.index.json, as large checkpoints come\n"
		   "                      (k, M, G, T: powers of 1024)\n"
		   "  --help              this text\n\n"
		   "examples:\n"
		   "  kvmem generate --preset tiny --out /tmp/tiny\n"
		   "  kvmem generate --preset 0.6b --out /tmp/q06 --seed 7 --shard-size 256M\n"
		   "  kvmem generate --preset 8b --dry-run\n");
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

/* ---- an interrupted run removes its temporary files -------------------- */
static char g_out[4096];	/* the directory being written */
static char g_tag[48];		/* KVMEM_TMP_TAG "<our pid>": how our temporary names end */

struct dirent64_raw {		/* what getdents64 returns */
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

/* Only system calls and plain byte comparisons: safe in a signal handler. */
static void on_signal(int sig)
{
	size_t tl = strlen(g_tag);
	char buf[4096];
	long n;
	int fd = open(g_out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	while (fd >= 0 && (n = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0)
		for (long at = 0; at < n;) {
			struct dirent64_raw *d = (struct dirent64_raw *)(buf + at);
			size_t nl = strlen(d->d_name);

			if (d->d_name[0] == '.' && nl > tl && !memcmp(d->d_name + nl - tl, g_tag, tl))
				unlinkat(fd, d->d_name, 0);
			at += d->d_reclen;
		}
	if (fd >= 0)
		close(fd);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void clean_on_signals(const char *out)
{
	struct sigaction sa = { .sa_handler = on_signal };

	snprintf(g_out, sizeof(g_out), "%s", out);
	snprintf(g_tag, sizeof(g_tag), KVMEM_TMP_TAG "%d", (int)getpid());
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

int cmd_generate(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "preset", required_argument, NULL, 'p' }, { "out", required_argument, NULL, 'o' },
		{ "seed", required_argument, NULL, 's' },   { "dry-run", no_argument, NULL, 'n' },
		{ "force", no_argument, NULL, 'f' },	    { "dtype", required_argument, NULL, 't' },
		{ "shard-size", required_argument, NULL, 'm' }, { "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *preset = NULL, *out = NULL, *who = "kvmem generate";
	bool dry = false, force = false;
	kvmem_gen_opts o = { 0 };
	struct shown shown = { .last = -1, .tty = isatty(2) };
	const kvmem_preset *p;
	uint64_t bytes;
	char a[32], b[32];
	int c, ne;

	cli_getopt_reset();
	while ((c = cli_getopt(who, argc, argv, opts)) != -1) {
		switch (c) {
		case 'p': preset = optarg; break;
		case 'o': out = optarg; break;
		case 'n': dry = true; break;
		case 'f': force = true; break;
		case 't': o.dtype = optarg; break;
		case 's':
			if (cli_parse_u64(who, cli_optname, optarg, &o.seed))
				return EXIT_USAGE;
			break;
		case 'm':
			if (cli_parse_size(who, cli_optname, optarg, 1 << 20, 1ull << 40, &o.shard_bytes))
				return EXIT_USAGE;
			break;
		case 'h': usage(stdout); return 0;
		default: return EXIT_USAGE;
		}
	}
	if (cli_no_operands(who, argc, argv))
		return EXIT_USAGE;
	if (!preset) {
		fprintf(stderr, "%s: --preset NAME is required (%s --help)\n", who, who);
		return EXIT_USAGE;
	}
	p = kvmem_preset_find(preset);
	if (!p) {
		fprintf(stderr, "%s: unknown preset '%s' (presets:", who, preset);
		for (const kvmem_preset *q = kvmem_presets; q->name; q++)
			fprintf(stderr, " %s", q->name);
		fprintf(stderr, ")\n");
		return EXIT_USAGE;
	}
	bytes = kvmem_model_generate_bytes(&p->cfg, &o);
	if (!bytes) {
		fprintf(stderr, "%s: %s\n", who, kvmem_last_error());
		return EXIT_USAGE;
	}
	if (dry) {
		print_geometry(p, &o, bytes);
		printf("(dry run: nothing written)\n");
		return 0;
	}
	if (!out) {
		fprintf(stderr, "%s: --out DIR is required (or --dry-run)\n", who);
		return EXIT_USAGE;
	}
	/* What a killed run left is ours to remove before anything else: it
	 * must not make the directory look taken, nor fill the disk. */
	if (kvmem_model_remove_stale_tmp(out) < 0) {
		fprintf(stderr, "%s: %s\n", who, kvmem_last_error());
		return 1;
	}
	ne = dir_nonempty(out);
	if (ne < 0) {
		fprintf(stderr, "%s: %s: %s\n", who, out, strerror(errno));
		return 1;
	}
	if (ne && !force) {
		fprintf(stderr, "%s: %s is not empty; use --force to write the model into it anyway\n",
			who, out);
		return 1;
	}
	if (bytes >= PROGRESS_FROM) {
		o.progress = show_progress;
		o.arg = &shown;
		fprintf(stderr, "generating preset %s (%s) into %s\n", p->name,
			cli_fmt_bytes(a, sizeof(a), (double)bytes), out);
	}
	clean_on_signals(out);
	if (kvmem_model_generate_opts(&p->cfg, out, &o)) {
		if (shown.tty && shown.last >= 0 && shown.last < 100)
			fputc('\n', stderr);
		fprintf(stderr, "%s: %s\n", who, kvmem_last_error());
		return 1;
	}
	printf("wrote %s: preset %s, seed %llu, %s parameters, %s\n", out, p->name,
	       (unsigned long long)o.seed,
	       cli_fmt_sci(a, sizeof(a), (double)kvmem_config_params(&p->cfg)),
	       cli_fmt_bytes(b, sizeof(b), (double)bytes));
	return 0;
}
