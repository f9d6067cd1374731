// SPDX-License-Identifier: MIT
/*
 * Workspaces in RADOS (user/pager/store_rados.c) against a real cluster the
 * test starts itself (tests/rados/cluster.sh: one monitor, one OSD with
 * BlueStore on a file, cephx on), or the one $KVMEM_TEST_CEPH names (a
 * directory cluster.sh made). Skipped, saying why, when Ceph is not
 * installed.
 *
 *  - reopened by another process as another client ("another host"), in
 *    parts, everything reads back and verifies;
 *  - a second writer is refused (-EBUSY naming the holder) while readers
 *    read; a clean hand-over fences nobody;
 *  - kill -9 of the writer mid-commit, and of the OSD mid-commit: the
 *    manifest is never torn, every commit the writer saw is there;
 *  - a writer that stalls past its lease is taken over; it stops writing,
 *    and one told to trust its lease is refused by the OSDs (fenced);
 *  - a wrong key, a missing pool, a bad name: refused, saying so;
 *  - the cluster going away mid-session: a clear error, the last commit
 *    intact after it comes back;
 *  - verify, salvage and copy between a directory and a pool, both ways.
 *
 * Writers run in child processes started with exec (a process that has
 * librados's threads must not fork and go on using it).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <cmocka.h>

#include "kvmem/kvmem.h"
#include "pager_fixture.h"
#include "kvmem/store.h"
#include "util/clock.h"

static uint64_t g_seed;
static char g_ceph[512];	/* the cluster's directory */
static int g_ours;		/* started here: destroyed at the end */
static const char *g_skip;	/* why every case is skipped */
static char g_self[4096];	/* this program, for the children */

#define POOL "rados://kvmem/"

/* ---- the cluster ---------------------------------------------------------- */

static int cluster(const char *cmd)
{
	char line[1200];

	snprintf(line, sizeof(line), "tests/rados/cluster.sh %s '%s' >>'%s.log' 2>&1", cmd, g_ceph,
		 g_ceph);
	return WEXITSTATUS(system(line));
}

static int group_setup(void **state)
{
	const char *have = getenv("KVMEM_TEST_CEPH");
	char conf[600];
	int rc;

	if (have && *have) {
		snprintf(g_ceph, sizeof(g_ceph), "%s", have);
	} else {
		if (access("tests/rados/cluster.sh", X_OK) < 0) {
			fprintf(stderr, "test_store_rados: run from the source tree (tests/rados/cluster.sh)\n");
			return -1;
		}
		snprintf(g_ceph, sizeof(g_ceph), "%s/kvmem-ceph.XXXXXX",
			 getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp");
		if (!mkdtemp(g_ceph))
			return -1;
		rc = cluster("start");
		if (rc == 77) {
			g_skip = "Ceph is not installed (apt-get install ceph-mon ceph-osd librados-dev)";
			fprintf(stderr, "test_store_rados: skipping every case: %s\n", g_skip);
			rmdir(g_ceph);
			return 0;
		}
		g_ours = 1;
		if (rc) {
			fprintf(stderr, "test_store_rados: the cluster did not start (%s.log)\n", g_ceph);
			return -1;
		}
	}
	snprintf(conf, sizeof(conf), "%s/ceph.conf", g_ceph);
	setenv("CEPH_CONF", conf, 1);
	unsetenv("CEPH_ARGS");
	unsetenv("KVMEM_RADOS_FAULT");
	return 0;
}

static int group_teardown(void **state)
{
	char log[600];

	if (g_ours) {
		cluster("destroy");
		snprintf(log, sizeof(log), "%s.log", g_ceph);
		unlink(log);
	}
	return 0;
}

#define NEED_CLUSTER()				\
	do {					\
		if (g_skip)			\
			skip();			\
	} while (0)

/* A workspace name of this run's own. */
static void ws_name(char *buf, size_t len, const char *what)
{
	static int n;

	snprintf(buf, len, POOL "%s-%016" PRIx64 "-%d", what, g_seed, n++);
}

/* Entries in the cluster's blocklist. */
static int blocklisted(void)
{
	char cmd[700], line[256];
	int n = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "timeout 60 ceph -c '%s/ceph.conf' osd blocklist ls 2>&1", g_ceph);
	if (!(f = popen(cmd, "r")))
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "listed %d entries", &n) == 1)
			break;
	pclose(f);
	return n;
}

