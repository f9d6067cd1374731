// SPDX-License-Identifier: MIT
/*
 * The random-model generator: a Qwen3-shaped model directory whose weights
 * come from a seed. Tensors are streamed to disk a buffer at a time, so a
 * 32b model needs tens of megabytes of memory, not 65 GB.
 *
 * Every tensor is cut into fixed chunks of CHUNK values; a chunk's values
 * come from its own splitmix64 stream keyed by (seed, tensor, chunk), so
 * chunks can be filled in parallel and the bytes never depend on threads.
 * Normal values come from Marsaglia's polar method (rejection keeps the
 * stream deterministic: it depends only on the stream's own numbers).
 */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "model/hfwrite.h"
#include "model/safetensors.h"
#include "model/tensors.h"
#include "util/fs.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data are little-endian; the generator writes host order"
#endif

#define CHUNK 16384		/* values per random stream */
#define BUF_CHUNKS 256		/* chunks per write: 4M values */

struct plan {
	kvmem_config c;		/* dtype set to what is written */
	kvmem_st_dtype dt;
	size_t n;
	struct kvmem_tensor_spec *t;
	int *shard_of;
	int nshards;
	uint64_t data_bytes;	/* all tensors, all shards */
};

static void plan_free(struct plan *p)
{
	free(p->t);
	free(p->shard_of);
}

static int plan_make(struct plan *p, const kvmem_config *c, const kvmem_gen_opts *o)
{
	const char *dt = o && o->dtype ? o->dtype : "bf16";
	uint64_t in_shard = 0, shard_bytes = o ? o->shard_bytes : 0;
	int rc;

	memset(p, 0, sizeof(*p));
	if ((rc = kvmem_config_validate(c, "generate")))
		return rc;
	p->c = *c;
	if (!strcmp(dt, "bf16")) {
		p->dt = KVMEM_ST_BF16;
		snprintf(p->c.dtype, sizeof(p->c.dtype), "bfloat16");
	} else if (!strcmp(dt, "f16")) {
		p->dt = KVMEM_ST_F16;
		snprintf(p->c.dtype, sizeof(p->c.dtype), "float16");
	} else if (!strcmp(dt, "f32")) {
		p->dt = KVMEM_ST_F32;
		snprintf(p->c.dtype, sizeof(p->c.dtype), "float32");
	} else {
		return kvmem_error(EINVAL, "generate: dtype '%s' is not one of bf16, f16, f32", dt);
	}
	p->n = kvmem_tensor_count(c);
	p->t = calloc(p->n, sizeof(*p->t));
	p->shard_of = calloc(p->n, sizeof(*p->shard_of));
	if (!p->t || !p->shard_of) {
		plan_free(p);
		return kvmem_error(ENOMEM, "generate: out of memory");
	}
	p->nshards = 1;
	for (size_t i = 0; i < p->n; i++) {
		uint64_t b;

		kvmem_tensor_spec(c, i, &p->t[i]);
		b = (uint64_t)p->t[i].shape[0] * (p->t[i].ndim == 2 ? (uint64_t)p->t[i].shape[1] : 1) *
		    kvmem_st_dtype_size(p->dt);
		if (shard_bytes && in_shard && in_shard + b > shard_bytes) {
			p->nshards++;
			in_shard = 0;
		}
		in_shard += b;
		p->shard_of[i] = p->nshards - 1;
		p->data_bytes += b;
	}
	return 0;
}

/* A writer with shard s's tensors declared (not begun). */
static kvmem_st_writer *shard_writer(const struct plan *p, int s, uint64_t seed)
{
	kvmem_st_writer *w = kvmem_st_writer_new();
	char gen[96];

	if (!w)
		return NULL;
	snprintf(gen, sizeof(gen), "kvmem %s, seed %llu", KVMEM_VERSION, (unsigned long long)seed);
	/* transformers refuses safetensors files without format "pt" */
	if (kvmem_st_writer_meta(w, "format", "pt") || kvmem_st_writer_meta(w, "generator", gen))
		goto fail;
	for (size_t i = 0; i < p->n; i++)
		if (p->shard_of[i] == s &&
		    kvmem_st_writer_add(w, p->t[i].name, p->dt, p->t[i].ndim, p->t[i].shape))
			goto fail;
	return w;
fail:
	kvmem_st_writer_free(w);
	return NULL;
}

uint64_t kvmem_model_generate_bytes(const kvmem_config *c, const kvmem_gen_opts *o)
{
	struct plan p;
	uint64_t total = 0;

	if (plan_make(&p, c, o))
		return 0;
	for (int s = 0; s < p.nshards; s++) {
		kvmem_st_writer *w = shard_writer(&p, s, o ? o->seed : 0);

		if (!w) {
			plan_free(&p);
			return 0;
		}
		total += kvmem_st_writer_file_size(w);
		kvmem_st_writer_free(w);
	}
	plan_free(&p);
	return total;
}

