# kvmem — top-level build.
#
#   make            library (static + shared) and build/kvmem
#   make demo       install missing Debian packages, build, run the demo
#   make test       install missing packages, build, run every test that needs
#                   no GPU: the plain build, then again under ASan + UBSan
#   make asan       the library, the CLI and the tests with ASan + UBSan
#   make static     build/static/kvmem linked statically (runs on other distros,
#                   e.g. the GPU machine, without carrying shared libraries)
#
# Sources are found by wildcard: a new .c file under user/ or kernels/cpu/
# joins the library, a new tools/kvmem/*.c joins the CLI, and a new
# tests/unit/test_*.c becomes the test program build/tests/test_*.

CC      ?= gcc
# BUILD names the plain build folder; the sanitizer build goes to $(BUILD)-asan.
# Several checkouts' work can share a tree with BUILD=build-<name>.
BUILD   ?= build
O       ?= $(BUILD)
SAN     ?=
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wmissing-prototypes
OPT     ?= -O2 -g
BLAS_INC := -I/usr/include/x86_64-linux-gnu/openblas-pthread
CFLAGS  += $(CSTD) $(WARN) $(OPT) -fopenmp -Iinclude -Iinclude/uapi -Iuser $(BLAS_INC) -MMD -MP
LDLIBS  += -lopenblas -luring -lnuma -lxxhash -lm -lpthread -fopenmp

ifeq ($(SAN),1)
O       := $(BUILD)-asan
OPT     := -O1 -g -fno-omit-frame-pointer
CFLAGS  += -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

LIB_SRC   := $(sort $(wildcard user/*/*.c kernels/cpu/*.c))
CLI_SRC   := $(sort $(wildcard tools/kvmem/*.c))
TEST_SRC  := $(sort $(wildcard tests/unit/test_*.c))
TEST_HELP := $(sort $(wildcard tests/unit/helpers/*.c))

LIB_OBJ   := $(LIB_SRC:%.c=$(O)/obj/%.o)
PIC_OBJ   := $(LIB_SRC:%.c=$(O)/pic/%.o)
CLI_OBJ   := $(CLI_SRC:%.c=$(O)/obj/%.o)
HELP_OBJ  := $(TEST_HELP:%.c=$(O)/obj/%.o)
TEST_BIN  := $(TEST_SRC:tests/unit/%.c=$(O)/tests/%)

.PHONY: all lib cli tests demo test asan static deps clean check-tests
all: lib cli

lib: $(O)/libkvmem.a $(O)/libkvmem.so
cli: $(O)/kvmem
tests: $(TEST_BIN)

$(O)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(O)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(O)/libkvmem.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(O)/libkvmem.so: $(PIC_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS) $(LDLIBS)

$(O)/kvmem: $(CLI_OBJ) $(O)/libkvmem.a
	$(CC) -o $@ $(CLI_OBJ) $(O)/libkvmem.a $(LDFLAGS) $(LDLIBS)

$(O)/tests/%: tests/unit/%.c $(HELP_OBJ) $(O)/libkvmem.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(HELP_OBJ) $(O)/libkvmem.a $(LDFLAGS) $(LDLIBS) -lcmocka

# Everything a fresh Debian 12 machine lacks, installed with apt-get.
deps:
	@tools/deps.sh

demo: deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/kvmem demo

# Plain build first, then the same tests under ASan + UBSan.
test: deps
	@$(MAKE) --no-print-directory all tests
	@$(MAKE) --no-print-directory SAN=1 all tests
	@tests/run.sh $(BUILD) $(BUILD)-asan

asan:
	@$(MAKE) --no-print-directory SAN=1 all tests

# A statically linked CLI for machines without our Debian packages.
static:
	@$(MAKE) --no-print-directory O=build/static-obj lib
	@mkdir -p build/static
	$(CC) -static -o build/static/kvmem $(CLI_SRC:%.c=build/static-obj/obj/%.o) \
	    build/static-obj/libkvmem.a $(LDFLAGS) \
	    /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.a \
	    -luring -lnuma -lxxhash -lgfortran -lquadmath -lm -lpthread -fopenmp
build/static-obj/obj/tools/%.o: tools/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
static: $(CLI_SRC:%.c=build/static-obj/obj/%.o)

clean:
	rm -rf $(BUILD) $(BUILD)-asan

-include $(shell find $(O) -name '*.d' 2>/dev/null)

# The demo's model is built into the binary (tools/kvmem/embedded_model.c).
EMBEDDED := $(wildcard models/agentlang/*.json models/agentlang/*.safetensors)
$(O)/obj/tools/kvmem/embedded_model.o build/static-obj/obj/tools/kvmem/embedded_model.o: $(EMBEDDED)
