/* SPDX-License-Identifier: MIT */
/*
 * The matmul weights of a loaded model as its files store them, when every
 * one is bf16 (the embedded model's, Qwen3's published checkpoints): the
 * cpu engine multiplies by them widened in registers (kvmem_matmul_bf16w),
 * with kvmem_matmul's bits over the fp32 copies in kvmem_model and half the
 * bytes read per decode step. Internal: the public kvmem_layer stays fp32.
 */
#ifndef KVMEM_MODEL_WEIGHTS_BF16_H
#define KVMEM_MODEL_WEIGHTS_BF16_H

#include <stdint.h>

#include "kvmem/model.h"

typedef struct kvmem_layer_bf16 {
	const uint16_t *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;
} kvmem_layer_bf16;

/* [n_layers], or NULL: a matmul weight (lm_head included) is stored in
 * another type, or the model was opened without its weights. */
const kvmem_layer_bf16 *kvmem_model_layers_bf16(const kvmem_model *m);
/* lm_head (the embedding when tied), or NULL as above. */
const uint16_t *kvmem_model_lm_head_bf16(const kvmem_model *m);

#endif
