#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The other architecture's all-reduce, for Documentation/architecture.md's
decision (tensor parallelism: one process driving every GPU, or one process
per GPU): PyTorch's NCCL all-reduce with one process per GPU, the way vLLM
and SGLang run their workers, at the sizes kvmem's one-process self-test
(test_tp_nccl) times. Host-timed like it: the call and a synchronize, the
median of 20 after 5 warm-ups; fp32 sums of `count` elements, in place.

    python3 tests/gpu/tp_allreduce_peer.py 2      # 2 GPUs

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, also for the children).
"""
import os
import sys
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

COUNTS = [1, 64, 4096, 262144, 16777216]


def worker(rank, n, store):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", store=dist.FileStore(store, n), rank=rank, world_size=n)
    for count in COUNTS:
        x = torch.full((count,), float(rank + 1), device="cuda", dtype=torch.float32)
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        x.fill_(float(rank + 1))
        dist.all_reduce(x)
        torch.cuda.synchronize()
        want = n * (n + 1) / 2
        assert float(x[0]) == want and float(x[-1]) == want, (count, float(x[0]), want)
        t = []
        for _ in range(20):
            dist.barrier()
            torch.cuda.synchronize()
            a = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            t.append(time.perf_counter() - a)
        t.sort()
        us = t[10] * 1e6
        bus = count * 4 * 2 * (n - 1) / n / t[10] / 1e9 if n > 1 else 0.0
        if rank == 0:
            print(f"peer (one process per GPU), {n} GPUs: all-reduce of {count} floats "
                  f"{us:.1f} us, bus {bus:.1f} GB/s", flush=True)
    dist.destroy_process_group()


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else torch.cuda.device_count()
    store = f"/tmp/kvmem-tp-peer.{os.getpid()}"
    mp.spawn(worker, args=(n, store), nprocs=n, join=True)
    if os.path.exists(store):
        os.unlink(store)


if __name__ == "__main__":
    main()
