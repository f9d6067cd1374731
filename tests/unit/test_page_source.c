// SPDX-License-Identifier: MIT
/*
 * One suite over every page source: one fixture, one variant per source, as
 * the kernel's hmm-tests run the same bodies per device type. A new source
 * adds a variant below and passes the same tests:
 *
 *   - tokens written in random chunks, layer by layer, with commits at
 *     random points where the source has them, come back from get bit for
 *     bit (full blocks and the partial last one), also after the host pool
 *     had to drop them and read them again;
 *   - bad writes and reads are refused with -EINVAL and change nothing;
 *   - prefetch and hint take anything (unknown blocks too) and change
 *     nothing;
 *   - a committed page with a flipped byte on disk is refused (-EBADMSG),
 *     never returned, and the other pages still read;
 *   - a session over the source at a budget far below the workspace,
 *     committing each step, decodes what the same session over host memory
 *     decodes, logit for logit;
 *   - the same on a backend with a device page pool (a GPU's, modelled by
 *     helpers/test_devpool.h), and where the source records tiers (the
 *     module's page table) the pool's pages are its GPU tier, at their
 *     slots, until the session ends.
 *
 * The kmod variant (the kernel module's source) runs where /dev/kvmem opens
 * (in the VM: make vmtest) and skips elsewhere, saying why; it also checks
 * that committed pages were read through the module's window.
 * KVMEM_TEST_SOURCE=NAME runs one variant alone (the others skip).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/kernels.h"
#include "kvmem/kmod.h"
#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "session/inspect.h"
#include "util/hostmem.h"
#include "helpers/test_devpool.h"
#include "helpers/test_model.h"
#include "helpers/test_tmpdir.h"

static uint64_t g_seed;

/* ---- the fixture and its variants ---------------------------------------- */
struct fx {
	int L, H, D, B;
	kvmem_page_source src;
	kvmem_pager *p;		/* the pager and kmod variants' */
	char dir[256];
};

struct variant {
	const char *name;
	/* Open a fresh source of this geometry; a small host pool where the
	 * source has one, so reads must come back from its lower tier. */
	void (*open)(struct fx *f);
	void (*close)(struct fx *f);
	/* Optional: make tokens [0, n) durable (ids: their token ids). */
	void (*commit)(struct fx *f, const int32_t *ids, int64_t n);
	/* Optional: after reading every page of [0, n) with `committed`
	 * tokens committed, check the reads went where they should. */
	void (*served)(struct fx *f, int64_t committed, int64_t n);
	/* Optional: 0 when the source can run here, else -errno with a
	 * message (the tests then skip it, saying why). */
	int (*available)(void);
};

static void mem_open(struct fx *f)
{
	assert_int_equal(kvmem_page_source_mem(&f->src, f->L, f->H, f->D, f->B), 0);
}

static void mem_close(struct fx *f)
{
	kvmem_page_source_destroy(&f->src);
}

static kvmem_page_geom fx_geom(const struct fx *f)
{
	kvmem_page_geom g = { .fingerprint = 0x5eed, .n_layers = f->L, .n_heads = f->H,
			      .n_kv_heads = f->H, .head_dim = f->D, .block_tokens = f->B,
			      .dtype = KVMEM_DTYPE_F32 };
	return g;
}

/* A fresh workspace in a scratch directory, its pager with room for one
 * block and a page: everything else is read from disk. */
static void workspace_open(struct fx *f)
{
	kvmem_page_geom g = fx_geom(f);
	kvmem_pager_opts po;

	assert_int_equal(test_tmpdir_make(f->dir, sizeof(f->dir), "page-source"), 0);
	strcat(f->dir, "/ws");
	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP;
	po.host_cap = kvmem_page_stride(&g) * (f->L + 1);
	if (kvmem_pager_open(f->dir, &g, &po, &f->p) < 0)
		fail_msg("pager: %s", kvmem_last_error());
}

static void pager_open(struct fx *f)
{
	workspace_open(f);
	assert_int_equal(kvmem_page_source_pager(&f->src, f->p), 0);
}

static void pager_close(struct fx *f)
{
	char *slash = strrchr(f->dir, '/');

	kvmem_page_source_destroy(&f->src);
	kvmem_pager_close(f->p);
	*slash = 0;
	test_tmpdir_remove(f->dir);
}

static void pager_commit(struct fx *f, const int32_t *ids, int64_t n)
{
	if (kvmem_page_source_commit(&f->src, ids, n, NULL, 0) < 0)
		fail_msg("commit of %lld tokens: %s", (long long)n, kvmem_last_error());
}

/* The kernel module's source: a window as small as the pager's pool, and
 * first sized for two blocks, so commits past it reopen it larger. */
