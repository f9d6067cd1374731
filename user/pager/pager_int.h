/* SPDX-License-Identifier: MIT */
/* The pager's private parts, shared by the files of user/pager/. */
#ifndef KVMEM_PAGER_INT_H
#define KVMEM_PAGER_INT_H

#include <limits.h>
#include <pthread.h>
#include <sys/uio.h>
#include <liburing.h>
#include <xxhash.h>

#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "pager/probes.h"	/* KVMEM_PROBE_BATCH_MAX */
#include "util/clock.h"
#include "pager/dirfiles.h"
#include "pager/faults.h"
#include "pager/hostpool.h"
#include "pager/repl_int.h"
#include "pager/wstore.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the workspace formats are little-endian and written as in memory"
#endif

static inline uint64_t round_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

/* ---- manifest (manifest.c) ---------------------------------------------- */
#define MF_MAGIC	"KVMEMWS1"
#define MF_VERSION	1u

/* The fixed head of the manifest; all little-endian. */
struct mf_head {
	char magic[8];
	uint32_t version;
	uint32_t head_bytes;	/* sizeof(struct mf_head) */
	uint64_t fingerprint;
	uint32_t n_layers, n_heads, n_kv_heads, head_dim;
	uint32_t block_tokens, dtype, index_bytes, page_bytes;
	uint32_t page_stride, align;
	uint64_t generation;	/* commits so far */
	uint64_t tokens;	/* committed tokens */
	uint64_t blocks;	/* committed full blocks (tokens / B) */
	uint64_t tokens_hash;	/* XXH3-64 of tokens[0, tokens * 4) */
	uint64_t sums_hash;	/* XXH3-64 of sums[0, blocks * (L + 1) * 8) */
	uint32_t tail_slot;	/* which slot of the tail file is current */
	uint32_t tail_tokens;	/* tokens % B */
	uint32_t app_bytes;	/* opaque session state after tail_sums */
	uint32_t reserved;
};
_Static_assert(sizeof(struct mf_head) == 120, "manifest head layout");

/* The decoded manifest: head, tail sums (L + 1), app state. */
struct manifest {
	struct mf_head h;
	uint64_t *tail_sums;
	uint8_t *app;
};

void mf_from_geom(struct manifest *m, const kvmem_page_geom *g);
void mf_geom(const struct manifest *m, kvmem_page_geom *g);
/* Read the store's manifest into m (allocates); names the file and problem
 * on error: -ENOENT absent, -EBADMSG corrupt, not a regular file, or counts
 * no file can hold, -ESTALE another format version. mf_read_at reads
 * DIR/manifest under a directory's descriptor; mf_decode checks bytes. */
int mf_read(struct ws_store *s, struct manifest *m);
int mf_read_at(int dirfd, const char *dir, struct manifest *m);
int mf_decode(const uint8_t *buf, size_t len, const char *name, struct manifest *m);
/* Replace the store's manifest atomically, while old_gen (UINT64_MAX: none
 * yet) is the current one. */
int mf_write(struct ws_store *s, const struct manifest *m, uint64_t old_gen);
/* The manifest's bytes (malloc'd; -ENOMEM). */
int mf_encode(const struct manifest *m, uint8_t **buf, size_t *len);
/* The directory's way: DIR/manifest's bytes; and a temporary file of this
 * writer's own name, fsync, rename over manifest, fsync the directory. */
int mf_load_at(int dirfd, const char *dir, uint8_t **buf, size_t *len);
int mf_replace_at(int dirfd, const char *dir, const void *buf, size_t len);
void mf_free(struct manifest *m);
/* The manifest summed up. */
int mf_info(struct ws_store *s, kvmem_workspace_info *wi);
/* The store's counters into s (zeros when absent); -errno with a message
 * when they cannot be read (-ENOENT: none saved yet). */
int stats_read(struct ws_store *s, kvmem_pager_stats *st);
/* Explain a geometry mismatch (-ESTALE); 0 when equal. */
int mf_check_geom(const struct manifest *m, const kvmem_page_geom *g, const char *dir);
/* Bytes each data file (ws_data_files order) must hold for the commit;
 * mf_read has checked that none overflows. */
void mf_needs(const struct mf_head *h, uint64_t need[5]);

