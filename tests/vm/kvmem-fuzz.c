// SPDX-License-Identifier: GPL-2.0
/*
 * A few thousand seeded random and malformed calls on /dev/kvmem: ioctl
 * numbers (ours, ours with wrong sizes or directions, anything), argument
 * structs with one field broken, pointers that are NULL, unmapped, in the
 * kernel's half or running off the end of a mapping, random mmaps and
 * touches of what they map, opens and closes in between. Every call must
 * return 0 or a documented errno, and the VM's /init fails the step when the
 * kernel log shows BUG:, WARNING: or Oops afterwards. Replay a failure with
 * KVMEM_TEST_SEED.
 */
#include <sys/ioctl.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "vmtest.h"

#define ROUNDS 4000
#define NFD 3

struct fz {
	uint64_t rng;
	struct vt_ws w;
	int fd[NFD];
	unsigned char *edge;	/* a page followed by a PROT_NONE page */
	void *gone;		/* an address that was unmapped */
	int devnull, dirfd;
};

static uint64_t r64(struct fz *z)
{
	return vt_rng(&z->rng);
}

static uint64_t below(struct fz *z, uint64_t n)
{
	return n ? r64(z) % n : 0;
}

static int errno_ok(int e)
{
	switch (e) {
	case EINVAL: case EFAULT: case ENOTTY: case EBADF: case EBUSY: case ENOMEM:
	case EAGAIN: case EPERM: case EACCES: case EIO: case EBADMSG: case EINTR:
		return 1;
	default:
		return 0;
	}
}

/* A user pointer: good (to buf), or one of the bad kinds. */
static uint64_t ptr(struct fz *z, void *buf, size_t len)
{
	switch (below(z, 10)) {
	case 0:
		return 0;
	case 1:
		return below(z, 4096);
	case 2:
		return (uintptr_t)z->gone;
	case 3:
		return 0xffff888000000000ull + below(z, 1u << 20) * 8;
	case 4:	/* the last bytes before the guard page */
		return (uintptr_t)(z->edge + 4096 - (len > 8 ? 8 : len));
	case 5:
		return r64(z);
	default:
		return (uintptr_t)buf;
	}
}

static int some_fd(struct fz *z)
{
	static const int odd[] = { -1, 0, 1, 9999, -100 };

	switch (below(z, 8)) {
	case 0:
		return z->devnull;
	case 1:
		return z->dirfd;
	case 2:
		return z->fd[below(z, NFD)];
	case 3:
		return odd[below(z, 5)];
	case 4:
		return z->w.sums_fd;
	default:
		return z->w.pages_fd;
	}
}

static void mk_setup(struct fz *z, struct kvmem_ioc_setup *s)
{
	memset(s, 0, sizeof(*s));
	s->pages_fd = z->w.pages_fd;
	s->sums_fd = z->w.sums_fd;
	s->page_bytes = z->w.page_bytes;
	s->page_stride = z->w.page_stride;
	s->n_layers = z->w.n_layers;
	s->numa_node = -1;
	s->page_count = z->w.pages;
	s->host_cap = (1 + below(z, 64)) * z->w.page_stride;
	switch (below(z, 16)) {	/* break one thing, or nothing */
	case 0: s->pages_fd = some_fd(z); break;
	case 1: s->sums_fd = some_fd(z); break;
	case 2: s->page_bytes = (uint32_t)r64(z); break;
	case 3: s->page_stride = (uint32_t)r64(z); break;
	case 4: s->n_layers = (uint32_t)below(z, 2000); break;
	case 5: s->numa_node = (int32_t)r64(z); break;
	case 6: s->page_count = r64(z) >> below(z, 64); break;
	case 7: s->page_max = r64(z) >> below(z, 64); break;
	case 8: s->host_cap = r64(z) >> below(z, 64); break;
	case 9: s->flags = (uint32_t)r64(z); break;
	case 10: s->reserved0 = 1; break;
	case 11: s->reserved[below(z, 4)] = r64(z) | 1; break;
	case 12: s->page_max = s->page_count + s->n_layers * below(z, 8); break;
	default: break;
	}
}

static void mk_pages(struct fz *z, struct kvmem_ioc_pages *a, uint64_t *ids, int32_t *st,
		     size_t cap)
{
	size_t n = 1 + below(z, cap);

	for (size_t i = 0; i < n; i++)
		ids[i] = below(z, 5) ? below(z, z->w.pages) : r64(z) >> below(z, 64);
	memset(a, 0, sizeof(*a));
	a->pages = below(z, 6) ? (uintptr_t)ids : ptr(z, ids, n * 8);
	a->status = below(z, 2) ? (uintptr_t)st : (below(z, 2) ? 0 : ptr(z, st, n * 4));
	a->n_pages = below(z, 12) ? n : (uint32_t)r64(z);
	a->flags = below(z, 4) ? (uint32_t)below(z, 4) : (uint32_t)r64(z);
	if (!below(z, 12))
		a->reserved = r64(z);
}

static const unsigned long cmds[] = {
	KVMEM_IOC_SETUP, KVMEM_IOC_PREFETCH, KVMEM_IOC_CLAIM, KVMEM_IOC_FILLED,
	KVMEM_IOC_EVICT, KVMEM_IOC_SYNC, KVMEM_IOC_STEP, KVMEM_IOC_SET_COUNT, KVMEM_IOC_STATS,
};

