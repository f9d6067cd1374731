// SPDX-License-Identifier: MIT
/*
 * kvmem synth: the synthetic agent-workspace language (include/kvmem/
 * agentlang.h). corpus writes training data for tools/train/train.py,
 * sample prints text for a person, vocab prints the vocabulary.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvmem/agentlang.h"
#include "kvmem/kvmem.h"
#include "cmd.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem synth <what> [options]\n\n"
		"  corpus   training sequences for tools/train/train.py\n"
		"  sample   a workspace (or a training sequence) as readable text\n"
		"  vocab    the vocabulary: id, piece, glue, roles\n\n"
		"kvmem synth <what> --help for the options. Documentation/agentlang.md\n"
		"describes the language.\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoull(s, &end, 0);
	return errno || end == s || *end || *s == '-' ? -1 : 0;
}

/* "400M", "2k", "1G", "4096" */
static int parse_count(const char *s, int64_t *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return -1;
	switch (*end) {
	case 'k': case 'K': v *= 1e3; end++; break;
	case 'm': case 'M': v *= 1e6; end++; break;
	case 'g': case 'G': v *= 1e9; end++; break;
	}
	if (*end || v > 9e18)
		return -1;
	*out = (int64_t)v;
	return 0;
}

static int parse_double(const char *s, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(s, &end);
	return errno || end == s || *end ? -1 : 0;
}

/* The value after an option, or NULL with a message. */
static const char *optval(int argc, char **argv, int *i)
{
	if (*i + 1 >= argc) {
		fprintf(stderr, "kvmem synth: %s needs a value\n", argv[*i]);
		return NULL;
	}
	return argv[++*i];
}

static int bad(const char *opt, const char *v)
{
	fprintf(stderr, "kvmem synth: bad value '%s' for %s\n", v, opt);
	return EXIT_USAGE;
}

/* ---- corpus -------------------------------------------------------------- */
struct progress {
	struct timespec t0;
	double last;
};

static double since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

static void show_progress(int64_t done, int64_t total, void *arg)
{
	struct progress *p = arg;
	double s = since(&p->t0);

	if (done < total && s - p->last < 1.0)
		return;
	p->last = s;
	fprintf(stderr, "\rkvmem synth corpus: %.1fM / %.1fM tokens, %.1fM tok/s   ",
		(double)done / 1e6, (double)total / 1e6, (double)done / 1e6 / (s > 0 ? s : 1e-9));
	if (done >= total)
		fprintf(stderr, "\n");
}

static void corpus_usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem synth corpus --tokens N --seq-len L --seed S --out FILE\n"
		"                          [--views F] [--threads T] [--u32] [--quiet]\n\n"
		"Writes ceil(N / L) training sequences of exactly L tokens (padded with\n"
		"<pad>), each with questions whose answers lie inside it. A share F of them\n"
		"(default 0.5) are view sequences: a workspace 1..16x L long cut the way\n"
		"kvmem's view cuts it. N takes k/M/G suffixes. Ids are uint16 (--u32 for\n"
		"uint32) after a 64-byte header (include/kvmem/agentlang.h). The file does\n"
		"not depend on the thread count. Seeds: training uses seeds below 1e6,\n"
		"evaluation (kvmem bench recall) 1e9 and up.\n");
}

