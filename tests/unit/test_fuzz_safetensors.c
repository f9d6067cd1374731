// SPDX-License-Identifier: MIT
/* Replays the safetensors fuzz target's seeds and crashes (tests/fuzz/). */
#include "../fuzz/fuzz_safetensors.c"
#define FUZZ_TARGET "safetensors"
#include "../fuzz/fuzz_replay.h"
