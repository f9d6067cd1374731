// SPDX-License-Identifier: MIT
/*
 * kvmemlat: log2 histograms of kvmem's latencies: page-in (NVMe read
 * requests), fetch (pages asked to pages ready), stage-out, backpressure,
 * commit and step, and with the module fault-to-ready and write-back.
 *
 * The BPF half keeps running totals; each print shows what was added
 * since the last one, so counts and sums add up to the pager's counters
 * (read_requests/read_ns, blocks_out/write_ns, commits/commit_ns, ...).
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

#include "kvmem_helpers.h"
#include "kvmemlat.h"
#include "kvmemlat.skel.h"

static struct {
	struct kt_env kt;
	long interval;	/* seconds; 0: one summary at Ctrl-C */
	long count;
	bool ms;
	bool skip[LAT_KINDS];	/* -x: histograms left out, their probes unattached */
} env = {
	.kt = { .tool = "kvmemlat" },
	.count = -1,
};

static const struct {
	const char *name;	/* JSON and headings */
	const char *what;
	const char *prog;	/* the BPF program that fills it (kvmemlat.bpf.c) */
} kinds[LAT_KINDS] = {
	[LAT_PAGE_IN] = { "page_in", "NVMe read requests, submit to completion", "usdt_page_in_batch" },
	[LAT_FETCH] = { "fetch", "fetch calls, pages asked to pages ready", "usdt_fetch" },
	[LAT_STAGE_OUT] = { "stage_out", "block writes to NVMe, submit to completion",
			    "usdt_stage_out" },
	[LAT_BACKPRESSURE] = { "backpressure", "appends waiting for the stage-out buffer",
			       "usdt_backpressure" },
	[LAT_COMMIT] = { "commit", "commits, durable", "usdt_commit" },
	[LAT_STEP] = { "step", "agent steps, boundary to boundary", "usdt_step" },
	[LAT_FAULT] = { "fault", "module: fault to page ready (fill done)", "tp_fill_done" },
	[LAT_WRITEBACK] = { "writeback", "module: dirty page written back", "tp_writeback" },
};

const char *argp_program_version = "kvmemlat 0.1";
static const char doc[] =
"Summarize kvmem latencies as log2 histograms.\n"
"\n"
"USAGE: kvmemlat [-p PID] [-b PATH] [-m|-u] [-M] [-x KIND,...] [-T] [-j] [interval] [count]\n"
"\n"
"Histograms: page_in (NVMe read requests), fetch (a fetch call until every\n"
"page is ready), stage_out (block writes), backpressure (appends waiting\n"
"for the stage-out buffer), commit, step; with the module, fault (fault to\n"
"page ready) and writeback. Without an interval, one summary at Ctrl-C.\n"
"Every histogram costs a probe hit per call, write or reap pass, not per\n"
"page: page_in reads each request's latency from the pass's batch.\n"
"\n"
"EXAMPLES:\n"
"    kvmemlat                 # summary at Ctrl-C\n"
"    kvmemlat 1 10            # 1 s summaries, 10 of them\n"
"    kvmemlat -M -T 5         # millisecond slots, timestamps, every 5 s\n"
"    kvmemlat -p 1234         # one process\n"
"    kvmemlat -x page_in,step # leave those histograms out\n"
"    kvmemlat -j              # JSON lines: count, sum_ns, slots per histogram\n";

static const struct argp_option opts[] = {
	{ "milliseconds", 'M', NULL, 0, "Millisecond histograms (default: microseconds)", 0 },
	{ "exclude", 'x', "KIND[,KIND...]", 0, "Leave these histograms out and their probes "
	  "unattached (page_in, fetch, stage_out, backpressure, commit, step, fault, writeback)",
	  0 },
	{},
};

