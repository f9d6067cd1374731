// SPDX-License-Identifier: MIT
/*
 * A small pool for the kernels' middle-sized work: a batched decode step's
 * matmuls and attention (tens of microseconds each, dozens a step), too
 * short for an OpenMP region under the passive waits kvmem runs with.
 *
 * Measured on the build machine (2 shared vCPUs, issue #26): an OpenMP
 * worker that sleeps between regions takes longer to wake than such a
 * kernel runs, so a decode batch's attention at 2 threads took the time
 * of 1 (0.26 ms a layer either way), and the 8-row matmuls stayed on one
 * thread; with spinning waits the same attention took 0.13 ms, but
 * spinning OpenMP workers made a loaded machine many times slower (they
 * hold the barrier for a descheduled peer).
 *
 * So this pool differs from an OpenMP region in two ways:
 *  - the caller never waits for a worker that has not started: it takes
 *    chunks itself from a shared counter and waits only for the chunks a
 *    worker has already taken (a worker that wakes late finds none left);
 *  - a worker spins for a short while (KVMEM_POOL_SPIN_US, default 200 us)
 *    after each job before it sleeps, so the many short jobs of one
 *    forward pass find it awake, and an idle process does not spin.
 *
 * Which thread runs a chunk changes no result: the callers' chunks write
 * disjoint outputs, each computed start to end by one thread with the
 * same arithmetic (kvmem_matmul's columns, kvmem_attention_batch's work
 * items), so the pool keeps their batch invariance.
 *
 * The workers are started on the first job that may use them: OpenMP's
 * thread count then, less one (the caller is the other). A caller whose
 * OpenMP thread count is 1 (omp_set_num_threads, OMP_NUM_THREADS=1), a
 * call from inside an OpenMP region, and a second caller while a job runs
 * (one job at a time) run their chunks alone.
 */
#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h"

#define MAX_WORKERS 15
/*
 * Whether the workers pay, judged over windows of WINDOW_NS: each job's
 * time against what it would have cost the caller alone (its own time per
 * chunk times all the chunks). A worker descheduled mid-chunk (another
 * process took its core for a time slice of milliseconds) makes the caller
 * wait for that chunk; once a window's waits have cost LOSS_NS more than
 * the workers saved in it, the caller runs its jobs alone for 8 ms,
 * doubling up to 256 ms while windows keep losing, back to 8 ms after one
 * that gains.
 *
 * Counting the gain matters under a server's own load: its HTTP and client
 * threads wake on every token and now and then preempt a worker for a
 * fraction of a millisecond. kvmem serve at 8 streams (cpu, this machine's
 * 2 cores) saw 13 waits over 100 us in 25,000 jobs; an earlier rule (any
 * such wait starts a backoff) ran 24,800 of those jobs alone, on one core.
 */
#define WINDOW_NS 100000000L
#define LOSS_NS 1000000L
#define BACKOFF_MIN_NS 8000000L
#define BACKOFF_MAX_NS 256000000L

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	atomic_uint gen;	/* bumped for each job (under mu) */
	kvmem_pool_fn fn;	/* the job, under mu */
	void *arg;
	int next, n;		/* chunks taken, chunks in all (under mu) */
	atomic_int done;	/* chunks finished */
	int sleepers;		/* workers waiting on cv (under mu) */
	int workers;
	long spin_ns;
	atomic_int busy;	/* a caller owns the pool */
	/* under busy: the window's start and net gain (ns: alone - pooled) */
	long window, gain, alone_until, backoff;
} P = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Take and run chunks of the current job until none are left; mu held on
 * entry and on return. Returns how many this thread ran. */
static int run_chunks(void)
{
	int ran = 0;

	while (P.next < P.n) {
		int c = P.next++;
		kvmem_pool_fn fn = P.fn;
		void *arg = P.arg;

		pthread_mutex_unlock(&P.mu);
		fn(arg, c);
		atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
		pthread_mutex_lock(&P.mu);
		ran++;
	}
	return ran;
}

/* A pooled job of n chunks took `took` ns, of which the caller ran `mine`
 * chunks in `mine_ns`: add to the window's gain, and run alone for a while
 * once the window has lost LOSS_NS. */
