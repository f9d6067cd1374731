// SPDX-License-Identifier: MIT
/*
 * A turn of kvmem serve, as units for the engine's rounds (serve_int.h).
 *
 *   start    the request's messages must begin with every message the
 *            conversation holds (else 409); the new ones are rendered by
 *            the chat template (or the new text tokenized); a request that
 *            repeats the last turn gets its stored answer (replayed)
 *   prefill  whole chunks, one unit each, as one append of everything
 *            would cut them
 *   select   the step boundary: its own unit, so it never holds the other
 *            conversations' decode back for more than itself
 *   decode   the server samples from the session's last logits (the
 *            request's sampler, seed and cuts; kvmem_sample), publishes the
 *            text at once, and the unit appends the token
 *   close    the tokens that end the turn in the history, then the record
 *            and the commit
 *
 * A turn's results do not depend on what else runs: sessions never share a
 * view, and each request draws from a sampler state of its own.
 */
#ifndef KVMEM_NO_SERVE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "serve_int.h"

enum { PH_PREFILL = 0, PH_SELECT, PH_DECODE, PH_CLOSE, PH_COMMIT, PH_PARKED, PH_RESTORE };

/* ---- matching ------------------------------------------------------------------- */
/* json_equal() says 0 when either side is absent. */
static int same(json_t *a, json_t *b)
{
	return (!a && !b) || (a && b && json_equal(a, b));
}

static int msg_same(json_t *a, json_t *b)
{
	return same(json_object_get(a, "role"), json_object_get(b, "role")) &&
	       same(json_object_get(a, "content"), json_object_get(b, "content")) &&
	       same(json_object_get(a, "tool_calls"), json_object_get(b, "tool_calls"));
}

/* ---- publishing ------------------------------------------------------------------ */
static void publish_text(struct job *j, const char *text, size_t len)
{
	struct serve *sv = j->sv;

	pthread_mutex_lock(&sv->mu);
	if (len + 1 > j->out_cap) {
		size_t cap = len + 256;
		char *p = realloc(j->out, cap);

		if (p) {
			j->out = p;
			j->out_cap = cap;
		}
	}
	if (len + 1 <= j->out_cap) {
		memcpy(j->out, text, len);
		j->out[len] = 0;
		j->out_len = len;
	}
	if (!j->t_first && len)
		j->t_first = serve_now();
	serve_news(j);
	pthread_mutex_unlock(&sv->mu);
}

/* A replay's log probabilities from the turn's record (conv_save): the
 * tokens' and as many alternatives as the request asks of those kept. A
 * turn recorded without them answers "logprobs": null (not an empty list:
 * the answer has tokens, their log probabilities are not known). */
static void replay_lps(struct job *j, json_t *turn)
{
	json_t *a = json_object_get(turn, "logprobs"), *e;
	size_t i;

	if (!j->logprobs)
		return;
	if (!json_is_array(a) || !(j->lps = calloc(json_array_size(a) + 1, sizeof(*j->lps)))) {
		j->logprobs = 0;
		return;
	}
	j->cap_lps = json_array_size(a) + 1;
	json_array_foreach(a, i, e) {
		struct tok_lp *lp = &j->lps[j->n_lps++];
		json_t *ids = json_array_get(e, 2), *lps = json_array_get(e, 3);

		lp->id = (int32_t)json_integer_value(json_array_get(e, 0));
		lp->lp = (float)json_number_value(json_array_get(e, 1));
		for (size_t k = 0; k < json_array_size(ids) && (int)k < j->top_logprobs &&
				   k < SERVE_TOP_LOGPROBS_MAX; k++) {
			lp->top_id[k] = (int32_t)json_integer_value(json_array_get(ids, k));
			lp->top_lp[k] = (float)json_number_value(json_array_get(lps, k));
			lp->n_top = (int)k + 1;
		}
	}
}

/* The turn's answer from the record: nothing runs. */
static void replay(struct job *j, const char *text, size_t len, json_t *turn)
{
	struct serve *sv = j->sv;

	replay_lps(j, turn);
	publish_text(j, text, len);
	pthread_mutex_lock(&sv->mu);
	j->replayed = 1;
	j->ws_tokens = kvmem_session_tokens(j->cv->s);
	/* The usage the turn had when it ran (records before it was kept
	 * have none: 0). */
	j->prompt_tokens = json_integer_value(json_object_get(turn, "prompt_tokens"));
	j->completion_tokens = json_integer_value(json_object_get(turn, "completion_tokens"));
	j->finish_length = json_is_true(json_object_get(turn, "length"));
	sv->c.replays++;
	j->done = 1;
	j->t_end = serve_now();
	serve_news(j);
	pthread_mutex_unlock(&sv->mu);
}

