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

#include "agentlang/agentlang.h"
#include "kvmem/kvmem.h"
#include "cli_util.h"
#include "cmd.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem synth <what> [options]\n\n"
		"  corpus   training sequences for tools/train/train.py\n"
		"  sample   a workspace (or a training sequence) as readable text\n"
		"  vocab    the vocabulary: id, piece, glue, roles\n\n"
		"kvmem synth <what> --help for the options. Documentation/agentlang.md\n"
		"describes the language.\n\n"
		"examples:\n"
		"  kvmem synth sample --seed 3 --tokens 1024 --questions 2\n"
		"  kvmem synth corpus --tokens 4M --seq-len 512 --seed 1 --out /tmp/t.bin\n"
		"  kvmem synth vocab | head\n");
}

#define WHO_CORPUS "kvmem synth corpus"
#define WHO_SAMPLE "kvmem synth sample"

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
		"                          [--views F] [--view-policy P] [--max-ratio R]\n"
		"                          [--stale P] [--drop P] [--paged P] [--page-window W]\n"
		"                          [--paged-whole P] [--whole-min-ratio R]\n"
		"                          [--lookalikes K] [--threads T] [--u32] [--quiet]\n\n"
		"Writes ceil(N / L) training sequences of exactly L tokens (padded with\n"
		"<pad>), each with questions whose answers lie inside it. A share F of them\n"
		"(default 0.5) are view sequences: a workspace 1..16x L long cut the way\n"
		"kvmem's view cuts it: by the generator's own mix, or, with --view-policy,\n"
		"by a selection policy that reads token ids only (lexical), exactly as\n"
		"kvmem_session_select_ahead plans it for each question. Ids are uint16\n"
		"(--u32 for uint32) after a 160-byte header (user/agentlang/agentlang.h).\n"
		"The file does not depend on the thread count. Seeds: training uses seeds\n"
		"below 1e6, evaluation (kvmem bench recall) 1e9 and up.\n\n"
		"options:\n"
		"  --tokens N     tokens to write (k, M, G: powers of 1000, 300M = 3e8)\n"
		"  --seq-len L    tokens per sequence, 256..1048576 (default 2048)\n"
		"  --seed S       corpus seed (default 1)\n"
		"  --out FILE     where to write\n"
		"  --views F      share of view sequences, 0..1 (default 0.5)\n"
		"  --view-policy P  the policy that chooses each view (lexical; default:\n"
		"                 the generator's own mix)\n"
		"  --max-ratio R  largest workspace of a view, in windows: 16, 32 or 64\n"
		"  --stale P      chance a needle has an older value earlier (default 0.3)\n"
		"  --drop P       with --view-policy: chance a needle line cut by a block\n"
		"                 boundary keeps only its value's block (default 0)\n"
		"  --paged P      with --view-policy: chance a view sequence of a workspace\n"
		"                 longer than L is paged: the file then also holds, after\n"
		"                 the ids, windows of workspace tokens that end at its kept\n"
		"                 blocks, from which train.py computes the view's K/V as\n"
		"                 kvmem does (default 0; version 3 of the format)\n"
		"  --page-window W  tokens of a page window, even, 64..32768 (default L)\n"
		"  --paged-whole P  chance a paged sequence of a workspace of at least R\n"
		"                 windows is whole: its page windows tile the whole\n"
		"                 workspace (every block computed with W/2 tokens of\n"
		"                 context), for train.py's Mean-K loss over all its\n"
		"                 blocks; W divisible by 64 (default 0; version 4)\n"
		"  --whole-min-ratio R  16, 32 or 64 (default 16)\n"
		"  --lookalikes K  look-alike lines for every needle of a view sequence,\n"
		"                 1..16 (default: drawn a sequence, 0-6, or 0-8 with a\n"
		"                 policy); a held-out corpus at kvmem bench recall's count\n"
		"                 (8 in issue #29's targets) takes 8\n"
		"  --threads T    writer threads, 1..1024 (default: all cores)\n"
		"  --u32          uint32 ids instead of uint16\n"
		"  --quiet        no progress on stderr\n"
		"  --help         this text\n\n"
		"examples:\n"
		"  kvmem synth corpus --tokens 300M --seq-len 2048 --seed 1 --out train.bin\n"
		"  kvmem synth corpus --tokens 64k --seq-len 512 --seed 999001 --views 0 --out e.bin\n"
		"  kvmem synth corpus --tokens 300M --seed 1 --view-policy lexical --max-ratio 64 \\\n"
		"      --drop 0.1 --out train.bin\n"
		"  kvmem synth corpus --tokens 4M --seed 1000000001 --view-policy lexical \\\n"
		"      --max-ratio 64 --views 1 --lookalikes 8 --out heldout.bin\n");
}

