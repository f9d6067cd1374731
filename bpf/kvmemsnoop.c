// SPDX-License-Identifier: MIT
/*
 * kvmemsnoop: one line per page event of the kvmem pager (or module): time,
 * pid, workspace, event, page, block, layer, tier move, bytes, latency.
 *
 * A read request of n pages arrives as one record and is printed as n
 * lines (one per page, the request's latency on each); a stage-out is one
 * line per block (layer "*"). So the lines add up to the pager's counters:
 * "in" lines = pages_in (their bytes = bytes_in), "out" lines = blocks_out
 * (bytes_out), "evict" lines = evictions, "prefetch" lines = prefetch_pages,
 * and with -a "hit" lines = host_hits + staging_hits, "miss" = host_misses.
 */
#include <argp.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "kvmem_helpers.h"
#include "kvmemsnoop.h"
#include "kvmemsnoop.skel.h"

static struct {
	struct kt_env kt;
	bool all;		/* -a: hits, misses and steps too */
	long buffer_mb;		/* -B: ring buffer size */
} env = {
	.kt = { .tool = "kvmemsnoop" },
	.buffer_mb = 4,
};

static const char *const kind_names[SNOOP_KINDS] = {
	[SNOOP_IN] = "in", [SNOOP_OUT] = "out", [SNOOP_EVICT] = "evict",
	[SNOOP_PREFETCH] = "prefetch", [SNOOP_ERROR] = "error", [SNOOP_HIT] = "hit",
	[SNOOP_MISS] = "miss", [SNOOP_STEP] = "step", [SNOOP_HINT] = "hint",
};

const char *argp_program_version = "kvmemsnoop 0.1";
static const char doc[] =
"Trace kvmem page events: one line per page moved, evicted or prefetched.\n"
"\n"
"USAGE: kvmemsnoop [-p PID] [-b PATH] [-m|-u] [-a] [-B MB] [-T] [-j]\n"
"\n"
"Events: in (read into the host tier; the latency is the read request's),\n"
"out (a block staged out to NVMe), evict, prefetch, error; with -a also\n"
"hit and miss for every fetched page, step for each step boundary and\n"
"hint for the selector's feedback.\n"
"\n"
"EXAMPLES:\n"
"    kvmemsnoop               # every kvmem process\n"
"    kvmemsnoop -p 1234 -T    # one process, wall-clock timestamps\n"
"    kvmemsnoop -a -j > t.jsonl   # everything as JSON lines (a recorded\n"
"                             # access sequence for kvmempolicy --replay)\n";

static const struct argp_option opts[] = {
	{ "all", 'a', NULL, 0, "Also every hit, miss, step boundary and selector hint (a probe hit "
	  "per fetched page)", 0 },
	{ "buffer", 'B', "MB", 0, "Ring buffer size in MiB (default 4)", 0 },
	{},
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'a':
		env.all = true;
		return 0;
	case 'B':
		if (kt_parse_long(arg, 1, 1024, &env.buffer_mb) < 0)
			argp_error(state, "invalid buffer size: %s", arg);
		return 0;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument: %s", arg);
		return 0;
	default:
		return ARGP_ERR_UNKNOWN;
	}
}

/* ---- workspace names ------------------------------------------------------- */
struct name {
	__u32 pid;
	__u64 ws;
	char dir[KT_DIR_LEN];
};

static struct name *names;
static size_t n_names;
static struct kvmemsnoop_bpf *skel;

static const char *ws_name(__u32 pid, __u64 ws)
{
	struct kt_workspace w;
	struct name *nm;

	for (size_t i = 0; i < n_names; i++)
		if (names[i].pid == pid && names[i].ws == ws)
			return names[i].dir;
	nm = realloc(names, (n_names + 1) * sizeof(*names));
	if (!nm)
		return "?";
	names = nm;
	nm = &names[n_names++];
	nm->pid = pid;
	nm->ws = ws;
	if (bpf_map_lookup_elem(bpf_map__fd(skel->maps.workspaces), &pid, &w) == 0 && w.id == ws &&
	    w.dir[0])
		snprintf(nm->dir, sizeof(nm->dir), "%s", w.dir);
	else
		snprintf(nm->dir, sizeof(nm->dir), ws ? "ws:%llu" : "?", (unsigned long long)ws);
	return nm->dir;
}

