// SPDX-License-Identifier: MIT
/*
 * kvmem run: prefill a token sequence and decode, on the CPU reference
 * engine with a plain growing KV cache. With any agent-session option it
 * hands over to session_main (the workspace mode).
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
#include "cli_util.h"
#include "cmd.h"

static const char *const session_opts[] = {
	"--script", "--budget", "--block", "--policy", "--check-exact", "--workspace", "--json",
	NULL
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem run --model DIR (--tokens FILE | --random N) [options]\n"
		"\n"
		"Prefill a token sequence through the CPU reference engine, then decode.\n"
		"\n"
		"  --model DIR        Hugging Face model directory (config.json + safetensors)\n"
		"  --tokens FILE      prompt token ids, separated by whitespace\n"
		"  --random N         a prompt of N random token ids instead\n"
		"  --seed S           seed of the random prompt (default 0)\n"
		"  --decode N         tokens to generate after the prompt (default 16)\n"
		"  --chunk N          prefill chunk size in tokens (default 256)\n"
		"  --temperature T    0 (default) is greedy; > 0 samples\n"
		"  --top-k K          keep the K most likely tokens (0: all)\n"
		"  --top-p P          keep the smallest set holding P of the mass (1: all)\n"
		"  --sample-seed S    seed of the sampler (default 0)\n"
		"  --logits FILE      write the logits of every prompt position: float32,\n"
		"                     little-endian, [prompt tokens][vocab]\n"
		"  --help             this text\n"
		"\n"
		"Prints the generated token ids and prefill / decode speed (tok/s).\n"
		"Agent-session options (--script, --budget, --block, --policy, --check-exact,\n"
		"--workspace, --json) switch to the workspace mode: see its own help.\n");
}

static int is_session_opt(const char *a)
{
	for (int i = 0; session_opts[i]; i++) {
		size_t n = strlen(session_opts[i]);

		if (!strncmp(a, session_opts[i], n) && (a[n] == '\0' || a[n] == '='))
			return 1;
	}
	return 0;
}

struct run_opts {
	const char *model, *tokens, *logits;
	long random_n, decode, chunk;
	uint64_t seed;
	kvmem_sampler sampler;
};

/* Returns 0 to run, 1 when --help was printed, -1 on bad usage. */
static int parse_args(int argc, char **argv, struct run_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->decode = 16;
	o->chunk = 256;
	o->random_n = -1;
	o->sampler.top_p = 1.0f;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		int r = 0;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 1;
		}
		if (!v) {
			fprintf(stderr, "kvmem run: %s needs a value (or is unknown)\n", a);
			return -1;
		}
		if (!strcmp(a, "--model"))
			o->model = v;
		else if (!strcmp(a, "--tokens"))
			o->tokens = v;
		else if (!strcmp(a, "--logits"))
			o->logits = v;
		else if (!strcmp(a, "--random"))
			r = cli_parse_long("kvmem run", a, v, 1, 1L << 30, &o->random_n);
		else if (!strcmp(a, "--seed"))
			r = cli_parse_u64("kvmem run", a, v, &o->seed);
		else if (!strcmp(a, "--decode"))
			r = cli_parse_long("kvmem run", a, v, 0, 1L << 30, &o->decode);
		else if (!strcmp(a, "--chunk"))
			r = cli_parse_long("kvmem run", a, v, 1, 1L << 20, &o->chunk);
		else if (!strcmp(a, "--temperature"))
			r = cli_parse_float("kvmem run", a, v, &o->sampler.temperature);
		else if (!strcmp(a, "--top-k")) {
			long k;

			r = cli_parse_long("kvmem run", a, v, 0, 1L << 30, &k);
			o->sampler.top_k = (int)k;
		} else if (!strcmp(a, "--top-p"))
			r = cli_parse_float("kvmem run", a, v, &o->sampler.top_p);
		else if (!strcmp(a, "--sample-seed"))
			r = cli_parse_u64("kvmem run", a, v, &o->sampler.seed);
		else {
			fprintf(stderr, "kvmem run: unknown option '%s' (kvmem run --help)\n", a);
			return -1;
		}
		if (r)
			return -1;
		i++;
	}
	if (!o->model) {
		fprintf(stderr, "kvmem run: --model DIR is required (kvmem run --help)\n");
		return -1;
	}
	if (!o->tokens == (o->random_n < 0)) {
		fprintf(stderr, "kvmem run: give exactly one of --tokens FILE and --random N\n");
		return -1;
	}
	return 0;
}