static int synth_corpus(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "tokens", required_argument, NULL, 'n' }, { "seq-len", required_argument, NULL, 'l' },
		{ "seed", required_argument, NULL, 's' },   { "out", required_argument, NULL, 'o' },
		{ "views", required_argument, NULL, 'v' },  { "threads", required_argument, NULL, 't' },
		{ "u32", no_argument, NULL, 'u' },	    { "quiet", no_argument, NULL, 'q' },
		{ "view-policy", required_argument, NULL, 'p' },
		{ "max-ratio", required_argument, NULL, 'r' }, { "stale", required_argument, NULL, 'S' },
		{ "drop", required_argument, NULL, 'd' },
		{ "paged", required_argument, NULL, 'P' },
		{ "page-window", required_argument, NULL, 'W' },
		{ "paged-whole", required_argument, NULL, 'H' },
		{ "whole-min-ratio", required_argument, NULL, 'R' },
		{ "lookalikes", required_argument, NULL, 'a' },
		{ "help", no_argument, NULL, 'h' },	    { 0 },
	};
	agentlang_corpus_opts o = { .seed = 1, .seq_len = 2048, .view_share = 0.5, .id_bytes = 2 };
	const char *out = NULL;
	int quiet = 0, have_tokens = 0, c;
	struct progress pr;
	int64_t n;

	cli_getopt_reset();
	while ((c = cli_getopt(WHO_CORPUS, argc, argv, opts)) != -1) {
		const char *w = WHO_CORPUS, *name = cli_optname;
		int bad = 0;

		switch (c) {
		case 'h': corpus_usage(stdout); return 0;
		case 'u': o.id_bytes = 4; break;
		case 'q': quiet = 1; break;
		case 'o': out = optarg; break;
		case 'n':
			bad = cli_parse_count(w, name, optarg, 1, INT64_MAX / 4, &n);
			o.n_tokens = n;
			have_tokens = 1;
			break;
		case 'l':
			bad = cli_parse_int(w, name, optarg, 256, 1 << 20, &o.seq_len);
			break;
		case 's': bad = cli_parse_u64(w, name, optarg, &o.seed); break;
		case 'v': bad = cli_parse_double(w, name, optarg, 0, 1, &o.view_share); break;
		case 't': bad = cli_parse_int(w, name, optarg, 1, 1024, &o.threads); break;
		case 'p': o.view.policy = optarg; break;
		case 'r':
			bad = cli_parse_int(w, name, optarg, 16, 64, &o.view.max_ratio);
			if (!bad && o.view.max_ratio != 16 && o.view.max_ratio != 32 &&
			    o.view.max_ratio != 64) {
				fprintf(stderr, "%s: --max-ratio %d: 16, 32 or 64\n", w, o.view.max_ratio);
				bad = 1;
			}
			break;
		case 'S': bad = cli_parse_double(w, name, optarg, 0, 1, &o.view.stale); break;
		case 'd': bad = cli_parse_double(w, name, optarg, 0, 1, &o.view.drop); break;
		case 'P': bad = cli_parse_double(w, name, optarg, 0, 1, &o.view.paged); break;
		case 'H': bad = cli_parse_double(w, name, optarg, 0, 1, &o.view.whole); break;
		case 'a': bad = cli_parse_int(w, name, optarg, 1, 16, &o.view.lookalikes); break;
		case 'R':
			bad = cli_parse_int(w, name, optarg, 16, 64, &o.view.whole_min_ratio);
			if (!bad && o.view.whole_min_ratio != 16 && o.view.whole_min_ratio != 32 &&
			    o.view.whole_min_ratio != 64) {
				fprintf(stderr, "%s: --whole-min-ratio %d: 16, 32 or 64\n", w,
					o.view.whole_min_ratio);
				bad = 1;
			}
			break;
		case 'W':
			bad = cli_parse_int(w, name, optarg, 64, 32768, &o.view.window);
			if (!bad && o.view.window % 2) {
				fprintf(stderr, "%s: --page-window %d: an even count\n", w, o.view.window);
				bad = 1;
			}
			break;
		default: return EXIT_USAGE;
		}
		if (bad)
			return EXIT_USAGE;
	}
	if (cli_no_operands(WHO_CORPUS, argc, argv))
		return EXIT_USAGE;
	if (o.view.drop > 0 && !o.view.policy) {
		fprintf(stderr, "%s: --drop needs --view-policy\n", WHO_CORPUS);
		return EXIT_USAGE;
	}
	if (o.view.paged > 0 && (!o.view.policy || o.id_bytes != 2)) {
		fprintf(stderr, "%s: --paged needs --view-policy and 2-byte ids\n", WHO_CORPUS);
		return EXIT_USAGE;
	}
	if (o.view.whole > 0 && !(o.view.paged > 0)) {
		fprintf(stderr, "%s: --paged-whole needs --paged\n", WHO_CORPUS);
		return EXIT_USAGE;
	}
	if (o.view.whole > 0 && (o.view.window ? o.view.window : o.seq_len) % 64) {
		fprintf(stderr, "%s: --paged-whole needs a page window divisible by 64, not %d\n",
			WHO_CORPUS, o.view.window ? o.view.window : o.seq_len);
		return EXIT_USAGE;
	}
	if (!out || !have_tokens) {
		fprintf(stderr, "%s: --tokens N and --out FILE are required (%s --help)\n", WHO_CORPUS,
			WHO_CORPUS);
		return EXIT_USAGE;
	}
	clock_gettime(CLOCK_MONOTONIC, &pr.t0);
	pr.last = -1;
	if (!quiet) {
		o.progress = show_progress;
		o.arg = &pr;
	}
	if (agentlang_corpus_write(out, &o)) {
		fprintf(stderr, "kvmem synth corpus: %s\n", kvmem_last_error());
		return 1;
	}
	uint64_t n_seqs = ((uint64_t)o.n_tokens + (uint64_t)o.seq_len - 1) / (uint64_t)o.seq_len;
	char look[16] = "drawn";

	if (o.view.lookalikes)
		snprintf(look, sizeof(look), "%d", o.view.lookalikes);
	fprintf(stderr, "kvmem synth corpus: wrote %s: %llu sequences of %d tokens, seed %llu, "
		"views %.2f (by %s, up to %dx, paged %.2f, whole %.2f, look-alikes %s), vocab %d "
		"(hash %08x), %.1f s\n", out,
		(unsigned long long)n_seqs, o.seq_len, (unsigned long long)o.seed, o.view_share,
		o.view.policy ? o.view.policy : "the generator's mix",
		o.view.max_ratio ? o.view.max_ratio : 16, o.view.paged, o.view.whole,
		look, agentlang_vocab_size(), agentlang_vocab_hash(), since(&pr.t0));
	return 0;
}

