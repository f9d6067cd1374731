// SPDX-License-Identifier: GPL-2.0
/*
 * /dev/kvmem: a misc device; each open file is one workspace (struct
 * kvmem_ws), set up once with KVMEM_IOC_SETUP and torn down when the last
 * reference to the file goes (close, or process exit: every mapping holds
 * the file). Every ioctl argument is checked before anything is changed.
 * The ABI is include/uapi/linux/kvmem.h; Documentation/kmod.md describes it.
 */
#include <linux/cred.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/memcontrol.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/nodemask.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>

#include "kvmem_int.h"
#include "kvmem_trace.h"

static int group = -1;
module_param(group, int, 0444);
MODULE_PARM_DESC(group, "gid allowed to open /dev/kvmem besides CAP_SYS_ADMIN (-1: none); makes the node 0660");

static struct workqueue_struct *kvmem_wq;

/* Read-only counters for leak checks, shown next to the parameters. */
atomic_long_t kvmem_pages_held = ATOMIC_LONG_INIT(0);
static atomic_long_t kvmem_open_files = ATOMIC_LONG_INIT(0);
/* Bytes all workspaces reserved at SETUP (window, table, page states). */
static atomic_long_t kvmem_reserved = ATOMIC_LONG_INIT(0);

/*
 * The module-wide cap on what every workspace together may hold: half of
 * RAM when the module loads, at most all of it; root may change it (a
 * lower cap leaves existing workspaces alone).
 */
static unsigned long kvmem_max_memory;

static int kvmem_max_memory_set(const char *val, const struct kernel_param *kp)
{
	unsigned long v;
	int err = kstrtoul(val, 0, &v);

	if (err)
		return err;
	if (!v || v > (unsigned long)totalram_pages() << PAGE_SHIFT)
		return -EINVAL;
	WRITE_ONCE(kvmem_max_memory, v);
	return 0;
}

static const struct kernel_param_ops kvmem_max_memory_ops = {
	.set = kvmem_max_memory_set,
	.get = param_get_ulong,
};
module_param_cb(max_memory, &kvmem_max_memory_ops, &kvmem_max_memory, 0644);
MODULE_PARM_DESC(max_memory, "bytes all workspaces together may hold (window, table, page states; default half of RAM)");

/* Take `bytes` of the cap for a workspace: -EINVAL when it alone exceeds
 * the cap, -ENOMEM when the others leave too little.
 */
static int kvmem_reserve(u64 bytes)
{
	unsigned long cap = READ_ONCE(kvmem_max_memory);
	long cur = atomic_long_read(&kvmem_reserved);

	if (bytes > cap)
		return -EINVAL;
	do {
		if (cur + bytes > cap)
			return -ENOMEM;
	} while (!atomic_long_try_cmpxchg(&kvmem_reserved, &cur, cur + bytes));
	return 0;
}

static int kvmem_counter_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%ld\n", atomic_long_read(kp->arg));
}

static int kvmem_counter_set(const char *val, const struct kernel_param *kp)
{
	return -EPERM;
}

static const struct kernel_param_ops kvmem_counter_ops = {
	.get = kvmem_counter_get,
	.set = kvmem_counter_set,
};
module_param_cb(pages, &kvmem_counter_ops, &kvmem_pages_held, 0444);
MODULE_PARM_DESC(pages, "read-only: pages of memory held in all windows");
module_param_cb(workspaces, &kvmem_counter_ops, &kvmem_open_files, 0444);
MODULE_PARM_DESC(workspaces, "read-only: open files of /dev/kvmem");
module_param_cb(reserved, &kvmem_counter_ops, &kvmem_reserved, 0444);
MODULE_PARM_DESC(reserved, "read-only: bytes of max_memory the workspaces reserved");

static bool kvmem_may_open(void)
{
	if (capable(CAP_SYS_ADMIN))
		return true;
	return group >= 0 && in_group_p(make_kgid(&init_user_ns, group));
}

static int kvmem_open(struct inode *inode, struct file *filp)
{
	struct kvmem_ws *ws;

	if (!kvmem_may_open())
		return -EACCES;
	ws = kzalloc(sizeof(*ws), GFP_KERNEL);
	if (!ws)
		return -ENOMEM;
	mutex_init(&ws->lock);
	init_waitqueue_head(&ws->wq);
	address_space_init_once(&ws->mapping);
	ws->mapping.host = inode;
	ws->mapping.a_ops = inode->i_mapping->a_ops;
	INIT_WORK(&ws->prefetch_work, kvmem_prefetch_work);
	INIT_LIST_HEAD(&ws->prefetch_list);
	filp->f_mapping = &ws->mapping;
	filp->private_data = ws;
	atomic_long_inc(&kvmem_open_files);
	return nonseekable_open(inode, filp);
}

