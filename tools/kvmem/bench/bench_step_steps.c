// SPDX-License-Identifier: MIT
/*
 * kvmem bench step, phases step and decode: the time from a question's append
 * to the first decoded token over a workspace, host tier warm and cold, and
 * decode's tokens/s in that session, beside the view's own prefill and plain
 * decode.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_step.h"

static void count_select(void *arg, const kvmem_plan *p, int forced)
{
	struct step_result *r = arg;

	r->selections++;
	r->entering += p->entering;
}

/* One tier: a session over the workspace, steps timed, decode timed. */
int run_tier(struct ctx *x, const kvmem_model *m, const char *dir, int64_t tokens,
	     uint64_t host_cap, int steps, int do_decode, int move, struct step_result *r)
{
	kvmem_workspace_opts wo = { .block = BLOCK, .host_cap = host_cap,
				    .dtype = x->o.kv_dtype };
	kvmem_session_opts so;
	kvmem_workspace *w = NULL;
	kvmem_session *s = NULL;
	kvmem_pager_stats ps0, ps1;
	int32_t q[128], tok;
	double t0;
	int rc = -1;

	memset(r, 0, sizeof(*r));
	if (kvmem_workspace_open(dir, m, &wo, &w) < 0)
		return -1;
	kvmem_session_opts_default(&so);
	so.block = BLOCK;
	so.budget = x->o.view;
	so.chunk = 128;
	so.source = kvmem_workspace_source(w);
	so.on_select = count_select;
	so.arg = r;
	so.host_scoring = x->o.host_scoring;
	so.policy = x->o.policy;
	so.seed = x->o.seed;
	if (!move)	/* the peer: shifted tokens placed again from their pages */
		setenv("KVMEM_MOVE", "0", 1);
	s = kvmem_session_create(x->b, &so);
	unsetenv("KVMEM_MOVE");
	if (!s)
		goto out;
	{
		kvmem_place_stats a, d;

		place_now(x, &a);
		t0 = cli_now_s();
		if (kvmem_workspace_adopt(w, s) < 0)
			goto out;
		r->adopt_s = cli_now_s() - t0;
		place_delta(x, &a, &d);
		r->filled_pages = d.filled_pages;
		r->filled_bytes = d.filled_bytes;
		r->fill_s = d.fill_ns / 1e9;
		r->pool_pages = d.pool_pages;
		r->pool_cap = d.pool_cap;
	}
	for (int i = 0; i < steps && i < 64; i++) {
		kvmem_place_stats a, d;
		kvmem_session_stats s0, sa, s1;
		double ta, t1, t2;

		/* Odd steps follow up on the step before (the same question
		 * again: the same topic), even ones change the subject. */
		random_ids(q, x->o.question, m->cfg.vocab, x->o.seed * 1000 + (uint64_t)(i / 2));
		place_now(x, &a);
		kvmem_pager_stats_get(kvmem_workspace_pager(w), &ps0);
		r->entering = 0;
		kvmem_session_get_stats(s, &s0);
		/* From the question's append: its prefill over the view as it
		 * is (whose queries the selection reads) is waited for too. */
		t0 = cli_now_s();
		if (kvmem_session_append(s, q, x->o.question, 0) < 0)
			goto out;
		ta = cli_now_s();
		kvmem_session_get_stats(s, &sa);
		if (kvmem_session_select(s) < 0)
			goto out;
		t1 = cli_now_s();
		r->entered[i] = r->entering;
		if (kvmem_session_decode(s, 1, NULL, &tok) < 0)
			goto out;
		t2 = cli_now_s();
		place_delta(x, &a, &d);
		kvmem_session_get_stats(s, &s1);
		kvmem_pager_stats_get(kvmem_workspace_pager(w), &ps1);
		r->step_s[i] = t2 - t0;
		r->ask_s[i] = ta - t0;
		r->ask_fwd_ms[i] = (sa.forward_ns - s0.forward_ns) / 1e6;
		r->ask_store_ms[i] = (sa.store_ns - s0.store_ns) / 1e6;
		r->ask_writer_ms[i] = (sa.writer_ns - s0.writer_ns) / 1e6;
		r->ask_pages_ms[i] = (sa.writer_pages_ns - s0.writer_pages_ns) / 1e6;
		r->ask_wait_ms[i] = (sa.last_wait_ns - s0.last_wait_ns) / 1e6;
		r->select_s[i] = t1 - ta;
		r->decode_s[i] = t2 - t1;
		r->bytes[i] = d.bytes_in;
		r->tokens[i] = d.tokens;
		r->pool_hits[i] = d.pool_hits;
		r->pool_bytes[i] = d.pool_bytes;
		r->place_ms[i] = d.ns / 1e6;
		/* The session's counters: every backend keeps them. */
		r->moved[i] = (uint64_t)(s1.moved_tokens - s0.moved_tokens);
		r->src_pages[i] = (uint64_t)(s1.source_pages - s0.source_pages);
		r->move_ms[i] = d.move_ns / 1e6;
		r->staged[i] = d.move_staged_tokens;
		r->score_ms[i] = (s1.score_ns - s0.score_ns) / 1e6;
		r->plan_ms[i] = (s1.plan_ns - s0.plan_ns) / 1e6;
		r->smove_ms[i] = (s1.move_ns - s0.move_ns) / 1e6;
		r->splace_ms[i] = (s1.place_ns - s0.place_ns) / 1e6;
		r->after_ms[i] = (s1.select_after_ns - s0.select_after_ns) / 1e6;
		r->nvme_pages[i] = ps1.pages_in - ps0.pages_in;
	}
	r->mem_used = x->b->ops->mem_used ? x->b->ops->mem_used(x->b->ctx) : 0;
	/* Once more with nothing new: nothing moves, what is left is the
	 * scoring of every block and the plan. */
	if (kvmem_session_select(s) < 0)
		goto out;
	t0 = cli_now_s();
	if (kvmem_session_select(s) < 0)
		goto out;
	r->select_only_s = cli_now_s() - t0;
	{
		const kvmem_index *ix = kvmem_session_index(s);
		kvmem_session_stats st;

		kvmem_session_get_stats(s, &st);
		r->device_scored = st.device_scored;
		r->index_dev = st.index_device_bytes;
		r->index_host = (uint64_t)ix->n_layers * ix->n_kv_heads * ix->n_blocks *
				ix->head_dim * 4;
	}
	if (do_decode) {
		kvmem_session_stats a, b;

		kvmem_session_get_stats(s, &a);
		r->dec_view = kvmem_session_view_len(s);
		t0 = cli_now_s();
		if (kvmem_session_decode(s, x->o.decode, NULL, NULL) < 0)
			goto out;
		r->decode_tps = x->o.decode / (cli_now_s() - t0);
		kvmem_session_get_stats(s, &b);
		r->dec_fwd_ms = (b.forward_ns - a.forward_ns) / 1e6 / x->o.decode;
		r->dec_store_ms = (b.store_ns - a.store_ns) / 1e6 / x->o.decode;
		r->dec_own_ms = (b.own_ns - a.own_ns) / 1e6 / x->o.decode;
		r->dec_forced = b.forced - a.forced;
	}
	rc = 0;
out:
	if (rc)
		fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
	kvmem_session_free(s);
	if (w)
		kvmem_workspace_close(w);
	return rc;
}

