// SPDX-License-Identifier: MIT
/* The session script reader (include/kvmem/script.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/script.h"
#include "util/grow.h"
#include "util/json.h"

struct kvmem_script {
	char *file;
	FILE *f;
	char *line;
	size_t cap;
	int lineno, vocab, steps;
	uint64_t seed;
	int32_t *ids;		/* the last "append" line's ids */
};

static int bad(const kvmem_script *sc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const kvmem_script *sc, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return kvmem_error(EINVAL, "%s:%d: %s", sc->file, sc->lineno, msg);
}

/* What a JSON value is, for messages: "1e+12", "a string", ... */
static const char *json_what(const json_t *v, char *buf, size_t len)
{
	if (json_is_number(v))
		snprintf(buf, len, "%.17g", json_number_value(v));
	else
		snprintf(buf, len, "a%s %s", json_is_array(v) || json_is_object(v) ? "n" : "",
			 kvmem_json_type_name(v));
	return buf;
}

/* A non-negative integer's value, else -1. */
static int64_t count_of(const json_t *v)
{
	return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

/* One line's object into st; ids checked against the vocabulary. */
static int parse_step(kvmem_script *sc, json_t *j, kvmem_script_step *st)
{
	const json_t *ap = json_object_get(j, "append"), *ar = json_object_get(j, "append_random");
	const json_t *dc = json_object_get(j, "decode"), *pin = json_object_get(j, "pin");
	const json_t *sd = json_object_get(j, "seed");
	const char *k;
	json_t *v;
	char what[64];

	if (!json_is_object(j))
		return bad(sc, "each line must be a JSON object");
	json_object_foreach(j, k, v) {
		if (strcmp(k, "append") && strcmp(k, "append_random") && strcmp(k, "decode") &&
		    strcmp(k, "pin") && strcmp(k, "seed"))
			return bad(sc, "unknown key \"%s\" (append, append_random, decode, pin, seed)", k);
	}
	if (!!ap + !!ar + !!dc != 1)
		return bad(sc, "needs exactly one of \"append\", \"append_random\", \"decode\"");
	if (pin && !json_is_boolean(pin))
		return bad(sc, "\"pin\" must be true or false");
	if (pin && dc)
		return bad(sc, "\"pin\" goes with an append, not with \"decode\"");
	if (sd && !ar)
		return bad(sc, "\"seed\" goes with \"append_random\"");
	memset(st, 0, sizeof(*st));
	st->line = sc->lineno;
	st->pin = json_is_true(pin);
	if (dc) {
		st->kind = KVMEM_STEP_DECODE;
		st->n = count_of(dc);
		if (st->n < 0 || st->n > KVMEM_SCRIPT_MAX_DECODE)
			return bad(sc, "\"decode\" wants a token count from 0 to %d, not %s",
				   KVMEM_SCRIPT_MAX_DECODE, json_what(dc, what, sizeof(what)));
		return 0;
	}
	st->kind = KVMEM_STEP_APPEND;
	if (ar) {
		st->n = count_of(ar);
		if (st->n < 1 || st->n > KVMEM_SCRIPT_MAX_RANDOM)
			return bad(sc, "\"append_random\" wants a token count from 1 to %d, not %s",
				   KVMEM_SCRIPT_MAX_RANDOM, json_what(ar, what, sizeof(what)));
		if (sd && count_of(sd) < 0)
			return bad(sc, "\"seed\" wants an integer from 0 to %lld, not %s",
				   (long long)INT64_MAX, json_what(sd, what, sizeof(what)));
		st->rng = kvmem_rng_seed(sd ? (uint64_t)count_of(sd) :
					 sc->seed * 1000003u + (uint64_t)sc->lineno);
		return 0;
	}
	st->n = (int64_t)json_array_size(ap);
	if (st->n < 1)	/* not an array, or empty */
		return bad(sc, "\"append\" wants a non-empty array of token ids");
	free(sc->ids);
	if (!(sc->ids = malloc(sizeof(int32_t) * st->n)))
		return kvmem_error(ENOMEM, "%s:%d: out of memory for %lld token ids", sc->file,
				   sc->lineno, (long long)st->n);
	for (int64_t i = 0; i < st->n; i++) {
		int64_t id = count_of(json_array_get(ap, (size_t)i));

		if (id < 0 || id >= sc->vocab)
			return bad(sc, "token %lld of \"append\" is not an id in 0..%d", (long long)i,
				   sc->vocab - 1);
		sc->ids[i] = (int32_t)id;
	}
	st->ids = sc->ids;
	return 0;
}

int kvmem_script_open(const char *path, int vocab, uint64_t seed, kvmem_script **out)
{
	kvmem_script *sc = calloc(1, sizeof(*sc));
	struct stat st;
	int rc;

	*out = NULL;
	if (!sc || !(sc->file = strdup(path))) {
		free(sc);
		return kvmem_error(ENOMEM, "%s: out of memory", path);
	}
	sc->vocab = vocab;
	sc->seed = seed;
	if (!(sc->f = fopen(path, "r"))) {
		rc = kvmem_error(errno, "%s: %s", path, strerror(errno));
		kvmem_script_close(sc);
		return rc;
	}
	if (fstat(fileno(sc->f), &st) == 0 && S_ISDIR(st.st_mode)) {
		kvmem_script_close(sc);
		return kvmem_error(EISDIR, "%s: a directory, not a script (one JSON object per line)",
				   path);
	}
	*out = sc;
	return 0;
}

void kvmem_script_close(kvmem_script *sc)
{
	if (!sc)
		return;
	if (sc->f)
		fclose(sc->f);
	free(sc->line);
	free(sc->ids);
	free(sc->file);
	free(sc);
}

int kvmem_script_next(kvmem_script *sc, kvmem_script_step *st)
{
	ssize_t len;

	while ((len = getline(&sc->line, &sc->cap, sc->f)) >= 0) {
		char name[4200];
		json_t *j;
		size_t k;
		int rc;

		sc->lineno++;
		for (k = 0; k < (size_t)len && strchr(" \t\r\n", sc->line[k]) && sc->line[k]; k++)
			;
		if (k == (size_t)len)
			continue;
		snprintf(name, sizeof(name), "%s:%d", sc->file, sc->lineno);
		if ((rc = kvmem_json_load(sc->line, (size_t)len, name, &j)) < 0)
			return rc;	/* the message names file:line */
		rc = parse_step(sc, j, st);
		json_decref(j);
		if (rc)
			return rc;
		sc->steps++;
		return 1;
	}
	if (ferror(sc->f))
		return kvmem_error(EIO, "%s: read error after line %d: %s", sc->file, sc->lineno,
				   strerror(errno));
	if (!sc->steps)
		return kvmem_error(ENODATA, "%s:%d: the script holds no steps", sc->file, sc->lineno);
	return 0;
}

int kvmem_script_check(kvmem_script *sc)
{
	kvmem_script_step st;
	struct stat sb;
	int r;

	if (fstat(fileno(sc->f), &sb) || !S_ISREG(sb.st_mode))
		return 0;
	while ((r = kvmem_script_next(sc, &st)) > 0)
		;
	if (r < 0)
		return r;
	rewind(sc->f);
	sc->lineno = sc->steps = 0;
	return 0;
}

void kvmem_script_random_ids(kvmem_script_step *st, int vocab, int32_t *ids, int64_t k)
{
	for (int64_t i = 0; i < k; i++)
		ids[i] = (int32_t)(kvmem_rng_uniform(&st->rng) * vocab);
}

int kvmem_token_file_read(const char *path, int vocab, int32_t **ids, int64_t *n_out)
{
	int32_t *t = NULL;
	size_t cap = 0;
	int64_t n = 0;
	long long off = 0;
	struct stat st;
	int ch, fd, rc = 0;
	FILE *f;

	*ids = NULL;
	*n_out = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return kvmem_error(errno, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
		close(fd);
		return kvmem_error(EISDIR, "%s: a directory, not a file of token ids", path);
	}
	if (!(f = fdopen(fd, "r"))) {
		rc = kvmem_error(errno, "%s: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	for (ch = getc(f);; ch = getc(f), off++) {
		uint64_t id = 0;
		long long start = off;
		int len = 0, bad = 0;

		while (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f') {
			ch = getc(f);
			start = ++off;
		}
		if (ch == EOF)
			break;
		for (; ch != EOF && !strchr(" \t\n\r\v\f", ch) && ch != 0; ch = getc(f), off++) {
			bad |= ch < '0' || ch > '9';
			if (++len <= 12 && !bad)
				id = id * 10 + (uint64_t)(ch - '0');
		}
		if (ch == 0) {
			rc = kvmem_error(EINVAL, "%s: a NUL byte at offset %lld: not a text file of "
					 "token ids", path, off);
			goto out;
		}
		if (bad) {
			rc = kvmem_error(EINVAL, "%s: the token at index %lld (offset %lld) is not a "
					 "decimal id", path, (long long)n, start);
			goto out;
		}
		if (len > 12 || id >= (uint64_t)vocab) {
			rc = len > 12 ?
			     kvmem_error(EINVAL, "%s: the token at index %lld (offset %lld) is a number "
					 "of %d digits, outside the vocabulary 0..%d", path,
					 (long long)n, start, len, vocab - 1) :
			     kvmem_error(EINVAL, "%s: the token at index %lld (offset %lld) is %llu, "
					 "outside the vocabulary 0..%d", path, (long long)n, start,
					 (unsigned long long)id, vocab - 1);
			goto out;
		}
		if (n == KVMEM_TOKEN_FILE_MAX) {
			rc = kvmem_error(EINVAL, "%s: more than %ld token ids", path,
					 KVMEM_TOKEN_FILE_MAX);
			goto out;
		}
		if (kvmem_grow(&t, sizeof(*t), (size_t)n + 1, &cap, 1024)) {
			rc = kvmem_error(ENOMEM, "%s: out of memory after %lld tokens", path,
					 (long long)n);
			goto out;
		}
		t[n++] = (int32_t)id;
		if (ch == EOF)
			break;
	}
	if (ferror(f))
		rc = kvmem_error(EIO, "%s: read error: %s", path, strerror(errno));
	else if (n == 0)
		rc = kvmem_error(ENODATA, "%s: holds no token ids", path);
out:
	fclose(f);
	if (rc < 0) {
		free(t);
		return rc;
	}
	*ids = t;
	*n_out = n;
	return 0;
}
