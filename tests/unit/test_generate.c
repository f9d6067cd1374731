// SPDX-License-Identifier: MIT
/*
 * The generator and presets: published geometries and parameter counts,
 * byte-identical output for a seed (whatever the thread count), models that
 * load back with the preset's geometry, weight statistics as documented,
 * activations of a sane size through every layer, the fingerprint as
 * Documentation/formats.md defines it, and the generate/info commands.
 */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "model/safetensors.h"
#include "util/json.h"
#include "helpers/test_model.h"
#include "helpers/test_tmpdir.h"

static uint64_t seed0;
static char root[64];

static int setup(void **state)
{
	char home[128];

	if (test_tmpdir_make(root, sizeof(root), "gen"))
		return -1;
	/* The fingerprint cache under the data directory: ours, not the user's. */
	snprintf(home, sizeof(home), "%s/home", root);
	return setenv("KVMEM_HOME", home, 1);
}

static int teardown(void **state)
{
	return test_tmpdir_remove(root);
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *b;
	long n;

	if (!f)
		fail_msg("cannot open %s", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	b = malloc((size_t)n + 1);
	assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
	b[n] = 0;
	fclose(f);
	*len = (size_t)n;
	return b;
}

static int same_file(const char *a, const char *b)
{
	size_t la, lb;
	char *x = slurp(a, &la), *y = slurp(b, &lb);
	int same = la == lb && !memcmp(x, y, la);

	free(x);
	free(y);
	return same;
}

/* Parameters counted here from the shapes, independently of the library. */
static uint64_t count_params(const kvmem_config *c)
{
	uint64_t h = (uint64_t)c->hidden, q = (uint64_t)c->n_heads * c->head_dim;
	uint64_t kv = (uint64_t)c->n_kv_heads * c->head_dim, i = (uint64_t)c->intermediate;
	uint64_t layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * (uint64_t)c->head_dim;

	return (uint64_t)c->vocab * h * (c->tie_embeddings ? 1 : 2) + h + layer * c->n_layers;
}

static void test_presets(void **state)
{
	/* published Qwen3 geometries, and the non-embedding sizes their model
	 * cards give (0.44B, 1.4B, 3.6B, 6.95B, 13.2B, 31.2B) */
	static const struct {
		const char *name;
		int l, h, nh, nkv, hd, inter, tied;
		double non_embedding;
	} want[] = {
		{ "0.6b", 28, 1024, 16, 8, 128, 3072, 1, 0.44e9 },
		{ "1.7b", 28, 2048, 16, 8, 128, 6144, 1, 1.4e9 },
		{ "4b", 36, 2560, 32, 8, 128, 9728, 1, 3.6e9 },
		{ "8b", 36, 4096, 32, 8, 128, 12288, 0, 6.95e9 },
		{ "14b", 40, 5120, 40, 8, 128, 17408, 0, 13.2e9 },
		{ "32b", 64, 5120, 64, 8, 128, 25600, 0, 31.2e9 },
	};
	const kvmem_preset *p;

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		uint64_t params, emb;

		p = kvmem_preset_find(want[i].name);
		assert_non_null(p);
		assert_int_equal(p->cfg.n_layers, want[i].l);
		assert_int_equal(p->cfg.hidden, want[i].h);
		assert_int_equal(p->cfg.n_heads, want[i].nh);
		assert_int_equal(p->cfg.n_kv_heads, want[i].nkv);
		assert_int_equal(p->cfg.head_dim, want[i].hd);
		assert_int_equal(p->cfg.intermediate, want[i].inter);
		assert_int_equal(p->cfg.tie_embeddings, want[i].tied);
		assert_int_equal(p->cfg.vocab, 151936);
		assert_int_equal(p->cfg.max_position, 40960);
		assert_true(p->cfg.rope_theta == 1e6);
		assert_true(p->cfg.rms_eps == 1e-6f);
		assert_int_equal(p->cfg.bos_id, 151643);
		assert_int_equal(p->cfg.eos_id, 151645);
		assert_int_equal(kvmem_config_validate(&p->cfg, p->name), 0);
		params = kvmem_config_params(&p->cfg);
		assert_int_equal(params, count_params(&p->cfg));
		emb = (uint64_t)p->cfg.vocab * p->cfg.hidden * (p->cfg.tie_embeddings ? 1 : 2);
		assert_true(fabs((double)(params - emb) / want[i].non_embedding - 1) < 0.02);
		/* a bf16 file is 2 bytes a parameter plus a header */
		assert_true(kvmem_model_generate_bytes(&p->cfg, NULL) > 2 * params + 8);
		assert_true(kvmem_model_generate_bytes(&p->cfg, NULL) < 2 * params + 200000);
	}
	p = kvmem_preset_find("8b");
	assert_int_equal(kvmem_config_params(&p->cfg), 8190735360ull);	/* the published 8.2B */
	assert_int_equal(kvmem_config_kv_bytes_per_token(&p->cfg, 2), 147456);
	assert_int_equal(kvmem_config_kv_bytes_per_token(&p->cfg, 4), 294912);
	p = kvmem_preset_find("tiny");
	assert_int_equal(kvmem_config_params(&p->cfg), 2624256);
	assert_true(kvmem_model_generate_bytes(&p->cfg, NULL) < 8u << 20);	/* a few MB */
	assert_null(kvmem_preset_find("7b"));
	assert_null(kvmem_preset_find(NULL));
}

