// SPDX-License-Identifier: MIT
/*
 * The gather kernel (kernels/cuda/gather.cu) against its CPU twin
 * (kernels/cpu/gather.c), bit for bit, on fresh random pages: every page
 * dtype (f32, bf16, f16), pages in device memory, in pinned host memory
 * (cudaMallocHost) and in malloc'd memory registered with cudaHostRegister
 * (as the pager's host pool is), 16-byte aligned and not (the scalar
 * path), Qwen3-8B's heads and the agentlang model's, with and without the
 * copy into a device page. And the gather against the forward pass's
 * scatter kernel over the same bf16 values: the same bits, so a placed
 * token equals a computed one on the GPU too. Every case also writes the
 * raw K a view keeps beside its slots (raw_k), checked against the twin's.
 * Views are poisoned first:
 * a slot the kernel should not touch must keep its poison.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda.h"
#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "check_gather.h"
#include "check_util.h"

/* One "ok"/"FAIL" line naming the case. */
static void result(int ok, const char *name, int heads, int hd, const char *what)
{
	report(ok, "gather %s: %d KV heads x %d, pages %s", name, heads, hd, what);
}

enum where { IN_DEVICE, IN_PINNED, IN_REGISTERED };

static const char *where_name[] = { "in device memory", "in pinned host memory",
				    "in registered host memory" };

static size_t esize(int dtype)
{
	return dtype == KVMEM_DTYPE_F32 ? 4 : 2;
}

/* One case: n_items items of random pages into a poisoned view. run > 1:
 * items in groups of L at the same slots, layers 0..L-1 (the session's
 * order: a block's layers in turn), run a kernel block (run = L: a group
 * each, sharing its rotary angles; else blocks straddle groups); the
 * second group's second item has one token fewer (the angles kept
 * serve), its third one more than the first (they are made again). */
static void one(kvmem_cuda_ctx *c, const char *name, int L, int H, int D, int B, int dtype,
		enum where w, int misalign, int copy, int run)
{
	const int cap = 24 * B, n_items = 24;	/* room: items never share a slot */
	const size_t half = (size_t)H * B * D, es = esize(dtype), vsz = (size_t)L * H * cap * D;
	const size_t page_bytes = 2 * half * es + 64;	/* K, V, room to misalign */
	char *host = NULL, *where = NULL, *dev_pages = NULL;
	uint16_t *vk_ref = malloc(vsz * 2), *vv_ref = malloc(vsz * 2), *vk = NULL, *vv = NULL;
	uint16_t *ck_ref = calloc((size_t)n_items * 2 * half, 2), *cpool = NULL;
	uint16_t *got_k = malloc(vsz * 2), *got_v = malloc(vsz * 2), *got_c = NULL;
	/* The raw K a view keeps beside its slots: written too, every case. */
	uint16_t *raw_ref = malloc(vsz * 2), *raw = NULL;
	kvmem_gather_item it[24], dit[24], *ditems = NULL;
	uint8_t *used = calloc((size_t)L * cap, 1);
	int ok = 1;

