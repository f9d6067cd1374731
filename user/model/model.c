// SPDX-License-Identifier: MIT
/*
 * Loading a Hugging Face model directory: config.json, then the tensors
 * from model.safetensors or from the shards model.safetensors.index.json
 * lists. Every tensor the config implies is checked (present, shape, dtype)
 * and every stray one under model./lm_head refused before any weight is
 * converted, so a bad directory costs no time and leaks nothing.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "model/digest.h"
#include "model/modelfile.h"
#include "model/safetensors.h"
#include "model/tensors.h"
#include "util/json.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define HUGE_FROM (2u << 20)

struct priv {
	kvmem_st_file **files;
	bool *keep;		/* a file some tensor is used in place from */
	int nfiles;
	json_t *index;		/* the shard index, when there is one */
	char index_path[4200];
	void **bufs;		/* converted tensors */
	size_t nbufs;
};

/* The tensor for `name` and the file holding it: via the index's
 * weight_map when sharded, else in the single file. */
static const kvmem_st_tensor *locate(const struct priv *p, const char *name, int *file)
{
	if (p->index) {
		const char *fname = json_string_value(json_object_get(json_object_get(p->index,
										      "weight_map"), name));

		for (int i = 0; fname && i < p->nfiles; i++) {
			const char *path = kvmem_st_path(p->files[i]);
			size_t pl = strlen(path), fl = strlen(fname);

			if (pl > fl && path[pl - fl - 1] == '/' && !strcmp(path + pl - fl, fname)) {
				*file = i;
				return kvmem_st_find(p->files[i], name);
			}
		}
		return NULL;
	}
	*file = 0;
	return kvmem_st_find(p->files[0], name);
}

static int add_file(struct priv *p, const char *path)
{
	kvmem_st_file **f = realloc(p->files, (size_t)(p->nfiles + 1) * sizeof(*f));
	bool *k;
	int rc;

	if (!f)
		return kvmem_error(ENOMEM, "%s: out of memory", path);
	p->files = f;
	k = realloc(p->keep, (size_t)(p->nfiles + 1) * sizeof(*k));
	if (!k)
		return kvmem_error(ENOMEM, "%s: out of memory", path);
	p->keep = k;
	if ((rc = kvmem_st_open(path, &p->files[p->nfiles])))
		return rc;
	p->keep[p->nfiles++] = false;
	return 0;
}

/* Open every shard the index names and check the index against them. */
static int open_shards(struct priv *p, const char *dir)
{
	json_t *wm, *file;
	const char *tensor;
	char *text;
	size_t len;
	int rc;

	if ((rc = kvmem_mf_read(p->index_path, 64u << 20, &text, &len)) < 0)
		return rc;
	rc = kvmem_json_load(text, len, p->index_path, &p->index);
	free(text);
	if (rc < 0)
		return rc;
	wm = json_object_get(p->index, "weight_map");
	if (!json_is_object(wm) || !json_object_size(wm))
		return kvmem_error(EINVAL, "%s: 'weight_map' must be a non-empty object of tensor -> file",
				 p->index_path);
	json_object_foreach(wm, tensor, file) {
		const char *fname = json_string_value(file);
		char path[8400];
		bool seen = false;

		if (!fname || !*fname || fname[0] == '.' || strchr(fname, '/'))
			return kvmem_error(EINVAL, "%s: weight_map entry '%s' must name a file in the model "
					 "directory", p->index_path, tensor);
		/* Seen when an earlier shard has this path (the shards are few). */
		for (int j = 0; j < p->nfiles && !seen; j++)
			seen = !strcmp(strrchr(kvmem_st_path(p->files[j]), '/') + 1, fname);
		if (seen)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, fname);
		if ((rc = add_file(p, path))) {
			char old[1024];

			snprintf(old, sizeof(old), "%s", kvmem_last_error());
			return kvmem_error(-rc, "%s (a shard listed in %s)", old, INDEX_NAME);
		}
	}
	/* Each listed tensor is where the index says; none is in two shards. */
	json_object_foreach(wm, tensor, file) {
		int f;

		if (!locate(p, tensor, &f))
			return kvmem_error(EINVAL, "%s: weight_map puts '%s' in %s, which does not hold it",
					 p->index_path, tensor, json_string_value(file));
	}
	for (int a = 0; a < p->nfiles; a++)
		for (size_t i = 0; i < kvmem_st_count(p->files[a]); i++) {
			const char *name = kvmem_st_at(p->files[a], i)->name;

			for (int b = a + 1; b < p->nfiles; b++)
				if (kvmem_st_find(p->files[b], name))
					return kvmem_error(EINVAL, "%s: tensor '%s' is in both %s and %s",
							 p->index_path, name, kvmem_st_path(p->files[a]),
							 kvmem_st_path(p->files[b]));
		}
	return 0;
}

