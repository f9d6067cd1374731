// SPDX-License-Identifier: MIT
/*
 * kvmem lab: replay recorded sessions with any selection and replacement
 * policy, offline (include/kvmem/lab.h, Documentation/lab.md).
 *
 *   kvmem lab info --trace FILE
 *   kvmem lab replay --workspace DIR --trace FILE [selection and pool options]
 *       [--layout LIST]  (what the plans would move under other view layouts)
 *   kvmem lab compare (--workspace DIR --trace FILE)... --policies LIST
 *       [--budgets LIST] [--blocks LIST] [--cache-policies LIST] [--host-caps LIST]
 *       [--md FILE] [--csv FILE] [--plot FILE.png]
 *
 * Traces come from `kvmem run --script ... --trace FILE`, `kvmem bench recall
 * --lab DIR`, or any program that attaches a kvmem_lab_recorder.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agentlang/agentlang.h"
#include "kvmem/kvmem.h"
#include "kvmem/lab.h"
#include "cli_util.h"
#include "cmd.h"

#define WHO "kvmem lab"
#define MAX_LIST 32
#define MAX_PAIRS 64

static const char *const tier_name[KVMEM_LAB_TIERS] = { "mem", "host", "stage", "nvme" };

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem lab info --trace FILE\n"
		"       kvmem lab replay --workspace DIR --trace FILE [options]\n"
		"       kvmem lab compare (--workspace DIR --trace FILE)... [options]\n"
		"\n"
		"Replay a recorded session's selections offline, with no model: the index is\n"
		"rebuilt from the workspace's raw K at any block size, any selection policy\n"
		"runs at any budget, any replacement policy at any host-pool size. Reported\n"
		"per step and overall: overlap with the attention-mass oracle's plan at the\n"
		"same budget and the share of its mass held, the needle in view where the\n"
		"trace marks one, pages and bytes per tier, the host hit rate, a modelled\n"
		"step time. Record with `kvmem run --script S --workspace DIR --trace FILE`\n"
		"or `kvmem bench recall --lab DIR`. Documentation/lab.md tells more.\n"
		"\n"
		"selection (replay; compare takes lists where it says LIST):\n"
		"  --policy P          selection policy (default: the recorded one); compare:\n"
		"                      --policies LIST ('all': every one)\n"
		"  --budget N          view budget in tokens (default: the recorded; 'none':\n"
		"                      unlimited); compare: --budgets LIST\n"
		"  --block N           tokens per block, 16..256 (default: the recorded);\n"
		"                      compare: --blocks LIST\n"
		"  --sink N, --recent N, --reserve N\n"
		"                      (default: the recorded at the recorded budget, else the\n"
		"                      session's defaults, budget/100 and budget/12)\n"
		"  --query-tokens N    select with the last N recorded query tokens (a\n"
		"                      select-ahead records the whole question); compare:\n"
		"                      --query-tokens LIST\n"
		"  --query-span        select with the queries of the step's annotated query\n"
		"                      span (a question's key tokens)\n"
		"pool and time:\n"
		"  --cache-policy R    replacement policy: lru, lfu, score (default lru);\n"
		"                      compare: --cache-policies LIST\n"
		"  --host-cap SIZE     host pool bytes (default 256M); compare: --host-caps LIST\n"
		"  --bw NVME,LINK,MEM  bandwidths in GB/s for the step time (default: measured\n"
		"                      here: reads of the workspace's pages with O_DIRECT, and\n"
		"                      memory copies for both others)\n"
		"  --no-oracle         skip the oracle (it scores every key of every step)\n"
		"output:\n"
		"  --per-step          (replay) one line per selection\n"
		"  --why N             (replay) for each needle not in view, the N best blocks\n"
		"                      (as text for an agentlang model)\n"
		"  --json              (replay) one JSON object, the overall figures\n"
		"  --layout LIST       (replay) what the replayed plans would move under each\n"
		"                      view layout: compact (chronological), stable (kept blocks\n"
		"                      stay, entering ones fill the holes: sessions' default),\n"
		"                      gaps:F (chronological in a span of the view + (F-1) x\n"
		"                      budget); per selection with\n"
		"                      --per-step; token-layers moved and entered\n"
		"  --md FILE, --csv FILE\n"
		"                      (compare) the table as Markdown / CSV ('-': stdout)\n"
		"  --plot FILE.png     (compare) recall proxy vs budget, hit rate vs pool size,\n"
		"                      MB read per step over the steps (gnuplot)\n"
		"\n"
		"%s; %s\n"
		"\n"
		"examples:\n"
		"  kvmem run --model M --script s.jsonl --workspace ws --budget 1024 --trace t\n"
		"  kvmem lab replay --workspace ws --trace t\n"
		"  kvmem lab replay --workspace ws --trace t --policy refine --block 16 --per-step\n"
		"  kvmem lab replay --workspace ws --trace t --no-oracle \\\n"
		"      --layout compact,stable,gaps:1.25,gaps:1.5,gaps:2\n"
		"  kvmem lab compare --workspace ws --trace t --policies meank,refine \\\n"
		"      --budgets 512,1024,2048 --host-caps 1M,4M,16M --md - --plot lab.png\n",
		CLI_SIZE_HELP, CLI_COUNT_HELP);
}

/* ---- options ------------------------------------------------------------ */
struct opts {
	const char *ws[MAX_PAIRS], *trace[MAX_PAIRS];
	int n_ws, n_trace;
	const char *pol[MAX_LIST], *cache[MAX_LIST];
	int n_pol, n_cache;
	int64_t budget[MAX_LIST];
	int n_budget;
	int block[MAX_LIST], n_block;
	int qtok[MAX_LIST], n_qtok;
	uint64_t host[MAX_LIST];
	int n_host;
	int64_t sink, recent, reserve;
	int query_span, no_oracle, per_step, why, json, have_bw;
	kvmem_lab_bw bw;
	const char *md, *csv, *plot;
	kvmem_lab_layout lay[MAX_LIST];
	int n_lay;
	char *lists[8];		/* strdup'd option values, freed at the end */
	int n_lists;
};

/* Split a comma list (kept in o->lists); the count, or -1 after a message. */
static int split(struct opts *o, const char *opt, const char *s, char **out, int max)
{
	char *list = strdup(s), *save = NULL;
	int n = 0;

	if (!list || o->n_lists == 8)
		return fprintf(stderr, "%s: out of memory\n", WHO), free(list), -1;
	o->lists[o->n_lists++] = list;
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == max)
			return fprintf(stderr, "%s: %s takes at most %d values\n", WHO, opt, max), -1;
		out[n++] = t;
	}
	if (!n)
		fprintf(stderr, "%s: %s wants a comma-separated list, not '%s'\n", WHO, opt, s);
	return n ? n : -1;
}

