// SPDX-License-Identifier: GPL-2.0
/*
 * kvmem.ko and the others who hold its pages or wait on its faults:
 *  - a writer holding a window page by a plain reference (here an O_DIRECT
 *    read into the window from a device-mapper target that was suspended,
 *    so the read waits, the page held, until the target resumes): the page
 *    is not evicted, and a write-back while it is held leaves it DIRTY, so
 *    the bytes that land later reach the file;
 *  - a fill of a 64 MiB page allocates its memory without the workspace's
 *    lock, and the fault that fills it (a long read and checksum) does not
 *    hold the process's mmap lock: another thread's STATS, and its mmap,
 *    go through while the fill is still under way.
 */
#include <linux/dm-ioctl.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>

#include "kselftest_harness.h"
#include "vmtest.h"

static pid_t gettid_(void)
{
	return (pid_t)syscall(SYS_gettid);
}

/* ---- device mapper, the few calls needed -------------------------------- */

struct dm_req {
	struct dm_ioctl io;
	char data[512];
};

static int dm_call(int ctl, unsigned long cmd, const char *name, uint32_t flags,
		   const char *linear, uint64_t sectors, uint64_t *dev)
{
	struct dm_req r;

	memset(&r, 0, sizeof(r));
	r.io.version[0] = DM_VERSION_MAJOR;
	r.io.data_size = sizeof(r);
	r.io.data_start = offsetof(struct dm_req, data);
	r.io.flags = flags;
	snprintf(r.io.name, sizeof(r.io.name), "%s", name);
	if (linear) {
		struct dm_target_spec *sp = (struct dm_target_spec *)r.data;

		sp->length = sectors;
		snprintf(sp->target_type, sizeof(sp->target_type), "linear");
		snprintf((char *)(sp + 1), sizeof(r.data) - sizeof(*sp), "%s", linear);
		r.io.target_count = 1;
	}
	if (ioctl(ctl, cmd, &r) < 0)
		return -errno;
	if (dev)
		*dev = r.io.dev;
	return 0;
}

struct held_read {
	int fd;
	void *dst;
	volatile pid_t tid;
	ssize_t n;
};

static void *held_reader(void *arg)
{
	struct held_read *h = arg;

	h->tid = gettid_();
	h->n = pread(h->fd, h->dst, 4096, 0);
	return NULL;
}


/* The dm device of a case, resumed and removed whatever the case did (a
 * read left waiting in a suspended target would never let the test end);
 * also a longer timeout than TEST's 30 s (6.1's harness has no
 * TEST_TIMEOUT). */
FIXTURE(slow) {
	int dm_ctl;
	const char *dm_name;
};

FIXTURE_SETUP(slow)
{
	self->dm_ctl = -1;
}

FIXTURE_TEARDOWN(slow)
{
	if (self->dm_ctl >= 0) {
		dm_call(self->dm_ctl, DM_DEV_SUSPEND, self->dm_name, 0, NULL, 0, NULL);
		close(self->dm_ctl);
	}
}

/*
 * Page 0 is resident and clean. An O_DIRECT read into it waits in a
 * suspended dm-linear target: the bio holds the page by plain references
 * (get_user_pages, not FOLL_PIN, on 6.1), and the write fault it took on the
 * way marked the page DIRTY. While it waits: EVICT says EBUSY, SYNC writes
 * the page but leaves it DIRTY. Once the target resumes, the new bytes are
 * in the window, and the next SYNC puts them in the file.
 */
