// SPDX-License-Identifier: MIT
/*
 * kvmem run, agent-session mode: a script of appends and decodes run as
 * agent steps over a workspace (kvmem_session), printing per step what was
 * selected, reused, entered and left and the decoded ids. --check-exact
 * runs a plain full-context twin alongside and compares every logit.
 *
 * Script: one JSON object per line (blank lines skipped):
 *   {"append": [ids...], "pin": true}      prefill these ids (pin: keep them in every view)
 *   {"append_random": N, "seed": S}        N random ids (seed optional), "pin" allowed
 *   {"decode": N}                          a step boundary: select, then generate N ids
 * Options are read by cmd_run.c (one table for both modes of kvmem run).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kvmem/backend.h"
#include "kvmem/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/workspace.h"
#include "util/json.h"
#include "cli_util.h"
#include "cmd.h"
#include "pager_cli.h"
#include "run.h"

enum { OP_APPEND, OP_DECODE };

struct op {
	int kind, pin, line;
	int64_t n;
	int32_t *ids;		/* "append": its ids (malloc'd); NULL for append_random */
	uint64_t rng;		/* append_random: the generator of its ids */
};

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
};

/* ---- the script --------------------------------------------------------- */
/*
 * The script is read and run a line at a time, so memory is bounded by the
 * longest line and the generation chunk, never by the script's token count
 * (five lines of {"append_random": 268435456} once took 5.2 GB before the
 * first step). A regular file is checked whole first, so a bad line 900
 * refuses the run before line 1 commits anything; a pipe is read once and
 * a bad line stops the run where it stands (exit 2 either way).
 */
struct script {
	const char *file;
	FILE *f;
	char *line;
	size_t cap;
	int lineno, vocab, steps;
	uint64_t seed;
};