static int parse_budgets(struct opts *o, const char *opt, const char *s)
{
	char *v[MAX_LIST];
	int n = split(o, opt, s, v, MAX_LIST);

	for (int i = 0; i < n; i++) {
		if (!strcmp(v[i], "none") || !strcmp(v[i], "unlimited"))
			o->budget[i] = -1;
		else if (cli_parse_count(WHO, opt, v[i], 1, INT32_MAX / 4, &o->budget[i]))
			return -1;
	}
	return (o->n_budget = n) < 0 ? -1 : 0;
}

static int parse_ints(struct opts *o, const char *opt, const char *s, int *out, int *n_out,
		      int lo, int hi)
{
	char *v[MAX_LIST];
	int n = split(o, opt, s, v, MAX_LIST);

	for (int i = 0; i < n; i++)
		if (cli_parse_int(WHO, opt, v[i], lo, hi, &out[i]))
			return -1;
	return (*n_out = n) < 0 ? -1 : 0;
}

static int parse_sizes(struct opts *o, const char *opt, const char *s)
{
	char *v[MAX_LIST];
	int n = split(o, opt, s, v, MAX_LIST);

	for (int i = 0; i < n; i++)
		if (cli_parse_size(WHO, opt, v[i], 4096, 1ull << 50, &o->host[i]))
			return -1;
	return (o->n_host = n) < 0 ? -1 : 0;
}

/* 1 when `name` is a replacement policy, else 0 with a message naming them. */
static int repl_known(const char *name)
{
	char known[128] = "";
	const char *r;

	for (int i = 0; (r = kvmem_repl_at(i, NULL)); i++) {
		if (!strcmp(r, name))
			return 1;
		snprintf(known + strlen(known), sizeof(known) - strlen(known), "%s%s", i ? ", " : "", r);
	}
	kvmem_error(EINVAL, "unknown replacement policy '%s' (known: %s)", name, known);
	return 0;
}

static int parse_names(struct opts *o, const char *opt, const char *s, const char **out, int *n_out,
		       int policies)
{
	char *v[MAX_LIST];
	int n = split(o, opt, s, v, MAX_LIST);

	if (n < 0)
		return -1;
	*n_out = 0;
	for (int i = 0; i < n; i++) {
		if (policies && !strcmp(v[i], "all")) {
			for (int k = 0; kvmem_policy_at(k) && *n_out < MAX_LIST; k++)
				out[(*n_out)++] = kvmem_policy_at(k)->name;
			continue;
		}
		if (policies ? !kvmem_policy_find(v[i]) : !repl_known(v[i]))
			return fprintf(stderr, "%s: %s: %s\n", WHO, opt, kvmem_last_error()), -1;
		if (*n_out < MAX_LIST)
			out[(*n_out)++] = v[i];
	}
	return 0;
}

static int parse_bw(struct opts *o, const char *opt, const char *s)
{
	char *v[3];
	double x[3];
	int n = split(o, opt, s, v, 3);

	if (n != 3)
		return n < 0 ? -1 : (fprintf(stderr, "%s: %s wants NVME,LINK,MEM in GB/s, not '%s'\n",
					     WHO, opt, s), -1);
	for (int i = 0; i < 3; i++)
		if (cli_parse_double(WHO, opt, v[i], 1e-6, 1e6, &x[i]))
			return -1;
	o->bw = (kvmem_lab_bw){ x[0] * 1e9, x[1] * 1e9, x[2] * 1e9 };
	o->have_bw = 1;
	return 0;
}

static int parse_layouts(struct opts *o, const char *opt, const char *s)
{
	char *v[MAX_LIST];
	int n = split(o, opt, s, v, MAX_LIST);

	for (int i = 0; i < n; i++)
		if (kvmem_lab_layout_parse(v[i], &o->lay[i]))
			return fprintf(stderr, "%s: %s: %s\n", WHO, opt, kvmem_last_error()), -1;
	return (o->n_lay = n) < 0 ? -1 : 0;
}

enum {
	O_WS = 1000, O_TRACE, O_POLICY, O_BUDGET, O_BLOCK, O_SINK, O_RECENT, O_RESERVE, O_QTOK,
	O_QSPAN, O_CACHE, O_HOST, O_BW, O_NOORACLE, O_PERSTEP, O_WHY, O_JSON, O_MD, O_CSV, O_PLOT,
	O_LAYOUT,
};