static void kmod_open(struct fx *f)
{
	kvmem_page_geom g = fx_geom(f);
	kvmem_kmod_opts ko;

	workspace_open(f);
	kvmem_kmod_opts_default(&ko);
	ko.host_cap = kvmem_page_stride(&g) * (f->L + 1);
	ko.page_max = 2 * f->L;
	if (kvmem_page_source_kmod(&f->src, f->p, &ko) < 0)
		fail_msg("kmod source: %s", kvmem_last_error());
	assert_string_equal(f->src.ops->name, "kmod");
}

/* Every committed page was faulted into the module's window (the table
 * counts faults per page); the module serves exactly the committed pages. */
static void kmod_served(struct fx *f, int64_t committed, int64_t n)
{
	kvmem_kmod *k = kvmem_page_source_kmod_client(&f->src);
	uint64_t pages = (uint64_t)(committed / f->B) * f->L;

	(void)n;
	assert_non_null(k);
	assert_int_equal(kvmem_kmod_pages(k), pages);
	for (uint64_t p = 0; p < pages; p++) {
		const struct kvmem_pte *e = kvmem_kmod_pte(k, p);

		assert_non_null(e);
		if (!e->access_count)
			fail_msg("page %llu of %llu committed was not read through the module",
				 (unsigned long long)p, (unsigned long long)pages);
	}
}

static int kmod_available(void)
{
	return kvmem_kmod_probe(NULL);
}

static const struct variant variants[] = {
	{ "mem", mem_open, mem_close, NULL, NULL, NULL },
	{ "pager", pager_open, pager_close, pager_commit, NULL, NULL },
	{ "kmod", kmod_open, pager_close, pager_commit, kmod_served, kmod_available },
};

static void fx_geometry(struct fx *f, uint64_t *rng)
{
	static const int dims[] = { 8, 16, 32, 64 };

	memset(f, 0, sizeof(*f));
	f->L = test_rng_int(rng, 1, 3);
	f->H = test_rng_int(rng, 1, 3);
	f->D = dims[test_rng_int(rng, 0, 3)];
	f->B = 16 << test_rng_int(rng, 0, 2);
}

/* Token t's raw K (v = 0) or V (v = 1) row of layer l: H * D floats that are
 * a pure function of (seed, t, l, v). */
static void row(uint64_t seed, int64_t t, int l, int v, int n, float *out)
{
	uint64_t s = seed ^ ((uint64_t)t * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)l << 40) ^
		     ((uint64_t)v << 56);

	for (int i = 0; i < n; i++)
		out[i] = (float)test_rng_range(&s, -4, 4);
}

/* Write tokens [from, n) as a session does: chunks of random length, each
 * layer's part of a chunk split at block boundaries. */
static void write_range(struct fx *f, uint64_t seed, int64_t from, int64_t n, uint64_t *rng)
{
	const int w = f->H * f->D;
	float *k = malloc(sizeof(float) * 64 * w), *v = malloc(sizeof(float) * 64 * w);

	for (int64_t p0 = from; p0 < n;) {
		int c = test_rng_int(rng, 1, 64);

		if (p0 + c > n)
			c = (int)(n - p0);
		for (int l = 0; l < f->L; l++) {
			for (int j = 0; j < c; j++) {
				row(seed, p0 + j, l, 0, w, k + (size_t)j * w);
				row(seed, p0 + j, l, 1, w, v + (size_t)j * w);
			}
			for (int j = 0; j < c;) {
				int64_t p = p0 + j;
				int t0 = (int)(p % f->B), m = f->B - t0 < c - j ? f->B - t0 : c - j;

				if (f->src.ops->write(f->src.ctx, p / f->B, l, t0, m,
						      k + (size_t)j * w, v + (size_t)j * w))
					fail_msg("%s", kvmem_last_error());
				j += m;
			}
		}
		p0 += c;
	}
	free(k);
	free(v);
}

static void write_tokens(struct fx *f, uint64_t seed, int64_t n, uint64_t *rng)
{
	write_range(f, seed, 0, n, rng);
}

/* Commit [0, n) where the variant commits (token ids: any). */
static void commit(const struct variant *var, struct fx *f, int64_t n)
{
	int32_t *ids;

	if (!var->commit)
		return;
	ids = calloc((size_t)n + 1, sizeof(*ids));
	assert_non_null(ids);
	var->commit(f, ids, n);
	free(ids);
}

