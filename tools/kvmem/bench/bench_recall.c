// SPDX-License-Identifier: MIT
/*
 * kvmem bench recall: does the model answer about facts far outside its
 * native window when kvmem pages the right blocks back into its view?
 *
 * For workspace sizes from the native window W to 64x W (and beyond), needles
 * at several depths, every selection policy and full context (where it fits
 * the window): exact-match accuracy of the answers, how often the needle's
 * blocks were in the view and where they ranked, time per question and the
 * bytes of pages read per question (the view's and, for policies that read
 * keys, the scoring's). Workspaces come from agentlang (Documentation/agentlang.md)
 * with seeds from 1e9 up, never used in training (training: < 1e6).
 *
 * Per workspace the history is prefilled once (Mean-K selection during the
 * prefill, the same budget; --prefill-policy another), its pages kept in
 * host memory; each policy then adopts that history in a fresh session and
 * answers every question in turn:
 * append the question up to its answer marker, select (the question's
 * queries drive the policy), append the marker (its logits are the first
 * answer token's, computed over the new view), decode greedily to <end>.
 * Questions and answers stay in the history like an agent's turns.
 *
 * Which query drives selection matters: the trained model retrieves from the
 * answer marker "=", not from the key tokens. By default (--select-at ahead)
 * the whole question is first run over the current view only to take the
 * marker's query (kvmem_session_select_ahead), the session selects with it, and
 * then the question is appended over the new view, so the first answer token
 * is computed with the selected blocks in view. The older modes stay for
 * comparison: "key" selects with the key tokens' queries, "marker" selects
 * after appending the whole question (the first answer token then still
 * comes from the view before the selection).
 *
 * Full
 * context (no budget) needs the whole workspace inside the window: the
 * history is prefilled without a budget and each question adopts it afresh.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "agentlang/agentlang.h"
#include "backend/backend_impl.h"
#include "kvmem/kvmem.h"
#include "kvmem/lab.h"
#include "kvmem/model.h"
#include "session/inspect.h"
#include "cli_util.h"
#include "recall_rag.h"
#include "cmd.h"

#define MAX_LIST 32
#define MAX_POL 16
#define EVAL_SEED_MIN 1000000000ull
#define FULL "full"
#define RAG "rag"	/* retrieve lines, prefill them again (recall_rag.h) */

enum { SELECT_AHEAD, SELECT_KEY, SELECT_MARKER };

struct cell {
	int64_t n, ok;
	double inview;		/* sum over questions of the share of block sets
				 * (layers, for a per-layer policy) holding the needle */
	double secs, bytes;
	double first_secs;	/* question in to first answer token out, summed */
	int64_t moved, sels;	/* token-layers moved inside the view by the
				 * questions' selections, and those selections */
	int64_t *rank;		/* [questions]: the needle's rank among the scored
				 * blocks (0: the best), for the median */
};

struct opts {
	const char *model, *json, *csv, *backend;
	uint32_t kv_dtype;	/* --kv-dtype fp8: KVMEM_DTYPE_FP8; 0: the backend's own */
	double sizes[MAX_LIST], depths[MAX_LIST];
	int n_sizes, n_depths;
	const char *pol[MAX_POL];
	int n_pol;
	int questions, lookalikes, chunk, block, query_tokens, quiet, trace;
	const char *lab;		/* --lab DIR: record for kvmem lab */
	int select_at;			/* SELECT_AHEAD, SELECT_KEY, SELECT_MARKER */
	const kvmem_policy_ops *query_view;	/* --query-view: chooses the view each
						 * question's queries are read over */
	const char *prefill_policy;	/* --prefill-policy (meank): the workspace's views */
	int layout;			/* --layout: enum kvmem_layout (0: the default) */
	int64_t budget;
	uint64_t seed;
};

