// SPDX-License-Identifier: MIT
/*
 * kvmem serve: the OpenAI HTTP API over kvmem, every conversation a
 * workspace (serve.h; Documentation/serve.md). With no --model it serves the
 * embedded agentlang model, so `kvmem serve` runs with no arguments.
 */
#include <errno.h>
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
#include "util/fs.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem serve [--model DIR] [--host ADDR] [--port N] [options]\n"
		"\n"
		"Speak the OpenAI HTTP API (/v1/chat/completions, /v1/completions, streaming\n"
		"or not, /v1/models, /health, /metrics). A request that names a conversation\n"
		"(header X-Kvmem-Conversation: ID, or \"conversation\": ID in the body) runs in\n"
		"that conversation's workspace under the data directory: it sends the messages\n"
		"the conversation holds, unchanged, and the new ones; only the new turns are\n"
		"prefilled, and a restarted server goes on with no re-prefill. Conversations\n"
		"run interleaved on one backend, one view each. Documentation/serve.md.\n"
		"\n"
		"  --model DIR               model directory (default: the embedded agentlang\n"
		"                            model, installed under the data directory); text\n"
		"                            needs its tokenizer.json or an agentlang model\n"
		"  --name NAME               the model's name in the API (default: the\n"
		"                            directory's last component)\n"
		"  --host ADDR               address to listen on (default 127.0.0.1); any\n"
		"                            other than loopback needs --api-key\n"
		"  --port N                  port (default 8000; 0: any free one, printed)\n"
		"  --api-key KEY             require Authorization: Bearer KEY (default:\n"
		"                            $KVMEM_API_KEY when set)\n"
		"  --data-dir DIR            where conversations live (default: <data dir>/serve;\n"
		"                            the data dir is $KVMEM_HOME, else ~/.local/share/kvmem)\n"
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
		"  --chunk N                 prefill chunk (default 128)\n"
		"  --host-cap SIZE           host pool of each conversation's pager (default 16M)\n"
		"  --max-body SIZE           largest request body (default 1M)\n"
		"  --max-request-tokens N    new prompt tokens + max_tokens of a request\n"
		"                            (default 16k)\n"
		"  --max-tokens N            max_tokens when a request gives none (default 256)\n"
		"  --max-conversations N     conversations kept (default 10k)\n"
		"  --max-open N              conversations held open at once (default 64)\n"
		"  --max-queue N             requests waiting or running (default 256)\n"
		"  --request-timeout S       seconds a request may take (default 600)\n"
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
	O_STORE, O_CEPHCONF,
};

