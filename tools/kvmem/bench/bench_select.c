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
 *
 * --backend cuda runs the same selection on the GPU (kernels/cuda/): the
 * index synthesised on the device (bf16 by default, as the GPU keeps it),
 * the distance-averaged queries, the scorer, and the planner's choice of
 * blocks (kvmem_cuda_plan_blocks: the mandatory blocks, then the k best)
 * downloaded as a sorted block list with its view positions. The floor is
 * the index bytes read once at the device's copy rate measured in the same
 * run; the first size also checks that the GPU's blocks are the ones
 * kvmem_plan_build picks from the same scores.
 */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels_cuda.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "session/inspect.h"
#include "cli_util.h"
#include "cmd.h"

#define GEO_LAYERS 36
#define GEO_KV_HEADS 8
#define GEO_HEADS 32
#define GEO_HEAD_DIM 128

/* The CUDA ops, when the CLI is built with them (weak: absent otherwise;
 * kernels/cuda/cuda.mk pulls their objects in with -u). */
#pragma weak kvmem_cuda_device_count
#pragma weak kvmem_cuda_ctx_create
#pragma weak kvmem_cuda_ctx_destroy
#pragma weak kvmem_cuda_device_name
#pragma weak kvmem_cuda_malloc
#pragma weak kvmem_cuda_free
#pragma weak kvmem_cuda_upload
#pragma weak kvmem_cuda_download
#pragma weak kvmem_cuda_random_bf16
#pragma weak kvmem_cuda_group_queries
#pragma weak kvmem_cuda_score_meank
#pragma weak kvmem_cuda_score_subblock
#pragma weak kvmem_cuda_plan_blocks
#pragma weak kvmem_cuda_sync
#pragma weak kvmem_cuda_copy_gbps
#pragma weak kvmem_cuda_mem_info

struct bench_opts {
	int64_t sizes[32];
	int n_sizes;
	int layers, block, query_tokens, reps, json, estimate;
	int64_t budget;
	uint64_t mem;		/* bytes the index may take; 0: 40% of what is available */
	const char *policy;
	int cuda;		/* --backend cuda */
	int index_dtype;	/* the GPU index: KVMEM_DTYPE_BF16 (default) or _F32 */
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
		"  --backend NAME    cpu (default) or cuda: score, choose and plan on the GPU\n"
		"                    (meank, subblock), the index on the device\n"
		"  --index TYPE      the GPU index: bf16 (default) or f32\n"
		"  --json            one JSON object per size\n"
		"  --help            this text\n"
		"\n"
		"examples:\n"
		"  kvmem bench select\n"
		"  kvmem bench select --blocks 64k,1M --policy subblock --mem 8G --json\n"
		"  kvmem bench select --backend cuda --blocks 1k,32k,312500\n");
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
		{ "backend", required_argument, NULL, 'x' },	  { "index", required_argument, NULL, 'i' },
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
	o->index_dtype = KVMEM_DTYPE_BF16;
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
		case 'x':
			if (!strcmp(optarg, "cuda")) {
				o->cuda = 1;
			} else if (strcmp(optarg, "cpu")) {
				fprintf(stderr, "%s: %s: '%s' is not cpu or cuda\n", w, name, optarg);
				bad = 1;
			}
			break;
		case 'i':
			if (!strcmp(optarg, "bf16") || !strcmp(optarg, "f32")) {
				o->index_dtype = optarg[0] == 'b' ? KVMEM_DTYPE_BF16 : KVMEM_DTYPE_F32;
			} else {
				fprintf(stderr, "%s: %s: '%s' is not bf16 or f32\n", w, name, optarg);
				bad = 1;
			}
			break;
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
	if (cli_no_operands(w, argc, argv))
		return -1;
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
	kvmem_plan_params pp = { o->budget, o->budget / 100, o->budget / 12,
				  KVMEM_LAYOUT_COMPACT };
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

/* ---- the GPU -------------------------------------------------------------- */
/* Mandatory blocks as kvmem_plan_build claims them for this benchmark's
 * blocks (pins over the first 1000 tokens, sink, recent, the newest): the
 * first `head` and the last `tail` blocks (all full: tokens = blocks x B). */
