// SPDX-License-Identifier: MIT
/*
 * kvmem run: prefill a token sequence and decode, on the CPU reference
 * engine with a plain growing KV cache; with --script, an agent session over
 * a workspace (session_main.c). One option table serves both modes; an
 * option of the other mode is refused by name.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvmem/backend.h"
#include "kvmem/script.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/session.h"
#include "cli_util.h"
#include "cmd.h"
#include "run.h"

#define MAX_TOKENS (1L << 30)

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem run --model DIR (--prompt FILE | --prompt-text TEXT | --chat FILE |\n"
		"                 --random N) [options]\n"
		"       kvmem run --model DIR --script FILE [session options]\n"
		"\n"
		"A plain run prefills a prompt through a compute backend (--backend), then\n"
		"decodes, and prints the generated ids and the speed. With --script it runs an agent\n"
		"session: the script's appends are prefilled in chunks, each {\"decode\": N}\n"
		"line is a step boundary (select blocks with the last queries, rematerialise\n"
		"the view, generate N tokens with the view frozen).\n"
		"\n"
		"options of both modes:\n"
		"  --model DIR         Hugging Face model directory (config.json + safetensors)\n"
		"  --chunk N           prefill chunk in tokens (default 256 plain, 128 session)\n"
		"  --seed S            plain: seed of --random; session: seed of random appends,\n"
		"                      the random policy and sampling (default 0)\n"
		"  --temperature T     0 (default) is greedy; T > 0 samples at that temperature\n"
		"  --top-k K           sample among the K most likely tokens (0, default: all)\n"
		"  --top-p P           sample among the fewest tokens holding P of the mass,\n"
		"                      0 < P <= 1 (default 1: all)\n"
		"  --sample-seed S     seed of the sampler (default: 0 plain, --seed session)\n"
		"  --backend NAME      compute backend: cpu, cuda, or auto (default: cuda\n"
		"                      when this kvmem has it and a GPU is there, else cpu)\n"
		"  --gpu-mem SIZE      device memory the backend may take: weights, view,\n"
		"                      device page pool, staging (default: no cap)\n"
		"  --kv-dtype T        the KV attention reads: bf16 (default: the backend's\n"
		"                      own, fp32 on cpu) or fp8 (e4m3 with a scale per token\n"
		"                      and KV head; cpu and cuda); a workspace keeps\n"
		"                      the one it was created with and refuses the other\n"
		"  --tp N              tensor parallel over N GPUs, the model split by KV\n"
		"                      heads (default: off); 1 runs the split code on one\n"
		"                      device (bit-exact on cpu); N > 1 is refused until the\n"
		"                      multi-GPU forward is built\n"
		"  --help              this text\n"
		"\n"
		"plain runs:\n"
		"  --prompt FILE       prompt token ids separated by whitespace (--tokens FILE\n"
		"                      is the old spelling, still read)\n"
		"  --prompt-text TEXT  the prompt as text, through the model's tokenizer\n"
		"                      (tokenizer.json, or agentlang's for kvmem's own model);\n"
		"                      the generated ids are printed as text too\n"
		"  --chat FILE         a JSON array of {\"role\", \"content\"} messages (or an\n"
		"                      OpenAI request's {\"messages\": [...]}), rendered by the\n"
		"                      chat template (Qwen3's, or agentlang's)\n"
		"  --random N          a prompt of N random token ids instead\n"
		"  --decode N          tokens to generate after the prompt (default 16)\n"
		"  --logits FILE       write the logits of every prompt position: float32,\n"
		"                      little-endian, [prompt tokens][vocab]\n"
		"\n"
		"agent sessions:\n"
		"  --script FILE       one JSON object per line, read and run line by line:\n"
		"                        {\"append\": [ids...]}  {\"append_random\": N, \"seed\": S}\n"
		"                        {\"decode\": N}   (\"pin\": true on an append pins its span)\n"
		"  --budget N          history tokens the view may hold (default 0: unlimited)\n"
		"  --block N           tokens per block, a power of two 16..256 (default 32)\n"
		"  --policy NAME       selection policy (default meank; see below)\n"
		"  --sink N            first tokens always in the view (default budget/100)\n"
		"  --recent N          last tokens always in the view (default budget/12)\n"
		"  --reserve N         tail slots between selections (default max(chunk, budget/8))\n"
		"  --query-tokens N    last tokens whose queries drive selection (default 4)\n"
		"  --layout L          where the view keeps its blocks: stable (default: a kept\n"
		"                      block keeps its slot, entering blocks take the freed\n"
		"                      ones: far fewer moves, positions out of order) or\n"
		"                      compact (chronological, a block entering or leaving\n"
		"                      shifts every later one); KVMEM_LAYOUT sets the default;\n"
		"                      a reopened session keeps the layout it was saved with\n"
		"  --json              one JSON object per step on stdout\n"
		"  --check-exact       run a full-context twin alongside; report the largest logit\n"
		"                      difference per step; exit 1 if it is not 0 while the\n"
		"                      budget holds the whole workspace\n"
		"  --workspace DIR     keep the history in a workspace directory: created, or\n"
		"                      reopened and continued with no re-prefill exactly where\n"
		"                      it stopped (the session state is committed with the\n"
		"                      history after every script line; Documentation/pager.md);\n"
		"                      rados://POOL/NAME keeps it in a Ceph pool instead\n"
		CLI_CEPH_CONF_HELP
		"  --host-cap SIZE     host pool of the workspace's pager (default 256M)\n"
		"  --cache-policy P    its replacement policy: lru (default), lfu, score\n"
		"  --pager NAME        who reads the workspace's pages back: uring (default,\n"
		"                      the userspace pager) or kmod (the kernel module,\n"
		"                      /dev/kvmem; writes and commits stay the pager's)\n"
		"  --trace FILE        record every selection for kvmem lab (lab.md)\n"
		"\n"
		"Token counts (N) take k, M, G (powers of 1000); SIZE takes k, M, G, T\n"
		"(powers of 1024: 256M = 268435456 bytes). Logits that are NaN or infinite\n"
		"stop the run with an error instead of being sampled.\n"
		"\n"
		"policies:\n");
	for (int i = 0; kvmem_policy_at(i); i++)
		fprintf(f, "  %-9s %s\n", kvmem_policy_at(i)->name, kvmem_policy_at(i)->what);
	fprintf(f,
		"\n"
		"examples:\n"
		"  kvmem run --model M --random 512 --decode 32\n"
		"  kvmem run --model M --prompt prompt.txt --temperature 0.7 --top-p 0.9\n"
		"  kvmem run --model /models/Qwen3-0.6B --prompt-text 'The capital of France is'\n"
		"  kvmem run --model /models/Qwen3-0.6B --chat messages.json --decode 64\n"
		"  kvmem run --model M --script session.jsonl --budget 512 --policy refine\n"
		"  kvmem run --model M --script session.jsonl --workspace ws --host-cap 64M --json\n");
}

/* ---- options --------------------------------------------------------------- */
enum {
	O_MODEL = 256, O_PROMPT, O_RANDOM, O_DECODE, O_LOGITS, O_SCRIPT, O_BUDGET, O_BLOCK,
	O_POLICY, O_SINK, O_RECENT, O_RESERVE, O_QUERY, O_JSON, O_CHECK, O_WORKSPACE, O_HOSTCAP,
	O_CACHEPOL, O_BACKEND, O_CHUNK, O_SEED, O_TEMP, O_TOPK, O_TOPP, O_SSEED, O_GPUMEM,
	O_TRACE, O_PAGER, O_PTEXT, O_CHAT, O_CEPHCONF, O_KVDTYPE, O_TP, O_LAYOUT,
};