/* Every page of [0, n) holds what write_tokens wrote. */
static void check_tokens(struct fx *f, uint64_t seed, int64_t n)
{
	const int w = f->H * f->D;
	float *want = malloc(sizeof(float) * w), *got = malloc(sizeof(float) * f->D);

	for (int64_t b = 0; b * f->B < n; b++)
		for (int l = 0; l < f->L; l++) {
			int len = n - b * f->B < f->B ? (int)(n - b * f->B) : f->B;
			kvmem_page pg;

			if (f->src.ops->get(f->src.ctx, b, l, &pg))
				fail_msg("get block %lld layer %d: %s", (long long)b, l,
					 kvmem_last_error());
			assert_int_equal(pg.mem, KVMEM_MEM_HOST);
			for (int t = 0; t < len; t++)
				for (int v = 0; v < 2; v++) {
					row(seed, b * f->B + t, l, v, w, want);
					for (int h = 0; h < f->H; h++) {
						assert_int_equal(kvmem_page_copy_f32(&pg, v,
							((size_t)h * f->B + t) * f->D, f->D, got), 0);
						assert_memory_equal(got, want + (size_t)h * f->D,
								    sizeof(float) * f->D);
					}
				}
			f->src.ops->put(f->src.ctx, b, l);
		}
	free(want);
	free(got);
}

/* ---- the tests: each runs once per variant ------------------------------ */
/* Name the variant; skip it (before the test holds anything) when it cannot
 * run here, or when KVMEM_TEST_SOURCE names another (the VM runs the kmod
 * variant alone: the others run on the build machine). */
static void announce(const struct variant *var)
{
	const char *only = getenv("KVMEM_TEST_SOURCE");

	print_message("source: %s\n", var->name);
	if (only && *only && strcmp(only, var->name)) {
		print_message("skipped: KVMEM_TEST_SOURCE=%s\n", only);
		skip();
	}
	if (var->available && var->available() < 0) {
		print_message("skipped: %s (the %s variant runs in the VM: make vmtest)\n",
			      kvmem_last_error(), var->name);
		skip();
	}
}

static void test_roundtrip(void **state)
{
	const struct variant *var = *state;

	announce(var);
	uint64_t rng = g_seed ^ 0x11;

	for (int round = 0; round < 4; round++) {
		struct fx f;
		int64_t n, n1, n2;

		fx_geometry(&f, &rng);
		n = test_rng_int(&rng, 1, 12 * f.B);
		/* Two commits on the way (the second past the kmod variant's
		 * first window, mostly): committed, staged and open blocks
		 * are all read below. */
		n1 = test_rng_int(&rng, 0, (int)n);
		n2 = test_rng_int(&rng, (int)n1, (int)n);
		uint64_t seed = test_rng_next(&rng);

		var->open(&f);
		write_range(&f, seed, 0, n1, &rng);
		commit(var, &f, n1);
		write_range(&f, seed, n1, n2, &rng);
		commit(var, &f, n2);
		write_range(&f, seed, n2, n, &rng);
		check_tokens(&f, seed, n);
		/* Read twice: pages the pool dropped meanwhile come back too. */
		check_tokens(&f, seed, n);
		if (var->served)
			var->served(&f, var->commit ? n2 : 0, n);
		var->close(&f);
	}
}

static void test_bad_calls_refused(void **state)
{
	const struct variant *var = *state;

	announce(var);
	uint64_t rng = g_seed ^ 0x22;
	struct fx f;
	float row_k[4096] = { 1 }, row_v[4096] = { 2 };
	kvmem_page pg;
	int64_t n;

	fx_geometry(&f, &rng);
	uint64_t seed = test_rng_next(&rng);

	n = f.B + f.B / 2;
	var->open(&f);
	write_tokens(&f, seed, n, &rng);
	/* Never written, a layer out of range, a negative block. */
	assert_int_equal(f.src.ops->get(f.src.ctx, 7, 0, &pg), -EINVAL);
	assert_int_equal(f.src.ops->get(f.src.ctx, 0, f.L, &pg), -EINVAL);
	assert_int_equal(f.src.ops->get(f.src.ctx, -1, 0, &pg), -EINVAL);
	/* Past the block, out of range, out of order (a gap in the partial
	 * block), negative counts. */
	assert_int_equal(f.src.ops->write(f.src.ctx, 1, 0, f.B - 1, 2, row_k, row_v), -EINVAL);
	assert_int_equal(f.src.ops->write(f.src.ctx, 1, f.L, f.B / 2, 1, row_k, row_v), -EINVAL);
	assert_int_equal(f.src.ops->write(f.src.ctx, 1, 0, f.B / 2 + 1, 1, row_k, row_v), -EINVAL);
	assert_int_equal(f.src.ops->write(f.src.ctx, 1, 0, f.B / 2, -1, row_k, row_v), -EINVAL);
	assert_int_equal(kvmem_last_errno(), EINVAL);
	/* Nothing changed. */
	check_tokens(&f, seed, n);
	var->close(&f);
}

