// SPDX-License-Identifier: MIT
/*
 * kvmem bench batch: the library's batched decode beside the loop it
 * replaces, at 1..N sessions on one backend.
 *
 * For each session count B, two sets of B sessions get the same histories
 * (lengths spread over 0.5..1.4 x --context, so the views differ), and one
 * more session, alone, the first history. Then --tokens greedy steps, each
 * timed three ways in turn: the lone session's one token (one conversation
 * decoding by itself), set A in a loop (kvmem_session_decode of one token,
 * one session after another) and set B batched (kvmem_session_decode_batch,
 * one forward for all). Printed: the aggregate rates from the fastest step
 * of each (on shared cores, the step nothing else disturbed) and from the
 * median step, the batch against the loop and against the lone session
 * (measured in the same steps, so the machine's load of the moment is in
 * both), and whether the two sets drew the very same tokens (batch
 * invariance: they must). The histories go in batched for set B
 * (kvmem_session_append_batch), round by round in turn with set A's
 * loop of appends: prefill's rates, loop against batch, each round of
 * the two timed back to back (on shared cores one set made after the
 * other met another load).
 *
 * Where a batched step's time goes (the JSON's "batch_*_ms" fields, means
 * over the steps, from the sessions' own stats): the batched forward's
 * wall time (the sessions' forward_ns summed: each is charged its share);
 * the rest of the step, the host work around it per item (drawing each
 * token, room in each view, the rows handed to each writer, the waits),
 * of which the rows put away on the step's thread (store) and the waits
 * for the writers. Issue #26 read its ~0.7 ms per item from these.
 *
 * A decode step returns with its rows still on the writer threads
 * (user/session/writer.c); in the steps above the lone session's and the
 * loop's steps come between two batched ones, so a batch's rows are put
 * away meanwhile and its next step never waits for them. The "run_*"
 * fields are the honest pace of steps back to back: --tokens more steps
 * of the lone session, then of the batch, each run timed whole with a
 * last kvmem_session_sync (every row put away). --rounds N repeats that
 * pair N times and prints the rounds' ratios (least, median, most): on
 * shared cores the lone step's pace drifts with what the machine's other
 * guests leave of the cache, by 20-30% between runs of one build here, and
 * one pair is one sample of it.
 *
 * Beside each row, the roofline of a step on this device, from the
 * ceilings the backend measures at the start (kvmem_backend_ceilings): the
 * bytes a step must read (every weight once for all its rows, each row's
 * view of K and V) over the copy rate, or its FLOPs (each row's matrix
 * products and attention) over the GEMM rate, whichever takes longer. B
 * rows over one row's floor is the most batching can give here: the
 * ceiling the measured batch / alone ratio is read against.
 */
#include <getopt.h>
#include <inttypes.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/backend_impl.h"	/* the weights' bytes */
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/session.h"
#include "bench_common.h"
#include "cli_util.h"
#include "cmd.h"
#include "embedded_model.h"

#define WHO "kvmem bench batch"
#define MAX_LIST 16
#define MAX_ROUNDS 100	/* --rounds */