static const struct option opts[] = {
	{ "model", required_argument, NULL, O_MODEL },
	{ "prompt", required_argument, NULL, O_PROMPT },
	{ "prompt-text", required_argument, NULL, O_PTEXT },
	{ "chat", required_argument, NULL, O_CHAT },
	{ "tokens", required_argument, NULL, O_PROMPT },	/* the old spelling */
	{ "random", required_argument, NULL, O_RANDOM },
	{ "decode", required_argument, NULL, O_DECODE },
	{ "logits", required_argument, NULL, O_LOGITS },
	{ "script", required_argument, NULL, O_SCRIPT },
	{ "budget", required_argument, NULL, O_BUDGET },
	{ "block", required_argument, NULL, O_BLOCK },
	{ "policy", required_argument, NULL, O_POLICY },
	{ "sink", required_argument, NULL, O_SINK },
	{ "recent", required_argument, NULL, O_RECENT },
	{ "reserve", required_argument, NULL, O_RESERVE },
	{ "query-tokens", required_argument, NULL, O_QUERY },
	{ "layout", required_argument, NULL, O_LAYOUT },
	{ "json", no_argument, NULL, O_JSON },
	{ "check-exact", no_argument, NULL, O_CHECK },
	{ "workspace", required_argument, NULL, O_WORKSPACE },
	{ "host-cap", required_argument, NULL, O_HOSTCAP },
	{ "cache-policy", required_argument, NULL, O_CACHEPOL },
	{ "trace", required_argument, NULL, O_TRACE },
	{ "pager", required_argument, NULL, O_PAGER },
	{ "ceph-conf", required_argument, NULL, O_CEPHCONF },
	{ "backend", required_argument, NULL, O_BACKEND },
	{ "chunk", required_argument, NULL, O_CHUNK },
	{ "seed", required_argument, NULL, O_SEED },
	{ "temperature", required_argument, NULL, O_TEMP },
	{ "top-k", required_argument, NULL, O_TOPK },
	{ "top-p", required_argument, NULL, O_TOPP },
	{ "sample-seed", required_argument, NULL, O_SSEED },
	{ "gpu-mem", required_argument, NULL, O_GPUMEM },
	{ "kv-dtype", required_argument, NULL, O_KVDTYPE },
	{ "tp", required_argument, NULL, O_TP },
	{ "help", no_argument, NULL, 'h' },
	{ 0 },
};