static void mandatory_blocks(const struct bench_opts *o, int64_t nb, int64_t *head, int64_t *tail,
			     int64_t *k)
{
	const int64_t B = o->block, pins = (1000 + B - 1) / B;
	const int64_t sink = (o->budget / 100 + B - 1) / B, recent = (o->budget / 12 + B - 1) / B;

	*head = pins > sink ? pins : sink;
	*tail = recent > 1 ? recent : 1;
	if (*head > nb)
		*head = nb;
	if (*tail > nb - *head)
		*tail = nb - *head;
	*k = (o->budget - (*head + *tail) * B) / B;
	if (*k < 0)
		*k = 0;
}

/* Random values in device memory: bf16 made there, fp32 uploaded from a
 * host chunk repeated at shifting offsets. */
static int gpu_fill(kvmem_cuda_ctx *c, void *d, size_t n, int dtype, uint64_t seed)
{
	const size_t chunk = (size_t)1 << 24;
	float *h;
	int rc = 0;

	if (dtype == KVMEM_DTYPE_BF16)
		return kvmem_cuda_random_bf16(c, d, n, seed, 1.0f);
	if (!(h = malloc((chunk + 4096) * sizeof(float))))
		return kvmem_error(ENOMEM, "out of memory");
	fill_random(h, chunk + 4096, seed);
	for (size_t at = 0, sh = 0; at < n && !rc; at += chunk, sh = (sh + 61) % 4096)
		rc = kvmem_cuda_upload(c, (float *)d + at, h + sh,
				       sizeof(float) * (n - at < chunk ? n - at : chunk));
	free(h);
	return rc;
}

