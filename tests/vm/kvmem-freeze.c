// SPDX-License-Identifier: GPL-2.0
/*
 * kvmem.ko over a file system that freezes (FIFREEZE / FITHAW on ext2 over a
 * loop device of the test's own, so a hang here leaves /mnt/ext alone):
 *  - write-back while the file system freezes and thaws again and again
 *    must never deadlock (the module once took freeze protection twice
 *    around a kernel_write, which takes it itself);
 *  - a fault that waited for another task's fill, which ended without a
 *    read error (the filling task was killed), fills the page itself: the
 *    page's BAD flag from an older failure is no verdict on that fill.
 * A deadlocked child cannot be killed (its tasks sleep uninterruptibly in
 * the file system), so the test watches its progress and gives up on it.
 */
#include <linux/fs.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "vmtest.h"

FIXTURE(frz) {
	char mnt[32];
	struct vt_ws w;
	int mnt_fd;
	bool frozen;	/* thaw in teardown */
	bool stuck;	/* the file system is wedged: leave it */
};

FIXTURE_SETUP(frz)
{
	snprintf(self->mnt, sizeof(self->mnt), "/tmp/frzXXXXXX");
	ASSERT_NE(NULL, mkdtemp(self->mnt));
	ASSERT_EQ(0, vt_loopfs_mount(self->mnt, 24));
	ASSERT_EQ(0, vt_ws_open_at(&self->w, VT_WS_SMALL, self->mnt));
	self->mnt_fd = open(self->mnt, O_RDONLY | O_DIRECTORY);
	ASSERT_LE(0, self->mnt_fd);
}

FIXTURE_TEARDOWN(frz)
{
	if (self->stuck)
		return;
	if (self->frozen)
		ioctl(self->mnt_fd, FITHAW, 0);
	close(self->mnt_fd);
	vt_ws_close(&self->w);
	vt_loopfs_umount(self->mnt);
}

static pid_t gettid_(void)
{
	return (pid_t)syscall(SYS_gettid);
}

/* ---- write-back against freeze and thaw --------------------------------- */

struct frz_progress {	/* MAP_SHARED: the child writes, the parent watches */
	volatile long writes, freezes, writebacks, done;
};

struct frz_thread {
	struct vt_ws *w;
	kvmem_kmod *k;
	struct frz_progress *pr;
	volatile int *stop;
	int mnt_fd;
	uint64_t seed;
};