/* The longest suffix of text[0..len) that is a proper prefix of a stop
 * string: held back, since the next token may complete the stop. */
static size_t stop_hold(const struct job *j, const char *text, size_t len)
{
	size_t hold = 0;

	for (int s = 0; s < j->n_stop; s++) {
		size_t sl = strlen(j->stop[s]);

		for (size_t k = sl - 1; k > hold; k--)
			if (k <= len && !memcmp(text + len - k, j->stop[s], k)) {
				hold = k;
				break;
			}
	}
	return hold;
}

/* Decode what was generated; cut it at the first stop string (then the
 * turn ends); publish the stable prefix: a trailing U+FFFD may still become
 * a character and a stop string's beginning may still become one, so both
 * wait unless final. 1: a stop string was found. */
static int refresh_text(struct job *j, int final)
{
	struct serve *sv = j->sv;
	char *text, *hit = NULL;
	size_t len, stable;

	if (j->stopped && j->stop_id < 0) {
		publish_text(j, j->text, j->text_len);	/* already cut */
		return 1;
	}
	if (kvmem_tokenizer_decode(sv->tok.tok, j->gen.v, j->gen.n, KVMEM_TOK_SKIP_SPECIAL, &text, &len))
		return -1;
	for (int s = 0; s < j->n_stop; s++) {
		char *h = memmem(text, len, j->stop[s], strlen(j->stop[s]));

		if (h && (!hit || h < hit))
			hit = h;
	}
	if (hit)
		len = (size_t)(hit - text);
	free(j->text);
	j->text = text;
	j->text_len = len;
	stable = len;
	if (!final && !hit) {
		while (stable >= 3 && !memcmp(text + stable - 3, "\xEF\xBF\xBD", 3))
			stable -= 3;
		stable -= stop_hold(j, text, stable);
	}
	if (stable > j->out_len || final || hit)
		publish_text(j, text, stable);
	if (hit) {
		j->stopped = 1;
		j->stop_id = -1;
	}
	return hit != NULL;
}

/* ---- start ------------------------------------------------------------------------ */
static int start_chat(struct job *j, struct conv *c)
{
	struct serve *sv = j->sv;
	size_t n = json_array_size(j->messages), held = c ? json_array_size(c->messages) : 0;
	const char **strs = NULL;
	kvmem_chat_msg *m;
	kvmem_chat_opts o = { .add_generation_prompt = 1, .thinking = j->thinking,
			      .tools = (const char *const *)j->tools, .n_tools = j->n_tools };
	int rc;

	for (size_t i = 0; i < held && i < n; i++)
		if (!msg_same(json_array_get(j->messages, i), json_array_get(c->messages, i))) {
			json_t *x = json_array_get(j->messages, i);

			job_fail(j, 409, "conversation_mismatch", "message %zu (%s) differs from what "
				 "conversation '%s' holds: a request sends the %zu messages the "
				 "conversation holds, unchanged, then its new ones (GET "
				 "/v1/conversations/%s gives them)", i,
				 json_string_value(json_object_get(x, "role")), j->conv, held, j->conv);
			return 1;
		}
	if (c && held && n == held - 1 &&
	    !strcmp(json_string_value(json_object_get(json_array_get(c->messages, held - 1), "role")),
		    "assistant")) {
		/* The last turn again: its answer is held. */
		const char *t = json_string_value(json_object_get(json_array_get(c->messages, held - 1),
								  "content"));

		replay(j, t ? t : "", t ? strlen(t) : 0,
		       json_array_get(c->turns, json_array_size(c->turns) - 1));
		return 1;
	}
	if (n <= held) {
		job_fail(j, 409, "conversation_mismatch", "conversation '%s' holds %zu messages; "
			 "the request has %zu: nothing new to answer", j->conv, held, n);
		return 1;
	}
	m = serve_chat_msgs(j->messages, &strs);
	if (!m) {
		job_fail(j, 500, "server_error", "out of memory");
		return 1;
	}
	rc = kvmem_chat_render(sv->tok.tok, m, n, held, &o, &j->ids);
	free(m);
	free(strs);
	j->msgs_total = (int64_t)n;
	return rc ? -1 : 0;
}

