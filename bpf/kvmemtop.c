// SPDX-License-Identifier: MIT
/*
 * kvmemtop: per interval, per process and workspace, the pager's tier
 * traffic (bytes/s and pages/s for NVMe->host, host->GPU, GPU->host,
 * host->NVMe), host hit rate, faults, prefetches and evictions.
 *
 * The BPF half keeps running totals; this half reads them every interval
 * and prints differences, so a run's rows add up to the pager's counters
 * (`kvmem stat`) exactly. The last, partial interval is printed on Ctrl-C.
 */
#include <argp.h>
#include <dirent.h>
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
#include "kvmemtop.h"
#include "kvmemtop.skel.h"

_Static_assert(KT_TIER_GPU == KVMEM_TIER_GPU && KT_TIER_HOST == KVMEM_TIER_HOST &&
	       KT_TIER_NVME == KVMEM_TIER_NVME, "kvmem_trace.h tiers differ from the uapi's");

static struct {
	struct kt_env kt;
	long interval;	/* seconds */
	long count;	/* intervals to print; -1: until Ctrl-C */
	bool per_page;	/* -P: the per-page probes */
} env = {
	.kt = { .tool = "kvmemtop" },
	.interval = 1,
	.count = -1,
};

const char *argp_program_version = "kvmemtop 0.1";
static const char doc[] =
"Show kvmem tier traffic per process and workspace, every interval.\n"
"\n"
"USAGE: kvmemtop [-p PID] [-b PATH] [-m|-u] [-P] [-T] [-j] [interval] [count]\n"
"\n"
"Columns: MB/s and pages/s per tier move (nvme>host: pages read in;\n"
"host>nvme: blocks staged out; host>gpu and gpu>host when an engine moves\n"
"pages to a GPU), the host hit rate of fetched pages, and per interval the\n"
"faults (fetched pages not in the host tier), prefetched pages and evictions.\n"
"\n"
"EXAMPLES:\n"
"    kvmemtop                 # every kvmem process, 1 s intervals\n"
"    kvmemtop 5 10            # 5 s intervals, 10 of them\n"
"    kvmemtop -p 1234 -T      # one process, with timestamps\n"
"    kvmemtop -j 1            # JSON lines with the raw counts of each interval\n"
"    kvmemtop -b build/libkvmem.so   # processes using the shared library\n"
"    kvmemtop -m              # the kernel module's tracepoints only\n"
"    kvmemtop -P              # from the per-page probes (costs more)\n";

static const struct argp_option opts[] = {
	{ "per-page", 'P', NULL, 0, "Count from the probes that fire per page (hit, miss, "
	  "tier_move): also GPU and memory->host moves, at a probe hit per page", 0 },
	{},
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'P':
		env.per_page = true;
		return 0;
	case ARGP_KEY_ARG:
		kt_interval_count_arg(state, arg, &env.interval, &env.count);
		return 0;
	default:
		return ARGP_ERR_UNKNOWN;
	}
}

/* ---- rows ------------------------------------------------------------------ */
struct row {
	struct top_key key;
	struct top_val prev;	/* totals at the last print */
	struct top_val d;	/* this interval */
	char name[KT_DIR_LEN];
};

static struct row *rows;
static size_t n_rows, cap_rows;

static struct row *row_get(const struct top_key *k)
{
	struct row *r;

	for (size_t i = 0; i < n_rows; i++)
		if (rows[i].key.pid == k->pid && rows[i].key.ws == k->ws)
			return &rows[i];
	if (n_rows == cap_rows) {
		size_t cap = cap_rows ? 2 * cap_rows : 16;

		r = realloc(rows, cap * sizeof(*rows));
		if (!r)
			return NULL;
		rows = r;
		cap_rows = cap;
	}
	r = &rows[n_rows++];
	memset(r, 0, sizeof(*r));
	r->key = *k;
	return r;
}

/* The workspace directory of a process that opened it before we attached:
 * the directory of the "pages" file it holds open. */
static void guess_dir(__u32 pid, char *out, size_t len)
{
	char path[64], link[PATH_MAX];
	struct dirent *de;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%u/fd", pid);
	d = opendir(path);
	if (!d)
		return;
	while ((de = readdir(d))) {
		char fd[PATH_MAX];
		ssize_t n;

		snprintf(fd, sizeof(fd), "%s/%s", path, de->d_name);
		n = readlink(fd, link, sizeof(link) - 1);
		if (n <= 6)
			continue;
		link[n] = 0;
		if (strcmp(link + n - 6, "/pages"))
			continue;
		n -= 6;	/* keep the tail of a long path: it names the workspace */
		link[n] = 0;
		if ((size_t)n < len)
			memcpy(out, link, (size_t)n + 1);
		else
			memcpy(out, link + n - (len - 1), len);
		break;
	}
	closedir(d);
}

