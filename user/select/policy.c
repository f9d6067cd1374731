// SPDX-License-Identifier: MIT
/*
 * The policy table, generated from policies.def (one line per policy), and
 * the policies registered at run time (kvmem_policy_register: a test file or
 * a research program adds its own without touching the library).
 */
#include <stdio.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "select/select.h"

#define KVMEM_POLICY(name) extern const kvmem_policy_ops kvmem_policy_##name;
#include "select/policies.def"
#undef KVMEM_POLICY

const kvmem_policy_ops *const kvmem_policies[] = {
#define KVMEM_POLICY(name) &kvmem_policy_##name,
#include "select/policies.def"
#undef KVMEM_POLICY
	NULL,
};

#define N_SHIPPED ((int)(sizeof(kvmem_policies) / sizeof(kvmem_policies[0])) - 1)

static const kvmem_policy_ops *extra[KVMEM_POLICY_EXTRA];
static int n_extra;

const kvmem_policy_ops *kvmem_policy_at(int i)
{
	if (i < 0)
		return NULL;
	if (i < N_SHIPPED)
		return kvmem_policies[i];
	return i - N_SHIPPED < n_extra ? extra[i - N_SHIPPED] : NULL;
}

int kvmem_policy_register(const kvmem_policy_ops *ops)
{
	if (!ops || !ops->name || !*ops->name || !ops->score)
		return kvmem_error(EINVAL, "workspace: a policy needs a name and a score function");
	if (strlen(ops->name) > 31)
		return kvmem_error(EINVAL, "workspace: policy name '%s' is longer than 31 characters",
				   ops->name);
	for (int i = 0; kvmem_policy_at(i); i++)
		if (!strcmp(kvmem_policy_at(i)->name, ops->name))
			return kvmem_error(EEXIST, "workspace: a policy named '%s' exists already",
					   ops->name);
	if (n_extra == KVMEM_POLICY_EXTRA)
		return kvmem_error(ENOSPC, "workspace: %d policies registered already, the most there "
				   "is room for", KVMEM_POLICY_EXTRA);
	extra[n_extra++] = ops;
	return 0;
}

const kvmem_policy_ops *kvmem_policy_find(const char *name)
{
	char known[512] = "";
	size_t at = 0;
	const kvmem_policy_ops *p;

	if (!name || !*name)
		return kvmem_policies[0];
	for (int i = 0; (p = kvmem_policy_at(i)); i++)
		if (!strcmp(p->name, name))
			return p;
	for (int i = 0; (p = kvmem_policy_at(i)) && at < sizeof(known); i++)
		at += snprintf(known + at, sizeof(known) - at, "%s%s", i ? ", " : "", p->name);
	kvmem_error(EINVAL, "workspace: unknown policy '%s' (known: %s)", name, known);
	return NULL;
}
