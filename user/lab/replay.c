// SPDX-License-Identifier: MIT
/*
 * Replaying a trace: every recorded selection again, with any policy,
 * budget and block size, over the index rebuilt from the workspace's raw K.
 *
 * Per step, in the session's own order: the index takes the tokens appended
 * since the previous selection (kvmem_index_append sums in token order, so
 * it is the live index's bits); the pool takes the blocks they filled; the
 * policy scores (its key reads are counted); the planner plans against the
 * replay's previous plan; the view's page reads are those the session's
 * rematerialisation makes for that diff (view.c's rules, mirrored here);
 * the selector's hints go to the replacement policy. Then the measures:
 * the oracle's plan at the same budget (every key scored, as the oracle
 * policy does), the needle, pages per tier, the modelled time.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "lab/lab_int.h"
#include "select/plan_walk.h"
#include "select/score.h"
#include "session/inspect.h"

#define UNLIMITED ((int64_t)0x3fffffff)
#define INDEX_CHUNK 1024

void kvmem_lab_params_default(kvmem_lab_params *p)
{
	memset(p, 0, sizeof(*p));
	p->sink = p->recent = p->reserve = -1;
}

static void oracle_free(struct lab_oracle *oc, int64_t n)
{
	for (int64_t i = 0; oc->mass && i < n; i++)
		free(oc->mass[i]);
	for (int64_t i = 0; oc->plan && i < n; i++)
		free(oc->plan[i]);
	free(oc->mass);
	free(oc->plan);
	free(oc->n_plan);
	memset(oc, 0, sizeof(*oc));
}

static const char *geom_str(char *buf, size_t len, uint64_t fp, int L, int Hq, int Hkv, int D)
{
	snprintf(buf, len, "fingerprint %016llx, L=%d Hq=%d Hkv=%d D=%d", (unsigned long long)fp, L,
		 Hq, Hkv, D);
	return buf;
}

int kvmem_lab_open(const char *ws_dir, const char *trace_path, kvmem_lab **out)
{
	kvmem_lab *lab;
	int rc;

	*out = NULL;
	if (!(lab = calloc(1, sizeof(*lab))))
		return kvmem_error(ENOMEM, "lab: out of memory");
	snprintf(lab->dir, sizeof(lab->dir), "%s", ws_dir);
	if ((rc = lab_trace_open(trace_path, &lab->t)) < 0)
		goto fail;
	if ((rc = kvmem_workspace_info_read(ws_dir, &lab->wi)) < 0) {
		rc = kvmem_error_prefix("lab");
		goto fail;
	}
	{
		const struct lab_header *h = &lab->t.h;
		const kvmem_page_geom *g = &lab->wi.geom;
		char a[160], b[160];

		if (h->fingerprint != g->fingerprint || h->n_layers != g->n_layers ||
		    h->n_heads != g->n_heads || h->n_kv_heads != g->n_kv_heads ||
		    h->head_dim != g->head_dim) {
			rc = kvmem_error(ESTALE, "%s: the trace was recorded for another model or "
					 "geometry (%s) than the workspace %s (%s)", trace_path,
					 geom_str(a, sizeof(a), h->fingerprint, (int)h->n_layers,
						  (int)h->n_heads, (int)h->n_kv_heads, (int)h->head_dim),
					 ws_dir,
					 geom_str(b, sizeof(b), g->fingerprint, (int)g->n_layers,
						  (int)g->n_heads, (int)g->n_kv_heads, (int)g->head_dim));
			goto fail;
		}
		if ((uint64_t)lab->t.end.max_tokens > lab->wi.tokens) {
			rc = kvmem_error(ESTALE, "%s: the trace selects over %lld tokens, the workspace %s "
					 "holds %llu: not the workspace it was recorded over",
					 trace_path, (long long)lab->t.end.max_tokens, ws_dir,
					 (unsigned long long)lab->wi.tokens);
			goto fail;
		}
	}
	if ((rc = lab_load(lab, ws_dir)) < 0)
		goto fail;
	*out = lab;
	return 0;
fail:
	kvmem_lab_close(lab);
	return rc;
}

void kvmem_lab_close(kvmem_lab *lab)
{
	if (!lab)
		return;
	oracle_free(&lab->oc, lab->t.n_sel);
	lab_trace_close(&lab->t);
	free(lab->ids);
	free(lab->k);
	free(lab);
}

const kvmem_lab_trace_info *kvmem_lab_info(const kvmem_lab *lab)
{
	return &lab->t.info;
}

int64_t kvmem_lab_tokens(const kvmem_lab *lab)
{
	return lab->n_tokens;
}

const int32_t *kvmem_lab_token_ids(const kvmem_lab *lab)
{
	return lab->ids;
}

void kvmem_lab_result_free(kvmem_lab_result *r)
{
	for (int64_t i = 0; r->steps && i < r->n_steps; i++) {
		free(r->steps[i].top);
		free(r->steps[i].blocks);
		free(r->steps[i].scores);
	}
	free(r->steps);
	memset(r, 0, sizeof(*r));
}

/* ---- one replay -------------------------------------------------------------- */
struct rp {
	kvmem_lab *lab;
	const kvmem_lab_params *p;
	kvmem_lab_result *r;
	const kvmem_policy_ops *pol, *oracle;
	int B, L, comparable;
	int64_t budget;		/* 0: unlimited */
	kvmem_index ix;
	int64_t indexed;	/* tokens in the index */
	float *kbuf;		/* [L][INDEX_CHUNK][Hkv][D] */
	kvmem_blocks bl;
	kvmem_plan prev;
	int64_t sel_tokens, view_len;
	struct lab_ksrc ks, ks_oracle;
	kvmem_page_source src, src_oracle;
	struct lab_cache cache;
	int64_t staged;		/* full blocks the pool has taken */
	float *scores, *oscores, *q;
	int64_t *q_pos;
	double page_bytes, index_unit;
};

