// SPDX-License-Identifier: MIT
/*
 * kvmem bench serve: the server under load, a benchmark (not a test).
 *
 *   closed   N clients, each sending its next request when the last one
 *            ended (R requests each): the load the server sustains with N
 *            in flight
 *   poisson  the same number of requests arriving at random (exponential
 *            gaps) at a rate: --rate, else --load (0.8) of the request
 *            rate the closed loop sustained at that N
 *
 * Every request streams a completion of --tokens tokens (ignore_eos, so
 * every answer is that long) after a prompt of workspace lines; with
 * --conversations each client's requests are the turns of one
 * conversation. Printed per load: aggregate decode tokens/s (all answers'
 * tokens over the wall time), its ratio to one client's, the time to
 * first token and the latency at p50 and p99, the time per output token
 * after the first (tpot p50) and a stream's longest wait between two
 * tokens (gap p99: what another's prefill costs a decoding stream), with
 * the backend, the model and the machine named. A warm-up request goes
 * first, not counted; each Poisson row's first-token p99 is put against the
 * unloaded one and beside an ideal server's at the same arrivals
 * (ideal_ttft99). The server is started in this process (a scratch data
 * directory; each row counts the turns it parked short of memory) unless
 * --url names one.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "cmd.h"

#ifdef KVMEM_NO_SERVE
int bench_serve(int argc, char **argv)
{
	fprintf(stderr, "kvmem bench serve: not in this build (the static kvmem leaves the HTTP "
		"server out: build with make)\n");
	return 1;
}
#else
#include <ftw.h>
#include <jansson.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "agentlang/agentlang.h"
#include "bench_client.h"
#include "embedded_model.h"
#include "kvmem/kvmem.h"
#include "kvmem/sample.h"
#include "serve.h"

#define WHO "kvmem bench serve"
#define MAX_LIST 16

struct opts {
	const char *model, *backend, *url, *api_key, *mode, *preset, *tokenizer;
	int clients[MAX_LIST], n_clients;
	int tokens, requests, lines, conversations, json;
	int chunk;			/* the server's --chunk (0: its default) */
	int64_t prefill_budget;		/* its --prefill-budget (0: its default) */
	int prefill_order;		/* its --prefill-order; set_order: given */
	int set_order;
	uint64_t gpu_mem;		/* its --gpu-mem (0: no cap) */
	uint32_t kv_dtype;		/* its --kv-dtype (0: the backend's own) */
	int batch_prefill;		/* its --batch-prefill */
	double view_slice_ms;		/* its --view-slice (< 0: serve's default) */
	int used_chunk;			/* what its server ran with (0: a --url server) */
	int64_t used_round;
	double rate;
	double load;			/* Poisson's rate as a share of the closed loop's */
	uint64_t seed;
	double temperature;		/* the requests' (0: greedy) */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvmem bench serve [options]\n"
		"\n"
		"kvmem serve under load: closed-loop clients and Poisson arrivals at 1..N in\n"
		"flight, each request a streamed completion of --tokens tokens. Prints the\n"
		"aggregate decode tokens/s, its ratio to one client's, time to first token and\n"
		"latency at p50 and p99, time per output token after the first (tpot p50) and\n"
		"a stream's longest wait between two tokens (gap p99), with the backend and\n"
		"the model named. One warm-up request goes first, not counted. A Poisson row's\n"
		"first-token p99 is put against the first load's (unloaded) and beside an\n"
		"ideal server's at the same arrivals (one prompt at a time in the unloaded\n"
		"p50, no decode). The server runs in this process (a scratch data directory;\n"
		"the rows count its turns that waited for memory) unless --url names one.\n"
		"\n"
		"  --model DIR         model directory (default: the embedded agentlang model)\n"
		"  --preset NAME       a published geometry with random weights instead (8b,\n"
		"                      ...; cuda backend; text as bytes): its timings\n"
		"  --tokenizer bytes   text as bytes, for a model with no tokenizer\n"
		"  --chunk N           the server's prefill chunk (default: kvmem serve's)\n"
		"  --prefill-budget N  the server's prefill tokens a round (default: serve's)\n"
		"  --prefill-order fcfs|shared  who takes them (default: serve's, fcfs)\n"
		"  --gpu-mem SIZE      the server's memory cap (default: none)\n"
		"  --kv-dtype T        the server's KV: bf16 (default: the backend's own) or\n"
		"                      fp8\n"
		"  --batch-prefill     the server's --batch-prefill (prompt chunks of several\n"
		"                      conversations in one forward pass)\n"
		"  --view-slice MS     the server's time a round for one conversation's view\n"
		"                      work (default: serve's, 5; 0: one slice a round)\n"
		"  --backend NAME      cpu, cuda or auto (default auto)\n"
		"  --url http://H:P    a running server instead (its model and backend are\n"
		"                      those /health names)\n"
		"  --api-key KEY       its bearer token\n"
		"  --clients LIST      requests in flight (default 1,8,32; the first load's\n"
		"                      decode rate is what \"vs 1\" divides by)\n"
		"  --mode M            closed, poisson or both (default both)\n"
		"  --requests N        requests per client (default 4)\n"
		"  --tokens N          tokens each answer decodes (default 64)\n"
		"  --lines N           workspace lines in each prompt (default 8: ~55 tokens)\n"
		"  --load F            Poisson arrivals at F of the request rate the closed\n"
		"                      loop sustained at that N (default 0.8)\n"
		"  --rate R            Poisson arrivals per second instead of --load\n"
		"  --conversations     each client's requests are the turns of a conversation\n"
		"  --seed S            prompts and arrival times (default 1)\n"
		"  --temperature T     each answer sampled at T, seeded (default 0: greedy);\n"
		"                      the server draws at a temperature on the host\n"
		"  --json              one JSON object per row\n"
		"  --help              this text\n"
		"\n"
		"examples:\n"
		"  kvmem bench serve\n"
		"  kvmem bench serve --clients 1,4,16,64 --mode closed --backend cuda\n"
		"  kvmem bench serve --url http://127.0.0.1:8000 --conversations\n");
}

