/* SPDX-License-Identifier: MIT */
/* Every forward pass's last logits, in order: a session's on_forward
 * callback (arg: a struct test_logits with vocab set, the rest zero), so
 * that two runs can be compared bit for bit. free(buf) when done. */
#ifndef KVMEM_TEST_LOGITS_H
#define KVMEM_TEST_LOGITS_H

#include <stddef.h>
#include <stdint.h>

struct test_logits {
	float *buf;
	size_t n, cap;	/* floats held, floats allocated */
	int vocab;
};

void test_logits_record(void *arg, const int32_t *tok, int n, const float *logits);

#endif
