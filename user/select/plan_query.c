// SPDX-License-Identifier: MIT
/* Questions about a plan that its callers (benchmarks, the demo) ask. */
#include "select/select.h"

double kvmem_plan_holds_span(const kvmem_plan *p, int block, int64_t start, int64_t end)
{
	int held = 0;

	for (int s = 0; s < p->n_sets; s++) {
		int all = 1;

		for (int64_t b = start / block; b <= (end - 1) / block && all; b++) {
			int found = 0;

			for (int i = 0; i < p->n_view && !found; i++)
				found = p->blocks[(size_t)s * p->n_view + i] == b;
			all = found;
		}
		held += all;
	}
	return p->n_sets ? (double)held / p->n_sets : 0;
}
