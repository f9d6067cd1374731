// SPDX-License-Identifier: MIT
/* Fuzz target: any text through the strict JSON reader (kvmem_json_load). */
#include <string.h>

#include "kvmem/kvmem.h"
#include "util/json.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *v = (json_t *)1;
	int rc = kvmem_json_load((const char *)data, size, "fuzz.json", &v);

	/* A tree, or a refusal naming the file: never both, never a crash. */
	if (rc == 0 ? !v : (v || (rc != -EBADMSG && rc != -ENOMEM) ||
			    strncmp(kvmem_last_error(), "fuzz.json", 9)))
		__builtin_trap();
	json_decref(v);
	return 0;
}