/* mode: 'i' info, 'r' replay, 'c' compare. Returns 0, 1 after --help, -1. */
static int parse(int argc, char **argv, int mode, struct opts *o)
{
	static const struct option opts[] = {
		{ "workspace", required_argument, NULL, O_WS },
		{ "trace", required_argument, NULL, O_TRACE },
		{ "policy", required_argument, NULL, O_POLICY },
		{ "policies", required_argument, NULL, O_POLICY },
		{ "budget", required_argument, NULL, O_BUDGET },
		{ "budgets", required_argument, NULL, O_BUDGET },
		{ "block", required_argument, NULL, O_BLOCK },
		{ "blocks", required_argument, NULL, O_BLOCK },
		{ "sink", required_argument, NULL, O_SINK },
		{ "recent", required_argument, NULL, O_RECENT },
		{ "reserve", required_argument, NULL, O_RESERVE },
		{ "query-tokens", required_argument, NULL, O_QTOK },
		{ "query-span", no_argument, NULL, O_QSPAN },
		{ "cache-policy", required_argument, NULL, O_CACHE },
		{ "cache-policies", required_argument, NULL, O_CACHE },
		{ "host-cap", required_argument, NULL, O_HOST },
		{ "host-caps", required_argument, NULL, O_HOST },
		{ "bw", required_argument, NULL, O_BW },
		{ "no-oracle", no_argument, NULL, O_NOORACLE },
		{ "per-step", no_argument, NULL, O_PERSTEP },
		{ "why", required_argument, NULL, O_WHY },
		{ "json", no_argument, NULL, O_JSON },
		{ "md", required_argument, NULL, O_MD },
		{ "csv", required_argument, NULL, O_CSV },
		{ "plot", required_argument, NULL, O_PLOT },
		{ "layout", required_argument, NULL, O_LAYOUT },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int c;

	o->sink = o->recent = o->reserve = -1;
	cli_getopt_reset();
	while ((c = cli_getopt(WHO, argc, argv, opts)) != -1) {
		const char *name = cli_optname;
		int bad = 0, list = mode == 'c';

		switch (c) {
		case 'h': usage(stdout); return 1;
		case O_WS:
			if (o->n_ws == MAX_PAIRS)
				return fprintf(stderr, "%s: at most %d workspaces\n", WHO, MAX_PAIRS), -1;
			o->ws[o->n_ws++] = optarg;
			break;
		case O_TRACE:
			if (o->n_trace == MAX_PAIRS)
				return fprintf(stderr, "%s: at most %d traces\n", WHO, MAX_PAIRS), -1;
			o->trace[o->n_trace++] = optarg;
			break;
		case O_POLICY: bad = parse_names(o, name, optarg, o->pol, &o->n_pol, 1); break;
		case O_BUDGET: bad = parse_budgets(o, name, optarg); break;
		case O_BLOCK:
			bad = parse_ints(o, name, optarg, o->block, &o->n_block, 16, 256);
			for (int i = 0; !bad && i < o->n_block; i++)
				if (o->block[i] & (o->block[i] - 1))
					bad = fprintf(stderr, "%s: %s wants powers of two from 16 to "
						      "256, not %d\n", WHO, name, o->block[i]) > 0;
			break;
		case O_SINK: bad = cli_parse_count(WHO, name, optarg, 0, INT32_MAX / 4, &o->sink); break;
		case O_RECENT: bad = cli_parse_count(WHO, name, optarg, 0, INT32_MAX / 4, &o->recent); break;
		case O_RESERVE: bad = cli_parse_count(WHO, name, optarg, 1, INT32_MAX / 4, &o->reserve); break;
		case O_QTOK: bad = parse_ints(o, name, optarg, o->qtok, &o->n_qtok, 1, 4096); break;
		case O_QSPAN: o->query_span = 1; break;
		case O_CACHE: bad = parse_names(o, name, optarg, o->cache, &o->n_cache, 0); break;
		case O_HOST: bad = parse_sizes(o, name, optarg); break;
		case O_BW: bad = parse_bw(o, name, optarg); break;
		case O_NOORACLE: o->no_oracle = 1; break;
		case O_PERSTEP: o->per_step = 1; break;
		case O_WHY: bad = cli_parse_int(WHO, name, optarg, 1, 64, &o->why); break;
		case O_JSON: o->json = 1; break;
		case O_MD: o->md = optarg; break;
		case O_CSV: o->csv = optarg; break;
		case O_PLOT: o->plot = optarg; break;
		case O_LAYOUT: bad = parse_layouts(o, name, optarg); break;
		default: return -1;
		}
		if (bad)
			return -1;
		/* replay takes one value where compare takes lists. */
		if (!list && (o->n_pol > 1 || o->n_budget > 1 || o->n_block > 1 || o->n_cache > 1 ||
			      o->n_host > 1 || o->n_qtok > 1))
			return fprintf(stderr, "%s: %s takes one value here; kvmem lab compare takes "
				       "lists\n", WHO, name), -1;
	}
	if (cli_no_operands(WHO, argc, argv))
		return -1;
	if (!o->n_trace)
		return fprintf(stderr, "%s: --trace FILE is required\n", WHO), -1;
	if (mode == 'i')
		return 0;
	if (!o->n_ws)
		return fprintf(stderr, "%s: --workspace DIR is required\n", WHO), -1;
	if (mode == 'r' && (o->n_ws > 1 || o->n_trace > 1))
		return fprintf(stderr, "%s: replay takes one --workspace and one --trace; compare "
			       "takes several\n", WHO), -1;
	if (o->n_ws != 1 && o->n_ws != o->n_trace)
		return fprintf(stderr, "%s: %d workspaces for %d traces: give one workspace, or one "
			       "per trace in the same order\n", WHO, o->n_ws, o->n_trace), -1;
	if (mode == 'r' && (o->md || o->csv || o->plot))
		return fprintf(stderr, "%s: --md, --csv and --plot go with compare\n", WHO), -1;
	if (mode == 'c' && (o->per_step || o->why || o->json || o->n_lay))
		return fprintf(stderr, "%s: --per-step, --why, --json and --layout go with replay\n",
			       WHO), -1;
	if (o->n_lay && o->json)
		return fprintf(stderr, "%s: --layout prints a table; leave out --json\n", WHO), -1;
	return 0;
}

static void free_opts(struct opts *o)
{
	for (int i = 0; i < o->n_lists; i++)
		free(o->lists[i]);
}

static void params_of(const struct opts *o, kvmem_lab_params *p)
{
	kvmem_lab_params_default(p);
	p->sink = o->sink;
	p->recent = o->recent;
	p->reserve = o->reserve;
	p->query_span = o->query_span;
	p->no_oracle = o->no_oracle;
	p->bw = o->bw;
}

/* The bandwidths, measured on the first workspace unless given. */
static void bandwidths(struct opts *o)
{
	char pages[4200];

	if (o->have_bw)
		return;
	snprintf(pages, sizeof(pages), "%s/pages", o->ws[0]);
	if (kvmem_lab_measure_bw(access(pages, R_OK) ? NULL : pages, 256ull << 20, &o->bw) == 0)
		fprintf(stderr, "%s: bandwidths measured here: NVMe %.2f GB/s (%s), link and memory "
			"%.2f GB/s; --bw fixes them\n", WHO, o->bw.nvme / 1e9, pages, o->bw.mem / 1e9);
}

/* ---- info --------------------------------------------------------------- */
static int lab_info(int argc, char **argv)
{
	struct opts o = { 0 };
	kvmem_lab_trace_info ti;
	int rc = parse(argc, argv, 'i', &o);

	if (rc)
		return free_opts(&o), rc > 0 ? 0 : EXIT_USAGE;
	for (int i = 0; i < o.n_trace; i++) {
		if (kvmem_lab_trace_info_read(o.trace[i], &ti)) {
			fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
			free_opts(&o);
			return 1;
		}
		printf("%s: lab trace version %u, '%s'\n"
		       "  model: fingerprint %016llx, %d layers, %d/%d heads, head_dim %d, vocab %d, "
		       "window %d\n"
		       "  live: policy %s, block %d, budget %lld, sink %lld, recent %lld, reserve %lld, "
		       "chunk %d, query tokens %d, seed %llu\n"
		       "  %lld selections over up to %lld tokens, %lld annotations, %lld page reads\n"
		       "  %llu bytes: %.0f per selection, of which raw queries %.0f\n",
		       o.trace[i], ti.version, ti.label, (unsigned long long)ti.fingerprint, ti.n_layers,
		       ti.n_heads, ti.n_kv_heads, ti.head_dim, ti.vocab, ti.window, ti.policy, ti.block,
		       (long long)ti.budget, (long long)ti.sink, (long long)ti.recent,
		       (long long)ti.reserve, ti.chunk, ti.query_tokens, (unsigned long long)ti.seed,
		       (long long)ti.steps, (long long)ti.max_tokens, (long long)ti.spans,
		       (long long)ti.reads, (unsigned long long)ti.bytes,
		       ti.steps ? (double)(ti.bytes - 256) / ti.steps : 0.0,
		       ti.steps ? (double)ti.query_bytes / ti.steps : 0.0);
	}
	free_opts(&o);
	return 0;
}

/* ---- replay ------------------------------------------------------------- */
static double sum_tiers(const double *v)
{
	double s = 0;

	for (int t = 0; t < KVMEM_LAB_TIERS; t++)
		s += v[t];
	return s;
}

static int64_t sum_pages(const int64_t *v)
{
	int64_t s = 0;

	for (int t = 0; t < KVMEM_LAB_TIERS; t++)
		s += v[t];
	return s;
}

/* Tokens [a, e) as text for agentlang, else as ids. */
static void print_span(const kvmem_lab *lab, int64_t a, int64_t e, int text)
{
	const int32_t *ids = kvmem_lab_token_ids(lab);
	int64_t n = kvmem_lab_tokens(lab);
	char buf[4096];

	a = a < 0 ? 0 : a;
	e = e > n ? n : e;
	if (text && agentlang_decode(ids + a, (size_t)(e - a), buf, sizeof(buf)) >= 0) {
		for (char *c = buf; *c; c++)
			*c = *c == '\n' ? '|' : *c;
		printf("%s\n", buf);
		return;
	}
	for (int64_t i = a; i < e; i++)
		printf("%s%d", i > a ? " " : "", ids[i]);
	printf("\n");
}

static void print_step(const kvmem_lab_step *st, double page_bytes)
{
	(void)page_bytes;
	printf("%6lld %9lld %5lld %5d %7.3f %7.3f %7.3f ", (long long)st->step, (long long)st->n_tokens,
	       (long long)st->n_blocks, st->n_view, st->overlap, st->mass, st->oracle_mass);
	if (st->needle_in_view >= 0)
		printf("%5.2f %5lld ", st->needle_in_view, (long long)st->needle_rank);
	else
		printf("%5s %5s ", "-", "-");
	printf("%6lld %6lld %6lld %6lld %8.3f %s\n", (long long)st->pages[1][KVMEM_LAB_HOST],
	       (long long)st->pages[1][KVMEM_LAB_NVME], (long long)st->pages[1][KVMEM_LAB_MEM],
	       (long long)sum_pages(st->pages[0]), st->time_s * 1e3,
	       st->live_equal < 0 ? "" : st->live_equal ? "=" : "DIFFERS");
}

static void print_summary(const kvmem_lab *lab, const kvmem_lab_result *r, const char *trace)
{
	const kvmem_lab_trace_info *ti = kvmem_lab_info(lab);
	double n = r->n_steps ? (double)r->n_steps : 1;

	printf("replay of %s: %lld selections, policy %s, block %d, budget %s%lld (sink %lld, "
	       "recent %lld, reserve %lld)\n", trace, (long long)r->n_steps, r->policy->name,
	       r->block, r->budget ? "" : "unlimited ", (long long)r->budget, (long long)r->sink,
	       (long long)r->recent, (long long)r->reserve);
	printf("  oracle: overlap %.3f, attention mass held %.3f (the oracle's own %.3f)\n",
	       r->overlap, r->mass, r->oracle_mass);
	if (r->needles)
		printf("  needle in view: %.1f%% of %lld annotated selections, median rank %lld\n",
		       100 * r->needle_in_view, (long long)r->needles, (long long)r->needle_rank_median);
	printf("  pages per selection: view %.1f (host %.1f, nvme %.1f, mem %.1f), scoring %.1f; "
	       "%.3f MB per selection\n", sum_pages(r->pages[1]) / n, r->pages[1][KVMEM_LAB_HOST] / n,
	       r->pages[1][KVMEM_LAB_NVME] / n, r->pages[1][KVMEM_LAB_MEM] / n,
	       sum_pages(r->pages[0]) / n, (sum_tiers(r->bytes[0]) + sum_tiers(r->bytes[1])) / n / 1e6);
	printf("  host pool: hit rate %.3f (%lld hits, %lld misses); modelled time %.3f ms per "
	       "selection\n", r->hit_rate, (long long)r->hits, (long long)r->misses,
	       1e3 * r->time_s / n);
	if (r->live_compared)
		printf("  against the recording: %lld of %lld plans equal%s\n", (long long)r->live_equal,
		       (long long)r->live_compared, r->live_equal == r->live_compared ? "" : " (DIFFERS)");
	printf("  recorded reads (live %s):", ti->policy);
	for (int w = 0; w < 3; w++)
		for (int t = 0; t < KVMEM_LAB_TIERS; t++)
			if (r->live_pages[w][t])
				printf(" %s/%s %lld", w == 0 ? "score" : w == 1 ? "view" : "other",
				       tier_name[t], (long long)r->live_pages[w][t]);
	printf("\n");
}

static void json_num(const char *k, double v, int last)
{
	if (isnan(v))
		printf("\"%s\":null%s", k, last ? "" : ",");
	else
		printf("\"%s\":%.6g%s", k, v, last ? "" : ",");
}

static void print_json(const kvmem_lab_result *r)
{
	printf("{\"policy\":\"%s\",\"block\":%d,\"budget\":%lld,\"steps\":%lld,", r->policy->name,
	       r->block, (long long)r->budget, (long long)r->n_steps);
	json_num("overlap", r->overlap, 0);
	json_num("mass", r->mass, 0);
	json_num("oracle_mass", r->oracle_mass, 0);
	printf("\"needles\":%lld,", (long long)r->needles);
	json_num("needle_in_view", r->needle_in_view, 0);
	printf("\"needle_rank_median\":%lld,\"view_pages\":%lld,\"score_pages\":%lld,"
	       "\"hits\":%lld,\"misses\":%lld,", (long long)r->needle_rank_median,
	       (long long)sum_pages(r->pages[1]), (long long)sum_pages(r->pages[0]),
	       (long long)r->hits, (long long)r->misses);
	json_num("hit_rate", r->hit_rate, 0);
	json_num("bytes", sum_tiers(r->bytes[0]) + sum_tiers(r->bytes[1]), 0);
	json_num("time_s", r->time_s, 0);
	printf("\"live_compared\":%lld,\"live_equal\":%lld}\n", (long long)r->live_compared,
	       (long long)r->live_equal);
}

/* A steady step: not the first (which lays out a history found in the
 * tail), and over a history the view could not hold whole. */
static int layout_steady(const kvmem_lab_result *r, int64_t k)
{
	return k > 0 && r->steps[k].n_tokens > r->steps[k].view_tokens;
}

/* One layout's counts summed over every step (steady 0) or the steady
 * ones; *n: how many. */
static kvmem_lab_layout_count layout_sum(const kvmem_lab_result *r, const kvmem_lab_layout_count *c,
					 int steady, int64_t *n)
{
	kvmem_lab_layout_count t = { 0 };

	*n = 0;
	for (int64_t k = 0; k < r->n_steps; k++) {
		if (steady && !layout_steady(r, k))
			continue;
		(*n)++;
		t.moved += c[k].moved;
		t.entered += c[k].entered;
		t.kept += c[k].kept;
		t.view += c[k].view;
		t.span = c[k].span > t.span ? c[k].span : t.span;
	}
	return t;
}

static void layout_row(const char *name, const char *which, kvmem_lab_layout_count t, int64_t n)
{
	double d = n ? (double)n : 1;

	printf("  %-12s %-6s %6lld %12.0f %12.0f %9.2f %8.3f %8.3f %7lld\n", name, which,
	       (long long)n, t.moved / d,
	       t.entered / d, t.entered ? (double)t.moved / t.entered : NAN,
	       t.view ? (double)t.moved / t.view : NAN, t.view ? (double)t.entered / t.view : NAN,
	       (long long)t.span);
}

/*
 * --layout: the replayed plans under each layout (kvmem_lab_layout_replay).
 * The first selection lays out a history that sat in the tail at 0..n-1
 * (a session's first), and a history the view holds whole moves nothing,
 * so the totals are given over every step and over the steady ones.
 */
static int print_layouts(const struct opts *o, const kvmem_lab *lab, const kvmem_lab_result *r)
{
	const int L = kvmem_lab_info(lab)->n_layers;
	kvmem_lab_layout_count *c = calloc((size_t)o->n_lay * (r->n_steps ? r->n_steps : 1),
					   sizeof(*c));

	if (!c)
		return kvmem_error(ENOMEM, "out of memory");
	for (int i = 0; i < o->n_lay; i++)
		if (kvmem_lab_layout_replay(r, L, &o->lay[i], c + (size_t)i * r->n_steps)) {
			free(c);
			return kvmem_fail();
		}
	printf("layouts, token-layers (%d layers) per selection: over all of them, and over the "
	       "steady ones\n(not the first, history past the view):\n"
	       "  %-12s %-6s %6s %12s %12s %9s %8s %8s %7s\n", L, "layout", "steps", "n", "moved",
	       "entered", "mv/ent", "mv/view", "ent/view", "span");
	for (int i = 0; i < o->n_lay; i++) {
		const kvmem_lab_layout_count *ci = c + (size_t)i * r->n_steps;

		kvmem_lab_layout_count t;
		int64_t n;

		t = layout_sum(r, ci, 0, &n);
		layout_row(o->lay[i].name, "all", t, n);
		t = layout_sum(r, ci, 1, &n);
		layout_row(o->lay[i].name, "steady", t, n);
	}
	if (o->per_step) {
		printf("per selection (f: forced, the tail full mid-append or mid-decode): moved/"
		       "entered token-layers, per layout\n%6s %1s %9s %9s", "step", "f", "tokens",
		       "view");
		for (int i = 0; i < o->n_lay; i++)
			printf(" %21s", o->lay[i].name);
		printf("\n");
		for (int64_t k = 0; k < r->n_steps; k++) {
			printf("%6lld %1s %9lld %9lld", (long long)r->steps[k].step,
			       r->steps[k].forced ? "f" : "", (long long)r->steps[k].n_tokens,
			       (long long)c[k].view);
			for (int i = 0; i < o->n_lay; i++)
				printf(" %10lld/%-10lld", (long long)c[(size_t)i * r->n_steps + k].moved,
				       (long long)c[(size_t)i * r->n_steps + k].entered);
			printf("\n");
		}
	}
	free(c);
	return 0;
}

static int lab_replay(int argc, char **argv)
{
	struct opts o = { 0 };
	kvmem_lab_params p;
	kvmem_lab_result r;
	kvmem_lab *lab = NULL;
	int rc = parse(argc, argv, 'r', &o);

	if (rc)
		return free_opts(&o), rc > 0 ? 0 : EXIT_USAGE;
	if (kvmem_lab_open(o.ws[0], o.trace[0], &lab)) {
		fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
		free_opts(&o);
		return 1;
	}
	bandwidths(&o);
	params_of(&o, &p);
	p.policy = o.n_pol ? o.pol[0] : NULL;
	p.budget = o.n_budget ? o.budget[0] : 0;
	p.block = o.n_block ? o.block[0] : 0;
	p.query_tokens = o.n_qtok ? o.qtok[0] : 0;
	p.cache_policy = o.n_cache ? o.cache[0] : NULL;
	p.host_cap = o.n_host ? o.host[0] : 0;
	p.rank_top = o.why;
	p.keep_plans = o.n_lay > 0;
	if (kvmem_lab_replay(lab, &p, &r)) {
		fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
		kvmem_lab_close(lab);
		free_opts(&o);
		return 1;
	}
	if (o.per_step) {
		printf("%6s %9s %5s %5s %7s %7s %7s %5s %5s %6s %6s %6s %6s %8s\n", "step", "tokens",
		       "blks", "view", "overlap", "mass", "o.mass", "in", "rank", "host", "nvme", "mem",
		       "score", "ms");
		for (int64_t k = 0; k < r.n_steps; k++)
			print_step(&r.steps[k], r.page_bytes);
	}
	if (o.why) {
		int text = kvmem_lab_info(lab)->vocab == agentlang_vocab_size();

		for (int64_t k = 0; k < r.n_steps; k++) {
			const kvmem_lab_step *st = &r.steps[k];

			if (st->needle_in_view < 0 || st->needle_in_view >= 1)
				continue;
			printf("step %lld: needle at %lld (block %lld), rank %lld, not in view\n  needle: ",
			       (long long)st->step, (long long)st->needle_start,
			       (long long)(st->needle_start / r.block), (long long)st->needle_rank);
			print_span(lab, st->needle_start, st->needle_end, text);
			for (int i = 0; i < o.why && st->top[i] >= 0; i++) {
				printf("  #%d block %lld: ", i, (long long)st->top[i]);
				print_span(lab, st->top[i] * r.block, (st->top[i] + 1) * r.block, text);
			}
		}
	}
	if (o.json)
		print_json(&r);
	else
		print_summary(lab, &r, o.trace[0]);
	if (o.n_lay && print_layouts(&o, lab, &r)) {
		fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
		kvmem_lab_result_free(&r);
		kvmem_lab_close(lab);
		free_opts(&o);
		return 1;
	}
	kvmem_lab_result_free(&r);
	kvmem_lab_close(lab);
	free_opts(&o);
	return cli_stdout_ok(WHO) ? 1 : 0;
}

/* ---- compare ------------------------------------------------------------- */
struct cell {
	const char *policy, *cache;
	int block, qtok;
	int64_t budget;		/* -1 unlimited, 0 the recorded */
	uint64_t host;
	/* summed over traces */
	int64_t steps, needles, live_compared, live_equal, hits, misses, rank_n;
	double in_view, overlap, mass, oracle_mass, n_oracle, view_bytes, score_bytes, nvme_bytes,
	       time_s;
	int64_t *ranks;
	int failed;		/* a replay refused it */
	int64_t budget_eff;	/* as resolved (the first trace's) */
	int block_eff;
	/* bytes per step of the first trace, for the plot */
	double *series;
	int64_t n_series;
};

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

static int add_result(struct cell *c, const kvmem_lab_result *r, int first)
{
	int64_t *rk = realloc(c->ranks, (size_t)(c->rank_n + r->n_steps + 1) * sizeof(*rk));

	if (!rk)
		return kvmem_error(ENOMEM, "out of memory");
	c->ranks = rk;
	if (first) {
		c->budget_eff = r->budget;
		c->block_eff = r->block;
		free(c->series);
		c->series = malloc((size_t)(r->n_steps ? r->n_steps : 1) * sizeof(double));
		c->n_series = c->series ? r->n_steps : 0;
	}
	for (int64_t k = 0; k < r->n_steps; k++) {
		const kvmem_lab_step *st = &r->steps[k];

		if (st->needle_in_view >= 0) {
			c->needles++;
			c->in_view += st->needle_in_view;
			if (st->needle_rank >= 0)
				c->ranks[c->rank_n++] = st->needle_rank;
		}
		if (!isnan(st->overlap)) {
			c->overlap += st->overlap;
			c->mass += st->mass;
			c->oracle_mass += st->oracle_mass;
			c->n_oracle++;
		}
		c->view_bytes += sum_tiers(st->bytes[1]);
		c->score_bytes += sum_tiers(st->bytes[0]);
		c->nvme_bytes += st->bytes[0][KVMEM_LAB_NVME] + st->bytes[1][KVMEM_LAB_NVME];
		c->time_s += st->time_s;
		if (first && c->series)
			c->series[k] = sum_tiers(st->bytes[0]) + sum_tiers(st->bytes[1]);
	}
	c->steps += r->n_steps;
	c->hits += r->hits;
	c->misses += r->misses;
	c->live_compared += r->live_compared;
	c->live_equal += r->live_equal;
	return 0;
}

static int64_t cell_median(struct cell *c)
{
	if (!c->rank_n)
		return -1;
	qsort(c->ranks, c->rank_n, sizeof(*c->ranks), cmp_i64);
	return c->ranks[c->rank_n / 2];
}

static void fmt_num(char *buf, size_t len, double v, const char *f)
{
	if (isnan(v))
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, f, v);
}

