/* SPDX-License-Identifier: MIT */
/*
 * `kvmem run --script ... --trace FILE`: the agent session recorded for
 * kvmem lab (kvmem/lab.h).
 */
#ifndef KVMEM_TOOLS_LAB_RECORD_H
#define KVMEM_TOOLS_LAB_RECORD_H

#include <stdio.h>

#include "kvmem/lab.h"

/* A recording in progress; zeroed: none. */
struct lab_record {
	kvmem_lab_recorder *rec;
	char path[4096];
};

/* Create the trace and hook the session options (before the session is
 * created); pager: the workspace's, for page tiers, or NULL. */
int lab_record_start(struct lab_record *lr, const char *trace, const kvmem_model *m,
		     kvmem_pager *pager, kvmem_session_opts *so);
/* After the session is gone: close the trace, print a line about it to f.
 * Negative when the trace could not be completed (nothing open: 0). */
int lab_record_finish(struct lab_record *lr, FILE *f);

#endif
