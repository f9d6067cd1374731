// SPDX-License-Identifier: GPL-2.0
/*
 * The kernel memory kvmem.ko allocates for a workspace is charged and
 * capped: the window's pages (filled by a fault or by the prefetch worker)
 * and the table count in the memory cgroup of the process that set the
 * workspace up, so a cgroup limit bounds them (fills past it fail, no OOM
 * kill); and the module's own cap (parameter max_memory) bounds what all
 * workspaces together may reserve (host_cap plus table and page states).
 *
 * The workspaces here are sparse files on tmpfs (1 MiB pages of zeros: a
 * hole reads as zeros and costs no memory), so the window's memory is the
 * only memory that grows.
 */
#include <sys/mount.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "vmtest.h"

#define CG "/sys/fs/cgroup"
#define MIB (1u << 20)

struct sparse_ws {
	char dir[64];
	kvmem_kmod_files f;
};

/* n pages of 1 MiB zeros, n_layers 1, and their sums. */
static int sparse_ws_make(struct sparse_ws *s, uint64_t n)
{
	unsigned char *zero = calloc(1, MIB);
	uint64_t sum, *sums = calloc(2 * n, 8);
	char path[96];
	int ok;

	snprintf(s->dir, sizeof(s->dir), "/tmp/sparse.XXXXXX");
	if (!zero || !sums || !mkdtemp(s->dir))
		return -1;
	sum = kvmem_xxh3_64(zero, MIB);
	for (uint64_t p = 0; p < n; p++)
		sums[2 * p] = sum;	/* per block: L = 1 page sum, then the index sum */
	snprintf(path, sizeof(path), "%s/pages", s->dir);
	s->f.pages_fd = open(path, O_RDWR | O_CREAT, 0600);
	snprintf(path, sizeof(path), "%s/sums", s->dir);
	s->f.sums_fd = open(path, O_RDWR | O_CREAT, 0600);
	ok = s->f.pages_fd >= 0 && s->f.sums_fd >= 0 && !ftruncate(s->f.pages_fd, n * MIB) &&
	     pwrite(s->f.sums_fd, sums, 2 * n * 8, 0) == (ssize_t)(2 * n * 8);
	s->f.page_bytes = MIB;
	s->f.page_stride = MIB;
	s->f.n_layers = 1;
	s->f.page_count = n;
	free(zero);
	free(sums);
	return ok ? 0 : -1;
}

static void sparse_ws_drop(struct sparse_ws *s)
{
	char cmd[96];

	close(s->f.pages_fd);
	close(s->f.sums_fd);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", s->dir);
	if (system(cmd))
		fprintf(stderr, "# cannot remove %s\n", s->dir);
}

static kvmem_kmod *sparse_open(struct sparse_ws *s, uint64_t cap_pages)
{
	kvmem_kmod_opts o;
	kvmem_kmod *k = NULL;

	kvmem_kmod_opts_default(&o);
	o.host_cap = cap_pages * MIB;
	if (kvmem_kmod_open(&s->f, &o, &k) < 0)
		fprintf(stderr, "# %s\n", kvmem_last_error());
	return k;
}

/* ---- memory cgroups ------------------------------------------------------ */

static int put_str(const char *path, const char *v)
{
	int fd = open(path, O_WRONLY), ok;

	if (fd < 0)
		return -1;
	ok = write(fd, v, strlen(v)) == (ssize_t)strlen(v);
	close(fd);
	return ok ? 0 : -1;
}

static long get_long(const char *path, const char *key)
{
	char buf[4096], *p;
	ssize_t n;
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	if (!key)
		return strtol(buf, NULL, 10);
	for (p = buf; p; p = strchr(p, '\n')) {
		p += *p == '\n';
		if (!strncmp(p, key, strlen(key)) && p[strlen(key)] == ' ')
			return strtol(p + strlen(key) + 1, NULL, 10);
	}
	return -1;
}

/* A fresh child cgroup of the root with the memory controller. */
static int cg_make(char *path, size_t len, const char *name)
{
	mkdir(CG, 0755);
	if (mount("none", CG, "cgroup2", 0, NULL) && errno != EBUSY)
		return -1;
	if (put_str(CG "/cgroup.subtree_control", "+memory"))
		return -1;
	snprintf(path, len, CG "/%s", name);
	rmdir(path);
	return mkdir(path, 0755);
}

static long cg_get(const char *cg, const char *file, const char *key)
{
	char path[160];

	snprintf(path, sizeof(path), "%s/%s", cg, file);
	return get_long(path, key);
}

