/* SPDX-License-Identifier: MIT */
/*
 * What the benchmarks that run a model share (bench engine, bench step):
 * the model (weights from --model DIR, or --preset NAME's geometry with
 * random weights the backend makes) and the backend (--backend), with one
 * spelling of the options, their help and their errors.
 */
#ifndef KVMEM_TOOLS_BENCH_COMMON_H
#define KVMEM_TOOLS_BENCH_COMMON_H

#include <getopt.h>
#include <stdint.h>

#include "kvmem/model.h"

/* getopt values of the shared options: above any character a bench uses. */
enum { BENCH_OPT_BACKEND = 0x100, BENCH_OPT_PRESET, BENCH_OPT_MODEL };

#define BENCH_MODEL_OPTIONS                                                   \
	{ "backend", required_argument, NULL, BENCH_OPT_BACKEND },            \
	{ "preset", required_argument, NULL, BENCH_OPT_PRESET },              \
	{ "model", required_argument, NULL, BENCH_OPT_MODEL }

#define BENCH_MODEL_HELP                                                              \
	"  --backend NAME     cpu, cuda or auto (default auto: cuda when there is a GPU)\n" \
	"  --preset NAME      a published geometry with random weights made by the\n"      \
	"                     backend (default 8b; kvmem generate --help lists them);\n"    \
	"                     the cpu backend needs --model\n"                               \
	"  --model DIR        a model directory instead\n"

struct bench_model {
	const char *backend, *preset, *dir;	/* from the options; NULL: not given */
	kvmem_model geo;			/* a preset's geometry, no weights */
	kvmem_model *loaded;			/* --model's */
};

/* Take option c (a BENCH_OPT_* value) with its argument: 1, or 0 when c is
 * not one of them. */
int bench_model_opt(struct bench_model *bm, int c, const char *arg);
/*
 * The model to run: --model's directory, or the preset's geometry (the
 * default preset when neither was given), with `layers` layers when > 0 (a
 * preset only). NULL after a message on stderr, *usage set when the
 * spelling was wrong (--model and --preset both, an unknown preset).
 */
const kvmem_model *bench_model_open(struct bench_model *bm, const char *who,
				    const char *dflt_preset, int layers, int *usage);
void bench_model_close(struct bench_model *bm);

/* The arithmetic of the rooflines (bench engine's decode, bench batch's
 * step). Matrix-product FLOPs of one token through every layer (no
 * lm_head). */
double bench_flops_per_token(const kvmem_config *c);
/* Bytes one decode step reads: every weight once (the embedding only its
 * row, the lm_head whole) at w_elem bytes (the backend's: 2 for bf16, 4 for
 * the cpu engine's fp32 weights) and ctx tokens' K and V at kv_elem bytes a
 * value (2 on a GPU, 4 in the cpu backend's fp32 views, 1 + 4 / head_dim in
 * fp8 views with a scale a row). */
double bench_decode_bytes(const kvmem_config *c, int64_t ctx, int w_elem, double kv_elem);
/* Those bytes for backend b: a weight's (its weight_bytes, else bf16's 2)
 * and a K or V value's in its views of kv_dtype (0: the backend's own). */
struct kvmem_backend;
int bench_weight_elem(const struct kvmem_backend *b);
double bench_kv_elem(const struct kvmem_backend *b, uint32_t kv_dtype, int head_dim);

#endif
