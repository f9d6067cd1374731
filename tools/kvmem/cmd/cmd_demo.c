// SPDX-License-Identifier: MIT
/*
 * kvmem demo: the main job, on an embedded default.
 *
 * The shipped agentlang model (models/agentlang, built into this binary) has
 * a native window of 2048 tokens. The demo plays an agent that works through
 * a workspace many windows long (tool calls and their outputs, with config
 * facts among look-alikes), in several steps, keeping a view a small fraction
 * of the workspace. Then it asks about facts seen far outside the window:
 * once with Mean-K selection paging the right blocks back into the view, once
 * with a plain sliding window over the same history. It says in words what
 * happened at each step. The default policy is subblock: in kvmem bench
 * recall (Documentation/recall.md) only refine, which also reads K pages to
 * score, does better, and on the demo's default workspace subblock answers
 * 5 of 6 to refine's 4.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "agentlang/agentlang.h"
#include "kvmem/backend.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/lab.h"
#include "kvmem/session.h"
#include "cli_util.h"
#include "cmd.h"
#include "embedded_model.h"

#define DEMO_SEED 1000000007ull	/* >= 1e9: never used in training */

struct demo {
	const char *model_dir, *policy, *backend;
	int64_t tokens, budget;
	int questions, steps, block, chunk, quiet;
	uint64_t seed;
	/* what the selections of one step did */
	int64_t selections, entered, left;
	const char *lab;		/* --lab DIR: record the questions for kvmem lab */
	kvmem_lab_recorder *rec;
	const kvmem_model *m;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem demo [options]\n"
		"\n"
		"An agent session on kvmem's own small model (5.7M parameters, trained here on\n"
		"a synthetic agent-workspace language, native window 2048 tokens). The agent\n"
		"reads a workspace 16 windows long in steps, keeping a view of under 2K tokens;\n"
		"then it is asked about facts from far outside its window, first with kvmem's\n"
		"block selection (--policy, subblock by default), then with a plain sliding\n"
		"window. Runs on the CPU in about a minute, or on a GPU (--backend). At\n"
		"appliance scale, a workspace of N tokens over NVMe: kvmem demo --scale N\n"
		"(kvmem demo --scale 1M --help).\n"
		"\n"
		"The model is built into this binary and written to the data directory\n"
		"($KVMEM_HOME, else $XDG_DATA_HOME/kvmem, else ~/.local/share/kvmem) on first\n"
		"use, under models/agentlang.\n"
		"\n"
		"  --model DIR       use another agentlang model directory\n"
		"  --tokens N        workspace size in tokens (default: 16 x the window)\n"
		"  --budget N        history tokens in the view (default: window - 32 - reserve)\n"
		"  --questions N     questions asked (default 6)\n"
		"  --steps N         agent steps the workspace is read in (default 8)\n"
		"  --policy NAME     selection policy to show (default subblock; refine reads\n"
		"                    K pages too and does better in kvmem bench recall)\n"
		"  --seed S          workspace seed (default %llu; training used seeds < 1e6)\n"
		"  --lab DIR         record the questions for kvmem lab: DIR/demo.trace over\n"
		"                    DIR/demo.ws (Documentation/lab.md)\n"
		"  --backend NAME    compute backend: cpu, cuda, or auto (default: cuda when\n"
		"                    there is a GPU, else cpu)\n"
		"  --quiet           only the summary\n"
		"  --help            this text\n"
		"Counts take k, M, G (powers of 1000: 32k = 32000 tokens).\n"
		"\n"
		"examples:\n"
		"  kvmem demo\n"
		"  kvmem demo --tokens 64k --questions 12 --policy refine\n"
		"  kvmem demo --quiet --seed 1000000123\n"
		"  kvmem demo --backend cuda\n"
		"  kvmem demo --scale 1M\n",
		(unsigned long long)DEMO_SEED);
}

/* ---- the session ------------------------------------------------------- */

static void on_select(void *arg, const kvmem_plan *p, int forced)
{
	struct demo *d = arg;

	d->selections++;
	d->entered += p->entering;
	d->left += p->n_left_total;
}