static int start_text(struct job *j, struct conv *c)
{
	struct serve *sv = j->sv;
	size_t held = c ? c->text_len : 0;
	int rc;

	if (c && held) {
		json_t *last = json_array_get(c->turns, json_array_size(c->turns) - 1);
		json_int_t ans = json_integer_value(json_object_get(last, "answer"));

		/* The last turn's prompt again: its completion is held. */
		if (json_object_get(last, "answer") && ans >= 0 && (size_t)ans <= held &&
		    j->prompt_len == held - (size_t)ans && !memcmp(j->prompt, c->text, j->prompt_len)) {
			replay(j, c->text + j->prompt_len, (size_t)ans, last);
			return 1;
		}
		if (j->prompt_len < held || memcmp(j->prompt, c->text, held)) {
			job_fail(j, 409, "conversation_mismatch", "the prompt does not begin with the "
				 "%zu bytes of text conversation '%s' holds (its prompts and "
				 "completions so far; GET /v1/conversations/%s gives them): send "
				 "them unchanged, then the new text", held, j->conv, j->conv);
			return 1;
		}
	}
	rc = kvmem_tokenizer_encode(sv->tok.tok, j->prompt + held, j->prompt_len - held,
				    KVMEM_TOK_SPECIAL, &j->ids);
	if (!rc && !held && sv->tok.agentlang && (!j->ids.n || j->ids.v[0] != 1)) {
		/* agentlang sequences begin with <bos>. */
		int32_t bos = 1;
		kvmem_ids x = { 0 };

		rc = kvmem_ids_push(&x, &bos, 1) || kvmem_ids_push(&x, j->ids.v, j->ids.n);
		kvmem_ids_free(&j->ids);
		j->ids = x;
	}
	return rc ? -1 : 0;
}

/* A conversation's turn writes its pages: a full disk is this turn's
 * trouble, told before anything is written (a write that fails halfway
 * leaves its bytes until the workspace is written again, which would take
 * the room the other conversations' commits need). The estimate: the
 * turn's tokens in whole blocks of every layer, the tail's two slots and
 * the record, against the disk's free space and --max-disk. 1 when
 * refused (507). */
static int disk_short(struct job *j)
{
	struct serve *sv = j->sv;
	kvmem_page_geom g;
	struct statvfs fs;
	uint64_t per_block, need, have;
	int64_t toks = (int64_t)j->ids.n + j->max_tokens + 2;

	kvmem_page_geom_model(&g, sv->m, sv->cfg.block);
	per_block = (uint64_t)kvmem_page_stride(&g) * g.n_layers;
	need = ((uint64_t)toks / (uint64_t)sv->cfg.block + 3) * per_block + (1u << 20);
	if (sv->cfg.max_disk) {
		/* The walk is at most 10 s old; the turns started since add
		 * their estimates, so a burst does not pass the cap by them. */
		uint64_t used = serve_disk_bytes(sv, 10), pending;

		pthread_mutex_lock(&sv->mu);
		pending = sv->disk_pending;
		if (used + pending + need <= sv->cfg.max_disk)
			sv->disk_pending += need;
		pthread_mutex_unlock(&sv->mu);
		if (used + pending + need > sv->cfg.max_disk) {
			job_fail(j, 507, "insufficient_storage", "conversation '%s': this turn (%zu new "
				 "tokens, max_tokens %lld) needs about %.1f MiB on disk, and the "
				 "conversations take %.1f MiB of the %.1f MiB --max-disk allows; the "
				 "conversation keeps its last turn", j->conv, j->ids.n,
				 (long long)j->max_tokens, need / 1048576.0,
				 (used + pending) / 1048576.0, sv->cfg.max_disk / 1048576.0);
			return 1;
		}
	}
	if (statvfs(j->cv->dir, &fs))
		return 0;
	have = (uint64_t)fs.f_bavail * fs.f_frsize;
	if (have >= need)
		return 0;
	job_fail(j, 507, "insufficient_storage", "conversation '%s': this turn (%zu new tokens, "
		 "max_tokens %lld) needs about %.1f MiB on disk, and the data directory has %.1f MiB "
		 "free; the conversation keeps its last turn", j->conv, j->ids.n,
		 (long long)j->max_tokens, need / 1048576.0, have / 1048576.0);
	return 1;
}

static int start_view(struct job *j);