static void *frz_writer(void *arg)
{
	struct frz_thread *t = arg;
	uint64_t rng = t->seed;

	while (!*t->stop) {
		uint64_t p = vt_rng(&rng) % t->w->pages, v = vt_rng(&rng);

		if (vt_write(kvmem_kmod_page_addr(t->k, p), &v, sizeof(v)))
			break;
		__atomic_fetch_add(&t->pr->writes, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void *frz_freezer(void *arg)
{
	struct frz_thread *t = arg;

	for (int i = 0; i < 300 && !*t->stop; i++) {
		if (ioctl(t->mnt_fd, FIFREEZE, 0))
			break;
		usleep(1000);
		if (ioctl(t->mnt_fd, FITHAW, 0))
			break;
		usleep(2000);
		t->pr->freezes++;
		t->pr->writebacks = vt_stats(t->k).writebacks;
	}
	return NULL;
}

/* The child: two writers dirtying random pages of an 8-page window (so
 * faults evict and write back) while a third thread freezes and thaws the
 * file system 300 times. */
static int frz_child(struct vt_ws *w, int mnt_fd, struct frz_progress *pr, uint64_t seed)
{
	volatile int stop = 0;
	struct frz_thread t[3];
	pthread_t tid[3];
	kvmem_kmod *k = vt_kmod(w, 8);

	if (!k)
		return 1;
	for (int i = 0; i < 3; i++) {
		t[i] = (struct frz_thread){ .w = w, .k = k, .pr = pr, .stop = &stop,
					    .mnt_fd = mnt_fd, .seed = seed + i };
		pthread_create(&tid[i], NULL, i < 2 ? frz_writer : frz_freezer, &t[i]);
	}
	pthread_join(tid[2], NULL);
	stop = 1;
	pthread_join(tid[0], NULL);
	pthread_join(tid[1], NULL);
	if (kvmem_kmod_sync(k))
		return 2;
	pr->writebacks = vt_stats(k).writebacks;
	kvmem_kmod_close(k);
	pr->done = 1;
	return 0;
}

TEST_F_TIMEOUT(frz, writeback_while_freezing_never_deadlocks, 300)
{
	struct frz_progress *pr = mmap(NULL, sizeof(*pr), PROT_READ | PROT_WRITE,
				       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	long last = -1, still = 0;
	int status = 0;
	pid_t pid;

	ASSERT_NE(MAP_FAILED, pr);
	pid = fork();
	if (pid == 0)
		_exit(frz_child(&self->w, self->mnt_fd, pr, vt_seed("frz")));
	/* Progress is writes + freezes; 20 s without any is a deadlock (the
	 * threads sleep in D state for good: nothing can end them). */
	for (int tick = 0; tick < 2400; tick++) {
		long now = pr->writes + pr->freezes;

		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
		still = now == last ? still + 1 : 0;
		last = now;
		if (still >= 200) {
			self->stuck = true;
			TH_LOG("no progress for 20 s after %ld writes, %ld write-backs, %ld freezes: "
			       "deadlocked", pr->writes, pr->writebacks, pr->freezes);
			ASSERT_TRUE(0);
		}
		usleep(100000);
	}
	TH_LOG("%ld writes, %ld write-backs, %ld freezes", pr->writes, pr->writebacks,
	       pr->freezes);
	ASSERT_TRUE(WIFEXITED(status));
	ASSERT_EQ(0, WEXITSTATUS(status));
	ASSERT_EQ(1, pr->done);
	ASSERT_EQ(300, pr->freezes);
	ASSERT_GT(pr->writebacks, 0);
}

/* ---- a waiter and a stale BAD flag -------------------------------------- */

struct waiter {
	kvmem_kmod *k;
	uint64_t page;
	uint32_t len;
	unsigned char *buf;
	volatile pid_t tid;
	int result;
};

static void *sync_thread(void *arg)
{
	struct waiter *s = arg;

	s->tid = gettid_();
	s->result = kvmem_kmod_sync(s->k);
	return NULL;
}

static void *read_thread(void *arg)
{
	struct waiter *r = arg;

	r->tid = gettid_();
	r->result = vt_read(kvmem_kmod_page_addr(r->k, r->page), r->buf, r->len);
	return NULL;
}

/*
 * One slot. Page P failed its checksum once (BAD), then was repaired on
 * disk. Page Q, dirty, holds the slot and its write-back waits for a thaw.
 * Task X faults P: its fill waits for the slot. Thread Y faults P: it waits
 * for X's fill. X is killed: its fill ends with no read at all. Y must not
 * take P's old BAD flag for the result of that fill: after the thaw it
 * fills P itself and reads the right bytes.
 */
TEST_F_TIMEOUT(frz, waiter_fills_after_a_killed_fill, 120)
{
	struct vt_ws *w = &self->w;
	uint32_t stride = w->page_stride, off = 100;
	uint64_t P = 5, Q = 9;
	unsigned char c = w->ref[P * stride + off] ^ 0xff, b;
	struct waiter s, y;
	pthread_t st, yt;
	kvmem_kmod *k;
	pid_t x, tids[2];

	k = vt_kmod(w, 1);
	ASSERT_NE(NULL, k);
	ASSERT_EQ(1, pwrite(w->pages_fd, &c, 1, P * stride + off));
	ASSERT_EQ(-1, vt_read(kvmem_kmod_page_addr(k, P), &b, 1));
	ASSERT_EQ(KVMEM_PTE_BAD, kvmem_kmod_pte(k, P)->flags & KVMEM_PTE_BAD);
	ASSERT_EQ(1, pwrite(w->pages_fd, &w->ref[P * stride + off], 1, P * stride + off));
	ASSERT_EQ(0, vt_write(kvmem_kmod_page_addr(k, Q), "q", 1));

	ASSERT_EQ(0, ioctl(self->mnt_fd, FIFREEZE, 0));
	self->frozen = true;
	s = (struct waiter){ .k = k };
	pthread_create(&st, NULL, sync_thread, &s);
	while (!s.tid)
		usleep(1000);
	ASSERT_EQ(0, vt_tasks_asleep((pid_t *)&s.tid, 1, 20));

	x = fork();
	if (x == 0) {
		*(volatile unsigned char *)kvmem_kmod_page_addr(k, P);
		_exit(0);
	}
	for (int i = 0; i < 400 && !(kvmem_kmod_pte(k, P)->flags & KVMEM_PTE_IN_FLIGHT); i++)
		usleep(10000);
	ASSERT_EQ(KVMEM_PTE_IN_FLIGHT, kvmem_kmod_pte(k, P)->flags & KVMEM_PTE_IN_FLIGHT);

	y = (struct waiter){ .k = k, .page = P, .len = stride, .buf = malloc(stride) };
	pthread_create(&yt, NULL, read_thread, &y);
	while (!y.tid)
		usleep(1000);
	tids[0] = x;
	tids[1] = y.tid;
	ASSERT_EQ(0, vt_tasks_asleep(tids, 2, 20));
	ASSERT_EQ(0, kill(x, SIGKILL));
	ASSERT_EQ(x, waitpid(x, NULL, 0));
	usleep(200000);
	ASSERT_EQ(0, ioctl(self->mnt_fd, FITHAW, 0));
	self->frozen = false;
	pthread_join(st, NULL);
	pthread_join(yt, NULL);
	ASSERT_EQ(0, s.result);
	ASSERT_EQ(0, y.result) TH_LOG("the waiter got SIGBUS from P's old BAD flag");
	ASSERT_EQ(0, memcmp(y.buf, w->ref + P * stride, stride));
	ASSERT_EQ(0, kvmem_kmod_pte(k, P)->flags & KVMEM_PTE_BAD);
	ASSERT_EQ(1, vt_stats(k).checksum_errors);
	free(y.buf);
	kvmem_kmod_close(k);
}

TEST_HARNESS_MAIN
