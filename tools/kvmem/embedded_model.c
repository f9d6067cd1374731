// SPDX-License-Identifier: MIT
/*
 * The shipped agentlang model (models/agentlang/), built into the kvmem binary
 * so that `kvmem demo` needs no file next to it: the demo writes these bytes
 * into the data directory the first time and loads them from there.
 * The assembler includes the files at build time (paths are relative to the
 * repository root, where make runs); the Makefile lists them as dependencies.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "embedded_model.h"
#include "util/fs.h"

#define EMBED(sym, path)                                                    \
	__asm__(".section .rodata\n"                                       \
		".global " #sym "\n"                                       \
		".balign 64\n" #sym ":\n"                                  \
		".incbin \"" path "\"\n"                                   \
		".global " #sym "_end\n" #sym "_end:\n"                    \
		".byte 0\n"                                                \
		".previous\n");                                            \
	extern const unsigned char sym[], sym##_end[]

EMBED(kvmem_emb_config, "models/agentlang/config.json");
EMBED(kvmem_emb_genconfig, "models/agentlang/generation_config.json");
EMBED(kvmem_emb_weights, "models/agentlang/model.safetensors");
EMBED(kvmem_emb_record, "models/agentlang/record.json");

const struct embedded_file embedded_model[] = {
	{ "config.json", kvmem_emb_config, kvmem_emb_config_end },
	{ "generation_config.json", kvmem_emb_genconfig, kvmem_emb_genconfig_end },
	{ "model.safetensors", kvmem_emb_weights, kvmem_emb_weights_end },
	{ "record.json", kvmem_emb_record, kvmem_emb_record_end },
	{ NULL, NULL, NULL },
};

static int same_file(const char *path, const unsigned char *data, size_t n)
{
	FILE *f = fopen(path, "rb");
	unsigned char buf[1 << 16];
	size_t off = 0, got;
	int same = 1;

	if (!f)
		return 0;
	while (same && (got = fread(buf, 1, sizeof(buf), f)) > 0) {
		same = off + got <= n && !memcmp(buf, data + off, got);
		off += got;
	}
	fclose(f);
	return same && off == n;
}

static int write_file(const char *path, const unsigned char *data, size_t n)
{
	char tmp[4200];
	int fd, rc;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return kvmem_error(EINVAL, "%s: path too long", path);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0)
		return kvmem_error(errno, "%s: cannot create: %s", tmp, strerror(errno));
	if ((rc = kvmem_write_all(fd, data, n, -1)) < 0) {
		close(fd);
		unlink(tmp);
		return kvmem_error(-rc, "%s: cannot write: %s", tmp, strerror(-rc));
	}
	if (fsync(fd)) {
		int e = errno;

		close(fd);
		unlink(tmp);
		return kvmem_error(e, "%s: cannot sync: %s", tmp, strerror(e));
	}
	if (close(fd) || rename(tmp, path)) {
		unlink(tmp);
		return kvmem_error(errno, "%s: cannot finish: %s", path, strerror(errno));
	}
	return 0;
}

int embedded_model_install(char *dir, size_t len)
{
	char base[4096], path[4096];
	int wrote = 0;

	if (!kvmem_data_dir(base, sizeof(base)))
		return kvmem_error(EINVAL, "the data directory's path is too long");
	if (snprintf(dir, len, "%s/models/agentlang", base) >= (int)len)
		return kvmem_error(EINVAL, "%s/models/agentlang: path too long", base);
	if (kvmem_mkdir_p(dir))
		return -1;
	for (int i = 0; embedded_model[i].name; i++) {
		const struct embedded_file *e = &embedded_model[i];
		size_t n = (size_t)(e->end - e->data);

		if (snprintf(path, sizeof(path), "%s/%s", dir, e->name) >= (int)sizeof(path))
			return kvmem_error(EINVAL, "%s: path too long", dir);
		if (same_file(path, e->data, n))
			continue;
		if (write_file(path, e->data, n))
			return -1;
		wrote = 1;
	}
	return wrote;
}
