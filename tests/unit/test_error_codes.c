// SPDX-License-Identifier: MIT
/*
 * The codes failing calls return (kvmem.h: a negative errno callers branch
 * on), for representative failures of the model loader, config.json,
 * safetensors, tokenizer.json, session scripts and agentlang: each as its
 * header documents it, equal to kvmem_last_errno(), with a message.
 * (Until issue 23 these paths returned -1, which reads as -EPERM.)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "agentlang/agentlang.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/script.h"
#include "kvmem/tokenizer.h"
#include "model/safetensors.h"
#include "helpers/test_tmpdir.h"

static char root[512];
static int counter;

/* rc is -want, the thread's code says the same, and there is a message. */
#define expect_code(rc, want) check_code((rc), (want), #rc, __LINE__)
static void check_code(int rc, int want, const char *what, int line)
{
	if (rc != -want || kvmem_last_errno() != want || !*kvmem_last_error())
		fail_msg("line %d: %s: want -%s (%d), got %d (last errno %d): %s", line, what,
			 strerror(want), -want, rc, kvmem_last_errno(), kvmem_last_error());
}

static char *new_dir(char *buf, size_t len)
{
	snprintf(buf, len, "%s/d%d", root, counter++);
	return buf;
}

static void put(const char *dir, const char *name, const char *text)
{
	char path[700];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

static void make_model(char *dir, size_t len)
{
	kvmem_config c = { .arch = "Qwen3ForCausalLM", .n_layers = 1, .hidden = 32, .n_heads = 4,
			   .n_kv_heads = 2, .head_dim = 8, .intermediate = 48, .vocab = 64,
			   .max_position = 512, .rope_theta = 1e6, .rms_eps = 1e-6f,
			   .tie_embeddings = 1, .bos_id = 1, .eos_id = 2, .dtype = "bfloat16" };
	kvmem_gen_opts o = { .seed = 7, .dtype = "bf16" };

	new_dir(dir, len);
	if (kvmem_model_generate_opts(&c, dir, &o))
		fail_msg("generate: %s", kvmem_last_error());
}

static int open_model(const char *dir)
{
	kvmem_model *m = (kvmem_model *)&m;
	int rc = kvmem_model_open(dir, KVMEM_MODEL_NO_WEIGHTS, &m);

	assert_null(m);
	return rc;
}

static void test_model_open(void **state)
{
	char dir[600], path[700];

	/* the directory, and the files in it */
	snprintf(dir, sizeof(dir), "%s/nowhere", root);
	expect_code(open_model(dir), ENOENT);
	expect_code(kvmem_model_load(dir, &(kvmem_model *){ NULL }), ENOENT);
	new_dir(dir, sizeof(dir));
	put(root, "plain", "x");
	snprintf(path, sizeof(path), "%s/plain", root);
	expect_code(open_model(path), ENOTDIR);
	assert_int_equal(mkdir(dir, 0755), 0);
	expect_code(open_model(dir), ENOENT);	/* no config.json */

	/* config.json: not JSON; JSON kvmem does not run */
	put(dir, "config.json", "{\"architectures\": [\"Qwen3ForCausalLM\"],");
	expect_code(open_model(dir), EBADMSG);
	put(dir, "config.json", "{\"a\": 1, \"a\": 2}");
	expect_code(open_model(dir), EBADMSG);
	put(dir, "config.json", "{\"architectures\": [\"LlamaForCausalLM\"]}");
	expect_code(open_model(dir), EINVAL);
	put(dir, "config.json", "{\"model_type\": \"qwen3\", \"hidden_size\": \"32\"}");
	expect_code(open_model(dir), EINVAL);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(mkfifo(path, 0644), 0);
	expect_code(open_model(dir), EINVAL);	/* a FIFO, never opened for good */
}

static void test_model_weights(void **state)
{
	char dir[600], path[700];
	kvmem_model *m;
	FILE *f;

	make_model(dir, sizeof(dir));
	assert_int_equal(kvmem_model_open(dir, KVMEM_MODEL_NO_WEIGHTS, &m), 0);
	kvmem_model_free(m);

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(truncate(path, 100), 0);	/* the header runs past the end */
	expect_code(open_model(dir), EBADMSG);
	f = fopen(path, "r+");
	assert_non_null(f);
	fwrite("\x08\0\0\0\0\0\0\0{\"a\": 1}", 1, 16, f);	/* a header that is not one */
	fclose(f);
	expect_code(open_model(dir), EBADMSG);
	assert_int_equal(unlink(path), 0);
	expect_code(open_model(dir), ENOENT);		/* neither file */
	assert_int_equal(symlink("elsewhere", path), 0);
	expect_code(open_model(dir), ENOENT);		/* a dangling link */

	/* shapes that disagree with config.json: read, but not this model */
	make_model(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/config.json", dir);
	f = fopen(path, "r+");
	assert_non_null(f);
	{
		char text[4096];
		size_t n = fread(text, 1, sizeof(text) - 1, f);
		char *p;

		text[n] = 0;
		p = strstr(text, "\"intermediate_size\": 48");
		assert_non_null(p);
		memcpy(p, "\"intermediate_size\": 40", 23);
		rewind(f);
		fwrite(text, 1, n, f);
	}
	fclose(f);
	expect_code(open_model(dir), EINVAL);
}

static void test_config_and_safetensors(void **state)
{
	kvmem_config c;
	kvmem_st_file *f = (kvmem_st_file *)&f;
	static const char hdr[] = "\x10\0\0\0\0\0\0\0{\"a\":{\"dtype\":1}}";

	expect_code(kvmem_config_parse(&c, "[1, 2", 5, "c.json"), EBADMSG);
	expect_code(kvmem_config_parse(&c, "[1, 2]", 6, "c.json"), EINVAL);
	expect_code(kvmem_config_parse(&c, "{\"model_type\": \"qwen3\"}", 23, "c.json"), EINVAL);
	c = (kvmem_config){ 0 };
	expect_code(kvmem_config_validate(&c, "c"), EINVAL);
	{
		char dir[600];

		expect_code(kvmem_model_generate(&c, new_dir(dir, sizeof(dir)), 1, NULL, NULL), EINVAL);
	}

	expect_code(kvmem_st_parse("abc", 3, "s", &f), EBADMSG);	/* too short */
	assert_null(f);
	expect_code(kvmem_st_parse(hdr, sizeof(hdr) - 1, "s", &f), EBADMSG);
	expect_code(kvmem_st_open("/nonexistent/x.safetensors", &f), ENOENT);
}

static void test_tokenizer(void **state)
{
	char dir[600];
	kvmem_tokenizer *t = (kvmem_tokenizer *)&t;

	snprintf(dir, sizeof(dir), "%s/notok", root);
	expect_code(kvmem_tokenizer_load(dir, &t), ENOENT);
	assert_null(t);
	new_dir(dir, sizeof(dir));
	assert_int_equal(mkdir(dir, 0755), 0);
	put(dir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}");
	expect_code(kvmem_tokenizer_load(dir, &t), EBADMSG);
	put(dir, "tokenizer.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
	expect_code(kvmem_tokenizer_load(dir, &t), ENOTSUP);
	put(dir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}}}");
	expect_code(kvmem_tokenizer_load(dir, &t), EINVAL);
	/* a failure inside a Sequence comes back with its own code */
	put(dir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
	    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}]}}");
	expect_code(kvmem_tokenizer_load(dir, &t), ENOTSUP);
	put(dir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0},"
	    " \"merges\": [\"a b\"]}}");
	expect_code(kvmem_tokenizer_load(dir, &t), EINVAL);	/* b is no token */
}

