// SPDX-License-Identifier: MIT
/*
 * /metrics: Prometheus text of kvmem serve's counters. Requests and turns,
 * tokens and the time spent on them, the admission queue, the engine's
 * rounds (units per round: the batch size), bytes per tier (the backend's
 * device memory, the open conversations' host pools, the conversations'
 * files on disk), and every pager counter summed over the conversations
 * (what `kvmem stat` prints for one).
 */
#ifndef KVMEM_NO_SERVE
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvmem/kvmem.h"
#include "pager/hostpool.h"
#include "serve_int.h"

struct out {
	char *s;
	size_t n, cap;
};

static void outf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int k;

	for (;;) {
		va_start(ap, fmt);
		k = vsnprintf(o->s ? o->s + o->n : NULL, o->s ? o->cap - o->n : 0, fmt, ap);
		va_end(ap);
		if (k < 0)
			return;
		if (o->s && o->n + (size_t)k < o->cap) {
			o->n += (size_t)k;
			return;
		}
		size_t cap = (o->cap + (size_t)k + 1) * 2;
		char *p = realloc(o->s, cap);

		if (!p)
			return;
		o->s = p;
		o->cap = cap;
	}
}

static void metric(struct out *o, const char *name, const char *type, const char *help, double v)
{
	outf(o, "# HELP %s %s\n# TYPE %s %s\n%s %.9g\n", name, help, name, type, name, v);
}

/* The turns' session time by part (kvmem_session_stats, summed as turns
 * end): inside the units' seconds, what the backend's forward took, what
 * putting rows away on the engine thread took, room and pages before a
 * forward, the writer threads' start and the waits for them, and a
 * selection's scoring, planning and placing. */
static void session_seconds(struct out *o, const kvmem_session_stats *s)
{
	const struct {
		const char *part;
		int64_t ns;
	} p[] = {
		{ "forward", s->forward_ns },	    { "store", s->store_ns },
		{ "own", s->own_ns },		    { "begin", s->begin_ns },
		{ "reserve", s->reserve_ns },	    { "writer_start", s->writer_start_ns },
		{ "writer_wait", s->writer_wait_ns }, { "score", s->score_ns },
		{ "plan", s->plan_ns },		    { "place", s->place_ns },
	};

	outf(o, "# HELP kvmem_session_seconds_total the turns' session time by part, summed as "
		"each turn ends\n# TYPE kvmem_session_seconds_total counter\n");
	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
		outf(o, "kvmem_session_seconds_total{part=\"%s\"} %.9g\n", p[i].part, p[i].ns / 1e9);
	metric(o, "kvmem_session_forwards_total", "counter", "the turns' forward passes, counted "
	       "as each turn ends", (double)s->forwards);
	metric(o, "kvmem_session_lazy_logits_total", "counter", "batched greedy steps whose logits "
	       "stayed on the backend, counted as each turn ends", (double)s->lazy_logits);
	metric(o, "kvmem_session_lazy_draws_total", "counter", "tokens drawn at a temperature "
	       "beside the logits by a batched step (on the GPU), counted as each turn ends",
	       (double)s->lazy_draws);
}

const double serve_round_le[SERVE_ROUND_BUCKETS] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
						     0.1, 0.25, 0.5, 1, 2.5 };

/* The rounds' wall times as a Prometheus histogram (cumulative buckets). */
static void round_histogram(struct out *o, const struct serve_counters *c)
{
	uint64_t at = 0;

	outf(o, "# HELP kvmem_round_seconds an engine round's wall time (its units, prefill passes, "
		"commits and answers): what every running stream waited for its next token\n"
		"# TYPE kvmem_round_seconds histogram\n");
	for (int b = 0; b < SERVE_ROUND_BUCKETS; b++) {
		at += c->round_hist[b];
		outf(o, "kvmem_round_seconds_bucket{le=\"%g\"} %llu\n", serve_round_le[b],
		     (unsigned long long)at);
	}
	at += c->round_hist[SERVE_ROUND_BUCKETS];
	outf(o, "kvmem_round_seconds_bucket{le=\"+Inf\"} %llu\nkvmem_round_seconds_sum %.9g\n"
		"kvmem_round_seconds_count %llu\n", (unsigned long long)at, c->round_s,
	     (unsigned long long)at);
	metric(o, "kvmem_round_seconds_max", "gauge", "the longest round since the server started",
	       c->round_max_s);
	metric(o, "kvmem_round_predraws_total", "counter", "tokens drawn at the start of a round, "
	       "side by side, for the streams whose draw reads their logits on the host "
	       "(a temperature, logprobs)", (double)c->predraws);
	metric(o, "kvmem_round_predraw_seconds_total", "counter", "the rounds' wall time spent "
	       "making those draws", c->predraw_s);
}