static int kvmem_release(struct inode *inode, struct file *filp)
{
	struct kvmem_ws *ws = filp->private_data;
	struct kvmem_prefetch_batch *b, *tmp;

	mutex_lock(&ws->lock);
	ws->dying = true;
	mutex_unlock(&ws->lock);
	cancel_work_sync(&ws->prefetch_work);
	list_for_each_entry_safe(b, tmp, &ws->prefetch_list, node) {
		list_del(&b->node);
		kvfree(b);
	}
	if (ws->set_up) {
		kvmem_writeback_all(ws);
		kvmem_ws_free_memory(ws);
		kvmem_hint_free(ws);
		fput(ws->pages);
		fput(ws->sums);
		atomic_long_sub(ws->reserved, &kvmem_reserved);
		mem_cgroup_put(ws->memcg);
	}
	mutex_destroy(&ws->lock);
	kfree(ws);
	atomic_long_dec(&kvmem_open_files);
	return 0;
}

/*
 * A private file on the same path as the caller's fd, with the access the
 * caller had (never more) and without O_DIRECT, so the module's I/O needs
 * no alignment and the caller may close or change its own descriptor.
 * dentry_open skips the checks of open(2), so the ones that matter are
 * made here: the module writes anywhere in the file, which a caller who
 * may only append to it (O_APPEND, an append-only or immutable file) could
 * not.
 */
static struct file *kvmem_reopen(int fd, bool rdonly)
{
	struct fd f = fdget(fd);
	struct inode *inode;
	struct file *nf;

	if (!fd_file(f))
		return ERR_PTR(-EBADF);
	inode = file_inode(fd_file(f));
	if (!S_ISREG(inode->i_mode)) {
		nf = ERR_PTR(-EINVAL);
	} else if (!(fd_file(f)->f_mode & FMODE_READ) ||
		   (!rdonly && !(fd_file(f)->f_mode & FMODE_WRITE))) {
		nf = ERR_PTR(-EBADF);
	} else if (!rdonly && ((fd_file(f)->f_flags & O_APPEND) || IS_APPEND(inode) ||
			       IS_IMMUTABLE(inode))) {
		nf = ERR_PTR(-EPERM);
	} else {
		nf = dentry_open(&fd_file(f)->f_path, (rdonly ? O_RDONLY : O_RDWR) | O_LARGEFILE,
				 current_cred());
	}
	fdput(f);
	return nf;
}

/* Both files hold at least `count` pages (and their sums). */
static int kvmem_check_sizes(struct kvmem_ws *ws, u64 count)
{
	u64 blocks = div_u64(count, ws->n_layers);

	if (i_size_read(file_inode(ws->pages)) < count * ws->page_stride)
		return -EINVAL;
	if (i_size_read(file_inode(ws->sums)) < blocks * (ws->n_layers + 1) * 8)
		return -EINVAL;
	return 0;
}

