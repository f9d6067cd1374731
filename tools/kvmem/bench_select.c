// SPDX-License-Identifier: MIT
/*
 * kvmem bench select: the time to score every block, choose the best and
 * plan the view, against the number of blocks (1K..1M), on a synthesised
 * index of the Qwen3-8B geometry (36 layers, 8 KV heads, head_dim 128, 32
 * query heads). Each size is also put against its floor: reading the index
 * once at the memory bandwidth measured in the same run.
 *
 * The fp32 index of 1M blocks at full depth is 151 GB. A size whose index
 * does not fit the memory limit (--mem, default 40% of available memory)
 * is measured over as many layers as fit and its scoring time scaled to the
 * full depth (scoring is linear in layers: one pass per (layer, KV head));
 * such rows say "est." and how many layers were measured. --layers N
 * measures N layers for every size instead (no scaling); --no-estimate
 * skips what does not fit.
 */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvmem/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/workspace.h"
#include "cli_util.h"
#include "cmd.h"

#define GEO_LAYERS 36
#define GEO_KV_HEADS 8
#define GEO_HEADS 32
#define GEO_HEAD_DIM 128

struct bench_opts {
	int64_t sizes[32];
	int n_sizes;
	int layers, block, query_tokens, reps, json, estimate;
	int64_t budget;
	uint64_t mem;		/* bytes the index may take; 0: 40% of what is available */
	const char *policy;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem bench select [options]\n"
		"\n"
		"Scoring + choosing + planning time against the number of blocks, on a\n"
		"synthesised index of the Qwen3-8B geometry, per block and as a multiple of\n"
		"the floor: reading the index once at the memory bandwidth measured here.\n"
		"\n"
		"options:\n"
		"  --blocks LIST     block counts, comma separated (k, M: powers of 1000)\n"
		"                    (default 1024,4096,16384,65536,262144,1048576)\n"
		"  --policy NAME     meank (default), subblock, quest, recency or random\n"
		"                    (refine and oracle read K pages: kvmem bench recall)\n"
		"  --budget N        view budget in tokens (default 131072)\n"
		"  --block N         tokens per block (default 32; only sets token counts)\n"
		"  --query-tokens N  query tokens per selection (default 4)\n"
		"  --layers N        synthesise and score N layers for every size (no scaling)\n"
		"  --mem SIZE        memory the index may take (default 40%% of available;\n"
		"                    k, M, G, T: powers of 1024)\n"
		"  --no-estimate     skip sizes that do not fit instead of scaling fewer layers\n"
		"  --reps N          selections per size; the best is reported (default 3)\n"
		"  --threads N       OpenMP threads (default: all)\n"
		"  --json            one JSON object per size\n"
		"  --help            this text\n"
		"\n"
		"examples:\n"
		"  kvmem bench select\n"
		"  kvmem bench select --blocks 64k,1M --policy subblock --mem 8G --json\n");
}