/* ---- the load ---------------------------------------------------------------------- */
struct load {
	struct bench_target t;
	struct serve *sv;		/* the server in this process (NULL: --url) */
	const char *model;
	const struct opts *o;
	char **prompts;			/* text, one per client */
	struct bench_sample *s;		/* [n_req] */
	double *arrive;			/* [n_req]: Poisson's arrival times, s from its start */
	int n_req;
	int clients;
};

/* A completion of the client's prompt (after the conversation's text so
 * far, with --conversations). */
static char *request_body(struct load *L, int c, char *const *held)
{
	json_t *doc = json_pack("{sisbsbs{sb}sfsb}", "max_tokens", L->o->tokens, "ignore_eos", 1,
				"stream", 1, "stream_options", "include_usage", 1, "temperature",
				L->o->temperature, "store", 0);
	char *prompt = NULL, *text;

	if (!doc || asprintf(&prompt, "%s%s", held && *held ? *held : "", L->prompts[c]) < 0) {
		json_decref(doc);
		return NULL;
	}
	json_object_set_new(doc, "prompt", json_string(prompt));
	if (L->o->temperature > 0)	/* sampled, the same draws run after run */
		json_object_set_new(doc, "seed", json_integer((json_int_t)(L->o->seed * 1000 + c)));
	if (L->model)
		json_object_set_new(doc, "model", json_string(L->model));
	if (held) {
		char conv[64];

		snprintf(conv, sizeof(conv), "bench-%llu-%d-%d", (unsigned long long)L->o->seed,
			 L->clients, c);
		json_object_set_new(doc, "conversation", json_string(conv));
	}
	free(prompt);
	text = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	return text;
}

/* Request i, client c's; with held, a turn of the client's conversation
 * (*held: its text so far). */
static void run_one(struct load *L, int c, int i, char **held)
{
	struct bench_sample *s = &L->s[i];
	char *body = request_body(L, c, held), *next;

	if (!body) {
		snprintf(s->err, sizeof(s->err), "out of memory");
		return;
	}
	bench_post_stream(&L->t, "/v1/completions", body, s);
	free(body);
	/* The conversation now holds the prompt and its answer. */
	if (held && s->ok &&
	    asprintf(&next, "%s%s%s\n", *held ? *held : "", L->prompts[c], s->text ? s->text : "") >= 0) {
		free(*held);
		*held = next;
	}
	free(s->text);
	s->text = NULL;
}

struct client_arg {
	struct load *L;
	int c;
};

