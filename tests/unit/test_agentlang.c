// SPDX-License-Identifier: MIT
/*
 * agentlang: the vocabulary, the tokenizer's round trip, determinism, and
 * the promises the benchmark and the training rely on, checked by a parser
 * written here independently of the generator: every answer is the latest
 * value of its key in its file, needles sit where asked, look-alikes are as
 * many as asked, sequences are exactly as long as asked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "agentlang/agentlang.h"
#include "backend/backend_impl.h"
#include "helpers/test_model.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/session.h"

static uint64_t seed0;

static uint64_t rnd(void)
{
	return kvmem_rng_next(&seed0);
}

/* ---- an independent parser of fact and question lines ------------------- */
struct fact {
	int32_t file[3], key[2], val[AGENTLANG_MAX_VALUE];
	int nfile, nval, question;
	int64_t line;
};

static int has(int32_t id, unsigned role)
{
	return (agentlang_roles(id) & role) != 0;
}

/* Line [a, b) (b is its newline or the end): 1 and *f for a fact
 * "[$ set] file key = value" or a question "? file key = value <end>". */
static int parse_line(const int32_t *t, int64_t a, int64_t b, struct fact *f)
{
	int32_t eq = agentlang_lookup("=", 0), dollar = agentlang_lookup("$", 0);
	int32_t set = agentlang_lookup("set", 0);
	int64_t i = a;

	memset(f, 0, sizeof(*f));
	if (i < b && t[i] == AGENTLANG_BOS)
		i++;
	f->line = i;
	if (i < b && t[i] == AGENTLANG_Q) {
		f->question = 1;
		i++;
	} else if (i + 1 < b && t[i] == dollar) {
		if (t[i + 1] != set)
			return 0;
		i += 2;
	}
	if (i >= b || !has(t[i], AGENTLANG_R_STEM))
		return 0;
	f->file[f->nfile++] = t[i++];
	if (i < b && has(t[i], AGENTLANG_R_VARIANT))
		f->file[f->nfile++] = t[i++];
	if (i >= b || !has(t[i], AGENTLANG_R_EXT))
		return 0;
	f->file[f->nfile++] = t[i++];
	if (i + 2 >= b || !has(t[i], AGENTLANG_R_KEYPART) || !has(t[i + 1], AGENTLANG_R_KEYNAME))
		return 0;
	f->key[0] = t[i++];
	f->key[1] = t[i++];
	if (t[i++] != eq)
		return 0;
	while (i < b && has(t[i], AGENTLANG_R_VALUE) && f->nval < AGENTLANG_MAX_VALUE)
		f->val[f->nval++] = t[i++];
	if (f->question && (i >= b || t[i++] != AGENTLANG_END))
		return 0;
	return f->nval > 0 && i == b;
}

static int same_file(const struct fact *x, const struct fact *y)
{
	return x->nfile == y->nfile && !memcmp(x->file, y->file, sizeof(x->file[0]) * x->nfile);
}

static int same_key(const struct fact *x, const struct fact *y)
{
	return x->key[0] == y->key[0] && x->key[1] == y->key[1];
}

static int same_val(const struct fact *x, const struct fact *y)
{
	return x->nval == y->nval && !memcmp(x->val, y->val, sizeof(x->val[0]) * x->nval);
}

/* All fact and question lines of ids[0..n). */
static struct fact *parse_all(const int32_t *t, int64_t n, int *count)
{
	struct fact *fs = malloc(((size_t)n / 4 + 1) * sizeof(*fs));
	int c = 0;

	assert_non_null(fs);
	for (int64_t a = 0; a < n;) {
		int64_t b = a;

		while (b < n && t[b] != AGENTLANG_NL)
			b++;
		if (parse_line(t, a, b, &fs[c]))
			c++;
		a = b + 1;
	}
	*count = c;
	return fs;
}

/* The latest fact about q's file and key among fs[0..upto). */
static const struct fact *latest(const struct fact *fs, int upto, const struct fact *q)
{
	for (int i = upto - 1; i >= 0; i--)
		if (!fs[i].question && same_file(&fs[i], q) && same_key(&fs[i], q))
			return &fs[i];
	return NULL;
}

/* Every question line in t is answered by the latest fact before it. */
static int check_inline_questions(const int32_t *t, int64_t n)
{
	int c, asked = 0;
	struct fact *fs = parse_all(t, n, &c);

	for (int i = 0; i < c; i++) {
		if (!fs[i].question)
			continue;
		const struct fact *f = latest(fs, i, &fs[i]);
		if (!f || !same_val(f, &fs[i]))
			fail_msg("question at %lld: %s", (long long)fs[i].line,
				 f ? "answer is not the latest value" : "no such fact before it");
		asked++;
	}
	free(fs);
	return asked;
}

/* A question of the API as a parsed fact (its answer without <end>). */
static void question_fact(const agentlang_question *q, struct fact *f)
{
	int32_t line[AGENTLANG_MAX_QUESTION + AGENTLANG_MAX_ANSWER];

	memcpy(line, q->ids, sizeof(q->ids[0]) * q->n_ids);
	memcpy(line + q->n_ids, q->answer, sizeof(q->answer[0]) * q->n_answer);
	assert_int_equal(parse_line(line, 0, q->n_ids + q->n_answer, f), 1);
	assert_int_equal(q->answer[q->n_answer - 1], AGENTLANG_END);
}

static void build(agentlang_transcript *ws, uint64_t seed, int64_t n, int m, int look,
		  const double *depths)
{
	agentlang_params p;

	agentlang_params_default(&p);
	p.seed = seed;
	p.n_tokens = n;
	p.n_questions = m;
	p.lookalikes = look;
	p.depths = depths;
	if (agentlang_transcript_build(&p, ws))
		fail_msg("workspace seed %llu: %s", (unsigned long long)seed, kvmem_last_error());
}

/* ---- tests -------------------------------------------------------------- */
static void test_vocab(void **state)
{
	int size = agentlang_vocab_size();
	static const unsigned exclusive[] = { AGENTLANG_R_STEM, AGENTLANG_R_KEYPART,
					      AGENTLANG_R_KEYNAME, AGENTLANG_R_EXT,
					      AGENTLANG_R_VARIANT };

	assert_true(size % 64 == 0 && size >= 512 && size <= 1024);
	assert_int_equal(agentlang_vocab_hash(), agentlang_vocab_hash());
	assert_string_equal(agentlang_piece(AGENTLANG_PAD), "<pad>");
	assert_string_equal(agentlang_piece(AGENTLANG_Q), "?");
	assert_string_equal(agentlang_piece(AGENTLANG_A), "=");
	assert_int_equal(agentlang_lookup("=", 0), AGENTLANG_A);
	/* The shipped model (models/agentlang) was trained on this vocabulary. */
	assert_int_equal(agentlang_vocab_hash(), 0x14e34a1c);
	assert_string_equal(agentlang_piece(AGENTLANG_END), "<end>");
	assert_string_equal(agentlang_piece(AGENTLANG_NL), "\n");
	assert_null(agentlang_piece(size));
	assert_null(agentlang_piece(-1));
	for (int id = 0; id < size; id++) {
		unsigned r = agentlang_roles(id);

		assert_int_equal(agentlang_lookup(agentlang_piece(id), agentlang_is_glue(id)), id);
		assert_true(r != 0);
		/* Files, keys and values never share a token. */
		for (size_t j = 0; j < sizeof(exclusive) / sizeof(exclusive[0]); j++)
			if (r & exclusive[j])
				assert_int_equal(r, exclusive[j]);
	}
}

