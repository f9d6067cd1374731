// SPDX-License-Identifier: MIT
/* Fuzz target: a session script (kvmem_script_open, check, next). */
#include "kvmem/kvmem.h"
#include "kvmem/script.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[64];
	int fd = fuzz_file(data, size, path, sizeof(path));
	kvmem_script *sc;
	kvmem_script_step st;

	if (fd < 0)
		return 0;
	if (kvmem_script_open(path, 1000, 7, &sc) == 0) {
		if (kvmem_script_check(sc) == 0)
			while (kvmem_script_next(sc, &st) > 0)
				if (st.kind == KVMEM_STEP_APPEND && st.ids)
					for (int64_t i = 0; i < st.n; i++)
						if (st.ids[i] < 0 || st.ids[i] >= 1000)
							__builtin_trap();
		kvmem_script_close(sc);
	}
	close(fd);
	return 0;
}