static int synth_corpus(int argc, char **argv)
{
	kvmem_lang_corpus_opts o = { .seed = 1, .seq_len = 2048, .view_share = 0.5, .id_bytes = 2 };
	const char *out = NULL, *v;
	int quiet = 0, have_tokens = 0;
	struct progress pr;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int64_t n;
		double d;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			corpus_usage(stdout);
			return 0;
		} else if (!strcmp(a, "--u32")) {
			o.id_bytes = 4;
		} else if (!strcmp(a, "--quiet")) {
			quiet = 1;
		} else if (!strcmp(a, "--tokens")) {
			if (!(v = optval(argc, argv, &i)))
				return EXIT_USAGE;
			if (parse_count(v, &n) || n <= 0)
				return bad(a, v);
			o.n_tokens = n;
			have_tokens = 1;
		} else if (!strcmp(a, "--seq-len")) {
			if (!(v = optval(argc, argv, &i)))
				return EXIT_USAGE;
			if (parse_count(v, &n) || n < 256 || n > (1 << 20))
				return bad(a, v);
			o.seq_len = (int)n;
		} else if (!strcmp(a, "--seed")) {
			if (!(v = optval(argc, argv, &i)))
				return EXIT_USAGE;
			if (parse_u64(v, &o.seed))
				return bad(a, v);
		} else if (!strcmp(a, "--views")) {
			if (!(v = optval(argc, argv, &i)))
				return EXIT_USAGE;
			if (parse_double(v, &d) || d < 0 || d > 1)
				return bad(a, v);
			o.view_share = d;
		} else if (!strcmp(a, "--threads")) {
			if (!(v = optval(argc, argv, &i)))
				return EXIT_USAGE;
			if (parse_count(v, &n) || n < 1 || n > 1024)
				return bad(a, v);
			o.threads = (int)n;
		} else if (!strcmp(a, "--out") || !strcmp(a, "-o")) {
			if (!(out = optval(argc, argv, &i)))
				return EXIT_USAGE;
		} else {
			fprintf(stderr, "kvmem synth corpus: unknown option '%s'\n", a);
			corpus_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (!out || !have_tokens) {
		fprintf(stderr, "kvmem synth corpus: --tokens and --out are required\n");
		corpus_usage(stderr);
		return EXIT_USAGE;
	}
	clock_gettime(CLOCK_MONOTONIC, &pr.t0);
	pr.last = -1;
	if (!quiet) {
		o.progress = show_progress;
		o.arg = &pr;
	}
	if (kvmem_lang_corpus_write(out, &o)) {
		fprintf(stderr, "kvmem synth corpus: %s\n", kvmem_last_error());
		return 1;
	}
	uint64_t n_seqs = ((uint64_t)o.n_tokens + (uint64_t)o.seq_len - 1) / (uint64_t)o.seq_len;
	fprintf(stderr, "kvmem synth corpus: wrote %s: %llu sequences of %d tokens, seed %llu, "
		"views %.2f, vocab %d (hash %08x), %.1f s\n", out, (unsigned long long)n_seqs,
		o.seq_len, (unsigned long long)o.seed, o.view_share, kvmem_lang_vocab_size(),
		kvmem_lang_vocab_hash(), since(&pr.t0));
	return 0;
}

/* ---- sample -------------------------------------------------------------- */
static void sample_usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem synth sample [--seed S] [--tokens N] [--questions M]\n"
		"                          [--depth D] [--lookalikes K] [--stale P]\n"
		"                          [--kind workspace|stream|view] [--seq-len L] [--ids]\n\n"
		"workspace (default): a workspace of N tokens (default 1024) with M needles\n"
		"(default 3) at depth D (default: spread evenly), then each question, its\n"
		"expected answer and where its needle lies. stream / view: training\n"
		"sequence number S of the corpus with seed 1, L tokens (default 1024).\n"
		"--ids prints the ids after the text.\n");
}

static int print_ids(const int32_t *ids, int64_t n)
{
	char *buf;
	long len = kvmem_lang_decode(ids, (size_t)n, NULL, 0);

	if (len < 0 || !(buf = malloc((size_t)len + 1))) {
		fprintf(stderr, "kvmem synth sample: %s\n", len < 0 ? kvmem_last_error() : "out of memory");
		return -1;
	}
	kvmem_lang_decode(ids, (size_t)n, buf, (size_t)len + 1);
	fputs(buf, stdout);
	free(buf);
	return 0;
}

static void print_id_list(const int32_t *ids, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		printf("%d%c", ids[i], i + 1 == n || i % 16 == 15 ? '\n' : ' ');
}

static int sample_workspace(const kvmem_lang_params *p, int with_ids)
{
	kvmem_lang_workspace ws;

	if (kvmem_lang_workspace_build(p, &ws)) {
		fprintf(stderr, "kvmem synth sample: %s\n", kvmem_last_error());
		return 1;
	}
	int rc = print_ids(ws.ids, ws.n_ids);
	printf("---- %lld tokens, %d questions\n", (long long)ws.n_ids, ws.n_q);
	for (int i = 0; !rc && i < ws.n_q; i++) {
		const kvmem_lang_question *q = &ws.q[i];

		rc = print_ids(q->ids, q->n_ids);
		printf(" ");
		rc = rc ? rc : print_ids(q->answer, q->n_answer);
		printf("    [needle at %lld, depth %.3f (asked %.3f), %d look-alikes, stale %s]\n",
		       (long long)q->needle_pos, q->depth, q->depth_asked, q->lookalikes,
		       q->stale_pos >= 0 ? "yes" : "no");
	}
	if (with_ids && !rc)
		print_id_list(ws.ids, ws.n_ids);
	kvmem_lang_workspace_free(&ws);
	return rc ? 1 : 0;
}

static int sample_train(uint64_t index, int seq_len, double views, int with_ids)
{
	int32_t *ids = malloc((size_t)seq_len * sizeof(*ids));
	kvmem_lang_seq_info info;
	int rc = 1;

	if (!ids)
		return 1;
	if (kvmem_lang_train_seq(1, index, seq_len, views, ids, &info)) {
		fprintf(stderr, "kvmem synth sample: %s\n", kvmem_last_error());
	} else if (!print_ids(ids, info.n_tokens)) {
		printf("---- %s sequence: %d tokens + %d padding, %d questions\n",
		       info.kind == KVMEM_LANG_SEQ_VIEW ? "view" : "stream", info.n_tokens,
		       seq_len - info.n_tokens, info.n_questions);
		if (with_ids)
			print_id_list(ids, seq_len);
		rc = 0;
	}
	free(ids);
	return rc;
}

