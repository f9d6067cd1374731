// SPDX-License-Identifier: MIT
/*
 * kvmem serve as an app (serve.h): the options' defaults, and start and
 * stop in their order: the model, its tokenizer and the backend, then the
 * engine thread, then the listener; stopping undoes them the other way, so
 * no request arrives at an engine that is gone.
 */
#ifndef KVMEM_NO_SERVE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend_impl.h"
#include "kvmem/backend.h"
#include "kvmem/kvmem.h"
#include "serve_int.h"
#include "util/fs.h"

void serve_cfg_default(struct serve_cfg *c)
{
	memset(c, 0, sizeof(*c));
	c->host = "127.0.0.1";
	c->port = 8000;
	c->max_body = 1 << 20;
	c->max_request_tokens = 16000;
	c->default_max_tokens = 256;
	c->max_conversations = 10000;
	c->max_open = 64;
	c->max_queue = 256;
	c->max_inflight = 64;
	c->max_batch = 64;
	c->prefill_budget = 0;		/* the backend's: serve_prefill_defaults */
	c->prefill_order = SERVE_PREFILL_FCFS;	/* the oldest prompt first */
	c->max_conv_queue = 4;
	c->max_n = 16;
	c->idle_close = 300;
	c->idle_release = 30;
	c->max_views = 64;
	c->view_slice_ms = 5;
	c->request_timeout = 600;
	c->budget = -1;
	c->block = 32;
	c->chunk = 0;			/* likewise */
	c->host_cap = 256 << 20;
}

/*
 * The prefill's shape when the options leave it: a chunk (a conversation's
 * tokens in one forward pass) and the tokens of every chunk in a round.
 * Each chunk is a forward pass of its own. On the cpu backend a 128-token
 * chunk is already compute-bound and a round of 512 keeps the others'
 * decode moving. On a GPU a forward pass reads all the weights whatever
 * its rows (16 GB at the 8B geometry, about 4 ms on the H200), and the
 * session's work around each chunk is paid per chunk: on the H200 at the
 * 8B geometry an 8K-token prompt's first token took 0.68 s in 128-token
 * chunks, 0.42 s in 512 and 0.37 s in 1024, and at 16 Poisson clients the
 * p99 was 4.01x the unloaded one in 512-token chunks (4.09x with 4096
 * tokens a round: the chunk, not the round) and 2.72x in 1024
 * (benchmarks.md, "The first token under load, against an ideal server").
 * The session's buffers grow with the chunk (its K and V rows, twice:
 * about 300 MB pinned a running turn at 1024 on the 8B geometry). The
 * largest default opens the backend (its scratch is sized by it); the
 * chunk then follows the backend it turned out to be (auto picks at open).
 */
enum { SERVE_CHUNK_CPU = 128, SERVE_CHUNK_DEVICE = 1024, SERVE_ROUND_CHUNKS = 4 };

static void serve_prefill_defaults(struct serve *sv)
{
	const int device = sv->be->ops->host_register != NULL;	/* its own memory */

	if (!sv->cfg.chunk)
		sv->cfg.chunk = device ? SERVE_CHUNK_DEVICE : SERVE_CHUNK_CPU;
	if (!sv->cfg.prefill_budget)
		sv->cfg.prefill_budget = (int64_t)SERVE_ROUND_CHUNKS * sv->cfg.chunk;
}

/*
 * The conversations' host pool pinned (registered with the backend) once,
 * here: every session over it then finds it pinned (a count, user/session/
 * view.c's ws_register), and no request pays for pinning. Before, the
 * first session to lay pages out pinned it inside its request and the
 * last to close unpinned it, so a later request paid again (a 2.73 GB
 * pool: 0.434 s on the H200's host). The cpu backend has nothing to pin;
 * a refusal only means pages are staged. KVMEM_SERVE_PIN=0 leaves it to
 * the sessions as before (a measurement's peer, tests/serve/release_py.py).
 */