/* Is `name` one this config implies? 1 yes, 0 not ours (ignored), -EINVAL
 * (a stray tensor where ours live: the config and files disagree). */
static int classify(const kvmem_config *c, const char *name, const char *file)
{
	const char *rest;
	char want[96];
	long layer;
	size_t n = strlen(name);

	if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "model.norm.weight"))
		return 1;
	if (!strcmp(name, "lm_head.weight"))
		return c->tie_embeddings ? 0 : 1;	/* tied: ignored, as transformers does */
	if (n >= 19 && !strcmp(name + n - 19, "rotary_emb.inv_freq"))
		return 0;	/* a buffer some exporters save; recomputed, never read */
	if (strncmp(name, "model.", 6) && strncmp(name, "lm_head", 7))
		return 0;
	if (!strncmp(name, "model.layers.", 13)) {
		layer = strtol(name + 13, (char **)&rest, 10);
		if (rest != name + 13 && *rest == '.' && layer >= c->n_layers)
			return kvmem_error(EINVAL, "%s: tensor '%s' is beyond num_hidden_layers %d in config.json",
					 file, name, c->n_layers);
		for (int r = KVMEM_T_ATTN_NORM; r <= KVMEM_T_DOWN; r++) {
			snprintf(want, sizeof(want), "model.layers.%ld.%s", layer,
				 kvmem_tensor_suffix((enum kvmem_tensor_role)r));
			if (rest != name + 13 && layer >= 0 && !strcmp(want, name))
				return 1;
		}
	}
	return kvmem_error(EINVAL, "%s: unexpected tensor '%s': a Qwen3 model as config.json describes it "
			 "has no such tensor%s", file, name,
			 n > 5 && !strcmp(name + n - 5, ".bias") ? " (biases are not supported)" : "");
}

static int check_tensor(const struct priv *p, const struct kvmem_tensor_spec *s,
			const kvmem_st_tensor *t, const char *file)
{
	char have[160], want[160];
	bool same = t->ndim == s->ndim;

	for (int d = 0; same && d < s->ndim; d++)
		same = t->shape[d] == s->shape[d];
	if (!same)
		return kvmem_error(EINVAL, "%s: tensor '%s' has shape %s, config.json implies %s", file, s->name,
				 kvmem_st_shape_str(have, sizeof(have), t->ndim, t->shape),
				 kvmem_st_shape_str(want, sizeof(want), s->ndim, s->shape));
	if (t->dtype != KVMEM_ST_BF16 && t->dtype != KVMEM_ST_F16 && t->dtype != KVMEM_ST_F32)
		return kvmem_error(EINVAL, "%s: tensor '%s' has dtype %s; kvmem reads BF16, F16 and F32", file,
				 s->name, kvmem_st_dtype_name(t->dtype));
	return 0;
}