/* ---- children ------------------------------------------------------------- */

/* A child running this program with `args` (argv[1] "--child"), as client
 * `client` (NULL: admin), with a lease of `lease` seconds, stdout to fd
 * `out` (-1: inherited) and stdin from fd `in` (-1: inherited). */
static pid_t spawn(const char *const *args, const char *client, int lease, const char *fault,
		   const char *more, int in, int out)
{
	char *argv[16], *envp[64], cephargs[1200], leasev[64], faultv[64];
	extern char **environ;
	int na = 0, ne = 0;
	pid_t pid;

	argv[na++] = g_self;
	argv[na++] = "--child";
	for (int i = 0; args[i] && na < 15; i++)
		argv[na++] = (char *)args[i];
	argv[na] = NULL;
	for (char **e = environ; *e && ne < 60; e++)
		if (strncmp(*e, "CEPH_ARGS=", 10) && strncmp(*e, "KVMEM_RADOS_LEASE=", 18) &&
		    strncmp(*e, "KVMEM_RADOS_FAULT=", 18))
			envp[ne++] = *e;
	if (client) {
		snprintf(cephargs, sizeof(cephargs), "CEPH_ARGS=--id %s --keyring %s/%s.keyring %s", client,
			 g_ceph, client, more ? more : "");
		envp[ne++] = cephargs;
	}
	snprintf(leasev, sizeof(leasev), "KVMEM_RADOS_LEASE=%d", lease);
	envp[ne++] = leasev;
	if (fault) {
		snprintf(faultv, sizeof(faultv), "KVMEM_RADOS_FAULT=%s", fault);
		envp[ne++] = faultv;
	}
	envp[ne] = NULL;
	pid = fork();
	if (pid == 0) {
		if (in >= 0)
			dup2(in, 0);
		if (out >= 0)
			dup2(out, 1);
		execve(g_self, argv, envp);
		_exit(127);
	}
	return pid;
}

