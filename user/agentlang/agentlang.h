/* SPDX-License-Identifier: MIT */
/*
 * agentlang: the synthetic agent-workspace language that kvmem's own model is
 * trained on and that the recall benchmark and the demo speak.
 *
 * A workspace is the transcript of an agent at work: tool calls ("$ cat",
 * "$ set", "$ grep", "$ ls", "$ tail", "$ make test") and their outputs. The
 * facts are config lines, one per line and self-contained:
 *
 *     api2.conf db.port = 5432
 *
 * (file "api2.conf", key "db.port", value "5432"). Look-alikes surround them:
 * the same key in sibling files, neighbouring keys in the same file, older
 * values of the same key, the same value under other keys. A question asks
 * for the latest value of a key in a file seen earlier:
 *
 *     ? api2.conf db.port = 5432 <end>
 *
 * Everything is deterministic from a seed. Documentation/agentlang.md tells
 * the why; this header is the contract.
 *
 * Tokenizer: word-level with a fixed vocabulary built in C (no file to ship).
 * A token is a "start" piece (preceded by a space in text, or by nothing at
 * the start of a line) or a "glue" piece (joined to the previous piece with
 * no space: ".conf", ".port", "##32"-style digit pairs). Encoding splits text
 * at blanks and newlines and takes, greedily, the longest start piece and
 * then the longest glue pieces of each word.
 */
#ifndef AGENTLANG_AGENTLANG_H
#define AGENTLANG_AGENTLANG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

/* ---- vocabulary --------------------------------------------------------- */
/* Special ids; fixed forever (the trained model's config names them). */
enum agentlang_special {
	AGENTLANG_PAD = 0,	/* "<pad>": fills a training sequence; no loss */
	AGENTLANG_BOS = 1,	/* "<bos>": first token of every sequence */
	AGENTLANG_EOS = 2,	/* "<eos>": reserved */
	AGENTLANG_Q = 3,		/* "?": a question begins */
	/* "=": between key and value in every fact, and the last token of a
	 * question, after which the answer follows. One token for both, so a
	 * question reads exactly like the start of its fact line. */
	AGENTLANG_A = 4,
	AGENTLANG_END = 5,	/* "<end>": the answer is complete */
	AGENTLANG_NL = 6,	/* newline */
	AGENTLANG_N_SPECIAL = 7,
};

/* What a token can be (a bit mask: a piece may serve several roles). */
enum agentlang_role {
	AGENTLANG_R_SPECIAL = 1u << 0,
	AGENTLANG_R_STRUCT = 1u << 1,	/* "$", "=", "ok", ":" */
	AGENTLANG_R_COMMAND = 1u << 2,	/* cat, set, grep, ... */
	AGENTLANG_R_STEM = 1u << 3,	/* file stems: api, billing, ... */
	AGENTLANG_R_VARIANT = 1u << 4,	/* glue digit after a stem: api2 */
	AGENTLANG_R_EXT = 1u << 5,	/* glue: .conf .yaml ... (.log too) */
	AGENTLANG_R_KEYPART = 1u << 6,	/* first half of a key: db, cache, ... */
	AGENTLANG_R_KEYNAME = 1u << 7,	/* glue second half: .port .host ... */
	AGENTLANG_R_VALUE = 1u << 8,	/* may appear in a value */
	AGENTLANG_R_WORD = 1u << 9,	/* log and command-output words */
	AGENTLANG_R_UNUSED = 1u << 10,	/* padding of the vocabulary */
};

#define AGENTLANG_MAX_VALUE 3				/* tokens in a value */
#define AGENTLANG_MAX_ANSWER (AGENTLANG_MAX_VALUE + 1)	/* value + <end> */
#define AGENTLANG_MAX_QUESTION 8				/* "? file key =" */