/* ---- output ---------------------------------------------------------------- */
static __u64 t_start;	/* CLOCK_MONOTONIC ns, bpf_ktime_get_ns()'s clock */
static double wall_minus_mono;

static const char *move_name(const struct snoop_event *e)
{
	static const char *const tier[8] = { "-", "gpu", "host", "?", "nvme", "?", "?", "?" };
	static char buf[32];

	switch (e->kind) {
	case SNOOP_ERROR:
	case SNOOP_MISS:
	case SNOOP_STEP:
	case SNOOP_HINT:
		return "-";
	case SNOOP_HIT:
		return e->from == KT_TIER_HOST ? "host" : "stage>host";
	case SNOOP_OUT:
		return "host>nvme";
	}
	snprintf(buf, sizeof(buf), "%s>%s", tier[e->from & 7], tier[e->to & 7]);
	return buf;
}

static void print_line(const struct snoop_event *e, __u64 page, __u64 bytes, bool block_rec)
{
	const char *ws = ws_name(e->pid, e->ws), *ev = kind_names[e->kind], *move = move_name(e);
	double t = (e->ts_ns - t_start) * 1e-9;
	bool hint = e->kind == SNOOP_HINT, geom = e->layers && e->kind != SNOOP_STEP && !hint;
	char when[32], blk[24] = "-", lay[16] = "-", wsb[KT_DIR_LEN + 4];

	if (hint)
		snprintf(blk, sizeof(blk), "%llu", (unsigned long long)page);
	if (geom) {
		snprintf(blk, sizeof(blk), "%llu", (unsigned long long)(page / e->layers));
		if (block_rec)
			snprintf(lay, sizeof(lay), "*");
		else
			snprintf(lay, sizeof(lay), "%llu", (unsigned long long)(page % e->layers));
	}
	if (env.kt.json) {
		printf("{\"t\":%.6f,\"time\":%.6f,\"pid\":%u,\"workspace\":", t,
		       e->ts_ns * 1e-9 + wall_minus_mono, e->pid);
		kt_json_str(stdout, ws);
		printf(",\"ws_id\":%llu,\"event\":\"%s\"", (unsigned long long)e->ws, ev);
		if (hint) {
			printf(",\"block\":%llu,\"score_ppm\":%llu}\n", (unsigned long long)page,
			       (unsigned long long)bytes);
			return;
		}
		printf(",\"%s\":%llu", e->kind == SNOOP_STEP ? "step" : "page",
		       (unsigned long long)page);
		if (geom) {
			printf(",\"block\":%llu,\"layer\":", (unsigned long long)(page / e->layers));
			if (block_rec)
				printf("null");
			else
				printf("%llu", (unsigned long long)(page % e->layers));
			printf(",\"layers\":%u", e->layers);
		}
		printf(",\"move\":\"%s\",\"bytes\":%llu,\"lat_ns\":%llu", move,
		       (unsigned long long)bytes, (unsigned long long)e->lat_ns);
		if (e->kind == SNOOP_ERROR)
			printf(",\"err\":%d", e->err);
		printf("}\n");
		return;
	}
	if (env.kt.timestamp) {
		double w = e->ts_ns * 1e-9 + wall_minus_mono;
		time_t s = (time_t)w;
		struct tm tm;

		strftime(when, sizeof(when), "%H:%M:%S", localtime_r(&s, &tm));
		snprintf(when + strlen(when), sizeof(when) - strlen(when), ".%06d",
			 (int)((w - s) * 1e6));
	} else {
		snprintf(when, sizeof(when), "%.6f", t);
	}
	ws = kt_tail(ws, 20, wsb, sizeof(wsb));
	if (hint) {
		printf("%-15s %-7u %-20s %-8s %9s %7s %5s score %.3f\n", when, e->pid, ws, ev, "-",
		       blk, lay, bytes / 1e6);
		return;
	}
	printf("%-15s %-7u %-20s %-8s %9llu %7s %5s %-10s %9llu", when, e->pid, ws, ev,
	       (unsigned long long)page, blk, lay, move, (unsigned long long)bytes);
	if (e->lat_ns)
		printf(" %9.1f", e->lat_ns / 1e3);
	else
		printf(" %9s", "-");
	if (e->kind == SNOOP_ERROR)
		printf(" %s", strerror(-e->err));
	printf("\n");
}