/* The index up to n tokens, from the raw K rows. */
static int index_to(struct rp *x, int64_t n)
{
	const kvmem_lab *lab = x->lab;
	const size_t row = (size_t)lab->Hkv * lab->D;

	while (x->indexed < n) {
		int m = n - x->indexed < INDEX_CHUNK ? (int)(n - x->indexed) : INDEX_CHUNK;

		for (int l = 0; l < lab->L; l++)
			memcpy(x->kbuf + (size_t)l * m * row,
			       lab->k + ((size_t)l * lab->n_tokens + x->indexed) * row,
			       (size_t)m * row * sizeof(float));
		if (kvmem_index_append(&x->ix, x->kbuf, m))
			return kvmem_fail();
		x->indexed += m;
	}
	return 0;
}

/* The queries the replay selects with, packed [L][n][Hq][D]; their count. */
static int pick_queries(struct rp *x, const struct lab_sel *s)
{
	const kvmem_lab *lab = x->lab;
	const size_t per = (size_t)lab->Hq * lab->D;
	const int ns = (int)s->h.n_store;
	int idx[4096], n = 0;

	if (x->p->query_span && s->has_query) {
		for (int i = 0; i < ns && n < 4096; i++)
			if (s->q_pos[i] >= s->query.start && s->q_pos[i] < s->query.end)
				idx[n++] = i;
	}
	if (!n) {
		int want = x->p->query_tokens > 0 ? x->p->query_tokens : (int)s->h.n_q;

		want = want > ns ? ns : want;
		want = want > 4096 ? 4096 : want;
		for (int i = ns - want; i < ns; i++)
			idx[n++] = i;
	}
	for (int l = 0; l < lab->L; l++)
		for (int i = 0; i < n; i++)
			memcpy(x->q + ((size_t)l * n + i) * per, s->q + ((size_t)l * ns + idx[i]) * per,
			       per * sizeof(float));
	for (int i = 0; i < n; i++)
		x->q_pos[i] = s->q_pos[idx[i]];
	return n;
}

/*
 * The query text the live session gave its policy (session.h): the history
 * from the first recorded query position to the last. A select-ahead's
 * positions are every token of its question, which the session appended
 * after selecting: the saved history holds them. Whatever --query-tokens
 * or --query-span pick, the text is the recorded one. Positions past the
 * saved history (a select-ahead whose tokens were never appended) are left
 * out.
 */
static void query_text(const kvmem_lab *lab, const struct lab_sel *s, kvmem_select_ctx *c)
{
	const int ns = (int)s->h.n_store;
	int64_t first, last;

	if (!ns)
		return;
	first = s->q_pos[0];
	last = s->q_pos[ns - 1] < lab->n_tokens ? s->q_pos[ns - 1] : lab->n_tokens - 1;
	if (first < 0 || last < first)
		return;
	c->text = lab->ids + first;
	c->n_text = last - first + 1;
}