/* Tokens in the vocabulary (a multiple of 64; the model's vocab_size). */
int agentlang_vocab_size(void);
/* FNV-1a over every piece and its glue flag: changes iff the vocabulary does. */
uint32_t agentlang_vocab_hash(void);
/* Whether the model directory `dir` (config c) speaks this agentlang: its
 * vocabulary size, and the "kvmem_vocab_hash" its config.json records when
 * it was trained here. 0: it does; 1: the size fits and no hash is recorded
 * (trained elsewhere, assumed to fit); negative: it does not (-ESTALE), or
 * config.json cannot be read. */
struct kvmem_config;
int agentlang_check_model(const char *dir, const struct kvmem_config *c);
/* The piece's text ("\n" for AGENTLANG_NL); NULL when id is out of range. */
const char *agentlang_piece(int id);
int agentlang_is_glue(int id);
unsigned agentlang_roles(int id);
/* The id of a piece, or -1. glue selects the glue or the start form. */
int agentlang_lookup(const char *piece, int glue);

/* Text -> ids. Returns the count, or -1 (kvmem_last_error names the word that
 * has no piece, or says cap is too small). */
int agentlang_encode(const char *text, int32_t *ids, size_t cap);
/* Ids -> text, NUL-terminated, truncated to cap like snprintf. Returns the
 * full length, or -1 for an id out of range. decode then encode gives the
 * ids back for every workspace and stream sequence the generator makes (not
 * always for view sequences, whose cuts can glue pieces of two lines). */
long agentlang_decode(const int32_t *ids, size_t n, char *buf, size_t cap);

/* ---- workspaces with needles (benchmark, demo) -------------------------- */
typedef struct agentlang_params {
	uint64_t seed;
	int64_t n_tokens;	/* exact length of the workspace, >= 256 */
	int n_questions;	/* needles, one question each */
	/* [n_questions] needle depths in [0, 1]: 0 = the oldest history, 1 =
	 * the newest. NULL: spread evenly, (i + 0.5) / n_questions. */
	const double *depths;
	int lookalikes;		/* look-alike fact lines per needle, 0..16 */
	double stale;		/* chance a needle has an older value earlier, 0..1 */
	double bg_questions;	/* other Q/A lines in the history, per 1000 tokens */
	double needle_cat;	/* chance the needle shows in a "$ cat" (else "$ set") */
} agentlang_params;

/* seed 1, 8192 tokens, 8 questions, 4 look-alikes, stale 0.3, 2 background
 * questions per 1000 tokens, needle_cat 0.5. */
void agentlang_params_default(agentlang_params *p);

typedef struct agentlang_question {
	int32_t ids[AGENTLANG_MAX_QUESTION];	/* "? file key =": append these */
	int n_ids;
	int32_t answer[AGENTLANG_MAX_ANSWER];	/* the value, then <end> */
	int n_answer;
	int64_t needle_pos;	/* first token of the needle's fact line */
	int64_t needle_end;	/* one past its newline */
	int64_t value_pos;	/* first token of the value */
	double depth_asked;
	double depth;		/* needle_pos / n_tokens: where it landed */
	int lookalikes;		/* look-alike lines emitted for this needle */
	int64_t stale_pos;	/* line of the older value, or -1 */
} agentlang_question;

typedef struct agentlang_transcript {
	int32_t *ids;		/* [n_ids]: starts with <bos>, ends with a newline */
	int64_t n_ids;
	agentlang_question *q;	/* [n_q], in the order of the depths given */
	int n_q;
} agentlang_transcript;

/* Build a workspace. The questions are not in ids: a caller appends q[i].ids
 * after the history and expects q[i].answer. Every needle is the latest value
 * of its key in its file, so the answer is right whatever order the questions
 * come in. Fails with -EINVAL on bad parameters (e.g. more needles than fit),
 * -ENOMEM. */
int agentlang_transcript_build(const agentlang_params *p, agentlang_transcript *ws);
void agentlang_transcript_free(agentlang_transcript *ws);

