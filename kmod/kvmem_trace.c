// SPDX-License-Identifier: GPL-2.0
/* The one place the tracepoints of kvmem_trace.h are instantiated. */
#define CREATE_TRACE_POINTS
#include "kvmem_trace.h"
