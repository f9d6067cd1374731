// SPDX-License-Identifier: MIT
/*
 * The view layouts of kvmem lab (include/kvmem/lab.h, Documentation/lab.md
 * "View layouts") on steps shaped like `kvmem bench step`'s on the H200:
 * a 256K-token workspace, a 64K view (sink budget/100, recent budget/12),
 * blocks of 32, a 32-token question appended before each step; new
 * subjects swap NEW of the view's scored blocks for others, follow-ups
 * FOLLOW (the bench's follow-ups brought in 380 of ~2000). Which blocks
 * swap is uniform at random: the bench's random weights and tokens give
 * no structure either. Prints, per layout, the share of the view's
 * token-layers moved and entered, over the follow-ups and the new
 * subjects apart (the first step, laid out from the tail, left out).
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Iinclude/uapi -Iuser \
 *      tools/bench/layout_synth.c build/libkvmem.a -lopenblas -luring -lnuma -lxxhash \
 *      -lpcre2-8 -lunistring -ljansson -lm -lpthread -fopenmp -o /tmp/layout_synth
 *   /tmp/layout_synth [FOLLOW [NEW [STEPS]]]     (default 380 1400 16)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/lab.h"

#define BLOCK 32
#define LAYERS 36
#define TOKENS 262144
#define BUDGET 65536
#define QUESTION 32

static uint64_t rng;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Mark `want` more blocks of [lo, hi) in the view (in), at random. */
static void take(uint8_t *in, int64_t lo, int64_t hi, int64_t want)
{
	while (want > 0) {
		int64_t b = lo + (int64_t)(next() % (uint64_t)(hi - lo));

		if (!in[b]) {
			in[b] = 1;
			want--;
		}
	}
}

/* Unmark `n` blocks of [lo, hi) that are in the view, at random. */
static void drop(uint8_t *in, int64_t lo, int64_t hi, int64_t n)
{
	while (n > 0) {
		int64_t b = lo + (int64_t)(next() % (uint64_t)(hi - lo));

		if (in[b]) {
			in[b] = 0;
			n--;
		}
	}
}

/*
 * The plan of step st over n tokens into v: the sink's blocks, the recent
 * ones (as the planner takes them), and the scored blocks in `in`, swapped
 * as the step's kind says. Returns the plan's block count.
 */
static int plan(uint8_t *in, int64_t *v, int64_t n, int st, int follow, int fresh)
{
	const int64_t nb = (n + BLOCK - 1) / BLOCK, sink_b = (BUDGET / 100 + BLOCK - 1) / BLOCK;
	const int64_t first_recent = (n - BUDGET / 12) / BLOCK;
	const int64_t room = (BUDGET - sink_b * BLOCK - (n - first_recent * BLOCK)) / BLOCK;
	int64_t have = 0;
	int nv = 0;

	for (int64_t b = sink_b; b < first_recent; b++)
		have += in[b];
	if (st == 0) {
		take(in, sink_b, first_recent, room);
	} else {
		int swap = st % 2 ? follow : fresh;

		if (have > room)	/* the recent blocks grew into the room */
			drop(in, sink_b, first_recent, have - room), have = room;
		drop(in, sink_b, first_recent, swap);
		take(in, sink_b, first_recent, room - have + swap);
	}
	for (int64_t b = 0; b < nb; b++)
		if (b < sink_b || b >= first_recent || in[b])
			v[nv++] = b;
	return nv;
}

static int run(const char *name, int follow, int fresh, int steps)
{
	kvmem_lab_layout lay;
	kvmem_lab_layout_sim *s;
	uint8_t *in = calloc(TOKENS / BLOCK + 1024, 1);
	int64_t *v = malloc((TOKENS / BLOCK + 1024) * sizeof(int64_t)), n = TOKENS;
	double mv[2] = { 0 }, en[2] = { 0 };
	int cnt[2] = { 0 };

	rng = 88172645463325252ull;	/* every layout sees the same plans */
	if (!in || !v || kvmem_lab_layout_parse(name, &lay) ||
	    kvmem_lab_layout_open(&lay, BLOCK, BUDGET, BUDGET / 12, LAYERS, &s))
		return fprintf(stderr, "layout_synth: %s\n", kvmem_last_error()), 1;
	for (int st = 0; st < steps; st++, n += QUESTION) {
		kvmem_lab_layout_count c;
		int nv = plan(in, v, n, st, follow, fresh), kind = st % 2;

		if (kvmem_lab_layout_step(s, v, 1, nv, n, &c))
			return fprintf(stderr, "layout_synth: %s\n", kvmem_last_error()), 1;
		if (st == 0)
			continue;
		mv[kind] += (double)c.moved / c.view;
		en[kind] += (double)c.entered / c.view;
		cnt[kind]++;
	}
	printf("| %s | %.3f | %.3f | %.2f | %.3f | %.3f |\n", name, mv[1] / cnt[1], en[1] / cnt[1],
	       mv[1] / en[1], mv[0] / cnt[0], en[0] / cnt[0]);
	kvmem_lab_layout_close(s);
	free(in);
	free(v);
	return 0;
}

int main(int argc, char **argv)
{
	static const char *const layouts[] = { "compact", "stable", "gaps:1.25", "gaps:1.5",
					       "gaps:2" };
	int follow = argc > 1 ? atoi(argv[1]) : 380, fresh = argc > 2 ? atoi(argv[2]) : 1400;
	int steps = argc > 3 ? atoi(argv[3]) : 16;

	if (follow < 0 || fresh < 0 || steps < 3 || follow > 1800 || fresh > 1800)
		return fprintf(stderr, "usage: layout_synth [FOLLOW [NEW [STEPS]]]: swaps up to "
			       "1800, at least 3 steps\n"), 2;
	printf("| layout | follow-up moved / view | entered / view | moved / entered | "
	       "new subject moved / view | entered / view |\n| --- | --- | --- | --- | --- | --- |\n");
	for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++)
		if (run(layouts[i], follow, fresh, steps))
			return 1;
	return 0;
}