static void test_hints_take_anything(void **state)
{
	const struct variant *var = *state;

	announce(var);
	uint64_t rng = g_seed ^ 0x33;
	struct fx f;
	int64_t n, blocks[] = { 0, 1, -5, 1000000, 2, 0 };
	float sc[] = { 1, 0.5f, 1, 1, 0, 2 };

	fx_geometry(&f, &rng);
	uint64_t seed = test_rng_next(&rng);

	n = 4 * f.B + 3;
	var->open(&f);
	write_tokens(&f, seed, n, &rng);
	if (f.src.ops->prefetch)
		f.src.ops->prefetch(f.src.ctx, blocks, 6);
	if (f.src.ops->hint)
		f.src.ops->hint(f.src.ctx, blocks, sc, 6);
	check_tokens(&f, seed, n);
	var->close(&f);
}

/* A kmod source over a fresh workspace: a window of 2L pages (two blocks)
 * and a host cap of `slots` pages. */
static void kmod_open_sized(struct fx *f, uint64_t slots)
{
	kvmem_page_geom g = fx_geom(f);
	kvmem_kmod_opts ko;

	workspace_open(f);
	kvmem_kmod_opts_default(&ko);
	ko.page_max = 2 * f->L;
	ko.host_cap = kvmem_page_stride(&g) * slots;
	if (kvmem_page_source_kmod(&f->src, f->p, &ko) < 0)
		fail_msg("kmod source: %s", kvmem_last_error());
}

/* The kmod source's region (what a GPU backend would cudaHostRegister):
 * refused (-ENOTSUP) while the window is larger than its host cap; where it
 * fits, the window over the committed pages, every committed page got
 * inside it, mapped read-only; after that the window never moves: blocks
 * committed past it are read through the pager, and every page still
 * reads right. Other
 * variants: nothing (mem has no region, the pager's is its host pool). */
static void test_kmod_region(void **state)
{
	const struct variant *var = *state;

	announce(var);
	uint64_t rng = g_seed ^ 0x77;
	struct fx f;
	kvmem_kmod *k;
	kvmem_page_geom g;
	void *base = NULL;
	size_t len = 0, wlen;
	int64_t n;

	if (strcmp(var->name, "kmod"))
		return;
	fx_geometry(&f, &rng);
	uint64_t seed = test_rng_next(&rng);

	n = 2 * f.B + 3;
	kmod_open_sized(&f, 2 * f.L - 1);	/* one slot short of the window */
	write_tokens(&f, seed, n, &rng);
	commit(var, &f, n);
	assert_int_equal(f.src.ops->region(f.src.ctx, &base, &len), -ENOTSUP);
	pager_close(&f);

	kmod_open_sized(&f, 2 * f.L);
	g = fx_geom(&f);
	assert_int_equal(f.src.ops->region(f.src.ctx, &base, &len), -ENOENT);
	write_tokens(&f, seed, n, &rng);
	commit(var, &f, n);
	k = kvmem_page_source_kmod_client(&f.src);
	assert_int_equal(f.src.ops->region(f.src.ctx, &base, &len), 0);
	assert_ptr_equal(base, kvmem_kmod_window(k, &wlen));
	assert_int_equal(len, 2 * f.L * kvmem_page_stride(&g));
	/* Mapped read-only: what makes the cuda backend pin it with
	 * cudaHostRegisterReadOnly (cuda_host_register). */
	assert_int_equal(kvmem_host_writable(base, len), 0);
	for (int64_t b = 0; b < 2; b++)
		for (int l = 0; l < f.L; l++) {
			kvmem_page pg;

			assert_int_equal(f.src.ops->get(f.src.ctx, b, l, &pg), 0);
			assert_true((const char *)pg.k >= (const char *)base &&
				    (const char *)pg.k < (const char *)base + len);
			f.src.ops->put(f.src.ctx, b, l);
		}
	/* Past the window: it stays, the pager serves the rest. */
	write_range(&f, seed, n, 5 * f.B + 1, &rng);
	commit(var, &f, 5 * f.B + 1);
	check_tokens(&f, seed, 5 * f.B + 1);
	assert_ptr_equal(k, kvmem_page_source_kmod_client(&f.src));
	assert_int_equal(kvmem_kmod_pages(k), 2 * f.L);
	pager_close(&f);
}

/* A flipped byte in a committed page on disk: get refuses that page with
 * -EBADMSG (a checksum mismatch), never returns its bytes; the others read. */