struct bench {
	struct opts o;
	kvmem_model *m;
	kvmem_backend *e;
	int W;			/* native window */
	int64_t budget, reserve;
	double page_bytes;	/* one block in one layer, K and V, bf16 */
	int64_t pages_read;	/* pages the sessions got from the source */
	struct cell *cells;	/* [size][depth][policy] */
	int64_t *ranks;		/* the cells' rank arrays, one allocation */
	double prefill_s;	/* budgeted prefills, for the progress line */
	int64_t prefill_tokens;
	FILE *json, *csv;
	kvmem_lab_recorder *rec;	/* recording the lab policy's session */
	uint64_t ws_seed;		/* the workspace being run */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem bench recall --model DIR [options]\n"
		"\n"
		"Exact-match recall of needles in agentlang workspaces of W (the model's\n"
		"window) up to 64x W, per needle depth, per selection policy and full\n"
		"context (where the workspace fits the window). Seeds >= 1e9: never seen\n"
		"in training. Documentation/agentlang.md describes the workspaces.\n"
		"\n"
		"  --model DIR        the trained agentlang model (required)\n"
		"  --sizes LIST       workspace sizes in multiples of W (default 1,4,16,64;\n"
		"                     1 means W - 16 so that a question fits)\n"
		"  --depths LIST      needle depths, 0 = oldest (default 0.1,0.3,0.5,0.7,0.9)\n"
		"  --questions N      questions per (size, depth, policy) cell (default 200)\n"
		"  --policies LIST    policies, 'full' and 'rag' (default: all of them): rag\n"
		"                     is the baseline without paging: the workspace's lines\n"
		"                     BM25 ranks best for the question, as many as fill the\n"
		"                     same budget, prefilled again with the question after\n"
		"  --budget N         view budget in tokens (default: W - 32 - max(chunk, W/8),\n"
		"                     a block multiple; the reserve takes the rest but 32)\n"
		"  --lookalikes K     look-alike lines per needle (default 4)\n"
		"  --seed S           first workspace seed (default 1000000000; >= 1e9)\n"
		"  --chunk N          prefill chunk (default 128)\n"
		"  --block N          tokens per block, a power of two 16..256 (default 32)\n"
		"  --backend NAME     compute backend: cpu (default: the published figures),\n"
		"                     cuda, or auto (cuda when there is a GPU)\n"
		"  --kv-dtype T       the KV attention reads: the backend's own (default) or\n"
		"                     fp8 (as kvmem run --kv-dtype)\n"
		"  --layout L         the view's layout in every budgeted session (the\n"
		"                     prefill's too): stable (default) or compact (kvmem run\n"
		"                     --help; recall.md's tables were measured compact)\n"
		"  --query-tokens N   query tokens that drive selection (default: 1 with\n"
		"                     ahead, the marker's; else the question's tokens)\n"
		"  --select-at WHERE  ahead (default): take the question's queries over the\n"
		"                     current view, select, then append the question over\n"
		"                     the new view; key: select after the question's key,\n"
		"                     then append the marker; marker: append the whole\n"
		"                     question, then select (the first answer token still\n"
		"                     comes from the view before the selection)\n"
		"  --query-view P     ahead only, a diagnostic: before each question's\n"
		"                     selection, the global policy P (lexical: one that\n"
		"                     reads token ids) selects ahead for it, so that each\n"
		"                     policy reads its query over the view P chose (one\n"
		"                     that holds the needle, with lexical) rather than the\n"
		"                     last question's: what a query that has seen the\n"
		"                     needle finds, as train.py's held-out ranks measure\n"
		"  --prefill-policy P the policy that chooses the views a workspace's\n"
		"                     prefill attends over, and so the context its keys and\n"
		"                     block summaries are computed in (default meank;\n"
		"                     recency: the newest tokens, one contiguous stretch)\n"
		"  --quick            smoke test: sizes 1,4, depths 0.25,0.75, 8 questions\n"
		"  --jsonl FILE       one JSON object per cell into FILE; --csv FILE the same\n"
		"                     as CSV\n"
		"  --quiet            no progress on stderr\n"
		"  --lab DIR          record the first policy's session per workspace for kvmem\n"
		"                     lab: DIR/s<size>-<seed>.ws (its history, a workspace)\n"
		"                     and .trace (selections, needles annotated)\n"
		"  --trace N          per question: the answer, the needle line (and the older\n"
		"                     line of its key, if any), the needle's rank and the N\n"
		"                     best-scored blocks as text (why a policy missed; full\n"
		"                     context: the answer and the lines)\n"
		"  --help             this text\n"
		"\n"
		"Columns: acc = exact-match answers; in-view = questions whose needle line\n"
		"was in the view; rank = median number of blocks scored above the needle's\n"
		"(0: first, whatever the budget); ms/q = a question's time, answer included;\n"
		"1st ms = question in to first answer token out (what an agent waits for);\n"
		"MB/q = pages read from the page source per question (view and key reads,\n"
		"bf16 K+V pages); mv/sel = tokens moved inside the view per selection (one\n"
		"layer's; the session's moved_tokens over layers and selections).\n\n"
		"examples:\n"
		"  kvmem bench recall --model models/agentlang --quick\n"
		"  kvmem bench recall --model models/agentlang --sizes 1,16 --policies full,refine \\\n"
		"      --questions 50 --csv recall.csv\n");
}

/* Comma-separated finite numbers (sizes, depths); the count, or -1. */
static int parse_list(const char *opt, const char *s, double *out, int max)
{
	char *list = strdup(s), *save = NULL;
	int n = 0;

	if (!list)
		return -1;
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == max)
			fprintf(stderr, "kvmem bench recall: %s takes at most %d values\n", opt, max);
		if (n == max || cli_parse_double("kvmem bench recall", opt, t, 0, 1e9, &out[n++])) {
			free(list);
			return -1;
		}
	}
	free(list);
	if (!n)
		fprintf(stderr, "kvmem bench recall: %s wants a comma-separated list, not '%s'\n", opt, s);
	return n ? n : -1;
}

