// SPDX-License-Identifier: MIT
/*
 * kvmem bench pager: the tiered store against the file system it sits on,
 * or (--store rados://POOL) against the Ceph pool it sits in.
 *
 *  1. Baselines, in the same run and directory: O_DIRECT sequential write
 *     and read of a fresh file with 1 MiB requests, 8 in flight (io_uring);
 *     in a pool, `rados bench write` and `rados bench seq` (4 MiB objects,
 *     16 in flight) on the same pool.
 *  2. Per page size: stage-out throughput (append every block of a
 *     workspace, then commit: the data is durable when the clock stops) as
 *     a ratio to the sequential write; page-in throughput (random pages,
 *     fetched in batches through the pager with O_DIRECT, so the page cache
 *     is not involved; the host pool holds a small share of the workspace)
 *     as a ratio to the sequential read.
 *  3. Commit latency, p50 and p99: a decode-like step (one token, the
 *     partial block rewritten) committed 100 times.
 *  4. Host hit rate per replacement policy on a synthetic agent step
 *     sequence (drifting topics, sink and recent blocks, selector hints).
 *
 * --pager kmod pages in through the kernel module instead (the stage-out
 * is the pager's either way): bench_pager_kmod.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "bench_pager_kmod.h"
#include "cli_util.h"
#include "cmd.h"
#include "pager/repl_int.h"
#include "pager/wstore.h"
#include "util/clock.h"

#define BENCH_LAYERS 16

static int rm_one(const char *path, const struct stat *sb, int type, struct FTW *f)
{
	return remove(path);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvmem bench pager [--dir D | --store rados://POOL] [--size SIZE]\n"
		   "                         [--pages LIST] [--batch N] [--rounds N]\n"
		   "                         [--pager uring|kmod] [--no-hit-rates]\n\n"
		   "Page-in and stage-out throughput of the NVMe store as ratios to O_DIRECT\n"
		   "sequential read/write of the same file system (of a RADOS store: to rados\n"
		   "bench seq and write on the same pool), commit latency, and host hit rates\n"
		   "per replacement policy on a synthetic agent step sequence.\n\n"
		   "options:\n"
		   "  --dir D        where to put the scratch files (default $TMPDIR or /var/tmp);\n"
		   "                 a fresh subdirectory is made and removed\n"
		   "  --store rados://POOL  measure a RADOS store in POOL instead (scratch\n"
		   "                 workspaces rados://POOL/kvmem-bench-*, removed after); the\n"
		   "                 rados command runs the baselines\n"
		   "  --rados-seconds N  seconds of each rados bench run (default 10)\n"
		   CLI_CEPH_CONF_HELP
		   "  --size SIZE    bytes written per measurement (default 512M, at least 16M)\n"
		   "  --pages LIST   page sizes, comma separated, multiples of 32k\n"
		   "                 (default 64k,128k,256k,1M,2M)\n"
		   "  --batch N      pages per fetch in the page-in test, 1..4096 (default 64)\n"
		   "  --rounds N     rounds per figure, 1..16; the median is shown (default 3)\n"
		   "  --pager P      who pages in: uring (the userspace pager, default) or kmod\n"
		   "                 (the kernel module: O_DIRECT reads into its window, as\n"
		   "                 kvmem run --pager kmod does; needs kvmem.ko loaded); the\n"
		   "                 stage-out is the pager's either way\n"
		   "  --no-hit-rates skip the replacement policies' hit rates (a simulation:\n"
		   "                 seconds of CPU, minutes in an emulated VM)\n"
		   "  --dtype T      page dtype: f32 (default), bf16 or fp8; a page of SIZE is\n"
		   "                 SIZE / (2 x 32 x 128 x element bytes) KV heads, so 128k of\n"
		   "                 bf16 and 64k of fp8 are both Qwen3-8B's page (fp8 adds its\n"
		   "                 scales: 67584 bytes)\n"
		   "  --help         this text\n"
		   "Sizes take k, M, G, T (powers of 1024: 512M = 536870912 bytes).\n\n"
		   "Targets: page-in >= 0.9 of sequential read for pages of 128 KiB and more;\n"
		   "stage-out >= 0.9 of sequential write.\n\n"
		   "RADOS targets: page-in >= 0.8 of rados bench seq, stage-out >= 0.8 of\n"
		   "rados bench write.\n\n"
		   "examples:\n"
		   "  kvmem bench pager --size 512M --rounds 5\n"
		   "  kvmem bench pager --store rados://kvmem --pages 128k,1M --size 1G\n"
		   "  kvmem bench pager --dir /mnt/nvme --size 1G --pages 128k,1M\n"
		   "  kvmem bench pager --dir /mnt/nvme --pager kmod --pages 128k,1M\n");
}

/* ---- machine and file system ---------------------------------------------- */
static void print_machine(const char *dir)
{
	char line[512], model[256] = "?", fstype[64] = "?", dev[600] = "?";
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	double mem = (double)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / (1 << 30);
	size_t best = 0;
	struct utsname u;
	FILE *f;

	f = fopen("/proc/cpuinfo", "r");
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
			snprintf(model, sizeof(model), "%s", strchr(line, ':') + 2);
			model[strcspn(model, "\n")] = 0;
			break;
		}
	if (f)
		fclose(f);
	/* The longest mount point that prefixes dir is its file system. */
	f = fopen("/proc/mounts", "r");
	while (f && fgets(line, sizeof(line), f)) {
		char d[256], m[256], t[64];
		size_t n;

		if (sscanf(line, "%255s %255s %63s", d, m, t) != 3)
			continue;
		n = strlen(m);
		if (!strncmp(dir, m, n) && (dir[n] == '/' || dir[n] == 0 || n == 1) && n >= best) {
			best = n;
			snprintf(fstype, sizeof(fstype), "%s", t);
			snprintf(dev, sizeof(dev), "%s on %s", d, m);
		}
	}
	if (f)
		fclose(f);
	uname(&u);
	printf("machine: %s, %ld cores, %.1f GiB, Linux %s\n", model, cores, mem, u.release);
	printf("file system: %s (%s), directory %s\n", fstype, dev, dir);
}