static void test_roundtrip_each_token(void **state)
{
	int size = agentlang_vocab_size();
	char buf[64];

	/* A glue piece alone would read as the start piece of the same text
	 * ("32"): put each behind "0x", which no other start piece begins. */
	int32_t ctx = agentlang_lookup("0x", 0), two[2];
	for (int i = 0; i < size; i++) {
		int32_t pair[2] = { ctx, i };
		int glue = agentlang_is_glue(i);

		assert_true(agentlang_decode(pair + !glue, 1 + glue, buf, sizeof(buf)) > 0);
		assert_int_equal(agentlang_encode(buf, two, 2), 1 + glue);
		assert_int_equal(two[glue], i);
	}
	assert_true(agentlang_encode("api.conf zzzz", two, 2) < 0);
	assert_non_null(strstr(kvmem_last_error(), "zzzz"));
	int32_t bad = size;
	assert_true(agentlang_decode(&bad, 1, buf, sizeof(buf)) < 0);
}

static void roundtrip(const int32_t *ids, int64_t n)
{
	long len = agentlang_decode(ids, (size_t)n, NULL, 0);
	char *text = malloc((size_t)len + 1), *again = malloc((size_t)len + 1);
	int32_t *back = malloc((size_t)n * sizeof(*back));

	assert_true(len > 0 && text && again && back);
	assert_int_equal(agentlang_decode(ids, (size_t)n, text, (size_t)len + 1), len);
	assert_int_equal(agentlang_encode(text, back, (size_t)n), n);
	assert_memory_equal(back, ids, (size_t)n * sizeof(*ids));
	assert_int_equal(agentlang_decode(back, (size_t)n, again, (size_t)len + 1), len);
	assert_string_equal(text, again);
	/* Too small a buffer: truncated, NUL-terminated, same length told. */
	char small[8];
	assert_int_equal(agentlang_decode(ids, (size_t)n, small, sizeof(small)), len);
	assert_int_equal(strlen(small), 7);
	free(text);
	free(again);
	free(back);
}

static void test_roundtrip_text(void **state)
{
	for (int r = 0; r < 6; r++) {
		agentlang_transcript ws;
		int32_t seq[2048];

		build(&ws, rnd(), 4096 + (int64_t)(rnd() % 4096), 3, (int)(rnd() % 9), NULL);
		roundtrip(ws.ids, ws.n_ids);
		for (int i = 0; i < ws.n_q; i++) {
			roundtrip(ws.q[i].ids, ws.q[i].n_ids);
			roundtrip(ws.q[i].answer, ws.q[i].n_answer);
		}
		agentlang_transcript_free(&ws);
		assert_int_equal(agentlang_train_seq(rnd(), rnd() % 1000, 2048, 0.0, seq, NULL), 0);
		roundtrip(seq, 2048);
	}
	/* Text written by hand. */
	int32_t ids[32];
	char out[256];
	const char *text = "$ set api2.conf db.port = 5432\nok\n? api2.conf db.port = 5432 <end>\n";
	int n = agentlang_encode(text, ids, 32);
	assert_int_equal(n, 24);
	assert_int_equal(ids[0], agentlang_lookup("$", 0));
	assert_int_equal(ids[3], agentlang_lookup("2", 1));
	assert_int_equal(ids[7], agentlang_lookup("=", 0));
	assert_int_equal(ids[8], agentlang_lookup("54", 0));
	assert_int_equal(ids[9], agentlang_lookup("32", 1));
	agentlang_decode(ids, (size_t)n, out, sizeof(out));
	assert_string_equal(out, text);
	assert_true(agentlang_encode(text, ids, 5) < 0);
}

static void test_determinism(void **state)
{
	uint64_t s = rnd();
	agentlang_transcript a, b, c;

	build(&a, s, 6000, 4, 3, NULL);
	build(&b, s, 6000, 4, 3, NULL);
	build(&c, s + 1, 6000, 4, 3, NULL);
	assert_int_equal(a.n_ids, 6000);
	assert_int_equal(b.n_ids, 6000);
	assert_memory_equal(a.ids, b.ids, 6000 * sizeof(int32_t));
	assert_memory_equal(a.q, b.q, 4 * sizeof(a.q[0]));
	assert_true(memcmp(a.ids, c.ids, 6000 * sizeof(int32_t)) != 0);
	agentlang_transcript_free(&a);
	agentlang_transcript_free(&b);
	agentlang_transcript_free(&c);

	int32_t x[1024], y[1024], z[1024];
	uint64_t i = rnd() % 100000;
	assert_int_equal(agentlang_train_seq(s, i, 1024, 0.5, x, NULL), 0);
	assert_int_equal(agentlang_train_seq(s, i, 1024, 0.5, y, NULL), 0);
	assert_int_equal(agentlang_train_seq(s, i + 1, 1024, 0.5, z, NULL), 0);
	assert_memory_equal(x, y, sizeof(x));
	assert_true(memcmp(x, z, sizeof(x)) != 0);
}

static void test_answers_are_latest(void **state)
{
	for (int r = 0; r < 4; r++) {
		agentlang_transcript ws;
		int c;

		build(&ws, rnd(), 20000, 12, (int)(rnd() % 9), NULL);
		struct fact *fs = parse_all(ws.ids, ws.n_ids, &c);
		check_inline_questions(ws.ids, ws.n_ids);
		for (int i = 0; i < ws.n_q; i++) {
			const agentlang_question *q = &ws.q[i];
			struct fact qf, nf;

			question_fact(q, &qf);
			const struct fact *f = latest(fs, c, &qf);
			assert_non_null(f);
			assert_true(same_val(f, &qf));
			/* ... and that latest fact is the needle, where it says. */
			assert_int_equal(f->line, q->needle_pos);
			int64_t e = q->needle_pos;
			while (ws.ids[e] != AGENTLANG_NL)
				e++;
			assert_int_equal(e + 1, q->needle_end);
			assert_int_equal(parse_line(ws.ids, q->needle_pos, e, &nf), 1);
			assert_memory_equal(&ws.ids[q->value_pos], q->answer,
					    (size_t)(q->n_answer - 1) * sizeof(int32_t));
			if (q->stale_pos >= 0) {
				struct fact sf;
				int64_t se = q->stale_pos;
				while (ws.ids[se] != AGENTLANG_NL)
					se++;
				assert_int_equal(parse_line(ws.ids, q->stale_pos, se, &sf), 1);
				assert_true(q->stale_pos < q->needle_pos);
				assert_true(same_file(&sf, &qf) && same_key(&sf, &qf));
				assert_false(same_val(&sf, &qf));
			}
		}
		free(fs);
		agentlang_transcript_free(&ws);
	}
}