struct opts {
	struct bench_model bm;
	int sessions[MAX_LIST], n_sessions;
	int context, tokens, chunk, json;
	int rounds;		/* --rounds: back-to-back pairs of runs */
	int no_loop;		/* --no-loop: no set A (half the memory) */
	double progress;	/* --progress: seconds between progress lines (0: none) */
	int64_t budget;
	uint64_t seed;
	uint32_t kv_dtype;	/* --kv-dtype: 0 (the backend's own) or KVMEM_DTYPE_FP8 */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem bench batch [options]\n"
		"\n"
		"Batched decode against the loop it replaces: B sessions on one backend decode\n"
		"one token each per step, one session after another (kvmem_session_decode)\n"
		"or all in one forward pass (kvmem_session_decode_batch), step by step beside\n"
		"one session decoding alone. Prints the aggregate rates, the batch's against\n"
		"the loop and against the lone session, and whether loop and batch drew the\n"
		"same tokens (they must: batch invariance). Beside each row, a step's\n"
		"roofline from the ceilings measured at the start: its bytes (the weights once,\n"
		"each view's K and V) over the copy rate or its FLOPs over the GEMM rate, and\n"
		"so the most B sessions can give over one on this device.\n"
		"\n"
		"  --model DIR        model directory (default: the embedded agentlang model)\n"
		"  --preset NAME      a published geometry (8b, ...) with random weights the\n"
		"                     backend makes (cuda only): the figures of a real size\n"
		"  --backend NAME     cpu, cuda or auto (default auto; cuda batches decode\n"
		"                     steps, prefill chunks go one by one)\n"
		"  --sessions LIST    session counts (default 1,8,32,64)\n"
		"  --context N        history tokens per session, spread over 0.5..1.4 x N\n"
		"                     (default 256)\n"
		"  --tokens N         decode steps, each timed for the loop and the batch in\n"
		"                     turn (default 32)\n"
		"  --budget N         each session's view budget in tokens (default 0:\n"
		"                     unlimited, the view holds the whole history)\n"
		"  --chunk N          prefill chunk (default 128)\n"
		"  --kv-dtype T       the views' KV: bf16 (default: the backend's own) or fp8\n"
		"                     (as kvmem run --kv-dtype); both sets and the lone\n"
		"                     session alike\n"
		"  --seed S           the histories' random token ids (default 1)\n"
		"  --rounds N         the back-to-back runs (--tokens steps of the lone\n"
		"                     session, then of the batch, each timed whole) N times\n"
		"                     in turn, with the rounds' ratios (default 1; 1..100);\n"
		"                     each round continues the histories: the views grow by\n"
		"                     --tokens a round\n"
		"  --no-loop          leave the loop's set of sessions out (the batch and the\n"
		"                     lone session only: half the memory, for long\n"
		"                     histories); batch invariance is then checked on the\n"
		"                     batch's first session against the lone one\n"
		"  --progress S       a line on stderr every S seconds while the histories\n"
		"                     go in (default 10; 0: none)\n"
		"  --quiet            no progress lines (--progress 0)\n"
		"  --json             one JSON object per row on stdout\n"
		"  --help             this text\n"
		"\n"
		"examples:\n"
		"  kvmem bench batch\n"
		"  kvmem bench batch --sessions 1,8 --context 1k --tokens 32\n"
		"  kvmem bench batch --sessions 1,8 --tokens 64 --rounds 5\n"
		"  kvmem bench batch --backend cuda --preset 8b --sessions 1,16,64 --context 1k\n"
		"  kvmem bench batch --backend cuda --preset 8b --sessions 1,16 --context 32k \\\n"
		"      --budget 4096 --chunk 2048 --no-loop\n"
		"  kvmem bench batch --backend cuda --preset 8b --sessions 1,16 --context 32k \\\n"
		"      --budget 4096 --chunk 2048 --no-loop --kv-dtype fp8\n");
}

