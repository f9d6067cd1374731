/* SPDX-License-Identifier: MIT */
/*
 * The tensors a Qwen3 config implies, in one canonical order shared by the
 * loader, the generator and the fingerprint:
 *   model.embed_tokens.weight
 *   per layer N: input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
 *                post_attention_layernorm, mlp.{gate,up,down}_proj
 *   model.norm.weight
 *   lm_head.weight (only when the embeddings are not tied)
 */
#ifndef KVMEM_MODEL_TENSORS_H
#define KVMEM_MODEL_TENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvmem/model.h"

enum kvmem_tensor_role {
	KVMEM_T_EMBED,
	KVMEM_T_ATTN_NORM,
	KVMEM_T_WQ,
	KVMEM_T_WK,
	KVMEM_T_WV,
	KVMEM_T_WO,
	KVMEM_T_Q_NORM,
	KVMEM_T_K_NORM,
	KVMEM_T_MLP_NORM,
	KVMEM_T_GATE,
	KVMEM_T_UP,
	KVMEM_T_DOWN,
	KVMEM_T_FINAL_NORM,
	KVMEM_T_LM_HEAD,
};

#define KVMEM_LAYER_TENSORS 11

struct kvmem_tensor_spec {
	char name[80];
	enum kvmem_tensor_role role;
	int layer;		/* -1 outside the layers */
	int ndim;		/* 1 or 2 */
	int64_t shape[2];	/* [out][in] for matrices */
	int64_t fan_in;		/* the input size a matrix multiplies */
};

size_t kvmem_tensor_count(const kvmem_config *c);
/* Tensor i (< kvmem_tensor_count) in canonical order. */
void kvmem_tensor_spec(const kvmem_config *c, size_t i, struct kvmem_tensor_spec *t);
/* The layer-local suffix of a role, e.g. "mlp.up_proj.weight". */
const char *kvmem_tensor_suffix(enum kvmem_tensor_role r);

/* The safetensors dtype config.json's torch_dtype names ("BF16"; "?" if none). */
const char *kvmem_config_st_dtype(const kvmem_config *c);

/* Pieces of the fingerprint text (see kvmem_config_fingerprint in model.h):
 * the geometry lines, and one tensor's "name DTYPE [d0, d1]" without the
 * line end (the model fingerprint appends its data hashes first). */
void kvmem_fingerprint_head(FILE *f, const kvmem_config *c);
void kvmem_fingerprint_tensor(FILE *f, const char *name, const char *dtype, int ndim,
			    const int64_t *shape);

#endif