static void test_script_and_agentlang(void **state)
{
	char dir[600], path[700];
	kvmem_script *sc;
	kvmem_script_step st;
	agentlang_params p;
	agentlang_transcript ws;

	new_dir(dir, sizeof(dir));
	assert_int_equal(mkdir(dir, 0755), 0);
	put(dir, "s.jsonl", "{\"append\": [1, 2]}\n{\"append\": [1, 2]\n");
	snprintf(path, sizeof(path), "%s/s.jsonl", dir);
	assert_int_equal(kvmem_script_open(path, 64, 1, &sc), 0);
	assert_int_equal(kvmem_script_next(sc, &st), 1);
	expect_code(kvmem_script_next(sc, &st), EBADMSG);	/* not JSON */
	kvmem_script_close(sc);
	put(dir, "s.jsonl", "{\"append\": [1, 2], \"pinned\": true}\n");
	assert_int_equal(kvmem_script_open(path, 64, 1, &sc), 0);
	expect_code(kvmem_script_next(sc, &st), EINVAL);	/* JSON, not a step */
	kvmem_script_close(sc);

	agentlang_params_default(&p);
	p.n_tokens = 100;	/* below the 256 a workspace needs */
	expect_code(agentlang_transcript_build(&p, &ws), EINVAL);
}

static int setup(void **state)
{
	return test_tmpdir_make(root, sizeof(root), "errcodes");
}

static int teardown(void **state)
{
	return test_tmpdir_remove(root);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_model_open),
		cmocka_unit_test(test_model_weights),
		cmocka_unit_test(test_config_and_safetensors),
		cmocka_unit_test(test_tokenizer),
		cmocka_unit_test(test_script_and_agentlang),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
