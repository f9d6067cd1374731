/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers the VM selftests share: a scratch copy of a generated workspace,
 * touches that survive SIGBUS, counters from the module and the kernel.
 * Each kselftest TEST runs in its own child, so the globals here are per
 * test.
 */
#ifndef KVMEM_VMTEST_H
#define KVMEM_VMTEST_H

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "../../kmod/kvmem_xxh3.h"
#include "kvmem/store.h"

#define VT_DEV "/dev/kvmem"

/* The workspaces tests/vm/run.sh generates with the real pager. */
#define VT_WS_SMALL "/data/ws-small"	/* 4 layers, page 4096 = stride */
#define VT_WS_WIDE "/data/ws-wide"	/* 2 layers, page 10240, stride 12288 */

struct vt_ws {
	char dir[64];
	int pages_fd, sums_fd;
	uint32_t page_bytes, page_stride, n_layers;
	uint64_t pages;
	unsigned char *ref;	/* the pages file as generated */
	uint64_t *sums;		/* per page, from the sums file */
};

static inline int vt_copy(const char *from, const char *to)
{
	char buf[65536];
	int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ssize_t n = 0;

	if (in < 0 || out < 0)
		return -1;
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, n) != n)
			n = -1;
	close(in);
	close(out);
	return n < 0 ? -1 : 0;
}

static inline int vt_pread_all(int fd, void *buf, size_t len, off_t off)
{
	return pread(fd, buf, len, off) == (ssize_t)len ? 0 : -1;
}

/* A private copy of a generated workspace (tests may damage it), in a new
 * directory under parent. */
static inline int vt_ws_open_at(struct vt_ws *w, const char *src, const char *parent)
{
	static const char *const files[] = { "manifest", "pages", "sums", "tokens", "index",
					     "tail" };
	kvmem_workspace_info wi;
	char a[128], b[128];
	unsigned char *raw;

	memset(w, 0, sizeof(*w));
	snprintf(w->dir, sizeof(w->dir), "%s/ws.XXXXXX", parent);
	if (!mkdtemp(w->dir))
		return -1;
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(a, sizeof(a), "%s/%s", src, files[i]);
		snprintf(b, sizeof(b), "%s/%s", w->dir, files[i]);
		if (vt_copy(a, b))
			return -1;
	}
	if (kvmem_workspace_info_read(w->dir, &wi) < 0)
		return -1;
	w->page_bytes = wi.page_bytes;
	w->page_stride = wi.page_stride;
	w->n_layers = wi.geom.n_layers;
	w->pages = wi.blocks * wi.geom.n_layers;
	snprintf(a, sizeof(a), "%s/pages", w->dir);
	w->pages_fd = open(a, O_RDWR);
	snprintf(a, sizeof(a), "%s/sums", w->dir);
	w->sums_fd = open(a, O_RDWR);
	if (w->pages_fd < 0 || w->sums_fd < 0)
		return -1;
	w->ref = malloc(w->pages * w->page_stride);
	w->sums = malloc(w->pages * 8);
	raw = malloc(wi.blocks * (w->n_layers + 1) * 8);
	if (!w->ref || !w->sums || !raw ||
	    vt_pread_all(w->pages_fd, w->ref, w->pages * w->page_stride, 0) ||
	    vt_pread_all(w->sums_fd, raw, wi.blocks * (w->n_layers + 1) * 8, 0))
		return -1;
	for (uint64_t p = 0; p < w->pages; p++)
		memcpy(&w->sums[p], raw + ((p / w->n_layers) * (w->n_layers + 1) +
					   p % w->n_layers) * 8, 8);
	free(raw);
	return 0;
}

static inline int vt_ws_open(struct vt_ws *w, const char *src)
{
	return vt_ws_open_at(w, src, "/tmp");
}

static inline void vt_ws_close(struct vt_ws *w)
{
	char cmd[160];

	if (w->pages_fd > 0)
		close(w->pages_fd);
	if (w->sums_fd > 0)
		close(w->sums_fd);
	free(w->ref);
	free(w->sums);
	if (w->dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf %s", w->dir);
		if (system(cmd))
			fprintf(stderr, "cannot remove %s\n", w->dir);
	}
}

static inline kvmem_kmod_files vt_files(const struct vt_ws *w)
{
	kvmem_kmod_files f = {
		.pages_fd = w->pages_fd, .sums_fd = w->sums_fd, .page_bytes = w->page_bytes,
		.page_stride = w->page_stride, .n_layers = w->n_layers, .page_count = w->pages,
	};
	return f;
}

/* Open the module over w with a window of cap_pages pages. */
static inline kvmem_kmod *vt_kmod(const struct vt_ws *w, uint64_t cap_pages)
{
	kvmem_kmod_files f = vt_files(w);
	kvmem_kmod_opts o;
	kvmem_kmod *k = NULL;

	kvmem_kmod_opts_default(&o);
	o.host_cap = cap_pages * w->page_stride;
	if (kvmem_kmod_open(&f, &o, &k) < 0)
		fprintf(stderr, "# %s\n", kvmem_last_error());
	return k;
}

/* ---- touches that report SIGBUS instead of dying ------------------------ */
/* Per thread: SIGBUS goes to the thread that touched. */
static __thread sigjmp_buf vt_jmp;
static __thread void *volatile vt_bus_addr;

static void vt_on_bus(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	vt_bus_addr = si->si_addr;
	siglongjmp(vt_jmp, 1);
}