/* ---- sample -------------------------------------------------------------- */
static void sample_usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem synth sample [--seed S] [--tokens N] [--questions M]\n"
		"                          [--depth D] [--lookalikes K] [--stale P]\n"
		"                          [--kind workspace|stream|view] [--seq-len L] [--ids]\n"
		"                          [--view-policy P]\n\n"
		"workspace (default): a workspace of N tokens (default 1024) with M needles\n"
		"(default 3) at depth D (default: spread evenly), then each question, its\n"
		"expected answer and where its needle lies. stream / view: training\n"
		"sequence number S of the corpus with seed 1, L tokens (default 1024).\n\n"
		"options:\n"
		"  --seed S          workspace seed, or the training sequence's number\n"
		"  --tokens N        workspace size, at least 256 (k, M, G: powers of 1000)\n"
		"  --questions M     needles and questions, 0..100000\n"
		"  --depth D         where the needles lie, 0 (oldest) .. 1\n"
		"  --lookalikes K    look-alike lines per needle, 0..16\n"
		"  --stale P         share of needles with a stale earlier value, 0..1\n"
		"  --kind K          workspace (default), stream or view\n"
		"  --seq-len L       training sequence length, 256..1048576\n"
		"  --view-policy P   --kind view: the view a policy chose (lexical)\n"
		"  --ids             print the ids after the text\n"
		"  --help            this text\n\n"
		"examples:\n"
		"  kvmem synth sample --seed 3 --tokens 1024 --questions 2\n"
		"  kvmem synth sample --kind view --seed 17 --seq-len 2048 --ids\n");
}