/* Bytes a directory's files take on disk (allocated blocks). */
static uint64_t du(const char *dir, int depth)
{
	DIR *d = depth < 8 ? opendir(dir) : NULL;
	struct dirent *e;
	uint64_t sum = 0;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char path[4400];
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (lstat(path, &st))
			continue;
		sum += (uint64_t)st.st_blocks * 512;
		if (S_ISDIR(st.st_mode))
			sum += du(path, depth + 1);
	}
	closedir(d);
	return sum;
}

uint64_t serve_disk_bytes(struct serve *sv, double max_age)
{
	double now = serve_now();
	char dir[4200];
	uint64_t disk;

	pthread_mutex_lock(&sv->mu);
	disk = now - sv->disk_t < max_age && sv->disk_t ? sv->disk_bytes : UINT64_MAX;
	pthread_mutex_unlock(&sv->mu);
	if (disk != UINT64_MAX)
		return disk;
	snprintf(dir, sizeof(dir), "%s/conversations", sv->data_dir);
	disk = du(dir, 0);
	pthread_mutex_lock(&sv->mu);
	sv->disk_bytes = disk;
	sv->disk_t = now;
	sv->disk_pending = 0;
	pthread_mutex_unlock(&sv->mu);
	return disk;
}

static void pager_add(kvmem_pager_stats *a, const kvmem_pager_stats *b)
{
#define ADD(name, what) a->name += b->name;
	KVMEM_PAGER_STATS(ADD)
#undef ADD
}

