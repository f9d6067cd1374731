// SPDX-License-Identifier: MIT
/*
 * kvmempolicy: load a BPF victim policy (bpf/policies/NAME.bpf.o).
 *
 * Offline (works today): --replay FILE replays a recorded access sequence
 * (kvmemsnoop -a -j output, or --synthetic-trace's) through a host pool of
 * --cap pages twice, once in LRU order (the default) and once asking the
 * policy about each candidate victim, and prints both hit rates. The policy
 * runs as it would live: its `choose` program reads the page history that
 * kvmempolicy's `feed` program keeps, both run with BPF_PROG_TEST_RUN in
 * trace order.
 *
 * Live, with the kvmem module loaded: the policy's tp_reclaim program is
 * attached to the module's writable tracepoint kvmem_reclaim (and its
 * tp_prefetch, if it has one, to kvmem_prefetch_hook), and the feeders
 * follow the module's steps (kvmem_step), faults and hits, keyed by the
 * module's workspace id (and the pager's USDT probes when a kvmem binary is
 * found); answer counts are printed every interval. Without the module
 * there is nothing to attach to and the tool says so. The VM of make
 * vmtest runs it against the module's clock (tests/vm/policy.sh).
 */
#include <argp.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/kvmem.h>

#include "kvmem_helpers.h"
#include "kvmem_tp.h"
#include "kvmempolicy.h"
#include "kvmempolicy.skel.h"

_Static_assert(sizeof(struct kt_reclaim_ctx) == sizeof(struct kvmem_reclaim_ctx) &&
	       KT_RECLAIM_MAX == KVMEM_RECLAIM_MAX && KT_VERDICT_DEFAULT == KVMEM_VERDICT_DEFAULT &&
	       __builtin_offsetof(struct kt_reclaim_ctx, dirty) ==
	       __builtin_offsetof(struct kvmem_reclaim_ctx, dirty) &&
	       __builtin_offsetof(struct kt_reclaim_ctx, hint) ==
	       __builtin_offsetof(struct kvmem_reclaim_ctx, hint) &&
	       KT_HINTED_SELECTED == KVMEM_HINTED_SELECTED &&
	       KT_HINTED_RUNNER_UP == KVMEM_HINTED_RUNNER_UP,
	       "kvmem_tp.h's reclaim buffer differs from the uapi's");
_Static_assert(sizeof(struct kt_prefetch_ctx) == sizeof(struct kvmem_prefetch_ctx) &&
	       KT_PREFETCH_ADD_MAX == KVMEM_PREFETCH_ADD_MAX &&
	       KT_PREFETCH_SEEN == KVMEM_PREFETCH_SEEN &&
	       __builtin_offsetof(struct kt_prefetch_ctx, add) ==
	       __builtin_offsetof(struct kvmem_prefetch_ctx, add),
	       "kvmem_tp.h's prefetch buffer differs from the uapi's");

#define MAX_PARAMS 8
#define REPLAY_WS 1	/* the workspace id a replay uses */

enum { OPT_REPLAY = 1000, OPT_SYNTHETIC, OPT_SYNTH_TRACE, OPT_CAP, OPT_SCAN, OPT_SEED, OPT_CHECK };

static struct {
	struct kt_env kt;
	const char *policy;
	__u64 params[MAX_PARAMS];
	int n_params;
	const char *replay;	/* FILE, "-" for stdin */
	bool synthetic;		/* replay the built-in sequence */
	bool synth_trace;	/* print the built-in sequence */
	bool check;		/* load both entry points, attach nothing */
	long cap, scan, seed;
	long interval, count;
} env = {
	.kt = { .tool = "kvmempolicy" },
	.scan = 16,
	.seed = 1,
	.interval = 1,
	.count = -1,
};

