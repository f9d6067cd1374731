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
/* A caller that waited longer than this for a worker's chunk (the worker
 * was descheduled mid-chunk: another process took its core, for a time
 * slice of milliseconds) runs its jobs alone for a while: 8 ms, doubling
 * up to 256 ms while it keeps happening, back to 8 ms after a second
 * without. Against a busy neighbour a pooled job saves tens of
 * microseconds and one such wait costs milliseconds. */
#define SLOW_WAIT_NS 100000L
#define BACKOFF_MIN_NS 8000000L
#define BACKOFF_MAX_NS 256000000L
#define BACKOFF_RESET_NS 1000000000L

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
	long alone_until, backoff, last_slow;	/* under busy */
} P = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Take and run chunks of the current job until none are left; mu held on
 * entry and on return. */
static void run_chunks(void)
{
	while (P.next < P.n) {
		int c = P.next++;
		kvmem_pool_fn fn = P.fn;
		void *arg = P.arg;

		pthread_mutex_unlock(&P.mu);
		fn(arg, c);
		atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
		pthread_mutex_lock(&P.mu);
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
	int expect = 0;
	long t0;

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
	pthread_mutex_lock(&P.mu);
	P.fn = fn;
	P.arg = arg;
	P.next = 0;
	P.n = n;
	atomic_store_explicit(&P.done, 0, memory_order_relaxed);
	atomic_fetch_add_explicit(&P.gen, 1, memory_order_release);
	if (P.sleepers)
		pthread_cond_broadcast(&P.cv);
	run_chunks();
	pthread_mutex_unlock(&P.mu);
	/* every chunk is taken; wait for the ones a worker is running */
	t0 = now_ns();
	for (long spins = 0; atomic_load_explicit(&P.done, memory_order_acquire) < n; spins++) {
		_mm_pause();
		if (spins % 64 == 63)
			sched_yield();	/* the worker may be waiting for this core */
	}
	if (now_ns() - t0 > SLOW_WAIT_NS) {
		P.backoff = P.backoff ? P.backoff * 2 : BACKOFF_MIN_NS;
		P.backoff = P.backoff < BACKOFF_MAX_NS ? P.backoff : BACKOFF_MAX_NS;
		P.last_slow = now_ns();
		P.alone_until = P.last_slow + P.backoff;
	} else if (P.backoff && now_ns() - P.last_slow > BACKOFF_RESET_NS) {
		P.backoff = 0;
	}
	atomic_store_explicit(&P.busy, 0, memory_order_release);
}
