# kvmem — top-level build.
#
#   make            library (static + shared) and build/kvmem
#   make demo       install missing Debian packages, build, run the demo
#   make test       install missing packages, build, run every test that needs
#                   no GPU: the plain build, then again under ASan + UBSan, then
#                   the kernel module's suite in qemu (make vmtest)
#   make kmod       the kernel module, $(BUILD)/kmod/kvmem.ko (tests/vm/vm.mk)
#   make vmtest     the module's kselftest suite in qemu booting Debian's 6.1
#   make asan       the library, the CLI and the tests with ASan + UBSan
#   make static     build/static/kvmem linked statically (runs on other distros,
#                   e.g. the GPU machine, without carrying shared libraries)
#   make fuzz       libFuzzer over every parser of untrusted input, FUZZ_SECONDS
#                   each (tests/fuzz/fuzz.mk)
#   make install    headers, libkvmem.{a,so}, kvmem.pc and kvmem under
#                   $(DESTDIR)$(PREFIX) (PREFIX=/usr/local by default)
#
# Sources are found by wildcard: a new .c file under user/ or kernels/cpu/
# joins the library (user/agentlang/ is its own archive, for the CLI and the
# tests), a new tools/kvmem/*.c joins the CLI, and a new tests/unit/test_*.c
# becomes the test program build/tests/test_*.

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
CFLAGS  += $(CSTD) $(WARN) $(OPT) -fopenmp -I. -Iinclude -Iinclude/uapi $(BLAS_INC) -MMD -MP
# pcre2 and unistring: the tokenizer's pre-tokenizer regex and NFC (user/tokenizer/);
# jansson: every JSON file the library reads (user/util/json.h) and kvmem serve's API.
LDLIBS  += -lopenblas -luring -lnuma -lxxhash -lpcre2-8 -lunistring -ljansson -lm -lpthread -fopenmp
# The server (kvmem serve): HTTP, the CLI's alone.
SERVE_LIBS := -lmicrohttpd

ifeq ($(SAN),1)
O       := $(BUILD)-asan
OPT     := -O1 -g -fno-omit-frame-pointer
CFLAGS  += -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