/* Which mode an option belongs to: 'p' plain, 's' session, 0 both. */
static int mode_of(int c)
{
	switch (c) {
	case O_PROMPT: case O_RANDOM: case O_DECODE: case O_LOGITS: case O_PTEXT: case O_CHAT:
		return 'p';
	case O_SCRIPT: case O_BUDGET: case O_BLOCK: case O_POLICY: case O_SINK: case O_RECENT:
	case O_RESERVE: case O_QUERY: case O_JSON: case O_CHECK: case O_WORKSPACE: case O_HOSTCAP:
	case O_CACHEPOL: case O_LAYOUT:
	case O_TRACE:
	case O_PAGER:
	case O_CEPHCONF:
		return 's';
	default:
		return 0;
	}
}

static int value(int c, const char *v, const char *name, struct run_opts *o)
{
	const char *w = RUN_WHO;

	switch (c) {
	case O_MODEL: o->model = v; return 0;
	case O_PROMPT: o->prompt = v; return 0;
	case O_PTEXT: o->prompt_text = v; return 0;
	case O_CHAT: o->chat = v; return 0;
	case O_LOGITS: o->logits = v; return 0;
	case O_SCRIPT: o->script = v; return 0;
	case O_WORKSPACE: o->workspace = v; return 0;
	case O_POLICY: o->policy = v; return 0;
	case O_CACHEPOL: o->cache_policy = v; return 0;
	case O_TRACE: o->trace = v; return 0;
	case O_CEPHCONF: cli_ceph_conf(v); return 0;
	case O_PAGER:
		if (!strcmp(v, "uring") || !strcmp(v, "kmod")) {
			o->pager = v;
			return 0;
		}
		fprintf(stderr, "%s: %s wants uring (the userspace pager) or kmod (the kernel "
			"module), not '%s'\n", w, name, v);
		return -1;
	case O_BACKEND: o->backend = v; return 0;
	case O_KVDTYPE: return cli_parse_kv_dtype(w, name, v, &o->kv_dtype);
	case O_JSON: o->json = 1; return 0;
	case O_CHECK: o->check_exact = 1; return 0;
	case O_RANDOM: return cli_parse_count(w, name, v, 1, MAX_TOKENS, &o->random_n);
	case O_DECODE: return cli_parse_count(w, name, v, 0, MAX_TOKENS, &o->decode);
	case O_BUDGET: return cli_parse_count(w, name, v, 0, INT32_MAX / 2, &o->budget);
	case O_SINK: return cli_parse_count(w, name, v, 0, INT32_MAX / 2, &o->sink);
	case O_RECENT: return cli_parse_count(w, name, v, 0, INT32_MAX / 2, &o->recent);
	case O_RESERVE: return cli_parse_count(w, name, v, 0, INT32_MAX / 2, &o->reserve);
	case O_BLOCK: return cli_parse_int(w, name, v, KVMEM_BLOCK_MIN, KVMEM_BLOCK_MAX, &o->block);
	case O_QUERY: return cli_parse_int(w, name, v, 1, 4096, &o->query_tokens);
	case O_LAYOUT: return cli_parse_layout(w, name, v, &o->layout);
	case O_CHUNK: return cli_parse_int(w, name, v, 1, 1 << 20, &o->chunk);
	case O_SEED: return cli_parse_u64(w, name, v, &o->seed);
	case O_GPUMEM:
		return cli_parse_size(w, name, v, 1 << 20, 1ull << 50, &o->gpu_mem);
	case O_TP: return cli_parse_int(w, name, v, 1, 64, &o->tp);
	case O_SSEED:
		o->sample_seed_set = 1;
		return cli_parse_u64(w, name, v, &o->sampler.seed);
	case O_HOSTCAP:
		/* The pager says whether it holds a page of this geometry. */
		return cli_parse_size(w, name, v, 1, 1ull << 50, &o->host_cap);
	case O_TEMP:
		return cli_parse_float(w, name, v, 0.0f, 1e4f, &o->sampler.temperature);
	case O_TOPK:
		return cli_parse_int(w, name, v, 0, 1 << 30, &o->sampler.top_k);
	case O_TOPP:
		if (cli_parse_float(w, name, v, 0.0f, 1.0f, &o->sampler.top_p))
			return -1;
		if (o->sampler.top_p > 0)
			return 0;
		fprintf(stderr, "%s: --top-p wants a share of the probability mass with 0 < P <= 1 "
			"(1 keeps every token), not '%s'\n", w, v);
		return -1;
	}
	return -1;
}

