/* SPDX-License-Identifier: MIT */
/*
 * The fuzzing harness's shared bits. Each fuzz_<target>.c defines
 * LLVMFuzzerTestOneInput over one of kvmem's parsers of untrusted input:
 *
 *   config       config.json (kvmem_config_parse)
 *   safetensors  a safetensors header (kvmem_st_parse)
 *   script       a session script (kvmem_script_open/check/next)
 *   tokens       a token-id file (kvmem_token_file_read)
 *   manifest     a workspace manifest (kvmem_workspace_info_read, verify)
 *   state        a session state (kvmem_session_adopt_state)
 *   json         any text through the strict JSON reader (kvmem_json_load)
 *   tokenizer    a tokenizer.json (kvmem_tokenizer_load_file), then a text
 *
 * `make fuzz` builds each with clang's libFuzzer (plus ASan and UBSan) and
 * runs it for FUZZ_SECONDS from the seeds in tests/fuzz/corpus/<target>/;
 * what crashes lands in tests/fuzz/crashes/<target>/, to be committed with
 * its fix. `make test` replays every seed and every crash ever found under
 * ASan/UBSan through tests/unit/test_fuzz_<target>.c (fuzz_replay.h).
 * Documentation/testing.md says more.
 */
#ifndef KVMEM_TESTS_FUZZ_H
#define KVMEM_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The bytes as a file the path-taking parsers can open: a memfd, named
 * through /proc/self/fd. Returns the fd (close it after) or -1. */
static inline int fuzz_file(const uint8_t *data, size_t size, char *path, size_t len)
{
	int fd = memfd_create("kvmem-fuzz", MFD_CLOEXEC);
	size_t done = 0;

	if (fd < 0)
		return -1;
	while (done < size) {
		ssize_t w = write(fd, data + done, size - done);

		if (w <= 0) {
			close(fd);
			return -1;
		}
		done += (size_t)w;
	}
	snprintf(path, len, "/proc/self/fd/%d", fd);
	return fd;
}

#endif