static int kvmem_setup(struct kvmem_ws *ws, void __user *uarg)
{
	struct kvmem_ioc_setup a;
	u64 page_max, n_slots;
	int err, i;

	if (copy_from_user(&a, uarg, sizeof(a)))
		return -EFAULT;
	if ((a.flags & ~KVMEM_SETUP_FLAGS) || a.reserved0)
		return -EINVAL;
	for (i = 0; i < ARRAY_SIZE(a.reserved); i++)
		if (a.reserved[i])
			return -EINVAL;
	if (!a.page_stride || a.page_stride % PAGE_SIZE || a.page_stride % KVMEM_IO_ALIGN ||
	    a.page_stride > KVMEM_STRIDE_MAX)
		return -EINVAL;
	if (!a.page_bytes || round_up(a.page_bytes, KVMEM_IO_ALIGN) != a.page_stride)
		return -EINVAL;
	if (!a.n_layers || a.n_layers > KVMEM_LAYERS_MAX)
		return -EINVAL;
	page_max = a.page_max ? a.page_max : a.page_count;
	if (!page_max || page_max > KVMEM_PAGE_MAX || a.page_count > page_max ||
	    a.page_count % a.n_layers || page_max % a.n_layers)
		return -EINVAL;
	if (a.host_cap < a.page_stride || a.host_cap > READ_ONCE(kvmem_max_memory))
		return -EINVAL;
	/* The table and the page states (40 bytes a page) stay under an
	 * eighth of memory, so no setup can push the machine into the OOM
	 * killer.
	 */
	if (page_max * (sizeof(struct kvmem_pte) + sizeof(struct kvmem_pg)) >
	    ((u64)totalram_pages() << PAGE_SHIFT) / 8)
		return -EINVAL;
	n_slots = div_u64(a.host_cap, a.page_stride);
	if (n_slots > KVMEM_PAGE_MAX)
		return -EINVAL;
	if (a.numa_node != NUMA_NO_NODE &&
	    (a.numa_node < 0 || a.numa_node >= MAX_NUMNODES || !node_online(a.numa_node) ||
	     !node_state(a.numa_node, N_MEMORY)))
		return -EINVAL;

	mutex_lock(&ws->lock);
	if (ws->set_up) {
		err = -EBUSY;
		goto out_unlock;
	}
	ws->rdonly = a.flags & KVMEM_SETUP_RDONLY;
	ws->pages = kvmem_reopen(a.pages_fd, ws->rdonly);
	if (IS_ERR(ws->pages)) {
		err = PTR_ERR(ws->pages);
		goto out_unlock;
	}
	ws->sums = kvmem_reopen(a.sums_fd, ws->rdonly);
	if (IS_ERR(ws->sums)) {
		err = PTR_ERR(ws->sums);
		goto out_pages;
	}
	err = -EINVAL;
	if (file_inode(ws->pages) == file_inode(ws->sums))
		goto out_sums;
	ws->page_bytes = a.page_bytes;
	ws->page_stride = a.page_stride;
	ws->npp = a.page_stride >> PAGE_SHIFT;
	ws->n_layers = a.n_layers;
	ws->node = a.numa_node;
	ws->page_count = a.page_count;
	ws->page_max = page_max;
	ws->ws_id = file_inode(ws->pages)->i_ino;
	err = kvmem_check_sizes(ws, a.page_count);
	if (err)
		goto out_sums;
	ws->reserved = kvmem_ws_memory_bytes(page_max, n_slots, ws->npp);
	err = kvmem_reserve(ws->reserved);
	if (err)
		goto out_sums;
	/* Every page of this workspace is charged to the caller's cgroup,
	 * whoever faults it in or the worker that prefetches it.
	 */
	ws->memcg = get_mem_cgroup_from_mm(current->mm);
	err = kvmem_ws_init_memory(ws, a.host_cap);
	if (err)
		goto out_unreserve;
	/* Pairs with kvmem_ready(): the fields above are seen before set_up. */
	smp_store_release(&ws->set_up, true);
	mutex_unlock(&ws->lock);
	return 0;

out_unreserve:
	mem_cgroup_put(ws->memcg);
	ws->memcg = NULL;
	atomic_long_sub(ws->reserved, &kvmem_reserved);
out_sums:
	fput(ws->sums);
out_pages:
	fput(ws->pages);
	ws->pages = NULL;
	ws->sums = NULL;
out_unlock:
	mutex_unlock(&ws->lock);
	return err;
}

void kvmem_queue_prefetch(struct kvmem_ws *ws)
{
	queue_work(kvmem_wq, &ws->prefetch_work);
}

static bool kvmem_ready(struct kvmem_ws *ws)
{
	/* set_up goes false -> true once, under the lock, after every field
	 * it covers is written.
	 */
	return smp_load_acquire(&ws->set_up);
}