/* Exact match: 1 when gen starts with the whole answer (value and <end>),
 * else 0. Tokens after <end> are ignored. */
int agentlang_exact_match(const agentlang_question *q, const int32_t *gen, int n_gen);

/* ---- training sequences ------------------------------------------------- */
enum agentlang_seq_kind {
	/* A workspace of seq_len tokens with questions between the episodes,
	 * each about a fact shown earlier in the same sequence. */
	AGENTLANG_SEQ_STREAM = 0,
	/* What the model sees under kvmem: a workspace 2..16x seq_len long cut
	 * to sink + 32-token blocks (those of the needles, look-alike ones and
	 * random ones) + recent tokens, in order, then questions about the
	 * needles. */
	AGENTLANG_SEQ_VIEW = 1,
};

typedef struct agentlang_seq_info {
	int kind;		/* enum agentlang_seq_kind */
	int n_questions;
	int n_tokens;		/* before padding */
	int lookalikes;		/* view sequences: the fewest look-alike lines a
				 * needle of the workspace got; -1 otherwise */
} agentlang_seq_info;

/* Sequence `index` of the corpus with this seed: exactly seq_len (>= 256)
 * tokens, padded with <pad>. view_share: the chance it is a view sequence.
 * Every answer is in the sequence. */
int agentlang_train_seq(uint64_t seed, uint64_t index, int seq_len, double view_share,
		       int32_t *out, agentlang_seq_info *info);

/*
 * How view sequences are made. All zero: the generator's own mix (above),
 * the sequences agentlang_train_seq gives.
 *
 * policy: a selection policy that reads only token ids (KVMEM_NEED_TEXT,
 * no keys or summaries beyond Mean-K: "lexical") chooses each view, the
 * way kvmem_session_select_ahead does at inference (agentlang_view_select):
 * 1-4 questions a view, the budget of kvmem bench recall for a window of
 * seq_len (seq_len - 32 - seq_len / 8, in blocks of 32). A question whose
 * needle line the view does not hold is not asked.
 * max_ratio: the largest workspace in windows, 16 (0), 32 or 64.
 * stale: the chance a needle has an older value earlier (0: the default,
 * 0.3); an older printing in view beside the newest is what a policy's
 * view brings, and what the model must learn to pass over.
 * drop: with a policy, the chance that a needle line cut by a block
 * boundary keeps only the block(s) of its value (the file and key cut off,
 * as views at inference sometimes do); the question is asked anyway.
 */
typedef struct agentlang_view_opts {
	const char *policy;
	int max_ratio;
	double stale;
	double drop;
	/* With a policy: the chance that a view sequence whose workspace is
	 * longer than the window is "paged" (agentlang_pages, below). Drawn
	 * apart from the sequence's own random stream: the ids are the same
	 * whatever paged is. */
	double paged;
	int window;	/* a page window's length in tokens; 0: seq_len */
	/* The chance that a paged sequence of a workspace of at least
	 * whole_min_ratio windows (0: 16) is "whole": its page windows tile
	 * the whole workspace (agentlang_pages), so that train.py can compute
	 * every block's Mean-K summary as kvmem's prefill would. Drawn apart
	 * from the sequence's stream and from the paged draw. */
	double whole;
	int whole_min_ratio;
	/* 1..16: every view sequence's needles get this many look-alike lines
	 * (a held-out corpus at kvmem bench recall's count, 8 in #29's
	 * targets); 0: drawn per sequence, 0-6 (0-8 with a policy). The draw
	 * is made either way, so the rest of a sequence's stream is the same. */
	int lookalikes;
} agentlang_view_opts;

/* agentlang_train_seq with view options (NULL: all zero). */
int agentlang_train_seq_opts(uint64_t seed, uint64_t index, int seq_len, double view_share,
			    const agentlang_view_opts *vo, int32_t *out, agentlang_seq_info *info);

