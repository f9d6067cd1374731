// SPDX-License-Identifier: MIT
/* Does a model directory speak this kvmem's agentlang? */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentlang/agentlang.h"
#include "kvmem/kvmem.h"
#include "kvmem/model.h"
#include "model/modelfile.h"
#include "util/json.h"

int agentlang_check_model(const char *dir, const kvmem_config *c)
{
	char path[4200], want[16], *text;
	const char *have;
	json_t *doc;
	size_t len;
	int rc;

	if (c->vocab != agentlang_vocab_size())
		return kvmem_error(ESTALE, "%s: vocabulary of %d tokens; agentlang has %d: not an "
				   "agentlang model", dir, c->vocab, agentlang_vocab_size());
	snprintf(path, sizeof(path), "%s/config.json", dir);
	if ((rc = kvmem_mf_read(path, 16u << 20, &text, &len)) < 0)
		return rc;
	rc = kvmem_json_load(text, len, path, &doc);
	free(text);
	if (rc < 0)
		return rc;
	have = json_string_value(json_object_get(doc, "kvmem_vocab_hash"));
	snprintf(want, sizeof(want), "%08x", agentlang_vocab_hash());
	if (!have)
		rc = 1;
	else if (strcmp(have, want))
		rc = kvmem_error(ESTALE, "%s: trained on agentlang vocabulary %s, this kvmem has %s",
				 path, have, want);
	json_decref(doc);
	return rc;
}
