// SPDX-License-Identifier: GPL-2.0
/*
 * A BPF program on the writable tracepoint kvmem_reclaim changes which page
 * reclaim evicts (seen in the page table), a bad verdict falls back to the
 * module's own choice, and the program sees the step; one on
 * kvmem_prefetch_hook adds pages to fills and prefetch lists. The programs
 * are tests/vm/victim.bpf.c, compiled with clang -target bpf and loaded here
 * with libbpf.
 */
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "kselftest_harness.h"
#include "vmtest.h"

#define VICTIM_OBJ "/tests/kvmem-victim.bpf.o"

FIXTURE(bpf) {
	struct bpf_object *obj;
	struct bpf_link *link, *hook;
	int cfg_fd;
	struct vt_ws w;
};

FIXTURE_SETUP(bpf)
{
	struct bpf_program *prog;

	ASSERT_EQ(0, vt_ws_open(&self->w, VT_WS_SMALL));
	self->obj = bpf_object__open_file(VICTIM_OBJ, NULL);
	ASSERT_NE(NULL, self->obj);
	ASSERT_EQ(0, bpf_object__load(self->obj));
	prog = bpf_object__find_program_by_name(self->obj, "kvmem_victim");
	ASSERT_NE(NULL, prog);
	self->link = bpf_program__attach(prog);
	ASSERT_NE(NULL, self->link) TH_LOG("attach raw_tp.w/kvmem_reclaim: %s", strerror(errno));
	prog = bpf_object__find_program_by_name(self->obj, "kvmem_readahead");
	ASSERT_NE(NULL, prog);
	self->hook = bpf_program__attach(prog);
	ASSERT_NE(NULL, self->hook) TH_LOG("attach raw_tp.w/kvmem_prefetch_hook: %s",
					   strerror(errno));
	self->cfg_fd = bpf_map__fd(bpf_object__find_map_by_name(self->obj, "kvmem_victim_cfg"));
	ASSERT_LE(0, self->cfg_fd);
}

FIXTURE_TEARDOWN(bpf)
{
	bpf_link__destroy(self->hook);
	bpf_link__destroy(self->link);
	bpf_object__close(self->obj);
	vt_ws_close(&self->w);
}

static uint64_t cfg_get(int fd, uint32_t k)
{
	uint64_t v = ~0ull;

	bpf_map_lookup_elem(fd, &k, &v);
	return v;
}

static void cfg_set(int fd, uint32_t k, uint64_t v)
{
	bpf_map_update_elem(fd, &k, &v, BPF_ANY);
}

/* Window of 4 pages holding pages 0..3; touching page 4 evicts one. Returns
 * the evicted page (-1 if not exactly one left) and the counters. */
static int64_t one_eviction(struct vt_ws *w, struct kvmem_ioc_stats *st)
{
	kvmem_kmod *k = vt_kmod(w, 4);
	int64_t gone = -1;
	int absent = 0;
	unsigned char b;

	if (!k)
		return -2;
	for (uint64_t p = 0; p < 5; p++)
		if (vt_read(kvmem_kmod_page_addr(k, p), &b, 1))
			return -3;
	for (uint64_t p = 0; p < 4; p++) {
		if (!kvmem_kmod_resident(k, p)) {
			gone = p;
			absent++;
		}
	}
	*st = vt_stats(k);
	kvmem_kmod_close(k);
	return absent == 1 ? gone : -1;
}

TEST_F(bpf, victim_program_changes_which_page_leaves)
{
	struct kvmem_ioc_stats st;

	/* Attached but silent: the module's clock evicts candidate 0. */
	cfg_set(self->cfg_fd, 0, 0);
	ASSERT_EQ(0, one_eviction(&self->w, &st));
	ASSERT_EQ(1, cfg_get(self->cfg_fd, 1));
	ASSERT_EQ(4, cfg_get(self->cfg_fd, 2));	/* every resident page a candidate */
	ASSERT_EQ(0, st.verdicts);
	/* The program picks the newest page instead. */
	cfg_set(self->cfg_fd, 0, 1);
	ASSERT_EQ(3, one_eviction(&self->w, &st));
	ASSERT_EQ(2, cfg_get(self->cfg_fd, 1));
	ASSERT_EQ(1, st.verdicts);
	ASSERT_EQ(0, st.bad_verdicts);
}