/* Returns 0 to run, 1 after --help, -1 on bad usage (the message printed). */
static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },	{ "jsonl", required_argument, NULL, 'J' },
		{ "csv", required_argument, NULL, 'c' },	{ "sizes", required_argument, NULL, 'S' },
		{ "depths", required_argument, NULL, 'D' },	{ "select-at", required_argument, NULL, 'a' },
		{ "policies", required_argument, NULL, 'p' },	{ "questions", required_argument, NULL, 'q' },
		{ "lookalikes", required_argument, NULL, 'l' }, { "budget", required_argument, NULL, 'B' },
		{ "block", required_argument, NULL, 'b' },	{ "chunk", required_argument, NULL, 'k' },	{ "query-tokens", required_argument, NULL, 'Q' },
		{ "lab", required_argument, NULL, 'L' },	{ "trace", required_argument, NULL, 't' },	{ "seed", required_argument, NULL, 's' },
		{ "quick", no_argument, NULL, 'K' },		{ "quiet", no_argument, NULL, 'z' },
		{ "backend", required_argument, NULL, 'x' },	{ "help", no_argument, NULL, 'h' },
		{ "kv-dtype", required_argument, NULL, 'V' },
		{ "layout", required_argument, NULL, 'Y' },
		{ "query-view", required_argument, NULL, 'G' },
		{ "prefill-policy", required_argument, NULL, 'P' },
		{ 0 },
	};
	static const double sizes[] = { 1, 4, 16, 64 }, depths[] = { 0.1, 0.3, 0.5, 0.7, 0.9 };
	const char *w = "kvmem bench recall";
	char *pols = NULL;
	int c;

	memset(o, 0, sizeof(*o));
	o->n_sizes = 4;
	memcpy(o->sizes, sizes, sizeof(sizes));
	o->n_depths = 5;
	memcpy(o->depths, depths, sizeof(depths));
	o->questions = 200;
	o->lookalikes = 4;
	o->chunk = 128;
	o->block = KVMEM_BLOCK_DEFAULT;
	o->seed = EVAL_SEED_MIN;
	cli_getopt_reset();
	while ((c = cli_getopt(w, argc, argv, opts)) != -1) {
		const char *name = cli_optname;
		int bad = 0;

		switch (c) {
		case 'h': usage(stdout); return 1;
		case 'K':
			o->n_sizes = 2, o->sizes[0] = 1, o->sizes[1] = 4;
			o->n_depths = 2, o->depths[0] = 0.25, o->depths[1] = 0.75;
			o->questions = 8;
			break;
		case 'z': o->quiet = 1; break;
		case 'm': o->model = optarg; break;
		case 'Y': bad = cli_parse_layout(w, name, optarg, &o->layout); break;
		case 'x': o->backend = optarg; break;
		case 'V': bad = cli_parse_kv_dtype(w, name, optarg, &o->kv_dtype); break;
		case 'J': o->json = optarg; break;
		case 'c': o->csv = optarg; break;
		case 'p': pols = optarg; break;
		case 'S': bad = (o->n_sizes = parse_list(name, optarg, o->sizes, MAX_LIST)) < 0; break;
		case 'D': bad = (o->n_depths = parse_list(name, optarg, o->depths, MAX_LIST)) < 0; break;
		case 'a':
			if (!strcmp(optarg, "ahead"))
				o->select_at = SELECT_AHEAD;
			else if (!strcmp(optarg, "key"))
				o->select_at = SELECT_KEY;
			else if (!strcmp(optarg, "marker"))
				o->select_at = SELECT_MARKER;
			else {
				fprintf(stderr, "%s: --select-at wants ahead, key or marker, not '%s'\n", w,
					optarg);
				bad = 1;
			}
			break;
		case 'q': bad = cli_parse_int(w, name, optarg, 1, 1 << 20, &o->questions); break;
		case 'l': bad = cli_parse_int(w, name, optarg, 0, 16, &o->lookalikes); break;
		case 'B': bad = cli_parse_count(w, name, optarg, 1, INT32_MAX / 2, &o->budget); break;
		case 'k': bad = cli_parse_int(w, name, optarg, 1, 1 << 20, &o->chunk); break;
		case 'b':
			bad = cli_parse_int(w, name, optarg, KVMEM_BLOCK_MIN, KVMEM_BLOCK_MAX, &o->block);
			if (!bad && (o->block & (o->block - 1)))
				bad = fprintf(stderr, "%s: --block wants a power of two from %d to %d, not %d\n",
					      w, KVMEM_BLOCK_MIN, KVMEM_BLOCK_MAX, o->block) > 0;
			break;
		case 'Q': bad = cli_parse_int(w, name, optarg, 1, 4096, &o->query_tokens); break;
		case 't': bad = cli_parse_int(w, name, optarg, 1, 64, &o->trace); break;
		case 'L': o->lab = optarg; break;
		case 'P':
			o->prefill_policy = optarg;
			if (!kvmem_policy_find(optarg))
				bad = fprintf(stderr, "%s: --prefill-policy: %s\n", w,
					      kvmem_last_error()) > 0;
			break;
		case 'G':
			if (!(o->query_view = kvmem_policy_find(optarg)))
				bad = fprintf(stderr, "%s: --query-view: %s\n", w, kvmem_last_error()) > 0;
			else if (o->query_view->per_layer || (o->query_view->needs & ~(KVMEM_SUM_MEANK |
											KVMEM_NEED_TEXT)))
				bad = fprintf(stderr, "%s: --query-view wants a global policy that reads "
					      "Mean-K or token ids only (lexical, meank), not %s\n", w,
					      optarg) > 0;
			break;
		case 's': bad = cli_parse_u64(w, name, optarg, &o->seed); break;
		default: return -1;
		}
		if (bad)
			return -1;
	}
	if (cli_no_operands(w, argc, argv))
		return -1;
	if (o->query_view && o->select_at != SELECT_AHEAD) {
		fprintf(stderr, "%s: --query-view works with --select-at ahead only\n", w);
		return -1;
	}
	if (!o->model) {
		fprintf(stderr, "kvmem bench recall: --model DIR is required\n");
		return -1;
	}
	if (o->seed < EVAL_SEED_MIN) {
		fprintf(stderr, "kvmem bench recall: seed %llu is below 1e9: training seeds are "
			"below 1e6, evaluation seeds from 1e9 up\n", (unsigned long long)o->seed);
		return -1;
	}
	for (int i = 0; i < o->n_sizes; i++)
		if (!(o->sizes[i] >= 1) || o->sizes[i] > 65536)
			return fprintf(stderr, "kvmem bench recall: size %g is not in 1..65536\n",
				       o->sizes[i]), -1;
	for (int i = 0; i < o->n_depths; i++)
		if (!(o->depths[i] >= 0 && o->depths[i] <= 1))
			return fprintf(stderr, "kvmem bench recall: depth %g is not in 0..1\n",
				       o->depths[i]), -1;
	if (pols) {
		for (char *t = strtok(pols, ","); t && o->n_pol < MAX_POL; t = strtok(NULL, ",")) {
			if (strcmp(t, FULL) && strcmp(t, RAG) && !kvmem_policy_find(t)) {
				fprintf(stderr, "kvmem bench recall: %s\n", kvmem_last_error());
				return -1;
			}
			o->pol[o->n_pol++] = t;
		}
	} else {
		o->pol[o->n_pol++] = FULL;
		for (int i = 0; kvmem_policies[i] && o->n_pol < MAX_POL; i++)
			o->pol[o->n_pol++] = kvmem_policies[i]->name;
		if (o->n_pol < MAX_POL)
			o->pol[o->n_pol++] = RAG;
	}
	return 0;
}

/* The model must speak this kvmem's agentlang. */
static int check_vocab(const char *dir, const kvmem_config *c)
{
	int rc = agentlang_check_model(dir, c);

	if (rc == 1)
		fprintf(stderr, "kvmem bench recall: note: %s/config.json has no kvmem_vocab_hash; "
			"assuming it was trained on this vocabulary\n", dir);
	return rc < 0 ? rc : 0;
}

static int64_t workspace_len(const struct bench *b, double size)
{
	return size <= 1 ? b->W - 16 : (int64_t)llround(size * b->W);
}