/* Read whitespace-separated token ids from `path`, each in [0, vocab). */
static int read_tokens(const char *path, int vocab, int32_t **out, int *n_out)
{
	FILE *f = fopen(path, "r");
	int32_t *t = NULL;
	int n = 0, cap = 0;
	char word[64];

	if (!f)
		return kvmem_error(errno, "%s: cannot open: %s", path, strerror(errno));
	while (fscanf(f, "%63s", word) == 1) {
		char *end;
		long id;

		errno = 0;
		id = strtol(word, &end, 10);
		if (errno || end == word || *end) {
			kvmem_error(EINVAL, "%s: the token at index %d ('%s') is not an integer id", path, n,
				  word);
			goto fail;
		}
		if (id < 0 || id >= vocab) {
			kvmem_error(EINVAL, "%s: the token at index %d is %ld, outside the vocabulary 0..%d",
				  path, n, id, vocab - 1);
			goto fail;
		}
		if (n == cap) {
			int32_t *p;

			cap = cap ? 2 * cap : 1024;
			p = realloc(t, sizeof(int32_t) * cap);
			if (!p) {
				kvmem_error(ENOMEM, "%s: out of memory after %d tokens", path, n);
				goto fail;
			}
			t = p;
		}
		t[n++] = (int32_t)id;
	}
	if (ferror(f)) {
		kvmem_error(EINVAL, "%s: read error", path);
		goto fail;
	}
	if (n == 0) {
		kvmem_error(EINVAL, "%s: holds no token ids", path);
		goto fail;
	}
	fclose(f);
	*out = t;
	*n_out = n;
	return 0;
fail:
	fclose(f);
	free(t);
	return -1;
}

static void print_speed(const char *what, int n, double secs)
{
	printf("%s: %d tokens in %.3f s, %.1f tok/s\n", what, n, secs,
	       secs > 0 ? n / secs : 0.0);
}

/* Prefill the prompt in chunks; leaves the last position's logits in `last`. */
static int prefill(kvmem_engine *e, kvmem_kvcache *kv, const int32_t *tok, int n, int chunk,
		   float *buf, float *last, FILE *logits_f, const char *logits_path)
{
	int vocab = kvmem_engine_model(e)->cfg.vocab;

	for (int at = 0; at < n; at += chunk) {
		int k = n - at < chunk ? n - at : chunk;

		if (kvmem_forward(e, kv, tok + at, k, buf, logits_f != NULL, NULL))
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

static int run_plain(const struct run_opts *o)
{
	kvmem_model *m = NULL;
	kvmem_engine *e = NULL;
	kvmem_kvcache kv = { 0 };
	int32_t *tok = NULL, *gen = NULL;
	float *buf = NULL, *last = NULL;
	FILE *lf = NULL;
	int n = 0, rc = 1;

	if (kvmem_model_load(o->model, &m))
		goto out;
	const kvmem_config *c = &m->cfg;

	if (o->tokens) {
		if (read_tokens(o->tokens, c->vocab, &tok, &n))
			goto out;
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
	int chunk = o->chunk < n ? (int)o->chunk : n, total = n + (int)o->decode;

	if (total > c->max_position && c->max_position > 0)
		fprintf(stderr, "kvmem run: note: %d tokens pass the model's window of %d\n",
			total, c->max_position);
	e = kvmem_engine_create(m, chunk);
	if (!e || kvmem_kvcache_init(&kv, c, total))
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

	if (prefill(e, &kv, tok, n, chunk, buf, last, lf, o->logits))
		goto out;
	double t1 = cli_now_s();
	uint64_t rng = kvmem_rng_seed(o->sampler.seed);

	for (long i = 0; i < o->decode; i++) {
		int id = kvmem_sample(last, c->vocab, &o->sampler, &rng);

		if (id < 0) {
			kvmem_error(ENOMEM, "sampling failed (out of memory)");
			goto out;
		}
		gen[i] = id;
		if (i + 1 < o->decode && kvmem_forward(e, &kv, &gen[i], 1, last, 0, NULL))
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
	kvmem_kvcache_free(&kv);
	kvmem_engine_free(e);
	if (m)
		kvmem_model_free(m);
	return rc;
}

int cmd_run(int argc, char **argv)
{
	struct run_opts o;
	int r;

	for (int i = 1; i < argc; i++)
		if (is_session_opt(argv[i]))
			return session_main(argc, argv);
	r = parse_args(argc, argv, &o);
	if (r)
		return r > 0 ? 0 : EXIT_USAGE;
	return run_plain(&o);
}