/* All checks: every implied tensor present and right, nothing stray. */
static int check_all(kvmem_model *m, struct priv *p)
{
	const kvmem_config *c = &m->cfg;
	struct kvmem_tensor_spec s;
	int f, rc;

	for (size_t i = 0; i < kvmem_tensor_count(c); i++) {
		const kvmem_st_tensor *t;

		kvmem_tensor_spec(c, i, &s);
		t = locate(p, s.name, &f);
		if (!t)
			return kvmem_error(EINVAL, "%s: missing tensor '%s'%s",
					 p->index ? p->index_path : kvmem_st_path(p->files[0]), s.name,
					 s.role == KVMEM_T_LM_HEAD ? " (config.json has tie_word_embeddings "
								   "false)" : "");
		if ((rc = check_tensor(p, &s, t, kvmem_st_path(p->files[f]))))
			return rc;
	}
	for (f = 0; f < p->nfiles; f++)
		for (size_t i = 0; i < kvmem_st_count(p->files[f]); i++)
			if ((rc = classify(c, kvmem_st_at(p->files[f], i)->name, kvmem_st_path(p->files[f]))) < 0)
				return rc;
	return 0;
}

/*
 * The model fingerprint (model.h) from every byte of every tensor the config
 * implies, and the refusal of non-finite weights, in one pass over the
 * files (or none, when the digest cache knows them).
 */
static int fingerprint(kvmem_model *m, struct priv *p)
{
	struct kvmem_tensor_digest **dig = calloc((size_t)p->nfiles + 1, sizeof(*dig));
	struct kvmem_tensor_spec s;
	char *text = NULL;
	size_t len = 0;
	int dtype = -1, f, rc;
	FILE *out = NULL;

	if (!dig)
		return kvmem_error(ENOMEM, "%s: out of memory", m->dir);
	for (f = 0; f < p->nfiles; f++) {
		uint64_t hashed;

		dig[f] = calloc(kvmem_st_count(p->files[f]) + 1, sizeof(**dig));
		if (!dig[f]) {
			rc = kvmem_error(ENOMEM, "%s: out of memory", m->dir);
			goto out;
		}
		kvmem_digest_file(p->files[f], dig[f], &hashed);
		m->hashed_bytes += hashed;
	}
	out = open_memstream(&text, &len);
	if (!out) {
		rc = kvmem_error(ENOMEM, "%s: out of memory", m->dir);
		goto out;
	}
	kvmem_fingerprint_head(out, &m->cfg);
	for (size_t i = 0; i < kvmem_tensor_count(&m->cfg); i++) {
		const kvmem_st_tensor *t;
		const struct kvmem_tensor_digest *d;

		kvmem_tensor_spec(&m->cfg, i, &s);
		t = locate(p, s.name, &f);
		d = &dig[f][t - kvmem_st_at(p->files[f], 0)];
		if (d->nonfinite) {
			rc = kvmem_error(EINVAL, "%s: tensor '%s' holds %llu NaN or infinite value%s; a model "
				    "with non-finite weights computes nothing meaningful", kvmem_st_path(p->files[f]),
				    s.name, (unsigned long long)d->nonfinite, d->nonfinite == 1 ? "" : "s");
			goto out;
		}
		dtype = dtype == -1 || dtype == (int)t->dtype ? (int)t->dtype : -2;
		kvmem_fingerprint_tensor(out, s.name, kvmem_st_dtype_name(t->dtype), t->ndim, t->shape);
		fprintf(out, " %016llx\n", (unsigned long long)d->hash);
	}
	if (fclose(out)) {
		out = NULL;
		rc = kvmem_error(ENOMEM, "%s: out of memory", m->dir);
		goto out;
	}
	out = NULL;
	m->fingerprint = XXH64(text, len, 0);
	snprintf(m->weight_dtype, sizeof(m->weight_dtype), "%s",
		 dtype >= 0 ? kvmem_st_dtype_name((kvmem_st_dtype)dtype) : "mixed");
	m->n_files = p->nfiles;
	for (f = 0; f < p->nfiles; f++)
		m->file_bytes += kvmem_st_file_size(p->files[f]);
	rc = 0;
out:
	if (out)
		fclose(out);
	free(text);
	for (f = 0; f < p->nfiles; f++)
		free(dig[f]);
	free(dig);
	return rc;
}

/* fp32 buffer for n values: 64-byte aligned; big ones on 2 MB boundaries
 * and in huge pages where the kernel offers them (a 4 KB page fault per
 * 1000 weights costs more than converting them). */