static const struct option opts[] = {
	{ "model", required_argument, NULL, O_MODEL },
	{ "name", required_argument, NULL, O_NAME },
	{ "host", required_argument, NULL, O_HOST },
	{ "port", required_argument, NULL, O_PORT },
	{ "api-key", required_argument, NULL, O_KEY },
	{ "data-dir", required_argument, NULL, O_DATA },
	{ "store", required_argument, NULL, O_STORE },
	{ "ceph-conf", required_argument, NULL, O_CEPHCONF },
	{ "backend", required_argument, NULL, O_BACKEND },
	{ "policy", required_argument, NULL, O_POLICY },
	{ "budget", required_argument, NULL, O_BUDGET },
	{ "block", required_argument, NULL, O_BLOCK },
	{ "chunk", required_argument, NULL, O_CHUNK },
	{ "host-cap", required_argument, NULL, O_HOSTCAP },
	{ "max-body", required_argument, NULL, O_BODY },
	{ "max-request-tokens", required_argument, NULL, O_REQTOK },
	{ "max-tokens", required_argument, NULL, O_MAXTOK },
	{ "max-conversations", required_argument, NULL, O_CONVS },
	{ "max-open", required_argument, NULL, O_OPEN },
	{ "max-queue", required_argument, NULL, O_QUEUE },
	{ "request-timeout", required_argument, NULL, O_TIMEOUT },
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
	int ch, budget_set = 0;
	int64_t v;

	cli_getopt_reset();
	while ((ch = cli_getopt(w, argc, argv, opts)) != -1) {
		const char *a = optarg, *n = cli_optname;

		switch (ch) {
		case 'h': usage(stdout); return 1;
		case '?': return -1;
		case O_MODEL: c->model_dir = a; break;
		case O_NAME: c->model_name = a; break;
		case O_HOST: c->host = a; break;
		case O_KEY: c->api_key = a; break;
		case O_DATA: c->data_dir = a; break;
		case O_CEPHCONF: cli_ceph_conf(a); break;
		case O_STORE:
			/* rados://POOL: conversations are rados://POOL/conv.ID. */
			if (strncmp(a, "rados://", 8) || !a[8] || strchr(a + 8, '/')) {
				fprintf(stderr, "%s: %s wants rados://POOL, not '%s'\n", w, n, a);
				return -1;
			}
			c->store = a;
			break;
		case O_BACKEND: c->backend = a; break;
		case O_POLICY: c->policy = a; break;
		case O_QUIET: c->quiet = 1; break;
		case O_PORT: if (cli_parse_int(w, n, a, 0, 65535, &c->port)) return -1; break;
		case O_BUDGET:
			if (cli_parse_count(w, n, a, 0, INT32_MAX / 2, &c->budget))
				return -1;
			budget_set = 1;
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
	if (!budget_set)
		c->budget = -1;	/* from the window, once the model is known */
	return 0;
}

static char model_path[4096], data_path[4096];

int cmd_serve(int argc, char **argv)
{
	struct serve_cfg c = {
		.host = "127.0.0.1", .port = 8000, .max_body = 1 << 20, .max_request_tokens = 16000,
		.default_max_tokens = 256, .max_conversations = 10000, .max_open = 64,
		.max_queue = 256, .request_timeout = 600, .block = 32, .chunk = 128,
		.host_cap = 16 << 20,
	};
	kvmem_config cfg;
	sigset_t set;
	int r = parse(argc, argv, &c), sig;

	if (r)
		return r > 0 ? 0 : EXIT_USAGE;
	if (!c.model_dir) {
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
	if (kvmem_config_load(&cfg, c.model_dir)) {
		fprintf(stderr, "%s: %s\n", SERVE_WHO, kvmem_last_error());
		return 1;
	}
	if (c.budget < 0) {
		/* Three quarters of the window, whole blocks: the rest is the
		 * tail's reserve and the answer's room. */
		c.budget = cfg.max_position > 0 ? (int64_t)cfg.max_position * 3 / 4 / c.block * c.block : 0;
	}
	if (kvmem_mkdir_p(c.data_dir)) {
		fprintf(stderr, "%s: %s\n", SERVE_WHO, kvmem_last_error());
		return 1;
	}
	/* Signals come to this thread alone: every other thread starts with
	 * them blocked. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (serve_engine_start(&c) || serve_http_start(&c)) {
		fprintf(stderr, "%s: %s\n", SERVE_WHO, kvmem_last_error());
		serve_http_stop();
		serve_engine_stop();
		return 1;
	}
	printf("kvmem serve: model %s (%s), budget %lld, conversations in %s\n", serve_model_name(),
	       c.model_dir, (long long)c.budget, c.store ? c.store : c.data_dir);
	printf("kvmem serve: listening on http://%s%s%s:%d/v1\n", strchr(c.host, ':') ? "[" : "",
	       c.host, strchr(c.host, ':') ? "]" : "", serve_http_port());
	fflush(stdout);
	sigwait(&set, &sig);
	if (!c.quiet)
		fprintf(stderr, "%s: %s: stopping\n", SERVE_WHO, strsignal(sig));
	serve_http_stop();
	serve_engine_stop();
	return 0;
}
#endif
