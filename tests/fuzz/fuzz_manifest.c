// SPDX-License-Identifier: MIT
/*
 * Fuzz target: a workspace manifest. The bytes become DIR/manifest of a
 * scratch workspace whose data files are empty; kvmem_workspace_info_read
 * and kvmem_workspace_verify must refuse a forged or torn one with an
 * error, never crash or allocate what a forged count asks for.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "fuzz.h"
#include "util/fs.h"
#include "kvmem/store.h"

static char ws_dir[64];

static void scratch(void)
{
	static const char *const files[] = { "pages", "sums", "index", "tokens", "tail" };

	snprintf(ws_dir, sizeof(ws_dir), "/tmp/kvmem-fuzz-manifest.%d", (int)getpid());
	mkdir(ws_dir, 0700);
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char p[128];
		int fd;

		snprintf(p, sizeof(p), "%s/%s", ws_dir, files[i]);
		if ((fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600)) >= 0)
			close(fd);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvmem_workspace_info wi;
	char p[128];
	int fd;

	if (!ws_dir[0])
		scratch();
	snprintf(p, sizeof(p), "%s/manifest", ws_dir);
	if ((fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0)
		return 0;
	if (kvmem_write_all(fd, data, size, -1) < 0) {
		close(fd);
		return 0;
	}
	close(fd);
	if (kvmem_workspace_info_read(ws_dir, &wi) == 0)
		kvmem_workspace_verify(ws_dir, NULL, 0);
	return 0;
}