static int handle_event(void *ctx, void *data, size_t len)
{
	const struct snoop_event *e = data;

	if (len < sizeof(*e) || e->kind >= SNOOP_KINDS)
		return 0;
	if ((e->kind == SNOOP_OUT && e->n == 0) || e->kind == SNOOP_HINT) {
		print_line(e, e->page, e->bytes, e->kind == SNOOP_OUT);
		return 0;
	}
	/* A run of pages: a line per page, each with its share of bytes. */
	for (__u32 k = 0; k < (e->n ? e->n : 1); k++) {
		__u64 per = e->page_bytes ? e->page_bytes : e->bytes / (e->n ? e->n : 1);

		print_line(e, e->page + k, per, false);
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct argp_child children[] = { { &kt_common_argp, 0, NULL, 0 }, {} };
	static const struct argp argp = { .options = opts, .parser = parse_arg, .doc = doc,
					  .children = children };
	static const char *const all_only[] = { "usdt_hit", "usdt_miss", "usdt_step", "usdt_hint",
						"tp_fault", "tp_hit", NULL };
	struct ring_buffer *rb = NULL;
	__u32 zero = 0;
	__u64 n_lost = 0;
	int err;

	if (kt_start(&argp, argc, argv, &env.kt))
		return 1;
	skel = kvmemsnoop_bpf__open();
	if (!skel)
		return kt_open_failed(&env.kt);
	err = kt_open_sources(&env.kt, skel->obj);
	if (err)
		goto out;
	if (!env.all)
		kt_skip(skel->obj, all_only);
	skel->rodata->targ_tgid = env.kt.pid;
	bpf_map__set_max_entries(skel->maps.events, (__u32)env.buffer_mb << 20);
	err = kvmemsnoop_bpf__load(skel);
	if (err) {
		err = kt_load_failed(&env.kt, err);
		goto out;
	}
	rb = ring_buffer__new(bpf_map__fd(skel->maps.events), handle_event, NULL, NULL);
	if (!rb) {
		err = -errno;
		fprintf(stderr, "%s: cannot open the ring buffer: %s\n", env.kt.tool, strerror(errno));
		goto out;
	}
	err = kt_attach(&env.kt, skel->obj);
	if (err)
		goto out;
	t_start = kt_mono_ns();
	wall_minus_mono = kt_wall() - t_start * 1e-9;
	kt_print_tracing(&env.kt, "kvmem page events");
	if (!env.kt.json)
		printf("%-15s %-7s %-20s %-8s %9s %7s %5s %-10s %9s %9s\n",
		       env.kt.timestamp ? "TIME" : "TIME(s)", "PID", "WORKSPACE", "EVENT", "PAGE",
		       "BLOCK", "LAYER", "MOVE", "BYTES", "LAT(us)");
	while (!kt_exiting) {
		err = ring_buffer__poll(rb, 100);
		if (err == -EINTR) {
			err = 0;
			break;
		}
		if (err < 0) {
			fprintf(stderr, "%s: reading the ring buffer: %s\n", env.kt.tool,
				strerror(-err));
			break;
		}
		err = 0;
	}
	/* Stop the sources, then print what is still in the buffer. */
	kt_detach();
	ring_buffer__consume(rb);
	fflush(stdout);
	if (bpf_map_lookup_elem(bpf_map__fd(skel->maps.lost), &zero, &n_lost) == 0 && n_lost)
		fprintf(stderr, "%s: %llu events lost (the ring buffer was full: -B for a larger "
			"one)\n", env.kt.tool, (unsigned long long)n_lost);
out:
	kt_detach();
	ring_buffer__free(rb);
	kvmemsnoop_bpf__destroy(skel);
	free(names);
	return err || n_lost ? 1 : 0;
}
