// SPDX-License-Identifier: MIT
/*
 * The agentlang episode generator: a small world of config files and the
 * tool calls an agent makes on it. Every value change is printed (a "$ set"
 * line or a later "$ cat"), so the value last printed for a (file, key) is
 * its current value: a question's answer is simply the world's state.
 *
 * Look-alikes come from the world's shape: files share stems (api.conf,
 * api.yaml, api2.conf), keys share parts (db.port, db.host, cache.port)
 * because each world draws its key parts from a small pool, and values are
 * reused by the small word sets.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "agentlang/lang.h"
#include "util/grow.h"

/* ---- random ------------------------------------------------------------- */
uint64_t al_mix64(uint64_t x)
{
	return kvmem_mix64(x + KVMEM_GOLDEN_GAMMA);
}

void al_rng_seed(struct al_rng *r, uint64_t seed, uint64_t stream)
{
	uint64_t x = al_mix64(seed) ^ al_mix64(stream ^ 0x632be59bd9b4e019ull);

	for (int i = 0; i < 4; i++)
		r->s[i] = x = al_mix64(x + (uint64_t)i);
	if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3]))
		r->s[0] = 1;
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t al_next(struct al_rng *r)
{
	uint64_t *s = r->s;
	uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

uint32_t al_below(struct al_rng *r, uint32_t n)
{
	return (uint32_t)(((al_next(r) >> 32) * (uint64_t)n) >> 32);
}

double al_unit(struct al_rng *r)
{
	return (double)(al_next(r) >> 11) * 0x1.0p-53;
}

/* ---- values ------------------------------------------------------------- */
/* The glue pair that spells the decimal digits of d (0..99). */
static int32_t dec_pair(const struct al_roles *R, int d)
{
	return R->pair[(d / 10) * 16 + d % 10];
}

static void value_draw(struct al_gen *g, int type, struct al_value *v)
{
	const struct al_roles *R = al_roles();
	struct al_rng *r = &g->rng;

	switch (type) {
	case AL_V_PORT:	/* 1000..9999: "54" "##32" */
		v->n = 2;
		v->t[0] = R->num[10 + al_below(r, 90)];
		v->t[1] = dec_pair(R, (int)al_below(r, 100));
		break;
	case AL_V_HOST:
		v->n = 2;
		v->t[0] = R->hostpfx.id[al_below(r, (uint32_t)R->hostpfx.n)];
		v->t[1] = dec_pair(R, (int)al_below(r, 100));
		break;
	case AL_V_HEX:
		v->n = 3;
		v->t[0] = R->hex0x;
		v->t[1] = R->pair[al_below(r, 256)];
		v->t[2] = R->pair[al_below(r, 256)];
		break;
	case AL_V_DURATION:	/* ms, s, m, h are units 0..3 */
		if (al_chance(r, 0.3)) {
			/* 1000..9999ms: a two-digit start keeps the split greedy */
			v->n = 3;
			v->t[0] = R->num[10 + al_below(r, 90)];
			v->t[1] = dec_pair(R, (int)al_below(r, 100));
			v->t[2] = R->unit.id[0];
		} else {
			v->n = 2;
			v->t[0] = R->num[1 + al_below(r, 99)];
			v->t[1] = R->unit.id[al_below(r, 4)];
		}
		break;
	case AL_V_SIZE:		/* kb, mb, gb are units 4..6 */
		v->n = 2;
		v->t[0] = R->num[1 + al_below(r, 99)];
		v->t[1] = R->unit.id[4 + al_below(r, 3)];
		break;
	case AL_V_COUNT:
		v->n = 1;
		v->t[0] = R->num[al_below(r, 100)];
		break;
	default: {
		const struct al_list *l = &R->words[type];

		v->n = 1;
		v->t[0] = l->id[al_below(r, (uint32_t)l->n)];
		break;
	}
	}
}

int al_value_eq(const struct al_value *a, const struct al_value *b)
{
	if (a->n != b->n)
		return 0;
	for (int i = 0; i < a->n; i++)
		if (a->t[i] != b->t[i])
			return 0;
	return 1;
}

void al_value_random(struct al_gen *g, int vtype, const struct al_value *not,
		     struct al_value *out)
{
	/* Word sets have at least five members: a few tries always differ. */
	for (int i = 0; i < 64; i++) {
		value_draw(g, vtype, out);
		if (!not || !al_value_eq(out, not))
			return;
	}
}

int al_key_type(const struct al_key *k)
{
	return al_roles()->kn_type[k->kn];
}

/* ---- world -------------------------------------------------------------- */
static int name_index(const struct al_roles *R, int stem, int variant, int ext)
{
	return (stem * 10 + variant) * R->ext.n + ext;
}

int al_file_find_key(const struct al_file *f, int kp, int kn)
{
	for (int i = 0; i < f->nkeys; i++)
		if (f->key[i].kp == kp && f->key[i].kn == kn)
			return i;
	return -1;
}

int al_file_add_key(struct al_gen *g, int fi, int kp, int kn)
{
	struct al_file *f = &g->file[fi];
	int i = al_file_find_key(f, kp, kn);

	if (i >= 0)
		return i;
	if (f->nkeys >= AL_FILE_KEYS)
		return -1;
	i = f->nkeys++;
	memset(&f->key[i], 0, sizeof(f->key[i]));
	f->key[i].kp = (uint8_t)kp;
	f->key[i].kn = (uint8_t)kn;
	al_value_random(g, al_key_type(&f->key[i]), NULL, &f->key[i].v);
	return i;
}

static int random_base(struct al_gen *g)
{
	const struct al_roles *R = al_roles();
	int variant = al_chance(&g->rng, 0.7) ? 0 : 1 + (int)al_below(&g->rng, 9);

	return (int)al_below(&g->rng, (uint32_t)R->stem.n) * 10 + variant;
}

int al_file_new(struct al_gen *g, int base, int ext, int reserved)
{
	const struct al_roles *R = al_roles();

	for (int tries = 0; tries < 256; tries++) {
		int b;

		if (base >= 0 && tries < 64)	/* all 8 extensions taken: try api2, api3 */
			b = tries < 32 ? base : base / 10 * 10 + (int)al_below(&g->rng, 10);
		else if (tries < 32)
			b = g->base[al_below(&g->rng, (uint32_t)g->nbase)];
		else
			b = random_base(g);
		int e = ext >= 0 && tries < 16 ? ext : (int)al_below(&g->rng, (uint32_t)R->ext.n);
		int ni = name_index(R, b / 10, b % 10, e);

		if (g->taken[ni])
			continue;
		if (kvmem_grow(&g->file, sizeof(*g->file), (size_t)g->nfile + 1, &g->capfile, 64))
			return kvmem_error(ENOMEM, "agentlang: out of memory for %d files", g->nfile + 1);
		g->taken[ni] = 1;
		struct al_file *f = &g->file[g->nfile];
		memset(f, 0, sizeof(*f));
		f->stem = (uint16_t)(b / 10);
		f->variant = (uint8_t)(b % 10);
		f->ext = (uint8_t)e;
		f->reserved = (uint8_t)reserved;
		return g->nfile++;
	}
	return kvmem_error(EINVAL, "agentlang: no free file name left in this world");
}

static int pool_kp(struct al_gen *g)
{
	return g->kp_pool[al_below(&g->rng, (uint32_t)g->nkp_pool)];
}

static int pool_kn(struct al_gen *g)
{
	return g->kn_pool[al_below(&g->rng, (uint32_t)g->nkn_pool)];
}

/* Background files: a theme key part for half the keys (db.port, db.host,
 * db.user), the rest from the pools. */
static int world_file(struct al_gen *g)
{
	const struct al_roles *R = al_roles();
	int f = al_file_new(g, -1, (int)al_below(&g->rng, (uint32_t)R->ext.n), 0);

	if (f < 0)
		return kvmem_fail();
	int nkeys = 3 + (int)al_below(&g->rng, 4), theme = pool_kp(g);
	for (int tries = 0; g->file[f].nkeys < nkeys && tries < 32; tries++)
		al_file_add_key(g, f, tries < 4 && al_chance(&g->rng, 0.6) ? theme : pool_kp(g),
				pool_kn(g));
	return f;
}

static void pick_subset(struct al_rng *r, uint8_t *out, int n, int from)
{
	uint8_t all[AL_MAX_LIST];

	for (int i = 0; i < from; i++)
		all[i] = (uint8_t)i;
	for (int i = 0; i < n; i++) {
		int j = i + (int)al_below(r, (uint32_t)(from - i));
		uint8_t t = all[i];

		all[i] = all[j];
		all[j] = t;
		out[i] = all[i];
	}
}

int al_gen_init(struct al_gen *g, uint64_t seed, uint64_t stream, int64_t limit, int nbg,
		double q_rate)
{
	const struct al_roles *R = al_roles();

	memset(g, 0, sizeof(*g));
	al_rng_seed(&g->rng, seed, stream);
	g->limit = limit;
	g->cap = limit;
	g->q_rate = q_rate;
	g->tok = malloc((size_t)limit * sizeof(*g->tok));
	g->taken = calloc((size_t)R->stem.n * 10 * R->ext.n, 1);
	g->nbase = nbg / 2 < 3 ? 3 : nbg / 2 > R->stem.n * 10 ? R->stem.n * 10 : nbg / 2;
	g->base = malloc((size_t)g->nbase * sizeof(*g->base));
	if (!g->tok || !g->taken || !g->base) {
		al_gen_free(g);
		return kvmem_error(ENOMEM, "agentlang: out of memory for a %lld-token stream",
				 (long long)limit);
	}
	for (int i = 0; i < g->nbase; i++)
		g->base[i] = random_base(g);
	g->nkp_pool = 4 + nbg / 4 < R->kp.n ? 4 + nbg / 4 : R->kp.n;
	g->nkn_pool = 8 + nbg / 4 < R->kn.n ? 8 + nbg / 4 : R->kn.n;
	pick_subset(&g->rng, g->kp_pool, g->nkp_pool, R->kp.n);
	pick_subset(&g->rng, g->kn_pool, g->nkn_pool, R->kn.n);
	for (int i = 0; i < nbg; i++)
		if (world_file(g) < 0) {
			al_gen_free(g);
			return kvmem_fail();
		}
	return 0;
}

void al_gen_free(struct al_gen *g)
{
	free(g->tok);
	free(g->taken);
	free(g->base);
	free(g->file);
	free(g->ask);
	memset(g, 0, sizeof(*g));
}

/* ---- token output ------------------------------------------------------- */
int al_push(struct al_gen *g, int32_t t)
{
	if (g->len >= g->cap)
		return kvmem_error(EINVAL, "agentlang: stream passed its %lld-token limit",
				 (long long)g->cap);
	g->tok[g->len++] = t;
	return 0;
}

int al_push_file(struct al_gen *g, const struct al_file *f)
{
	const struct al_roles *R = al_roles();

	if (al_push(g, R->stem.id[f->stem]))
		return kvmem_fail();
	if (f->variant && al_push(g, R->variant[f->variant]))
		return kvmem_fail();
	return al_push(g, R->ext.id[f->ext]);
}

int al_push_key(struct al_gen *g, const struct al_key *k)
{
	const struct al_roles *R = al_roles();

	return al_push(g, R->kp.id[k->kp]) || al_push(g, R->kn.id[k->kn]) ? -1 : 0;
}

int al_push_value(struct al_gen *g, const struct al_value *v)
{
	for (int i = 0; i < v->n; i++)
		if (al_push(g, v->t[i]))
			return kvmem_fail();
	return 0;
}

static int ask_add(struct al_gen *g, int f, int k)
{
	if (g->file[f].reserved)
		return 0;
	if (kvmem_grow(&g->ask, sizeof(*g->ask), (size_t)g->nask + 1, &g->capask, 64))
		return kvmem_error(ENOMEM, "agentlang: out of memory");
	g->ask[g->nask].f = f;
	g->ask[g->nask++].k = (uint8_t)k;
	return 0;
}

/* "file key = value\n" */
static int fact_line(struct al_gen *g, int f, int k)
{
	struct al_key *key = &g->file[f].key[k];

	g->fact_line = g->len;
	if (al_push_file(g, &g->file[f]) || al_push_key(g, key) || al_push(g, al_roles()->eq))
		return kvmem_fail();
	g->fact_value = g->len;
	if (al_push_value(g, &key->v) || al_push(g, AGENTLANG_NL))
		return kvmem_fail();
	if (!key->shown) {
		key->shown = 1;
		return ask_add(g, f, k);
	}
	return 0;
}

static int command(struct al_gen *g, int32_t a, int32_t b)
{
	return al_push(g, al_roles()->dollar) || al_push(g, a) || (b >= 0 && al_push(g, b)) ? -1 : 0;
}

/* ---- episodes ----------------------------------------------------------- */
int al_ep_cat(struct al_gen *g, int f)
{
	if (command(g, al_roles()->cmd_cat, -1) || al_push_file(g, &g->file[f]) ||
	    al_push(g, AGENTLANG_NL))
		return kvmem_fail();
	for (int k = 0; k < g->file[f].nkeys; k++) {
		if (fact_line(g, f, k))
			return kvmem_fail();
		g->cat_line[k] = g->fact_line;
		g->cat_value[k] = g->fact_value;
	}
	return 0;
}

/* "$ set file key = value\n ok\n": the command line is the fact. */
int al_ep_set(struct al_gen *g, int f, int k, const struct al_value *v)
{
	int64_t start = g->len;

	g->file[f].key[k].v = *v;
	if (command(g, al_roles()->cmd_set, -1) || fact_line(g, f, k))
		return kvmem_fail();
	g->fact_line = start;
	return al_push(g, al_roles()->ok) || al_push(g, AGENTLANG_NL) ? -1 : 0;
}

int al_ep_question(struct al_gen *g, int f, int k)
{
	const struct al_key *key = &g->file[f].key[k];

	if (al_push(g, AGENTLANG_Q) || al_push_file(g, &g->file[f]) || al_push_key(g, key) ||
	    al_push(g, AGENTLANG_A) || al_push_value(g, &key->v) || al_push(g, AGENTLANG_END) ||
	    al_push(g, AGENTLANG_NL))
		return kvmem_fail();
	return 0;
}

/* A random background (not reserved) file. */
static int bg_file(struct al_gen *g)
{
	for (int i = 0; i < 64; i++) {
		int f = (int)al_below(&g->rng, (uint32_t)g->nfile);

		if (!g->file[f].reserved)
			return f;
	}
	for (int f = 0; f < g->nfile; f++)
		if (!g->file[f].reserved)
			return f;
	return 0;
}

static int ep_set_random(struct al_gen *g)
{
	int f = bg_file(g), k;
	struct al_file *file = &g->file[f];

	if (al_chance(&g->rng, 0.25) && file->nkeys < AL_FILE_KEYS) {
		int kp = al_chance(&g->rng, 0.6) ? file->key[0].kp : pool_kp(g);

		k = al_file_add_key(g, f, kp, pool_kn(g));
	} else {
		k = (int)al_below(&g->rng, file->nkeys);
	}
	struct al_value v;
	al_value_random(g, al_key_type(&file->key[k]), &file->key[k].v, &v);
	return al_ep_set(g, f, k, &v);
}

/* "$ grep db.port": that key in up to four files. */
static int ep_grep(struct al_gen *g)
{
	int f0 = bg_file(g);
	const struct al_key *key = &g->file[f0].key[al_below(&g->rng, g->file[f0].nkeys)];
	int kp = key->kp, kn = key->kn, shown = 0;

	if (command(g, al_roles()->cmd_grep, -1) || al_push_key(g, key) || al_push(g, AGENTLANG_NL))
		return kvmem_fail();
	int start = (int)al_below(&g->rng, (uint32_t)g->nfile);
	for (int i = 0; i < g->nfile && shown < 4; i++) {
		int f = (start + i) % g->nfile, k;

		if (g->file[f].reserved || (k = al_file_find_key(&g->file[f], kp, kn)) < 0)
			continue;
		if (fact_line(g, f, k))
			return kvmem_fail();
		shown++;
	}
	return 0;
}

static int ep_ls(struct al_gen *g)
{
	int n = 3 + (int)al_below(&g->rng, 8);

	if (command(g, al_roles()->cmd_ls, -1) || al_push(g, AGENTLANG_NL))
		return kvmem_fail();
	for (int i = 0; i < n; i++) {
		if (al_push_file(g, &g->file[al_below(&g->rng, (uint32_t)g->nfile)]))
			return kvmem_fail();
		if ((i % 4 == 3 || i == n - 1) && al_push(g, AGENTLANG_NL))
			return kvmem_fail();
	}
	return 0;
}

static int32_t log_word(struct al_gen *g)
{
	const struct al_roles *R = al_roles();
	uint32_t c = al_below(&g->rng, 10);

	if (c < 6)
		return R->logw.id[al_below(&g->rng, (uint32_t)R->logw.n)];
	if (c < 8)
		return R->num[al_below(&g->rng, 100)];
	return R->kp.id[g->kp_pool[al_below(&g->rng, (uint32_t)g->nkp_pool)]];
}

/* "stem2: level word word ...\n" */
static int log_line(struct al_gen *g, const struct al_file *f, int words)
{
	const struct al_roles *R = al_roles();

	if (al_push(g, R->stem.id[f->stem]) || (f->variant && al_push(g, R->variant[f->variant])) ||
	    al_push(g, R->colon) || al_push(g, R->level.id[al_below(&g->rng, 4)]))
		return kvmem_fail();
	for (int i = 0; i < words; i++)
		if (al_push(g, log_word(g)))
			return kvmem_fail();
	return al_push(g, AGENTLANG_NL);
}

static int ep_tail(struct al_gen *g)
{
	const struct al_roles *R = al_roles();
	const struct al_file *f = &g->file[bg_file(g)];
	int lines = 2 + (int)al_below(&g->rng, 3);

	if (command(g, R->cmd_tail, -1) || al_push(g, R->stem.id[f->stem]) ||
	    (f->variant && al_push(g, R->variant[f->variant])) || al_push(g, R->ext_log) ||
	    al_push(g, AGENTLANG_NL))
		return kvmem_fail();
	for (int i = 0; i < lines; i++)
		if (log_line(g, f, 1 + (int)al_below(&g->rng, 5)))
			return kvmem_fail();
	return 0;
}

static int ep_run(struct al_gen *g)
{
	const struct al_roles *R = al_roles();
	uint32_t c = al_below(&g->rng, 3);
	int rc;

	if (c == 0) {		/* $ make test / passed 41 failed 0 */
		rc = command(g, R->cmd_make, R->cmd_test) || al_push(g, AGENTLANG_NL) ||
		     al_push(g, R->w_passed) || al_push(g, R->num[al_below(&g->rng, 100)]) ||
		     al_push(g, R->w_failed) ||
		     al_push(g, R->num[al_chance(&g->rng, 0.7) ? 0 : al_below(&g->rng, 10)]) ||
		     al_push(g, AGENTLANG_NL);
	} else if (c == 1) {	/* $ git status / modified api.conf */
		rc = command(g, R->cmd_git, R->cmd_status) || al_push(g, AGENTLANG_NL);
		int n = (int)al_below(&g->rng, 3);
		if (!rc && n == 0)
			rc = al_push(g, R->w_clean) || al_push(g, AGENTLANG_NL);
		for (int i = 0; !rc && i < n; i++)
			rc = al_push(g, R->w_modified) ||
			     al_push_file(g, &g->file[al_below(&g->rng, (uint32_t)g->nfile)]) ||
			     al_push(g, AGENTLANG_NL);
	} else {		/* $ npm run build / built 12 files took 340ms */
		rc = command(g, R->cmd_npm, R->cmd_run) || al_push(g, R->cmd_build) ||
		     al_push(g, AGENTLANG_NL) || al_push(g, R->w_built) ||
		     al_push(g, R->num[1 + al_below(&g->rng, 99)]) || al_push(g, R->w_files) ||
		     al_push(g, R->w_took) || al_push(g, R->num[1 + al_below(&g->rng, 99)]) ||
		     al_push(g, R->unit.id[0]) || al_push(g, AGENTLANG_NL);
	}
	return rc ? -1 : 0;
}

int al_ep_background(struct al_gen *g)
{
	int64_t start = g->len;
	int rc;

	if (g->q_credit >= 1.0 && g->nask > 0) {
		const struct al_pair *p = &g->ask[al_below(&g->rng, (uint32_t)g->nask)];

		g->q_credit -= 1.0;
		return al_ep_question(g, p->f, p->k);
	}
	uint32_t c = al_below(&g->rng, 82);
	if (c < 30)
		rc = al_ep_cat(g, bg_file(g));
	else if (c < 44)
		rc = ep_set_random(g);
	else if (c < 54)
		rc = ep_grep(g);
	else if (c < 62)
		rc = ep_ls(g);
	else if (c < 74)
		rc = ep_tail(g);
	else
		rc = ep_run(g);
	if (rc)
		return rc;
	if (g->len - start > AL_EP_MAX)
		return kvmem_error(EINVAL, "agentlang: an episode took %lld tokens, more than %d",
				 (long long)(g->len - start), AL_EP_MAX);
	g->q_credit += (double)(g->len - start) * g->q_rate;
	return 0;
}

int al_ep_small(struct al_gen *g)
{
	if (g->q_rate > 0 && g->nask > 0 && al_chance(&g->rng, 0.5)) {
		const struct al_pair *p = &g->ask[al_below(&g->rng, (uint32_t)g->nask)];

		return al_ep_question(g, p->f, p->k);
	}
	return ep_set_random(g);
}

int al_fill(struct al_gen *g)
{
	/* No variant digit: a line is then exactly 3 + words tokens. */
	struct al_file plain = g->file[bg_file(g)];

	plain.variant = 0;
	const struct al_file *f = &plain;

	while (g->limit - g->len >= 4) {
		int64_t r = g->limit - g->len;
		int words = 1 + (int)al_below(&g->rng, 6);

		if (words > r - 3)
			words = (int)(r - 3);
		int64_t rest = r - 3 - words;
		if (rest > 0 && rest < 4)
			words += (int)rest;	/* never leave 1..3 tokens */
		if (log_line(g, f, words - 1))
			return kvmem_fail();
	}
	while (g->len < g->limit)
		if (al_push(g, AGENTLANG_NL))
			return kvmem_fail();
	return 0;
}