static int cg_set(const char *cg, const char *file, long v)
{
	char path[160], val[32];

	snprintf(path, sizeof(path), "%s/%s", cg, file);
	snprintf(val, sizeof(val), "%ld", v);
	return put_str(path, val);
}

/* The child and the parent take turns over two pipes. */
struct turns {
	int up[2], down[2];
};

static void turn_give(int fd, long v)
{
	if (write(fd, &v, sizeof(v)) != sizeof(v))
		_exit(90);
}

static long turn_take(int fd)
{
	long v = -1;

	if (read(fd, &v, sizeof(v)) != sizeof(v))
		return -1;
	return v;
}

/* One memcg charge batch (64 pages) per online CPU: what memory.current
 * may lag the charges by (see below). */
static long batch_slack(void)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	return (cpus > 0 ? cpus : 1) * 64 * sysconf(_SC_PAGESIZE);
}

/*
 * The window's memory is charged to the cgroup of the process that set the
 * workspace up, whether its own faults or the module's prefetch worker
 * filled it: memory.current grows by the window, less at most one charge
 * batch a CPU.
 */
TEST(window_memory_is_charged_to_its_cgroup)
{
	char cg[96];
	struct sparse_ws s;
	uint64_t n = 8;

	ASSERT_EQ(0, sparse_ws_make(&s, n));
	for (int by_prefetch = 0; by_prefetch < 2; by_prefetch++) {
		struct turns t;
		long base, now;
		int status;
		pid_t pid;

		ASSERT_EQ(0, cg_make(cg, sizeof(cg), "kvmem-charge"));
		ASSERT_EQ(0, pipe(t.up));
		ASSERT_EQ(0, pipe(t.down));
		pid = fork();
		if (pid == 0) {
			char procs[128];
			kvmem_kmod *k;
			int bad = 0;

			snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg);
			if (put_str(procs, "0"))
				_exit(10);
			turn_give(t.up[1], 0);
			turn_take(t.down[0]);
			k = sparse_open(&s, n);
			if (!k)
				_exit(11);
			for (uint64_t p = 0; p < n; p++) {
				unsigned char b;

				if (by_prefetch)
					bad += kvmem_kmod_prefetch(k, &p, 1, 1) != 0 ||
					       !kvmem_kmod_resident(k, p);
				else
					bad += vt_read(kvmem_kmod_page_addr(k, p), &b, 1) != 0;
			}
			turn_give(t.up[1], bad);
			turn_take(t.down[0]);
			kvmem_kmod_close(k);
			_exit(0);
		}
		ASSERT_EQ(0, turn_take(t.up[0]));
		base = cg_get(cg, "memory.current", NULL);
		turn_give(t.down[1], 0);
		ASSERT_EQ(0, turn_take(t.up[0]));	/* every page resident */
		now = cg_get(cg, "memory.current", NULL);
		turn_give(t.down[1], 0);
		ASSERT_EQ(pid, waitpid(pid, &status, 0));
		ASSERT_EQ(0, WEXITSTATUS(status));
		TH_LOG("%s: memory.current %ld -> %ld bytes for a window of %llu MiB",
		       by_prefetch ? "prefetch" : "faults", base, now, (unsigned long long)n);
		/* memory.current moves in batches: a charge takes 64 pages
		 * (MEMCG_CHARGE_BATCH) from the counter at once and keeps what
		 * it did not use in a per-CPU stock, which later charges on that
		 * CPU spend without moving the counter. base can hold such a
		 * stock (262144 bytes, 64 pages, when the fills then ran on its
		 * CPU: 8,167,424 bytes more for the 8 MiB, 2026-12-03), so the
		 * window may show up to one batch a CPU short of its size. */
		ASSERT_GE(now - base, (long)(n * MIB) - batch_slack());
		ASSERT_EQ(0, vt_param("pages"));
		for (int i = 0; i < 2; i++) {
			close(t.up[i]);
			close(t.down[i]);
		}
		ASSERT_EQ(0, rmdir(cg));
	}
	sparse_ws_drop(&s);
}

/*
 * A cgroup allowed 5.5 MiB more than the process already uses, a window
 * that could hold 48 MiB: about five pages fill, the rest are SIGBUS (the
 * fills fail, nobody is OOM-killed), and the cgroup never went past its
 * limit.
 */
