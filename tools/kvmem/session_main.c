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
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvmem/engine.h"
#include "kvmem/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/workspace.h"
#include "util/json.h"
#include "cli_util.h"
#include "cmd.h"
#include "pager_cli.h"

enum { OP_APPEND, OP_DECODE };

struct op {
	int kind, pin, line;
	int64_t n;
	int32_t *ids;		/* OP_APPEND */
};

struct cli {
	const char *model, *script, *workspace, *policy, *cache_policy;
	uint64_t host_cap;
	int64_t budget, sink, recent, reserve;
	long block, chunk, query_tokens;
	int json, check_exact;
	uint64_t seed;
	kvmem_sampler sampler;
};

/* What one step did, summed over the selections in it. */
struct step {
	int64_t selections, forced, reused, entering, born, left, forwards, differ;
	double max_diff;
	const kvmem_plan *plan;
};

struct twin {
	kvmem_engine *e;
	const kvmem_config *c;
	kvmem_kvcache kv;
	float *logits;
	int failed;
};

struct run {
	struct cli *o;
	struct step st;
	struct twin tw;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem run --model DIR --script FILE [options]\n"
		"\n"
		"Run an agent session: the script's appends are prefilled in chunks, each\n"
		"{\"decode\": N} line is a step boundary (select blocks with the last queries,\n"
		"rematerialise the view, generate N tokens with the view frozen).\n"
		"\n"
		"  --model DIR        model directory (config.json + safetensors)\n"
		"  --script FILE      one JSON object per line:\n"
		"                       {\"append\": [ids...]}  {\"append_random\": N, \"seed\": S}\n"
		"                       {\"decode\": N}   (\"pin\": true on an append pins its span)\n"
		"  --budget N         history tokens the view may hold (default 0: unlimited)\n"
		"  --block N          tokens per block, a power of two 16..256 (default 32)\n"
		"  --policy NAME      selection policy (default meank; see below)\n"
		"  --chunk N          prefill chunk (default 128)\n"
		"  --sink N           first tokens always in the view (default budget/100)\n"
		"  --recent N         last tokens always in the view (default budget/12)\n"
		"  --reserve N        tail slots between selections (default max(chunk, budget/8))\n"
		"  --query-tokens N   last tokens whose queries drive selection (default 4)\n"
		"  --temperature T    0 (default) is greedy; --top-k K, --top-p P as in plain run\n"
		"  --seed S           seed of random appends, the random policy and sampling\n"
		"  --json             one JSON object per step on stdout\n"
		"  --check-exact      run a full-context twin alongside; report the largest logit\n"
		"                     difference per step; exit 1 if it is not 0 while the\n"
		"                     budget holds the whole workspace\n"
		"  --workspace DIR    keep the history in a workspace directory: created, or\n"
		"                     reopened and continued with no re-prefill exactly where\n"
		"                     it stopped (the session state is committed with the\n"
		"                     history after every script line; Documentation/pager.md)\n"
		"  --host-cap BYTES   host pool of the workspace's pager (default 256M; k/M/G)\n"
		"  --cache-policy P   its replacement policy: lru (default), lfu, score\n"
		"  --help             this text\n"
		"\npolicies:\n");
	for (int i = 0; kvmem_policies[i]; i++)
		fprintf(f, "  %-9s %s\n", kvmem_policies[i]->name, kvmem_policies[i]->what);
}

