// SPDX-License-Identifier: MIT
/* Fuzz target: a tokenizer.json (kvmem_tokenizer_load_file), and when one
 * loads, a text through it and back. */
#include <stdlib.h>

#include "kvmem/kvmem.h"
#include "kvmem/tokenizer.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[64];
	int fd = fuzz_file(data, size, path, sizeof(path));
	kvmem_tokenizer *t;

	if (fd < 0)
		return 0;
	if (kvmem_tokenizer_load_file(path, &t) == 0) {
		static const char text[] = "hello world <|im_start|>aaaa\xc3\xa9 1234\n";
		kvmem_ids ids = { 0 };
		char *back = NULL;
		size_t len;

		if (kvmem_tokenizer_encode(t, text, sizeof(text) - 1, KVMEM_TOK_SPECIAL, &ids) == 0)
			kvmem_tokenizer_decode(t, ids.v, ids.n, 0, &back, &len);
		free(back);
		kvmem_ids_free(&ids);
		kvmem_tokenizer_free(t);
	}
	close(fd);
	return 0;
}
