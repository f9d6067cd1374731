// SPDX-License-Identifier: MIT
/* Fuzz target: a safetensors file's header (kvmem_st_parse). */
#include "kvmem/kvmem.h"
#include "model/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvmem_st_file *f = NULL;

	if (kvmem_st_parse(data, size, "fuzz.safetensors", &f) == 0)
		kvmem_st_close(f);
	return 0;
}
