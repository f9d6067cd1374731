// SPDX-License-Identifier: MIT
/* kvmem info: what a model directory holds, checked but not loaded. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "cli_util.h"
#include "cmd.h"
#include "util/json.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: kvmem info [--json] DIR\n"
		   "       kvmem info [--json] --model DIR\n\n"
		   "Check a Hugging Face model directory (config.json plus model.safetensors,\n"
		   "or shards listed in model.safetensors.index.json) the way the engine would\n"
		   "load it, without converting the weights, and print its geometry, parameter\n"
		   "count, stored dtype, KV bytes per token, native window and fingerprint.\n"
		   "The fingerprint covers every byte of every tensor: a first look at a model\n"
		   "reads all of it; later ones take the digests from the cache in the data\n"
		   "directory while the files are unchanged.\n\n"
		   "options:\n"
		   "  --model DIR   the model directory (or give it as the operand)\n"
		   "  --json        one JSON object instead of text\n"
		   "  --help        this text\n\n"
		   "examples:\n"
		   "  kvmem info /path/to/Qwen3-0.6B\n"
		   "  kvmem info --json --model models/agentlang\n");
}

/* Bytes of the Mean-K index per token at block 32 (elem: 2 bf16, 4 fp32). */
static double index_bytes_per_token(const kvmem_config *c, int elem)
{
	return (double)c->n_layers * c->n_kv_heads * c->head_dim * elem / 32;
}

static void print_text(const kvmem_model *m)
{
	const kvmem_config *c = &m->cfg;
	uint64_t params = kvmem_config_params(c);
	char a[32], b[32];

	printf("model         %s\n", m->dir);
	printf("architecture  %s\n", c->arch);
	cli_print_geometry(c);
	printf("weights       %s in %d file%s, %s; %s as fp32 in memory\n", m->weight_dtype,
	       m->n_files, m->n_files == 1 ? "" : "s",
	       cli_fmt_bytes(a, sizeof(a), (double)m->file_bytes),
	       cli_fmt_bytes(b, sizeof(b), params * 4.0));
	cli_print_kv(c);
	/* The selection index per token at the default block of 32: Mean-K of
	 * every (layer, KV head) per block, fp32 on the host; a session on the
	 * GPU keeps a copy of it there, up to the backend's index_mem. */
	printf("index         Mean-K %s per token at block 32 in fp32 (the host's, and the GPU's\n"
	       "              copy while it fits its share; %s in bf16); min/max 2x that more,\n"
	       "              quarter-block means 4x\n",
	       cli_fmt_bytes(b, sizeof(b), index_bytes_per_token(c, 4)),
	       cli_fmt_bytes(a, sizeof(a), index_bytes_per_token(c, 2)));
	printf("fingerprint   %016llx (geometry only: %016llx)\n",
	       (unsigned long long)m->fingerprint,
	       (unsigned long long)kvmem_config_fingerprint(c));
}

static int print_json(const kvmem_model *m)
{
	const kvmem_config *c = &m->cfg;
	char *dir = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&dir, &n);
	int rc = f ? kvmem_json_write_str(f, m->dir) : -ENOMEM;

	if (f)
		fclose(f);
	if (rc) {	/* a path JSON cannot hold is an error, not a broken document */
		fprintf(stderr, "kvmem info: %s: %s\n", m->dir,
			rc == -EILSEQ ? "the path is not UTF-8, which JSON cannot hold" : strerror(-rc));
		free(dir);
		return 1;
	}
	printf("{\"dir\": %s", dir);
	free(dir);
	printf(", \"architecture\": \"%s\", \"layers\": %d, \"hidden\": %d, \"heads\": %d, "
	       "\"kv_heads\": %d, \"head_dim\": %d, \"intermediate\": %d, \"vocab\": %d, "
	       "\"bos_id\": %d, \"eos_id\": %d, \"max_position\": %d, \"rope_theta\": %.17g, "
	       "\"rms_eps\": %.7g, \"tied\": %s, \"params\": %llu, \"weight_dtype\": \"%s\", "
	       "\"files\": %d, \"file_bytes\": %llu, \"kv_bytes_per_token_bf16\": %llu, "
	       "\"kv_bytes_per_token_fp32\": %llu, \"index_bytes_per_token_bf16\": %.0f, "
	       "\"index_bytes_per_token_fp32\": %.0f, \"fingerprint\": \"%016llx\", "
	       "\"config_fingerprint\": \"%016llx\"}\n",
	       c->arch, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim,
	       c->intermediate, c->vocab, c->bos_id, c->eos_id, c->max_position, c->rope_theta,
	       (double)c->rms_eps, c->tie_embeddings ? "true" : "false",
	       (unsigned long long)kvmem_config_params(c), m->weight_dtype, m->n_files,
	       (unsigned long long)m->file_bytes,
	       (unsigned long long)kvmem_config_kv_bytes_per_token(c, 2),
	       (unsigned long long)kvmem_config_kv_bytes_per_token(c, 4),
	       index_bytes_per_token(c, 2), index_bytes_per_token(c, 4),
	       (unsigned long long)m->fingerprint, (unsigned long long)kvmem_config_fingerprint(c));
	return 0;
}

int cmd_info(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool json = false;
	const char *dir = NULL;
	kvmem_model *m;
	int c, rc = 0;

	cli_getopt_reset();
	while ((c = cli_getopt("kvmem info", argc, argv, opts)) != -1) {
		switch (c) {
		case 'm': dir = optarg; break;
		case 'j': json = true; break;
		case 'h': usage(stdout); return 0;
		default: return EXIT_USAGE;
		}
	}
	if (argc - optind + (dir != NULL) != 1) {
		fprintf(stderr, "kvmem info: give exactly one model directory (kvmem info --help)\n");
		return EXIT_USAGE;
	}
	if (!dir)
		dir = argv[optind];
	if (kvmem_model_open(dir, KVMEM_MODEL_NO_WEIGHTS, &m)) {
		fprintf(stderr, "kvmem info: %s\n", kvmem_last_error());
		return 1;
	}
	if (json)
		rc = print_json(m);
	else
		print_text(m);
	kvmem_model_free(m);
	return rc;
}