static void test_lookalikes(void **state)
{
	static const int looks[] = { 0, 3, 8, 16 };

	for (size_t r = 0; r < sizeof(looks) / sizeof(looks[0]); r++) {
		agentlang_transcript ws;
		int c, a = 0, b = 0, v = 0;

		build(&ws, rnd(), 30000, 6, looks[r], NULL);
		struct fact *fs = parse_all(ws.ids, ws.n_ids, &c);
		for (int i = 0; i < ws.n_q; i++) {
			struct fact qf;
			int n = 0;

			question_fact(&ws.q[i], &qf);
			assert_int_equal(ws.q[i].lookalikes, looks[r]);
			for (int j = 0; j < c; j++) {
				const struct fact *f = &fs[j];
				int sf = same_file(f, &qf), sk = same_key(f, &qf);

				if (f->question || (sf && sk))
					continue;
				if (sk) {
					a++;
					n++;
				} else if (sf && (f->key[0] == qf.key[0] || f->key[1] == qf.key[1])) {
					b++;
					n++;
				} else if (same_val(f, &qf)) {
					v++;
					n++;
				}
			}
			if (n < looks[r])
				fail_msg("needle %d: %d look-alike lines, asked %d", i, n, looks[r]);
		}
		/* All three kinds appear once there are enough of them. */
		if (looks[r] >= 8)
			assert_true(a > 0 && b > 0 && v > 0);
		free(fs);
		agentlang_transcript_free(&ws);
	}
}

static void test_depth(void **state)
{
	double depths[10];
	agentlang_transcript ws;
	int64_t n = 65536;

	for (int i = 0; i < 10; i++)
		depths[i] = (double)(rnd() % 1000) / 1000.0;
	depths[0] = 0.0;
	depths[1] = 0.999;
	build(&ws, rnd(), n, 10, 4, depths);
	for (int i = 0; i < 10; i++) {
		const agentlang_question *q = &ws.q[i];
		int64_t want = (int64_t)(depths[i] * (double)n + 0.5);

		assert_true(q->depth_asked == depths[i]);
		if (depths[i] > 0.99) {
			/* The end flushes what is left: still in the last 2%. */
			assert_true(q->needle_pos > n - n / 50);
			continue;
		}
		if (q->needle_pos < want || q->needle_pos > want + 400)
			fail_msg("needle %d at %lld, asked %lld", i, (long long)q->needle_pos,
				 (long long)want);
		assert_true(q->depth >= depths[i] - 0.01 && q->depth <= depths[i] + 0.01);
	}
	agentlang_transcript_free(&ws);

	/* NULL depths spread the needles evenly. */
	build(&ws, rnd(), 16384, 4, 2, NULL);
	for (int i = 0; i < 4; i++)
		assert_true(ws.q[i].depth > (i + 0.5) / 4 - 0.02 && ws.q[i].depth < (i + 0.5) / 4 + 0.02);
	agentlang_transcript_free(&ws);
}

/* Views: the needle's whole line "file key = answer" is in the sequence
 * before its question, and it is the latest "file key =" there (an earlier
 * question's "? file key = answer <end>" counts too). A view may
 * glue the head of one line to the tail of another at a block cut and so
 * make a later, false "file key =" (kvmem's views do the same); that is
 * rare (about 1 question in 10^4), so allow a few. Returns the count of
 * such questions. */
static int check_view_answers(const int32_t *t, int n, int *asked)
{
	int32_t eq = agentlang_lookup("=", 0);
	int glued = 0;

	for (int p = 0; p < n; p++) {
		if (t[p] != AGENTLANG_Q)
			continue;
		int ka = p + 1, kb = ka, latest = 1, found = 0;
		while (t[kb] != AGENTLANG_A)
			kb++;
		for (int s = p - (kb - ka) - 1; s >= 0 && !found; s--) {
			if (memcmp(&t[s], &t[ka], (size_t)(kb - ka) * sizeof(*t)) || t[s + kb - ka] != eq)
				continue;
			int v = s + kb - ka + 1, a = kb + 1;
			while (t[a] != AGENTLANG_END && t[v] == t[a])
				v++, a++;
			/* A fact line ends in a newline, an earlier answer in <end>. */
			if (t[a] == AGENTLANG_END && (t[v] == AGENTLANG_NL || t[v] == AGENTLANG_END))
				found = 1;
			else
				latest = 0;
		}
		if (!found)
			fail_msg("question at %d: its fact is not in the sequence", p);
		glued += !latest;
		(*asked)++;
	}
	return glued;
}

/* A 256-token stream sequence at a low question rate can draw none: this one
 * did (a clean clone's make test, seed 5067996580). The generator draws it
 * again until it asks one per 150 tokens; the first draw of each index is
 * kept where it asks enough. */
static void test_train_short_stream_asks(void **state)
{
	int32_t buf[256];
	agentlang_seq_info info;

	(void)state;
	assert_int_equal(agentlang_train_seq(7634195196451101812ull, 350719, 256, 0.5, buf, &info),
			 0);
	assert_int_equal(info.kind, AGENTLANG_SEQ_STREAM);
	assert_true(info.n_questions >= 1);
	assert_int_equal(check_inline_questions(buf, info.n_tokens), info.n_questions);
}

static void test_train_sequences(void **state)
{
	static const int lens[] = { 256, 512, 777, 2048 };
	int kinds[2] = { 0, 0 }, size = agentlang_vocab_size(), asked = 0, glued = 0;

	for (int r = 0; r < 64; r++) {
		int L = lens[r % 4];
		int32_t *buf = malloc((size_t)(L + 16) * sizeof(*buf));
		agentlang_seq_info info;
		uint64_t s = rnd();

		assert_non_null(buf);
		for (int i = 0; i < L + 16; i++)
			buf[i] = -7;
		assert_int_equal(agentlang_train_seq(s, rnd() % 1000000, L, 0.5, buf, &info), 0);
		for (int i = L; i < L + 16; i++)
			assert_int_equal(buf[i], -7);	/* nothing past L */
		assert_int_equal(buf[0], AGENTLANG_BOS);
		assert_true(info.n_tokens <= L && info.n_tokens > L / 2);
		for (int i = 0; i < L; i++)
			assert_true(buf[i] >= 0 && buf[i] < size);
		for (int i = info.n_tokens; i < L; i++)
			assert_int_equal(buf[i], AGENTLANG_PAD);
		assert_true(info.n_questions >= 1);
		kinds[info.kind]++;
		if (info.kind == AGENTLANG_SEQ_STREAM) {
			assert_int_equal(check_inline_questions(buf, info.n_tokens), info.n_questions);
			/* Dense questions: the loss on answers is strong. */
			assert_true(info.n_questions >= L / 150);
		}
		glued += check_view_answers(buf, info.n_tokens, &asked);
		free(buf);
	}
	assert_true(kinds[0] > 0 && kinds[1] > 0);
	if (glued * 50 > asked)
		fail_msg("%d of %d questions have a later false fact glued at a cut", glued, asked);
	assert_true(agentlang_train_seq(1, 0, 200, 0.5, NULL, NULL) < 0);
}

