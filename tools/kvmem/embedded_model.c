// SPDX-License-Identifier: MIT
/*
 * The shipped agentlang model (models/agentlang/), built into the kvmem binary
 * so that `kvmem demo` needs no file next to it: the demo writes these bytes
 * into the data directory the first time and loads them from there.
 * The assembler includes the files at build time (paths are relative to the
 * repository root, where make runs); the Makefile lists them as dependencies.
 */
#include <stddef.h>

#include "embedded_model.h"

#define EMBED(sym, path)                                                    \
	__asm__(".section .rodata\n"                                       \
		".global " #sym "\n"                                       \
		".balign 64\n" #sym ":\n"                                  \
		".incbin \"" path "\"\n"                                   \
		".global " #sym "_end\n" #sym "_end:\n"                    \
		".byte 0\n"                                                \
		".previous\n");                                            \
	extern const unsigned char sym[], sym##_end[]

EMBED(kvm_emb_config, "models/agentlang/config.json");
EMBED(kvm_emb_genconfig, "models/agentlang/generation_config.json");
EMBED(kvm_emb_weights, "models/agentlang/model.safetensors");
EMBED(kvm_emb_record, "models/agentlang/record.json");

const struct embedded_file embedded_model[] = {
	{ "config.json", kvm_emb_config, kvm_emb_config_end },
	{ "generation_config.json", kvm_emb_genconfig, kvm_emb_genconfig_end },
	{ "model.safetensors", kvm_emb_weights, kvm_emb_weights_end },
	{ "record.json", kvm_emb_record, kvm_emb_record_end },
	{ NULL, NULL, NULL },
};
