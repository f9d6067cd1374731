// SPDX-License-Identifier: MIT
/* Replays the tokenizer fuzz target's seeds and crashes (tests/fuzz/). */
#include "../fuzz/fuzz_tokenizer.c"
#define FUZZ_TARGET "tokenizer"
#include "../fuzz/fuzz_replay.h"
