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

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

typedef struct kvmem_config {
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
} kvmem_config;

/*
 * Parse config.json text (len bytes); `name` starts error messages. Reads
 * the keys transformers 4.x and 5.x write for Qwen3 (torch_dtype or dtype;
 * rope_theta at the top or in rope_parameters). Refuses, naming the key:
 * another architecture or model_type, rope scaling other than "default",
 * sliding-window layers, attention biases, an activation other than silu,
 * a missing size, a value of the wrong type. Then kvmem_config_validate().
 * Returns 0; -EBADMSG when the text is not strict JSON (the message says
 * "<name>:<line>:<column>: ...", Documentation/formats.md); -EINVAL for
 * JSON that is not a config kvmem runs (the cases above, a document that
 * is not an object); -ENOMEM.
 * Defaults as transformers': num_key_value_heads = num_attention_heads,
 * head_dim = hidden_size / num_attention_heads, max_position_embeddings
 * 32768, rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings false,
 * bos/eos -1 (an eos list gives its first id).
 */
int kvmem_config_parse(kvmem_config *c, const char *json, size_t len, const char *name);
/* Read and parse <dir>/config.json (messages name that path). The codes of
 * kvmem_config_parse, and -ENOENT (no dir, or no config.json in it),
 * -ENOTDIR (dir is a file), -EINVAL (config.json is a FIFO, a device or a
 * directory, or larger than 16 MB), -ELOOP, -EIO. */
int kvmem_config_load(kvmem_config *c, const char *dir);
/* Check the geometry is one the engine runs: every size positive and
 * within bounds (layers <= 1024, heads <= 1024, head_dim <= 1024 and even,
 * hidden and intermediate <= 1 << 20, vocab <= 1 << 24, window <= 1 << 30),
 * n_heads a multiple of n_kv_heads, rope_theta and rms_eps positive and
 * finite, bos/eos in [-1, vocab). 0 or -EINVAL. */
int kvmem_config_validate(const kvmem_config *c, const char *name);

/* Parameter count and KV bytes per token (raw K + V, all layers, at the
 * given bytes per element). */
uint64_t kvmem_config_params(const kvmem_config *c);
uint64_t kvmem_config_kv_bytes_per_token(const kvmem_config *c, int elem_bytes);
/*
 * A 64-bit fingerprint of the geometry and the tensors it implies, for
 * refusing a workspace built by another model: XXH64 (seed 0) of a text
 * that starts "kvmem-model-v1\n", then one "key value\n" line per field
 * that changes the KV state (arch, layers, hidden, heads, kv_heads,
 * head_dim, intermediate, vocab, rope_theta, rms_eps, tied), then one line
 * "name DTYPE [d0, d1]\n" per tensor in canonical order, DTYPE from
 * c->dtype ("bfloat16" -> BF16...). bos/eos and max_position are left out:
 * they do not change K or V. Two models with the same geometry but other
 * weights share it; kvmem_model.fingerprint tells those apart.
 */
uint64_t kvmem_config_fingerprint(const kvmem_config *c);

typedef struct kvmem_layer {
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
} kvmem_layer;

typedef struct kvmem_model {
	kvmem_config cfg;
	char dir[4096];
	const float *embed;	/* [vocab][hidden]  model.embed_tokens */
	const float *final_norm;/* [hidden]         model.norm */
	const float *lm_head;	/* [vocab][hidden]  lm_head (== embed when tied) */
	kvmem_layer *layers;	/* [n_layers] */
	/*
	 * The model fingerprint: like kvmem_config_fingerprint() but with each
	 * tensor's dtype as stored, and after each tensor's shape the XXH3-64
	 * of every one of its stored bytes, so models that differ in a single
	 * weight differ here too. The per-tensor digests are cached by file
	 * identity (Documentation/formats.md), so only a first open, or one
	 * after a file changed, reads every byte.
	 */
	uint64_t fingerprint;
	uint64_t hashed_bytes;	/* bytes this open read to hash (0: all from the cache) */
	char weight_dtype[8];	/* "BF16", "F16", "F32" or "mixed", as stored */
	int n_files;		/* safetensors files read */
	uint64_t file_bytes;	/* their total size */
	void *priv;		/* owned storage: maps, converted buffers */
} kvmem_model;