/* Text of ids[a, e) on one line, newlines shown as " | ", cut to max chars. */
static void show(const int32_t *ids, int64_t a, int64_t e, int max)
{
	char buf[512];
	long n = agentlang_decode(ids + a, (size_t)(e - a), buf, sizeof(buf));

	if (n < 0)
		return;
	for (char *p = buf; *p; p++)
		if (*p == '\n')
			*p = p[1] ? '|' : 0;
	printf("%.*s%s", max, buf, (int)strlen(buf) > max ? "..." : "");
}

static kvmem_session *open_session(struct demo *d, kvmem_backend *e, const char *policy,
				 const kvmem_page_source *src, int query_tokens)
{
	kvmem_session_opts so;

	kvmem_session_opts_default(&so);
	so.block = d->block;
	so.budget = d->budget;
	so.chunk = d->chunk;
	so.policy = policy;
	so.seed = d->seed;
	so.source = src;
	so.query_tokens = query_tokens;
	so.on_select = on_select;
	so.arg = d;
	if (d->rec && kvmem_lab_record_attach(d->rec, &so))
		return NULL;
	return kvmem_session_create(e, &so);
}

/* The agent reads the workspace in d->steps steps, cut at line ends. */
static int read_workspace(struct demo *d, kvmem_backend *e, const agentlang_transcript *ws,
			  const kvmem_page_source *src, int window)
{
	kvmem_session *s = open_session(d, e, "meank", src, 4);
	int64_t at = 0;
	double t0 = cli_now_s();

	if (!s)
		return -1;
	for (int step = 1; step <= d->steps; step++) {
		int64_t end = step == d->steps ? ws->n_ids : ws->n_ids * step / d->steps;

		while (end < ws->n_ids && ws->ids[end - 1] != AGENTLANG_NL)
			end++;
		d->selections = d->entered = d->left = 0;
		if (kvmem_session_append(s, ws->ids + at, end - at, 0)) {
			kvmem_session_free(s);
			return -1;
		}
		if (!d->quiet) {
			const kvmem_plan *p = kvmem_session_plan(s);
			int64_t n = kvmem_session_tokens(s);

			printf("  step %d: +%lld tokens, e.g. \"", step, (long long)(end - at));
			show(ws->ids, at, end, 46);
			printf("\"\n          workspace %lld tokens (%.1f windows); view %lld history "
			       "tokens in %d blocks (%.1f%%); %lld selections moved %lld blocks in, "
			       "%lld out\n",
			       (long long)n, (double)n / window, (long long)p->view_tokens, p->n_view,
			       100.0 * p->view_tokens / n, (long long)d->selections,
			       (long long)d->entered, (long long)d->left);
			fflush(stdout);	/* progress, also when piped */
		}
		at = end;
	}
	if (!d->quiet)
		printf("  read in %.1f s on the CPU\n", cli_now_s() - t0);
	kvmem_session_free(s);
	return 0;
}

