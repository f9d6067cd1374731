// SPDX-License-Identifier: MIT
/*
 * Batched steps (kvmem/session.h): the forwards of many sessions on one
 * backend in one pass.
 *
 * A session's token run has three parts (session.c): ws_run_begin (room,
 * and a selection first when the tail is full), the forward, ws_run_end
 * (the tokens and rows put away, the logits kept). A batch runs every
 * item's first part one session after another, one forward_batch over all
 * the views, then every item's last part; the writer threads of sessions
 * that hand their rows to one work side by side. The call returns without
 * waiting for them, as kvmem_session_decode does (writer.c): each
 * session's next ws_run_end waits for its rows after the next forward,
 * which they overlap, and whatever reads a history before that waits
 * first. A failed item waits (its writer drained) before it is reported.
 *
 * The batched forward fails only as a whole, with nothing changed (a token
 * outside the vocabulary, no memory): the items then run one by one with
 * the plain forward, which gives the same bits (batch invariance), so a
 * failure is charged to the item that caused it and the others go on. A
 * backend without forward_batch takes that path every time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"	/* kvmem_pool_run */
#include "kvmem/kvmem.h"
#include "session/session_int.h"

/*
 * KVMEM_SESSION_BATCH_PROFILE=1 (read at the first batch) says where a
 * batched decode step's host time goes, for issue #26: the draws, the
 * items' first parts, the forward, their last parts and the step's end,
 * summed over the process's batched decode steps (one token an item) and
 * printed to stderr at exit
 * (the backend's own split of the forward: KVMEM_CUDA_BATCH_PROFILE).
 */
enum { PB_DRAWS, PB_BEGIN, PB_FORWARD, PB_END, PB_STEP_END, PB_PARTS };
static const char *const pb_name[PB_PARTS] = {
	"draws (each session's token from its logits)", "first parts (room, a selection when due)",
	"the forward", "last parts (tokens and rows put away, logits kept)",
	"the step's end (the writers' hand-off)" };
static int pb_on = -1;
static int64_t pb_ns[PB_PARTS], pb_steps, pb_items;

static void pb_print(void)
{
	int64_t sum = 0;

	for (int i = 0; i < PB_PARTS; i++)
		sum += pb_ns[i];
	if (!pb_steps)
		return;
	fprintf(stderr, "KVMEM_SESSION_BATCH_PROFILE: %lld batched steps, %.1f sessions a step, "
		"%.3f ms a step:\n", (long long)pb_steps, (double)pb_items / pb_steps,
		sum / 1e6 / pb_steps);
	for (int i = 0; i < PB_PARTS; i++)
		fprintf(stderr, "  %-50s %8.3f ms a step, %6.1f us a session\n", pb_name[i],
			pb_ns[i] / 1e6 / pb_steps, pb_ns[i] / 1e3 / pb_items);
}

/* t: the part's start, made the next one's; returns now. */
static int64_t pb_mark(int part, int64_t t)
{
	int64_t now = (int64_t)kvmem_now_ns();

	__atomic_fetch_add(&pb_ns[part], now - t, __ATOMIC_RELAXED);
	return now;
}

static int pb_enabled(void)
{
	if (pb_on < 0) {
		const char *e = getenv("KVMEM_SESSION_BATCH_PROFILE");

		pb_on = e && !strcmp(e, "1");
		if (pb_on)
			atexit(pb_print);
	}
	return pb_on;
}

/* Whether switch variable var is set to 0 (read once, into *cache: -1
 * until then). */
static int switched_off(const char *var, int *cache)
{
	if (*cache < 0) {
		const char *e = getenv(var);

		*cache = e && !strcmp(e, "0");
	}
	return *cache;
}

/*
 * KVMEM_SESSION_LAZY_LOGITS=0 (read at the first batch): every batched
 * decode step brings each item's logits to the host, as before 2026-12-06,
 * for A/B runs; by default a backend with logits_fetch keeps them and
 * returns the greedy draw (on the H100 host 2 ms of a 64-item step went to
 * the 39 MB of logits: their copy down, out of the pinned buffer and the
 * draws' pass over them; issue #26).
 */