/*
 * A held-out corpus at the bench's count (view.lookalikes): every needle of
 * every view sequence, by the generator's mix and by a policy, gets that
 * many look-alike lines; drawn (0), the counts vary; streams have none to
 * count (-1). The corpus header records it; 17 is refused by name.
 */
static void test_fixed_lookalikes(void **state)
{
	const int L = 1024;
	int32_t *buf = malloc((size_t)L * sizeof(*buf));
	int drawn_min = 99, drawn_max = -1, fixed = 0;
	char path[] = "/tmp/kvmem-corpus-XXXXXX";
	int fd = mkstemp(path);
	agentlang_corpus_header h;

	assert_non_null(buf);
	assert_true(fd >= 0);
	close(fd);
	for (int r = 0; r < 48; r++) {
		agentlang_view_opts vo = { .policy = r % 2 ? "lexical" : NULL, .max_ratio = 16 };
		agentlang_seq_info info;
		const uint64_t s = rnd(), idx = rnd() % 1000000;

		vo.lookalikes = 8;
		assert_int_equal(agentlang_train_seq_opts(s, idx, L, 1.0, &vo, buf, &info), 0);
		assert_int_equal(info.kind, AGENTLANG_SEQ_VIEW);
		assert_int_equal(info.lookalikes, 8);
		fixed++;
		vo.lookalikes = 0;
		assert_int_equal(agentlang_train_seq_opts(s, idx, L, 1.0, &vo, buf, &info), 0);
		drawn_min = info.lookalikes < drawn_min ? info.lookalikes : drawn_min;
		drawn_max = info.lookalikes > drawn_max ? info.lookalikes : drawn_max;
		assert_int_equal(agentlang_train_seq_opts(s, idx, L, 0.0, &vo, buf, &info), 0);
		assert_int_equal(info.kind, AGENTLANG_SEQ_STREAM);
		assert_int_equal(info.lookalikes, -1);
	}
	assert_int_equal(fixed, 48);
	assert_true(drawn_min >= 0 && drawn_max <= 8 && drawn_min < drawn_max);
	{
		agentlang_corpus_opts o = { .seed = 1000000001, .n_tokens = 4096, .seq_len = 512,
					   .view_share = 1.0, .threads = 1 };

		o.view.lookalikes = 8;
		assert_int_equal(agentlang_corpus_write(path, &o), 0);
		assert_int_equal(agentlang_corpus_read_header(path, &h), 0);
		assert_int_equal(h.lookalikes, 8);
		o.view.lookalikes = 17;
		assert_true(agentlang_corpus_write(path, &o) < 0);
		assert_non_null(strstr(kvmem_last_error(), "17 look-alike"));
	}
	unlink(path);
	free(buf);
}

/*
 * Views chosen at corpus time are the views inference builds: for one
 * question, the tokens agentlang_view_select keeps are exactly the blocks
 * of the plan a real session makes with kvmem_session_select_ahead over
 * the same workspace, budget and policy (a random model: lexical reads
 * token ids only, so the model's weights cannot matter).
 */
static void test_view_policy_plan(void **state)
{
	kvmem_config c = test_model_config(1, 32, 2, 1, 16, 32, agentlang_vocab_size(), 1);
	kvmem_model *m = test_model_random(&c, rnd());
	kvmem_backend *e = kvmem_backend_cpu(m, 64);
	int partial = 0;

	assert_non_null(e);
	for (int round = 0; round < 3; round++) {
		static const int64_t budgets[] = { 416, 800, 1760 };
		int64_t budget = budgets[round], N = 2048 + (int64_t)(rnd() % 3000);
		agentlang_params p;
		agentlang_transcript ws;
		kvmem_session_opts o;

		agentlang_params_default(&p);
		p.seed = rnd();
		p.n_tokens = N;
		p.n_questions = 3;
		p.lookalikes = 8;
		p.stale = 0.6;
		assert_int_equal(agentlang_transcript_build(&p, &ws), 0);
		uint8_t *keep = malloc((size_t)ws.n_ids);
		assert_non_null(keep);
		for (int i = 0; i < ws.n_q; i++) {
			const agentlang_question *q = &ws.q[i];
			int64_t kept = agentlang_view_select(&ws, &i, 1, budget, "lexical", keep);

			assert_true(kept > 0 && kept <= budget);
			kvmem_session_opts_default(&o);
			o.budget = budget;
			o.block = 32;
			o.chunk = 64;
			o.query_tokens = 1;
			o.policy = "lexical";
			kvmem_session *s = kvmem_session_create(e, &o);
			assert_non_null(s);
			assert_int_equal(kvmem_session_append(s, ws.ids, ws.n_ids, 0), 0);
			assert_int_equal(kvmem_session_select_ahead(s, q->ids, q->n_ids), 0);
			const kvmem_plan *pl = kvmem_session_plan(s);
			int64_t nb = (ws.n_ids + 31) / 32, in_plan = 0;
			uint8_t *want = calloc((size_t)nb, 1);
			assert_non_null(want);
			for (int j = 0; j < pl->n_view; j++)
				want[pl->blocks[j]] = 1;
			for (int64_t b = 0; b < nb; b++) {
				int64_t e0 = (b + 1) * 32 < ws.n_ids ? (b + 1) * 32 : ws.n_ids;

				for (int64_t t = b * 32; t < e0; t++)
					if (keep[t] != want[b])
						fail_msg("round %d question %d: token %lld (block %lld) %s the "
							 "corpus view, %s the session's plan", round, i,
							 (long long)t, (long long)b, keep[t] ? "in" : "not in",
							 want[b] ? "in" : "not in");
				in_plan += want[b] ? e0 - b * 32 : 0;
			}
			assert_int_equal(in_plan, kept);
			partial += kept < ws.n_ids;
			free(want);
			kvmem_session_free(s);
		}
		free(keep);
		agentlang_transcript_free(&ws);
	}
	assert_true(partial > 0);	/* views that leave something out were compared */
	kvmem_backend_close(e);
	test_model_free(m);
}

/* With drops a question's file and key may be cut off; its value, and the
 * newline that ends its line, must still be in view before the questions.
 * Returns the questions checked. */