static void row_name(struct kvmemtop_bpf *obj, struct row *r)
{
	struct kt_workspace ws;

	if (bpf_map_lookup_elem(bpf_map__fd(obj->maps.workspaces), &r->key.pid, &ws) == 0 &&
	    ws.id == r->key.ws && ws.dir[0]) {
		snprintf(r->name, sizeof(r->name), "%s", ws.dir);
		return;
	}
	if (r->name[0])
		return;
	if (r->key.ws == 0 && r->key.pid)
		guess_dir(r->key.pid, r->name, sizeof(r->name));
	if (!r->name[0])
		snprintf(r->name, sizeof(r->name), r->key.ws ? "ws:%llu" : "?",
			 (unsigned long long)r->key.ws);
}

static bool busy(const struct top_val *d)
{
	const __u64 *w = (const __u64 *)d;

	for (size_t i = 0; i < sizeof(*d) / sizeof(__u64); i++)
		if (w[i])
			return true;
	return false;
}

static __u64 moved(const struct top_val *d)
{
	__u64 b = 0;

	for (int i = 0; i < (int)KT_MOVES; i++)
		b += d->bytes[i];
	return b;
}

static int cmp_rows(const void *a, const void *b)
{
	__u64 x = moved(&((const struct row *)a)->d), y = moved(&((const struct row *)b)->d);

	return (x < y) - (x > y);
}

/* Read every total, set d = total - prev, prev = total. */
static int collect(struct kvmemtop_bpf *obj)
{
	int fd = bpf_map__fd(obj->maps.rows);
	struct top_key k, next, *prev = NULL;
	struct top_val v;

	while (bpf_map_get_next_key(fd, prev, &next) == 0) {
		struct row *r;

		k = next;
		prev = &k;
		if (bpf_map_lookup_elem(fd, &k, &v) < 0)
			continue;	/* deleted meanwhile */
		r = row_get(&k);
		if (!r) {
			fprintf(stderr, "%s: out of memory\n", env.kt.tool);
			return -ENOMEM;
		}
		for (size_t i = 0; i < sizeof(v) / sizeof(__u64); i++)
			((__u64 *)&r->d)[i] = ((__u64 *)&v)[i] - ((__u64 *)&r->prev)[i];
		r->prev = v;
		row_name(obj, r);
	}
	return 0;
}

/* Rows of processes that are gone and did nothing since: forget them. */
static void prune(struct kvmemtop_bpf *obj)
{
	int fd = bpf_map__fd(obj->maps.rows);

	for (size_t i = 0; i < n_rows;) {
		if (!busy(&rows[i].d) && rows[i].key.pid && !kt_pid_alive(rows[i].key.pid)) {
			bpf_map_delete_elem(fd, &rows[i].key);
			rows[i] = rows[--n_rows];
			continue;
		}
		i++;
	}
}

/* The four moves the columns show, as cells of top_val's arrays. */
static const struct { const char *name; unsigned cell; } cols[] = {
	{ "nvme_host", KT_MOVE(KT_TIER_NVME, KT_TIER_HOST) },
	{ "host_gpu", KT_MOVE(KT_TIER_HOST, KT_TIER_GPU) },
	{ "gpu_host", KT_MOVE(KT_TIER_GPU, KT_TIER_HOST) },
	{ "host_nvme", KT_MOVE(KT_TIER_NONE, KT_TIER_NVME) },
};
/* Stage-out writes from the stage-out buffer (0 -> NVMe) in the userspace
 * pager and from host pages (2 -> NVMe) in the module: one column. */
#define HOST_NVME2 KT_MOVE(KT_TIER_HOST, KT_TIER_NVME)
#define MEM_HOST KT_MOVE(KT_TIER_NONE, KT_TIER_HOST)
#define EVICT KT_MOVE(KT_TIER_HOST, KT_TIER_NONE)

static __u64 cell_bytes(const struct top_val *d, int c)
{
	return d->bytes[cols[c].cell] + (c == 3 ? d->bytes[HOST_NVME2] : 0);
}

static __u64 cell_pages(const struct top_val *d, int c)
{
	return d->pages[cols[c].cell] + (c == 3 ? d->pages[HOST_NVME2] : 0);
}

