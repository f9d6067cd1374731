/* SPDX-License-Identifier: MIT */
/* The small JSON files of a Hugging Face model directory, as the generator
 * writes them (each to a temporary name, synced, then renamed). */
#ifndef KVMEM_MODEL_HFWRITE_H
#define KVMEM_MODEL_HFWRITE_H

#include <stdint.h>

#include "kvmem/model.h"

/* config.json with the keys and layout transformers writes for Qwen3. */
int kvmem_hf_write_config(const kvmem_config *c, const char *dir);
/* generation_config.json: bos, eos, greedy by default. */
int kvmem_hf_write_generation_config(const kvmem_config *c, const char *dir);
/* model.safetensors.index.json: total_size and weight_map (tensor names[i]
 * lives in shard shard_of[i], 0-based, of nshards). */
int kvmem_hf_write_index(const char *dir, uint64_t total_size, const char *const *names,
		       const int *shard_of, size_t n, int nshards);
/* "model-00002-of-00004.safetensors" */
void kvmem_hf_shard_name(char *buf, size_t len, int shard, int nshards);

#endif
