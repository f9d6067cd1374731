// SPDX-License-Identifier: MIT
/*
 * kvmem bench engine: prefill and decode speed of a backend, each beside its
 * ceiling measured in the same run.
 *
 *   prefill  tokens/s over P tokens in chunks (each chunk attends to the
 *            tokens before it and itself), as model FLOP/s (the matrix
 *            products and the causal attention) over the backend's GEMM rate,
 *            a short burst's and (cuda) the rate held for a second at the
 *            power limit, which a long prefill runs at;
 *   decode   tokens/s one token at a time after a context of C tokens,
 *            against the memory roofline: the bytes one token must read
 *            (every weight once, the lm_head, and the context's K and V)
 *            over the copy rate measured here.
 *
 * With --preset (default 8b on a GPU) the model is a geometry only: the
 * cuda backend makes random bf16 weights on the GPU (no 16 GB file). The
 * PyTorch peer is tools/bench/torch_engine.py; tools/bench/engine_gpu.sh runs
 * both in one call and prints the ratios. On the cuda backend decode runs as
 * a CUDA graph per step unless KVMEM_CUDA_GRAPH=0 (user/backend/cuda_fwd.c),
 * and one-row GEMMs by kvmem's GEMV unless KVMEM_CUDA_GEMV=0: the header
 * says which.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "bench_common.h"
#include "cli_util.h"
#include "cmd.h"

#define MAX_LIST 16
#define WHO "kvmem bench engine"

struct opts {
	struct bench_model bm;
	int64_t prefill[MAX_LIST], decode_at[MAX_LIST];
	int n_prefill, n_decode, chunk, decode_tokens, json;
	int tp;			/* --tp: tensor parallel ranks; 0: off */
	uint64_t seed;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem bench engine [options]\n"
		"\n"
		"Prefill and decode speed of a compute backend, beside the ceilings measured\n"
		"in the same run: the backend's GEMM rate (prefill; on a GPU both a short\n"
		"burst's and the rate held for a second at the power limit) and the memory\n"
		"roofline (decode: the bytes one token reads over the measured copy rate).\n"
		"\n"
		BENCH_MODEL_HELP
		"  --prefill LIST     prompt lengths (default 4k,16k,32k; k = 1024 here)\n"
		"  --decode LIST      contexts to decode after (default 4k,32k)\n"
		"  --decode-tokens N  tokens timed per context (default 32)\n"
		"  --chunk N          prefill chunk (default 4096, at most the shortest prompt)\n"
		"  --seed S           the prompt's random token ids (default 1)\n"
		"  --json             one JSON object per row on stdout\n"
		"  --tp N             tensor parallel over N GPUs (as kvmem run --tp; 1 runs\n"
		"                     the split code on one device)\n"
		"  --help             this text\n"
		"\n"
		"examples:\n"
		"  kvmem bench engine --backend cuda\n"
		"  kvmem bench engine --backend cpu --model /tmp/tiny --prefill 512 --decode 512\n");
}

