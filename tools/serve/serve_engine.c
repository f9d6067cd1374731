// SPDX-License-Identifier: MIT
/*
 * kvmem serve's engine: one thread owns the model, the backend (one view
 * per session) and every conversation, and runs the requests in rounds.
 *
 * Admission. A request waits in a lane: one per conversation (its requests
 * in order, one running at a time), one per request of no conversation.
 * Lanes are served round-robin while fewer than --max-inflight turns run
 * and fewer than --max-open conversations have a turn running; so a busy
 * conversation's many requests never starve another's one. Past
 * --max-queue requests in all, or --max-conversation-queue in one lane, a
 * request is refused at once with 429 and a Retry-After.
 *
 * Rounds. Each round takes one unit from every running turn that has one,
 * starting where the last round stopped, up to --max-batch units and
 * --prefill-budget prefill tokens (whole chunks; at least one chunk when any
 * waits): a decode step, a prefill chunk, a selection, the tokens that close
 * a turn. The budget goes to the prompts oldest first (--prefill-order fcfs,
 * the default: a prompt's first token then waits for the prompts before it,
 * not for a share beside every later one, as a server taking prompts one at
 * a time would have it), or in turn with the round (shared). What a prompt's
 * first chunk leaves of its share goes to its next chunks in the same round
 * (more_prefill). The units go to the batch runner in one
 * call (serve_batch.h); then each turn takes its result, and turns whose
 * units are done are recorded and committed. A selection is a unit like
 * the others: one conversation's step boundary costs the others one
 * round's share, never its whole turn.
 */
#ifndef KVMEM_NO_SERVE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvmem/backend.h"
#include "kvmem/kvmem.h"
#include "serve_int.h"

double serve_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

void serve_news(struct job *j)
{
	pthread_cond_broadcast(&j->lead->news);
}

int serve_wait(struct job *lead, double until)
{
	struct timespec ts;
	double t = serve_now();

	if (t >= until)
		return -ETIMEDOUT;
	ts.tv_sec = (time_t)until;
	ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L)
		ts.tv_nsec = 999999999L;
	pthread_cond_timedwait(&lead->news, &lead->sv->mu, &ts);
	return 0;
}

/* ---- admission ------------------------------------------------------------------- */
static struct lane *lane_find(struct serve *sv, const char *conv)
{
	if (!conv[0])
		return NULL;
	for (struct lane *l = sv->lanes; l; l = l->next)
		if (!strcmp(l->conv, conv))
			return l;
	return NULL;
}

static struct lane *lane_new(struct serve *sv, const char *conv)
{
	struct lane *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	snprintf(l->conv, sizeof(l->conv), "%s", conv);
	if (sv->lanes_tail)
		sv->lanes_tail->next = l;
	else
		sv->lanes = l;
	sv->lanes_tail = l;
	return l;
}

/* Seconds a refused client might wait: a turn's mean time for each round
 * of --max-inflight turns ahead of it (1..60). */
static int retry_after(const struct serve *sv)
{
	double turn = sv->c.turns ? sv->c.turn_s / (double)sv->c.turns : 1.0;
	double s = turn * (1.0 + (double)sv->waiting / (double)sv->cfg.max_inflight);

	return s < 1 ? 1 : s > 60 ? 60 : (int)(s + 0.999);
}

static int refuse(struct serve *sv, struct job *j, int status, const char *code, const char *fmt,
		  long long a)
{
	j->http = status;
	snprintf(j->code, sizeof(j->code), "%s", code);
	snprintf(j->msg, sizeof(j->msg), fmt, a);
	j->retry_after = retry_after(sv);
	sv->c.rejected++;
	return status;
}

