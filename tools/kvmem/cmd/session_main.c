// SPDX-License-Identifier: MIT
/*
 * kvmem run, agent-session mode: a script of appends and decodes run as
 * agent steps over a workspace (kvmem_session), printing per step what was
 * selected, reused, entered and left and the decoded ids. --check-exact
 * runs a plain full-context twin alongside and compares every logit.
 *
 * The script's format and reader: include/kvmem/script.h. Options are read
 * by cmd_run.c (one table for both modes of kvmem run).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvmem/backend.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/script.h"
#include "kvmem/session.h"
#include "cli_util.h"
#include "cmd.h"
#include "lab_record.h"
#include "run_ws.h"
#include "run.h"

/* What one step did, summed over the selections in it. */
struct step {
	int64_t selections, forced, reused, entering, born, left, forwards, differ;
	double max_diff;
	const kvmem_plan *plan;
};

/* The full-context twin: a second view on the session's backend that only
 * grows, fed the same tokens in the same chunks. */
struct twin {
	kvmem_backend *be;
	kvmem_view *v;
	const kvmem_config *c;
	float *logits;
	int failed;
};

struct run {
	const struct run_opts *o;
	int nonfinite;		/* logits that were NaN or infinite since the step began */
	char said[512];		/* the failure already printed */
	struct step st;
	struct twin tw;
	struct run_ws ws;	/* --workspace */
	struct lab_record lr;	/* --trace */
};

/* ---- the script (kvmem/script.h reads it) ------------------------------- */
/* The ids of an append_random, made and prefilled a chunk at a time. The
 * chunk is a multiple of the prefill chunk, so the forward passes (and the
 * selections between them) fall where one append of every id would put
 * them. */
static int append_random(kvmem_session *s, kvmem_script_step *op, int vocab, int chunk)
{
	int64_t per = (int64_t)chunk * (chunk < 65536 ? 65536 / chunk : 1);
	int64_t p0 = kvmem_session_tokens(s);
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)(op->n < per ? op->n : per));
	int rc = 0;

	if (!ids)
		return kvmem_error(ENOMEM, "out of memory for %lld token ids", (long long)per);
	/* The whole span at once, as one append would pin it. */
	if (op->pin)
		rc = kvmem_session_pin(s, p0, p0 + op->n);
	for (int64_t done = 0; !rc && done < op->n;) {
		int64_t k = op->n - done < per ? op->n - done : per;

		kvmem_script_random_ids(op, vocab, ids, k);
		rc = kvmem_session_append(s, ids, k, 0);
		done += k;
	}
	free(ids);
	return rc;
}

/* ---- the full-context twin ------------------------------------------ */
static void on_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct run *r = arg;
	struct twin *t = &r->tw;
	size_t cnt;

	r->st.forwards++;
	/* The last token's logits are the ones sampled from. */
	if (!run_logits_finite(logits + (r->o->check_exact ? (size_t)(n - 1) * t->c->vocab : 0),
			       t->c->vocab))
		r->nonfinite = 1;
	if (!r->o->check_exact || t->failed)
		return;
	cnt = (size_t)n * t->c->vocab;
	if (kvmem_backend_append(t->be, t->v, tok, n, t->logits, 1) < 0) {
		fprintf(stderr, "kvmem run: the full-context twin failed: %s\n", kvmem_last_error());
		t->failed = 1;
		return;
	}
	if (memcmp(logits, t->logits, cnt * sizeof(float)))
		r->st.differ++;
	for (size_t i = 0; i < cnt; i++) {
		double d = (double)logits[i] - t->logits[i];

		d = d < 0 ? -d : d;
		if (d > r->st.max_diff || d != d)
			r->st.max_diff = d;
	}
}

static void on_select(void *arg, const kvmem_plan *p, int forced)
{
	struct run *r = arg;

	r->st.selections++;
	r->st.forced += forced;
	r->st.reused += p->reused;
	r->st.entering += p->entering;
	r->st.born += p->born;
	r->st.left += p->n_left_total;
}

