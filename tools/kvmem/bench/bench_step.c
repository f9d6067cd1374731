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
 *             pinned copy peak. With --kv-dtype both: the same tokens' bf16
 *             and fp8 pages placed into their views, each page's first time
 *             on the GPU, with the device page pool (the session's way) and
 *             without: fp8 / bf16 tokens/s (issue #27).
 *   coldin    a workspace read cold from NVMe into view slots through the
 *             pager (prefetch everything, then fetch + place 1024 pages at a
 *             time, O_DIRECT into the registered pool) over an O_DIRECT
 *             sequential read of the same pages file, the two alternated
 *             three times (medians: a virtual disk's rate drifts), then the
 *             pager alone (no place); tokens/s beside the read's. In bf16
 *             or fp8 pages (--kv-dtype), or both over the same tokens, each
 *             pass every dtype in turn: fp8 / bf16 tokens/s (issue #27).
 *             With both, step, decode and fits also run in each dtype, one
 *             after the other, and print fp8 against bf16.
 *   step      a workspace of --tokens (random pages written through the
 *             pager: no prefill) with a --view budget: per agent step, the
 *             time from a question's append to the first decoded token (the
 *             question's prefill over the view as it is, selection,
 *             rematerialisation of what enters, one decode: what the user
 *             waits for; until 2026-12-04 it began after the append and
 *             left the question's prefill out), host tier warm (the pool
 *             holds the workspace) and cold (a small pool: entering pages
 *             come from NVMe); the peer is prefilling the view's tokens
 *             from scratch.
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
/*
 * This file: the usage, the options and the driver; the phases are in
 * bench_step_remat.c (ceilings, remat, coldin), bench_step_steps.c (step,
 * decode) and bench_step_stage.c (stageout, memory, fits), the helpers they
 * share in bench_step_util.c (bench_step.h declares them).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_step.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem bench step [options]\n"
		"\n"
		"The GPU paging pipeline, each figure beside its ceiling or peer measured in\n"
		"the same run: rematerialisation (gather, batched copies) over one large pinned\n"
		"copy; cold page-in from NVMe into view slots over an O_DIRECT sequential read;\n"
		"an agent step (a question appended -> first decoded token, warm and cold host\n"
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
		"  --question N       the question's tokens, appended at each step (default 32)\n"
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
		"  --kv-dtype T       bf16 (default), fp8 or both: the workspace's pages and the\n"
		"                     backend's views (as kvmem run --kv-dtype); fp8 runs the\n"
		"                     phases coldin, step, decode, fits and stageout; both runs\n"
		"                     all but stageout and memory in bf16 and in fp8 (a second\n"
		"                     backend) and prints fp8 against bf16: remat over the\n"
		"                     same tokens, each page's first time on the GPU, with the\n"
		"                     device page pool and without, the dtypes in turn; coldin\n"
		"                     over the same tokens (those of --coldin bytes of bf16\n"
		"                     pages), each pass every dtype in turn; step, decode and\n"
		"                     fits one dtype after the other\n"
		"  --policy NAME      the step phase's selection policy (default meank);\n"
		"                     random (seeded by --seed) enters the same blocks\n"
		"                     whatever the KV dtype: --kv-dtype both like for like\n"
		"  --seed S           random pages and tokens (default 1)\n"
		"  --keep             keep the scratch workspaces\n"
		"  --help             this text\n"
		"%s; %s.\n"
		"\n"
		"examples:\n"
		"  kvmem bench step --only ceilings,remat,coldin\n"
		"  kvmem bench step --layers 4 --only step,decode --tokens 256k --view 64k\n"
		"  kvmem bench step --layers 1 --only memory --memory 256k,4M\n"
		"  kvmem bench step --kv-dtype fp8 --only step,decode --tiers warm --view 32k\n"
		"  kvmem bench step --kv-dtype both --only remat,coldin --coldin 2G\n"
		"  kvmem bench step --kv-dtype both --only step,decode --tiers warm --tokens 48k \\\n"
		"      --view 32k        (issue #27's warm step and decode rows in one run)\n"
		"  kvmem bench step --backend cpu --model DIR --kv-dtype both --only coldin\n",
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
		{ "kv-dtype", required_argument, NULL, 'K' },
		{ "policy", required_argument, NULL, 'p' },
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
	o->kv_dtype = KVMEM_DTYPE_BF16;
	o->policy = "meank";
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
		case 'p':
			if (!kvmem_policy_find(optarg)) {
				fprintf(stderr, "%s: --policy: no policy '%s' (kvmem run --help lists "
					"them)\n", WHO, optarg);
				bad = 1;
			}
			o->policy = optarg;
			break;
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
		case 'K':
			o->both = 0;
			if (!strcmp(optarg, "bf16"))
				o->kv_dtype = KVMEM_DTYPE_BF16;
			else if (!strcmp(optarg, "fp8"))
				o->kv_dtype = KVMEM_DTYPE_FP8;
			else if (!strcmp(optarg, "both"))
				o->kv_dtype = KVMEM_DTYPE_BF16, o->both = 1;
			else {
				fprintf(stderr, "%s: --kv-dtype: '%s' (bf16, fp8 or both)\n", WHO,
					optarg);
				bad = 1;
			}
			break;
		default: return -1;
		}
		if (bad)
			return -1;
	}
	if (cli_no_operands(WHO, argc, argv))
		return -1;
	/* The other phases lay out bf16 pages themselves. */
	if (o->kv_dtype == KVMEM_DTYPE_FP8 && !o->both &&
	    (o->only & ~(PH_CEIL | PH_COLDIN | PH_STEP | PH_DECODE | PH_FITS | PH_STAGE))) {
		fprintf(stderr, "%s: --kv-dtype fp8 runs the phases coldin, step, decode, fits and "
			"stageout only (--only)\n", WHO);
		return -1;
	}
	if (o->both && (!(o->only & ~PH_CEIL) ||
			(o->only & ~(PH_CEIL | PH_REMAT | PH_COLDIN | PH_STEP | PH_DECODE | PH_FITS)))) {
		fprintf(stderr, "%s: --kv-dtype both runs the phases remat, coldin, step, decode and "
			"fits (--only, one of them at least)\n", WHO);
		return -1;
	}
	return 0;
}

/* The coldin phase's fp8 arm of --kv-dtype both: x's run with fp8 pages, on
 * a backend of its own opened with fp8 views. */
static int open_fp8(const struct ctx *x, struct ctx *y)
{
	kvmem_page_geom g;

	*y = *x;
	y->b = NULL;
	y->peer = NULL;
	y->o.kv_dtype = KVMEM_DTYPE_FP8;
	geom_of(y, &y->geo, &g);
	y->page_bytes = kvmem_page_bytes(&g);
	return kvmem_backend_open(x->o.bm.backend, &y->geo,
				  &(kvmem_backend_opts){ .max_chunk = 4096, .mem_cap = x->o.gpu_mem,
							 .index_mem = x->o.index_mem, .tp = x->o.tp,
							 .kv_dtype = KVMEM_DTYPE_FP8 }, &y->b);
}

/* --kv-dtype both, phases step and decode: the fp8 arm after the bf16 one
 * (x's figures), then fp8 against bf16 with the targets. */
static int step_both(struct ctx *x, struct ctx *y)
{
	printf("\n--kv-dtype both: the same phases over fp8 pages and views (%s backend)\n",
	       y->b->ops->name);
	y->ce = x->ce;
	if (ph_step(y, y->o.only) < 0)
		return -1;
	if (!(x->o.tiers & TIER_WARM))
		return 0;
	printf("\nfp8 against bf16, the same run: warm step %.1f / %.1f ms, bf16 time / fp8 time "
	       "%.2f (target >= 1.6)", x->warm_step_s * 1e3, y->warm_step_s * 1e3,
	       y->warm_step_s > 0 ? x->warm_step_s / y->warm_step_s : 0);
	if (x->warm_decode_tps > 0 && y->warm_decode_tps > 0)
		printf("; decode in the %" PRId64 "-token view %.1f / %.1f tokens/s, fp8 / bf16 %.2f "
		       "(target >= 1.08 at a 32K view, >= 1.3 at 128K)", x->o.view, y->warm_decode_tps,
		       x->warm_decode_tps, y->warm_decode_tps / x->warm_decode_tps);
	printf("\n");
	if (x->warm_first_s > 0 && y->warm_first_s > 0)
		printf("the warm steps' parts, like for like (a selection that depends on the KV, as "
		       "meank does, enters other blocks in each dtype): "
		       "the question's prefill %.1f / %.1f ms, bf16 / fp8 %.2f; "
		       "first token %.1f / %.1f ms, bf16 / fp8 %.2f; selection and rematerialisation "
		       "%.1f / %.1f us a block entered, bf16 / fp8 %.2f\n", x->warm_ask_s * 1e3,
		       y->warm_ask_s * 1e3, y->warm_ask_s > 0 ? x->warm_ask_s / y->warm_ask_s : 0,
		       x->warm_first_s * 1e3,
		       y->warm_first_s * 1e3, x->warm_first_s / y->warm_first_s,
		       x->warm_sel_per_block_s * 1e6, y->warm_sel_per_block_s * 1e6,
		       y->warm_sel_per_block_s > 0 ? x->warm_sel_per_block_s / y->warm_sel_per_block_s : 0);
	/* What bounds that ratio: the step's floor (no KV read) is the same
	 * for both dtypes; fp8 at best removes all of the rest (the ceiling)
	 * or half of it (its bytes halved, at the same rates). */
	if (x->floor_step_s > 0 && x->warm_step_s > x->floor_step_s)
		printf("what bounds the warm step's ratio: bf16's step floor %.1f ms (the question and "
		       "a token over an empty view, no KV read) is fp8's too: bf16 time / fp8 time is "
		       "at most %.2f with no KV cost at all, %.2f with half of bf16's\n",
		       x->floor_step_s * 1e3, x->warm_step_s / x->floor_step_s,
		       x->warm_step_s / (x->floor_step_s + (x->warm_step_s - x->floor_step_s) / 2));
	return 0;
}

/* --kv-dtype both, phase fits: the fp8 arm's largest view against bf16's. */
static int fits_both(struct ctx *x, struct ctx *y)
{
	if (ph_fits(y) < 0)
		return -1;
	printf("fp8 against bf16, the same cap: the largest view %" PRId64 " / %" PRId64
	       " slots, fp8 / bf16 %.2f (target 2)\n", y->fits_slots, x->fits_slots,
	       x->fits_slots ? (double)y->fits_slots / x->fits_slots : 0);
	return 0;
}

int bench_step(int argc, char **argv)
{
	struct ctx x = { 0 }, y = { 0 };
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
	{
		kvmem_page_geom g;

		geom_of(&x, &x.geo, &g);
		x.page_bytes = kvmem_page_bytes(&g);
	}
	if (mkdir(x.o.dir, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "%s: %s: %s\n", WHO, x.o.dir, strerror(errno));
		return 1;
	}
	if (kvmem_backend_open(x.o.bm.backend, &x.geo,
			       &(kvmem_backend_opts){ .max_chunk = 4096, .mem_cap = x.o.gpu_mem,
						      .index_mem = x.o.index_mem,
						      .tp = x.o.tp,
						      .kv_dtype = x.o.kv_dtype == KVMEM_DTYPE_FP8 ?
								  KVMEM_DTYPE_FP8 : 0 }, &x.b) < 0)
		goto err;
	printf("kvmem bench step: backend %s, model %s with %d layers (hidden %d, %d/%d heads, "
	       "head_dim %d), blocks of %d, pages %s of %zu bytes, scratch %s\n", x.b->ops->name,
	       x.geo.dir, x.geo.cfg.n_layers, x.geo.cfg.hidden, x.geo.cfg.n_heads,
	       x.geo.cfg.n_kv_heads, x.geo.cfg.head_dim, BLOCK, kvmem_dtype_name(x.o.kv_dtype),
	       x.page_bytes, x.o.dir);
	if (x.o.both) {
		if (open_fp8(&x, &y) < 0)
			goto err;
		printf("--kv-dtype both: fp8 pages of %zu bytes into fp8 views on a second %s "
		       "backend\n", y.page_bytes, y.b->ops->name);
	}
	if (x.o.gpu_mem)
		printf("device memory cap %s\n", cli_fmt_bytes(buf, sizeof(buf), (double)x.o.gpu_mem));
	fflush(stdout);
	if (ph_ceilings(&x) < 0)
		goto err;
	if ((x.o.only & PH_REMAT) && (x.o.both ? ph_remat_both(&x, &y) : ph_remat(&x)) < 0)
		goto err;
	fflush(stdout);
	if ((x.o.only & PH_COLDIN) && (x.o.both ? ph_coldin_both(&x, &y) : ph_coldin(&x)) < 0)
		goto err;
	fflush(stdout);
	if ((x.o.only & (PH_STEP | PH_DECODE)) &&
	    (ph_step(&x, x.o.only) < 0 || (x.o.both && step_both(&x, &y) < 0)))
		goto err;
	fflush(stdout);
	if ((x.o.only & PH_STAGE) && ph_stageout(&x) < 0)
		goto err;
	fflush(stdout);
	if ((x.o.only & PH_MEM) && ph_memory(&x) < 0)
		goto err;
	fflush(stdout);
	if ((x.o.only & PH_FITS) && x.o.gpu_mem &&
	    (ph_fits(&x) < 0 || (x.o.both && fits_both(&x, &y) < 0)))
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
	if (y.peer)
		y.b->ops->view_destroy(y.b->ctx, y.peer);
	kvmem_backend_close(y.b);
	kvmem_backend_close(x.b);
	bench_model_close(&x.o.bm);
	if (!x.o.keep)
		rm_rf(x.o.dir);
	return rc;
}