/* Returns 0 to run, 1 when --help was printed, -1 on bad usage. */
static int parse_args(int argc, char **argv, struct run_opts *o)
{
	char given[2][64] = { "", "" };	/* an option of each mode, for messages */
	int c;

	memset(o, 0, sizeof(*o));
	o->decode = 16;
	o->random_n = -1;
	o->sink = o->recent = o->reserve = -1;
	o->sampler.top_p = 1.0f;
	cli_getopt_reset();
	while ((c = cli_getopt(RUN_WHO, argc, argv, opts)) != -1) {
		if (c == 'h') {
			usage(stdout);
			return 1;
		}
		if (c == '?' || value(c, optarg, cli_optname, o))
			return -1;
		if (mode_of(c) && !given[mode_of(c) == 's'][0])
			snprintf(given[mode_of(c) == 's'], sizeof(given[0]), "%s", cli_optname);
	}
	if (cli_no_operands(RUN_WHO, argc, argv))
		return -1;
	if (!o->model) {
		fprintf(stderr, "%s: --model DIR is required (%s --help)\n", RUN_WHO, RUN_WHO);
		return -1;
	}
	if (o->script) {
		if (given[0][0]) {
			fprintf(stderr, "%s: %s is an option of plain runs; an agent session (--script) "
				"takes its tokens from the script\n", RUN_WHO, given[0]);
			return -1;
		}
		if (o->policy && !kvmem_policy_find(o->policy)) {
			fprintf(stderr, "%s: %s\n", RUN_WHO, kvmem_last_error());
			return -1;
		}
		if ((o->host_cap || o->cache_policy || o->pager) && !o->workspace)
			fprintf(stderr, "%s: note: %s sets a workspace's pager; without --workspace it "
				"changes nothing\n", RUN_WHO, o->host_cap ? "--host-cap" :
				o->cache_policy ? "--cache-policy" : "--pager");
		if (!o->chunk)
			o->chunk = 128;
		if (!o->sample_seed_set)
			o->sampler.seed = o->seed;
		return 0;
	}
	if (given[1][0]) {
		fprintf(stderr, "%s: %s is an option of agent sessions: give --script FILE too, or "
			"leave it out for a plain run (%s --help)\n", RUN_WHO, given[1], RUN_WHO);
		return -1;
	}
	if (!!o->prompt + !!o->prompt_text + !!o->chat + (o->random_n >= 0) != 1) {
		fprintf(stderr, "%s: give exactly one of --prompt FILE, --prompt-text TEXT, --chat FILE "
			"and --random N (or --script FILE "
			"for an agent session)\n", RUN_WHO);
		return -1;
	}
	if (!o->chunk)
		o->chunk = 256;
	return 0;
}