/* Where the last selection was scored and where the index it read lives. */
const char *scored_where(const struct step_result *r)
{
	if (!r->device_scored)
		return "on the host";
	if (r->index_dev >= r->index_host)
		return "on the device, from its copy of the index";
	return "on the device, reading the host's index over PCIe";
}

/* A ratio against a ceiling, and "slower" below 1. */
static const char *below(double ratio)
{
	return ratio < 1 ? " (slower)" : "";
}

/*
 * Bytes entered against bytes moved, by where they came from, each held
 * against the same run's ceiling: pages from host memory at the pinned
 * copy rate, pages from the device pool and tokens moved inside the view
 * at the device copy rate (which counts bytes read plus written: a page
 * from the pool or a moved token has its K and V read and K, V and raw K
 * written, 2.5 times its bytes). Ratio: the time at the ceilings over the
 * time taken (place(), move()), "slower" below 1.
 */
static void print_moved(const struct ctx *x, const struct step_result *r, int i, double in)
{
	const double kv = 2.0 * x->geo.cfg.n_kv_heads * x->geo.cfg.head_dim * 2;	/* K+V bf16 */
	const double host = (double)r->bytes[i], pool = (double)r->pool_bytes[i];
	const double moved = (double)r->moved[i] * kv, staged = (double)r->staged[i] * kv;
	double place_floor = 0, move_floor = 0, pr = 0, mr = 0;

	if (x->ce.h2d_gbps > 0)
		place_floor += host / (x->ce.h2d_gbps * 1e9);
	if (x->ce.copy_gbps > 0) {
		place_floor += 2.5 * pool / (x->ce.copy_gbps * 1e9);
		move_floor = 2.5 * moved / (x->ce.copy_gbps * 1e9);
	}
	if (r->place_ms[i] > 0)
		pr = place_floor * 1e3 / r->place_ms[i];
	if (r->move_ms[i] > 0)
		mr = move_floor * 1e3 / r->move_ms[i];
	printf("      bytes: %.2f GB entered; moved %.2f GB from host memory + %.2f GB from the "
	       "device page pool (%.2f of what entered) in %.1f ms, %.2f of the ceilings' %.1f ms%s; "
	       "%.2f GB moved inside the view (%.2f GB of sources copied aside first) in %.1f ms, "
	       "%.2f of the device copy rate's %.1f ms%s\n",
	       in / 1e9, host / 1e9, pool / 1e9, in > 0 ? (host + pool) / in : 0.0, r->place_ms[i],
	       pr, place_floor * 1e3, r->place_ms[i] > 0 ? below(pr) : "", moved / 1e9,
	       staged / 1e9, r->move_ms[i], mr, move_floor * 1e3, r->move_ms[i] > 0 ? below(mr) : "");
}

