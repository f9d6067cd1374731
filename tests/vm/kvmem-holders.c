// SPDX-License-Identifier: GPL-2.0
/*
 * kvmem.ko and the others who wait on its work:
 *  - a fill of a 64 MiB page allocates its memory without the workspace's
 *    lock: another thread's STATS goes through while the allocation is
 *    still under way.
 */
#include <pthread.h>
#include <sys/ioctl.h>

#include "kselftest_harness.h"
#include "vmtest.h"

/* A fixture with nothing in it, for a longer timeout than TEST's 30 s
 * (6.1's harness has no TEST_TIMEOUT). */
FIXTURE(slow) {
	int unused;
};

FIXTURE_SETUP(slow)
{
}

FIXTURE_TEARDOWN(slow)
{
}

/* ---- a page of 64 MiB ---------------------------------------------------- */

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

TEST_HARNESS_MAIN
