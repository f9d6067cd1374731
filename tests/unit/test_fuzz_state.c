// SPDX-License-Identifier: MIT
/* Replays the state fuzz target's seeds and crashes (tests/fuzz/). */
#include "../fuzz/fuzz_state.c"
#define FUZZ_TARGET "state"
#include "../fuzz/fuzz_replay.h"
