// SPDX-License-Identifier: MIT
/*
 * config.json of a Qwen3 model: parse (as transformers 4.x and 5.x write
 * it), refuse what the engine does not implement, validate the geometry,
 * and derive sizes and the fingerprint.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "model/modelfile.h"
#include "model/tensors.h"
#include "util/json.h"

#define QWEN3_ARCH "Qwen3ForCausalLM"

/* An integer member: absent or null gives def (or an error if required). */
static int read_int(const kvmem_json *root, const char *key, int required, int def, int *out,
		    const char *name)
{
	const kvmem_json *v = kvmem_json_get(root, key);
	int64_t n;

	if (kvmem_json_typeof(v) == KVMEM_JSON_NULL) {
		if (required)
			return kvmem_error(EINVAL, "%s: missing '%s'", name, key);
		*out = def;
		return 0;
	}
	if (!kvmem_json_is_int(v))
		return kvmem_error(EINVAL, "%s:%d: '%s' must be an integer, found %s", name, kvmem_json_line(v),
				 key, kvmem_json_type_name(v));
	n = kvmem_json_int(v, 0);
	if (n < INT_MIN || n > INT_MAX)
		return kvmem_error(EINVAL, "%s:%d: '%s' is %lld, out of range", name, kvmem_json_line(v), key,
				 (long long)n);
	*out = (int)n;
	return 0;
}

static int read_num(const kvmem_json *root, const char *key, double def, double *out,
		    const char *name)
{
	const kvmem_json *v = kvmem_json_get(root, key);

	if (kvmem_json_typeof(v) == KVMEM_JSON_NULL) {
		*out = def;
		return 0;
	}
	if (kvmem_json_typeof(v) != KVMEM_JSON_NUMBER)
		return kvmem_error(EINVAL, "%s:%d: '%s' must be a number, found %s", name, kvmem_json_line(v),
				 key, kvmem_json_type_name(v));
	*out = kvmem_json_num(v, def);
	return 0;
}

static int read_bool(const kvmem_json *root, const char *key, int def, int *out, const char *name)
{
	const kvmem_json *v = kvmem_json_get(root, key);

	if (kvmem_json_typeof(v) == KVMEM_JSON_NULL) {
		*out = def;
		return 0;
	}
	if (kvmem_json_typeof(v) != KVMEM_JSON_BOOL)
		return kvmem_error(EINVAL, "%s:%d: '%s' must be true or false, found %s", name,
				 kvmem_json_line(v), key, kvmem_json_type_name(v));
	*out = kvmem_json_bool(v, def);
	return 0;
}

/* bos/eos: an id, null, or a list whose first id counts. */
static int read_token(const kvmem_json *root, const char *key, int *out, const char *name)
{
	const kvmem_json *v = kvmem_json_get(root, key);

	if (kvmem_json_typeof(v) == KVMEM_JSON_ARRAY)
		v = kvmem_json_at(v, 0);
	if (kvmem_json_typeof(v) == KVMEM_JSON_NULL) {
		*out = -1;
		return 0;
	}
	if (!kvmem_json_is_int(v) || kvmem_json_int(v, 0) < 0 || kvmem_json_int(v, 0) > INT_MAX)
		return kvmem_error(EINVAL, "%s:%d: '%s' must be a token id, found %s", name, kvmem_json_line(v),
				 key, kvmem_json_type_name(v));
	*out = (int)kvmem_json_int(v, 0);
	return 0;
}