static int wait_exit(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The geometry every child and the parent agree on, from a seed. */
static kvmem_page_geom geom_of(uint64_t seed)
{
	uint64_t rng = seed;

	return fx_geom(&rng);
}

static kvmem_pager *open_writer(const char *ws, const kvmem_page_geom *g, int quiet)
{
	return fx_open(ws, g, 1 << 20, 1 << 20, KVMEM_PAGER_CREATE, quiet);
}

/* Open for writing, waiting (up to `secs`) while another writer's lease
 * has not lapsed. */
static kvmem_pager *open_writer_wait(const char *ws, const kvmem_page_geom *g, int secs)
{
	time_t end = time(NULL) + secs;
	kvmem_pager *p;

	while (!(p = open_writer(ws, g, 1)) && kvmem_last_errno() == EBUSY && time(NULL) < end)
		usleep(200000);
	if (!p)
		fprintf(stderr, "open %s: %s\n", ws, kvmem_last_error());
	return p;
}

/* child part WS GEOMSEED SEED N: check what is there, append N tokens,
 * commit, close. */
static int child_part(char **a)
{
	kvmem_page_geom g = geom_of(strtoull(a[1], NULL, 0));
	uint64_t seed = strtoull(a[2], NULL, 0);
	kvmem_pager *p = open_writer(a[0], &g, 0);

	if (!p)
		return 2;
	if (fx_check(p, seed, 1))
		return 3;
	if (fx_append(p, seed, strtoull(a[3], NULL, 0)) || fx_commit(p, seed, a[0], 8)) {
		fprintf(stderr, "child: %s\n", kvmem_last_error());
		return 4;
	}
	if (fx_check(p, seed, 1))
		return 5;
	return kvmem_pager_close(p) ? 6 : 0;
}

/* child loop WS GEOMSEED SEED RNG: append and commit until killed,
 * writing each commit's token count (u64) to stdout. */
static int child_loop(char **a)
{
	kvmem_page_geom g = geom_of(strtoull(a[1], NULL, 0));
	uint64_t seed = strtoull(a[2], NULL, 0), rng = strtoull(a[3], NULL, 0);
	kvmem_pager *p = open_writer_wait(a[0], &g, 60);

	if (!p)
		return 2;
	for (;;) {
		uint64_t n;

		if (fx_append(p, seed, test_rng_int(&rng, 1, 3 * g.block_tokens)) < 0)
			return 3;
		if (test_rng_int(&rng, 0, 1))
			continue;
		if (fx_commit(p, seed, &(uint64_t){ kvmem_pager_tokens(p) }, 8) < 0) {
			fprintf(stderr, "child: %s\n", kvmem_last_error());
			return 4;
		}
		n = kvmem_pager_committed_tokens(p);
		if (write(1, &n, sizeof(n)) != sizeof(n))
			return 5;
	}
}

/* child stale WS GEOMSEED SEED SEED2: commit, say "ready", wait for a
 * byte on stdin, then append with SEED2 and commit; write the result: the
 * commit's code (int) and its message. */
static int child_stale(char **a)
{
	kvmem_page_geom g = geom_of(strtoull(a[1], NULL, 0));
	uint64_t seed = strtoull(a[2], NULL, 0), seed2 = strtoull(a[3], NULL, 0);
	kvmem_pager *p = open_writer(a[0], &g, 0);
	char c, msg[1024];
	int rc;

	if (!p)
		return 2;
	if (fx_append(p, seed, 3 * g.block_tokens + 3) || fx_commit(p, seed, NULL, 0))
		return 3;
	if (write(1, "r", 1) != 1)
		return 4;
	/* Stopped and continued in this read (the parent's SIGSTOP): a
	 * handler librados installs may end it with EINTR. */
	while ((rc = (int)read(0, &c, 1)) < 0 && errno == EINTR)
		;
	if (rc != 1)
		return 4;
	rc = fx_append(p, seed2, 4 * g.block_tokens + 1);
	if (!rc)
		rc = fx_commit(p, seed2, NULL, 0);
	snprintf(msg, sizeof(msg), "%s", rc ? kvmem_last_error() : "");
	if (write(1, &rc, sizeof(rc)) != sizeof(rc) || write(1, msg, strlen(msg) + 1) < 0)
		return 5;
	kvmem_pager_close(p);
	return 0;
}

static int child_main(int argc, char **argv)
{
	if (argc >= 7 && !strcmp(argv[2], "part"))
		return child_part(argv + 3);
	if (argc >= 7 && !strcmp(argv[2], "loop"))
		return child_loop(argv + 3);
	if (argc >= 7 && !strcmp(argv[2], "stale"))
		return child_stale(argv + 3);
	return 64;
}

static void u64s(char *a, char *b, char *c, uint64_t x, uint64_t y, uint64_t z)
{
	sprintf(a, "%" PRIu64, x);
	sprintf(b, "%" PRIu64, y);
	sprintf(c, "%" PRIu64, z);
}

/* The workspace reopened read-only: everything up to its commit reads back
 * as `seed` wrote it, and verify finds nothing bad. Returns the committed
 * tokens. */
static uint64_t check_ws(const char *ws, const kvmem_page_geom *g, uint64_t seed)
{
	kvmem_pager *p = fx_open(ws, g, 1 << 20, 0, KVMEM_PAGER_RDONLY, 0);
	uint64_t n;

	assert_non_null(p);
	n = kvmem_pager_committed_tokens(p);
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(kvmem_workspace_verify(ws, stderr, 0), 0);
	return n;
}

/* ---- cases --------------------------------------------------------------- */

/* Written in parts, every other part by another process as another
 * client; each part first checks all that came before. Objects of one
 * block, so requests span objects. */
static void test_reopen_other_process_and_client(void **state)
{
	uint64_t gs = g_seed, seed = fx_mix(g_seed);
	kvmem_page_geom g = geom_of(gs);
	char ws[256], a[32], b[32], n[32];
	uint64_t rng = g_seed ^ 7;

	NEED_CLUSTER();
	ws_name(ws, sizeof(ws), "parts");
	setenv("KVMEM_RADOS_OBJECT", "4096", 1);
	for (int part = 0; part < 4; part++) {
		u64s(a, b, n, gs, seed, test_rng_int(&rng, 1, 5 * g.block_tokens));
		if (part % 2) {
			const char *args[] = { "part", ws, a, b, n, NULL };

			assert_int_equal(wait_exit(spawn(args, "kvmem-b", 30, NULL, NULL, -1, -1)), 0);
		} else {
			kvmem_pager *p = open_writer(ws, &g, 0);

			assert_non_null(p);
			assert_int_equal(fx_check(p, seed, 1), 0);
			assert_int_equal(fx_append(p, seed, strtoull(n, NULL, 10)), 0);
			assert_int_equal(fx_commit(p, seed, ws, 8), 0);
			assert_int_equal(kvmem_pager_close(p), 0);
		}
	}
	unsetenv("KVMEM_RADOS_OBJECT");
	assert_true(check_ws(ws, &g, seed) > 0);
}

/* One writer: a second is refused, naming the first, while a reader reads
 * the last commit; after a clean close the next writer takes over with no
 * fencing. */
static void test_second_writer_refused(void **state)
{
	uint64_t seed = fx_mix(g_seed + 1);
	kvmem_page_geom g = geom_of(g_seed + 1);
	char ws[256], pid[32];
	kvmem_pager *p, *q, *r;
	int fenced;

	NEED_CLUSTER();
	ws_name(ws, sizeof(ws), "two");
	p = open_writer(ws, &g, 0);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 2 * g.block_tokens + 1), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	q = open_writer(ws, &g, 1);
	assert_null(q);
	assert_int_equal(kvmem_last_errno(), EBUSY);
	snprintf(pid, sizeof(pid), "process %d", (int)getpid());
	assert_non_null(strstr(kvmem_last_error(), pid));
	assert_non_null(strstr(kvmem_last_error(), "one writer at a time"));
	r = fx_open(ws, &g, 1 << 20, 0, KVMEM_PAGER_RDONLY, 0);
	assert_non_null(r);
	assert_int_equal(kvmem_pager_committed_tokens(r), 2 * g.block_tokens + 1);
	assert_int_equal(fx_check(r, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(r), 0);
	fenced = blocklisted();
	assert_int_equal(kvmem_pager_close(p), 0);
	q = open_writer(ws, &g, 0);
	assert_non_null(q);
	assert_int_equal(fx_append(q, seed, g.block_tokens), 0);
	assert_int_equal(fx_commit(q, seed, NULL, 0), 0);
	assert_int_equal(kvmem_pager_close(q), 0);
	assert_int_equal(blocklisted(), fenced);
	assert_int_equal(check_ws(ws, &g, seed), 3 * g.block_tokens + 1);
}

/* Read the u64 commit counts a loop child reported so far (fd
 * non-blocking, or the child gone). */
static uint64_t last_reported(int fd, uint64_t last)
{
	uint64_t n;

	while (read(fd, &n, sizeof(n)) == sizeof(n))
		last = n;
	return last;
}

/* kill -9 of the writer at random moments: each time, the next writer
 * (another process) waits out the dead one's lease, fences it and goes on;
 * what the dead one saw committed is there, whole. */
static void test_kill9_writer(void **state)
{
	uint64_t seed = fx_mix(g_seed + 2), gs = g_seed + 2, rng = g_seed ^ 3, last = 0;
	kvmem_page_geom g = geom_of(gs);
	char ws[256], a[32], b[32], c[32];

	NEED_CLUSTER();
	ws_name(ws, sizeof(ws), "kill9");
	for (int k = 0; k < 5; k++) {
		int fds[2];
		pid_t pid;
		uint64_t n;

		assert_int_equal(pipe(fds), 0);
		u64s(a, b, c, gs, seed, test_rng_next(&rng));
		{
			const char *args[] = { "loop", ws, a, b, c, NULL };

			pid = spawn(args, k % 2 ? "kvmem-a" : "kvmem-b", 2, NULL, NULL, -1, fds[1]);
		}
		close(fds[1]);
		/* Until it committed at least once, then a random moment. */
		assert_int_equal(read(fds[0], &n, sizeof(n)), sizeof(n));
		last = n;
		usleep(test_rng_int(&rng, 0, 400000));
		kill(pid, SIGKILL);
		assert_int_equal(wait_exit(pid), 128 + SIGKILL);
		last = last_reported(fds[0], last);
		close(fds[0]);
		n = check_ws(ws, &g, seed);
		assert_true(n >= last);
	}
}

/* Wait up to `secs` for a commit count above `above` on fd; the last one
 * read (above when none came). */
static uint64_t commit_after(int fd, uint64_t above, int secs)
{
	time_t end = time(NULL) + secs;
	uint64_t n, last = above;

	while (last <= above && time(NULL) < end) {
		ssize_t got = read(fd, &n, sizeof(n));

		if (got == sizeof(n))
			last = n;
		else if (got == 0)
			break;
		else
			usleep(100000);
	}
	return last;
}

/* kill -9 of the OSD while a writer commits, then the OSD started again:
 * the writer's operations wait for it (a 60 s op timeout here) and it goes
 * on committing; every commit it saw is there, whole, whatever moment the
 * OSD died at. */
static void test_kill9_osd(void **state)
{
	uint64_t seed = fx_mix(g_seed + 3), gs = g_seed + 3, rng = g_seed ^ 4;
	kvmem_page_geom g = geom_of(gs);
	char ws[256], a[32], b[32], c[32];

	NEED_CLUSTER();
	for (int k = 0; k < 2; k++) {
		uint64_t n, last;
		int fds[2];
		pid_t pid;

		/* A workspace each: the killed writer's lease is not waited out. */
		ws_name(ws, sizeof(ws), "osd");
		assert_int_equal(pipe(fds), 0);
		u64s(a, b, c, gs, seed, test_rng_next(&rng));
		{
			const char *args[] = { "loop", ws, a, b, c, NULL };

			pid = spawn(args, "kvmem-a", 30, NULL, "--rados_osd_op_timeout 60", -1,
				    fds[1]);
		}
		close(fds[1]);
		assert_int_equal(read(fds[0], &n, sizeof(n)), sizeof(n));
		fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
		usleep(test_rng_int(&rng, 0, 300000));
		assert_int_equal(cluster("osd-kill"), 0);
		last = last_reported(fds[0], n);
		usleep(test_rng_int(&rng, 200000, 1500000));
		assert_int_equal(cluster("osd-start"), 0);
		/* It rode the restart out: a commit after the OSD is back. */
		n = commit_after(fds[0], last, 90);
		assert_true(n > last);
		kill(pid, SIGKILL);
		wait_exit(pid);
		last = last_reported(fds[0], n);
		close(fds[0]);
		n = check_ws(ws, &g, seed);
		assert_true(n >= last);
	}
}

/* A writer stalls (SIGSTOP) past its lease; another takes the workspace
 * over (fencing it) and commits. Resumed, the stalled writer stops: its
 * commit fails, and the new writer's data is intact. With `trust` it does
 * not check its own deadline and sends everything: the OSDs refuse it. */
static void stalled_writer(int trust)
{
	uint64_t gs = g_seed + 4 + trust, seed = fx_mix(gs), seed2 = fx_mix(gs + 100);
	kvmem_page_geom g = geom_of(gs);
	char ws[256], a[32], b[32], c[32], msg[1024] = "";
	int to[2], from[2], fenced, rc = 0;
	uint64_t t0, n0;
	kvmem_pager *p;
	pid_t pid;
	char ch;

	ws_name(ws, sizeof(ws), trust ? "stale-trust" : "stale");
	assert_int_equal(pipe(to), 0);
	assert_int_equal(pipe(from), 0);
	u64s(a, b, c, gs, seed, seed2);
	{
		const char *args[] = { "stale", ws, a, b, c, NULL };

		pid = spawn(args, "kvmem-a", 2, trust ? "trust-lease" : NULL, NULL, to[0], from[1]);
	}
	close(to[0]);
	close(from[1]);
	assert_int_equal(read(from[0], &ch, 1), 1);
	kill(pid, SIGSTOP);
	fenced = blocklisted();
	/* Refused while the lease holds, taken over once it lapses. */
	setenv("CEPH_ARGS", "--id kvmem-b", 0);
	{
		char args[600];

		snprintf(args, sizeof(args), "--id kvmem-b --keyring %s/kvmem-b.keyring", g_ceph);
		setenv("CEPH_ARGS", args, 1);
	}
	t0 = kvmem_now_ns();
	p = open_writer_wait(ws, &g, 30);
	assert_non_null(p);
	assert_true(kvmem_now_ns() - t0 < 20000000000ull);
	assert_int_equal(blocklisted(), fenced + 1);
	n0 = kvmem_pager_tokens(p);
	assert_int_equal(n0, 3 * g.block_tokens + 3);
	assert_int_equal(fx_check(p, seed, 1), 0);
	/* The new writer's blocks lie where the stalled one will write. */
	assert_int_equal(fx_append(p, seed, 5 * g.block_tokens), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	unsetenv("CEPH_ARGS");

	kill(pid, SIGCONT);
	assert_int_equal(write(to[1], "x", 1), 1);
	if (read(from[0], &rc, sizeof(rc)) != sizeof(rc))
		fail_msg("the stalled writer ended before its commit's answer (exit %d: 4 a pipe, "
			 "128+N signal N)", wait_exit(pid));
	assert_true(read(from[0], msg, sizeof(msg) - 1) >= 0);
	assert_int_equal(wait_exit(pid), 0);
	close(to[1]);
	close(from[0]);
	fprintf(stderr, "stalled writer: %s\n", msg);
	assert_int_equal(rc, -ENOLCK);
	/* Untrusting, the writer names whichever it learnt first on waking:
	 * its own clock (the lease lapsed) or its renewal thread's answer
	 * (the new writer had it blocklisted). Both stop it before a write. */
	if (trust)
		assert_non_null(strstr(msg, "fenced off"));
	else
		assert_true(strstr(msg, "not renewed") || strstr(msg, "blocklisted"));

	/* Nothing of the stalled writer's landed: B's commit checks out. */
	assert_int_equal(fx_check(p, seed, 1), 0);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(check_ws(ws, &g, seed), n0 + 5 * g.block_tokens);
}

static void test_lease_expiry_takeover(void **state)
{
	NEED_CLUSTER();
	stalled_writer(0);
}

static void test_stale_writer_fenced(void **state)
{
	NEED_CLUSTER();
	stalled_writer(1);
}

/* A wrong key, a pool that is not there, a name that is no workspace's:
 * refused with what is wrong. */
static void test_refusals(void **state)
{
	kvmem_page_geom g = geom_of(g_seed + 6);
	char args[600], ws[256];

	NEED_CLUSTER();
	ws_name(ws, sizeof(ws), "refused");
	snprintf(args, sizeof(args), "--id kvmem-a --keyring %s/wrong.keyring", g_ceph);
	setenv("CEPH_ARGS", args, 1);
	assert_null(open_writer(ws, &g, 1));
	assert_int_equal(kvmem_last_errno(), EACCES);
	assert_non_null(strstr(kvmem_last_error(), "refused client.kvmem-a"));
	assert_non_null(strstr(kvmem_last_error(), "authentication"));
	assert_int_equal(kvmem_workspace_verify(ws, NULL, 0), -EACCES);
	unsetenv("CEPH_ARGS");

	assert_null(open_writer("rados://nopool/x", &g, 1));
	assert_int_equal(kvmem_last_errno(), ENOENT);
	assert_non_null(strstr(kvmem_last_error(), "no pool 'nopool'"));
	assert_null(open_writer("rados://kvmem/../x", &g, 1));
	assert_int_equal(kvmem_last_errno(), EINVAL);
	assert_null(open_writer("rados://kvmem", &g, 1));
	assert_int_equal(kvmem_last_errno(), EINVAL);
	/* Reading a workspace that is not there creates nothing. */
	assert_null(fx_open(ws, &g, 1 << 20, 0, KVMEM_PAGER_RDONLY, 1));
	assert_int_equal(kvmem_last_errno(), ENOENT);
	assert_non_null(strstr(kvmem_last_error(), "no manifest"));
}

/* The cluster goes away mid-session: the next commit fails within the op
 * timeout, saying so; once it is back the last commit is whole. */
static void test_cluster_gone(void **state)
{
	uint64_t seed = fx_mix(g_seed + 7), t0, committed;
	kvmem_page_geom g = geom_of(g_seed + 7);
	char ws[256];
	kvmem_pager *p;
	int rc;

	NEED_CLUSTER();
	ws_name(ws, sizeof(ws), "gone");
	p = open_writer(ws, &g, 0);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 3 * g.block_tokens + 2), 0);
	assert_int_equal(fx_commit(p, seed, NULL, 0), 0);
	committed = kvmem_pager_tokens(p);
	assert_int_equal(cluster("osd-kill"), 0);
	assert_int_equal(cluster("mon-kill"), 0);
	t0 = kvmem_now_ns();
	rc = fx_append(p, seed, 2 * g.block_tokens);
	if (!rc)
		rc = fx_commit(p, seed, NULL, 0);
	fprintf(stderr, "commit with the cluster gone: %s\n", kvmem_last_error());
	assert_true(rc < 0);
	assert_non_null(strstr(kvmem_last_error(), "no answer from the cluster"));
	assert_true(kvmem_now_ns() - t0 < 60000000000ull);
	kvmem_pager_close(p);
	assert_int_equal(cluster("mon-start"), 0);
	assert_int_equal(cluster("osd-start"), 0);
	assert_int_equal(cluster("wait"), 0);
	assert_int_equal(check_ws(ws, &g, seed), committed);
}

