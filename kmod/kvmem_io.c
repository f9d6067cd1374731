// SPDX-License-Identifier: GPL-2.0
/*
 * The module's file I/O, always without ws->lock: a page's stride read from
 * or written to the pages file at id * page_stride (bio_vecs over the
 * slot's pages), its XXH3-64 read from or written to the sums file, where
 * each block has its L page sums and then the index record's sum.
 */
#include <linux/bvec.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/uio.h>

#include "kvmem_int.h"
#include "kvmem_xxh3.h"

static loff_t sum_offset(struct kvmem_ws *ws, u64 id)
{
	/* Per block: L page sums, then the index record's sum. */
	return (loff_t)((id / ws->n_layers) * (ws->n_layers + 1) + id % ws->n_layers) * 8;
}

static int page_io(struct kvmem_ws *ws, u64 id, struct kvmem_slot *s, bool write)
{
	struct bio_vec *bv;
	struct iov_iter it;
	loff_t pos = (loff_t)id * ws->page_stride;
	ssize_t n;
	u32 i;

	bv = kvmalloc_array(ws->npp, sizeof(*bv), GFP_KERNEL);
	if (!bv)
		return -ENOMEM;
	for (i = 0; i < ws->npp; i++)
		bvec_set_page(&bv[i], s->pages[i], PAGE_SIZE, 0);
	iov_iter_bvec(&it, write ? ITER_SOURCE : ITER_DEST, bv, ws->npp, ws->page_stride);
	if (write) {
		/* vfs_iter_write leaves freeze protection to its caller. */
		file_start_write(ws->pages);
		n = vfs_iter_write(ws->pages, &it, &pos, 0);
		file_end_write(ws->pages);
	} else {
		n = vfs_iter_read(ws->pages, &it, &pos, 0);
	}
	kvfree(bv);
	if (n < 0)
		return n;
	return n == ws->page_stride ? 0 : -EIO;	/* short: the file is truncated */
}

int kvmem_read_page(struct kvmem_ws *ws, u64 id, struct kvmem_slot *s)
{
	loff_t pos = sum_offset(ws, id);
	__le64 sum;
	ssize_t n;
	int err;

	err = page_io(ws, id, s, false);
	if (err)
		return err;
	n = kernel_read(ws->sums, &sum, sizeof(sum), &pos);
	if (n != sizeof(sum))
		return n < 0 ? n : -EIO;
	if (kvmem_xxh3_64(s->vaddr, ws->page_bytes) != le64_to_cpu(sum))
		return -EBADMSG;
	return 0;
}

/* Checked against the sums file, as a fill is (FILLED with VERIFY). */
int kvmem_verify_page(struct kvmem_ws *ws, u64 id, struct kvmem_slot *s)
{
	loff_t pos = sum_offset(ws, id);
	__le64 sum;
	ssize_t n;

	n = kernel_read(ws->sums, &sum, sizeof(sum), &pos);
	if (n != sizeof(sum))
		return n < 0 ? n : -EIO;
	return kvmem_xxh3_64(s->vaddr, ws->page_bytes) == le64_to_cpu(sum) ? 0 : -EBADMSG;
}

/* The page's bytes, then its checksum: a crash between the two leaves a
 * page that fails its check, never one that passes with the wrong bytes.
 */
int kvmem_write_page(struct kvmem_ws *ws, u64 id, struct kvmem_slot *s)
{
	loff_t pos = sum_offset(ws, id);
	__le64 sum;
	ssize_t n;
	int err;

	err = page_io(ws, id, s, true);
	if (err)
		return err;
	sum = cpu_to_le64(kvmem_xxh3_64(s->vaddr, ws->page_bytes));
	/* kernel_write takes the file system's freeze protection itself:
	 * taking it around the call too would wait, holding it, for a freeze
	 * that waits for us.
	 */
	n = kernel_write(ws->sums, &sum, sizeof(sum), &pos);
	if (n != sizeof(sum))
		return n < 0 ? n : -EIO;
	return 0;
}