static int parse_list(const char *s, int *out, int max)
{
	char *list = strdup(s), *save = NULL;
	int n = 0;

	if (!list)
		return -1;
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == max || cli_parse_int(WHO, "--sessions", t, 1, 4096, &out[n])) {
			free(list);
			return -1;
		}
		n++;
	}
	free(list);
	return n ? n : -1;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option opts[] = {
		BENCH_MODEL_OPTIONS,
		{ "sessions", required_argument, NULL, 'S' }, { "context", required_argument, NULL, 'C' },
		{ "tokens", required_argument, NULL, 'n' },
		{ "budget", required_argument, NULL, 'b' },   { "chunk", required_argument, NULL, 'c' },
		{ "seed", required_argument, NULL, 's' },     { "json", no_argument, NULL, 'j' },
		{ "no-loop", no_argument, NULL, 'L' },	      { "help", no_argument, NULL, 'h' },
		{ "progress", required_argument, NULL, 'P' }, { "quiet", no_argument, NULL, 'q' },
		{ "kv-dtype", required_argument, NULL, 'K' },
		{ "rounds", required_argument, NULL, 'R' },
		{ 0 },
	};
	int c;
	int64_t v;

	memset(o, 0, sizeof(*o));
	o->sessions[0] = 1, o->sessions[1] = 8, o->sessions[2] = 32, o->sessions[3] = 64;
	o->n_sessions = 4;
	o->context = 256;
	o->tokens = 32;
	o->rounds = 1;
	o->chunk = 128;
	o->seed = 1;
	o->progress = 10;
	cli_getopt_reset();
	while ((c = cli_getopt(WHO, argc, argv, opts)) != -1) {
		const char *name = cli_optname;
		int bad = 0;

		if (bench_model_opt(&o->bm, c, optarg))
			continue;
		switch (c) {
		case 'h': usage(stdout); return 1;
		case 'S': bad = (o->n_sessions = parse_list(optarg, o->sessions, MAX_LIST)) < 0; break;
		case 'C':
			bad = cli_parse_count(WHO, name, optarg, 1, 1 << 20, &v);
			o->context = (int)v;
			break;
		case 'n': bad = cli_parse_int(WHO, name, optarg, 1, 100000, &o->tokens); break;
		case 'R': bad = cli_parse_int(WHO, name, optarg, 1, MAX_ROUNDS, &o->rounds); break;
		case 'b': bad = cli_parse_count(WHO, name, optarg, 0, (int64_t)1 << 40, &o->budget); break;
		case 'c': bad = cli_parse_int(WHO, name, optarg, 1, 1 << 16, &o->chunk); break;
		case 's': bad = cli_parse_u64(WHO, name, optarg, &o->seed); break;
		case 'j': o->json = 1; break;
		case 'L': o->no_loop = 1; break;
		case 'P': bad = cli_parse_double(WHO, name, optarg, 0, 86400, &o->progress); break;
		case 'q': o->progress = 0; break;
		case 'K': bad = cli_parse_kv_dtype(WHO, name, optarg, &o->kv_dtype); break;
		default: return -1;
		}
		if (bad)
			return -1;
	}
	return cli_no_operands(WHO, argc, argv) ? -1 : 0;
}

/* One set of B sessions with their histories. */
struct set {
	kvmem_session **s;
	int32_t *out;		/* [tokens][B]: what each step drew */
	int b;
	int64_t *at;		/* [B]: history tokens in so far */
	kvmem_batch_item *it;	/* [B]: a round's items */
};

static void set_free(struct set *x)
{
	for (int i = 0; x->s && i < x->b; i++)
		kvmem_session_free(x->s[i]);
	free(x->s);
	free(x->out);
	free(x->at);
	free(x->it);
	memset(x, 0, sizeof(*x));
}

/* History i of a set: its length and ids (the same for both sets). */
static int64_t history_len(const struct opts *o, int i)
{
	return (int64_t)o->context * (8 + (i * 5) % 15) / 16;	/* 0.5 .. 1.4 x */
}

/* A set of b sessions, with no history yet. */
static int set_open(struct set *x, const struct opts *o, kvmem_backend *be, int b)
{
	kvmem_session_opts so;

	memset(x, 0, sizeof(*x));
	x->b = b;
	x->s = calloc((size_t)b, sizeof(*x->s));
	/* the interleaved steps' draws, then the rounds' */
	x->out = calloc((size_t)b * o->tokens * (1 + o->rounds), sizeof(*x->out));
	x->at = calloc((size_t)b, sizeof(*x->at));
	x->it = calloc((size_t)b, sizeof(*x->it));
	if (!x->s || !x->out || !x->at || !x->it) {
		set_free(x);
		return kvmem_error(ENOMEM, "out of memory for %d sessions", b);
	}
	kvmem_session_opts_default(&so);
	so.budget = o->budget;
	so.chunk = o->chunk;
	for (int i = 0; i < b; i++)
		if (!(x->s[i] = kvmem_session_create(be, &so))) {
			set_free(x);
			return -1;
		}
	return 0;
}

/* One round of a set's histories: every session's next chunk, one session
 * after another, or batched (one forward for the round). Seconds, 0 when
 * every history is in, or < 0. *tokens grows by the round's. */