static int check_family(kvmem_config *c, const kvmem_json *root, const char *name)
{
	const kvmem_json *archs = kvmem_json_get(root, "architectures");
	const kvmem_json *type = kvmem_json_get(root, "model_type");
	const char *arch = NULL;

	if (kvmem_json_typeof(archs) != KVMEM_JSON_NULL) {
		arch = kvmem_json_str(kvmem_json_at(archs, 0), NULL);
		if (kvmem_json_typeof(archs) != KVMEM_JSON_ARRAY || !arch)
			return kvmem_error(EINVAL, "%s: 'architectures' must be a list of names", name);
		if (strcmp(arch, QWEN3_ARCH))
			return kvmem_error(EINVAL, "%s: architecture '%.60s' is not supported (kvmem runs "
					 QWEN3_ARCH ")", name, arch);
	}
	if (kvmem_json_typeof(type) != KVMEM_JSON_NULL) {
		const char *t = kvmem_json_str(type, NULL);

		if (!t)
			return kvmem_error(EINVAL, "%s: 'model_type' must be a string", name);
		if (strcmp(t, "qwen3"))
			return kvmem_error(EINVAL, "%s: model_type '%.60s' is not supported (kvmem runs qwen3)",
					 name, t);
	} else if (!arch) {
		return kvmem_error(EINVAL, "%s: neither 'architectures' nor 'model_type' is given, so this "
				 "is not known to be a Qwen3 model", name);
	}
	snprintf(c->arch, sizeof(c->arch), "%s", QWEN3_ARCH);
	return 0;
}

/* rope_theta may be at the top (transformers 4) or in rope_parameters (5);
 * any scaling other than "default" changes the rotation: refuse it. */
static int read_rope(kvmem_config *c, const kvmem_json *root, const char *name)
{
	static const char *const blocks[] = { "rope_scaling", "rope_parameters" };
	double top, inner = NAN;

	for (int i = 0; i < 2; i++) {
		const kvmem_json *b = kvmem_json_get(root, blocks[i]);
		const kvmem_json *type;
		const char *t;

		if (kvmem_json_typeof(b) == KVMEM_JSON_NULL)
			continue;
		if (kvmem_json_typeof(b) != KVMEM_JSON_OBJECT)
			return kvmem_error(EINVAL, "%s: '%s' must be an object or null", name, blocks[i]);
		type = kvmem_json_get(b, "rope_type");
		if (!type)
			type = kvmem_json_get(b, "type");
		t = kvmem_json_str(type, "default");
		if (strcmp(t, "default"))
			return kvmem_error(EINVAL, "%s: %s of type '%.40s' is not supported (kvmem implements "
					 "plain RoPE)", name, blocks[i], t);
		if (kvmem_json_get(b, "rope_theta") && read_num(b, "rope_theta", NAN, &inner, name))
			return -1;
	}
	if (read_num(root, "rope_theta", NAN, &top, name))
		return -1;
	if (!isnan(top) && !isnan(inner) && top != inner)
		return kvmem_error(EINVAL, "%s: rope_theta %g and rope_parameters.rope_theta %g disagree", name,
				 top, inner);
	c->rope_theta = !isnan(top) ? top : !isnan(inner) ? inner : 10000.0;
	return 0;
}

/* Features Qwen3 configs can switch on that the engine does not have. */
static int refuse_unsupported(const kvmem_json *root, const char *name)
{
	const kvmem_json *act = kvmem_json_get(root, "hidden_act");
	const kvmem_json *types = kvmem_json_get(root, "layer_types");
	int flag;

	if (act && strcmp(kvmem_json_str(act, "?"), "silu"))
		return kvmem_error(EINVAL, "%s: hidden_act '%.40s' is not supported (kvmem runs silu)", name,
				 kvmem_json_str(act, kvmem_json_type_name(act)));
	if (read_bool(root, "attention_bias", 0, &flag, name))
		return -1;
	if (flag)
		return kvmem_error(EINVAL, "%s: attention_bias true is not supported (Qwen3 has no attention "
				 "biases)", name);
	if (read_bool(root, "use_sliding_window", 0, &flag, name))
		return -1;
	if (flag)
		return kvmem_error(EINVAL, "%s: use_sliding_window true is not supported (kvmem runs full "
				 "attention in every layer)", name);
	for (size_t i = 0; i < kvmem_json_len(types); i++) {
		const char *t = kvmem_json_str(kvmem_json_at(types, i), "?");

		if (strcmp(t, "full_attention"))
			return kvmem_error(EINVAL, "%s: layer_types[%zu] is '%.40s'; kvmem runs full_attention "
					 "only", name, i, t);
	}
	return 0;
}

