/* SPDX-License-Identifier: MIT */
/* The client's private parts, shared by the files of user/kmod/. */
#ifndef KVMEM_KMOD_INT_H
#define KVMEM_KMOD_INT_H

#include "kvmem/kmod.h"

/* k owns fd (the workspace's writer's lock) from now on and closes it
 * last, in kvmem_kmod_close. */
void kmod_keep_lock(kvmem_kmod *k, int fd);

#endif