/* ---- arguments ------------------------------------------------------- */
/* Returns 0 to run, 1 after --help, -1 on bad usage. */
static int parse_args(int argc, char **argv, struct cli *o)
{
	memset(o, 0, sizeof(*o));
	o->sink = o->recent = o->reserve = -1;
	o->sampler.top_p = 1.0f;
	for (int i = 1; i < argc; i++) {
		char *a = argv[i], *eq = strchr(a, '='), *val = NULL;
		char name[64];
		int64_t v;

		if (!strcmp(a, "--help") || !strcmp(a, "-h"))
			return usage(stdout), 1;
		snprintf(name, sizeof(name), "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
#define FLAG(s) (!strcmp(name, s))
		if (FLAG("--json") || FLAG("--check-exact")) {
			if (eq) {
				fprintf(stderr, "kvmem run: %s takes no value\n", name);
				return -1;
			}
			*(FLAG("--json") ? &o->json : &o->check_exact) = 1;
			continue;
		}
		if (eq) {
			val = eq + 1;
		} else if (i + 1 < argc) {
			val = argv[++i];
		} else {
			fprintf(stderr, "kvmem run: %s needs a value\n", name);
			return -1;
		}
		if (FLAG("--model")) {
			o->model = val;
		} else if (FLAG("--script")) {
			o->script = val;
		} else if (FLAG("--workspace")) {
			o->workspace = val;
		} else if (FLAG("--cache-policy")) {
			o->cache_policy = val;
		} else if (FLAG("--host-cap")) {
			char *end;
			double b = strtod(val, &end);

			b *= *end == 'k' || *end == 'K' ? 1024 : *end == 'm' || *end == 'M' ? 1 << 20 :
			     *end == 'g' || *end == 'G' ? 1 << 30 : 1;
			if (b < 1 || (*end && end[1])) {
				fprintf(stderr, "kvmem run: --host-cap wants bytes (k/M/G), not '%s'\n", val);
				return -1;
			}
			o->host_cap = (uint64_t)b;
		} else if (FLAG("--policy")) {
			o->policy = val;
		} else if (FLAG("--budget")) {
			if (cli_parse_i64("kvmem run", name, val, 0, INT32_MAX / 2, &o->budget))
				return -1;
		} else if (FLAG("--sink") || FLAG("--recent") || FLAG("--reserve")) {
			if (cli_parse_i64("kvmem run", name, val, 0, INT32_MAX / 2, &v))
				return -1;
			*(FLAG("--sink") ? &o->sink : FLAG("--recent") ? &o->recent : &o->reserve) = v;
		} else if (FLAG("--block")) {
			if (cli_parse_long("kvmem run", name, val, KVMEM_BLOCK_MIN, KVMEM_BLOCK_MAX, &o->block))
				return -1;
		} else if (FLAG("--chunk")) {
			if (cli_parse_long("kvmem run", name, val, 1, 1 << 20, &o->chunk))
				return -1;
		} else if (FLAG("--query-tokens")) {
			if (cli_parse_long("kvmem run", name, val, 1, 4096, &o->query_tokens))
				return -1;
		} else if (FLAG("--seed")) {
			if (cli_parse_i64("kvmem run", name, val, 0, INT64_MAX, &v))
				return -1;
			o->seed = (uint64_t)v;
		} else if (FLAG("--temperature")) {
			if (cli_parse_float("kvmem run", name, val, &o->sampler.temperature))
				return -1;
		} else if (FLAG("--top-k")) {
			long k;

			if (cli_parse_long("kvmem run", name, val, 0, 1 << 30, &k))
				return -1;
			o->sampler.top_k = (int)k;
		} else if (FLAG("--top-p")) {
			if (cli_parse_float("kvmem run", name, val, &o->sampler.top_p))
				return -1;
		} else {
			fprintf(stderr, "kvmem run: unknown option '%s' (see kvmem run --script x --help)\n",
				name);
			return -1;
		}
#undef FLAG
	}
	if (!o->model || !o->script) {
		fprintf(stderr, "kvmem run: agent sessions need --model DIR and --script FILE\n");
		return -1;
	}
	if (o->policy && !kvmem_policy_find(o->policy)) {
		fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		return -1;
	}
	if (!o->chunk)
		o->chunk = 128;
	o->sampler.seed = o->seed;
	return 0;
}

/* ---- the script ------------------------------------------------------- */
static int script_error(const char *file, int line, const char *what)
{
	fprintf(stderr, "kvmem run: %s:%d: %s\n", file, line, what);
	return -1;
}

/* One line's object into op; ids checked against the vocabulary. */
static int parse_op(const kvmem_json *j, const char *file, int line, int vocab, uint64_t seed,
		    struct op *op)
{
	const kvmem_json *ap = kvmem_json_get(j, "append"), *ar = kvmem_json_get(j, "append_random");
	const kvmem_json *dc = kvmem_json_get(j, "decode"), *pin = kvmem_json_get(j, "pin");
	const kvmem_json *sd = kvmem_json_get(j, "seed");
	char msg[256];

	if (kvmem_json_typeof(j) != KVMEM_JSON_OBJECT)
		return script_error(file, line, "each line must be a JSON object");
	for (size_t i = 0; i < kvmem_json_len(j); i++) {
		const char *k = kvmem_json_key(j, i);

		if (strcmp(k, "append") && strcmp(k, "append_random") && strcmp(k, "decode") &&
		    strcmp(k, "pin") && strcmp(k, "seed")) {
			snprintf(msg, sizeof(msg), "unknown key \"%s\" (append, append_random, decode, pin, seed)", k);
			return script_error(file, line, msg);
		}
	}
	if (!!ap + !!ar + !!dc != 1)
		return script_error(file, line, "needs exactly one of \"append\", \"append_random\", \"decode\"");
	if (pin && kvmem_json_typeof(pin) != KVMEM_JSON_BOOL)
		return script_error(file, line, "\"pin\" must be true or false");
	if ((pin && dc) || (sd && !ar))
		return script_error(file, line, dc ? "\"pin\" goes with an append" :
				    "\"seed\" goes with \"append_random\"");
	op->line = line;
	op->pin = kvmem_json_bool(pin, 0);
	if (dc) {
		op->kind = OP_DECODE;
		op->n = kvmem_json_int(dc, -1);
		if (!kvmem_json_is_int(dc) || op->n < 0 || op->n > (1 << 30))
			return script_error(file, line, "\"decode\" wants a token count >= 0");
		return 0;
	}
	op->kind = OP_APPEND;
	if (ar) {
		uint64_t rng;

		op->n = kvmem_json_int(ar, -1);
		if (!kvmem_json_is_int(ar) || op->n < 1 || op->n > (1 << 28))
			return script_error(file, line, "\"append_random\" wants a token count >= 1");
		if (sd && (!kvmem_json_is_int(sd) || kvmem_json_int(sd, -1) < 0))
			return script_error(file, line, "\"seed\" wants an integer >= 0");
		rng = kvmem_rng_seed(sd ? (uint64_t)kvmem_json_int(sd, 0) : seed * 1000003u + line);
		op->ids = malloc(sizeof(int32_t) * op->n);
		if (!op->ids)
			return script_error(file, line, "out of memory");
		for (int64_t i = 0; i < op->n; i++)
			op->ids[i] = (int32_t)(kvmem_rng_uniform(&rng) * vocab);
		return 0;
	}
	op->n = (int64_t)kvmem_json_len(ap);
	if (kvmem_json_typeof(ap) != KVMEM_JSON_ARRAY || op->n < 1)
		return script_error(file, line, "\"append\" wants a non-empty array of token ids");
	op->ids = malloc(sizeof(int32_t) * op->n);
	if (!op->ids)
		return script_error(file, line, "out of memory");
	for (int64_t i = 0; i < op->n; i++) {
		const kvmem_json *t = kvmem_json_at(ap, (size_t)i);
		int64_t id = kvmem_json_int(t, -1);

		if (!kvmem_json_is_int(t) || id < 0 || id >= vocab) {
			snprintf(msg, sizeof(msg), "token %lld of \"append\" is not an id in 0..%d",
				 (long long)i, vocab - 1);
			return script_error(file, line, msg);
		}
		op->ids[i] = (int32_t)id;
	}
	return 0;
}

static void free_ops(struct op *ops, int n)
{
	for (int i = 0; i < n; i++)
		free(ops[i].ids);
	free(ops);
}

static int read_script(const char *file, int vocab, uint64_t seed, struct op **out, int *n_out)
{
	FILE *f = fopen(file, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	struct op *ops = NULL;
	int n = 0, cap_ops = 0, lineno = 0, rc = 0;

	if (!f) {
		fprintf(stderr, "kvmem run: %s: %s\n", file, strerror(errno));
		return -1;
	}
	while (!rc && (len = getline(&line, &cap, f)) >= 0) {
		char name[4200];
		kvmem_json *j;
		size_t k;

		lineno++;
		for (k = 0; k < (size_t)len && strchr(" \t\r\n", line[k]); k++)
			;
		if (k == (size_t)len)
			continue;
		snprintf(name, sizeof(name), "%s:%d", file, lineno);
		if (!(j = kvmem_json_parse(line, (size_t)len, name))) {
			fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
			rc = -1;
			break;
		}
		if (n == cap_ops) {
			struct op *t = realloc(ops, sizeof(*ops) * (cap_ops = cap_ops ? 2 * cap_ops : 16));

			if (!t) {
				kvmem_json_free(j);
				rc = script_error(file, lineno, "out of memory");
				break;
			}
			ops = t;
		}
		memset(&ops[n], 0, sizeof(ops[n]));
		rc = parse_op(j, file, lineno, vocab, seed, &ops[n]);
		n++;
		kvmem_json_free(j);
	}
	free(line);
	fclose(f);
	if (!rc && n == 0)
		rc = script_error(file, lineno, "the script holds no steps");
	if (rc) {
		free_ops(ops, n);
		return -1;
	}
	*out = ops;
	*n_out = n;
	return 0;
}

/* ---- the full-context twin ------------------------------------------ */
static int twin_grow(struct twin *t, int need)
{
	kvmem_kvcache nk;
	int cap = t->kv.cap ? t->kv.cap : 1024;

	if (need <= t->kv.cap)
		return 0;
	while (cap < need)
		cap *= 2;
	if (kvmem_kvcache_init(&nk, t->c, cap))
		return -1;
	for (int l = 0; l < t->c->n_layers && t->kv.len; l++)
		for (int h = 0; h < t->c->n_kv_heads; h++) {
			memcpy(kvmem_kv_k(&nk, l, h, 0), kvmem_kv_k(&t->kv, l, h, 0),
			       sizeof(float) * t->kv.len * t->c->head_dim);
			memcpy(kvmem_kv_v(&nk, l, h, 0), kvmem_kv_v(&t->kv, l, h, 0),
			       sizeof(float) * t->kv.len * t->c->head_dim);
		}
	nk.len = t->kv.len;
	kvmem_kvcache_free(&t->kv);
	t->kv = nk;
	return 0;
}

static void on_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct run *r = arg;
	struct twin *t = &r->tw;
	size_t cnt;

	r->st.forwards++;
	if (!r->o->check_exact || t->failed)
		return;
	cnt = (size_t)n * t->c->vocab;
	if (twin_grow(t, t->kv.len + n) ||
	    kvmem_forward(t->e, &t->kv, tok, n, t->logits, 1, NULL)) {
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

static void print_step(const struct cli *o, kvmem_session *s, int step, const struct op *op,
		       const struct step *st, const int32_t *out, double ms)
{
	const kvmem_plan *p = kvmem_session_plan(s);
	int64_t view = p->view_tokens, tail = kvmem_session_view(s)->len - view;

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
static int workspace_commit(kvmem_page_source *src, kvmem_session *s)
{
	return pager_cli_commit(src, s);
}

/* ---- the run ------------------------------------------------------------ */
static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int run_script(struct run *r, kvmem_session *s, kvmem_page_source *ws,
		      const struct op *ops, int n_ops)
{
	const struct cli *o = r->o;
	int exact_failed = 0;

	for (int i = 0; i < n_ops; i++) {
		const struct op *op = &ops[i];
		int32_t *out = NULL;
		double t0 = now_ms();
		int rc;

		memset(&r->st, 0, sizeof(r->st));
		if (op->kind == OP_APPEND) {
			rc = kvmem_session_append(s, op->ids, op->n, op->pin);
		} else {
			out = malloc(sizeof(int32_t) * (op->n ? op->n : 1));
			rc = !out ? kvmem_error(ENOMEM, "out of memory") : kvmem_session_select(s);
			if (!rc)
				rc = kvmem_session_decode(s, (int)op->n, &o->sampler, out);
		}
		if (!rc && ws)
			rc = workspace_commit(ws, s);
		if (rc) {
			fprintf(stderr, "kvmem run: %s:%d: %s\n", o->script, op->line, kvmem_last_error());
			free(out);
			return 1;
		}
		print_step(o, s, i + 1, op, &r->st, out, now_ms() - t0);
		free(out);
		if (o->check_exact && r->tw.failed)
			return 1;
		/* The budget held everything: the view was the identity all along. */
		if (o->check_exact && r->st.differ &&
		    (!o->budget || o->budget >= kvmem_session_tokens(s))) {
			fprintf(stderr, "kvmem run: check-exact: step %d (line %d): %lld forward passes "
				"differ from full context (max |diff| %g) although the budget %lld holds "
				"the whole workspace (%lld tokens)\n", i + 1, op->line,
				(long long)r->st.differ, r->st.max_diff, (long long)o->budget,
				(long long)kvmem_session_tokens(s));
			exact_failed = 1;
		}
		fflush(stdout);
	}
	return exact_failed;
}

int session_main(int argc, char **argv)
{
	struct cli o;
	struct run r = { .o = &o };
	struct op *ops = NULL;
	int n_ops = 0, rc = 1;
	kvmem_config cfg;
	kvmem_model *m = NULL;
	kvmem_engine *e = NULL;
	kvmem_session *s = NULL;
	kvmem_session_opts so;
	kvmem_page_source wsrc = { 0 };
	int32_t *adopt_ids = NULL;
	int64_t n_adopt = 0;
	kvmem_session_stats ss;

	switch (parse_args(argc, argv, &o)) {
	case 1:
		return 0;
	case -1:
		return EXIT_USAGE;
	}
	if (kvmem_config_load(&cfg, o.model)) {
		fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		return 1;
	}
	if (read_script(o.script, cfg.vocab, o.seed, &ops, &n_ops))
		return EXIT_USAGE;
	if (kvmem_model_load(o.model, &m) || !(e = kvmem_engine_create(m, (int)o.chunk)))
		goto err;
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
				   o.cache_policy, &wsrc, &adopt_ids, &n_adopt))
			goto err;
		so.source = &wsrc;
	}
	if (!(s = kvmem_session_create(e, &so)))
		goto err;
	if (n_adopt && pager_cli_adopt(s, adopt_ids, n_adopt))
		goto err;
	if (o.check_exact) {
		r.tw.e = e;
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
	rc = run_script(&r, s, o.workspace ? &wsrc : NULL, ops, n_ops);
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
	kvmem_page_source_destroy(&wsrc);
	if (pager_cli_close(o.json ? stderr : stdout)) {
		fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
		rc = 1;
	}
	free(adopt_ids);
	kvmem_kvcache_free(&r.tw.kv);
	free(r.tw.logits);
	kvmem_engine_free(e);
	kvmem_model_free(m);
	free_ops(ops, n_ops);
	return rc;
}