	if (!vk_ref || !vv_ref || !ck_ref || !got_k || !got_v || !used || !raw_ref) {
		result(0, name, H, D, "(out of host memory)");
		goto out;
	}
	/* The pages, made in host memory first. */
	if (w == IN_PINNED) {
		if (cudaMallocHost((void **)&host, (size_t)n_items * page_bytes) != cudaSuccess)
			host = NULL;
	} else {
		host = malloc((size_t)n_items * page_bytes);
	}
	if (!host) {
		result(0, name, H, D, "(no memory for the pages)");
		goto out;
	}
	if (dtype == KVMEM_DTYPE_F32) {
		for (size_t i = 0; i < (size_t)n_items * page_bytes / 4; i++)
			((float *)host)[i] = (float)(runi(0, 1) * 6 - 3);
	} else {
		for (size_t i = 0; i < (size_t)n_items * page_bytes / 2; i++) {
			float x = (float)(runi(0, 1) * 6 - 3);

			((uint16_t *)host)[i] = dtype == KVMEM_DTYPE_BF16 ? kvmem_f32_to_bf16(x)
									 : kvmem_f32_to_f16(x);
		}
	}
	where = host;
	if (w == IN_REGISTERED &&
	    cudaHostRegister(host, (size_t)n_items * page_bytes,
			     cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) {
		cudaGetLastError();
		result(0, name, H, D, "(cudaHostRegister refused)");
		goto out;
	}
	if (w == IN_DEVICE) {
		if (kvmem_cuda_malloc((void **)&dev_pages, (size_t)n_items * page_bytes) ||
		    kvmem_cuda_upload(c, dev_pages, host, (size_t)n_items * page_bytes)) {
			result(0, name, H, D, "(no device memory)");
			goto out;
		}
		where = dev_pages;
	} else if (w == IN_REGISTERED) {
		void *d = NULL;

		if (cudaHostGetDevicePointer(&d, host, 0) != cudaSuccess) {
			cudaGetLastError();
			result(0, name, H, D, "(no device address)");
			goto out;
		}
		where = d;
	}
	if (kvmem_cuda_malloc((void **)&vk, vsz * 2) || kvmem_cuda_malloc((void **)&vv, vsz * 2) ||
	    kvmem_cuda_malloc((void **)&ditems, sizeof(dit)) ||
	    kvmem_cuda_malloc((void **)&raw, vsz * 2) ||
	    cudaMemset(raw, 0x33, vsz * 2) != cudaSuccess ||
	    (copy && kvmem_cuda_malloc((void **)&cpool, (size_t)n_items * 2 * half * 2)) ||
	    cudaMemset(vk, 0xa5, vsz * 2) != cudaSuccess || cudaMemset(vv, 0x5a, vsz * 2) != cudaSuccess ||
	    (copy && cudaMemset(cpool, 0, (size_t)n_items * 2 * half * 2) != cudaSuccess)) {
		result(0, name, H, D, "(no device memory)");
		goto out;
	}
	memset(vk_ref, 0xa5, vsz * 2);
	memset(vv_ref, 0x5a, vsz * 2);
	memset(raw_ref, 0x33, vsz * 2);
	for (int i = 0, gn = 0, gu0 = 0, gslot = 0; i < n_items; i++) {
		int n = 1 + (int)(runi(0, 1) * (B - 2)), u0 = (int)(runi(0, 1) * (B - n + 1)), l, slot;
		size_t off = (size_t)i * page_bytes + (misalign ? es * (1 + i % 3) : 0);

		if (copy && i % 3 == 0)
			u0 = 0, n = B;	/* whole pages are what the pool keeps */
		if (run > 1)
			u0 = (int)(runi(0, 1) * (B - n));	/* room for one more */
		if (run > 1 && i % L) {	/* the group's slots, the next layer */
			l = i % L;
			n = gn ? gn - (i == L + 1) + (i == L + 2) : 0;
			u0 = gu0;
			slot = gslot;
		} else for (int tries = 0;; tries++) {
			int free_run = 1;

			l = run > 1 ? 0 : (int)(runi(0, 1) * L);
			slot = (int)(runi(0, 1) * (cap - n));	/* room for one more */
			for (int k = 0; k < (run > 1 ? L : 1); k++)
				for (int t = 0; t < n + (run > 1); t++)
					free_run &= !used[(size_t)(l + k) * cap + slot + t];
			if (free_run) {
				gn = n, gu0 = u0, gslot = slot;
				break;
			}
			if (tries > 1000) {
				n = gn = 0;	/* no room: an empty item (and group) */
				break;
			}
		}
		for (int t = 0; t < n; t++)
			used[(size_t)l * cap + slot + t] = 1;
		it[i] = (kvmem_gather_item){
			.k = host + off + (size_t)u0 * D * es,
			.v = host + off + half * es + (size_t)u0 * D * es,
			.copy_k = copy ? ck_ref + (size_t)i * 2 * half + (size_t)u0 * D : NULL,
			.copy_v = copy ? ck_ref + (size_t)i * 2 * half + half + (size_t)u0 * D : NULL,
			.raw_k = raw_ref + ((size_t)l * H * cap + slot) * D,
			.layer = l, .slot = slot, .n = n, .head_stride = B * D, .dtype = dtype,
			.raw_stride = cap * D,
		};
		dit[i] = it[i];
		dit[i].raw_k = raw + ((size_t)l * H * cap + slot) * D;
		dit[i].k = where + off + (size_t)u0 * D * es;
		dit[i].v = where + off + half * es + (size_t)u0 * D * es;
		if (copy) {
			dit[i].copy_k = cpool + (size_t)i * 2 * half + (size_t)u0 * D;
			dit[i].copy_v = cpool + (size_t)i * 2 * half + half + (size_t)u0 * D;
		}
	}
	if (kvmem_view_gather_bf16(vk_ref, vv_ref, it, n_items, L, H, D, cap, 1e6) < 0 ||
	    kvmem_cuda_upload(c, ditems, dit, sizeof(dit)) ||
	    kvmem_cuda_view_gather_bf16(c, vk, vv, ditems, n_items, run, L, H, D, cap, 1e6) ||
	    kvmem_cuda_sync(c) || kvmem_cuda_download(c, got_k, vk, vsz * 2) ||
	    kvmem_cuda_download(c, got_v, vv, vsz * 2)) {
		printf("     %s\n", kvmem_last_error());
		ok = 0;
	}
	ok = ok && !memcmp(got_k, vk_ref, vsz * 2) && !memcmp(got_v, vv_ref, vsz * 2);
	/* got_v is free again: the raw K kept beside the view. */
	ok = ok && !kvmem_cuda_download(c, got_v, raw, vsz * 2) && !memcmp(got_v, raw_ref, vsz * 2);
	if (ok)
		kvmem_cuda_download(c, got_v, vv, vsz * 2);
	if (ok && copy) {
		got_c = malloc((size_t)n_items * 2 * half * 2);
		ok = got_c && !kvmem_cuda_download(c, got_c, cpool, (size_t)n_items * 2 * half * 2) &&
		     !memcmp(got_c, ck_ref, (size_t)n_items * 2 * half * 2);
	}
	{
		char what[160];

		snprintf(what, sizeof(what), "%s %s%s%s%s", dtype == KVMEM_DTYPE_F32 ? "f32" :
			 dtype == KVMEM_DTYPE_BF16 ? "bf16" : "f16", where_name[w],
			 misalign ? ", misaligned" : "", copy ? ", copied to a device page" : "",
			 run > 1 ? (run == L ? ", a block's layers in turn" :
				    ", a block's layers in turn, kernel blocks straddling them") : "");
		result(ok, name, H, D, what);
	}
	/* bf16 pages: the gather equals the forward pass's scatter of the
	 * same values staged packed, bit for bit. */
	if (dtype == KVMEM_DTYPE_BF16 && w == IN_DEVICE && !misalign && !copy) {
		uint16_t *sk = NULL, *sv = NULL, *hk = malloc((size_t)n_items * half * 2);
		uint16_t *hv = malloc((size_t)n_items * half * 2), *vk2 = NULL, *vv2 = NULL;
		kvmem_scatter_item si[24], *dsi = NULL;
		int same = hk && hv;

		for (int i = 0; same && i < n_items; i++) {
			const uint16_t *pk = (const uint16_t *)it[i].k, *pv = (const uint16_t *)it[i].v;

			for (int t = 0; t < it[i].n; t++)
				for (int h = 0; h < H; h++) {
					size_t s = (size_t)t * D + (size_t)h * B * D;
					size_t d = (size_t)i * half + ((size_t)t * H + h) * D;

					memcpy(hk + d, pk + s, (size_t)D * 2);
					memcpy(hv + d, pv + s, (size_t)D * 2);
				}
			si[i] = (kvmem_scatter_item){ .layer = it[i].layer, .slot = it[i].slot,
						      .n = it[i].n, .tok_stride = H * D,
						      .src = (int64_t)i * half, .head_stride = D };
		}
		same = same && !kvmem_cuda_malloc((void **)&sk, (size_t)n_items * half * 2) &&
		       !kvmem_cuda_malloc((void **)&sv, (size_t)n_items * half * 2) &&
		       !kvmem_cuda_malloc((void **)&vk2, vsz * 2) &&
		       !kvmem_cuda_malloc((void **)&vv2, vsz * 2) &&
		       !kvmem_cuda_malloc((void **)&dsi, sizeof(si)) &&
		       cudaMemset(vk2, 0xa5, vsz * 2) == cudaSuccess &&
		       cudaMemset(vv2, 0x5a, vsz * 2) == cudaSuccess &&
		       !kvmem_cuda_upload(c, sk, hk, (size_t)n_items * half * 2) &&
		       !kvmem_cuda_upload(c, sv, hv, (size_t)n_items * half * 2) &&
		       !kvmem_cuda_upload(c, dsi, si, sizeof(si)) &&
		       !kvmem_cuda_view_scatter_bf16(c, vk2, vv2, sk, sv, dsi, n_items, L, H, D, cap,
						     1e6) &&
		       !kvmem_cuda_sync(c) && !kvmem_cuda_download(c, vk_ref, vk2, vsz * 2) &&
		       !kvmem_cuda_download(c, vv_ref, vv2, vsz * 2) &&
		       !memcmp(vk_ref, got_k, vsz * 2) && !memcmp(vv_ref, got_v, vsz * 2);
		result(same, name, H, D, "bf16: the same bits as the forward pass's scatter");
		kvmem_cuda_free(sk);
		kvmem_cuda_free(sv);
		kvmem_cuda_free(vk2);
		kvmem_cuda_free(vv2);
		kvmem_cuda_free(dsi);
		free(hk);
		free(hv);
	}
out:
	if (w == IN_REGISTERED && host)
		cudaHostUnregister(host);
	if (w == IN_PINNED)
		cudaFreeHost(host);
	else
		free(host);
	cudaGetLastError();
	kvmem_cuda_free(dev_pages);
	kvmem_cuda_free(vk);
	kvmem_cuda_free(vv);
	kvmem_cuda_free(ditems);
	kvmem_cuda_free(cpool);
	kvmem_cuda_free(raw);
	free(raw_ref);
	free(vk_ref);
	free(vv_ref);
	free(ck_ref);
	free(got_k);
	free(got_v);
	free(got_c);
	free(used);
}

void check_gather(void)
{
	static const int dtypes[] = { KVMEM_DTYPE_BF16, KVMEM_DTYPE_F32, KVMEM_DTYPE_F16 };

	kvmem_cuda_ctx *c = g_c;
	const int quick = g_quick;

	for (int d = 0; d < 3; d++)
		for (int w = 0; w < 3; w++) {
			if (quick && w != IN_REGISTERED)
				continue;
			one(c, "8B", quick ? 2 : 4, 8, 128, 32, dtypes[d], w, 0, d == 0 && w != 0,
			    1);
		}
	one(c, "8B", 3, 8, 128, 32, KVMEM_DTYPE_BF16, IN_REGISTERED, 1, 0, 1);
	one(c, "8B", 3, 8, 128, 32, KVMEM_DTYPE_F32, IN_PINNED, 1, 1, 1);
	one(c, "agentlang", 6, 2, 64, 32, KVMEM_DTYPE_BF16, IN_REGISTERED, 0, 1, 1);
	one(c, "agentlang", 6, 2, 64, 32, KVMEM_DTYPE_F32, IN_PINNED, 0, 0, 1);
	/* a block's layers in turn (the session's order), their angles shared */
	one(c, "8B", 4, 8, 128, 32, KVMEM_DTYPE_BF16, IN_DEVICE, 0, 0, 4);
	one(c, "8B", 4, 8, 128, 32, KVMEM_DTYPE_BF16, IN_DEVICE, 0, 0, 3);
	one(c, "agentlang", 6, 2, 64, 32, KVMEM_DTYPE_BF16, IN_REGISTERED, 0, 0, 6);
	if (!quick)
		one(c, "hd64 x 16 heads", 2, 16, 64, 16, KVMEM_DTYPE_BF16, IN_DEVICE, 0, 1, 1);
}
