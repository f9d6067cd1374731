/* SPDX-License-Identifier: MIT */
/*
 * The lab trace file, private to user/lab (Documentation/formats.md, "Lab
 * trace", is the description of record).
 *
 *   header   256 bytes: magic, version, model geometry and fingerprint, the
 *            live session's options, a label, XXH3-64 of the bytes before it
 *   records  each a 16-byte head (type, payload bytes, XXH3-64 of the
 *            payload seeded with type << 32 | bytes), the payload, zero
 *            padding to a multiple of 8
 *   END      the last record: counts; a trace without it is truncated
 *
 * Host byte order (little-endian on every machine kvmem runs on), like the
 * workspace's files.
 */
#ifndef KVMEM_LAB_TRACE_H
#define KVMEM_LAB_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem/lab.h"

#define LAB_MAGIC "KVLABTR1"
#define LAB_HEADER_BYTES 256
#define LAB_RECORD_HEAD 16
/* No record may claim more (a forged length is refused, not allocated). */
#define LAB_RECORD_MAX (1u << 31)

enum lab_record_type {
	LAB_REC_SELECT = 1,	/* one selection */
	LAB_REC_SPAN = 2,	/* an annotation for the next unforced selection */
	LAB_REC_READS = 3,	/* page reads outside selections */
	LAB_REC_STATE = 4,	/* the plan in force when recording began */
	LAB_REC_END = 5,	/* counts; the last record */
};

/* The header, as on disk. */
struct lab_header {
	char magic[8];
	uint32_t version, header_bytes;
	uint64_t fingerprint;
	uint32_t n_layers, n_heads, n_kv_heads, head_dim;
	uint32_t vocab, window;
	double rope_theta;
	uint32_t block, chunk, query_tokens, reserved0;
	int64_t budget, sink, recent, reserve;
	uint64_t seed;
	char policy[32];
	char label[64];
	uint8_t reserved[40];
	uint64_t checksum;
};
_Static_assert(sizeof(struct lab_header) == LAB_HEADER_BYTES, "lab header is 256 bytes");

struct lab_record_head {
	uint32_t type, bytes;
	uint64_t checksum;
};

/* The fixed part of a SELECT payload; then i64 q_pos[n_store], i64
 * pins[n_pins][2], f32 q[L][n_store][Hq][D], u32 blocks[n_sets][n_view],
 * struct lab_run runs[n_runs]. */
struct lab_select_head {
	int64_t step, n_tokens, budget, sink, recent, reserve, span;
	uint64_t seed;
	uint32_t block, forced, n_q, n_store;
	uint32_t n_pins, n_sets, n_view, n_runs;
};
_Static_assert(sizeof(struct lab_select_head) == 96, "select head is 96 bytes");

/* Page reads of consecutive blocks of one layer with one tier and reason. */
struct lab_run {
	uint32_t block, count;
	uint16_t layer;
	uint8_t tier, why;
};
_Static_assert(sizeof(struct lab_run) == 12, "a read run is 12 bytes");

/* SPAN: then label bytes. */
struct lab_span_head {
	uint32_t kind, label_len;
	int64_t start, end;
};

/* STATE (the session as recording began): then u32 blocks[n_sets][n_view]
 * of the plan in force. n_tokens: history; sel_tokens: tokens before the
 * tail (the last selection's); plan_tokens: the history when that plan was
 * made; view_tokens: its tokens per set. */
struct lab_state_head {
	int64_t n_tokens, sel_tokens, plan_tokens, view_tokens;
	uint32_t block, n_sets, n_view, reserved;
};

/* END. */
struct lab_end {
	int64_t steps, spans, runs, reads;
	uint64_t bytes;		/* of the file before this record */
	uint64_t query_bytes;
	int64_t max_tokens;
	uint64_t reserved;
};

uint64_t lab_record_checksum(uint32_t type, const void *payload, uint32_t bytes);
uint64_t lab_header_checksum(const struct lab_header *h);

/* ---- a trace in memory (trace_read.c) ------------------------------------- */
struct lab_span {
	int kind;
	int64_t start, end;
	const char *label;	/* not NUL-terminated: label_len bytes */
	int label_len;
};

struct lab_sel {
	struct lab_select_head h;
	const int64_t *q_pos;	/* [n_store] */
	const int64_t *pins;	/* [n_pins][2] */
	const float *q;		/* [L][n_store][Hq][D] */
	const uint32_t *blocks;	/* [n_sets][n_view] */
	const struct lab_run *runs;
	int has_needle, has_query;
	struct lab_span needle, query;	/* the last of each kind before it */
};

struct lab_trace {
	char path[4096];
	void *map;
	size_t len;
	struct lab_header h;
	struct lab_sel *sel;
	int64_t n_sel;
	int has_state;
	struct lab_state_head state;
	const uint32_t *state_blocks;
	const struct lab_run **other;	/* READS records' runs */
	uint32_t *n_other;
	int64_t n_reads_recs;
	struct lab_end end;
	kvmem_lab_trace_info info;
};

/* Map and check a whole trace (-EBADMSG, -ESTALE, -ENOENT ... naming it). */
int lab_trace_open(const char *path, struct lab_trace *t);
void lab_trace_close(struct lab_trace *t);

#endif
