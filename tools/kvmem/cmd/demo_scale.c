// SPDX-License-Identifier: MIT
/*
 * kvmem demo --scale N: the demo at appliance scale. The shipped agentlang
 * model (native window 2048 tokens) reads a workspace of N tokens (1M and
 * more) in steps on the GPU, its history kept as bf16 pages in a workspace
 * directory (host pool over NVMe), a view of under 2K tokens chosen anew as
 * it goes; then it answers questions about facts far back. Per question:
 * the selection time, the bytes rematerialised, the step time (question
 * asked -> first answer token), and what re-prefilling the whole workspace
 * would take instead (measured on two slices with full attention, fitted
 * to a + b n^2 and scaled: an estimate, said so). Run it again on the same
 * --workspace and the history is reopened, not read again.
 */
#include <ftw.h>
#include <sys/stat.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentlang/agentlang.h"
#include "kvmem/backend.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/store.h"
#include "kvmem/session.h"
#include "cli_util.h"
#include "cmd.h"
#include "embedded_model.h"

#define WHO "kvmem demo"
#define SEED 1000000007ull

struct scale {
	const char *model_dir, *backend, *policy, *workspace;
	int64_t tokens, budget;
	int questions, steps, quiet, keep;
	uint64_t seed, gpu_mem, host_cap;
	int64_t selections, entered;	/* of the current step */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem demo --scale N [options]\n"
		"\n"
		"The demo at appliance scale: the agentlang model reads a workspace of N tokens\n"
		"in steps on the GPU, its history kept in a workspace directory (bf16 pages,\n"
		"host pool over NVMe), then answers questions about facts far back, printing\n"
		"per question the selection time, the bytes moved into the view, the step time,\n"
		"and what re-prefilling the whole workspace would take (an estimate from two\n"
		"measured slices). Run again on the same --workspace: no re-prefill.\n"
		"\n"
		"  --scale N         workspace tokens (e.g. 1M)\n"
		"  --backend NAME    cuda, cpu or auto (default auto)\n"
		"  --workspace DIR   where the history lives (default /tmp/kvmem-demo-<N>)\n"
		"  --host-cap SIZE   host pool (default 2G)\n"
		"  --gpu-mem SIZE    device memory cap\n"
		"  --questions N     questions (default 8)\n"
		"  --steps N         steps the workspace is read in (default 16)\n"
		"  --budget N        history tokens in the view (default: window - 32 - reserve)\n"
		"  --policy NAME     selection policy for the questions (default subblock)\n"
		"  --seed S          workspace seed (default %llu)\n"
		"  --model DIR       another agentlang model directory\n"
		"  --keep            keep the workspace directory (default: kept only when given)\n"
		"  --quiet           only the summary\n"
		"%s; %s.\n"
		"\n"
		"examples:\n"
		"  kvmem demo --scale 1M --backend cuda\n"
		"  kvmem demo --scale 1M --backend cuda --workspace /var/tmp/demo-1m --quiet\n",
		(unsigned long long)SEED, CLI_COUNT_HELP, CLI_SIZE_HELP);
}

static int parse(struct scale *d, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "scale", required_argument, NULL, 'n' },	{ "backend", required_argument, NULL, 'B' },
		{ "workspace", required_argument, NULL, 'w' }, { "host-cap", required_argument, NULL, 'H' },
		{ "gpu-mem", required_argument, NULL, 'g' },	{ "questions", required_argument, NULL, 'q' },
		{ "steps", required_argument, NULL, 's' },	{ "budget", required_argument, NULL, 'b' },
		{ "policy", required_argument, NULL, 'p' },	{ "seed", required_argument, NULL, 'S' },
		{ "model", required_argument, NULL, 'm' },	{ "keep", no_argument, NULL, 'k' },
		{ "quiet", no_argument, NULL, 'Q' },		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int c;

	cli_getopt_reset();
	while ((c = cli_getopt(WHO, argc, argv, opts)) != -1) {
		const char *name = cli_optname;
		int bad = 0;

		switch (c) {
		case 'h': usage(stdout); return 1;
		case 'B': d->backend = optarg; break;
		case 'w': d->workspace = optarg; d->keep = 1; break;
		case 'p': d->policy = optarg; break;
		case 'm': d->model_dir = optarg; break;
		case 'k': d->keep = 1; break;
		case 'Q': d->quiet = 1; break;
		case 'n': bad = cli_parse_count(WHO, name, optarg, 4096, 1ll << 31, &d->tokens); break;
		case 'b': bad = cli_parse_count(WHO, name, optarg, 32, INT32_MAX / 2, &d->budget); break;
		case 'H': bad = cli_parse_size(WHO, name, optarg, 1 << 20, 1ull << 50, &d->host_cap); break;
		case 'g': bad = cli_parse_size(WHO, name, optarg, 1 << 20, 1ull << 50, &d->gpu_mem); break;
		case 'q': bad = cli_parse_int(WHO, name, optarg, 1, 64, &d->questions); break;
		case 's': bad = cli_parse_int(WHO, name, optarg, 1, 100000, &d->steps); break;
		case 'S': bad = cli_parse_u64(WHO, name, optarg, &d->seed); break;
		default: return -1;
		}
		if (bad)
			return -1;
	}
	if (cli_no_operands(WHO, argc, argv))
		return -1;
	if (!kvmem_policy_find(d->policy)) {
		fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
		return -1;
	}
	return 0;
}