static void print_steps(struct ctx *x, const char *tier, const struct step_result *r, int steps,
			double peer)
{
	const double L = x->geo.cfg.n_layers;
	double med = median(r->step_s, steps), follow[64], fresh[64];
	int nf = 0, nn = 0;
	char b1[32], b2[32];

	printf("  %s (first view laid out in %.2f s; a selection that moves nothing "
	       "takes %.1f ms: scoring every block %s, and planning):\n", tier, r->adopt_s,
	       r->select_only_s * 1e3, scored_where(r));
	if (r->pool_cap)
		printf("    device page pool: %" PRIu64 " slots (%.2f GB); after the first view "
		       "%" PRIu64 " pages in it, %" PRIu64 " of them (%.2f GB) filled ahead from host "
		       "memory in %.3f s (%.1f GB/s; pinned peak %.1f GB/s)\n", r->pool_cap,
		       r->pool_cap * (double)x->page_bytes / 1e9, r->pool_pages, r->filled_pages,
		       r->filled_bytes / 1e9, r->fill_s, r->fill_s > 0 ? r->filled_bytes / r->fill_s / 1e9 : 0,
		       x->ce.h2d_gbps);
	for (int i = 0; i < steps; i++) {
		/* What entered against what moved: the pages of the blocks new
		 * to the view, against the bytes the step read from host memory
		 * (NVMe reads land there first). */
		double in = (double)r->entered[i] * L * x->page_bytes;

		printf("    step %d (%s): %.1f ms (the question's prefill %.1f ms, selection + "
		       "rematerialisation %.1f ms, first token %.1f ms); %" PRId64 " blocks entered (%.2f GB of pages); %.2f GB read from "
		       "host memory (%.2f of what entered), %" PRIu64 " pages from NVMe, %" PRIu64
		       " from the device page pool; %" PRIu64 " pages got from the source (%.2f of "
		       "the entered blocks'); %" PRIu64 " token-layers placed from pages, %" PRIu64
		       " moved inside the view (%.1f ms)\n", i + 1, i % 2 ? "follow-up" : "new subject",
		       r->step_s[i] * 1e3, r->ask_s[i] * 1e3, r->select_s[i] * 1e3,
		       r->decode_s[i] * 1e3, r->entered[i],
		       in / 1e9, r->bytes[i] / 1e9, in > 0 ? r->bytes[i] / in : 0.0, r->nvme_pages[i],
		       r->pool_hits[i], r->src_pages[i],
		       r->entered[i] ? r->src_pages[i] / (r->entered[i] * L) : 0.0, r->tokens[i],
		       r->moved[i], r->move_ms[i]);
		print_moved(x, r, i, in);
		printf("      the question's split: forward %.1f ms, rows put away in line %.1f, on "
		       "the writer %.1f (pages %.1f), waited for %.1f; the rest %.1f\n",
		       r->ask_fwd_ms[i], r->ask_store_ms[i], r->ask_writer_ms[i], r->ask_pages_ms[i],
		       r->ask_wait_ms[i], r->ask_s[i] * 1e3 - r->ask_fwd_ms[i] - r->ask_store_ms[i] -
		       r->ask_wait_ms[i]);
		printf("      selection's split: scoring %.1f ms, planning %.1f, moves %.1f, placements "
		       "%.1f (of which the backend's place() %.1f), after %.1f; the rest %.1f\n",
		       r->score_ms[i], r->plan_ms[i], r->smove_ms[i], r->splace_ms[i], r->place_ms[i],
		       r->after_ms[i], r->select_s[i] * 1e3 - r->score_ms[i] - r->plan_ms[i] -
		       r->smove_ms[i] - r->splace_ms[i] - r->after_ms[i]);
		if (i % 2)
			follow[nf++] = r->step_s[i];
		else
			fresh[nn++] = r->step_s[i];
	}
	printf("    median step %.1f ms: %s than prefilling the view (%.2f s)\n", med * 1e3,
	       vs(b1, sizeof(b1), peer, med), peer);
	if (nf && nn)
		printf("    median new subject %.1f ms (%s), follow-up %.1f ms (%s)\n",
		       median(fresh, nn) * 1e3, vs(b1, sizeof(b1), peer, median(fresh, nn)),
		       median(follow, nf) * 1e3, vs(b2, sizeof(b2), peer, median(follow, nf)));
}

