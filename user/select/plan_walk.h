/* SPDX-License-Identifier: MIT */
/*
 * The placements that take a view from one plan to the next, in the order
 * the session's rematerialisation makes them (view.c) and the lab replays
 * them (lab/replay.c): one walk, so the replay counts what the view moves.
 */
#ifndef KVMEM_WORKSPACE_PLAN_WALK_H
#define KVMEM_WORKSPACE_PLAN_WALK_H

#include "select/select.h"

/* Tokens [u0, u1) of block b in layer l sit at view slot `have` + u (have
 * < 0: not in the view) and belong at `want` + u. Nonzero stops the walk. */
typedef int (*ws_place_fn)(void *arg, int l, int64_t b, int u0, int u1, int64_t have,
			   int64_t want);

/*
 * Per layer, per block of np in chronological order: the block's tokens
 * before sel_tokens (those the old view can hold) from where the old plan
 * op put them (-1 where it did not hold the block), then the rest from the
 * view's tail, which holds the tokens appended since the last selection at
 * view_len - sel_tokens + their position. Returns 0, or the first nonzero
 * `place` returned.
 */
int ws_plan_walk(const kvmem_plan *op, const kvmem_plan *np, const kvmem_blocks *bl, int n_layers,
		 int64_t sel_tokens, int64_t view_len, ws_place_fn place, void *arg);

/*
 * The same placements without the runs that stay where they are (have ==
 * want): their token-layers are counted into *kept (may be NULL). Where
 * every layer has the same plan (one set, old and new), the runs are found
 * for one layer and replayed for each: a step over a 64K view then calls
 * place for the few hundred runs that change, not for the view's 147K
 * (block, layer) runs, a run's layers one after another (the same slots
 * back to back); otherwise in ws_plan_walk's order, layer by layer.
 */
int ws_plan_walk_changed(const kvmem_plan *op, const kvmem_plan *np, const kvmem_blocks *bl,
			 int n_layers, int64_t sel_tokens, int64_t view_len, ws_place_fn place,
			 void *arg, int64_t *kept);

/*
 * What a session tells its page source after planning np (view.c,
 * hint_selected; the lab replays it): into idx (nb entries), the blocks of
 * the view first (*n_in of them, score hint 1), then as many runners-up,
 * the best of the rest by score (sc: n_sets rows of nb; a block's best
 * row), hint 0.5. Returns how many of idx to send, or -ENOMEM.
 */
int64_t ws_plan_hints(const kvmem_plan *np, const float *sc, int n_sets, int64_t nb, int64_t *idx,
		      int64_t *n_in);

#endif
