// SPDX-License-Identifier: MIT
/*
 * Reading a lab trace: the file is mapped read-only and checked whole
 * before anything is used: the header's magic, version and checksum, every
 * record's checksum and sizes, and an end record whose counts match what
 * came before it, at the end of the file. A trace cut short (no end record,
 * a zero header), a flipped byte or a forged length is refused with
 * -EBADMSG naming the file and the offset; another format version with
 * -ESTALE. Selections point into the mapping.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvmem/kvmem.h"
#include "lab/trace.h"

static int bad(const struct lab_trace *t, uint64_t off, const char *what)
{
	return kvmem_error(EBADMSG, "%s: at byte %llu: %s: corrupt or truncated lab trace", t->path,
			   (unsigned long long)off, what);
}

static int is_pow2_block(uint32_t b)
{
	return b >= KVMEM_BLOCK_MIN && b <= KVMEM_BLOCK_MAX && !(b & (b - 1));
}

static int check_header(struct lab_trace *t)
{
	const struct lab_header *h = &t->h;

	if (t->len < LAB_HEADER_BYTES)
		return kvmem_error(EBADMSG, "%s: %zu bytes, shorter than a lab trace's header: truncated",
				   t->path, t->len);
	memcpy(&t->h, t->map, sizeof(t->h));
	if (memcmp(h->magic, LAB_MAGIC, 8))
		return kvmem_error(EBADMSG, "%s: not a lab trace (no %s magic; a recording cut short "
				   "before its end has none either)", t->path, LAB_MAGIC);
	/* The checksum covers the version: another version's intact header is
	 * -ESTALE, a flipped version byte is corruption like any other. */
	if (h->version != KVMEM_LAB_TRACE_VERSION && h->checksum == lab_header_checksum(h))
		return kvmem_error(ESTALE, "%s: lab trace format version %u; this kvmem reads version %d",
				   t->path, h->version, KVMEM_LAB_TRACE_VERSION);
	if (h->version != KVMEM_LAB_TRACE_VERSION || h->header_bytes != LAB_HEADER_BYTES ||
	    h->checksum != lab_header_checksum(h))
		return bad(t, 0, "header checksum mismatch");
	if (!h->n_layers || h->n_layers > 1024 || !h->n_heads || h->n_heads > 1024 ||
	    !h->n_kv_heads || h->n_kv_heads > h->n_heads || !h->head_dim || h->head_dim > 1024 ||
	    !is_pow2_block(h->block))
		return bad(t, 0, "impossible geometry in the header");
	return 0;
}

/* Everything a SELECT record's payload holds, sized and pointed at. */
static int parse_select(struct lab_trace *t, uint64_t off, const uint8_t *p, uint32_t bytes,
			struct lab_sel *s)
{
	const struct lab_header *h = &t->h;
	uint64_t need, per_q = (uint64_t)h->n_layers * h->n_heads * h->head_dim * 4, nb;

	if (bytes < sizeof(s->h))
		return bad(t, off, "short selection record");
	memcpy(&s->h, p, sizeof(s->h));
	if (s->h.n_store > (1u << 20) || s->h.n_q > s->h.n_store || s->h.n_pins > (1u << 24) ||
	    s->h.n_sets > h->n_layers || (s->h.n_sets != 1 && s->h.n_sets != h->n_layers) ||
	    s->h.n_view > (1u << 30) || !is_pow2_block(s->h.block) || s->h.n_tokens < 0 ||
	    s->h.n_tokens > ((int64_t)1 << 40) || s->h.step < 0)
		return bad(t, off, "impossible counts in a selection record");
	need = sizeof(s->h) + 8ull * s->h.n_store + 16ull * s->h.n_pins + per_q * s->h.n_store +
	       4ull * s->h.n_sets * s->h.n_view + sizeof(struct lab_run) * (uint64_t)s->h.n_runs;
	if (need != bytes)
		return bad(t, off, "selection record of the wrong size");
	p += sizeof(s->h);
	s->q_pos = (const int64_t *)p;
	p += 8ull * s->h.n_store;
	s->pins = (const int64_t *)p;
	p += 16ull * s->h.n_pins;
	s->q = (const float *)p;
	p += per_q * s->h.n_store;
	s->blocks = (const uint32_t *)p;
	p += 4ull * s->h.n_sets * s->h.n_view;
	s->runs = (const struct lab_run *)p;
	nb = ((uint64_t)s->h.n_tokens + s->h.block - 1) / s->h.block;
	for (uint64_t i = 0; i < (uint64_t)s->h.n_sets * s->h.n_view; i++)
		if (s->blocks[i] >= nb)
			return bad(t, off, "a selected block past the history");
	for (uint32_t i = 0; i < s->h.n_pins; i++)
		if (s->pins[2 * i] < 0 || s->pins[2 * i + 1] <= s->pins[2 * i])
			return bad(t, off, "a bad pinned span");
	for (uint32_t i = 0; i < s->h.n_runs; i++)
		if (s->runs[i].tier >= KVMEM_LAB_TIERS || s->runs[i].why > KVMEM_LAB_OTHER ||
		    s->runs[i].layer >= h->n_layers || !s->runs[i].count)
			return bad(t, off, "a bad page-read run");
	return 0;
}

