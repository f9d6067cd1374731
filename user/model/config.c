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

/* A member that is absent or null: the default applies. */
static int absent(const json_t *v)
{
	return !v || json_is_null(v);
}

/* An integer member: absent or null gives def (or an error if required). */
static int read_int(const json_t *root, const char *key, int required, int def, int *out,
		    const char *name)
{
	const json_t *v = json_object_get(root, key);
	json_int_t n;

	if (absent(v)) {
		if (required)
			return kvmem_error(EINVAL, "%s: missing '%s'", name, key);
		*out = def;
		return 0;
	}
	if (!json_is_integer(v))
		return kvmem_error(EINVAL, "%s: '%s' must be an integer, found %s", name, key,
				   kvmem_json_type_name(v));
	n = json_integer_value(v);
	if (n < INT_MIN || n > INT_MAX)
		return kvmem_error(EINVAL, "%s: '%s' is %lld, out of range", name, key, (long long)n);
	*out = (int)n;
	return 0;
}

static int read_num(const json_t *root, const char *key, double def, double *out,
		    const char *name)
{
	const json_t *v = json_object_get(root, key);

	if (absent(v)) {
		*out = def;
		return 0;
	}
	if (!json_is_number(v))
		return kvmem_error(EINVAL, "%s: '%s' must be a number, found %s", name, key,
				   kvmem_json_type_name(v));
	*out = json_number_value(v);
	return 0;
}

static int read_bool(const json_t *root, const char *key, int def, int *out, const char *name)
{
	const json_t *v = json_object_get(root, key);

	if (absent(v)) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return kvmem_error(EINVAL, "%s: '%s' must be true or false, found %s", name, key,
				   kvmem_json_type_name(v));
	*out = json_is_true(v);
	return 0;
}