TEST_F(bpf, bad_verdict_falls_back)
{
	struct kvmem_ioc_stats st;

	cfg_set(self->cfg_fd, 0, 2);
	ASSERT_EQ(0, one_eviction(&self->w, &st));
	ASSERT_EQ(1, st.bad_verdicts);
	ASSERT_EQ(0, st.verdicts);
	ASSERT_EQ(1, st.evictions);
}

/* The victim hook is told the workspace's step (KVMEM_IOC_STEP). */
TEST_F(bpf, victim_hook_sees_the_step)
{
	struct kvmem_ioc_stats st;
	kvmem_kmod *k;
	unsigned char b;

	cfg_set(self->cfg_fd, 0, 0);
	k = vt_kmod(&self->w, 4);
	ASSERT_NE(NULL, k);
	ASSERT_EQ(0, kvmem_kmod_step(k, 77));
	for (uint64_t p = 0; p < 5; p++)
		ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, p), &b, 1));
	st = vt_stats(k);
	ASSERT_EQ(1, st.evictions);
	ASSERT_EQ(77, cfg_get(self->cfg_fd, 3));
	kvmem_kmod_close(k);
}

static int wait_resident(kvmem_kmod *k, uint64_t p)
{
	for (int i = 0; i < 400 && !kvmem_kmod_resident(k, p); i++)
		usleep(5000);
	return kvmem_kmod_resident(k, p);
}

/* The step's selection (HINT) reaches the victim hook: candidates it names
 * come last, runners-up before selected pages, each with its hint; the
 * hints end when the step moves on; a HINT's prefetch passes the prefetch
 * hook with reason HINT. */
TEST_F(bpf, victim_hook_sees_the_hints)
{
	uint64_t hint[2] = { 1, 2 }, more[2] = { 8, 9 };
	kvmem_kmod *k;
	unsigned char b;

	cfg_set(self->cfg_fd, 0, 0);
	cfg_set(self->cfg_fd, 4, 0);
	k = vt_kmod(&self->w, 4);
	ASSERT_NE(NULL, k);
	for (uint64_t p = 0; p < 4; p++)
		ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, p), &b, 1));
	ASSERT_EQ(0, kvmem_kmod_hint(k, 3, hint, 2, 1, 0));	/* 1 selected, 2 runner-up */
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, 4), &b, 1));
	ASSERT_EQ(1, cfg_get(self->cfg_fd, 1));
	ASSERT_EQ(4, cfg_get(self->cfg_fd, 2));
	ASSERT_EQ(3, cfg_get(self->cfg_fd, 3));	/* the hint's step is the step */
	/* Clock order 0 1 2 3, hinted ones last: 0 3 2 1. */
	ASSERT_EQ(0x1230, cfg_get(self->cfg_fd, 9));
	ASSERT_EQ(KVMEM_HINTED_RUNNER_UP << 8 | KVMEM_HINTED_SELECTED << 12,
		  cfg_get(self->cfg_fd, 8));
	ASSERT_FALSE(kvmem_kmod_resident(k, 0));
	/* The next step: no hint counts any more. The scan passes page 4
	 * (just filled: its second chance) and comes round to pages 1-3
	 * again: each page is a candidate once. */
	ASSERT_EQ(0, kvmem_kmod_step(k, 4));
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, 5), &b, 1));
	ASSERT_EQ(2, cfg_get(self->cfg_fd, 1));
	ASSERT_EQ(0, cfg_get(self->cfg_fd, 8));
	ASSERT_EQ(4, cfg_get(self->cfg_fd, 2));
	ASSERT_EQ(0x4321, cfg_get(self->cfg_fd, 9));
	/* A HINT that prefetches: the hook is told why. */
	ASSERT_EQ(0, kvmem_kmod_hint(k, 5, more, 2, 2, KVMEM_KMOD_HINT_PREFETCH));
	ASSERT_TRUE(wait_resident(k, 8));
	ASSERT_TRUE(wait_resident(k, 9));
	ASSERT_EQ(KVMEM_PREFETCH_HINT, cfg_get(self->cfg_fd, 7));
	ASSERT_EQ(5, cfg_get(self->cfg_fd, 6));
	kvmem_kmod_close(k);
}

