/* SPDX-License-Identifier: MIT */
/*
 * Per-tensor digests of a safetensors file: the XXH3-64 (seed 0) of every
 * stored byte of each tensor, and how many of its values are not finite
 * (NaN or +-Inf; BF16, F16 and F32 tensors, 0 for other dtypes). The model
 * fingerprint is built from them, and the loader refuses a tensor holding
 * a non-finite value.
 *
 * Reading every byte of a 16 GB checkpoint on each open would make a reopen
 * cost what a load costs, so the digests are cached: one small text file per
 * weight file under <data dir>/fingerprints/ (kvmem_data_dir()), named by
 * the file's device and inode, valid while the file's device, inode, size,
 * mtime, ctime and header hash all match. Anything else (a changed file, a
 * torn or foreign cache file) means hashing again. The cache is only ever
 * an optimisation: failing to read or write it is silent, and a file
 * changed less than two seconds before it was hashed is not cached (a
 * second change within the file system's timestamp granularity could go
 * unseen). Documentation/formats.md describes the format.
 */
#ifndef KVMEM_MODEL_DIGEST_H
#define KVMEM_MODEL_DIGEST_H

#include <stdint.h>

#include "model/safetensors.h"

struct kvmem_tensor_digest {
	uint64_t hash;		/* XXH3-64 of the tensor's stored bytes */
	uint64_t nonfinite;	/* values that are NaN or infinite */
};

/*
 * Digests for every tensor of f, in kvmem_st_at() order, into out[count]:
 * from the cache when it is valid, else computed (and cached). *hashed is
 * set to the bytes read to compute them (0 on a cache hit). Cannot fail.
 */
int kvmem_digest_file(const kvmem_st_file *f, struct kvmem_tensor_digest *out, uint64_t *hashed);

/* The digest of one tensor's bytes (what kvmem_digest_file computes). */
void kvmem_digest_tensor(const kvmem_st_tensor *t, struct kvmem_tensor_digest *d);

#endif
