// SPDX-License-Identifier: GPL-2.0
/*
 * A BPF program on the writable tracepoint kvmem_reclaim changes which page
 * reclaim evicts (seen in the page table), and a bad verdict falls back to
 * the module's own choice. The program is tests/vm/victim.bpf.c, compiled
 * with clang -target bpf and loaded here with libbpf.
 */
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "kselftest_harness.h"
#include "vmtest.h"

#define VICTIM_OBJ "/tests/kvmem-victim.bpf.o"

FIXTURE(bpf) {
	struct bpf_object *obj;
	struct bpf_link *link;
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
	self->cfg_fd = bpf_map__fd(bpf_object__find_map_by_name(self->obj, "kvmem_victim_cfg"));
	ASSERT_LE(0, self->cfg_fd);
}

FIXTURE_TEARDOWN(bpf)
{
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