static void account(int n, int mine, long mine_ns, long took, long now)
{
	if (now - P.window > WINDOW_NS) {	/* a new window */
		if (P.gain >= 0)
			P.backoff = 0;
		P.window = now;
		P.gain = 0;
	}
	if (mine > 0)	/* else no time per chunk to judge by */
		P.gain += (long)((double)mine_ns / mine * n) - took;
	if (P.gain < -LOSS_NS) {
		P.backoff = P.backoff ? P.backoff * 2 : BACKOFF_MIN_NS;
		P.backoff = P.backoff < BACKOFF_MAX_NS ? P.backoff : BACKOFF_MAX_NS;
		P.alone_until = now + P.backoff;
		P.window = P.alone_until;	/* judged afresh after it */
		P.gain = 0;
	}
}

static void *worker(void *unused)
{
	unsigned seen = 0;

	(void)unused;
	for (;;) {
		long t0 = now_ns();

		/* awake for a while: the next job of the same pass comes soon */
		while (atomic_load_explicit(&P.gen, memory_order_acquire) == seen) {
			for (int i = 0; i < 32; i++)
				_mm_pause();
			if (now_ns() - t0 > P.spin_ns)
				break;
			sched_yield();	/* a caller on this core runs first */
		}
		pthread_mutex_lock(&P.mu);
		while (atomic_load_explicit(&P.gen, memory_order_relaxed) == seen) {
			P.sleepers++;
			pthread_cond_wait(&P.cv, &P.mu);
			P.sleepers--;
		}
		seen = atomic_load_explicit(&P.gen, memory_order_relaxed);
		run_chunks();
		pthread_mutex_unlock(&P.mu);
	}
	return NULL;
}

static void start(void)
{
	const char *s = getenv("KVMEM_POOL_SPIN_US");
	int want = omp_get_max_threads() - 1;

	P.spin_ns = (s && *s ? atol(s) : 200) * 1000L;
	want = want < MAX_WORKERS ? want : MAX_WORKERS;
	for (int i = 0; i < want; i++) {
		pthread_t t;
		pthread_attr_t a;

		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (!pthread_create(&t, &a, worker, NULL))
			P.workers++;
		pthread_attr_destroy(&a);
	}
}

static void run_alone(int n, kvmem_pool_fn fn, void *arg)
{
	for (int c = 0; c < n; c++)
		fn(arg, c);
}

void kvmem_pool_run(int n, kvmem_pool_fn fn, void *arg)
{
	int expect = 0, mine;
	long t0, t1, mine_ns;

	if (n <= 0)
		return;
	if (n == 1 || omp_get_max_threads() < 2 || omp_in_parallel()) {
		run_alone(n, fn, arg);
		return;
	}
	pthread_once(&pool_once, start);
	if (!P.workers || !atomic_compare_exchange_strong(&P.busy, &expect, 1)) {
		run_alone(n, fn, arg);
		return;
	}
	if (P.alone_until && now_ns() < P.alone_until) {	/* the workers' cores are taken */
		atomic_store_explicit(&P.busy, 0, memory_order_release);
		run_alone(n, fn, arg);
		return;
	}
	t0 = now_ns();
	pthread_mutex_lock(&P.mu);
	P.fn = fn;
	P.arg = arg;
	P.next = 0;
	P.n = n;
	atomic_store_explicit(&P.done, 0, memory_order_relaxed);
	atomic_fetch_add_explicit(&P.gen, 1, memory_order_release);
	if (P.sleepers)
		pthread_cond_broadcast(&P.cv);
	mine = run_chunks();
	pthread_mutex_unlock(&P.mu);
	mine_ns = now_ns() - t0;
	/* every chunk is taken; wait for the ones a worker is running */
	for (long spins = 0; atomic_load_explicit(&P.done, memory_order_acquire) < n; spins++) {
		_mm_pause();
		if (spins % 64 == 63)
			sched_yield();	/* the worker may be waiting for this core */
	}
	t1 = now_ns();
	account(n, mine, mine_ns, t1 - t0, t1);
	atomic_store_explicit(&P.busy, 0, memory_order_release);
}