/* turn_start's work; *cv: the conversation it opened, if any. */
static int start(struct job *j, struct conv **cv)
{
	struct serve *sv = j->sv;
	const struct serve_cfg *cfg = &sv->cfg;
	struct conv *c = NULL;
	int rc;

	if (j->conv[0]) {
		if (!(c = *cv = pool_get(sv, j)))
			return 1;
		if (c->kind >= 0 && c->kind != j->kind) {
			job_fail(j, 409, "conversation_kind", "conversation '%s' holds %s; it cannot "
				 "continue with %s", j->conv,
				 c->kind == JOB_CHAT ? "chat messages" : "completion text",
				 j->kind == JOB_CHAT ? "chat messages" : "completion text");
			return 1;
		}
		j->cv = c;
		j->s = c->s;
		j->restored = c->restored;
	}
	rc = j->kind == JOB_CHAT ? start_chat(j, c) : start_text(j, c);
	if (rc > 0) {
		j->cv = NULL;
		j->s = NULL;
		return 1;
	}
	if (rc < 0) {
		job_fail(j, 400, "invalid_prompt", "%s", kvmem_last_error());
		return 1;
	}
	if (!j->ids.n) {
		job_fail(j, 400, "invalid_prompt", "nothing new to append: the prompt is empty");
		return 1;
	}
	if (j->json_object && !serve_json_possible(sv)) {
		job_fail(j, 400, "invalid_request", "response_format json_object: no token of model "
			 "'%s' can begin a JSON object ('{')", sv->name);
		return 1;
	}
	if ((int64_t)j->ids.n + j->max_tokens > cfg->max_request_tokens) {
		job_fail(j, 400, "too_many_tokens", "the request's new turns are %zu tokens and "
			 "max_tokens %lld: more than the %lld tokens a request may run "
			 "(--max-request-tokens)", j->ids.n, (long long)j->max_tokens,
			 (long long)cfg->max_request_tokens);
		return 1;
	}
	if (c && cfg->max_conv_tokens &&
	    kvmem_session_tokens(c->s) + (int64_t)j->ids.n + j->max_tokens + 2 > cfg->max_conv_tokens) {
		job_fail(j, 400, "conversation_full", "conversation '%s' holds %lld tokens; this "
			 "turn's %zu new tokens and max_tokens %lld would pass the %lld a "
			 "conversation may hold (--max-conversation-tokens): begin another",
			 j->conv, (long long)kvmem_session_tokens(c->s), j->ids.n,
			 (long long)j->max_tokens, (long long)cfg->max_conv_tokens);
		return 1;
	}
	if (c && disk_short(j))
		return 1;
	if (!c) {
		kvmem_session_opts so;

		kvmem_session_opts_default(&so);
		so.block = cfg->block;
		so.budget = cfg->budget;
		so.chunk = cfg->chunk;
		so.policy = cfg->policy;
		so.seed = j->samp.seed;
		if (!(j->s = kvmem_session_create(sv->be, &so))) {
			job_fail(j, 500, "server_error", "%s", kvmem_last_error());
			return 1;
		}
	} else {
		/* An idle conversation's view comes back from its pages
		 * (serve_pool.c), never by a prefill of its history, a few
		 * layers a round (turn_unit's PH_RESTORE) while the others'
		 * units run; busy first, so that room under --max-views is made
		 * elsewhere. The rest of the start waits for it. */
		c->busy = 1;
		if (pool_view_back_begin(sv, c)) {
			j->phase = PH_RESTORE;
			return 0;
		}
	}
	rc = start_view(j);
	if (rc && !j->cv)
		*cv = NULL;	/* turn_undo closed it */
	return rc;
}

/* The rest of a turn's start, its view in place: 0 (running, or parked
 * short of memory) or 1 (failed: answered). */
static int start_view(struct job *j)
{
	struct serve *sv = j->sv;

	j->rng = kvmem_rng_seed(j->samp.seed);
	pthread_mutex_lock(&sv->mu);
	j->prompt_tokens = (int64_t)j->ids.n;
	pthread_mutex_unlock(&sv->mu);
	j->phase = PH_PREFILL;
	/* The turn's view memory now, before any of its work: short of it,
	 * the turn waits (parked) having done nothing, and its decode never
	 * grows the view (a failure there could not wait: tokens are out). */
	if (kvmem_session_reserve(j->s, (int64_t)j->ids.n + j->max_tokens + 2)) {
		if (kvmem_last_errno() != ENOMEM) {
			job_fail(j, 500, "server_error", "%s", kvmem_last_error());
			turn_undo(j);	/* closes it: it reopens at its last commit */
			return 1;
		}
		snprintf(j->short_of, sizeof(j->short_of), "%s", kvmem_last_error());
		j->phase = PH_PARKED;
	}
	return 0;
}

/* ---- units --------------------------------------------------------------------------- */
/* A turn whose tokens are the session's own greedy draws (no temperature,
 * logprobs or json_object: nothing that reads the logits on the host). */
static int greedy_plain(const struct job *j)
{
	return j->samp.temperature <= 0 && !j->json_object && !j->logprobs;
}

/* A turn at a temperature whose draw the session can make alone: nothing
 * read from the logits on the host (logprobs), no JSON constraint, no
 * min_p (a cut the session does not know). */