static double set_round(struct set *x, const struct opts *o, const int32_t *ids, int batched,
			int64_t *tokens)
{
	double t0 = cli_now_s();
	int m = 0;

	for (int i = 0; i < x->b; i++) {
		int64_t left = history_len(o, i) - x->at[i];
		int k = left < o->chunk ? (int)left : o->chunk;

		if (k <= 0)
			continue;
		if (!batched && kvmem_session_append(x->s[i], ids + x->at[i], k, 0) < 0)
			return -1;
		x->it[m++] = (kvmem_batch_item){ .s = x->s[i], .tokens = ids + x->at[i], .n = k };
		x->at[i] += k;
		*tokens += k;
	}
	if (!m)
		return 0;
	if (batched && kvmem_session_append_batch(x->it, m) != 0) {
		for (int k = 0; k < m; k++)
			if (x->it[k].rc) {
				kvmem_error(-x->it[k].rc, "%s", x->it[k].err);
				break;
			}
		return -1;
	}
	t0 = cli_now_s() - t0;
	return t0 > 0 ? t0 : 1e-9;	/* > 0: a round ran */
}

/* Long histories take minutes (16 of 16K-36K tokens on the H200): a line
 * on stderr every `every` seconds (--progress) while they go in, none for
 * a run shorter than that. */
struct progress {
	double t0, last, every;
	int64_t total;
	int b;
};

static void progress_note(struct progress *p, int64_t done, const char *what)
{
	double now = cli_now_s();

	if (p->every <= 0 || now - p->last < p->every)
		return;
	p->last = now;
	fprintf(stderr, "%s: %d session%s: %s %lld of %lld history tokens (%.0f%%), %.0f s\n", WHO,
		p->b, p->b == 1 ? "" : "s", what, (long long)done, (long long)p->total,
		p->total ? 100.0 * (double)done / (double)p->total : 100.0, now - p->t0);
}

/* The loop's set a and the batch's set x get their histories round by
 * round in turn (each round timed, so the two rates meet the machine's
 * same moments), then the lone session its own. Seconds of a and x in
 * pa, pb; the tokens of one set in *tokens; 0 or -1. */
static int sets_make(struct set *a, struct set *x, struct set *solo, const struct opts *o,
		     kvmem_backend *be, int b, const int32_t *ids, double *pa, double *pb,
		     int64_t *tokens)
{
	int64_t t1 = 0, ts = 0;
	double ra, rb, rs;
	struct progress pr = { .t0 = cli_now_s(), .every = o->progress, .b = b };

	pr.last = pr.t0;
	for (int i = 0; i < b; i++)
		pr.total += history_len(o, i);

	*pa = *pb = 0;
	*tokens = 0;
	memset(a, 0, sizeof(*a));
	memset(solo, 0, sizeof(*solo));
	if (!o->no_loop && set_open(a, o, be, b))
		return -1;
	if (set_open(x, o, be, b)) {
		set_free(a);
		return -1;
	}
	if (set_open(solo, o, be, 1))
		goto fail;
	do {
		ra = o->no_loop ? 0 : set_round(a, o, ids, 0, tokens);
		if (ra < 0 || (rb = set_round(x, o, ids, 1, &t1)) < 0)
			goto fail;
		*pa += ra;
		*pb += rb;
		progress_note(&pr, t1, o->no_loop ? "prefilled"
						  : "prefilled (the loop's set and the batch's each)");
	} while (o->no_loop ? rb > 0 : ra > 0);
	if (o->no_loop)
		*tokens = t1;
	pr.b = 1;
	pr.total = history_len(o, 0);
	while ((rs = set_round(solo, o, ids, 0, &ts)) > 0)
		progress_note(&pr, ts, "the lone session prefilled");
	if (rs < 0)
		goto fail;
	return 0;
fail:
	set_free(a);
	set_free(x);
	set_free(solo);
	return -1;
}

/* Steps [from, from + n) of a set; seconds, or < 0. */
static double decode(struct set *x, int from, int n, int batched)
{
	static const kvmem_sampler greedy = { 0 };
	double t0 = cli_now_s();

	for (int k = from; k < from + n; k++) {
		int32_t *out = x->out + (size_t)k * x->b;

		if (batched) {
			if (kvmem_session_decode_batch(x->s, x->b, NULL, out, NULL) != 0)
				return -1;
			continue;
		}
		for (int i = 0; i < x->b; i++)
			if (kvmem_session_decode(x->s[i], 1, &greedy, &out[i]) < 0)
				return -1;
	}
	return cli_now_s() - t0;
}

/* Steps [from, from + n) back to back, then every row put away; seconds,
 * or < 0. */