static int run_size_cuda(const struct bench_opts *o, kvmem_cuda_ctx *c, int sub, int64_t nb,
			 int layers, double bw, int check, struct row *row)
{
	const int per = sub ? 4 : 1, eb = o->index_dtype == KVMEM_DTYPE_BF16 ? 2 : 4;
	const size_t rows = (size_t)layers * GEO_KV_HEADS * nb * per * GEO_HEAD_DIM;
	const size_t qn = (size_t)layers * o->query_tokens * GEO_HEADS * GEO_HEAD_DIM;
	kvmem_score_geom g = { .n_layers = layers, .n_heads = GEO_HEADS, .n_kv_heads = GEO_KV_HEADS,
			       .head_dim = GEO_HEAD_DIM, .block = o->block, .n_blocks = nb,
			       .cap_blocks = nb, .last_len = o->block,
			       .last_sub = { o->block / 4, o->block / 4, o->block / 4, o->block / 4 },
			       .index_dtype = o->index_dtype };
	void *ix = NULL, *q = NULL, *gq = NULL, *sc = NULL, *out = NULL;
	float *hq = malloc(qn * sizeof(float));
	int64_t *blocks = malloc(sizeof(int64_t) * (nb + 1)), *start = malloc(sizeof(int64_t) * (nb + 1));
	int64_t head, tail, k, cnt = 0;
	int rc = -1;

	memset(row, 0, sizeof(*row));
	mandatory_blocks(o, nb, &head, &tail, &k);
	if (!hq || !blocks || !start) {
		kvmem_error(ENOMEM, "out of memory");
		goto out;
	}
	if (kvmem_cuda_malloc(&ix, rows * eb) || kvmem_cuda_malloc(&q, qn * 4) ||
	    kvmem_cuda_malloc(&gq, (size_t)layers * GEO_KV_HEADS * GEO_HEAD_DIM * 4) ||
	    kvmem_cuda_malloc(&sc, 4 * (size_t)nb) || kvmem_cuda_malloc(&out, 8 * (size_t)(nb + 1)) ||
	    gpu_fill(c, ix, rows, o->index_dtype, 0x5e1ec7 + nb))
		goto out;
	fill_random(hq, qn, 99);
	if (kvmem_cuda_upload(c, q, hq, qn * 4) || kvmem_cuda_sync(c))
		goto out;
	row->score_ms = row->plan_ms = row->total_ms = 1e30;
	for (int rep = -1; rep < o->reps; rep++) {	/* rep -1: warm-up */
		double t0 = cli_now_s(), t1, t2;
		int64_t pos = 0;

		if (kvmem_cuda_group_queries(c, gq, q, layers, o->query_tokens, GEO_HEADS, GEO_KV_HEADS,
					     GEO_HEAD_DIM, 1e6, o->budget + o->budget / 8) ||
		    (sub ? kvmem_cuda_score_subblock(c, sc, ix, gq, &g)
			 : kvmem_cuda_score_meank(c, sc, ix, gq, &g)) ||
		    kvmem_cuda_sync(c))
			goto out;
		t1 = cli_now_s();
		if ((cnt = kvmem_cuda_plan_blocks(c, out, sc, nb, head, tail, k)) < 0 ||
		    kvmem_cuda_download(c, blocks, out, 8 * (size_t)cnt))
			goto out;
		for (int64_t i = 0; i < cnt; i++) {	/* view positions: all blocks full */
			start[i] = pos;
			pos += o->block;
		}
		t2 = cli_now_s();
		if (rep >= 0 && (t2 - t0) * 1e3 < row->total_ms) {
			row->score_ms = (t1 - t0) * 1e3;
			row->plan_ms = (t2 - t1) * 1e3;
			row->total_ms = (t2 - t0) * 1e3;
		}
	}
	if (check) {	/* the same scores through kvmem_plan_build */
		float *hs = malloc(4 * (size_t)nb);
		kvmem_blocks r;
		kvmem_plan plan = { 0 };
		kvmem_plan_params pp = { o->budget, o->budget / 100, o->budget / 12,
				  KVMEM_LAYOUT_COMPACT };
		int same;

		if (!hs || kvmem_blocks_init(&r, o->block)) {
			free(hs);
			goto out;
		}
		r.n_tokens = nb * o->block;
		kvmem_blocks_pin(&r, 0, 1000 < r.n_tokens ? 1000 : r.n_tokens);
		if (kvmem_cuda_group_queries(c, gq, q, layers, o->query_tokens, GEO_HEADS, GEO_KV_HEADS,
					     GEO_HEAD_DIM, 1e6, o->budget + o->budget / 8) ||
		    (sub ? kvmem_cuda_score_subblock(c, sc, ix, gq, &g)
			 : kvmem_cuda_score_meank(c, sc, ix, gq, &g)) ||
		    kvmem_cuda_download(c, hs, sc, 4 * (size_t)nb) ||
		    kvmem_plan_build(&plan, &r, hs, 1, NULL, &pp)) {
			free(hs);
			kvmem_blocks_free(&r);
			goto out;
		}
		same = plan.n_view == cnt && !memcmp(plan.blocks, blocks, 8 * (size_t)cnt);
		fprintf(o->json ? stderr : stdout, "plan check at %lld blocks: the GPU's %lld blocks %s "
			"kvmem_plan_build's %d\n", (long long)nb, (long long)cnt,
			same ? "are" : "DIFFER FROM", plan.n_view);
		kvmem_plan_free(&plan);
		kvmem_blocks_free(&r);
		free(hs);
		if (!same) {
			kvmem_error(EBADMSG, "the GPU's plan differs from kvmem_plan_build's");
			goto out;
		}
	}
	row->n_view = (int)cnt;
	row->blocks = nb;
	row->layers = layers;
	row->estimated = layers < GEO_LAYERS && !o->layers;
	row->index_gb = (double)GEO_KV_HEADS * GEO_HEAD_DIM * per * eb * nb * GEO_LAYERS / 1e9;
	if (row->estimated) {
		row->score_ms *= (double)GEO_LAYERS / layers;
		row->total_ms = row->score_ms + row->plan_ms;
	}
	if (o->layers)
		row->index_gb = row->index_gb * layers / GEO_LAYERS;
	row->floor_ms = bw > 0 ? row->index_gb / bw * 1e3 : 0;
	rc = 0;
out:
	if (rc)
		fprintf(stderr, "kvmem bench select: %lld blocks on the GPU: %s\n", (long long)nb,
			kvmem_last_error());
	kvmem_cuda_free(ix);
	kvmem_cuda_free(q);
	kvmem_cuda_free(gq);
	kvmem_cuda_free(sc);
	kvmem_cuda_free(out);
	free(hq);
	free(blocks);
	free(start);
	return rc;
}

static void print_row(const struct bench_opts *o, const struct row *w);