static const char *columns[] = {
	"policy", "block", "budget", "queries", "cache", "host_cap", "steps", "needles",
	"needle_in_view", "rank_median", "overlap", "mass", "oracle_mass", "hit_rate",
	"view_MB_per_step", "score_MB_per_step", "nvme_MB_per_step", "ms_per_step", "live_equal",
};
#define N_COLS (int)(sizeof(columns) / sizeof(columns[0]))

/* Cell c's values as strings, in the columns' order. */
static void cell_values(struct cell *c, char v[N_COLS][48])
{
	double n = c->steps ? (double)c->steps : 1;

	if (c->failed) {
		for (int i = 0; i < N_COLS; i++)
			snprintf(v[i], 48, "-");
		snprintf(v[0], 48, "%s", c->policy);
		snprintf(v[2], 48, "%lld", (long long)c->budget);
		snprintf(v[N_COLS - 1], 48, "refused");
		return;
	}

	snprintf(v[0], 48, "%s", c->policy);
	snprintf(v[1], 48, "%d", c->block_eff);
	if (c->budget_eff)
		snprintf(v[2], 48, "%lld", (long long)c->budget_eff);
	else
		snprintf(v[2], 48, "none");
	if (c->qtok)
		snprintf(v[3], 48, "%d", c->qtok);
	else
		snprintf(v[3], 48, "rec");
	snprintf(v[4], 48, "%s", c->cache);
	if (c->host % (1ull << 30) == 0)
		snprintf(v[5], 48, "%lluG", (unsigned long long)(c->host >> 30));
	else if (c->host % (1ull << 20) == 0)
		snprintf(v[5], 48, "%lluM", (unsigned long long)(c->host >> 20));
	else if (c->host % 1024 == 0)
		snprintf(v[5], 48, "%lluk", (unsigned long long)(c->host >> 10));
	else
		snprintf(v[5], 48, "%llu", (unsigned long long)c->host);
	snprintf(v[6], 48, "%lld", (long long)c->steps);
	snprintf(v[7], 48, "%lld", (long long)c->needles);
	fmt_num(v[8], 48, c->needles ? c->in_view / c->needles : NAN, "%.4f");
	snprintf(v[9], 48, "%lld", (long long)cell_median(c));
	fmt_num(v[10], 48, c->n_oracle ? c->overlap / c->n_oracle : NAN, "%.4f");
	fmt_num(v[11], 48, c->n_oracle ? c->mass / c->n_oracle : NAN, "%.4f");
	fmt_num(v[12], 48, c->n_oracle ? c->oracle_mass / c->n_oracle : NAN, "%.4f");
	fmt_num(v[13], 48, c->hits + c->misses ? (double)c->hits / (c->hits + c->misses) : NAN, "%.4f");
	snprintf(v[14], 48, "%.4f", c->view_bytes / n / 1e6);
	snprintf(v[15], 48, "%.4f", c->score_bytes / n / 1e6);
	snprintf(v[16], 48, "%.4f", c->nvme_bytes / n / 1e6);
	snprintf(v[17], 48, "%.4f", 1e3 * c->time_s / n);
	if (c->live_compared)
		snprintf(v[18], 48, "%lld/%lld", (long long)c->live_equal, (long long)c->live_compared);
	else
		snprintf(v[18], 48, "-");
}

