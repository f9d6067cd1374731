/* SPDX-License-Identifier: MIT */
/* A session's state, shared by session.c (steps) and view.c (selection and
 * rematerialisation). Private to user/workspace. */
#ifndef KVMEM_WORKSPACE_SESSION_INT_H
#define KVMEM_WORKSPACE_SESSION_INT_H

#include "kvmem/workspace.h"

struct kvm_session {
	kvm_engine *e;
	kvm_config cfg;
	kvm_session_opts o;		/* defaults resolved */
	const kvm_policy_ops *pol;
	int n_sets;			/* 1, or n_layers for a per-layer policy */
	int64_t budget;			/* resolved: huge when unlimited */
	int64_t cap_limit;		/* budget + reserve: most slots the view takes */

	kvm_blocks blocks;
	kvm_index index;
	kvm_page_source own_src;	/* used when the caller gives none */
	const kvm_page_source *src;

	int32_t *tokens;
	int64_t cap_tokens;

	/* The execution view: plan.view_tokens history tokens at slots
	 * 0..view_len-1, then the tail: token p >= sel_tokens at slot
	 * view_len + (p - sel_tokens). */
	kvm_kvcache kv;
	kvm_plan plan;
	int64_t view_len, sel_tokens;

	/* Per forward pass: [L][chunk][...] as the engine returns them. */
	float *raw_k, *v, *q_raw, *logits, *last_logits;
	int have_logits;

	/* Raw queries of the last n_q tokens, [L][n_q][n_heads][D], packed. */
	float *qring, *qtmp;
	int64_t *qpos;
	int n_q;

	float *scores;
	int64_t cap_scores;
	int64_t scored_blocks;	/* blocks the last selection scored */
	int32_t *pos;			/* [block] compact positions for kvm_rope */
	uint64_t rng;
	kvm_session_stats st;
	int broken;			/* a failure left the view inconsistent */
};

/* view.c */
int ws_view_reserve(kvm_session *s, int64_t need);
int ws_select(kvm_session *s, int forced);
/* Lay out the whole view from the plan in force, sel_tokens and view_len
 * (a restored state): every slot rebuilt from the pages. */
int ws_view_restore(kvm_session *s);

/* adopt.c */
int ws_adopt_check(const kvm_session *s, const int32_t *tokens, int64_t n);
int ws_adopt_history(kvm_session *s, const int32_t *tokens, int64_t n);

#endif