/*
 * What a paged view sequence needs to compute its view's K/V the way kvmem
 * does: kvmem re-uses the K/V computed when the workspace was prefilled, in
 * the workspace's own context, rotated again at the view's compact positions
 * 0..n_view-1. The cheap form of that context: windows of at most `window`
 * workspace tokens, each ending where a run of kept tokens ends; a window
 * serves every run that starts at least window / 2 tokens after the window's
 * start (or in a window that starts at the workspace's start), and runs
 * longer than window / 2 are cut into pieces of window / 2, so every kept
 * token has at least window / 2 tokens of its workspace before it in its
 * window (or all of them). The sequence's first n_view ids are the kept
 * tokens in order: token i is ids[win[i] * window + off[i]], workspace
 * position pos[i].
 *
 * A whole paged sequence (whole = 1) has windows that tile the workspace
 * instead: window 0 is [0, min(N, W)), window k ends at min(N, W + k W/2)
 * and starts W before its end (at 0 at most), and owns the tokens from the
 * previous window's end to its own: every workspace token is owned by one
 * window, with at least W/2 tokens of its workspace before it there (or
 * all of them); a kept token's win and off are its owner's. needle[i] is
 * the workspace position of the '=' of the fact line that the i-th
 * question after the view asks about (every paged sequence has them).
 */
typedef struct agentlang_pages {
	int n_view;		/* 0: the sequence is not paged */
	int n_windows;
	int window;
	int64_t ws_tokens;	/* the workspace's length */
	int64_t *win_start, *win_end;	/* [n_windows]: workspace offsets, end - start <= window */
	int32_t *ids;		/* [n_windows * window]: each window's tokens, <pad> after its end */
	uint16_t *win, *off;	/* [n_view]: the window of each kept token, its place there */
	int64_t *pos;		/* [n_view]: its workspace position */
	int whole;		/* the windows tile the workspace (above) */
	int n_q;		/* questions after the view */
	int64_t needle[64];	/* [n_q]: each one's fact line's '=' in the workspace */
	/* Only when want_workspace was set before the call: the workspace
	 * itself (tests compare the kept tokens with a plan of their own). */
	int want_workspace;
	agentlang_transcript *ws;
} agentlang_pages;

/* agentlang_train_seq_opts that also fills pg (n_view 0 when the sequence
 * is not paged). pg->want_workspace is read; free with agentlang_pages_free
 * (also after an error). */
int agentlang_train_seq_paged(uint64_t seed, uint64_t index, int seq_len, double view_share,
			      const agentlang_view_opts *vo, int32_t *out, agentlang_seq_info *info,
			      agentlang_pages *pg);
void agentlang_pages_free(agentlang_pages *pg);

/*
 * The view a policy keeps of workspace ws for the questions asked[n_asked]
 * (indices into ws->q): for each, the policy scores ws's 32-token blocks
 * with the question's ids as the select-ahead text, and the planner
 * (sink max(1, budget / 100), recent max(1, budget / 12)) plans a view of
 * sink + recent + an even share of the rest of budget; keep[ws->n_ids]
 * gets 1 for every token of the union. With one question this is exactly
 * the plan kvmem_session_select_ahead makes over ws with that budget.
 * Returns the kept count or -errno (an unknown policy, one that needs the
 * model's keys, no memory).
 */
/* 0 when `policy` can choose views at corpus time (it reads only token
 * ids), else -EINVAL (unknown, or it scores the model's keys). */
int agentlang_view_policy_check(const char *policy);
int64_t agentlang_view_select(const agentlang_transcript *ws, const int *asked, int n_asked,
			      int64_t budget, const char *policy, uint8_t *keep);