static void test_corrupt_page_refused(void **state)
{
	const struct variant *var = *state;

	announce(var);
	if (!var->commit) {
		print_message("skipped: the %s source has no disk\n", var->name);
		skip();
	}
	uint64_t rng = g_seed ^ 0x55;
	struct fx f;
	char path[300];
	kvmem_page pg;
	int64_t n, b;
	int l, fd;
	unsigned char byte;
	off_t off;

	fx_geometry(&f, &rng);
	uint64_t seed = test_rng_next(&rng);

	n = test_rng_int(&rng, 2 * f.B, 6 * f.B);
	var->open(&f);
	write_tokens(&f, seed, n, &rng);
	commit(var, &f, n);
	b = test_rng_int(&rng, 0, (int)(n / f.B) - 1);
	l = test_rng_int(&rng, 0, f.L - 1);
	{
		kvmem_page_geom g = fx_geom(&f);

		off = (off_t)((uint64_t)b * f.L + l) * kvmem_page_stride(&g) +
		      test_rng_int(&rng, 0, (int)kvmem_page_bytes(&g) - 1);
	}
	snprintf(path, sizeof(path), "%s/pages", f.dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &byte, 1, off), 1);
	byte ^= (unsigned char)(1u << test_rng_int(&rng, 0, 7));
	assert_int_equal(pwrite(fd, &byte, 1, off), 1);
	assert_int_equal(fsync(fd), 0);
	close(fd);
	print_message("block %lld layer %d: byte %lld flipped\n", (long long)b, l, (long long)off);
	assert_int_equal(f.src.ops->get(f.src.ctx, b, l, &pg), -EBADMSG);
	assert_int_equal(kvmem_last_errno(), EBADMSG);
	/* Again: a bad page stays refused. */
	assert_int_equal(f.src.ops->get(f.src.ctx, b, l, &pg), -EBADMSG);
	/* Every other page reads as written. */
	{
		const int w = f.H * f.D;
		float *want = malloc(sizeof(float) * w), *got = malloc(sizeof(float) * f.D);

		for (int64_t ob = 0; ob * f.B < n; ob++)
			for (int ol = 0; ol < f.L; ol++) {
				int len = n - ob * f.B < f.B ? (int)(n - ob * f.B) : f.B;

				if (ob == b && ol == l)
					continue;
				if (f.src.ops->get(f.src.ctx, ob, ol, &pg))
					fail_msg("get block %lld layer %d: %s", (long long)ob, ol,
						 kvmem_last_error());
				for (int t = 0; t < len; t++) {
					row(seed, ob * f.B + t, ol, 1, w, want);
					assert_int_equal(kvmem_page_copy_f32(&pg, 1, (size_t)t * f.D,
									     f.D, got), 0);
					assert_memory_equal(got, want, sizeof(float) * f.D);
				}
				f.src.ops->put(f.src.ctx, ob, ol);
			}
		free(want);
		free(got);
	}
	var->close(&f);
}

/* Logits of every forward pass, appended. */
struct logs {
	float *buf;
	size_t n, cap;
	int vocab;
};

static void log_forward(void *arg, const int32_t *tok, int n, const float *logits)
{
	struct logs *lg = arg;

	if (lg->n + lg->vocab > lg->cap) {
		lg->cap = (lg->cap + lg->vocab) * 2;
		lg->buf = realloc(lg->buf, lg->cap * sizeof(float));
	}
	memcpy(lg->buf + lg->n, logits, lg->vocab * sizeof(float));
	lg->n += lg->vocab;
}

/* Three steps of append + select + decode at a budget of an eighth of the
 * workspace, each committed where the variant commits (var may be NULL),
 * then each(f) when given; returns the logits and the decoded tokens. */
static void session_run(kvmem_backend *be, const kvmem_page_source *src, int block,
			uint64_t seed, struct logs *lg, int32_t *out, const struct variant *var,
			struct fx *f, void (*each)(struct fx *f))
{
	kvmem_session_opts o;
	kvmem_session *s;
	uint64_t rng = seed;
	int vocab = be->model->cfg.vocab;
	int32_t tok[400];