/* The tier of a read of (block, layer) at n_tokens, through the pool. */
static int read_tier(struct rp *x, int64_t b, int l, int64_t n_tokens)
{
	int hit;

	if ((b + 1) * x->B > n_tokens)
		return KVMEM_LAB_MEM;	/* the partial block: in the source's memory */
	if ((hit = lab_cache_read(&x->cache, (uint64_t)b * x->L + l)) < 0)
		return hit;
	return hit ? KVMEM_LAB_HOST : KVMEM_LAB_NVME;
}

static int count_read(struct rp *x, kvmem_lab_step *st, int why, int64_t b, int l)
{
	int t = read_tier(x, b, l, st->n_tokens);

	if (t < 0)
		return t;
	st->pages[why][t]++;
	st->bytes[why][t] += x->page_bytes;
	if (t == KVMEM_LAB_HOST)
		x->r->hits++;
	else if (t == KVMEM_LAB_NVME)
		x->r->misses++;
	return 0;
}

/* A step's counts, for the walk's callback. */
struct walk {
	struct rp *x;
	kvmem_lab_step *st;
};

/* Tokens u0..u1 of block b sit at `have` + u (-1: nowhere) and belong at
 * `want` + u: a page read when they are not in the view (view.c, place).
 * Tokens in it at another slot are moved on the backend from the raw K it
 * keeps (view.c, move_kept; both shipped backends do): no read. */
static int place(void *arg, int l, int64_t b, int u0, int u1, int64_t have, int64_t want)
{
	struct walk *w = arg;

	if (u1 <= u0 || have >= 0)
		return 0;
	return count_read(w->x, w->st, KVMEM_LAB_VIEW, b, l);
}

/* The page reads of going from the previous plan to np: the view's own
 * walk (view.c, rematerialise). */
static int remat_reads(struct rp *x, kvmem_lab_step *st, const kvmem_plan *np)
{
	struct walk w = { x, st };

	if (ws_plan_walk(&x->prev, np, &x->bl, x->L, x->sel_tokens, x->view_len, place, &w))
		return kvmem_fail();
	return 0;
}

/* What the session tells its source after a plan (view.c, hint_selected):
 * 1 for the view's blocks, 0.5 for as many runners-up. */