int ph_step(struct ctx *x, int phases)
{
	char dir[4200];
	struct step_result warm, cold;
	uint64_t ws_bytes = (uint64_t)(x->o.tokens / BLOCK) * x->geo.cfg.n_layers * x->page_bytes;
	uint64_t small = (uint64_t)x->o.view / BLOCK * x->geo.cfg.n_layers * x->page_bytes / 2;
	double made;
	int steps = x->o.steps < 64 ? x->o.steps : 64, rc = -1;

	snprintf(dir, sizeof(dir), "%s/step", x->o.dir);
	if (peers(x) < 0)
		return -1;
	if (make_workspace(x, &x->geo, dir, x->o.tokens / BLOCK * BLOCK, &made) < 0)
		return -1;
	printf("\nagent step: workspace %" PRId64 " tokens (%.2f GB of %s pages, written in %.1f s), "
	       "view %" PRId64 " tokens, question %d tokens, %s\n", x->o.tokens, ws_bytes / 1e9,
	       kvmem_dtype_name(x->o.kv_dtype), made, x->o.view, x->o.question, x->o.policy);
	if (small < (256ull << 20))
		small = 256ull << 20;
	if ((x->o.tiers & TIER_WARM) &&
	    run_tier(x, &x->geo, dir, x->o.tokens, x->o.host_cap ? x->o.host_cap :
		     ws_bytes + (ws_bytes >> 3) + (256ull << 20), steps, phases & PH_DECODE, 1,
		     &warm) < 0)
		goto out;
	if (x->o.tiers & TIER_WARM) {
		print_steps(x, "warm host tier", &warm, steps, x->prefill_view_s);
		x->warm_step_s = median(warm.step_s, steps);
		x->warm_first_s = median(warm.decode_s, steps);
		x->warm_ask_s = median(warm.ask_s, steps);
		{
			double sel = 0, blocks = 0;

			for (int i = 0; i < steps; i++)
				sel += warm.select_s[i], blocks += (double)warm.entered[i];
			x->warm_sel_per_block_s = blocks > 0 ? sel / blocks : 0;
		}
		x->warm_decode_tps = phases & PH_DECODE ? warm.decode_tps : 0;
	}
	if (x->o.tiers & TIER_PAGES) {
		struct step_result pages;

		if (run_tier(x, &x->geo, dir, x->o.tokens, x->o.host_cap ? x->o.host_cap :
			     ws_bytes + (ws_bytes >> 3) + (256ull << 20), steps, 0, 0, &pages) < 0)
			goto out;
		printf("\n");
		print_steps(x, "warm host tier, moves off (KVMEM_MOVE=0: every token that shifts "
			    "placed again from its page, the path before moves; the peer)", &pages,
			    steps, x->prefill_view_s);
	}
	if ((phases & PH_DECODE) && (x->o.tiers & TIER_WARM))
		printf("\ndecode in a %" PRId64 "-token view over %" PRId64 " tokens: %.1f tokens/s; "
		       "plain decode at %" PRId64 ": %.1f tokens/s; ratio %.2f\n", x->o.view,
		       x->o.tokens, warm.decode_tps, x->o.view, x->plain_decode_tps,
		       warm.decode_tps / x->plain_decode_tps);
	if ((phases & PH_DECODE) && (x->o.tiers & TIER_WARM))
		printf("    per token: forward %.3f ms, rows put away in line (index, pages, queries) %.3f ms, own "
		       "%.3f ms; plain %.3f ms in all; view %" PRId64 " tokens at the start (plain "
		       "%" PRId64 "), %" PRId64 " selections forced\n", warm.dec_fwd_ms,
		       warm.dec_store_ms, warm.dec_own_ms, 1e3 / x->plain_decode_tps, warm.dec_view,
		       x->o.view, warm.dec_forced);
	if (!(x->o.tiers & TIER_COLD)) {
		rc = 0;
		goto out;
	}
	if (run_tier(x, &x->geo, dir, x->o.tokens, small, steps, 0, 1, &cold) < 0)
		goto out;
	printf("\n");
	print_steps(x, "cold host tier", &cold, steps, x->prefill_view_s);
	printf("    (host pool %.2f GB: entering pages not in it come from NVMe)\n", small / 1e9);
	{
		/* What bounds a cold step: its pages from NVMe at the disk's
		 * sequential rate, measured now on the same file. */
		char path[4300];
		uint64_t sz = ws_bytes < (2ull << 30) ? ws_bytes : (2ull << 30);
		double seq, floor_s[64], med;
		char fl[32];

		snprintf(path, sizeof(path), "%s/pages", dir);
		seq = seq_read(path, sz, 8u << 20, 64);
		for (int i = 0; i < steps; i++)
			floor_s[i] = seq > 0 ? cold.nvme_pages[i] * (double)x->page_bytes / seq : 0;
		med = median(floor_s, steps);
		if (med > 0)
			printf("    NVMe floor (its pages at the O_DIRECT sequential read of the same "
			       "file, %.2f GB/s, measured now): median %.1f ms, at best %s than the "
			       "prefill\n", seq / 1e9, med * 1e3, vs(fl, sizeof(fl), x->prefill_view_s, med));
	}
	rc = 0;
out:
	if (!x->o.keep)
		rm_rf(dir);
	return rc;
}