	kvmem_session_opts_default(&o);
	o.block = block;
	o.budget = 4 * block;
	o.chunk = 32;
	o.policy = "subblock";
	o.source = src;
	o.on_forward = log_forward;
	o.arg = lg;
	s = kvmem_session_create(be, &o);
	assert_non_null(s);
	for (int step = 0; step < 3; step++) {
		int n = test_rng_int(&rng, 100, 400);

		for (int i = 0; i < n; i++)
			tok[i] = test_rng_int(&rng, 0, vocab - 1);
		/* A decode step returns with its rows in flight: synced before
		 * the source is committed (or read) here, past the session. */
		if (kvmem_session_append(s, tok, n, 0) || kvmem_session_select(s) ||
		    kvmem_session_decode(s, 5, NULL, out + 5 * step) || kvmem_session_sync(s))
			fail_msg("step %d: %s", step, kvmem_last_error());
		if (var && var->commit)
			var->commit(f, kvmem_session_token_ids(s), kvmem_session_tokens(s));
		if (each)
			each(f);
	}
	kvmem_session_free(s);
}

static void test_session_matches_memory(void **state)
{
	const struct variant *var = *state;

	announce(var);
	uint64_t rng = g_seed ^ 0x44;
	kvmem_config c = test_model_config(2, 64, 4, 2, 16, 96, 200, 0);
	kvmem_model *m = test_model_random(&c, test_rng_next(&rng));
	kvmem_backend *be = kvmem_backend_cpu(m, 32);
	struct logs want = { .vocab = c.vocab }, got = { .vocab = c.vocab };
	int32_t out_want[15], out_got[15];
	kvmem_page_source mem;
	struct fx f = { .L = c.n_layers, .H = c.n_kv_heads, .D = c.head_dim, .B = 16 };
	uint64_t seed = test_rng_next(&rng);

	assert_non_null(be);
	assert_int_equal(kvmem_page_source_mem(&mem, f.L, f.H, f.D, f.B), 0);
	session_run(be, &mem, f.B, seed, &want, out_want, NULL, NULL, NULL);
	kvmem_page_source_destroy(&mem);
	var->open(&f);
	session_run(be, &f.src, f.B, seed, &got, out_got, var, &f, NULL);
	if (kvmem_page_source_kmod_client(&f.src)) {
		/* The selections re-read committed pages through the module
		 * (counted over every window: commits grew it). */
		struct kvmem_ioc_stats st;

		assert_int_equal(kvmem_page_source_kmod_stats(&f.src, &st), 0);
		print_message("module: %llu faults, %llu pages read, %llu evictions\n",
			      (unsigned long long)st.faults, (unsigned long long)st.fills,
			      (unsigned long long)st.evictions);
		assert_true(st.fills > 0);
	}
	var->close(&f);
	assert_int_equal(got.n, want.n);
	assert_memory_equal(got.buf, want.buf, want.n * sizeof(float));
	assert_memory_equal(out_got, out_want, sizeof(out_want));
	free(want.buf);
	free(got.buf);
	kvmem_backend_close(be);
	test_model_free(m);
}

/* The kmod source with a window the backend may register (it fits the
 * host cap: ks_region), 128 blocks of pages. */
static void kmod_open_region(struct fx *f)
{
	kmod_open_sized(f, 128 * (uint64_t)f->L);
}

/* Pages on the GPU tier in the module's table, the most seen after a step. */
static uint64_t g_gpu_pages;

/* The module's table against the device pool: a page has the GPU tier, at
 * its pool slot, exactly when the pool holds it; every page the pool
 * holds is in the table. Other sources keep no tiers: nothing to check. */
static void gpu_tier_check(struct fx *f)
{
	kvmem_kmod *k = kvmem_page_source_kmod_client(&f->src);
	uint64_t pages, gpu = 0, host = 0, disk = 0;
	test_devpool_stats st;

	if (!k)
		return;
	pages = kvmem_kmod_pages(k);
	test_devpool_stats_get(&st);
	for (uint64_t p = 0; p < pages; p++) {
		uint32_t want = test_devpool_slot((int64_t)(p / f->L), (int)(p % f->L));
		struct kvmem_pte e;

		assert_int_equal(kvmem_kmod_pte_read(k, p, &e), 0);
		if (e.gpu_slot != want || !(e.tiers & KVMEM_TIER_GPU) != (want == UINT32_MAX))
			fail_msg("page %llu: gpu_slot %u, tiers 0x%x; the device pool has it at %u",
				 (unsigned long long)p, e.gpu_slot, e.tiers, want);
		gpu += !!(e.tiers & KVMEM_TIER_GPU);
		host += !!(e.tiers & KVMEM_TIER_HOST);
		disk += !!(e.tiers & KVMEM_TIER_NVME);
	}
	print_message("module's table, %llu pages: %llu on the GPU, %llu in host memory, "
		      "%llu on disk (pool: %llu in, %llu out, %llu hits)\n",
		      (unsigned long long)pages, (unsigned long long)gpu, (unsigned long long)host,
		      (unsigned long long)disk, (unsigned long long)st.fills,
		      (unsigned long long)st.drops, (unsigned long long)st.hits);
	assert_int_equal(gpu, (uint64_t)st.held);
	assert_int_equal(disk, pages);
	if (gpu > g_gpu_pages)
		g_gpu_pages = gpu;
}