static int device_drawable(const struct job *j)
{
	return j->samp.temperature > 0 && !j->json_object && !j->logprobs && !(j->samp.min_p > 0);
}

/* The next token from the turn's last logits (and its logprobs when asked). */
static int draw(struct job *j, int32_t *out, struct tok_lp *lp)
{
	struct serve *sv = j->sv;
	const float *logits;
	int32_t id;
	int rc, plain = greedy_plain(j);

	if (plain) {
		/* A plain greedy draw is the session's own (kvmem_sample's
		 * rule): a batched step's is made beside its logits, which
		 * then stay on the device (kvmem/session.h, "Batched steps").
		 * With ignore_eos a best token that is not a stop is also the
		 * best of the tokens that are not (the first of the highest);
		 * only a stop sends the draw to the masked logits below, whose
		 * passes over 151,936 logits a token are the engine thread's
		 * (issue #26: benchmarks.md, "kvmem serve's rounds"). */
		if ((rc = kvmem_session_draw(j->s, NULL, &id)))
			return rc;
		plain = !(j->ignore_eos && tok_cli_is_stop(&sv->tok, id));
	}
	if (!plain && device_drawable(j)) {
		/* The session draws at the temperature (kvmem_sample's token,
		 * ignore_eos's stops left out) and, after a batched step on the
		 * GPU, beside the logits, where they stay: a round's draws were
		 * 3 ms of its 11 on the host (issue #26). */
		const kvmem_sampler smp = { .temperature = j->samp.temperature,
					    .top_k = j->samp.top_k, .top_p = j->samp.top_p };
		int32_t stops[8];
		kvmem_draw_opts o = { .rng = &j->rng, .banned = stops };

		for (int k = 0; j->ignore_eos && k < sv->tok.n_stop && k < 8; k++)
			if (sv->tok.stop[k] >= 0 && sv->tok.stop[k] < sv->m->cfg.vocab)
				stops[o.n_banned++] = sv->tok.stop[k];
		if ((rc = kvmem_session_draw_with(j->s, &smp, &o, &id)))
			return rc;
		*out = id;
		return 0;
	}
	if (!plain) {
		if (!(logits = kvmem_session_logits(j->s)))
			return kvmem_error(EINVAL, "no logits to sample from");
		rc = serve_sample(sv, logits, sv->m->cfg.vocab, j, &j->rng,
				  j->json_object ? &j->jp : NULL, &id, j->logprobs ? lp : NULL);
		if (rc)
			return rc;
	}
	*out = id;
	return 0;
}

/* A decode turn whose next draw reads its logits on the host (a
 * temperature, logprobs): worth drawing ahead, beside the others'. Not
 * json_object's (its pieces' table is made at its first use). */
static int wants_predraw(const struct job *j)
{
	return !j->done && j->phase == PH_DECODE && !j->pending && !j->drawn && !j->json_object &&
	       !greedy_plain(j);
}

int turn_predraw(struct job *const *run, int n)
{
	struct job **w = malloc(sizeof(*w) * (size_t)(n > 0 ? n : 1));
	int m = 0;

	if (!w)
		return 0;	/* each draws with its unit, as before */
	for (int i = 0; i < n; i++)
		if (wants_predraw(run[i]))
			w[m++] = run[i];
	/* Each draw touches its own turn, session and random state only. */
#pragma omp parallel for schedule(dynamic, 1) if (m >= 2)
	for (int k = 0; k < m; k++) {
		struct job *j = w[k];

		j->drawn_rc = draw(j, &j->drawn_id, &j->drawn_lp);
		if (j->drawn_rc)
			snprintf(j->drawn_err, sizeof(j->drawn_err), "%s", kvmem_last_error());
		j->drawn = 1;
	}
	free(w);
	return m;
}

/* Sample the next token (or take the one drawn ahead); the turn's end when
 * it is a stop, the last one or completes a stop string. -1: failed. */