/* ---- the directory's files (files.c) and durability (durable.c) -------- */
#define WS_N_DATA 5
_Static_assert(WS_N_DATA == WS_N_STREAMS, "the data files are the store's streams");
extern const char *const ws_data_files[WS_N_DATA];	/* pages tokens index sums tail */

/* Create DIR/name where nothing is (O_EXCL, no link followed): fd or -errno. */
int ws_create_file(int dirfd, const char *dir, const char *name, int flags);

struct ws_scan {
	int manifest;		/* an entry named manifest, of any type */
	int empty_data;		/* empty data files (a creation cut short) */
	char ws_file[256];	/* first workspace file that holds something */
	char other[256];	/* first name that is no workspace file */
};
int ws_scan(int dirfd, const char *dir, struct ws_scan *sc);
/* Remove temporary files (a killed writer's) and, when asked, the empty
 * data files of a creation cut short. */
void ws_clean_temps(int dirfd, int empty_data_too);
/* fsync the directory that holds dir (after creating dir). */
int ws_sync_parent(const char *dir);

/* fdatasync (data_only) or fsync fd, telling the trace; fails (-errno
 * naming DIR/name) when the sync or an injected KVMEM_FAULT_SYNC does. */
int dur_sync(int fd, int data_only, const char *dir, const char *name);
void dur_note(const char *op, const char *name);

/* ---- io_uring (uring.c) ------------------------------------------------- */
/* Equal to KVMEM_FAULT_READ / KVMEM_FAULT_WRITE: fault injection matches on them. */
enum io_kind { IO_READ = KVMEM_FAULT_READ, IO_WRITE = KVMEM_FAULT_WRITE };

struct io_req {
	int kind;		/* enum io_kind */
	int res;		/* completion result (bytes or -errno) */
	int done;
	int purpose;		/* pager's: fetch, prefetch, stage-out */
	uint64_t first_page;	/* reads: first page; writes: block */
	uint32_t n_pages;
	uint32_t slot;		/* reads: first host slot; writes: stage slot */
	void *buf;
	size_t len;
	uint64_t off;
	uint64_t t_submit;
	struct io_req *next;	/* free list */
};

/* Registered memory goes to io_uring a piece at a time (IO_PIECE bytes),
 * when an I/O first uses the piece: opening a pager pins nothing. */
#define IO_PIECE ((size_t)64 << 20)
#define IO_PIECES 4096		/* 256 GiB */
#define IO_REGIONS 4

struct kvmem_io {
	struct io_uring ring;
	unsigned depth, inflight;
	int fixed;			/* fixed buffers in use */
	int sparse;			/* pieces registered when first used */
	int has_ring;			/* ring set up (a directory store's) */
	int warned;			/* a piece was refused (said once) */
	struct iovec iov[IO_PIECES];	/* the pieces, in region order */
	int8_t state[IO_PIECES];	/* 1 registered, 0 not yet, -1 refused */
	unsigned n_iov;
	struct io_region {
		uint8_t *base;
		size_t len;
		unsigned first;	/* its first piece */
	} reg[IO_REGIONS];
	unsigned n_reg;
	struct io_req *reqs, *free_reqs;
};

int io_init(struct kvmem_io *io, unsigned depth);
void io_exit(struct kvmem_io *io);
/* The request records alone (a store without a ring). */
int io_init_reqs(struct kvmem_io *io, unsigned depth);
/* Register regions (pointer, length) as fixed buffers: a sparse table now,
 * each piece when an I/O first uses it (where the kernel has no sparse
 * tables, everything now); on failure I/O goes on without them (one
 * warning). */
void io_register(struct kvmem_io *io, void *const *bases, const size_t *lens, unsigned n);
struct io_req *io_req_get(struct kvmem_io *io);
void io_req_put(struct kvmem_io *io, struct io_req *r);
/* Queue a request (reads or writes of r->len at r->off into/from r->buf). */
int io_queue(struct kvmem_io *io, int fd, struct io_req *r);
/* Submit what is queued; wait for at least `wait` completions; call done()
 * on every completion reaped. Returns completions reaped, -1 on ring error. */
int io_reap(struct kvmem_io *io, unsigned wait, void (*done)(void *arg, struct io_req *r),
	    void *arg);

