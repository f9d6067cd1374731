// SPDX-License-Identifier: MIT
/* Does a model directory speak this kvmem's agentlang? */
#include <stdio.h>
#include <string.h>

#include "agentlang/agentlang.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "util/json.h"

int agentlang_check_model(const char *dir, const kvmem_config *c)
{
	char path[4200], want[16];
	const char *have;
	kvmem_json *doc;
	int rc = 0;

	if (c->vocab != agentlang_vocab_size())
		return kvmem_error(ESTALE, "%s: vocabulary of %d tokens; agentlang has %d: not an "
				   "agentlang model", dir, c->vocab, agentlang_vocab_size());
	snprintf(path, sizeof(path), "%s/config.json", dir);
	if (!(doc = kvmem_json_parse_file(path)))
		return kvmem_fail();
	have = kvmem_json_str(kvmem_json_get(doc, "kvmem_vocab_hash"), NULL);
	snprintf(want, sizeof(want), "%08x", agentlang_vocab_hash());
	if (!have)
		rc = 1;
	else if (strcmp(have, want))
		rc = kvmem_error(ESTALE, "%s: trained on agentlang vocabulary %s, this kvmem has %s",
				 path, have, want);
	kvmem_json_free(doc);
	return rc;
}
