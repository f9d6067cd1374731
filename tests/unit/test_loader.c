// SPDX-License-Identifier: MIT
/*
 * The model loader on good and bad directories. Every bad case must fail
 * with a message naming the file and the problem (checked by substring),
 * without a crash, a leak or a read outside the file (ASan/UBSan builds run
 * this too). Good cases read bf16/fp16/fp32 values back exactly.
 */
#include <fcntl.h>
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
#include <cmocka.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "model/safetensors.h"
#include "model/tensors.h"
#include "helpers/test_model.h"
#include "helpers/test_tmpdir.h"

static uint64_t seed0;
static char root[64];
static int dir_counter;

static int setup(void **state)
{
	char home[128];

	if (test_tmpdir_make(root, sizeof(root), "loader"))
		return -1;
	/* The fingerprint cache goes under the data directory: ours, not the
	 * user's. */
	snprintf(home, sizeof(home), "%s/home", root);
	return setenv("KVMEM_HOME", home, 1);
}

static int teardown(void **state)
{
	return test_tmpdir_remove(root);
}

/* A small GQA config, so a model is a few hundred kB. */
static kvmem_config small_config(int tied)
{
	kvmem_config c = { .arch = "Qwen3ForCausalLM", .n_layers = 2, .hidden = 32, .n_heads = 4,
			 .n_kv_heads = 2, .head_dim = 16, .intermediate = 48, .vocab = 64,
			 .max_position = 512, .rope_theta = 1e6, .rms_eps = 1e-6f,
			 .tie_embeddings = tied, .bos_id = 1, .eos_id = 2, .dtype = "bfloat16" };
	return c;
}

static char *new_dir(char *buf, size_t len)
{
	snprintf(buf, len, "%s/m%d", root, dir_counter++);
	return buf;
}

static void make_model(char *dir, size_t len, int tied, const char *dtype, uint64_t shard_bytes)
{
	kvmem_config c = small_config(tied);
	kvmem_gen_opts o = { .seed = seed0 + (uint64_t)dir_counter, .dtype = dtype,
			   .shard_bytes = shard_bytes };

	new_dir(dir, len);
	if (kvmem_model_generate_opts(&c, dir, &o))
		fail_msg("generate: %s", kvmem_last_error());
}

static void expect_load_error(const char *dir, const char *want1, const char *want2)
{
	kvmem_model *m = (kvmem_model *)&m;

	if (!kvmem_model_load(dir, &m))
		fail_msg("%s loaded, want an error with <%s>", dir, want1);
	assert_null(m);
	if (!strstr(kvmem_last_error(), want1) || (want2 && !strstr(kvmem_last_error(), want2)))
		fail_msg("want <%s>%s%s, got <%s>", want1, want2 ? " and " : "", want2 ? want2 : "",
			 kvmem_last_error());
	/* the checks-only path says the same */
	assert_true(kvmem_model_open(dir, KVMEM_MODEL_NO_WEIGHTS, &m) < 0);
	assert_non_null(strstr(kvmem_last_error(), want1));
}