int serve_engine_submit(struct serve *sv, struct job **jobs, int n)
{
	struct job *j0 = jobs[0];
	struct lane *l;
	int rc = 0;

	pthread_mutex_lock(&sv->mu);
	l = lane_find(sv, j0->conv);
	if (!sv->running) {
		rc = refuse(sv, j0, 503, "server_shutting_down", "the server is stopping%.0lld", 0);
	} else if (sv->waiting + sv->inflight + n > sv->cfg.max_queue) {
		rc = refuse(sv, j0, 429, "server_busy", "%lld requests are waiting or running, the "
			    "server's limit (--max-queue): try again after Retry-After seconds",
			    (long long)(sv->waiting + sv->inflight));
	} else if (j0->kind == JOB_DELETE && l) {
		rc = refuse(sv, j0, 409, "conversation_busy", "a request of this conversation is "
			    "waiting or running (%lld waiting): delete it when it is done", (long long)l->n);
		j0->retry_after = 0;
	} else if (l && l->n >= sv->cfg.max_conv_queue) {
		rc = refuse(sv, j0, 429, "conversation_queue_full", "%lld requests of this "
			    "conversation are waiting, its limit (--max-conversation-queue): try "
			    "again after Retry-After seconds", (long long)l->n);
	}
	if (rc) {
		pthread_mutex_unlock(&sv->mu);
		return rc;
	}
	for (int i = 0; i < n; i++) {
		struct job *j = jobs[i];

		/* Each choice of a request of no conversation is a lane of
		 * its own; a conversation's requests share one. */
		if (!(l = lane_find(sv, j->conv)) && !(l = lane_new(sv, j->conv))) {
			/* Out of memory: those already queued still run. */
			rc = refuse(sv, j0, 503, "server_error", "out of memory%.0lld", 0);
			break;
		}
		j->refs++;
		j->lane = l;
		j->next = NULL;
		if (l->tail)
			l->tail->next = j;
		else
			l->head = j;
		l->tail = j;
		l->n++;
		sv->waiting++;
	}
	sv->c.requests++;
	pthread_cond_signal(&sv->work);
	pthread_mutex_unlock(&sv->mu);
	return rc;
}

static int conv_open(const struct serve *sv, const char *id)
{
	for (const struct conv *c = sv->convs; c; c = c->next)
		if (!strcmp(c->id, id))
			return 1;
	return 0;
}

/* The jobs whose turn comes now (mu held): one pass over the lanes from
 * the cursor, at most one running per lane. Requests of no conversation
 * whose client left are dropped here. */
static struct job *admit(struct serve *sv, int64_t *conv_inflight)
{
	struct job *in = NULL, **tail = &in;
	struct lane *l = sv->cursor ? sv->cursor : sv->lanes;
	int64_t lanes = 0;

	for (struct lane *x = sv->lanes; x; x = x->next)
		lanes++;
	/* Memory was short: the episode ends when nobody waits; with nothing
	 * running, one turn goes in. */
	if (sv->mem_short && !sv->waiting)
		sv->mem_short = 0;
	if (sv->mem_short && !sv->inflight && sv->mem_slots <= 0)
		sv->mem_slots = 1;
	for (int64_t k = 0; k < lanes && l; k++, l = l->next ? l->next : sv->lanes) {
		struct job *j = l->head;

		if (!j || l->running)
			continue;
		if (sv->running && !j->conv[0] && j->cancelled) {
			/* Nobody waits for it. */
		} else if (sv->running && j->kind != JOB_DELETE &&
			   (sv->inflight >= sv->cfg.max_inflight ||
			    (sv->mem_short && sv->mem_slots <= 0) ||
			    (j->conv[0] && !conv_open(sv, j->conv) && *conv_inflight >= sv->cfg.max_open))) {
			continue;
		}
		if (sv->mem_short && j->kind != JOB_DELETE)
			sv->mem_slots--;
		l->head = j->next;
		if (!l->head)
			l->tail = NULL;
		l->n--;
		sv->waiting--;
		l->running = j;
		j->seq = ++sv->id_counter;
		sv->inflight++;
		*conv_inflight += j->conv[0] != 0;
		j->next = NULL;
		*tail = j;
		tail = &j->next;
		sv->cursor = l->next;
	}
	return in;
}

/* A job leaves the engine (mu taken): its lane goes on, or goes. */
static void finish(struct serve *sv, struct job *j, int64_t *conv_inflight)
{
	struct lane *l = j->lane;

	pthread_mutex_lock(&sv->mu);
	sv->inflight--;
	*conv_inflight -= j->conv[0] != 0;
	if (j->http == 499)
		sv->c.cancelled++;
	l->running = NULL;
	/* Memory short: room for the next turn, and for one more when no
	 * turn was parked since the last one ended. */
	if (sv->mem_short)
		sv->mem_slots += sv->mem_parked ? 1 : 2;
	sv->mem_parked = 0;
	if (!l->head) {
		struct lane **p = &sv->lanes, *prev = NULL;

		while (*p != l) {
			prev = *p;
			p = &(*p)->next;
		}
		*p = l->next;
		if (sv->lanes_tail == l)
			sv->lanes_tail = prev;
		if (sv->cursor == l)
			sv->cursor = l->next;
		free(l);
	}
	pthread_cond_signal(&sv->work);
	pthread_mutex_unlock(&sv->mu);
	job_put(j);
}