static int print_ids(const int32_t *ids, int64_t n)
{
	char *buf;
	long len = agentlang_decode(ids, (size_t)n, NULL, 0);

	if (len < 0 || !(buf = malloc((size_t)len + 1))) {
		fprintf(stderr, "kvmem synth sample: %s\n", len < 0 ? kvmem_last_error() : "out of memory");
		return -1;
	}
	agentlang_decode(ids, (size_t)n, buf, (size_t)len + 1);
	fputs(buf, stdout);
	free(buf);
	return 0;
}

static void print_id_list(const int32_t *ids, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		printf("%d%c", ids[i], i + 1 == n || i % 16 == 15 ? '\n' : ' ');
}

static int sample_workspace(const agentlang_params *p, int with_ids)
{
	agentlang_transcript ws;

	if (agentlang_transcript_build(p, &ws)) {
		fprintf(stderr, "kvmem synth sample: %s\n", kvmem_last_error());
		return 1;
	}
	int rc = print_ids(ws.ids, ws.n_ids);
	printf("---- %lld tokens, %d questions\n", (long long)ws.n_ids, ws.n_q);
	for (int i = 0; !rc && i < ws.n_q; i++) {
		const agentlang_question *q = &ws.q[i];

		rc = print_ids(q->ids, q->n_ids);
		printf(" ");
		rc = rc ? rc : print_ids(q->answer, q->n_answer);
		printf("    [needle at %lld, depth %.3f (asked %.3f), %d look-alikes, stale %s]\n",
		       (long long)q->needle_pos, q->depth, q->depth_asked, q->lookalikes,
		       q->stale_pos >= 0 ? "yes" : "no");
	}
	if (with_ids && !rc)
		print_id_list(ws.ids, ws.n_ids);
	agentlang_transcript_free(&ws);
	return rc ? 1 : 0;
}

