// SPDX-License-Identifier: MIT
/*
 * Sampling for kvmem serve: a request's own sampler state (its seed, or a
 * fresh random one), temperature, top_p and top_k as kvmem_sample draws
 * them, min_p as a top-k cut (the tokens whose probability is at least
 * min_p times the best one's are exactly the best c of them), log
 * probabilities of the model's distribution, and response_format
 * json_object as a constraint: only tokens that keep the text a prefix of
 * one JSON object are drawn, and once the object is closed only a stop.
 */
#ifndef KVMEM_NO_SERVE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>
#include <time.h>

#include "kvmem/kvmem.h"
#include "kvmem/sample.h"
#include "serve_int.h"

uint64_t serve_random_seed(void)
{
	uint64_t s;
	struct timespec ts;

	if (getrandom(&s, sizeof(s), GRND_NONBLOCK) == (ssize_t)sizeof(s))
		return s;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
}

/* ---- JSON prefixes ------------------------------------------------------------- */
enum {
	JS_START,	/* before the top-level '{' */
	JS_KEY_OR_END,	/* after '{' */
	JS_KEY,		/* after ',' in an object */
	JS_COLON,	/* after a key */
	JS_VALUE,	/* after ':' or ',' in an array */
	JS_VALUE_OR_END,/* after '[' */
	JS_AFTER,	/* after a value */
	JS_STRING,	/* inside a value string */
	JS_KSTRING,	/* inside a key */
	JS_NUMBER,
	JS_LITERAL,
	JS_DONE,
};
/* Number states: after '-', after a leading 0, in integer digits, after
 * '.', in fraction digits, after 'e', after its sign, in exponent digits. */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
static const char *const literals[] = { "true", "false", "null" };