static int push_sel(struct lab_trace *t, int64_t *cap)
{
	if (t->n_sel < *cap)
		return 0;
	*cap = *cap ? 2 * *cap : 64;
	struct lab_sel *v = realloc(t->sel, (size_t)*cap * sizeof(*v));

	if (!v)
		return kvmem_error(ENOMEM, "%s: out of memory", t->path);
	t->sel = v;
	return 0;
}

static int push_other(struct lab_trace *t, const struct lab_run *runs, uint32_t n)
{
	const struct lab_run **o = realloc(t->other, (size_t)(t->n_reads_recs + 1) * sizeof(*o));
	uint32_t *c;

	if (!o)
		return kvmem_error(ENOMEM, "%s: out of memory", t->path);
	t->other = o;
	if (!(c = realloc(t->n_other, (size_t)(t->n_reads_recs + 1) * sizeof(*c))))
		return kvmem_error(ENOMEM, "%s: out of memory", t->path);
	t->n_other = c;
	t->other[t->n_reads_recs] = runs;
	t->n_other[t->n_reads_recs++] = n;
	return 0;
}

static int walk(struct lab_trace *t)
{
	const uint8_t *base = t->map;
	uint64_t off = LAB_HEADER_BYTES;
	int64_t cap = 0, spans = 0, runs = 0, reads = 0, max_tokens = 0;
	uint64_t qbytes = 0;
	struct lab_span needle = { 0 }, query = { 0 };
	int have_needle = 0, have_query = 0, ended = 0;

	while (off < t->len) {
		struct lab_record_head rh;
		const uint8_t *p;
		int rc = 0;

		if (ended)
			return bad(t, off, "bytes after the end record");
		if (t->len - off < sizeof(rh))
			return bad(t, off, "a record head cut short");
		memcpy(&rh, base + off, sizeof(rh));
		if (rh.bytes >= LAB_RECORD_MAX || t->len - off - sizeof(rh) < rh.bytes)
			return bad(t, off, "a record longer than the file");
		p = base + off + sizeof(rh);
		if (lab_record_checksum(rh.type, p, rh.bytes) != rh.checksum)
			return bad(t, off, "record checksum mismatch");
		switch (rh.type) {
		case LAB_REC_SELECT: {
			struct lab_sel *s;

			if ((rc = push_sel(t, &cap)))
				return rc;
			s = &t->sel[t->n_sel];
			memset(s, 0, sizeof(*s));
			if ((rc = parse_select(t, off, p, rh.bytes, s)))
				return rc;
			if (t->n_sel && (s->h.n_tokens < t->sel[t->n_sel - 1].h.n_tokens ||
					 s->h.step <= t->sel[t->n_sel - 1].h.step))
				return bad(t, off, "selections out of order");
			/* Annotations belong to the next selection the caller
			 * asked for, not to one a full tail forced. */
			if (!s->h.forced) {
				s->has_needle = have_needle, s->needle = needle;
				s->has_query = have_query, s->query = query;
				have_needle = have_query = 0;
			}
			for (uint32_t i = 0; i < s->h.n_runs; i++)
				reads += s->runs[i].count;
			runs += s->h.n_runs;
			qbytes += (uint64_t)t->h.n_layers * t->h.n_heads * t->h.head_dim * 4 * s->h.n_store;
			max_tokens = s->h.n_tokens > max_tokens ? s->h.n_tokens : max_tokens;
			t->n_sel++;
			break;
		}
		case LAB_REC_SPAN: {
			struct lab_span_head sh;
			struct lab_span sp;

			if (rh.bytes < sizeof(sh))
				return bad(t, off, "short span record");
			memcpy(&sh, p, sizeof(sh));
			if (sh.label_len > 255 || rh.bytes != sizeof(sh) + sh.label_len || sh.start < 0 ||
			    sh.end <= sh.start || (sh.kind != KVMEM_LAB_SPAN_NEEDLE && sh.kind != KVMEM_LAB_SPAN_QUERY))
				return bad(t, off, "a bad span record");
			sp = (struct lab_span){ .kind = (int)sh.kind, .start = sh.start, .end = sh.end,
						.label = (const char *)p + sizeof(sh),
						.label_len = (int)sh.label_len };
			if (sh.kind == KVMEM_LAB_SPAN_NEEDLE)
				needle = sp, have_needle = 1;
			else
				query = sp, have_query = 1;
			spans++;
			break;
		}
		case LAB_REC_READS: {
			uint32_t n;
			const struct lab_run *rr;

			if (rh.bytes < 8)
				return bad(t, off, "short page-read record");
			memcpy(&n, p, 4);
			if (rh.bytes != 8 + (uint64_t)n * sizeof(struct lab_run))
				return bad(t, off, "page-read record of the wrong size");
			rr = (const struct lab_run *)(p + 8);
			for (uint32_t i = 0; i < n; i++) {
				if (rr[i].tier >= KVMEM_LAB_TIERS || rr[i].why > KVMEM_LAB_OTHER ||
				    rr[i].layer >= t->h.n_layers || !rr[i].count)
					return bad(t, off, "a bad page-read run");
				reads += rr[i].count;
			}
			runs += n;
			if ((rc = push_other(t, rr, n)))
				return rc;
			break;
		}
		case LAB_REC_STATE:
			if (t->n_sel || t->has_state || rh.bytes < sizeof(t->state))
				return bad(t, off, "a misplaced or short state record");
			memcpy(&t->state, p, sizeof(t->state));
			if ((t->state.n_sets != 1 && t->state.n_sets != t->h.n_layers) ||
			    !is_pow2_block(t->state.block) || t->state.sel_tokens < 0 ||
			    t->state.sel_tokens > t->state.n_tokens || t->state.plan_tokens < 0 ||
			    t->state.view_tokens < 0 ||
			    rh.bytes != sizeof(t->state) + 4ull * t->state.n_sets * t->state.n_view)
				return bad(t, off, "a bad state record");
			t->state_blocks = (const uint32_t *)(p + sizeof(t->state));
			t->has_state = 1;
			break;
		case LAB_REC_END:
			if (rh.bytes != sizeof(t->end))
				return bad(t, off, "an end record of the wrong size");
			memcpy(&t->end, p, sizeof(t->end));
			if (t->end.steps != t->n_sel || t->end.spans != spans || t->end.runs != runs ||
			    t->end.reads != reads || t->end.bytes != off || t->end.query_bytes != qbytes ||
			    t->end.max_tokens != max_tokens)
				return bad(t, off, "the end record's counts differ from the records");
			ended = 1;
			break;
		default:
			return bad(t, off, "a record of unknown type");
		}
		{
			uint64_t pad = (8 - rh.bytes % 8) % 8, at = off + sizeof(rh) + rh.bytes;

			if (t->len - at < pad)
				return bad(t, at, "padding past the end of the file");
			for (uint64_t i = 0; i < pad; i++)
				if (base[at + i])
					return bad(t, at + i, "padding that is not zero");
			off = at + pad;
		}
	}
	if (!ended)
		return bad(t, off, "no end record (the recording did not finish)");
	return 0;
}