static int hints(struct rp *x, const kvmem_plan *np, const float *sc, int n_sets, int64_t nb)
{
	int64_t *idx = malloc((size_t)(nb ? nb : 1) * sizeof(*idx)), n_in, n;

	if (!idx || (n = ws_plan_hints(np, sc, n_sets, nb, idx, &n_in)) < 0) {
		free(idx);
		return kvmem_error(ENOMEM, "lab: out of memory");
	}
	for (int64_t i = 0; i < n; i++)
		lab_cache_hint(&x->cache, (uint64_t)idx[i], i < n_in ? 1.0f : 0.5f);
	free(idx);
	return 0;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

int64_t kvmem_lab_needle_rank(const float *sc, int n_sets, int64_t nb, int B, int64_t start,
			      int64_t end)
{
	int64_t b0 = start / B, b1 = (end - 1) / B;
	double sum = 0;

	if (b1 >= nb)
		b1 = nb - 1;
	if (b0 > b1)
		return -1;
	for (int s = 0; s < n_sets; s++) {
		const float *row = sc + (size_t)s * nb;
		float worst = row[b0];
		int64_t above = 0;

		for (int64_t b = b0; b <= b1; b++)
			worst = row[b] < worst ? row[b] : worst;
		for (int64_t b = 0; b < nb; b++)
			above += row[b] > worst;
		sum += (double)above;
	}
	return llround(sum / n_sets);
}

struct scored {
	float s;
	int64_t b;
};

static int by_score(const void *a, const void *b)
{
	const struct scored *x = a, *y = b;
	float sx = isnan(x->s) ? -INFINITY : x->s, sy = isnan(y->s) ? -INFINITY : y->s;

	if (sx != sy)
		return sx < sy ? 1 : -1;
	return (x->b < y->b) - (x->b > y->b);
}

static int64_t *top_blocks(const float *sc, int64_t nb, int n)
{
	struct scored *v = malloc((size_t)nb * sizeof(*v));
	int64_t *out = malloc((size_t)n * sizeof(*out));

	if (!v || !out) {
		free(v), free(out);
		return NULL;
	}
	for (int64_t b = 0; b < nb; b++)
		v[b] = (struct scored){ sc[b], b };
	qsort(v, nb, sizeof(*v), by_score);
	for (int i = 0; i < n; i++)
		out[i] = i < nb ? v[i].b : -1;
	free(v);
	return out;
}

/* The oracle at step k: every key scored (the oracle policy's masses, in
 * double), and its plan at the same parameters. Cached per parameters. */
static int oracle_step(struct rp *x, int64_t k, const kvmem_select_ctx *c,
		       const kvmem_plan_params *pp, int qspan_key)
{
	struct lab_oracle *oc = &x->lab->oc;
	const int64_t nb = c->n_blocks, n_sel = x->lab->t.n_sel;
	int64_t *all;
	kvmem_plan op = { 0 };
	int rc;

	if (!oc->valid || oc->block != x->B || oc->span != c->span || oc->budget != pp->budget ||
	    oc->sink != pp->sink || oc->recent != pp->recent || oc->qtok != x->p->query_tokens ||
	    oc->qspan != qspan_key) {
		oracle_free(oc, n_sel);
		oc->mass = calloc((size_t)n_sel, sizeof(*oc->mass));
		oc->plan = calloc((size_t)n_sel, sizeof(*oc->plan));
		oc->n_plan = calloc((size_t)n_sel, sizeof(*oc->n_plan));
		if (!oc->mass || !oc->plan || !oc->n_plan) {
			oracle_free(oc, n_sel);
			return kvmem_error(ENOMEM, "lab: out of memory");
		}
		*oc = (struct lab_oracle){ .valid = 1, .block = x->B, .span = c->span,
					   .budget = pp->budget, .sink = pp->sink, .recent = pp->recent,
					   .qtok = x->p->query_tokens, .qspan = qspan_key,
					   .mass = oc->mass, .plan = oc->plan, .n_plan = oc->n_plan };
	}
	if (oc->mass[k])
		return 0;
	oc->mass[k] = calloc((size_t)nb, sizeof(double));
	all = malloc((size_t)nb * sizeof(*all));
	if (!oc->mass[k] || !all) {
		free(all);
		return kvmem_error(ENOMEM, "lab: out of memory");
	}
	for (int64_t b = 0; b < nb; b++)
		all[b] = b;
	{
		kvmem_select_ctx co = *c;

		co.keys = &x->src_oracle;
		rc = ws_token_mass(&co, all, nb, oc->mass[k]);
	}
	free(all);
	if (rc) {
		free(oc->mass[k]);
		oc->mass[k] = NULL;
		return kvmem_error_prefix("lab: the oracle at step %lld", (long long)k);
	}
	for (int64_t b = 0; b < nb; b++)
		x->oscores[b] = (float)oc->mass[k][b];
	if (kvmem_plan_build(&op, &x->bl, x->oscores, 1, NULL, pp))
		return kvmem_error_prefix("lab: the oracle's plan at step %lld", (long long)k);
	oc->plan[k] = malloc((size_t)(op.n_view ? op.n_view : 1) * sizeof(int64_t));
	if (!oc->plan[k]) {
		kvmem_plan_free(&op);
		return kvmem_error(ENOMEM, "lab: out of memory");
	}
	memcpy(oc->plan[k], op.blocks, (size_t)op.n_view * sizeof(int64_t));
	oc->n_plan[k] = op.n_view;
	kvmem_plan_free(&op);
	return 0;
}

static void oracle_measures(struct rp *x, int64_t k, const kvmem_plan *np, kvmem_lab_step *st)
{
	const struct lab_oracle *oc = &x->lab->oc;
	const double *m = oc->mass[k];
	const int64_t nb = st->n_blocks;
	uint8_t *in_o = calloc((size_t)nb, 1);
	double total = 0, own = 0, ov = 0, ms = 0;

	if (!in_o) {
		st->overlap = st->mass = st->oracle_mass = NAN;
		return;
	}
	for (int64_t b = 0; b < nb; b++)
		total += m[b];
	for (int i = 0; i < oc->n_plan[k]; i++) {
		in_o[oc->plan[k][i]] = 1;
		own += m[oc->plan[k][i]];
	}
	for (int s = 0; s < np->n_sets; s++) {
		int64_t both = 0;
		double held = 0;

		for (int i = 0; i < np->n_view; i++) {
			int64_t b = np->blocks[(size_t)s * np->n_view + i];

			both += in_o[b];
			held += m[b];
		}
		ov += oc->n_plan[k] ? (double)both / oc->n_plan[k] : 1.0;
		ms += total > 0 ? held / total : 1.0;
	}
	st->overlap = ov / np->n_sets;
	st->mass = ms / np->n_sets;
	st->oracle_mass = total > 0 ? own / total : 1.0;
	free(in_o);
}

static int resolve(struct rp *x, kvmem_lab_result *r)
{
	const struct lab_header *h = &x->lab->t.h;
	const kvmem_lab_params *p = x->p;
	const kvmem_repl_ops *ro;
	kvmem_page_geom g = x->lab->wi.geom;
	uint64_t cap = p->host_cap ? p->host_cap : 256ull << 20, slots;

	if (!(x->pol = kvmem_policy_find(p->policy ? p->policy : h->policy)))
		return kvmem_error_prefix("lab");
	if (!(x->oracle = kvmem_policy_find("oracle")))
		return kvmem_error_prefix("lab");
	x->B = p->block ? p->block : (int)h->block;
	if (x->B < KVMEM_BLOCK_MIN || x->B > KVMEM_BLOCK_MAX || (x->B & (x->B - 1)))
		return kvmem_error(EINVAL, "lab: block %d is not a power of two from %d to %d", x->B,
				   KVMEM_BLOCK_MIN, KVMEM_BLOCK_MAX);
	x->budget = p->budget == 0 ? h->budget : p->budget < 0 ? 0 : p->budget;
	if (x->budget && x->budget < x->B)
		return kvmem_error(EINVAL, "lab: budget %lld is smaller than one block (%d tokens)",
				   (long long)x->budget, x->B);
	x->L = (int)h->n_layers;
	if (!(ro = kvmem_repl_find(p->cache_policy ? p->cache_policy : "lru")))
		return kvmem_error_prefix("lab");
	g.block_tokens = (uint32_t)x->B;
	slots = cap / kvmem_page_stride(&g);
	if (!slots)
		return kvmem_error(EINVAL, "lab: a host pool of %llu bytes holds no page of %zu bytes",
				   (unsigned long long)cap, kvmem_page_stride(&g));
	if (lab_cache_init(&x->cache, ro, slots > UINT32_MAX ? UINT32_MAX : (uint32_t)slots,
			   (uint32_t)x->L))
		return kvmem_fail();
	x->page_bytes = (double)kvmem_page_bytes(&g);
	{
		unsigned n = x->pol->needs;
		int units = (n & KVMEM_SUM_SUBBLOCK ? KVMEM_SUBBLOCKS : 0) + (n & KVMEM_SUM_MINMAX ? 2 : 0);

		x->index_unit = (double)x->L * h->n_kv_heads * h->head_dim * 4 * (units ? units : 1);
	}
	x->comparable = !strcmp(x->pol->name, h->policy) && x->B == (int)h->block &&
			x->budget == h->budget && p->sink < 0 && p->recent < 0 && p->reserve < 0 &&
			p->query_tokens == 0 && !p->query_span;
	r->policy = x->pol;
	r->block = x->B;
	r->budget = x->budget;
	r->page_bytes = x->page_bytes;
	return 0;
}

/* The plan in force when recording began, at the live block size. */
static int initial_state(struct rp *x, int n_sets)
{
	const struct lab_trace *t = &x->lab->t;
	const struct lab_state_head *st = &t->state;
	kvmem_plan *p = &x->prev;

	memset(p, 0, sizeof(*p));
	x->sel_tokens = 0;
	x->view_len = 0;
	if (!t->has_state)
		return 0;
	x->sel_tokens = st->sel_tokens;
	if ((int)st->block != x->B || !st->n_view || ((int)st->n_sets != 1 && (int)st->n_sets != n_sets)) {
		/* Another block size, or per-layer sets a global policy cannot
		 * diff against: no view carried over, the tokens before the tail
		 * count as out of view (the first step's reads are approximate). */
		return 0;
	}
	size_t n = (size_t)st->n_sets * st->n_view;

	p->blocks = malloc(n * sizeof(int64_t));
	p->start = malloc(n * sizeof(int64_t));
	if (!p->blocks || !p->start)
		return kvmem_error(ENOMEM, "lab: out of memory");
	p->n_sets = (int)st->n_sets;
	p->n_view = (int)st->n_view;
	p->n_tokens = st->plan_tokens;
	p->view_tokens = st->view_tokens;
	for (int s = 0; s < p->n_sets; s++) {
		int64_t at = 0;

		for (int i = 0; i < p->n_view; i++) {
			int64_t b = t->state_blocks[(size_t)s * p->n_view + i], left = st->plan_tokens - b * x->B;

			p->blocks[(size_t)s * p->n_view + i] = b;
			p->start[(size_t)s * p->n_view + i] = at;
			at += left < x->B ? left : x->B;
		}
	}
	x->view_len = st->view_tokens;
	return 0;
}

static int replay_step(struct rp *x, int64_t k, kvmem_lab_step *st)
{
	const kvmem_lab *lab = x->lab;
	const struct lab_sel *s = &lab->t.sel[k];
	const kvmem_lab_params *p = x->p;
	const int64_t n = s->h.n_tokens;
	const int n_sets = x->pol->per_layer ? x->L : 1;
	const int live_budget = x->budget == lab->t.h.budget;
	kvmem_plan_params pp;
	kvmem_select_ctx c;
	kvmem_plan np = { 0 };
	int64_t nb, reserve, sink, recent;
	int nq, rc;

	memset(st, 0, sizeof(*st));
	st->step = s->h.step;
	st->n_tokens = n;
	st->forced = (int)s->h.forced;
	st->needle_rank = -1;
	st->needle_in_view = -1;
	st->live_equal = -1;
	if ((rc = index_to(x, n)))
		return rc;
	/* Blocks that filled since the last step were staged out and kept. */
	for (; (x->staged + 1) * x->B <= n; x->staged++)
		for (int l = 0; l < x->L; l++)
			if (lab_cache_write(&x->cache, (uint64_t)x->staged * x->L + l))
				return kvmem_fail();
	lab_cache_step(&x->cache, (uint64_t)k);
	kvmem_blocks_free(&x->bl);
	if (kvmem_blocks_init(&x->bl, x->B))
		return kvmem_fail();
	for (uint32_t i = 0; i < s->h.n_pins; i++)
		if (kvmem_blocks_pin(&x->bl, s->pins[2 * i], s->pins[2 * i + 1]))
			return kvmem_fail();
	x->bl.n_tokens = n;
	nb = kvmem_blocks_count(&x->bl);
	st->n_blocks = nb;
	if (!nb)
		return 0;
	/* Parameters: the live ones at the live budget, the session's
	 * defaults at another; the caller's where given. */
	reserve = p->reserve >= 0 ? p->reserve : s->h.reserve;
	if (!x->budget) {
		sink = recent = reserve = 0;
		pp = (kvmem_plan_params){ UNLIMITED, p->sink > 0 ? p->sink : 0,
					  p->recent > 0 ? p->recent : 0, KVMEM_LAYOUT_COMPACT };
	} else {
		sink = p->sink >= 0 ? p->sink : live_budget ? s->h.sink :
		       (x->budget / 100 > 1 ? x->budget / 100 : 1);
		recent = p->recent >= 0 ? p->recent : live_budget ? s->h.recent :
			 (x->budget / 12 > 1 ? x->budget / 12 : 1);
		pp = (kvmem_plan_params){ x->budget, sink, recent, KVMEM_LAYOUT_COMPACT };
	}
	if (k == 0) {
		x->r->sink = pp.sink;
		x->r->recent = pp.recent;
		x->r->reserve = reserve;
	}
	nq = pick_queries(x, s);
	c = (kvmem_select_ctx){
		.index = &x->ix, .keys = &x->src, .n_tokens = n, .n_blocks = nb, .block = x->B,
		.n_layers = x->L, .n_heads = lab->Hq, .n_kv_heads = lab->Hkv, .head_dim = lab->D,
		.rope_theta = lab->t.h.rope_theta, .n_q = nq, .q = x->q, .q_pos = x->q_pos,
		.seed = s->h.seed, .step = s->h.step,
		.span = x->budget ? x->budget + reserve : 0, .budget = x->budget,
		.tokens = lab->ids,
	};
	query_text(lab, s, &c);
	x->ks.n_reads = 0;
	if (x->pol->score(&c, x->scores))
		return kvmem_error_prefix("lab: policy %s at step %lld", x->pol->name, (long long)k);
	if (kvmem_plan_build(&np, &x->bl, x->scores, n_sets, &x->prev, &pp))
		return kvmem_error_prefix("lab: step %lld", (long long)k);
	st->n_sets = np.n_sets;
	st->n_view = np.n_view;
	st->view_tokens = np.view_tokens;
	st->reused = np.reused;
	st->entering = np.entering;
	st->born = np.born;
	/* Reads: the policy's own, then the view's, then the hints. */
	for (size_t i = 0; i < x->ks.n_reads && !rc; i++)
		rc = count_read(x, st, KVMEM_LAB_SCORE, x->ks.reads[i].block, x->ks.reads[i].layer);
	if (rc || remat_reads(x, st, &np) || hints(x, &np, x->scores, n_sets, nb)) {
		kvmem_plan_free(&np);
		return kvmem_fail();
	}
	if (x->comparable) {
		st->live_equal = (int)s->h.n_sets == np.n_sets && (int)s->h.n_view == np.n_view;
		for (size_t i = 0; st->live_equal && i < (size_t)np.n_sets * np.n_view; i++)
			st->live_equal = (int64_t)s->blocks[i] == np.blocks[i];
	}
	if (s->has_needle) {
		st->needle_start = s->needle.start;
		st->needle_end = s->needle.end;
		st->needle_in_view = kvmem_plan_holds_span(&np, x->B, s->needle.start, s->needle.end);
		st->needle_rank = kvmem_lab_needle_rank(x->scores, n_sets, nb, x->B, s->needle.start,
							 s->needle.end);
	}
	if (p->rank_top > 0 && !(st->top = top_blocks(x->scores, nb, p->rank_top))) {
		kvmem_plan_free(&np);
		return kvmem_error(ENOMEM, "lab: out of memory");
	}
	if (p->keep_plans) {
		size_t nv = (size_t)np.n_sets * np.n_view, ns = (size_t)n_sets * nb;

		st->blocks = malloc((nv ? nv : 1) * sizeof(int64_t));
		st->scores = malloc(ns * sizeof(float));
		if (!st->blocks || !st->scores) {
			kvmem_plan_free(&np);
			return kvmem_error(ENOMEM, "lab: out of memory");
		}
		memcpy(st->blocks, np.blocks, nv * sizeof(int64_t));
		memcpy(st->scores, x->scores, ns * sizeof(float));
	}
	st->overlap = st->mass = st->oracle_mass = NAN;
	if (!p->no_oracle) {
		if (oracle_step(x, k, &c, &pp, p->query_span ? 1 : 0)) {
			kvmem_plan_free(&np);
			return kvmem_fail();
		}
		oracle_measures(x, k, &np, st);
	}
	{
		double nvme = st->bytes[0][KVMEM_LAB_NVME] + st->bytes[1][KVMEM_LAB_NVME];
		double view = 0, score = 0;

		for (int t = 0; t < KVMEM_LAB_TIERS; t++)
			view += st->bytes[KVMEM_LAB_VIEW][t], score += st->bytes[KVMEM_LAB_SCORE][t];
		st->time_s = (p->bw.nvme > 0 ? nvme / p->bw.nvme : 0) +
			     (p->bw.link > 0 ? view / p->bw.link : 0) +
			     (p->bw.mem > 0 ? (nb * x->index_unit + score) / p->bw.mem : 0);
	}
	kvmem_plan_free(&x->prev);
	x->prev = np;
	x->sel_tokens = n;
	x->view_len = np.view_tokens;
	return 0;
}

static void summarise(const kvmem_lab *lab, kvmem_lab_result *r)
{
	int64_t *ranks = malloc((size_t)(r->n_steps ? r->n_steps : 1) * sizeof(*ranks)), n_rank = 0;
	double ov = 0, ms = 0, om = 0, iv = 0;
	int64_t n_or = 0;

	r->first_diff = -1;
	r->needle_rank_median = -1;
	for (int64_t k = 0; k < r->n_steps; k++) {
		const kvmem_lab_step *st = &r->steps[k];

		if (!isnan(st->overlap)) {
			ov += st->overlap, ms += st->mass, om += st->oracle_mass;
			n_or++;
		}
		if (st->needle_in_view >= 0) {
			r->needles++;
			iv += st->needle_in_view;
			if (ranks && st->needle_rank >= 0)
				ranks[n_rank++] = st->needle_rank;
		}
		for (int w = 0; w < 2; w++)
			for (int t = 0; t < KVMEM_LAB_TIERS; t++) {
				r->pages[w][t] += st->pages[w][t];
				r->bytes[w][t] += st->bytes[w][t];
			}
		r->time_s += st->time_s;
		if (st->live_equal >= 0) {
			r->live_compared++;
			r->live_equal += st->live_equal;
			if (!st->live_equal && r->first_diff < 0)
				r->first_diff = st->step;
		}
	}
	r->overlap = n_or ? ov / n_or : NAN;
	r->mass = n_or ? ms / n_or : NAN;
	r->oracle_mass = n_or ? om / n_or : NAN;
	r->needle_in_view = r->needles ? iv / r->needles : NAN;
	if (n_rank) {
		qsort(ranks, n_rank, sizeof(*ranks), cmp_i64);
		r->needle_rank_median = ranks[n_rank / 2];
	}
	free(ranks);
	r->hit_rate = r->hits + r->misses ? (double)r->hits / (r->hits + r->misses) : NAN;
	/* The recording's own reads. */
	for (int64_t k = 0; k < lab->t.n_sel; k++)
		for (uint32_t i = 0; i < lab->t.sel[k].h.n_runs; i++) {
			const struct lab_run *u = &lab->t.sel[k].runs[i];

			r->live_pages[u->why][u->tier] += u->count;
		}
	for (int64_t k = 0; k < lab->t.n_reads_recs; k++)
		for (uint32_t i = 0; i < lab->t.n_other[k]; i++) {
			const struct lab_run *u = &lab->t.other[k][i];

			r->live_pages[u->why][u->tier] += u->count;
		}
}

int kvmem_lab_replay(kvmem_lab *lab, const kvmem_lab_params *p, kvmem_lab_result *r)
{
	kvmem_lab_params def;
	struct rp x;
	int64_t max_blocks, max_q = 0;
	int rc = 0;

	memset(r, 0, sizeof(*r));
	memset(&x, 0, sizeof(x));
	if (!p) {
		kvmem_lab_params_default(&def);
		p = &def;
	}
	x.lab = lab;
	x.p = p;
	x.r = r;
	if ((rc = resolve(&x, r)))
		goto out;
	max_blocks = (lab->t.end.max_tokens + x.B - 1) / x.B + 1;
	for (int64_t k = 0; k < lab->t.n_sel; k++)
		max_q = lab->t.sel[k].h.n_store > max_q ? lab->t.sel[k].h.n_store : max_q;
	if (max_q > 4096)
		max_q = 4096;
	x.kbuf = malloc((size_t)lab->L * INDEX_CHUNK * lab->Hkv * lab->D * sizeof(float));
	x.scores = malloc((size_t)x.L * max_blocks * sizeof(float));
	x.oscores = malloc((size_t)max_blocks * sizeof(float));
	x.q = malloc((size_t)lab->L * (max_q ? max_q : 1) * lab->Hq * lab->D * sizeof(float));
	x.q_pos = malloc((size_t)(max_q ? max_q : 1) * sizeof(int64_t));
	r->steps = calloc((size_t)(lab->t.n_sel ? lab->t.n_sel : 1), sizeof(*r->steps));
	if (!x.kbuf || !x.scores || !x.oscores || !x.q || !x.q_pos || !r->steps) {
		rc = kvmem_error(ENOMEM, "lab: out of memory");
		goto out;
	}
	if (kvmem_index_init(&x.ix, lab->L, lab->Hkv, lab->D, x.B,
			     KVMEM_SUM_MEANK | KVMEM_SUM_MINMAX | KVMEM_SUM_SUBBLOCK) ||
	    kvmem_blocks_init(&x.bl, x.B) || initial_state(&x, x.pol->per_layer ? x.L : 1)) {
		rc = kvmem_fail();
		goto out;
	}
	lab_ksrc_init(&x.ks, &x.src, lab, x.B);
	lab_ksrc_init(&x.ks_oracle, &x.src_oracle, lab, x.B);
	for (int64_t k = 0; k < lab->t.n_sel; k++) {
		r->n_steps = k + 1;
		if ((rc = replay_step(&x, k, &r->steps[k])))
			goto out;
	}
	summarise(lab, r);
out:
	if (rc)
		kvmem_lab_result_free(r);
	lab_cache_free(&x.cache);
	lab_ksrc_free(&x.ks);
	lab_ksrc_free(&x.ks_oracle);
	kvmem_index_free(&x.ix);
	kvmem_blocks_free(&x.bl);
	kvmem_plan_free(&x.prev);
	free(x.kbuf);
	free(x.scores);
	free(x.oscores);
	free(x.q);
	free(x.q_pos);
	return rc;
}
