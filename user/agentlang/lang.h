/* SPDX-License-Identifier: MIT */
/* agentlang internals: the random source, the vocabulary's role tables and
 * the episode generator shared by workspaces and training sequences. */
#ifndef KVMEM_AGENTLANG_LANG_H
#define KVMEM_AGENTLANG_LANG_H

#include <stdint.h>

#include "agentlang/agentlang.h"

/* ---- random: xoshiro256** seeded through splitmix64 --------------------- */
struct al_rng {
	uint64_t s[4];
};

uint64_t al_mix64(uint64_t x);
void al_rng_seed(struct al_rng *r, uint64_t seed, uint64_t stream);
uint64_t al_next(struct al_rng *r);
/* Uniform in [0, n), n >= 1. */
uint32_t al_below(struct al_rng *r, uint32_t n);
/* Uniform in [0, 1) with 53 bits. */
double al_unit(struct al_rng *r);
static inline int al_chance(struct al_rng *r, double p)
{
	return al_unit(r) < p;
}

/* ---- vocabulary roles ---------------------------------------------------- */
/* Value types: each key name has one; needles use the wide ones only, so a
 * lucky guess almost never matches. */
enum al_vtype {
	AL_V_PORT,	/* 4 digits: "54" "##32" */
	AL_V_HOST,	/* node17: "node" "##17" */
	AL_V_HEX,	/* 0xa3f9: "0x" "##a3" "##f9" */
	AL_V_DURATION,	/* 30ms, 1500ms: number then unit */
	AL_V_SIZE,	/* 64mb */
	AL_V_COUNT,	/* 1..99: one token */
	AL_V_LEVEL,	/* one word from a small set from here on */
	AL_V_BOOL,
	AL_V_USER,
	AL_V_MODE,
	AL_V_REGION,
	AL_V_FORMAT,
	AL_V_DRIVER,
	AL_V_NTYPES,
	AL_V_FIRST_WORD = AL_V_LEVEL,
};

#define AL_MAX_LIST 160

struct al_list {
	int n;
	int32_t id[AL_MAX_LIST];
};

struct al_roles {
	int32_t dollar, eq, ok, colon;
	int32_t cmd_cat, cmd_set, cmd_ls, cmd_tail, cmd_grep, cmd_make, cmd_test, cmd_git,
		cmd_status, cmd_npm, cmd_build, cmd_run;
	int32_t w_passed, w_failed, w_modified, w_clean, w_built, w_files, w_took;
	struct al_list stem, ext, kp, kn, unit, hostpfx, logw, level;
	int32_t ext_log;
	int32_t variant[10];	/* [1..9]: glue digits; [0] unused */
	int32_t num[100];	/* start pieces "0".."99" */
	int32_t pair[256];	/* glue hex pairs "00".."ff" */
	int32_t hex0x;
	uint8_t kn_type[AL_MAX_LIST];
	struct al_list words[AL_V_NTYPES];	/* word sets, AL_V_FIRST_WORD.. */
};

/* Built once, thread-safe. */
const struct al_roles *al_roles(void);

/* ---- the episode generator --------------------------------------------- */
#define AL_FILE_KEYS 8		/* keys a file may hold */
#define AL_EP_MAX 96		/* bound on the tokens of one episode */

struct al_value {
	uint8_t n;
	int32_t t[AGENTLANG_MAX_VALUE];
};

struct al_key {
	uint8_t kp, kn;		/* indices into roles->kp / roles->kn */
	uint8_t shown;		/* its value appeared in the stream */
	struct al_value v;
};

struct al_file {
	uint16_t stem;		/* index into roles->stem */
	uint8_t variant;	/* 0: none, 1..9 */
	uint8_t ext;		/* index into roles->ext */
	uint8_t nkeys;
	uint8_t reserved;	/* a needle's: background episodes leave it alone */
	struct al_key key[AL_FILE_KEYS];
};

struct al_pair {
	int32_t f;
	uint8_t k;
};

struct al_gen {
	struct al_rng rng;
	int32_t *tok;
	int64_t len, cap, limit;
	struct al_file *file;
	int nfile;
	size_t capfile;
	int nbg;		/* files 0..nbg-1 are background files */
	uint8_t *taken;		/* file names in use: [stem][variant][ext] */
	int32_t *base;		/* this world's (stem * 10 + variant) pool */
	int nbase;
	uint8_t kp_pool[AL_MAX_LIST], kn_pool[AL_MAX_LIST];
	int nkp_pool, nkn_pool;
	struct al_pair *ask;	/* background pairs shown so far */
	int nask;
	size_t capask;
	double q_rate;		/* background questions per token */
	double q_credit;
	/* Set by every fact line emitted, and per key by al_ep_cat. */
	int64_t fact_line, fact_value;
	int64_t cat_line[AL_FILE_KEYS], cat_value[AL_FILE_KEYS];
};

/* A world of nbg background files for a stream of limit tokens. */
int al_gen_init(struct al_gen *g, uint64_t seed, uint64_t stream, int64_t limit, int nbg,
		double q_rate);
void al_gen_free(struct al_gen *g);

int al_push(struct al_gen *g, int32_t t);
int al_push_file(struct al_gen *g, const struct al_file *f);
int al_push_key(struct al_gen *g, const struct al_key *k);
int al_push_value(struct al_gen *g, const struct al_value *v);

/* A fresh random value of a type, different from `not` when given. */
void al_value_random(struct al_gen *g, int vtype, const struct al_value *not,
		     struct al_value *out);
int al_value_eq(const struct al_value *a, const struct al_value *b);
int al_key_type(const struct al_key *k);
/* Index of key (kp, kn) in f, or -1. */
int al_file_find_key(const struct al_file *f, int kp, int kn);
/* A new file with a name not yet taken (base -1: from the pool), or -1. */
int al_file_new(struct al_gen *g, int base, int ext, int reserved);
/* Add key (kp, kn) with a random value; returns its index or -1 when full. */
int al_file_add_key(struct al_gen *g, int f, int kp, int kn);

/* Episodes. Each appends at most AL_EP_MAX tokens; the caller makes room. */
int al_ep_cat(struct al_gen *g, int f);
int al_ep_set(struct al_gen *g, int f, int k, const struct al_value *v);
int al_ep_question(struct al_gen *g, int f, int k);
/* One background episode (and maybe questions after it). */
int al_ep_background(struct al_gen *g);
/* A question (when they are wanted) or a "$ set": at most AL_SMALL_MAX. */
#define AL_SMALL_MAX 16
int al_ep_small(struct al_gen *g);
/* Lines of filler up to exactly g->limit tokens. */
int al_fill(struct al_gen *g);

#endif
