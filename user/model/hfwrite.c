// SPDX-License-Identifier: MIT
/* config.json, generation_config.json and the shard index, written the way
 * transformers writes them (sorted keys, two-space indent), atomically. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "model/hfwrite.h"
#include "util/json.h"

/* Write `text` to dir/name through a temporary file, fsync, rename. */
static int put_file(const char *dir, const char *name, const char *text, size_t len)
{
	char path[4200], tmp[4300];
	size_t done = 0;
	int fd, rc;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s/.%s" KVMEM_TMP_TAG "%d", dir, name, (int)getpid());
	unlink(tmp);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return kvmem_error(errno, "%s: cannot create: %s", tmp, strerror(errno));
	while (done < len) {
		ssize_t r = write(fd, text + done, len - done);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = kvmem_error(r ? errno : EIO, "%s: write failed: %s", tmp,
					 r ? strerror(errno) : "no progress");
			close(fd);
			unlink(tmp);
			return rc;
		}
		done += (size_t)r;
	}
	if (fsync(fd)) {
		rc = kvmem_error(errno, "%s: fsync failed: %s", tmp, strerror(errno));
		close(fd);
		unlink(tmp);
		return rc;
	}
	if (close(fd) || rename(tmp, path)) {
		rc = kvmem_error(errno, "%s: cannot write: %s", path, strerror(errno));
		unlink(tmp);
		return rc;
	}
	return 0;
}

/* Finish a memstream and put its text into dir/name. */
static int put_stream(FILE *f, char **text, size_t *len, const char *dir, const char *name)
{
	int rc;

	if (fclose(f) || !*text) {
		free(*text);
		return kvmem_error(ENOMEM, "%s/%s: out of memory", dir, name);
	}
	rc = put_file(dir, name, *text, *len);
	free(*text);
	return rc;
}

/* The shortest decimal that reads back as the same float, as Python's repr
 * would write it ("1e-06"). */
static void put_float(FILE *f, float v)
{
	char buf[40];

	for (int prec = 1; prec <= 9; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, (double)v);
		if ((float)strtod(buf, NULL) == v)
			break;
	}
	fputs(buf, f);
}

static void put_double(FILE *f, double v)
{
	char buf[40];

	if (v == floor(v) && fabs(v) < 1e15) {
		fprintf(f, "%.0f", v);	/* transformers keeps integral thetas as ints */
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	fputs(buf, f);
}

static void put_token(FILE *f, const char *key, int id, const char *end)
{
	if (id >= 0)
		fprintf(f, "  \"%s\": %d%s\n", key, id, end);
	else
		fprintf(f, "  \"%s\": null%s\n", key, end);
}

int kvmem_hf_write_config(const kvmem_config *c, const char *dir)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return kvmem_error(ENOMEM, "%s/config.json: out of memory", dir);
	fprintf(f, "{\n  \"architectures\": [\n    ");
	kvmem_json_write_str(f, c->arch);
	fprintf(f, "\n  ],\n"
		   "  \"attention_bias\": false,\n"
		   "  \"attention_dropout\": 0.0,\n");
	put_token(f, "bos_token_id", c->bos_id, ",");
	put_token(f, "eos_token_id", c->eos_id, ",");
	fprintf(f, "  \"head_dim\": %d,\n"
		   "  \"hidden_act\": \"silu\",\n"
		   "  \"hidden_size\": %d,\n"
		   "  \"initializer_range\": 0.02,\n"
		   "  \"intermediate_size\": %d,\n"
		   "  \"max_position_embeddings\": %d,\n"
		   "  \"max_window_layers\": %d,\n"
		   "  \"model_type\": \"qwen3\",\n"
		   "  \"num_attention_heads\": %d,\n"
		   "  \"num_hidden_layers\": %d,\n"
		   "  \"num_key_value_heads\": %d,\n"
		   "  \"rms_norm_eps\": ",
		c->head_dim, c->hidden, c->intermediate, c->max_position, c->n_layers, c->n_heads,
		c->n_layers, c->n_kv_heads);
	put_float(f, c->rms_eps);
	fprintf(f, ",\n  \"rope_scaling\": null,\n  \"rope_theta\": ");
	put_double(f, c->rope_theta);
	fprintf(f, ",\n  \"sliding_window\": null,\n"
		   "  \"tie_word_embeddings\": %s,\n"
		   "  \"torch_dtype\": ", c->tie_embeddings ? "true" : "false");
	kvmem_json_write_str(f, c->dtype);
	fprintf(f, ",\n  \"use_cache\": true,\n"
		   "  \"use_sliding_window\": false,\n"
		   "  \"vocab_size\": %d\n}\n", c->vocab);
	return put_stream(f, &text, &len, dir, "config.json");
}

int kvmem_hf_write_generation_config(const kvmem_config *c, const char *dir)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return kvmem_error(ENOMEM, "%s/generation_config.json: out of memory", dir);
	fprintf(f, "{\n");
	put_token(f, "bos_token_id", c->bos_id, ",");
	fprintf(f, "  \"do_sample\": false,\n");
	put_token(f, "eos_token_id", c->eos_id, "");
	fprintf(f, "}\n");
	return put_stream(f, &text, &len, dir, "generation_config.json");
}

void kvmem_hf_shard_name(char *buf, size_t len, int shard, int nshards)
{
	snprintf(buf, len, "model-%05d-of-%05d.safetensors", shard + 1, nshards);
}

int kvmem_hf_write_index(const char *dir, uint64_t total_size, const char *const *names,
		       const int *shard_of, size_t n, int nshards)
{
	char *text = NULL, shard[64];
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return kvmem_error(ENOMEM, "%s/model.safetensors.index.json: out of memory", dir);
	fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
		(unsigned long long)total_size);
	for (size_t i = 0; i < n; i++) {
		kvmem_hf_shard_name(shard, sizeof(shard), shard_of[i], nshards);
		fputs("    ", f);
		kvmem_json_write_str(f, names[i]);
		fprintf(f, ": \"%s\"%s\n", shard, i + 1 < n ? "," : "");
	}
	fprintf(f, "  }\n}\n");
	return put_stream(f, &text, &len, dir, "model.safetensors.index.json");
}