static int parse_args(int argc, char **argv, struct bench_opts *o)
{
	static const struct option opts[] = {
		{ "blocks", required_argument, NULL, 'b' },	  { "policy", required_argument, NULL, 'p' },
		{ "budget", required_argument, NULL, 'B' },	  { "block", required_argument, NULL, 'k' },
		{ "query-tokens", required_argument, NULL, 'q' }, { "layers", required_argument, NULL, 'l' },
		{ "mem", required_argument, NULL, 'm' },	  { "no-estimate", no_argument, NULL, 'E' },
		{ "reps", required_argument, NULL, 'r' },	  { "threads", required_argument, NULL, 't' },
		{ "json", no_argument, NULL, 'j' },		  { "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const int64_t def[] = { 1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20 };
	const char *w = "kvmem bench select";
	int c, threads;

	memset(o, 0, sizeof(*o));
	o->block = 32;
	o->query_tokens = 4;
	o->reps = 3;
	o->budget = 131072;
	o->estimate = 1;
	o->policy = "meank";
	o->n_sizes = 6;
	memcpy(o->sizes, def, sizeof(def));
	cli_getopt_reset();
	while ((c = cli_getopt(w, argc, argv, opts)) != -1) {
		const char *name = cli_optname;
		int bad = 0;

		switch (c) {
		case 'h': usage(stdout); return 1;
		case 'j': o->json = 1; break;
		case 'E': o->estimate = 0; break;
		case 'p': o->policy = optarg; break;
		case 'b': {
			char *list = strdup(optarg), *save = NULL;

			o->n_sizes = 0;
			for (char *t = list ? strtok_r(list, ",", &save) : NULL; t && !bad;
			     t = strtok_r(NULL, ",", &save)) {
				if (o->n_sizes == 32) {
					fprintf(stderr, "%s: --blocks takes at most 32 counts\n", w);
					bad = 1;
				} else {
					bad = cli_parse_count(w, name, t, 1, 1ll << 32, &o->sizes[o->n_sizes++]);
				}
			}
			if (!bad && (!list || !o->n_sizes)) {
				fprintf(stderr, "%s: --blocks wants a list of counts\n", w);
				bad = 1;
			}
			free(list);
			break;
		}
		case 'B': bad = cli_parse_count(w, name, optarg, 1, INT32_MAX / 2, &o->budget); break;
		case 'k': bad = cli_parse_int(w, name, optarg, 1, 1 << 20, &o->block); break;
		case 'q': bad = cli_parse_int(w, name, optarg, 1, 4096, &o->query_tokens); break;
		case 'l': bad = cli_parse_int(w, name, optarg, 0, GEO_LAYERS, &o->layers); break;
		case 'r': bad = cli_parse_int(w, name, optarg, 1, 1000, &o->reps); break;
		case 'm': bad = cli_parse_size(w, name, optarg, 1 << 20, 1ull << 50, &o->mem); break;
		case 't':
			bad = cli_parse_int(w, name, optarg, 1, 4096, &threads);
			if (!bad)
				omp_set_num_threads(threads);
			break;
		default: return -1;
		}
		if (bad)
			return -1;
	}
	if (optind < argc) {
		fprintf(stderr, "%s: unexpected argument '%s'\n", w, argv[optind]);
		return -1;
	}
	return 0;
}

/* ---- the machine ------------------------------------------------------ */
static double meminfo_gb(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	double kb = 0;

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, key, strlen(key)))
			kb = atof(line + strlen(key));
	if (f)
		fclose(f);
	return kb * 1024 / 1e9;
}

static void cpu_model(char *buf, size_t len)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];

	snprintf(buf, len, "unknown CPU");
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
			snprintf(buf, len, "%s", strchr(line, ':') + 2);
			buf[strcspn(buf, "\n")] = 0;
			break;
		}
	if (f)
		fclose(f);
}

/* Sum of a float array with sixteen running sums: the read loop the floor
 * is measured with, vectorised like the scoring dots. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static float read_all(const float *x, size_t n)
{
	float total = 0;

#pragma omp parallel reduction(+ : total)
	{
		float acc[16] = { 0 };

#pragma omp for schedule(static)
		for (size_t i = 0; i < n / 16; i++)
			for (int u = 0; u < 16; u++)
				acc[u] += x[i * 16 + u];
		for (int u = 0; u < 16; u++)
			total += acc[u];
	}
	return total;
}

/* Read bandwidth in GB/s over a buffer of `bytes`, the best of a few passes. */
static double measure_bandwidth(size_t bytes)
{
	size_t n = bytes / sizeof(float);
	float *x = malloc(n * sizeof(float)), sink = 0;
	double best = 0;

	if (!x)
		return 0;
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(i & 1023);
	for (int r = 0; r < 5; r++) {
		double t = cli_now_s();

		sink += read_all(x, n);
		t = cli_now_s() - t;
		if (bytes / t / 1e9 > best)
			best = bytes / t / 1e9;
	}
	free(x);
	return sink == -1 ? 0 : best;
}