TEST(a_cgroup_limit_bounds_the_window)
{
	char cg[96];
	struct sparse_ws s;
	struct turns t;
	uint64_t n = 48;
	long base, got, peak;
	int status;
	pid_t pid;

	ASSERT_EQ(0, sparse_ws_make(&s, n));
	ASSERT_EQ(0, cg_make(cg, sizeof(cg), "kvmem-limit"));
	ASSERT_EQ(0, pipe(t.up));
	ASSERT_EQ(0, pipe(t.down));
	pid = fork();
	if (pid == 0) {
		char procs[128];
		kvmem_kmod *k;
		long ok = 0;

		snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg);
		if (put_str(procs, "0"))
			_exit(10);
		k = sparse_open(&s, n);
		if (!k)
			_exit(11);
		turn_give(t.up[1], 0);
		turn_take(t.down[0]);
		for (uint64_t p = 0; p < n; p++) {
			unsigned char b;

			ok += vt_read(kvmem_kmod_page_addr(k, p), &b, 1) == 0;
		}
		turn_give(t.up[1], ok);
		kvmem_kmod_close(k);
		_exit(0);
	}
	ASSERT_EQ(0, turn_take(t.up[0]));
	base = cg_get(cg, "memory.current", NULL);
	ASSERT_EQ(0, cg_set(cg, "memory.max", base + 11 * MIB / 2));
	turn_give(t.down[1], 0);
	got = turn_take(t.up[0]);
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	peak = cg_get(cg, "memory.peak", NULL);
	TH_LOG("%ld of %llu pages of 1 MiB filled under a limit of %ld + 5.5 MiB; peak %ld",
	       got, (unsigned long long)n, base, peak);
	ASSERT_TRUE(WIFEXITED(status)) TH_LOG("the child was killed (signal %d)", WTERMSIG(status));
	ASSERT_EQ(0, WEXITSTATUS(status));
	ASSERT_GE(got, 3);
	ASSERT_LE(got, 6);
	ASSERT_LE(peak, base + 11 * MIB / 2);
	ASSERT_EQ(0, cg_get(cg, "memory.events", "oom_kill"));
	ASSERT_EQ(0, vt_param("pages"));
	ASSERT_EQ(0, rmdir(cg));
	sparse_ws_drop(&s);
}

/* ---- the module's own cap ------------------------------------------------ */

static int set_param(const char *name, long v)
{
	char path[128], val[32];

	snprintf(path, sizeof(path), "/sys/module/kvmem/parameters/%s", name);
	snprintf(val, sizeof(val), "%ld", v);
	return put_str(path, val);
}

/*
 * max_memory bounds the sum over all workspaces of host_cap plus table and
 * page states: one workspace that alone exceeds it is EINVAL, one that
 * fits alone but not beside the others is ENOMEM until they close;
 * `reserved` says how much is taken and goes back to 0.
 */
TEST(module_cap_bounds_all_workspaces)
{
	long old = vt_param("max_memory");
	struct sparse_ws s;
	kvmem_kmod *a, *b;

	ASSERT_GT(old, 0) TH_LOG("no max_memory parameter");
	ASSERT_EQ(0, vt_param("reserved"));
	/* At most half of RAM by default. */
	ASSERT_LE(old, vt_meminfo("MemTotal") * 1024 / 2 + 4096);
	ASSERT_EQ(0, sparse_ws_make(&s, 16));
	ASSERT_EQ(0, set_param("max_memory", 8 * MIB));
	ASSERT_EQ(NULL, sparse_open(&s, 9));
	ASSERT_EQ(EINVAL, kvmem_last_errno());
	a = sparse_open(&s, 5);
	ASSERT_NE(NULL, a);
	ASSERT_GE(vt_param("reserved"), 5 * MIB);
	ASSERT_EQ(NULL, sparse_open(&s, 5));
	ASSERT_EQ(ENOMEM, kvmem_last_errno());
	b = sparse_open(&s, 2);
	ASSERT_NE(NULL, b);
	kvmem_kmod_close(a);
	a = sparse_open(&s, 5);
	ASSERT_NE(NULL, a);
	kvmem_kmod_close(a);
	kvmem_kmod_close(b);
	ASSERT_EQ(0, vt_param("reserved"));
	ASSERT_EQ(0, set_param("max_memory", old));
	/* Above RAM: refused. */
	ASSERT_NE(0, set_param("max_memory", vt_meminfo("MemTotal") * 2048));
	ASSERT_EQ(old, vt_param("max_memory"));
	sparse_ws_drop(&s);
}

TEST_HARNESS_MAIN