static int check_values_in_view(const int32_t *t, int n)
{
	int asked = 0, first_q = n;

	for (int p = 0; p < n; p++)
		if (t[p] == AGENTLANG_Q && p < first_q)
			first_q = p;
	for (int p = first_q; p < n; p++) {
		if (t[p] != AGENTLANG_Q)
			continue;
		int a = p + 1, e, found = 0;
		while (t[a] != AGENTLANG_A)
			a++;
		for (e = a + 1; t[e] != AGENTLANG_END; e++)
			;
		for (int s = 0; s + (e - a - 1) < first_q && !found; s++)
			found = !memcmp(&t[s], &t[a + 1], (size_t)(e - a - 1) * sizeof(*t)) &&
				t[s + e - a - 1] == AGENTLANG_NL;
		if (!found)
			fail_msg("question at %d: its value is not in the view", p);
		asked++;
	}
	return asked;
}

/* Policy views (lexical, workspaces up to 64x): every question asked is
 * answered by the latest value in view, the default options give the
 * generator's own mix bit for bit, and policies that need a model are
 * refused. */
static void test_view_policy_sequences(void **state)
{
	const int L = 2048;
	int32_t *a = malloc(sizeof(*a) * L), *b = malloc(sizeof(*b) * L);
	agentlang_view_opts lex = { .policy = "lexical", .max_ratio = 64, .stale = 0.6 };
	agentlang_view_opts zero = { 0 };
	int asked = 0, glued = 0, views = 0, differ = 0, q = 0;

	assert_true(a && b);
	for (int r = 0; r < 24; r++) {
		uint64_t s = rnd() % 1000000, i = rnd() % 100000;
		agentlang_seq_info info;

		assert_int_equal(agentlang_train_seq(s, i, L, 0.5, a, NULL), 0);
		assert_int_equal(agentlang_train_seq_opts(s, i, L, 0.5, &zero, b, NULL), 0);
		assert_memory_equal(a, b, sizeof(*a) * L);
		assert_int_equal(agentlang_train_seq_opts(s, i, L, 1.0, &lex, b, &info), 0);
		assert_int_equal(info.kind, AGENTLANG_SEQ_VIEW);
		assert_true(info.n_tokens <= L);
		for (int t = info.n_tokens; t < L; t++)
			assert_int_equal(b[t], AGENTLANG_PAD);
		glued += check_view_answers(b, info.n_tokens, &asked);
		q += info.n_questions;
		views++;
		assert_int_equal(agentlang_train_seq(s, i, L, 1.0, a, NULL), 0);
		differ += memcmp(a, b, sizeof(*a) * L) != 0;
	}
	assert_int_equal(asked, q);
	assert_true(q >= views);	/* about 4 a view; the needle nearly always in view */
	/* Drops on every cut line: the values stay in view. */
	agentlang_view_opts drop = lex;
	int dropped_q = 0;
	drop.drop = 1.0;
	drop.max_ratio = 16;	/* smaller workspaces: needles share blocks more often */
	for (int r = 0; r < 400; r++) {
		agentlang_seq_info info;

		assert_int_equal(agentlang_train_seq_opts(rnd() % 1000000, rnd() % 100000, L, 1.0, &drop,
							 b, &info), 0);
		dropped_q += check_values_in_view(b, info.n_tokens);
	}
	assert_true(dropped_q > 0);
	assert_true(differ > views / 2);
	if (glued * 50 > asked)
		fail_msg("%d of %d questions have a later false fact glued at a cut", glued, asked);
	assert_int_equal(agentlang_view_policy_check("lexical"), 0);
	assert_true(agentlang_view_policy_check("meank") < 0);
	assert_non_null(strstr(kvmem_last_error(), "meank"));
	assert_true(agentlang_view_policy_check("no-such-policy") < 0);
	lex.policy = "refine";
	assert_true(agentlang_train_seq_opts(1, 0, L, 1.0, &lex, a, NULL) < 0);
	free(a);
	free(b);
}

static void test_corpus_file(void **state)
{
	char p1[] = "/tmp/kvmem-corpus-XXXXXX", p2[] = "/tmp/kvmem-corpus-XXXXXX";
	int fd1 = mkstemp(p1), fd2 = mkstemp(p2);
	agentlang_corpus_opts o = { .seed = rnd() % 1000000, .n_tokens = 9000, .seq_len = 512,
				   .view_share = 0.5, .threads = 1 };
	agentlang_corpus_header h;

	assert_true(fd1 >= 0 && fd2 >= 0);
	close(fd1);
	close(fd2);
	assert_int_equal(agentlang_corpus_write(p1, &o), 0);
	o.threads = 2;
	assert_int_equal(agentlang_corpus_write(p2, &o), 0);
	assert_int_equal(agentlang_corpus_read_header(p1, &h), 0);
	assert_int_equal(h.n_seqs, 18);
	assert_int_equal(h.seq_len, 512);
	assert_int_equal(h.id_bytes, 2);
	assert_int_equal(h.vocab, agentlang_vocab_size());
	assert_int_equal(h.vocab_hash, agentlang_vocab_hash());
	assert_int_equal(h.seed, o.seed);
	assert_int_equal(h.view_permille, 500);
	assert_int_equal(h.version, 4);
	assert_int_equal(h.lookalikes, 0);	/* drawn a sequence */
	assert_int_equal(h.n_paged, 0);
	assert_int_equal(h.paged_index, 0);
	assert_string_equal(h.view_policy, "");
	assert_int_equal(h.max_ratio, 16);
	assert_true(h.pad == AGENTLANG_PAD && h.bos == AGENTLANG_BOS && h.q == AGENTLANG_Q &&
		    h.a == AGENTLANG_A && h.end == AGENTLANG_END && h.eos == AGENTLANG_EOS);

	size_t bytes = AGENTLANG_CORPUS_HEADER + 18 * 512 * 2;
	uint8_t *a = malloc(bytes + 1), *b = malloc(bytes + 1);
	FILE *f1 = fopen(p1, "rb"), *f2 = fopen(p2, "rb");
	assert_true(a && b && f1 && f2);
	assert_int_equal(fread(a, 1, bytes + 1, f1), bytes);
	assert_int_equal(fread(b, 1, bytes + 1, f2), bytes);
	fclose(f1);
	fclose(f2);
	assert_memory_equal(a, b, bytes);	/* thread count does not matter */
	/* A version-3 header (128 bytes) still reads; version 4 needs its 160. */
	uint8_t v3[AGENTLANG_CORPUS_HEADER_V3];
	memcpy(v3, a, sizeof(v3));
	v3[8] = 3;
	v3[12] = AGENTLANG_CORPUS_HEADER_V3;
	f1 = fopen(p2, "wb");
	assert_non_null(f1);
	assert_int_equal(fwrite(v3, 1, sizeof(v3), f1), sizeof(v3));
	fclose(f1);
	assert_int_equal(agentlang_corpus_read_header(p2, &h), 0);
	assert_true(h.version == 3 && h.n_seqs == 18 && h.n_whole == 0 && h.whole_permille == 0);
	v3[8] = 4;
	f1 = fopen(p2, "wb");
	assert_non_null(f1);
	assert_int_equal(fwrite(v3, 1, sizeof(v3), f1), sizeof(v3));
	fclose(f1);
	assert_true(agentlang_corpus_read_header(p2, &h) < 0);
	int32_t seq[512];
	for (int s = 0; s < 18; s += 5) {
		assert_int_equal(agentlang_train_seq(o.seed, (uint64_t)s, 512, 0.5, seq, NULL), 0);
		for (int i = 0; i < 512; i++) {
			const uint8_t *p = a + AGENTLANG_CORPUS_HEADER + ((size_t)s * 512 + i) * 2;
			assert_int_equal(p[0] | p[1] << 8, seq[i]);
		}
	}
	free(a);
	free(b);
	unlink(p1);
	unlink(p2);
	/* The view policy and its knobs travel in the header. */
	o.view = (agentlang_view_opts){ .policy = "lexical", .max_ratio = 64, .stale = 0.6,
					.drop = 0.1 };
	assert_int_equal(agentlang_corpus_write(p1, &o), 0);
	assert_int_equal(agentlang_corpus_read_header(p1, &h), 0);
	assert_string_equal(h.view_policy, "lexical");
	assert_int_equal(h.max_ratio, 64);
	assert_int_equal(h.stale_permille, 600);
	assert_int_equal(h.drop_permille, 100);
	o.view.policy = "meank";
	unlink(p1);
	assert_true(agentlang_corpus_write(p1, &o) < 0);
	assert_int_equal(access(p1, F_OK), -1);	/* refused before the file is made */
	o.view = (agentlang_view_opts){ 0 };
	o.seq_len = 100;
	assert_true(agentlang_corpus_write(p1, &o) < 0);
	assert_int_equal(access(p1, F_OK), -1);
	assert_true(agentlang_corpus_read_header("/nonexistent/corpus", &h) < 0);
	assert_non_null(strstr(kvmem_last_error(), "/nonexistent/corpus"));
}

