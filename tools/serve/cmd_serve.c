// SPDX-License-Identifier: MIT
/*
 * kvmem serve: the OpenAI HTTP API over kvmem, every conversation a
 * workspace (serve.h; Documentation/serve.md). With no --model it serves the
 * embedded agentlang model, so `kvmem serve` runs with no arguments.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/session.h"
#include "cli_util.h"
#include "cmd.h"

#ifdef KVMEM_NO_SERVE
int cmd_serve(int argc, char **argv)
{
	fprintf(stderr, "kvmem serve: not in this build (the static kvmem leaves the HTTP server "
		"out: build with make)\n");
	return 1;
}
#else
#include <arpa/inet.h>

#include "embedded_model.h"
#include "serve.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem serve [--model DIR] [--host ADDR] [--port N] [options]\n"
		"\n"
		"Speak the OpenAI HTTP API (/v1/chat/completions, /v1/completions, streaming\n"
		"or not, /v1/models, /v1/conversations, /tokenize, /detokenize, /health,\n"
		"/metrics). A request that names a conversation (header X-Kvmem-Conversation:\n"
		"ID, or \"conversation\": ID in the body) runs in that conversation's workspace\n"
		"under the data directory: it sends the messages the conversation holds,\n"
		"unchanged, and the new ones; only the new turns are prefilled, and a restarted\n"
		"server goes on with no re-prefill. Conversations run in rounds on one backend,\n"
		"one view each, one unit each a round. Documentation/serve.md.\n"
		"\n"
		"  --model DIR               model directory (default: the embedded agentlang\n"
		"                            model, installed under the data directory); text\n"
		"                            needs its tokenizer.json or an agentlang model\n"
		"  --preset NAME             serve a published geometry (8b, 0.6b, ...: kvmem\n"
		"                            generate --help) with random weights instead, to\n"
		"                            time it under load (cuda backend; answers are\n"
		"                            noise); its text goes through --tokenizer bytes\n"
		"  --tokenizer bytes         text as bytes, an id as its byte or \"<|N|>\", for\n"
		"                            a model with no tokenizer (kvmem generate's)\n"
		"  --name NAME               the model's name in the API (default: the\n"
		"                            directory's last component, or preset-NAME)\n"
		"  --host ADDR               address to listen on (default 127.0.0.1); any\n"
		"                            other than loopback needs --api-key\n"
		"  --port N                  port (default 8000; 0: any free one, printed)\n"
		"  --api-key KEY             require Authorization: Bearer KEY (default:\n"
		"                            $KVMEM_API_KEY when set)\n"
		"  --data-dir DIR            where conversations live (default: <data dir>/serve;\n"
		"                            the data dir is $KVMEM_HOME, else\n"
		"                            $XDG_DATA_HOME/kvmem, else ~/.local/share/kvmem)\n"
		"  --store rados://POOL      keep conversations in a Ceph pool instead, shared\n"
		"                            with other servers: a conversation is held for one\n"
		"                            turn at a time (409 while another server holds it)\n"
		"  --ceph-conf PATH          that cluster (default $CEPH_CONF; client and keyring\n"
		"                            from $CEPH_ARGS, as Ceph's tools take them)\n"
		"  --backend NAME            cpu, cuda or auto (default auto)\n"
		"  --policy NAME             selection policy (default meank)\n"
		"  --budget N                history tokens in a view (default: 3/4 of the\n"
		"                            model's window; 0: unlimited)\n"
		"  --block N                 tokens per block (default 32)\n"
		"  --chunk N                 prefill chunk (default 128 on the cpu backend, 1024\n"
		"                            on a GPU)\n"
		"  --host-cap SIZE           host pool the conversations share (default 256M)\n"
		"  --max-disk SIZE           bytes the conversations' files may take on disk; a\n"
		"                            turn that would pass it gets 507 (default: no cap\n"
		"                            but the disk's free space)\n"
		"  --gpu-mem SIZE            device memory the backend may take: weights, views,\n"
		"                            scratch, page pool (on the cpu backend: the views);\n"
		"                            a turn whose view does not fit beside the others'\n"
		"                            waits for one to end (default: no cap)\n"
		"  --kv-dtype T              the KV the views hold and new conversations keep:\n"
		"                            bf16 (default: the backend's own) or fp8 (e4m3\n"
		"                            with a scale a row, half the bytes on every tier;\n"
		"                            fixed when a conversation is made: one of the\n"
		"                            other kind gets 409)\n"
		"  --batch-prefill           a round's prompt chunks of up to 256 tokens share\n"
		"                            forward passes, each with the bits it gets alone\n"
		"                            (cuda: the GEMMs then pinned; burst first tokens\n"
		"                            ~10%% sooner, a lone short prompt's ~10%% later;\n"
		"                            default off)\n"
		"  --max-body SIZE           largest request body (default 1M)\n"
		"  --max-request-tokens N    new prompt tokens + max_tokens of a request\n"
		"                            (default 16k)\n"
		"  --max-tokens N            max_tokens when a request gives none (default 256)\n"
		"  --max-conversations N     conversations kept (default 10k)\n"
		"  --max-open N              conversations held open at once (default 64)\n"
		"  --idle-close S            close a conversation idle S seconds (default 300;\n"
		"                            0: never); it reopens from its stored state\n"
		"  --idle-release S          an open conversation idle S seconds gives its view\n"
		"                            up (default 30; decimals; 0: never); its next turn\n"
		"                            lays the view out again from its pages\n"
		"  --max-views N             open conversations holding a view at once (default\n"
		"                            64); past it the least recently used idle ones give\n"
		"                            theirs up\n"
		"  --view-slice MS           time a round gives one conversation's selection,\n"
		"                            view layout or reopen before the others' units run:\n"
		"                            layer slices until MS is spent, at least one\n"
		"                            (default 5; decimals; 0: one slice a round)\n"
		"  --max-queue N             requests waiting or running (default 256); past it\n"
		"                            429 with Retry-After\n"
		"  --max-inflight N          turns running at once (default 64); the rest wait\n"
		"                            in a fair queue\n"
		"  --max-batch N             units (decode steps, prefill chunks, selections) in\n"
		"                            one round of the engine (default 64)\n"
		"  --prefill-budget N        prefill tokens in one round, whole chunks, at least\n"
		"                            one (default 4 chunks)\n"
		"  --prefill-order fcfs|shared  who takes that budget: the oldest prompts first\n"
		"                            (fcfs, the default: the first token waits for the\n"
		"                            prompts before it only) or every prompt a chunk in\n"
		"                            turn (shared: a short prompt behind a long one\n"
		"                            does not wait for it)\n"
		"  --max-conversation-queue N  requests of one conversation waiting (default 4)\n"
		"  --max-conversation-tokens N tokens one conversation may hold (default: no\n"
		"                            limit)\n"
		"  --max-n N                 choices one request may ask for (n; default 16)\n"
		"  --request-timeout S       seconds a request may take (default 600)\n"
		"  --cors ORIGIN             answer browsers from ORIGIN (or *): the CORS headers\n"
		"                            and OPTIONS preflights (default: none)\n"
		"  --quiet                   no log lines\n"
		"  --help                    this text\n"
		"\n"
		"Sampling is greedy unless a request gives a temperature. Counts take k, M, G\n"
		"(powers of 1000); SIZE takes k, M, G, T (powers of 1024).\n"
		"\n"
		"examples:\n"
		"  kvmem serve\n"
		"  kvmem serve --model /models/Qwen3-0.6B --port 8080 --budget 8k\n"
		"  kvmem serve --host 0.0.0.0 --api-key \"$(cat key)\" --data-dir /srv/kvmem\n"
		"  CEPH_ARGS='--id kvmem-a' kvmem serve --store rados://kvmem --port 8001\n"
		"  curl -s localhost:8000/v1/chat/completions -H 'X-Kvmem-Conversation: a1' \\\n"
		"    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"? api.conf db.port =\"}]}'\n");
}

enum {
	O_MODEL = 256, O_NAME, O_HOST, O_PORT, O_KEY, O_DATA, O_BACKEND, O_POLICY, O_BUDGET, O_BLOCK,
	O_CHUNK, O_HOSTCAP, O_BODY, O_REQTOK, O_MAXTOK, O_CONVS, O_OPEN, O_QUEUE, O_TIMEOUT, O_QUIET,
	O_INFLIGHT, O_BATCH, O_PREFILL, O_CONVQ, O_CONVTOK, O_MAXN, O_IDLE, O_CORS, O_STORE,
	O_CEPHCONF, O_RELEASE, O_VIEWS, O_SLICE, O_PRESET, O_TOKENIZER, O_GPUMEM, O_ORDER, O_MAXDISK,
	O_KVDTYPE, O_BPREFILL,
};

static const struct option opts[] = {
	{ "model", required_argument, NULL, O_MODEL },
	{ "preset", required_argument, NULL, O_PRESET },
	{ "tokenizer", required_argument, NULL, O_TOKENIZER },
	{ "name", required_argument, NULL, O_NAME },
	{ "host", required_argument, NULL, O_HOST },
	{ "port", required_argument, NULL, O_PORT },
	{ "api-key", required_argument, NULL, O_KEY },
	{ "data-dir", required_argument, NULL, O_DATA },
	{ "backend", required_argument, NULL, O_BACKEND },
	{ "policy", required_argument, NULL, O_POLICY },
	{ "budget", required_argument, NULL, O_BUDGET },
	{ "block", required_argument, NULL, O_BLOCK },
	{ "chunk", required_argument, NULL, O_CHUNK },
	{ "host-cap", required_argument, NULL, O_HOSTCAP },
	{ "max-disk", required_argument, NULL, O_MAXDISK },
	{ "gpu-mem", required_argument, NULL, O_GPUMEM },
	{ "kv-dtype", required_argument, NULL, O_KVDTYPE },
	{ "batch-prefill", no_argument, NULL, O_BPREFILL },
	{ "max-body", required_argument, NULL, O_BODY },
	{ "max-request-tokens", required_argument, NULL, O_REQTOK },
	{ "max-tokens", required_argument, NULL, O_MAXTOK },
	{ "max-conversations", required_argument, NULL, O_CONVS },
	{ "max-open", required_argument, NULL, O_OPEN },
	{ "max-queue", required_argument, NULL, O_QUEUE },
	{ "request-timeout", required_argument, NULL, O_TIMEOUT },
	{ "max-inflight", required_argument, NULL, O_INFLIGHT },
	{ "max-batch", required_argument, NULL, O_BATCH },
	{ "prefill-budget", required_argument, NULL, O_PREFILL },
	{ "prefill-order", required_argument, NULL, O_ORDER },
	{ "max-conversation-queue", required_argument, NULL, O_CONVQ },
	{ "max-conversation-tokens", required_argument, NULL, O_CONVTOK },
	{ "max-n", required_argument, NULL, O_MAXN },
	{ "idle-close", required_argument, NULL, O_IDLE },
	{ "idle-release", required_argument, NULL, O_RELEASE },
	{ "max-views", required_argument, NULL, O_VIEWS },
	{ "view-slice", required_argument, NULL, O_SLICE },
	{ "cors", required_argument, NULL, O_CORS },
	{ "store", required_argument, NULL, O_STORE },
	{ "ceph-conf", required_argument, NULL, O_CEPHCONF },
	{ "quiet", no_argument, NULL, O_QUIET },
	{ "help", no_argument, NULL, 'h' },
	{ 0 },
};

static int loopback(const char *host)
{
	struct in_addr a;

	if (inet_pton(AF_INET, host, &a) == 1)
		return (ntohl(a.s_addr) >> 24) == 127;
	return !strcmp(host, "::1");
}

static int parse(int argc, char **argv, struct serve_cfg *c)
{
	const char *w = SERVE_WHO;
	int ch;
	int64_t v;

	cli_getopt_reset();
	while ((ch = cli_getopt(w, argc, argv, opts)) != -1) {
		const char *a = optarg, *n = cli_optname;

		switch (ch) {
		case 'h': usage(stdout); return 1;
		case '?': return -1;
		case O_MODEL: c->model_dir = a; break;
		case O_PRESET: c->preset = a; break;
		case O_TOKENIZER:
			if (serve_tokenizer_opt(w, a))
				return -1;
			c->tokenizer = a;
			break;
		case O_NAME: c->model_name = a; break;
		case O_HOST: c->host = a; break;
		case O_KEY: c->api_key = a; break;
		case O_DATA: c->data_dir = a; break;
		case O_BACKEND: c->backend = a; break;
		case O_POLICY: c->policy = a; break;
		case O_QUIET: c->quiet = 1; break;
		case O_PORT: if (cli_parse_int(w, n, a, 0, 65535, &c->port)) return -1; break;
		case O_BUDGET:
			if (cli_parse_count(w, n, a, 0, INT32_MAX / 2, &c->budget))
				return -1;
			break;
		case O_BLOCK:
			if (cli_parse_int(w, n, a, KVMEM_BLOCK_MIN, KVMEM_BLOCK_MAX, &c->block))
				return -1;
			break;
		case O_CHUNK: if (cli_parse_int(w, n, a, 1, 4096, &c->chunk)) return -1; break;
		case O_HOSTCAP:
			if (cli_parse_size(w, n, a, 1 << 20, 1ull << 50, &c->host_cap))
				return -1;
			break;
		case O_MAXDISK:
			if (cli_parse_size(w, n, a, 1 << 20, 1ull << 60, &c->max_disk))
				return -1;
			break;
		case O_GPUMEM:
			if (cli_parse_size(w, n, a, 1 << 20, 1ull << 50, &c->gpu_mem))
				return -1;
			break;
		case O_KVDTYPE: if (cli_parse_kv_dtype(w, n, a, &c->kv_dtype)) return -1; break;
		case O_BPREFILL: c->batch_prefill = 1; break;
		case O_BODY: if (cli_parse_size(w, n, a, 1024, 1ull << 32, &c->max_body)) return -1; break;
		case O_REQTOK:
			if (cli_parse_count(w, n, a, 1, 1 << 30, &c->max_request_tokens))
				return -1;
			break;
		case O_MAXTOK:
			if (cli_parse_count(w, n, a, 0, 1 << 30, &c->default_max_tokens))
				return -1;
			break;
		case O_CONVS:
			if (cli_parse_count(w, n, a, 0, INT64_MAX / 2, &c->max_conversations))
				return -1;
			break;
		case O_OPEN: if (cli_parse_count(w, n, a, 1, 1 << 20, &c->max_open)) return -1; break;
		case O_QUEUE: if (cli_parse_count(w, n, a, 1, 1 << 20, &c->max_queue)) return -1; break;
		case O_TIMEOUT:
			if (cli_parse_i64(w, n, a, 1, 86400, &v))
				return -1;
			c->request_timeout = (int)v;
			break;
		case O_IDLE:
			if (cli_parse_i64(w, n, a, 0, 86400 * 365, &v))
				return -1;
			c->idle_close = (int)v;
			break;
		case O_RELEASE:
			if (cli_parse_double(w, n, a, 0, 86400.0 * 365, &c->idle_release))
				return -1;
			break;
		case O_VIEWS: if (cli_parse_count(w, n, a, 1, 1 << 20, &c->max_views)) return -1; break;
		case O_SLICE: if (cli_parse_double(w, n, a, 0, 60000, &c->view_slice_ms)) return -1; break;
		case O_INFLIGHT: if (cli_parse_count(w, n, a, 1, 1 << 16, &c->max_inflight)) return -1; break;
		case O_BATCH: if (cli_parse_count(w, n, a, 1, 1 << 16, &c->max_batch)) return -1; break;
		case O_PREFILL:
			if (cli_parse_count(w, n, a, 1, 1 << 24, &c->prefill_budget))
				return -1;
			break;
		case O_ORDER:
			if (serve_parse_prefill_order(w, a, &c->prefill_order))
				return -1;
			break;
		case O_CONVQ: if (cli_parse_count(w, n, a, 1, 1 << 20, &c->max_conv_queue)) return -1; break;
		case O_CONVTOK:
			if (cli_parse_count(w, n, a, 0, INT64_MAX / 4, &c->max_conv_tokens))
				return -1;
			break;
		case O_MAXN: if (cli_parse_count(w, n, a, 1, 128, &c->max_n)) return -1; break;
		case O_CEPHCONF: cli_ceph_conf(a); break;
		case O_STORE:
			/* rados://POOL: conversations are rados://POOL/conv.ID. */
			if (strncmp(a, "rados://", 8) || !a[8] || strchr(a + 8, '/')) {
				fprintf(stderr, "%s: %s wants rados://POOL, not '%s'\n", w, n, a);
				return -1;
			}
			c->store = a;
			break;
		case O_CORS:
			if (!*a || strpbrk(a, "\r\n")) {
				fprintf(stderr, "%s: --cors '%s': give an origin (https://app.example) "
					"or *\n", w, a);
				return -1;
			}
			c->cors = a;
			break;
		}
	}
	if (cli_no_operands(w, argc, argv))
		return -1;
	if (!c->api_key && getenv("KVMEM_API_KEY") && *getenv("KVMEM_API_KEY"))
		c->api_key = getenv("KVMEM_API_KEY");
	if (getenv("KVMEM_SERVE_FAULT") && *getenv("KVMEM_SERVE_FAULT")) {
		/* Test only: tests/cli/test_serve_crash.sh crashes the server
		 * between a turn's record and its commit. */
		const char *f = getenv("KVMEM_SERVE_FAULT");
		char *end;

		errno = 0;
		c->fault_record = strncmp(f, "record:", 7) ? 0 : strtoll(f + 7, &end, 10);
		if (c->fault_record < 1 || errno || *end) {
			fprintf(stderr, "%s: KVMEM_SERVE_FAULT='%s': want record:N (N >= 1), a fault "
				"for tests\n", w, f);
			return -1;
		}
	}
	if (c->api_key && !*c->api_key) {
		fprintf(stderr, "%s: --api-key is empty\n", w);
		return -1;
	}
	if (!loopback(c->host) && !c->api_key) {
		fprintf(stderr, "%s: --host %s is not loopback: give --api-key KEY (or KVMEM_API_KEY) "
			"so that only clients with the key are served\n", w, c->host);
		return -1;
	}
	if (c->policy && !kvmem_policy_find(c->policy)) {
		fprintf(stderr, "%s: %s\n", w, kvmem_last_error());
		return -1;
	}
	return 0;
}