static int lazy_off(void)
{
	static int off = -1;

	return switched_off("KVMEM_SESSION_LAZY_LOGITS", &off);
}

/*
 * KVMEM_SESSION_DEVICE_DRAW=0: a draw at a temperature reads its logits on
 * the host after each step, as before 2026-12-06 (the same tokens: the
 * device's draw is kvmem_sample's, kernels/draw_fixed.h), for a benchmark's
 * other side.
 */
static int draw_off(void)
{
	static int off = -1;

	return switched_off("KVMEM_SESSION_DEVICE_DRAW", &off);
}

/* Items on the stack up to this many; a larger batch allocates. */
#define STACK_ITEMS 64
/* Draws spread over the kernels' pool from this many sessions on. */
#define PAR_DRAWS 8

static void item_fail(kvmem_batch_item *it)
{
	it->rc = kvmem_fail();
	snprintf(it->err, sizeof(it->err), "%s", kvmem_last_error());
}

/* The call's own arguments: sessions distinct and on one backend. */
static int check_items(const kvmem_batch_item *items, int n)
{
	if (n < 0 || (n && !items))
		return kvmem_error(EINVAL, "session batch: %d items", n);
	for (int i = 0; i < n; i++) {
		if (!items[i].s)
			return kvmem_error(EINVAL, "session batch: item %d has no session", i);
		if (items[i].s->be != items[0].s->be)
			return kvmem_error(EINVAL, "session batch: items 0 and %d are sessions of "
					   "two backends", i);
	}
	/* Sessions in a batch are few (the server's --max-batch): pairs are cheap. */
	for (int i = 0; i < n; i++)
		for (int j = 0; j < i; j++)
			if (items[i].s == items[j].s)
				return kvmem_error(EINVAL, "session batch: items %d and %d are one "
						   "session", j, i);
	return 0;
}

/* The forwards of the live items (live[0..m)): all at once, or one by one
 * when the batched one cannot run. ns: the wall time each item is charged,
 * the batch's shared by tokens. */
static void forward_all(kvmem_backend *be, kvmem_batch_item *items, const int *live, int m,
			kvmem_fwd_item *fwd, int64_t *ns)
{
	int64_t t0 = (int64_t)kvmem_now_ns(), tokens = 0;

	if (kvmem_backend_forward_batch(be, fwd, m) == 0) {
		int64_t dt = (int64_t)kvmem_now_ns() - t0;

		for (int k = 0; k < m; k++)
			tokens += fwd[k].n;
		for (int k = 0; k < m; k++)
			ns[k] = dt * fwd[k].n / (tokens ? tokens : 1);
		return;
	}
	for (int k = 0; k < m; k++) {
		kvmem_batch_item *it = &items[live[k]];

		t0 = (int64_t)kvmem_now_ns();
		if (fwd[k].argmax)	/* a failed batch may have set it */
			*fwd[k].argmax = KVMEM_ARGMAX_NONE;
		if (be->ops->forward(be->ctx, fwd[k].v, fwd[k].tokens, fwd[k].n, fwd[k].logits,
				     fwd[k].all_logits, fwd[k].out)) {
			kvmem_error_prefix("session");
			item_fail(it);
		}
		ns[k] = (int64_t)kvmem_now_ns() - t0;
	}
}