static int bench_select_cuda(const struct bench_opts *o, const kvmem_policy_ops *pol)
{
	const int sub = !!(pol->needs & KVMEM_SUM_SUBBLOCK), eb = o->index_dtype == KVMEM_DTYPE_BF16 ? 2 : 4;
	kvmem_cuda_ctx *c = NULL;
	size_t free_b = 0, total_b = 0;
	double bw, limit;
	int rc = 1;

	if (!kvmem_cuda_ctx_create || !kvmem_cuda_plan_blocks) {
		fprintf(stderr, "kvmem bench select: --backend cuda: this kvmem was built without CUDA\n");
		return EXIT_USAGE;
	}
	if (strcmp(pol->name, "meank") && strcmp(pol->name, "subblock")) {
		fprintf(stderr, "kvmem bench select: --backend cuda scores meank and subblock, not %s\n",
			pol->name);
		return EXIT_USAGE;
	}
	if (kvmem_cuda_device_count() < 1) {
		fprintf(stderr, "kvmem bench select: --backend cuda: no CUDA device here\n");
		return 1;
	}
	if (kvmem_cuda_ctx_create(&c, 0) < 0 || kvmem_cuda_mem_info(&free_b, &total_b) < 0)
		goto err;
	if ((bw = kvmem_cuda_copy_gbps(c, (size_t)2 << 30)) < 0)
		goto err;
	limit = o->mem ? o->mem / 1e9 : 0.8 * free_b / 1e9;
	fprintf(o->json ? stderr : stdout,
		"kvmem bench select: policy %s on the GPU, Qwen3-8B geometry (%d layers, %d KV heads, "
		"head_dim %d, %d query heads), block %d, budget %lld tokens, %d query tokens, best of "
		"%d\nmachine: %s, %.1f GB device memory (%.1f GB free, index limit %.1f GB), %s index\n"
		"floor: index bytes read once at the copy rate %.0f GB/s (a 2 GiB device copy, read + "
		"written, this run)\n", pol->name, GEO_LAYERS, GEO_KV_HEADS, GEO_HEAD_DIM, GEO_HEADS,
		o->block, (long long)o->budget, o->query_tokens, o->reps, kvmem_cuda_device_name(c),
		total_b / 1e9, free_b / 1e9, limit, eb == 2 ? "bf16" : "fp32", bw);
	if (!o->json)
		printf("\n%9s %10s %9s %9s %10s %8s %10s %9s %9s %7s\n", "blocks", "tokens", "layers",
		       "index GB", "score ms", "plan ms", "total ms", "ns/block", "floor ms", "x floor");
	for (int i = 0; i < o->n_sizes; i++) {
		const int64_t nb = o->sizes[i];
		/* the index, the scorer's z / e arrays (4 bytes per pair and item) */
		const double per_layer = ((double)GEO_KV_HEADS * GEO_HEAD_DIM * eb + GEO_KV_HEADS * 4) *
					 (sub ? 4 : 1) * nb / 1e9;
		int layers = o->layers ? o->layers : GEO_LAYERS;
		struct row w;

		if (per_layer * layers > limit) {
			int fit = (int)(limit / per_layer);

			if (o->layers || !o->estimate || fit < 1) {
				fprintf(o->json ? stderr : stdout, "%9lld   skipped: %d layers need %.1f GB "
					"of device memory, over the %.1f GB limit\n", (long long)nb, layers,
					per_layer * layers, limit);
				continue;
			}
			layers = fit;
		}
		if (run_size_cuda(o, c, sub, nb, layers, bw, i == 0, &w))
			goto out;
		print_row(o, &w);
		fflush(stdout);
	}
	if (!o->json)
		printf("\nscore: the queries and the scorer; plan: the planner's blocks chosen on the GPU "
		       "(mandatory + top-k)\nand downloaded in order with their positions. x floor: total "
		       "over the index read once at the copy rate.\n");
	rc = 0;
	goto out;
err:
	fprintf(stderr, "kvmem bench select: %s\n", kvmem_last_error());
out:
	kvmem_cuda_ctx_destroy(c);
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
	if (pol->needs & KVMEM_NEED_TEXT) {
		fprintf(stderr, "kvmem bench select: policy %s reads token ids, not the index: "
			"kvmem bench recall times it\n", pol->name);
		return EXIT_USAGE;
	}
	if (o.cuda)
		return bench_select_cuda(&o, pol);
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
