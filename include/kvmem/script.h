/* SPDX-License-Identifier: MIT */
/*
 * The session script: an agent's steps as text, one JSON object per line
 * (blank lines skipped), what `kvmem run --script` and the policy lab read.
 *
 *   {"append": [ids...], "pin": true}   prefill these ids ("pin": keep them
 *                                        in every view; optional)
 *   {"append_random": N, "seed": S}     N random ids (seed optional; default
 *                                        from the script's seed and the line)
 *   {"decode": N}                       a step boundary: select, then
 *                                        generate N ids with the view frozen
 *
 * Read a line at a time, so memory is bounded by the longest line, never by
 * the script's token count; an append_random keeps only its count and
 * generator (kvmem_script_random_ids makes its ids in chunks). A pipe or FIFO
 * is read as it arrives (an agent may feed steps as it goes).
 */
#ifndef KVMEM_SCRIPT_H
#define KVMEM_SCRIPT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: what is declared here is its API. */
#pragma GCC visibility push(default)

enum kvmem_step_kind { KVMEM_STEP_APPEND = 0, KVMEM_STEP_DECODE = 1 };

#define KVMEM_SCRIPT_MAX_DECODE (1 << 30)
#define KVMEM_SCRIPT_MAX_RANDOM (1 << 28)

typedef struct kvmem_script_step {
	int kind;		/* enum kvmem_step_kind */
	int line;		/* 1-based line of the script */
	int pin;		/* an append pins its span */
	int64_t n;		/* tokens appended or decoded */
	const int32_t *ids;	/* "append": its ids, valid until the next call;
				 * NULL for append_random */
	uint64_t rng;		/* append_random: the state its ids come from */
} kvmem_script_step;

typedef struct kvmem_script kvmem_script;

/*
 * Open `path` for a model of `vocab` ids; seed: the default seed of
 * append_random lines. -ENOENT etc. from open, -EISDIR for a directory.
 */
int kvmem_script_open(const char *path, int vocab, uint64_t seed, kvmem_script **out);
/* When the script is a regular file, read it whole and check every line
 * (so a bad line 900 refuses the run before line 1 does anything), then
 * rewind. A pipe is checked line by line as it is read. */
int kvmem_script_check(kvmem_script *sc);
/* The next step: 1, 0 at the end, negative (-EBADMSG: a line that is not
 * strict JSON, "<file>:<line>:1:<column>: ..."; -EINVAL: JSON that is not a
 * step, "<file>:<line>: what is wrong"; -EIO: a read error; -ENODATA: a
 * script with no step at all). */
int kvmem_script_next(kvmem_script *sc, kvmem_script_step *st);
void kvmem_script_close(kvmem_script *sc);
/* The next k ids of an append_random step, uniform over the vocabulary. */
void kvmem_script_random_ids(kvmem_script_step *st, int vocab, int32_t *ids, int64_t k);

/*
 * A token-id file (`kvmem run --prompt FILE`): whitespace-separated decimal
 * ids, each in [0, vocab), at most KVMEM_TOKEN_FILE_MAX of them. Read a byte
 * at a time, so no id is ever cut in two however long it is written, and a
 * NUL byte (a binary file, or "1\0 2") is an error, not a separator. *ids is
 * malloc'd. -EINVAL names the offset and index of the first bad token; an
 * empty file is -ENODATA.
 */
#define KVMEM_TOKEN_FILE_MAX (1L << 30)
int kvmem_token_file_read(const char *path, int vocab, int32_t **ids, int64_t *n);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
