// SPDX-License-Identifier: MIT
/*
 * The RADOS store (wstore.h): a workspace as the objects of one namespace of
 * a Ceph pool, `rados://POOL/NAME` (namespace NAME). Layout and promises:
 * Documentation/formats.md, "Workspace in RADOS"; Documentation/pager.md,
 * "What the store promises".
 *
 *   manifest            the manifest's bytes (as a directory's), replaced
 *                       whole by one write operation guarded by the
 *                       writer's lock and the generation it replaces; its
 *                       xattrs: kvmem.gen (that generation), kvmem.object
 *                       (bytes per data object), kvmem.holder (who writes)
 *   <stream>.<12 hex>   the data streams (pages, tokens, index, sums,
 *                       tail) cut into objects of kvmem.object bytes
 *   stats               the counters, advisory
 *
 * One writer: an exclusive RADOS lock on `manifest` ("kvmem.writer") with a
 * lease, renewed by a thread every lease/3. The writer refuses to write
 * once its lease may have lapsed (a local deadline, lease/4 short of the
 * OSD's), and every manifest replacement asserts the lock on the OSD in the
 * same operation, so a writer that lost its lease cannot commit. A writer
 * that takes over from one that died or stalled blocklists the old
 * holder's address first (kvmem.holder) and waits for the OSD map that
 * carries it, so nothing the old one still had in flight can land after
 * the take-over. A clean close removes kvmem.holder and unlocks.
 *
 * Durability: an acknowledged RADOS write is on every replica, so sync only
 * waits for what is in flight. Small streams (tokens, index, sums, tail)
 * are gathered in memory and written at sync, or every 4 MiB; pages are
 * written as their block is staged out, many requests in flight, and read
 * straight into the host pool. Nothing is printed: librados's own stderr
 * chatter is turned off and every failure is a message naming the
 * workspace and the object or stream.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "pager/pager_int.h"
#include "pager/rados_dl.h"

#ifndef KVMEM_HAVE_RADOS
int ws_rados_open(const char *where, int flags, struct ws_store **out)
{
	*out = NULL;
	return kvmem_error(EPROTONOSUPPORT, "%s: this kvmem was built without librados-dev "
			   "(<rados/librados.h>): RADOS workspaces are not available", where);
}

int ws_rados_destroy(const char *where)
{
	struct ws_store *s;

	return ws_rados_open(where, 0, &s);
}
#else

#define R kvmem_rados
#define MANIFEST "manifest"
#define LOCK_NAME "kvmem.writer"
#define XA_GEN "kvmem.gen"
#define XA_OBJECT "kvmem.object"
#define XA_HOLDER "kvmem.holder"
#define DEFAULT_OBJECT (4ull << 20)
#define DEFAULT_LEASE_S 30
#define DEFAULT_TIMEOUT_S 30
#define FLUSH_BYTES (4u << 20)
#define CHUNK 4096		/* BlueStore's allocation unit: writes cover whole ones */
#define FENCE_S 3600		/* how long a replaced writer stays blocklisted */
#ifndef EBLOCKLISTED
#define EBLOCKLISTED ESHUTDOWN	/* what librados returns to a fenced client */
#endif

struct rjob;

/* One object's piece of an asynchronous request. */
struct rpart {
	struct rjob *j;
	rados_completion_t c;
	uint64_t at;		/* offset of the piece within the request */
	size_t want;
	int ret;
};

/* An io_req in flight: its pieces; done when the last one lands. */
struct rjob {
	struct io_req *r;
	struct rados_store *rs;
	unsigned n, left;
	struct rjob *next;
	struct rpart part[];
};

/* Bytes appended to a small stream, not yet written, and the stream's
 * last 4 KiB chunk as written ([cbase, cbase + chave), cbase aligned;
 * chave -1: not known yet), so every write covers whole chunks. */
struct wbuf {
	uint64_t off;
	uint8_t *buf;
	size_t len, cap;
	uint64_t cbase;
	ssize_t chave;
	uint8_t chunk[CHUNK];
};

struct rados_store {
	struct ws_store s;
	rados_t cl;
	rados_ioctx_t io;
	int connected;
	char pool[256], ns[256], client[128], addr[256];
	uint64_t obj;			/* bytes per data object */
	unsigned timeout_s;		/* rados_osd_op_timeout in force */

	/* The writer's lease. */
	int locked;
	char cookie[40];
	unsigned lease_s;
	int trust_lease;		/* KVMEM_RADOS_FAULT=trust-lease (tests) */
	pthread_t renewer;
	int renewing, stop;
	pthread_mutex_t lmu;
	pthread_cond_t lcv;
	char errbuf[768];		/* r_strerr's words */
	_Atomic uint64_t deadline;	/* monotonic ns: no write is sent after it */
	_Atomic int lost;		/* errno the lease was lost with (0: held) */
	char lost_why[512];		/* under lmu */

	/* Completions of page requests, handed to reap. */
	pthread_mutex_t qmu;
	pthread_cond_t qcv;
	struct rjob *done_head, **done_tail;

	/* Small-stream writes gathered, and those in flight. */
	struct wbuf wb[WS_N_STREAMS];
	rados_completion_t *pend;
	int *pend_stream;
	size_t n_pend, cap_pend;
	unsigned pend_streams;		/* bit per stream with writes in flight */
};

#define FENCED "fenced off (blocklisted) by a writer that took the workspace over"

