# bpf/bpf.mk — the eBPF tools, included from the top-level Makefile.
#
#   make bpf        $(O)/bpf/kvmemtop, kvmemsnoop, kvmemlat, kvmempolicy and
#                   the example policies $(O)/bpf/policies/*.bpf.o
#
# `make` (all) builds them too when clang, bpftool, libbpf's headers and the
# kernel's BTF are there (tools/deps.sh installs the packages), except in the
# sanitizer build.
# vmlinux.h is generated from the BTF of the kernel the tools will run on:
# VMLINUX_BTF=/sys/kernel/btf/vmlinux by default; for the module's VM give
# the Debian kernel's BTF (see Documentation/observability.md). Never
# committed. Each tool is x.bpf.c (BPF, CO-RE) + x.c (userspace) + x.h
# (what both share), with a skeleton x.skel.h from `bpftool gen skeleton`.

BPF_TOOLS    := kvmemtop kvmemsnoop kvmemlat kvmempolicy
BPF_POLICIES := $(patsubst bpf/policies/%.bpf.c,%,$(wildcard bpf/policies/*.bpf.c))
BPF_OUT      := $(O)/bpf
CLANG        ?= clang
LLVM_STRIP   ?= llvm-strip
BPFTOOL      ?= $(firstword $(shell command -v bpftool 2>/dev/null) $(wildcard /usr/sbin/bpftool))
VMLINUX_BTF  ?= /sys/kernel/btf/vmlinux
BPF_ARCH     := $(shell uname -m | sed 's/x86_64/x86/; s/aarch64/arm64/')
# usdt.bpf.h includes <linux/errno.h>, which wants the multiarch asm/ dir.
BPF_CFLAGS   := -g -O2 -target bpf -D__TARGET_ARCH_$(BPF_ARCH) -Wall -Wno-unused-function \
		-I$(BPF_OUT) -Ibpf -idirafter /usr/include/$(shell $(CC) -dumpmachine)
BPF_USER_CFLAGS := $(CSTD) $(WARN) $(OPT) -I$(BPF_OUT) -Ibpf -Iinclude/uapi -MMD -MP
BPF_LDLIBS   := -lbpf -lelf -lz

# Built by `make` only where they can be: clang, bpftool, libbpf's USDT
# header and the kernel's BTF (`make bpf` tries anyway and says what fails).
BPF_HAVE := $(and $(shell command -v $(CLANG) 2>/dev/null),$(BPFTOOL),$(wildcard /usr/include/bpf/usdt.bpf.h),$(wildcard $(VMLINUX_BTF)))

.PHONY: bpf
bpf: $(BPF_TOOLS:%=$(BPF_OUT)/%) $(BPF_POLICIES:%=$(BPF_OUT)/policies/%.bpf.o)

ifneq ($(BPF_HAVE),)
ifneq ($(SAN),1)
all: bpf
endif
endif

# Keep the intermediates (objects and skeletons) for the next build.
.SECONDARY: $(BPF_TOOLS:%=$(BPF_OUT)/%.bpf.o) $(BPF_TOOLS:%=$(BPF_OUT)/%.skel.h) \
	    $(BPF_TOOLS:%=$(BPF_OUT)/%.o)

$(BPF_OUT)/vmlinux.h:
	@mkdir -p $(dir $@)
	$(BPFTOOL) btf dump file $(VMLINUX_BTF) format c > $@.tmp && mv $@.tmp $@

# BPF objects (clang writes their dependencies like the C objects').
$(BPF_OUT)/%.bpf.o: bpf/%.bpf.c $(BPF_OUT)/vmlinux.h
	@mkdir -p $(dir $@)
	$(CLANG) $(BPF_CFLAGS) -MMD -MP -c $< -o $@
	$(LLVM_STRIP) -g $@

$(BPF_OUT)/%.skel.h: $(BPF_OUT)/%.bpf.o
	$(BPFTOOL) gen skeleton $< name $(subst -,_,$*)_bpf > $@.tmp && mv $@.tmp $@

$(BPF_OUT)/kvmem_helpers.o: bpf/kvmem_helpers.c
	@mkdir -p $(dir $@)
	$(CC) $(BPF_USER_CFLAGS) -c $< -o $@

$(BPF_TOOLS:%=$(BPF_OUT)/%.o): $(BPF_OUT)/%.o: bpf/%.c $(BPF_OUT)/%.skel.h
	$(CC) $(BPF_USER_CFLAGS) -c $< -o $@

$(BPF_TOOLS:%=$(BPF_OUT)/%): $(BPF_OUT)/%: $(BPF_OUT)/%.o $(BPF_OUT)/kvmem_helpers.o
	$(CC) -o $@ $^ $(LDFLAGS) $(BPF_LDLIBS)

# Example victim policies: loaded by kvmempolicy at run time, no skeleton.
$(BPF_OUT)/policies/%.bpf.o: bpf/policies/%.bpf.c bpf/policies/policy.bpf.h $(BPF_OUT)/vmlinux.h
	@mkdir -p $(dir $@)
	$(CLANG) $(BPF_CFLAGS) -Ibpf/policies -MMD -MP -c $< -o $@
	$(LLVM_STRIP) -g $@

# The VM of `make vmtest` (tests/vm/vm.mk) starts kvmem-vm-observe, when it
# is in $(VM_DIR)/observe, during its session over the kernel module
# (tests/vm/session.sh) and prints what it says: the tools on the module's
# tracepoints and a policy on kvmem_reclaim (bpf/vm-observe.sh).
ifdef VM_DIR
ifneq ($(BPF_HAVE),)
$(VM_DIR)/initramfs.cpio: $(VM_DIR)/observe/kvmem-vm-observe
endif
$(VM_DIR)/observe/kvmem-vm-observe: bpf/vm-observe.sh $(BPF_TOOLS:%=$(BPF_OUT)/%) \
		$(BPF_OUT)/policies/protect_recent.bpf.o
	@mkdir -p $(dir $@)
	cp $(BPF_TOOLS:%=$(BPF_OUT)/%) $(BPF_OUT)/policies/protect_recent.bpf.o $(dir $@)
	cp bpf/vm-observe.sh $@
endif
