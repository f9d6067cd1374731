# kvmem — the CUDA ops (included from the top-level Makefile).
#
# When nvcc is found (on PATH, or /usr/local/cuda/bin/nvcc), `make` builds
# $(O)/libkvmem_cuda.a from kernels/cuda/*.cu for sm_90 (machine code for
# Hopper, plus compute_90 PTX that newer GPUs compile at load) and the GPU
# check program $(O)/gpu/kvmem_gpu_check (tests/gpu/; it runs only on a GPU
# machine, through tests/gpu/run.sh, never in `make test`). Without nvcc
# all of this is left out and nothing else changes. NVCC=none turns it off.
# The sanitizer build (SAN=1) leaves it out too: nothing there links it.
#
# `make gpu-check-static` links the check program with Debian's libraries
# (OpenBLAS, liburing, libnuma, libxxhash, libgomp, libgfortran) and the CUDA
# runtime statically, so it runs on the GPU machine without our -dev
# packages; only cuBLASLt (CUDA 13, present there) is a shared library,
# opened at run time (lt_load.cu).

ifeq ($(origin NVCC),undefined)
NVCC := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && \
	  echo /usr/local/cuda/bin/nvcc; })
endif

ifneq ($(filter-out none,$(NVCC)),)
ifneq ($(SAN),1)

CUDA_HOME   ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH   ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCC_FLAGS  ?= -std=c++17 -O3 -lineinfo $(CUDA_ARCH) -Xcompiler -Wall,-fPIC -I. -Iinclude \
	       -Iinclude/uapi -MMD -MP
CUDA_SRC    := $(sort $(wildcard kernels/cuda/*.cu))
# The cuda backend (user/backend/cuda*.c: C over these ops) joins them.
CUDA_BE_SRC := $(sort $(wildcard user/backend/cuda*.c))
CUDA_OBJ    := $(CUDA_SRC:%.cu=$(O)/cuda/%.o) $(CUDA_BE_SRC:%.c=$(O)/cuda/%.o)
GPU_CHECK_OBJ := $(patsubst %.c,$(O)/gpu/obj/%.o,$(sort $(wildcard tests/gpu/*.c)))
GPU_CHECK   := $(O)/gpu/kvmem_gpu_check
GCC_LIBDIR  := $(dir $(shell $(CC) -print-libgcc-file-name))
# cuBLASLt is not linked: lt_load.cu opens it on first use (linking it cost
# every process 0.1 s and 210 MB at start); the run path and
# KVMEM_CUDA_LIBDIR tell it where to look.
CUDA_LIBS   := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static \
	       -ldl -lrt -lpthread
$(O)/cuda/kernels/cuda/lt_load.o: NVCC_FLAGS += -DKVMEM_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'
# NCCL likewise (user/backend/cuda_nccl.c, nccl_dl.h).
$(O)/cuda/user/backend/cuda_nccl.o: CFLAGS += -DKVMEM_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'
# Prefill attention v6 uses wgmma, which only the sm_90a target has (the
# -gencode form: nvcc 13.0's -arch=sm_90a also runs a plain sm_90 pass that
# rejects it); no PTX for other GPUs, where attention.cu runs v4 instead.
$(O)/cuda/kernels/cuda/attention_wgmma.o: CUDA_ARCH = -gencode arch=compute_90a,code=sm_90a

$(O)/cuda/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(O)/cuda/user/backend/%.o: user/backend/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -Iuser -I$(CUDA_HOME)/include -c $< -o $@

# The CLI and the unit tests link the cuda backend too (kvmem run --backend
# cuda; KVMEM_TEST_BACKEND=cuda on a GPU machine): -u pulls its ops table,
# which the registry names only weakly.
# kvmem bench select names the selection ops weakly: -u pulls them in too.
# test_tp_nccl names the NCCL loader weakly: -u pulls it in too.
CUDA_LINK   := -Wl,-u,kvmem_backend_cuda_ops -Wl,-u,kvmem_cuda_plan_blocks \
	       -Wl,-u,kvmem_cuda_copy_gbps -Wl,-u,kvmem_nccl_selftest $(O)/libkvmem_cuda.a $(O)/libkvmem.a -lstdc++ $(CUDA_LIBS)
$(O)/kvmem $(TEST_BIN): $(O)/libkvmem_cuda.a

$(O)/libkvmem_cuda.a: $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(O)/gpu/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iuser -I$(CUDA_HOME)/include -c $< -o $@

# Linked like the tests (Debian's shared libraries): what CI builds.
$(GPU_CHECK): $(GPU_CHECK_OBJ) $(O)/libkvmem_cuda.a $(O)/libkvmem.a
	$(CC) -o $@ $(GPU_CHECK_OBJ) $(O)/libkvmem_cuda.a $(O)/libkvmem.a $(LDFLAGS) $(LDLIBS) \
	    -lstdc++ $(CUDA_LIBS)

# For the GPU machine: Debian's libraries (and libgomp, libgfortran: the
# gfortran-12 / libgfortran-12-dev package) linked in statically.
$(GPU_CHECK)-static: $(GPU_CHECK_OBJ) $(O)/libkvmem_cuda.a $(O)/libkvmem.a
	$(CC) -o $@ $(GPU_CHECK_OBJ) $(O)/libkvmem_cuda.a $(O)/libkvmem.a \
	    /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.a \
	    -Wl,-Bstatic -luring -lnuma -lxxhash -lgfortran -lquadmath -lstdc++ -Wl,-Bdynamic \
	    $(GCC_LIBDIR)libgomp.a -lm $(CUDA_LIBS)

.PHONY: cuda gpu-check gpu-check-static
cuda: $(O)/libkvmem_cuda.a
gpu-check: $(GPU_CHECK)
gpu-check-static: $(GPU_CHECK)-static
all: $(O)/libkvmem_cuda.a
all: $(GPU_CHECK)

endif
endif