static FILE *open_out(const char *path)
{
	FILE *f = !strcmp(path, "-") ? stdout : fopen(path, "w");

	if (!f)
		fprintf(stderr, "%s: %s: %s\n", WHO, path, strerror(errno));
	return f;
}

static int close_out(FILE *f, const char *path)
{
	if (f == stdout)
		return 0;
	if (ferror(f) | fclose(f))
		return fprintf(stderr, "%s: %s: write error\n", WHO, path), -1;
	return 0;
}

static int write_table(struct cell *cells, int n, const char *path, int md)
{
	FILE *f = open_out(path);

	if (!f)
		return -1;
	for (int i = 0; i < N_COLS; i++)
		fprintf(f, md ? "| %s " : "%s%s", md ? columns[i] : i ? "," : "", md ? "" : columns[i]);
	fprintf(f, md ? "|\n" : "\n");
	if (md) {
		for (int i = 0; i < N_COLS; i++)
			fprintf(f, "| --- ");
		fprintf(f, "|\n");
	}
	for (int k = 0; k < n; k++) {
		char v[N_COLS][48];

		cell_values(&cells[k], v);
		for (int i = 0; i < N_COLS; i++)
			fprintf(f, md ? "| %s " : "%s%s", md ? v[i] : i ? "," : "", md ? "" : v[i]);
		fprintf(f, md ? "|\n" : "\n");
	}
	return close_out(f, path);
}