/* ---- editing files ------------------------------------------------------ */
static void put_text(const char *dir, const char *name, const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static char *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *b;
	long n;

	assert_non_null(f);
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

static void write_all(const char *path, const void *b, size_t len)
{
	FILE *f = fopen(path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(b, 1, len, f), len);
	fclose(f);
}

/* Replace the first `from` in dir/name by `to` (text files). */
static void edit_text(const char *dir, const char *name, const char *from, const char *to)
{
	char path[256], *b, *at, *out;
	size_t len;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	b = read_all(path, &len);
	at = strstr(b, from);
	if (!at)
		fail_msg("'%s' not in %s", from, path);
	out = malloc(len + strlen(to) + 1);
	memcpy(out, b, (size_t)(at - b));
	strcpy(out + (at - b), to);
	strcat(out, at + strlen(from));
	write_all(path, out, strlen(out));
	free(b);
	free(out);
}

/* Replace the first `from` in the JSON header of dir/model.safetensors by
 * `to`, fixing the header length (the data section moves with it). */
static void edit_header(const char *dir, const char *from, const char *to)
{
	char path[256], *b, *at, *h, *out;
	size_t len, hlen = 0, nlen, tl = strlen(to), fl = strlen(from);

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	b = read_all(path, &len);
	for (int i = 0; i < 8; i++)
		hlen |= (size_t)(unsigned char)b[i] << (8 * i);
	h = strndup(b + 8, hlen);
	at = strstr(h, from);
	if (!at)
		fail_msg("'%s' not in the header of %s", from, path);
	nlen = hlen - fl + tl;
	out = malloc(8 + nlen + (len - 8 - hlen));
	for (int i = 0; i < 8; i++)
		out[i] = (char)(nlen >> (8 * i));
	memcpy(out + 8, h, (size_t)(at - h));
	memcpy(out + 8 + (at - h), to, tl);
	memcpy(out + 8 + (at - h) + tl, at + fl, hlen - (size_t)(at - h) - fl);
	memcpy(out + 8 + nlen, b + 8 + hlen, len - 8 - hlen);
	write_all(path, out, 8 + nlen + (len - 8 - hlen));
	free(b);
	free(h);
	free(out);
}

/* "data_offsets":[b,e] of a tensor, as the writer spells it. */
static void offsets_of(const char *dir, const char *tensor, char *buf, size_t len,
		       uint64_t *begin, uint64_t *end)
{
	char path[256];
	kvmem_st_file *f;
	const kvmem_st_tensor *t;
	uint64_t d0;

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(kvmem_st_open(path, &f), 0);
	t = kvmem_st_find(f, tensor);
	assert_non_null(t);
	/* offsets count from the data section, which the writer's first tensor starts */
	d0 = kvmem_st_at(f, 0)->offset;
	*begin = t->offset - d0;
	*end = *begin + t->nbytes;
	snprintf(buf, len, "\"data_offsets\":[%llu,%llu]", (unsigned long long)*begin,
		 (unsigned long long)*end);
	kvmem_st_close(f);
}

/* ---- tensor-level rewriting ------------------------------------------- */
struct tdesc {
	char name[96];
	kvmem_st_dtype dtype;
	int ndim;
	int64_t shape[KVMEM_ST_MAX_DIMS];
	unsigned char *data;
	size_t nbytes;
};

static int load_tensors(const char *path, struct tdesc *t, int max)
{
	kvmem_st_file *f;
	int n;

	assert_int_equal(kvmem_st_open(path, &f), 0);
	n = (int)kvmem_st_count(f);
	assert_true(n <= max);
	for (int i = 0; i < n; i++) {
		const kvmem_st_tensor *s = kvmem_st_at(f, (size_t)i);

		snprintf(t[i].name, sizeof(t[i].name), "%s", s->name);
		t[i].dtype = s->dtype;
		t[i].ndim = s->ndim;
		memcpy(t[i].shape, s->shape, sizeof(s->shape));
		t[i].nbytes = s->nbytes;
		t[i].data = malloc(s->nbytes + 1);
		memcpy(t[i].data, s->data, s->nbytes);
	}
	kvmem_st_close(f);
	return n;
}

static void save_tensors(const char *path, struct tdesc *t, int n)
{
	kvmem_st_writer *w = kvmem_st_writer_new();

	for (int i = 0; i < n; i++)
		if (t[i].name[0])	/* an emptied name drops the tensor */
			assert_int_equal(kvmem_st_writer_add(w, t[i].name, t[i].dtype, t[i].ndim,
							   t[i].shape), 0);
	assert_int_equal(kvmem_st_writer_begin(w, path), 0);
	for (int i = 0; i < n; i++)
		if (t[i].name[0])
			assert_int_equal(kvmem_st_writer_write(w, t[i].data, t[i].nbytes), 0);
	assert_int_equal(kvmem_st_writer_finish(w), 0);
	kvmem_st_writer_free(w);
	for (int i = 0; i < n; i++)
		free(t[i].data);
}

static struct tdesc *find_t(struct tdesc *t, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(t[i].name, name))
			return &t[i];
	fail_msg("no tensor %s", name);
	return NULL;
}

/* ---- good models -------------------------------------------------------- */
/* Every weight of m equals the stored value of its tensor in dir, converted. */
static void check_values(const kvmem_model *m, const char *file)
{
	kvmem_st_file *f;
	const kvmem_config *c = &m->cfg;
	const struct {
		const char *suffix;
		size_t off;
	} roles[] = {
		{ "input_layernorm.weight", offsetof(kvmem_layer, attn_norm) },
		{ "self_attn.q_proj.weight", offsetof(kvmem_layer, wq) },
		{ "self_attn.k_proj.weight", offsetof(kvmem_layer, wk) },
		{ "self_attn.v_proj.weight", offsetof(kvmem_layer, wv) },
		{ "self_attn.o_proj.weight", offsetof(kvmem_layer, wo) },
		{ "self_attn.q_norm.weight", offsetof(kvmem_layer, q_norm) },
		{ "self_attn.k_norm.weight", offsetof(kvmem_layer, k_norm) },
		{ "post_attention_layernorm.weight", offsetof(kvmem_layer, mlp_norm) },
		{ "mlp.gate_proj.weight", offsetof(kvmem_layer, w_gate) },
		{ "mlp.up_proj.weight", offsetof(kvmem_layer, w_up) },
		{ "mlp.down_proj.weight", offsetof(kvmem_layer, w_down) },
	};
	char name[128];

	assert_int_equal(kvmem_st_open(file, &f), 0);
	for (int l = -1; l < c->n_layers; l++) {
		for (size_t r = 0; r < (l < 0 ? 3 : sizeof(roles) / sizeof(roles[0])); r++) {
			const float *w;
			const kvmem_st_tensor *t;

			if (l < 0) {
				const char *top[] = { "model.embed_tokens.weight", "model.norm.weight",
						      "lm_head.weight" };
				const float *ptr[] = { m->embed, m->final_norm, m->lm_head };

				snprintf(name, sizeof(name), "%s", top[r]);
				w = ptr[r];
				if (r == 2 && c->tie_embeddings) {
					assert_ptr_equal(m->lm_head, m->embed);
					continue;
				}
			} else {
				snprintf(name, sizeof(name), "model.layers.%d.%s", l, roles[r].suffix);
				w = *(const float *const *)((const char *)&m->layers[l] + roles[r].off);
			}
			t = kvmem_st_find(f, name);
			assert_non_null(t);
			assert_non_null(w);
			for (uint64_t i = 0; i < t->numel; i++) {
				float want;
				uint16_t h;

				if (t->dtype == KVMEM_ST_F32) {
					memcpy(&want, (const char *)t->data + 4 * i, 4);
				} else {
					memcpy(&h, (const char *)t->data + 2 * i, 2);
					want = t->dtype == KVMEM_ST_BF16 ? kvmem_bf16_to_f32(h) : kvmem_f16_to_f32(h);
				}
				if (memcmp(&want, &w[i], 4))
					fail_msg("%s[%llu]: %g, stored %g", name, (unsigned long long)i,
						 (double)w[i], (double)want);
			}
		}
	}
	kvmem_st_close(f);
}

