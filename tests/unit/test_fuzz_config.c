// SPDX-License-Identifier: MIT
/* Replays the config fuzz target's seeds and crashes (tests/fuzz/). */
#include "../fuzz/fuzz_config.c"
#define FUZZ_TARGET "config"
#include "../fuzz/fuzz_replay.h"
