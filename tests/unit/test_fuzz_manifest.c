// SPDX-License-Identifier: MIT
/* Replays the manifest fuzz target's seeds and crashes (tests/fuzz/). */
#include "../fuzz/fuzz_manifest.c"
#define FUZZ_TARGET "manifest"
#include "../fuzz/fuzz_replay.h"