/* bos/eos: an id, null, or a list whose first id counts. */
static int read_token(const json_t *root, const char *key, int *out, const char *name)
{
	const json_t *v = json_object_get(root, key);

	if (json_is_array(v))
		v = json_array_get(v, 0);
	if (absent(v)) {
		*out = -1;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
		return kvmem_error(EINVAL, "%s: '%s' must be a token id, found %s", name, key,
				   kvmem_json_type_name(v));
	*out = (int)json_integer_value(v);
	return 0;
}

static int check_family(kvmem_config *c, const json_t *root, const char *name)
{
	const json_t *archs = json_object_get(root, "architectures");
	const json_t *type = json_object_get(root, "model_type");
	const char *arch = NULL;

	if (!absent(archs)) {
		arch = json_string_value(json_array_get(archs, 0));
		if (!arch)
			return kvmem_error(EINVAL, "%s: 'architectures' must be a list of names", name);
		if (strcmp(arch, QWEN3_ARCH))
			return kvmem_error(EINVAL, "%s: architecture '%.60s' is not supported (kvmem runs "
					 QWEN3_ARCH ")", name, arch);
	}
	if (!absent(type)) {
		const char *t = json_string_value(type);

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
static int read_rope(kvmem_config *c, const json_t *root, const char *name)
{
	static const char *const blocks[] = { "rope_scaling", "rope_parameters" };
	double top, inner = NAN;
	int rc;

	for (int i = 0; i < 2; i++) {
		const json_t *b = json_object_get(root, blocks[i]);
		const json_t *type;
		const char *t;

		if (absent(b))
			continue;
		if (!json_is_object(b))
			return kvmem_error(EINVAL, "%s: '%s' must be an object or null", name, blocks[i]);
		type = json_object_get(b, "rope_type");
		if (!type)
			type = json_object_get(b, "type");
		t = json_is_string(type) ? json_string_value(type) : "default";
		if (strcmp(t, "default"))
			return kvmem_error(EINVAL, "%s: %s of type '%.40s' is not supported (kvmem implements "
					 "plain RoPE)", name, blocks[i], t);
		if (json_object_get(b, "rope_theta") && (rc = read_num(b, "rope_theta", NAN, &inner, name)))
			return rc;
	}
	if ((rc = read_num(root, "rope_theta", NAN, &top, name)))
		return rc;
	if (!isnan(top) && !isnan(inner) && top != inner)
		return kvmem_error(EINVAL, "%s: rope_theta %g and rope_parameters.rope_theta %g disagree", name,
				 top, inner);
	c->rope_theta = !isnan(top) ? top : !isnan(inner) ? inner : 10000.0;
	return 0;
}

/* Features Qwen3 configs can switch on that the engine does not have. */
static int refuse_unsupported(const json_t *root, const char *name)
{
	const json_t *act = json_object_get(root, "hidden_act");
	const json_t *types = json_object_get(root, "layer_types");
	int flag, rc;

	if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
		return kvmem_error(EINVAL, "%s: hidden_act '%.40s' is not supported (kvmem runs silu)", name,
				   json_is_string(act) ? json_string_value(act) : kvmem_json_type_name(act));
	if ((rc = read_bool(root, "attention_bias", 0, &flag, name)))
		return rc;
	if (flag)
		return kvmem_error(EINVAL, "%s: attention_bias true is not supported (Qwen3 has no attention "
				 "biases)", name);
	if ((rc = read_bool(root, "use_sliding_window", 0, &flag, name)))
		return rc;
	if (flag)
		return kvmem_error(EINVAL, "%s: use_sliding_window true is not supported (kvmem runs full "
				 "attention in every layer)", name);
	for (size_t i = 0; i < json_array_size(types); i++) {
		const char *t = json_string_value(json_array_get(types, i));

		if (!t || strcmp(t, "full_attention"))
			return kvmem_error(EINVAL, "%s: layer_types[%zu] is '%.40s'; kvmem runs full_attention "
					 "only", name, i, t ? t : "?");
	}
	return 0;
}

int kvmem_config_parse(kvmem_config *c, const char *json, size_t len, const char *name)
{
	json_t *root;
	const json_t *dt;
	double eps;
	int rc;

	memset(c, 0, sizeof(*c));
	if (!name)
		name = "config.json";
	if ((rc = kvmem_json_load(json, len, name, &root)) < 0)
		return rc;
	if (!json_is_object(root)) {
		rc = kvmem_error(EINVAL, "%s: expected a JSON object, found %s", name,
				 kvmem_json_type_name(root));
		goto out;
	}
	if ((rc = check_family(c, root, name)) || (rc = refuse_unsupported(root, name)) ||
	    (rc = read_int(root, "num_hidden_layers", 1, 0, &c->n_layers, name)) ||
	    (rc = read_int(root, "hidden_size", 1, 0, &c->hidden, name)) ||
	    (rc = read_int(root, "num_attention_heads", 1, 0, &c->n_heads, name)) ||
	    (rc = read_int(root, "num_key_value_heads", 0, c->n_heads, &c->n_kv_heads, name)) ||
	    (rc = read_int(root, "head_dim", 0, c->n_heads > 0 ? c->hidden / c->n_heads : 0,
			   &c->head_dim, name)) ||
	    (rc = read_int(root, "intermediate_size", 1, 0, &c->intermediate, name)) ||
	    (rc = read_int(root, "vocab_size", 1, 0, &c->vocab, name)) ||
	    (rc = read_int(root, "max_position_embeddings", 0, 32768, &c->max_position, name)) ||
	    (rc = read_num(root, "rms_norm_eps", 1e-6, &eps, name)) ||
	    (rc = read_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings, name)) ||
	    (rc = read_token(root, "bos_token_id", &c->bos_id, name)) ||
	    (rc = read_token(root, "eos_token_id", &c->eos_id, name)) || (rc = read_rope(c, root, name)))
		goto out;
	c->rms_eps = (float)eps;
	dt = json_object_get(root, "torch_dtype");
	if (!dt)
		dt = json_object_get(root, "dtype");
	snprintf(c->dtype, sizeof(c->dtype), "%s", json_is_string(dt) ? json_string_value(dt) : "");
	rc = kvmem_config_validate(c, name);
out:
	json_decref(root);
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
		return kvmem_error(ENOTDIR, "%s: not a directory (a model is a directory holding config.json "
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
	int rc;

	if (!name)
		name = "config";
	if ((rc = bound(c->n_layers, 1, 1024, "num_hidden_layers", name)) ||
	    (rc = bound(c->hidden, 1, 1 << 20, "hidden_size", name)) ||
	    (rc = bound(c->n_heads, 1, 1024, "num_attention_heads", name)) ||
	    (rc = bound(c->n_kv_heads, 1, 1024, "num_key_value_heads", name)) ||
	    (rc = bound(c->head_dim, 2, 1024, "head_dim", name)) ||
	    (rc = bound(c->intermediate, 1, 1 << 20, "intermediate_size", name)) ||
	    (rc = bound(c->vocab, 1, 1 << 24, "vocab_size", name)) ||
	    (rc = bound(c->max_position, 1, 1 << 30, "max_position_embeddings", name)))
		return rc;
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