/* Needles one workspace of n tokens may hold (agentlang's limit, with room). */
static int needles_per_ws(const struct bench *b, int64_t n)
{
	int64_t m = n / (2 * (96 + 16 * (b->o.lookalikes + 1))) * 9 / 10;

	return m < 1 ? 1 : m > 1000 ? 1000 : (int)m;
}

static kvmem_session *session(struct bench *b, const char *policy, int64_t budget,
			    const kvmem_page_source *src, int qtok)
{
	kvmem_session_opts so;

	kvmem_session_opts_default(&so);
	so.block = b->o.block;
	so.budget = budget;
	so.reserve = budget ? b->reserve : -1;
	so.chunk = b->o.chunk;
	so.query_tokens = qtok;
	so.policy = policy;
	so.seed = b->o.seed;
	so.layout = b->o.layout;
	so.source = src;
	if (b->rec && kvmem_lab_record_attach(b->rec, &so))
		return NULL;
	return kvmem_session_create(b->e, &so);
}

static int prefill(struct bench *b, const agentlang_transcript *ws, int64_t budget,
		   kvmem_page_source *src)
{
	const kvmem_config *c = &b->m->cfg;
	kvmem_session *s;

	if (kvmem_page_source_mem(src, c->n_layers, c->n_kv_heads, c->head_dim, b->o.block))
		return -1;
	s = session(b, b->o.prefill_policy ? b->o.prefill_policy : "meank", budget, src, 4);
	if (!s || kvmem_session_append(s, ws->ids, ws->n_ids, 0)) {
		kvmem_session_free(s);
		kvmem_page_source_destroy(src);
		return kvmem_error_prefix("prefill of %lld tokens", (long long)ws->n_ids);
	}
	kvmem_session_free(s);
	return 0;
}

/*
 * Where the needle's line ranked in the last selection: for each block set,
 * the blocks scored above the worst-scored block of the line; the mean over
 * sets. It says how far a policy is from finding the needle whatever the
 * budget (0: first).
 */
