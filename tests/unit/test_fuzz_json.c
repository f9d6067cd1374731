// SPDX-License-Identifier: MIT
/* Replays the json fuzz target's seeds and crashes (tests/fuzz/). */
#include "../fuzz/fuzz_json.c"
#define FUZZ_TARGET "json"
#include "../fuzz/fuzz_replay.h"
