// SPDX-License-Identifier: MIT
/* Fuzz target: a token-id file (kvmem_token_file_read). */
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "kvmem/script.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[64];
	int fd = fuzz_file(data, size, path, sizeof(path));
	int32_t *ids = NULL;
	int64_t n = 0;

	if (fd < 0)
		return 0;
	if (kvmem_token_file_read(path, 151936, &ids, &n) == 0)
		for (int64_t i = 0; i < n; i++)
			if (ids[i] < 0 || ids[i] >= 151936)
				__builtin_trap();
	free(ids);
	close(fd);
	return 0;
}