static int rm_one(const char *path, const struct stat *sb, int type, struct FTW *f)
{
	return remove(path);
}

static void on_select(void *arg, const kvmem_plan *p, int forced)
{
	struct scale *d = arg;

	d->selections++;
	d->entered += p->entering;
}

static kvmem_session *session(struct scale *d, kvmem_backend *e, kvmem_workspace *w,
			      const char *policy, int query_tokens)
{
	kvmem_session_opts so;

	kvmem_session_opts_default(&so);
	so.block = 32;
	so.budget = d->budget;
	so.chunk = 128;
	so.policy = policy;
	so.seed = d->seed;
	so.source = kvmem_workspace_source(w);
	so.query_tokens = query_tokens;
	so.on_select = on_select;
	so.arg = d;
	return kvmem_session_create(e, &so);
}

/* Full-attention prefill of n tokens on a fresh view: seconds. */
static double full_prefill(kvmem_backend *e, const int32_t *ids, int64_t n, int chunk)
{
	kvmem_view *v = NULL;
	double t0, t = -1;

	if (kvmem_backend_view_new(e, n, &v) < 0)
		goto out;
	t0 = cli_now_s();
	for (int64_t at = 0; at < n; at += chunk)
		if (kvmem_backend_append(e, v, ids + at, n - at < chunk ? (int)(n - at) : chunk, NULL,
					 0) < 0)
			goto out;
	t = cli_now_s() - t0;
out:
	kvmem_backend_view_free(e, v);
	return t;
}

