// SPDX-License-Identifier: MIT
/*
 * Embedding kvmem: a program of your own runs an agent session whose
 * history lives in a workspace directory, stops, and goes on where it
 * stopped with no re-prefill. Build it against an installed kvmem:
 *
 *   cc -std=c11 embed.c $(pkg-config --cflags --libs kvmem) -o embed
 *   ./embed /tmp/embed-demo
 *
 * It writes a small random Qwen3-shaped model to DIR/model (kvmem's
 * generator: no download), then runs two "processes" worth of steps over
 * DIR/ws and prints the tokens each step decoded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvmem/backend.h>
#include <kvmem/kvmem.h>
#include <kvmem/model.h>
#include <kvmem/store.h>
#include <kvmem/session.h>

#define CHECK(x)                                                                   \
	do {                                                                       \
		if ((x) < 0) {                                                     \
			fprintf(stderr, "embed: %s: %s (%s)\n", #x, kvmem_last_error(), \
				strerror(kvmem_last_errno()));                     \
			exit(1);                                                   \
		}                                                                  \
	} while (0)

/* One run: open the workspace, take its history over, append a "tool
 * result" of n tokens, decode 8 with the view frozen, commit. */
static void run(const char *ws_dir, kvmem_model *m, kvmem_backend *be, uint64_t seed, int n)
{
	kvmem_workspace *w;
	kvmem_session_opts so;
	kvmem_session *s;
	int32_t *tok = malloc(n * sizeof(int32_t)), out[8];
	uint64_t rng = kvmem_rng_seed(seed);

	CHECK(kvmem_workspace_open(ws_dir, m, NULL, &w));
	kvmem_session_opts_default(&so);
	so.budget = 256;		/* history tokens in the view */
	so.chunk = 64;
	so.source = kvmem_workspace_source(w);
	s = kvmem_session_create(be, &so);
	CHECK(s ? 0 : -1);
	CHECK(kvmem_workspace_adopt(w, s));
	printf("reopened with %lld tokens\n", (long long)kvmem_session_tokens(s));
	for (int i = 0; i < n; i++)
		tok[i] = (int32_t)(kvmem_rng_uniform(&rng) * m->cfg.vocab);
	CHECK(kvmem_session_append(s, tok, n, 0));
	CHECK(kvmem_session_select(s));
	CHECK(kvmem_session_decode(s, 8, NULL, out));
	CHECK(kvmem_workspace_commit(w, s));
	printf("decoded:");
	for (int i = 0; i < 8; i++)
		printf(" %d", out[i]);
	printf("\n");
	kvmem_session_free(s);
	CHECK(kvmem_workspace_close(w));
	free(tok);
}

int main(int argc, char **argv)
{
	char model_dir[4096], ws_dir[4096];
	kvmem_model *m;
	kvmem_backend *be;

	if (argc != 2) {
		fprintf(stderr, "usage: embed DIR\n");
		return 2;
	}
	snprintf(model_dir, sizeof(model_dir), "%s/model", argv[1]);
	snprintf(ws_dir, sizeof(ws_dir), "%s/ws", argv[1]);
	CHECK(kvmem_model_generate(&kvmem_preset_find("tiny")->cfg, model_dir, 1, NULL, NULL));
	CHECK(kvmem_model_load(model_dir, &m));
	CHECK(kvmem_backend_open("cpu", m, NULL, &be));
	run(ws_dir, m, be, 1, 300);	/* a first process */
	run(ws_dir, m, be, 2, 200);	/* a later one goes on */
	kvmem_backend_close(be);
	kvmem_model_free(m);
	return 0;
}
