/* SPDX-License-Identifier: MIT */
/* What the tests and the in-tree tools look at inside a session beyond the
 * public API (kvmem/session.h): its host view and its block registry. */
#ifndef KVMEM_SESSION_INSPECT_H
#define KVMEM_SESSION_INSPECT_H

#include "backend/backend_impl.h"
#include "engine/engine.h"
#include "select/select.h"

/* The execution view (selected history then the tail) as host fp32, when
 * the backend keeps it so (cpu); NULL otherwise. */
const kvmem_kvcache *kvmem_session_view(const kvmem_session *s);
const kvmem_blocks *kvmem_session_blocks(const kvmem_session *s);
/* kvmem_session_select_ahead with pol scoring instead of the session's
 * policy (bench recall's --query-view): a global policy when the session's
 * is, needing no summary the session's index lacks (-EINVAL otherwise). */
int kvmem_session_select_ahead_with(kvmem_session *s, const kvmem_policy_ops *pol,
				    const int32_t *tokens, int n);

#endif