/* ---- corpus files (kvmem synth corpus -> tools/train/train.py) ---------- */
/*
 * Little endian. A 160-byte header (128 before version 4), then
 * n_seqs * seq_len ids (uint16 or uint32). Offsets:
 *   0 "KVMSYN1\0"  8 u32 version (4)  12 u32 header bytes (160)
 *  16 u32 vocab size  20 u32 seq_len  24 u64 n_seqs  32 u64 seed
 *  40 u32 id bytes (2|4)  44 u16 pad, bos, eos, q, a, end
 *  56 u32 view share in 1/1000  60 u32 vocabulary hash
 * Version 2 adds (version 1 had a 64-byte header and the generator's own
 * views; it is still read):
 *  64 char[32] view policy, NUL-padded ("" for the generator's own mix)
 *  96 u32 largest workspace in windows  100 u32 stale chance in 1/1000
 *     (0: the default)  104 u32 drop chance in 1/1000  108.. zero
 * Version 3 adds paged view sequences (agentlang_pages; versions 1 and 2
 * are still read):
 * 108 u32 paged chance in 1/1000  112 u32 page window length
 * 116 u32 paged sequences  120 u64 offset of the paged index (0: none)
 * Version 4 (a 160-byte header; version 3 is still read) adds whole paged
 * sequences (agentlang_pages.whole) and each question's needle:
 * 128 u32 whole chance in 1/1000  132 u32 whole_min_ratio
 * 136 u32 whole sequences  140 u32 look-alike lines a needle of every view
 * sequence (0: drawn a sequence; zero in files written before it)
 * 144.. zero
 * After the ids, one record per paged sequence, in sequence order, each
 * 4-byte aligned:
 *   u32 n_view, n_windows, workspace tokens (saturated at 2^32 - 1), window
 *   u32 flags (bit 0: whole), n_q, 0, 0          (version 4 only)
 *   u32 needle[n_q]                              (version 4 only)
 *   u32 win_start[n_windows], win_end[n_windows]
 *   u16 win[n_view], off[n_view]   (each with a u16 0 after it when n_view
 *                                   is odd)
 *   u16 ids[n_windows * window]    (<pad> after each window's end)
 * then the index: per paged sequence, u64 its sequence number, u64 the
 * offset of its record. Paged corpora need 2-byte ids.
 */
#define AGENTLANG_CORPUS_MAGIC "KVMSYN1"
#define AGENTLANG_CORPUS_HEADER 160
#define AGENTLANG_CORPUS_HEADER_V3 128	/* versions 2 and 3 */
#define AGENTLANG_CORPUS_HEADER_V1 64
#define AGENTLANG_CORPUS_POLICY 32

typedef struct agentlang_corpus_header {
	uint32_t version, header_bytes, vocab, seq_len, id_bytes, view_permille, vocab_hash;
	uint64_t n_seqs, seed;
	uint16_t pad, bos, eos, q, a, end;
	char view_policy[AGENTLANG_CORPUS_POLICY];	/* "" for version 1 */
	uint32_t max_ratio, stale_permille, drop_permille;
	uint32_t paged_permille, window, n_paged;	/* version 3; 0 before */
	uint64_t paged_index;
	uint32_t whole_permille, whole_min_ratio, n_whole;	/* version 4; 0 before */
	uint32_t lookalikes;	/* version 4: view.lookalikes (0: drawn) */
} agentlang_corpus_header;

typedef struct agentlang_corpus_opts {
	uint64_t seed;
	int64_t n_tokens;	/* at least this many: ceil(n_tokens / seq_len) sequences */
	int seq_len;
	double view_share;
	agentlang_view_opts view;	/* how view sequences are made */
	int id_bytes;		/* 2 or 4; 0: 2 */
	int threads;		/* 0: OpenMP's default */
	void (*progress)(int64_t done_tokens, int64_t total_tokens, void *arg);
	void *arg;
} agentlang_corpus_opts;

/* Write a corpus file. The result does not depend on the thread count. */
int agentlang_corpus_write(const char *path, const agentlang_corpus_opts *o);
int agentlang_corpus_read_header(const char *path, agentlang_corpus_header *h);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