int kvmem_session_append_batch(kvmem_batch_item *items, int n)
{
	kvmem_fwd_item fwd_stack[STACK_ITEMS], *fwd = fwd_stack;
	kvmem_fwd_out out_stack[STACK_ITEMS], *outs = out_stack;
	int live_stack[STACK_ITEMS], *live = live_stack;
	int64_t ns_stack[STACK_ITEMS], *ns = ns_stack;
	int m = 0, failed = 0;
	int prof = pb_enabled();	/* decode steps only: one token an item */
	int64_t t = 0;

	for (int i = 0; prof && i < n; i++)
		prof = items[i].n == 1;
	if (prof)
		t = (int64_t)kvmem_now_ns();

	if (check_items(items, n))
		return kvmem_fail();
	if (!n)
		return 0;
	if (n > STACK_ITEMS) {
		fwd = malloc(sizeof(*fwd) * (size_t)n);
		outs = malloc(sizeof(*outs) * (size_t)n);
		live = malloc(sizeof(*live) * (size_t)n);
		ns = malloc(sizeof(*ns) * (size_t)n);
		if (!fwd || !outs || !live || !ns) {
			if (fwd != fwd_stack)
				free(fwd);
			if (outs != out_stack)
				free(outs);
			if (live != live_stack)
				free(live);
			if (ns != ns_stack)
				free(ns);
			return kvmem_error(ENOMEM, "session batch: out of memory for %d items", n);
		}
	}
	/* First parts: each session makes room (and selects when it must). */
	for (int i = 0; i < n; i++) {
		kvmem_batch_item *it = &items[i];
		kvmem_session *s = it->s;

		it->rc = 0;
		it->err[0] = 0;
		if (ws_usable(s)) {
			item_fail(it);
		} else if (it->n <= 0 || it->n > s->o.chunk || !it->tokens) {
			kvmem_error(EINVAL, "session batch: an item runs 1..%d tokens (the session's "
				    "chunk), not %d", s->o.chunk, it->n);
			item_fail(it);
		} else if (ws_run_begin(s, it->n, &outs[m])) {
			ws_writer_drain(s);
			item_fail(it);
		} else {
			fwd[m] = (kvmem_fwd_item){ .v = s->view, .tokens = it->tokens, .n = it->n,
						   .logits = s->logits, .all_logits = s->o.all_logits,
						   .out = &outs[m] };
			/* A decode step's logits may stay on the backend,
			 * fetched when asked (ws_logits_host); its greedy
			 * draw comes back now. Only while the session draws
			 * greedily (or at a temperature the backend draws
			 * at: kvmem_fwd_item.draw) and its logits go unread; not when every
			 * forward's are handed out (on_forward) or kept
			 * (all_logits). */
			if (it->n == 1 && (s->draw_greedy || (s->plan_on && !draw_off())) &&
			    !s->logits_asked && !s->o.all_logits && !s->o.on_forward &&
			    s->be->ops->logits_fetch && !lazy_off()) {
				fwd[m].argmax = &s->dev_argmax;
				/* a draw at a temperature: made there too,
				 * as the last one was (ws_sample_with) */
				if (!s->draw_greedy) {
					fwd[m].draw = &s->next_draw;
					s->run_draw = 1;
				}
			}
			live[m++] = i;
		}
	}
	if (prof)
		t = pb_mark(PB_BEGIN, t);
	if (m)
		forward_all(items[live[0]].s->be, items, live, m, fwd, ns);
	if (prof)
		t = pb_mark(PB_FORWARD, t);
	/* Last parts: the rows to each session's history (each waits for its
	 * previous step's first, done during the forward by now). A failed
	 * item's writer is drained; the others' rows stay in flight. */
	for (int k = 0; k < m; k++) {
		kvmem_batch_item *it = &items[live[k]];

		if (it->rc) {
			ws_writer_drain(it->s);
		} else if (ws_run_end(it->s, it->tokens, it->n, &outs[k], ns[k])) {
			ws_writer_drain(it->s);
			item_fail(it);
		}
	}
	if (prof)
		t = pb_mark(PB_END, t);
	for (int k = 0; k < m; k++)	/* no wait, unless KVMEM_WRITER_DEFER=0 */
		if (!items[live[k]].rc && ws_step_end(items[live[k]].s))
			item_fail(&items[live[k]]);
	if (prof) {
		pb_mark(PB_STEP_END, t);
		__atomic_fetch_add(&pb_steps, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&pb_items, m, __ATOMIC_RELAXED);
	}
	for (int i = 0; i < n; i++)
		failed += items[i].rc != 0;
	if (fwd != fwd_stack) {
		free(fwd);
		free(outs);
		free(live);
		free(ns);
	}
	return failed;
}

/* The draws of a batched decode step: item i's token from its session's
 * logits, or its failure's message kept in the item. */