/* ---- sequential baselines --------------------------------------------------- */
/* Write (or read) `size` bytes of `path` sequentially, `qd` requests of `req`
 * bytes in flight, O_DIRECT; `prealloc` allocates the file first. Returns
 * bytes/s, or -1. */
static double seq_io(const char *path, uint64_t size, int write, size_t req, int qd,
		     int prealloc)
{
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	uint8_t *buf;
	uint64_t off = 0, done = 0;
	int fd, inflight = 0;
	double t0, t;

	fd = open(path, (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_DIRECT, 0644);
	if (fd < 0) {
		fprintf(stderr, "kvmem bench pager: %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (write && prealloc && fallocate(fd, 0, 0, size) < 0)
		prealloc = 0;
	if (posix_memalign((void **)&buf, 4096, req * qd) ||
	    io_uring_queue_init(qd * 2, &ring, 0) < 0) {
		close(fd);
		return -1;
	}
	for (size_t i = 0; i < req * qd; i += 8) {
		uint64_t v = i * 0x9e3779b97f4a7c15ull;

		memcpy(buf + i, &v, 8);
	}
	t0 = cli_now_s();
	while (done < size) {
		while (inflight < qd && off < size) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			uint8_t *b = buf + (size_t)(off / req % qd) * req;

			if (write)
				io_uring_prep_write(sqe, fd, b, req, off);
			else
				io_uring_prep_read(sqe, fd, b, req, off);
			off += req;
			inflight++;
		}
		if (io_uring_submit_and_wait(&ring, 1) < 0 || io_uring_wait_cqe(&ring, &cqe) < 0)
			break;
		if (cqe->res != (int)req) {
			fprintf(stderr, "kvmem bench pager: %s: %s\n", path,
				cqe->res < 0 ? strerror(-cqe->res) : "short transfer");
			io_uring_cqe_seen(&ring, cqe);
			done = 0;
			break;
		}
		io_uring_cqe_seen(&ring, cqe);
		inflight--;
		done += req;
	}
	if (write && done == size)
		fdatasync(fd);
	t = cli_now_s() - t0;
	io_uring_queue_exit(&ring);
	free(buf);
	close(fd);
	return done == size ? size / t : -1;
}

#define SEQ_REQ (1u << 20)
#define SEQ_QD 32

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- pager throughput ------------------------------------------------------- */
/* The page dtype of every workspace made here (--dtype). */
static uint32_t g_dtype = KVMEM_DTYPE_F32;

static kvmem_page_geom bench_geom(uint64_t page)
{
	/* 2 * Hkv * B * D * e bytes with B = 32, D = 128 (fp8: and its scales). */
	kvmem_page_geom g = {
		.fingerprint = 0x6b766d656d62656eull,
		.n_layers = BENCH_LAYERS,
		.head_dim = 128,
		.block_tokens = 32,
		.dtype = g_dtype,
	};

	g.n_kv_heads = page / (2 * 32 * 128 * kvmem_dtype_bytes(g_dtype));
	g.n_heads = g.n_kv_heads;
	return g;
}

struct pager_result {
	double out_bps, in_bps;
};

static void pager_opts(kvmem_pager_opts *o, uint64_t page, int batch, int flags)
{
	kvmem_pager_opts_default(o);
	o->flags = flags;
	o->stage_bytes = 64ull << 20;
	if (o->stage_bytes < 4 * page * BENCH_LAYERS)
		o->stage_bytes = 4 * page * BENCH_LAYERS;
	o->host_cap = (uint64_t)batch * page * 2;
	/* Two fetches in flight when the next one is prefetched. */
	o->queue_depth = 2 * batch > 64 ? 2 * batch : 64;
}

/* Stage-out: append every block, then commit (durable when the clock stops). */
static int stage_out(kvmem_pager *p, uint64_t page, uint64_t blocks, struct pager_result *res)
{
	const void *layers[BENCH_LAYERS];
	uint8_t *data = malloc(page * BENCH_LAYERS);
	double t0;
	int rc = 0;

	if (!data)
		return -1;
	for (uint64_t i = 0; i < page * BENCH_LAYERS / 8; i++)
		((uint64_t *)data)[i] = (i + 1) * 0x9e3779b97f4a7c15ull;
	for (uint32_t l = 0; l < BENCH_LAYERS; l++)
		layers[l] = data + l * page;
	t0 = cli_now_s();
	for (uint64_t b = 0; b < blocks && !rc; b++) {
		int32_t tok[32] = { 0 };

		rc = kvmem_pager_append_tokens(p, tok, 32);
		if (!rc)
			rc = kvmem_pager_append_block(p, b, layers, NULL);
	}
	if (!rc)
		rc = kvmem_pager_commit(p, NULL, NULL, NULL, 0);
	res->out_bps = blocks * page * BENCH_LAYERS / (cli_now_s() - t0);
	free(data);
	return rc;
}

/* Page-in: every page once in random order, `batch` pages per fetch; the
 * pool holds two batches, so nothing is read from memory. Pipelined, the
 * next batch is prefetched before each fetch (a session's select-ahead
 * does that), so reads stay in flight between fetches; its pool holds
 * three batches. */
static int page_in(kvmem_pager *p, uint64_t page, uint64_t n_pages, int batch, int pipelined,
		   struct pager_result *res)
{
	uint64_t *order = bench_pager_order(n_pages);
	const void **ptr = malloc(batch * sizeof(*ptr));
	double t0;
	int rc = 0;

	if (!order || !ptr) {
		free(order);
		free(ptr);
		return -1;
	}
	t0 = cli_now_s();
	for (uint64_t i = 0; i < n_pages && !rc; i += batch) {
		size_t k = n_pages - i < (uint64_t)batch ? n_pages - i : (uint64_t)batch;

		if (pipelined && i + k < n_pages)
			kvmem_pager_prefetch(p, order + i + k, n_pages - i - k < (uint64_t)batch ?
					     n_pages - i - k : (uint64_t)batch);
		rc = kvmem_pager_fetch(p, order + i, k, ptr);
		if (!rc)
			kvmem_pager_release(p, order + i, k);
	}
	res->in_bps = n_pages * page / (cli_now_s() - t0);
	free(order);
	free(ptr);
	return rc;
}

/* --pager kmod: page in through the module; its counters, summed. */
static int g_kmod;
static struct kvmem_ioc_stats g_kst;

/* The page-in of phase 1 through the module (the pager is not open). */
static int run_kmod(const char *dir, uint64_t page, uint64_t n_pages, int batch,
		    struct pager_result *res)
{
	uint64_t *order = bench_pager_order(n_pages);
	struct kvmem_ioc_stats st;
	int rc;

	if (!order)
		return -1;
	rc = bench_kmod_page_in(dir, page, order, n_pages, batch, &res->in_bps, &st);
	free(order);
	if (rc < 0) {
		fprintf(stderr, "kvmem bench pager: --pager kmod: %s\n", kvmem_last_error());
		return -1;
	}
	g_kst.user_fills += st.user_fills;
	g_kst.fills += st.fills;
	g_kst.evictions += st.evictions;
	g_kst.read_errors += st.read_errors;
	g_kst.checksum_errors += st.checksum_errors;
	return 0;
}

/* phase 0: create the workspace in dir and stage out; 1: reopen, page in
 * (through the module with --pager kmod); 2: the same, pipelined. */
static int run_pager(const char *dir, uint64_t page, uint64_t size, int batch,
		     struct pager_result *res, int phase)
{
	kvmem_page_geom g = bench_geom(page);
	uint64_t blocks = size / (page * g.n_layers);
	kvmem_pager_opts o;
	kvmem_pager *p;
	int rc;

	if (blocks < 2) {
		fprintf(stderr, "kvmem bench pager: --size too small for %" PRIu64 " byte pages\n",
			page);
		return -1;
	}
	if (phase == 1 && g_kmod)
		return run_kmod(dir, page, blocks * g.n_layers, batch, res);
	pager_opts(&o, page, batch, phase ? 0 : KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP);
	/* Pipelined, a third fetch's room: LRU would take the prefetched
	 * pages, landed but not yet used, before the ones just released. */
	if (phase == 2)
		o.host_cap = (uint64_t)batch * page * 3;
	if (kvmem_pager_open(dir, &g, &o, &p) < 0) {
		fprintf(stderr, "kvmem bench pager: %s\n", kvmem_last_error());
		return -1;
	}
	rc = phase ? page_in(p, page, blocks * g.n_layers, batch, phase == 2, res)
		   : stage_out(p, page, blocks, res);
	if (rc < 0)
		fprintf(stderr, "kvmem bench pager: %s\n", kvmem_last_error());
	kvmem_pager_close(p);
	return rc;
}

/* ---- commit latency ---------------------------------------------------------- */
static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* A decode-like step committed `n` times: one token appended, the partial
 * block (every layer's page and its bytes) rewritten in the free tail
 * slot, the manifest replaced. p50 and p99 in seconds. */
static int commit_latency(const char *where, uint64_t page, int n, double *p50, double *p99)
{
	kvmem_page_geom g = bench_geom(page);
	uint64_t *ns = malloc(n * sizeof(*ns));
	uint8_t *data = calloc(BENCH_LAYERS, page);
	const void *layers[BENCH_LAYERS];
	kvmem_pager_opts o;
	kvmem_pager *p;
	int rc = 0;

	if (!ns || !data) {
		free(ns);
		free(data);
		return -1;
	}
	for (uint32_t l = 0; l < BENCH_LAYERS; l++)
		layers[l] = data + l * page;
	pager_opts(&o, page, 1, KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP);
	if (kvmem_pager_open(where, &g, &o, &p) < 0) {
		fprintf(stderr, "kvmem bench pager: %s\n", kvmem_last_error());
		free(ns);
		free(data);
		return -1;
	}
	for (int i = 0; i < n && !rc; i++) {
		int32_t tok = i;
		uint64_t t0;

		/* A full block stays out of the way: one token short of it. */
		if ((kvmem_pager_tokens(p) + 1) % g.block_tokens == 0) {
			rc = kvmem_pager_append_tokens(p, &tok, 1);
			if (!rc)
				rc = kvmem_pager_append_block(p, kvmem_pager_blocks(p), layers, NULL);
		}
		if (!rc)
			rc = kvmem_pager_append_tokens(p, &tok, 1);
		t0 = kvmem_now_ns();
		if (!rc)
			rc = kvmem_pager_commit(p, kvmem_pager_tokens(p) % g.block_tokens ? layers : NULL,
						NULL, NULL, 0);
		ns[i] = kvmem_now_ns() - t0;
	}
	if (rc < 0)
		fprintf(stderr, "kvmem bench pager: %s\n", kvmem_last_error());
	kvmem_pager_close(p);
	qsort(ns, n, sizeof(*ns), cmp_u64);
	*p50 = ns[n / 2] / 1e9;
	*p99 = ns[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] / 1e9;
	free(ns);
	free(data);
	return rc;
}

/* ---- rados bench beside a RADOS store --------------------------------------- */
#define RADOS_OBJ (4u << 20)
#define RADOS_QD 16

/* `rados bench` on pool (write leaves its objects for seq; seq reads them;
 * "cleanup" removes them): bytes/s from its "Bandwidth (MB/sec)" line, or
 * -1. The rados command reads CEPH_CONF and CEPH_ARGS as kvmem does. */
static double rados_bench(const char *pool, const char *mode, int secs)
{
	char cmd[1024], line[512];
	double mbs = -1;
	FILE *f;

	if (!strcmp(mode, "cleanup"))
		snprintf(cmd, sizeof(cmd), "rados -p '%s' cleanup --run-name kvmem-bench 2>&1", pool);
	else if (!strcmp(mode, "write"))
		snprintf(cmd, sizeof(cmd), "rados -p '%s' bench %d write -b %u -t %d --run-name "
			 "kvmem-bench --no-cleanup 2>&1", pool, secs, RADOS_OBJ, RADOS_QD);
	else
		snprintf(cmd, sizeof(cmd), "rados -p '%s' bench %d %s -t %d --run-name kvmem-bench 2>&1",
			 pool, secs, mode, RADOS_QD);
	if (!(f = popen(cmd, "r")))
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "Bandwidth (MB/sec):", 19))
			mbs = strtod(line + 19, NULL);
	if (pclose(f) != 0 && strcmp(mode, "cleanup"))
		return -1;
	return mbs < 0 ? -1 : mbs * (1 << 20);	/* rados bench's MB is 2^20 */
}

/* The RADOS store beside rados bench, page size by page size. */
static int bench_rados(const char *store, uint64_t size, const uint64_t *pages, int n_pages,
		       int batch, int rounds, int secs, const char *pages_arg)
{
	const char *pool = store + 8;
	int rc = 0;

	printf("cluster: %s, pool %s (CEPH_CONF=%s)\n", store, pool,
	       getenv("CEPH_CONF") ? getenv("CEPH_CONF") : "default");
	printf("command: kvmem bench pager --store %s --size %" PRIu64 "M --pages %s --batch %d "
	       "--rounds %d --rados-seconds %d\n", store, size >> 20, pages_arg, batch, rounds, secs);
	printf("\nEach figure is the median of %d rounds; a round runs, back to back, rados bench\n"
	       "write (%u MiB objects, %d in flight, %d s), the stage-out (appends then a commit:\n"
	       "durable when the clock stops), rados bench seq on what it wrote, and the page-in\n"
	       "(random pages, %d a fetch, through a host pool of two fetches), then the page-in\n"
	       "again with each next fetch's pages prefetched. %" PRIu64 " MiB per pager\n"
	       "measurement. MB/s are 10^6 bytes.\n\n", rounds, RADOS_OBJ >> 20, RADOS_QD,
	       secs, batch, size >> 20);
	printf("  %-8s  %9s %9s %6s    %9s %9s %6s   %9s %6s   %s\n", "page", "rados wr",
	       "stage-out", "ratio", "rados seq", "page-in", "ratio", "pipelined", "ratio", "MB/s");
	for (int pg = 0; pg < n_pages; pg++) {
		uint64_t page = pages[pg];
		double sw[16], so[16], sr[16], pi[16], pp[16], mw, mo, mr, mi, mp;
		int ok = 1;

		for (int r = 0; r < rounds && ok; r++) {
			struct pager_result pr = { 0 };
			char ws[512];

			snprintf(ws, sizeof(ws), "%s/kvmem-bench-%d-%" PRIu64 "-%d", store, (int)getpid(),
				 page, r);
			sw[r] = rados_bench(pool, "write", secs);
			ok = sw[r] > 0 && run_pager(ws, page, size, batch, &pr, 0) == 0;
			so[r] = pr.out_bps;
			sr[r] = ok ? rados_bench(pool, "seq", secs) : -1;
			rados_bench(pool, "cleanup", 0);
			ok = ok && sr[r] > 0 && run_pager(ws, page, size, batch, &pr, 1) == 0;
			pi[r] = pr.in_bps;
			ok = ok && run_pager(ws, page, size, batch, &pr, 2) == 0;
			pp[r] = pr.in_bps;
			ws_rados_destroy(ws);
		}
		if (!ok) {
			fprintf(stderr, "kvmem bench pager: a round failed (is the rados command there?)\n");
			rc = 1;
			continue;
		}
		mw = median(sw, rounds);
		mo = median(so, rounds);
		mr = median(sr, rounds);
		mi = median(pi, rounds);
		mp = median(pp, rounds);
		printf("  %5" PRIu64 " KiB  %9.1f %9.1f %6.2f %-3s %9.1f %9.1f %6.2f   %9.1f %6.2f %s\n",
		       page >> 10, mw / 1e6, mo / 1e6, mo / mw, mo >= 0.8 * mw ? "" : "LOW",
		       mr / 1e6, mi / 1e6, mi / mr, mp / 1e6, mp / mr, mp >= 0.8 * mr ? "" : "LOW");
	}
	printf("  (targets: ratio >= 0.8; page-in pipelined: the next fetch's pages prefetched)\n");
	return rc;
}

/* ---- replacement on a step sequence ---------------------------------------- */
static uint64_t xs(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/*
 * An agent-like sequence: the workspace grows by 8 blocks a step from 1000;
 * each step the selector takes 2 sink blocks, the 8 most recent and 40
 * scored ones drawn from 3 active topics of 50 blocks (Zipf-like within a
 * topic), the topics drifting every 12 steps; it hints 1 for chosen blocks
 * and 0.5 for 40 runners-up. 8 layers per block.
 */
static void hit_rates(void)
{
	enum { STEPS = 300, L = 8, START = 1000, GROW = 8, SINK = 2, RECENT = 8, TOP = 40,
	       TOPIC = 50, ACTIVE = 3 };
	size_t per = (SINK + RECENT + TOP) * L, nh = 2 * TOP;
	uint64_t *pages = malloc(STEPS * per * sizeof(*pages)), *hb = malloc(STEPS * nh * 8);
	float *hs = malloc(STEPS * nh * sizeof(float));
	size_t *off = malloc((STEPS + 1) * sizeof(size_t)), *hoff = malloc((STEPS + 1) * sizeof(size_t));
	uint64_t rng = 0x1234567, topics[ACTIVE] = { 0 }, final_blocks = START + GROW * STEPS;
	const double caps[] = { 0.05, 0.10, 0.25 };
	size_t n = 0, h = 0;

	for (int s = 0; s < STEPS; s++) {
		uint64_t blocks = START + GROW * s, n_topics = blocks / TOPIC;

		if (s % 12 == 0)
			for (int t = 0; t < ACTIVE; t++)
				topics[t] = xs(&rng) % n_topics;
		off[s] = n;
		hoff[s] = h;
		for (int i = 0; i < SINK + RECENT + TOP; i++) {
			uint64_t b;

			if (i < SINK) {
				b = i;
			} else if (i < SINK + RECENT) {
				b = blocks - 1 - (i - SINK);
			} else {
				/* Zipf-like rank inside a topic: rank^2 of a uniform. */
				double u = (double)(xs(&rng) % 1000000) / 1e6;

				b = topics[xs(&rng) % ACTIVE] * TOPIC + (uint64_t)(u * u * TOPIC);
				hb[h] = b;
				hs[h++] = 1.0f;
			}
			for (int l = 0; l < L; l++)
				pages[n++] = b * L + l;
		}
		for (int i = 0; i < TOP; i++) {
			hb[h] = topics[xs(&rng) % ACTIVE] * TOPIC + xs(&rng) % TOPIC;
			hs[h++] = 0.5f;
		}
	}
	off[STEPS] = n;
	hoff[STEPS] = h;
	kvmem_repl_trace t = { STEPS, off, pages, hoff, hb, hs };

	printf("\nhost hit rate per replacement policy (%d steps, %d..%" PRIu64 " blocks x %d "
	       "layers, %d blocks fetched a step)\n", STEPS, START, final_blocks, L,
	       SINK + RECENT + TOP);
	printf("  %-7s", "policy");
	for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++)
		printf("  cap %4.0f%%", caps[c] * 100);
	printf("\n");
	for (int i = 0; kvmem_repl_policies[i]; i++) {
		printf("  %-7s", kvmem_repl_policies[i]->name);
		for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
			uint32_t slots = caps[c] * final_blocks * L;

			if (slots < per)
				slots = per;
			printf("  %9.3f", kvmem_repl_simulate(kvmem_repl_policies[i], slots, L, &t, NULL,
							   NULL));
		}
		printf("\n");
	}
	free(pages);
	free(hb);
	free(hs);
	free(off);
	free(hoff);
}

