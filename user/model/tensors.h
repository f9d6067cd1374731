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

enum kvm_tensor_role {
	KVM_T_EMBED,
	KVM_T_ATTN_NORM,
	KVM_T_WQ,
	KVM_T_WK,
	KVM_T_WV,
	KVM_T_WO,
	KVM_T_Q_NORM,
	KVM_T_K_NORM,
	KVM_T_MLP_NORM,
	KVM_T_GATE,
	KVM_T_UP,
	KVM_T_DOWN,
	KVM_T_FINAL_NORM,
	KVM_T_LM_HEAD,
};

#define KVM_LAYER_TENSORS 11

struct kvm_tensor_spec {
	char name[80];
	enum kvm_tensor_role role;
	int layer;		/* -1 outside the layers */
	int ndim;		/* 1 or 2 */
	int64_t shape[2];	/* [out][in] for matrices */
	int64_t fan_in;		/* the input size a matrix multiplies */
};

size_t kvm_tensor_count(const kvm_config *c);
/* Tensor i (< kvm_tensor_count) in canonical order. */
void kvm_tensor_spec(const kvm_config *c, size_t i, struct kvm_tensor_spec *t);
/* The layer-local suffix of a role, e.g. "mlp.up_proj.weight". */
const char *kvm_tensor_suffix(enum kvm_tensor_role r);

/* The safetensors dtype config.json's torch_dtype names ("BF16"; "?" if none). */
const char *kvm_config_st_dtype(const kvm_config *c);

/* Pieces of the fingerprint text (see kvm_config_fingerprint in model.h):
 * the geometry lines, and one tensor's "name DTYPE [d0, d1]" without the
 * line end (the model fingerprint appends its data hashes first). */
void kvm_fingerprint_head(FILE *f, const kvm_config *c);
void kvm_fingerprint_tensor(FILE *f, const char *name, const char *dtype, int ndim,
			    const int64_t *shape);

#endif