int run_logits_finite(const float *logits, int64_t n)
{
	int ok = 1;

	for (int64_t i = 0; i < n; i++)
		ok &= isfinite(logits[i]);
	return ok;
}

static void print_speed(const char *what, int n, double secs)
{
	printf("%s: %d tokens in %.3f s, %.1f tok/s\n", what, n, secs,
	       secs > 0 ? n / secs : 0.0);
}

/* Prefill the prompt in chunks; leaves the last position's logits in `last`. */
static int prefill(kvmem_backend *e, kvmem_view *v, const int32_t *tok, int n, int chunk,
		   float *buf, float *last, FILE *logits_f, const char *logits_path)
{
	int vocab = kvmem_backend_model(e)->cfg.vocab;

	for (int at = 0; at < n; at += chunk) {
		int k = n - at < chunk ? n - at : chunk;

		if (kvmem_backend_append(e, v, tok + at, k, buf, logits_f != NULL))
			return -1;
		if (logits_f) {
			if (fwrite(buf, sizeof(float) * vocab, k, logits_f) != (size_t)k)
				return kvmem_error(errno, "%s: write failed: %s", logits_path,
						 strerror(errno));
			if (at + k == n)
				memcpy(last, buf + (size_t)(k - 1) * vocab, sizeof(float) * vocab);
		} else if (at + k == n) {
			memcpy(last, buf, sizeof(float) * vocab);
		}
	}
	return 0;
}

static int logits_check(const float *last, int vocab, long pos)
{
	if (run_logits_finite(last, vocab))
		return 0;
	return kvmem_error(ERANGE, "the logits after %ld tokens hold NaN or infinite values (the "
			   "model's arithmetic overflowed); refusing to sample from them", pos);
}

