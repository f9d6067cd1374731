// SPDX-License-Identifier: MIT
/*
 * Model presets for the generator: `tiny` for tests and the demo, and the
 * geometries of the published Qwen3 dense models (from their config.json:
 * layers, hidden, heads, KV heads, head_dim, intermediate, vocab, tied).
 */
#include <string.h>

#include "kvmem/model.h"

#define QWEN3(L, H, NH, NKV, I, TIED)                                                   \
	{ .arch = "Qwen3ForCausalLM", .n_layers = L, .hidden = H, .n_heads = NH,         \
	  .n_kv_heads = NKV, .head_dim = 128, .intermediate = I, .vocab = 151936,        \
	  .max_position = 40960, .rope_theta = 1000000.0, .rms_eps = 1e-6f,              \
	  .tie_embeddings = TIED, .bos_id = 151643, .eos_id = 151645, .dtype = "bfloat16" }

const kvmem_preset kvmem_presets[] = {
	{ "tiny", "4 layers, hidden 256, vocab 1024: tests, demo",
	  { .arch = "Qwen3ForCausalLM", .n_layers = 4, .hidden = 256, .n_heads = 4,
	    .n_kv_heads = 2, .head_dim = 64, .intermediate = 512, .vocab = 1024,
	    .max_position = 4096, .rope_theta = 1000000.0, .rms_eps = 1e-6f,
	    .tie_embeddings = 1, .bos_id = 1, .eos_id = 2, .dtype = "bfloat16" } },
	{ "0.6b", "the geometry of Qwen3-0.6B", QWEN3(28, 1024, 16, 8, 3072, 1) },
	{ "1.7b", "the geometry of Qwen3-1.7B", QWEN3(28, 2048, 16, 8, 6144, 1) },
	{ "4b", "the geometry of Qwen3-4B", QWEN3(36, 2560, 32, 8, 9728, 1) },
	{ "8b", "the geometry of Qwen3-8B", QWEN3(36, 4096, 32, 8, 12288, 0) },
	{ "14b", "the geometry of Qwen3-14B", QWEN3(40, 5120, 40, 8, 17408, 0) },
	{ "32b", "the geometry of Qwen3-32B", QWEN3(64, 5120, 64, 8, 25600, 0) },
	{ NULL, NULL, { .n_layers = 0 } },
};

const kvmem_preset *kvmem_preset_find(const char *name)
{
	for (const kvmem_preset *p = kvmem_presets; name && p->name; p++)
		if (!strcmp(p->name, name))
			return p;
	return NULL;
}
