// SPDX-License-Identifier: MIT
/* `kvmem run --trace FILE`: the session recorded for kvmem lab. */
#include <stdio.h>

#include "kvmem/kvmem.h"
#include "lab_record.h"

int lab_record_start(struct lab_record *lr, const char *trace, const kvmem_model *m,
		     kvmem_pager *pager, kvmem_session_opts *so)
{
	kvmem_lab_record_opts ro = { .label = "kvmem run", .pager = pager };

	if (lr->rec)
		return kvmem_error(EINVAL, "--trace %s: a recording is open already", trace);
	if (kvmem_lab_record_open(trace, m, &ro, &lr->rec) < 0)
		return kvmem_error_prefix("--trace");
	if (kvmem_lab_record_attach(lr->rec, so) < 0) {
		kvmem_lab_record_close(lr->rec);
		lr->rec = NULL;
		return kvmem_error_prefix("--trace");
	}
	snprintf(lr->path, sizeof(lr->path), "%s", trace);
	return 0;
}

int lab_record_finish(struct lab_record *lr, FILE *f)
{
	int64_t steps;
	uint64_t bytes;
	int rc;

	if (!lr->rec)
		return 0;
	steps = kvmem_lab_record_steps(lr->rec);
	bytes = kvmem_lab_record_bytes(lr->rec);
	rc = kvmem_lab_record_close(lr->rec);
	lr->rec = NULL;
	if (rc < 0)
		return kvmem_error_prefix("--trace %s", lr->path);
	fprintf(f, "trace %s: %lld selections, %llu bytes (kvmem lab replay --trace %s ...)\n",
		lr->path, (long long)steps, (unsigned long long)bytes, lr->path);
	return 0;
}