const char *argp_program_version = "kvmempolicy 0.1";
static const char doc[] =
"Load a BPF victim policy for the kvmem host tier.\n"
"\n"
"USAGE: kvmempolicy -P POLICY [-o VALUE]... (--replay FILE | --synthetic) [--cap N]\n"
"       kvmempolicy -P POLICY [-o VALUE]... [interval] [count]   (needs the module)\n"
"\n"
"POLICY: a name from the policies/ folder next to this tool (protect_recent,\n"
"score_aware) or the path of a .bpf.o. Offline, a replay compares the\n"
"policy's host hit rate with LRU order on the same access sequence. Live,\n"
"the policy answers the module's reclaim tracepoint (kvmem_reclaim).\n"
"\n"
"EXAMPLES:\n"
"    kvmempolicy -P protect_recent --synthetic           # the built-in sequence\n"
"    kvmemsnoop -a -j > t.jsonl   # record a session, then:\n"
"    kvmempolicy -P score_aware --replay t.jsonl --cap 256\n"
"    kvmempolicy -P protect_recent -o 6 -o 2 --synthetic # N=6 steps, K=2 uses\n"
"    kvmempolicy --synthetic-trace > s.jsonl             # write the sequence\n"
"    kvmempolicy -P protect_recent 5                     # live, with the module\n"
"    kvmempolicy -P my_policy.bpf.o --check              # does it load?\n";