static unsigned long pick_cmd(struct fz *z)
{
	switch (below(z, 10)) {
	case 0:	/* our type, any number, size, direction */
		return _IOC(below(z, 4), KVMEM_IOC_MAGIC, below(z, 16), below(z, 512));
	case 1:
		return (unsigned long)r64(z);
	case 2:	/* a real command with another size */
		return (cmds[below(z, 9)] & ~(_IOC_SIZEMASK << _IOC_SIZESHIFT)) |
		       ((below(z, 256) & _IOC_SIZEMASK) << _IOC_SIZESHIFT);
	default:
		return cmds[below(z, 9)];
	}
}

/* Map something, touch it (SIGBUS is fine: a bad page), unmap. */
static int random_mmap(struct fz *z, int fd)
{
	static const uint64_t offs[] = { 0, KVMEM_MMAP_PAGE_WINDOW, 4096,
					 KVMEM_MMAP_PAGE_WINDOW - 4096 };
	size_t len = 4096 * (1 + below(z, 300));
	int prot = below(z, 3) ? PROT_READ : PROT_READ | PROT_WRITE;
	int flags = below(z, 5) ? MAP_SHARED : MAP_PRIVATE;
	uint64_t off = below(z, 5) ? offs[below(z, 4)] : (r64(z) & ~4095ull) >> below(z, 40);
	unsigned char *m, b;

	if (below(z, 2))
		off = KVMEM_MMAP_PAGE_WINDOW + below(z, z->w.pages) * z->w.page_stride;
	m = mmap(NULL, len, prot, flags, fd, off);
	if (m == MAP_FAILED)
		return errno_ok(errno) || errno == ENODEV;
	for (int i = 0; i < 4; i++) {
		size_t at = below(z, len);

		if (prot & PROT_WRITE && below(z, 2))
			vt_write(m + at, "x", 1);
		else
			vt_read(m + at, &b, 1);
	}
	munmap(m, len);
	return 1;
}

FIXTURE(fuzz) {
	int unused;
};

FIXTURE_SETUP(fuzz)
{
}

FIXTURE_TEARDOWN(fuzz)
{
}

TEST_F_TIMEOUT(fuzz, random_and_malformed_calls, 300)
{
	struct fz z;
	union {
		struct kvmem_ioc_setup s;
		struct kvmem_ioc_pages p;
		struct kvmem_ioc_stats st;
		uint64_t v;
		unsigned char raw[512];
	} arg;
	uint64_t ids[96];
	int32_t st[96];
	int bad = 0, calls = 0, ok = 0;

	memset(&z, 0, sizeof(z));
	z.rng = vt_seed("kvmem-fuzz");
	ASSERT_EQ(0, vt_ws_open(&z.w, VT_WS_SMALL));
	z.edge = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, z.edge);
	ASSERT_EQ(0, mprotect(z.edge + 4096, 4096, PROT_NONE));
	z.gone = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(z.gone, 4096);
	z.devnull = open("/dev/null", O_RDWR);
	z.dirfd = open("/tmp", O_RDONLY | O_DIRECTORY);
	for (int i = 0; i < NFD; i++)
		z.fd[i] = open(VT_DEV, O_RDWR);

	for (int r = 0; r < ROUNDS; r++) {
		int i = below(&z, NFD), ret;
		unsigned long cmd;
		void *a;

		if (!below(&z, 200)) {	/* close and reopen: teardown mid-way */
			close(z.fd[i]);
			z.fd[i] = open(VT_DEV, O_RDWR);
			continue;
		}
		if (!below(&z, 15)) {
			bad += !random_mmap(&z, z.fd[i]);
			continue;
		}
		cmd = pick_cmd(&z);
		memset(&arg, 0, sizeof(arg));
		for (size_t k = 0; k < sizeof(arg.raw); k += 8) {
			uint64_t v = r64(&z);

			memcpy(arg.raw + k, &v, 8);
		}
		if (cmd == KVMEM_IOC_SETUP)
			mk_setup(&z, &arg.s);
		else if (cmd == KVMEM_IOC_PREFETCH || cmd == KVMEM_IOC_CLAIM ||
			 cmd == KVMEM_IOC_FILLED || cmd == KVMEM_IOC_EVICT)
			mk_pages(&z, &arg.p, ids, st, 96);
		else if (cmd == KVMEM_IOC_SET_COUNT)
			arg.v = below(&z, 3) ? z.w.pages - z.w.n_layers * below(&z, 3) : r64(&z);
		a = (void *)(uintptr_t)ptr(&z, &arg, sizeof(arg));
		if (below(&z, 3))
			a = &arg;
		ret = ioctl(z.fd[i], cmd, a);
		calls++;
		if (ret == 0)
			ok++;
		else if (!errno_ok(errno)) {
			TH_LOG("round %d: ioctl 0x%lx gave errno %d", r, cmd, errno);
			bad++;
		}
	}
	TH_LOG("%d ioctls, %d succeeded", calls, ok);
	ASSERT_EQ(0, bad);
	ASSERT_GT(ok, 50);	/* valid calls were among them */
	for (int i = 0; i < NFD; i++)
		close(z.fd[i]);
	/* Everything is freed once the files are closed. */
	ASSERT_EQ(0, vt_param("workspaces"));
	ASSERT_EQ(0, vt_param("pages"));
	vt_ws_close(&z.w);
}

TEST_HARNESS_MAIN