/* The GPU tier: the session of test_session_matches_memory on the cpu
 * backend with a device page pool of 6 pages (fewer than a view's, so
 * pages leave it too) decodes what the session over host memory on the
 * plain backend decodes; after each step the source's tiers follow the
 * pool (gpu_tier_check), and once the session is freed (the region
 * unregistered, the pool emptied) no page is left on the GPU tier. */
static void test_session_device_tier(void **state)
{
	const struct variant *var = *state;

	announce(var);
	uint64_t rng = g_seed ^ 0x91;
	kvmem_config c = test_model_config(2, 64, 4, 2, 16, 96, 200, 0);
	kvmem_model *m = test_model_random(&c, test_rng_next(&rng));
	kvmem_backend *be = kvmem_backend_cpu(m, 32), pooled;
	struct logs want = { .vocab = c.vocab }, got = { .vocab = c.vocab };
	int32_t out_want[15], out_got[15];
	kvmem_page_source mem;
	struct fx f = { .L = c.n_layers, .H = c.n_kv_heads, .D = c.head_dim, .B = 16 };
	uint64_t seed = test_rng_next(&rng);
	test_devpool_stats st;

	assert_non_null(be);
	assert_int_equal(kvmem_page_source_mem(&mem, f.L, f.H, f.D, f.B), 0);
	session_run(be, &mem, f.B, seed, &want, out_want, NULL, NULL, NULL);
	kvmem_page_source_destroy(&mem);
	if (strcmp(var->name, "kmod"))
		var->open(&f);
	else
		kmod_open_region(&f);
	assert_int_equal(test_devpool_wrap(&pooled, be, 6), 0);
	g_gpu_pages = 0;
	session_run(&pooled, &f.src, f.B, seed, &got, out_got, var, &f, gpu_tier_check);
	test_devpool_stats_get(&st);
	print_message("device pool: %llu pages in, %llu out, %llu placed from it\n",
		      (unsigned long long)st.fills, (unsigned long long)st.drops,
		      (unsigned long long)st.hits);
	assert_int_equal(st.held, 0);
	if (var->commit)	/* sources with a region: the pager's pool, the window */
		assert_true(st.fills > 0);
	if (kvmem_page_source_kmod_client(&f.src)) {
		assert_true(g_gpu_pages > 0);
		gpu_tier_check(&f);	/* the pool is empty: so is the GPU tier */
	}
	test_devpool_unwrap();
	var->close(&f);
	assert_int_equal(got.n, want.n);
	assert_memory_equal(got.buf, want.buf, want.n * sizeof(float));
	assert_memory_equal(out_got, out_want, sizeof(out_want));
	free(want.buf);
	free(got.buf);
	kvmem_backend_close(be);
	test_model_free(m);
}

/* The memory source with bf16 pages (a bf16 backend's session keeps its
 * history in one): get says bf16; fp32 rows written through write and
 * write_rows read back as their nearest-even bf16, bf16 rows as they are;
 * a dtype it does not keep is refused. Not a variant above: their rows are
 * fp32 values that bf16 pages cannot hold. */