static int is_ws(char c)
{
	return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static int value_start(struct json_prefix *jp, char c)
{
	if (c == '"') {
		jp->state = JS_STRING;
		return 0;
	}
	if (c == '{' || c == '[') {
		if (jp->depth >= (int)sizeof(jp->stack))
			return -1;
		jp->stack[jp->depth++] = c;
		jp->state = c == '{' ? JS_KEY_OR_END : JS_VALUE_OR_END;
		return 0;
	}
	if (c == '-' || (c >= '0' && c <= '9')) {
		jp->state = JS_NUMBER;
		jp->num = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
		return 0;
	}
	for (int i = 0; i < 3; i++)
		if (c == literals[i][0]) {
			jp->state = JS_LITERAL;
			jp->lit = i;
			jp->lit_at = 1;
			return 0;
		}
	return -1;
}

static int close_level(struct json_prefix *jp, char c)
{
	if (!jp->depth || jp->stack[jp->depth - 1] != (c == '}' ? '{' : '['))
		return -1;
	jp->depth--;
	jp->state = jp->depth ? JS_AFTER : JS_DONE;
	jp->done = !jp->depth;
	return 0;
}

/* A number ends at the first character that cannot go on with it. */
static int number_char(struct json_prefix *jp, char c)
{
	int d = c >= '0' && c <= '9';

	switch (jp->num) {
	case N_MINUS: if (d) { jp->num = c == '0' ? N_ZERO : N_INT; return 1; } return -1;
	case N_ZERO: break;
	case N_INT: if (d) return 1; break;
	case N_DOT: if (d) { jp->num = N_FRAC; return 1; } return -1;
	case N_FRAC: if (d) return 1; break;
	case N_E:
		if (c == '+' || c == '-') { jp->num = N_ESIGN; return 1; }
		if (d) { jp->num = N_EXP; return 1; }
		return -1;
	case N_ESIGN: if (d) { jp->num = N_EXP; return 1; } return -1;
	case N_EXP: if (d) return 1; return 0;
	}
	if (c == '.' && (jp->num == N_ZERO || jp->num == N_INT)) {
		jp->num = N_DOT;
		return 1;
	}
	if ((c == 'e' || c == 'E') && (jp->num == N_ZERO || jp->num == N_INT || jp->num == N_FRAC)) {
		jp->num = N_E;
		return 1;
	}
	return 0;	/* the number is over (it is complete in these states) */
}

static int feed1(struct json_prefix *jp, char c)
{
	unsigned char u = (unsigned char)c;

	switch (jp->state) {
	case JS_STRING:
	case JS_KSTRING:
		if (jp->esc > 0) {
			if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
				return -1;
			jp->esc--;
			return 0;
		}
		if (jp->esc < 0) {
			if (c == 'u')
				jp->esc = 4;
			else if (strchr("\"\\/bfnrt", c) && c)
				jp->esc = 0;
			else
				return -1;
			return 0;
		}
		if (c == '\\') {
			jp->esc = -1;
			return 0;
		}
		if (c == '"') {
			jp->state = jp->state == JS_KSTRING ? JS_COLON : JS_AFTER;
			return 0;
		}
		return u < 0x20 ? -1 : 0;
	case JS_NUMBER: {
		int r = number_char(jp, c);

		if (r)
			return r > 0 ? 0 : -1;
		jp->state = JS_AFTER;
		return feed1(jp, c);
	}
	case JS_LITERAL:
		if (literals[jp->lit][jp->lit_at] != c)
			return -1;
		if (!literals[jp->lit][++jp->lit_at])
			jp->state = JS_AFTER;
		return 0;
	case JS_DONE:
		return -1;
	default:
		break;
	}
	/* Blanks between tokens, but not without end: a model that only
	 * writes blanks would never close the object. */
	if (is_ws(c))
		return ++jp->ws > 16 ? -1 : 0;
	jp->ws = 0;
	switch (jp->state) {
	case JS_START:
		return c == '{' ? value_start(jp, c) : -1;
	case JS_KEY_OR_END:
		if (c == '}')
			return close_level(jp, c);
		/* fall through */
	case JS_KEY:
		if (c != '"')
			return -1;
		jp->state = JS_KSTRING;
		return 0;
	case JS_COLON:
		if (c != ':')
			return -1;
		jp->state = JS_VALUE;
		return 0;
	case JS_VALUE_OR_END:
		if (c == ']')
			return close_level(jp, c);
		/* fall through */
	case JS_VALUE:
		return value_start(jp, c);
	case JS_AFTER:
		if (c == '}' || c == ']')
			return close_level(jp, c);
		if (c != ',')
			return -1;
		jp->state = jp->stack[jp->depth - 1] == '{' ? JS_KEY : JS_VALUE;
		return 0;
	}
	return -1;
}

int json_prefix_feed(struct json_prefix *jp, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (feed1(jp, s[i]))
			return -1;
	return 0;
}

/* ---- sampling ------------------------------------------------------------------- */
/* log sum exp of the logits, in double (the log probabilities' base). */
static double log_norm(const float *logits, int vocab)
{
	double top = -INFINITY, sum = 0;

	for (int i = 0; i < vocab; i++)
		if (logits[i] > top)
			top = logits[i];
	for (int i = 0; i < vocab; i++)
		sum += exp((double)logits[i] - top);
	return top + log(sum);
}

static void fill_lp(const float *logits, int vocab, int32_t id, int n_top, struct tok_lp *lp)
{
	double z = log_norm(logits, vocab);

	memset(lp, 0, sizeof(*lp));
	lp->id = id;
	lp->lp = (float)((double)logits[id] - z);
	/* The n_top best, best first, ties to the lower id. */
	for (int i = 0; i < vocab; i++) {
		int at = lp->n_top < n_top ? lp->n_top : n_top - 1;

		if (n_top <= 0 || (lp->n_top == n_top && !(logits[i] > logits[lp->top_id[n_top - 1]])))
			continue;
		if (lp->n_top < n_top)
			lp->n_top++;
		while (at > 0 && logits[i] > logits[lp->top_id[at - 1]]) {
			lp->top_id[at] = lp->top_id[at - 1];
			at--;
		}
		lp->top_id[at] = i;
	}
	for (int k = 0; k < lp->n_top; k++)
		lp->top_lp[k] = (float)((double)logits[lp->top_id[k]] - z);
}

/* The text of every id alone, for the JSON constraint: decoded once, on
 * the engine's thread, the first time a request asks for json_object. */
static const char *piece(struct serve *sv, int32_t id, size_t *len)
{
	int n = sv->m->cfg.vocab;

	if (!sv->piece_text) {
		sv->piece_text = calloc((size_t)n, sizeof(char *));
		sv->piece_len = calloc((size_t)n, sizeof(size_t));
		if (!sv->piece_text || !sv->piece_len) {
			free(sv->piece_text);
			free(sv->piece_len);
			sv->piece_text = NULL;
			sv->piece_len = NULL;
			return NULL;
		}
		for (int32_t i = 0; i < n; i++)
			if (kvmem_tokenizer_decode(sv->tok.tok, &i, 1, KVMEM_TOK_SKIP_SPECIAL,
						   &sv->piece_text[i], &sv->piece_len[i]))
				sv->piece_text[i] = NULL;
	}
	if (id < 0 || id >= n || !sv->piece_text[id])
		return NULL;
	*len = sv->piece_len[id];
	return sv->piece_text[id];
}

int serve_json_possible(struct serve *sv)
{
	struct json_prefix jp = { 0 };

	for (int32_t i = 0; i < sv->m->cfg.vocab; i++) {
		size_t len;
		const char *t = piece(sv, i, &len);
		struct json_prefix x = jp;

		if (t && len && !tok_cli_is_stop(&sv->tok, i) && !json_prefix_feed(&x, t, len) &&
		    x.depth)
			return 1;
	}
	return 0;
}

/* Whether id may come next under the JSON constraint. Special tokens
 * decode to nothing: only a stop, and only once the object is closed. */
static int json_allows(struct serve *sv, const struct json_prefix *jp, int32_t id)
{
	struct json_prefix t = *jp;
	size_t len;
	const char *s;

	if (tok_cli_is_stop(&sv->tok, id))
		return jp->done;
	if (jp->done || !(s = piece(sv, id, &len)) || !len)
		return 0;
	return json_prefix_feed(&t, s, len) == 0;
}

int serve_sample(struct serve *sv, const float *logits, int vocab, struct job *j,
		 uint64_t *rng, struct json_prefix *jp, int32_t *out, struct tok_lp *lp)
{
	kvmem_sampler s = { .temperature = j->samp.temperature, .top_k = j->samp.top_k,
			    .top_p = j->samp.top_p, .seed = j->samp.seed };
	const float *use = logits;
	int id;

	/* NaN would never be drawn and infinities would always win: either
	 * way the model's arithmetic overflowed (kvmem_session_decode refuses
	 * the same). */
	for (int i = 0; i < vocab; i++)
		if (!isfinite(logits[i]))
			return kvmem_error(ERANGE, "the logits hold NaN or infinite values (logit %d "
					   "is %g): the model's arithmetic overflowed; nothing sampled",
					   i, (double)logits[i]);

	if (jp || j->ignore_eos) {
		int any = 0;

		/* The turn's own buffer, kept for its next draws: a 0.6 MB
		 * malloc a draw was glibc's mmap and munmap each time, page
		 * faults and a TLB shootdown of every thread while a round's
		 * draws run side by side (turn_predraw). */
		float *masked = j->masked;

		if (!masked && !(masked = j->masked = malloc((size_t)vocab * sizeof(float))))
			return kvmem_error(ENOMEM, "out of memory");
		if (jp) {
			for (int32_t i = 0; i < vocab; i++) {
				int ok = json_allows(sv, jp, i);

				masked[i] = ok ? logits[i] : -INFINITY;
				any |= ok;
			}
		} else {	/* ignore_eos: a stop is never drawn (the turn runs to
				 * max_tokens, as a benchmark wants) */
			memcpy(masked, logits, (size_t)vocab * sizeof(float));
			for (int k = 0; k < sv->tok.n_stop; k++)
				if (sv->tok.stop[k] >= 0 && sv->tok.stop[k] < vocab)
					masked[sv->tok.stop[k]] = -INFINITY;
			for (int32_t i = 0; i < vocab && !any; i++)
				any = masked[i] != -INFINITY || !tok_cli_is_stop(&sv->tok, i);
		}
		if (!any)
			return kvmem_error(EINVAL, "response_format json_object: no token of this "
					   "model's vocabulary can go on with the JSON text so far");
		use = masked;
	}
	if (s.temperature > 0 && j->samp.min_p > 0) {
		/* p_i >= min_p * p_max  <=>  l_i >= l_max + T * ln(min_p). */
		float top = -INFINITY;
		int c = 0;

		for (int i = 0; i < vocab; i++)
			if (use[i] > top)
				top = use[i];
		double cut = top + s.temperature * log(j->samp.min_p);

		for (int i = 0; i < vocab; i++)
			c += use[i] >= cut;
		if (!s.top_k || c < s.top_k)
			s.top_k = c > 0 ? c : 1;
	}
	id = kvmem_sample(use, vocab, &s, rng);
	if (id >= 0 && jp) {
		size_t len;
		const char *t = piece(sv, id, &len);

		if (t && !tok_cli_is_stop(&sv->tok, id))
			json_prefix_feed(jp, t, len);
	}
	if (id < 0)
		return kvmem_error(-id, "sampling: out of memory");
	*out = id;
	if (lp)
		fill_lp(logits, vocab, id, j->top_logprobs, lp);
	return 0;
}
#endif