int bench_pager(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dir", required_argument, NULL, 'd' },   { "size", required_argument, NULL, 's' },
		{ "pages", required_argument, NULL, 'p' }, { "batch", required_argument, NULL, 'b' },
		{ "rounds", required_argument, NULL, 'r' }, { "help", no_argument, NULL, 'h' },
		{ "store", required_argument, NULL, 'S' }, { "ceph-conf", required_argument, NULL, 'c' },
		{ "rados-seconds", required_argument, NULL, 'R' },
		{ "dtype", required_argument, NULL, 'D' },
		{ "pager", required_argument, NULL, 'P' },
		{ "no-hit-rates", no_argument, NULL, 'H' },
		{ 0 },
	};
	const char *store = NULL;
	int secs = 10;
	double c50, c99;
	const char *base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
	const char *w = "kvmem bench pager";
	char pages_arg[256] = "64k,128k,256k,1M,2M", dir[4096], *tok, *save;
	uint64_t size = 512ull << 20, pages[16];
	int batch = 64, rc = 0, n_pages = 0, c;
	int rounds = 3, no_hit = 0;

	cli_getopt_reset();
	while ((c = cli_getopt(w, argc, argv, opts)) != -1) {
		int bad = 0;

		switch (c) {
		case 'h': usage(stdout); return 0;
		case 'd': base = optarg; break;
		case 's': bad = cli_parse_size(w, cli_optname, optarg, 16u << 20, 1ull << 44, &size); break;
		case 'p':
			if (strlen(optarg) >= sizeof(pages_arg)) {
				fprintf(stderr, "%s: --pages: list too long\n", w);
				return EXIT_USAGE;
			}
			snprintf(pages_arg, sizeof(pages_arg), "%s", optarg);
			break;
		case 'b': bad = cli_parse_int(w, cli_optname, optarg, 1, 4096, &batch); break;
		case 'r': bad = cli_parse_int(w, cli_optname, optarg, 1, 16, &rounds); break;
		case 'R': bad = cli_parse_int(w, cli_optname, optarg, 1, 600, &secs); break;
		case 'c': cli_ceph_conf(optarg); break;
		case 'D':
			g_dtype = !strcmp(optarg, "f32") ? KVMEM_DTYPE_F32 :
				  !strcmp(optarg, "bf16") ? KVMEM_DTYPE_BF16 :
				  !strcmp(optarg, "fp8") ? KVMEM_DTYPE_FP8 : 0;
			if (!g_dtype) {
				fprintf(stderr, "%s: --dtype wants f32, bf16 or fp8, not '%s'\n", w, optarg);
				return EXIT_USAGE;
			}
			break;
		case 'H': no_hit = 1; break;
		case 'P':
			if (strcmp(optarg, "uring") && strcmp(optarg, "kmod")) {
				fprintf(stderr, "%s: --pager wants uring or kmod, not '%s'\n", w, optarg);
				return EXIT_USAGE;
			}
			g_kmod = !strcmp(optarg, "kmod");
			break;
		case 'S':
			if (strncmp(optarg, "rados://", 8) || !optarg[8] || strchr(optarg + 8, '/')) {
				fprintf(stderr, "%s: --store wants rados://POOL, not '%s'\n", w, optarg);
				return EXIT_USAGE;
			}
			store = optarg;
			break;
		default: return EXIT_USAGE;
		}
		if (bad)
			return EXIT_USAGE;
	}
	if (cli_no_operands(w, argc, argv))
		return EXIT_USAGE;
	{
		char list[256];

		snprintf(list, sizeof(list), "%s", pages_arg);
		for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
			if (n_pages == 16) {
				fprintf(stderr, "%s: --pages takes at most 16 sizes\n", w);
				return EXIT_USAGE;
			}
			if (cli_parse_size(w, "--pages", tok, 32 << 10, 1ull << 30, &pages[n_pages]))
				return EXIT_USAGE;
			if (pages[n_pages] % (2 * 32 * 128 * 4)) {
				fprintf(stderr, "%s: page size %s is not a multiple of 32 KiB\n", w, tok);
				return EXIT_USAGE;
			}
			/* The bytes a page of that many KV heads really takes (fp8:
			 * the scales too); bench_geom gives them the same heads. */
			{
				kvmem_page_geom g = bench_geom(pages[n_pages]);

				pages[n_pages] = kvmem_page_bytes(&g);
			}
			n_pages++;
		}
		if (!n_pages) {
			fprintf(stderr, "%s: --pages wants a list of sizes\n", w);
			return EXIT_USAGE;
		}
	}
	size = size / SEQ_REQ * SEQ_REQ;
	if (store && g_kmod) {
		fprintf(stderr, "%s: --pager kmod reads a workspace directory, not --store\n", w);
		return EXIT_USAGE;
	}
	if (g_kmod && (rc = kvmem_kmod_probe(NULL)) < 0) {
		fprintf(stderr, "%s: --pager kmod: %s\n", w, kvmem_last_error());
		return 1;
	}
	if (store) {
		char ws[512];

		print_machine("/");
		rc = bench_rados(store, size, pages, n_pages, batch, rounds, secs, pages_arg);
		snprintf(ws, sizeof(ws), "%s/kvmem-bench-%d-commit", store, (int)getpid());
		if (commit_latency(ws, pages[0], 100, &c50, &c99) == 0)
			printf("\ncommit latency (%" PRIu64 " KiB pages x %d layers, 1 token a commit, 100 "
			       "commits): p50 %.2f ms, p99 %.2f ms\n", pages[0] >> 10, BENCH_LAYERS,
			       c50 * 1e3, c99 * 1e3);
		else
			rc = 1;
		ws_rados_destroy(ws);
		if (!no_hit)
			hit_rates();
		return rc;
	}
	snprintf(dir, sizeof(dir), "%s/kvmem-bench.XXXXXX", base);
	if (!mkdtemp(dir)) {
		fprintf(stderr, "kvmem bench pager: cannot make a directory in %s: %s\n", base,
			strerror(errno));
		return 1;
	}
	{
		char real[4096];

		print_machine(realpath(dir, real) ? real : dir);
	}
	printf("command: kvmem bench pager --size %" PRIu64 "M --pages %s --batch %d --rounds %d "
	       "--dtype %s --pager %s\n", size >> 20, pages_arg, batch, rounds,
	       kvmem_dtype_name(g_dtype), g_kmod ? "kmod" : "uring");

	printf("\nEach figure is the median of %d rounds; a round runs, back to back, an O_DIRECT\n"
	       "sequential write of a new file (%u KiB requests, %d in flight), the stage-out,\n"
	       "an O_DIRECT sequential read of that file (same requests), and the page-in%s.\n"
	       "%" PRIu64 " MiB per measurement.\n\n", rounds, SEQ_REQ >> 10, SEQ_QD,
	       g_kmod ? "\nthrough the kernel module (kvmem.ko)" : "", size >> 20);
	printf("  %-8s  %9s %9s %6s    %9s %9s %6s   %s\n", "page", "seq write", "stage-out",
	       "ratio", "seq read", "page-in", "ratio", "MB/s");
	for (int pg = 0; pg < n_pages; pg++) {
		uint64_t page = pages[pg];
		double sw[16], so[16], sr[16], pi[16], mw, mo, mr, mi;
		char ws[4200], path[4200];
		int ok = 1;

		snprintf(ws, sizeof(ws), "%s/ws-%" PRIu64, dir, page);
		snprintf(path, sizeof(path), "%s/seq", dir);
		for (int r = 0; r < rounds && ok; r++) {
			struct pager_result pr = { 0 };

			sw[r] = seq_io(path, size, 1, SEQ_REQ, SEQ_QD, 0);
			ok = run_pager(ws, page, size, batch, &pr, 0) == 0 && sw[r] > 0;
			so[r] = pr.out_bps;
			sr[r] = seq_io(path, size, 0, SEQ_REQ, SEQ_QD, 0);
			ok = ok && sr[r] > 0 && run_pager(ws, page, size, batch, &pr, 1) == 0;
			pi[r] = pr.in_bps;
			unlink(path);
			nftw(ws, rm_one, 16, FTW_DEPTH | FTW_PHYS);
		}
		if (!ok) {
			rc = 1;
			continue;
		}
		mw = median(sw, rounds);
		mo = median(so, rounds);
		mr = median(sr, rounds);
		mi = median(pi, rounds);
		printf("  %5" PRIu64 " KiB  %9.1f %9.1f %6.2f %-3s %9.1f %9.1f %6.2f %s\n",
		       page >> 10, mw / 1e6, mo / 1e6, mo / mw, mo >= 0.9 * mw ? "" : "LOW",
		       mr / 1e6, mi / 1e6, mi / mr,
		       page < (128u << 10) || mi >= 0.9 * mr ? "" : "LOW");
	}
	printf("  (targets: ratio >= 0.9; for page-in with pages of 128 KiB and more)\n");
	if (g_kmod)
		printf("kernel module: %llu pages filled by O_DIRECT into its window, %llu read by "
		       "the module (page-cache copies), %llu evictions, %llu read errors, %llu "
		       "checksum errors\n", (unsigned long long)g_kst.user_fills,
		       (unsigned long long)g_kst.fills, (unsigned long long)g_kst.evictions,
		       (unsigned long long)g_kst.read_errors,
		       (unsigned long long)g_kst.checksum_errors);
	{
		char ws[4200];

		snprintf(ws, sizeof(ws), "%s/commit", dir);
		if (commit_latency(ws, pages[0], 100, &c50, &c99) == 0)
			printf("\ncommit latency (%" PRIu64 " KiB pages x %d layers, 1 token a commit, 100 "
			       "commits): p50 %.2f ms, p99 %.2f ms\n", pages[0] >> 10, BENCH_LAYERS,
			       c50 * 1e3, c99 * 1e3);
		else
			rc = 1;
		nftw(ws, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	}
	rmdir(dir);
	if (!no_hit)
		hit_rates();
	return rc;
}