static int64_t needle_rank(const kvmem_session *s, int block, const agentlang_question *q)
{
	int n_sets;
	int64_t nb;
	const float *sc = kvmem_session_scores(s, &n_sets, &nb);

	/* A needle not wholly scored yet has no rank here. */
	if (!sc || (q->needle_end - 1) / block >= nb)
		return -1;
	return kvmem_lab_needle_rank(sc, n_sets, nb, block, q->needle_pos, q->needle_end);
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

/* Median needle rank of a cell (-1: none recorded, e.g. full context, or no
 * memory to sort them). */
static int64_t median_rank(const struct cell *c)
{
	int64_t *v = malloc(sizeof(*v) * (c->n ? c->n : 1)), med = -1;
	int64_t m = 0;

	for (int64_t i = 0; v && i < c->n; i++)
		if (c->rank[i] >= 0)
			v[m++] = c->rank[i];
	if (m) {
		qsort(v, m, sizeof(*v), cmp_i64);
		med = v[m / 2];
	}
	free(v);
	return med;
}

/*
 * The policies' sessions read pages through this wrapper of the host-memory
 * source, which counts them: rematerialising the view and, for refine and
 * oracle, reading keys to score them. It is the traffic the tiered pager
 * would serve from host memory or NVMe.
 */
struct counted {
	const kvmem_page_source *inner;
	int64_t *pages;
};

static int counted_write(void *ctx, int64_t b, int l, int t0, int n, const float *k,
			 const float *v)
{
	const struct counted *c = ctx;

	return c->inner->ops->write(c->inner->ctx, b, l, t0, n, k, v);
}

static int counted_get(void *ctx, int64_t b, int l, kvmem_page *pg)
{
	const struct counted *c = ctx;

	(*c->pages)++;
	return c->inner->ops->get(c->inner->ctx, b, l, pg);
}

static void counted_put(void *ctx, int64_t b, int l)
{
	const struct counted *c = ctx;

	c->inner->ops->put(c->inner->ctx, b, l);
}

static const kvmem_page_source_ops counted_ops = {
	.name = "counted", .write = counted_write, .get = counted_get, .put = counted_put,
};

/* ids[a..e) as one line of text, clipped to the workspace. */
static void print_span(const int32_t *ids, int64_t n, int64_t a, int64_t e)
{
	char buf[2048];

	a = a < 0 ? 0 : a;
	e = e > n ? n : e;
	if (agentlang_decode(ids + a, (size_t)(e - a), buf, sizeof(buf)) < 0)
		snprintf(buf, sizeof(buf), "(undecodable)");
	for (char *c = buf; *c; c++)
		*c = *c == '\n' ? '|' : *c;
	printf("%s\n", buf);
}

struct scored {
	float score;
	int64_t block;
};

/* Best first; ties to the later block, as the planner breaks them. */
static int by_score(const void *a, const void *b)
{
	const struct scored *x = a, *y = b;

	if (x->score != y->score)
		return x->score < y->score ? 1 : -1;
	return (x->block < y->block) - (x->block > y->block);
}

/* The line holding position p: its first token, and one past its newline. */
static void line_of(const int32_t *ids, int64_t n, int64_t p, int64_t *a, int64_t *e)
{
	for (*a = p; *a > 0 && ids[*a - 1] != AGENTLANG_NL; --*a)
		;
	for (*e = p; *e < n && ids[*e] != AGENTLANG_NL; ++*e)
		;
	++*e;
}

/* --trace, a wrong answer: the latest line of the history that holds the
 * answered value (an older printing of the key, a look-alike's, a sibling
 * key's), or that none does. */
static void trace_source(const int32_t *ids, int64_t n, const int32_t *gen, int n_gen,
			 const agentlang_question *q)
{
	const int len = n_gen > 0 && gen[n_gen - 1] == AGENTLANG_END ? n_gen - 1 : n_gen;

	/* the history before the question and the answer, which end the session */
	const int64_t h = n - q->n_ids - n_gen;

	if (agentlang_exact_match(q, gen, n_gen) || len <= 0)
		return;
	for (int64_t i = h - len; i >= 0; i--) {
		if (memcmp(ids + i, gen, sizeof(*gen) * (size_t)len))
			continue;
		int64_t a, e;

		line_of(ids, n, i, &a, &e);
		printf("  answered from %lld: ", (long long)a);
		print_span(ids, n, a, e);
		return;
	}
	printf("  answered from: no line of the history\n");
}

/* --trace: the question, its answer, the needle's rank and the best blocks
 * (full context: no rank, no blocks). */
static void trace(const struct bench *b, const kvmem_session *s, const agentlang_question *q,
		  const int32_t *gen, int n_gen, int64_t rank, int full)
{
	const int32_t *ids = kvmem_session_token_ids(s);
	int64_t n = kvmem_session_tokens(s), nb, B = b->o.block;
	int sets;
	const float *sc = kvmem_session_scores(s, &sets, &nb);
	char want[256], got[256];

	agentlang_decode(q->answer, q->n_answer, want, sizeof(want));
	agentlang_decode(gen, n_gen, got, sizeof(got));
	printf("trace: needle at %lld (block %lld), rank %lld, want '%s', got '%s'\n  needle: ",
	       (long long)q->needle_pos, (long long)(q->needle_pos / B), (long long)rank, want, got);
	print_span(ids, n, q->needle_pos, q->needle_end);
	if (q->stale_pos >= 0) {	/* the older value the question must not answer */
		int64_t a, e;

		line_of(ids, n, q->stale_pos, &a, &e);
		printf("  older: ");
		print_span(ids, n, a, e);
	}
	trace_source(ids, n, gen, n_gen, q);
	struct scored *order = sc && !full ? malloc(sizeof(*order) * nb) : NULL;

	/* The first block set's best blocks (the only set of a global policy). */
	for (int64_t i = 0; order && i < nb; i++)
		order[i] = (struct scored){ sc[i], i };
	if (order)
		qsort(order, nb, sizeof(*order), by_score);
	for (int k = 0; order && k < b->o.trace && k < nb; k++) {
		printf("  #%d block %lld (%.4g): ", k, (long long)order[k].block, order[k].score);
		print_span(ids, n, order[k].block * B, (order[k].block + 1) * B);
	}
	free(order);
}

/* One question: ask, select, answer. Adds to the cell. */
static int ask(struct bench *b, kvmem_session *s, const agentlang_question *q, int full,
	       struct cell *cl)
{
	int32_t gen[AGENTLANG_MAX_ANSWER], nl = AGENTLANG_NL;
	int n = 0;
	double t0 = cli_now_s(), seen = 1.0;
	int64_t pages0 = b->pages_read;
	kvmem_session_stats st0, st1;

	cl->rank[cl->n] = -1;

	int ahead = b->o.select_at == SELECT_AHEAD;
	int head = ahead ? 0 : b->o.select_at == SELECT_MARKER ? q->n_ids : q->n_ids - 1;

	if (kvmem_session_append(s, q->ids, head, 0))
		return -1;
	if (!full) {
		/* For the lab: the needle, and the question's key tokens (between
		 * '?' and '=') as queries a replay may select with. */
		int64_t at = kvmem_session_tokens(s) - head;

		if (b->rec && (kvmem_lab_record_span(b->rec, KVMEM_LAB_SPAN_NEEDLE, q->needle_pos,
						     q->needle_end, "needle") ||
			       kvmem_lab_record_span(b->rec, KVMEM_LAB_SPAN_QUERY, at + 1,
						     at + q->n_ids - 1, "key")))
			return -1;
		if (b->o.query_view &&
		    kvmem_session_select_ahead_with(s, b->o.query_view, q->ids, q->n_ids))
			return -1;
		kvmem_session_get_stats(s, &st0);
		if (ahead ? kvmem_session_select_ahead(s, q->ids, q->n_ids) : kvmem_session_select(s))
			return -1;
		kvmem_session_get_stats(s, &st1);
		cl->moved += st1.moved_tokens - st0.moved_tokens;
		cl->sels += st1.selections - st0.selections;
		const kvmem_plan *p = kvmem_session_plan(s);
		seen = kvmem_plan_holds_span(p, b->o.block, q->needle_pos, q->needle_end);
		cl->rank[cl->n] = needle_rank(s, b->o.block, q);
	}
	if (head < q->n_ids && kvmem_session_append(s, q->ids + head, q->n_ids - head, 0))
		return -1;
	while (n < AGENTLANG_MAX_ANSWER) {
		if (kvmem_session_decode(s, 1, NULL, &gen[n]))
			return -1;
		if (!n)
			cl->first_secs += cli_now_s() - t0;
		if (gen[n++] == AGENTLANG_END)
			break;
	}
	cl->secs += cli_now_s() - t0;
	cl->bytes += (double)(b->pages_read - pages0) * b->page_bytes;
	cl->n++;
	cl->ok += agentlang_exact_match(q, gen, n);
	if (b->o.trace)	/* full context: the answer and the needle, no blocks */
		trace(b, s, q, gen, n, cl->rank[cl->n - 1], full);
	cl->inview += seen;
	/* The next question starts a line, as in the language. */
	return kvmem_session_append(s, &nl, 1, 0);
}

/* The greedy answer token after `logits`. */
static int32_t greedy_token(const float *logits, int vocab)
{
	int32_t best = 0;

	for (int i = 1; i < vocab; i++)
		best = logits[i] > logits[best] ? i : best;
	return best;
}

/*
 * One question the way a retrieval pipeline answers it: the lines BM25
 * ranks best within the budget, in history order, after <bos>, the
 * question after them, all prefilled over an empty view v, then the
 * answer decoded greedily. The needle counts as in view when its line's
 * tokens are among the retrieved ones.
 */
static int rag_ask(struct bench *b, const struct rag_index *x, const agentlang_transcript *ws,
		   kvmem_view *v, int32_t *prompt, float *logits, const agentlang_question *q,
		   struct cell *cl)
{
	const int vocab = b->m->cfg.vocab;
	int32_t gen[AGENTLANG_MAX_ANSWER];
	int64_t n, nl = q->needle_end - q->needle_pos;
	int k = 0, seen = 0;
	double t0 = cli_now_s();

	prompt[0] = AGENTLANG_BOS;
	n = rag_retrieve(x, ws->ids + 1, q->ids, q->n_ids, b->budget, prompt + 1);
	if (n < 0)
		return kvmem_error(ENOMEM, "rag: out of memory");
	for (int64_t i = 1; !seen && i + nl <= n + 1; i++)
		seen = !memcmp(prompt + i, ws->ids + q->needle_pos, sizeof(int32_t) * nl);
	memcpy(prompt + 1 + n, q->ids, sizeof(int32_t) * q->n_ids);
	n += 1 + q->n_ids;
	if (kvmem_backend_view_clear(b->e, v) < 0)
		return -1;
	for (int64_t at = 0; at < n; at += b->o.chunk) {
		int c = n - at < b->o.chunk ? (int)(n - at) : b->o.chunk;

		if (kvmem_backend_append(b->e, v, prompt + at, c, logits, 0) < 0)
			return -1;
	}
	while (k < AGENTLANG_MAX_ANSWER) {
		gen[k] = greedy_token(logits, vocab);
		if (!k)
			cl->first_secs += cli_now_s() - t0;
		if (gen[k++] == AGENTLANG_END || k == AGENTLANG_MAX_ANSWER)
			break;
		if (kvmem_backend_append(b->e, v, &gen[k - 1], 1, logits, 0) < 0)
			return -1;
	}
	cl->secs += cli_now_s() - t0;
	cl->rank[cl->n] = -1;
	cl->n++;
	cl->ok += agentlang_exact_match(q, gen, k);
	cl->inview += seen;
	return 0;
}

/* Every question of one workspace answered by retrieval (RAG). */
static int run_rag(struct bench *b, const agentlang_transcript *ws, const int *q_depth,
		   struct cell *cl)
{
	const int np = b->o.n_pol;
	struct rag_index x;
	kvmem_view *v = NULL;
	int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(b->budget + AGENTLANG_MAX_QUESTION + 2));
	float *logits = malloc(sizeof(float) * (size_t)b->m->cfg.vocab);
	int rc;

	if (!prompt || !logits || rag_index_build(&x, ws->ids + 1, ws->n_ids - 1, b->m->cfg.vocab,
						    AGENTLANG_NL) < 0) {
		free(prompt);
		free(logits);
		return kvmem_error(ENOMEM, "rag: out of memory");
	}
	rc = kvmem_backend_view_new(b->e, b->budget + AGENTLANG_MAX_QUESTION + AGENTLANG_MAX_ANSWER + 2,
				    &v);
	for (int i = 0; i < ws->n_q && !rc; i++)
		rc = rag_ask(b, &x, ws, v, prompt, logits, &ws->q[i], cl + (size_t)q_depth[i] * np);
	kvmem_backend_view_free(b->e, v);
	rag_index_free(&x);
	free(prompt);
	free(logits);
	return rc;
}