static int sample_next(struct job *j)
{
	struct serve *sv = j->sv;
	struct tok_lp lp;
	int32_t id;
	int rc;

	if (j->drawn) {
		j->drawn = 0;
		if (j->drawn_rc)
			return kvmem_error(-j->drawn_rc, "%s", j->drawn_err);
		id = j->drawn_id;
		lp = j->drawn_lp;
	} else if ((rc = draw(j, &id, &lp))) {
		return rc;
	}
	j->tok = id;
	pthread_mutex_lock(&sv->mu);
	j->completion_tokens++;
	sv->c.completion_tokens++;
	/* A stop token ends the content and is not part of it. */
	if (j->logprobs && tok_cli_is_stop(&sv->tok, id))
		lp.id = -1;
	if (j->logprobs && lp.id >= 0 && j->n_lps == j->cap_lps) {
		size_t cap = j->cap_lps ? 2 * j->cap_lps : 16;
		struct tok_lp *p = realloc(j->lps, cap * sizeof(*p));

		if (p) {
			j->lps = p;
			j->cap_lps = cap;
		}
	}
	if (j->logprobs && lp.id >= 0 && j->n_lps < j->cap_lps)
		j->lps[j->n_lps++] = lp;
	pthread_mutex_unlock(&sv->mu);
	if (tok_cli_is_stop(&sv->tok, id)) {
		/* The stop token goes into the history, not the content. */
		j->stopped = 1;
		j->stop_id = id;
		j->phase = PH_CLOSE;
		return 0;
	}
	if (kvmem_ids_push(&j->gen, &id, 1))
		return -1;
	rc = refresh_text(j, 0);
	if (rc < 0)
		return -1;
	if (rc > 0) {
		j->phase = PH_CLOSE;
	} else if ((int64_t)j->gen.n >= j->max_tokens) {
		j->finish_length = 1;
		j->phase = PH_CLOSE;
	}
	return 0;
}

int turn_prefill_next(const struct job *j)
{
	size_t k, per;

	if (j->phase == PH_COMMIT)
		return -1;
	if (j->phase != PH_PREFILL)
		return 0;
	k = j->ids.n - j->appended;
	per = (size_t)kvmem_session_options(j->s)->chunk;
	return (int)(k < per ? k : per);
}

int64_t turn_prefill_left(const struct job *j)
{
	return j->phase == PH_PREFILL ? (int64_t)(j->ids.n - j->appended) : 0;
}

int turn_unit(struct job *j, struct serve_unit *u)
{
	struct serve *sv = j->sv;

	memset(u, 0, sizeof(*u));
	u->s = j->s;
	if (j->phase == PH_RESTORE) {
		/* A slice of the view's layout a round; after the last, the
		 * turn's units from the next round on (its prompt's chunks then
		 * take their place in the round's prefill budget). */
		int rc = pool_view_back_step(sv, j->cv);

		if (rc < 0) {
			struct conv *c = j->cv;

			c->busy = 0;
			job_fail(j, 500, "conversation_unavailable", "conversation '%s': %s", j->conv,
				 kvmem_last_error());
			j->cv = NULL;
			j->s = NULL;
			pool_close(sv, c);
			return -1;
		}
		if (rc > 0)
			return 1;
		return start_view(j) ? -1 : 1;	/* running, or parked short of memory */
	}
	switch (j->phase) {
	case PH_PREFILL: {
		/* Slices of whole chunks: the forward passes fall where one
		 * append of everything would put them. */
		size_t k = j->ids.n - j->appended, per = (size_t)kvmem_session_options(j->s)->chunk;

		u->kind = SERVE_UNIT_PREFILL;
		u->tokens = j->ids.v + j->appended;
		u->n = (int)(k < per ? k : per);
		return 0;
	}
	case PH_SELECT:
		/* Slices of an eighth of the layers' placements (at least
		 * one) until --view-slice is spent, the others' units between
		 * the rounds, as for a view laid out again (PH_RESTORE). */
		u->kind = SERVE_UNIT_SELECT;
		u->n = (sv->m->cfg.n_layers + 7) / 8;
		u->slice_s = sv->cfg.view_slice_ms / 1e3;
		return 0;
	case PH_DECODE: {
		int gone;

		/* A client that went away stops a request of no conversation. */
		pthread_mutex_lock(&sv->mu);
		gone = !j->cv && j->cancelled;
		sv->c.cancelled += gone;
		pthread_mutex_unlock(&sv->mu);
		if (gone) {
			j->phase = PH_COMMIT;
			return 1;
		}
		if (j->pending) {	/* the first token, sampled before the selection */
			j->pending = 0;
			j->phase = j->after_first;
		} else if (sample_next(j)) {
			job_fail_errno(j, kvmem_last_errno(), kvmem_last_error());
			return -1;
		}
		u->kind = SERVE_UNIT_DECODE;
		u->tokens = &j->tok;
		u->n = 1;
		return 0;
	}
	case PH_CLOSE: {
		/* The history holds a well-formed turn: a newline, or
		 * <|im_end|> and a newline when the turn did not end on it. */
		const kvmem_ids *close = j->stopped && j->stop_id == sv->tok.stop[0] ? &sv->tok.after_stop
											 : &sv->tok.after_other;

		j->phase = PH_COMMIT;
		if (!j->cv || j->kind != JOB_CHAT || !close->n)
			return 1;
		u->kind = SERVE_UNIT_PREFILL;
		u->tokens = close->v;
		u->n = (int)close->n;
		return 0;
	}
	default:
		return 1;
	}
}