/*
 * Paged view sequences: the same ids as without paging; the kept tokens are
 * the plan's (lexical, no drops) and the windows' tokens at (win, off);
 * every window ends on a kept token and holds at least half a window of
 * workspace before each kept token it serves.
 */
static void check_pages(const int32_t *seq, const agentlang_pages *pg, int L)
{
	const agentlang_transcript *ws = pg->ws;
	const int W = pg->window;
	int asked[64];

	assert_non_null(ws);
	assert_int_equal(pg->ws_tokens, ws->n_ids);
	assert_true(pg->n_view > 0 && pg->n_view < L);
	assert_int_equal(seq[pg->n_view], AGENTLANG_Q);	/* a question follows the view */
	/* The i-th question after the view asks about the fact line whose '='
	 * is at needle[i]: the same file and key before it. */
	int at = pg->n_view;
	assert_true(pg->n_q > 0 && pg->n_q <= 64);
	for (int i = 0; i < pg->n_q; i++) {
		int eq = at;

		assert_true(at < L && seq[at] == AGENTLANG_Q);
		while (seq[eq] != AGENTLANG_A)
			eq++;
		assert_true(pg->needle[i] >= eq - at && pg->needle[i] < ws->n_ids);
		assert_int_equal(ws->ids[pg->needle[i]], AGENTLANG_A);
		for (int j = 1; j < eq - at; j++)
			assert_int_equal(ws->ids[pg->needle[i] - (eq - at) + j], seq[at + j]);
		while (seq[at] != AGENTLANG_NL)
			at++;
		at++;
	}
	assert_true(at >= L || seq[at] != AGENTLANG_Q);	/* no question left unlabelled */
	for (int i = 0; i < pg->n_view; i++) {
		int w = pg->win[i];

		assert_true(w < pg->n_windows);
		assert_true(i == 0 || (pg->pos[i] > pg->pos[i - 1] && w >= pg->win[i - 1]));
		assert_int_equal(pg->win_start[w] + pg->off[i], pg->pos[i]);
		assert_true(pg->pos[i] < pg->win_end[w]);
		assert_int_equal(seq[i], pg->ids[(size_t)w * W + pg->off[i]]);
		assert_int_equal(seq[i], ws->ids[pg->pos[i]]);
		if (pg->win_start[w] > 0 && pg->off[i] < W / 2)
			fail_msg("kept token %d (workspace %lld) has %d tokens of context in window %d",
				 i, (long long)pg->pos[i], pg->off[i], w);
	}
	for (int w = 0; w < pg->n_windows; w++) {
		int64_t a = pg->win_start[w], e = pg->win_end[w], last = -1;
		int64_t owned = w ? pg->win_end[w - 1] : 0;

		assert_true(a >= 0 && e > a && e - a <= W && e <= ws->n_ids);
		assert_true(w == 0 || e > pg->win_end[w - 1]);
		for (int i = 0; i < pg->n_view; i++)
			if (pg->win[i] == w)
				last = pg->pos[i];
		if (pg->whole) {
			/* The windows tile the workspace: each owns [owned, e), with at
			 * least half a window of context for each token it owns, and a
			 * kept token sits in its owner. */
			assert_true(a <= owned && (a == 0 || owned - a >= W / 2));
			assert_true(w + 1 < pg->n_windows || e == ws->n_ids);
			assert_true(w > 0 || (a == 0 && e == (ws->n_ids < W ? ws->n_ids : W)));
			assert_true(w == 0 || e - owned == W / 2 || e == ws->n_ids);
			for (int i = 0; i < pg->n_view; i++)
				if (pg->pos[i] >= owned && pg->pos[i] < e)
					assert_int_equal(pg->win[i], w);
		} else if (last != e - 1) {
			fail_msg("window %d ends at %lld, its last kept token is at %lld", w, (long long)e,
				 (long long)last);
		}
		assert_memory_equal(pg->ids + (size_t)w * W, ws->ids + a, (size_t)(e - a) * sizeof(int32_t));
		for (int64_t i = e - a; i < W; i++)
			assert_int_equal(pg->ids[(size_t)w * W + i], AGENTLANG_PAD);
	}
	/* The kept tokens are the lexical plan for all the workspace's questions. */
	int64_t budget = (L - 32 - L / 8) / 32 * 32, k = 0;
	uint8_t *keep = malloc((size_t)ws->n_ids);

	assert_non_null(keep);
	for (int i = 0; i < ws->n_q; i++)
		asked[i] = i;
	assert_int_equal(agentlang_view_select(ws, asked, ws->n_q, budget, "lexical", keep),
			 pg->n_view);
	for (int64_t t = 0; t < ws->n_ids; t++) {
		if (!keep[t])
			continue;
		assert_true(k < pg->n_view);
		assert_int_equal(pg->pos[k++], t);
	}
	assert_int_equal(k, pg->n_view);
	free(keep);
}