static int synth_sample(int argc, char **argv)
{
	kvmem_lang_params p;
	double depth = -1;
	int with_ids = 0, seq_len = 1024;
	const char *kind = "workspace", *v;

	kvmem_lang_params_default(&p);
	p.n_tokens = 1024;
	p.n_questions = 3;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int64_t n;
		double d;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			sample_usage(stdout);
			return 0;
		} else if (!strcmp(a, "--ids")) {
			with_ids = 1;
			continue;
		}
		if (!(v = optval(argc, argv, &i)))
			return EXIT_USAGE;
		if (!strcmp(a, "--kind")) {
			if (strcmp(v, "workspace") && strcmp(v, "stream") && strcmp(v, "view"))
				return bad(a, v);
			kind = v;
		} else if (!strcmp(a, "--seed")) {
			if (parse_u64(v, &p.seed))
				return bad(a, v);
		} else if (!strcmp(a, "--tokens")) {
			if (parse_count(v, &n) || n < 256)
				return bad(a, v);
			p.n_tokens = n;
		} else if (!strcmp(a, "--seq-len")) {
			if (parse_count(v, &n) || n < 256 || n > (1 << 20))
				return bad(a, v);
			seq_len = (int)n;
		} else if (!strcmp(a, "--questions")) {
			if (parse_count(v, &n) || n > 100000)
				return bad(a, v);
			p.n_questions = (int)n;
		} else if (!strcmp(a, "--lookalikes")) {
			if (parse_count(v, &n) || n > 16)
				return bad(a, v);
			p.lookalikes = (int)n;
		} else if (!strcmp(a, "--depth")) {
			if (parse_double(v, &d) || d < 0 || d > 1)
				return bad(a, v);
			depth = d;
		} else if (!strcmp(a, "--stale")) {
			if (parse_double(v, &d) || d < 0 || d > 1)
				return bad(a, v);
			p.stale = d;
		} else {
			fprintf(stderr, "kvmem synth sample: unknown option '%s'\n", a);
			sample_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (!strcmp(kind, "stream"))
		return sample_train(p.seed, seq_len, 0.0, with_ids);
	if (!strcmp(kind, "view"))
		return sample_train(p.seed, seq_len, 1.0, with_ids);
	double *depths = NULL;
	if (depth >= 0 && p.n_questions > 0) {
		if (!(depths = malloc((size_t)p.n_questions * sizeof(*depths))))
			return 1;
		for (int i = 0; i < p.n_questions; i++)
			depths[i] = depth;
		p.depths = depths;
	}
	int rc = sample_workspace(&p, with_ids);
	free(depths);
	return rc;
}

/* ---- vocab --------------------------------------------------------------- */
static int synth_vocab(int argc, char **argv)
{
	static const char *const role_names[] = {
		"special", "struct", "command", "stem", "variant", "ext", "keypart", "keyname",
		"value", "word", "unused",
	};

	if (argc > 1) {
		FILE *f = strcmp(argv[1], "--help") && strcmp(argv[1], "-h") ? stderr : stdout;

		fprintf(f, "usage: kvmem synth vocab\n\n"
			   "Prints every token: id, piece (\\n for newline), glue (1: joins the\n"
			   "previous piece with no space) and roles. The vocabulary is built in C\n"
			   "(user/agentlang/vocab.c); its hash names this exact version.\n");
		return f == stdout ? 0 : EXIT_USAGE;
	}
	printf("# agentlang vocabulary: %d tokens, hash %08x\n# id\tpiece\tglue\troles\n",
	       kvmem_lang_vocab_size(), kvmem_lang_vocab_hash());
	for (int id = 0; id < kvmem_lang_vocab_size(); id++) {
		unsigned roles = kvmem_lang_roles(id);
		const char *p = kvmem_lang_piece(id);
		int first = 1;

		printf("%d\t%s\t%d\t", id, id == KVMEM_LANG_NL ? "\\n" : p, kvmem_lang_is_glue(id));
		for (int b = 0; b < (int)(sizeof(role_names) / sizeof(role_names[0])); b++)
			if (roles & (1u << b)) {
				printf("%s%s", first ? "" : ",", role_names[b]);
				first = 0;
			}
		printf("\n");
	}
	return 0;
}

int cmd_synth(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "corpus"))
		return synth_corpus(argc - 1, argv + 1);
	if (!strcmp(argv[1], "sample"))
		return synth_sample(argc - 1, argv + 1);
	if (!strcmp(argv[1], "vocab"))
		return synth_vocab(argc - 1, argv + 1);
	fprintf(stderr, "kvmem synth: unknown '%s'\n\n", argv[1]);
	usage(stderr);
	return EXIT_USAGE;
}
