// SPDX-License-Identifier: MIT
/*
 * Fuzz target: a saved session state (kvmem_session_adopt_state). A small
 * random model's session appends 40 tokens once; each input is then
 * offered to a fresh session over the same pages: it must be refused
 * (-ESTALE) or restore a consistent session, never crash.
 */
#include <stdlib.h>

#include "backend/backend_impl.h"
#include "kvmem/kvmem.h"
#include "session/inspect.h"
#include "helpers/test_model.h"
#include "fuzz.h"

#define N 40

static kvmem_model *m;
static kvmem_backend *be;
static kvmem_page_source src;
static int32_t ids[N];

static kvmem_session *session(void)
{
	kvmem_session_opts o;

	kvmem_session_opts_default(&o);
	o.block = 16;
	o.budget = 32;
	o.chunk = 16;
	o.source = &src;
	return kvmem_session_create(be, &o);
}

static int setup(void)
{
	kvmem_config c = test_model_config(2, 32, 4, 2, 8, 48, 64, 0);
	kvmem_session *s;
	uint64_t r = 1;

	m = test_model_random(&c, 5);
	if (!m || !(be = kvmem_backend_cpu(m, 16)) ||
	    kvmem_page_source_mem(&src, c.n_layers, c.n_kv_heads, c.head_dim, 16))
		return -1;
	for (int i = 0; i < N; i++)
		ids[i] = (int32_t)(kvmem_rng_next(&r) % c.vocab);
	if (!(s = session()) || kvmem_session_append(s, ids, N, 0)) {
		kvmem_session_free(s);
		return -1;
	}
	kvmem_session_free(s);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int ready;
	kvmem_session *s;
	int32_t out[2];

	if (!ready && setup() == 0)
		ready = 1;
	if (ready != 1 || !(s = session()))
		return 0;
	if (kvmem_session_adopt_state(s, ids, N, data, size) == 0) {
		/* Restored: it must be usable. */
		if (kvmem_session_tokens(s) != N)
			__builtin_trap();
		kvmem_session_decode(s, 2, NULL, out);
	}
	kvmem_session_free(s);
	return 0;
}