int demo_scale(int argc, char **argv)
{
	struct scale d = { .policy = "subblock", .questions = 8, .steps = 16, .seed = SEED,
			   .host_cap = 2ull << 30 };
	char mdir[4300], wdir[4300];
	kvmem_model *m = NULL;
	kvmem_backend *e = NULL;
	kvmem_workspace *w = NULL;
	kvmem_session *s = NULL;
	agentlang_transcript ws = { 0 };
	agentlang_params lp;
	kvmem_workspace_opts wo = { .block = 32 };
	double depths[64], t_read = 0, a = 0, bq = 0, est;
	int64_t have = 0, at = 0;
	int W, right = 0, rc = 1;

	switch (parse(&d, argc, argv)) {
	case 1:
		return 0;
	case -1:
		return EXIT_USAGE;
	}
	if (!d.model_dir) {
		if (embedded_model_install(mdir, sizeof(mdir)) < 0)
			goto err;
		d.model_dir = mdir;
	}
	if (kvmem_model_load(d.model_dir, &m) < 0)
		goto err;
	if (m->cfg.vocab != agentlang_vocab_size()) {
		kvmem_error(EINVAL, "%s: not an agentlang model", d.model_dir);
		goto err;
	}
	W = m->cfg.max_position;
	if (!d.budget) {
		int reserve = W / 8 > 128 ? W / 8 : 128;

		d.budget = (W - 32 - reserve) / 32 * 32;
	}
	if (kvmem_backend_open(d.backend, m, &(kvmem_backend_opts){ .max_chunk = 4096,
								   .mem_cap = d.gpu_mem }, &e) < 0)
		goto err;
	agentlang_params_default(&lp);
	lp.seed = d.seed;
	lp.n_tokens = d.tokens;
	lp.n_questions = d.questions;
	for (int i = 0; i < d.questions; i++)
		depths[i] = 0.02 + 0.88 * i / (d.questions > 1 ? d.questions - 1 : 1);
	lp.depths = depths;
	if (agentlang_transcript_build(&lp, &ws) < 0)
		goto err;
	if (!d.workspace) {
		snprintf(wdir, sizeof(wdir), "/tmp/kvmem-demo-%" PRId64, d.tokens);
		d.workspace = wdir;
	}
	wo.host_cap = d.host_cap;
	wo.dtype = strcmp(kvmem_backend_name(e), "cpu") ? KVMEM_DTYPE_BF16 : 0;
	if (kvmem_workspace_open(d.workspace, m, &wo, &w) < 0)
		goto err;
	have = kvmem_workspace_tokens(w);
	if (have && (have > ws.n_ids ||
		     memcmp(kvmem_workspace_token_ids(w), ws.ids, (size_t)have * sizeof(int32_t)))) {
		kvmem_error(EEXIST, "%s holds another history (%" PRId64 " tokens); remove it or pick "
			    "another --workspace", d.workspace, have);
		goto err;
	}
	printf("kvmem demo --scale: model %s (%.1fM parameters, window %d), %s backend\n"
	       "workspace %" PRId64 " tokens (%.0f windows) kept in %s (%s pages, host pool %.1f GB)"
	       "; view %" PRId64 " history tokens\n", d.model_dir, kvmem_config_params(&m->cfg) / 1e6,
	       W, kvmem_backend_name(e), ws.n_ids, (double)ws.n_ids / W, d.workspace,
	       wo.dtype == KVMEM_DTYPE_BF16 ? "bf16" : "f32", d.host_cap / 1e9, d.budget);
	fflush(stdout);
	/* Reading: whatever the workspace does not hold yet. */
	if (have < ws.n_ids) {
		double t0 = cli_now_s();

		if (!(s = session(&d, e, w, "meank", 4)) || kvmem_workspace_adopt(w, s) < 0)
			goto err;
		at = have;
		for (int step = 1; step <= d.steps && at < ws.n_ids; step++) {
			int64_t end = step == d.steps ? ws.n_ids : ws.n_ids * step / d.steps;
			double ts = cli_now_s();

			if (end <= at)
				continue;
			while (end < ws.n_ids && ws.ids[end - 1] != AGENTLANG_NL)
				end++;
			d.selections = d.entered = 0;
			if (kvmem_session_append(s, ws.ids + at, end - at, 0) < 0 ||
			    kvmem_workspace_commit(w, s) < 0)
				goto err;
			if (!d.quiet)
				printf("  read step %d: workspace %" PRId64 " tokens, +%" PRId64 " in %.1f s "
				       "(%.0f tokens/s), %" PRId64 " selections moved %" PRId64 " blocks "
				       "in; committed\n", step, end, end - at, cli_now_s() - ts,
				       (end - at) / (cli_now_s() - ts), d.selections, d.entered);
			fflush(stdout);
			at = end;
		}
		t_read = cli_now_s() - t0;
		printf("  read %" PRId64 " tokens in %.1f s (%.0f tokens/s), durable in %s\n",
		       ws.n_ids - have, t_read, (ws.n_ids - have) / t_read, d.workspace);
		kvmem_session_free(s);
		s = NULL;
		/* Closed and opened again: what a later run sees, and the
		 * history the questions' session takes over. */
		if (kvmem_workspace_close(w) < 0) {
			w = NULL;
			goto err;
		}
		if (kvmem_workspace_open(d.workspace, m, &wo, &w) < 0) {
			w = NULL;
			goto err;
		}
	} else {
		printf("  reopened: the workspace holds all %" PRId64 " tokens; nothing is prefilled "
		       "again\n", have);
	}
	/* The re-prefill it saves: full attention over two slices. */
	{
		/* Slices long enough for attention's n^2 to show: at 16K and 32K
		 * tokens this small model's prefill is mostly its linear part,
		 * and a fit through them underestimates (it said ~1 s at 512K
		 * on the H200, where attention alone is ~1.6e15 FLOP). */
		int64_t n1 = ws.n_ids < 131072 ? ws.n_ids / 2 : 65536, n2 = 2 * n1;
		double t1 = full_prefill(e, ws.ids, n1, 512), t2 = full_prefill(e, ws.ids, n2, 512);

		if (t1 < 0 || t2 < 0)
			goto err;
		/* t = a n + b n^2 through both points. */
		bq = (t2 - 2 * t1) / ((double)n2 * n2 - 2.0 * n1 * n1);
		if (bq < 0)
			bq = 0;
		a = (t1 - bq * (double)n1 * n1) / n1;
		est = a * ws.n_ids + bq * (double)ws.n_ids * ws.n_ids;
		printf("  a re-prefill of the whole workspace with full attention: about %.0f s "
		       "(estimated: %" PRId64 " tokens took %.2f s and %" PRId64 " took %.2f s here, "
		       "fitted to a n + b n^2 and scaled to %" PRId64 ")\n", est, n1, t1, n2, t2,
		       ws.n_ids);
	}
	/* Questions: a fresh session takes the history over from the pages. */
	{
		double t0 = cli_now_s();

		if (!(s = session(&d, e, w, d.policy, 1)) || kvmem_workspace_adopt(w, s) < 0)
			goto err;
		printf("\nQuestions (%s selection; the history taken over from the pages in %.1f s):\n",
		       d.policy, cli_now_s() - t0);
	}
	for (int i = 0; i < ws.n_q; i++) {
		const agentlang_question *q = &ws.q[i];
		int32_t gen[AGENTLANG_MAX_ANSWER], nl = AGENTLANG_NL;
		kvmem_place_stats p0, p1;
		double t0, t1, t2, t3;
		int n = 0, ok, held;
		char buf[256];

		kvmem_backend_place_stats(e, &p0);
		t0 = cli_now_s();
		if (kvmem_session_select_ahead(s, q->ids, q->n_ids) < 0)
			goto err;
		t1 = cli_now_s();
		kvmem_backend_place_stats(e, &p1);
		held = kvmem_plan_holds_span(kvmem_session_plan(s), 32, q->needle_pos, q->needle_end) >= 1.0;
		if (kvmem_session_append(s, q->ids, q->n_ids, 0) < 0 ||
		    kvmem_session_decode(s, 1, NULL, &gen[n++]) < 0)
			goto err;
		t2 = cli_now_s();
		while (n < AGENTLANG_MAX_ANSWER && gen[n - 1] != AGENTLANG_END)
			if (kvmem_session_decode(s, 1, NULL, &gen[n++]) < 0)
				goto err;
		t3 = cli_now_s();
		ok = agentlang_exact_match(q, gen, n);
		right += ok;
		if (!d.quiet) {
			long len = agentlang_decode(q->ids, (size_t)q->n_ids, buf, sizeof(buf));

			printf("  Q%d %.*s  fact %.2fM tokens back: %s the view; answer %s\n", i + 1,
			       len > 0 ? (int)len - 1 : 0, buf, (ws.n_ids - q->needle_pos) / 1e6,
			       held ? "paged into" : "NOT in", ok ? "right" : "WRONG");
			printf("      selection %.1f ms, %.2f MB moved into the view (%.1f ms), step "
			       "%.1f ms to the first answer token, %.1f ms to the whole answer; a "
			       "re-prefill: ~%.0f s\n",
			       (t1 - t0) * 1e3 - (p1.ns - p0.ns) / 1e6,
			       (p1.bytes_in - p0.bytes_in) / 1e6, (p1.ns - p0.ns) / 1e6,
			       (t2 - t0) * 1e3, (t3 - t0) * 1e3,
			       a * ws.n_ids + bq * (double)ws.n_ids * ws.n_ids);
			fflush(stdout);
		}
		if (kvmem_session_append(s, &nl, 1, 0) < 0)
			goto err;
	}
	printf("\nSummary: %d of %d right over a %" PRId64 "-token workspace with a %" PRId64
	       "-token view (%s).\n", right, ws.n_q, ws.n_ids, d.budget, kvmem_backend_name(e));
	rc = 0;
	goto out;
err:
	fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
out:
	kvmem_session_free(s);
	if (w)
		kvmem_workspace_close(w);
	if (rc == 0 && !d.keep && d.workspace == wdir)
		nftw(wdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	agentlang_transcript_free(&ws);
	kvmem_backend_close(e);
	kvmem_model_free(m);
	return rc;
}