/*
 * A turn short of memory before its first token (turn_parked: no room for
 * its view at its start, or a prefill or selection unit that ran out; under
 * --gpu-mem or on a full device). It is undone and waits again at the head
 * of its lane, the idle conversations give their views up, and from then
 * on a new turn is admitted only as a running one ends (mem_short; one more
 * each time a turn ends with none parked since), so that the turns in
 * flight keep to what the memory holds instead of failing with it. Parked
 * at its start it cost nothing; after a unit, the prefill it had done.
 * others: the turns that ran beside it in its round. Alone, with no idle
 * view to give up, it could never fit: 503.
 */
static void park(struct serve *sv, int64_t *conv_inflight, int others, struct job *j)
{
	struct lane *l = j->lane;

	turn_undo(j);
	if (!pool_views_idle(sv) && !others) {
		job_fail(j, 503, "insufficient_memory", "the turn does not fit in the backend's "
			 "memory with nothing else running (%s): a smaller --budget, a shorter "
			 "prompt or a larger --gpu-mem", j->short_of);
		finish(sv, j, conv_inflight);
		return;
	}
	if (!sv->cfg.quiet)
		fprintf(stderr, "%s: request %llu waits for memory (%s): it runs again when a "
			"running turn ends\n", SERVE_WHO, (unsigned long long)j->seq, j->short_of);
	pthread_mutex_lock(&sv->mu);
	sv->inflight--;
	*conv_inflight -= j->conv[0] != 0;
	l->running = NULL;
	j->next = l->head;
	l->head = j;
	if (!l->tail)
		l->tail = j;
	l->n++;
	sv->waiting++;
	sv->cursor = l;		/* first in when room comes */
	sv->mem_short = 1;
	sv->mem_slots = 0;
	sv->mem_parked = 1;
	sv->c.parked++;
	pthread_mutex_unlock(&sv->mu);
}

/* ---- rounds ----------------------------------------------------------------------- */
struct round {
	struct job **run;		/* running turns */
	int n_run, cap_run;
	int first;			/* where the next round starts */
	uint64_t id;			/* rounds run (a prompt's prefill_rounds) */
	struct serve_unit *units;
	struct job **owner;
	int64_t *share;			/* with owner: prefill tokens a unit's turn may
					 * still take this round (fcfs) */
	struct job **wait;		/* fcfs: the turns whose prompt wants a chunk */
	int64_t conv_inflight;		/* conversations with a turn running */
};

/* A unit ran for j in round r: count the rounds of its prompt's prefill
 * (before its first token: a chat turn's closing tokens, prefilled after
 * the answer, are not its prompt's). */
static void ran_unit(struct round *r, struct job *j, struct serve_unit *u)
{
	if (u->kind == SERVE_UNIT_PREFILL && !j->t_first && j->prefill_round != r->id) {
		j->prefill_round = r->id;
		j->prefill_rounds++;
	}
	turn_after(j, u);
}

static void take_in(struct serve *sv, struct round *r, struct job *in)
{
	while (in) {
		struct job *j = in;

		in = in->next;
		j->next = NULL;
		if (!sv->running) {
			job_fail(j, 503, "server_shutting_down", "the server is stopping");
		} else if (!j->conv[0] && j->cancelled) {
			job_fail(j, 499, "client_closed", "the client went away before its turn");
		} else if (j->kind == JOB_DELETE) {
			pool_delete(sv, j);
		} else if (turn_start(j) == 0) {
			/* Room: admission keeps --max-inflight turns at most. */
			r->run[r->n_run++] = j;
			continue;
		}
		finish(sv, j, &r->conv_inflight);
	}
}

/*
 * What a round's first pass left of the prefill budget goes to the prompts
 * that pass served: their next whole chunks run in the same round, in
 * passes of prefill alone, while they fit. So a prompt of P tokens takes
 * about P / --prefill-budget rounds, not P / --chunk, and the others'
 * decode steps between its chunks go with them: on a GPU, where each
 * round's decode pass of 16 conversations costs about what a 512-token
 * chunk does, the first token under load had paid one per chunk. The
 * first pass's units are r->units[0..n) of r->owner; shared: they take
 * `budget` in turn; fcfs: each takes what r->share gave it (the oldest
 * prompt's whole share before the next's). The units run here count with
 * the round.
 */