/* A panel's "plot ", and for a panel with no finite point a line below its
 * range and the reason in its middle instead of its series (gnuplot stops
 * at a plot whose every point is undefined: "x range is invalid"). The
 * caller writes the series when shown. */
static void panel_plot(FILE *f, int shown, const char *why)
{
	if (!shown)
		fprintf(f, "set label 1 '%s' at graph 0.5, 0.5 center\nplot [0:1][0:1] -1 notitle\n"
			   "unset label 1", why);
	else
		fprintf(f, "plot ");
}

/*
 * Three panels with gnuplot: the recall proxy (needle in view where the
 * traces mark needles, else the oracle's mass held) against the budget, one
 * line per policy; the host hit rate against the pool size, one line per
 * replacement policy; the MB read per selection over the first trace's
 * selections, one line per policy at the first budget. The data and the
 * script are written beside the PNG (FILE.dat, FILE.gp) to tweak and rerun.
 */
static int plot(struct cell *cells, int n, const struct opts *o, const char *png)
{
	char dat[4200], gp[4200], cmd[8600];
	FILE *f;
	int nb = o->n_budget ? o->n_budget : 1, nc = o->n_cache ? o->n_cache : 1;
	int nh = o->n_host ? o->n_host : 1, npol = o->n_pol ? o->n_pol : 1;
	int needles = 0, rc, shown[3] = { 0 };	/* each panel's finite points */

	for (int k = 0; k < n; k++)
		needles |= cells[k].needles > 0;
	snprintf(dat, sizeof(dat), "%s.dat", png);
	snprintf(gp, sizeof(gp), "%s.gp", png);
	if (!(f = fopen(dat, "w")))
		return fprintf(stderr, "%s: %s: %s\n", WHO, dat, strerror(errno)), -1;
	/* Block 0: recall per (policy, budget) at the first cache setting. */
	for (int pi = 0; pi < npol; pi++) {
		fprintf(f, "# %s\n", cells[pi * n / npol].policy);
		for (int k = 0; k < n; k++) {
			struct cell *c = &cells[k];
			double y = needles ? (c->needles ? c->in_view / c->needles : NAN) :
				   (c->n_oracle ? c->mass / c->n_oracle : NAN);

			if (c->failed || c->policy != cells[pi * n / npol].policy || c->cache != cells[0].cache ||
			    c->host != cells[0].host || c->block != cells[0].block || c->qtok != cells[0].qtok)
				continue;
			fprintf(f, "%lld %.6f\n", (long long)c->budget_eff, y);
			shown[0] += isfinite(y);
		}
		fprintf(f, "\n\n");
	}
	/* Next: hit rate per (cache policy, host cap) for the first policy and budget. */
	for (int ci = 0; ci < nc; ci++) {
		fprintf(f, "# %s\n", o->n_cache ? o->cache[ci] : "lru");
		for (int k = 0; k < n; k++) {
			struct cell *c = &cells[k];

			if (c->failed || c->policy != cells[0].policy || c->budget != cells[0].budget ||
			    c->block != cells[0].block || c->qtok != cells[0].qtok ||
			    strcmp(c->cache, o->n_cache ? o->cache[ci] : "lru"))
				continue;
			fprintf(f, "%.3f %.6f\n", c->host / 1048576.0,
				c->hits + c->misses ? (double)c->hits / (c->hits + c->misses) : NAN);
			shown[1] += c->hits + c->misses > 0;
		}
		fprintf(f, "\n\n");
	}
	/* Last: MB per selection over the steps, per policy, first budget and cache. */
	for (int pi = 0; pi < npol; pi++) {
		struct cell *c = &cells[pi * n / npol];

		fprintf(f, "# %s\n", c->policy);
		for (int64_t s = 0; s < c->n_series; s++)
			fprintf(f, "%lld %.6f\n", (long long)s, c->series[s] / 1e6);
		shown[2] += c->n_series > 0;
		fprintf(f, "\n\n");
	}
	if (close_out(f, dat))
		return -1;
	if (!(f = fopen(gp, "w")))
		return fprintf(stderr, "%s: %s: %s\n", WHO, gp, strerror(errno)), -1;
	fprintf(f, "set terminal pngcairo size 1500,460 font ',10' noenhanced\n"
		   "set output '%s'\nset multiplot layout 1,3\nset key below horizontal\n"
		   "set grid\nset datafile missing 'nan'\n", png);
	fprintf(f, "set title '%s vs view budget'\nset xlabel 'budget (tokens)'\nset ylabel '%s'\n"
		   "set yrange [0:1.05]\n%s\n", needles ? "needle in view" : "oracle mass held",
		   needles ? "needle in view" : "share of the oracle mass held",
		   nb > 2 ? "set logscale x 2" : "unset logscale x");
	panel_plot(f, shown[0], "no needle or oracle mass in these traces");
	for (int pi = 0; shown[0] && pi < npol; pi++)
		fprintf(f, "%s'%s' index %d using 1:2 with linespoints lw 2 title '%s'", pi ? ", " : "",
			dat, pi, cells[pi * n / npol].policy);
	fprintf(f, "\nunset logscale x\nset title 'host pool hit rate (%s, budget %lld)'\n"
		   "set xlabel 'host pool (MiB)'\nset ylabel 'hit rate'\n%s\n", cells[0].policy,
		   (long long)cells[0].budget_eff, nh > 2 ? "set logscale x 2" : "");
	panel_plot(f, shown[1], "no host pool lookups in these cells");
	for (int ci = 0; shown[1] && ci < nc; ci++)
		fprintf(f, "%s'%s' index %d using 1:2 with linespoints lw 2 title '%s'", ci ? ", " : "",
			dat, npol + ci, o->n_cache ? o->cache[ci] : "lru");
	fprintf(f, "\nunset logscale x\nset title 'MB read per selection (first trace)'\n"
		   "set xlabel 'selection'\nset ylabel 'MB (pages, K+V)'\nset autoscale y\n");
	panel_plot(f, shown[2], "no selections read pages");
	for (int pi = 0; shown[2] && pi < npol; pi++)
		fprintf(f, "%s'%s' index %d using 1:2 with lines lw 1.5 title '%s'", pi ? ", " : "", dat,
			npol + nc + pi, cells[pi * n / npol].policy);
	fprintf(f, "\nunset multiplot\n");
	if (close_out(f, gp))
		return -1;
	snprintf(cmd, sizeof(cmd), "gnuplot '%s'", gp);
	rc = system(cmd);
	if (rc)
		return fprintf(stderr, "%s: gnuplot failed on %s (is gnuplot installed? "
			       "tools/deps.sh installs gnuplot-nox)\n", WHO, gp), -1;
	fprintf(stderr, "%s: wrote %s (data %s, script %s)\n", WHO, png, dat, gp);
	return 0;
}