static const struct argp_option opts[] = {
	{ "policy", 'P', "POLICY", 0, "The policy: a name or a .bpf.o path", 0 },
	{ "param", 'o', "VALUE", 0, "The policy's next parameter (see its source)", 0 },
	{ "replay", OPT_REPLAY, "FILE", 0, "Replay a recorded sequence (kvmemsnoop -a -j; - = stdin)",
	  0 },
	{ "synthetic", OPT_SYNTHETIC, NULL, 0, "Replay the built-in sequence (a hot set every third "
	  "step, scans between)", 0 },
	{ "synthetic-trace", OPT_SYNTH_TRACE, NULL, 0, "Print the built-in sequence and exit", 0 },
	{ "cap", OPT_CAP, "PAGES", 0, "Host pool of the replay in pages (default: 200 for the "
	  "built-in sequence, else a quarter of the pages seen)", 0 },
	{ "scan", OPT_SCAN, "N", 0, "Candidates asked per eviction, oldest first (default 16)", 0 },
	{ "seed", OPT_SEED, "N", 0, "Seed of the built-in sequence (default 1)", 0 },
	{ "check", OPT_CHECK, NULL, 0, "Load the policy with its module entry point (the verifier "
	  "checks both) and exit; no module needed", 0 },
	{},
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	long v;

	switch (key) {
	case 'P':
		env.policy = arg;
		break;
	case 'o':
		if (env.n_params == MAX_PARAMS || kt_parse_long(arg, 0, LONG_MAX, &v) < 0)
			argp_error(state, "invalid or too many parameters: %s", arg);
		env.params[env.n_params++] = (__u64)v;
		break;
	case OPT_REPLAY:
		env.replay = arg;
		break;
	case OPT_SYNTHETIC:
		env.synthetic = true;
		break;
	case OPT_SYNTH_TRACE:
		env.synth_trace = true;
		break;
	case OPT_CHECK:
		env.check = true;
		break;
	case OPT_CAP:
		if (kt_parse_long(arg, 1, INT_MAX / 2, &env.cap) < 0)
			argp_error(state, "invalid --cap: %s", arg);
		break;
	case OPT_SCAN:
		if (kt_parse_long(arg, 1, 1 << 20, &env.scan) < 0)
			argp_error(state, "invalid --scan: %s", arg);
		break;
	case OPT_SEED:
		if (kt_parse_long(arg, 0, LONG_MAX, &env.seed) < 0)
			argp_error(state, "invalid --seed: %s", arg);
		break;
	case ARGP_KEY_ARG:
		kt_interval_count_arg(state, arg, &env.interval, &env.count);
		break;
	case ARGP_KEY_END:
		if (env.replay && env.synthetic)
			argp_error(state, "--replay and --synthetic exclude each other");
		if (!env.policy && !env.synth_trace)
			argp_error(state, "no policy: give -P NAME");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

/* ---- the access sequence ---------------------------------------------------- */
struct ev {
	__u8 kind;	/* FEED_STEP, FEED_ACCESS, FEED_HINT */
	__u64 id;	/* page (access), block (hint) */
	__u64 value;	/* hint: score x 1e6; access: dense page index (set after loading) */
};

struct trace {
	struct ev *ev;
	size_t n, cap;
	__u64 layers;
	size_t steps, accesses, pages;
	__u64 *page_ids;	/* distinct pages, sorted: dense index -> page */
};

static int trace_add(struct trace *t, __u8 kind, __u64 id, __u64 value)
{
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 4096;
		struct ev *e = realloc(t->ev, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		t->ev = e;
		t->cap = cap;
	}
	t->ev[t->n++] = (struct ev){ .kind = kind, .id = id, .value = value };
	if (kind == FEED_STEP)
		t->steps++;
	else if (kind == FEED_ACCESS)
		t->accesses++;
	return 0;
}

/* The number after "key": in a JSON line (our own flat format). */
static bool json_u64(const char *line, const char *key, __u64 *out)
{
	char pat[48];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(line, pat);
	if (!p)
		return false;
	p += strlen(pat);
	if (*p < '0' || *p > '9')
		return false;
	*out = strtoull(p, NULL, 10);
	return true;
}

static int trace_read(struct trace *t, const char *path)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
	char line[4096];
	size_t lineno = 0;
	int rc = 0;

	if (!f) {
		fprintf(stderr, "%s: %s: %s\n", env.kt.tool, path, strerror(errno));
		return -errno;
	}
	while (!rc && fgets(line, sizeof(line), f)) {
		const char *ev = strstr(line, "\"event\":\"");
		__u64 a, b;

		lineno++;
		if (!ev)
			continue;	/* not a record (a message line) */
		ev += 9;
		if (!t->layers && json_u64(line, "layers", &a))
			t->layers = a;
		if (!strncmp(ev, "step\"", 5)) {
			rc = trace_add(t, FEED_STEP, 0, 0);
		} else if (!strncmp(ev, "miss\"", 5) || !strncmp(ev, "access\"", 7) ||
			   (!strncmp(ev, "hit\"", 4) && !strstr(line, "\"move\":\"stage>host\""))) {
			/* a hit from the stage-out buffer follows its miss: one access */
			if (!json_u64(line, "page", &a))
				goto bad;
			rc = trace_add(t, FEED_ACCESS, a, 0);
		} else if (!strncmp(ev, "hint\"", 5)) {
			if (!json_u64(line, "block", &a) || !json_u64(line, "score_ppm", &b))
				goto bad;
			rc = trace_add(t, FEED_HINT, a, b);
		}
		continue;
bad:
		fprintf(stderr, "%s: %s:%zu: a record without its page, block or score\n",
			env.kt.tool, path, lineno);
		rc = -EINVAL;
	}
	if (f != stdin)
		fclose(f);
	if (!rc && !t->accesses) {
		fprintf(stderr, "%s: %s: no page accesses in it (record with kvmemsnoop -a -j)\n",
			env.kt.tool, path);
		rc = -EINVAL;
	}
	return rc;
}

/* A small deterministic generator (xorshift64*), so a seed replays. */
static __u64 rng_next(__u64 *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

/*
 * The built-in sequence: 400 blocks of 4 layers; a hot set of 24 blocks
 * (chosen by the seed) is selected every third step, and the steps between
 * select 24 blocks each from a scan through the rest; the selector hints
 * every chosen block with score 1.0. LRU with a pool smaller than the hot
 * set plus two scans loses the hot set every time.
 */
#define SYN_BLOCKS 400
#define SYN_LAYERS 4
#define SYN_HOT 24
#define SYN_STEPS 300

static int synth(struct trace *t)
{
	__u64 s = (__u64)env.seed * 2654435761ull + 1, hot[SYN_HOT], cursor = 0;
	bool is_hot[SYN_BLOCKS] = { false };
	int rc = 0;

	t->layers = SYN_LAYERS;
	for (int i = 0; i < SYN_HOT;) {
		__u64 b = rng_next(&s) % SYN_BLOCKS;

		if (is_hot[b])
			continue;
		is_hot[b] = true;
		hot[i++] = b;
	}
	for (int step = 0; !rc && step < SYN_STEPS; step++) {
		__u64 chosen[SYN_HOT];

		for (int i = 0; i < SYN_HOT; i++) {
			if (step % 3 == 0) {
				chosen[i] = hot[i];
				continue;
			}
			do
				cursor = (cursor + 1) % SYN_BLOCKS;
			while (is_hot[cursor]);
			chosen[i] = cursor;
		}
		rc = trace_add(t, FEED_STEP, 0, 0);
		for (int i = 0; !rc && i < SYN_HOT; i++)
			rc = trace_add(t, FEED_HINT, chosen[i], 1000000);
		for (int i = 0; !rc && i < SYN_HOT; i++)
			for (int l = 0; !rc && l < SYN_LAYERS; l++)
				rc = trace_add(t, FEED_ACCESS, chosen[i] * SYN_LAYERS + l, 0);
	}
	return rc;
}

static void synth_print(const struct trace *t)
{
	__u64 step = 0;

	for (size_t i = 0; i < t->n; i++) {
		const struct ev *e = &t->ev[i];

		if (e->kind == FEED_STEP)
			printf("{\"event\":\"step\",\"step\":%llu}\n", (unsigned long long)step++);
		else if (e->kind == FEED_HINT)
			printf("{\"event\":\"hint\",\"block\":%llu,\"score_ppm\":%llu}\n",
			       (unsigned long long)e->id, (unsigned long long)e->value);
		else
			printf("{\"event\":\"access\",\"page\":%llu,\"block\":%llu,\"layer\":%llu,"
			       "\"layers\":%llu}\n", (unsigned long long)e->id,
			       (unsigned long long)(e->id / t->layers),
			       (unsigned long long)(e->id % t->layers), (unsigned long long)t->layers);
	}
}

static int cmp_u64(const void *a, const void *b)
{
	__u64 x = *(const __u64 *)a, y = *(const __u64 *)b;

	return (x > y) - (x < y);
}

/* Number the distinct pages 0..pages-1 (ev.value of each access). */
static int trace_index(struct trace *t)
{
	size_t m = 0;

	t->page_ids = malloc((t->accesses ? t->accesses : 1) * sizeof(__u64));
	if (!t->page_ids)
		return -ENOMEM;
	for (size_t i = 0; i < t->n; i++)
		if (t->ev[i].kind == FEED_ACCESS)
			t->page_ids[m++] = t->ev[i].id;
	qsort(t->page_ids, m, sizeof(__u64), cmp_u64);
	t->pages = 0;
	for (size_t i = 0; i < m; i++)
		if (!t->pages || t->page_ids[t->pages - 1] != t->page_ids[i])
			t->page_ids[t->pages++] = t->page_ids[i];
	for (size_t i = 0; i < t->n; i++) {
		__u64 *hit;

		if (t->ev[i].kind != FEED_ACCESS)
			continue;
		hit = bsearch(&t->ev[i].id, t->page_ids, t->pages, sizeof(__u64), cmp_u64);
		t->ev[i].value = (__u64)(hit - t->page_ids);
	}
	return 0;
}

/* ---- the BPF side of a replay ------------------------------------------------ */
struct policy {
	struct kvmempolicy_bpf *skel;
	struct bpf_object *obj;
	int feed_fd, choose_fd;
	char path[PATH_MAX];
};

static int run_prog(int fd, __u64 *args, int n, __u32 *ret)
{
	LIBBPF_OPTS(bpf_test_run_opts, o, .ctx_in = args, .ctx_size_in = n * sizeof(__u64));

	if (bpf_prog_test_run_opts(fd, &o) < 0)
		return -errno;
	if (ret)
		*ret = o.retval;
	return 0;
}

static int feed(struct policy *p, __u64 kind, __u64 id, __u64 step, __u64 value)
{
	__u64 args[5] = { kind, REPLAY_WS, id, step, value };
	int rc = run_prog(p->feed_fd, args, 5, NULL);

	if (rc < 0)
		fprintf(stderr, "%s: running the feed program: %s\n", env.kt.tool, strerror(-rc));
	return rc;
}

static const char *policy_path(char *buf, size_t len)
{
	char self[PATH_MAX], *slash;
	ssize_t n;

	if (strchr(env.policy, '/') || strstr(env.policy, ".bpf.o")) {
		snprintf(buf, len, "%s", env.policy);
		return buf;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return NULL;
	self[n] = 0;
	slash = strrchr(self, '/');
	if (slash)
		*slash = 0;
	if ((size_t)snprintf(buf, len, "%.*s/policies/%s.bpf.o", (int)(len - 64), self,
			     env.policy) >= len)
		return NULL;
	return buf;
}

/* Open kvmempolicy's object and the policy's, sharing the history maps;
 * `live`: also the feeders and the policy's tp_reclaim (module). */
static int policy_load(struct policy *p, bool live)
{
	static const char *const shared[] = { "pol_pages", "pol_blocks", "pol_wss", "pol_params",
					       "pol_verdicts", NULL };
	struct bpf_program *prog;
	int err;

	if (!policy_path(p->path, sizeof(p->path)) || access(p->path, R_OK) < 0) {
		fprintf(stderr, "%s: policy %s: no such policy (%s)\n", env.kt.tool, env.policy,
			p->path);
		return -ENOENT;
	}
	p->skel = kvmempolicy_bpf__open();
	if (!p->skel) {
		fprintf(stderr, "%s: cannot open the BPF object: %s\n", env.kt.tool, strerror(errno));
		return -errno;
	}
	if (live) {
		err = kt_open_sources(&env.kt, p->skel->obj);
		if (err)
			return err;
		p->skel->rodata->targ_tgid = env.kt.pid;
	} else {
		bpf_object__for_each_program(prog, p->skel->obj)
			if (strcmp(bpf_program__name(prog), "feed"))
				bpf_program__set_autoload(prog, false);
	}
	err = kvmempolicy_bpf__load(p->skel);
	if (err)
		return -kt_load_failed(&env.kt, err);
	p->obj = bpf_object__open_file(p->path, NULL);
	if (!p->obj) {
		fprintf(stderr, "%s: %s: not a BPF object: %s\n", env.kt.tool, p->path,
			strerror(errno));
		return -errno;
	}
	for (int i = 0; shared[i]; i++) {
		struct bpf_map *m = bpf_object__find_map_by_name(p->obj, shared[i]);
		struct bpf_map *mine = bpf_object__find_map_by_name(p->skel->obj, shared[i]);

		if (!m || !mine) {
			fprintf(stderr, "%s: %s: no map %s: not a kvmem policy (build it with "
				"policies/policy.bpf.h)\n", env.kt.tool, p->path, shared[i]);
			return -EINVAL;
		}
		err = bpf_map__reuse_fd(m, bpf_map__fd(mine));
		if (err) {
			fprintf(stderr, "%s: %s: map %s does not match kvmempolicy's: %s\n",
				env.kt.tool, p->path, shared[i], strerror(-err));
			return err;
		}
	}
	prog = bpf_object__find_program_by_name(p->obj, "tp_reclaim");
	if (prog)
		bpf_program__set_autoload(prog, live || env.check);
	prog = bpf_object__find_program_by_name(p->obj, "tp_prefetch");
	if (prog)
		bpf_program__set_autoload(prog, live || env.check);
	err = bpf_object__load(p->obj);
	if (err)
		return -kt_load_failed(&env.kt, err);
	prog = bpf_object__find_program_by_name(p->obj, "choose");
	if (!prog) {
		fprintf(stderr, "%s: %s: no program `choose`: not a kvmem policy\n", env.kt.tool,
			p->path);
		return -EINVAL;
	}
	p->choose_fd = bpf_program__fd(prog);
	p->feed_fd = bpf_program__fd(p->skel->progs.feed);
	for (__u32 i = 0; i < (__u32)env.n_params; i++)
		bpf_map_update_elem(bpf_map__fd(p->skel->maps.pol_params), &i, &env.params[i], BPF_ANY);
	return 0;
}

static void policy_free(struct policy *p)
{
	bpf_object__close(p->obj);
	kvmempolicy_bpf__destroy(p->skel);
}

/* ---- the replay -------------------------------------------------------------- */
/* A host pool of `cap` pages in LRU order; slots hold dense page indices. */
struct pool {
	__u32 cap, used;
	__s32 head, tail;	/* most and least recently used slot, -1: none */
	__s32 *prev, *next;
	__u64 *page;		/* dense index per slot */
	__u64 *last;		/* step of the last access per slot */
	__s32 *slot_of;		/* per dense page: slot or -1 */
};

static void lru_unlink(struct pool *p, __s32 s)
{
	if (p->prev[s] >= 0)
		p->next[p->prev[s]] = p->next[s];
	else
		p->head = p->next[s];
	if (p->next[s] >= 0)
		p->prev[p->next[s]] = p->prev[s];
	else
		p->tail = p->prev[s];
}

static void lru_front(struct pool *p, __s32 s)
{
	p->prev[s] = -1;
	p->next[s] = p->head;
	if (p->head >= 0)
		p->prev[p->head] = s;
	p->head = s;
	if (p->tail < 0)
		p->tail = s;
}

struct result {
	__u64 hits, misses, bypass;	/* bypass: every slot pinned, not inserted */
	__u64 verdicts[POL_VERDICTS];
};

/*
 * The victim, chosen as a reclaim scan with a policy does: candidates
 * oldest first, pages fetched this step skipped (pinned, as in the
 * pager); the first the policy does not keep goes; a kept page gets a
 * second chance (it moves to the recent end, as the module's clock sets
 * its referenced bit); when `scan` candidates were all kept, the oldest
 * unpinned page goes anyway. -1: every page pinned.
 */
static int victim(struct pool *p, struct policy *pol, const struct trace *t, __u64 step,
		  __s32 *out)
{
	long asked = 0;
	__s32 s = p->tail;

	while (s >= 0) {
		__u64 args[3] = { REPLAY_WS, t->page_ids[p->page[s]], step };
		__u32 verdict = POL_DEFAULT;
		__s32 older = p->prev[s];
		int rc;

		if (p->last[s] == step) {
			s = older;
			continue;
		}
		if (!pol || asked == env.scan)
			break;
		asked++;
		rc = run_prog(pol->choose_fd, args, 3, &verdict);
		if (rc < 0) {
			fprintf(stderr, "%s: running the policy: %s\n", env.kt.tool, strerror(-rc));
			return rc;
		}
		if (verdict != POL_KEEP)
			break;
		lru_unlink(p, s);
		lru_front(p, s);
		if (older < 0)
			older = p->tail == s ? -1 : p->tail;
		s = older;
	}
	/* past the scan: the oldest unpinned page */
	if (s < 0 || p->last[s] == step)
		for (s = p->tail; s >= 0 && p->last[s] == step; s = p->prev[s])
			;
	*out = s;
	return 0;
}

static int replay(const struct trace *t, struct policy *pol, __u32 cap, struct result *r)
{
	struct pool p = { .cap = cap, .head = -1, .tail = -1 };
	__u64 step = 0;
	int rc = 0;

	memset(r, 0, sizeof(*r));
	p.prev = malloc(cap * sizeof(*p.prev));
	p.next = malloc(cap * sizeof(*p.next));
	p.page = malloc(cap * sizeof(*p.page));
	p.last = malloc(cap * sizeof(*p.last));
	p.slot_of = malloc(t->pages * sizeof(*p.slot_of));
	if (!p.prev || !p.next || !p.page || !p.last || !p.slot_of) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < t->pages; i++)
		p.slot_of[i] = -1;
	if (pol && (rc = feed(pol, FEED_SETUP, t->layers ? t->layers : 1, 0, 0)) < 0)
		goto out;
	for (size_t i = 0; !rc && i < t->n; i++) {
		const struct ev *e = &t->ev[i];
		__s32 s;

		if (e->kind == FEED_STEP) {
			step++;
			if (pol)
				rc = feed(pol, FEED_STEP, 0, step, 0);
			continue;
		}
		if (e->kind == FEED_HINT) {
			if (pol)
				rc = feed(pol, FEED_HINT, e->id, step, e->value);
			continue;
		}
		if (pol && (rc = feed(pol, FEED_ACCESS, e->id, step, 0)) < 0)
			break;
		s = p.slot_of[e->value];
		if (s >= 0) {
			r->hits++;
			lru_unlink(&p, s);
		} else {
			r->misses++;
			if (p.used < p.cap) {
				s = (__s32)p.used++;
			} else {
				rc = victim(&p, pol, t, step, &s);
				if (rc < 0)
					break;
				if (s < 0) {
					r->bypass++;
					continue;
				}
				lru_unlink(&p, s);
				p.slot_of[p.page[s]] = -1;
			}
			p.page[s] = e->value;
			p.slot_of[e->value] = s;
		}
		p.last[s] = step;
		lru_front(&p, s);
	}
	if (!rc && pol)
		for (__u32 k = 0; k < POL_VERDICTS; k++)
			bpf_map_lookup_elem(bpf_map__fd(pol->skel->maps.pol_verdicts), &k, &r->verdicts[k]);
out:
	free(p.prev);
	free(p.next);
	free(p.page);
	free(p.last);
	free(p.slot_of);
	if (rc == -ENOMEM)
		fprintf(stderr, "%s: out of memory\n", env.kt.tool);
	return rc;
}

static double rate(const struct result *r)
{
	return r->hits + r->misses ? (double)r->hits / (r->hits + r->misses) : 0;
}

static int run_replay(void)
{
	struct trace t = {};
	struct policy pol = {};
	struct result lru, mine;
	const char *name = env.replay ? env.replay : "synthetic";
	__u32 cap;
	int rc;

	rc = env.replay ? trace_read(&t, env.replay) : synth(&t);
	if (rc == -ENOMEM)
		fprintf(stderr, "%s: out of memory\n", env.kt.tool);
	if (rc < 0 || (rc = trace_index(&t)) < 0)
		goto out;
	cap = env.cap ? (__u32)env.cap : env.replay ? (__u32)(t.pages / 4 ? t.pages / 4 : 1) : 200;
	rc = policy_load(&pol, false);
	if (rc < 0)
		goto out;
	rc = replay(&t, NULL, cap, &lru);
	if (!rc)
		rc = replay(&t, &pol, cap, &mine);
	if (rc < 0)
		goto out;
	if (env.kt.json) {
		printf("{\"trace\":");
		kt_json_str(stdout, name);
		printf(",\"steps\":%zu,\"accesses\":%zu,\"pages\":%zu,\"layers\":%llu,\"cap\":%u,"
		       "\"scan\":%ld,\"lru_hits\":%llu,\"lru_hit_rate\":%.4f,\"policy\":",
		       t.steps, t.accesses, t.pages, (unsigned long long)t.layers, cap, env.scan,
		       (unsigned long long)lru.hits, rate(&lru));
		kt_json_str(stdout, env.policy);
		printf(",\"policy_hits\":%llu,\"policy_hit_rate\":%.4f,\"keep\":%llu,\"evict\":%llu,"
		       "\"default\":%llu}\n", (unsigned long long)mine.hits, rate(&mine),
		       (unsigned long long)mine.verdicts[POL_KEEP],
		       (unsigned long long)mine.verdicts[POL_EVICT],
		       (unsigned long long)mine.verdicts[POL_DEFAULT]);
	} else {
		printf("replay of %s: %zu steps, %zu accesses, %zu pages; pool %u pages, "
		       "%ld candidates asked per eviction\n", name, t.steps, t.accesses, t.pages,
		       cap, env.scan);
		printf("  %-16s hit rate %.4f (%llu hits)\n", "lru (default)", rate(&lru),
		       (unsigned long long)lru.hits);
		printf("  %-16s hit rate %.4f (%llu hits); verdicts: keep %llu, evict %llu, "
		       "default %llu\n", env.policy, rate(&mine), (unsigned long long)mine.hits,
		       (unsigned long long)mine.verdicts[POL_KEEP],
		       (unsigned long long)mine.verdicts[POL_EVICT],
		       (unsigned long long)mine.verdicts[POL_DEFAULT]);
		printf("  change           %+.4f\n", rate(&mine) - rate(&lru));
	}
out:
	policy_free(&pol);
	free(t.ev);
	free(t.page_ids);
	return rc < 0 ? 1 : 0;
}

/* ---- live: the module's kvmem_reclaim tracepoint ----------------------------- */
static int run_live(void)
{
	struct policy pol = {};
	struct bpf_link *victim_link = NULL, *prefetch_link = NULL;
	__u64 prev[POL_VERDICTS] = { 0 };
	int rc;

	if (!kt_module_loaded()) {
		fprintf(stderr, "%s: the kvmem kernel module is not loaded (no /sys/module/kvmem): "
			"nothing to attach a victim policy to; try it offline with --synthetic "
			"or --replay FILE\n", env.kt.tool);
		return 1;
	}
	rc = policy_load(&pol, true);
	if (rc < 0)
		goto out;
	rc = kt_attach(&env.kt, pol.skel->obj);
	if (rc < 0)
		goto out;
	victim_link = bpf_program__attach(bpf_object__find_program_by_name(pol.obj, "tp_reclaim"));
	if (!victim_link) {
		rc = -errno;
		fprintf(stderr, "%s: cannot attach %s to the module's %s tracepoint: %s\n",
			env.kt.tool, env.policy, KVMEM_TP_RECLAIM, strerror(errno));
		goto out;
	}
	/* A policy may also answer the prefetch hook (its tp_prefetch). */
	if (bpf_object__find_program_by_name(pol.obj, "tp_prefetch")) {
		prefetch_link = bpf_program__attach(bpf_object__find_program_by_name(pol.obj,
										 "tp_prefetch"));
		if (!prefetch_link) {
			rc = -errno;
			fprintf(stderr, "%s: cannot attach %s to the module's %s tracepoint: %s\n",
				env.kt.tool, env.policy, KVMEM_TP_PREFETCH_HOOK, strerror(errno));
			goto out;
		}
	}
	kt_print_tracing(&env.kt, "reclaim choices");
	while (!kt_exiting) {
		__u64 cur[POL_VERDICTS] = { 0 };
		char ts[32];

		sleep(env.interval);
		for (__u32 k = 0; k < POL_VERDICTS; k++)
			bpf_map_lookup_elem(bpf_map__fd(pol.skel->maps.pol_verdicts), &k, &cur[k]);
		if (env.kt.json)
			printf("{\"time\":%.3f,\"keep\":%llu,\"evict\":%llu,\"default\":%llu}\n",
			       kt_wall(), (unsigned long long)(cur[2] - prev[2]),
			       (unsigned long long)(cur[1] - prev[1]),
			       (unsigned long long)(cur[0] - prev[0]));
		else
			printf("%s%s%s candidates: keep %llu, evict %llu, default %llu\n",
			       env.kt.timestamp ? kt_clock(ts, sizeof(ts)) : "",
			       env.kt.timestamp ? " " : "", env.policy,
			       (unsigned long long)(cur[2] - prev[2]),
			       (unsigned long long)(cur[1] - prev[1]),
			       (unsigned long long)(cur[0] - prev[0]));
		fflush(stdout);
		memcpy(prev, cur, sizeof(prev));
		if (env.count > 0 && --env.count == 0)
			break;
	}
out:
	bpf_link__destroy(prefetch_link);
	bpf_link__destroy(victim_link);
	kt_detach();
	policy_free(&pol);
	return rc < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct argp_child children[] = { { &kt_common_argp, 0, NULL, 0 }, {} };
	static const struct argp argp = { .options = opts, .parser = parse_arg,
					  .args_doc = "[interval] [count]", .doc = doc,
					  .children = children };
	struct trace t = {};
	int err;

	if (kt_start(&argp, argc, argv, &env.kt))
		return 1;
	if (env.synth_trace) {
		err = synth(&t);
		if (!err)
			synth_print(&t);
		free(t.ev);
		return err ? 1 : 0;
	}
	if (env.check) {
		struct policy pol = {};

		err = policy_load(&pol, false);
		if (!err)
			printf("%s: choose and tp_reclaim passed the verifier\n", env.policy);
		policy_free(&pol);
		return err ? 1 : 0;
	}
	if (env.replay || env.synthetic)
		return run_replay();
	return run_live();
}