static void load_and_check(const char *dir, int tied, const char *dtype_name)
{
	char file[256];
	kvmem_model *m;
	kvmem_config want = small_config(tied);

	if (kvmem_model_load(dir, &m))
		fail_msg("load %s: %s", dir, kvmem_last_error());
	assert_int_equal(m->cfg.n_layers, want.n_layers);
	assert_int_equal(m->cfg.hidden, want.hidden);
	assert_int_equal(m->cfg.n_heads, want.n_heads);
	assert_int_equal(m->cfg.n_kv_heads, want.n_kv_heads);
	assert_int_equal(m->cfg.head_dim, want.head_dim);
	assert_int_equal(m->cfg.intermediate, want.intermediate);
	assert_int_equal(m->cfg.vocab, want.vocab);
	assert_int_equal(m->cfg.tie_embeddings, tied);
	assert_string_equal(m->weight_dtype, dtype_name);
	assert_int_equal(m->n_files, 1);
	snprintf(file, sizeof(file), "%s/model.safetensors", dir);
	check_values(m, file);
	if (!tied)
		assert_true(m->lm_head != m->embed);
	kvmem_model_free(m);
}

static void test_good_dtypes(void **state)
{
	char dir[128];

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	load_and_check(dir, 1, "BF16");
	make_model(dir, sizeof(dir), 0, "bf16", 0);
	load_and_check(dir, 0, "BF16");
	make_model(dir, sizeof(dir), 0, "f16", 0);
	load_and_check(dir, 0, "F16");
	make_model(dir, sizeof(dir), 1, "f32", 0);
	load_and_check(dir, 1, "F32");
}

/* Random bit patterns of every dtype in one file, some at odd offsets (the
 * copy path): values come back exactly. Stray names outside model. are ok. */