int kvmem_config_parse(kvmem_config *c, const char *json, size_t len, const char *name)
{
	kvmem_json *root;
	const kvmem_json *dt;
	double eps;
	int rc = -1;

	memset(c, 0, sizeof(*c));
	if (!name)
		name = "config.json";
	root = kvmem_json_parse(json, len, name);
	if (!root)
		return -1;
	if (kvmem_json_typeof(root) != KVMEM_JSON_OBJECT) {
		kvmem_error(EINVAL, "%s: expected a JSON object, found %s", name, kvmem_json_type_name(root));
		goto out;
	}
	if (kvmem_mf_refuse_nul(root, name))
		goto out;
	if (check_family(c, root, name) || refuse_unsupported(root, name) ||
	    read_int(root, "num_hidden_layers", 1, 0, &c->n_layers, name) ||
	    read_int(root, "hidden_size", 1, 0, &c->hidden, name) ||
	    read_int(root, "num_attention_heads", 1, 0, &c->n_heads, name) ||
	    read_int(root, "num_key_value_heads", 0, c->n_heads, &c->n_kv_heads, name) ||
	    read_int(root, "head_dim", 0, c->n_heads > 0 ? c->hidden / c->n_heads : 0,
		     &c->head_dim, name) ||
	    read_int(root, "intermediate_size", 1, 0, &c->intermediate, name) ||
	    read_int(root, "vocab_size", 1, 0, &c->vocab, name) ||
	    read_int(root, "max_position_embeddings", 0, 32768, &c->max_position, name) ||
	    read_num(root, "rms_norm_eps", 1e-6, &eps, name) ||
	    read_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings, name) ||
	    read_token(root, "bos_token_id", &c->bos_id, name) ||
	    read_token(root, "eos_token_id", &c->eos_id, name) || read_rope(c, root, name))
		goto out;
	c->rms_eps = (float)eps;
	dt = kvmem_json_get(root, "torch_dtype");
	if (!dt)
		dt = kvmem_json_get(root, "dtype");
	snprintf(c->dtype, sizeof(c->dtype), "%s", kvmem_json_str(dt, ""));
	rc = kvmem_config_validate(c, name);
out:
	kvmem_json_free(root);
	return rc;
}