/* ---- output ------------------------------------------------------------ */
/* Block set 0 as ranges "a-b,c,...", at most max ranges (0: all). */
static void print_ranges(FILE *f, const kvmem_plan *p, int json, int max)
{
	int shown = 0, i = 0;

	while (i < p->n_view) {
		int j = i;

		while (j + 1 < p->n_view && p->blocks[j + 1] == p->blocks[j] + 1)
			j++;
		if (max && shown == max) {
			fprintf(f, ",...");
			break;
		}
		if (json)
			fprintf(f, "%s[%lld,%lld]", shown ? "," : "", (long long)p->blocks[i],
				(long long)p->blocks[j]);
		else if (i == j)
			fprintf(f, "%s%lld", shown ? "," : "", (long long)p->blocks[i]);
		else
			fprintf(f, "%s%lld-%lld", shown ? "," : "", (long long)p->blocks[i],
				(long long)p->blocks[j]);
		shown++;
		i = j + 1;
	}
}

static void print_step(const struct run_opts *o, kvmem_session *s, int step, const kvmem_script_step *op,
		       const struct step *st, const int32_t *out, double ms)
{
	const kvmem_plan *p = kvmem_session_plan(s);
	int64_t view = p->view_tokens, tail = kvmem_session_view_len(s) - view;

	if (o->json) {
		printf("{\"step\":%d,\"line\":%d,\"op\":\"%s\",\"n\":%lld,\"pinned\":%s,"
		       "\"workspace_tokens\":%lld,\"view_tokens\":%lld,\"tail_tokens\":%lld,"
		       "\"selected_blocks\":%d,\"selections\":%lld,\"forced\":%lld,\"reused\":%lld,"
		       "\"entered\":%lld,\"new\":%lld,\"left\":%lld,\"sets\":%d,\"blocks\":[",
		       step, op->line, op->kind == KVMEM_STEP_DECODE ? "decode" : "append", (long long)op->n,
		       op->pin ? "true" : "false", (long long)kvmem_session_tokens(s), (long long)view,
		       (long long)tail, p->n_view, (long long)st->selections, (long long)st->forced,
		       (long long)st->reused, (long long)st->entering, (long long)st->born,
		       (long long)st->left, p->n_sets);
		print_ranges(stdout, p, 1, 0);
		printf("],\"tokens\":[");
		for (int64_t i = 0; out && i < op->n; i++)
			printf("%s%d", i ? "," : "", out[i]);
		printf("],\"ms\":%.3f", ms);
		if (o->check_exact)
			printf(",\"max_logit_diff\":%.9g,\"differing_passes\":%lld", st->max_diff,
			       (long long)st->differ);
		printf("}\n");
		return;
	}
	printf("step %d (line %d) %s %lld%s: workspace %lld, view %lld + tail %lld, %.1f ms\n",
	       step, op->line, op->kind == KVMEM_STEP_DECODE ? "decode" : "append", (long long)op->n,
	       op->pin ? " pinned" : "", (long long)kvmem_session_tokens(s), (long long)view,
	       (long long)tail, ms);
	if (st->selections) {
		printf("  selected %d blocks%s: ", p->n_view, p->n_sets > 1 ? " per layer (layer 0)" : "");
		print_ranges(stdout, p, 0, 24);
		printf("\n  %lld selection%s (%lld forced): reused %lld, entered %lld, new %lld, left %lld\n",
		       (long long)st->selections, st->selections == 1 ? "" : "s",
		       (long long)st->forced, (long long)st->reused, (long long)st->entering,
		       (long long)st->born, (long long)st->left);
	}
	if (out && op->n) {
		printf("  tokens:");
		for (int64_t i = 0; i < op->n; i++)
			printf(" %d", out[i]);
		printf("\n");
	}
	if (o->check_exact)
		printf("  max |logit diff| %.9g over %lld forward passes (%lld differ)\n", st->max_diff,
		       (long long)st->forwards, (long long)st->differ);
}