/* ---- the pager (pager.c and friends) ----------------------------------- */
/* PUR_OUT writes a block from its stage-out extent; PUR_POOL_OUT writes a
 * run of a block's pages from the host pool slots they were made in. */
enum { PUR_FETCH = 1, PUR_PREFETCH = 2, PUR_OUT = 3, PUR_POOL_OUT = 4 };

/* A write waiting for a request record (stage.c): stage-out never waits
 * for one, so an append runs ahead of the disk as far as the stage-out
 * buffer or the pool holds its pages. */
struct out_wait {
	int purpose;		/* PUR_OUT or PUR_POOL_OUT */
	uint64_t first_page;	/* PUR_OUT: the block; else its first page */
	uint32_t n_pages, slot;	/* PUR_OUT: the stage slot; else the first pool slot */
	void *buf;
	size_t len;
	uint64_t off;
};

/* A block's pages made in pool slots before it is appended
 * (kvmem_pager_block_memory): the slots, one per layer. */
struct pool_resv {
	uint64_t block;
	uint32_t *slot;
};

/* A block written from pool slots: its writes left (one per run of
 * consecutive slots) and when the first was queued. */
struct pool_out {
	uint64_t block;
	uint32_t left;
	uint64_t t0;
};

struct stage_slot {
	uint64_t block;
	int busy;		/* write in flight */
	uint64_t t_submit;
};

struct kvmem_pager {
	char dir[PATH_MAX];		/* the store's name: a directory or rados://... */
	kvmem_page_geom g;
	size_t page_bytes, page_stride, extent_bytes, tail_slot_bytes, sums_rec;
	int flags, rdonly;
	size_t max_read;		/* opts.max_read resolved */
	struct ws_store *ws;		/* where the bytes live (wstore.h) */
	int locked;			/* the writer's lock is held (claimed at open's end) */
	int wrote;			/* store_begin_write done: files may differ */

	struct manifest m;		/* last committed state */
	uint64_t n_tokens, n_blocks;	/* appended */
	int32_t *tok_pend;		/* tokens appended since the last commit */
	size_t tok_pend_cap;
	XXH3_state_t *tok_hash, *sums_hash;
	uint64_t *sums;			/* (L + 1) per appended block */
	size_t sums_cap;

	struct kvmem_pte *pt;		/* n_blocks * L entries */
	size_t pt_cap;
	void **orphan;			/* per block: extent kept in memory after a failed write */
	void **orphan_ix;		/* per block: index record the index file lacks */
	size_t orphan_cap;

	kvmem_hostpool *pool;
	uint64_t *slot_page;		/* per slot: page id or UINT64_MAX */
	uint16_t *slot_pin;
	const kvmem_repl_ops *repl;
	void *repl_st;

	int own_pool;			/* the pool is this pager's (else shared) */
	int shared;			/* a shared pool: mu guards every entry */
	uint32_t held;			/* slots of the pool this pager holds (pager_slots_take) */
	pthread_mutex_t mu;		/* recursive; used only when shared */

	struct kvmem_io io;
	unsigned writes_inflight;	/* stage-out writes submitted */
	struct out_wait *ow;		/* writes waiting for a request record */
	size_t ow_head, ow_n, ow_cap;	/* a ring */
	struct pool_resv *resv;		/* blocks made in pool slots */
	int n_resv, cap_resv;
	struct pool_out *pout;		/* blocks being written from the pool */
	int n_pout, cap_pout;
	uint8_t *stage_buf;		/* n_stage extents, registered */
	size_t stage_map_len;
	struct stage_slot *stage;
	uint32_t n_stage, stage_busy;

	int write_failed;		/* sticky since the last commit */
	int write_errno;		/* its cause (ENOSPC, EIO, ...) */
	char write_err[PATH_MAX + 512];
	uint64_t step, step_t0;
	kvmem_pager_stats st, base, at_step;
	void (*prefetch_hook)(void *arg, kvmem_pager *p, uint64_t next_step);
	void *prefetch_arg;
	uint32_t fetch_waiting;		/* fetch reads outstanding */
	/* Reads completed in the current reap pass, for the page_in_batch
	 * probe (read_done adds, pin_batch_fire fires and clears): requests,
	 * their pages, bytes read, summed submit-to-completion ns and each
	 * request's ns, so kvmemlat's per-request histogram costs a probe hit
	 * per pass, not per request. */
	struct pin_batch {
		uint64_t requests, pages, bytes, ns;
		uint64_t lat[KVMEM_PROBE_BATCH_MAX];
	} pin_batch;
	char read_err[PATH_MAX + 512];		/* first failure of the current fetch */
	int read_errno;				/* its code: EBADMSG checksum, EIO... */
};