/* Ask every question under one policy; returns the number right, or -1. */
static int ask_all(struct demo *d, kvmem_backend *e, const agentlang_transcript *ws,
		   const kvmem_page_source *src, const char *policy, int window)
{
	kvmem_session *s;
	int right = 0;
	char path[4200];

	/* --lab: this policy's questions recorded, needles annotated, and the
	 * history saved beside the trace (the sliding window is not). */
	if (d->lab && strcmp(policy, "recency")) {
		snprintf(path, sizeof(path), "%s/demo.trace", d->lab);
		if ((mkdir(d->lab, 0777) && errno != EEXIST &&
		     kvmem_error(errno, "%s: %s", d->lab, strerror(errno))) ||
		    kvmem_lab_record_open(path, d->m, &(kvmem_lab_record_opts){ .label = "kvmem demo" },
					  &d->rec))
			return -1;
	}
	s = open_session(d, e, policy, src, 1);

	if (!s || kvmem_session_adopt(s, ws->ids, ws->n_ids)) {
		kvmem_session_free(s);
		return -1;
	}
	for (int i = 0; i < ws->n_q; i++) {
		const agentlang_question *q = &ws->q[i];
		int32_t gen[AGENTLANG_MAX_ANSWER], nl = AGENTLANG_NL;
		int n = 0, held, ok;
		int64_t back = ws->n_ids - q->needle_pos;

		/* A step boundary for the question: the query of its answer
		 * marker (the token that retrieves) chooses the blocks, then the
		 * question runs over the new view and the answer follows. */
		if (d->rec && (kvmem_lab_record_span(d->rec, KVMEM_LAB_SPAN_NEEDLE, q->needle_pos,
						     q->needle_end, "needle") ||
			       kvmem_lab_record_span(d->rec, KVMEM_LAB_SPAN_QUERY,
						     kvmem_session_tokens(s) + 1,
						     kvmem_session_tokens(s) + q->n_ids - 1, "key")))
			goto fail;
		if (kvmem_session_select_ahead(s, q->ids, q->n_ids))
			goto fail;
		held = kvmem_plan_holds_span(kvmem_session_plan(s), d->block, q->needle_pos,
					  q->needle_end) >= 1.0;
		if (kvmem_session_append(s, q->ids, q->n_ids, 0))
			goto fail;
		while (n < AGENTLANG_MAX_ANSWER) {
			if (kvmem_session_decode(s, 1, NULL, &gen[n]))
				goto fail;
			if (gen[n++] == AGENTLANG_END)
				break;
		}
		ok = agentlang_exact_match(q, gen, n);
		right += ok;
		if (!d->quiet) {
			printf("  Q%d \"", i + 1);
			show(q->ids, 0, q->n_ids, 60);
			printf("\"  fact %lld tokens back (%.1f windows), its block %s the view\n"
			       "      answer \"", (long long)back, (double)back / window,
			       held ? "paged into" : "NOT in");
			show(gen, 0, n, 30);
			printf("\" %s", ok ? "right" : "WRONG, expected \"");
			if (!ok) {
				show(q->answer, 0, q->n_answer, 30);
				printf("\"");
			}
			printf("\n");
		}
		if (kvmem_session_append(s, &nl, 1, 0))
			goto fail;
	}
	if (d->rec) {
		snprintf(path, sizeof(path), "%s/demo.ws", d->lab);
		if (kvmem_lab_save_workspace(path, d->m, d->block, 0, src, kvmem_session_token_ids(s),
					     kvmem_session_tokens(s)))
			goto fail;
		kvmem_session_free(s);
		s = NULL;
		if (kvmem_lab_record_close(d->rec))
			right = -1;
		d->rec = NULL;
		if (right >= 0 && !d->quiet)
			printf("  recorded for kvmem lab: %s/demo.trace over %s/demo.ws\n", d->lab, d->lab);
	}
	kvmem_session_free(s);
	return right;
fail:
	kvmem_session_free(s);
	if (d->rec)
		kvmem_lab_record_close(d->rec);
	d->rec = NULL;
	return -1;
}

/* Returns 0 to run, 1 after --help, -1 on bad usage (the message printed). */
static int parse(struct demo *d, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },	{ "policy", required_argument, NULL, 'p' },
		{ "tokens", required_argument, NULL, 'n' },	{ "budget", required_argument, NULL, 'b' },
		{ "questions", required_argument, NULL, 'q' }, { "steps", required_argument, NULL, 's' },
		{ "seed", required_argument, NULL, 'S' },	{ "quiet", no_argument, NULL, 'Q' },
		{ "backend", required_argument, NULL, 'B' },	{ "lab", required_argument, NULL, 'L' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *w = "kvmem demo";
	int c;

	cli_getopt_reset();
	while ((c = cli_getopt(w, argc, argv, opts)) != -1) {
		const char *name = cli_optname;
		int bad = 0;

		switch (c) {
		case 'h': usage(stdout); return 1;
		case 'Q': d->quiet = 1; break;
		case 'm': d->model_dir = optarg; break;
		case 'p': d->policy = optarg; break;
		case 'B': d->backend = optarg; break;
		case 'L': d->lab = optarg; break;
		case 'n': bad = cli_parse_count(w, name, optarg, 1, 1ll << 31, &d->tokens); break;
		case 'b': bad = cli_parse_count(w, name, optarg, 1, INT32_MAX / 2, &d->budget); break;
		case 'q': bad = cli_parse_int(w, name, optarg, 1, 64, &d->questions); break;
		case 's': bad = cli_parse_int(w, name, optarg, 1, 1000, &d->steps); break;
		case 'S': bad = cli_parse_u64(w, name, optarg, &d->seed); break;
		default: return -1;
		}
		if (bad)
			return -1;
	}
	if (cli_no_operands(w, argc, argv))
		return -1;
	return 0;
}