/* Every policy over one workspace; q_depth[i] is question i's depth index. */
static int run_workspace(struct bench *b, int si, const agentlang_transcript *ws, const int *q_depth)
{
	const int nd = b->o.n_depths, np = b->o.n_pol;
	int64_t n = ws->n_ids;
	int fits = n + 16 <= b->W;
	kvmem_page_source src = { 0 }, full_src = { 0 };
	const struct counted cnt = { &src, &b->pages_read };
	const kvmem_page_source counted_src = { &counted_ops, (void *)&cnt };
	int rc = 0, qtok = b->o.query_tokens;

	double t0 = cli_now_s();
	if (prefill(b, ws, b->budget, &src))
		return -1;
	b->prefill_s += cli_now_s() - t0;
	b->prefill_tokens += n;
	int lab_pi = -1;

	for (int pi = 0; b->o.lab && pi < np && lab_pi < 0; pi++)
		lab_pi = strcmp(b->o.pol[pi], FULL) && strcmp(b->o.pol[pi], RAG) ? pi : -1;
	for (int pi = 0; pi < np && !rc; pi++) {
		const char *pol = b->o.pol[pi];
		int full = !strcmp(pol, FULL);
		char lab_path[4200];

		if (pi == lab_pi) {
			snprintf(lab_path, sizeof(lab_path), "%s/s%g-%llu.trace", b->o.lab,
				 b->o.sizes[si], (unsigned long long)b->ws_seed);
			if (kvmem_lab_record_open(lab_path, b->m, &(kvmem_lab_record_opts){
					.label = "kvmem bench recall" }, &b->rec)) {
				rc = -1;
				break;
			}
		}
		struct cell *cl = &b->cells[((size_t)si * nd) * np + pi];

		if (full && !fits)
			continue;
		if (!strcmp(pol, RAG)) {
			rc = run_rag(b, ws, q_depth, cl);
			continue;
		}
		if (full && !full_src.ops && prefill(b, ws, 0, &full_src)) {
			rc = -1;
			break;
		}
		kvmem_session *s = NULL;
		for (int i = 0; i < ws->n_q && !rc; i++) {
			const agentlang_question *q = &ws->q[i];
			int t = qtok ? qtok : b->o.select_at == SELECT_AHEAD ? 1 :
				q->n_ids - (b->o.select_at == SELECT_KEY);

			/* Full context adopts afresh each time: the window cannot
			 * hold the questions piling up. */
			if (!s || full) {
				kvmem_session_free(s);
				s = session(b, full ? "meank" : pol, full ? 0 : b->budget,
					    full ? &full_src : &counted_src, t);
				rc = !s || kvmem_session_adopt(s, ws->ids, n);
				if (rc)
					break;
			}
			rc = ask(b, s, q, full, cl + (size_t)q_depth[i] * np);
		}
		if (b->rec) {
			/* The history the trace selected over, as a workspace. */
			snprintf(lab_path, sizeof(lab_path), "%s/s%g-%llu.ws", b->o.lab,
				 b->o.sizes[si], (unsigned long long)b->ws_seed);
			if (!rc && s && kvmem_lab_save_workspace(lab_path, b->m, b->o.block, 0, &src,
								 kvmem_session_token_ids(s),
								 kvmem_session_tokens(s)))
				rc = -1;
			kvmem_session_free(s);
			s = NULL;
			if (kvmem_lab_record_close(b->rec) && !rc)
				rc = -1;
			b->rec = NULL;
		}
		kvmem_session_free(s);
	}
	kvmem_page_source_destroy(&src);
	if (full_src.ops)
		kvmem_page_source_destroy(&full_src);
	return rc ? kvmem_error_prefix("workspace seed") : 0;
}

