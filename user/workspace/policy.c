// SPDX-License-Identifier: MIT
/* The policy table, generated from policies.def (one line per policy). */
#include <stdio.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/workspace.h"

#define KVM_POLICY(name) extern const kvm_policy_ops kvm_policy_##name;
#include "workspace/policies.def"
#undef KVM_POLICY

const kvm_policy_ops *const kvm_policies[] = {
#define KVM_POLICY(name) &kvm_policy_##name,
#include "workspace/policies.def"
#undef KVM_POLICY
	NULL,
};

const kvm_policy_ops *kvm_policy_find(const char *name)
{
	char known[256] = "";
	size_t at = 0;

	if (!name || !*name)
		return kvm_policies[0];
	for (int i = 0; kvm_policies[i]; i++)
		if (!strcmp(kvm_policies[i]->name, name))
			return kvm_policies[i];
	for (int i = 0; kvm_policies[i] && at < sizeof(known); i++)
		at += snprintf(known + at, sizeof(known) - at, "%s%s", i ? ", " : "",
			       kvm_policies[i]->name);
	kvm_error("workspace: unknown policy '%s' (known: %s)", name, known);
	return NULL;
}