char *serve_metrics(struct serve *sv)
{
	struct out o = { 0 };
	kvmem_pager_stats st;
	uint64_t hits, misses, host = 0, host_used = 0, disk;
	const struct serve_counters *c = &sv->c;
	const struct serve_batch_stats *b = &c->batch;

	disk = serve_disk_bytes(sv, 10);
	pthread_mutex_lock(&sv->mu);
	st = sv->closed;
	/* The pagers of open conversations: they leave the list under the
	 * lock before they are closed. */
	if (sv->pool) {
		void *base;
		size_t len = 0;

		kvmem_hostpool_region(sv->pool, &base, &len);
		host = len;
		/* Slots in use (pages, reads in flight, blocks made ahead): a
		 * read of two counters the pool's lock guards, so one scrape may
		 * be a slot off. */
		host_used = (uint64_t)(kvmem_hostpool_slots(sv->pool) -
				       kvmem_hostpool_free_slots(sv->pool)) *
			    kvmem_hostpool_slot_bytes(sv->pool);
	}
	for (struct conv *x = sv->convs; x; x = x->next) {
		kvmem_pager_stats y;
		void *base, *shared = NULL;
		size_t len = 0, slen = 0;

		if (!x->ws)
			continue;
		kvmem_pager_stats_get(kvmem_workspace_pager(x->ws), &y);
		pager_add(&st, &y);
		/* A conversation with a pool of its own (another page size). */
		kvmem_pager_region(kvmem_workspace_pager(x->ws), &base, &len);
		if (sv->pool)
			kvmem_hostpool_region(sv->pool, &shared, &slen);
		if (base != shared)
			host += len;
	}
	metric(&o, "kvmem_requests_total", "counter", "requests taken by the engine", (double)c->requests);
	metric(&o, "kvmem_requests_failed_total", "counter", "requests answered with an error",
	       (double)c->failed);
	metric(&o, "kvmem_requests_rejected_total", "counter",
	       "requests refused at admission (429 with Retry-After)", (double)c->rejected);
	metric(&o, "kvmem_requests_cancelled_total", "counter",
	       "requests of no conversation dropped because their client went away",
	       (double)c->cancelled);
	metric(&o, "kvmem_replays_total", "counter", "turns answered from a conversation's record",
	       (double)c->replays);
	metric(&o, "kvmem_turns_total", "counter", "turns run to the end", (double)c->turns);
	metric(&o, "kvmem_prompt_tokens_total", "counter", "tokens appended (prefilled)",
	       (double)c->prompt_tokens);
	metric(&o, "kvmem_completion_tokens_total", "counter", "tokens decoded",
	       (double)c->completion_tokens);
	metric(&o, "kvmem_prefill_seconds_total", "counter", "time in prefill units", c->prefill_s);
	metric(&o, "kvmem_decode_seconds_total", "counter", "time in decode units", c->decode_s);
	metric(&o, "kvmem_selections_total", "counter", "step-boundary selections", (double)c->selections);
	metric(&o, "kvmem_selection_seconds_total", "counter", "time in step-boundary selections",
	       c->select_s);
	metric(&o, "kvmem_commit_seconds_total", "counter", "time writing records and committing",
	       c->commit_s);
	session_seconds(&o, &c->sess);
	metric(&o, "kvmem_time_to_first_token_seconds_sum", "counter",
	       "submit to first content, summed over turns", c->ttft_s);
	metric(&o, "kvmem_time_to_first_token_seconds_count", "counter", "turns in that sum", c->ttft_n);
	metric(&o, "kvmem_queue_depth", "gauge", "requests waiting or running",
	       (double)(sv->waiting + sv->inflight));
	metric(&o, "kvmem_queue_waiting", "gauge", "requests waiting for admission", (double)sv->waiting);
	metric(&o, "kvmem_requests_running", "gauge", "requests admitted and running",
	       (double)sv->inflight);
	metric(&o, "kvmem_turns_parked_total", "counter", "turns undone short of memory before "
	       "their first token, to wait for a running one to end", (double)c->parked);
	metric(&o, "kvmem_memory_short", "gauge", "1 while turns are admitted only as others end "
	       "(a turn was parked short of memory)", (double)sv->mem_short);
	metric(&o, "kvmem_batch_rounds_total", "counter", "engine rounds that ran units",
	       (double)c->rounds);
	metric(&o, "kvmem_batch_units_total", "counter", "units run in those rounds", (double)c->units);
	metric(&o, "kvmem_batch_size", "gauge", "units in the last round", (double)c->batch_last);
	metric(&o, "kvmem_batch_size_max", "gauge", "units in the largest round", (double)c->batch_max);
	round_histogram(&o, c);
	metric(&o, "kvmem_batch_decode_units_total", "counter", "decode units run",
	       (double)b->units[SERVE_UNIT_DECODE]);
	metric(&o, "kvmem_batch_prefill_units_total", "counter", "prefill units run",
	       (double)b->units[SERVE_UNIT_PREFILL]);
	metric(&o, "kvmem_batch_select_units_total", "counter", "selection units run",
	       (double)b->units[SERVE_UNIT_SELECT]);
	metric(&o, "kvmem_tier_device_bytes", "gauge",
	       "bytes the backend holds on its device (views, pools; 0 for cpu)",
	       (double)c->device_bytes);
	metric(&o, "kvmem_tier_host_bytes", "gauge", "host pool bytes (the pool the conversations "
	       "share, and any of their own)",
	       (double)host);
	metric(&o, "kvmem_tier_host_used_bytes", "gauge", "bytes of the shared host pool in use "
	       "(its slots that hold pages or are being filled)", (double)host_used);
	metric(&o, "kvmem_host_pool_pinned_bytes", "gauge",
	       "shared host pool bytes pinned for the backend at start (0: cpu)",
	       (double)sv->pinned_bytes);
	metric(&o, "kvmem_host_pool_pin_seconds", "gauge", "seconds pinning it took at start",
	       sv->pin_s);
	metric(&o, "kvmem_tier_disk_bytes", "gauge", "bytes the conversations take on disk (at most "
	       "10 s old)", (double)disk);
	metric(&o, "kvmem_conversations_open", "gauge", "conversations held open", (double)sv->n_open);
	metric(&o, "kvmem_conversation_restores_total", "counter",
	       "conversations reopened from their workspace", (double)c->restores);
	metric(&o, "kvmem_conversation_fresh_views_total", "counter",
	       "reopens whose session state could not be restored", (double)c->fresh_views);
	metric(&o, "kvmem_conversation_evictions_total", "counter",
	       "idle conversations closed to make room (--max-open)", (double)c->evictions);
	metric(&o, "kvmem_conversation_idle_closes_total", "counter",
	       "conversations closed after --idle-close seconds idle", (double)c->idle_closes);
	metric(&o, "kvmem_conversation_deletes_total", "counter", "conversations deleted",
	       (double)c->deletes);
	metric(&o, "kvmem_views_released_total", "counter",
	       "views given up by idle open conversations (--idle-release, --max-views)",
	       (double)c->view_releases);
	metric(&o, "kvmem_views_restored_total", "counter",
	       "views laid out again from their pages for a turn (no prefill)",
	       (double)c->view_restores);
	metric(&o, "kvmem_view_restore_tokens_total", "counter", "tokens of the views laid out again",
	       (double)c->view_restore_tokens);
	metric(&o, "kvmem_view_restore_seconds_total", "counter", "time laying views out again",
	       c->view_restore_s);
	metric(&o, "kvmem_view_restore_steps_total", "counter", "rounds that laid out a slice of a "
	       "view (an eighth of its layers, at least one), the others' units between them",
	       (double)c->view_restore_steps);
	metric(&o, "kvmem_conversations_without_view", "gauge",
	       "open conversations whose view is given up now", (double)c->views_away);
#define PAGER_METRIC(name, what) {                                                   \
		char n[96];                                                          \
		snprintf(n, sizeof(n), "kvmem_pager_%s_total", #name);               \
		metric(&o, n, "counter", what, (double)st.name);                     \
	}
	KVMEM_PAGER_STATS(PAGER_METRIC)
#undef PAGER_METRIC
	hits = st.host_hits + st.staging_hits;
	misses = st.host_misses > st.staging_hits ? st.host_misses - st.staging_hits : 0;
	metric(&o, "kvmem_pager_host_hit_ratio", "gauge",
	       "fetched pages found in host memory (pool or staging), of all fetched",
	       hits + misses ? (double)hits / (double)(hits + misses) : 0);
	pthread_mutex_unlock(&sv->mu);
	return o.s;
}
#endif
