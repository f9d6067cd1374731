# tests/fuzz/fuzz.mk: the fuzzing harness (included from the Makefile).
#
#   make fuzz                 every target for FUZZ_SECONDS (default 60) each
#   make fuzz FUZZ=config     one target
#
# The library is built again with clang, with libFuzzer's coverage, ASan and
# UBSan, into $(BUILD)-fuzz/; each target (tests/fuzz/fuzz_<t>.c) runs from
# the committed seeds in tests/fuzz/corpus/<t>/ (read only: what it finds
# new goes to $(BUILD)-fuzz/corpus/<t>/). An input that crashes is written
# to tests/fuzz/crashes/<t>/: commit it with its fix, and make test replays
# it from then on (tests/unit/test_fuzz_<t>.c). Needs clang, libclang-rt-dev
# and libomp-dev (tools/deps.sh installs them).

FUZZ_TARGETS := config safetensors script tokens manifest state json tokenizer
FUZZ         ?= $(FUZZ_TARGETS)
FUZZ_SECONDS ?= 60
FUZZ_DIR     := $(BUILD)-fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

.PHONY: fuzz fuzz-build
fuzz-build: deps
	@$(MAKE) --no-print-directory O=$(FUZZ_DIR) CC=clang \
	    OPT="-O1 -g -fsanitize=fuzzer-no-link $(FUZZ_SAN)" \
	    $(FUZZ_DIR)/libkvmem.a $(FUZZ_DIR)/obj/tests/unit/helpers/test_model.o
	@for t in $(FUZZ); do \
	    echo "fuzz: building $$t"; \
	    clang $(CSTD) -O1 -g -fsanitize=fuzzer $(FUZZ_SAN) -fopenmp -I. -Iinclude -Iinclude/uapi \
	        -Iuser -Itests/unit $(BLAS_INC) tests/fuzz/fuzz_$$t.c \
	        $(FUZZ_DIR)/obj/tests/unit/helpers/test_model.o $(FUZZ_DIR)/libkvmem.a \
	        $(LDLIBS) -o $(FUZZ_DIR)/fuzz_$$t || exit 1; \
	done

fuzz: fuzz-build
	@for t in $(FUZZ); do \
	    mkdir -p $(FUZZ_DIR)/corpus/$$t tests/fuzz/crashes/$$t; \
	    echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	    $(FUZZ_DIR)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=2048 \
	        -artifact_prefix=tests/fuzz/crashes/$$t/ -print_final_stats=1 \
	        $(FUZZ_DIR)/corpus/$$t tests/fuzz/corpus/$$t 2>$(FUZZ_DIR)/fuzz_$$t.log; \
	    rc=$$?; grep -E '^stat::number_of_executed_units|^Done|SUMMARY' $(FUZZ_DIR)/fuzz_$$t.log; \
	    [ $$rc -eq 0 ] || { tail -n 30 $(FUZZ_DIR)/fuzz_$$t.log; echo "fuzz: $$t FOUND A CRASH (tests/fuzz/crashes/$$t/)"; exit 1; }; \
	done; echo "fuzz: every target ran clean"
