// SPDX-License-Identifier: MIT
/*
 * Workspaces with needles: the history the recall benchmark and the demo
 * feed to kvmem, and the raw material of view training sequences.
 *
 * Each needle owns a reserved file that background episodes never touch, so
 * its value is printed exactly where the needle is scheduled and never again
 * after. Scheduled around it, at random places in the whole workspace:
 *  - stale:   the same key in the same file with an older value (before it);
 *  - type A:  the same key in a sibling file (same stem, other extension, or
 *             other stem, same extension) with another value;
 *  - type B:  a neighbouring key of the same file (same key part) changes;
 *  - type C:  the needle's very value under an unrelated key (other key
 *             part, another name of the same value type where there is one)
 *             in an unrelated file (other stem and extension): a reused
 *             value that a wrong retrieval cannot turn into a lucky hit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "agentlang/lang.h"

/* Key names whose values are wide (ports, hosts, hex ids, durations,
 * sizes): the first 18 of vocab.c's list. */
#define AL_NEEDLE_KN 18
#define SET_MAX AL_SMALL_MAX	/* bound on a "$ set" episode */

enum ev_kind { EV_STALE, EV_NEEDLE, EV_LOOK_A, EV_LOOK_B, EV_LOOK_C };

struct event {
	int64_t pos;
	int order;
	uint8_t kind;
	int q;
};

struct needle {
	int f, k;		/* reserved file, needle key */
	int sib[2];		/* sibling files holding the same key */
	struct al_value v;
};

void agentlang_params_default(agentlang_params *p)
{
	memset(p, 0, sizeof(*p));
	p->seed = 1;
	p->n_tokens = 8192;
	p->n_questions = 8;
	p->lookalikes = 4;
	p->stale = 0.3;
	p->bg_questions = 2.0;
	p->needle_cat = 0.5;
}

static int ev_cmp(const void *a, const void *b)
{
	const struct event *x = a, *y = b;

	if (x->pos != y->pos)
		return x->pos < y->pos ? -1 : 1;
	return x->order - y->order;
}

static int ev_bound(int kind)
{
	return kind == EV_NEEDLE ? AL_EP_MAX : SET_MAX;
}

static int check_params(const agentlang_params *p)
{
	if (p->n_tokens < 256 || p->n_tokens > ((int64_t)1 << 34))
		return kvmem_error(EINVAL, "agentlang: workspace of %lld tokens: need 256 .. 2^34",
				 (long long)p->n_tokens);
	if (p->n_questions < 0 || p->lookalikes < 0 || p->lookalikes > 16)
		return kvmem_error(EINVAL, "agentlang: %d questions, %d look-alikes: need >= 0 and 0..16",
				 p->n_questions, p->lookalikes);
	if (!(p->stale >= 0 && p->stale <= 1) || !(p->needle_cat >= 0 && p->needle_cat <= 1) ||
	    !(p->bg_questions >= 0 && p->bg_questions <= 100))
		return kvmem_error(EINVAL, "agentlang: stale and needle_cat must lie in 0..1, bg_questions in 0..100");
	for (int i = 0; p->depths && i < p->n_questions; i++)
		if (!(p->depths[i] >= 0 && p->depths[i] <= 1))
			return kvmem_error(EINVAL, "agentlang: depth %g of question %d is not in 0..1",
					 p->depths[i], i);
	int64_t need = (int64_t)p->n_questions * (AL_EP_MAX + SET_MAX * (p->lookalikes + 1));
	if (need > p->n_tokens / 2)
		return kvmem_error(EINVAL, "agentlang: %d questions with %d look-alikes each need a workspace "
				 "of at least %lld tokens, not %lld", p->n_questions, p->lookalikes,
				 (long long)need * 2, (long long)p->n_tokens);
	return 0;
}

/* A wide key name other than kn, or kn's neighbour in the list. */
static int other_kn(struct al_gen *g, int kn, int wide)
{
	int n = wide ? AL_NEEDLE_KN : al_roles()->kn.n;
	int o = (int)al_below(&g->rng, (uint32_t)n - 1);

	return o >= kn ? o + 1 : o;
}