/* verify names a bad page by its workspace and place; salvage keeps the
 * blocks before it, into a directory or a pool; copy is all or nothing. */
static void test_verify_salvage_copy(void **state)
{
	uint64_t seed = fx_mix(g_seed + 8);
	kvmem_page_geom g = geom_of(g_seed + 8);
	char ws[256], ws2[256], ws3[256], dir[256], dir2[300], cmd[1400], want[300];
	kvmem_salvage_report r;
	kvmem_pager_stats st;
	kvmem_pager *p;
	uint64_t n;
	FILE *out;
	char *text = NULL;
	size_t len = 0;

	NEED_CLUSTER();
	ws_name(ws, sizeof(ws), "copy");
	ws_name(ws2, sizeof(ws2), "copy");
	ws_name(ws3, sizeof(ws3), "salvaged");
	assert_non_null(fx_tmpdir(dir, sizeof(dir)));
	snprintf(dir2, sizeof(dir2), "%s/back", dir);
	strcat(dir, "/ws");
	/* A directory, copied into a pool and back. */
	p = open_writer(dir, &g, 0);
	assert_non_null(p);
	assert_int_equal(fx_append(p, seed, 6 * g.block_tokens + 5), 0);
	assert_int_equal(fx_commit(p, seed, "state", 6), 0);
	n = kvmem_pager_tokens(p);
	assert_int_equal(kvmem_pager_close(p), 0);
	assert_int_equal(kvmem_workspace_copy(dir, ws, &r), 0);
	assert_int_equal(r.tokens_kept, n);
	assert_true(r.app_kept);
	assert_int_equal(check_ws(ws, &g, seed), n);
	assert_int_equal(kvmem_workspace_copy(ws, dir2, &r), 0);
	assert_int_equal(check_ws(dir2, &g, seed), n);
	assert_int_equal(kvmem_workspace_copy(ws, dir2, &r), -EEXIST);
	assert_int_equal(kvmem_workspace_copy(dir, ws, &r), -EEXIST);
	assert_int_equal(kvmem_workspace_stats(ws, &st), 0);
	assert_true(st.commits >= 1);

	/* Damage block 3's first page in the pool (objects of 4 MiB: one
	 * object, the byte at its offset). */
	snprintf(cmd, sizeof(cmd), "cd '%s' && rados -c ceph.conf -p kvmem -N '%s' get pages.000000000000 "
		 "pg && printf '\\x5a' | dd of=pg bs=1 seek=%zu conv=notrunc status=none && "
		 "rados -c ceph.conf -p kvmem -N '%s' put pages.000000000000 pg && rm pg",
		 g_ceph, ws + strlen(POOL), 3 * g.n_layers * kvmem_page_stride(&g) + 7, ws + strlen(POOL));
	assert_int_equal(system(cmd), 0);
	out = open_memstream(&text, &len);
	assert_int_equal(kvmem_workspace_verify(ws, out, 0), 1);
	fclose(out);
	snprintf(want, sizeof(want), "%s/pages: page %u (block 3, layer 0)", ws, 3 * g.n_layers);
	assert_non_null(strstr(text, want));
	free(text);
	assert_int_equal(kvmem_workspace_copy(ws, ws2, &r), -EBADMSG);
	assert_non_null(strstr(kvmem_last_error(), "holds an empty workspace"));
	assert_int_equal(check_ws(ws2, &g, seed), 0);
	assert_int_equal(kvmem_workspace_salvage(ws, ws3, &r), 0);
	assert_int_equal(r.blocks_kept, 3);
	assert_int_equal(check_ws(ws3, &g, seed), 3 * g.block_tokens);
	*strrchr(dir, '/') = 0;
	fx_rmtree(dir);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reopen_other_process_and_client),
		cmocka_unit_test(test_second_writer_refused),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_verify_salvage_copy),
		cmocka_unit_test(test_lease_expiry_takeover),
		cmocka_unit_test(test_stale_writer_fenced),
		cmocka_unit_test(test_kill9_writer),
		cmocka_unit_test(test_kill9_osd),
		cmocka_unit_test(test_cluster_gone),
	};
	ssize_t n;

	if (argc > 1 && !strcmp(argv[1], "--child"))
		return child_main(argc, argv);
	n = readlink("/proc/self/exe", g_self, sizeof(g_self) - 1);
	g_self[n > 0 ? n : 0] = 0;
	g_seed = test_rng_fresh_seed("test_store_rados");
	/* KVMEM_TEST_FILTER=test_kill9_osd runs the cases matching it only. */
	if (getenv("KVMEM_TEST_FILTER") && *getenv("KVMEM_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KVMEM_TEST_FILTER"));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