static void fill_info(struct lab_trace *t)
{
	const struct lab_header *h = &t->h;
	kvmem_lab_trace_info *i = &t->info;

	memset(i, 0, sizeof(*i));
	i->version = h->version;
	i->fingerprint = h->fingerprint;
	i->n_layers = (int)h->n_layers;
	i->n_heads = (int)h->n_heads;
	i->n_kv_heads = (int)h->n_kv_heads;
	i->head_dim = (int)h->head_dim;
	i->vocab = (int)h->vocab;
	i->window = (int)h->window;
	i->rope_theta = h->rope_theta;
	i->block = (int)h->block;
	i->chunk = (int)h->chunk;
	i->query_tokens = (int)h->query_tokens;
	i->budget = h->budget;
	i->sink = h->sink;
	i->recent = h->recent;
	i->reserve = h->reserve;
	i->seed = h->seed;
	memcpy(i->policy, h->policy, sizeof(i->policy));
	i->policy[sizeof(i->policy) - 1] = 0;
	memcpy(i->label, h->label, sizeof(i->label));
	i->label[sizeof(i->label) - 1] = 0;
	i->steps = t->n_sel;
	i->spans = t->end.spans;
	i->reads = t->end.reads;
	i->bytes = t->len;
	i->query_bytes = t->end.query_bytes;
	i->max_tokens = t->end.max_tokens;
}

int lab_trace_open(const char *path, struct lab_trace *t)
{
	struct stat st;
	int fd, rc;

	memset(t, 0, sizeof(*t));
	snprintf(t->path, sizeof(t->path), "%s", path);
	fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return kvmem_error(errno == ENOENT ? ENOENT : EIO, "%s: cannot open the trace: %s", path,
				   strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return kvmem_error(EBADMSG, "%s: not a regular file; a lab trace is one", path);
	}
	t->len = (size_t)st.st_size;
	if (t->len) {
		t->map = mmap(NULL, t->len, PROT_READ, MAP_PRIVATE, fd, 0);
		if (t->map == MAP_FAILED) {
			t->map = NULL;
			close(fd);
			return kvmem_error(EIO, "%s: cannot map the trace: %s", path, strerror(errno));
		}
	}
	close(fd);
	if ((rc = check_header(t)) || (rc = walk(t))) {
		lab_trace_close(t);
		return rc;
	}
	fill_info(t);
	return 0;
}

void lab_trace_close(struct lab_trace *t)
{
	if (t->map)
		munmap(t->map, t->len);
	free(t->sel);
	free(t->other);
	free(t->n_other);
	t->map = NULL;
	t->sel = NULL;
	t->other = NULL;
	t->n_other = NULL;
}

int kvmem_lab_trace_info_read(const char *path, kvmem_lab_trace_info *ti)
{
	struct lab_trace t;
	int rc = lab_trace_open(path, &t);

	if (rc)
		return rc;
	*ti = t.info;
	lab_trace_close(&t);
	return 0;
}