static int other_kp(struct al_gen *g, int kp)
{
	int o = (int)al_below(&g->rng, (uint32_t)al_roles()->kp.n - 1);

	return o >= kp ? o + 1 : o;
}

/* The reserved file of a needle: the needle key, two neighbours with the same
 * key part, one with the same key name, in shuffled order; and two siblings
 * that hold the same key. */
static int reserve(struct al_gen *g, struct needle *nd)
{
	const struct al_roles *R = al_roles();
	int kp = g->kp_pool[al_below(&g->rng, (uint32_t)g->nkp_pool)];
	int kn = (int)al_below(&g->rng, AL_NEEDLE_KN);
	int ext = (int)al_below(&g->rng, (uint32_t)R->ext.n);
	int f = al_file_new(g, -1, ext, 1);
	int keys[4][2] = { { kp, kn }, { kp, other_kn(g, kn, 1) }, { kp, other_kn(g, kn, 0) },
			   { other_kp(g, kp), kn } };

	if (f < 0)
		return kvmem_fail();
	for (int i = 3; i > 0; i--) {
		int j = (int)al_below(&g->rng, (uint32_t)i + 1), a = keys[i][0], b = keys[i][1];

		keys[i][0] = keys[j][0], keys[i][1] = keys[j][1];
		keys[j][0] = a, keys[j][1] = b;
	}
	for (int i = 0; i < 4; i++)
		al_file_add_key(g, f, keys[i][0], keys[i][1]);
	nd->f = f;
	nd->k = al_file_find_key(&g->file[f], kp, kn);
	al_value_random(g, R->kn_type[kn], &g->file[f].key[nd->k].v, &nd->v);

	int base = g->file[f].stem * 10 + g->file[f].variant;
	for (int s = 0; s < 2; s++) {
		int e = s == 0 ? (ext + 1 + (int)al_below(&g->rng, (uint32_t)R->ext.n - 1)) % R->ext.n
			       : ext;
		int sf = al_file_new(g, s == 0 ? base : -1, e, 0);

		if (sf < 0)
			return kvmem_fail();
		al_file_add_key(g, sf, kp, kn);
		al_file_add_key(g, sf, kp, other_kn(g, kn, 0));
		al_file_add_key(g, sf, g->kp_pool[al_below(&g->rng, (uint32_t)g->nkp_pool)],
				g->kn_pool[al_below(&g->rng, (uint32_t)g->nkn_pool)]);
		nd->sib[s] = sf;
	}
	return 0;
}

/* Set key k of file f to a fresh value other than `avoid` and the current. */
static int set_fresh(struct al_gen *g, int f, int k, const struct al_value *avoid)
{
	struct al_key *key = &g->file[f].key[k];
	struct al_value v;

	for (int i = 0; i < 16; i++) {
		al_value_random(g, al_key_type(key), &key->v, &v);
		if (!avoid || !al_value_eq(&v, avoid))
			break;
	}
	return al_ep_set(g, f, k, &v);
}

/* Type A: the needle's key in a sibling file, with another value. */
static int look_same_key(struct al_gen *g, const struct needle *nd, agentlang_question *q,
			 int kp, int kn)
{
	int sf = nd->sib[al_below(&g->rng, 2)];
	int k = al_file_find_key(&g->file[sf], kp, kn);

	if (k < 0)	/* reserve() put it there and keys are never removed */
		return kvmem_error(EINVAL, "agentlang: sibling file lost the needle key");
	q->lookalikes++;
	return set_fresh(g, sf, k, &nd->v);
}

/* A key name of the same value type as kn, other than kn where one exists. */
static int same_type_kn(struct al_gen *g, int kn)
{
	const struct al_roles *R = al_roles();
	int n = 0, pick[AL_MAX_LIST];

	for (int i = 0; i < R->kn.n; i++)
		if (i != kn && R->kn_type[i] == R->kn_type[kn])
			pick[n++] = i;
	return n ? pick[al_below(&g->rng, (uint32_t)n)] : kn;
}