/* ---- one size ------------------------------------------------------------ */
static void fill_random(float *x, size_t n, uint64_t seed)
{
#pragma omp parallel
	{
		int t = omp_get_thread_num(), nt = omp_get_num_threads();
		size_t a = n / nt * t, b = t == nt - 1 ? n : n / nt * (t + 1);
		uint64_t s = kvmem_rng_seed(seed + 7919 * (uint64_t)t);

		for (size_t i = a; i < b; i++)
			x[i] = (float)(kvmem_rng_uniform(&s) * 2 - 1);
	}
}

struct row {
	int64_t blocks;
	int layers, estimated;
	double index_gb, score_ms, plan_ms, total_ms, floor_ms;
	int n_view;
};

/* Bytes of index per block and layer the policy reads. */
static double index_bytes_per_block_layer(const kvmem_policy_ops *p)
{
	double per = (double)GEO_KV_HEADS * GEO_HEAD_DIM * sizeof(float);

	if (p->needs & KVMEM_SUM_MINMAX)
		return per * 3;
	if (p->needs & KVMEM_SUM_SUBBLOCK)
		return per * (1 + KVMEM_SUBBLOCKS);
	return per;
}

/* Only what the policy reads is counted against memory and the floor. */
static double read_bytes_per_block_layer(const kvmem_policy_ops *p)
{
	double per = (double)GEO_KV_HEADS * GEO_HEAD_DIM * sizeof(float);

	if (p->needs & KVMEM_SUM_MINMAX)
		return per * 2;
	if (p->needs & KVMEM_SUM_SUBBLOCK)
		return per * KVMEM_SUBBLOCKS;
	if (!strcmp(p->name, "recency") || !strcmp(p->name, "random"))
		return 0;
	return per;
}