static void *closed_client(void *arg)
{
	struct client_arg *a = arg;
	char *held = NULL;

	for (int r = 0; r < a->L->o->requests; r++)
		run_one(a->L, a->c, a->c * a->L->o->requests + r, a->L->o->conversations ? &held : NULL);
	free(held);
	return NULL;
}

/* Poisson: request i is client (i mod N)'s, on its own (no conversation:
 * arrivals do not wait for the client's last answer). */
static void *poisson_one(void *arg)
{
	struct client_arg *a = arg;

	run_one(a->L, a->c % a->L->clients, a->c, NULL);
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
	int i;

	if (!n)
		return NAN;
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	i = (int)ceil(p / 100.0 * n) - 1;
	return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

struct result {
	double wall, tok_s, req_s, ttft50, ttft99, lat50, lat99;
	int64_t parked;			/* the server's turns parked in the load (-1: unknown) */
	/* after the first token: time per output token (a request's mean)
	 * and a request's longest wait between two, percentiles over the
	 * requests (NAN: none with two tokens) */
	double tpot50, tpot99, gap99;
	int64_t tokens, prompt;
	int ok, failed;
	char err[160];
};

static void summarise(struct load *L, double wall, struct result *r)
{
	double *tt = calloc((size_t)L->n_req + 1, sizeof(double));
	double *lat = calloc((size_t)L->n_req + 1, sizeof(double));
	double *tpot = calloc((size_t)L->n_req + 1, sizeof(double));
	double *gap = calloc((size_t)L->n_req + 1, sizeof(double));
	int nt = 0, nl = 0, ng = 0;

	memset(r, 0, sizeof(*r));
	r->wall = wall;
	for (int i = 0; i < L->n_req; i++) {
		const struct bench_sample *s = &L->s[i];

		if (!s->ok) {
			if (!r->failed++)
				snprintf(r->err, sizeof(r->err), "%s", s->err);
			continue;
		}
		r->ok++;
		r->tokens += s->completion_tokens;
		r->prompt += s->prompt_tokens;
		if (tt && s->ttft >= 0)
			tt[nt++] = s->ttft;
		if (lat)
			lat[nl++] = s->latency;
		/* Streams of two contents or more: one token a content here
		 * (the server streams each decoded token). */
		if (tpot && gap && s->ttft >= 0 && s->t_last > s->ttft && s->completion_tokens > 1) {
			tpot[ng] = (s->t_last - s->ttft) / (double)(s->completion_tokens - 1);
			gap[ng++] = s->gap_max;
		}
	}
	r->tok_s = r->tokens / wall;
	r->req_s = r->ok / wall;
	r->ttft50 = pct(tt, nt, 50) * 1e3;
	r->ttft99 = pct(tt, nt, 99) * 1e3;
	r->lat50 = pct(lat, nl, 50) * 1e3;
	r->lat99 = pct(lat, nl, 99) * 1e3;
	r->tpot50 = pct(tpot, ng, 50) * 1e3;
	r->tpot99 = pct(tpot, ng, 99) * 1e3;
	r->gap99 = pct(gap, ng, 99) * 1e3;
	free(tt);
	free(lat);
	free(tpot);
	free(gap);
}

static int run_load(struct load *L, int poisson, double rate, struct result *r)
{
	int n = poisson ? L->n_req : L->clients;
	pthread_t *th = calloc((size_t)n, sizeof(*th));
	struct client_arg *args = calloc((size_t)n, sizeof(*args));
	uint64_t rng = kvmem_rng_seed(L->o->seed ^ (uint64_t)L->clients << 20);
	const uint64_t parked0 = L->sv ? serve_parked(L->sv) : 0;
	double t0, at = 0;
	int started = 0;

	if (!th || !args) {
		free(th);
		free(args);
		return -1;
	}
	memset(L->s, 0, (size_t)L->n_req * sizeof(*L->s));
	t0 = bench_now();
	for (int i = 0; i < n; i++) {
		args[i].L = L;
		args[i].c = i;
		if (poisson) {
			/* Exponential gaps: the arrivals of a Poisson process. */
			double now;

			at += -log(1.0 - kvmem_rng_uniform(&rng)) / rate;
			L->arrive[i] = at;
			while ((now = bench_now() - t0) < at)
				usleep((useconds_t)((at - now) * 1e6 < 1e6 ? (at - now) * 1e6 : 1e6));
		}
		if (pthread_create(&th[i], NULL, poisson ? poisson_one : closed_client, &args[i]))
			break;
		started++;
	}
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	summarise(L, bench_now() - t0, r);
	r->parked = L->sv ? (int64_t)(serve_parked(L->sv) - parked0) : -1;
	free(th);
	free(args);
	return started == n ? 0 : -1;
}

/*
 * The first token p99 an ideal server gives the same arrivals: one prompt
 * at a time, in order of arrival, each in `service` seconds (the unloaded
 * first token), and nothing else (no decode). For prompts of one size no
 * server that prefills them one at a time at the unloaded speed does
 * better, so a Poisson row's ratio is put beside this one: what the offered
 * load alone costs. A server that batches several prompts' chunks in one
 * forward pass can (kvmem serve's 1024-token chunks did once on the H200,
 * 32 requests at 0.8 of the closed loop's rate, and not at 48:
 * benchmarks.md).
 */
static double ideal_ttft99(const double *arrive, int n, double service)
{
	double *t = calloc((size_t)n + 1, sizeof(double)), free_at = 0, p;

	if (!t)
		return NAN;
	for (int i = 0; i < n; i++) {
		double start = arrive[i] > free_at ? arrive[i] : free_at;

		free_at = start + service;
		t[i] = free_at - arrive[i];
	}
	p = pct(t, n, 99);
	free(t);
	return p;
}

/* ---- options, the server, the report ------------------------------------------------ */
static int parse_list(const char *s, int *out, int max)
{
	char *list = strdup(s), *save = NULL, *tok, *end;
	int n = 0;

	for (tok = list ? strtok_r(list, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
		long v = strtol(tok, &end, 10);

		if (*end || v < 1 || v > 4096 || n == max) {
			free(list);
			return -1;
		}
		out[n++] = (int)v;
	}
	free(list);
	return n ? n : -1;
}

enum { O_MODEL = 256, O_BACKEND, O_URL, O_KEY, O_CLIENTS, O_MODE, O_REQ, O_TOK, O_LINES, O_RATE,
       O_CONV, O_SEED, O_JSON, O_PRESET, O_TOKENIZER, O_CHUNK, O_PREFILL, O_GPUMEM, O_LOAD,
       O_ORDER, O_SLICE, O_KVDTYPE, O_TEMP, O_BPREFILL };

static const struct option lopts[] = {
	{ "model", required_argument, NULL, O_MODEL },
	{ "preset", required_argument, NULL, O_PRESET },
	{ "tokenizer", required_argument, NULL, O_TOKENIZER },
	{ "chunk", required_argument, NULL, O_CHUNK },
	{ "gpu-mem", required_argument, NULL, O_GPUMEM },
	{ "kv-dtype", required_argument, NULL, O_KVDTYPE },
	{ "batch-prefill", no_argument, NULL, O_BPREFILL },
	{ "prefill-budget", required_argument, NULL, O_PREFILL },
	{ "prefill-order", required_argument, NULL, O_ORDER },
	{ "view-slice", required_argument, NULL, O_SLICE },
	{ "backend", required_argument, NULL, O_BACKEND },
	{ "url", required_argument, NULL, O_URL },
	{ "api-key", required_argument, NULL, O_KEY },
	{ "clients", required_argument, NULL, O_CLIENTS },
	{ "mode", required_argument, NULL, O_MODE },
	{ "requests", required_argument, NULL, O_REQ },
	{ "tokens", required_argument, NULL, O_TOK },
	{ "lines", required_argument, NULL, O_LINES },
	{ "rate", required_argument, NULL, O_RATE },
	{ "load", required_argument, NULL, O_LOAD },
	{ "conversations", no_argument, NULL, O_CONV },
	{ "seed", required_argument, NULL, O_SEED },
	{ "temperature", required_argument, NULL, O_TEMP },
	{ "json", no_argument, NULL, O_JSON },
	{ "help", no_argument, NULL, 'h' },
	{ 0 },
};

static int parse(int argc, char **argv, struct opts *o)
{
	int ch;

	cli_getopt_reset();
	while ((ch = cli_getopt(WHO, argc, argv, lopts)) != -1) {
		const char *a = optarg, *n = cli_optname;

		switch (ch) {
		case 'h': usage(stdout); return 1;
		case '?': return -1;
		case O_MODEL: o->model = a; break;
		case O_PRESET: o->preset = a; break;
		case O_TOKENIZER:
			if (serve_tokenizer_opt(WHO, a))
				return -1;
			o->tokenizer = a;
			break;
		case O_BACKEND: o->backend = a; break;
		case O_URL: o->url = a; break;
		case O_KEY: o->api_key = a; break;
		case O_CONV: o->conversations = 1; break;
		case O_JSON: o->json = 1; break;
		case O_CLIENTS:
			if ((o->n_clients = parse_list(a, o->clients, MAX_LIST)) < 0) {
				fprintf(stderr, "%s: --clients '%s': a list of counts 1..4096\n", WHO, a);
				return -1;
			}
			break;
		case O_MODE:
			if (strcmp(a, "closed") && strcmp(a, "poisson") && strcmp(a, "both")) {
				fprintf(stderr, "%s: --mode '%s': closed, poisson or both\n", WHO, a);
				return -1;
			}
			o->mode = a;
			break;
		case O_REQ: if (cli_parse_int(WHO, n, a, 1, 100000, &o->requests)) return -1; break;
		case O_CHUNK: if (cli_parse_int(WHO, n, a, 1, 4096, &o->chunk)) return -1; break;
		case O_GPUMEM:
			if (cli_parse_size(WHO, n, a, 1 << 20, 1ull << 50, &o->gpu_mem))
				return -1;
			break;
		case O_KVDTYPE: if (cli_parse_kv_dtype(WHO, n, a, &o->kv_dtype)) return -1; break;
		case O_BPREFILL: o->batch_prefill = 1; break;
		case O_PREFILL:
			if (cli_parse_count(WHO, n, a, 1, 1 << 20, &o->prefill_budget))
				return -1;
			break;
		case O_ORDER:
			if (serve_parse_prefill_order(WHO, a, &o->prefill_order))
				return -1;
			o->set_order = 1;
			break;
		case O_SLICE:
			if (cli_parse_double(WHO, n, a, 0, 60000, &o->view_slice_ms))
				return -1;
			break;
		case O_TOK: if (cli_parse_int(WHO, n, a, 1, 1 << 20, &o->tokens)) return -1; break;
		case O_LINES: if (cli_parse_int(WHO, n, a, 1, 10000, &o->lines)) return -1; break;
		case O_RATE: if (cli_parse_double(WHO, n, a, 1e-3, 1e6, &o->rate)) return -1; break;
		case O_LOAD: if (cli_parse_double(WHO, n, a, 0.01, 10, &o->load)) return -1; break;
		case O_SEED: if (cli_parse_u64(WHO, n, a, &o->seed)) return -1; break;
		case O_TEMP: if (cli_parse_double(WHO, n, a, 0, 100, &o->temperature)) return -1; break;
		}
	}
	return cli_no_operands(WHO, argc, argv) ? -1 : 0;
}

/* Workspace lines of agentlang for client c (the embedded model's
 * language; a BPE model reads them as any text). */
static char *prompt_for(const struct opts *o, int c)
{
	agentlang_params p;
	agentlang_transcript ws;
	char *text;
	long n;
	int lines = 0;
	size_t cut = 0;

	agentlang_params_default(&p);
	p.seed = o->seed * 1000 + (uint64_t)c;
	/* At least 384: a transcript of fewer tokens has no room for its
	 * question (--lines 4 failed); the text is cut at --lines anyway. */
	p.n_tokens = 256 + 16 * (o->lines > 8 ? o->lines : 8);
	p.n_questions = 1;
	if (agentlang_transcript_build(&p, &ws))
		return NULL;
	/* Without the <bos> (the server begins a sequence with it). */
	n = agentlang_decode(ws.ids + 1, (size_t)ws.n_ids - 1, NULL, 0);
	text = n >= 0 ? malloc((size_t)n + 1) : NULL;
	if (text) {
		agentlang_decode(ws.ids + 1, (size_t)ws.n_ids - 1, text, (size_t)n + 1);
		while (text[cut] && lines < o->lines)
			lines += text[cut++] == '\n';
		text[cut] = 0;
	}
	agentlang_transcript_free(&ws);
	return text;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *f)
{
	(void)st;
	(void)f;
	return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* one: the first load's decode rate ("vs 1"); unloaded: its first token
 * p99, which a Poisson row's p99 is put against (0: none). */
static void report(const struct opts *o, const char *mode, int n, double rate,
		   const struct result *r, double one, double unloaded, double ideal)
{
	const double vs_unloaded = unloaded > 0 && !isnan(r->ttft99) ? r->ttft99 / unloaded : 0;
	const double ideal_vs = unloaded > 0 && ideal > 0 ? ideal / unloaded : 0;

	if (o->json) {
		/* No answer: no percentile (JSON has no NaN). */
		double v[7] = { r->ttft50, r->ttft99, r->lat50, r->lat99, r->tpot50, r->tpot99,
				r->gap99 };

		for (int i = 0; i < 7; i++)
			v[i] = isnan(v[i]) ? -1 : v[i];
		printf("{\"mode\":\"%s\",\"clients\":%d,\"rate\":%.3f,\"requests\":%d,\"failed\":%d,"
		       "\"wall_s\":%.3f,\"decode_tok_s\":%.1f,\"vs_one\":%.2f,\"requests_s\":%.2f,"
		       "\"ttft_ms_p50\":%.1f,\"ttft_ms_p99\":%.1f,\"latency_ms_p50\":%.1f,"
		       "\"latency_ms_p99\":%.1f,\"tpot_ms_p50\":%.2f,\"tpot_ms_p99\":%.2f,"
		       "\"gap_ms_p99\":%.1f,\"ttft_p99_vs_unloaded\":%.2f,"
		       "\"ideal_ttft_ms_p99\":%.1f,\"ideal_vs_unloaded\":%.2f,\"parked\":%lld,"
		       "\"prompt_tokens_mean\":%.1f,\"chunk\":%d,\"prefill_round\":%lld,"
		       "\"prefill_order\":\"%s\",\"view_slice_ms\":%g,\"temperature\":%g%s%s%s}\n",
		       mode, n, rate,
		       r->ok, r->failed, r->wall, r->tok_s, one > 0 ? r->tok_s / one : 0, r->req_s,
		       v[0], v[1], v[2], v[3], v[4], v[5], v[6], vs_unloaded,
		       ideal_vs > 0 ? ideal : 0, ideal_vs, (long long)r->parked,
		       r->ok ? (double)r->prompt / r->ok : 0,
		       o->used_chunk, (long long)o->used_round,
		       o->used_chunk ? serve_prefill_order_name(o->prefill_order) : "",
		       o->used_chunk ? o->view_slice_ms : -1, o->temperature,
		       r->failed ? ",\"error\":" : "", r->failed ? "\"see stderr\"" : "", "");
		if (r->failed)
			fprintf(stderr, "%s: %d requests failed; the first: %s\n", WHO, r->failed, r->err);
		return;
	}
	char vs[16] = "      -";

	/* Poisson's rate is what was offered, not what the server can do:
	 * no ratio. */
	if (one > 0)
		snprintf(vs, sizeof(vs), "%6.2fx", r->tok_s / one);
	printf("%-8s %7d %8.2f %8d %8.2f %9.1f %s %9.1f %9.1f %9.1f %9.1f %9.2f %8.1f %8.0f%s%s\n",
	       mode, n, rate, r->ok, r->wall, r->tok_s, vs, r->ttft50, r->ttft99, r->lat50, r->lat99,
	       r->tpot50, r->gap99, r->ok ? (double)r->prompt / r->ok : 0,
	       r->failed ? "  FAILED: " : "",
	       r->failed ? r->err : "");
	if (vs_unloaded > 0)
		printf("%-8s %7s first token p99 against the first load's (unloaded): %.1f / %.1f ms "
		       "= %.2fx\n", "", "", r->ttft99, unloaded, vs_unloaded);
	if (r->parked > 0)
		printf("%-8s %7s %lld turns waited for memory (parked: undone before their first "
		       "token, run again)\n", "",
		       "", (long long)r->parked);
	if (ideal_vs > 0)
		printf("%-8s %7s an ideal server at the same arrivals (one prompt at a time, each in "
		       "the unloaded p50): %.1f ms = %.2fx\n", "", "", ideal, ideal_vs);
}

int bench_serve(int argc, char **argv)
{
	struct opts o = { .mode = "both", .clients = { 1, 8, 32 }, .n_clients = 3, .tokens = 64,
			  .requests = 4, .lines = 8, .seed = 1, .load = 0.8, .view_slice_ms = -1 };
	struct serve_cfg c;
	struct serve *sv = NULL;
	struct load L = { 0 };
	char model_path[4096], data[] = "/tmp/kvmem-bench-serve.XXXXXX", machine[128] = "";
	char backend[32] = "", model[256] = "";
	double one = 0, unloaded = 0, service = 0;
	int r = parse(argc, argv, &o), rc = 0, maxc = 0;

	if (r)
		return r > 0 ? 0 : EXIT_USAGE;
	if (o.preset && o.model) {
		fprintf(stderr, "%s: --model or --preset, not both\n", WHO);
		return EXIT_USAGE;
	}
	if (o.url && (o.preset || o.model || o.tokenizer || o.chunk || o.prefill_budget || o.gpu_mem ||
		      o.set_order || o.view_slice_ms >= 0 || o.kv_dtype || o.batch_prefill)) {
		fprintf(stderr, "%s: --url names a running server: its model and settings are its "
			"own (no --model, --preset, --tokenizer, --chunk, --prefill-budget, "
			"--prefill-order, --view-slice, --gpu-mem, --kv-dtype or --batch-prefill)\n",
			WHO);
		return EXIT_USAGE;
	}
	if (o.url) {
		if (bench_target_parse(o.url, &L.t)) {
			fprintf(stderr, "%s: --url '%s': want http://HOST:PORT\n", WHO, o.url);
			return EXIT_USAGE;
		}
	} else {
		serve_cfg_default(&c);
		if (!o.model && !o.preset) {
			if (embedded_model_install(model_path, sizeof(model_path)) < 0) {
				fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
				return 1;
			}
			o.model = model_path;
		}
		if (!mkdtemp(data)) {
			fprintf(stderr, "%s: cannot make %s: %s\n", WHO, data, strerror(errno));
			return 1;
		}
		for (int i = 0; i < o.n_clients; i++)
			maxc = o.clients[i] > maxc ? o.clients[i] : maxc;
		c.model_dir = o.model;
		c.preset = o.preset;
		c.tokenizer = o.tokenizer;
		c.data_dir = data;
		c.backend = o.backend;
		c.port = 0;
		c.quiet = 1;
		c.max_queue = (int64_t)maxc * o.requests + 16;
		c.max_inflight = c.max_batch = c.max_open = maxc > 64 ? maxc : 64;
		c.max_request_tokens = 1 << 20;
		c.chunk = o.chunk;			/* 0: the backend's, as serve's */
		c.prefill_budget = o.prefill_budget;
		if (o.set_order)
			c.prefill_order = o.prefill_order;
		o.prefill_order = c.prefill_order;
		c.gpu_mem = o.gpu_mem;
		c.kv_dtype = o.kv_dtype;
		c.batch_prefill = o.batch_prefill;
		if (o.view_slice_ms >= 0)
			c.view_slice_ms = o.view_slice_ms;
		o.view_slice_ms = c.view_slice_ms;
		if (serve_start(&c, &sv)) {
			fprintf(stderr, "%s: %s\n", WHO, kvmem_last_error());
			nftw(data, rm_one, 16, FTW_DEPTH | FTW_PHYS);
			return 1;
		}
		snprintf(L.t.host, sizeof(L.t.host), "127.0.0.1");
		L.t.port = serve_port(sv);
		L.sv = sv;
		snprintf(model, sizeof(model), "%s", serve_model_name(sv));
		const char *wn = serve_weights_name(sv);

		snprintf(backend, sizeof(backend), "%s%s%s", serve_backend_name(sv),
			 wn ? ", weights " : "", wn ? wn : "");
		serve_prefill(sv, &o.used_chunk, &o.used_round);
	}
	L.t.api_key = o.api_key;
	if (!model[0]) {
		/* The named server's /health says what it runs. */
		snprintf(model, sizeof(model), "(see %s/health)", o.url);
		snprintf(backend, sizeof(backend), "?");
	}
	L.model = o.url ? NULL : model;	/* the request's "model" (a named server takes none) */
	{
		FILE *f = fopen("/proc/cpuinfo", "r");
		char line[256];

		while (f && fgets(line, sizeof(line), f))
			if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
				snprintf(machine, sizeof(machine), "%s", strchr(line, ':') + 2);
				machine[strcspn(machine, "\n")] = 0;
				break;
			}
		if (f)
			fclose(f);
	}
	if (!o.json) {
		printf("kvmem bench serve: model %s, backend %s%s, %ld CPUs (%s)\n", model, backend,
		       o.kv_dtype == KVMEM_DTYPE_FP8 ? " (fp8 KV)" : "", sysconf(_SC_NPROCESSORS_ONLN),
		       machine);
		printf("each request: %d workspace lines, %d tokens decoded (ignore_eos, %s), streamed%s\n",
		       o.lines, o.tokens, o.temperature > 0 ? "sampled" : "greedy",
		       o.conversations ? ", turns of one conversation per client" : "");
		if (o.temperature > 0)
			printf("sampled at temperature %g, each request seeded\n", o.temperature);
		if (sv)
			printf("the server's prefill: chunk %d, %lld tokens a round%s, %s%s; view work "
			       "%g ms a round (--view-slice)\n",
			       o.used_chunk, (long long)o.used_round,
			       o.chunk || o.prefill_budget ? "" : " (the backend's defaults)",
			       serve_prefill_order_says(o.prefill_order),
			       o.batch_prefill ? ", chunks of several prompts in one pass "
						 "(--batch-prefill)" : "",
			       o.view_slice_ms);
		printf("%-8s %7s %8s %8s %8s %9s %7s %9s %9s %9s %9s %9s %8s %8s\n", "load", "clients",
		       "rate/s", "requests", "wall s", "decode/s", "vs 1", "ttft p50", "ttft p99",
		       "lat p50", "lat p99", "tpot p50", "gap p99", "prompt");
	}
	for (int k = 0; k < o.n_clients && !rc; k++) {
		int n = o.clients[k];
		struct result res;
		double sustained = 0;

		L.clients = n;
		L.n_req = n * o.requests;
		L.o = &o;
		L.s = calloc((size_t)L.n_req, sizeof(*L.s));
		L.arrive = calloc((size_t)L.n_req, sizeof(*L.arrive));
		L.prompts = calloc((size_t)n, sizeof(char *));
		if (!L.s || !L.arrive || !L.prompts) {
			rc = 1;
			break;
		}
		for (int i = 0; i < n && !rc; i++)
			if (!(L.prompts[i] = prompt_for(&o, i))) {
				fprintf(stderr, "%s: client %d's prompt: %s\n", WHO, i,
					kvmem_last_error());
				rc = 1;
			}
		if (!rc && !k) {
			/* One request first, not counted: the first load's
			 * first token is then a warm server's (a cold one's
			 * pays for the backend's first forward and the first
			 * allocations, and "unloaded" is put against it). */
			run_one(&L, 0, 0, NULL);
			if (!L.s[0].ok) {
				fprintf(stderr, "%s: the warm-up request failed: %s\n", WHO, L.s[0].err);
				rc = 1;
			} else if (!o.json) {
				printf("warm-up: one request before the loads, not counted (first token "
				       "%.1f ms)\n", L.s[0].ttft * 1e3);
			}
		}
		if (!rc && strcmp(o.mode, "poisson")) {
			run_load(&L, 0, 0, &res);
			/* The first load's rate (one client's, by default) is
			 * what "vs 1" divides by. */
			if (!one) {
				one = res.tok_s;
				unloaded = res.ttft99;
				/* The ideal server's time a prompt: a lone
				 * client's first token (not a loaded one's). */
				service = n == 1 ? res.ttft50 / 1e3 : 0;
			}
			report(&o, "closed", n, 0, &res, one, 0, 0);
			sustained = res.req_s;
			rc = res.failed > 0;
		}
		if (!rc && strcmp(o.mode, "closed")) {
			double rate = o.rate ? o.rate : o.load * (sustained ? sustained : 1.0);

			run_load(&L, 1, rate, &res);
			report(&o, "poisson", n, rate, &res, 0, isnan(unloaded) ? 0 : unloaded,
			       service > 0 ? ideal_ttft99(L.arrive, L.n_req, service) * 1e3 : 0);
			rc = res.failed > 0;
		}
		for (int i = 0; i < n; i++)
			free(L.prompts[i]);
		free(L.prompts);
		free(L.s);
		free(L.arrive);
	}
	if (sv) {
		serve_stop(sv);
		nftw(data, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	}
	return rc;
}
#endif