/* store.c: the workspace over its store. */
int store_open(kvmem_pager *p, const char *dir, const kvmem_page_geom *g, int flags);
/* Before this open's first write (append or commit): cut what lies past
 * the last commit, remove a dead writer's temporary files. Until then the
 * open has changed no file but DIR/lock. */
int store_begin_write(kvmem_pager *p);
void store_close(kvmem_pager *p);
int store_grow(kvmem_pager *p, uint64_t blocks);	/* page table, sums, orphans */
void stats_save(kvmem_pager *p);
void stats_load(kvmem_pager *p);	/* the directory's saved totals as base */
/* Hash of stream i's bytes [0, len); -errno with a message naming `name`
 * when they cannot be read. */
int hash_stream_prefix(struct ws_store *s, int i, uint64_t len, const char *name, uint64_t *out);

/* The shared pool's lock around a pager's entry points (a pager of its
 * own pool needs none: one thread at a time, as before). */
static inline void pager_lock(const kvmem_pager *p)
{
	if (p->shared)
		pthread_mutex_lock((pthread_mutex_t *)&p->mu);
}

static inline void pager_unlock(const kvmem_pager *p)
{
	if (p->shared)
		pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
}

/* io completion handling (pager.c), stage-out (stage.c). */
void pager_io_done(void *arg, struct io_req *r);
/* Give writes waiting for a request record to io_uring while records are
 * free (some are kept for reads); 1 when any was queued. */
int out_pump(kvmem_pager *p);
void pool_out_done(kvmem_pager *p, struct io_req *r);
/* Give back a block's pool slots made ahead (close, or a block appended
 * from other memory). */
void resv_drop(kvmem_pager *p, int i);
/* Shared pools: another pager asks this one for up to `want` slots, as
 * far as it keeps `floor` (it passes when busy); the slots it freed. */
uint32_t pager_give_back(void *user, uint32_t want, uint32_t floor);
/* Slots of the pool taken and given back by this pager, counted in
 * p->held (its share's measure in a shared pool). */
uint32_t pager_slots_take(kvmem_pager *p, uint32_t want, uint32_t *first);
void pager_slots_give(kvmem_pager *p, uint32_t first, uint32_t n);
struct io_req *pager_req(kvmem_pager *p);	/* a free request, reaping if needed */
void read_done(kvmem_pager *p, struct io_req *r);
void pager_fail_write(kvmem_pager *p, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Evict until `need` slots are free; -ENOBUFS when pinned pages leave too
 * few, -ENOMEM. No message: the caller says what needed the room. In a
 * shared pool a pager below its share (the pool's slots over its pagers)
 * takes from the pagers above theirs before its own pages go; at or above
 * it, its own go first. Either way the rest of the pool comes last. */
int make_room(kvmem_pager *p, uint32_t need);
/* A shared pool short of room while its other pagers are busy in calls
 * (they give nothing back then): ask again ROOM_TRIES times, room_pause()
 * (0.2 ms) apart, before calling it too small. */
#define ROOM_TRIES 500
void room_pause(void);
/* Put a page's bytes in a fresh host slot (no I/O); -1 when no room. */
int pool_insert_copy(kvmem_pager *p, uint64_t page, const void *src);
/* The same without the copy: the slot the page now holds (its bytes are
 * the caller's to write before anything reads them). */
int pool_insert_slot(kvmem_pager *p, uint64_t page, uint32_t *slot);
int pager_reap(kvmem_pager *p, unsigned wait);
/* Fire page_in_batch with the reads gathered so far and start a new batch. */
void pin_batch_fire(kvmem_pager *p);
void stage_done(kvmem_pager *p, struct io_req *r);
int stage_drain(kvmem_pager *p);
/* Where an in-flight or failed block's bytes are in memory (or NULL). */
const uint8_t *stage_find(const kvmem_pager *p, uint64_t block);
int fault_fire(int kind);

#endif