/* The fingerprint recomputed from its definition in model.h / formats.md. */
static void test_fingerprint_definition(void **state)
{
	const kvmem_config *c = &kvmem_preset_find("tiny")->cfg;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	const char *names[] = { "input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
				"self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
				"self_attn.k_norm", "post_attention_layernorm", "mlp.gate_proj",
				"mlp.up_proj", "mlp.down_proj" };
	const char *shapes[] = { "[256]", "[256, 256]", "[128, 256]", "[128, 256]", "[256, 256]",
				 "[64]", "[64]", "[256]", "[512, 256]", "[512, 256]", "[256, 512]" };
	kvmem_config other = *c;

	fprintf(f, "kvmem-model-v1\narch Qwen3ForCausalLM\nlayers 4\nhidden 256\nheads 4\n"
		   "kv_heads 2\nhead_dim 64\nintermediate 512\nvocab 1024\nrope_theta 1000000\n"
		   "rms_eps 9.99999997e-07\ntied 1\n");
	fprintf(f, "model.embed_tokens.weight BF16 [1024, 256]\n");
	for (int l = 0; l < 4; l++)
		for (int k = 0; k < 11; k++)
			fprintf(f, "model.layers.%d.%s.weight BF16 %s\n", l, names[k], shapes[k]);
	fprintf(f, "model.norm.weight BF16 [256]\n");
	fclose(f);
	assert_int_equal(kvmem_config_fingerprint(c), XXH64(text, len, 0));
	free(text);

	/* what changes K/V changes it; what does not, does not */
	other.intermediate = 768;
	assert_true(kvmem_config_fingerprint(&other) != kvmem_config_fingerprint(c));
	other = *c;
	other.rope_theta = 1e4;
	assert_true(kvmem_config_fingerprint(&other) != kvmem_config_fingerprint(c));
	other = *c;
	other.tie_embeddings = 0;
	assert_true(kvmem_config_fingerprint(&other) != kvmem_config_fingerprint(c));
	other = *c;
	other.max_position = 1 << 20;
	other.eos_id = 5;
	assert_int_equal(kvmem_config_fingerprint(&other), kvmem_config_fingerprint(c));
}

/* The model fingerprint recomputed from its definition in model.h and
 * formats.md: the geometry lines, then per tensor "name DTYPE [shape]
 * <XXH3-64 of every stored byte>", XXH64 of the whole. */