static void test_paged_sequences(void **state)
{
	const int L = 1024;
	int32_t *a = malloc(sizeof(*a) * L), *b = malloc(sizeof(*b) * L);
	agentlang_view_opts plain = { .policy = "lexical", .max_ratio = 16, .stale = 0.6 };
	agentlang_view_opts paged = plain;
	agentlang_pages pg = { .want_workspace = 1 };
	int n_paged = 0, n_views = 0, multi = 0;

	assert_true(a && b);
	paged.paged = 1.0;
	for (int r = 0; r < 40; r++) {
		uint64_t s = rnd() % 1000000, i = rnd() % 100000;
		agentlang_seq_info info;

		paged.window = r % 2 ? 256 : 0;	/* 0: the sequence's length */
		assert_int_equal(agentlang_train_seq_opts(s, i, L, 0.8, &plain, a, NULL), 0);
		assert_int_equal(agentlang_train_seq_paged(s, i, L, 0.8, &paged, b, &info, &pg), 0);
		assert_memory_equal(a, b, sizeof(*a) * L);	/* paging leaves the ids alone */
		n_views += info.kind == AGENTLANG_SEQ_VIEW;
		if (pg.n_view) {
			assert_int_equal(info.kind, AGENTLANG_SEQ_VIEW);
			assert_int_equal(pg.window, paged.window ? paged.window : L);
			check_pages(b, &pg, L);
			n_paged++;
			multi += pg.n_windows > 1;
		}
		agentlang_pages_free(&pg);
	}
	/* Every view of a workspace longer than the window is paged (4 of 5). */
	assert_true(n_paged > 0 && n_paged <= n_views);
	assert_true(multi > 0);
	/* The paged share draws apart from the sequence's stream. */
	paged.paged = 0.5;
	int some = 0;
	for (uint64_t i = 0; i < 60; i++) {
		agentlang_seq_info info;

		assert_int_equal(agentlang_train_seq_paged(7, i, L, 1.0, &paged, b, &info, &pg), 0);
		some += pg.n_view > 0;
		agentlang_pages_free(&pg);
	}
	assert_true(some > 5 && some < 55);
	paged.window = 100 + 1;
	assert_true(agentlang_train_seq_paged(7, 0, L, 1.0, &paged, b, NULL, &pg) < 0);
	agentlang_pages_free(&pg);
	free(a);
	free(b);
}

/*
 * Whole paged sequences: the same ids and the same kept tokens as paged
 * ones; their windows tile the workspace (check_pages); only workspaces of
 * at least whole_min_ratio windows are whole; a window not divisible by 64
 * is refused.
 */
static void test_whole_pages(void **state)
{
	const int L = 512;
	int32_t *a = malloc(sizeof(*a) * L), *b = malloc(sizeof(*b) * L);
	agentlang_view_opts paged = { .policy = "lexical", .max_ratio = 64, .stale = 0.6,
				      .paged = 1.0, .window = 256 };
	agentlang_view_opts whole = paged;
	agentlang_pages p1 = { .want_workspace = 1 }, p2 = { .want_workspace = 1 };
	int n_whole = 0, n_part = 0;

	assert_true(a && b);
	whole.whole = 1.0;
	/* Until both kinds were seen (six whole): under seed 26465236202 the
	 * first six were all whole, and the loop stopped at the sixth. */
	for (int r = 0; r < 600 && (n_whole < 6 || n_part < 1); r++) {
		uint64_t s = rnd() % 1000000, i = rnd() % 100000;

		whole.whole_min_ratio = r % 3 ? 16 : 32;
		assert_int_equal(agentlang_train_seq_paged(s, i, L, 1.0, &paged, a, NULL, &p1), 0);
		assert_int_equal(agentlang_train_seq_paged(s, i, L, 1.0, &whole, b, NULL, &p2), 0);
		assert_memory_equal(a, b, sizeof(*a) * L);
		assert_int_equal(p1.n_view, p2.n_view);
		assert_int_equal(p1.n_q, p2.n_q);
		if (p2.n_view) {
			assert_memory_equal(p1.pos, p2.pos, sizeof(*p1.pos) * (size_t)p1.n_view);
			assert_memory_equal(p1.needle, p2.needle, sizeof(*p1.needle) * (size_t)p1.n_q);
			/* a workspace of ratio r windows is about r * L tokens */
			assert_int_equal(p2.whole,
					 p2.ws_tokens >= (int64_t)L * whole.whole_min_ratio * 3 / 4);
			assert_int_equal(p1.whole, 0);
			check_pages(b, &p2, L);
			n_whole += p2.whole;
			n_part += !p2.whole;
			/* 2N / W windows, not one a run of kept blocks */
			if (p2.whole)
				assert_int_equal(p2.n_windows, 1 + (p2.ws_tokens - 256 + 127) / 128);
		}
		agentlang_pages_free(&p1);
		agentlang_pages_free(&p2);
	}
	assert_true(n_whole > 0 && n_part > 0);
	whole.window = 288;	/* even, but halves of 144 cut blocks */
	assert_true(agentlang_train_seq_paged(7, 0, L, 1.0, &whole, b, NULL, &p2) < 0);
	agentlang_pages_free(&p2);
	free(a);
	free(b);
}

