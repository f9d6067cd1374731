// SPDX-License-Identifier: MIT
/* `kvmem run --trace FILE`: the session recorded for kvmem lab. */
#include <stdio.h>

#include "kvmem/kvmem.h"
#include "lab_record.h"

static kvmem_lab_recorder *g_rec;
static char g_path[4096];

int lab_record_start(const char *trace, const kvmem_model *m, kvmem_pager *pager,
		     kvmem_session_opts *so)
{
	kvmem_lab_record_opts ro = { .label = "kvmem run", .pager = pager };
	int rc;

	if (g_rec)
		return kvmem_error(EINVAL, "--trace %s: one recording per process", trace);
	if ((rc = kvmem_lab_record_open(trace, m, &ro, &g_rec)) < 0)
		return kvmem_error_prefix("--trace");
	if ((rc = kvmem_lab_record_attach(g_rec, so)) < 0) {
		kvmem_lab_record_close(g_rec);
		g_rec = NULL;
		return kvmem_error_prefix("--trace");
	}
	snprintf(g_path, sizeof(g_path), "%s", trace);
	return 0;
}

int lab_record_finish(FILE *f)
{
	int64_t steps;
	uint64_t bytes;
	int rc;

	if (!g_rec)
		return 0;
	steps = kvmem_lab_record_steps(g_rec);
	bytes = kvmem_lab_record_bytes(g_rec);
	rc = kvmem_lab_record_close(g_rec);
	g_rec = NULL;
	if (rc < 0)
		return kvmem_error_prefix("--trace %s", g_path);
	fprintf(f, "trace %s: %lld selections, %llu bytes (kvmem lab replay --trace %s ...)\n", g_path,
		(long long)steps, (unsigned long long)bytes, g_path);
	return 0;
}