static inline void vt_catch_bus(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = vt_on_bus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigaction(SIGBUS, &sa, NULL);
}

/* Copy len bytes out of the window; -1 when the access raised SIGBUS. */
static inline int vt_read(const void *src, void *dst, size_t len)
{
	vt_catch_bus();
	vt_bus_addr = NULL;
	if (sigsetjmp(vt_jmp, 1))
		return -1;
	memcpy(dst, src, len);
	return 0;
}

static inline int vt_write(void *dst, const void *src, size_t len)
{
	vt_catch_bus();
	vt_bus_addr = NULL;
	if (sigsetjmp(vt_jmp, 1))
		return -1;
	memcpy(dst, src, len);
	return 0;
}

/* ---- scratch file systems and tasks -------------------------------------- */

/* An ext2 file system of size_mb MiB on a loop device of its own, mounted at
 * mnt (its image beside it, mnt.img, on the root tmpfs): for tests that
 * freeze the file system or change its files' attributes. */
static inline int vt_loopfs_mount(const char *mnt, int size_mb)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "set -e; mkdir -p %s; rm -f %s.img; truncate -s %dM %s.img; "
		 "dev=$(losetup -f); losetup $dev %s.img; mke2fs -q -b 4096 $dev >/dev/null; "
		 "mount -t ext4 $dev %s", mnt, mnt, size_mb, mnt, mnt, mnt);
	return system(cmd) == 0 ? 0 : -1;
}

static inline void vt_loopfs_umount(const char *mnt)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "dev=$(awk '$2 == \"%s\" { print $1 }' /proc/mounts); "
		 "umount %s && losetup -d $dev; rm -f %s.img", mnt, mnt, mnt);
	if (system(cmd))
		fprintf(stderr, "# cannot unmount %s\n", mnt);
}

/* The state letter of a task (R, S, D, ...), 0 when it is gone. */
static inline char vt_task_state(pid_t tid)
{
	char path[64], buf[512], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)tid);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : 0;
}

/* Wait (up to `seconds`) until every task of tids[] has been asleep (S or
 * D) at three checks 50 ms apart: they sit in the waits a test set up.
 * 0, or -1 on the time limit. */
static inline int vt_tasks_asleep(const pid_t *tids, int n, int seconds)
{
	int calm = 0;

	for (int i = 0; i < seconds * 20; i++) {
		int asleep = 1;

		for (int t = 0; t < n; t++) {
			char st = vt_task_state(tids[t]);

			asleep &= st == 'S' || st == 'D';
		}
		calm = asleep ? calm + 1 : 0;
		if (calm >= 3)
			return 0;
		usleep(50000);
	}
	return -1;
}

/* ---- counters ------------------------------------------------------------ */
static inline long vt_majflt(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_majflt;
}

static inline struct kvmem_ioc_stats vt_stats(kvmem_kmod *k)
{
	struct kvmem_ioc_stats st;

	memset(&st, 0xff, sizeof(st));
	kvmem_kmod_stats(k, &st);
	return st;
}

/* ---- tracefs ------------------------------------------------------------- */
/* Switch the kvmem trace event ev on or off; 0, or -1 when the write fails. */
static inline int vt_event_enable(const char *ev, int on)
{
	char path[160];
	int fd, ok;

	snprintf(path, sizeof(path), "/sys/kernel/tracing/events/kvmem/%s/enable", ev);
	fd = open(path, O_WRONLY);
	if (fd < 0)
		return -1;
	ok = write(fd, on ? "1" : "0", 1) == 1;
	close(fd);
	return ok ? 0 : -1;
}

/* Empty the trace buffer. */
static inline void vt_trace_clear(void)
{
	int fd = open("/sys/kernel/tracing/trace", O_WRONLY | O_TRUNC);

	if (fd >= 0)
		close(fd);
}

/* The trace buffer's first cap - 1 bytes, NUL-terminated; their count,
 * or -1. */
static inline ssize_t vt_trace_read(char *buf, size_t cap)
{
	int fd = open("/sys/kernel/tracing/trace", O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, cap - 1);
	close(fd);
	buf[n > 0 ? n : 0] = 0;
	return n;
}

/* A module parameter (read-only counters live there too); -1 if absent. */
static inline long vt_param(const char *name)
{
	char path[128];
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/module/kvmem/parameters/%s", name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%ld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

/* The debug kernel of make vmtest-debug (booted with kmemleak=on). */
static inline int vt_debug_kernel(void)
{
	char line[1024] = "";
	FILE *f = fopen("/proc/cmdline", "r");

	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
	}
	return strstr(line, "kmemleak=on") != NULL;
}

/* A /proc/meminfo field in KiB. */
static inline long vt_meminfo(const char *field)
{
	char line[256];
	size_t n = strlen(field);
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':')
			v = strtol(line + n + 1, NULL, 10);
	fclose(f);
	return v;
}

static inline uint64_t vt_rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* KVMEM_TEST_SEED, else the clock; printed so a failure can be replayed. */
static inline uint64_t vt_seed(const char *what)
{
	const char *env = getenv("KVMEM_TEST_SEED");
	struct timespec ts;
	uint64_t seed;

	clock_gettime(CLOCK_REALTIME, &ts);
	seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)ts.tv_sec * 1000003u + ts.tv_nsec;
	printf("# %s: seed %llu (replay with KVMEM_TEST_SEED=%llu)\n", what,
	       (unsigned long long)seed, (unsigned long long)seed);
	return seed;
}

#endif