static float *alloc_f32(size_t n)
{
	size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
	void *p = NULL;

	if (bytes < HUGE_FROM)
		return aligned_alloc(64, bytes ? bytes : 64);
	if (posix_memalign(&p, HUGE_FROM, bytes))
		return NULL;
	madvise(p, bytes & ~(size_t)(HUGE_FROM - 1), MADV_HUGEPAGE);
	return p;
}

/* fp32 copy of a stored tensor (any alignment). */
static float *convert(const kvmem_st_tensor *t)
{
	enum { CHUNK = 1 << 20 };
	size_t n = t->numel;
	float *dst = alloc_f32(n);
	size_t nchunks = (n + CHUNK - 1) / CHUNK;
	int aligned = ((uintptr_t)t->data & (kvmem_st_dtype_size(t->dtype) - 1)) == 0;

	if (!dst)
		return NULL;
	if (t->dtype == KVMEM_ST_F32 || !aligned) {
		/* memcpy has no alignment needs: F32, or 16-bit data at an odd
		 * address, copied as they are first. */
		memcpy(dst, t->data, t->nbytes);
		if (t->dtype == KVMEM_ST_F32)
			return dst;
		/* Widen in place from the back, so no element is overwritten
		 * before it is read. */
		for (size_t i = n; i-- > 0;) {
			uint16_t h;

			memcpy(&h, (const char *)dst + 2 * i, 2);
			dst[i] = t->dtype == KVMEM_ST_BF16 ? kvmem_bf16_to_f32(h) : kvmem_f16_to_f32(h);
		}
		return dst;
	}
	#pragma omp parallel for schedule(dynamic)
	for (size_t c = 0; c < nchunks; c++) {
		size_t b = c * CHUNK, k = n - b < CHUNK ? n - b : CHUNK;
		const uint16_t *src = (const uint16_t *)t->data + b;

		if (t->dtype == KVMEM_ST_BF16)
			kvmem_bf16_to_f32_n(dst + b, src, k);
		else
			kvmem_f16_to_f32_n(dst + b, src, k);
	}
	return dst;
}

static int check_memory(const kvmem_model *m, const struct priv *p)
{
	uint64_t need = 0, have = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	struct kvmem_tensor_spec s;
	int f;

	for (size_t i = 0; i < kvmem_tensor_count(&m->cfg); i++) {
		const kvmem_st_tensor *t;

		kvmem_tensor_spec(&m->cfg, i, &s);
		t = locate(p, s.name, &f);
		if (t->dtype != KVMEM_ST_F32 || ((uintptr_t)t->data & 3))
			need += t->numel * sizeof(float);
	}
	if (have && need > have)
		return kvmem_error(ENOMEM, "%s: the weights need %.1f GB as fp32 but this machine has %.1f GB "
				 "of memory", m->dir, need / 1e9, have / 1e9);
	return 0;
}

