// SPDX-License-Identifier: MIT
/* The policy table, generated from policies.def (one line per policy). */
#include <stdio.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/workspace.h"

#define KVMEM_POLICY(name) extern const kvmem_policy_ops kvmem_policy_##name;
#include "workspace/policies.def"
#undef KVMEM_POLICY

const kvmem_policy_ops *const kvmem_policies[] = {
#define KVMEM_POLICY(name) &kvmem_policy_##name,
#include "workspace/policies.def"
#undef KVMEM_POLICY
	NULL,
};

const kvmem_policy_ops *kvmem_policy_find(const char *name)
{
	char known[256] = "";
	size_t at = 0;

	if (!name || !*name)
		return kvmem_policies[0];
	for (int i = 0; kvmem_policies[i]; i++)
		if (!strcmp(kvmem_policies[i]->name, name))
			return kvmem_policies[i];
	for (int i = 0; kvmem_policies[i] && at < sizeof(known); i++)
		at += snprintf(known + at, sizeof(known) - at, "%s%s", i ? ", " : "",
			       kvmem_policies[i]->name);
	kvmem_error(EINVAL, "workspace: unknown policy '%s' (known: %s)", name, known);
	return NULL;
}