static uint32_t rd32(const uint8_t *p)
{
	return p[0] | p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
	return rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

/* A paged corpus: the same ids as without paging, then a record per paged
 * sequence, found through the index, that says what the generator says. */
static void test_paged_corpus(void **state)
{
	char p1[] = "/tmp/kvmem-corpus-XXXXXX", p2[] = "/tmp/kvmem-corpus-XXXXXX";
	int fd1 = mkstemp(p1), fd2 = mkstemp(p2);
	/* N sequences: enough that some paged ones are whole and some not
	 * (at 40 both kinds were missing about once in 200 runs, seed
	 * 15013740134). */
	const int L = 512, W = 256, N = 120;
	agentlang_corpus_opts o = { .seed = rnd() % 1000000, .n_tokens = N * 512, .seq_len = L,
				   .view_share = 0.7, .threads = 2 };
	agentlang_corpus_header h;
	agentlang_pages pg = { 0 };
	int32_t seq[512];
	uint32_t n_whole = 0;

	assert_true(fd1 >= 0 && fd2 >= 0);
	close(fd1);
	close(fd2);
	o.view = (agentlang_view_opts){ .policy = "lexical", .max_ratio = 16 };
	assert_int_equal(agentlang_corpus_write(p2, &o), 0);
	o.view.paged = 0.6;
	o.view.window = W;
	o.view.whole = 0.5;
	o.view.whole_min_ratio = 2;	/* the API takes any ratio; the CLI 16, 32, 64 */
	assert_int_equal(agentlang_corpus_write(p1, &o), 0);
	assert_int_equal(agentlang_corpus_read_header(p1, &h), 0);
	assert_int_equal(h.whole_permille, 500);
	assert_int_equal(h.whole_min_ratio, 2);
	assert_int_equal(h.version, 4);
	assert_int_equal(h.paged_permille, 600);
	assert_int_equal(h.window, W);
	assert_true(h.n_paged > 0 && h.n_paged < (uint32_t)N);
	assert_true(h.paged_index > AGENTLANG_CORPUS_HEADER + (uint64_t)N * 512 * 2);

	FILE *f1 = fopen(p1, "rb"), *f2 = fopen(p2, "rb");
	size_t ids = (size_t)N * 512 * 2, size;
	assert_true(f1 && f2);
	fseek(f1, 0, SEEK_END);
	size = (size_t)ftell(f1);
	rewind(f1);
	uint8_t *a = malloc(size), *b = malloc(AGENTLANG_CORPUS_HEADER + ids + 1);
	assert_true(a && b);
	assert_int_equal(fread(a, 1, size, f1), size);
	assert_int_equal(fread(b, 1, AGENTLANG_CORPUS_HEADER + ids + 1, f2),
			 AGENTLANG_CORPUS_HEADER + ids);
	fclose(f1);
	fclose(f2);
	assert_memory_equal(a + AGENTLANG_CORPUS_HEADER, b + AGENTLANG_CORPUS_HEADER, ids);
	assert_int_equal(size, h.paged_index + 16 * (uint64_t)h.n_paged);
	uint64_t prev = 0, next = AGENTLANG_CORPUS_HEADER + ids;
	for (uint32_t k = 0; k < h.n_paged; k++) {
		uint64_t s = rd64(a + h.paged_index + 16 * k), off = rd64(a + h.paged_index + 16 * k + 8);
		const uint8_t *r = a + off;

		assert_true(s < (uint64_t)N && (k == 0 || s > prev));
		assert_int_equal(off, next);	/* records follow one another */
		prev = s;
		assert_int_equal(agentlang_train_seq_paged(o.seed, s, L, o.view_share, &o.view, seq,
							   NULL, &pg), 0);
		uint32_t nv = rd32(r), nw = rd32(r + 4), nve = (nv + 1) / 2 * 2;

		assert_int_equal(nv, pg.n_view);
		assert_int_equal(nw, pg.n_windows);
		assert_int_equal(rd32(r + 8), pg.ws_tokens);
		assert_int_equal(rd32(r + 12), W);
		assert_int_equal(rd32(r + 16), pg.whole);
		assert_int_equal(rd32(r + 20), pg.n_q);
		assert_true(rd32(r + 24) == 0 && rd32(r + 28) == 0);
		n_whole += pg.whole;
		r += 32;
		for (int i = 0; i < pg.n_q; i++)
			assert_int_equal(rd32(r + 4 * i), pg.needle[i]);
		r += 4 * pg.n_q;
		for (uint32_t w = 0; w < nw; w++) {
			assert_int_equal(rd32(r + 4 * w), pg.win_start[w]);
			assert_int_equal(rd32(r + 4 * (nw + w)), pg.win_end[w]);
		}
		r += 8 * nw;
		for (uint32_t i = 0; i < nv; i++) {
			assert_int_equal(r[2 * i] | r[2 * i + 1] << 8, pg.win[i]);
			assert_int_equal(r[2 * (nve + i)] | r[2 * (nve + i) + 1] << 8, pg.off[i]);
		}
		r += 4 * nve;
		for (size_t i = 0; i < (size_t)nw * W; i++)
			assert_int_equal(r[2 * i] | r[2 * i + 1] << 8, pg.ids[i]);
		next = off + 32 + 4 * (uint64_t)pg.n_q + 8 * nw + 4 * nve + 2 * (uint64_t)nw * W;
		agentlang_pages_free(&pg);
	}
	assert_int_equal(next, h.paged_index);
	assert_int_equal(n_whole, h.n_whole);
	assert_true(n_whole > 0 && n_whole < h.n_paged);
	free(a);
	free(b);
	unlink(p1);
	unlink(p2);
	o.id_bytes = 4;	/* windows are u16 */
	assert_true(agentlang_corpus_write(p1, &o) < 0);
	o.id_bytes = 2;
	o.view.policy = NULL;
	assert_true(agentlang_corpus_write(p1, &o) < 0);
	assert_int_equal(access(p1, F_OK), -1);
}

static void test_exact_match(void **state)
{
	agentlang_transcript ws;

	build(&ws, rnd(), 4096, 2, 2, NULL);
	for (int i = 0; i < ws.n_q; i++) {
		const agentlang_question *q = &ws.q[i];
		int32_t gen[8];

		memcpy(gen, q->answer, sizeof(q->answer[0]) * q->n_answer);
		gen[q->n_answer] = AGENTLANG_NL;
		assert_int_equal(agentlang_exact_match(q, gen, q->n_answer + 1), 1);
		assert_int_equal(agentlang_exact_match(q, gen, q->n_answer), 1);
		assert_int_equal(agentlang_exact_match(q, gen, q->n_answer - 1), 0);
		gen[q->n_answer - 1] = AGENTLANG_NL;	/* no <end> */
		assert_int_equal(agentlang_exact_match(q, gen, q->n_answer), 0);
		memcpy(gen, q->answer, sizeof(q->answer[0]) * q->n_answer);
		gen[0] = gen[0] == 100 ? 101 : 100;	/* a wrong first token */
		assert_int_equal(agentlang_exact_match(q, gen, q->n_answer), 0);
	}
	agentlang_transcript_free(&ws);
}

static void test_bad_params(void **state)
{
	agentlang_params p;
	agentlang_transcript ws;
	double d = 1.5;

	agentlang_params_default(&p);
	p.n_tokens = 2048;
	p.n_questions = 50;
	assert_true(agentlang_transcript_build(&p, &ws) < 0);
	assert_non_null(strstr(kvmem_last_error(), "need a workspace"));
	assert_null(ws.ids);
	p.n_questions = 1;
	p.depths = &d;
	assert_true(agentlang_transcript_build(&p, &ws) < 0);
	assert_non_null(strstr(kvmem_last_error(), "depth"));
	p.depths = NULL;
	p.n_tokens = 100;
	assert_true(agentlang_transcript_build(&p, &ws) < 0);
	p.n_tokens = 4096;
	p.lookalikes = 17;
	assert_true(agentlang_transcript_build(&p, &ws) < 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vocab),
		cmocka_unit_test(test_roundtrip_each_token),
		cmocka_unit_test(test_roundtrip_text),
		cmocka_unit_test(test_determinism),
		cmocka_unit_test(test_answers_are_latest),
		cmocka_unit_test(test_lookalikes),
		cmocka_unit_test(test_depth),
		cmocka_unit_test(test_train_sequences),
		cmocka_unit_test(test_train_short_stream_asks),
		cmocka_unit_test(test_fixed_lookalikes),
		cmocka_unit_test(test_view_policy_plan),
		cmocka_unit_test(test_view_policy_sequences),
		cmocka_unit_test(test_corpus_file),
		cmocka_unit_test(test_paged_sequences),
		cmocka_unit_test(test_whole_pages),
		cmocka_unit_test(test_paged_corpus),
		cmocka_unit_test(test_exact_match),
		cmocka_unit_test(test_bad_params),
	};

	const char *env = getenv("KVMEM_TEST_SEED");

	seed0 = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
	printf("test_agentlang: seed %llu (KVMEM_TEST_SEED repeats a run)\n",
	       (unsigned long long)seed0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