int cmd_serve(int argc, char **argv)
{
	char model_path[4096], data_path[4096];
	struct serve_cfg c;
	struct serve *sv;
	sigset_t set;
	int r, sig;

	serve_cfg_default(&c);
	r = parse(argc, argv, &c);
	if (r)
		return r > 0 ? 0 : EXIT_USAGE;
	if (c.preset && c.model_dir) {
		fprintf(stderr, "%s: --model or --preset, not both\n", SERVE_WHO);
		return EXIT_USAGE;
	}
	if (!c.model_dir && !c.preset) {
		if (embedded_model_install(model_path, sizeof(model_path)) < 0) {
			fprintf(stderr, "%s: %s\n", SERVE_WHO, kvmem_last_error());
			return 1;
		}
		c.model_dir = model_path;
	}
	if (!c.data_dir) {
		char base[4000];

		if (!kvmem_data_dir(base, sizeof(base))) {
			fprintf(stderr, "%s: the data directory's path is too long\n", SERVE_WHO);
			return 1;
		}
		snprintf(data_path, sizeof(data_path), "%s/serve", base);
		c.data_dir = data_path;
	}
	/* Signals come to this thread alone: every other thread starts with
	 * them blocked. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (serve_start(&c, &sv)) {
		fprintf(stderr, "%s: %s\n", SERVE_WHO, kvmem_last_error());
		return 1;
	}
	printf("kvmem serve: model %s (%s%s, %s backend%s), budget %lld, conversations in %s\n",
	       serve_model_name(sv), c.preset ? "random weights of preset " : "",
	       c.preset ? c.preset : c.model_dir, serve_backend_name(sv),
	       c.kv_dtype == KVMEM_DTYPE_FP8 ? ", fp8 KV" : "", (long long)serve_budget(sv),
	       c.store ? c.store : c.data_dir);
	if (!strcmp(serve_backend_name(sv), "cuda") && c.max_batch > 1 &&
	    getenv("KVMEM_CUDA_GEMM_TC") && !strcmp(getenv("KVMEM_CUDA_GEMM_TC"), "1"))
		printf("kvmem serve: decode's GEMMs on tensor cores, for batches of up to %lld "
		       "(KVMEM_CUDA_GEMM_TC=0: the lone decode's GEMV)\n", (long long)c.max_batch);
	if (!strcmp(serve_backend_name(sv), "cuda") && c.max_batch > 1 &&
	    c.kv_dtype == KVMEM_DTYPE_FP8 && getenv("KVMEM_CUDA_DEC_MIN_TILES"))
		printf("kvmem serve: decode attention's splits at least %s stages of 64 keys "
		       "(KVMEM_CUDA_DEC_MIN_TILES; 4 for a server that does not batch)\n",
		       getenv("KVMEM_CUDA_DEC_MIN_TILES"));
	{
		double pin_s;
		uint64_t pinned = serve_pinned(sv, &pin_s);
		int64_t round;
		int chunk;

		serve_prefill(sv, &chunk, &round);
		printf("kvmem serve: prefill in chunks of %d tokens, %lld tokens a round, %s%s\n",
		       chunk, (long long)round, serve_prefill_order_says(c.prefill_order),
		       c.batch_prefill ? ", chunks of up to 256 tokens of several prompts in one "
					 "pass (--batch-prefill)" : "");

		/* Start-up's one large cost on a GPU (Documentation/serve.md). */
		if (pinned)
			printf("kvmem serve: host pool of %.1f MiB pinned for the %s backend in %.3f s\n",
			       pinned / 1048576.0, serve_backend_name(sv), pin_s);
	}
	printf("kvmem serve: listening on http://%s%s%s:%d/v1\n", strchr(c.host, ':') ? "[" : "",
	       c.host, strchr(c.host, ':') ? "]" : "", serve_port(sv));
	fflush(stdout);
	sigwait(&set, &sig);
	if (!c.quiet)
		fprintf(stderr, "%s: %s: stopping\n", SERVE_WHO, strsignal(sig));
	serve_stop(sv);
	return 0;
}
#endif
