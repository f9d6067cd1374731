// SPDX-License-Identifier: GPL-2.0
/*
 * Who may open /dev/kvmem: root only by default (the node is 0600 and the
 * module checks CAP_SYS_ADMIN itself, even on a node made world-readable);
 * with the module's group= parameter, members of that group too. Run twice
 * by the VM's /init: without and with group=4242.
 */
#include <grp.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "vmtest.h"

#define NOBODY 65534

/* In a child: drop to uid/gid NOBODY with the given supplementary group
 * (or none), open the device, return 0 when open succeeded or the errno. */
static int open_as(gid_t group, int with_group)
{
	pid_t pid = fork();
	int status;

	if (pid == 0) {
		gid_t g = group;
		int fd;

		if (setgroups(with_group ? 1 : 0, &g) || setgid(NOBODY) || setuid(NOBODY))
			_exit(200);
		fd = open(VT_DEV, O_RDWR);
		_exit(fd >= 0 ? 0 : errno);
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

TEST(unprivileged_open_refused)
{
	struct stat sb;

	if (vt_param("group") >= 0)
		SKIP(return, "module loaded with group=: see group_member_opens");
	ASSERT_EQ(0, stat(VT_DEV, &sb));
	ASSERT_EQ(0600, sb.st_mode & 0777);
	ASSERT_EQ(EACCES, open_as(0, 0));
	/* The module's own check holds on a node opened to everyone. */
	ASSERT_EQ(0, chmod(VT_DEV, 0666));
	ASSERT_EQ(EACCES, open_as(0, 0));
	ASSERT_EQ(0, chmod(VT_DEV, 0600));
	/* Root opens it. */
	ASSERT_LE(0, open(VT_DEV, O_RDWR));
}

TEST(group_member_opens)
{
	long g = vt_param("group");
	struct stat sb;

	if (g < 0)
		SKIP(return, "module loaded without group=");
	ASSERT_EQ(0, stat(VT_DEV, &sb));
	ASSERT_EQ(0660, sb.st_mode & 0777);
	/* What a udev rule (GROUP="kvmem") does on a real system. */
	ASSERT_EQ(0, chown(VT_DEV, 0, g));
	ASSERT_EQ(0, open_as(g, 1));
	ASSERT_EQ(EACCES, open_as(g + 1, 1));
	ASSERT_EQ(EACCES, open_as(0, 0));
	/* Group permission on the node alone is not enough: the module checks
	 * membership of its own group. */
	ASSERT_EQ(0, chown(VT_DEV, 0, g + 1));
	ASSERT_EQ(EACCES, open_as(g + 1, 1));
	ASSERT_EQ(0, chown(VT_DEV, 0, 0));
}

/* A member of the group sets up a workspace and reads pages. */
TEST(group_member_uses_a_workspace)
{
	long g = vt_param("group");
	struct vt_ws w;
	pid_t pid;
	int status;

	if (g < 0)
		SKIP(return, "module loaded without group=");
	ASSERT_EQ(0, vt_ws_open(&w, VT_WS_SMALL));
	ASSERT_EQ(0, chown(VT_DEV, 0, g));
	pid = fork();
	if (pid == 0) {
		gid_t gg = g;
		kvmem_kmod *k;
		unsigned char b[64];

		/* The workspace fds were opened as root; they travel. */
		if (setgroups(1, &gg) || setgid(NOBODY) || setuid(NOBODY))
			_exit(200);
		k = vt_kmod(&w, 8);
		if (!k)
			_exit(1);
		if (vt_read(kvmem_kmod_page_addr(k, 5), b, sizeof(b)) ||
		    memcmp(b, w.ref + 5 * w.page_stride, sizeof(b)))
			_exit(2);
		_exit(0);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_EQ(0, WEXITSTATUS(status));
	ASSERT_EQ(0, chown(VT_DEV, 0, 0));
	vt_ws_close(&w);
}

TEST_HARNESS_MAIN