static void test_mixed_and_misaligned(void **state)
{
	struct tdesc t[64];
	char dir[128], path[256];
	uint64_t s = seed0 ^ 0x1234;
	int n;
	kvmem_model *m;

	make_model(dir, sizeof(dir), 0, "f32", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	n = load_tensors(path, t, 63);
	for (int i = 0; i < n; i++) {
		kvmem_st_dtype dt =
			(kvmem_st_dtype[]){ KVMEM_ST_BF16, KVMEM_ST_F16, KVMEM_ST_F32 }[test_rng_next(&s) % 3];
		size_t numel = t[i].nbytes / 4;

		t[i].dtype = dt;
		t[i].nbytes = numel * kvmem_st_dtype_size(dt);
		for (size_t k = 0; k < numel; k++) {
			float v = (float)((double)(test_rng_next(&s) >> 11) * 0x1.0p-53 * 4.0 - 2.0);
			uint16_t h = dt == KVMEM_ST_BF16 ? kvmem_f32_to_bf16(v) : kvmem_f32_to_f16(v);

			if (dt == KVMEM_ST_F32)
				memcpy(t[i].data + 4 * k, &v, 4);
			else
				memcpy(t[i].data + 2 * k, &h, 2);
		}
	}
	/* a 3-byte tensor first puts everything after it at odd offsets */
	memmove(&t[1], &t[0], (size_t)n * sizeof(t[0]));
	memset(&t[0], 0, sizeof(t[0]));
	snprintf(t[0].name, sizeof(t[0].name), "extra.padding");
	t[0].dtype = KVMEM_ST_U8;
	t[0].ndim = 1;
	t[0].shape[0] = 3;
	t[0].nbytes = 3;
	t[0].data = malloc(3);
	memset(t[0].data, 7, 3);
	save_tensors(path, t, n + 1);
	if (kvmem_model_load(dir, &m))
		fail_msg("load: %s", kvmem_last_error());
	assert_string_equal(m->weight_dtype, "mixed");
	check_values(m, path);
	kvmem_model_free(m);
}

/* Shards: the same weights as one file; a missing or mislisted shard fails. */
static void test_sharded(void **state)
{
	char one[128], many[128], path[256], *idx;
	kvmem_model *a, *b;
	kvmem_config c = small_config(0);
	kvmem_gen_opts o = { .seed = seed0 + 99, .shard_bytes = 20000 };
	size_t len;

	new_dir(one, sizeof(one));
	new_dir(many, sizeof(many));
	assert_int_equal(kvmem_model_generate_opts(&c, many, &o), 0);
	o.shard_bytes = 0;
	assert_int_equal(kvmem_model_generate_opts(&c, one, &o), 0);
	snprintf(path, sizeof(path), "%s/model-00002-of-00003.safetensors", many);
	assert_int_equal(access(path, F_OK), 0);	/* 3 shards of <= 20 kB */
	if (kvmem_model_load(many, &b))
		fail_msg("load: %s", kvmem_last_error());
	assert_int_equal(kvmem_model_load(one, &a), 0);
	assert_int_equal(b->n_files, 3);
	assert_int_equal(a->fingerprint, b->fingerprint);	/* same tensors, same bytes */
	assert_memory_equal(a->embed, b->embed, (size_t)c.vocab * c.hidden * 4);
	assert_memory_equal(a->lm_head, b->lm_head, (size_t)c.vocab * c.hidden * 4);
	for (int l = 0; l < c.n_layers; l++)
		assert_memory_equal(a->layers[l].w_down, b->layers[l].w_down,
				    (size_t)c.hidden * c.intermediate * 4);
	kvmem_model_free(a);
	kvmem_model_free(b);

	/* a tensor listed in the wrong shard */
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", many);
	idx = read_all(path, &len);
	edit_text(many, "model.safetensors.index.json",
		  "\"model.norm.weight\": \"model-00003-of-00003.safetensors\"",
		  "\"model.norm.weight\": \"model-00001-of-00003.safetensors\"");
	expect_load_error(many, "model.safetensors.index.json: weight_map puts 'model.norm.weight' "
			  "in model-00001-of-00003.safetensors, which does not hold it", NULL);
	write_all(path, idx, len);
	free(idx);
	edit_text(many, "model.safetensors.index.json", "\"weight_map\"", "\"weight_mop\"");
	expect_load_error(many, "model.safetensors.index.json: 'weight_map' must be", NULL);
	edit_text(many, "model.safetensors.index.json", "\"weight_mop\"", "\"weight_map\"");
	edit_text(many, "model.safetensors.index.json", "\"model-00003-of-00003", "\"../x");
	expect_load_error(many, "must name a file in the model directory", NULL);
	edit_text(many, "model.safetensors.index.json", "\"../x", "\"model-00003-of-00003");

	/* a shard gone */
	snprintf(path, sizeof(path), "%s/model-00003-of-00003.safetensors", many);
	assert_int_equal(unlink(path), 0);
	expect_load_error(many, "model-00003-of-00003.safetensors: cannot open: No such file",
			  "(a shard listed in model.safetensors.index.json)");
}

/* ---- bad models ---------------------------------------------------------- */
static void test_missing_and_stray_tensors(void **state)
{
	struct tdesc t[64];
	char dir[128], path[256];
	int n;

	make_model(dir, sizeof(dir), 0, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	n = load_tensors(path, t, 64);
	find_t(t, n, "model.layers.1.mlp.up_proj.weight")->name[0] = 0;
	save_tensors(path, t, n);
	expect_load_error(dir, "model.safetensors: missing tensor 'model.layers.1.mlp.up_proj.weight'",
			  dir);

	make_model(dir, sizeof(dir), 0, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	n = load_tensors(path, t, 64);
	find_t(t, n, "lm_head.weight")->name[0] = 0;
	save_tensors(path, t, n);
	expect_load_error(dir, "missing tensor 'lm_head.weight' (config.json has tie_word_embeddings "
			  "false)", NULL);

	/* a bias where Qwen3 has none */
	make_model(dir, sizeof(dir), 1, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	n = load_tensors(path, t, 63);
	t[n] = t[0];
	t[n].data = malloc(t[0].nbytes);
	memcpy(t[n].data, t[0].data, t[0].nbytes);
	snprintf(t[n].name, sizeof(t[n].name), "model.layers.0.self_attn.q_proj.bias");
	save_tensors(path, t, n + 1);
	expect_load_error(dir, "model.safetensors: unexpected tensor "
			  "'model.layers.0.self_attn.q_proj.bias'", "(biases are not supported)");

	/* a tensor with the wrong dtype */
	make_model(dir, sizeof(dir), 1, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	n = load_tensors(path, t, 64);
	find_t(t, n, "model.layers.0.self_attn.k_norm.weight")->dtype = KVMEM_ST_I16;
	save_tensors(path, t, n);
	expect_load_error(dir, "tensor 'model.layers.0.self_attn.k_norm.weight' has dtype I16; "
			  "kvmem reads BF16, F16 and F32", NULL);

	/* ignored: names outside model./lm_head, rotary buffers, a tied lm_head */
	make_model(dir, sizeof(dir), 1, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	n = load_tensors(path, t, 60);
	for (int k = 0; k < 3; k++) {
		const char *names[] = { "something.else", "model.rotary_emb.inv_freq", "lm_head.weight" };

		t[n + k] = t[0];
		t[n + k].data = malloc(t[0].nbytes);
		memcpy(t[n + k].data, t[0].data, t[0].nbytes);
		snprintf(t[n + k].name, sizeof(t[n + k].name), "%s", names[k]);
	}
	save_tensors(path, t, n + 3);
	load_and_check(dir, 1, "BF16");
}

/* config.json and the tensors disagree. */
static void test_config_disagrees(void **state)
{
	char dir[128];

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_text(dir, "config.json", "\"intermediate_size\": 48", "\"intermediate_size\": 64");
	expect_load_error(dir, "model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has "
			  "shape [48, 32], config.json implies [64, 32]", NULL);

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_text(dir, "config.json", "\"vocab_size\": 64", "\"vocab_size\": 80");
	expect_load_error(dir, "tensor 'model.embed_tokens.weight' has shape [64, 32], config.json "
			  "implies [80, 32]", NULL);

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_text(dir, "config.json", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4");
	expect_load_error(dir, "'model.layers.0.self_attn.k_proj.weight' has shape [32, 32], "
			  "config.json implies [64, 32]", NULL);

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_text(dir, "config.json", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
	expect_load_error(dir, "model.safetensors: tensor 'model.layers.1.",
			  "is beyond num_hidden_layers 1 in config.json");

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_text(dir, "config.json", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
	expect_load_error(dir, "missing tensor 'model.layers.2.input_layernorm.weight'", NULL);

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_text(dir, "config.json", "\"head_dim\": 16", "\"head_dim\": 8");
	expect_load_error(dir, "'model.layers.0.self_attn.q_proj.weight' has shape [64, 32], "
			  "config.json implies [32, 32]", NULL);
}

/* The file itself is damaged: the loader passes the reader's message on. */
static void test_damaged_files(void **state)
{
	char dir[128], path[256], from[96], to[96], *b;
	uint64_t begin, end, e0, e1;
	size_t len;
	struct stat st;

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(truncate(path, st.st_size - 1), 0);
	expect_load_error(dir, path, "run past the end of the data");

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	b = read_all(path, &len);
	b[5] = 1;	/* header length near 2^40 */
	write_all(path, b, len);
	free(b);
	expect_load_error(dir, path, "header length 1099511");

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(truncate(path, 6), 0);
	expect_load_error(dir, "model.safetensors: file is 6 bytes, too short", NULL);

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_header(dir, "\"dtype\":\"BF16\"", "\"dtype\":\"BF16\",");
	expect_load_error(dir, "model.safetensors (header):1:", "string or '}' expected near ','");

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_header(dir, "\"dtype\":\"BF16\"", "\"dtype\":\"BF12\"");
	expect_load_error(dir, "model.safetensors: tensor '", "has unknown dtype 'BF12'");

	/* overlapping: move the final norm back onto the tensor before it */
	make_model(dir, sizeof(dir), 1, "bf16", 0);
	offsets_of(dir, "model.norm.weight", from, sizeof(from), &begin, &end);
	snprintf(to, sizeof(to), "\"data_offsets\":[%llu,%llu]", (unsigned long long)(begin - 2),
		 (unsigned long long)(end - 2));
	edit_header(dir, from, to);
	expect_load_error(dir, "model.safetensors: tensors '", "overlap");

	/* out of range: past the end of the data */
	make_model(dir, sizeof(dir), 1, "bf16", 0);
	offsets_of(dir, "model.norm.weight", from, sizeof(from), &begin, &end);
	snprintf(to, sizeof(to), "\"data_offsets\":[%llu,%llu]", (unsigned long long)(begin + 64),
		 (unsigned long long)(end + 64));
	edit_header(dir, from, to);
	expect_load_error(dir, "tensor 'model.norm.weight': data_offsets [", "run past the end");

	/* a length that does not match shape x dtype */
	make_model(dir, sizeof(dir), 1, "bf16", 0);
	offsets_of(dir, "model.embed_tokens.weight", from, sizeof(from), &e0, &e1);
	snprintf(to, sizeof(to), "\"data_offsets\":[%llu,%llu]", (unsigned long long)e0,
		 (unsigned long long)(e1 - 2));
	edit_header(dir, from, to);
	expect_load_error(dir, "tensor 'model.embed_tokens.weight': data_offsets", "of BF16 needs 4096");
}

static void test_config_errors(void **state)
{
	char dir[128], path[256];

	new_dir(dir, sizeof(dir));
	expect_load_error(dir, dir, "No such file or directory");
	assert_int_equal(mkdir(dir, 0755), 0);
	expect_load_error(dir, "no config.json here", NULL);
	put_text(dir, "config.json", "{}");
	snprintf(path, sizeof(path), "%s/config.json", dir);
	expect_load_error(path, "not a directory", NULL);
	expect_load_error(dir, "config.json: neither 'architectures' nor 'model_type'", NULL);

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(unlink(path), 0);
	expect_load_error(dir, "holds config.json but neither model.safetensors nor "
			  "model.safetensors.index.json", NULL);

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_text(dir, "config.json", "\"Qwen3ForCausalLM\"", "\"LlamaForCausalLM\"");
	expect_load_error(dir, "config.json: architecture 'LlamaForCausalLM' is not supported "
			  "(kvmem runs Qwen3ForCausalLM)", NULL);
	edit_text(dir, "config.json", "\"LlamaForCausalLM\"", "\"Qwen3ForCausalLM\"");
	edit_text(dir, "config.json", "\"qwen3\"", "\"qwen2\"");
	expect_load_error(dir, "model_type 'qwen2' is not supported (kvmem runs qwen3)", NULL);
	edit_text(dir, "config.json", "\"qwen2\"", "\"qwen3\"");
	edit_text(dir, "config.json", "\"rope_scaling\": null",
		  "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}");
	expect_load_error(dir, "config.json: rope_scaling of type 'yarn' is not supported", NULL);
	edit_text(dir, "config.json", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", "null");
	edit_text(dir, "config.json", "\"hidden_size\": 32", "\"hidden_size\": \"32\"");
	expect_load_error(dir, "config.json:", "'hidden_size' must be an integer, found string");
	edit_text(dir, "config.json", "\"hidden_size\": \"32\",", "");
	expect_load_error(dir, "config.json: missing 'hidden_size'", NULL);
	edit_text(dir, "config.json", "\"hidden_act\": \"silu\"",
		  "\"hidden_act\": \"gelu\", \"hidden_size\": 32");
	expect_load_error(dir, "hidden_act 'gelu' is not supported", NULL);
	edit_text(dir, "config.json", "\"gelu\"", "\"silu\"");
	edit_text(dir, "config.json", "\"attention_bias\": false", "\"attention_bias\": true");
	expect_load_error(dir, "attention_bias true is not supported", NULL);
	edit_text(dir, "config.json", "\"attention_bias\": true", "\"attention_bias\": false");
	edit_text(dir, "config.json", "\"use_sliding_window\": false", "\"use_sliding_window\": true");
	expect_load_error(dir, "use_sliding_window true is not supported", NULL);
	edit_text(dir, "config.json", "\"use_sliding_window\": true", "\"use_sliding_window\": false");
	edit_text(dir, "config.json", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
	expect_load_error(dir, "num_key_value_heads 3 does not divide num_attention_heads 4", NULL);
	edit_text(dir, "config.json", "\"num_key_value_heads\": 3", "\"num_key_value_heads\": 2");
	edit_text(dir, "config.json", "\"head_dim\": 16", "\"head_dim\": 15");
	expect_load_error(dir, "head_dim 15 must be even", NULL);
	edit_text(dir, "config.json", "\"head_dim\": 15", "\"head_dim\": 16");
	edit_text(dir, "config.json", "\"vocab_size\": 64", "\"vocab_size\": 64,");
	expect_load_error(dir, "config.json:29:1: string or '}' expected near '}'", NULL);
}

/* The keys of transformers 5 (dtype, rope_parameters, layer_types, eos
 * lists), and defaults when keys are absent. */
static void test_config_variants(void **state)
{
	kvmem_config c;
	const char *v5 =
		"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\",\n"
		" \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,\n"
		" \"intermediate_size\": 96, \"vocab_size\": 100, \"dtype\": \"float32\",\n"
		" \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5000000.0},\n"
		" \"layer_types\": [\"full_attention\", \"full_attention\"],\n"
		" \"eos_token_id\": [7, 3], \"bos_token_id\": null, \"tie_word_embeddings\": true}";

	assert_int_equal(kvmem_config_parse(&c, v5, strlen(v5), "v5.json"), 0);
	assert_int_equal(c.n_kv_heads, 4);	/* defaults to the query heads */
	assert_int_equal(c.head_dim, 16);	/* hidden / heads */
	assert_int_equal(c.max_position, 32768);
	assert_true(c.rope_theta == 5e6);
	assert_true(c.rms_eps == 1e-6f);
	assert_int_equal(c.eos_id, 7);
	assert_int_equal(c.bos_id, -1);
	assert_int_equal(c.tie_embeddings, 1);
	assert_string_equal(c.dtype, "float32");
	assert_string_equal(c.arch, "Qwen3ForCausalLM");

	const char *sliding = "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
			      " \"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 100,"
			      " \"layer_types\": [\"full_attention\", \"sliding_attention\"]}";
	assert_true(kvmem_config_parse(&c, sliding, strlen(sliding), "s.json") < 0);
	assert_non_null(strstr(kvmem_last_error(), "s.json: layer_types[1] is 'sliding_attention'"));

	const char *both = "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
			   " \"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 100,"
			   " \"rope_theta\": 10000, \"rope_parameters\": {\"rope_theta\": 20000}}";
	assert_true(kvmem_config_parse(&c, both, strlen(both), "b.json") < 0);
	assert_non_null(strstr(kvmem_last_error(), "disagree"));

	const char *anon = "{\"hidden_size\": 64}";
	assert_true(kvmem_config_parse(&c, anon, strlen(anon), "a.json") < 0);
	assert_non_null(strstr(kvmem_last_error(), "a.json: neither 'architectures' nor 'model_type'"));

	const char *eos = "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
			  " \"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 100,"
			  " \"eos_token_id\": 100}";
	assert_true(kvmem_config_parse(&c, eos, strlen(eos), "e.json") < 0);
	assert_non_null(strstr(kvmem_last_error(), "eos_token_id 100 is outside the vocabulary (100)"));

	assert_true(kvmem_config_parse(&c, "[]", 2, "arr.json") < 0);
	assert_non_null(strstr(kvmem_last_error(), "arr.json: expected a JSON object, found array"));
}

/* ---- issue 9: storage you can trust ------------------------------------- */
/* The stored position of element `at` of a tensor in dir/file. */
static off_t element_offset(const char *dir, const char *file, const char *tensor, double frac,
			    size_t *esz, kvmem_st_dtype *dt)
{
	char path[256];
	kvmem_st_file *f;
	const kvmem_st_tensor *t;
	off_t off;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	assert_int_equal(kvmem_st_open(path, &f), 0);
	t = kvmem_st_find(f, tensor);
	assert_non_null(t);
	*esz = kvmem_st_dtype_size(t->dtype);
	*dt = t->dtype;
	off = (off_t)(t->offset + (uint64_t)(frac * (double)t->numel) * *esz);
	kvmem_st_close(f);
	return off;
}

static void pwrite_at(const char *dir, const char *file, off_t off, const void *b, size_t n)
{
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, b, n, off), (ssize_t)n);
	close(fd);
}

/* Flip the lowest bit of the byte at off (of an element: its lowest
 * mantissa bit, the value still finite); the byte it held. Writing a
 * fixed byte instead could write what is already there. */
static unsigned char flip_at(const char *dir, const char *file, off_t off)
{
	char path[256];
	unsigned char b, flipped;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, off), 1);
	close(fd);
	flipped = b ^ 1;
	pwrite_at(dir, file, off, &flipped, 1);
	return b;
}

static uint64_t fingerprint_of(const char *dir, uint64_t *hashed)
{
	kvmem_model *m;
	uint64_t fp;

	if (kvmem_model_open(dir, KVMEM_MODEL_NO_WEIGHTS, &m))
		fail_msg("open %s: %s", dir, kvmem_last_error());
	fp = m->fingerprint;
	if (hashed)
		*hashed = m->hashed_bytes;
	kvmem_model_free(m);
	return fp;
}

/*
 * Item 4: the fingerprint covers every byte of every tensor. One bit of one
 * weight in the middle of layer 0's q_proj (the old fingerprint read only the
 * first and last 4 KiB of each tensor) changes it; putting it back restores it.
 */
static void test_item4_fingerprint_every_byte(void **state)
{
	uint64_t rng = seed0 ^ 0x4444, fp0, fp1;
	const char *dtypes[] = { "bf16", "f16", "f32" };
	char dir[128];

	/* Tensors of 32 KiB and more, so the middle is far from both ends. */
	kvmem_config c = small_config(0);

	c.hidden = 128;
	c.head_dim = 32;
	c.intermediate = 192;
	for (int k = 0; k < 3; k++) {
		const char *t = k == 2 ? "model.layers.1.mlp.down_proj.weight" :
					 "model.layers.0.self_attn.q_proj.weight";
		kvmem_gen_opts o = { .seed = seed0 + (uint64_t)k, .dtype = dtypes[k] };
		size_t esz;
		kvmem_st_dtype dt;
		off_t off;
		unsigned char b;

		c.tie_embeddings = k == 1;
		new_dir(dir, sizeof(dir));
		if (kvmem_model_generate_opts(&c, dir, &o))
			fail_msg("generate: %s", kvmem_last_error());
		fp0 = fingerprint_of(dir, NULL);
		off = element_offset(dir, "model.safetensors", t, test_rng_range(&rng, 0.3, 0.7), &esz, &dt);
		b = flip_at(dir, "model.safetensors", off);
		fp1 = fingerprint_of(dir, NULL);
		if (fp1 == fp0)
			fail_msg("%s: one bit of %s changed, the fingerprint did not", dtypes[k], t);
		pwrite_at(dir, "model.safetensors", off, &b, 1);
		assert_int_equal(fingerprint_of(dir, NULL), fp0);
	}
}

/*
 * Item 4: reopening is cheap. A file last changed two seconds or more ago
 * has its digests cached (the next open reads nothing), a changed file is
 * hashed again, a file changed within the last two seconds is not cached,
 * and a damaged cache is ignored.
 */
static void test_item4_digest_cache(void **state)
{
	char dir[128], cache[256], path[400];
	uint64_t fp0, fp, hashed;
	struct stat st;
	size_t esz;
	kvmem_st_dtype dt;
	off_t off;
	FILE *f;

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(stat(path, &st), 0);
	snprintf(cache, sizeof(cache), "%s/home/fingerprints/%016llx-%016llx", root,
		 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
	/* just written: hashed, but not cached */
	fp0 = fingerprint_of(dir, &hashed);
	assert_true(hashed > 0);
	assert_int_equal(access(cache, F_OK), -1);
	sleep(2);
	assert_int_equal(fingerprint_of(dir, &hashed), fp0);
	assert_true(hashed > 0);
	assert_int_equal(access(cache, F_OK), 0);
	assert_int_equal(fingerprint_of(dir, &hashed), fp0);
	assert_int_equal(hashed, 0);	/* from the cache */

	/* a damaged cache is a miss, never a wrong fingerprint */
	f = fopen(cache, "r+b");
	assert_non_null(f);
	fseek(f, 90, SEEK_SET);
	fputc('z', f);
	fclose(f);
	assert_int_equal(fingerprint_of(dir, &hashed), fp0);
	assert_true(hashed > 0);

	/* a changed file is hashed again */
	off = element_offset(dir, "model.safetensors", "model.embed_tokens.weight", 0.5, &esz, &dt);
	flip_at(dir, "model.safetensors", off);	/* a fixed 0 was there for some seeds */
	fp = fingerprint_of(dir, &hashed);
	assert_true(hashed > 0);
	assert_true(fp != fp0);
	assert_int_equal(fingerprint_of(dir, &hashed), fp);
	assert_true(hashed > 0);	/* changed under two seconds ago: not cached */
}

/*
 * Item 6: a FIFO in the place of config.json, model.safetensors or the shard
 * index must not block (the old loader waited for a writer forever: the
 * alarm ends the test then), and is refused by name; a dangling
 * model.safetensors link is called one.
 */
static void test_item6_fifo_and_dangling_link(void **state)
{
	const char *names[] = { "config.json", "model.safetensors", "model.safetensors.index.json" };
	char dir[128], path[256];

	alarm(20);
	for (int k = 0; k < 3; k++) {
		make_model(dir, sizeof(dir), 1, "bf16", 0);
		snprintf(path, sizeof(path), "%s/%s", dir, names[k]);
		unlink(path);
		assert_int_equal(mkfifo(path, 0644), 0);
		expect_load_error(dir, names[k], "a FIFO, not a regular file");
	}
	make_model(dir, sizeof(dir), 1, "bf16", 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	unlink(path);
	assert_int_equal(symlink("/nonexistent/kvmem-weights", path), 0);
	expect_load_error(dir, "model.safetensors: a dangling symbolic link to "
			  "'/nonexistent/kvmem-weights'", NULL);
	/* a directory in a file's place is named too */
	unlink(path);
	assert_int_equal(mkdir(path, 0755), 0);
	expect_load_error(dir, "model.safetensors: a directory, not a regular file", NULL);
	alarm(0);
}

/*
 * Item 8: a NaN or an infinity anywhere in a tensor the model uses is
 * refused, naming the tensor (found by the fingerprint pass, which reads
 * every byte anyway); and a name or string holding "\u0000" is refused.
 */
static void test_item8_nonfinite_weights(void **state)
{
	uint64_t rng = seed0 ^ 0x8888;
	const char *dtypes[] = { "bf16", "f16", "f32" };
	char dir[128];

	for (int k = 0; k < 6; k++) {
		kvmem_config c = small_config(k & 1);
		struct kvmem_tensor_spec sp;
		size_t n = kvmem_tensor_count(&c), esz;
		kvmem_st_dtype dt;
		off_t off;
		unsigned char v[4];
		int nan = test_rng_int(&rng, 0, 1);
		char want[160];

		make_model(dir, sizeof(dir), k & 1, dtypes[k % 3], 0);
		kvmem_tensor_spec(&c, (size_t)test_rng_int(&rng, 0, (int)n - 1), &sp);
		off = element_offset(dir, "model.safetensors", sp.name, test_rng_uniform(&rng), &esz, &dt);
		if (dt == KVMEM_ST_BF16) {
			v[0] = nan ? 0xc0 : 0x80;
			v[1] = nan ? 0x7f : 0xff;	/* NaN, or -Inf */
		} else if (dt == KVMEM_ST_F16) {
			v[0] = 0;
			v[1] = nan ? 0x7e : 0x7c;	/* NaN, or +Inf */
		} else {
			v[0] = v[1] = 0;
			v[2] = nan ? 0xc0 : 0x80;
			v[3] = 0x7f;
		}
		pwrite_at(dir, "model.safetensors", off, v, esz);
		snprintf(want, sizeof(want), "tensor '%s' holds 1 NaN or infinite value", sp.name);
		expect_load_error(dir, "model.safetensors", want);
	}
}

static void test_item8_nul_in_names(void **state)
{
	char dir[128];

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_text(dir, "config.json", "\"Qwen3ForCausalLM\"", "\"Qwen3ForCausalLM\\u0000x\"");
	expect_load_error(dir, "config.json:", "holds \"\\u0000\"");

	make_model(dir, sizeof(dir), 1, "bf16", 0);
	edit_header(dir, "\"model.norm.weight\"", "\"model.norm.weight\\u0000\"");
	expect_load_error(dir, "a key holds \"\\u0000\": \"model.norm.weight\\u0000\"", NULL);

	make_model(dir, sizeof(dir), 1, "bf16", 4096);
	edit_text(dir, "model.safetensors.index.json", "\"model.norm.weight\"",
		  "\"model.norm.weight\\u0000\"");
	expect_load_error(dir, "model.safetensors.index.json:", "holds \"\\u0000\"");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_good_dtypes),
		cmocka_unit_test(test_mixed_and_misaligned),
		cmocka_unit_test(test_sharded),
		cmocka_unit_test(test_missing_and_stray_tensors),
		cmocka_unit_test(test_config_disagrees),
		cmocka_unit_test(test_damaged_files),
		cmocka_unit_test(test_config_errors),
		cmocka_unit_test(test_config_variants),
		cmocka_unit_test(test_item4_fingerprint_every_byte),
		cmocka_unit_test(test_item4_digest_cache),
		cmocka_unit_test(test_item6_fifo_and_dangling_link),
		cmocka_unit_test(test_item8_nonfinite_weights),
		cmocka_unit_test(test_item8_nul_in_names),
	};

	seed0 = test_rng_fresh_seed("test_loader");
	return cmocka_run_group_tests(tests, setup, teardown);
}