/* -x LIST: mark each named histogram skipped; 0, or an argp error. */
static error_t parse_exclude(struct argp_state *state, const char *arg)
{
	char *list = strdup(arg), *save = NULL;

	if (!list)
		argp_failure(state, 1, ENOMEM, "-x");
	for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
		__u32 k = 0;

		while (k < LAT_KINDS && strcmp(kinds[k].name, name))
			k++;
		if (k == LAT_KINDS) {
			argp_error(state, "-x: no histogram named '%s'", name);
			free(list);
			return EINVAL;
		}
		env.skip[k] = true;
	}
	free(list);
	return 0;
}

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'M':
		env.ms = true;
		return 0;
	case 'x':
		return parse_exclude(state, arg);
	case ARGP_KEY_ARG:
		kt_interval_count_arg(state, arg, &env.interval, &env.count);
		return 0;
	default:
		return ARGP_ERR_UNKNOWN;
	}
}

static struct lat_hist prev[LAT_KINDS];

static int print_hists(struct kvmemlat_bpf *obj, double secs)
{
	int fd = bpf_map__fd(obj->maps.hists);
	const char *unit = env.ms ? "msecs" : "usecs";
	char ts[32];

	if (!env.kt.json) {
		printf("\n");
		if (env.kt.timestamp)
			printf("%s\n", kt_clock(ts, sizeof(ts)));
	}
	for (__u32 k = 0; k < LAT_KINDS; k++) {
		struct lat_hist cur, d;

		if (bpf_map_lookup_elem(fd, &k, &cur) < 0) {
			fprintf(stderr, "%s: cannot read histogram %s: %s\n", env.kt.tool,
				kinds[k].name, strerror(errno));
			return -errno;
		}
		for (size_t i = 0; i < sizeof(cur) / sizeof(__u64); i++)
			((__u64 *)&d)[i] = ((__u64 *)&cur)[i] - ((__u64 *)&prev[k])[i];
		prev[k] = cur;
		if (!d.count)
			continue;
		if (env.kt.json) {
			printf("{\"time\":%.3f,\"interval_s\":%.3f,\"kind\":\"%s\",\"unit\":\"%s\","
			       "\"count\":%llu,\"sum_ns\":%llu,\"slots\":", kt_wall(), secs,
			       kinds[k].name, env.ms ? "ms" : "us", (unsigned long long)d.count,
			       (unsigned long long)d.sum_ns);
			kt_json_hist(stdout, d.slots, KT_MAX_SLOTS);
			printf("}\n");
			continue;
		}
		printf("%s: %s; count %llu, average %.1f %s\n", kinds[k].name, kinds[k].what,
		       (unsigned long long)d.count,
		       (double)d.sum_ns / d.count / (env.ms ? 1e6 : 1e3), env.ms ? "ms" : "us");
		kt_print_log2_hist(stdout, d.slots, KT_MAX_SLOTS, unit);
	}
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct argp_child children[] = { { &kt_common_argp, 0, NULL, 0 }, {} };
	static const struct argp argp = { .options = opts, .parser = parse_arg,
					  .args_doc = "[interval] [count]", .doc = doc,
					  .children = children };
	struct kvmemlat_bpf *obj;
	__u64 t0;
	int err;

	if (kt_start(&argp, argc, argv, &env.kt))
		return 1;
	obj = kvmemlat_bpf__open();
	if (!obj)
		return kt_open_failed(&env.kt);
	err = kt_open_sources(&env.kt, obj->obj);
	if (err)
		goto out;
	for (__u32 k = 0; k < LAT_KINDS; k++) {
		const char *skip[] = { kinds[k].prog, NULL };

		if (env.skip[k])
			kt_skip(obj->obj, skip);
	}
	obj->rodata->targ_tgid = env.kt.pid;
	obj->rodata->targ_ms = env.ms;
	err = kvmemlat_bpf__load(obj);
	if (err) {
		err = kt_load_failed(&env.kt, err);
		goto out;
	}
	err = kt_attach(&env.kt, obj->obj);
	if (err)
		goto out;
	kt_print_tracing(&env.kt, "kvmem latencies");
	t0 = kt_mono_ns();
	for (;;) {
		__u64 t;

		sleep(env.interval ? env.interval : 1);
		if (!env.interval && !kt_exiting)
			continue;	/* one summary, at the end */
		t = kt_mono_ns();
		err = print_hists(obj, (t - t0) * 1e-9);
		t0 = t;
		if (err || kt_exiting || (env.count > 0 && --env.count == 0))
			break;
	}
out:
	kt_detach();
	kvmemlat_bpf__destroy(obj);
	return err ? 1 : 0;
}