static int more_prefill(struct serve *sv, struct round *r, int n, int64_t budget, int fcfs)
{
	struct job **pre = r->owner + n;	/* owner, share: 2 max_batch slots; n used */
	int64_t *left = r->share + n;
	int n_pre = 0, ran = 0;

	for (int i = 0; i < n; i++)
		if (r->units[i].kind == SERVE_UNIT_PREFILL && !r->owner[i]->done &&
		    turn_prefill_next(r->owner[i]) > 0) {
			left[n_pre] = r->share[i];
			pre[n_pre++] = r->owner[i];
		}
	while (n_pre && (fcfs || budget > 0)) {
		int m = 0;

		for (int i = 0; i < n_pre; i++) {
			struct job *j = pre[i];
			int64_t *b = fcfs ? &left[i] : &budget;
			int want = j->done ? 0 : turn_prefill_next(j);

			if (want <= 0 || want > *b || turn_unit(j, &r->units[m]))
				continue;
			*b -= want;
			r->owner[m++] = j;
		}
		if (!m)
			break;
		serve_batch_run(sv->be, r->units, m, &sv->bs);
		for (int i = 0; i < m; i++)
			ran_unit(r, r->owner[i], &r->units[i]);
		ran += m;
	}
	return ran;
}

/* fcfs: the oldest request first (submitted earlier; then admitted earlier). */
static int older_first(const void *a, const void *b)
{
	const struct job *x = *(struct job *const *)a, *y = *(struct job *const *)b;

	if (x->t_submit != y->t_submit)
		return x->t_submit < y->t_submit ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/*
 * fcfs: the prompts in r->wait[0..n_wait) take the round's prefill budget
 * oldest first, each as many whole chunks as it has and the budget holds
 * (the oldest at least one); a prompt whose first chunk does not fit waits
 * for the next round, and so do the younger ones. Their first chunks join
 * the round's units from n; returns the new count.
 */
static int fcfs_prefill(struct round *r, int n, int n_wait, int64_t max, int64_t budget)
{
	qsort(r->wait, (size_t)n_wait, sizeof(*r->wait), older_first);
	for (int i = 0; i < n_wait && n < max; i++) {
		struct job *j = r->wait[i];
		const int64_t want = turn_prefill_next(j), has = turn_prefill_left(j);
		int64_t share = has <= budget ? has : budget / want * want;

		if (!i && share < want)
			share = want;	/* at least one chunk a round */
		if (share < want)
			break;
		if (turn_unit(j, &r->units[n]))
			continue;
		budget -= share;
		r->share[n] = share - want;
		r->owner[n++] = j;
	}
	return n;
}

static void round_once(struct serve *sv, struct round *r)
{
	const int64_t max = sv->cfg.max_batch;
	const int fcfs = sv->cfg.prefill_order == SERVE_PREFILL_FCFS;
	int64_t budget = sv->cfg.prefill_budget;
	int n = 0, prefilled = 0, k, units = 0, ran, n_wait = 0, b = 0, drawn;
	const double t0 = serve_now();
	double dt, t_draws;

	r->id++;
	drawn = turn_predraw(r->run, r->n_run);
	t_draws = serve_now() - t0;
	for (k = 0; k < r->n_run && n < max; k++) {
		struct job *j = r->run[(r->first + k) % r->n_run];
		int want = turn_prefill_next(j);

		if (j->done)
			continue;
		if (want > 0 && fcfs) {	/* after the others' units, oldest first */
			r->wait[n_wait++] = j;
			continue;
		}
		/* Whole chunks up to the budget; at least one a round. */
		if (want && prefilled && want > budget)
			continue;
		if (turn_unit(j, &r->units[n]) == 0) {
			r->share[n] = 0;
			r->owner[n++] = j;
			if (want) {
				budget -= want;
				prefilled = 1;
			}
		}
	}
	/* The next round begins where this one stopped. */
	r->first = r->n_run ? (r->first + (k < r->n_run ? k : 1)) % r->n_run : 0;
	if (n_wait)
		n = fcfs_prefill(r, n, n_wait, max, budget);
	if (n) {
		serve_batch_run(sv->be, r->units, n, &sv->bs);
		for (int i = 0; i < n; i++)
			ran_unit(r, r->owner[i], &r->units[i]);
		units = n + more_prefill(sv, r, n, budget, fcfs);
	}
	/* Turns whose units are done: record, commit, answer. */
	ran = r->n_run;
	for (int i = 0; i < r->n_run;) {
		struct job *j = r->run[i];

		if (!j->done && turn_parked(j)) {
			r->run[i] = r->run[--r->n_run];
			park(sv, &r->conv_inflight, ran > 1, j);
			continue;
		}
		if (!j->done && turn_prefill_next(j) < 0)
			turn_close(j);
		if (!j->done) {
			i++;
			continue;
		}
		turn_end(j);
		r->run[i] = r->run[--r->n_run];
		finish(sv, j, &r->conv_inflight);
	}
	dt = serve_now() - t0;
	while (b < SERVE_ROUND_BUCKETS && dt > serve_round_le[b])
		b++;
	pthread_mutex_lock(&sv->mu);
	if (n > 0) {	/* a round that ran units, its commits and answers too */
		sv->c.round_hist[b]++;
		sv->c.round_s += dt;
		if (dt > sv->c.round_max_s)
			sv->c.round_max_s = dt;
	}
	sv->c.rounds += n > 0;
	sv->c.units += (uint64_t)units;
	sv->c.predraws += (uint64_t)drawn;
	if (drawn)
		sv->c.predraw_s += t_draws;
	sv->c.batch_last = n;
	if ((uint64_t)n > sv->c.batch_max)
		sv->c.batch_max = (uint64_t)n;
	sv->c.device_bytes = kvmem_backend_mem_used(sv->be);
	sv->c.batch = sv->bs;
	pthread_mutex_unlock(&sv->mu);
}

static void *engine_main(void *arg)
{
	struct serve *sv = arg;
	struct round r = { .cap_run = (int)sv->cfg.max_inflight };
	double idle_check = serve_now() + 1;

	r.run = calloc((size_t)r.cap_run, sizeof(*r.run));
	r.units = calloc((size_t)sv->cfg.max_batch, sizeof(*r.units));
	r.owner = calloc(2 * (size_t)sv->cfg.max_batch, sizeof(*r.owner));	/* more_prefill */
	r.share = calloc(2 * (size_t)sv->cfg.max_batch, sizeof(*r.share));
	r.wait = calloc((size_t)r.cap_run, sizeof(*r.wait));
	pthread_mutex_lock(&sv->mu);
	for (;;) {
		struct job *in = admit(sv, &r.conv_inflight);

		if (!in && !r.n_run) {
			struct timespec ts;

			if (!sv->running && !sv->waiting)
				break;
			/* Idle: wake now and then to close idle conversations. */
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&sv->work, &sv->mu, &ts);
		}
		pthread_mutex_unlock(&sv->mu);
		if (!r.run || !r.units || !r.owner || !r.share || !r.wait) {
			/* Out of memory at start: every job fails. */
			for (struct job *j = in, *next; j; j = next) {
				next = j->next;
				job_fail(j, 503, "server_error", "out of memory");
				finish(sv, j, &r.conv_inflight);
			}
			in = NULL;
		}
		take_in(sv, &r, in);
		if (r.n_run)
			round_once(sv, &r);
		if (serve_now() >= idle_check) {
			pool_idle(sv);
			idle_check = serve_now() + 1;
		}
		pthread_mutex_lock(&sv->mu);
	}
	pthread_mutex_unlock(&sv->mu);
	free(r.run);
	free(r.units);
	free(r.owner);
	free(r.share);
	free(r.wait);
	return NULL;
}

/* ---- start and stop ------------------------------------------------------------------ */
int serve_engine_start(struct serve *sv)
{
	sv->running = 1;
	if (pthread_create(&sv->thread, NULL, engine_main, sv)) {
		sv->running = 0;
		return kvmem_error(EAGAIN, "cannot start the engine thread");
	}
	sv->started = 1;
	return 0;
}

void serve_engine_stop(struct serve *sv)
{
	if (sv->started) {
		pthread_mutex_lock(&sv->mu);
		sv->running = 0;
		pthread_cond_broadcast(&sv->work);
		pthread_mutex_unlock(&sv->mu);
		pthread_join(sv->thread, NULL);
		sv->started = 0;
	}
	pool_close_all(sv);
	if (sv->piece_text && sv->m)
		for (int i = 0; i < sv->m->cfg.vocab; i++)
			free(sv->piece_text[i]);
	free(sv->piece_text);
	free(sv->piece_len);
	sv->piece_text = NULL;
}
#endif