int turn_after(struct job *j, struct serve_unit *u)
{
	struct serve *sv = j->sv;

	if (u->rc) {
		/* Out of memory before the first token: nothing has reached
		 * the client, so the turn can wait and run again (the engine
		 * parks it, or fails it when nothing else runs). A selection's
		 * comes after it (sampled at the prompt's end): the turn fails. */
		if (-u->rc == ENOMEM && (j->phase == PH_PREFILL ||
					 (j->phase == PH_SELECT && !j->completion_tokens))) {
			snprintf(j->short_of, sizeof(j->short_of), "%s", u->err);
			j->phase = PH_PARKED;
			return 1;
		}
		job_fail_errno(j, -u->rc, u->err);
		return 1;
	}
	pthread_mutex_lock(&sv->mu);
	if (u->kind == SERVE_UNIT_PREFILL && j->phase == PH_PREFILL) {
		sv->c.prefill_s += u->seconds;
		sv->c.prompt_tokens += (uint64_t)u->n;
	} else if (u->kind == SERVE_UNIT_SELECT) {
		sv->c.select_s += u->seconds;
		sv->c.selections += !u->more;
	} else if (u->kind == SERVE_UNIT_DECODE) {
		sv->c.decode_s += u->seconds;
	}
	pthread_mutex_unlock(&sv->mu);
	if (u->kind == SERVE_UNIT_PREFILL && j->phase == PH_PREFILL) {
		j->appended += (size_t)u->n;
		if (j->appended == j->ids.n && !j->max_tokens) {
			j->phase = PH_CLOSE;
		} else if (j->appended == j->ids.n) {
			/* The first token now, from the prompt's logits, which the
			 * step-boundary selection does not change: the client has
			 * it a selection (and a round) sooner, the same token. It
			 * is appended after the selection, as before. */
			j->phase = PH_DECODE;
			if (sample_next(j)) {
				job_fail_errno(j, kvmem_last_errno(), kvmem_last_error());
				return 1;
			}
			j->after_first = j->phase;
			j->pending = 1;
			j->phase = PH_SELECT;
		}
	} else if (u->kind == SERVE_UNIT_SELECT && !u->more) {
		j->phase = PH_DECODE;
	}
	return 0;
}

/* ---- close ------------------------------------------------------------------------------ */
/* Split Qwen3's thinking off the answer: "<think>...</think>\n\n" first. */
static void split_thinking(struct job *j)
{
	const char *open = "<think>", *close = "</think>";
	char *e;

	if (j->sv->tok.agentlang || !j->out || strncmp(j->out, open, 7) || !(e = strstr(j->out, close)))
		return;
	j->reasoning = strndup(j->out + 7, (size_t)(e - j->out - 7));
	e += 8;
	while (*e == '\n')
		e++;
	memmove(j->out, e, strlen(e) + 1);
	j->out_len = strlen(j->out);
}

/* Test only (KVMEM_SERVE_FAULT=record:N, serve.h): the N-th turn ends the
 * process after its record is written and before its workspace is
 * committed, the one moment where the two disagree. */
static void fault_after_record(struct serve *sv, const struct conv *c)
{
	if (!sv->cfg.fault_record || ++sv->fault_records != sv->cfg.fault_record)
		return;
	fprintf(stderr, "%s: KVMEM_SERVE_FAULT: exiting between conversation %s's record and its "
		"commit\n", SERVE_WHO, c->id);
	_exit(75);
}

/* The record and the commit of a conversation's turn. */
static int commit(struct job *j)
{
	struct serve *sv = j->sv;
	struct conv *c = j->cv;
	double t0;

	if (j->kind == JOB_CHAT) {
		for (size_t i = json_array_size(c->messages); i < json_array_size(j->messages); i++)
			json_array_append(c->messages, json_array_get(j->messages, i));
		json_array_append_new(c->messages, json_pack("{ssss}", "role", "assistant", "content",
							     j->out ? j->out : ""));
	} else {
		size_t n = j->prompt_len + j->out_len;
		char *t = realloc(c->text, n + 1);

		if (!t)
			return kvmem_error(ENOMEM, "out of memory");
		memcpy(t, j->prompt, j->prompt_len);
		memcpy(t + j->prompt_len, j->out ? j->out : "", j->out_len);
		t[n] = 0;
		c->text = t;
		c->text_len = n;
	}
	c->kind = j->kind;
	t0 = serve_now();
	/* The record first: after a crash between the two it holds one turn
	 * more than the workspace, and reopening trims it (serve_conv.c). */
	if (conv_save(c, kvmem_session_tokens(c->s), j))
		return -1;
	fault_after_record(sv, c);
	if (kvmem_workspace_commit(c->ws, c->s) < 0)
		return -1;
	pthread_mutex_lock(&sv->mu);
	sv->c.commit_s += serve_now() - t0;
	pthread_mutex_unlock(&sv->mu);
	return 0;
}

