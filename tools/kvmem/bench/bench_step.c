// SPDX-License-Identifier: MIT
/*
 * kvmem bench step: the paging pipeline on a backend, each figure beside its
 * ceiling or peer measured in the same run (Documentation/benchmarks.md,
 * "GPU paging"). Phases (--only picks some):
 *
 *   ceilings  the backend's: GEMM, device copy, one large pinned host ->
 *             device copy (the rematerialisation peak) and back.
 *   remat     pages in registered (pinned, mapped) host memory placed into
 *             view slots, re-RoPE'd, in calls of 1024 pages as a session
 *             makes them: method gather (one kernel reading the pages over
 *             PCIe) and batch (cudaMemcpyBatchAsync, then the kernel from
 *             HBM), beside the pack path (CPU bf16 packing, the first
 *             version), pages in unregistered memory (staged), and pages
 *             served by the device page pool; GB/s of page bytes over the
 *             pinned copy peak.
 *   coldin    a workspace read cold from NVMe into view slots through the
 *             pager (prefetch everything, then fetch + place 1024 pages at a
 *             time, O_DIRECT into the registered pool) over an O_DIRECT
 *             sequential read of the same pages file, the two alternated
 *             three times (medians: a virtual disk's rate drifts).
 *   step      a workspace of --tokens (random pages written through the
 *             pager: no prefill) with a --view budget: per agent step, the
 *             time from the end of a question's append to the first decoded
 *             token (selection, rematerialisation of what enters, one
 *             decode), host tier warm (the pool holds the workspace) and
 *             cold (a small pool: entering pages come from NVMe); the peer
 *             is prefilling the view's tokens from scratch.
 *   decode    tokens/s decoding in that session (a --view view over the
 *             workspace) over plain decode after a --view-token prefill.
 *   stageout  prefill through a session: over a bf16 workspace (raw K/V
 *             made in a host pool that holds them, written to NVMe from
 *             there), twice: the pool's first use and a later one; over
 *             host memory (no store); and the plain forward pass (no
 *             outputs).
 *   memory    device memory held at each workspace size of --memory, one
 *             step each, with the index's bytes and where they live, and
 *             the selection time.
 *
 * The model is a geometry with random weights made by the backend (--preset,
 * default 8b); --layers keeps the width and changes the depth (the step's
 * and the prefill's costs both scale with it; the 4M-token memory figure
 * needs few layers to fit this host's memory and disk).
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <liburing.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend_impl.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/pager.h"
#include "kvmem/store.h"
#include "session/inspect.h"
#include "bench_common.h"
#include "cli_util.h"
#include "cmd.h"

#define WHO "kvmem bench step"
#define BATCH 1024	/* pages per place() call: view.c's PLACE_BATCH */
#define BLOCK 32
#define MAX_LIST 8

/* The step phase's tiers (--tiers). */
enum { TIER_WARM = 1, TIER_PAGES = 2, TIER_COLD = 4 };

enum { PH_CEIL = 1, PH_REMAT = 2, PH_COLDIN = 4, PH_STEP = 8, PH_DECODE = 16, PH_STAGE = 32,
       PH_MEM = 64, PH_FITS = 128, PH_ALL = 255 };

struct opts {
	struct bench_model bm;
	const char *dir;
	int layers, mem_layers, steps, question, decode, chunk, only, keep, host_scoring, tiers;
	int64_t tokens, view, remat, prefill, memory[MAX_LIST];
	int n_memory;
	uint64_t coldin, gpu_mem, host_cap, seed, index_mem, read_size;
	int queue_depth;
	int tp;			/* --tp: tensor parallel ranks; 0: off */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem bench step [options]\n"
		"\n"
		"The GPU paging pipeline, each figure beside its ceiling or peer measured in\n"
		"the same run: rematerialisation (gather, batched copies) over one large pinned\n"
		"copy; cold page-in from NVMe into view slots over an O_DIRECT sequential read;\n"
		"an agent step (end of an append -> first decoded token, warm and cold host\n"
		"tier) over prefilling the view; decode in a paged view over plain decode;\n"
		"stage-out under prefill; device memory against the workspace size.\n"
		"\n"
		BENCH_MODEL_HELP
		"  --layers N         keep the width, use N layers (default: the preset's)\n"
		"  --dir DIR          scratch directory on the disk to measure (default\n"
		"                     /tmp/kvmem-bench-step; removed at the end unless --keep)\n"
		"  --only LIST        phases: ceilings,remat,coldin,step,decode,stageout,memory,\n"
		"                     fits (the largest view under --gpu-mem, chunks of 512)\n"
		"  --tokens N         workspace of the step phase (default 256k)\n"
		"  --view N           view budget in tokens (default 64k)\n"
		"  --steps N          agent steps timed per tier (default 3)\n"
		"  --tiers LIST       the step phase's host tiers: warm, pages (warm with\n"
		"                     every shifted token placed again from its page, as\n"
		"                     before moves inside the view: the peer), cold\n"
		"                     (default warm,cold)\n"
		"  --question N       tokens appended before each step (default 32)\n"
		"  --decode N         tokens decoded for the decode figures (default 32)\n"
		"  --remat N          tokens of pages placed in the remat phase (default 16k)\n"
		"  --coldin SIZE      bytes of pages read cold (default 2G)\n"
		"  --read-size SIZE   the pager's largest read in the coldin phase (default\n"
		"                     the pager's, 8M)\n"
		"  --queue-depth N    the pager's io_uring entries in the coldin phase (default\n"
		"                     the pager's, 64)\n"
		"  --prefill N        tokens prefilled in the stageout phase (default 16k)\n"
		"  --chunk N          prefill chunk (default 1024)\n"
		"  --memory LIST      workspace sizes for the memory phase (default 256k,4M)\n"
		"  --memory-layers N  layers for the memory phase (default 1)\n"
		"  --gpu-mem SIZE     device memory cap of the backend\n"
		"  --host-cap SIZE    host pool of the warm tier (default: the workspace's pages)\n"
		"  --index-mem SIZE   device memory for the copy of the index the selection is\n"
		"                     scored on (default: the backend's; 64M in the memory\n"
		"                     phase); past it the device reads the host's index\n"
		"  --host-scoring     score selections on the host (the comparison)\n"
		"  --tp N             tensor parallel over N GPUs (as kvmem run --tp)\n"
		"  --seed S           random pages and tokens (default 1)\n"
		"  --keep             keep the scratch workspaces\n"
		"  --help             this text\n"
		"%s; %s.\n"
		"\n"
		"examples:\n"
		"  kvmem bench step --only ceilings,remat,coldin\n"
		"  kvmem bench step --layers 4 --only step,decode --tokens 256k --view 64k\n"
		"  kvmem bench step --layers 1 --only memory --memory 256k,4M\n",
		CLI_COUNT_HELP, CLI_SIZE_HELP);
}

static int parse_list(const char *opt, const char *s, int64_t *out, int max)
{
	char *list = strdup(s), *save = NULL;
	int n = 0;

	if (!list)
		return -1;
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == max || cli_parse_count(WHO, opt, t, BLOCK, 1ll << 33, &out[n])) {
			free(list);
			return -1;
		}
		n++;
	}
	free(list);
	return n ? n : -1;
}

static int parse_only(const char *s)
{
	static const char *names[] = { "ceilings", "remat", "coldin", "step", "decode",
				       "stageout", "memory", "fits" };
	char *list = strdup(s), *save = NULL;
	int m = 0;

	if (!list)
		return -1;
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int found = 0;

		for (int i = 0; i < 8; i++)
			if (!strcmp(t, names[i]))
				m |= 1 << i, found = 1;
		if (!found) {
			fprintf(stderr, "%s: --only: no phase '%s' (ceilings, remat, coldin, step, "
				"decode, stageout, memory, fits)\n", WHO, t);
			free(list);
			return -1;
		}
	}
	free(list);
	return m;
}

