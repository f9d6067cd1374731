// SPDX-License-Identifier: MIT
/*
 * Writes a workspace directory for the VM tests with the real userspace
 * pager (kvmem_pager_open / append / commit), so the pages and sums files
 * the module reads have the layout and checksums kvmem itself produces.
 * Page contents are random (splitmix64 from --seed).
 *
 *   kvmem_genws DIR --layers L --kv-heads H --head-dim D --block B --blocks N [--seed S]
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/pager.h"

static uint64_t next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void fill(uint64_t *rng, void *buf, size_t len)
{
	unsigned char *b = buf;

	for (size_t i = 0; i < len; i += 8) {
		uint64_t v = next(rng);

		memcpy(b + i, &v, len - i < 8 ? len - i : 8);
	}
}

static int usage(void)
{
	fprintf(stderr, "usage: kvmem_genws DIR --layers L --kv-heads H --head-dim D "
		"--block B --blocks N [--seed S]\n");
	return 2;
}

int main(int argc, char **argv)
{
	kvmem_page_geom g = { .fingerprint = 0x6b766d656d766d31ull, .dtype = KVMEM_DTYPE_F32 };
	uint64_t blocks = 0, seed = 1;
	kvmem_pager_opts o;
	kvmem_pager *p;
	const char *dir;
	void **layers;
	void *index;
	int32_t *ids;

	if (argc < 2 || argv[1][0] == '-')
		return usage();
	dir = argv[1];
	for (int i = 2; i + 1 < argc; i += 2) {
		uint64_t v = strtoull(argv[i + 1], NULL, 0);

		if (!strcmp(argv[i], "--layers"))
			g.n_layers = (uint32_t)v;
		else if (!strcmp(argv[i], "--kv-heads"))
			g.n_kv_heads = g.n_heads = (uint32_t)v;
		else if (!strcmp(argv[i], "--head-dim"))
			g.head_dim = (uint32_t)v;
		else if (!strcmp(argv[i], "--block"))
			g.block_tokens = (uint32_t)v;
		else if (!strcmp(argv[i], "--blocks"))
			blocks = v;
		else if (!strcmp(argv[i], "--seed"))
			seed = v;
		else
			return usage();
	}
	/* An index record too, so the sums file has its L + 1 sums per block. */
	g.index_bytes = 64;
	if (kvmem_page_geom_check(&g, dir) < 0 || !blocks) {
		fprintf(stderr, "kvmem_genws: %s\n", blocks ? kvmem_last_error() : "--blocks missing");
		return 2;
	}
	kvmem_pager_opts_default(&o);
	o.host_cap = 16 << 20;
	o.flags = KVMEM_PAGER_CREATE;
	if (kvmem_pager_open(dir, &g, &o, &p) < 0) {
		fprintf(stderr, "kvmem_genws: %s\n", kvmem_last_error());
		return 1;
	}
	layers = calloc(g.n_layers, sizeof(*layers));
	index = malloc(g.index_bytes);
	ids = malloc(sizeof(*ids) * g.block_tokens);
	for (uint32_t l = 0; l < g.n_layers; l++)
		layers[l] = malloc(kvmem_page_bytes(&g));
	for (uint64_t b = 0; b < blocks; b++) {
		uint64_t rng = seed ^ (b * 0x100000001b3ull);

		for (uint32_t t = 0; t < g.block_tokens; t++)
			ids[t] = (int32_t)(next(&rng) % 1000);
		for (uint32_t l = 0; l < g.n_layers; l++)
			fill(&rng, layers[l], kvmem_page_bytes(&g));
		fill(&rng, index, g.index_bytes);
		if (kvmem_pager_append_tokens(p, ids, g.block_tokens) < 0 ||
		    kvmem_pager_append_block(p, b, (const void *const *)layers, index) < 0) {
			fprintf(stderr, "kvmem_genws: %s\n", kvmem_last_error());
			return 1;
		}
	}
	if (kvmem_pager_commit(p, NULL, NULL, NULL, 0) < 0 || kvmem_pager_close(p) < 0) {
		fprintf(stderr, "kvmem_genws: %s\n", kvmem_last_error());
		return 1;
	}
	printf("%s: %" PRIu64 " blocks x %u layers, page %zu bytes, stride %zu\n", dir, blocks,
	       g.n_layers, kvmem_page_bytes(&g), kvmem_page_stride(&g));
	return 0;
}