static void lease_lose(struct rados_store *rs, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static struct rados_store *RS(struct ws_store *s)
{
	return (struct rados_store *)s;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void oid_of(char *oid, size_t len, int stream, uint64_t k)
{
	snprintf(oid, len, "%s.%012" PRIx64, ws_data_files[stream], k);
}

/* A failure talking to the cluster, worded for what it says. */
static int cluster_error(struct rados_store *rs, int rc, const char *what)
{
	const char *n = rs->s.name;

	switch (-rc) {
	case ETIMEDOUT:
		return kvmem_error(ETIMEDOUT, "%s: %s: no answer from the cluster within %u s "
				   "(rados_osd_op_timeout): is it up?", n, what, rs->timeout_s);
	case EBLOCKLISTED:
		lease_lose(rs, EBLOCKLISTED, "this client was " FENCED);
		return kvmem_error(ENOLCK, "%s: %s: this client was %s", n, what, FENCED);
	case EACCES:
	case EPERM:
		return kvmem_error(EACCES, "%s: %s: %s is not allowed to (check the key's caps: "
				   "Documentation/deploy.md)", n, what, rs->client);
	case EDQUOT:
	case ENOSPC:
		return kvmem_error(-rc, "%s: %s: the pool is full", n, what);
	}
	return kvmem_error(-rc, "%s: %s: %s", n, what, strerror(-rc));
}

/* ---- the lease ------------------------------------------------------------ */

static void lease_lose(struct rados_store *rs, int err, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&rs->lmu);
	if (!atomic_load(&rs->lost)) {
		va_start(ap, fmt);
		vsnprintf(rs->lost_why, sizeof(rs->lost_why), fmt, ap);
		va_end(ap);
		atomic_store(&rs->lost, err);
	}
	pthread_mutex_unlock(&rs->lmu);
}

/* 0 while this writer may send a write, else -ENOLCK. No message. */
static int lease_ok(struct rados_store *rs)
{
	if (!rs->locked)
		return -EBADF;
	if (atomic_load(&rs->lost))
		return -ENOLCK;
	if (!rs->trust_lease && mono_ns() >= atomic_load(&rs->deadline)) {
		lease_lose(rs, ETIMEDOUT, "the lease was not renewed within %u s", rs->lease_s * 3 / 4);
		return -ENOLCK;
	}
	return 0;
}

/* The message for a lost lease (after lease_ok said -ENOLCK). */
static int lease_error(struct rados_store *rs, const char *what)
{
	char why[512];

	pthread_mutex_lock(&rs->lmu);
	snprintf(why, sizeof(why), "%s", rs->lost_why[0] ? rs->lost_why : "not held");
	pthread_mutex_unlock(&rs->lmu);
	return kvmem_error(ENOLCK, "%s: %s: this writer lost the workspace (%s); it stopped "
			   "writing, and the workspace stays at its last commit", rs->s.name, what,
			   why);
}

static uint64_t lease_margin_ns(const struct rados_store *rs)
{
	return (uint64_t)rs->lease_s * 1000000000ull / 4;
}

/* Take (flags 0) or renew (MUST_RENEW) the lock; on success the deadline
 * moves to lease - margin after the request was sent. */
static int lock_call(struct rados_store *rs, uint8_t flags)
{
	struct timeval tv = { .tv_sec = rs->lease_s };
	uint64_t t0 = mono_ns();
	int rc = R.rados_lock_exclusive(rs->io, MANIFEST, LOCK_NAME, rs->cookie, "kvmem writer", &tv,
					flags);

	if (rc == 0)
		atomic_store(&rs->deadline, t0 + (uint64_t)rs->lease_s * 1000000000ull -
			     lease_margin_ns(rs));
	return rc;
}

static void *renew_main(void *arg)
{
	struct rados_store *rs = arg;
	uint64_t every = (uint64_t)rs->lease_s * 1000000000ull / 3, next = mono_ns() + every;

	pthread_mutex_lock(&rs->lmu);
	while (!rs->stop) {
		struct timespec ts = { .tv_sec = next / 1000000000ull, .tv_nsec = next % 1000000000ull };
		uint64_t t;
		int rc;

		if (pthread_cond_timedwait(&rs->lcv, &rs->lmu, &ts) != ETIMEDOUT || rs->stop)
			continue;
		pthread_mutex_unlock(&rs->lmu);
		rc = lock_call(rs, LIBRADOS_LOCK_FLAG_MUST_RENEW);
		t = mono_ns();
		pthread_mutex_lock(&rs->lmu);
		if (rc == 0) {
			next = t + every;
			continue;
		}
		/* A slow cluster may still answer before the deadline (a
		 * writer told to trust its lease, a test's, keeps trying). */
		if ((rc == -ETIMEDOUT && t < atomic_load(&rs->deadline)) || rs->trust_lease) {
			next = t + 1000000000ull;
			continue;
		}
		pthread_mutex_unlock(&rs->lmu);
		lease_lose(rs, -rc, "renewing its lease failed: %s",
			   rc == -ENOENT ? "it had lapsed" : rc == -EBUSY ?
			   "another writer holds the lock" : rc == -EBLOCKLISTED ?
			   "this client was blocklisted" : strerror(-rc));
		pthread_mutex_lock(&rs->lmu);
		break;
	}
	pthread_mutex_unlock(&rs->lmu);
	return NULL;
}

/* cls_lock's assert_locked request (its cls_lock_assert_op encoding: a
 * versioned struct of the lock name, type 1 = exclusive, cookie, tag ""),
 * so a write operation fails on the OSD unless this writer holds the lock. */
static size_t assert_locked_arg(const struct rados_store *rs, char *buf)
{
	const char *str[3] = { LOCK_NAME, rs->cookie, "" };
	size_t o = 6;

	for (int i = 0; i < 3; i++) {
		uint32_t n = strlen(str[i]);

		memcpy(buf + o, &n, 4);
		memcpy(buf + o + 4, str[i], n);
		o += 4 + n;
		if (i == 0)
			buf[o++] = 1;
	}
	buf[0] = 1;	/* struct version */
	buf[1] = 1;	/* oldest compatible */
	{
		uint32_t len = o - 6;

		memcpy(buf + 2, &len, 4);
	}
	return o;
}

/* A write operation on the manifest object that only applies while this
 * writer holds the lock. */
static rados_write_op_t locked_op(struct rados_store *rs, char *arg, int *prval)
{
	rados_write_op_t op = R.rados_create_write_op();

	if (op)
		R.rados_write_op_exec(op, "lock", "assert_locked", arg, assert_locked_arg(rs, arg),
				      prval);
	return op;
}

/* The holder's own words, from kvmem.holder ("" when none). */
static void holder_read(struct rados_store *rs, char *buf, size_t len)
{
	int n = R.rados_getxattr(rs->io, MANIFEST, XA_HOLDER, buf, len - 1);

	buf[n > 0 ? n : 0] = 0;
}

/* Fence the writer named in kvmem.holder off the OSDs (it died or stalled:
 * a clean close removes it) before this one writes anything. */
static int fence_previous(struct rados_store *rs)
{
	char holder[512], addr[256];
	int rc;

	holder_read(rs, holder, sizeof(holder));
	if (sscanf(holder, "%255s", addr) != 1 || !strcmp(addr, rs->addr))
		return 0;
	rc = R.rados_blocklist_add(rs->cl, addr, FENCE_S);
	if (rc == -EACCES || rc == -EPERM)
		return kvmem_error(EACCES, "%s: the previous writer (%s) did not let the workspace go "
				   "cleanly, and %s may not fence it off (blocklist): its key needs "
				   "the mon cap 'allow command \"osd blocklist\"' (profile rbd); "
				   "refusing to take the workspace over unfenced", rs->s.name, holder,
				   rs->client);
	if (rc < 0)
		return cluster_error(rs, rc, "fencing off the previous writer");
	rc = R.rados_wait_for_latest_osdmap(rs->cl);
	return rc < 0 ? cluster_error(rs, rc, "waiting for the OSD map that fences the previous "
				      "writer") : 0;
}

/* Say who holds the workspace (kvmem.holder): the address the next
 * writer fences if this one does not let go cleanly. */
static int holder_write(struct rados_store *rs)
{
	char arg[256], host[256] = "", holder[768];
	rados_write_op_t op;
	int prval = 0, rc;

	gethostname(host, sizeof(host) - 1);
	snprintf(holder, sizeof(holder), "%s %s, process %d on host %s", rs->addr, rs->client,
		 (int)getpid(), host);
	if (!(op = locked_op(rs, arg, &prval)))
		return kvmem_error(ENOMEM, "%s: out of memory", rs->s.name);
	R.rados_write_op_setxattr(op, XA_HOLDER, holder, strlen(holder));
	rc = R.rados_write_op_operate(op, rs->io, MANIFEST, NULL, 0);
	R.rados_release_write_op(op);
	return rc < 0 ? cluster_error(rs, rc, "naming the writer") : 0;
}

/* The lock, the previous holder fenced, this one named, the lease renewed
 * from now on: before this writer's first write, so whatever it writes can
 * be fenced too. */
static int r_lock(struct ws_store *s)
{
	struct rados_store *rs = RS(s);
	char holder[512];
	int rc;

	rc = lock_call(rs, 0);
	if (rc == -EBUSY) {
		holder_read(rs, holder, sizeof(holder));
		return kvmem_error(EBUSY, "%s: in use by another writer (%s, holding the lock on %s/"
				   MANIFEST "); a workspace has one writer at a time (read-only "
				   "opens, kvmem verify and kvmem stat are fine); a writer that "
				   "stops renewing its lease loses it within %u s", s->name,
				   holder[0] ? holder : "one that has not said who it is", s->name,
				   rs->lease_s);
	}
	if (rc < 0)
		return cluster_error(rs, rc, "taking the writer's lock");
	rs->locked = 1;
	if ((rc = fence_previous(rs)) < 0 || (rc = holder_write(rs)) < 0)
		return rc;
	rs->stop = 0;
	if (pthread_create(&rs->renewer, NULL, renew_main, rs) != 0)
		return kvmem_error(EAGAIN, "%s: cannot start the lease's renewal thread", s->name);
	rs->renewing = 1;
	return 0;
}

/* The holder is named at lock time already; the open's last step only
 * checks that the lease still holds. */
static int r_claim(struct ws_store *s)
{
	struct rados_store *rs = RS(s);

	return lease_ok(rs) < 0 ? lease_error(rs, "claiming the workspace") : 0;
}

/* ---- small writes in flight ---------------------------------------------- */

static int pend_add(struct rados_store *rs, rados_completion_t c, int stream)
{
	if (rs->n_pend == rs->cap_pend) {
		size_t n = rs->cap_pend ? 2 * rs->cap_pend : 64;
		rados_completion_t *p = realloc(rs->pend, n * sizeof(*p));
		int *ps;

		if (!p)
			return -ENOMEM;
		rs->pend = p;
		ps = realloc(rs->pend_stream, n * sizeof(*ps));
		if (!ps)
			return -ENOMEM;
		rs->pend_stream = ps;
		rs->cap_pend = n;
	}
	rs->pend[rs->n_pend] = c;
	rs->pend_stream[rs->n_pend++] = stream;
	if (stream >= 0)
		rs->pend_streams |= 1u << stream;
	return 0;
}

/* Wait for every small write in flight; the first failure of a stream's
 * (-errno) and that stream (an aux object's, the advisory counters', is
 * no failure). */
static int pend_wait(struct rados_store *rs, int *stream)
{
	int first = 0;

	for (size_t i = 0; i < rs->n_pend; i++) {
		int rc;

		R.rados_aio_wait_for_complete(rs->pend[i]);
		rc = R.rados_aio_get_return_value(rs->pend[i]);
		R.rados_aio_release(rs->pend[i]);
		if (rc == -EBLOCKLISTED) {
			lease_lose(rs, EBLOCKLISTED, "this client was " FENCED);
			rc = -ENOLCK;
		}
		if (rc < 0 && !first && rs->pend_stream[i] >= 0) {
			first = rc;
			*stream = rs->pend_stream[i];
		}
	}
	rs->n_pend = 0;
	rs->pend_streams = 0;
	return first;
}

static int range_read(struct rados_store *rs, int i, void *buf, size_t len, uint64_t off);

/*
 * Send what stream i gathered, one write per object it spans, as whole 4
 * KiB chunks: the bytes of the first chunk before it (as written, and
 * committed) go again in front, zeros fill the last one. A write smaller
 * than BlueStore's allocation unit is a deferred write (logged, applied
 * later), and Ceph 16's replay of those after a crash can lose them
 * (tracker.ceph.com/issues/68060: the OSD then finds bad checksums);
 * whole chunks are written in place of new ones, never deferred (with
 * bluestore_prefer_deferred_size 0, as Documentation/deploy.md says).
 * Rewriting committed bytes with the same bytes is safe: an object write
 * is atomic.
 */
static int wb_flush(struct rados_store *rs, int i)
{
	struct wbuf *w = &rs->wb[i];
	uint64_t base = w->off / CHUNK * CHUNK, end;
	size_t pre = w->off - base, total, padded, done = 0;
	uint8_t *out;
	int rc, stream;

	if (!w->len)
		return 0;
	if ((rc = lease_ok(rs)) < 0) {
		w->len = 0;
		return rc;
	}
	if (pre && (w->cbase != base || w->chave < (ssize_t)pre)) {
		/* The chunk's head, written before this open: read it once. */
		if (rs->pend_streams & (1u << i))
			pend_wait(rs, &stream);
		if ((rc = range_read(rs, i, w->chunk, pre, base)) < 0) {
			w->len = 0;
			return rc;
		}
		w->cbase = base;
		w->chave = pre;
	}
	total = pre + w->len;
	padded = (total + CHUNK - 1) / CHUNK * CHUNK;
	if (!(out = malloc(padded)))
		return -ENOMEM;
	memcpy(out, w->chunk, pre);
	memcpy(out + pre, w->buf, w->len);
	memset(out + total, 0, padded - total);
	while (done < padded) {
		uint64_t at = base + done, k = at / rs->obj, in = at % rs->obj;
		size_t n = padded - done < rs->obj - in ? padded - done : rs->obj - in;
		rados_completion_t c;
		char oid[64];

		oid_of(oid, sizeof(oid), i, k);
		if (R.rados_aio_create_completion2(NULL, NULL, &c) < 0) {
			rc = -ENOMEM;
			break;
		}
		rc = R.rados_aio_write(rs->io, oid, c, (const char *)out + done, n, in);
		if (rc < 0) {
			R.rados_aio_release(c);
			break;
		}
		if ((rc = pend_add(rs, c, i)) < 0) {
			R.rados_aio_wait_for_complete(c);
			R.rados_aio_release(c);
			break;
		}
		done += n;
	}
	/* The new last chunk, for the next append. */
	end = w->off + w->len;
	w->cbase = end / CHUNK * CHUNK;
	w->chave = end - w->cbase;
	memcpy(w->chunk, out + (w->cbase - base), w->chave);
	free(out);
	w->len = 0;
	return done < padded ? (rc < 0 ? rc : -EIO) : 0;
}

/* ---- streams ------------------------------------------------------------- */

/* Read [off, off + len) of stream i whole, every object at once: 0,
 * -ENODATA when the stream ends first, -errno. */
static int range_read(struct rados_store *rs, int i, void *buf, size_t len, uint64_t off)
{
	size_t n = len ? (off + len - 1) / rs->obj - off / rs->obj + 1 : 0, k = 0;
	rados_completion_t *c;
	size_t *want;
	int rc = 0;

	if (!n)
		return 0;
	c = calloc(n, sizeof(*c));
	want = calloc(n, sizeof(*want));
	if (!c || !want) {
		free(c);
		free(want);
		return -ENOMEM;
	}
	for (size_t done = 0; done < len && !rc; k++) {
		uint64_t at = off + done, in = at % rs->obj;
		char oid[64];

		want[k] = len - done < rs->obj - in ? len - done : rs->obj - in;
		oid_of(oid, sizeof(oid), i, at / rs->obj);
		if ((rc = R.rados_aio_create_completion2(NULL, NULL, &c[k])) < 0)
			break;
		if ((rc = R.rados_aio_read(rs->io, oid, c[k], (char *)buf + done, want[k], in)) < 0) {
			R.rados_aio_release(c[k]);
			c[k] = NULL;
			break;
		}
		done += want[k];
	}
	for (size_t j = 0; j < n; j++) {
		int ret;

		if (!c[j])
			continue;
		R.rados_aio_wait_for_complete(c[j]);
		ret = R.rados_aio_get_return_value(c[j]);
		R.rados_aio_release(c[j]);
		if (rc)
			continue;
		if (ret == -ENOENT || (ret >= 0 && (size_t)ret < want[j]))
			rc = -ENODATA;
		else if (ret < 0)
			rc = ret;
	}
	free(c);
	free(want);
	return rc;
}

static int r_open_stream(struct ws_store *s, int i)
{
	return 0;	/* objects are named, not opened */
}

/* Bytes stream i holds: the objects up to the one holding byte need - 1,
 * taken to be whole (a missing one in between is found when it is read),
 * and what follows it. */
static int r_size(struct ws_store *s, int i, uint64_t need, uint64_t *bytes)
{
	struct rados_store *rs = RS(s);
	int64_t k = need ? (int64_t)((need - 1) / rs->obj) : 0;
	char oid[64];
	uint64_t sz;
	time_t mt;
	int rc;

	for (;; k--) {
		if (k < 0) {
			*bytes = 0;
			return 0;
		}
		oid_of(oid, sizeof(oid), i, (uint64_t)k);
		rc = R.rados_stat(rs->io, oid, &sz, &mt);
		if (rc == 0)
			break;
		if (rc != -ENOENT)
			return rc;
	}
	/* Whole objects after it: more than the commit needs. */
	while (sz == rs->obj) {
		uint64_t more;

		oid_of(oid, sizeof(oid), i, (uint64_t)k + 1);
		if (R.rados_stat(rs->io, oid, &more, &mt) < 0)
			break;
		k++;
		sz = more;
	}
	*bytes = (uint64_t)k * rs->obj + sz;
	return 0;
}

static int r_read(struct ws_store *s, int i, void *buf, size_t len, uint64_t off)
{
	struct rados_store *rs = RS(s);
	struct wbuf *w = &rs->wb[i];
	int stream;

	/* Bytes gathered or in flight are read back after they land. */
	if (w->len && off < w->off + w->len && w->off < off + len)
		wb_flush(rs, i);
	if (rs->pend_streams & (1u << i))
		pend_wait(rs, &stream);	/* a failure is sync's to report */
	return range_read(rs, i, buf, len, off);
}

static int r_write(struct ws_store *s, int i, const void *buf, size_t len, uint64_t off)
{
	struct rados_store *rs = RS(s);
	struct wbuf *w = &rs->wb[i];
	int rc;

	if (w->len && off != w->off + w->len && (rc = wb_flush(rs, i)) < 0)
		return rc;
	if (!w->len)
		w->off = off;
	if (w->len + len > w->cap) {
		size_t cap = w->cap ? w->cap : 65536;
		uint8_t *b;

		while (cap < w->len + len)
			cap *= 2;
		if (!(b = realloc(w->buf, cap)))
			return -ENOMEM;
		w->buf = b;
		w->cap = cap;
	}
	memcpy(w->buf + w->len, buf, len);
	w->len += len;
	return w->len >= FLUSH_BYTES ? wb_flush(rs, i) : 0;
}

static int r_sync(struct ws_store *s)
{
	struct rados_store *rs = RS(s);
	int rc = 0, err, stream = -1;
	char what[64];

	for (int i = 0; i < WS_N_STREAMS; i++)
		if (!rc)
			rc = wb_flush(rs, i);
	/* Acknowledged writes are on every replica: waiting is enough. */
	err = pend_wait(rs, &stream);
	if (rc == -ENOLCK || err == -ENOLCK)
		return lease_error(rs, "making the appended data durable");
	if (rc < 0)
		return cluster_error(rs, rc, "writing the appended data");
	snprintf(what, sizeof(what), "writing %s", stream >= 0 ? ws_data_files[stream] : "");
	return err < 0 ? cluster_error(rs, err, what) : 0;
}

static int r_begin_write(struct ws_store *s, const uint64_t need[WS_N_STREAMS])
{
	/* Nothing to cut: bytes past the commit are written over by the
	 * appends that follow, and read by nobody. */
	return 0;
}

/* ---- the manifest -------------------------------------------------------- */

/* A whole object's bytes (one read: one version of it). */
static int whole_read(struct rados_store *rs, const char *oid, uint64_t max, uint8_t **out,
		      size_t *len)
{
	uint64_t size;
	time_t mt;
	int rc;

	*out = NULL;
	*len = 0;
	if ((rc = R.rados_stat(rs->io, oid, &size, &mt)) < 0)
		return rc;
	for (;;) {
		size_t cap = size + 65536;
		uint8_t *buf;

		if (size > max)
			return -EFBIG;
		if (!(buf = malloc(cap)))
			return -ENOMEM;
		rc = R.rados_read(rs->io, oid, (char *)buf, cap, 0);
		if (rc < 0) {
			free(buf);
			return rc;
		}
		if ((size_t)rc < cap) {
			*out = buf;
			*len = rc;
			return 0;
		}
		free(buf);	/* it grew meanwhile: again, larger */
		size = 2 * cap;
	}
}

static int r_mf_load(struct ws_store *s, uint8_t **buf, size_t *len)
{
	struct rados_store *rs = RS(s);
	char obj[32];
	int rc, n;

	rc = whole_read(rs, MANIFEST, KVMEM_PAGER_APP_MAX + (1 << 20), buf, len);
	if (rc == -EFBIG)
		return kvmem_error(EBADMSG, "%s/" MANIFEST ": too large to be a manifest", s->name);
	if (rc < 0 && rc != -ENOENT)
		return cluster_error(rs, rc, "reading " MANIFEST);
	/* The lock alone (a creation cut short) is no manifest. */
	if (rc == -ENOENT || !*len) {
		free(*buf);
		*buf = NULL;
		return kvmem_error(ENOENT, "%s/" MANIFEST ": %s", s->name, strerror(ENOENT));
	}
	n = R.rados_getxattr(rs->io, MANIFEST, XA_OBJECT, obj, sizeof(obj) - 1);
	if (n > 0) {
		obj[n] = 0;
		rs->obj = strtoull(obj, NULL, 10);
	}
	if (n <= 0 || rs->obj < KVMEM_IO_ALIGN || rs->obj > (1ull << 30)) {
		free(*buf);
		*buf = NULL;
		return kvmem_error(EBADMSG, "%s/" MANIFEST ": no valid " XA_OBJECT " attribute: "
				   "corrupt", s->name);
	}
	return 0;
}

static int r_mf_replace(struct ws_store *s, const void *buf, size_t len, uint64_t old_gen,
			uint64_t new_gen)
{
	struct rados_store *rs = RS(s);
	char arg[256], old[24] = "", gen[24];
	rados_write_op_t op;
	int prval = 0, rc;

	if (lease_ok(rs) < 0)
		return lease_error(rs, "writing " MANIFEST);
	if (old_gen != UINT64_MAX)
		snprintf(old, sizeof(old), "%020" PRIu64, old_gen);
	snprintf(gen, sizeof(gen), "%020" PRIu64, new_gen);
	if (!(op = locked_op(rs, arg, &prval)))
		return kvmem_error(ENOMEM, "%s: out of memory", s->name);
	/* Replaced only over the generation this writer read: an absent
	 * attribute compares as "" (no manifest yet). */
	R.rados_write_op_cmpxattr(op, XA_GEN, LIBRADOS_CMPXATTR_OP_EQ, old, strlen(old));
	R.rados_write_op_write_full(op, buf, len);
	R.rados_write_op_setxattr(op, XA_GEN, gen, strlen(gen));
	rc = R.rados_write_op_operate(op, rs->io, MANIFEST, NULL, 0);
	R.rados_release_write_op(op);
	if (rc == -ECANCELED) {
		lease_lose(rs, ECANCELED, "another writer committed after generation %s", old);
		return lease_error(rs, "replacing " MANIFEST);
	}
	if (rc == -EBUSY) {
		lease_lose(rs, EBUSY, "the OSD says it no longer holds the lock");
		return lease_error(rs, "replacing " MANIFEST);
	}
	if (rc == -ETIMEDOUT)
		return kvmem_error(ETIMEDOUT, "%s/" MANIFEST ": no answer from the cluster within %u s: "
				   "this commit may or may not have been made; reopen to see",
				   s->name, rs->timeout_s);
	return rc < 0 ? cluster_error(rs, rc, "replacing " MANIFEST) : 0;
}

/* No manifest: refuse to create over workspace objects left without one. */
static int r_may_create(struct ws_store *s, int flags)
{
	struct rados_store *rs = RS(s);
	const char *names[WS_N_STREAMS + 1];
	char oids[WS_N_STREAMS][64];
	uint64_t sz;
	time_t mt;

	for (int i = 0; i < WS_N_STREAMS; i++) {
		oid_of(oids[i], sizeof(oids[i]), i, 0);
		names[i] = oids[i];
	}
	names[WS_N_STREAMS] = "stats";
	for (int i = 0; i <= WS_N_STREAMS; i++) {
		int rc = R.rados_stat(rs->io, names[i], &sz, &mt);

		if (rc == 0)
			return kvmem_error(ENOENT, "%s: no manifest, but the namespace holds workspace "
					   "objects ('%s'): a damaged workspace, not an empty one; "
					   "refusing to create a new workspace over it", s->name,
					   names[i]);
		if (rc != -ENOENT)
			return cluster_error(rs, rc, "looking for workspace objects");
	}
	if (!(flags & KVMEM_PAGER_CREATE) || s->rdonly)
		return kvmem_error(ENOENT, "%s: not a kvmem workspace (no manifest)", s->name);
	return 0;
}

/* Objects of a few MiB holding whole blocks, so a block moves as one
 * request; a block larger than that spans objects of the few MiB, written
 * and read in parallel pieces (one object each, on different PGs). */
static int r_create(struct ws_store *s, uint64_t extent)
{
	struct rados_store *rs = RS(s);
	const char *env = getenv("KVMEM_RADOS_OBJECT");
	uint64_t want = env && *env ? strtoull(env, NULL, 10) : DEFAULT_OBJECT;
	char arg[256], obj[32];
	rados_write_op_t op;
	int prval = 0, rc;

	if (want < KVMEM_IO_ALIGN)
		want = DEFAULT_OBJECT;
	rs->obj = want < extent ? round_up(want, KVMEM_IO_ALIGN) : want / extent * extent;
	if (rs->obj > (1ull << 30))
		rs->obj = round_up(1ull << 30, KVMEM_IO_ALIGN);
	if (lease_ok(rs) < 0)
		return lease_error(rs, "creating the workspace");
	snprintf(obj, sizeof(obj), "%" PRIu64, rs->obj);
	if (!(op = locked_op(rs, arg, &prval)))
		return kvmem_error(ENOMEM, "%s: out of memory", s->name);
	R.rados_write_op_setxattr(op, XA_OBJECT, obj, strlen(obj));
	rc = R.rados_write_op_operate(op, rs->io, MANIFEST, NULL, 0);
	R.rados_release_write_op(op);
	return rc < 0 ? cluster_error(rs, rc, "creating the workspace") : 0;
}

/* ---- asynchronous page I/O ---------------------------------------------- */

static int r_io_setup(struct ws_store *s, struct kvmem_io *io, unsigned depth,
		      void *const *bases, const size_t *lens, unsigned n)
{
	return io_init_reqs(io, depth);
}

static void job_land(struct rjob *j)
{
	struct rados_store *rs = j->rs;

	pthread_mutex_lock(&rs->qmu);
	if (--j->left == 0) {
		j->next = NULL;
		*rs->done_tail = j;
		rs->done_tail = &j->next;
		pthread_cond_signal(&rs->qcv);
	}
	pthread_mutex_unlock(&rs->qmu);
}

/* librados's completion thread: one piece landed. */
static void part_done(rados_completion_t c, void *arg)
{
	struct rpart *pt = arg;

	pt->ret = R.rados_aio_get_return_value(c);
	job_land(pt->j);
}

static int r_submit(struct ws_store *s, struct kvmem_io *io, struct io_req *r)
{
	struct rados_store *rs = RS(s);
	uint64_t first = r->off / rs->obj, last = r->len ? (r->off + r->len - 1) / rs->obj : first;
	unsigned n = (unsigned)(last - first + 1);
	struct rjob *j = calloc(1, sizeof(*j) + n * sizeof(j->part[0]));
	size_t done = 0;
	int stop = 0;

	if (!j)
		return -ENOMEM;
	j->r = r;
	j->rs = rs;
	j->n = n;
	j->left = n + 1;	/* + 1: held until every piece is sent */
	r->t_submit = kvmem_now_ns();
	io->inflight++;
	if (r->kind == IO_WRITE && lease_ok(rs) < 0)
		stop = -ENOLCK;
	for (unsigned k = 0; k < n; k++) {
		struct rpart *pt = &j->part[k];
		uint64_t at = r->off + done, in = at % rs->obj;
		char oid[64];
		int rc;

		pt->j = j;
		pt->at = done;
		pt->want = r->len - done < rs->obj - in ? r->len - done : rs->obj - in;
		done += pt->want;
		if (stop || (rc = R.rados_aio_create_completion2(pt, part_done, &pt->c)) < 0) {
			pt->ret = stop ? stop : -ENOMEM;
			pt->c = NULL;
			job_land(j);
			continue;
		}
		oid_of(oid, sizeof(oid), WS_PAGES, at / rs->obj);
		rc = r->kind == IO_READ ?
			R.rados_aio_read(rs->io, oid, pt->c, (char *)r->buf + pt->at, pt->want, in) :
			R.rados_aio_write(rs->io, oid, pt->c, (const char *)r->buf + pt->at, pt->want, in);
		if (rc < 0) {
			R.rados_aio_release(pt->c);
			pt->c = NULL;
			pt->ret = rc;
			job_land(j);
		}
	}
	job_land(j);
	return 0;
}

/* The request's result from its pieces: bytes of the whole (reads: up to
 * the first piece that came back short), or the first failure. */
static int job_result(struct rjob *j)
{
	for (unsigned k = 0; k < j->n; k++) {
		struct rpart *pt = &j->part[k];

		if (pt->c)
			R.rados_aio_release(pt->c);
	}
	for (unsigned k = 0; k < j->n; k++) {
		struct rpart *pt = &j->part[k];

		if (j->r->kind == IO_READ && (pt->ret == -ENOENT ||
					      (pt->ret >= 0 && (size_t)pt->ret < pt->want)))
			return (int)(pt->at + (pt->ret > 0 ? (size_t)pt->ret : 0));
		if (pt->ret == -EBLOCKLISTED) {
			lease_lose(j->rs, EBLOCKLISTED, "this client was " FENCED);
			return -ENOLCK;
		}
		if (pt->ret < 0)
			return pt->ret;
	}
	return (int)j->r->len;
}

static int r_reap(struct ws_store *s, struct kvmem_io *io, unsigned wait, ws_done_fn done,
		  void *arg)
{
	struct rados_store *rs = RS(s);
	unsigned got = 0;

	if (wait > io->inflight)
		wait = io->inflight;
	for (;;) {
		struct rjob *j;

		pthread_mutex_lock(&rs->qmu);
		while (!rs->done_head && got < wait)
			pthread_cond_wait(&rs->qcv, &rs->qmu);
		j = rs->done_head;
		rs->done_head = NULL;
		rs->done_tail = &rs->done_head;
		pthread_mutex_unlock(&rs->qmu);
		if (!j)
			break;
		while (j) {
			struct rjob *next = j->next;
			struct io_req *r = j->r;

			r->res = job_result(j);
			free(j);
			io->inflight--;
			if (fault_fire(r->kind))
				r->res = -EIO;
			r->done = 1;
			done(arg, r);
			got++;
			j = next;
		}
	}
	return (int)got;
}

/* ---- small objects beside the workspace -------------------------------- */

static int r_aux_read(struct ws_store *s, const char *name, char **buf, size_t *len)
{
	struct rados_store *rs = RS(s);
	uint8_t *b;
	int rc = whole_read(rs, name, 16u << 20, &b, len);

	*buf = NULL;
	if (rc == -ENOENT)
		return kvmem_error(ENOENT, "%s/%s: %s", s->name, name, strerror(ENOENT));
	if (rc == -EFBIG)
		return kvmem_error(EFBIG, "%s/%s: too large", s->name, name);
	if (rc < 0)
		return cluster_error(rs, rc, name);
	/* A terminating NUL, as a directory's reader gives. */
	b = realloc(b, *len + 1);
	if (!b)
		return kvmem_error(ENOMEM, "%s/%s: out of memory", s->name, name);
	b[*len] = 0;
	*buf = (char *)b;
	return 0;
}

static int r_aux_write(struct ws_store *s, const char *name, const void *buf, size_t len,
		       int durable)
{
	struct rados_store *rs = RS(s);
	rados_completion_t c;
	int rc;

	if ((rc = lease_ok(rs)) < 0)
		return rc;
	if (R.rados_aio_create_completion2(NULL, NULL, &c) < 0)
		return -ENOMEM;
	rc = R.rados_aio_write_full(rs->io, name, c, buf, len);
	if (rc < 0) {
		R.rados_aio_release(c);
		return rc;
	}
	if (!durable && pend_add(rs, c, -1) == 0)
		return 0;	/* waited for at the next sync or close */
	R.rados_aio_wait_for_complete(c);
	rc = R.rados_aio_get_return_value(c);
	R.rados_aio_release(c);
	if (rc == -EBLOCKLISTED) {
		lease_lose(rs, EBLOCKLISTED, "this client was " FENCED);
		rc = -ENOLCK;
	}
	return rc < 0 ? rc : 0;
}

static const char *r_strerr(struct ws_store *s, int err)
{
	struct rados_store *rs = RS(s);

	switch (err) {
	case ENOLCK:
		pthread_mutex_lock(&rs->lmu);
		snprintf(rs->errbuf, sizeof(rs->errbuf), "this writer lost the workspace (%s) and "
			 "stopped writing", rs->lost_why[0] ? rs->lost_why : "its lease lapsed");
		pthread_mutex_unlock(&rs->lmu);
		return rs->errbuf;
	case ETIMEDOUT:
		snprintf(rs->errbuf, sizeof(rs->errbuf), "no answer from the cluster within %u s "
			 "(rados_osd_op_timeout)", rs->timeout_s);
		return rs->errbuf;
	case EACCES:
	case EPERM:
		snprintf(rs->errbuf, sizeof(rs->errbuf), "%s is not allowed to (check the key's "
			 "caps: Documentation/deploy.md)", rs->client);
		return rs->errbuf;
	case EDQUOT:
	case ENOSPC:
		return "the pool is full";
	}
	return strerror(err);
}

static uint64_t r_id(const struct ws_store *s)
{
	return XXH3_64bits(s->name, strlen(s->name));
}

/* ---- open and close ------------------------------------------------------ */

static void r_close(struct ws_store *s)
{
	struct rados_store *rs = RS(s);
	int stream;

	if (rs->renewing) {
		pthread_mutex_lock(&rs->lmu);
		rs->stop = 1;
		pthread_cond_signal(&rs->lcv);
		pthread_mutex_unlock(&rs->lmu);
		pthread_join(rs->renewer, NULL);
	}
	if (rs->connected) {
		pend_wait(rs, &stream);
		/* A clean hand-over: the next writer need not fence this one. */
		if (rs->locked && lease_ok(rs) == 0) {
			char arg[256];
			int prval = 0;
			rados_write_op_t op = locked_op(rs, arg, &prval);

			if (op) {
				R.rados_write_op_rmxattr(op, XA_HOLDER);
				R.rados_write_op_operate(op, rs->io, MANIFEST, NULL, 0);
				R.rados_release_write_op(op);
			}
			R.rados_unlock(rs->io, MANIFEST, LOCK_NAME, rs->cookie);
		}
		R.rados_ioctx_destroy(rs->io);
	}
	if (rs->cl)
		R.rados_shutdown(rs->cl);
	for (int i = 0; i < WS_N_STREAMS; i++)
		free(rs->wb[i].buf);
	free(rs->pend);
	free(rs->pend_stream);
	pthread_mutex_destroy(&rs->lmu);
	pthread_cond_destroy(&rs->lcv);
	pthread_mutex_destroy(&rs->qmu);
	pthread_cond_destroy(&rs->qcv);
	free(rs);
}

static const struct ws_store_ops rados_ops = {
	.kind = "rados",
	.close = r_close,
	.mf_load = r_mf_load,
	.mf_replace = r_mf_replace,
	.may_create = r_may_create,
	.create = r_create,
	.open_stream = r_open_stream,
	.size = r_size,
	.read = r_read,
	.write = r_write,
	.sync = r_sync,
	.begin_write = r_begin_write,
	.lock = r_lock,
	.claim = r_claim,
	.io_setup = r_io_setup,
	.submit = r_submit,
	.reap = r_reap,
	.aux_read = r_aux_read,
	.aux_write = r_aux_write,
	.id = r_id,
	.strerr = r_strerr,
};

/* rados://POOL/NAME: a pool and a namespace of letters, digits, '.', '_'
 * and '-' (NAME not beginning with '.'). */
static int parse_where(const char *where, struct rados_store *rs)
{
	const char *p = where + 8, *slash = strchr(p, '/');
	size_t np = slash ? (size_t)(slash - p) : 0, nn = slash ? strlen(slash + 1) : 0;

	if (!slash || !np || np >= sizeof(rs->pool) || !nn || nn > 128 || slash[1] == '.')
		return kvmem_error(EINVAL, "%s: a RADOS workspace is rados://POOL/NAME (NAME: 1 to 128 "
				   "letters, digits, '.', '_', '-', not beginning with '.')", where);
	for (size_t i = 0; i < np + 1 + nn; i++) {
		char c = p[i];

		if (i == np)
			continue;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return kvmem_error(EINVAL, "%s: '%c' in a pool or workspace name (letters, "
					   "digits, '.', '_', '-')", where, c);
	}
	memcpy(rs->pool, p, np);
	rs->pool[np] = 0;
	snprintf(rs->ns, sizeof(rs->ns), "%s", slash + 1);
	return 0;
}

/* The client's name as Ceph's tools take it from CEPH_ARGS (--id X,
 * --user X, --name client.X, -n client.X); client.admin by default. */
static void client_from_env(char *out, size_t len)
{
	const char *args = getenv("CEPH_ARGS");
	char buf[1024], *save = NULL, *tok, *prev = NULL;

	snprintf(out, len, "client.admin");
	if (!args)
		return;
	snprintf(buf, sizeof(buf), "%s", args);
	for (tok = strtok_r(buf, " \t", &save); tok; prev = tok, tok = strtok_r(NULL, " \t", &save)) {
		const char *v = NULL;
		int id = 0;

		if (prev && (!strcmp(prev, "--id") || !strcmp(prev, "--user") || !strcmp(prev, "-i")))
			v = tok, id = 1;
		else if (prev && (!strcmp(prev, "--name") || !strcmp(prev, "-n")))
			v = tok;
		else if (!strncmp(tok, "--id=", 5) || !strncmp(tok, "--user=", 7))
			v = strchr(tok, '=') + 1, id = 1;
		else if (!strncmp(tok, "--name=", 7))
			v = tok + 7;
		if (v && *v)
			snprintf(out, len, "%s%s", id && strncmp(v, "client.", 7) ? "client." : "", v);
	}
}

/* CEPH_ARGS (--keyring, --key, any option), as Ceph's tools read it: split
 * at blanks. Read at every open, not once per process as librados's
 * rados_conf_parse_env would. */
static int conf_args(rados_t cl)
{
	const char *args = getenv("CEPH_ARGS"), *argv[64];
	char buf[2048], *save = NULL, *tok;
	int argc = 0;

	if (!args || !*args)
		return 0;
	snprintf(buf, sizeof(buf), "%s", args);
	argv[argc++] = "kvmem";	/* skipped, as a program's name */
	for (tok = strtok_r(buf, " \t", &save); tok && argc < 63; tok = strtok_r(NULL, " \t", &save))
		argv[argc++] = tok;
	argv[argc] = NULL;
	return R.rados_conf_parse_argv(cl, argc, argv);
}

/* Set a client option to `val` when the configuration left it at `dflt`. */
static void conf_default(rados_t cl, const char *opt, const char *dflt, const char *val)
{
	char cur[64];

	if (R.rados_conf_get(cl, opt, cur, sizeof(cur)) == 0 && strtod(cur, NULL) == strtod(dflt, NULL))
		R.rados_conf_set(cl, opt, val);
}

static int connect_cluster(struct rados_store *rs)
{
	const char *n = rs->s.name, *conf = getenv("CEPH_CONF");
	char t[32], cur[64];
	int rc;

	if ((rc = R.rados_create2(&rs->cl, "ceph", rs->client, 0)) < 0) {
		rs->cl = NULL;
		return kvmem_error(-rc, "%s: cannot make a cluster handle for %s: %s", n, rs->client,
				   strerror(-rc));
	}
	/* Our messages say what went wrong; librados's own lines would only
	 * repeat it on stderr. */
	R.rados_conf_set(rs->cl, "log_to_stderr", "false");
	R.rados_conf_set(rs->cl, "err_to_stderr", "false");
	if ((rc = R.rados_conf_read_file(rs->cl, NULL)) < 0)
		return kvmem_error(-rc, "%s: cannot read the Ceph configuration %s: %s (set CEPH_CONF "
				   "or --ceph-conf)", n, conf && *conf ? conf : "(/etc/ceph/ceph.conf)",
				   strerror(-rc));
	if ((rc = conf_args(rs->cl)) < 0)
		return kvmem_error(-rc, "%s: CEPH_ARGS: %s", n, strerror(-rc));
	/* Without a bound an operation on a cluster that went away waits
	 * forever; the conf may choose other bounds. */
	snprintf(t, sizeof(t), "%d", DEFAULT_TIMEOUT_S);
	conf_default(rs->cl, "rados_osd_op_timeout", "0", t);
	conf_default(rs->cl, "rados_mon_op_timeout", "0", t);
	conf_default(rs->cl, "client_mount_timeout", "300", t);
	rs->timeout_s = R.rados_conf_get(rs->cl, "rados_osd_op_timeout", cur, sizeof(cur)) == 0 ?
		(unsigned)strtod(cur, NULL) : DEFAULT_TIMEOUT_S;
	rc = R.rados_connect(rs->cl);
	if (rc == -EACCES || rc == -EPERM)
		return kvmem_error(EACCES, "%s: the cluster refused %s: cephx authentication failed "
				   "(a wrong key, or no such client; the keyring is the conf's "
				   "'keyring' or CEPH_ARGS --keyring)", n, rs->client);
	if (rc == -ENOENT)
		return kvmem_error(ENOENT, "%s: no key for %s: no keyring found (the conf's 'keyring' "
				   "or CEPH_ARGS --keyring)", n, rs->client);
	if (rc == -ETIMEDOUT)
		return kvmem_error(ETIMEDOUT, "%s: no monitor answered within %u s (mon_host of %s)", n,
				   rs->timeout_s, conf && *conf ? conf : "the Ceph configuration");
	if (rc < 0)
		return kvmem_error(-rc, "%s: cannot connect to the cluster as %s: %s", n, rs->client,
				   strerror(-rc));
	rs->connected = 1;
	rc = R.rados_ioctx_create(rs->cl, rs->pool, &rs->io);
	if (rc == -ENOENT) {
		rs->connected = 0;
		return kvmem_error(ENOENT, "%s: the cluster has no pool '%s' (ceph osd pool create %s)",
				   n, rs->pool, rs->pool);
	}
	if (rc < 0) {
		rs->connected = 0;
		return cluster_error(rs, rc, "opening the pool");
	}
	R.rados_ioctx_set_namespace(rs->io, rs->ns);
	return 0;
}

int ws_rados_destroy(const char *where)
{
	struct ws_store *s;
	struct rados_store *rs;
	const char *aux[] = { MANIFEST, "stats", "app.conversation.json" };
	int rc;

	if ((rc = ws_rados_open(where, 0, &s)) < 0)
		return rc;
	rs = RS(s);
	for (int i = 0; i < WS_N_STREAMS; i++)
		for (uint64_t k = 0;; k++) {
			char oid[64];

			oid_of(oid, sizeof(oid), i, k);
			if (R.rados_remove(rs->io, oid) < 0)
				break;
		}
	for (size_t i = 0; i < sizeof(aux) / sizeof(aux[0]); i++)
		R.rados_remove(rs->io, aux[i]);
	ws_store_close(s);
	return 0;
}

int ws_rados_open(const char *where, int flags, struct ws_store **out)
{
	struct rados_store *rs;
	pthread_condattr_t ca;
	const char *lease = getenv("KVMEM_RADOS_LEASE"), *fault = getenv("KVMEM_RADOS_FAULT");
	unsigned char rnd[16];
	char *addrs = NULL;
	int rc;

	*out = NULL;
	if (kvmem_rados_load(where) < 0)
		return kvmem_fail();
	if (!(rs = calloc(1, sizeof(*rs))))
		return kvmem_error(ENOMEM, "%s: out of memory", where);
	rs->s.ops = &rados_ops;
	snprintf(rs->s.name, sizeof(rs->s.name), "%s", where);
	rs->s.flags = flags;
	rs->s.rdonly = !!(flags & KVMEM_PAGER_RDONLY);
	rs->obj = DEFAULT_OBJECT;
	rs->lease_s = lease && atoi(lease) > 0 && atoi(lease) <= 3600 ? (unsigned)atoi(lease) :
		DEFAULT_LEASE_S;
	rs->trust_lease = fault && !strcmp(fault, "trust-lease");
	rs->done_tail = &rs->done_head;
	for (int i = 0; i < WS_N_STREAMS; i++)
		rs->wb[i].chave = -1;
	pthread_mutex_init(&rs->lmu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&rs->lcv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&rs->qmu, NULL);
	pthread_cond_init(&rs->qcv, NULL);
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
		uint64_t t = mono_ns() ^ (uint64_t)getpid() << 32;

		memcpy(rnd, &t, 8);
		memcpy(rnd + 8, &t, 8);
	}
	for (int i = 0; i < 16; i++)
		snprintf(rs->cookie + 2 * i, 3, "%02x", rnd[i]);
	client_from_env(rs->client, sizeof(rs->client));
	if ((rc = parse_where(where, rs)) < 0 || (rc = connect_cluster(rs)) < 0) {
		r_close(&rs->s);
		return rc;
	}
	if (R.rados_getaddrs(rs->cl, &addrs) == 0 && addrs) {
		snprintf(rs->addr, sizeof(rs->addr), "%s", addrs);
		R.rados_buffer_free(addrs);
	}
	*out = &rs->s;
	return 0;
}
#endif