VERSION   := $(shell sed -n 's/^\#define KVMEM_VERSION "\(.*\)"/\1/p' include/kvmem/kvmem.h)
SOMAJOR   := $(firstword $(subst ., ,$(VERSION)))
AL_SRC    := $(sort $(wildcard user/agentlang/*.c))
# The cuda backend (user/backend/cuda*.c) is C over the CUDA ops: it goes
# into libkvmem_cuda.a.
LIB_SRC   := $(filter-out $(AL_SRC) $(wildcard user/backend/cuda*.c),$(sort $(wildcard user/*/*.c kernels/cpu/*.c)))
CLI_SRC   := $(sort $(wildcard tools/kvmem/*.c tools/kvmem/*/*.c tools/serve/*.c))
TEST_SRC  := $(sort $(wildcard tests/unit/test_*.c))
TEST_HELP := $(sort $(wildcard tests/unit/helpers/*.c))

LIB_OBJ   := $(LIB_SRC:%.c=$(O)/obj/%.o)
AL_OBJ    := $(AL_SRC:%.c=$(O)/obj/%.o)
PIC_OBJ   := $(LIB_SRC:%.c=$(O)/pic/%.o)
CLI_OBJ   := $(CLI_SRC:%.c=$(O)/obj/%.o)
HELP_OBJ  := $(TEST_HELP:%.c=$(O)/obj/%.o)
TEST_BIN  := $(TEST_SRC:tests/unit/%.c=$(O)/tests/%)

.PHONY: all lib cli tests demo test asan static deps clean check-tests install uninstall
all: lib cli

lib: $(O)/libkvmem.a $(O)/libkvmem.so $(O)/libkvmem_agentlang.a
cli: $(O)/kvmem
tests: $(TEST_BIN)

# The public API is what include/kvmem/ declares and libkvmem.so exports
# (the headers push default visibility, everything else is hidden, and the
# version script user/libkvmem.map names each symbol). The in-tree programs
# (the CLI, its benchmarks, the tests) link the static archive and may also
# use the private headers under user/ (agentlang, the internal layers a
# benchmark measures).
$(LIB_OBJ) $(PIC_OBJ) $(AL_OBJ) $(HELP_OBJ) $(CLI_OBJ): CFLAGS += -Iuser
# The command's folders (cmd/, bench/) share the helpers at its top.
$(CLI_OBJ): CFLAGS += -Itools/kvmem
$(PIC_OBJ): CFLAGS += -fvisibility=hidden

$(O)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(O)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(O)/libkvmem.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(O)/libkvmem_agentlang.a: $(AL_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(O)/libkvmem.so.$(VERSION): $(PIC_OBJ) user/libkvmem.map
	$(CC) -shared -Wl,-soname,libkvmem.so.$(SOMAJOR) -Wl,--version-script=user/libkvmem.map \
	    -o $@ $(PIC_OBJ) $(LDFLAGS) $(LDLIBS)
$(O)/libkvmem.so: $(O)/libkvmem.so.$(VERSION)
	ln -sf libkvmem.so.$(VERSION) $(O)/libkvmem.so.$(SOMAJOR)
	ln -sf libkvmem.so.$(SOMAJOR) $@

$(O)/kvmem: $(CLI_OBJ) $(O)/libkvmem.a $(O)/libkvmem_agentlang.a
	$(CC) -o $@ $(CLI_OBJ) $(O)/libkvmem_agentlang.a $(O)/libkvmem.a $(CUDA_LINK) $(LDFLAGS) \
	    $(LDLIBS) $(SERVE_LIBS)

$(O)/tests/%: tests/unit/%.c $(HELP_OBJ) $(O)/libkvmem.a $(O)/libkvmem_agentlang.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iuser -Itests/unit -o $@ $< $(HELP_OBJ) $(O)/libkvmem_agentlang.a \
	    $(O)/libkvmem.a $(CUDA_LINK) $(LDFLAGS) $(LDLIBS) -lcmocka

# The fuzzing harness: make fuzz (its replays are unit tests: make test).
include tests/fuzz/fuzz.mk

# The CUDA ops and the GPU check program, when nvcc is found (else nothing).
include kernels/cuda/cuda.mk

# The kernel module and its VM suite: make kmod, make vmtest (tests/vm/vm.mk).
include tests/vm/vm.mk

# The eBPF tools: make bpf, and part of `make` when clang and bpftool are there.
include bpf/bpf.mk

# ---- install ------------------------------------------------------------------
PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
INCDIR  ?= $(PREFIX)/include
# Every header under include/kvmem/ is the API (the private ones live beside their code).
PUB_HDR := $(wildcard include/kvmem/*.h)

install: lib cli
	install -d $(DESTDIR)$(INCDIR)/kvmem $(DESTDIR)$(INCDIR)/linux \
	    $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(PUB_HDR) $(DESTDIR)$(INCDIR)/kvmem/
	install -m 644 include/uapi/linux/kvmem.h $(DESTDIR)$(INCDIR)/linux/
	install -m 644 $(O)/libkvmem.a $(DESTDIR)$(LIBDIR)/
	install -m 755 $(O)/libkvmem.so.$(VERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libkvmem.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libkvmem.so.$(SOMAJOR)
	ln -sf libkvmem.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libkvmem.so
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCDIR@|$(INCDIR)|g' \
	    -e 's|@VERSION@|$(VERSION)|g' user/kvmem.pc.in >$(DESTDIR)$(LIBDIR)/pkgconfig/kvmem.pc
	install -m 755 $(O)/kvmem $(DESTDIR)$(PREFIX)/bin/

uninstall:
	rm -rf $(DESTDIR)$(INCDIR)/kvmem
	rm -f $(DESTDIR)$(INCDIR)/linux/kvmem.h $(DESTDIR)$(LIBDIR)/libkvmem.a \
	    $(DESTDIR)$(LIBDIR)/libkvmem.so* $(DESTDIR)$(LIBDIR)/pkgconfig/kvmem.pc \
	    $(DESTDIR)$(PREFIX)/bin/kvmem

# Everything a fresh Debian 12 machine lacks, installed with apt-get.
deps:
	@tools/deps.sh

demo: deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/kvmem demo

# Plain build first, then the same tests under ASan + UBSan, then the kernel
# module's suite in a VM (both run; either failing fails the target).
test: deps
	@$(MAKE) --no-print-directory all tests
	@$(MAKE) --no-print-directory SAN=1 all tests
	@tests/run.sh $(BUILD) $(BUILD)-asan; rc=$$?; \
	    $(MAKE) --no-print-directory vmtest || rc=1; exit $$rc

asan:
	@$(MAKE) --no-print-directory SAN=1 all tests

# A statically linked CLI for machines without our Debian packages.
static:
	@$(MAKE) --no-print-directory O=build/static-obj lib
	@mkdir -p build/static
	$(CC) -static -o build/static/kvmem $(CLI_SRC:%.c=build/static-obj/obj/%.o) \
	    build/static-obj/libkvmem_agentlang.a build/static-obj/libkvmem.a $(LDFLAGS) \
	    /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.a \
	    -luring -lnuma -lxxhash -lpcre2-8 -lunistring -ljansson -lgfortran -lquadmath -lm \
	    -lpthread -fopenmp
# kvmem serve stays out of the static binary: Debian's libmicrohttpd pulls in
# GnuTLS, whose p11-kit has no static library (jansson, the JSON library, links
# statically: Debian ships libjansson.a).
build/static-obj/obj/tools/%.o: tools/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iuser -Itools/kvmem -DKVMEM_NO_SERVE -c $< -o $@
static: $(CLI_SRC:%.c=build/static-obj/obj/%.o)

clean:
	rm -rf $(BUILD) $(BUILD)-asan

# (not inside the debug kernel's source tree of make vmtest-debug, whose
# .d files are not ours)
-include $(shell find $(O) -path '$(O)/vm-debug' -prune -o -name '*.d' -print 2>/dev/null)

# The demo's model is built into the binary (tools/kvmem/embedded_model.c).
EMBEDDED := $(wildcard models/agentlang/*.json models/agentlang/*.safetensors)
$(O)/obj/tools/kvmem/embedded_model.o build/static-obj/obj/tools/kvmem/embedded_model.o: $(EMBEDDED)