static int sample_train(uint64_t index, int seq_len, double views,
			const agentlang_view_opts *vo, int with_ids)
{
	int32_t *ids = malloc((size_t)seq_len * sizeof(*ids));
	agentlang_seq_info info;
	int rc = 1;

	if (!ids)
		return 1;
	if (agentlang_train_seq_opts(1, index, seq_len, views, vo, ids, &info)) {
		fprintf(stderr, "kvmem synth sample: %s\n", kvmem_last_error());
	} else if (!print_ids(ids, info.n_tokens)) {
		printf("---- %s sequence: %d tokens + %d padding, %d questions\n",
		       info.kind == AGENTLANG_SEQ_VIEW ? "view" : "stream", info.n_tokens,
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
	static const struct option opts[] = {
		{ "kind", required_argument, NULL, 'k' },	{ "seed", required_argument, NULL, 's' },
		{ "tokens", required_argument, NULL, 'n' },	{ "seq-len", required_argument, NULL, 'l' },
		{ "questions", required_argument, NULL, 'q' }, { "lookalikes", required_argument, NULL, 'a' },
		{ "depth", required_argument, NULL, 'd' },	{ "stale", required_argument, NULL, 't' },
		{ "ids", no_argument, NULL, 'i' },		{ "help", no_argument, NULL, 'h' },
		{ "view-policy", required_argument, NULL, 'p' },
		{ 0 },
	};
	agentlang_view_opts vo = { 0 };
	agentlang_params p;
	double depth = -1;
	int with_ids = 0, seq_len = 1024, c;
	const char *kind = "workspace";

	agentlang_params_default(&p);
	p.n_tokens = 1024;
	p.n_questions = 3;
	cli_getopt_reset();
	while ((c = cli_getopt(WHO_SAMPLE, argc, argv, opts)) != -1) {
		const char *w = WHO_SAMPLE, *name = cli_optname;
		int bad = 0;

		switch (c) {
		case 'h': sample_usage(stdout); return 0;
		case 'i': with_ids = 1; break;
		case 'k':
			if (strcmp(optarg, "workspace") && strcmp(optarg, "stream") && strcmp(optarg, "view")) {
				fprintf(stderr, "%s: --kind wants workspace, stream or view, not '%s'\n", w,
					optarg);
				return EXIT_USAGE;
			}
			kind = optarg;
			break;
		case 's': bad = cli_parse_u64(w, name, optarg, &p.seed); break;
		case 'n': bad = cli_parse_count(w, name, optarg, 256, INT64_MAX / 4, &p.n_tokens); break;
		case 'l': bad = cli_parse_int(w, name, optarg, 256, 1 << 20, &seq_len); break;
		case 'q': bad = cli_parse_int(w, name, optarg, 0, 100000, &p.n_questions); break;
		case 'a': bad = cli_parse_int(w, name, optarg, 0, 16, &p.lookalikes); break;
		case 'd': bad = cli_parse_double(w, name, optarg, 0, 1, &depth); break;
		case 't': bad = cli_parse_double(w, name, optarg, 0, 1, &p.stale); break;
		case 'p': vo.policy = optarg; break;
		default: return EXIT_USAGE;
		}
		if (bad)
			return EXIT_USAGE;
	}
	if (cli_no_operands(WHO_SAMPLE, argc, argv))
		return EXIT_USAGE;
	if (!strcmp(kind, "stream"))
		return sample_train(p.seed, seq_len, 0.0, NULL, with_ids);
	if (!strcmp(kind, "view"))
		return sample_train(p.seed, seq_len, 1.0, &vo, with_ids);
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

	static const struct option opts[] = { { "help", no_argument, NULL, 'h' }, { 0 } };
	int c;

	cli_getopt_reset();
	while ((c = cli_getopt("kvmem synth vocab", argc, argv, opts)) != -1) {
		if (c != 'h')
			return EXIT_USAGE;
		printf("usage: kvmem synth vocab\n\n"
		       "Prints every token: id, piece (\\n for newline), glue (1: joins the\n"
		       "previous piece with no space) and roles. The vocabulary is built in C\n"
		       "(user/agentlang/vocab.c); its hash names this exact version.\n\n"
		       "examples:\n"
		       "  kvmem synth vocab > vocab.tsv\n");
		return 0;
	}
	if (cli_no_operands("kvmem synth vocab", argc, argv))
		return EXIT_USAGE;
	printf("# agentlang vocabulary: %d tokens, hash %08x\n# id\tpiece\tglue\troles\n",
	       agentlang_vocab_size(), agentlang_vocab_hash());
	for (int id = 0; id < agentlang_vocab_size(); id++) {
		unsigned roles = agentlang_roles(id);
		const char *p = agentlang_piece(id);
		int first = 1;

		printf("%d\t%s\t%d\t", id, id == AGENTLANG_NL ? "\\n" : p, agentlang_is_glue(id));
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