static void test_mem_bf16_pages(void **state)
{
	uint64_t rng = g_seed ^ 0xbf16;
	struct fx f;

	(void)state;
	for (int round = 0; round < 3; round++) {
		fx_geometry(&f, &rng);
		const int w = f.H * f.D, n = test_rng_int(&rng, 1, 3 * f.B);
		const size_t rows = (size_t)f.L * n * w;
		float *k = malloc(sizeof(float) * rows), *v = malloc(sizeof(float) * rows);
		uint16_t *kb = malloc(sizeof(uint16_t) * rows), *vb = malloc(sizeof(uint16_t) * rows);
		kvmem_page_source a, b;

		assert_true(k && v && kb && vb);
		for (size_t i = 0; i < rows; i++) {
			k[i] = (float)test_rng_range(&rng, -4, 4);
			v[i] = (float)test_rng_range(&rng, -4, 4);
			kb[i] = (uint16_t)test_rng_next(&rng);	/* any bits, NaNs too */
			vb[i] = (uint16_t)test_rng_next(&rng);
		}
		assert_int_equal(kvmem_page_source_mem_dtype(&a, f.L, f.H, f.D, f.B,
							     KVMEM_DTYPE_BF16), 0);
		assert_int_equal(kvmem_page_source_mem_dtype(&b, f.L, f.H, f.D, f.B,
							     KVMEM_DTYPE_BF16), 0);
		/* a: fp32 rows, layer by layer through write, in block pieces;
		 * b: bf16 rows whole through write_rows. */
		for (int l = 0; l < f.L; l++)
			for (int j = 0; j < n;) {
				int t0 = j % f.B, m = f.B - t0 < n - j ? f.B - t0 : n - j;
				size_t at = ((size_t)l * n + j) * w;

				assert_int_equal(a.ops->write(a.ctx, j / f.B, l, t0, m, k + at,
							      v + at), 0);
				j += m;
			}
		assert_int_equal(b.ops->write_rows(b.ctx, 0, n, kb, vb, KVMEM_DTYPE_BF16), 0);
		for (int t = 0; t < n; t++)
			for (int l = 0; l < f.L; l++) {
				kvmem_page pa, pb;

				assert_int_equal(a.ops->get(a.ctx, t / f.B, l, &pa), 0);
				assert_int_equal(b.ops->get(b.ctx, t / f.B, l, &pb), 0);
				assert_int_equal(pa.dtype, KVMEM_DTYPE_BF16);
				assert_int_equal(pb.dtype, KVMEM_DTYPE_BF16);
				for (int h = 0; h < f.H; h++)
					for (int i = 0; i < f.D; i++) {
						size_t in = ((size_t)l * n + t) * w + (size_t)h * f.D + i;
						size_t pg = ((size_t)h * f.B + t % f.B) * f.D + i;

						assert_int_equal(((const uint16_t *)pa.k)[pg],
								 kvmem_f32_to_bf16(k[in]));
						assert_int_equal(((const uint16_t *)pa.v)[pg],
								 kvmem_f32_to_bf16(v[in]));
						assert_int_equal(((const uint16_t *)pb.k)[pg], kb[in]);
						assert_int_equal(((const uint16_t *)pb.v)[pg], vb[in]);
					}
				a.ops->put(a.ctx, t / f.B, l);
				b.ops->put(b.ctx, t / f.B, l);
			}
		/* fp32 rows whole round the same way as write's. */
		kvmem_page_source_destroy(&b);
		assert_int_equal(kvmem_page_source_mem_dtype(&b, f.L, f.H, f.D, f.B,
							     KVMEM_DTYPE_BF16), 0);
		assert_int_equal(b.ops->write_rows(b.ctx, 0, n, k, v, KVMEM_DTYPE_F32), 0);
		for (int64_t blk = 0; blk * f.B < n; blk++)
			for (int l = 0; l < f.L; l++) {
				kvmem_page pa, pb;
				int len = n - blk * f.B < f.B ? (int)(n - blk * f.B) : f.B;

				assert_int_equal(a.ops->get(a.ctx, blk, l, &pa), 0);
				assert_int_equal(b.ops->get(b.ctx, blk, l, &pb), 0);
				for (int h = 0; h < f.H; h++) {
					size_t at = (size_t)h * f.B * f.D;

					assert_memory_equal((const uint16_t *)pa.k + at,
							    (const uint16_t *)pb.k + at,
							    sizeof(uint16_t) * len * f.D);
					assert_memory_equal((const uint16_t *)pa.v + at,
							    (const uint16_t *)pb.v + at,
							    sizeof(uint16_t) * len * f.D);
				}
			}
		kvmem_page_source_destroy(&a);
		kvmem_page_source_destroy(&b);
		free(k);
		free(v);
		free(kb);
		free(vb);
	}
	assert_int_equal(kvmem_page_source_mem_dtype(&f.src, 1, 1, 8, 16, KVMEM_DTYPE_FP8), -EINVAL);
	assert_non_null(strstr(kvmem_last_error(), "f32 or bf16"));
}

#define PER_VARIANT(t)                                                            \
	cmocka_unit_test_prestate(t, (void *)&variants[0]),                       \
	cmocka_unit_test_prestate(t, (void *)&variants[1]),                       \
	cmocka_unit_test_prestate(t, (void *)&variants[2])

int main(void)
{
	const struct CMUnitTest tests[] = {
		PER_VARIANT(test_roundtrip),
		PER_VARIANT(test_bad_calls_refused),
		PER_VARIANT(test_hints_take_anything),
		PER_VARIANT(test_corrupt_page_refused),
		PER_VARIANT(test_kmod_region),
		PER_VARIANT(test_session_matches_memory),
		PER_VARIANT(test_session_device_tier),
		cmocka_unit_test(test_mem_bf16_pages),
	};

	_Static_assert(sizeof(variants) / sizeof(variants[0]) == 3,
		       "PER_VARIANT lists every variant");
	g_seed = test_rng_fresh_seed("test_page_source");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