int kvmem_config_load(kvmem_config *c, const char *dir)
{
	char path[4200];
	struct stat st;
	char *text;
	size_t len;
	int rc;

	memset(c, 0, sizeof(*c));
	/* Say what is wrong with the directory, not only with the file. */
	if (stat(dir, &st))
		return kvmem_error(errno, "%s: %s", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return kvmem_error(EINVAL, "%s: not a directory (a model is a directory holding config.json "
				 "and *.safetensors)", dir);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	if (!kvmem_mf_exists(path))
		return kvmem_error(ENOENT, "%s: no config.json here: not a Hugging Face model directory",
				 dir);
	/* Not a FIFO, a device or a dangling link; 16 MB is far above any
	 * real config. */
	rc = kvmem_mf_read(path, 16u << 20, &text, &len);
	if (rc < 0)
		return rc;
	rc = kvmem_config_parse(c, text, len, path);
	free(text);
	return rc;
}

static int bound(int v, int lo, int hi, const char *key, const char *name)
{
	if (v < lo || v > hi)
		return kvmem_error(EINVAL, "%s: %s is %d; kvmem needs %d..%d", name, key, v, lo, hi);
	return 0;
}

int kvmem_config_validate(const kvmem_config *c, const char *name)
{
	if (!name)
		name = "config";
	if (bound(c->n_layers, 1, 1024, "num_hidden_layers", name) ||
	    bound(c->hidden, 1, 1 << 20, "hidden_size", name) ||
	    bound(c->n_heads, 1, 1024, "num_attention_heads", name) ||
	    bound(c->n_kv_heads, 1, 1024, "num_key_value_heads", name) ||
	    bound(c->head_dim, 2, 1024, "head_dim", name) ||
	    bound(c->intermediate, 1, 1 << 20, "intermediate_size", name) ||
	    bound(c->vocab, 1, 1 << 24, "vocab_size", name) ||
	    bound(c->max_position, 1, 1 << 30, "max_position_embeddings", name))
		return -1;
	if (c->head_dim % 2)
		return kvmem_error(EINVAL, "%s: head_dim %d must be even (RoPE turns pairs of dimensions)",
				 name, c->head_dim);
	if (c->n_heads % c->n_kv_heads)
		return kvmem_error(EINVAL, "%s: num_key_value_heads %d does not divide num_attention_heads %d",
				 name, c->n_kv_heads, c->n_heads);
	if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
		return kvmem_error(EINVAL, "%s: rope_theta %g must be positive and finite", name, c->rope_theta);
	if (!(c->rms_eps > 0) || !isfinite(c->rms_eps))
		return kvmem_error(EINVAL, "%s: rms_norm_eps %g must be positive and finite", name,
				 (double)c->rms_eps);
	if (c->bos_id < -1 || c->bos_id >= c->vocab)
		return kvmem_error(EINVAL, "%s: bos_token_id %d is outside the vocabulary (%d)", name,
				 c->bos_id, c->vocab);
	if (c->eos_id < -1 || c->eos_id >= c->vocab)
		return kvmem_error(EINVAL, "%s: eos_token_id %d is outside the vocabulary (%d)", name,
				 c->eos_id, c->vocab);
	return 0;
}

uint64_t kvmem_config_params(const kvmem_config *c)
{
	uint64_t n = 0;
	struct kvmem_tensor_spec t;

	for (size_t i = 0; i < kvmem_tensor_count(c); i++) {
		kvmem_tensor_spec(c, i, &t);
		n += (uint64_t)t.shape[0] * (t.ndim == 2 ? (uint64_t)t.shape[1] : 1);
	}
	return n;
}

uint64_t kvmem_config_kv_bytes_per_token(const kvmem_config *c, int elem_bytes)
{
	return 2ull * (uint64_t)c->n_layers * (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim *
	       (uint64_t)elem_bytes;
}

const char *kvmem_config_st_dtype(const kvmem_config *c)
{
	if (!strcmp(c->dtype, "bfloat16"))
		return "BF16";
	if (!strcmp(c->dtype, "float16"))
		return "F16";
	if (!strcmp(c->dtype, "float32"))
		return "F32";
	return "?";
}

void kvmem_fingerprint_head(FILE *f, const kvmem_config *c)
{
	fprintf(f, "kvmem-model-v1\narch %s\nlayers %d\nhidden %d\nheads %d\nkv_heads %d\n"
		   "head_dim %d\nintermediate %d\nvocab %d\nrope_theta %.17g\nrms_eps %.9g\n"
		   "tied %d\n", c->arch, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads,
		c->head_dim, c->intermediate, c->vocab, c->rope_theta, (double)c->rms_eps,
		c->tie_embeddings ? 1 : 0);
}

void kvmem_fingerprint_tensor(FILE *f, const char *name, const char *dtype, int ndim,
			    const int64_t *shape)
{
	fprintf(f, "%s %s [", name, dtype);
	for (int d = 0; d < ndim; d++)
		fprintf(f, "%s%lld", d ? ", " : "", (long long)shape[d]);
	fputc(']', f);
}

uint64_t kvmem_config_fingerprint(const kvmem_config *c)
{
	struct kvmem_tensor_spec t;
	char *text = NULL;
	size_t len = 0;
	uint64_t h;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return 0;
	kvmem_fingerprint_head(f, c);
	for (size_t i = 0; i < kvmem_tensor_count(c); i++) {
		kvmem_tensor_spec(c, i, &t);
		kvmem_fingerprint_tensor(f, t.name, kvmem_config_st_dtype(c), t.ndim, t.shape);
		fputc('\n', f);
	}
	fclose(f);
	h = XXH64(text, len, 0);
	free(text);
	return h;
}