static int materialise(kvmem_model *m, struct priv *p)
{
	const kvmem_config *c = &m->cfg;
	struct kvmem_tensor_spec s;
	int f, rc;

	if ((rc = check_memory(m, p)))
		return rc;
	m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
	p->bufs = calloc(kvmem_tensor_count(c), sizeof(*p->bufs));
	if (!m->layers || !p->bufs)
		return kvmem_error(ENOMEM, "%s: out of memory", m->dir);
	for (size_t i = 0; i < kvmem_tensor_count(c); i++) {
		const kvmem_st_tensor *t;
		const float *w;

		kvmem_tensor_spec(c, i, &s);
		t = locate(p, s.name, &f);
		if (t->dtype == KVMEM_ST_F32 && !((uintptr_t)t->data & 3)) {
			w = t->data;	/* used in place: keep the mapping */
			p->keep[f] = true;
		} else {
			float *buf = convert(t);

			if (!buf)
				return kvmem_error(ENOMEM, "%s: out of memory converting '%s' (%llu values)",
						 m->dir, s.name, (unsigned long long)t->numel);
			p->bufs[p->nbufs++] = buf;
			w = buf;
		}
		switch (s.role) {
		case KVMEM_T_EMBED: m->embed = w; break;
		case KVMEM_T_FINAL_NORM: m->final_norm = w; break;
		case KVMEM_T_LM_HEAD: m->lm_head = w; break;
		case KVMEM_T_ATTN_NORM: m->layers[s.layer].attn_norm = w; break;
		case KVMEM_T_WQ: m->layers[s.layer].wq = w; break;
		case KVMEM_T_WK: m->layers[s.layer].wk = w; break;
		case KVMEM_T_WV: m->layers[s.layer].wv = w; break;
		case KVMEM_T_WO: m->layers[s.layer].wo = w; break;
		case KVMEM_T_Q_NORM: m->layers[s.layer].q_norm = w; break;
		case KVMEM_T_K_NORM: m->layers[s.layer].k_norm = w; break;
		case KVMEM_T_MLP_NORM: m->layers[s.layer].mlp_norm = w; break;
		case KVMEM_T_GATE: m->layers[s.layer].w_gate = w; break;
		case KVMEM_T_UP: m->layers[s.layer].w_up = w; break;
		case KVMEM_T_DOWN: m->layers[s.layer].w_down = w; break;
		}
	}
	if (c->tie_embeddings)
		m->lm_head = m->embed;
	return 0;
}

int kvmem_model_open(const char *dir, int flags, kvmem_model **out)
{
	kvmem_model *m = calloc(1, sizeof(*m));
	struct priv *p = calloc(1, sizeof(*p));
	char path[4200];
	int rc;

	*out = NULL;
	if (!m || !p) {
		free(m);
		free(p);
		return kvmem_error(ENOMEM, "%s: out of memory", dir);
	}
	m->priv = p;
	snprintf(m->dir, sizeof(m->dir), "%s", dir);
	if (strlen(dir) >= sizeof(m->dir)) {
		rc = kvmem_error(ENAMETOOLONG, "%.100s...: path too long", dir);
		goto fail;
	}
	if ((rc = kvmem_config_load(&m->cfg, dir)))
		goto fail;
	snprintf(p->index_path, sizeof(p->index_path), "%s/" INDEX_NAME, dir);
	snprintf(path, sizeof(path), "%s/" SINGLE_NAME, dir);
	/* Anything there counts, a dangling link too: opening it says what
	 * is wrong, where "neither ... nor" would mislead. */
	if (kvmem_mf_exists(p->index_path))
		rc = open_shards(p, dir);
	else if (kvmem_mf_exists(path))
		rc = add_file(p, path);
	else
		rc = kvmem_error(ENOENT, "%s: holds config.json but neither " SINGLE_NAME " nor "
				 INDEX_NAME, dir);
	if (rc || (rc = check_all(m, p)) || (rc = fingerprint(m, p)))
		goto fail;
	if (!(flags & KVMEM_MODEL_NO_WEIGHTS) && (rc = materialise(m, p)))
		goto fail;
	/* Files nothing points into any more are unmapped now. */
	for (int f = 0; f < p->nfiles; f++)
		if (!p->keep[f]) {
			kvmem_st_close(p->files[f]);
			p->files[f] = NULL;
		}
	json_decref(p->index);
	p->index = NULL;
	*out = m;
	return 0;
fail:
	kvmem_model_free(m);
	return rc;
}

int kvmem_model_load(const char *dir, kvmem_model **out)
{
	return kvmem_model_open(dir, 0, out);
}

void kvmem_model_free(kvmem_model *m)
{
	struct priv *p;

	if (!m)
		return;
	p = m->priv;
	if (p) {
		for (int f = 0; f < p->nfiles; f++)
			kvmem_st_close(p->files[f]);
		for (size_t i = 0; i < p->nbufs; i++)
			free(p->bufs[i]);
		json_decref(p->index);
		free(p->files);
		free(p->keep);
		free(p->bufs);
		free(p);
	}
	free(m->layers);
	free(m);
}
