// SPDX-License-Identifier: MIT
/* Fuzz target: config.json text (kvmem_config_parse). */
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvmem_config c;

	if (kvmem_config_parse(&c, (const char *)data, size, "fuzz/config.json") == 0 &&
	    kvmem_config_validate(&c, "fuzz") != 0)
		__builtin_trap();	/* parse promises a valid config */
	return 0;
}