/* ---- the run ------------------------------------------------------------ */
static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int run_script(struct run *r, kvmem_session *s, int ws, kvmem_script *sc, int vocab)
{
	const struct run_opts *o = r->o;
	int exact_failed = 0, step = 0, got;
	kvmem_script_step op;

	while ((got = kvmem_script_next(sc, &op)) > 0) {
		int32_t *out = NULL;
		double t0 = now_ms();
		int rc;

		step++;
		memset(&r->st, 0, sizeof(r->st));
		if (op.kind == KVMEM_STEP_APPEND && op.ids) {
			rc = kvmem_session_append(s, op.ids, op.n, op.pin);
		} else if (op.kind == KVMEM_STEP_APPEND) {
			rc = append_random(s, &op, vocab, o->chunk);
		} else {
			out = malloc(sizeof(int32_t) * (op.n ? op.n : 1));
			rc = !out ? kvmem_error(ENOMEM, "out of memory") : kvmem_session_select(s);
			if (!rc)
				rc = kvmem_session_decode(s, (int)op.n, &o->sampler, out);
		}
		/* A NaN would be sampled as token 0, and K/V computed with it are
		 * no better: nothing of this step is printed or committed. */
		if (!rc && r->nonfinite)
			rc = kvmem_error(ERANGE, "the logits hold NaN or infinite values (the model's "
					 "arithmetic overflowed); stopping before they are sampled or "
					 "committed");
		/* With --workspace the step is made durable, the session's
		 * state with it, so a reopen goes on exactly from here. */
		if (!rc && ws)
			rc = run_ws_commit(&r->ws, s);
		if (rc) {
			fprintf(stderr, "kvmem run: %s:%d: %s\n", o->script, op.line, kvmem_last_error());
			snprintf(r->said, sizeof(r->said), "%s", kvmem_last_error());
			free(out);
			return 1;
		}
		print_step(o, s, step, &op, &r->st, out, now_ms() - t0);
		free(out);
		if (o->check_exact && r->tw.failed)
			return 1;
		/* The budget held everything: the view was the identity all along. */
		if (o->check_exact && r->st.differ &&
		    (!o->budget || o->budget >= kvmem_session_tokens(s))) {
			fprintf(stderr, "kvmem run: check-exact: step %d (line %d): %lld forward passes "
				"differ from full context (max |diff| %g) although the budget %lld holds "
				"the whole workspace (%lld tokens)\n", step, op.line,
				(long long)r->st.differ, r->st.max_diff, (long long)o->budget,
				(long long)kvmem_session_tokens(s));
			exact_failed = 1;
		}
		/* Output is the product: stop at the first step stdout refuses. */
		if (cli_stdout_ok(RUN_WHO))
			return 1;
	}
	if (got < 0) {
		fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		return EXIT_USAGE;
	}
	return exact_failed;
}