static void size_name(char *buf, size_t len, int64_t n, double size)
{
	if (n >= 1 << 20)
		snprintf(buf, len, "%.3gM (%gx)", (double)n / (1 << 20), size);
	else if (n >= 10 << 10)
		snprintf(buf, len, "%lldK (%gx)", (long long)((n + 512) >> 10), size);
	else
		snprintf(buf, len, "%lld (%gx)", (long long)n, size);
}

static void report_cell(struct bench *b, int si, int di, int pi)
{
	const struct cell *c = &b->cells[((size_t)si * b->o.n_depths + di) * b->o.n_pol + pi];
	int64_t n = workspace_len(b, b->o.sizes[si]);
	char name[64];
	const char *pol = b->o.pol[pi];

	if (!c->n)
		return;
	size_name(name, sizeof(name), n, b->o.sizes[si]);
	double acc = 100.0 * c->ok / c->n, ms = 1e3 * c->secs / c->n, mb = c->bytes / c->n / 1e6;
	double first = 1e3 * c->first_secs / c->n;
	int64_t rank = median_rank(c);
	double mv = c->sels ? (double)c->moved / c->sels / b->m->cfg.n_layers : 0;

	printf("%-14s %5.2f  %-9s %6.1f%% %5lld  %6.1f%%  %6lld  %7.1f  %7.1f  %7.3f  %7.1f\n",
	       name, b->o.depths[di], pol, acc, (long long)c->n, 100.0 * c->inview / c->n,
	       (long long)rank, ms, first, mb, mv);
	if (b->json)
		fprintf(b->json, "{\"tokens\": %lld, \"size\": %g, \"depth\": %g, \"policy\": \"%s\", "
			"\"accuracy\": %.4f, \"questions\": %lld, \"needle_in_view\": %.4f, "
			"\"needle_rank_median\": %lld, "
			"\"ms_per_question\": %.3f, \"first_token_ms\": %.3f, "
			"\"mb_paged_per_question\": %.4f, \"moved_tokens_per_selection\": %.2f, "
			"\"budget\": %lld, \"window\": %d}\n", (long long)n, b->o.sizes[si],
			b->o.depths[di], pol, acc / 100, (long long)c->n,
			(double)c->inview / c->n, (long long)rank, ms, first, mb, mv,
			!strcmp(pol, FULL) ? 0LL : (long long)b->budget, b->W);
	if (b->csv)
		fprintf(b->csv, "%lld,%g,%g,%s,%.4f,%lld,%.4f,%.3f,%.4f,%lld,%.3f\n", (long long)n,
			b->o.sizes[si], b->o.depths[di], pol, acc / 100, (long long)c->n,
			(double)c->inview / c->n, ms, mb, (long long)rank, first);
}

static void summary(struct bench *b)
{
	printf("\naccuracy over all depths (needle line in view: share of questions, and of\n"
	       "layers for a per-layer policy):\n%-14s", "size");
	for (int pi = 0; pi < b->o.n_pol; pi++)
		printf(" %16s", b->o.pol[pi]);
	printf("\n");
	for (int si = 0; si < b->o.n_sizes; si++) {
		char name[64];

		size_name(name, sizeof(name), workspace_len(b, b->o.sizes[si]), b->o.sizes[si]);
		printf("%-14s", name);
		for (int pi = 0; pi < b->o.n_pol; pi++) {
			int64_t n = 0, ok = 0;
			double iv = 0;

			for (int di = 0; di < b->o.n_depths; di++) {
				const struct cell *c = &b->cells[((size_t)si * b->o.n_depths + di) *
								 b->o.n_pol + pi];
				n += c->n, ok += c->ok, iv += c->inview;
			}
			if (n)
				printf("   %5.1f%% (%5.1f%%)", 100.0 * ok / n, 100.0 * iv / n);
			else
				printf(" %16s", "-");
		}
		printf("\n");
	}
}

static int run_size(struct bench *b, int si)
{
	const int nd = b->o.n_depths;
	int64_t n = workspace_len(b, b->o.sizes[si]);
	int per_ws = needles_per_ws(b, n), total = b->o.questions * nd, done = 0, wsi = 0;
	double t0 = cli_now_s();

	while (done < total) {
		int m = total - done < per_ws ? total - done : per_ws;
		double *depths = malloc((size_t)m * sizeof(*depths));
		int *qd = malloc((size_t)m * sizeof(*qd));
		agentlang_params p;
		agentlang_transcript ws;

		if (!depths || !qd) {
			free(depths);
			free(qd);
			return kvmem_error(ENOMEM, "out of memory");
		}
		/* Round-robin over depths; needles of one depth spread over a
		 * few percent of the workspace so they do not share blocks. */
		int per_depth = (m + nd - 1) / nd;
		for (int j = 0; j < m; j++) {
			int d = (done + j) % nd, k = j / nd;
			double off = per_depth > 1 ? 0.04 * ((k + 0.5) / per_depth - 0.5) : 0;
			double x = b->o.depths[d] + off;

			depths[j] = x < 0 ? 0 : x > 1 ? 1 : x;
			qd[j] = d;
		}
		agentlang_params_default(&p);
		p.seed = b->o.seed + (uint64_t)si * 1000000 + (uint64_t)wsi;
		p.n_tokens = n;
		p.n_questions = m;
		p.depths = depths;
		p.lookalikes = b->o.lookalikes;
		int rc = agentlang_transcript_build(&p, &ws);

		b->ws_seed = p.seed;
		if (!rc) {
			rc = run_workspace(b, si, &ws, qd);
			agentlang_transcript_free(&ws);
		}
		free(depths);
		free(qd);
		if (rc)
			return kvmem_error_prefix("%lld-token workspace, seed %llu", (long long)n,
						(unsigned long long)p.seed);
		done += m;
		wsi++;
		if (!b->o.quiet)
			fprintf(stderr, "kvmem bench recall: %lld tokens: %d/%d questions, %d workspaces, "
				"%.0f s (prefill %.0f tok/s)\n", (long long)n, done, total, wsi,
				cli_now_s() - t0, b->prefill_tokens / (b->prefill_s > 0 ? b->prefill_s : 1));
	}
	for (int di = 0; di < nd; di++)
		for (int pi = 0; pi < b->o.n_pol; pi++)
			report_cell(b, si, di, pi);
	fflush(stdout);
	return 0;
}