/* Type C: the needle's value in an unrelated file under an unrelated key. */
static int reuse_value(struct al_gen *g, const struct needle *nd, agentlang_question *q,
		       int kp, int kn)
{
	const struct al_file *rf = &g->file[nd->f];

	for (int tries = 0; tries < 256; tries++) {
		int f = (int)al_below(&g->rng, (uint32_t)g->nfile), k;
		const struct al_file *file = &g->file[f];

		if (file->reserved || file->stem == rf->stem || file->ext == rf->ext)
			continue;
		if ((k = al_file_add_key(g, f, other_kp(g, kp), same_type_kn(g, kn))) < 0)
			continue;	/* full */
		q->lookalikes++;
		return al_ep_set(g, f, k, &nd->v);
	}
	return look_same_key(g, nd, q, kp, kn);	/* a tiny world: settle for type A */
}

static int emit_event(struct al_gen *g, const agentlang_params *p, const struct event *ev,
		      struct needle *nds, agentlang_question *qs)
{
	struct needle *nd = &nds[ev->q];
	agentlang_question *q = &qs[ev->q];
	struct al_file *rf = &g->file[nd->f];
	int kp = rf->key[nd->k].kp, kn = rf->key[nd->k].kn;

	switch (ev->kind) {
	case EV_STALE:
		if (set_fresh(g, nd->f, nd->k, &nd->v))
			return kvmem_fail();
		q->stale_pos = g->fact_line;
		return 0;
	case EV_NEEDLE:
		if (al_chance(&g->rng, p->needle_cat)) {
			rf->key[nd->k].v = nd->v;
			if (al_ep_cat(g, nd->f))
				return kvmem_fail();
			q->needle_pos = g->cat_line[nd->k];
			q->value_pos = g->cat_value[nd->k];
		} else {
			if (al_ep_set(g, nd->f, nd->k, &nd->v))
				return kvmem_fail();
			q->needle_pos = g->fact_line;
			q->value_pos = g->fact_value;
		}
		q->needle_end = q->value_pos + nd->v.n + 1;
		return 0;
	case EV_LOOK_B: {
		int k = (nd->k + 1 + (int)al_below(&g->rng, rf->nkeys - 1)) % rf->nkeys;

		q->lookalikes++;
		return set_fresh(g, nd->f, k, &nd->v);
	}
	case EV_LOOK_C:
		return reuse_value(g, nd, q, kp, kn);
	default:
		return look_same_key(g, nd, q, kp, kn);
	}
}

static void question_ids(struct al_gen *g, const struct needle *nd, agentlang_question *q)
{
	const struct al_roles *R = al_roles();
	const struct al_file *f = &g->file[nd->f];
	const struct al_key *k = &f->key[nd->k];
	int n = 0;

	q->ids[n++] = AGENTLANG_Q;
	q->ids[n++] = R->stem.id[f->stem];
	if (f->variant)
		q->ids[n++] = R->variant[f->variant];
	q->ids[n++] = R->ext.id[f->ext];
	q->ids[n++] = R->kp.id[k->kp];
	q->ids[n++] = R->kn.id[k->kn];
	q->ids[n++] = AGENTLANG_A;
	q->n_ids = n;
	for (int i = 0; i < nd->v.n; i++)
		q->answer[i] = nd->v.t[i];
	q->answer[nd->v.n] = AGENTLANG_END;
	q->n_answer = nd->v.n + 1;
}

static void add_event(struct event *ev, int *nev, int64_t pos, int kind, int q)
{
	ev[*nev] = (struct event){ .pos = pos, .order = *nev, .kind = (uint8_t)kind, .q = q };
	(*nev)++;
}

static int run(struct al_gen *g, const agentlang_params *p, agentlang_transcript *ws,
	       struct needle *nds, struct event *ev, int *nev_out)
{
	int M = p->n_questions, nev = 0;
	int64_t N = p->n_tokens, pending = 0;