struct draws {
	kvmem_session *const *s;
	const kvmem_sampler *const *smp;
	int32_t *out;
	kvmem_batch_item *items;
};

static void draw_one(void *arg, int i)
{
	const struct draws *d = arg;

	d->items[i].rc = 0;
	if (ws_usable(d->s[i]) || ws_sample(d->s[i], d->smp ? d->smp[i] : NULL, &d->out[i]))
		item_fail(&d->items[i]);
}

/* The draws d of sessions at[0..). */
struct draws_of {
	const struct draws *d;
	const int *at;
};

static void draw_of(void *arg, int k)
{
	const struct draws_of *o = arg;

	draw_one((void *)o->d, o->at[k]);
}

int kvmem_session_decode_batch(kvmem_session *const *s, int n, const kvmem_sampler *const *smp,
			       int32_t *out, int *rc)
{
	kvmem_batch_item stack[16] = { 0 }, *items = stack;
	int idx_stack[16], *idx = idx_stack;
	int m = 0, failed = 0, code = 0;
	char msg[256] = "";

	if (n < 0 || (n && (!s || !out)))
		return kvmem_error(EINVAL, "session batch: %d sessions to decode", n);
	if (n > 16) {
		items = calloc((size_t)n, sizeof(*items));
		idx = calloc((size_t)n, sizeof(*idx));
		if (!items || !idx) {
			free(items);
			free(idx);
			return kvmem_error(ENOMEM, "session batch: out of memory for %d sessions", n);
		}
	}
	const int64_t t0 = pb_enabled() ? (int64_t)kvmem_now_ns() : 0;

	for (int i = 0; i < n; i++)
		items[i] = (kvmem_batch_item){ .s = s[i] };
	if (check_items(items, n)) {
		code = kvmem_fail();
		goto out;
	}
	/* Draw first, each from its own logits and random state; a session
	 * that cannot draw sits the forward out. A draw reads the session's
	 * logits (0.6 MB at Qwen3's vocabulary; a greedy draw checks them in
	 * the same pass) and touches nothing another session has, so from
	 * PAR_DRAWS sessions on they are spread over the kernels' pool, whose
	 * caller starts on them at once: an OpenMP region's passive workers
	 * took ~200 us to wake on the H100 host after a forward's 9 ms, more
	 * than 16 draws take (issue #26). A failure's message is the failing
	 * thread's, kept in its item. */
	{
		const struct draws d = { s, smp, out, items };
		int slow = 0;

		/* A draw made beside its logits (a greedy one after a batched
		 * step that left them on the backend) is at hand: here. The
		 * rest read their logits: on the pool when they are many. */
		for (int i = 0; i < n; i++)
			if (ws_draw_at_hand(s[i], smp ? smp[i] : NULL))
				draw_one((void *)&d, i);
			else
				idx[slow++] = i;
		if (slow >= PAR_DRAWS) {
			const struct draws_of o = { &d, idx };

			kvmem_pool_run(slow, draw_of, (void *)&o);
		} else {
			for (int k = 0; k < slow; k++)
				draw_one((void *)&d, idx[k]);
		}
	}
	for (int i = 0; i < n; i++) {
		const int r = items[i].rc;

		if (rc)
			rc[i] = r;
		if (r) {
			ws_writer_drain(s[i]);
			code = r;
			snprintf(msg, sizeof(msg), "%s", items[i].err);
			failed++;
			continue;
		}
		items[m] = (kvmem_batch_item){ .s = s[i], .tokens = &out[i], .n = 1 };
		idx[m++] = i;
	}
	if (t0)
		pb_mark(PB_DRAWS, t0);
	kvmem_session_append_batch(items, m);
	for (int k = 0; k < m; k++) {
		if (rc)
			rc[idx[k]] = items[k].rc;
		if (items[k].rc) {
			code = items[k].rc;
			snprintf(msg, sizeof(msg), "%s", items[k].err);
			failed++;
		}
	}
	if (failed)	/* the last failure's message stays the thread's error */
		kvmem_error(-code, "%s", msg);
	code = failed;
out:
	if (items != stack) {
		free(items);
		free(idx);
	}
	return code;
}
