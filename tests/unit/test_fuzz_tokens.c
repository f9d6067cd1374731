// SPDX-License-Identifier: MIT
/* Replays the tokens fuzz target's seeds and crashes (tests/fuzz/). */
#include "../fuzz/fuzz_tokens.c"
#define FUZZ_TARGET "tokens"
#include "../fuzz/fuzz_replay.h"