/* "4k,16k": token counts, k = 1024 (contexts are powers of two). */
static int parse_tokens(const char *opt, const char *s, int64_t *out, int max)
{
	char *list = strdup(s), *save = NULL;
	int n = 0;

	if (!list)
		return -1;
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		size_t len = strlen(t);
		int64_t v;
		int k = len && (t[len - 1] == 'k' || t[len - 1] == 'K');

		if (k)
			t[len - 1] = 0;
		if (n == max || cli_parse_i64(WHO, opt, t, 1, k ? (1 << 20) : (1 << 30), &v)) {
			free(list);
			return -1;
		}
		out[n++] = k ? v * 1024 : v;
	}
	free(list);
	return n ? n : -1;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option opts[] = {
		BENCH_MODEL_OPTIONS,			     { "prefill", required_argument, NULL, 'P' },
		{ "decode", required_argument, NULL, 'D' },  { "decode-tokens", required_argument, NULL, 'n' },
		{ "chunk", required_argument, NULL, 'c' },   { "seed", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },	     { "help", no_argument, NULL, 'h' },
		{ "tp", required_argument, NULL, 't' },
		{ 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	o->prefill[0] = 4096, o->prefill[1] = 16384, o->prefill[2] = 32768, o->n_prefill = 3;
	o->decode_at[0] = 4096, o->decode_at[1] = 32768, o->n_decode = 2;
	o->decode_tokens = 32;
	o->chunk = 4096;
	o->seed = 1;
	cli_getopt_reset();
	while ((c = cli_getopt(WHO, argc, argv, opts)) != -1) {
		const char *name = cli_optname;
		int bad = 0;

		if (bench_model_opt(&o->bm, c, optarg))
			continue;
		switch (c) {
		case 'h': usage(stdout); return 1;
		case 'P': bad = (o->n_prefill = parse_tokens(name, optarg, o->prefill, MAX_LIST)) < 0; break;
		case 'D': bad = (o->n_decode = parse_tokens(name, optarg, o->decode_at, MAX_LIST)) < 0; break;
		case 'n': bad = cli_parse_int(WHO, name, optarg, 1, 100000, &o->decode_tokens); break;
		case 'c': bad = cli_parse_int(WHO, name, optarg, 1, 1 << 16, &o->chunk); break;
		case 's': bad = cli_parse_u64(WHO, name, optarg, &o->seed); break;
		case 'j': o->json = 1; break;
		case 't': bad = cli_parse_int(WHO, name, optarg, 1, 64, &o->tp); break;
		default: return -1;
		}
		if (bad)
			return -1;
	}
	if (cli_no_operands(WHO, argc, argv))
		return -1;
	for (int i = 0; i < o->n_prefill; i++)
		if (o->chunk > o->prefill[i])
			o->chunk = (int)o->prefill[i];
	return 0;
}

/* Causal attention FLOPs of tokens p0..p1-1 (token t sees t + 1 keys):
 * q.k and p.v, 2 * head_dim each per query head and key. */
static double attn_flops(const kvmem_config *c, int64_t p0, int64_t p1)
{
	double keys = ((double)p1 * (p1 + 1) - (double)p0 * (p0 + 1)) / 2;

	return 4.0 * c->n_layers * c->n_heads * c->head_dim * keys;
}

static void random_ids(int32_t *ids, int64_t n, int vocab, uint64_t seed)
{
	uint64_t r = kvmem_rng_seed(seed);

	for (int64_t i = 0; i < n; i++)
		ids[i] = (int32_t)(kvmem_rng_uniform(&r) * vocab);
}

/* Prefill ids[0..n) in chunks into v; seconds, or < 0. */
static double prefill(kvmem_backend *b, kvmem_view *v, const int32_t *ids, int64_t n, int chunk,
		      float *logits)
{
	double t0 = cli_now_s();

	for (int64_t at = 0; at < n; at += chunk) {
		int k = n - at < chunk ? (int)(n - at) : chunk;

		if (b->ops->forward(b->ctx, v, ids + at, k, at + k == n ? logits : NULL, 0, NULL) < 0)
			return -1;
	}
	return cli_now_s() - t0;
}

int bench_engine(int argc, char **argv)
{
	struct opts o;
	const kvmem_model *m;
	kvmem_backend *b = NULL;
	kvmem_view *v = NULL;
	kvmem_ceilings ce;
	int32_t *ids = NULL;
	float *logits = NULL;
	int64_t most = 0;
	int rc = 1, elem, w_elem, usage_err;
	char buf[64];

	switch (parse_args(argc, argv, &o)) {
	case 1:
		return 0;
	case -1:
		return EXIT_USAGE;
	}
	if (!(m = bench_model_open(&o.bm, WHO, "8b", 0, &usage_err)))
		return usage_err ? EXIT_USAGE : 1;
	if (kvmem_backend_open(o.bm.backend, m, &(kvmem_backend_opts){ .max_chunk = o.chunk, .tp = o.tp },
			       &b) < 0 ||
	    b->ops->view_create(b->ctx, &v) < 0)
		goto err;
	if (!b->ops->ceilings) {
		kvmem_error(ENOTSUP, "the %s backend cannot measure its ceilings", b->ops->name);
		goto err;
	}
	if (b->ops->ceilings(b->ctx, &ce) < 0)
		goto err;
	elem = (int)bench_kv_elem(b, 0, m->cfg.head_dim);
	w_elem = bench_weight_elem(b);
	for (int i = 0; i < o.n_prefill; i++)
		most = o.prefill[i] > most ? o.prefill[i] : most;
	for (int i = 0; i < o.n_decode; i++)
		most = o.decode_at[i] + o.decode_tokens > most ? o.decode_at[i] + o.decode_tokens : most;
	ids = malloc(sizeof(int32_t) * most);
	logits = malloc(sizeof(float) * m->cfg.vocab);
	if (!ids || !logits) {
		kvmem_error(ENOMEM, "out of memory");
		goto err;
	}
	random_ids(ids, most, m->cfg.vocab, o.seed);
	if (b->ops->reserve(b->ctx, v, most) < 0)
		goto err;
	if (!o.json) {
		printf("machine: %s; backend %s; model %s (%d layers, hidden %d, %d/%d heads, head_dim "
		       "%d, vocab %d)\n", ce.device, b->ops->name, m->dir, m->cfg.n_layers,
		       m->cfg.hidden, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.head_dim, m->cfg.vocab);
		printf("ceilings measured now: GEMM %.1f TFLOP/s (%s)", ce.matmul_tflops,
		       ce.matmul_type);
		if (ce.matmul_held_tflops > 0)
			printf(", %.1f held for a second at the power limit", ce.matmul_held_tflops);
		printf("; copy %.0f GB/s (read + written)\n", ce.copy_gbps);
		if (!strcmp(b->ops->name, "cuda")) {
			const char *g = getenv("KVMEM_CUDA_GRAPH"), *gv = getenv("KVMEM_CUDA_GEMV");

			printf("decode: %s; one-row GEMMs by %s\n",
			       g && g[0] == '0' ? "plain launches (KVMEM_CUDA_GRAPH=0)" : "a CUDA graph per step",
			       gv && gv[0] == '0' ? "cuBLASLt (KVMEM_CUDA_GEMV=0)" : "kvmem's GEMV");
		} else {
			printf("weights read as %s; the decode roofline counts %d bytes a weight, %d a "
			       "KV value\n", w_elem == 2 ? "bf16" : "fp32", w_elem, elem);
		}
		printf("\n%-10s %8s %12s %10s %8s %8s\n", "prefill", "chunk", "tokens/s", "TFLOP/s",
		       "of GEMM", "of held");
	}
	/* A warm-up pass: first-use costs (GEMM plans, scratch) stay out. */
	if (prefill(b, v, ids, o.chunk, o.chunk, logits) < 0 || b->ops->set_length(b->ctx, v, 0) < 0)
		goto err;
	for (int i = 0; i < o.n_prefill; i++) {
		int64_t n = o.prefill[i];
		double t, fl = bench_flops_per_token(&m->cfg) * n + attn_flops(&m->cfg, 0, n) +
			       2.0 * m->cfg.vocab * m->cfg.hidden;

		if (b->ops->set_length(b->ctx, v, 0) < 0 || (t = prefill(b, v, ids, n, o.chunk, logits)) < 0)
			goto err;
		if (o.json)
			printf("{\"bench\": \"engine\", \"backend\": \"%s\", \"device\": \"%s\", "
			       "\"phase\": \"prefill\", \"tokens\": %" PRId64 ", \"chunk\": %d, "
			       "\"seconds\": %.6f, \"tokens_per_s\": %.1f, \"tflops\": %.2f, "
			       "\"gemm_tflops\": %.2f, \"gemm_held_tflops\": %.2f}\n", b->ops->name,
			       ce.device, n, o.chunk, t, n / t, fl / t / 1e12, ce.matmul_tflops,
			       ce.matmul_held_tflops);
		else if (ce.matmul_held_tflops > 0)
			printf("%-10" PRId64 " %8d %12.0f %10.3f %7.0f%% %7.0f%%\n", n, o.chunk, n / t,
			       fl / t / 1e12, 100 * fl / t / 1e12 / ce.matmul_tflops,
			       100 * fl / t / 1e12 / ce.matmul_held_tflops);
		else
			printf("%-10" PRId64 " %8d %12.0f %10.3f %7.0f%% %8s\n", n, o.chunk, n / t,
			       fl / t / 1e12, 100 * fl / t / 1e12 / ce.matmul_tflops, "-");
		fflush(stdout);
	}
	if (!o.json)
		printf("\n%-10s %8s %12s %12s %8s\n", "decode at", "tokens", "tokens/s", "roofline",
		       "of it");
	for (int i = 0; i < o.n_decode; i++) {
		int64_t ctx = o.decode_at[i];
		uint64_t rng = kvmem_rng_seed(o.seed);
		kvmem_sampler greedy = { 0 };
		double t0, t, roof;
		int32_t tok;

		if (b->ops->set_length(b->ctx, v, 0) < 0 || prefill(b, v, ids, ctx, o.chunk, logits) < 0)
			goto err;
		t0 = cli_now_s();
		for (int k = 0; k < o.decode_tokens; k++) {
			tok = kvmem_sample(logits, m->cfg.vocab, &greedy, &rng);
			if (tok < 0 || b->ops->forward(b->ctx, v, &tok, 1, logits, 0, NULL) < 0)
				goto err;
		}
		t = (cli_now_s() - t0) / o.decode_tokens;
		/* The average context over the timed tokens. */
		roof = ce.copy_gbps * 1e9 /
		       bench_decode_bytes(&m->cfg, ctx + o.decode_tokens / 2, w_elem, elem);
		if (o.json)
			printf("{\"bench\": \"engine\", \"backend\": \"%s\", \"device\": \"%s\", "
			       "\"phase\": \"decode\", \"context\": %" PRId64 ", \"tokens\": %d, "
			       "\"tokens_per_s\": %.1f, \"roofline_tokens_per_s\": %.1f, "
			       "\"copy_gbps\": %.1f, \"weight_bytes\": %d}\n", b->ops->name, ce.device,
			       ctx, o.decode_tokens, 1 / t, roof, ce.copy_gbps, w_elem);
		else
			printf("%-10" PRId64 " %8d %12.1f %12.1f %7.0f%%\n", ctx, o.decode_tokens, 1 / t,
			       roof, 100 / t / roof);
		fflush(stdout);
	}
	if (b->ops->mem_used && !o.json)
		printf("\ndevice memory held by the backend: %s\n",
		       cli_fmt_bytes(buf, sizeof(buf), (double)b->ops->mem_used(b->ctx)));
	rc = 0;
	goto out;
err:
	fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
out:
	if (v)
		b->ops->view_destroy(b->ctx, v);
	kvmem_backend_close(b);
	bench_model_close(&o.bm);
	free(ids);
	free(logits);
	return rc;
}