static int run_size(const struct bench_opts *o, const kvmem_policy_ops *pol, int64_t nb,
		    int layers, double bw, struct row *row)
{
	kvmem_index ix;
	kvmem_blocks r;
	kvmem_plan plan = { 0 };
	kvmem_select_ctx c;
	kvmem_plan_params pp = { o->budget, o->budget / 100, o->budget / 12 };
	int sets = pol->per_layer ? layers : 1, rc = -1;
	size_t qn = (size_t)layers * o->query_tokens * GEO_HEADS * GEO_HEAD_DIM;
	float *q = malloc(qn * sizeof(float)), *scores = malloc(sizeof(float) * sets * nb);
	int64_t *qpos = malloc(sizeof(int64_t) * o->query_tokens);
	size_t per = (size_t)GEO_HEAD_DIM * nb;

	memset(row, 0, sizeof(*row));
	if (kvmem_index_init(&ix, layers, GEO_KV_HEADS, GEO_HEAD_DIM, o->block, pol->needs)) {
		free(q);
		free(scores);
		free(qpos);
		return -1;
	}
	if (kvmem_blocks_init(&r, o->block) || !q || !scores || !qpos ||
	    kvmem_index_reserve(&ix, nb))
		goto out;
	r.n_tokens = nb * o->block;
	ix.n_tokens = r.n_tokens;
	ix.n_blocks = nb;
	/* The system prompt is pinned, as in an agent session. */
	kvmem_blocks_pin(&r, 0, 1000 < r.n_tokens ? 1000 : r.n_tokens);
	for (int l = 0; l < layers; l++)
		for (int h = 0; h < GEO_KV_HEADS; h++) {
			size_t run = (((size_t)l * GEO_KV_HEADS + h) * ix.cap_blocks) * GEO_HEAD_DIM;

			fill_random(ix.meank + run, per, run + 1);
			if (ix.kmin) {
				fill_random(ix.kmin + run, per, run + 2);
				fill_random(ix.kmax + run, per, run + 3);
			}
			if (ix.sub)
				fill_random(ix.sub + run * KVMEM_SUBBLOCKS, per * KVMEM_SUBBLOCKS, run + 4);
		}
	fill_random(q, qn, 99);
	for (int t = 0; t < o->query_tokens; t++)
		qpos[t] = r.n_tokens - o->query_tokens + t;
	c = (kvmem_select_ctx){
		.index = &ix, .n_tokens = r.n_tokens, .n_blocks = nb, .block = o->block,
		.n_layers = layers, .n_heads = GEO_HEADS, .n_kv_heads = GEO_KV_HEADS,
		.head_dim = GEO_HEAD_DIM, .rope_theta = 1e6, .n_q = o->query_tokens, .q = q,
		.q_pos = qpos, .seed = 1,
		/* As a session scores: distance-averaged queries (same cost). */
		.span = o->budget + o->budget / 8, .budget = o->budget,
	};
	row->score_ms = row->plan_ms = row->total_ms = 1e30;
	for (int rep = 0; rep < o->reps; rep++) {
		double t0 = cli_now_s(), t1, t2;

		c.step = rep;
		if (pol->score(&c, scores))
			goto out;
		t1 = cli_now_s();
		if (kvmem_plan_build(&plan, &r, scores, sets, &plan, &pp))
			goto out;
		t2 = cli_now_s();
		if ((t2 - t0) * 1e3 < row->total_ms) {
			row->score_ms = (t1 - t0) * 1e3;
			row->plan_ms = (t2 - t1) * 1e3;
			row->total_ms = (t2 - t0) * 1e3;
		}
	}
	row->n_view = plan.n_view;
	row->blocks = nb;
	row->layers = layers;
	row->estimated = layers < GEO_LAYERS && !o->layers;
	row->index_gb = read_bytes_per_block_layer(pol) * nb * GEO_LAYERS / 1e9;
	if (row->estimated) {
		/* Scoring is one pass per (layer, KV head): linear in layers. A
		 * per-layer policy also plans once per layer. */
		row->score_ms *= (double)GEO_LAYERS / layers;
		if (pol->per_layer)
			row->plan_ms *= (double)GEO_LAYERS / layers;
		row->total_ms = row->score_ms + row->plan_ms;
	}
	if (o->layers)
		row->index_gb = row->index_gb * layers / GEO_LAYERS;
	row->floor_ms = bw > 0 ? row->index_gb / bw * 1e3 : 0;
	rc = 0;
out:
	if (rc)
		fprintf(stderr, "kvmem bench select: %lld blocks: %s\n", (long long)nb, kvmem_last_error());
	kvmem_plan_free(&plan);
	kvmem_blocks_free(&r);
	kvmem_index_free(&ix);
	free(q);
	free(scores);
	free(qpos);
	return rc;
}

static void print_row(const struct bench_opts *o, const struct row *w)
{
	double per_block_ns = w->total_ms * 1e6 / w->blocks;

	if (o->json) {
		printf("{\"blocks\":%lld,\"tokens\":%lld,\"layers_measured\":%d,\"estimated\":%s,"
		       "\"index_gb\":%.4f,\"score_ms\":%.4f,\"plan_ms\":%.4f,\"total_ms\":%.4f,"
		       "\"ns_per_block\":%.2f,\"floor_ms\":%.4f,\"x_floor\":%.3f,\"view_blocks\":%d}\n",
		       (long long)w->blocks, (long long)w->blocks * o->block, w->layers,
		       w->estimated ? "true" : "false", w->index_gb, w->score_ms, w->plan_ms,
		       w->total_ms, per_block_ns, w->floor_ms,
		       w->floor_ms > 0 ? w->total_ms / w->floor_ms : 0, w->n_view);
		return;
	}
	printf("%9lld %10lld %4d%-5s %9.3f %10.2f %8.2f %10.2f %9.1f %9.2f %7.2f\n",
	       (long long)w->blocks, (long long)w->blocks * o->block, w->layers,
	       w->estimated ? " est" : "", w->index_gb, w->score_ms, w->plan_ms, w->total_ms,
	       per_block_ns, w->floor_ms, w->floor_ms > 0 ? w->total_ms / w->floor_ms : 0);
}