static double run(struct set *x, int from, int n, int batched)
{
	double t0 = cli_now_s();

	if (decode(x, from, n, batched) < 0)
		return -1;
	for (int i = 0; i < x->b; i++)
		if (kvmem_session_sync(x->s[i]) < 0)
			return -1;
	return cli_now_s() - t0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The sums of a set's sessions' stats: forward, store, writer wait (ns). */
static void set_ns(const struct set *x, int64_t *ns)
{
	ns[0] = ns[1] = ns[2] = 0;
	for (int i = 0; i < x->b; i++) {
		kvmem_session_stats st;

		kvmem_session_get_stats(x->s[i], &st);
		ns[0] += st.forward_ns;
		ns[1] += st.store_ns;
		ns[2] += st.writer_wait_ns;
	}
}

/* One of the loop's figures as text: v in fmt, or where there is no loop
 * (--no-loop) "null" for JSON and "-" for the table. */
static void loop_fig(char *buf, size_t n, int have, const char *fmt, double v, int json)
{
	if (have)
		snprintf(buf, n, fmt, v);
	else
		snprintf(buf, n, "%s", json ? "null" : "-");
}

/* The median of n values (sorts them). */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A step's roofline: see the head of the file. */
struct roof {
	kvmem_ceilings ce;
	int ok;			/* the backend measured its ceilings */
	int w_elem;		/* bytes a weight */
	double kv_elem;		/* bytes a K or V value in a view */
};

static void roof_init(struct roof *r, kvmem_backend *be, const kvmem_config *c, uint32_t kv_dtype)
{
	memset(r, 0, sizeof(*r));
	r->ok = kvmem_backend_ceilings(be, &r->ce) == 0;
	r->w_elem = bench_weight_elem(be);
	r->kv_elem = bench_kv_elem(be, kv_dtype, c->head_dim);
}

/* The floor of one step over n rows whose views hold view[i] tokens, in
 * seconds; its bytes and FLOPs in *bytes, *flops. */
static double roof_step(const struct roof *r, const kvmem_config *c, const double *view, int n,
			double *bytes, double *flops)
{
	double tb, tf;

	*bytes = bench_decode_bytes(c, 0, r->w_elem, r->kv_elem);
	*flops = 0;
	for (int i = 0; i < n; i++) {
		*bytes += bench_decode_bytes(c, (int64_t)view[i], 0, r->kv_elem);
		*flops += bench_flops_per_token(c) + 2.0 * c->vocab * c->hidden +
			  4.0 * c->n_layers * c->n_heads * c->head_dim * view[i];
	}
	tb = *bytes / (r->ce.copy_gbps * 1e9);
	tf = *flops / (r->ce.matmul_tflops * 1e12);
	return tb > tf ? tb : tf;
}

/* Each session's view length (tokens), added into v. */
static void views_add(const struct set *x, double *v)
{
	for (int i = 0; i < x->b; i++)
		v[i] += (double)kvmem_session_view_len(x->s[i]);
}

int bench_batch(int argc, char **argv)
{
	struct opts o;
	const kvmem_model *m;
	kvmem_backend *be = NULL;
	char model_path[4096];
	int32_t *ids = NULL;
	double *lo = NULL, *la = NULL, *lb = NULL, *vb = NULL;
	int rc = 1, usage_err, most = 0;
	struct roof roof;

	switch (parse_args(argc, argv, &o)) {
	case 1:
		return 0;
	case -1:
		return EXIT_USAGE;
	}
	if (!o.bm.dir && !o.bm.preset) {
		if (embedded_model_install(model_path, sizeof(model_path)) < 0) {
			fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
			return 1;
		}
		o.bm.dir = model_path;
	}
	if (!(m = bench_model_open(&o.bm, WHO, NULL, 0, &usage_err)))
		return usage_err ? EXIT_USAGE : 1;
	if (kvmem_backend_open(o.bm.backend, m,
			       &(kvmem_backend_opts){ .max_chunk = o.chunk, .kv_dtype = o.kv_dtype },
			       &be) < 0)
		goto err;
	roof_init(&roof, be, &m->cfg, o.kv_dtype);
	for (int k = 0; k < o.n_sessions; k++)
		most = o.sessions[k] > most ? o.sessions[k] : most;
	vb = malloc(sizeof(double) * (size_t)most);
	ids = malloc(sizeof(int32_t) * (size_t)(o.context * 3 / 2 + 1));
	lo = malloc(sizeof(double) * o.tokens);
	la = malloc(sizeof(double) * o.tokens);
	lb = malloc(sizeof(double) * o.tokens);
	if (!ids || !lo || !la || !lb || !vb) {
		kvmem_error(ENOMEM, "out of memory");
		goto err;
	}
	{
		uint64_t r = kvmem_rng_seed(o.seed);

		for (int i = 0; i <= o.context * 3 / 2; i++)
			ids[i] = (int32_t)(kvmem_rng_uniform(&r) * m->cfg.vocab);
	}
	if (!o.json) {
		printf("%s: model %s (%d layers, hidden %d), backend %s, %d threads, matmul %s", WHO,
		       m->dir, m->cfg.n_layers, m->cfg.hidden, kvmem_backend_name(be),
		       omp_get_max_threads(), kvmem_matmul_isa());
		if (be->ops->weight_bytes)	/* the cpu engine's bf16 copies or fp32 */
			printf(", weights %s", roof.w_elem == 2 ? "bf16" : "fp32");
		printf(", KV %s\n", o.kv_dtype == KVMEM_DTYPE_FP8 ? "fp8" : "the backend's own");
		if (roof.ok)	/* a step whose bytes the caches hold can beat it */
			printf("ceilings measured now on %s: copy %.0f GB/s (read + written), GEMM "
			       "%.2f TFLOP/s (%s)\na step's roofline: its bytes over the copy rate or "
			       "its FLOPs over the GEMM rate\n", roof.ce.device, roof.ce.copy_gbps,
			       roof.ce.matmul_tflops, roof.ce.matmul_type);
		else
			printf("ceilings: not measured (%s): no roofline\n", kvmem_last_error());
		printf("histories %d..%d tokens (budget %s), %d greedy steps: one session alone, "
		       "the loop, the batch, in turn\n", (int)history_len(&o, 0),
		       (int)history_len(&o, 14), o.budget ? "set" : "unlimited", o.tokens);
		printf("%-8s %9s %9s %9s %7s %7s | %9s %7s %7s | %8s %8s %5s\n", "", "fastest",
		       "step", "", "", "", "median", "", "", "prefill", "", "same");
		printf("%-8s %9s %9s %9s %7s %7s | %9s %7s %7s | %8s %8s %5s\n", "sessions",
		       "alone", "loop", "batch", "batch/", "batch/", "batch", "batch/", "batch/",
		       "loop", "batch", "draws");
		printf("%-8s %9s %9s %9s %7s %7s | %9s %7s %7s | %8s %8s %5s\n", "", "tok/s",
		       "tok/s", "tok/s", "loop", "alone", "tok/s", "loop", "alone", "tok/s", "tok/s",
		       "");
	}
	for (int k = 0; k < o.n_sessions; k++) {
		int b = o.sessions[k], same;
		struct set a, x, solo;
		int64_t pt;
		double pa, pb, to = 1e30, ta = 1e30, tb = 1e30, mo, ma, mb, sum_b = 0;
		int64_t ns0[3], ns1[3], ns2[3];
		double ro, rb, rr[MAX_ROUNDS], r_med;	/* rr: each round's batch / alone */
		/* the roofline: the views' mean lengths over the timed steps */
		double vs = 0, ra_ms = 0, rb_ms = 0, rbytes = 0, rflops = 0, abytes, aflops;

		if (sets_make(&a, &x, &solo, &o, be, b, ids, &pa, &pb, &pt))
			goto err;
		memset(vb, 0, sizeof(double) * (size_t)b);
		views_add(&x, vb);	/* the views at the first timed step and the last */
		views_add(&solo, &vs);
		set_ns(&x, ns0);
		for (int step = 0; step < o.tokens; step++) {
			double t0, t1, t2;

			if ((t0 = decode(&solo, step, 1, 0)) < 0 ||
			    (t1 = o.no_loop ? 1e30 : decode(&a, step, 1, 0)) < 0 ||
			    (t2 = decode(&x, step, 1, 1)) < 0) {
				set_free(&a);
				set_free(&x);
				set_free(&solo);
				goto err;
			}
			to = t0 < to ? t0 : to;
			ta = t1 < ta ? t1 : ta;
			tb = t2 < tb ? t2 : tb;
			lo[step] = t0;
			la[step] = t1;
			lb[step] = t2;
			sum_b += t2;
		}
		set_ns(&x, ns1);
		views_add(&x, vb);
		views_add(&solo, &vs);
		for (int i = 0; i < b; i++)
			vb[i] /= 2;
		vs /= 2;
		if (roof.ok) {
			ra_ms = 1e3 * roof_step(&roof, &m->cfg, &vs, 1, &abytes, &aflops);
			rb_ms = 1e3 * roof_step(&roof, &m->cfg, vb, b, &rbytes, &rflops);
		}
		/* Back to back, --rounds times: each round's ratio, and the
		 * runs' times summed (the rates over every round's steps). */
		ro = rb = 0;
		for (int r = 0; r < o.rounds; r++) {
			const int from = o.tokens * (1 + r);
			double t_o, t_b;

			if ((t_o = run(&solo, from, o.tokens, 0)) < 0 ||
			    (t_b = run(&x, from, o.tokens, 1)) < 0) {
				set_free(&a);
				set_free(&x);
				set_free(&solo);
				goto err;
			}
			ro += t_o;
			rb += t_b;
			rr[r] = b * t_o / t_b;
		}
		set_ns(&x, ns2);
		r_med = median(rr, o.rounds);	/* sorted: rr[0] the least */
		const double rn = (double)o.tokens * o.rounds;	/* each run's steps, all rounds */
		mo = median(lo, o.tokens);
		ma = median(la, o.tokens);
		mb = median(lb, o.tokens);
		if (o.no_loop) {	/* session 0 has the lone session's history */
			same = 1;
			for (int st = 0; st < (1 + o.rounds) * o.tokens; st++)
				same &= solo.out[st] == x.out[(size_t)st * b];
		} else
			same = !memcmp(a.out, x.out, sizeof(int32_t) * (size_t)b * o.tokens);
		/* The loop's figures, or (--no-loop) JSON null and "-". */
		char l_fast[32], l_med[32], l_pre[32], l_x[2][32];

		loop_fig(l_fast, sizeof(l_fast), !o.no_loop, o.json ? "%.1f" : "%9.1f", b / ta, o.json);
		loop_fig(l_med, sizeof(l_med), !o.no_loop, "%.1f", b / ma, o.json);
		loop_fig(l_pre, sizeof(l_pre), !o.no_loop, o.json ? "%.1f" : "%8.0f", pt / pa, o.json);
		loop_fig(l_x[0], sizeof(l_x[0]), !o.no_loop, "%6.2fx", ta / tb, 0);
		loop_fig(l_x[1], sizeof(l_x[1]), !o.no_loop, "%6.2fx", ma / mb, 0);
		/* The process's peak resident memory so far (the histories'
		 * pages live in host memory): what bounds B x --context. */
		struct rusage ru;
		double rss_gb = getrusage(RUSAGE_SELF, &ru) ? 0 : ru.ru_maxrss / 1048576.0;
		/* The roofline's figures, or JSON null where the ceilings were not
		 * measured. */
		char r_fig[4][32];

		loop_fig(r_fig[0], sizeof(r_fig[0]), roof.ok, "%.4f", ra_ms, 1);
		loop_fig(r_fig[1], sizeof(r_fig[1]), roof.ok, "%.4f", rb_ms, 1);
		loop_fig(r_fig[2], sizeof(r_fig[2]), roof.ok, "%.2f", roof.ok ? b * ra_ms / rb_ms : 0, 1);
		loop_fig(r_fig[3], sizeof(r_fig[3]), roof.ok, "%.0f", rbytes, 1);

		if (o.json)
			printf("{\"bench\":\"batch\",\"backend\":\"%s\",\"kv_dtype\":\"%s\","
			       "\"sessions\":%d,"
			       "\"alone_tokens_per_s\":%.1f,\"loop_tokens_per_s\":%s,"
			       "\"batch_tokens_per_s\":%.1f,\"median_alone_tokens_per_s\":%.1f,"
			       "\"median_loop_tokens_per_s\":%s,\"median_batch_tokens_per_s\":%.1f,"
			       "\"prefill_loop_tokens_per_s\":%s,\"prefill_batch_tokens_per_s\":%.1f,"
			       "\"batch_step_ms\":%.3f,\"batch_forward_ms\":%.3f,"
			       "\"batch_host_ms\":%.3f,\"batch_store_ms\":%.3f,"
			       "\"batch_writer_wait_ms\":%.3f,"
			       "\"run_alone_tokens_per_s\":%.1f,\"run_batch_tokens_per_s\":%.1f,"
			       "\"run_batch_step_ms\":%.3f,\"run_batch_forward_ms\":%.3f,"
			       "\"run_batch_writer_wait_ms\":%.3f,\"run_rounds\":%d,"
			       "\"run_ratio_min\":%.3f,\"run_ratio_median\":%.3f,"
			       "\"run_ratio_max\":%.3f,\"host_peak_rss_gb\":%.2f,"
			       "\"roofline_alone_step_ms\":%s,\"roofline_batch_step_ms\":%s,"
			       "\"roofline_batch_over_alone\":%s,\"roofline_batch_bytes\":%s,"
			       "\"same_tokens\":%s}\n", kvmem_backend_name(be),
			       o.kv_dtype == KVMEM_DTYPE_FP8 ? "fp8" : "own", b, 1 / to, l_fast,
			       b / tb, 1 / mo, l_med, b / mb, l_pre, pt / pb,
			       1e3 * sum_b / o.tokens, (ns1[0] - ns0[0]) / 1e6 / o.tokens,
			       1e3 * sum_b / o.tokens - (ns1[0] - ns0[0]) / 1e6 / o.tokens,
			       (ns1[1] - ns0[1]) / 1e6 / o.tokens, (ns1[2] - ns0[2]) / 1e6 / o.tokens,
			       rn / ro, b * rn / rb, 1e3 * rb / rn, (ns2[0] - ns1[0]) / 1e6 / rn,
			       (ns2[2] - ns1[2]) / 1e6 / rn, o.rounds, rr[0], r_med, rr[o.rounds - 1],
			       rss_gb, r_fig[0], r_fig[1], r_fig[2], r_fig[3], same ? "true" : "false");
		else {
			printf("%-8d %9.1f %9s %9.1f %7s %6.2fx | %9.1f %7s %6.2fx | %8s %8.0f "
			       "%5s\n%-8s back to back: alone %.1f tok/s, batch %.1f tok/s (%.2fx)", b,
			       1 / to, l_fast, b / tb, l_x[0], b * to / tb, b / mb, l_x[1],
			       b * mo / mb, l_pre, pt / pb, same ? "yes" : "NO", "", rn / ro,
			       b * rn / rb, b * ro / rb);
			if (o.rounds > 1)
				printf(", %d rounds: %.2fx-%.2fx, median %.2fx", o.rounds, rr[0],
				       rr[o.rounds - 1], r_med);
			printf("; host peak RSS %.2f GB\n", rss_gb);
		}
		if (!o.json && roof.ok)
			printf("%-8s roofline: one alone %.3f ms a step, %d batched %.3f ms (%.1f MB, "
			       "%.1f MFLOP): %d / one at most %.2fx by it; the median steps reach "
			       "%.0f%% (alone) and %.0f%% (batch) of its pace\n", "", ra_ms, b, rb_ms,
			       rbytes / 1e6, rflops / 1e6, b, b * ra_ms / rb_ms,
			       100 * ra_ms / (1e3 * mo), 100 * rb_ms / (1e3 * mb));
		fflush(stdout);
		set_free(&a);
		set_free(&x);
		set_free(&solo);
		if (!same) {
			fprintf(stderr, "%s: the batch drew other tokens than the %s at %d sessions: "
				"batch invariance is broken\n", WHO,
				o.no_loop ? "lone session (its first session)" : "loop", b);
			goto out;
		}
	}
	rc = 0;
	goto out;
err:
	fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
out:
	kvmem_backend_close(be);
	bench_model_close(&o.bm);
	free(ids);
	free(lo);
	free(la);
	free(lb);
	free(vb);
	return rc;
}