/* The standard deviation of a tensor's values (0: a norm weight, all 1). */
static double tensor_std(const kvmem_config *c, const struct kvmem_tensor_spec *t)
{
	switch (t->role) {
	case KVMEM_T_EMBED:
	case KVMEM_T_LM_HEAD:
		/* rows of unit-RMS hidden states dotted with these give logits
		 * of standard deviation about 1, tied or not */
		return 1.0 / sqrt((double)c->hidden);
	case KVMEM_T_WO:
	case KVMEM_T_DOWN:
		/* residual branches: 2 per layer add up over n_layers */
		return 1.0 / sqrt((double)t->fan_in * 2.0 * c->n_layers);
	case KVMEM_T_WQ:
	case KVMEM_T_WK:
	case KVMEM_T_WV:
	case KVMEM_T_GATE:
	case KVMEM_T_UP:
		return 1.0 / sqrt((double)t->fan_in);
	default:
		return 0;
	}
}

static void store(void *out, size_t i, kvmem_st_dtype dt, float v)
{
	if (dt == KVMEM_ST_F32) {
		((float *)out)[i] = v;
	} else {
		uint16_t h = dt == KVMEM_ST_BF16 ? kvmem_f32_to_bf16(v) : kvmem_f32_to_f16(v);

		((uint16_t *)out)[i] = h;
	}
}

/* Values [0, k) of chunk `chunk` of tensor `ti` into out (as dtype dt). */
static void fill_chunk(void *out, size_t k, kvmem_st_dtype dt, double std, uint64_t seed,
		       size_t ti, uint64_t chunk)
{
	uint64_t s = kvmem_mix64(kvmem_mix64(seed ^ kvmem_mix64(ti + 1)) + 0x632be59bd9b4e019ull * (chunk + 1));

	if (std == 0) {
		for (size_t i = 0; i < k; i++)
			store(out, i, dt, 1.0f);
		return;
	}
	for (size_t i = 0; i < k; i += 2) {
		/* Marsaglia's polar form of Box-Muller: a point drawn uniformly
		 * in the unit disc gives two normals with one log and no trig. */
		double u, v, r2, f;

		do {
			u = (double)(kvmem_rng_next(&s) >> 11) * 0x1.0p-52 - 1.0;
			v = (double)(kvmem_rng_next(&s) >> 11) * 0x1.0p-52 - 1.0;
			r2 = u * u + v * v;
		} while (r2 >= 1.0 || r2 == 0.0);
		f = sqrt(-2.0 * log(r2) / r2) * std;
		store(out, i, dt, (float)(u * f));
		if (i + 1 < k)
			store(out, i + 1, dt, (float)(v * f));
	}
}

struct progress {
	void (*fn)(uint64_t done, uint64_t total, void *arg);
	void *arg;
	uint64_t done, total;
};

static int write_tensor(kvmem_st_writer *w, const struct plan *p, size_t ti, uint64_t seed,
			unsigned char *buf, struct progress *pr)
{
	const struct kvmem_tensor_spec *t = &p->t[ti];
	uint64_t numel = (uint64_t)t->shape[0] * (t->ndim == 2 ? (uint64_t)t->shape[1] : 1);
	uint64_t nchunks = (numel + CHUNK - 1) / CHUNK;
	size_t esz = kvmem_st_dtype_size(p->dt);
	double std = tensor_std(&p->c, t);
	int rc;

	for (uint64_t c0 = 0; c0 < nchunks; c0 += BUF_CHUNKS) {
		uint64_t cn = nchunks - c0 < BUF_CHUNKS ? nchunks - c0 : BUF_CHUNKS;
		uint64_t first = c0 * CHUNK, n = numel - first < cn * CHUNK ? numel - first : cn * CHUNK;

		#pragma omp parallel for schedule(static)
		for (uint64_t c = 0; c < cn; c++) {
			uint64_t b = c * CHUNK, k = n - b < CHUNK ? n - b : CHUNK;

			fill_chunk(buf + b * esz, k, p->dt, std, seed, ti, c0 + c);
		}
		if ((rc = kvmem_st_writer_write(w, buf, n * esz)))
			return rc;
		pr->done += n * esz;
		if (pr->fn)
			pr->fn(pr->done, pr->total, pr->arg);
	}
	return 0;
}

/* Weights of an earlier model in the same place that the loader would
 * otherwise find first (or that would just waste the disk). */