static void pin_pool(struct serve *sv)
{
	const kvmem_backend_ops *ops = sv->be->ops;
	const char *e = getenv("KVMEM_SERVE_PIN");
	void *base = NULL;
	size_t len = 0;
	double t0;

	if (!sv->pool || !ops->host_register || (e && !strcmp(e, "0")))
		return;
	kvmem_pager_pool_region(sv->pool, &base, &len);
	if (!base || !len)
		return;
	t0 = serve_now();
	if (ops->host_register(sv->be->ctx, base, len) == 0) {
		sv->pinned = base;
		sv->pinned_bytes = len;
	} else if (!sv->cfg.quiet) {
		fprintf(stderr, "%s: the host pool stays unpinned (pages are staged): %s\n", SERVE_WHO,
			kvmem_last_error());
	}
	sv->pin_s = serve_now() - t0;
}

int serve_tokenizer_opt(const char *who, const char *name)
{
	if (!strcmp(name, "bytes"))
		return 0;
	fprintf(stderr, "%s: --tokenizer '%s': the one to choose is 'bytes' (without the option: "
		"the model's own)\n", who, name);
	return -1;
}

/*
 * A preset's geometry with no weights (--preset): the cuda backend makes
 * random ones on the GPU, as the benchmarks' --preset does; the cpu backend
 * refuses it (it computes with real weights: kvmem generate makes some).
 * Its fingerprint is the configuration's with a mark, so its
 * conversations never open under a real model of that geometry.
 */
static int preset_model(const char *name, kvmem_model **out)
{
	const kvmem_preset *p = kvmem_preset_find(name);
	kvmem_model *m;

	if (!p)
		return kvmem_error(EINVAL, "unknown preset '%s' (kvmem generate --help lists them)",
				   name);
	if (!(m = calloc(1, sizeof(*m))))
		return kvmem_error(ENOMEM, "out of memory");
	m->cfg = p->cfg;
	m->fingerprint = kvmem_config_fingerprint(&p->cfg) ^ 0x72616e646f6d2121ull; /* "random!!" */
	snprintf(m->dir, sizeof(m->dir), "preset %s", p->name);
	snprintf(m->weight_dtype, sizeof(m->weight_dtype), "BF16");
	*out = m;
	return 0;
}

int serve_start(const struct serve_cfg *cfg, struct serve **out)
{
	struct serve *sv = calloc(1, sizeof(*sv));
	pthread_condattr_t ca;
	const char *base;
	char msg[1024];
	int rc;

	*out = NULL;
	if (!sv)
		return kvmem_error(ENOMEM, "out of memory");
	pthread_mutex_init(&sv->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_REALTIME);
	pthread_cond_init(&sv->work, &ca);
	pthread_condattr_destroy(&ca);
	sv->cfg = *cfg;
	snprintf(sv->model_dir, sizeof(sv->model_dir), "%s",
		 cfg->preset ? "" : cfg->model_dir);
	snprintf(sv->data_dir, sizeof(sv->data_dir), "%s", cfg->data_dir);
	sv->cfg.model_dir = sv->model_dir;
	sv->cfg.data_dir = sv->data_dir;
	serve_batch_knobs(cfg->max_batch, cfg->kv_dtype);
	if ((cfg->preset ? preset_model(cfg->preset, &sv->m) : kvmem_model_load(sv->model_dir, &sv->m)) ||
	    (cfg->preset || cfg->tokenizer ? tok_cli_open_bytes(&sv->m->cfg, &sv->tok)
					   : tok_cli_open(sv->model_dir, &sv->m->cfg, &sv->tok)))
		goto fail;
	if (kvmem_backend_open(cfg->backend, sv->m,
			       &(kvmem_backend_opts){
				       .max_chunk = cfg->chunk ? cfg->chunk : SERVE_CHUNK_DEVICE,
				       .mem_cap = cfg->gpu_mem, .kv_dtype = cfg->kv_dtype,
				       .batch_prefill = cfg->batch_prefill },
			       &sv->be) < 0) {
		if (cfg->preset) {	/* the cpu backend wants weights: say how to make them */
			snprintf(msg, sizeof(msg), "%s", kvmem_last_error());
			kvmem_error(kvmem_last_errno(), "%s (the cpu backend: kvmem generate --preset "
				    "%s --out DIR makes weights, then serve --model DIR --tokenizer "
				    "bytes)", msg, cfg->preset);
		}
		goto fail;
	}
	serve_prefill_defaults(sv);
	if (kvmem_mkdir_p(sv->data_dir))
		goto fail;
	/* The pages of new conversations (the workspace's default dtype);
	 * an older one of another dtype opens with a pool of its own. */
	kvmem_page_geom_model(&sv->pool_geom, sv->m, sv->cfg.block);
	if (cfg->kv_dtype == KVMEM_DTYPE_FP8)
		sv->pool_geom.dtype = KVMEM_DTYPE_FP8;
	if (kvmem_pager_pool_create(&sv->pool_geom, sv->cfg.host_cap, -1, &sv->pool) < 0)
		goto fail;
	pin_pool(sv);
	if (sv->cfg.budget < 0) {
		/* Three quarters of the window, whole blocks: the rest is the
		 * tail's reserve and the answer's room. */
		int64_t w = sv->m->cfg.max_position;

		sv->cfg.budget = w > 0 ? w * 3 / 4 / sv->cfg.block * sv->cfg.block : 0;
	}
	base = strrchr(sv->model_dir, '/');
	base = base && base[1] ? base + 1 : sv->model_dir;
	if (cfg->model_name)
		snprintf(sv->name, sizeof(sv->name), "%.255s", cfg->model_name);
	else if (cfg->preset)
		snprintf(sv->name, sizeof(sv->name), "preset-%.200s", cfg->preset);
	else
		snprintf(sv->name, sizeof(sv->name), "%.255s", base);
	if (serve_engine_start(sv) || serve_http_start(sv))
		goto fail;
	*out = sv;
	return 0;
fail:
	/* Stopping must not take the message of what failed. */
	rc = kvmem_fail();
	snprintf(msg, sizeof(msg), "%s", kvmem_last_error());
	serve_stop(sv);
	return kvmem_error(-rc, "%s", msg);
}