static long kvmem_pages_ioctl(struct kvmem_ws *ws, unsigned int cmd, void __user *uarg)
{
	struct kvmem_ioc_pages a;
	s32 __user *ustatus;
	struct kvmem_prefetch_batch *b;
	u32 allowed = 0, i;
	s32 *status = NULL;
	u64 *ids, count;
	long ret = 0;
	int r;

	if (copy_from_user(&a, uarg, sizeof(a)))
		return -EFAULT;
	if (cmd == KVMEM_IOC_PREFETCH)
		allowed = KVMEM_PAGES_WAIT;
	else if (cmd == KVMEM_IOC_FILLED)
		allowed = KVMEM_PAGES_VERIFY | KVMEM_PAGES_FAILED;
	if ((a.flags & ~allowed) || a.reserved)
		return -EINVAL;
	/* A failed fill has no bytes to verify: one or the other. */
	if ((a.flags & KVMEM_PAGES_VERIFY) && (a.flags & KVMEM_PAGES_FAILED))
		return -EINVAL;
	if (!a.n_pages || a.n_pages > KVMEM_IOC_PAGES_MAX)
		return -EINVAL;
	if ((cmd == KVMEM_IOC_PREFETCH && a.status) || (cmd == KVMEM_IOC_CLAIM && !a.status))
		return -EINVAL;
	ustatus = u64_to_user_ptr(a.status);

	b = kvmalloc(struct_size(b, ids, a.n_pages + (cmd == KVMEM_IOC_PREFETCH ?
							KVMEM_PREFETCH_ADD_MAX : 0)),
		     GFP_KERNEL_ACCOUNT);
	if (!b)
		return -ENOMEM;
	b->n = a.n_pages;
	ids = b->ids;
	if (copy_from_user(ids, u64_to_user_ptr(a.pages), (size_t)a.n_pages * sizeof(u64))) {
		ret = -EFAULT;
		goto out;
	}
	count = READ_ONCE(ws->page_count);
	for (i = 0; i < a.n_pages; i++) {
		if (ids[i] >= count) {
			ret = -EINVAL;
			goto out;
		}
	}
	/* Every result must be deliverable before anything is done: zero the
	 * status array now (access_ok alone passes a PROT_NONE page).
	 */
	if (a.status && clear_user(ustatus, (size_t)a.n_pages * sizeof(s32))) {
		ret = -EFAULT;
		goto out;
	}

	if (cmd == KVMEM_IOC_PREFETCH) {
		ret = kvmem_prefetch_list(ws, b, a.flags & KVMEM_PAGES_WAIT, KVMEM_PREFETCH_LIST);
		if (ret)
			goto out;
		return 0;	/* the batch belongs to the work now */
	}

	if (a.status) {
		status = kvmalloc_array(a.n_pages, sizeof(s32), GFP_KERNEL_ACCOUNT);
		if (!status) {
			ret = -ENOMEM;
			goto out;
		}
	}
	for (i = 0; i < a.n_pages; i++) {
		if (cmd == KVMEM_IOC_CLAIM)
			r = kvmem_claim_page(ws, ids[i]);
		else if (cmd == KVMEM_IOC_FILLED)
			r = kvmem_filled_page(ws, ids[i], a.flags);
		else
			r = kvmem_evict_page(ws, ids[i]);
		if (status)
			status[i] = r;
		if (r < 0 && !ret)
			ret = r;
	}
	if (status && copy_to_user(ustatus, status, (size_t)a.n_pages * sizeof(s32))) {
		/* The array went away meanwhile: claims nobody knows of would
		 * stay claimed until close, so they are undone.
		 */
		if (cmd == KVMEM_IOC_CLAIM)
			for (i = 0; i < a.n_pages; i++)
				if (status[i] == 1)
					kvmem_unclaim_page(ws, ids[i]);
		ret = -EFAULT;
	}
out:
	kvfree(status);
	kvfree(b);
	return ret;
}

static long kvmem_set_count(struct kvmem_ws *ws, u64 count)
{
	long ret;

	mutex_lock(&ws->lock);
	ret = -EINVAL;
	if (count < ws->page_count || count > ws->page_max || count % ws->n_layers)
		goto out;
	ret = kvmem_check_sizes(ws, count);
	if (ret)
		goto out;
	if (count > ws->page_count) {
		u64 old = ws->page_count;

		WRITE_ONCE(ws->page_count, count);
		kvmem_pte_init(ws, old, count);
	}
out:
	mutex_unlock(&ws->lock);
	return ret;
}