static void remove_stale(const char *dir, bool sharded)
{
	char path[4400];
	DIR *d;
	struct dirent *e;

	snprintf(path, sizeof(path), "%s/%s", dir,
		 sharded ? "model.safetensors" : "model.safetensors.index.json");
	unlink(path);
	d = opendir(dir);
	if (!d)
		return;
	while ((e = readdir(d)))
		if (!fnmatch("model-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].safetensors",
			     e->d_name, 0)) {
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			unlink(path);
		}
	closedir(d);
}

int kvmem_model_remove_stale_tmp(const char *dir)
{
	char path[4400];
	struct dirent *e;
	int removed = 0;
	DIR *d = opendir(dir);

	if (!d)
		return errno == ENOENT ? 0 : kvmem_error(errno, "%s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		const char *tag = e->d_name[0] == '.' ? strstr(e->d_name, KVMEM_TMP_TAG) : NULL;
		char *end;
		long pid;

		if (!tag)
			continue;
		errno = 0;
		pid = strtol(tag + strlen(KVMEM_TMP_TAG), &end, 10);
		if (errno || *end || pid <= 0 || end == tag + strlen(KVMEM_TMP_TAG))
			continue;
		/* Only a writer that is gone: a live pid (ours, or another
		 * generate still writing) keeps its file. */
		if (pid == (long)getpid() || !(kill((pid_t)pid, 0) && errno == ESRCH))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		removed += !unlink(path);
	}
	closedir(d);
	return removed;
}

static int check_space(const char *dir, uint64_t need)
{
	struct statvfs vfs;
	uint64_t avail;

	if (statvfs(dir, &vfs))
		return 0;	/* cannot tell: let the writes say */
	avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	if (avail < need + (16u << 20))
		return kvmem_error(ENOSPC, "%s: the model needs %.2f GB but only %.2f GB are free there", dir,
				 need / 1e9, avail / 1e9);
	return 0;
}

static int write_shards(const struct plan *p, const char *dir, uint64_t seed,
			struct progress *pr)
{
	unsigned char *buf = malloc((size_t)BUF_CHUNKS * CHUNK * sizeof(float));
	int rc = 0;

	if (!buf)
		return kvmem_error(ENOMEM, "generate: out of memory");
	for (int s = 0; s < p->nshards && !rc; s++) {
		kvmem_st_writer *w = shard_writer(p, s, seed);
		char path[4400], name[64];

		if (p->nshards == 1)
			snprintf(name, sizeof(name), "model.safetensors");
		else
			kvmem_hf_shard_name(name, sizeof(name), s, p->nshards);
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		rc = w ? kvmem_st_writer_begin(w, path) : kvmem_fail();	/* NULL: -ENOMEM set */
		for (size_t i = 0; i < p->n && !rc; i++)
			if (p->shard_of[i] == s)
				rc = write_tensor(w, p, i, seed, buf, pr);
		if (!rc)
			rc = kvmem_st_writer_finish(w);
		kvmem_st_writer_free(w);
	}
	free(buf);
	return rc;
}

int kvmem_model_generate_opts(const kvmem_config *c, const char *dir, const kvmem_gen_opts *o)
{
	static const kvmem_gen_opts defaults;
	struct plan p;
	struct progress pr = { 0 };
	uint64_t bytes;
	int rc;

	if (!o)
		o = &defaults;
	bytes = kvmem_model_generate_bytes(c, o);
	if (!bytes)
		return kvmem_fail();	/* the plan's error, set */
	if ((rc = plan_make(&p, c, o)))
		return rc;
	pr.fn = o->progress;
	pr.arg = o->arg;
	pr.total = p.data_bytes;
	/* First what a killed generate left, so it counts as free space. */
	if ((rc = kvmem_mkdir_p(dir)) || (rc = kvmem_model_remove_stale_tmp(dir)) < 0 ||
	    (rc = check_space(dir, bytes)))
		goto out;
	remove_stale(dir, p.nshards > 1);
	if ((rc = write_shards(&p, dir, o->seed, &pr)))
		goto out;
	if (p.nshards > 1) {
		const char **names = malloc(p.n * sizeof(*names));

		if (!names) {
			rc = kvmem_error(ENOMEM, "generate: out of memory");
			goto out;
		}
		for (size_t i = 0; i < p.n; i++)
			names[i] = p.t[i].name;
		rc = kvmem_hf_write_index(dir, p.data_bytes, names, p.shard_of, p.n, p.nshards);
		free(names);
		if (rc)
			goto out;
	}
	if (!(rc = kvmem_hf_write_config(&p.c, dir)))
		rc = kvmem_hf_write_generation_config(&p.c, dir);
out:
	plan_free(&p);
	return rc;
}

int kvmem_model_generate(const kvmem_config *c, const char *dir, uint64_t seed,
		       void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg)
{
	kvmem_gen_opts o = { .seed = seed, .progress = progress, .arg = arg };

	return kvmem_model_generate_opts(c, dir, &o);
}