static int run_plain(const struct run_opts *o)
{
	kvmem_model *m = NULL;
	kvmem_backend *e = NULL;
	kvmem_view *v = NULL;
	int32_t *tok = NULL, *gen = NULL;
	float *buf = NULL, *last = NULL;
	FILE *lf = NULL;
	int n = 0, rc = 1;

	if (kvmem_model_load(o->model, &m))
		goto out;
	const kvmem_config *c = &m->cfg;

	if (o->prompt_text || o->chat) {
		if (run_text_prompt(o, c, &tok, &n))
			goto out;
	} else if (o->prompt) {
		int64_t got;

		if (kvmem_token_file_read(o->prompt, c->vocab, &tok, &got) < 0)
			goto out;
		n = (int)got;
	} else {
		uint64_t rng = kvmem_rng_seed(o->seed);

		n = (int)o->random_n;
		tok = malloc(sizeof(int32_t) * n);
		if (!tok) {
			kvmem_error(ENOMEM, "out of memory for %d prompt tokens", n);
			goto out;
		}
		for (int i = 0; i < n; i++)
			tok[i] = (int32_t)(kvmem_rng_uniform(&rng) * c->vocab);
	}
	if ((long)n + o->decode > (1L << 31) - 1) {
		kvmem_error(EINVAL, "prompt plus decode passes 2^31 tokens");
		goto out;
	}
	int chunk = o->chunk < n ? o->chunk : n, total = n + (int)o->decode;

	if (total > c->max_position && c->max_position > 0)
		fprintf(stderr, "kvmem run: note: %d tokens pass the model's window of %d\n",
			total, c->max_position);
	if (kvmem_backend_open(o->backend, m,
			       &(kvmem_backend_opts){ .max_chunk = chunk, .mem_cap = o->gpu_mem,
						      .kv_dtype = o->kv_dtype, .tp = o->tp }, &e) < 0 ||
	    kvmem_backend_view_new(e, total, &v) < 0)
		goto out;
	buf = malloc(sizeof(float) * c->vocab * (o->logits ? chunk : 1));
	last = malloc(sizeof(float) * c->vocab);
	gen = malloc(sizeof(int32_t) * (o->decode ? o->decode : 1));
	if (!buf || !last || !gen) {
		kvmem_error(ENOMEM, "out of memory for logits (vocab %d, chunk %d)", c->vocab, chunk);
		goto out;
	}
	if (o->logits && !(lf = fopen(o->logits, "wb"))) {
		kvmem_error(errno, "%s: cannot create: %s", o->logits, strerror(errno));
		goto out;
	}
	printf("model: %s (%d layers, hidden %d, %d/%d heads, head_dim %d, vocab %d)\n",
	       o->model, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim,
	       c->vocab);
	if (o->sampler.temperature > 0)
		printf("sampling: temperature %g, top-k %d, top-p %g, seed %" PRIu64 "\n",
		       o->sampler.temperature, o->sampler.top_k, o->sampler.top_p,
		       o->sampler.seed);
	else
		printf("sampling: greedy\n");

	double t0 = cli_now_s();

	if (prefill(e, v, tok, n, chunk, buf, last, lf, o->logits))
		goto out;
	double t1 = cli_now_s();
	uint64_t rng = kvmem_rng_seed(o->sampler.seed);

	for (long i = 0; i < o->decode; i++) {
		int id;

		if (logits_check(last, c->vocab, n + i))
			goto out;
		id = kvmem_sample(last, c->vocab, &o->sampler, &rng);
		if (id < 0) {
			kvmem_error(ENOMEM, "sampling failed (out of memory)");
			goto out;
		}
		gen[i] = id;
		if (i + 1 < o->decode && kvmem_backend_append(e, v, &gen[i], 1, last, 0))
			goto out;
	}
	double t2 = cli_now_s();

	if (lf) {
		if (fclose(lf)) {
			lf = NULL;
			kvmem_error(errno, "%s: write failed: %s", o->logits, strerror(errno));
			goto out;
		}
		lf = NULL;
		printf("logits: %d x %d float32 written to %s\n", n, c->vocab, o->logits);
	}
	printf("generated:");
	for (long i = 0; i < o->decode; i++)
		printf(" %d", gen[i]);
	printf("\n");
	if ((o->prompt_text || o->chat) && run_text_print(o, c, gen, o->decode))
		goto out;
	print_speed("prefill", n, t1 - t0);
	/* The last generated token needs no forward pass of its own. */
	print_speed("decode", o->decode > 1 ? (int)o->decode - 1 : 0, t2 - t1);
	rc = 0;
out:
	if (rc)
		fprintf(stderr, "kvmem run: %s\n", kvmem_last_error());
	if (lf)
		fclose(lf);
	free(tok);
	free(gen);
	free(buf);
	free(last);
	if (v)
		kvmem_backend_view_free(e, v);
	kvmem_backend_close(e);
	run_text_close();
	if (m)
		kvmem_model_free(m);
	return rc;
}

int cmd_run(int argc, char **argv)
{
	struct run_opts o;
	int r = parse_args(argc, argv, &o);

	if (r)
		return r > 0 ? 0 : EXIT_USAGE;
	return o.script ? session_main(&o) : run_plain(&o);
}