/*
 * Load a model directory. On failure returns a negative errno and
 * kvmem_last_error() names the file and the problem ("<dir>/model.safetensors:
 * tensor 'x' has shape [64, 32], config.json implies [96, 32]"); nothing is
 * leaked. The codes:
 *   -ENOENT   no such directory, no config.json, neither model.safetensors
 *             nor model.safetensors.index.json, a shard the index names is
 *             missing, or a file is a dangling symbolic link;
 *   -ENOTDIR  dir is not a directory;
 *   -EBADMSG  a file is not what it claims: JSON that does not parse
 *             (config.json, the index), a safetensors file that fails its
 *             checks (truncated, header past the end, bad offsets, overlaps);
 *   -EINVAL   well-formed files kvmem does not run or that disagree: an
 *             unsupported config (kvmem_config_parse), tensors missing,
 *             stray or of other shapes or dtypes than config.json implies,
 *             non-finite weights, a FIFO or device in a file's place;
 *   -ENOMEM   out of memory, or weights larger than the machine's memory;
 *   -ELOOP, -ENAMETOOLONG, -EIO and other open/read/map errors as such.
 *
 * Files are opened without blocking and must be regular files: a FIFO, a
 * device or a directory in a file's place is refused by name, and a
 * dangling symbolic link is called one. A tensor holding a NaN or an
 * infinite value is refused (found by the fingerprint pass, which reads
 * every byte anyway), and so is a name or string holding "\u0000" in
 * config.json, a safetensors header or the shard index.
 *
 * Every tensor the config implies must be present with that shape and a
 * dtype of BF16, F16 or F32 (converted to fp32 once; 4-byte-aligned F32 is
 * used in place from the mapping). lm_head.weight is absent when
 * tie_word_embeddings is true (and ignored if present). A tensor under
 * model.layers.N with N >= num_hidden_layers, any other unexpected name
 * under "model." or "lm_head", or a bias is an error (config and tensors
 * disagree); names outside those prefixes, and rotary inv_freq buffers,
 * are ignored.
 */
int kvmem_model_load(const char *dir, kvmem_model **out);
/* The same checks without converting or keeping weights: every weight
 * pointer is NULL; cfg, fingerprint, weight_dtype, n_files, file_bytes
 * are set. Cheap once the digests are cached (for `kvmem info`); a first
 * open reads every byte to hash it. */
#define KVMEM_MODEL_NO_WEIGHTS 1
int kvmem_model_open(const char *dir, int flags, kvmem_model **out);
void kvmem_model_free(kvmem_model *m);

/* ---- generator -------------------------------------------------------- */
typedef struct kvmem_preset {
	const char *name;	/* "tiny", "0.6b", ... "32b" */
	const char *what;	/* one line for --help */
	kvmem_config cfg;
} kvmem_preset;

/* NULL-terminated by name == NULL. */
extern const kvmem_preset kvmem_presets[];
const kvmem_preset *kvmem_preset_find(const char *name);

/* Write a Qwen3-shaped model directory (config.json, generation_config.json,
 * model.safetensors, bf16) with random weights from `seed`, scaled so
 * activations keep a sane size through every layer. Creates `dir` if needed.
 * progress, if set, is called now and then with bytes written / total.
 * 0, or -EINVAL (a config kvmem_config_validate refuses, a bad dtype),
 * -ENOSPC (too little free space, checked first), or the error of a write
 * (-EIO, ...). */
int kvmem_model_generate(const kvmem_config *c, const char *dir, uint64_t seed,
		       void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg);

/*
 * The generator with every option. Weights are N(0, s^2) from splitmix64
 * and Marsaglia's polar method, each tensor in 16384-element chunks seeded
 * by (seed, tensor index, chunk index), so the output does not depend on
 * threads or buffer sizes. s = 1/sqrt(hidden) for embeddings and lm_head,
 * 1/sqrt(fan_in) for q/k/v/gate/up, 1/sqrt(fan_in * 2 * n_layers) for
 * o_proj and down_proj (the 2 * n_layers residual branches add up to an
 * RMS below 1 however deep the model), norm weights 1.
 */
typedef struct kvmem_gen_opts {
	uint64_t seed;
	const char *dtype;	/* "bf16" (default when NULL), "f16" or "f32" */
	uint64_t shard_bytes;	/* 0: one model.safetensors; else shards of at most
				 * this many data bytes (a bigger tensor gets its own)
				 * named model-0000i-of-0000n.safetensors, plus
				 * model.safetensors.index.json */
	void (*progress)(uint64_t done, uint64_t total, void *arg);
	void *arg;
} kvmem_gen_opts;
int kvmem_model_generate_opts(const kvmem_config *c, const char *dir, const kvmem_gen_opts *o);
/*
 * Remove what a killed generator left in dir: its temporary files are named
 * ".<name>" KVMEM_TMP_TAG "<pid>", and those whose process is gone are unlinked
 * (a live one's are kept). Returns how many went (0 when dir is absent),
 * or a negative errno value. kvmem_model_generate_opts() calls it first.
 */
#define KVMEM_TMP_TAG ".kvmem-tmp-"
int kvmem_model_remove_stale_tmp(const char *dir);
/* Bytes the safetensors file(s) will take, without writing anything; 0 and
 * an error set if the config is invalid. */
uint64_t kvmem_model_generate_bytes(const kvmem_config *c, const kvmem_gen_opts *o);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