/* A program on the prefetch hook adds pages to a fault's fill and to a
 * PREFETCH list; ids past the end and too long a list are refused and
 * counted; it sees the step and why it was called. */
TEST_F(bpf, prefetch_hook_adds_pages)
{
	uint64_t list = 20;
	kvmem_kmod *k;
	unsigned char b;

	k = vt_kmod(&self->w, 32);
	ASSERT_NE(NULL, k);
	ASSERT_EQ(0, kvmem_kmod_step(k, 5));
	cfg_set(self->cfg_fd, 4, 1);
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, 10), &b, 1));
	ASSERT_EQ(KVMEM_PREFETCH_FAULT, cfg_get(self->cfg_fd, 7));
	ASSERT_EQ(5, cfg_get(self->cfg_fd, 6));
	ASSERT_TRUE(wait_resident(k, 11));
	ASSERT_TRUE(wait_resident(k, 12));
	ASSERT_FALSE(kvmem_kmod_resident(k, 13));
	ASSERT_EQ(0, kvmem_kmod_prefetch(k, &list, 1, 1));
	ASSERT_EQ(KVMEM_PREFETCH_LIST, cfg_get(self->cfg_fd, 7));
	ASSERT_TRUE(kvmem_kmod_resident(k, 21));
	ASSERT_TRUE(kvmem_kmod_resident(k, 22));
	ASSERT_EQ(4, vt_stats(k).prefetch_adds);
	ASSERT_EQ(0, vt_stats(k).bad_prefetch_adds);
	/* One past the end (refused), one good. */
	cfg_set(self->cfg_fd, 4, 2);
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, 30), &b, 1));
	ASSERT_TRUE(wait_resident(k, 31));
	ASSERT_EQ(5, vt_stats(k).prefetch_adds);
	ASSERT_EQ(1, vt_stats(k).bad_prefetch_adds);
	/* Too many: all refused. */
	cfg_set(self->cfg_fd, 4, 3);
	ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, 40), &b, 1));
	usleep(100000);
	ASSERT_FALSE(kvmem_kmod_resident(k, 41));
	ASSERT_EQ(5, vt_stats(k).prefetch_adds);
	ASSERT_EQ(1 + KVMEM_PREFETCH_ADD_MAX, vt_stats(k).bad_prefetch_adds);
	cfg_set(self->cfg_fd, 4, 0);
	kvmem_kmod_close(k);
}

/* Many evictions with the program steering: the window never holds more
 * than its cap and every page still reads right. */
TEST_F(bpf, steered_reclaim_stays_correct)
{
	kvmem_kmod *k;
	unsigned char *buf = malloc(self->w.page_stride);

	cfg_set(self->cfg_fd, 0, 1);
	k = vt_kmod(&self->w, 6);
	ASSERT_NE(NULL, k);
	for (int round = 0; round < 3; round++) {
		for (uint64_t p = 0; p < self->w.pages; p++) {
			ASSERT_EQ(0, vt_read(kvmem_kmod_page_addr(k, p), buf, self->w.page_stride));
			ASSERT_EQ(0, memcmp(buf, self->w.ref + p * self->w.page_stride,
					    self->w.page_stride));
		}
	}
	ASSERT_LE(vt_stats(k).resident, 6);
	ASSERT_GT(vt_stats(k).verdicts, self->w.pages);
	kvmem_kmod_close(k);
	free(buf);
}

TEST_HARNESS_MAIN