static void print_json(const struct row *r, double secs)
{
	const struct top_val *d = &r->d;
	__u64 fetched = d->hits + d->misses;

	printf("{\"time\":%.3f,\"interval_s\":%.3f,\"pid\":%u,\"workspace\":", kt_wall(), secs,
	       r->key.pid);
	kt_json_str(stdout, r->name);
	printf(",\"ws_id\":%llu", (unsigned long long)r->key.ws);
	for (int c = 0; c < 4; c++)
		printf(",\"%s_bytes\":%llu,\"%s_pages\":%llu", cols[c].name,
		       (unsigned long long)cell_bytes(d, c), cols[c].name,
		       (unsigned long long)cell_pages(d, c));
	printf(",\"host_nvme_moves\":%llu",
	       (unsigned long long)(d->moves[cols[3].cell] + d->moves[HOST_NVME2]));
	if (env.per_page)
		printf(",\"mem_host_bytes\":%llu,\"mem_host_pages\":%llu",
		       (unsigned long long)d->bytes[MEM_HOST], (unsigned long long)d->pages[MEM_HOST]);
	printf(",\"hits\":%llu,\"staging_hits\":%llu,\"misses\":%llu,\"hit_rate\":",
	       (unsigned long long)d->hits, (unsigned long long)d->staging_hits,
	       (unsigned long long)d->misses);
	if (fetched)
		printf("%.4f", (double)d->hits / fetched);
	else
		printf("null");
	printf(",\"prefetches\":%llu,\"evictions\":%llu,\"errors\":%llu,\"steps\":%llu,"
	       "\"commits\":%llu}\n", (unsigned long long)d->prefetches,
	       (unsigned long long)d->pages[EVICT], (unsigned long long)d->errors,
	       (unsigned long long)d->steps, (unsigned long long)d->commits);
}

static void print_text(const struct row *r, double secs)
{
	const struct top_val *d = &r->d;
	__u64 fetched = d->hits + d->misses;
	char pid[16], name[KT_DIR_LEN + 4], hit[16] = "-";

	if (r->key.pid)
		snprintf(pid, sizeof(pid), "%u", r->key.pid);
	else
		snprintf(pid, sizeof(pid), "kmod");
	if (fetched)
		snprintf(hit, sizeof(hit), "%.1f", 100.0 * d->hits / fetched);
	printf("%-7s %-20s", pid, kt_tail(r->name, 20, name, sizeof(name)));
	for (int c = 0; c < 4; c++)
		printf(" %8.1f %7.0f", cell_bytes(d, c) / secs / 1e6, cell_pages(d, c) / secs);
	printf(" %6s %7llu %8llu %7llu\n", hit, (unsigned long long)d->misses,
	       (unsigned long long)d->prefetches, (unsigned long long)d->pages[EVICT]);
}

static int print_interval(struct kvmemtop_bpf *obj, double secs)
{
	char ts[32];
	int rc = collect(obj);

	if (rc < 0)
		return rc;
	qsort(rows, n_rows, sizeof(*rows), cmp_rows);
	if (!env.kt.json) {
		printf("\n");
		if (env.kt.timestamp)
			printf("%s\n", kt_clock(ts, sizeof(ts)));
		printf("%-28s %-16s %-16s %-16s %-16s\n", "", "      nvme>host", "       host>gpu",
		       "       gpu>host", "      host>nvme");
		printf("%-7s %-20s", "PID", "WORKSPACE");
		for (int c = 0; c < 4; c++)
			printf(" %8s %7s", "MB/s", "pg/s");
		printf(" %6s %7s %8s %7s\n", "HIT%", "FAULTS", "PREFETCH", "EVICT");
	}
	for (size_t i = 0; i < n_rows; i++) {
		if (!busy(&rows[i].d))
			continue;
		if (env.kt.json)
			print_json(&rows[i], secs);
		else
			print_text(&rows[i], secs);
	}
	fflush(stdout);
	prune(obj);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct argp_child children[] = { { &kt_common_argp, 0, NULL, 0 }, {} };
	static const struct argp argp = { .options = opts, .parser = parse_arg,
					  .args_doc = "[interval] [count]", .doc = doc,
					  .children = children };
	static const char *const batched[] = { "usdt_fetch", "usdt_page_in_batch", "usdt_reclaim",
					       "usdt_prefetch_batch", "usdt_stage_out", NULL };
	static const char *const per_page[] = { "usdt_hit", "usdt_miss", "usdt_tier_move",
						"usdt_prefetch", NULL };
	struct kvmemtop_bpf *obj;
	__u64 t0;
	int err;

	if (kt_start(&argp, argc, argv, &env.kt))
		return 1;
	obj = kvmemtop_bpf__open();
	if (!obj)
		return kt_open_failed(&env.kt);
	err = kt_open_sources(&env.kt, obj->obj);
	if (err)
		goto out;
	kt_skip(obj->obj, env.per_page ? batched : per_page);
	obj->rodata->targ_tgid = env.kt.pid;
	err = kvmemtop_bpf__load(obj);
	if (err) {
		err = kt_load_failed(&env.kt, err);
		goto out;
	}
	err = kt_attach(&env.kt, obj->obj);
	if (err)
		goto out;
	kt_print_tracing(&env.kt, "kvmem tier traffic");
	t0 = kt_mono_ns();
	while (!kt_exiting) {
		__u64 t;

		sleep(env.interval);
		t = kt_mono_ns();
		err = print_interval(obj, (t - t0) * 1e-9);
		t0 = t;
		if (err || (env.count > 0 && --env.count == 0))
			break;
	}
out:
	kt_detach();
	kvmemtop_bpf__destroy(obj);
	free(rows);
	return err ? 1 : 0;
}
