// SPDX-License-Identifier: MIT
/* Replays the script fuzz target's seeds and crashes (tests/fuzz/). */
#include "../fuzz/fuzz_script.c"
#define FUZZ_TARGET "script"
#include "../fuzz/fuzz_replay.h"