static void test_model_fingerprint_definition(void **state)
{
	const kvmem_config *c = &kvmem_preset_find("tiny")->cfg;
	char dir[128], path[160];
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	kvmem_st_file *st;
	kvmem_model *m;

	snprintf(dir, sizeof(dir), "%s/fpdef", root);
	assert_int_equal(kvmem_model_generate(c, dir, seed0 ^ 0xf00d, NULL, NULL), 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(kvmem_st_open(path, &st), 0);
	fprintf(f, "kvmem-model-v1\narch Qwen3ForCausalLM\nlayers 4\nhidden 256\nheads 4\n"
		   "kv_heads 2\nhead_dim 64\nintermediate 512\nvocab 1024\nrope_theta 1000000\n"
		   "rms_eps 9.99999997e-07\ntied 1\n");
	for (size_t i = 0; i < kvmem_st_count(st); i++) {	/* canonical order = file order */
		const kvmem_st_tensor *t = kvmem_st_at(st, i);
		char shape[64];

		fprintf(f, "%s BF16 %s %016llx\n", t->name,
			kvmem_st_shape_str(shape, sizeof(shape), t->ndim, t->shape),
			(unsigned long long)XXH3_64bits(t->data, t->nbytes));
	}
	fclose(f);
	assert_int_equal(kvmem_model_open(dir, KVMEM_MODEL_NO_WEIGHTS, &m), 0);
	assert_int_equal(m->fingerprint, XXH64(text, len, 0));
	assert_true(m->hashed_bytes > 0);
	kvmem_model_free(m);
	kvmem_st_close(st);
	free(text);
}

/* Same seed, same bytes, whatever the thread count; another seed, other
 * weights but the same config (and geometry fingerprint). */
static void test_deterministic(void **state)
{
	const kvmem_preset *p = kvmem_preset_find("tiny");
	char a[128], b[128], c[128], fa[160], fb[160];
	kvmem_model *ma, *mb, *mc;
	int threads = omp_get_max_threads();

	snprintf(a, sizeof(a), "%s/det-a", root);
	snprintf(b, sizeof(b), "%s/det-b", root);
	snprintf(c, sizeof(c), "%s/det-c", root);
	omp_set_num_threads(1);
	assert_int_equal(kvmem_model_generate(&p->cfg, a, seed0, NULL, NULL), 0);
	omp_set_num_threads(threads > 1 ? threads : 3);
	assert_int_equal(kvmem_model_generate(&p->cfg, b, seed0, NULL, NULL), 0);
	omp_set_num_threads(threads);
	assert_int_equal(kvmem_model_generate(&p->cfg, c, seed0 + 1, NULL, NULL), 0);
	for (int k = 0; k < 3; k++) {
		const char *name[] = { "model.safetensors", "config.json", "generation_config.json" };

		snprintf(fa, sizeof(fa), "%s/%s", a, name[k]);
		snprintf(fb, sizeof(fb), "%s/%s", b, name[k]);
		assert_true(same_file(fa, fb));
		snprintf(fb, sizeof(fb), "%s/%s", c, name[k]);
		assert_int_equal(same_file(fa, fb), k != 0);
	}
	assert_int_equal(kvmem_model_load(a, &ma), 0);
	assert_int_equal(kvmem_model_load(b, &mb), 0);
	assert_int_equal(kvmem_model_load(c, &mc), 0);
	assert_int_equal(ma->fingerprint, mb->fingerprint);
	assert_true(ma->fingerprint != mc->fingerprint);
	assert_int_equal(kvmem_config_fingerprint(&ma->cfg), kvmem_config_fingerprint(&mc->cfg));
	assert_int_equal(kvmem_config_fingerprint(&ma->cfg), kvmem_config_fingerprint(&p->cfg));
	kvmem_model_free(ma);
	kvmem_model_free(mb);
	kvmem_model_free(mc);
}

static double stdev(const float *w, size_t n, double *mean)
{
	double s = 0, s2 = 0;

	for (size_t i = 0; i < n; i++) {
		s += w[i];
		s2 += (double)w[i] * w[i];
	}
	*mean = s / n;
	return sqrt(s2 / n - *mean * *mean);
}

/*
 * The sample mean of n draws has standard error want / sqrt(n). A 4-sigma
 * bound failed about once in 500 runs over the ~29 tensors checked (seed
 * 47249287619027: wo's mean at 4.3 sigma); 6 sigma fails once in ~10^7
 * runs by chance and still catches any bias above 3.3% of the std in the
 * smallest tensor. The std is within 3% (its own error is under 0.4%).
 */
static void expect_std(const float *w, size_t n, double want, const char *what)
{
	double mean, sd = stdev(w, n, &mean);

	if (fabs(sd / want - 1) > 0.03 || fabs(mean) > 6 * want / sqrt((double)n))
		fail_msg("%s: std %g (want %g), mean %g", what, sd, want, mean);
}

/* The tiny preset loads back with its geometry and the documented scales. */
static void test_loads_back(void **state)
{
	const kvmem_preset *p = kvmem_preset_find("tiny");
	const kvmem_config *c = &p->cfg;
	char dir[128];
	kvmem_model *m;
	size_t h = (size_t)c->hidden, q = (size_t)c->n_heads * c->head_dim;
	size_t kv = (size_t)c->n_kv_heads * c->head_dim, in = (size_t)c->intermediate;

	snprintf(dir, sizeof(dir), "%s/back", root);
	assert_int_equal(kvmem_model_generate(c, dir, seed0 ^ 77, NULL, NULL), 0);
	assert_int_equal(kvmem_model_load(dir, &m), 0);
	assert_string_equal(m->cfg.arch, c->arch);
	assert_int_equal(m->cfg.n_layers, c->n_layers);
	assert_int_equal(m->cfg.hidden, c->hidden);
	assert_int_equal(m->cfg.n_heads, c->n_heads);
	assert_int_equal(m->cfg.n_kv_heads, c->n_kv_heads);
	assert_int_equal(m->cfg.head_dim, c->head_dim);
	assert_int_equal(m->cfg.intermediate, c->intermediate);
	assert_int_equal(m->cfg.vocab, c->vocab);
	assert_int_equal(m->cfg.max_position, c->max_position);
	assert_true(m->cfg.rope_theta == c->rope_theta);
	assert_true(m->cfg.rms_eps == c->rms_eps);
	assert_int_equal(m->cfg.tie_embeddings, c->tie_embeddings);
	assert_int_equal(m->cfg.bos_id, c->bos_id);
	assert_int_equal(m->cfg.eos_id, c->eos_id);
	assert_string_equal(m->cfg.dtype, "bfloat16");
	assert_string_equal(m->weight_dtype, "BF16");
	assert_ptr_equal(m->lm_head, m->embed);

	expect_std(m->embed, (size_t)c->vocab * h, 1 / sqrt((double)h), "embed");
	for (int l = 0; l < c->n_layers; l++) {
		const kvmem_layer *L = &m->layers[l];
		double res = 1.0 / sqrt(2.0 * c->n_layers);

		expect_std(L->wq, q * h, 1 / sqrt((double)h), "wq");
		expect_std(L->wk, kv * h, 1 / sqrt((double)h), "wk");
		expect_std(L->wv, kv * h, 1 / sqrt((double)h), "wv");
		expect_std(L->wo, h * q, res / sqrt((double)q), "wo");
		expect_std(L->w_gate, in * h, 1 / sqrt((double)h), "gate");
		expect_std(L->w_up, in * h, 1 / sqrt((double)h), "up");
		expect_std(L->w_down, h * in, res / sqrt((double)in), "down");
		for (size_t i = 0; i < h; i++)
			assert_true(L->attn_norm[i] == 1.0f && L->mlp_norm[i] == 1.0f);
		for (int i = 0; i < c->head_dim; i++)
			assert_true(L->q_norm[i] == 1.0f && L->k_norm[i] == 1.0f);
	}
	for (size_t i = 0; i < h; i++)
		assert_true(m->final_norm[i] == 1.0f);
	/* different layers draw different numbers */
	assert_true(memcmp(m->layers[0].wq, m->layers[1].wq, q * h * 4));

	/* the engine runs it: finite logits of a moderate size that vary */
	{
		enum { N = 48 };
		kvmem_engine *e = kvmem_engine_create(m, N);
		kvmem_kvcache kvc;
		int32_t tok[N];
		float *logits = malloc((size_t)N * c->vocab * sizeof(float));
		uint64_t s = seed0;
		int argmax_changes = 0, prev = -1;

		assert_non_null(e);
		assert_int_equal(kvmem_kvcache_init(&kvc, c, N), 0);
		for (int i = 0; i < N; i++)
			tok[i] = (int32_t)(test_rng_next(&s) % (uint64_t)c->vocab);
		assert_int_equal(kvmem_forward(e, &kvc, tok, N, logits, 1, NULL), 0);
		for (int i = 0; i < N; i++) {
			double mean, sd = stdev(logits + (size_t)i * c->vocab, (size_t)c->vocab, &mean);
			int best = 0;

			for (int v = 0; v < c->vocab; v++) {
				assert_true(isfinite(logits[(size_t)i * c->vocab + v]));
				if (logits[(size_t)i * c->vocab + v] > logits[(size_t)i * c->vocab + best])
					best = v;
			}
			if (sd < 0.3 || sd > 3)
				fail_msg("position %d: logits std %g", i, sd);
			argmax_changes += best != prev;
			prev = best;
		}
		assert_true(argmax_changes > N / 4);
		free(logits);
		kvmem_kvcache_free(&kvc);
		kvmem_engine_free(e);
	}
	kvmem_model_free(m);
}

static double rms(const float *x, int n)
{
	double s = 0;

	for (int i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	return sqrt(s / n);
}

/*
 * The residual stream of a deep generated model stays near unit size: one
 * token through 32 layers (attention over a single key is its value, so
 * the pass needs only the kernels), its RMS checked after every layer.
 */
static void test_activations_sane(void **state)
{
	kvmem_config c = { .arch = "Qwen3ForCausalLM", .n_layers = 32, .hidden = 128, .n_heads = 4,
			 .n_kv_heads = 2, .head_dim = 32, .intermediate = 384, .vocab = 256,
			 .max_position = 1024, .rope_theta = 1e6, .rms_eps = 1e-6f,
			 .tie_embeddings = 1, .bos_id = -1, .eos_id = -1, .dtype = "bfloat16" };
	char dir[128];
	kvmem_model *m;
	int H = c.hidden, Q = c.n_heads * c.head_dim, KV = c.n_kv_heads * c.head_dim;
	int group = c.n_heads / c.n_kv_heads;
	float *x = malloc(H * 4), *h = malloc(H * 4), *v = malloc(KV * 4), *a = malloc(Q * 4);
	float *o = malloc(H * 4), *g = malloc(c.intermediate * 4), *u = malloc(c.intermediate * 4);
	uint64_t s = seed0 ^ 5;

	snprintf(dir, sizeof(dir), "%s/deep", root);
	assert_int_equal(kvmem_model_generate(&c, dir, seed0, NULL, NULL), 0);
	assert_int_equal(kvmem_model_load(dir, &m), 0);
	for (int trial = 0; trial < 4; trial++) {
		int32_t tok = (int32_t)(test_rng_next(&s) % (uint64_t)c.vocab);

		kvmem_embedding(x, m->embed, &tok, 1, H);
		for (int l = 0; l < c.n_layers; l++) {
			const kvmem_layer *L = &m->layers[l];
			double r;

			kvmem_rmsnorm(h, x, L->attn_norm, 1, H, c.rms_eps);
			kvmem_matmul(v, h, L->wv, 1, H, KV);
			for (int hh = 0; hh < c.n_heads; hh++)	/* each query head reads its KV head */
				memcpy(a + hh * c.head_dim, v + (hh / group) * c.head_dim,
				       (size_t)c.head_dim * 4);
			kvmem_matmul(o, a, L->wo, 1, Q, H);
			kvmem_add(x, o, (size_t)H);
			kvmem_rmsnorm(h, x, L->mlp_norm, 1, H, c.rms_eps);
			kvmem_matmul(g, h, L->w_gate, 1, H, c.intermediate);
			kvmem_matmul(u, h, L->w_up, 1, H, c.intermediate);
			kvmem_swiglu(g, g, u, (size_t)c.intermediate);
			kvmem_matmul(o, g, L->w_down, 1, c.intermediate, H);
			kvmem_add(x, o, (size_t)H);
			r = rms(x, H);
			/* embeddings start near 1/sqrt(H); 2L branches of ~1/sqrt(2L) each add up to ~1 */
			if (!(r > 0.03 && r < 3))
				fail_msg("token %d, layer %d: residual RMS %g", tok, l, r);
		}
	}
	kvmem_model_free(m);
	free(x); free(h); free(v); free(a); free(o); free(g); free(u);
}

/* One prefill of n tokens and `steps` greedy decode steps, the last logits
 * of each call into out[(1 + steps)][vocab]; bf16: the engine's weights. */
static void run_engine(const kvmem_model *m, int bf16, const int32_t *tok, int n, int steps,
		       float *out)
{
	kvmem_engine *e = kvmem_engine_create(m, 64);
	kvmem_kvcache kv;
	kvmem_sampler greedy = { 0 };
	uint64_t st = 0;
	int V = m->cfg.vocab;

	assert_non_null(e);
	assert_int_equal(kvmem_engine_use_bf16_weights(e, bf16), bf16);
	assert_int_equal(kvmem_kvcache_init(&kv, &m->cfg, n + steps), 0);
	assert_int_equal(kvmem_forward(e, &kv, tok, n, out, 0, NULL), 0);
	for (int s = 0; s < steps; s++) {
		int32_t t = kvmem_sample(out + (size_t)s * V, V, &greedy, &st);

		assert_int_equal(kvmem_forward(e, &kv, &t, 1, out + (size_t)(s + 1) * V, 0, NULL), 0);
	}
	kvmem_kvcache_free(&kv);
	kvmem_engine_free(e);
}

/* A model stored as bf16 is multiplied by the engine's bf16 copies of its
 * weights (widened in registers; q|k|v and gate|up one product each, where
 * the fp32 weights take five): the logits are the fp32 weights' bit for
 * bit, tied and untied, in one file or in shards, at each instruction set
 * the CPU has. A model stored as f32 (weights no bf16 holds) gets none. */
static void test_bf16_weights(void **state)
{
	kvmem_config c = { .arch = "Qwen3ForCausalLM", .n_layers = 3, .hidden = 96, .n_heads = 4,
			 .n_kv_heads = 2, .head_dim = 24, .intermediate = 204, .vocab = 301,
			 .max_position = 1024, .rope_theta = 1e6, .rms_eps = 1e-6f,
			 .tie_embeddings = 1, .bos_id = -1, .eos_id = -1, .dtype = "bfloat16" };
	static const char *const isas[] = { "avx512", "avx2", "c" };
	const char *best = kvmem_matmul_isa();
	uint64_t r = seed0 ^ 0xb16;
	int n = 40, steps = 6;
	int32_t tok[40];
	float *a = malloc(sizeof(float) * (size_t)(1 + steps) * c.vocab);
	float *b = malloc(sizeof(float) * (size_t)(1 + steps) * c.vocab);

	assert_non_null(a);
	assert_non_null(b);
	for (int i = 0; i < n; i++)
		tok[i] = (int32_t)(test_rng_next(&r) % (uint64_t)c.vocab);
	for (int k = 0; k < 4; k++) {
		kvmem_gen_opts o = { .seed = seed0 + k, .dtype = k == 3 ? "f32" : "bf16",
				     .shard_bytes = k == 2 ? 100000 : 0 };
		char dir[160];
		kvmem_model *m;

		c.tie_embeddings = k != 1;
		snprintf(dir, sizeof(dir), "%s/bf16w-%d", root, k);
		assert_int_equal(kvmem_model_generate_opts(&c, dir, &o), 0);
		assert_int_equal(kvmem_model_load(dir, &m), 0);
		if (k == 3) {
			kvmem_engine *e = kvmem_engine_create(m, 64);

			assert_int_equal(kvmem_engine_use_bf16_weights(e, 1), 0);
			kvmem_engine_free(e);
			kvmem_model_free(m);
			continue;
		}
		for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
			if (kvmem_matmul_use(isas[i]))
				continue;
			run_engine(m, 1, tok, n, steps, a);
			run_engine(m, 0, tok, n, steps, b);
			if (memcmp(a, b, sizeof(float) * (size_t)(1 + steps) * c.vocab))
				fail_msg("model %d (%s), matmul %s: logits differ with bf16 weights",
					 k, k == 1 ? "untied" : k == 2 ? "sharded" : "tied", isas[i]);
		}
		assert_int_equal(kvmem_matmul_use(best), 0);
		kvmem_model_free(m);
	}
	free(a);
	free(b);
}

struct prog {
	uint64_t last, total;
	int calls;
	int backwards;
};

static void on_progress(uint64_t done, uint64_t total, void *arg)
{
	struct prog *p = arg;

	p->backwards |= done < p->last;
	p->last = done;
	p->total = total;
	p->calls++;
}

static void test_progress_and_errors(void **state)
{
	kvmem_config c = { .arch = "Qwen3ForCausalLM", .n_layers = 1, .hidden = 1024, .n_heads = 2,
			 .n_kv_heads = 1, .head_dim = 16, .intermediate = 16, .vocab = 9000,
			 .max_position = 1024, .rope_theta = 1e6, .rms_eps = 1e-6f,
			 .tie_embeddings = 1, .bos_id = -1, .eos_id = -1, .dtype = "bfloat16" };
	struct prog p = { 0 };
	char dir[128], file[160];
	kvmem_gen_opts o = { .seed = 3, .progress = on_progress, .arg = &p };
	struct stat st;
	FILE *f;

	snprintf(dir, sizeof(dir), "%s/prog", root);
	assert_int_equal(kvmem_model_generate_opts(&c, dir, &o), 0);
	assert_true(p.calls >= 3);	/* 9.2M values in 4M-value pieces, and more */
	assert_false(p.backwards);
	assert_int_equal(p.last, p.total);
	assert_int_equal(p.total, kvmem_config_params(&c) * 2);
	snprintf(file, sizeof(file), "%s/model.safetensors", dir);
	assert_int_equal(stat(file, &st), 0);
	assert_int_equal((uint64_t)st.st_size, kvmem_model_generate_bytes(&c, &o));

	/* refusals */
	c.n_kv_heads = 3;
	assert_true(kvmem_model_generate(&c, dir, 1, NULL, NULL) < 0);
	assert_non_null(strstr(kvmem_last_error(), "num_key_value_heads 3 does not divide"));
	c.n_kv_heads = 1;
	o.dtype = "int8";
	assert_true(kvmem_model_generate_opts(&c, dir, &o) < 0);
	assert_non_null(strstr(kvmem_last_error(), "dtype 'int8' is not one of bf16, f16, f32"));
	snprintf(file, sizeof(file), "%s/afile", root);
	f = fopen(file, "w");
	fclose(f);
	assert_true(kvmem_model_generate(&c, file, 1, NULL, NULL) < 0);
	assert_non_null(strstr(kvmem_last_error(), "afile: not a directory"));
}

/* ---- the commands -------------------------------------------------------- */
static const char *kvmem_bin(void)
{
	static char path[512];
	const char *b = getenv("KVMEM_BUILD");

	snprintf(path, sizeof(path), "%s/kvmem", b && *b ? b : "build");
	return path;
}

/* Run a command line; its stdout+stderr into out; returns the exit code. */
static int run(char *out, size_t len, const char *fmt, ...)
{
	char cmd[1024];
	va_list ap;
	FILE *p;
	size_t n = 0;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	strncat(cmd, " 2>&1", sizeof(cmd) - strlen(cmd) - 1);
	p = popen(cmd, "r");
	assert_non_null(p);
	while (n + 1 < len && fgets(out + n, (int)(len - n), p))
		n += strlen(out + n);
	out[n] = 0;
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void want_in(const char *out, const char *s)
{
	if (!strstr(out, s))
		fail_msg("<%s> not in output:\n%s", s, out);
}

static void test_cli(void **state)
{
	const char *bin = kvmem_bin();
	char out[8192], dir[128];
	json_t *j;

	if (access(bin, X_OK)) {
		print_message("no %s: skipping the command tests\n", bin);
		skip();
	}
	assert_int_equal(run(out, sizeof(out), "%s generate --preset 8b --dry-run", bin), 0);
	want_in(out, "layers        36\n");
	want_in(out, "hidden        4096\n");
	want_in(out, "heads         32 query, 8 KV (4 queries per KV head), head_dim 128\n");
	want_in(out, "intermediate  12288\n");
	want_in(out, "vocab         151936 (bos 151643, eos 151645)\n");
	want_in(out, "window        40960 tokens");
	want_in(out, "rope_theta    1000000\n");
	want_in(out, "embeddings    untied\n");
	want_in(out, "parameters    8190735360 (8.19e9, embeddings included)\n");
	want_in(out, "KV per token  147456 bytes bf16, 294912 bytes fp32\n");
	want_in(out, "nothing written");

	assert_int_equal(run(out, sizeof(out), "%s generate --help", bin), 0);
	for (const kvmem_preset *p = kvmem_presets; p->name; p++)
		want_in(out, p->name);
	assert_int_equal(run(out, sizeof(out), "%s generate --preset 7b --dry-run", bin), 2);
	want_in(out, "unknown preset '7b'");
	assert_int_equal(run(out, sizeof(out), "%s generate --preset tiny --seed x", bin), 2);

	snprintf(dir, sizeof(dir), "%s/cli", root);
	assert_int_equal(run(out, sizeof(out), "%s generate --preset tiny --out %s --seed 9", bin,
			     dir), 0);
	want_in(out, "wrote");
	assert_int_equal(run(out, sizeof(out), "%s generate --preset tiny --out %s", bin, dir), 1);
	want_in(out, "is not empty; use --force");
	assert_int_equal(run(out, sizeof(out), "%s generate --preset tiny --out %s --force --seed 9",
			     bin, dir), 0);

	assert_int_equal(run(out, sizeof(out), "%s info %s", bin, dir), 0);
	want_in(out, "parameters    2624256 (2.62e6");
	want_in(out, "KV per token  2048 bytes bf16, 4096 bytes fp32");
	want_in(out, "window        4096 tokens");
	want_in(out, "fingerprint   ");
	assert_int_equal(run(out, sizeof(out), "%s info %s --json", bin, dir), 0);
	assert_int_equal(kvmem_json_load(out, strlen(out), "info --json", &j), 0);
	assert_int_equal(json_integer_value(json_object_get(j, "layers")), 4);
	assert_int_equal(json_integer_value(json_object_get(j, "params")), 2624256);
	assert_int_equal(json_integer_value(json_object_get(j, "kv_bytes_per_token_bf16")), 2048);
	assert_string_equal(json_string_value(json_object_get(j, "weight_dtype")), "BF16");
	assert_int_equal(json_string_length(json_object_get(j, "fingerprint")), 16);
	json_decref(j);
	/* A path that is not UTF-8 cannot be a JSON string: an error, not a
	 * broken document. */
	{
		char odd[160];

		snprintf(odd, sizeof(odd), "%s/cli\xff", root);
		assert_int_equal(symlink(dir, odd), 0);
		assert_int_equal(run(out, sizeof(out), "%s info '%s' --json", bin, odd), 1);
		want_in(out, "the path is not UTF-8");
		unlink(odd);
	}

	assert_int_equal(run(out, sizeof(out), "%s info %s/nowhere", bin, root), 1);
	want_in(out, "kvmem info: ");
	want_in(out, "nowhere: No such file or directory");
	assert_int_equal(run(out, sizeof(out), "%s info", bin), 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_presets),
		cmocka_unit_test(test_bf16_weights),
		cmocka_unit_test(test_fingerprint_definition),
		cmocka_unit_test(test_model_fingerprint_definition),
		cmocka_unit_test(test_deterministic),
		cmocka_unit_test(test_loads_back),
		cmocka_unit_test(test_activations_sane),
		cmocka_unit_test(test_progress_and_errors),
		cmocka_unit_test(test_cli),
	};

	seed0 = test_rng_fresh_seed("test_generate");
	return cmocka_run_group_tests(tests, setup, teardown);
}