int bench_select(int argc, char **argv)
{
	struct bench_opts o;
	const kvmem_policy_ops *pol;
	char cpu[256];
	double avail = meminfo_gb("MemAvailable:"), limit, bw;
	size_t bw_bytes;

	switch (parse_args(argc, argv, &o)) {
	case 1:
		return 0;
	case -1:
		return EXIT_USAGE;
	}
	if (!(pol = kvmem_policy_find(o.policy))) {
		fprintf(stderr, "kvmem bench select: %s\n", kvmem_last_error());
		return EXIT_USAGE;
	}
	if (pol->needs & KVMEM_NEED_KEYS) {
		fprintf(stderr, "kvmem bench select: policy %s reads every page, not the index: "
			"it has no place in this benchmark\n", pol->name);
		return EXIT_USAGE;
	}
	limit = o.mem ? o.mem / 1e9 : 0.4 * avail;
	cpu_model(cpu, sizeof(cpu));
	/* The floor's buffer: large enough to defeat caches, small enough to share. */
	bw_bytes = (size_t)(limit * 1e9 / 4) < (1ul << 30) ? (size_t)(limit * 1e9 / 4) : (1ul << 30);
	bw = measure_bandwidth(bw_bytes);
	fprintf(o.json ? stderr : stdout,
		"kvmem bench select: policy %s, Qwen3-8B geometry (%d layers, %d KV heads, head_dim %d, "
		"%d query heads), block %d, budget %lld tokens, %d query tokens, best of %d\n"
		"machine: %s, %ld cores, %d OpenMP threads, %.1f GB memory (%.1f GB available, "
		"index limit %.1f GB)\n"
		"floor: index bytes read once at %.2f GB/s (read loop over %.2f GB, this run)\n",
		pol->name, GEO_LAYERS, GEO_KV_HEADS, GEO_HEAD_DIM, GEO_HEADS, o.block,
		(long long)o.budget, o.query_tokens, o.reps, cpu, sysconf(_SC_NPROCESSORS_ONLN),
		omp_get_max_threads(), meminfo_gb("MemTotal:"), avail, limit, bw, bw_bytes / 1e9);
	if (!o.json)
		printf("\n%9s %10s %9s %9s %10s %8s %10s %9s %9s %7s\n", "blocks", "tokens",
		       "layers", "index GB", "score ms", "plan ms", "total ms", "ns/block",
		       "floor ms", "x floor");
	for (int i = 0; i < o.n_sizes; i++) {
		int64_t nb = o.sizes[i];
		double per_layer = index_bytes_per_block_layer(pol) * nb / 1e9 +
				   (double)nb * 12 / 1e9 / GEO_LAYERS;
		int layers = o.layers ? o.layers : GEO_LAYERS;
		struct row w;

		if (per_layer * layers > limit) {
			int fit = (int)(limit / per_layer);

			if (o.layers || !o.estimate || fit < 1) {
				fprintf(o.json ? stderr : stdout,
					"%9lld   skipped: %d layers of index need %.1f GB, over the %.1f GB "
					"limit%s\n", (long long)nb, layers, per_layer * layers, limit,
					fit < 1 ? " even for one layer" : " (drop --no-estimate / --layers "
					"to scale fewer layers)");
				continue;
			}
			layers = fit;
		}
		if (run_size(&o, pol, nb, layers, bw, &w))
			return 1;
		print_row(&o, &w);
		fflush(stdout);
	}
	if (!o.json)
		printf("\nest: measured over the layers shown and scaled to %d (scoring is one pass per "
		       "layer and KV head).\nx floor: total time over the time to read the index "
		       "bytes the policy reads once at the measured bandwidth.\n", GEO_LAYERS);
	return 0;
}
