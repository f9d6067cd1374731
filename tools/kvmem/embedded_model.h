/* SPDX-License-Identifier: MIT */
/* The shipped agentlang model's files, built into the binary. */
#ifndef KVMEM_TOOLS_EMBEDDED_MODEL_H
#define KVMEM_TOOLS_EMBEDDED_MODEL_H

#include <stddef.h>

struct embedded_file {
	const char *name;
	const unsigned char *data, *end;
};

/* NULL-terminated by name. */
extern const struct embedded_file embedded_model[];
/* Make sure <data dir>/models/agentlang holds exactly the embedded files
 * (written atomically when absent or different); the path goes into dir. */
int embedded_model_install(char *dir, size_t len);

#endif
