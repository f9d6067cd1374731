// SPDX-License-Identifier: MIT
/* The canonical tensor list of a Qwen3 config (see tensors.h). */
#include <stdio.h>

#include "model/tensors.h"

static const char *const suffix[] = {
	[KVMEM_T_EMBED] = "model.embed_tokens.weight",
	[KVMEM_T_ATTN_NORM] = "input_layernorm.weight",
	[KVMEM_T_WQ] = "self_attn.q_proj.weight",
	[KVMEM_T_WK] = "self_attn.k_proj.weight",
	[KVMEM_T_WV] = "self_attn.v_proj.weight",
	[KVMEM_T_WO] = "self_attn.o_proj.weight",
	[KVMEM_T_Q_NORM] = "self_attn.q_norm.weight",
	[KVMEM_T_K_NORM] = "self_attn.k_norm.weight",
	[KVMEM_T_MLP_NORM] = "post_attention_layernorm.weight",
	[KVMEM_T_GATE] = "mlp.gate_proj.weight",
	[KVMEM_T_UP] = "mlp.up_proj.weight",
	[KVMEM_T_DOWN] = "mlp.down_proj.weight",
	[KVMEM_T_FINAL_NORM] = "model.norm.weight",
	[KVMEM_T_LM_HEAD] = "lm_head.weight",
};

const char *kvmem_tensor_suffix(enum kvmem_tensor_role r)
{
	return suffix[r];
}

size_t kvmem_tensor_count(const kvmem_config *c)
{
	return 2 + (size_t)c->n_layers * KVMEM_LAYER_TENSORS + (c->tie_embeddings ? 0 : 1);
}

static void mat(struct kvmem_tensor_spec *t, int64_t out, int64_t in)
{
	t->ndim = 2;
	t->shape[0] = out;
	t->shape[1] = in;
	t->fan_in = in;
}

static void vec(struct kvmem_tensor_spec *t, int64_t n)
{
	t->ndim = 1;
	t->shape[0] = n;
	t->shape[1] = 0;
	t->fan_in = 0;
}

void kvmem_tensor_spec(const kvmem_config *c, size_t i, struct kvmem_tensor_spec *t)
{
	int64_t h = c->hidden, q = (int64_t)c->n_heads * c->head_dim;
	int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
	size_t in_layers = (size_t)c->n_layers * KVMEM_LAYER_TENSORS;

	t->layer = -1;
	if (i == 0) {
		t->role = KVMEM_T_EMBED;
		mat(t, c->vocab, h);
	} else if (i <= in_layers) {
		t->layer = (int)((i - 1) / KVMEM_LAYER_TENSORS);
		t->role = (enum kvmem_tensor_role)(KVMEM_T_ATTN_NORM + (i - 1) % KVMEM_LAYER_TENSORS);
	} else if (i == in_layers + 1) {
		t->role = KVMEM_T_FINAL_NORM;
		vec(t, h);
	} else {
		t->role = KVMEM_T_LM_HEAD;
		mat(t, c->vocab, h);
	}
	switch (t->role) {
	case KVMEM_T_ATTN_NORM:
	case KVMEM_T_MLP_NORM: vec(t, h); break;
	case KVMEM_T_Q_NORM:
	case KVMEM_T_K_NORM: vec(t, c->head_dim); break;
	case KVMEM_T_WQ: mat(t, q, h); break;
	case KVMEM_T_WK:
	case KVMEM_T_WV: mat(t, kv, h); break;
	case KVMEM_T_WO: mat(t, h, q); break;
	case KVMEM_T_GATE:
	case KVMEM_T_UP: mat(t, c->intermediate, h); break;
	case KVMEM_T_DOWN: mat(t, h, c->intermediate); break;
	default: break;
	}
	if (t->layer >= 0)
		snprintf(t->name, sizeof(t->name), "model.layers.%d.%s", t->layer, suffix[t->role]);
	else
		snprintf(t->name, sizeof(t->name), "%s", suffix[t->role]);
}