static int script_error(const struct script *sc, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static int script_error(const struct script *sc, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvmem run: %s:%d: ", sc->file, sc->lineno);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return -1;
}

/* What a JSON value is, for messages: "1e+12", "a string", ... */
static const char *json_what(const kvmem_json *v, char *buf, size_t len)
{
	if (kvmem_json_typeof(v) == KVMEM_JSON_NUMBER)
		snprintf(buf, len, "%.17g", kvmem_json_num(v, 0));
	else
		snprintf(buf, len, "a%s %s", kvmem_json_typeof(v) == KVMEM_JSON_ARRAY ||
			 kvmem_json_typeof(v) == KVMEM_JSON_OBJECT ? "n" : "", kvmem_json_type_name(v));
	return buf;
}

#define MAX_DECODE (1 << 30)
#define MAX_APPEND_RANDOM (1 << 28)

/* One line's object into op; ids checked against the vocabulary. An
 * append_random keeps only its count and generator: its ids are made in
 * chunks as it runs. */
static int parse_op(struct script *sc, const kvmem_json *j, struct op *op)
{
	const kvmem_json *ap = kvmem_json_get(j, "append"), *ar = kvmem_json_get(j, "append_random");
	const kvmem_json *dc = kvmem_json_get(j, "decode"), *pin = kvmem_json_get(j, "pin");
	const kvmem_json *sd = kvmem_json_get(j, "seed");
	char what[64];

	if (kvmem_json_typeof(j) != KVMEM_JSON_OBJECT)
		return script_error(sc, "each line must be a JSON object");
	for (size_t i = 0; i < kvmem_json_len(j); i++) {
		const char *k = kvmem_json_key(j, i);

		if (strcmp(k, "append") && strcmp(k, "append_random") && strcmp(k, "decode") &&
		    strcmp(k, "pin") && strcmp(k, "seed"))
			return script_error(sc, "unknown key \"%s\" (append, append_random, decode, pin, "
					    "seed)", k);
	}
	if (!!ap + !!ar + !!dc != 1)
		return script_error(sc, "needs exactly one of \"append\", \"append_random\", \"decode\"");
	if (pin && kvmem_json_typeof(pin) != KVMEM_JSON_BOOL)
		return script_error(sc, "\"pin\" must be true or false");
	if (pin && dc)
		return script_error(sc, "\"pin\" goes with an append, not with \"decode\"");
	if (sd && !ar)
		return script_error(sc, "\"seed\" goes with \"append_random\"");
	memset(op, 0, sizeof(*op));
	op->line = sc->lineno;
	op->pin = kvmem_json_bool(pin, 0);
	if (dc) {
		op->kind = OP_DECODE;
		op->n = kvmem_json_int(dc, -1);
		if (!kvmem_json_is_int(dc) || op->n < 0 || op->n > MAX_DECODE)
			return script_error(sc, "\"decode\" wants a token count from 0 to %d, not %s",
					    MAX_DECODE, json_what(dc, what, sizeof(what)));
		return 0;
	}
	op->kind = OP_APPEND;
	if (ar) {
		op->n = kvmem_json_int(ar, -1);
		if (!kvmem_json_is_int(ar) || op->n < 1 || op->n > MAX_APPEND_RANDOM)
			return script_error(sc, "\"append_random\" wants a token count from 1 to %d, not %s",
					    MAX_APPEND_RANDOM, json_what(ar, what, sizeof(what)));
		if (sd && (!kvmem_json_is_int(sd) || kvmem_json_int(sd, -1) < 0))
			return script_error(sc, "\"seed\" wants an integer from 0 to %lld, not %s",
					    (long long)INT64_MAX, json_what(sd, what, sizeof(what)));
		op->rng = kvmem_rng_seed(sd ? (uint64_t)kvmem_json_int(sd, 0) :
					 sc->seed * 1000003u + (uint64_t)sc->lineno);
		return 0;
	}
	op->n = (int64_t)kvmem_json_len(ap);
	if (kvmem_json_typeof(ap) != KVMEM_JSON_ARRAY || op->n < 1)
		return script_error(sc, "\"append\" wants a non-empty array of token ids");
	op->ids = malloc(sizeof(int32_t) * op->n);
	if (!op->ids)
		return script_error(sc, "out of memory for %lld token ids", (long long)op->n);
	for (int64_t i = 0; i < op->n; i++) {
		const kvmem_json *t = kvmem_json_at(ap, (size_t)i);
		int64_t id = kvmem_json_int(t, -1);

		if (!kvmem_json_is_int(t) || id < 0 || id >= sc->vocab) {
			free(op->ids);
			op->ids = NULL;
			return script_error(sc, "token %lld of \"append\" is not an id in 0..%d",
					    (long long)i, sc->vocab - 1);
		}
		op->ids[i] = (int32_t)id;
	}
	return 0;
}

static int script_open(struct script *sc, const char *file, int vocab, uint64_t seed)
{
	struct stat st;

	memset(sc, 0, sizeof(*sc));
	sc->file = file;
	sc->vocab = vocab;
	sc->seed = seed;
	/* A pipe or FIFO is fine (an agent may feed its steps as it goes);
	 * a directory is not a script. */
	sc->f = fopen(file, "r");
	if (!sc->f) {
		fprintf(stderr, "kvmem run: %s: %s\n", file, strerror(errno));
		return -1;
	}
	if (fstat(fileno(sc->f), &st) == 0 && S_ISDIR(st.st_mode)) {
		fprintf(stderr, "kvmem run: %s: a directory, not a script (one JSON object per line)\n",
			file);
		fclose(sc->f);
		sc->f = NULL;
		return -1;
	}
	return 0;
}

static void script_close(struct script *sc)
{
	if (sc->f)
		fclose(sc->f);
	free(sc->line);
	sc->f = NULL;
	sc->line = NULL;
}

/* The next step into op: 1, 0 at the end, -1 after a message. */
static int script_next(struct script *sc, struct op *op)
{
	ssize_t len;

	while ((len = getline(&sc->line, &sc->cap, sc->f)) >= 0) {
		char name[4200];
		kvmem_json *j;
		size_t k;
		int rc;

		sc->lineno++;
		for (k = 0; k < (size_t)len && strchr(" \t\r\n", sc->line[k]) && sc->line[k]; k++)
			;
		if (k == (size_t)len)
			continue;
		snprintf(name, sizeof(name), "%s:%d", sc->file, sc->lineno);
		if (!(j = kvmem_json_parse(sc->line, (size_t)len, name))) {
			fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
			return -1;
		}
		rc = parse_op(sc, j, op);
		kvmem_json_free(j);
		if (rc)
			return -1;
		sc->steps++;
		return 1;
	}
	if (ferror(sc->f)) {
		fprintf(stderr, "kvmem run: %s: read error after line %d: %s\n", sc->file, sc->lineno,
			strerror(errno));
		return -1;
	}
	if (!sc->steps)
		return script_error(sc, "the script holds no steps");
	return 0;
}

/* A regular file is checked whole, then read again from the top to run. */
static int script_check(struct script *sc)
{
	struct stat st;
	struct op op;
	int r;

	if (fstat(fileno(sc->f), &st) || !S_ISREG(st.st_mode))
		return 0;
	while ((r = script_next(sc, &op)) > 0)
		free(op.ids);
	if (r < 0)
		return -1;
	rewind(sc->f);
	sc->lineno = sc->steps = 0;
	return 0;
}

/* The ids of an append_random, made and prefilled a chunk at a time. The
 * chunk is a multiple of the prefill chunk, so the forward passes (and the
 * selections between them) fall where one append of every id would put
 * them. */
static int append_random(kvmem_session *s, struct op *op, int vocab, int chunk)
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

		for (int64_t i = 0; i < k; i++)
			ids[i] = (int32_t)(kvmem_rng_uniform(&op->rng) * vocab);
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
	if (kvmem_backend_append(t->be, t->v, tok, n, t->logits, 1, NULL) < 0) {
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

static void print_step(const struct run_opts *o, kvmem_session *s, int step, const struct op *op,
		       const struct step *st, const int32_t *out, double ms)
{
	const kvmem_plan *p = kvmem_session_plan(s);
	int64_t view = p->view_tokens, tail = kvmem_session_view_len(s) - view;

	if (o->json) {
		printf("{\"step\":%d,\"line\":%d,\"op\":\"%s\",\"n\":%lld,\"pinned\":%s,"
		       "\"workspace_tokens\":%lld,\"view_tokens\":%lld,\"tail_tokens\":%lld,"
		       "\"selected_blocks\":%d,\"selections\":%lld,\"forced\":%lld,\"reused\":%lld,"
		       "\"entered\":%lld,\"new\":%lld,\"left\":%lld,\"sets\":%d,\"blocks\":[",
		       step, op->line, op->kind == OP_DECODE ? "decode" : "append", (long long)op->n,
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
	       step, op->line, op->kind == OP_DECODE ? "decode" : "append", (long long)op->n,
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

/*
 * After every step with --workspace: make the step durable, the session's
 * state with it, so a reopen goes on exactly from here.
 */
static int workspace_commit(kvmem_session *s)
{
	return pager_cli_commit(s);
}

/* ---- the run ------------------------------------------------------------ */
static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int run_script(struct run *r, kvmem_session *s, int ws, struct script *sc)
{
	const struct run_opts *o = r->o;
	int exact_failed = 0, step = 0, got;
	struct op op;

	while ((got = script_next(sc, &op)) > 0) {
		int32_t *out = NULL;
		double t0 = now_ms();
		int rc;

		step++;
		memset(&r->st, 0, sizeof(r->st));
		if (op.kind == OP_APPEND && op.ids) {
			rc = kvmem_session_append(s, op.ids, op.n, op.pin);
		} else if (op.kind == OP_APPEND) {
			rc = append_random(s, &op, sc->vocab, o->chunk);
		} else {
			out = malloc(sizeof(int32_t) * (op.n ? op.n : 1));
			rc = !out ? kvmem_error(ENOMEM, "out of memory") : kvmem_session_select(s);
			if (!rc)
				rc = kvmem_session_decode(s, (int)op.n, &o->sampler, out);
		}
		free(op.ids);
		/* A NaN would be sampled as token 0, and K/V computed with it are
		 * no better: nothing of this step is printed or committed. */
		if (!rc && r->nonfinite)
			rc = kvmem_error(ERANGE, "the logits hold NaN or infinite values (the model's "
					 "arithmetic overflowed); stopping before they are sampled or "
					 "committed");
		if (!rc && ws)
			rc = workspace_commit(s);
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
	return got < 0 ? EXIT_USAGE : exact_failed;
}

int session_main(const struct run_opts *opts)
{
	const struct run_opts o = *opts;
	struct run r = { .o = &o };
	struct script sc = { 0 };
	int rc = 1;
	kvmem_config cfg;
	kvmem_model *m = NULL;
	kvmem_backend *e = NULL;
	kvmem_session *s = NULL;
	kvmem_session_opts so;
	const kvmem_page_source *wsrc = NULL;
	int64_t n_adopt = 0;
	kvmem_session_stats ss;

	if (kvmem_config_load(&cfg, o.model)) {
		fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		return 1;
	}
	if (script_open(&sc, o.script, cfg.vocab, o.seed) || script_check(&sc)) {
		script_close(&sc);
		return EXIT_USAGE;
	}
	if (kvmem_model_load(o.model, &m) ||
	    kvmem_backend_open(o.backend, m, &(kvmem_backend_opts){ .max_chunk = (int)o.chunk },
			       &e) < 0)
		goto err;
	r.tw.c = &m->cfg;	/* on_forward reads the vocabulary from it */
	kvmem_session_opts_default(&so);
	so.block = (int)o.block;
	so.budget = o.budget;
	so.sink = o.sink;
	so.recent = o.recent;
	so.reserve = o.reserve;
	so.chunk = (int)o.chunk;
	so.query_tokens = (int)o.query_tokens;
	so.policy = o.policy;
	so.seed = o.seed;
	so.all_logits = o.check_exact;
	so.on_forward = on_forward;
	so.on_select = on_select;
	so.arg = &r;
	if (o.workspace) {
		if (pager_cli_open(o.workspace, m, so.block ? so.block : KVMEM_BLOCK_DEFAULT, o.host_cap,
				   o.cache_policy, &wsrc))
			goto err;
		so.source = wsrc;
		n_adopt = pager_cli_tokens();
	}
	if (!(s = kvmem_session_create(e, &so)))
		goto err;
	if (pager_cli_adopt(s))
		goto err;
	if (o.check_exact) {
		r.tw.be = e;
		if (e->ops->view_create(e->ctx, &r.tw.v) < 0)
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
			"budget %s%lld, sink %lld, recent %lld, reserve %lld, chunk %d\n",
			o.model, m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.head_dim,
			ro->policy, ro->block, ro->budget ? "" : "unlimited ", (long long)ro->budget,
			(long long)ro->sink, (long long)ro->recent, (long long)ro->reserve, ro->chunk);
	}
	rc = run_script(&r, s, o.workspace != NULL, &sc);
	kvmem_session_get_stats(s, &ss);
	fprintf(o.json ? stderr : stdout,
		"done: %lld tokens, %lld forward passes, %lld selections (%lld forced), "
		"%lld token-layers re-rotated from raw K, %lld kept in place%s\n",
		(long long)kvmem_session_tokens(s), (long long)ss.forwards, (long long)ss.selections,
		(long long)ss.forced, (long long)ss.rebuilt_tokens, (long long)ss.kept_tokens,
		o.check_exact ? (rc ? "; check-exact FAILED" : "; check-exact ok") : "");
	goto out;
err:
	fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
	rc = 1;
out:
	kvmem_session_free(s);
	if (pager_cli_close(o.json ? stderr : stdout)) {
		/* A failed commit leaves the pager failed: say it once. */
		if (!strstr(r.said, kvmem_last_error()))
			fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		rc = rc ? rc : 1;
	}
	if (r.tw.v)
		e->ops->view_destroy(e->ctx, r.tw.v);
	free(r.tw.logits);
	kvmem_backend_close(e);
	kvmem_model_free(m);
	script_close(&sc);
	return rc;
}