	for (int i = 0; i < M; i++)
		if (reserve(g, &nds[i]))
			return kvmem_fail();
	for (int i = 0; i < M; i++) {
		agentlang_question *q = &ws->q[i];
		double d = p->depths ? p->depths[i] : (i + 0.5) / M;
		int64_t pos = llround(d * (double)N);

		pos = pos < 1 ? 1 : pos > N - 1 ? N - 1 : pos;
		q->depth_asked = d;
		q->stale_pos = -1;
		if (al_chance(&g->rng, p->stale) && pos > 2)
			add_event(ev, &nev, 1 + (int64_t)(al_unit(&g->rng) * (double)(pos - 2)),
				  EV_STALE, i);
		add_event(ev, &nev, pos, EV_NEEDLE, i);
		for (int j = 0; j < p->lookalikes; j++) {
			int kind = EV_LOOK_A + (int)((j + al_below(&g->rng, 3)) % 3);
			int64_t at = 1 + (int64_t)(al_unit(&g->rng) * (double)(N - 2));

			add_event(ev, &nev, at, kind, i);
		}
	}
	qsort(ev, (size_t)nev, sizeof(*ev), ev_cmp);
	for (int i = 0; i < nev; i++)
		pending += ev_bound(ev[i].kind);

	if (al_push(g, AGENTLANG_BOS))
		return kvmem_fail();
	for (int next = 0;;) {
		int64_t room = g->limit - g->len;

		if (next < nev && (ev[next].pos <= g->len || room - pending <= AL_EP_MAX)) {
			int64_t before = g->len;

			if (emit_event(g, p, &ev[next], nds, ws->q))
				return kvmem_fail();
			if (g->len - before > ev_bound(ev[next].kind))
				return kvmem_error(EINVAL, "agentlang: a scheduled episode passed its bound");
			pending -= ev_bound(ev[next].kind);
			next++;
			continue;
		}
		if (room - pending < AL_EP_MAX)
			break;
		if (al_ep_background(g))
			return kvmem_fail();
	}
	while (g->limit - g->len >= AL_SMALL_MAX)
		if (al_ep_small(g))
			return kvmem_fail();
	if (al_fill(g))
		return kvmem_fail();
	for (int i = 0; i < M; i++) {
		question_ids(g, &nds[i], &ws->q[i]);
		ws->q[i].depth = (double)ws->q[i].needle_pos / (double)N;
	}
	*nev_out = nev;
	return 0;
}

int agentlang_transcript_build(const agentlang_params *p, agentlang_transcript *ws)
{
	struct al_gen g;
	int M = p->n_questions, nev = 0, rc;
	int64_t nbg = p->n_tokens / 128;

	memset(ws, 0, sizeof(*ws));
	if (check_params(p))
		return kvmem_fail();
	nbg = nbg < 6 ? 6 : nbg > 4000 ? 4000 : nbg;
	if (al_gen_init(&g, p->seed, 0, p->n_tokens, (int)nbg, p->bg_questions / 1000.0))
		return kvmem_error_prefix("agentlang: workspace");
	ws->q = calloc((size_t)M + 1, sizeof(*ws->q));
	struct needle *nds = calloc((size_t)M + 1, sizeof(*nds));
	struct event *ev = calloc((size_t)M * (p->lookalikes + 2) + 1, sizeof(*ev));
	if (!ws->q || !nds || !ev) {
		rc = kvmem_error(ENOMEM, "agentlang: out of memory for %d questions", M);
	} else {
		rc = run(&g, p, ws, nds, ev, &nev);
	}
	free(nds);
	free(ev);
	if (rc) {
		al_gen_free(&g);
		agentlang_transcript_free(ws);
		return rc;
	}
	ws->ids = g.tok;	/* the stream is the workspace: hand it over */
	ws->n_ids = g.len;
	ws->n_q = M;
	g.tok = NULL;
	al_gen_free(&g);
	return 0;
}

void agentlang_transcript_free(agentlang_transcript *ws)
{
	free(ws->ids);
	free(ws->q);
	memset(ws, 0, sizeof(*ws));
}

int agentlang_exact_match(const agentlang_question *q, const int32_t *gen, int n_gen)
{
	if (n_gen < q->n_answer)
		return 0;
	for (int i = 0; i < q->n_answer; i++)
		if (gen[i] != q->answer[i])
			return 0;
	return 1;
}