static int lab_compare(int argc, char **argv)
{
	struct opts o = { 0 };
	kvmem_lab *labs[MAX_PAIRS] = { 0 };
	struct cell *cells = NULL;
	int n = 0, rc = parse(argc, argv, 'c', &o), err = 1;
	int npol, nb, nbl, nq, nc, nh;

	if (rc)
		return free_opts(&o), rc > 0 ? 0 : EXIT_USAGE;
	for (int t = 0; t < o.n_trace; t++)
		if (kvmem_lab_open(o.ws[o.n_ws == 1 ? 0 : t], o.trace[t], &labs[t])) {
			fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
			goto out;
		}
	bandwidths(&o);
	npol = o.n_pol ? o.n_pol : 1;
	nb = o.n_budget ? o.n_budget : 1;
	nbl = o.n_block ? o.n_block : 1;
	nq = o.n_qtok ? o.n_qtok : 1;
	nc = o.n_cache ? o.n_cache : 1;
	nh = o.n_host ? o.n_host : 1;
	cells = calloc((size_t)npol * nb * nbl * nq * nc * nh, sizeof(*cells));
	if (!cells) {
		fprintf(stderr, "%s: out of memory\n", WHO);
		goto out;
	}
	/* The table: policy outermost (the plot's lines), then budget, block,
	 * queries, pool. */
	for (int pi = 0; pi < npol; pi++)
		for (int bi = 0; bi < nb; bi++)
			for (int li = 0; li < nbl; li++)
				for (int qi = 0; qi < nq; qi++)
					for (int ci = 0; ci < nc; ci++)
						for (int hi = 0; hi < nh; hi++) {
							struct cell *c = &cells[n++];

							c->policy = o.n_pol ? o.pol[pi] :
								    kvmem_lab_info(labs[0])->policy;
							c->budget = o.n_budget ? o.budget[bi] : 0;
							c->block = o.n_block ? o.block[li] : 0;
							c->qtok = o.n_qtok ? o.qtok[qi] : 0;
							c->cache = o.n_cache ? o.cache[ci] : "lru";
							c->host = o.n_host ? o.host[hi] : 256ull << 20;
						}
	/* Run them with the policy innermost but one: each trace's oracle (it
	 * scores every key) is computed once per (budget, block, queries) and
	 * serves every policy and pool there. */
	for (int j = 0; j < n; j++) {
		int per_pol = n / npol, k = (j % npol) * per_pol + j / npol;
		struct cell *c = &cells[k];

		for (int t = 0; t < o.n_trace; t++) {
			kvmem_lab_params p;
			kvmem_lab_result r;

			params_of(&o, &p);
			p.policy = c->policy;
			p.budget = c->budget;
			p.block = c->block;
			p.query_tokens = c->qtok;
			p.cache_policy = c->cache;
			p.host_cap = c->host;
			if (kvmem_lab_replay(labs[t], &p, &r)) {
				/* One cell that cannot run (pins past a small budget)
				 * does not sink the others. */
				fprintf(stderr, "%s: %s: %s; the cell is left out\n", WHO, o.trace[t],
					kvmem_last_error());
				c->failed = 1;
				break;
			}
			rc = add_result(c, &r, t == 0);
			kvmem_lab_result_free(&r);
			if (rc) {
				fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
				goto out;
			}
		}
		if (isatty(2))
			fprintf(stderr, "%s: %d/%d cells\r", WHO, j + 1, n);
	}
	if (isatty(2))
		fprintf(stderr, "\n");
	if (!o.md && !o.csv)
		o.md = "-";
	if ((o.md && write_table(cells, n, o.md, 1)) || (o.csv && write_table(cells, n, o.csv, 0)) ||
	    (o.plot && plot(cells, n, &o, o.plot)))
		goto out;
	err = cli_stdout_ok(WHO) ? 1 : 0;
out:
	for (int k = 0; cells && k < n; k++) {
		free(cells[k].ranks);
		free(cells[k].series);
	}
	free(cells);
	for (int t = 0; t < o.n_trace; t++)
		kvmem_lab_close(labs[t]);
	free_opts(&o);
	return err;
}

int cmd_lab(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	if (!strcmp(argv[1], "info"))
		return lab_info(argc - 1, argv + 1);
	if (!strcmp(argv[1], "replay"))
		return lab_replay(argc - 1, argv + 1);
	if (!strcmp(argv[1], "compare"))
		return lab_compare(argc - 1, argv + 1);
	fprintf(stderr, "%s: unknown subcommand '%s' (info, replay, compare)\n", WHO, argv[1]);
	return EXIT_USAGE;
}