TEST_F_TIMEOUT(slow, held_page_stays_dirty_and_resident, 120)
{
	const char *img = "/tmp/dmsrc.img", *name = "kvmem-held";
	unsigned char want[4096], got[4096];
	char table[64], loopdev[32], node[32], cmd[160];
	struct held_read h;
	struct stat lst;
	struct vt_ws w;
	pthread_t tid;
	kvmem_kmod *k;
	uint64_t dev, id0 = 0, sum;
	int32_t st;
	int ctl, src, fd;
	FILE *p;

	ctl = open("/dev/mapper/control", O_RDWR);
	if (ctl < 0)
		SKIP(return, "no device mapper (dm-mod) in this kernel");
	self->dm_ctl = ctl;
	self->dm_name = name;
	for (int i = 0; i < 4096; i++)
		want[i] = (unsigned char)(i * 7 + 1);
	src = open(img, O_RDWR | O_CREAT | O_TRUNC, 0600);
	ASSERT_LE(0, src);
	ASSERT_EQ(4096, pwrite(src, want, 4096, 0));
	ASSERT_EQ(0, ftruncate(src, 1 << 20));
	close(src);
	snprintf(cmd, sizeof(cmd), "dev=$(losetup -f) && losetup $dev %s && echo $dev", img);
	p = popen(cmd, "r");
	ASSERT_NE(NULL, p);
	ASSERT_NE(NULL, fgets(loopdev, sizeof(loopdev), p));
	pclose(p);
	loopdev[strcspn(loopdev, "\n")] = 0;
	ASSERT_EQ(0, stat(loopdev, &lst));
	snprintf(table, sizeof(table), "%u:%u 0", major(lst.st_rdev), minor(lst.st_rdev));
	dm_call(ctl, DM_DEV_REMOVE, name, 0, NULL, 0, NULL);
	ASSERT_EQ(0, dm_call(ctl, DM_DEV_CREATE, name, 0, NULL, 0, &dev));
	ASSERT_EQ(0, dm_call(ctl, DM_TABLE_LOAD, name, 0, table, 2048, NULL));
	ASSERT_EQ(0, dm_call(ctl, DM_DEV_SUSPEND, name, 0, NULL, 0, NULL));	/* resume */
	snprintf(node, sizeof(node), "/dev/dm-%u", (unsigned)((dev & 0xff) | ((dev >> 12) & 0xfff00)));
	fd = open(node, O_RDONLY | O_DIRECT);
	ASSERT_LE(0, fd) TH_LOG("%s: %s", node, strerror(errno));

	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));
	k = vt_kmod(&w, 8);
	ASSERT_NE(NULL, k);
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, 0), got, 4096));
	ASSERT_EQ(0, kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_DIRTY);

	ASSERT_EQ(0, dm_call(ctl, DM_DEV_SUSPEND, name, DM_SUSPEND_FLAG, NULL, 0, NULL));
	h = (struct held_read){ .fd = fd, .dst = kvmem_kmod_page_addr(k, 0) };
	pthread_create(&tid, NULL, held_reader, &h);
	while (!h.tid)
		usleep(1000);
	ASSERT_EQ(0, vt_tasks_asleep((pid_t *)&h.tid, 1, 20));
	ASSERT_EQ(KVMEM_PTE_DIRTY, kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_DIRTY);
	/* Held: not evicted, and a write-back leaves it dirty. */
	ASSERT_EQ(-EBUSY, kvmem_kmod_evict(k, &id0, 1, &st));
	ASSERT_EQ(-EBUSY, st);
	ASSERT_TRUE(kvmem_kmod_resident(k, 0));
	ASSERT_EQ(0, kvmem_kmod_sync(k));
	ASSERT_EQ(KVMEM_PTE_DIRTY, kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_DIRTY)
		TH_LOG("a write-back cleaned a page a writer still holds");
	/* Reclaim passes it by too: eight other pages through a window of 8. */
	for (uint64_t q = 1; q <= 8; q++)
		ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, q), got, 1));
	ASSERT_TRUE(kvmem_kmod_resident(k, 0));

	ASSERT_EQ(0, dm_call(ctl, DM_DEV_SUSPEND, name, 0, NULL, 0, NULL));
	pthread_join(tid, NULL);
	ASSERT_EQ(4096, h.n);
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, 0), got, 4096));
	ASSERT_EQ(0, memcmp(got, want, 4096));
	ASSERT_EQ(0, kvmem_kmod_sync(k));
	ASSERT_EQ(0, kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_DIRTY);
	ASSERT_EQ(0, vt_pread_all(w.pages_fd, got, 4096, 0));
	ASSERT_EQ(0, memcmp(got, want, 4096)) TH_LOG("the held writer's bytes were lost");
	ASSERT_EQ(8, pread(w.sums_fd, &sum, 8, 0));
	ASSERT_EQ(kvmem_xxh3_64(want, w.page_bytes), sum);
	ASSERT_EQ(0, kvmem_kmod_evict(k, &id0, 1, &st));

	kvmem_kmod_close(k);
	vt_ws_close(&w);
	close(fd);
	ASSERT_EQ(0, dm_call(ctl, DM_DEV_REMOVE, name, 0, NULL, 0, NULL));
	self->dm_ctl = -1;
	close(ctl);
	snprintf(cmd, sizeof(cmd), "losetup -d %s && rm -f %s", loopdev, img);
	ASSERT_EQ(0, system(cmd));
}

/* ---- the mmap lock during a fill ----------------------------------------- */

#define BIG (64u << 20)

struct toucher {
	kvmem_kmod *k;
	volatile int done;
	int result;
};

static void *touch_page0(void *arg)
{
	struct toucher *t = arg;
	unsigned char b;

	t->result = vt_read(kvmem_kmod_page_addr(t->k, 0), &b, 1);
	t->done = 1;
	return NULL;
}