int serve_port(const struct serve *sv)
{
	return serve_http_port(sv);
}

const char *serve_model_name(const struct serve *sv)
{
	return sv->name;
}

const char *serve_backend_name(const struct serve *sv)
{
	return kvmem_backend_name(sv->be);
}

const char *serve_weights_name(const struct serve *sv)
{
	const kvmem_backend_ops *o = sv->be->ops;

	if (!o->weight_bytes)
		return NULL;
	return o->weight_bytes(sv->be->ctx) == 2 ? "bf16" : "fp32";
}

int64_t serve_budget(const struct serve *sv)
{
	return sv->cfg.budget;
}

void serve_prefill(const struct serve *sv, int *chunk, int64_t *round_tokens)
{
	*chunk = sv->cfg.chunk;
	*round_tokens = sv->cfg.prefill_budget;
}

static const char *const prefill_orders[] = { [SERVE_PREFILL_FCFS] = "fcfs",
					       [SERVE_PREFILL_SHARED] = "shared" };

int serve_parse_prefill_order(const char *who, const char *word, int *order)
{
	for (int i = 0; i < 2; i++)
		if (!strcmp(word, prefill_orders[i])) {
			*order = i;
			return 0;
		}
	fprintf(stderr, "%s: --prefill-order %s: not fcfs (the oldest prompt first) or shared "
		"(every prompt a chunk in turn)\n", who, word);
	return -1;
}

const char *serve_prefill_order_name(int order)
{
	return order == SERVE_PREFILL_SHARED ? "shared" : "fcfs";
}

const char *serve_prefill_order_says(int order)
{
	return order == SERVE_PREFILL_SHARED ? "a chunk to each prompt in turn (shared)"
					     : "the oldest prompt first (fcfs)";
}

uint64_t serve_pinned(const struct serve *sv, double *seconds)
{
	*seconds = sv->pin_s;
	return sv->pinned_bytes;
}

uint64_t serve_parked(struct serve *sv)
{
	uint64_t n;

	pthread_mutex_lock(&sv->mu);
	n = sv->c.parked;
	pthread_mutex_unlock(&sv->mu);
	return n;
}

void serve_stop(struct serve *sv)
{
	if (!sv)
		return;
	serve_http_stop(sv);
	serve_engine_stop(sv);
	/* After the conversations closed, before its memory goes. */
	if (sv->pinned)
		sv->be->ops->host_unregister(sv->be->ctx, sv->pinned);
	kvmem_pager_pool_free(sv->pool);	/* after the conversations closed */
	kvmem_backend_close(sv->be);
	tok_cli_close(&sv->tok);
	if (sv->m)
		kvmem_model_free(sv->m);
	pthread_mutex_destroy(&sv->mu);
	pthread_cond_destroy(&sv->work);
	free(sv);
}
#endif
