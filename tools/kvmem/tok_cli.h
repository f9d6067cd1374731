/* SPDX-License-Identifier: MIT */
/*
 * Text for the commands (kvmem serve, kvmem run --prompt-text/--chat): the
 * model directory's tokenizer behind kvmem/tokenizer.h, and how an
 * assistant's turn is closed in the history.
 *
 * A directory with tokenizer.json gets the byte-level BPE (and the Qwen3
 * chat template when its vocabulary has <|im_start|>); an agentlang model
 * (kvmem's own, `agentlang_check_model`) gets agentlang's word-level
 * tokenizer with a template of its own: <bos> first, each message's text,
 * a newline between messages, an assistant's turn is its answer, <end> and
 * a newline. Generation stops at <end> (agentlang) or <|im_end|> /
 * <|endoftext|> (Qwen3).
 */
#ifndef KVMEM_TOOLS_TOK_CLI_H
#define KVMEM_TOOLS_TOK_CLI_H

#include <stdint.h>

#include "kvmem/model.h"
#include "kvmem/tokenizer.h"

struct tok_cli {
	kvmem_tokenizer *tok;
	int agentlang;		/* 1: the agentlang tokenizer */
	int32_t stop[8];	/* ids that end an assistant's turn */
	int n_stop;
	/* Ids appended after a turn that ended on stop[0] (after_stop), or on
	 * anything else (after_other: the length limit, another stop id), so
	 * the history holds a well-formed turn either way. */
	kvmem_ids after_stop, after_other;
};

/* Open the tokenizer of model directory dir (config c). -ENOENT (with a
 * message) when it has none: no tokenizer.json and not an agentlang model. */
int tok_cli_open(const char *dir, const kvmem_config *c, struct tok_cli *t);
/* The bytes tokenizer (kvmem_tokenizer_bytes) for a model of config c,
 * whatever its directory holds: --tokenizer bytes, --preset. It stops at
 * the model's eos id, if it has one; no chat template. */
int tok_cli_open_bytes(const kvmem_config *c, struct tok_cli *t);
void tok_cli_close(struct tok_cli *t);
/* 1 when id ends an assistant's turn. */
int tok_cli_is_stop(const struct tok_cli *t, int32_t id);

#endif