int cmd_demo(int argc, char **argv)
{
	struct demo d = { .policy = "subblock", .questions = 6, .steps = 8, .block = 32,
			  .chunk = 128, .seed = DEMO_SEED };
	char dir[4300];
	kvmem_model *m = NULL;
	kvmem_backend *e = NULL;
	agentlang_transcript ws = { 0 };
	agentlang_params lp;
	kvmem_page_source src = { 0 };
	int rc = 1, W, got, slide;
	double depths[64];

	/* At appliance scale (demo_scale.c): its own options. */
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--scale", 7))
			return demo_scale(argc, argv);

	switch (parse(&d, argc, argv)) {
	case 1:
		return 0;
	case -1:
		return EXIT_USAGE;
	}
	if (!kvmem_policy_find(d.policy)) {
		fprintf(stderr, "kvmem demo: %s\n", kvmem_last_error());
		return EXIT_USAGE;
	}
	if (!d.model_dir) {
		int w = embedded_model_install(dir, sizeof(dir));

		if (w < 0)
			goto err;
		if (w && !d.quiet)
			printf("kvmem demo: wrote the built-in model to %s\n", dir);
		d.model_dir = dir;
	}
	if (kvmem_model_load(d.model_dir, &m))
		goto err;
	d.m = m;
	W = m->cfg.max_position;
	if (m->cfg.vocab != agentlang_vocab_size()) {
		kvmem_error(EINVAL, "%s: vocabulary of %d tokens, agentlang has %d: not an agentlang model",
			  d.model_dir, m->cfg.vocab, agentlang_vocab_size());
		goto err;
	}
	if (!d.tokens)
		d.tokens = 16LL * W;
	if (!d.budget) {
		int reserve = W / 8 > d.chunk ? W / 8 : d.chunk;

		d.budget = (W - 32 - reserve) / d.block * d.block;
	}
	if (kvmem_backend_open(d.backend, m, &(kvmem_backend_opts){ .max_chunk = d.chunk }, &e) < 0) {
		if (kvmem_last_errno() == EINVAL)
			rc = EXIT_USAGE;	/* an unknown backend name */
		goto err;
	}

	/* Facts spread over the history, the oldest first. */
	agentlang_params_default(&lp);
	lp.seed = d.seed;
	lp.n_tokens = d.tokens;
	lp.n_questions = d.questions;
	for (int i = 0; i < d.questions; i++)
		depths[i] = 0.1 + 0.8 * i / (d.questions > 1 ? d.questions - 1 : 1);
	lp.depths = depths;
	if (agentlang_transcript_build(&lp, &ws))
		goto err;

	printf("kvmem demo: model %s (%.1fM parameters, native window %d tokens), %s backend\n"
	       "An agent works through a workspace of %lld tokens (%.1f windows) of tool calls\n"
	       "and outputs. kvmem keeps all of it as KV pages and lets the model see a view of\n"
	       "%lld history tokens (%.1f%% of the workspace), chosen anew at each step.\n\n",
	       d.model_dir, kvmem_config_params(&m->cfg) / 1e6, W, kvmem_backend_name(e),
	       (long long)ws.n_ids,
	       (double)ws.n_ids / W, (long long)d.budget, 100.0 * d.budget / ws.n_ids);

	if (kvmem_page_source_mem(&src, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim, d.block))
		goto err;
	if (read_workspace(&d, e, &ws, &src, W))
		goto err;

	printf("\nQuestions about facts seen long ago, with %s selection:\n", d.policy);
	if ((got = ask_all(&d, e, &ws, &src, d.policy, W)) < 0)
		goto err;
	printf("\nThe same questions with a sliding window (the most recent tokens only):\n");
	if ((slide = ask_all(&d, e, &ws, &src, "recency", W)) < 0)
		goto err;

	printf("\nSummary: %s answered %d of %d; a sliding window of the same size answered %d.\n"
	       "The model never saw more than %d tokens at once; every fact lay %.1f or more\n"
	       "windows back. `kvmem bench recall` measures this over hundreds of questions.\n",
	       d.policy, got, ws.n_q, slide, W,
	       (double)(ws.n_ids - ws.q[ws.n_q - 1].needle_pos) / W);
	rc = 0;
	goto out;
err:
	fprintf(stderr, "kvmem demo: %s\n", kvmem_last_error());
out:
	if (src.ops)
		kvmem_page_source_destroy(&src);
	agentlang_transcript_free(&ws);
	kvmem_backend_close(e);
	kvmem_model_free(m);
	return rc;
}