int bench_recall(int argc, char **argv)
{
	struct bench b;
	size_t n_cells;
	int rc = 1;

	memset(&b, 0, sizeof(b));
	switch (parse_args(argc, argv, &b.o)) {
	case 1:
		return 0;
	case -1:
		return EXIT_USAGE;
	}
	if (kvmem_model_load(b.o.model, &b.m) || check_vocab(b.o.model, &b.m->cfg) ||
	    kvmem_backend_open(b.o.backend ? b.o.backend : "cpu", b.m,
			       &(kvmem_backend_opts){ .max_chunk = b.o.chunk,
						      .kv_dtype = b.o.kv_dtype }, &b.e) < 0) {
		fprintf(stderr, "kvmem bench recall: %s\n", kvmem_last_error());
		if (b.m && !b.e && kvmem_last_errno() == EINVAL && b.o.backend)
			rc = EXIT_USAGE;	/* an unknown backend name */
		goto out;
	}
	const kvmem_config *c = &b.m->cfg;
	b.W = c->max_position;
	/* Budget + reserve (the tail between selections: at least a prefill
	 * chunk) + 32 slots for a question and its answer fit the window. */
	b.reserve = b.W / 8 > b.o.chunk ? b.W / 8 : b.o.chunk;
	b.budget = b.o.budget ? b.o.budget : (b.W - 32 - b.reserve) / b.o.block * b.o.block;
	b.reserve = b.W - 32 - b.budget;
	if (b.reserve < b.o.chunk || b.budget < b.o.block) {
		fprintf(stderr, "kvmem bench recall: budget %lld leaves %lld of the %d-token window "
			"for the tail; need at least the chunk (%d)\n", (long long)b.budget,
			(long long)b.reserve, b.W, b.o.chunk);
		rc = EXIT_USAGE;
		goto out;
	}
	b.page_bytes = 2.0 * c->n_kv_heads * b.o.block * c->head_dim * 2;
	b.cells = calloc((size_t)b.o.n_sizes * b.o.n_depths * b.o.n_pol, sizeof(*b.cells));
	n_cells = (size_t)b.o.n_sizes * b.o.n_depths * b.o.n_pol;
	b.ranks = malloc(sizeof(int64_t) * n_cells * b.o.questions);
	for (size_t i = 0; b.cells && b.ranks && i < n_cells; i++)
		b.cells[i].rank = b.ranks + i * b.o.questions;
	if (!b.ranks) {
		free(b.cells);
		b.cells = NULL;
	}
	if (!b.cells || (b.o.json && !(b.json = fopen(b.o.json, "w"))) ||
	    (b.o.csv && !(b.csv = fopen(b.o.csv, "w")))) {
		fprintf(stderr, "kvmem bench recall: %s\n", !b.cells ? "out of memory" : strerror(errno));
		goto out;
	}
	if (b.o.lab && mkdir(b.o.lab, 0777) && errno != EEXIST) {
		fprintf(stderr, "kvmem bench recall: --lab %s: %s\n", b.o.lab, strerror(errno));
		goto out;
	}
	if (b.csv)
		fprintf(b.csv, "tokens,size,depth,policy,accuracy,questions,needle_in_view,"
			"ms_per_question,mb_paged_per_question,needle_rank_median,first_token_ms\n");
	printf("kvmem bench recall: %s (window %d, %.2fM parameters, %s backend), budget %lld + "
	       "reserve %lld, block %d, %d look-alikes per needle, %d questions per cell, seeds from "
	       "%llu%s\n", b.o.model, b.W, kvmem_config_params(c) / 1e6, kvmem_backend_name(b.e),
	       (long long)b.budget,
	       (long long)b.reserve, b.o.block, b.o.lookalikes, b.o.questions,
	       (unsigned long long)b.o.seed,
	       b.o.layout == KVMEM_LAYOUT_STABLE ? ", layout stable" : "");
	if (b.o.query_view)
		printf("each question's queries read over the view %s chose for it (--query-view: "
		       "a diagnostic, not a policy's own figure)\n", b.o.query_view->name);
	printf("%-14s %5s  %-9s %7s %5s  %7s  %6s  %7s  %7s  %7s  %7s\n", "workspace", "depth",
	       "policy", "acc", "n", "in-view", "rank", "ms/q", "1st ms", "MB/q", "mv/sel");
	rc = 0;
	for (int si = 0; si < b.o.n_sizes && !rc; si++)
		if (run_size(&b, si)) {
			fprintf(stderr, "kvmem bench recall: %s\n", kvmem_last_error());
			rc = 1;
		}
	if (!rc)
		summary(&b);
out:
	if (b.json)
		fclose(b.json);
	if (b.csv)
		fclose(b.csv);
	free(b.cells);
	free(b.ranks);
	kvmem_backend_close(b.e);
	kvmem_model_free(b.m);
	return rc;
}
