/* SPDX-License-Identifier: MIT */
/*
 * Qwen3-family models: configuration, loading from a Hugging Face model
 * directory, and the random-model generator.
 *
 * A model directory holds config.json and either model.safetensors or
 * sharded *.safetensors listed in model.safetensors.index.json. Tensors may
 * be bf16, fp16 or fp32; they are mapped with mmap and converted to fp32 once
 * at load (fp32 tensors that are suitably aligned are used in place).
 */
#ifndef KVMEM_MODEL_H
#define KVMEM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvm_config {
	char arch[64];		/* "Qwen3ForCausalLM" */
	int n_layers;		/* num_hidden_layers */
	int hidden;		/* hidden_size */
	int n_heads;		/* num_attention_heads */
	int n_kv_heads;		/* num_key_value_heads */
	int head_dim;		/* head_dim (default hidden / n_heads) */
	int intermediate;	/* intermediate_size */
	int vocab;		/* vocab_size */
	int max_position;	/* max_position_embeddings: the native window */
	double rope_theta;	/* rope_theta */
	float rms_eps;		/* rms_norm_eps */
	int tie_embeddings;	/* tie_word_embeddings */
	int bos_id, eos_id;	/* -1 when absent */
	char dtype[16];		/* torch_dtype / dtype as written: "bfloat16"... */
} kvm_config;

/* Parse config.json text (len bytes). `name` is used in error messages. */
int kvm_config_parse(kvm_config *c, const char *json, size_t len, const char *name);
/* Read and parse <dir>/config.json. */
int kvm_config_load(kvm_config *c, const char *dir);
/* Check the geometry is one the engine runs (positive sizes, GQA divides,
 * even head_dim...). */
int kvm_config_validate(const kvm_config *c, const char *name);

/* Parameter count and KV bytes per token (raw K + V, all layers, at the
 * given bytes per element). */
uint64_t kvm_config_params(const kvm_config *c);
uint64_t kvm_config_kv_bytes_per_token(const kvm_config *c, int elem_bytes);
/* A 64-bit fingerprint of the geometry and tensor shapes/dtypes, for
 * refusing a workspace built by another model. */
uint64_t kvm_config_fingerprint(const kvm_config *c);

typedef struct kvm_layer {
	const float *attn_norm;	/* [hidden]                      input_layernorm */
	const float *wq;	/* [n_heads*head_dim][hidden]    self_attn.q_proj */
	const float *wk;	/* [n_kv_heads*head_dim][hidden] self_attn.k_proj */
	const float *wv;	/* [n_kv_heads*head_dim][hidden] self_attn.v_proj */
	const float *wo;	/* [hidden][n_heads*head_dim]    self_attn.o_proj */
	const float *q_norm;	/* [head_dim]                    self_attn.q_norm */
	const float *k_norm;	/* [head_dim]                    self_attn.k_norm */
	const float *mlp_norm;	/* [hidden]                      post_attention_layernorm */
	const float *w_gate;	/* [intermediate][hidden]        mlp.gate_proj */
	const float *w_up;	/* [intermediate][hidden]        mlp.up_proj */
	const float *w_down;	/* [hidden][intermediate]        mlp.down_proj */
} kvm_layer;

typedef struct kvm_model {
	kvm_config cfg;
	char dir[4096];
	const float *embed;	/* [vocab][hidden]  model.embed_tokens */
	const float *final_norm;/* [hidden]         model.norm */
	const float *lm_head;	/* [vocab][hidden]  lm_head (== embed when tied) */
	kvm_layer *layers;	/* [n_layers] */
	void *priv;		/* owned storage: maps, converted buffers */
} kvm_model;

/* Load a model directory. On failure returns -1 and kvm_last_error() names
 * the file and the problem; nothing is leaked. */
int kvm_model_load(const char *dir, kvm_model **out);
void kvm_model_free(kvm_model *m);

/* ---- generator -------------------------------------------------------- */
typedef struct kvm_preset {
	const char *name;	/* "tiny", "0.6b", ... "32b" */
	const char *what;	/* one line for --help */
	kvm_config cfg;
} kvm_preset;

/* NULL-terminated by name == NULL. */
extern const kvm_preset kvm_presets[];
const kvm_preset *kvm_preset_find(const char *name);

/* Write a Qwen3-shaped model directory (config.json, generation_config.json,
 * model.safetensors, bf16) with random weights from `seed`, scaled so
 * activations keep a sane size through every layer. Creates `dir` if needed.
 * progress, if set, is called now and then with bytes written / total. */
int kvm_model_generate(const kvm_config *c, const char *dir, uint64_t seed,
		       void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg);

#ifdef __cplusplus
}
#endif
#endif