static long kvmem_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct kvmem_ws *ws = filp->private_data;
	void __user *uarg = (void __user *)arg;
	struct kvmem_ioc_stats st;
	u64 v;

	switch (cmd) {
	case KVMEM_IOC_SETUP:
	case KVMEM_IOC_PREFETCH:
	case KVMEM_IOC_CLAIM:
	case KVMEM_IOC_FILLED:
	case KVMEM_IOC_EVICT:
	case KVMEM_IOC_SYNC:
	case KVMEM_IOC_STEP:
	case KVMEM_IOC_SET_COUNT:
	case KVMEM_IOC_HINT:
	case KVMEM_IOC_GPU:
		/* Everything but STATS changes the workspace: not through a
		 * descriptor opened for reading only.
		 */
		if (!(filp->f_mode & FMODE_WRITE))
			return -EBADF;
		if (cmd == KVMEM_IOC_SETUP)
			return kvmem_setup(ws, uarg);
		break;
	case KVMEM_IOC_STATS:
		break;
	default:
		return -ENOTTY;
	}
	if (!kvmem_ready(ws))
		return -EINVAL;
	switch (cmd) {
	case KVMEM_IOC_PREFETCH:
	case KVMEM_IOC_CLAIM:
	case KVMEM_IOC_FILLED:
	case KVMEM_IOC_EVICT:
		return kvmem_pages_ioctl(ws, cmd, uarg);
	case KVMEM_IOC_SYNC:
		if (ws->rdonly)
			return 0;
		return kvmem_sync(ws);
	case KVMEM_IOC_STEP:
		if (copy_from_user(&v, uarg, sizeof(v)))
			return -EFAULT;
		mutex_lock(&ws->lock);
		ws->step = v;
		mutex_unlock(&ws->lock);
		/* So BPF policies key their history by this workspace's own
		 * step (kvmempolicy's feeders).
		 */
		trace_kvmem_step(ws->ws_id, v, ws->n_layers);
		return 0;
	case KVMEM_IOC_SET_COUNT:
		if (copy_from_user(&v, uarg, sizeof(v)))
			return -EFAULT;
		return kvmem_set_count(ws, v);
	case KVMEM_IOC_HINT:
		return kvmem_hint(ws, uarg);
	case KVMEM_IOC_GPU:
		return kvmem_gpu(ws, uarg);
	default:	/* KVMEM_IOC_STATS */
		mutex_lock(&ws->lock);
		st = ws->stats;
		mutex_unlock(&ws->lock);
		return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
	}
}

/* Offset 0: the page table, read-only. KVMEM_MMAP_PAGE_WINDOW and above:
 * the window, MAP_SHARED (set up RDONLY: only claimed pages take writes).
 */
static int kvmem_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct kvmem_ws *ws = filp->private_data;
	unsigned long len = vma->vm_end - vma->vm_start;
	u64 first, window_pages;

	if (!kvmem_ready(ws))
		return -EINVAL;
	/* Data, never code: neither mapping may be executable, now or after
	 * an mprotect.
	 */
	if (vma->vm_flags & VM_EXEC)
		return -EPERM;
	kvmem_vm_flags_clear(vma, VM_MAYEXEC);
	if (vma->vm_pgoff == 0) {
		if (len > PAGE_ALIGN(ws->table_bytes))
			return -EINVAL;
		if (vma->vm_flags & VM_WRITE)
			return -EPERM;
		kvmem_vm_flags_clear(vma, VM_MAYWRITE);
		kvmem_vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
		vma->vm_ops = &kvmem_table_vm_ops;
		return vm_map_pages(vma, ws->table_pages, ws->n_table_pages);
	}
	if (vma->vm_pgoff < KVMEM_WINDOW_PGOFF || !(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	first = vma->vm_pgoff - KVMEM_WINDOW_PGOFF;
	window_pages = ws->page_max * ws->npp;
	if (first >= window_pages || (len >> PAGE_SHIFT) > window_pages - first)
		return -EINVAL;
	/* A read-only workspace's window may be mapped writable too, so that
	 * userspace can fill claimed pages (an O_DIRECT read into them); its
	 * page_mkwrite refuses a write to any other page.
	 */
	kvmem_vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
	vma->vm_ops = &kvmem_window_vm_ops;
	vma->vm_private_data = ws;
	return 0;
}

static const struct file_operations kvmem_fops = {
	.owner = THIS_MODULE,
	.open = kvmem_open,
	.release = kvmem_release,
	.unlocked_ioctl = kvmem_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = kvmem_mmap,
	/* no .llseek: nonseekable_open makes lseek ESPIPE (no_llseek is
	 * gone in 6.12)
	 */
};

static struct miscdevice kvmem_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kvmem",
	.fops = &kvmem_fops,
	.mode = 0600,
};

static int __init kvmem_init(void)
{
	int err;

	if (!kvmem_max_memory)	/* not given to insmod */
		kvmem_max_memory = (unsigned long)totalram_pages() << (PAGE_SHIFT - 1);
	kvmem_wq = alloc_workqueue("kvmem", WQ_UNBOUND, 0);
	if (!kvmem_wq)
		return -ENOMEM;
	if (group >= 0)
		kvmem_misc.mode = 0660;
	err = misc_register(&kvmem_misc);
	if (err)
		destroy_workqueue(kvmem_wq);
	return err;
}

static void __exit kvmem_exit(void)
{
	misc_deregister(&kvmem_misc);
	destroy_workqueue(kvmem_wq);
}

module_init(kvmem_init);
module_exit(kvmem_exit);
MODULE_DESCRIPTION("kvmem: a KV-page window with fault, prefetch and BPF-steered reclaim");
MODULE_LICENSE("GPL");