static int parse_tiers(const char *s)
{
	static const char *names[] = { "warm", "pages", "cold" };
	char buf[64], *save = NULL;
	int m = 0;

	snprintf(buf, sizeof(buf), "%s", s);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int i = 0;

		while (i < 3 && strcmp(t, names[i]))
			i++;
		if (i == 3) {
			fprintf(stderr, "%s: --tiers: unknown tier '%s' (warm, pages, cold)\n", WHO, t);
			return -1;
		}
		m |= 1 << i;
	}
	return m ? m : -1;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option opts[] = {
		BENCH_MODEL_OPTIONS,
		{ "layers", required_argument, NULL, 'L' },  { "dir", required_argument, NULL, 'd' },
		{ "only", required_argument, NULL, 'o' },    { "tokens", required_argument, NULL, 't' },
		{ "view", required_argument, NULL, 'v' },    { "steps", required_argument, NULL, 'S' },
		{ "question", required_argument, NULL, 'q' }, { "decode", required_argument, NULL, 'D' },
		{ "remat", required_argument, NULL, 'r' },   { "coldin", required_argument, NULL, 'c' },
		{ "prefill", required_argument, NULL, 'P' }, { "chunk", required_argument, NULL, 'C' },
		{ "memory", required_argument, NULL, 'm' },
		{ "memory-layers", required_argument, NULL, 'M' },
		{ "gpu-mem", required_argument, NULL, 'g' }, { "host-cap", required_argument, NULL, 'H' },
		{ "seed", required_argument, NULL, 's' },    { "keep", no_argument, NULL, 'k' },
		{ "index-mem", required_argument, NULL, 'I' },
		{ "host-scoring", no_argument, NULL, 'A' },
		{ "read-size", required_argument, NULL, 'R' },
		{ "queue-depth", required_argument, NULL, 'Q' },
		{ "tiers", required_argument, NULL, 'i' },
		{ "tp", required_argument, NULL, 'T' },
		{ "help", no_argument, NULL, 'h' },	     { 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	o->dir = "/tmp/kvmem-bench-step";
	o->only = PH_ALL;
	o->tokens = 256 * 1024;
	o->view = 64 * 1024;
	o->steps = 3;
	o->tiers = TIER_WARM | TIER_COLD;
	o->question = 32;
	o->decode = 32;
	o->remat = 16 * 1024;
	o->coldin = 2ull << 30;
	o->prefill = 16 * 1024;
	o->chunk = 1024;
	o->memory[0] = 256 * 1024, o->memory[1] = 4 * 1024 * 1024, o->n_memory = 2;
	o->mem_layers = 1;
	o->seed = 1;
	cli_getopt_reset();
	while ((c = cli_getopt(WHO, argc, argv, opts)) != -1) {
		const char *name = cli_optname;
		int bad = 0;

		if (bench_model_opt(&o->bm, c, optarg))
			continue;
		switch (c) {
		case 'h': usage(stdout); return 1;
		case 'd': o->dir = optarg; break;
		case 'k': o->keep = 1; break;
		case 'A': o->host_scoring = 1; break;
		case 'R': bad = cli_parse_size(WHO, name, optarg, 4096, 1ull << 30, &o->read_size); break;
		case 'Q': bad = cli_parse_int(WHO, name, optarg, 1, 4096, &o->queue_depth); break;
		case 'I': bad = cli_parse_size(WHO, name, optarg, 1, 1ull << 50, &o->index_mem); break;
		case 'L': bad = cli_parse_int(WHO, name, optarg, 1, 1024, &o->layers); break;
		case 'T': bad = cli_parse_int(WHO, name, optarg, 1, 64, &o->tp); break;
		case 'M': bad = cli_parse_int(WHO, name, optarg, 1, 1024, &o->mem_layers); break;
		case 'o': bad = (o->only = parse_only(optarg)) < 0; break;
		case 'i': bad = (o->tiers = parse_tiers(optarg)) < 0; break;
		case 't': bad = cli_parse_count(WHO, name, optarg, BLOCK, 1ll << 33, &o->tokens); break;
		case 'v': bad = cli_parse_count(WHO, name, optarg, BLOCK, 1ll << 30, &o->view); break;
		case 'S': bad = cli_parse_int(WHO, name, optarg, 1, 1000, &o->steps); break;
		case 'q': bad = cli_parse_int(WHO, name, optarg, 1, 128, &o->question); break;
		case 'D': bad = cli_parse_int(WHO, name, optarg, 1, 100000, &o->decode); break;
		case 'r': bad = cli_parse_count(WHO, name, optarg, BLOCK, 1ll << 30, &o->remat); break;
		case 'c': bad = cli_parse_size(WHO, name, optarg, 1 << 20, 1ull << 40, &o->coldin); break;
		case 'P': bad = cli_parse_count(WHO, name, optarg, 1, 1ll << 30, &o->prefill); break;
		case 'C': bad = cli_parse_int(WHO, name, optarg, 1, 1 << 16, &o->chunk); break;
		case 'm': bad = (o->n_memory = parse_list(name, optarg, o->memory, MAX_LIST)) < 0; break;
		case 'g': bad = cli_parse_size(WHO, name, optarg, 1 << 20, 1ull << 50, &o->gpu_mem); break;
		case 'H': bad = cli_parse_size(WHO, name, optarg, 1 << 20, 1ull << 50, &o->host_cap); break;
		case 's': bad = cli_parse_u64(WHO, name, optarg, &o->seed); break;
		default: return -1;
		}
		if (bad)
			return -1;
	}
	if (cli_no_operands(WHO, argc, argv))
		return -1;
	return 0;
}

/* ---- small helpers ------------------------------------------------------ */
struct ctx {
	struct opts o;
	kvmem_model geo;	/* a geometry: the backend makes random weights */
	kvmem_backend *b;
	kvmem_ceilings ce;
	size_t half, page_bytes;	/* bf16: one K (or V) half, a page */
	double prefill_view_s;		/* the step's peer */
	double plain_decode_tps;
	kvmem_view *peer;		/* the view prefilled with --view tokens */
};

/* "52x faster", or "1.4x slower": a ratio below 1 is said as what it is. */
static const char *vs(char *buf, size_t n, double peer_s, double t_s)
{
	double r = t_s > 0 ? peer_s / t_s : 0;

	if (r >= 1)
		snprintf(buf, n, "%.*fx faster", r < 10 ? 1 : 0, r);
	else
		snprintf(buf, n, "%.1fx slower", r > 0 ? 1 / r : 0.0);
	return buf;
}

static double gbps(double bytes, double s)
{
	return s > 0 ? bytes / s / 1e9 : 0;
}

static uint64_t xs(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Random bf16 values in [-2, 2): 16 MiB drawn, the rest repeats it at a
 * shifting offset (the values do not matter to the copies; they only have
 * to be finite). */
static void fill_bf16(void *dst, size_t bytes, uint64_t seed)
{
	const size_t src_n = 8u << 20;	/* elements */
	uint16_t *p = dst;
	size_t n = bytes / 2;
	uint64_t r = seed | 1;

	for (size_t i = 0; i < n && i < src_n; i++)
		p[i] = kvmem_f32_to_bf16((float)((double)(xs(&r) >> 11) * 0x1p-53 * 4 - 2));
	for (size_t at = src_n, k = 0; at < n; at += src_n, k++) {
		size_t m = n - at < src_n ? n - at : src_n, sh = (k * 7919) % 4096;

		memcpy(p + at, p + sh, (m < src_n - sh ? m : src_n - sh) * 2);
		if (m > src_n - sh)
			memcpy(p + at + (src_n - sh), p, (m - (src_n - sh)) * 2);
	}
}

static void random_ids(int32_t *ids, int64_t n, int vocab, uint64_t seed)
{
	uint64_t r = kvmem_rng_seed(seed);

	for (int64_t i = 0; i < n; i++)
		ids[i] = (int32_t)(kvmem_rng_uniform(&r) * vocab);
}

static int rm_one(const char *path, const struct stat *sb, int type, struct FTW *f)
{
	return remove(path);
}

static void rm_rf(const char *path)
{
	nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void place_delta(struct ctx *x, const kvmem_place_stats *a, kvmem_place_stats *d)
{
	kvmem_place_stats b = { 0 };

	if (x->b->ops->place_stats)
		x->b->ops->place_stats(x->b->ctx, &b);
	d->calls = b.calls - a->calls;
	d->items = b.items - a->items;
	d->tokens = b.tokens - a->tokens;
	d->bytes_in = b.bytes_in - a->bytes_in;
	d->bytes_staged = b.bytes_staged - a->bytes_staged;
	d->pool_hits = b.pool_hits - a->pool_hits;
	d->pool_misses = b.pool_misses - a->pool_misses;
	d->pool_pages = b.pool_pages;
	d->ns = b.ns - a->ns;
	d->moved_tokens = b.moved_tokens - a->moved_tokens;
	d->move_ns = b.move_ns - a->move_ns;
}

static void place_now(struct ctx *x, kvmem_place_stats *s)
{
	memset(s, 0, sizeof(*s));
	if (x->b->ops->place_stats)
		x->b->ops->place_stats(x->b->ctx, s);
}

static int set(struct ctx *x, const char *k, const char *v)
{
	if (!x->b->ops->set)
		return kvmem_error(ENOTSUP, "the %s backend has no settings", x->b->ops->name);
	return x->b->ops->set(x->b->ctx, k, v);
}

/* Prefill n random tokens into v (from length 0) in chunks; seconds. */
static double prefill_view(struct ctx *x, kvmem_view *v, int64_t n, int chunk, float *logits)
{
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
	double t0;

	if (!ids) {
		kvmem_error(ENOMEM, "out of memory");
		return -1;
	}
	random_ids(ids, n, x->geo.cfg.vocab, x->o.seed + 7);
	/* Room for the warm-up and the timed decode steps that follow. */
	if (x->b->ops->set_length(x->b->ctx, v, 0) < 0 ||
	    x->b->ops->reserve(x->b->ctx, v, n + 8 + x->o.decode) < 0) {
		free(ids);
		return -1;
	}
	t0 = cli_now_s();
	for (int64_t at = 0; at < n; at += chunk) {
		int k = n - at < chunk ? (int)(n - at) : chunk;

		if (x->b->ops->forward(x->b->ctx, v, ids + at, k, at + k == n ? logits : NULL, 0,
				       NULL) < 0) {
			free(ids);
			return -1;
		}
	}
	free(ids);
	return cli_now_s() - t0;
}

/* ---- a workspace of random pages, written through the pager ---------------- */
static void geom_of(const struct ctx *x, const kvmem_model *m, kvmem_page_geom *g)
{
	kvmem_page_geom_model(g, m, BLOCK);
	g->dtype = KVMEM_DTYPE_BF16;
}

/* tokens (a multiple of BLOCK) of random pages and ids, committed. */
static int make_workspace(struct ctx *x, const kvmem_model *m, const char *dir, int64_t tokens,
			  double *secs)
{
	kvmem_page_geom g;
	kvmem_pager_opts po;
	kvmem_pager *p = NULL;
	const int L = m->cfg.n_layers;
	const void **layers = calloc(L, sizeof(*layers));
	size_t pb, src_bytes = 64u << 20;
	char *src = NULL;
	int32_t *ids = malloc(sizeof(int32_t) * 65536);
	double t0 = cli_now_s();
	int rc = -1;

	geom_of(x, m, &g);
	pb = kvmem_page_bytes(&g);
	if (!layers || !ids || posix_memalign((void **)&src, 4096, src_bytes + pb)) {
		kvmem_error(ENOMEM, "out of memory");
		goto out;
	}
	fill_bf16(src, src_bytes + pb, x->o.seed ^ (uint64_t)tokens);
	rm_rf(dir);
	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP;
	po.host_cap = 64ull << 20;
	po.stage_bytes = 256ull << 20;
	if (kvmem_pager_open(dir, &g, &po, &p) < 0)
		goto out;
	for (int64_t at = 0; at < tokens; at += 65536) {
		int64_t n = tokens - at < 65536 ? tokens - at : 65536;

		random_ids(ids, n, m->cfg.vocab, x->o.seed + (uint64_t)at);
		if (kvmem_pager_append_tokens(p, ids, n) < 0)
			goto out;
	}
	for (int64_t b = 0; b < tokens / BLOCK; b++) {
		for (int l = 0; l < L; l++) {
			uint64_t h = (uint64_t)(b * L + l) * 0x9e3779b97f4a7c15ull;

			layers[l] = src + ((h >> 20) % (src_bytes / 4096)) * 4096;
		}
		if (kvmem_pager_append_block(p, (uint64_t)b, layers, NULL) < 0)
			goto out;
	}
	if (kvmem_pager_commit(p, NULL, NULL, NULL, 0) < 0)
		goto out;
	rc = 0;
out:
	if (p && kvmem_pager_close(p) < 0)
		rc = -1;
	free(layers);
	free(ids);
	free(src);
	*secs = cli_now_s() - t0;
	return rc;
}

/* ---- phases ---------------------------------------------------------------- */
static int ph_ceilings(struct ctx *x)
{
	if (!x->b->ops->ceilings)
		return kvmem_error(ENOTSUP, "the %s backend cannot measure its ceilings", x->b->ops->name);
	if (x->b->ops->ceilings(x->b->ctx, &x->ce) < 0)
		return -1;
	printf("ceilings: GEMM %.0f TFLOP/s, device copy %.0f GB/s (read + written), pinned host -> "
	       "device %.1f GB/s, device -> host %.1f GB/s (one 1 GiB copy each)\n",
	       x->ce.matmul_tflops, x->ce.copy_gbps, x->ce.h2d_gbps, x->ce.d2h_gbps);
	return 0;
}

/* Place every item in calls of BATCH; seconds. */
static double place_all(struct ctx *x, kvmem_view *v, kvmem_place *it, int64_t n)
{
	double t0 = cli_now_s();

	for (int64_t i = 0; i < n; i += BATCH)
		if (x->b->ops->place(x->b->ctx, v, it + i, n - i < BATCH ? (int)(n - i) : BATCH) < 0)
			return -1;
	return cli_now_s() - t0;
}

static int ph_remat(struct ctx *x)
{
	const int L = x->geo.cfg.n_layers;
	const int64_t nb = x->o.remat / BLOCK, np = nb * L;
	const size_t bytes = (size_t)np * x->page_bytes;
	char *arena = NULL;
	kvmem_place *it = NULL;
	kvmem_view *v = NULL;
	int64_t *order = NULL;
	int reg = 0, rc = -1;
	static const char *methods[] = { "gather", "batch", "pack" };
	double best[3] = { 0 }, peak = x->ce.h2d_gbps;

	if (posix_memalign((void **)&arena, 2u << 20, bytes) || !(it = calloc(np, sizeof(*it))) ||
	    !(order = malloc(sizeof(*order) * nb))) {
		kvmem_error(ENOMEM, "out of memory for %zu bytes of pages", bytes);
		goto out;
	}
	fill_bf16(arena, bytes, x->o.seed);
	/* Blocks to slots in a shuffled order: the pages are scattered over
	 * the arena as entering blocks are over a host pool. */
	for (int64_t i = 0; i < nb; i++)
		order[i] = i;
	{
		uint64_t r = x->o.seed | 1;

		for (int64_t i = nb - 1; i > 0; i--) {
			int64_t j = (int64_t)(xs(&r) % (uint64_t)(i + 1)), t = order[i];

			order[i] = order[j];
			order[j] = t;
		}
	}
	for (int l = 0, k = 0; l < L; l++)
		for (int64_t i = 0; i < nb; i++, k++) {
			int64_t b = order[i];
			char *pg = arena + (size_t)(b * L + l) * x->page_bytes;

			it[k] = (kvmem_place){ .block = b, .layer = l, .u0 = 0, .n = BLOCK, .stride = BLOCK,
					       .slot = i * BLOCK,
					       .page = { .k = pg, .v = pg + x->half,
							 .dtype = KVMEM_DTYPE_BF16,
							 .mem = KVMEM_MEM_HOST } };
		}
	if (x->b->ops->view_create(x->b->ctx, &v) < 0 || x->b->ops->reserve(x->b->ctx, v, nb * BLOCK) < 0)
		goto out;
	if (x->b->ops->host_register && x->b->ops->host_register(x->b->ctx, arena, bytes) == 0)
		reg = 1;
	printf("\nrematerialisation: %" PRId64 " pages of %zu KiB (%.2f GB, %" PRId64 " tokens x %d "
	       "layers, bf16) placed in calls of %d pages, shuffled blocks; pages in %s host memory\n",
	       np, x->page_bytes >> 10, bytes / 1e9, nb * BLOCK, L, BATCH, reg ? "registered" :
	       "unregistered (host_register refused)");
	if (!x->b->ops->set) {
		double t = place_all(x, v, it, np);

		if (t < 0 || (t = place_all(x, v, it, np)) < 0)
			goto out;
		printf("  %7.1f GB/s (the %s backend's place)\n", gbps(bytes, t), x->b->ops->name);
		rc = 0;
		goto out;
	}
	if (set(x, "pool", "0") < 0)
		goto out;
	for (int m = 0; m < 3; m++) {
		if (set(x, "place", methods[m]) < 0 || place_all(x, v, it, m == 2 ? BATCH : np) < 0)
			goto out;	/* warm-up */
		for (int r = 0; r < (m == 2 ? 1 : 3); r++) {
			double t = place_all(x, v, it, np);

			if (t < 0)
				goto out;
			if (!best[m] || gbps(bytes, t) > best[m])
				best[m] = gbps(bytes, t);
		}
		printf("  %-7s %7.1f GB/s  %.2f of the pinned copy peak (%.1f GB/s)%s\n", methods[m],
		       best[m], best[m] / peak, peak,
		       m == 0 ? "  [one kernel reads the pages over PCIe]" :
		       m == 1 ? "  [cudaMemcpyBatchAsync of merged runs, then the kernel]" :
				"  [the first version: CPU packs bf16, two uploads, scatter]");
		fflush(stdout);
	}
	{
		const char *keep = best[1] > best[0] ? "batch" : "gather";

		printf("  kept: %s (the faster here)\n", keep);
		if (set(x, "place", keep) < 0)
			goto out;
	}
	/* Unregistered memory: staged into pinned memory first. */
	if (reg) {
		double t = 0, bst = 0;

		x->b->ops->host_unregister(x->b->ctx, arena);
		reg = 0;
		for (int r = 0; r < 2; r++)
			if ((t = place_all(x, v, it, np)) < 0)
				goto out;
			else if (gbps(bytes, t) > bst)
				bst = gbps(bytes, t);
		printf("  %-7s %7.1f GB/s  %.2f of the peak  [pages in unregistered memory: copied "
		       "to pinned staging, then the kernel]\n", "staged", bst, bst / peak);
		if (x->b->ops->host_register(x->b->ctx, arena, bytes) == 0)
			reg = 1;
	}
	/* The device page pool: a second visit of the same pages. */
	{
		char pool[32];
		kvmem_place_stats a, d;
		double t;

		snprintf(pool, sizeof(pool), "%zu", bytes + (bytes >> 4));
		if (reg && set(x, "pool", pool) == 0 && place_all(x, v, it, np) >= 0) {
			place_now(x, &a);
			if ((t = place_all(x, v, it, np)) < 0)
				goto out;
			place_delta(x, &a, &d);
			printf("  %-7s %7.1f GB/s  %.1f x the pinned copy peak  [the device page pool: "
			       "%" PRIu64 " of %" PRIu64 " pages from HBM]\n", "pool", gbps(bytes, t),
			       gbps(bytes, t) / peak, d.pool_hits, d.items);
		}
		set(x, "pool", "0");
	}
	rc = 0;
out:
	if (reg)
		x->b->ops->host_unregister(x->b->ctx, arena);
	if (v)
		x->b->ops->view_destroy(x->b->ctx, v);
	free(arena);
	free(it);
	free(order);
	return rc;
}

/* ---- O_DIRECT sequential read (the peer of cold page-in) ------------------- */
/* An O_DIRECT sequential read of path's first size bytes in requests of
 * req bytes, qd in flight: bytes per second, or -1. */
static double seq_read(const char *path, uint64_t size, size_t req, int qd)
{
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	uint8_t *buf;
	uint64_t off = 0, done = 0;
	int fd = open(path, O_RDONLY | O_DIRECT), inflight = 0;
	double t0;

	if (fd < 0)
		return -1;
	if (posix_memalign((void **)&buf, 4096, req * qd) || io_uring_queue_init(qd * 2, &ring, 0) < 0) {
		close(fd);
		return -1;
	}
	size -= size % req;
	t0 = cli_now_s();
	while (done < size) {
		while (inflight < qd && off < size) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);

			io_uring_prep_read(sqe, fd, buf + (size_t)(off / req % qd) * req, req, off);
			off += req;
			inflight++;
		}
		if (io_uring_submit_and_wait(&ring, 1) < 0 || io_uring_wait_cqe(&ring, &cqe) < 0 ||
		    cqe->res != (int)req)
			break;
		io_uring_cqe_seen(&ring, cqe);
		inflight--;
		done += req;
	}
	t0 = cli_now_s() - t0;
	io_uring_queue_exit(&ring);
	free(buf);
	close(fd);
	return done == size ? size / t0 : -1;
}

/* One cold pass: a fresh pager (an empty host pool) over the workspace in
 * dir, everything prefetched, then fetched and placed BATCH pages at a
 * time as a step does. Its seconds, or -1. */
static double coldin_once(struct ctx *x, const char *dir, int64_t np, kvmem_view *v,
			  kvmem_pager_opts *po, int *registered)
{
	const int L = x->geo.cfg.n_layers;
	kvmem_page_geom g;
	kvmem_pager *p = NULL;
	uint64_t *ids = NULL;
	const void **data = NULL;
	kvmem_place *it = NULL;
	void *base = NULL;
	size_t len = 0;
	double t0, t = -1;
	int reg = 0;

	geom_of(x, &x->geo, &g);
	if (kvmem_pager_open(dir, &g, po, &p) < 0)
		goto out;
	kvmem_pager_region(p, &base, &len);
	if (x->b->ops->host_register && x->b->ops->host_register(x->b->ctx, base, len) == 0)
		reg = 1;
	*registered = reg;
	if (!(ids = malloc(sizeof(*ids) * np)) || !(data = malloc(sizeof(*data) * BATCH)) ||
	    !(it = calloc(BATCH, sizeof(*it)))) {
		kvmem_error(ENOMEM, "out of memory");
		goto out;
	}
	for (int64_t i = 0; i < np; i++)
		ids[i] = (uint64_t)i;
	t0 = cli_now_s();
	/* As a step does: the selection known, everything asked ahead, then
	 * placed batch by batch as the pages land. */
	kvmem_pager_prefetch(p, ids, (size_t)np);
	for (int64_t i = 0; i < np; i += BATCH) {
		int n = np - i < BATCH ? (int)(np - i) : BATCH, rc;

		if (kvmem_pager_fetch(p, ids + i, n, data) < 0)
			goto out;
		for (int k = 0; k < n; k++) {
			int64_t id = i + k, b = id / L;

			it[k] = (kvmem_place){ .block = b, .layer = (int)(id % L), .u0 = 0, .n = BLOCK,
					       .stride = BLOCK, .slot = b * BLOCK,
					       .page = { .k = data[k], .v = (const char *)data[k] + x->half,
							 .dtype = KVMEM_DTYPE_BF16,
							 .mem = KVMEM_MEM_HOST } };
		}
		rc = x->b->ops->place(x->b->ctx, v, it, n);
		kvmem_pager_release(p, ids + i, n);
		if (rc < 0)
			goto out;
	}
	t = cli_now_s() - t0;
out:
	if (reg)
		x->b->ops->host_unregister(x->b->ctx, base);
	if (p)
		kvmem_pager_close(p);
	free(ids);
	free(data);
	free(it);
	return t;
}

#define COLDIN_REPS 3

static double median(const double *v, int n);

static int ph_coldin(struct ctx *x)
{
	const int L = x->geo.cfg.n_layers;
	int64_t nb = (int64_t)(x->o.coldin / ((uint64_t)L * x->page_bytes)), np;
	char dir[4200], path[4300];
	kvmem_page_geom g;
	kvmem_pager_opts po;
	kvmem_view *v = NULL;
	kvmem_place_stats a, d;
	size_t stride;
	double made, seq[COLDIN_REPS], seqp[COLDIN_REPS], pin[COLDIN_REPS], bytes;
	int reg = 0, rc = -1;

	if (nb < 1)
		nb = 1;
	np = nb * L;
	snprintf(dir, sizeof(dir), "%s/coldin", x->o.dir);
	if (make_workspace(x, &x->geo, dir, nb * BLOCK, &made) < 0)
		return -1;
	geom_of(x, &x->geo, &g);
	stride = kvmem_page_stride(&g);
	bytes = (double)np * stride;
	kvmem_pager_opts_default(&po);
	po.host_cap = (uint64_t)np * stride + (64ull << 20);
	if (x->o.read_size)
		po.max_read = (uint32_t)x->o.read_size;
	if (x->o.queue_depth)
		po.queue_depth = (uint32_t)x->o.queue_depth;
	if (x->b->ops->view_create(x->b->ctx, &v) < 0 || x->b->ops->reserve(x->b->ctx, v, nb * BLOCK) < 0)
		goto out;
	snprintf(path, sizeof(path), "%s/pages", dir);
	printf("\ncold page-in, NVMe -> view slots: %" PRId64 " pages (%.2f GB, workspace written in "
	       "%.1f s) through the pager (O_DIRECT reads of up to %u KiB, %u entries, then the "
	       "backend's place), alternated %d times with O_DIRECT sequential reads of the same "
	       "file in 1 MiB requests 32 deep and in the pager's (a virtual disk's rate drifts "
	       "between runs; the ceiling is the better median)\n", np,
	       bytes / 1e9, made, po.max_read >> 10, po.queue_depth, COLDIN_REPS);
	place_now(x, &a);
	for (int r = 0; r < COLDIN_REPS; r++) {
		seq[r] = seq_read(path, (uint64_t)np * stride, 1u << 20, 32);
		seqp[r] = seq_read(path, (uint64_t)np * stride, po.max_read,
				   po.queue_depth < 64 ? (int)po.queue_depth : 64);
		if ((pin[r] = coldin_once(x, dir, np, v, &po, &reg)) < 0)
			goto out;
		printf("  pass %d: sequential read %.2f GB/s (1 MiB) / %.2f GB/s (the pager's requests), "
		       "page-in %.2f GB/s (host pool %s)\n", r + 1, seq[r] > 0 ? seq[r] / 1e9 : 0,
		       seqp[r] > 0 ? seqp[r] / 1e9 : 0, gbps(bytes, pin[r]),
		       reg ? "registered: the gather reads it" : "not registered: a staging copy");
	}
	place_delta(x, &a, &d);
	{
		double m1 = median(seq, COLDIN_REPS), m2 = median(seqp, COLDIN_REPS);
		double ms = m1 > m2 ? m1 : m2, mp = median(pin, COLDIN_REPS), all = 0;

		for (int r = 0; r < COLDIN_REPS; r++)
			all += pin[r];

		printf("  median page-in %.2f GB/s   best median sequential read %.2f GB/s   ratio %.2f\n"
		       "  (place() %.0f ms of the %.0f ms of %d passes, %" PRIu64 " calls)\n",
		       gbps(bytes, mp), ms > 0 ? ms / 1e9 : 0, ms > 0 ? bytes / mp / ms : 0,
		       d.ns / 1e6, all * 1e3, COLDIN_REPS, d.calls);
	}
	rc = 0;
out:
	if (v)
		x->b->ops->view_destroy(x->b->ctx, v);
	if (!x->o.keep)
		rm_rf(dir);
	return rc;
}

/* The view's own prefill and plain decode, once: the step's and decode's
 * peers. */
static int peers(struct ctx *x)
{
	float *logits = malloc(sizeof(float) * x->geo.cfg.vocab);
	uint64_t rng = kvmem_rng_seed(x->o.seed);
	kvmem_sampler greedy = { 0 };
	double t0;
	int rc = -1;

	if (!logits)
		return kvmem_error(ENOMEM, "out of memory");
	if ((!x->peer && x->b->ops->view_create(x->b->ctx, &x->peer) < 0) ||
	    (x->prefill_view_s = prefill_view(x, x->peer, x->o.view, 4096, logits)) < 0)
		goto out;
	for (int k = 0; k < 4; k++) {	/* first-use costs (a decode graph) stay out */
		int32_t tok = kvmem_sample(logits, x->geo.cfg.vocab, &greedy, &rng);

		if (x->b->ops->forward(x->b->ctx, x->peer, &tok, 1, logits, 0, NULL) < 0)
			goto out;
	}
	t0 = cli_now_s();
	for (int k = 0; k < x->o.decode; k++) {
		int32_t tok = kvmem_sample(logits, x->geo.cfg.vocab, &greedy, &rng);

		if (x->b->ops->forward(x->b->ctx, x->peer, &tok, 1, logits, 0, NULL) < 0)
			goto out;
	}
	x->plain_decode_tps = x->o.decode / (cli_now_s() - t0);
	printf("\npeers: prefilling %" PRId64 " tokens from scratch (chunks of 4096) %.3f s; plain "
	       "decode after them %.1f tokens/s\n", x->o.view, x->prefill_view_s,
	       x->plain_decode_tps);
	rc = 0;
out:
	free(logits);
	return rc;
}

struct step_result {
	double adopt_s, step_s[64], select_s[64], decode_s[64];
	uint64_t bytes[64], nvme_pages[64], pool_hits[64], tokens[64], moved[64], src_pages[64];
	double move_ms[64];
	double decode_tps;
	/* The timed decode: its per-token split (kvmem_session_stats), the
	 * view's length when it began, and selections it forced. */
	double dec_fwd_ms, dec_store_ms, dec_own_ms;
	int64_t dec_view, dec_forced;
	uint64_t mem_used;	/* the backend's device memory with the session's view */
	int64_t entered[64];	/* blocks that entered the view at each step */
	double select_only_s;	/* a selection that moves nothing: scoring + planning */
	int64_t selections, entering;	/* counted by on_select */
	int64_t device_scored;	/* selections scored on the device */
	uint64_t index_dev, index_host;	/* the index: device copy, host arrays */
};

static void count_select(void *arg, const kvmem_plan *p, int forced)
{
	struct step_result *r = arg;

	r->selections++;
	r->entering += p->entering;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
	double s[64];

	memcpy(s, v, sizeof(double) * n);
	qsort(s, n, sizeof(double), cmp_d);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* One tier: a session over the workspace, steps timed, decode timed. */
static int run_tier(struct ctx *x, const kvmem_model *m, const char *dir, int64_t tokens,
		    uint64_t host_cap, int steps, int do_decode, int move, struct step_result *r)
{
	kvmem_workspace_opts wo = { .block = BLOCK, .host_cap = host_cap,
				    .dtype = KVMEM_DTYPE_BF16 };
	kvmem_session_opts so;
	kvmem_workspace *w = NULL;
	kvmem_session *s = NULL;
	kvmem_pager_stats ps0, ps1;
	int32_t q[128], tok;
	double t0;
	int rc = -1;

	memset(r, 0, sizeof(*r));
	if (kvmem_workspace_open(dir, m, &wo, &w) < 0)
		return -1;
	kvmem_session_opts_default(&so);
	so.block = BLOCK;
	so.budget = x->o.view;
	so.chunk = 128;
	so.source = kvmem_workspace_source(w);
	so.on_select = count_select;
	so.arg = r;
	so.host_scoring = x->o.host_scoring;
	if (!move)	/* the peer: shifted tokens placed again from their pages */
		setenv("KVMEM_MOVE", "0", 1);
	s = kvmem_session_create(x->b, &so);
	unsetenv("KVMEM_MOVE");
	if (!s)
		goto out;
	t0 = cli_now_s();
	if (kvmem_workspace_adopt(w, s) < 0)
		goto out;
	r->adopt_s = cli_now_s() - t0;
	for (int i = 0; i < steps && i < 64; i++) {
		kvmem_place_stats a, d;
		kvmem_session_stats s0, s1;
		double t1, t2;

		/* Odd steps follow up on the step before (the same question
		 * again: the same topic), even ones change the subject. */
		random_ids(q, x->o.question, m->cfg.vocab, x->o.seed * 1000 + (uint64_t)(i / 2));
		if (kvmem_session_append(s, q, x->o.question, 0) < 0)
			goto out;
		place_now(x, &a);
		kvmem_pager_stats_get(kvmem_workspace_pager(w), &ps0);
		r->entering = 0;
		kvmem_session_get_stats(s, &s0);
		t0 = cli_now_s();
		if (kvmem_session_select(s) < 0)
			goto out;
		t1 = cli_now_s();
		r->entered[i] = r->entering;
		if (kvmem_session_decode(s, 1, NULL, &tok) < 0)
			goto out;
		t2 = cli_now_s();
		place_delta(x, &a, &d);
		kvmem_session_get_stats(s, &s1);
		kvmem_pager_stats_get(kvmem_workspace_pager(w), &ps1);
		r->step_s[i] = t2 - t0;
		r->select_s[i] = t1 - t0;
		r->decode_s[i] = t2 - t1;
		r->bytes[i] = d.bytes_in;
		r->tokens[i] = d.tokens;
		r->pool_hits[i] = d.pool_hits;
		/* The session's counters: every backend keeps them. */
		r->moved[i] = (uint64_t)(s1.moved_tokens - s0.moved_tokens);
		r->src_pages[i] = (uint64_t)(s1.source_pages - s0.source_pages);
		r->move_ms[i] = d.move_ns / 1e6;
		r->nvme_pages[i] = ps1.pages_in - ps0.pages_in;
	}
	r->mem_used = x->b->ops->mem_used ? x->b->ops->mem_used(x->b->ctx) : 0;
	/* Once more with nothing new: nothing moves, what is left is the
	 * scoring of every block and the plan. */
	if (kvmem_session_select(s) < 0)
		goto out;
	t0 = cli_now_s();
	if (kvmem_session_select(s) < 0)
		goto out;
	r->select_only_s = cli_now_s() - t0;
	{
		const kvmem_index *ix = kvmem_session_index(s);
		kvmem_session_stats st;

		kvmem_session_get_stats(s, &st);
		r->device_scored = st.device_scored;
		r->index_dev = st.index_device_bytes;
		r->index_host = (uint64_t)ix->n_layers * ix->n_kv_heads * ix->n_blocks *
				ix->head_dim * 4;
	}
	if (do_decode) {
		kvmem_session_stats a, b;

		kvmem_session_get_stats(s, &a);
		r->dec_view = kvmem_session_view_len(s);
		t0 = cli_now_s();
		if (kvmem_session_decode(s, x->o.decode, NULL, NULL) < 0)
			goto out;
		r->decode_tps = x->o.decode / (cli_now_s() - t0);
		kvmem_session_get_stats(s, &b);
		r->dec_fwd_ms = (b.forward_ns - a.forward_ns) / 1e6 / x->o.decode;
		r->dec_store_ms = (b.store_ns - a.store_ns) / 1e6 / x->o.decode;
		r->dec_own_ms = (b.own_ns - a.own_ns) / 1e6 / x->o.decode;
		r->dec_forced = b.forced - a.forced;
	}
	rc = 0;
out:
	if (rc)
		fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
	kvmem_session_free(s);
	if (w)
		kvmem_workspace_close(w);
	return rc;
}

/* Where the last selection was scored and where the index it read lives. */
static const char *scored_where(const struct step_result *r)
{
	if (!r->device_scored)
		return "on the host";
	if (r->index_dev >= r->index_host)
		return "on the device, from its copy of the index";
	return "on the device, reading the host's index over PCIe";
}

static void print_steps(struct ctx *x, const char *tier, const struct step_result *r, int steps,
			double peer)
{
	const double L = x->geo.cfg.n_layers;
	double med = median(r->step_s, steps), follow[64], fresh[64];
	int nf = 0, nn = 0;
	char b1[32], b2[32];

	printf("  %s (first view laid out in %.2f s; a selection that moves nothing "
	       "takes %.1f ms: scoring every block %s, and planning):\n", tier, r->adopt_s,
	       r->select_only_s * 1e3, scored_where(r));
	for (int i = 0; i < steps; i++) {
		/* What entered against what moved: the pages of the blocks new
		 * to the view, against the bytes the step read from host memory
		 * (NVMe reads land there first). */
		double in = (double)r->entered[i] * L * x->page_bytes;

		printf("    step %d (%s): %.1f ms (selection + rematerialisation %.1f ms, first token "
		       "%.1f ms); %" PRId64 " blocks entered (%.2f GB of pages); %.2f GB read from "
		       "host memory (%.2f of what entered), %" PRIu64 " pages from NVMe, %" PRIu64
		       " from the device page pool; %" PRIu64 " pages got from the source (%.2f of "
		       "the entered blocks'); %" PRIu64 " token-layers placed from pages, %" PRIu64
		       " moved inside the view (%.1f ms)\n", i + 1, i % 2 ? "follow-up" : "new subject",
		       r->step_s[i] * 1e3, r->select_s[i] * 1e3, r->decode_s[i] * 1e3, r->entered[i],
		       in / 1e9, r->bytes[i] / 1e9, in > 0 ? r->bytes[i] / in : 0.0, r->nvme_pages[i],
		       r->pool_hits[i], r->src_pages[i],
		       r->entered[i] ? r->src_pages[i] / (r->entered[i] * L) : 0.0, r->tokens[i],
		       r->moved[i], r->move_ms[i]);
		if (i % 2)
			follow[nf++] = r->step_s[i];
		else
			fresh[nn++] = r->step_s[i];
	}
	printf("    median step %.1f ms: %s than prefilling the view (%.2f s)\n", med * 1e3,
	       vs(b1, sizeof(b1), peer, med), peer);
	if (nf && nn)
		printf("    median new subject %.1f ms (%s), follow-up %.1f ms (%s)\n",
		       median(fresh, nn) * 1e3, vs(b1, sizeof(b1), peer, median(fresh, nn)),
		       median(follow, nf) * 1e3, vs(b2, sizeof(b2), peer, median(follow, nf)));
}

static int ph_step(struct ctx *x, int phases)
{
	char dir[4200];
	struct step_result warm, cold;
	uint64_t ws_bytes = (uint64_t)(x->o.tokens / BLOCK) * x->geo.cfg.n_layers * x->page_bytes;
	uint64_t small = (uint64_t)x->o.view / BLOCK * x->geo.cfg.n_layers * x->page_bytes / 2;
	double made;
	int steps = x->o.steps < 64 ? x->o.steps : 64, rc = -1;

	snprintf(dir, sizeof(dir), "%s/step", x->o.dir);
	if (peers(x) < 0)
		return -1;
	if (make_workspace(x, &x->geo, dir, x->o.tokens / BLOCK * BLOCK, &made) < 0)
		return -1;
	printf("\nagent step: workspace %" PRId64 " tokens (%.2f GB of bf16 pages, written in %.1f s), "
	       "view %" PRId64 " tokens, question %d tokens, meank\n", x->o.tokens, ws_bytes / 1e9,
	       made, x->o.view, x->o.question);
	if (small < (256ull << 20))
		small = 256ull << 20;
	if ((x->o.tiers & TIER_WARM) &&
	    run_tier(x, &x->geo, dir, x->o.tokens, x->o.host_cap ? x->o.host_cap :
		     ws_bytes + (ws_bytes >> 3) + (256ull << 20), steps, phases & PH_DECODE, 1,
		     &warm) < 0)
		goto out;
	if (x->o.tiers & TIER_WARM)
		print_steps(x, "warm host tier", &warm, steps, x->prefill_view_s);
	if (x->o.tiers & TIER_PAGES) {
		struct step_result pages;

		if (run_tier(x, &x->geo, dir, x->o.tokens, x->o.host_cap ? x->o.host_cap :
			     ws_bytes + (ws_bytes >> 3) + (256ull << 20), steps, 0, 0, &pages) < 0)
			goto out;
		printf("\n");
		print_steps(x, "warm host tier, moves off (KVMEM_MOVE=0: every token that shifts "
			    "placed again from its page, the path before moves; the peer)", &pages,
			    steps, x->prefill_view_s);
	}
	if ((phases & PH_DECODE) && (x->o.tiers & TIER_WARM))
		printf("\ndecode in a %" PRId64 "-token view over %" PRId64 " tokens: %.1f tokens/s; "
		       "plain decode at %" PRId64 ": %.1f tokens/s; ratio %.2f\n", x->o.view,
		       x->o.tokens, warm.decode_tps, x->o.view, x->plain_decode_tps,
		       warm.decode_tps / x->plain_decode_tps);
	if ((phases & PH_DECODE) && (x->o.tiers & TIER_WARM))
		printf("    per token: forward %.3f ms, rows put away in line (index, pages, queries) %.3f ms, own "
		       "%.3f ms; plain %.3f ms in all; view %" PRId64 " tokens at the start (plain "
		       "%" PRId64 "), %" PRId64 " selections forced\n", warm.dec_fwd_ms,
		       warm.dec_store_ms, warm.dec_own_ms, 1e3 / x->plain_decode_tps, warm.dec_view,
		       x->o.view, warm.dec_forced);
	if (!(x->o.tiers & TIER_COLD)) {
		rc = 0;
		goto out;
	}
	if (run_tier(x, &x->geo, dir, x->o.tokens, small, steps, 0, 1, &cold) < 0)
		goto out;
	printf("\n");
	print_steps(x, "cold host tier", &cold, steps, x->prefill_view_s);
	printf("    (host pool %.2f GB: entering pages not in it come from NVMe)\n", small / 1e9);
	{
		/* What bounds a cold step: its pages from NVMe at the disk's
		 * sequential rate, measured now on the same file. */
		char path[4300];
		uint64_t sz = ws_bytes < (2ull << 30) ? ws_bytes : (2ull << 30);
		double seq, floor_s[64], med;
		char fl[32];

		snprintf(path, sizeof(path), "%s/pages", dir);
		seq = seq_read(path, sz, 8u << 20, 64);
		for (int i = 0; i < steps; i++)
			floor_s[i] = seq > 0 ? cold.nvme_pages[i] * (double)x->page_bytes / seq : 0;
		med = median(floor_s, steps);
		if (med > 0)
			printf("    NVMe floor (its pages at the O_DIRECT sequential read of the same "
			       "file, %.2f GB/s, measured now): median %.1f ms, at best %s than the "
			       "prefill\n", seq / 1e9, med * 1e3, vs(fl, sizeof(fl), x->prefill_view_s, med));
	}
	rc = 0;
out:
	if (!x->o.keep)
		rm_rf(dir);
	return rc;
}

/* Prefill n tokens through a session over a new workspace in dir (NULL:
 * host memory); seconds of the appends (and of the commit, for a
 * workspace). The workspace's pages live in pool (shared, sized to hold
 * them: the appends never wait for the disk, the commit does). */
static int stage_run(struct ctx *x, const int32_t *ids, int64_t n, const char *dir,
		     kvmem_pager_pool *pool, double *t_app, double *t_commit, kvmem_session_stats *st,
		     kvmem_pager_stats *ps)
{
	kvmem_workspace_opts wo = { .block = BLOCK, .dtype = KVMEM_DTYPE_BF16, .pool = pool };
	kvmem_session_opts so;
	kvmem_workspace *w = NULL;
	kvmem_session *s = NULL;
	double t0;
	int rc = -1;

	*t_commit = 0;
	kvmem_session_opts_default(&so);
	so.block = BLOCK;
	so.budget = x->o.view;
	so.chunk = x->o.chunk;
	if (dir) {
		rm_rf(dir);
		if (kvmem_workspace_open(dir, &x->geo, &wo, &w) < 0)
			return -1;
		so.source = kvmem_workspace_source(w);
	}
	if (!(s = kvmem_session_create(x->b, &so)))
		goto out;
	t0 = cli_now_s();
	if (kvmem_session_append(s, ids, n, 0) < 0)
		goto out;
	*t_app = cli_now_s() - t0;
	kvmem_session_get_stats(s, st);
	memset(ps, 0, sizeof(*ps));
	if (w) {
		kvmem_pager_stats_get(kvmem_workspace_pager(w), ps);	/* before the commit */
		t0 = cli_now_s();
		if (kvmem_workspace_commit(w, s) < 0)
			goto out;
		*t_commit = cli_now_s() - t0;
	}
	rc = 0;
out:
	kvmem_session_free(s);
	if (w)
		kvmem_workspace_close(w);
	return rc;
}

static int ph_stageout(struct ctx *x)
{
	const int64_t n = x->o.prefill;
	const double pages = (double)(n / BLOCK) * x->geo.cfg.n_layers * x->page_bytes;
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
	float *logits = malloc(sizeof(float) * x->geo.cfg.vocab);
	kvmem_view *v = NULL;
	kvmem_pager_pool *pool = NULL;
	kvmem_page_geom g;
	char dir[4200];
	double plain, mem, cold, warm, c_cold, commit, dummy;
	kvmem_session_stats sm, sc, sw;
	kvmem_pager_stats pm, pc, pw;
	int rc = -1;

	if (!ids || !logits) {
		kvmem_error(ENOMEM, "out of memory");
		goto out;
	}
	random_ids(ids, n, x->geo.cfg.vocab, x->o.seed + 99);
	snprintf(dir, sizeof(dir), "%s/stageout", x->o.dir);
	geom_of(x, &x->geo, &g);
	/* Room for every page of the prefill and the blocks a chunk keeps
	 * open: the pages are made in the pool and written from there. */
	if (kvmem_pager_pool_create(&g, (uint64_t)((n + 2 * x->o.chunk) / BLOCK + 2) *
				    x->geo.cfg.n_layers * kvmem_page_stride(&g), -1, &pool) < 0)
		goto out;
	if (x->b->ops->view_create(x->b->ctx, &v) < 0 ||
	    prefill_view(x, v, x->o.chunk, x->o.chunk, logits) < 0 ||	/* warm-up */
	    (plain = prefill_view(x, v, n, x->o.chunk, logits)) < 0)
		goto out;
	x->b->ops->view_destroy(x->b->ctx, v);
	v = NULL;
	/* Twice over a workspace: first into the fresh pool (its memory
	 * faulted in as pages arrive: the first prefill of a process), then
	 * into a new workspace on the same pool (a server's conversations, a
	 * session's later appends). */
	if (stage_run(x, ids, x->o.chunk, NULL, NULL, &dummy, &commit, &sm, &pm) < 0 ||	/* warm-up */
	    stage_run(x, ids, n, NULL, NULL, &mem, &commit, &sm, &pm) < 0 ||
	    stage_run(x, ids, n, dir, pool, &cold, &c_cold, &sc, &pc) < 0 ||
	    stage_run(x, ids, n, dir, pool, &warm, &commit, &sw, &pw) < 0)
		goto out;
	/* The figure is the session over the workspace against the plain
	 * forward pass: what a user waits for when a long tool output is
	 * appended, against the engine alone. */
	printf("\nstage-out under prefill: %" PRId64 " tokens in chunks of %d (%.2f GB of bf16 "
	       "pages, made in a host pool that holds them)\n  plain forward, no outputs      %.3f s\n"
	       "  session over host memory       %.3f s (+%.1f%% over plain: raw K/V and queries to "
	       "the host, the index)\n  session over the workspace, the pool's first use %.3f s "
	       "(then the commit %.3f s)\n  session over the workspace, the pool used before %.3f s "
	       "(+%.1f%% over plain, %+.1f%% over host memory: the store)\n  then the commit "
	       "(durable)     %.3f s (%.2f GB/s of pages from the first append)\n  plain / session "
	       "over the workspace: %.3f (%.3f with the commit); first use of the pool %.3f (%.3f)\n"
	       "  the session's forward passes took %.3f s of its %.3f s (rows in line %.3f s)\n",
	       n, x->o.chunk, pages / 1e9, plain, mem, 100 * (mem / plain - 1), cold, c_cold, warm,
	       100 * (warm / plain - 1), 100 * (warm / mem - 1), commit, pages / (warm + commit) / 1e9,
	       plain / warm, plain / (warm + commit), plain / cold, plain / (cold + c_cold),
	       sw.forward_ns / 1e9, warm, sw.store_ns / 1e9);
	printf("  writer thread: over host memory %.3f s busy, waited for %.3f s; over the "
	       "workspace %.3f s busy, waited for %.3f s (first use of the pool: %.3f s busy); "
	       "stage-out: %" PRIu64 " of %" PRId64 " blocks written by the end of the appends, "
	       "%" PRIu64 " appends waited %.3f s for room\n",
	       sm.writer_ns / 1e9, sm.writer_wait_ns / 1e9, sw.writer_ns / 1e9,
	       sw.writer_wait_ns / 1e9, sc.writer_ns / 1e9, pw.blocks_out, n / BLOCK,
	       pw.backpressure_waits, pw.backpressure_ns / 1e9);
	rc = 0;
out:
	if (v)
		x->b->ops->view_destroy(x->b->ctx, v);
	if (kvmem_pager_pool_free(pool) < 0)
		rc = -1;
	if (!x->o.keep)
		rm_rf(dir);
	free(ids);
	free(logits);
	return rc;
}

static int ph_memory(struct ctx *x)
{
	kvmem_model m = x->geo;
	kvmem_backend *b = NULL, *saved = x->b;
	char dir[4200], buf[64];
	uint64_t used[MAX_LIST] = { 0 };
	/* The index's device copy: 64 MiB unless asked (--index-mem). */
	const uint64_t index_mem = x->o.index_mem ? x->o.index_mem : 64ull << 20;
	int rc = -1;

	m.cfg.n_layers = x->o.mem_layers;
	snprintf(m.dir, sizeof(m.dir), "%.64s, %d layers", x->geo.dir, x->o.mem_layers);
	if (kvmem_backend_open(x->b->ops->name, &m,
			       &(kvmem_backend_opts){ .max_chunk = 4096, .mem_cap = x->o.gpu_mem,
						      .page_pool = 2ull << 30,
						      .index_mem = index_mem }, &b) < 0)
		return -1;
	x->b = b;
	snprintf(dir, sizeof(dir), "%s/memory", x->o.dir);
	printf("\ndevice memory against the workspace (%d layers of the same width, view %" PRId64
	       " tokens, device page pool 2 GiB, the index's device copy at most %s):\n",
	       m.cfg.n_layers, x->o.view,
	       cli_fmt_bytes(buf, sizeof(buf), (double)index_mem));
	for (int i = 0; i < x->o.n_memory; i++) {
		int64_t tok = x->o.memory[i] / BLOCK * BLOCK;
		uint64_t pages = (uint64_t)(tok / BLOCK) * m.cfg.n_layers * x->page_bytes;
		struct step_result r;
		double made;

		if (make_workspace(x, &m, dir, tok, &made) < 0 ||
		    run_tier(x, &m, dir, tok, 1ull << 30, 1, 0, 1, &r) < 0)
			goto out;
		used[i] = r.mem_used;
		printf("  %9" PRId64 " tokens (%.1f GB of pages, written in %.0f s): device %s; "
		       "index %.3f GB on the host, %.3f GB on the device; selection (scoring %s, "
		       "and the plan) %.1f ms; a step %.1f ms (host pool 1 GiB: entering pages from "
		       "NVMe)\n", tok, pages / 1e9, made,
		       cli_fmt_bytes(buf, sizeof(buf), (double)used[i]), r.index_host / 1e9,
		       r.index_dev / 1e9, scored_where(&r), r.select_only_s * 1e3, r.step_s[0] * 1e3);
		fflush(stdout);
		if (!x->o.keep)
			rm_rf(dir);
	}
	if (x->o.n_memory > 1 && used[0])
		printf("  growth %" PRId64 " -> %" PRId64 " tokens: %+.2f%%\n", x->o.memory[0],
		       x->o.memory[x->o.n_memory - 1],
		       100.0 * ((double)used[x->o.n_memory - 1] / used[0] - 1));
	rc = 0;
out:
	x->b = saved;
	kvmem_backend_close(b);
	return rc;
}

/* The largest view a backend with chunks of 512 can reserve under the
 * cap: what fits on a card of that size. */
static int ph_fits(struct ctx *x)
{
	kvmem_backend *b = NULL;
	kvmem_view *v = NULL;
	int64_t lo = 0, hi = 1 << 22;
	char buf[3][64];
	int rc = -1;

	if (!x->o.gpu_mem)
		return kvmem_error(EINVAL, "the fits phase needs --gpu-mem");
	if (kvmem_backend_open(x->b->ops->name, &x->geo,
			       &(kvmem_backend_opts){ .max_chunk = 512, .mem_cap = x->o.gpu_mem }, &b) < 0)
		return -1;
	/* Binary search in steps of 1024 slots; a refused reserve takes
	 * nothing. */
	while (hi - lo > 1024) {
		int64_t mid = (lo + hi) / 2 / 1024 * 1024;

		if (b->ops->view_create(b->ctx, &v) < 0)
			goto out;
		if (b->ops->reserve(b->ctx, v, mid) == 0)
			lo = mid;
		else
			hi = mid;
		b->ops->view_destroy(b->ctx, v);
		v = NULL;
	}
	printf("\nunder a cap of %s (chunks of 512): the backend holds %s (weights and the "
	       "forward pass's scratch); a view of up to %" PRId64 " slots fits (%s), i.e. a "
	       "budget of about %" PRId64 " tokens with the default reserve of budget/8; the "
	       "device page pool takes half of what the cap then leaves\n",
	       cli_fmt_bytes(buf[0], sizeof(buf[0]), (double)x->o.gpu_mem),
	       cli_fmt_bytes(buf[1], sizeof(buf[1]), (double)(b->ops->mem_used ?
							      b->ops->mem_used(b->ctx) : 0)),
	       lo, cli_fmt_bytes(buf[2], sizeof(buf[2]), (double)lo * x->geo.cfg.n_layers *
			 x->geo.cfg.n_kv_heads * x->geo.cfg.head_dim * 4), lo * 8 / 9 / 1024 * 1024);
	rc = 0;
out:
	kvmem_backend_close(b);
	return rc;
}

int bench_step(int argc, char **argv)
{
	struct ctx x = { 0 };
	const kvmem_model *m;
	char buf[64];
	int rc = 1, usage_err;

	switch (parse_args(argc, argv, &x.o)) {
	case 1:
		return 0;
	case -1:
		return EXIT_USAGE;
	}
	/* Weights from a directory keep its layers; --layers cuts a preset. */
	if (!(m = bench_model_open(&x.o.bm, WHO, "8b", x.o.layers, &usage_err)))
		return usage_err ? EXIT_USAGE : 1;
	x.geo = *m;
	x.half = (size_t)x.geo.cfg.n_kv_heads * BLOCK * x.geo.cfg.head_dim * 2;
	x.page_bytes = 2 * x.half;
	if (mkdir(x.o.dir, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "%s: %s: %s\n", WHO, x.o.dir, strerror(errno));
		return 1;
	}
	if (kvmem_backend_open(x.o.bm.backend, &x.geo,
			       &(kvmem_backend_opts){ .max_chunk = 4096, .mem_cap = x.o.gpu_mem,
						      .index_mem = x.o.index_mem,
						      .tp = x.o.tp }, &x.b) < 0)
		goto err;
	printf("kvmem bench step: backend %s, model %s with %d layers (hidden %d, %d/%d heads, "
	       "head_dim %d), blocks of %d, pages bf16 of %zu KiB, scratch %s\n", x.b->ops->name,
	       x.geo.dir, x.geo.cfg.n_layers, x.geo.cfg.hidden, x.geo.cfg.n_heads,
	       x.geo.cfg.n_kv_heads, x.geo.cfg.head_dim, BLOCK, x.page_bytes >> 10, x.o.dir);
	if (x.o.gpu_mem)
		printf("device memory cap %s\n", cli_fmt_bytes(buf, sizeof(buf), (double)x.o.gpu_mem));
	fflush(stdout);
	if (ph_ceilings(&x) < 0)
		goto err;
	if ((x.o.only & PH_REMAT) && ph_remat(&x) < 0)
		goto err;
	fflush(stdout);
	if ((x.o.only & PH_COLDIN) && ph_coldin(&x) < 0)
		goto err;
	fflush(stdout);
	if ((x.o.only & (PH_STEP | PH_DECODE)) && ph_step(&x, x.o.only) < 0)
		goto err;
	fflush(stdout);
	if ((x.o.only & PH_STAGE) && ph_stageout(&x) < 0)
		goto err;
	fflush(stdout);
	if ((x.o.only & PH_MEM) && ph_memory(&x) < 0)
		goto err;
	fflush(stdout);
	if ((x.o.only & PH_FITS) && x.o.gpu_mem && ph_fits(&x) < 0)
		goto err;
	if (x.b->ops->mem_used)
		printf("\ndevice memory held by the backend at the end: %s\n",
		       cli_fmt_bytes(buf, sizeof(buf), (double)x.b->ops->mem_used(x.b->ctx)));
	rc = 0;
	goto out;
err:
	fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
out:
	if (x.peer)
		x.b->ops->view_destroy(x.b->ctx, x.peer);
	kvmem_backend_close(x.b);
	bench_model_close(&x.o.bm);
	if (!x.o.keep)
		rm_rf(x.o.dir);
	return rc;
}
