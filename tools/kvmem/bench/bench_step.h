/* SPDX-License-Identifier: MIT */
/*
 * kvmem bench step's private header: what its files (bench_step.c, the
 * options and the driver; bench_step_util.c, bench_step_remat.c,
 * bench_step_steps.c, bench_step_stage.c) share: the options, the run's
 * context, a step tier's result, the helpers and the phases.
 */
#ifndef KVMEM_TOOLS_BENCH_STEP_H
#define KVMEM_TOOLS_BENCH_STEP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/backend_impl.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "kvmem/pager.h"
#include "kvmem/store.h"
#include "session/inspect.h"
#include "bench_common.h"
#include "cli_util.h"
#include "cmd.h"

#define WHO "kvmem bench step"
#define BATCH 1024	/* pages per place() call: view.c's PLACE_BATCH */
#define BLOCK 32
#define MAX_LIST 8

/* The step phase's tiers (--tiers). */
enum { TIER_WARM = 1, TIER_PAGES = 2, TIER_COLD = 4 };

enum { PH_CEIL = 1, PH_REMAT = 2, PH_COLDIN = 4, PH_STEP = 8, PH_DECODE = 16, PH_STAGE = 32,
       PH_MEM = 64, PH_FITS = 128, PH_ALL = 255 };

struct opts {
	struct bench_model bm;
	const char *dir;
	int layers, mem_layers, steps, question, decode, chunk, only, keep, host_scoring, tiers;
	int64_t tokens, view, remat, prefill, memory[MAX_LIST];
	int n_memory;
	uint64_t coldin, gpu_mem, host_cap, seed, index_mem, read_size;
	int queue_depth;
	int tp;			/* --tp: tensor parallel ranks; 0: off */
	uint32_t kv_dtype;	/* --kv-dtype: KVMEM_DTYPE_BF16, or _FP8 (pages and views) */
	int both;		/* --kv-dtype both: the coldin phase in bf16 and in fp8, kv_dtype
				 * bf16 for the rest */
	const char *policy;	/* --policy: the step phase's selection (meank) */
};

struct ctx {
	struct opts o;
	kvmem_model geo;	/* a geometry: the backend makes random weights */
	kvmem_backend *b;
	kvmem_ceilings ce;
	size_t half, page_bytes;	/* one K (or V) half (bf16 only), a page (with its
					 * scales in fp8) */
	double prefill_view_s;		/* the step's peer */
	double plain_decode_tps;
	/* The step's floor: the question's forward and one decoded token over
	 * an empty view (no KV to read: what no KV format can shrink). */
	double floor_step_s;
	kvmem_view *peer;		/* the view prefilled with --view tokens */
	/* The last phases' figures, for --kv-dtype both's ratios: the warm
	 * tier's median step (s) and decode (tokens/s; 0: not run), the
	 * largest view that fits (slots). */
	double warm_step_s, warm_decode_tps;
	/* the warm steps' parts, like for like across dtypes whose selections
	 * differ: the median first token, and the selections' time per block
	 * entered (all steps) */
	double warm_first_s, warm_sel_per_block_s;
	double warm_ask_s;		/* the median question's prefill */
	int64_t fits_slots;
};

struct step_result {
	/* A step: the question appended (its prefill over the view as it
	 * is: ask_s), the selection (select_s), the first token (decode_s);
	 * step_s all three, what the user waits for. */
	double adopt_s, step_s[64], ask_s[64], select_s[64], decode_s[64];
	uint64_t bytes[64], nvme_pages[64], pool_hits[64], tokens[64], moved[64], src_pages[64];
	uint64_t staged[64];	/* token-layers moves copied aside (their sources) */
	/* The selection's split (kvmem_session_stats): ms a step */
	double score_ms[64], plan_ms[64], smove_ms[64], splace_ms[64], after_ms[64];
	double move_ms[64], place_ms[64];
	/* The question's split (kvmem_session_stats over its append): its
	 * forward, its rows put away on the session's thread, the writer's
	 * time on them (of which the pages), the append's wait for it. */
	double ask_fwd_ms[64], ask_store_ms[64], ask_writer_ms[64], ask_pages_ms[64];
	double ask_wait_ms[64];
	uint64_t pool_bytes[64];	/* page bytes read from the device page pool */
	/* Pages the device page pool took at adopt (pool_fill), their bytes,
	 * the time, the pool's pages then and its slots. */
	uint64_t filled_pages, filled_bytes, pool_pages, pool_cap;
	double fill_s;
	double decode_tps;
	/* The timed decode: its per-token split (kvmem_session_stats), the
	 * view's length when it began, and selections it forced. */
	double dec_fwd_ms, dec_store_ms, dec_own_ms;
	int64_t dec_view, dec_forced;
	uint64_t mem_used;	/* the backend's device memory with the session's view */
	int64_t entered[64];	/* blocks that entered the view at each step */
	double select_only_s;	/* a selection that moves nothing: scoring + planning */
	int64_t selections, entering;	/* counted by on_select */
	int64_t device_scored;	/* selections scored on the device */
	uint64_t index_dev, index_host;	/* the index: device copy, host arrays */
};

/* bench_step_util.c */
const char *vs(char *buf, size_t n, double peer_s, double t_s);
double gbps(double bytes, double s);
uint64_t xs(uint64_t *s);
void fill_bf16(void *dst, size_t bytes, uint64_t seed);
void fp8_valid(char *p, size_t bytes);
void random_ids(int32_t *ids, int64_t n, int vocab, uint64_t seed);
void rm_rf(const char *path);
void place_delta(struct ctx *x, const kvmem_place_stats *a, kvmem_place_stats *d);
void place_now(struct ctx *x, kvmem_place_stats *s);
double prefill_view(struct ctx *x, kvmem_view *v, int64_t n, int chunk, float *logits);
void geom_of(const struct ctx *x, const kvmem_model *m, kvmem_page_geom *g);
int make_workspace(struct ctx *x, const kvmem_model *m, const char *dir, int64_t tokens,
		   double *secs);
double median(const double *v, int n);

/* bench_step_remat.c */
int ph_ceilings(struct ctx *x);
int ph_remat(struct ctx *x);
int ph_remat_both(struct ctx *bf16, struct ctx *fp8);
double seq_read(const char *path, uint64_t size, size_t req, int qd);
int ph_coldin(struct ctx *x);
int ph_coldin_both(struct ctx *bf16, struct ctx *fp8);
int peers(struct ctx *x);

/* bench_step_steps.c */
int run_tier(struct ctx *x, const kvmem_model *m, const char *dir, int64_t tokens,
	     uint64_t host_cap, int steps, int do_decode, int move, struct step_result *r);
const char *scored_where(const struct step_result *r);
int ph_step(struct ctx *x, int phases);

/* bench_step_stage.c */
int ph_stageout(struct ctx *x);
int ph_memory(struct ctx *x);
int ph_fits(struct ctx *x);

#endif
