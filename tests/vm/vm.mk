# tests/vm/vm.mk: the kernel module and its VM test suite (the Makefile
# includes this file).
#
#   make kmod     kvmem.ko against Debian's 6.1 headers, in $(BUILD)/kmod
#                 (a copy of kmod/ is built there: the tree stays clean)
#   make vmtest   the module, the kselftest programs (kselftest_harness.h
#                 taken from Debian's linux-source-6.1 at build time), two
#                 workspaces written by the real pager, the page-source
#                 suite and the CLI (for sessions over --pager kmod), an
#                 initramfs; boots Debian's 6.1 kernel in qemu (TCG) and
#                 runs everything; prints "N passed, N failed, N skipped"
#   make vmtest-debug  the same on a debug kernel built here from
#                 linux-source-6.1 (KASAN, lockdep, DEBUG_VM, kmemleak, BTF;
#                 cached in $(BUILD)/vm-debug); not part of make test
#
# KVER (default: newest installed linux-headers-6.1.*-amd64) names the ABI
# built for and booted; the image is downloaded once into $(BUILD)/vm/kernel.

VM_DIR    := $(BUILD)/vm
KMOD_DIR  := $(BUILD)/kmod
KVER      ?= $(shell tests/vm/kver.sh)
KDIR      ?= $(firstword $(wildcard /lib/modules/$(KVER)/build) /usr/src/linux-headers-$(KVER))
KSRC_TAR  ?= /usr/src/linux-source-6.1.tar.xz
KMOD_SRC  := $(sort $(wildcard kmod/*.c kmod/*.h)) kmod/Kbuild
VM_CFLAGS := -std=gnu11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wno-unused-parameter \
	     -Wno-sign-compare -Iinclude -Iinclude/uapi -I$(VM_DIR)/ksft -pthread
VM_PROGS  := $(patsubst tests/vm/%.c,$(VM_DIR)/bin/%,$(wildcard tests/vm/kvmem-*.c))
VM_BPF    := $(patsubst tests/vm/%.bpf.c,$(VM_DIR)/bin/kvmem-%.bpf.o,$(wildcard tests/vm/*.bpf.c))
VM_DATA   := $(VM_DIR)/data/ws-small/manifest $(VM_DIR)/data/ws-wide/manifest

.PHONY: kmod vmtest vm-build
kmod: $(KMOD_DIR)/kvmem.ko

$(KMOD_DIR)/kvmem.ko: $(KMOD_SRC) include/uapi/linux/kvmem.h
	@test -d "$(KDIR)" || { echo "kvmem: no kernel headers for '$(KVER)': run tools/deps.sh"; exit 1; }
	@mkdir -p $(KMOD_DIR)
	cp $(KMOD_SRC) $(KMOD_DIR)/
	$(MAKE) -C $(KDIR) M=$(abspath $(KMOD_DIR)) KVMEM_UAPI=$(abspath include/uapi) modules

$(VM_DIR)/ksft/kselftest_harness.h: $(KSRC_TAR)
	@mkdir -p $(VM_DIR)/ksft
	tar -xJf $(KSRC_TAR) -C $(VM_DIR)/ksft --strip-components=4 \
	    linux-source-6.1/tools/testing/selftests/kselftest_harness.h \
	    linux-source-6.1/tools/testing/selftests/kselftest.h
	@touch $@

$(VM_DIR)/bin/kvmem-%: tests/vm/kvmem-%.c tests/vm/vmtest.h kmod/kvmem_xxh3.c \
		include/uapi/linux/kvmem.h $(VM_DIR)/ksft/kselftest_harness.h $(BUILD)/libkvmem.a
	@mkdir -p $(dir $@)
	$(CC) $(VM_CFLAGS) -o $@ $< kmod/kvmem_xxh3.c $(BUILD)/libkvmem.a -Wl,--as-needed \
	    $(VM_LIBS) $(LDLIBS)
$(VM_DIR)/bin/kvmem-bpf $(VM_DIR)/bin/kvmem-fuzz: VM_LIBS = -lbpf

# (--as-needed: only the libraries the objects taken from libkvmem.a use
# travel into the initramfs.)

# The BPF victim program, for the kernel of the VM (no vmlinux.h needed).
$(VM_DIR)/bin/kvmem-%.bpf.o: tests/vm/%.bpf.c include/uapi/linux/kvmem.h
	@mkdir -p $(dir $@)
	clang -O2 -g -target bpf -Iinclude/uapi -I/usr/include/$(shell $(CC) -dumpmachine) \
	    -c $< -o $@

$(VM_DIR)/bin/kvmem_genws: tests/vm/kvmem_genws.c $(BUILD)/libkvmem.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libkvmem.a $(LDFLAGS) $(LDLIBS)

# Workspaces written by the real pager: 4 layers of 4 KiB pages (stride =
# page), and 2 layers of 10 KiB pages in 12 KiB strides.
$(VM_DIR)/data/ws-small/manifest: $(VM_DIR)/bin/kvmem_genws
	rm -rf $(dir $@) && mkdir -p $(VM_DIR)/data && $< $(dir $@) --layers 4 --kv-heads 2 --head-dim 32 --block 8 --blocks 64 --seed 11
$(VM_DIR)/data/ws-wide/manifest: $(VM_DIR)/bin/kvmem_genws
	rm -rf $(dir $@) && mkdir -p $(VM_DIR)/data && $< $(dir $@) --layers 2 --kv-heads 2 --head-dim 40 --block 16 --blocks 48 --seed 12

# The page-source suite (its kmod variant runs where /dev/kvmem is) and the
# CLI, for the guest's /usr/bin: linked without CUDA (no GPU there, and
# cuBLASLt alone would outweigh the rest of the initramfs).
VM_USR    := $(VM_DIR)/usr/test_page_source $(VM_DIR)/usr/kvmem $(VM_DIR)/usr/kvmem-vm-scan
$(VM_DIR)/usr/test_page_source: tests/unit/test_page_source.c $(HELP_OBJ) $(BUILD)/libkvmem.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iuser -Itests/unit -o $@ $< $(HELP_OBJ) $(BUILD)/libkvmem.a $(LDFLAGS) \
	    $(LDLIBS) -lcmocka
$(VM_DIR)/usr/kvmem: $(CLI_OBJ) $(BUILD)/libkvmem.a $(BUILD)/libkvmem_agentlang.a
	@mkdir -p $(dir $@)
	$(CC) -o $@ $(CLI_OBJ) $(BUILD)/libkvmem_agentlang.a $(BUILD)/libkvmem.a $(LDFLAGS) \
	    $(LDLIBS) $(SERVE_LIBS)

# The workload of the live-policy check (tests/vm/policy.sh).
$(VM_DIR)/usr/kvmem-vm-scan: tests/vm/kvmem_scan.c tests/vm/vmtest.h kmod/kvmem_xxh3.c \
		include/uapi/linux/kvmem.h $(BUILD)/libkvmem.a
	@mkdir -p $(dir $@)
	$(CC) $(VM_CFLAGS) -o $@ $< kmod/kvmem_xxh3.c $(BUILD)/libkvmem.a -Wl,--as-needed $(LDLIBS)

# The kernel image first: the initramfs takes a few of its modules (ext4 and
# loop, for the O_DIRECT tests), so on a fresh machine it must be there
# before the initramfs is packed.
VM_KERNEL := $(VM_DIR)/kernel/root/boot/vmlinuz-$(KVER)
$(VM_KERNEL):
	@tests/vm/kernel.sh $(VM_DIR) $(KVER)

$(VM_DIR)/initramfs.cpio: $(KMOD_DIR)/kvmem.ko $(VM_PROGS) $(VM_BPF) $(VM_DATA) $(VM_USR) \
		$(wildcard $(VM_DIR)/observe/*) tests/vm/init.sh tests/vm/session.sh tests/vm/policy.sh \
		tests/vm/bench.sh \
		tests/vm/mkinitramfs.sh $(VM_KERNEL)
	tests/vm/mkinitramfs.sh $(VM_DIR) $(KMOD_DIR)/kvmem.ko $(KVER)

vm-build: $(VM_DIR)/initramfs.cpio

vmtest: deps
	@$(MAKE) --no-print-directory vm-build
	@tests/vm/run.sh $(VM_DIR) $(KVER)

# make vmtest-debug: the same suite on a debug kernel built here from
# Debian's linux-source-6.1 (KASAN, lockdep, DEBUG_VM, kmemleak on the
# command line: tests/vm/debug.config), the module built against it. The
# kernel is built once (an hour or two on two cores) and kept in
# $(VMD_DIR)/linux; a change to debug.config builds it again. Not part of
# make test.
VMD_DIR   := $(BUILD)/vm-debug
VMD_IMAGE := $(VMD_DIR)/linux/arch/x86/boot/bzImage
VMD_KO    := $(VMD_DIR)/kmod/kvmem.ko
.PHONY: vmtest-debug vm-debug-build

$(VMD_IMAGE): tests/vm/debug.config tests/vm/debug-kernel.sh
	tests/vm/debug-kernel.sh $(VMD_DIR) $(KSRC_TAR)

$(VMD_KO): $(KMOD_SRC) include/uapi/linux/kvmem.h $(VMD_IMAGE)
	@mkdir -p $(VMD_DIR)/kmod
	cp $(KMOD_SRC) $(VMD_DIR)/kmod/
	$(MAKE) -C $(VMD_DIR)/linux M=$(abspath $(VMD_DIR)/kmod) KVMEM_UAPI=$(abspath include/uapi) modules

# The programs and workspaces are the stock run's ($(VM_DIR)); only the
# module differs. (No image modules: the debug kernel has ext4, loop and dm
# built in.)
vm-debug-build: vm-build $(VMD_KO)
	@mkdir -p $(VMD_DIR)/vm
	@for d in bin data usr observe; do \
		[ -e $(VM_DIR)/$$d ] && ln -sfn $(abspath $(VM_DIR))/$$d $(VMD_DIR)/vm/$$d; done; true
	tests/vm/mkinitramfs.sh $(VMD_DIR)/vm $(VMD_KO) debug

vmtest-debug: deps
	@$(MAKE) --no-print-directory vm-debug-build
	@KVMEM_VM_TIMEOUT=$${KVMEM_VM_TIMEOUT:-5400} tests/vm/run.sh $(VMD_DIR)/vm debug $(VMD_IMAGE)