/* One page of 64 MiB (its file in dir, its sums beside it). */
static kvmem_kmod *big_open(char *dir, kvmem_kmod_files *f)
{
	unsigned char *buf = malloc(BIG);
	uint64_t sums[2] = { 0, 0 };
	kvmem_kmod_opts o;
	kvmem_kmod *k = NULL;
	char path[64];

	if (!buf || !mkdtemp(dir))
		return NULL;
	for (uint32_t i = 0; i < BIG; i += 8) {
		uint64_t v = i * 0x9e3779b97f4a7c15ull;

		memcpy(buf + i, &v, 8);
	}
	sums[0] = kvmem_xxh3_64(buf, BIG);
	*f = (kvmem_kmod_files){ .page_bytes = BIG, .page_stride = BIG, .n_layers = 1,
				 .page_count = 1 };
	snprintf(path, sizeof(path), "%s/pages", dir);
	f->pages_fd = open(path, O_RDWR | O_CREAT, 0600);
	snprintf(path, sizeof(path), "%s/sums", dir);
	f->sums_fd = open(path, O_RDWR | O_CREAT, 0600);
	if (pwrite(f->pages_fd, buf, BIG, 0) != (ssize_t)BIG || pwrite(f->sums_fd, sums, 16, 0) != 16)
		return NULL;
	free(buf);
	kvmem_kmod_opts_default(&o);
	o.host_cap = BIG;
	if (kvmem_kmod_open(f, &o, &k))
		return NULL;
	return k;
}

static void big_close(char *dir, kvmem_kmod_files *f, kvmem_kmod *k)
{
	char cmd[64];

	kvmem_kmod_close(k);
	close(f->pages_fd);
	close(f->sums_fd);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd))
		fprintf(stderr, "# cannot remove %s\n", dir);
}

/* Wait until page 0's fill has started (IN_FLIGHT) or A is done. */
static void wait_in_flight(kvmem_kmod *k, struct toucher *a)
{
	for (int polls = 0; polls < 200000 && !a->done; polls++) {
		if (kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_IN_FLIGHT)
			return;
		usleep(50);
	}
}

/*
 * One page of 64 MiB: its fill allocates 16,384 pages and maps them
 * (vmap) before it reads. The workspace's lock is not held meanwhile:
 * once the table says the fill started, a STATS (which takes the lock)
 * returns while the module still holds none of those pages (its `pages`
 * counter counts them when the allocation is done).
 */
TEST_F_TIMEOUT(slow, fill_allocates_without_the_workspace_lock, 300)
{
	char dir[] = "/tmp/big.XXXXXX";
	kvmem_kmod_files f;
	kvmem_kmod *k = big_open(dir, &f);
	uint64_t id0 = 0;
	int32_t st;
	int passed = 0;

	ASSERT_NE(NULL, k);
	for (int attempt = 0; attempt < 3 && !passed; attempt++) {
		struct toucher a = { .k = k };
		pthread_t at;
		long held;

		pthread_create(&at, NULL, touch_page0, &a);
		wait_in_flight(k, &a);
		vt_stats(k);
		held = vt_param("pages");
		passed = held < (long)(BIG / 4096);
		pthread_join(at, NULL);
		TH_LOG("attempt %d: after STATS the module held %ld of the fill's %u pages", attempt,
		       held, BIG / 4096);
		ASSERT_EQ(0, a.result);
		ASSERT_EQ(0, kvmem_kmod_evict(k, &id0, 1, &st));
	}
	ASSERT_TRUE(passed);
	big_close(dir, &f, k);
}

/*
 * The same page: its fill reads 64 MiB and hashes them, which takes a
 * while under TCG. Thread A faults it; once the table says the fill is under
 * way, the main thread maps and unmaps anonymous memory (which takes the
 * mmap lock for writing). The fault must have let go of the mmap lock: the
 * mmap returns while the fill is still under way. (A fault that holds it
 * makes the mmap wait for the whole fill.)
 */
TEST_F_TIMEOUT(slow, fault_lets_go_of_the_mmap_lock_while_filling, 300)
{
	char dir[] = "/tmp/big.XXXXXX";
	kvmem_kmod_files f;
	kvmem_kmod *k = big_open(dir, &f);
	uint64_t id0 = 0;
	int32_t st;
	int passed = 0;

	ASSERT_NE(NULL, k);
	for (int attempt = 0; attempt < 3 && !passed; attempt++) {
		struct toucher a = { .k = k }, c = { .k = k };
		pthread_t at, ct;
		struct timespec t0, t1;
		void *m;

		pthread_create(&at, NULL, touch_page0, &a);
		wait_in_flight(k, &a);
		/* A second fault on the page waits for A's fill. */
		pthread_create(&ct, NULL, touch_page0, &c);
		usleep(20000);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		m = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		ASSERT_NE(MAP_FAILED, m);
		munmap(m, 4096);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		passed = !!(kvmem_kmod_pte(k, 0)->flags & KVMEM_PTE_IN_FLIGHT);
		pthread_join(at, NULL);
		pthread_join(ct, NULL);
		TH_LOG("attempt %d: mmap took %.3f s; the fill was %s under way when it returned",
		       attempt, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
		       passed ? "still" : "no longer");
		ASSERT_EQ(0, a.result);
		ASSERT_EQ(0, c.result);
		ASSERT_EQ(0, kvmem_kmod_evict(k, &id0, 1, &st));
	}
	ASSERT_TRUE(passed);
	big_close(dir, &f, k);
}

TEST_HARNESS_MAIN
