/* SPDX-License-Identifier: MIT */
/*
 * kvmem run: the options of both its modes, read by one getopt_long table
 * in cmd_run.c. A plain run (cmd_run.c) prefills a prompt and decodes; an
 * agent session (--script, session_main.c) runs a script of steps over a
 * workspace.
 */
#ifndef KVMEM_TOOLS_RUN_H
#define KVMEM_TOOLS_RUN_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "kvmem/model.h"

#define RUN_WHO "kvmem run"

struct run_opts {
	const char *model;
	/* plain runs */
	const char *prompt, *logits;
	const char *prompt_text, *chat;	/* --prompt-text TEXT, --chat FILE (run_text.c) */
	int64_t random_n, decode;	/* random_n -1: no --random */
	/* agent sessions */
	const char *script, *workspace, *policy, *cache_policy, *backend;
	const char *pager;		/* who reads pages back: "uring" (NULL) or "kmod" */
	const char *trace;		/* --trace: record the session for kvmem lab */
	uint64_t host_cap;		/* 0: the pager's default */
	uint64_t gpu_mem;		/* the backend's device memory cap; 0: none */
	uint32_t kv_dtype;		/* --kv-dtype: 0 (the backend's own) or KVMEM_DTYPE_FP8 */
	int tp;				/* --tp: tensor parallel ranks; 0: off */
	int64_t budget, sink, recent, reserve;	/* -1: the session's default */
	int block, query_tokens;	/* 0: the session's default */
	int layout;			/* --layout: enum kvmem_layout; 0: the default */
	int json, check_exact;
	/* both */
	int chunk;			/* 0: the mode's default */
	uint64_t seed;
	int sample_seed_set;
	kvmem_sampler sampler;
};

/* A plain run's prompt as text or a chat (run_text.c): its ids, malloc'd;
 * the generated ids printed as "text: ..." (up to a stop token). */
int run_text_prompt(const struct run_opts *o, const kvmem_config *c, int32_t **ids, int *n);
int run_text_print(const struct run_opts *o, const kvmem_config *c, const int32_t *gen, long n);
void run_text_close(void);

/* The agent-session mode (session_main.c). */
int session_main(const struct run_opts *o);

/*
 * 1 when every one of the n values is finite. The CLI refuses to sample
 * from logits that are not: a NaN would otherwise decode as token 0.
 */
int run_logits_finite(const float *logits, int64_t n);

#endif