int turn_close(struct job *j)
{
	struct serve *sv = j->sv;

	if (refresh_text(j, 1) < 0) {
		job_fail_errno(j, kvmem_last_errno(), kvmem_last_error());
		return 1;
	}
	pthread_mutex_lock(&sv->mu);
	if (j->kind == JOB_CHAT)
		split_thinking(j);
	pthread_mutex_unlock(&sv->mu);
	if (j->cv && commit(j)) {
		job_fail_errno(j, kvmem_last_errno(), kvmem_last_error());
		return 1;
	}
	pthread_mutex_lock(&sv->mu);
	j->ws_tokens = kvmem_session_tokens(j->s);
	j->done = 1;
	j->t_end = serve_now();
	sv->c.turns++;
	sv->c.turn_s += j->t_end - j->t_submit;
	if (j->t_first) {
		sv->c.ttft_s += j->t_first - j->t_submit;
		sv->c.ttft_n++;
	}
	serve_news(j);
	pthread_mutex_unlock(&sv->mu);
	return 1;
}

int turn_start(struct job *j)
{
	struct conv *c = NULL;
	int rc = start(j, &c);

	if (!rc && j->s)
		kvmem_session_get_stats(j->s, &j->st0);

	/* No turn runs (refused, or replayed from the record): a shared
	 * conversation (--store) is let go at once, its lease with it, as
	 * after a turn. */
	if (rc && c && c->shared) {
		j->cv = NULL;
		j->s = NULL;
		pool_close(j->sv, c);
	}
	return rc;
}

/* What the turn's session spent, into the server's sums. */
static void add_session_time(struct job *j)
{
	kvmem_session_stats now, *sum = &j->sv->c.sess;
	const kvmem_session_stats *was = &j->st0;

	kvmem_session_get_stats(j->s, &now);
	pthread_mutex_lock(&j->sv->mu);
#define ADD(f) (sum->f += now.f - was->f)
	ADD(forwards), ADD(forward_ns), ADD(store_ns), ADD(own_ns), ADD(begin_ns);
	ADD(reserve_ns), ADD(writer_start_ns), ADD(writer_wait_ns), ADD(score_ns);
	ADD(plan_ns), ADD(place_ns), ADD(lazy_logits), ADD(lazy_fetches), ADD(lazy_draws);
#undef ADD
	pthread_mutex_unlock(&j->sv->mu);
}

void turn_end(struct job *j)
{
	struct serve *sv = j->sv;

	if (j->s)
		add_session_time(j);

	if (j->cv) {
		j->cv->busy = 0;
		j->cv->last_used = serve_now();
		/* A conversation whose turn failed is closed, so the next
		 * request reopens it at its last commit; a shared one
		 * (--store) after every turn, its lease with it, so another
		 * server may take the next turn. */
		if (j->http >= 500 || j->cv->shared)
			pool_close(sv, j->cv);
		/* Between turns a conversation keeps its view, not its row
		 * buffers: four pinned 75 MB buffers at the 8B geometry, which
		 * idle conversations held while every new session pinned its
		 * own on the engine thread (issue #26: benchmarks.md, "kvmem
		 * serve's rounds"). Rows that cannot be put away: closed, to
		 * reopen at the last commit. */
		else if (kvmem_session_idle(j->cv->s))
			pool_close(sv, j->cv);
	} else {
		kvmem_session_free(j->s);
	}
	j->s = NULL;
	j->cv = NULL;
}

int turn_parked(const struct job *j)
{
	return j->phase == PH_PARKED;
}

void turn_undo(struct job *j)
{
	struct serve *sv = j->sv;

	if (j->cv) {
		j->cv->busy = 0;
		pool_close(sv, j->cv);
	} else {
		kvmem_session_free(j->s);
	}
	j->cv = NULL;
	j->s = NULL;
	kvmem_ids_free(&j->ids);
	j->appended = 0;
	j->restored = 0;
	j->phase = PH_PREFILL;
	pthread_mutex_lock(&sv->mu);
	j->prompt_tokens = 0;
	pthread_mutex_unlock(&sv->mu);
}
#endif
