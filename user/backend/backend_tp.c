// SPDX-License-Identifier: MIT
/*
 * --tp N at backend open: the split must divide the model (user/tp/tp.h),
 * the backend must be one that spreads over GPUs and have N of them, and
 * until the multi-GPU forward exists (issue 30) N > 1 stops there. So a
 * user learns which of the three is missing, in that order.
 */
#include <errno.h>

#include "backend/backend_impl.h"
#include "kvmem/kvmem.h"
#include "tp/tp.h"

int kvmem_backend_tp_check(const kvmem_backend_ops *ops, const kvmem_model *m,
			   const kvmem_backend_opts *o)
{
	int have;

	if (o->tp == 0)
		return 0;
	if (o->tp < 0)
		return kvmem_error(EINVAL, "backend %s: --tp %d: the rank count is not positive",
				   ops->name, o->tp);
	if (kvmem_tp_check(&m->cfg, o->tp))
		return kvmem_error_prefix("backend %s: --tp %d", ops->name, o->tp);
	if (o->tp == 1)
		return 0;
	if (!ops->devices)
		return kvmem_error(ENODEV, "backend %s: --tp %d: this backend runs one rank (--tp "
				   "1); %d ranks need the cuda backend and %d GPUs", ops->name,
				   o->tp, o->tp, o->tp);
	if ((have = ops->devices()) < o->tp)
		return kvmem_error(ENODEV, "backend %s: --tp %d needs %d GPUs; %d here", ops->name,
				   o->tp, o->tp, have < 0 ? 0 : have);
	return kvmem_error(ENOTSUP, "backend %s: --tp %d: %d GPUs are here, but the forward "
			   "pass over several GPUs is not built yet (issue 30: the split, its "
			   "CPU reference and the NCCL loader are; tests/gpu/tp.sh)", ops->name,
			   o->tp, have);
}
