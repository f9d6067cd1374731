// SPDX-License-Identifier: MIT
/* librados opened at first use: rados_dl.h says why. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "pager/rados_dl.h"

#ifdef KVMEM_HAVE_RADOS
struct kvmem_rados_lib kvmem_rados;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_err[512];

static void load(void)
{
	/* RTLD_NODELETE: librados starts threads and registers atexit
	 * handlers; it stays mapped for the life of the process. */
	void *h = dlopen("librados.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);

	if (!h) {
		snprintf(load_err, sizeof(load_err), "cannot load librados.so.2 (%s): install "
			 "Debian's librados2 (apt-get install librados2)", dlerror());
		return;
	}
#define KVMEM_RADOS_SYM(fn)							\
	if (!load_err[0] && !(*(void **)&kvmem_rados.fn = dlsym(h, #fn)))		\
		snprintf(load_err, sizeof(load_err), "librados.so.2 lacks %s: Ceph 16 "	\
			 "(Pacific) or newer is needed", #fn);
	KVMEM_RADOS_CALLS(KVMEM_RADOS_SYM)
#undef KVMEM_RADOS_SYM
}

int kvmem_rados_load(const char *who)
{
	pthread_once(&once, load);
	if (load_err[0])
		return kvmem_error(ENOPKG, "%s: %s", who, load_err);
	return 0;
}
#endif
