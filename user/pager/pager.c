// SPDX-License-Identifier: MIT
/*
 * The pager: open and close a workspace with its host pool, ring and
 * stage-out buffer; tokens, index and tail; step boundaries. Fetch and
 * prefetch live in fetch.c, stage-out in stage.c, commit in commit.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pager/pager_int.h"
#include "util/grow.h"
#include "pager/probes.h"
#include "util/fs.h"

#define DEFAULT_CAP (256ull << 20)
#define DEFAULT_STAGE (32ull << 20)
#define DEFAULT_DEPTH 64u
#define DEFAULT_MAX_READ (8u << 20)	/* largest single read request */

void kvmem_pager_opts_default(kvmem_pager_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->host_cap = DEFAULT_CAP;
	o->numa_node = -1;
	o->policy = "lru";
	o->stage_bytes = DEFAULT_STAGE;
	o->queue_depth = DEFAULT_DEPTH;
	o->max_read = DEFAULT_MAX_READ;
}

static int setup_memory(kvmem_pager *p, const kvmem_pager_opts *o)
{
	uint32_t n;
	void *bases[2];
	size_t lens[2];
	unsigned nreg = 0;

	if (o->pool) {
		if (!kvmem_hostpool_shared(o->pool))
			return kvmem_error(EINVAL, "%s: opts.pool is not a shared host pool", p->dir);
		if (kvmem_hostpool_slot_bytes(o->pool) != p->page_stride)
			return kvmem_error(EINVAL, "%s: the shared host pool's slots are %zu bytes, this "
					   "workspace's pages %zu", p->dir,
					   kvmem_hostpool_slot_bytes(o->pool), p->page_stride);
		p->pool = o->pool;
	} else {
		p->pool = kvmem_hostpool_create(o->host_cap ? o->host_cap : DEFAULT_CAP, p->page_stride,
						o->numa_node);
		if (!p->pool)
			return kvmem_error_prefix("%s", p->dir);
		p->own_pool = 1;
	}
	n = kvmem_hostpool_slots(p->pool);
	p->slot_page = kvmem_hostpool_slot_pages(p->pool);
	p->slot_pin = kvmem_hostpool_slot_pins(p->pool);
	p->repl_st = p->repl->create(n, p->g.n_layers);
	if (!p->repl_st)
		return kvmem_error(ENOMEM, "%s: out of memory for the replacement policy", p->dir);
	if (!p->own_pool) {
		pthread_mutexattr_t ma;

		pthread_mutexattr_init(&ma);
		pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
		if (pthread_mutex_init(&p->mu, &ma)) {
			pthread_mutexattr_destroy(&ma);
			return kvmem_error(ENOMEM, "%s: cannot make a lock", p->dir);
		}
		pthread_mutexattr_destroy(&ma);
		if (kvmem_hostpool_attach(p->pool, p) < 0) {
			pthread_mutex_destroy(&p->mu);
			return kvmem_error_prefix("%s", p->dir);
		}
		p->shared = 1;
	}
	p->max_read = o->max_read ? o->max_read : DEFAULT_MAX_READ;
	kvmem_hostpool_region(p->pool, &bases[nreg], &lens[nreg]);
	nreg++;
	if (!p->rdonly) {
		uint64_t want = o->stage_bytes ? o->stage_bytes : DEFAULT_STAGE;

		p->n_stage = want / p->extent_bytes;
		if (p->n_stage < 2)
			p->n_stage = 2;
		if (p->n_stage > 1024)
			p->n_stage = 1024;
		/* Mapped, not touched: blocks made in the pool never use it. */
		p->stage_map_len = round_up(p->n_stage * p->extent_bytes, 2u << 20);
		p->stage_buf = mmap(NULL, p->stage_map_len, PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		p->stage = calloc(p->n_stage, sizeof(*p->stage));
		if (p->stage_buf == MAP_FAILED || !p->stage) {
			p->stage_buf = NULL;
			return kvmem_error(ENOMEM, "%s: cannot map a stage-out buffer of %zu bytes", p->dir,
					 p->stage_map_len);
		}
		bases[nreg] = p->stage_buf;
		lens[nreg++] = p->stage_map_len;
	}
	/* The store's page I/O: a directory's ring, with the pool and the
	 * stage-out buffer registered; RADOS reads straight into the pool. */
	if (p->ws->ops->io_setup(p->ws, &p->io, o->queue_depth ? o->queue_depth : DEFAULT_DEPTH,
				 bases, lens, nreg) < 0)
		return kvmem_error_prefix("%s", p->dir);
	return 0;
}

/* The workspace's id in the open/close probes: its directory's inode (a
 * hash of the name for RADOS). */
static uint64_t probe_ws_id(const kvmem_pager *p)
{
	return p->ws ? p->ws->ops->id(p->ws) : 0;
}

int kvmem_pager_open(const char *dir, const kvmem_page_geom *g, const kvmem_pager_opts *o,
		   kvmem_pager **out)
{
	const kvmem_repl_ops *repl;
	kvmem_pager_opts def;
	kvmem_pager *p;

	*out = NULL;
	if (!o) {
		kvmem_pager_opts_default(&def);
		o = &def;
	}
	if (g && kvmem_page_geom_check(g, dir) < 0)
		return kvmem_fail();
	if (!g && !(o->flags & KVMEM_PAGER_RDONLY))
		return kvmem_error(EINVAL, "%s: opening a workspace for writing needs the model's geometry",
				 dir);
	/* Every option is checked before the directory is touched. */
	repl = kvmem_repl_find(o->policy ? o->policy : "lru");
	if (!repl)
		return kvmem_error(EINVAL, "%s: unknown replacement policy '%s' (lru, lfu, score)", dir,
				   o->policy);
	p = calloc(1, sizeof(*p));
	if (!p)
		return kvmem_error(ENOMEM, "%s: out of memory", dir);
	p->prefetch_hook = o->prefetch_hook;
	p->prefetch_arg = o->prefetch_arg;
	p->repl = repl;
	/* The pid goes into DIR/lock last (a RADOS writer's name into its
	 * lock): an open refused on the way has written nothing. */
	if (store_open(p, dir, g, o->flags) < 0 || setup_memory(p, o) < 0 ||
	    (!p->rdonly && p->ws->ops->claim(p->ws) < 0)) {
		char msg[1024];
		int err = kvmem_last_errno();

		snprintf(msg, sizeof(msg), "%s", kvmem_last_error());
		/* Nothing was written: close has nothing to say, saves no counters
		 * and cuts nothing. */
		p->write_failed = 0;
		p->rdonly = 1;
		kvmem_pager_close(p);
		return kvmem_error(err ? err : EIO, "%s", msg);
	}
	p->step_t0 = kvmem_now_ns();
	PROBE_OPEN((const char *)p->dir, p->g.n_layers, p->page_bytes, probe_ws_id(p));
	*out = p;
	return 0;
}

int kvmem_pager_close(kvmem_pager *p)
{
	int rc = 0;

	if (!p)
		return 0;
	PROBE_CLOSE(probe_ws_id(p));
	pager_lock(p);
	/* Writes not started yet are of uncommitted blocks (the next open
	 * cuts them): dropped. */
	p->ow_n = 0;
	if (p->io.reqs) {
		/* Reads and writes still in flight point into our buffers. */
		while (p->io.inflight)
			if (pager_reap(p, 1) < 0)
				break;
	}
	while (p->n_resv)
		resv_drop(p, p->n_resv - 1);
	if (p->write_failed)
		rc = kvmem_error(p->write_errno ? p->write_errno : EIO, "%s", p->write_err);
	/* Give back what was allocated ahead and not written. */
	if (p->ws && p->ws->ops->unreserve)
		p->ws->ops->unreserve(p->ws, p->n_blocks * p->extent_bytes);
	/* A writer that wrote nothing (its session refused the history it
	 * found, say) leaves the counters file as it was, like the rest. */
	if (p->ws && p->m.tail_sums && p->wrote)
		stats_save(p);
	io_exit(&p->io);
	if (p->shared) {
		/* Every slot this pager holds goes back to the pool. */
		for (uint64_t pg = 0; p->pt && pg < p->n_blocks * p->g.n_layers; pg++) {
			struct kvmem_pte *e = &p->pt[pg];

			if ((e->tiers & KVMEM_TIER_HOST) || (e->flags & KVMEM_PTE_IN_FLIGHT)) {
				p->slot_page[e->host_slot] = UINT64_MAX;
				p->slot_pin[e->host_slot] = 0;
				pager_slots_give(p, e->host_slot, 1);
				e->tiers &= ~KVMEM_TIER_HOST;
			}
		}
		/* Before the lock goes: a pager asking for room holds the
		 * pool's lock and only tries this one's. */
		kvmem_hostpool_detach(p->pool, p);
		pager_unlock(p);
		pthread_mutex_destroy(&p->mu);
	} else if (p->own_pool) {
		kvmem_hostpool_free(p->pool);
	}
	if (p->repl_st)
		p->repl->destroy(p->repl_st);
	free(p->ow);
	free(p->resv);
	free(p->pout);
	if (p->stage_buf)
		munmap(p->stage_buf, p->stage_map_len);
	free(p->stage);
	free(p->tok_pend);
	store_close(p);
	free(p);
	return rc;
}

const kvmem_page_geom *kvmem_pager_geom(const kvmem_pager *p) { return &p->g; }
const char *kvmem_pager_dir(const kvmem_pager *p) { return p->dir; }
uint64_t kvmem_pager_tokens(const kvmem_pager *p) { return p->n_tokens; }
uint64_t kvmem_pager_blocks(const kvmem_pager *p) { return p->n_blocks; }
uint64_t kvmem_pager_committed_tokens(const kvmem_pager *p) { return p->m.h.tokens; }
kvmem_hostpool *kvmem_pager_hostpool(kvmem_pager *p) { return p->pool; }

int kvmem_pager_open_file(const kvmem_pager *p, const char *name, int flags)
{
	int dirfd = ws_store_dirfd(p->ws);

	if (dirfd < 0)
		return kvmem_error(EOPNOTSUPP, "%s/%s: a %s workspace has no files to open", p->dir,
				   name, p->ws->ops->kind);
	return ws_open_file(dirfd, p->dir, name, flags);
}

void kvmem_pager_region(const kvmem_pager *p, void **base, size_t *len)
{
	kvmem_hostpool_region(p->pool, base, len);
}
int kvmem_pager_direct(const kvmem_pager *p) { return p->ws->direct; }
int kvmem_pager_registered(const kvmem_pager *p) { return p->io.fixed; }

const void *kvmem_pager_app_state(const kvmem_pager *p, uint32_t *len)
{
	*len = p->m.h.app_bytes;
	return p->m.app;
}

const struct kvmem_pte *kvmem_pager_pte(const kvmem_pager *p, uint64_t page)
{
	return page < p->n_blocks * p->g.n_layers ? &p->pt[page] : NULL;
}

/* A sticky write failure: later commits are refused, memory keeps the data. */
void pager_fail_write(kvmem_pager *p, int err, const char *fmt, ...)
{
	va_list ap;

	p->st.write_errors++;
	if (p->write_failed)
		return;
	p->write_failed = 1;
	p->write_errno = err > 0 ? err : EIO;
	va_start(ap, fmt);
	vsnprintf(p->write_err, sizeof(p->write_err), fmt, ap);
	va_end(ap);
}

int kvmem_pager_append_tokens(kvmem_pager *p, const int32_t *ids, size_t n)
{
	size_t len = n * 4;
	uint64_t off = p->n_tokens * 4;
	uint64_t pend = p->n_tokens - p->m.h.tokens;
	int rc;

	if (p->rdonly)
		return kvmem_error(EINVAL, "%s: opened read-only", p->dir);
	if (store_begin_write(p) < 0)
		return kvmem_fail();
	if (kvmem_grow(&p->tok_pend, sizeof(*p->tok_pend), pend + n, &p->tok_pend_cap, 4096))
		return kvmem_error(ENOMEM, "%s/tokens: out of memory", p->dir);
	/* Kept in memory until committed, so they read back even when the
	 * file write fails. */
	memcpy(p->tok_pend + pend, ids, len);
	XXH3_64bits_update(p->tok_hash, ids, len);
	p->n_tokens += n;
	if (!p->write_failed && (rc = p->ws->ops->write(p->ws, WS_TOKENS, ids, len, off)) < 0) {
		pager_fail_write(p, -rc, "%s/tokens: cannot append: %s", p->dir,
				 ws_strerror(p->ws, -rc));
		return kvmem_error(-rc, "%s", p->write_err);
	}
	return 0;
}

int kvmem_pager_read_tokens(kvmem_pager *p, uint64_t first, size_t n, int32_t *out)
{
	uint64_t committed = p->m.h.tokens;
	int rc;

	if (first + n > p->n_tokens || first + n < first)
		return kvmem_error(EINVAL, "%s/tokens: tokens %" PRIu64 "..%" PRIu64 " asked, %" PRIu64
				 " present", p->dir, first, first + n, p->n_tokens);
	while (n && first + n > committed) {
		uint64_t pos = first + n - 1;

		out[n - 1] = p->tok_pend[pos - committed];
		n--;
	}
	if (!n)
		return 0;
	if ((rc = p->ws->ops->read(p->ws, WS_TOKENS, out, n * 4, first * 4)) < 0)
		return kvmem_error(rc == -ENODATA ? EIO : -rc, "%s/tokens: cannot read tokens %" PRIu64
				 "..%" PRIu64 ": %s", p->dir, first, first + n,
				 rc == -ENODATA ? "short read" : strerror(-rc));
	return 0;
}

int kvmem_pager_read_index(kvmem_pager *p, uint64_t first_block, size_t n, void *out)
{
	size_t ib = p->g.index_bytes, L = p->g.n_layers;
	int rc;

	if (first_block + n > p->n_blocks || first_block + n < first_block)
		return kvmem_error(EINVAL, "%s/index: blocks %" PRIu64 "..%" PRIu64 " asked, %" PRIu64
				 " present", p->dir, first_block, first_block + n, p->n_blocks);
	if (!ib || !n)
		return 0;
	/* Records of blocks appended after a failed write are in memory only. */
	while (n && p->orphan_ix[first_block + n - 1]) {
		memcpy((uint8_t *)out + (n - 1) * ib, p->orphan_ix[first_block + n - 1], ib);
		n--;
	}
	if (!n)
		return 0;
	if ((rc = p->ws->ops->read(p->ws, WS_INDEX, out, n * ib, first_block * ib)) < 0)
		return kvmem_error(rc == -ENODATA ? EIO : -rc, "%s/index: cannot read blocks %" PRIu64
				 "..%" PRIu64 ": %s", p->dir, first_block, first_block + n,
				 rc == -ENODATA ? "short read" : strerror(-rc));
	for (size_t i = 0; i < n; i++) {
		uint64_t b = first_block + i;

		if (XXH3_64bits((uint8_t *)out + i * ib, ib) != p->sums[b * (L + 1) + L]) {
			p->st.checksum_errors++;
			return kvmem_error(EBADMSG, "%s/index: record of block %" PRIu64
					 " (offset %" PRIu64 "): checksum mismatch: corrupt",
					 p->dir, b, b * ib);
		}
	}
	return 0;
}

/* A read-only pager beside a writer: has the manifest moved past ours? */
static int tail_moved_on(kvmem_pager *p)
{
	struct manifest now;
	int moved;

	if (mf_read(p->ws, &now) < 0)
		return 0;
	moved = now.h.generation != p->m.h.generation;
	mf_free(&now);
	return moved;
}

int kvmem_pager_read_tail(kvmem_pager *p, void *const *layers, void *index)
{
	const struct mf_head *h = &p->m.h;
	size_t L = p->g.n_layers;
	uint8_t *buf;
	uint64_t off;
	int rc;

	if (!h->tail_tokens)
		return 0;
	buf = malloc(p->tail_slot_bytes);
	if (!buf)
		return kvmem_error(ENOMEM, "%s/tail: out of memory", p->dir);
	off = (uint64_t)h->tail_slot * p->tail_slot_bytes;
	if ((rc = p->ws->ops->read(p->ws, WS_TAIL, buf, p->tail_slot_bytes, off)) < 0) {
		int err = rc == -ENODATA ? EIO : -rc;

		free(buf);
		return kvmem_error(err, "%s/tail: cannot read slot %u: %s", p->dir, h->tail_slot,
				 strerror(err));
	}
	for (size_t l = 0; l <= L; l++) {
		const uint8_t *src = buf + l * p->page_stride;
		size_t len = l < L ? p->page_bytes : p->g.index_bytes;

		if (XXH3_64bits(src, len) != p->m.tail_sums[l]) {
			free(buf);
			p->st.checksum_errors++;
			if (p->rdonly && tail_moved_on(p))
				return kvmem_error(ESTALE, "%s/tail: the writer has committed twice since this "
						 "read-only open and reused the slot of its partial block; "
						 "reopen to read the new commit", p->dir);
			return kvmem_error(EBADMSG, "%s/tail: slot %u, %s %zu: checksum mismatch: corrupt",
					 p->dir, h->tail_slot, l < L ? "layer" : "index", l);
		}
		if (l < L && layers)
			memcpy(layers[l], src, len);
		else if (l == L && index && len)
			memcpy(index, src, len);
	}
	free(buf);
	return (int)h->tail_tokens;
}

/* Every completion goes through here (io_reap has no other caller), so the
 * page_in_batch probe fires once per pass that completed reads (more often
 * when a pass completes over KVMEM_PROBE_BATCH_MAX), with the sums of the
 * page_in probes it fired and their latencies. */
void pin_batch_fire(kvmem_pager *p)
{
	struct pin_batch *b = &p->pin_batch;

	PROBE_PAGE_IN_BATCH(b->requests, b->pages, b->bytes, b->ns, b->lat);
	b->requests = b->pages = b->bytes = b->ns = 0;
}

int pager_reap(kvmem_pager *p, unsigned wait)
{
	int rc, n = 0;

	/* Completions free request records: writes waiting for one start,
	 * and are submitted by the next pass. */
	for (;;) {
		rc = p->ws->ops->reap(p->ws, &p->io, wait, pager_io_done, p);
		if (rc < 0)
			break;
		n += rc;
		if (!p->ow_n || !out_pump(p))
			break;
		wait = 0;
	}
	if (p->pin_batch.requests)
		pin_batch_fire(p);
	return rc < 0 ? rc : n;
}

struct io_req *pager_req(kvmem_pager *p)
{
	struct io_req *r;

	while (!(r = io_req_get(&p->io)))
		if (pager_reap(p, 1) < 0)
			return NULL;
	return r;
}

void pager_io_done(void *arg, struct io_req *r)
{
	kvmem_pager *p = arg;

	if (r->purpose == PUR_OUT)
		stage_done(p, r);
	else if (r->purpose == PUR_POOL_OUT)
		pool_out_done(p, r);
	else
		read_done(p, r);
	io_req_put(&p->io, r);
}

void kvmem_pager_hint(kvmem_pager *p, uint64_t block, float score)
{
	PROBE_HINT(block, (int64_t)(score * 1e6f));
	pager_lock(p);
	if (p->repl->hint)
		p->repl->hint(p->repl_st, block, score, p->step);
	pager_unlock(p);
}

int kvmem_pager_step(kvmem_pager *p, uint64_t step)
{
	uint64_t t = kvmem_now_ns();
	int rc;

	pager_lock(p);
	rc = pager_reap(p, 0);
	PROBE_STEP(p->step, p->st.host_hits - p->at_step.host_hits,
		   p->st.host_misses - p->at_step.host_misses,
		   p->st.bytes_in - p->at_step.bytes_in, t - p->step_t0);
	p->at_step = p->st;
	p->step_t0 = t;
	p->step = step;
	p->st.steps++;
	if (p->repl->step)
		p->repl->step(p->repl_st, step);
	pager_unlock(p);
	if (p->prefetch_hook)
		p->prefetch_hook(p->prefetch_arg, p, step);
	return rc < 0 ? -1 : 0;
}