int session_main(const struct run_opts *opts)
{
	const struct run_opts o = *opts;
	struct run r = { .o = &o };
	kvmem_script *sc = NULL;
	int rc = 1;
	kvmem_config cfg;
	kvmem_model *m = NULL;
	kvmem_backend *e = NULL;
	kvmem_session *s = NULL;
	kvmem_session_opts so;
	int64_t n_adopt = 0;
	kvmem_session_stats ss;

	if (kvmem_config_load(&cfg, o.model)) {
		fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		return 1;
	}
	if (kvmem_script_open(o.script, cfg.vocab, o.seed, &sc) < 0 || kvmem_script_check(sc) < 0) {
		fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		kvmem_script_close(sc);
		return EXIT_USAGE;
	}
	if (kvmem_model_load(o.model, &m) ||
	    kvmem_backend_open(o.backend, m, &(kvmem_backend_opts){ .max_chunk = (int)o.chunk,
								     .mem_cap = o.gpu_mem,
								     .kv_dtype = o.kv_dtype, .tp = o.tp }, &e) < 0)
		goto err;
	/* A GPU's workspace keeps bf16 pages (what its view holds: nothing is
	 * converted on the way back); the CPU engine's f32. */
	r.tw.c = &m->cfg;	/* on_forward reads the vocabulary from it */
	kvmem_session_opts_default(&so);
	so.block = (int)o.block;
	so.budget = o.budget;
	so.sink = o.sink;
	so.recent = o.recent;
	so.reserve = o.reserve;
	so.chunk = (int)o.chunk;
	so.query_tokens = (int)o.query_tokens;
	so.layout = o.layout;
	so.policy = o.policy;
	so.seed = o.seed;
	so.all_logits = o.check_exact;
	so.on_forward = on_forward;
	so.on_select = on_select;
	so.arg = &r;
	if (o.workspace) {
		kvmem_workspace_opts wo = {
			.block = so.block ? so.block : KVMEM_BLOCK_DEFAULT,
			.host_cap = o.host_cap,
			.cache_policy = o.cache_policy,
			.dtype = o.kv_dtype ? o.kv_dtype :
				 strcmp(kvmem_backend_name(e), "cpu") ? KVMEM_DTYPE_BF16 : 0,
			.pager = o.pager,
		};

		if (run_ws_open(&r.ws, o.workspace, m, &wo))
			goto err;
		so.source = run_ws_source(&r.ws);
		n_adopt = run_ws_tokens(&r.ws);
	}
	if (o.trace && lab_record_start(&r.lr, o.trace, m, run_ws_pager(&r.ws), &so))
		goto err;
	if (!(s = kvmem_session_create(e, &so)))
		goto err;
	if (run_ws_adopt(&r.ws, s))
		goto err;
	if (o.check_exact) {
		r.tw.be = e;
		if (kvmem_backend_view_new(e, 0, &r.tw.v) < 0)
			goto err;
		r.tw.c = &m->cfg;
		r.tw.logits = malloc(sizeof(float) * o.chunk * m->cfg.vocab);
		if (!r.tw.logits) {
			kvmem_error(ENOMEM, "out of memory for the twin's logits");
			goto err;
		}
		if (n_adopt)
			fprintf(stderr, "kvmem run: note: --check-exact compares only the steps "
				"after the %lld adopted tokens' prefill, which the twin lacks\n",
				(long long)n_adopt);
	}
	{
		const kvmem_session_opts *ro = kvmem_session_options(s);

		fprintf(o.json ? stderr : stdout,
			"session: model %s (%d layers, %d/%d heads, head_dim %d), policy %s, block %d, "
			"budget %s%lld, sink %lld, recent %lld, reserve %lld, chunk %d%s\n",
			o.model, m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.head_dim,
			ro->policy, ro->block, ro->budget ? "" : "unlimited ", (long long)ro->budget,
			(long long)ro->sink, (long long)ro->recent, (long long)ro->reserve,
			ro->chunk, ro->layout == KVMEM_LAYOUT_STABLE ? ", layout stable" : "");
	}
	rc = run_script(&r, s, o.workspace != NULL, sc, m->cfg.vocab);
	kvmem_session_get_stats(s, &ss);
	fprintf(o.json ? stderr : stdout,
		"done: %lld tokens, %lld forward passes, %lld selections (%lld forced), "
		"%lld token-layers re-rotated from raw K (%lld moved inside the view), "
		"%lld kept in place%s\n",
		(long long)kvmem_session_tokens(s), (long long)ss.forwards, (long long)ss.selections,
		(long long)ss.forced, (long long)ss.rebuilt_tokens, (long long)ss.moved_tokens,
		(long long)ss.kept_tokens,
		o.check_exact ? (rc ? "; check-exact FAILED" : "; check-exact ok") : "");
	goto out;
err:
	fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
	rc = 1;
out:
	kvmem_session_free(s);
	if (lab_record_finish(&r.lr, o.json ? stderr : stdout)) {
		fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		rc = rc ? rc : 1;
	}
	if (run_ws_close(&r.ws, o.json ? stderr : stdout)) {
		/* A failed commit leaves the pager failed: say it once. */
		if (!strstr(r.said, kvmem_last_error()))
			fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		rc = rc ? rc : 1;
	}
	kvmem_backend_view_free(e, r.tw.v);
	free(r.tw.logits);
	kvmem_backend_close(e);
	kvmem_model_free(m);
	kvmem_script_close(sc);
	return rc;
}
