// SPDX-License-Identifier: MIT
/*
 * The agentlang vocabulary: fixed word lists, laid out in a fixed order, so
 * the ids never depend on anything but this file. The trained model's
 * embedding rows are these ids: change a list and the model must be trained
 * again (agentlang_vocab_hash() tells).
 *
 * Lists are kept disjoint on purpose (a stem is never a key part or a value
 * word): a look-alike is then a matter of which tokens are shared, never of
 * one token meaning two things.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "agentlang/lang.h"

#define VOCAB_CAP 1024
#define PIECE_MAX 24
#define HASH_SLOTS 4096

static const char *const specials[AGENTLANG_N_SPECIAL] = {
	"<pad>", "<bos>", "<eos>", "?", "=", "<end>", "\n",
};

static const char *const commands[] = {
	"cat", "set", "ls", "tail", "grep", "make", "test", "git", "status", "npm", "build", "run",
};

static const char *const output_words[] = {
	"passed", "failed", "modified", "clean", "built", "files", "took",
};

static const char *const stems[] = {
	"api", "web", "worker", "auth", "billing", "gateway", "proxy", "search", "indexer",
	"mailer", "scheduler", "storage", "metrics", "logger", "deployer", "console", "cron",
	"notifier", "reporter", "uploader", "media", "streamer", "chat", "accounts",
	"payments", "orders", "cart", "catalog", "inventory", "shipping", "pricing", "geo",
	"maps", "router", "edge", "cdn", "vault", "secrets", "core", "common", "shared",
	"utils", "tools", "release", "agent", "monitor", "alerter", "tracer", "auditor",
	"ledger", "invoices", "profile", "feed", "timeline", "comments", "likes", "votes",
	"ranking", "recsys", "ads", "analytics", "events", "ingest", "etl", "warehouse",
	"lake", "spark", "flink", "airflow", "jobs", "tasks", "pipeline", "builder", "runner",
	"executor", "planner", "optimizer", "compiler", "linter", "formatter", "parser",
	"lexer", "renderer", "thumbnailer", "transcoder", "encoder", "decoder", "crawler",
	"scraper", "fetcher", "loader", "exporter", "importer", "converter", "validator",
	"checker", "tester", "fuzzer", "bench", "profiler", "debugger", "shell", "terminal",
	"editor", "viewer", "portal", "dashboard", "frontend", "backend", "mobile", "desktop",
	"kiosk", "printer", "scanner", "sensor", "device", "firmware", "bootloader", "kernel",
	"mesh", "sidecar", "ingress", "egress", "registry", "discovery", "broker", "relay",
	"bridge", "tunnel", "firewall", "vpn", "wiki", "forum", "blog", "shop",
};

static const char *const exts[] = {
	".conf", ".yaml", ".toml", ".env", ".ini", ".json", ".cfg", ".props",
};

static const char *const keyparts[] = {
	"db", "cache", "http", "grpc", "queue", "smtp", "redis", "kafka", "tls", "pool",
	"retry", "rate", "feature", "trace", "session", "cookie", "cors", "jwt", "oauth",
	"ldap", "dns", "snapshot", "gc", "heap", "thread", "batch", "upload", "stream",
	"lock", "index", "shard", "quota",
};

/* Key names and the type of their values. The wide types come first: a
 * needle's key is drawn from them (AL_NEEDLE_KN in gen.c). */
static const struct {
	const char *name;
	uint8_t type;
} keynames[] = {
	{ ".port", AL_V_PORT }, { ".host", AL_V_HOST }, { ".peer", AL_V_HOST },
	{ ".leader", AL_V_HOST }, { ".cluster", AL_V_HOST }, { ".id", AL_V_HEX },
	{ ".key", AL_V_HEX }, { ".secret", AL_V_HEX }, { ".token", AL_V_HEX },
	{ ".bucket", AL_V_HEX }, { ".timeout", AL_V_DURATION }, { ".ttl", AL_V_DURATION },
	{ ".interval", AL_V_DURATION }, { ".delay", AL_V_DURATION },
	{ ".backoff", AL_V_DURATION }, { ".size", AL_V_SIZE }, { ".buffer", AL_V_SIZE },
	{ ".cap", AL_V_SIZE }, { ".max", AL_V_COUNT }, { ".min", AL_V_COUNT },
	{ ".replicas", AL_V_COUNT }, { ".retries", AL_V_COUNT }, { ".workers", AL_V_COUNT },
	{ ".threads", AL_V_COUNT }, { ".level", AL_V_LEVEL }, { ".enabled", AL_V_BOOL },
	{ ".user", AL_V_USER }, { ".mode", AL_V_MODE }, { ".region", AL_V_REGION },
	{ ".zone", AL_V_REGION }, { ".format", AL_V_FORMAT }, { ".driver", AL_V_DRIVER },
};

static const char *const w_level[] = { "debug", "info", "warn", "error", "verbose", "fatal" };
static const char *const w_bool[] = { "on", "off", "true", "false", "yes", "no" };
static const char *const w_user[] = { "root", "admin", "deploy", "app", "svc", "guest",
				      "nobody", "ops" };
static const char *const w_mode[] = { "strict", "lax", "auto", "manual", "fast", "safe",
				      "eager", "lazy", "sync", "async" };
static const char *const w_region[] = { "north", "south", "east", "west", "central" };
static const char *const w_format[] = { "json", "text", "csv", "xml", "gzip", "zstd", "lz4",
					"snappy" };
static const char *const w_driver[] = { "postgres", "mysql", "sqlite", "mongo", "memory",
					"nfs", "local", "tmpfs" };

static const char *const hostpfx[] = { "node", "host", "pod", "vm", "rack" };
static const char *const units[] = { "ms", "s", "m", "h", "kb", "mb", "gb" };

static const char *const logwords[] = {
	"started", "stopped", "connected", "disconnected", "retrying", "request", "response",
	"served", "login", "logout", "timeout", "slow", "hit", "miss", "flushed", "loaded",
	"saved", "compiled", "linked", "skipped", "queued", "done", "pid", "job", "task",
	"commit", "push", "pull", "merge", "branch", "main", "opened", "closed", "accepted",
	"rejected", "sent", "received", "wrote", "read", "deleted", "created", "updated",
	"synced", "ready", "healthy", "unhealthy", "restarting", "listening", "waiting",
	"dropped", "expired", "renewed", "rotated", "scaled", "user", "conn", "bytes", "rows",
	"cpu", "mem", "latency", "p99", "errors", "warnings", "retries", "spawned", "killed",
	"exited", "code", "signal", "ping", "pong", "upstream", "downstream", "client", "server",
};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

struct vocab {
	int n, size;
	char piece[VOCAB_CAP][PIECE_MAX];
	uint8_t glue[VOCAB_CAP];
	unsigned roles[VOCAB_CAP];
	int16_t slot[HASH_SLOTS];	/* id + 1, 0 = empty */
	uint32_t hash;
	struct al_roles r;
	int failed;
};

static struct vocab V;
static pthread_once_t vocab_once = PTHREAD_ONCE_INIT;

static uint32_t fnv(const char *s, int glue)
{
	uint32_t h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 16777619u;
	return (h ^ (uint32_t)glue) * 16777619u;
}

static int find(const char *s, int glue)
{
	for (uint32_t i = fnv(s, glue) & (HASH_SLOTS - 1);; i = (i + 1) & (HASH_SLOTS - 1)) {
		int id = V.slot[i] - 1;

		if (id < 0)
			return -1;
		if (V.glue[id] == glue && !strcmp(V.piece[id], s))
			return id;
	}
}

/* The id of (s, glue), added with `role` if new. */
static int32_t add(const char *s, int glue, unsigned role)
{
	int id = find(s, glue);

	if (id >= 0) {
		V.roles[id] |= role;
		return id;
	}
	if (V.n >= VOCAB_CAP || strlen(s) >= PIECE_MAX) {
		V.failed = 1;
		return 0;
	}
	id = V.n++;
	strcpy(V.piece[id], s);
	V.glue[id] = (uint8_t)glue;
	V.roles[id] = role;
	for (uint32_t i = fnv(s, glue) & (HASH_SLOTS - 1);; i = (i + 1) & (HASH_SLOTS - 1))
		if (!V.slot[i]) {
			V.slot[i] = (int16_t)(id + 1);
			break;
		}
	return id;
}

static void add_list(struct al_list *l, const char *const *w, int n, int glue, unsigned role)
{
	for (int i = 0; i < n && l->n < AL_MAX_LIST; i++)
		l->id[l->n++] = add(w[i], glue, role);
}

static void build(void)
{
	struct al_roles *r = &V.r;
	char buf[PIECE_MAX];

	for (int i = 0; i < AGENTLANG_N_SPECIAL; i++)
		add(specials[i], 0, AGENTLANG_R_SPECIAL);
	r->dollar = add("$", 0, AGENTLANG_R_STRUCT);
	r->eq = AGENTLANG_A;	/* "=" is special: the answer marker too */
	r->ok = add("ok", 0, AGENTLANG_R_STRUCT);
	r->colon = add(":", 1, AGENTLANG_R_STRUCT);

	int32_t cmd[N_OF(commands)];
	for (int i = 0; i < N_OF(commands); i++)
		cmd[i] = add(commands[i], 0, AGENTLANG_R_COMMAND);
	r->cmd_cat = cmd[0], r->cmd_set = cmd[1], r->cmd_ls = cmd[2], r->cmd_tail = cmd[3];
	r->cmd_grep = cmd[4], r->cmd_make = cmd[5], r->cmd_test = cmd[6], r->cmd_git = cmd[7];
	r->cmd_status = cmd[8], r->cmd_npm = cmd[9], r->cmd_build = cmd[10], r->cmd_run = cmd[11];
	int32_t ow[N_OF(output_words)];
	for (int i = 0; i < N_OF(output_words); i++)
		ow[i] = add(output_words[i], 0, AGENTLANG_R_WORD);
	r->w_passed = ow[0], r->w_failed = ow[1], r->w_modified = ow[2], r->w_clean = ow[3];
	r->w_built = ow[4], r->w_files = ow[5], r->w_took = ow[6];

	add_list(&r->stem, stems, N_OF(stems), 0, AGENTLANG_R_STEM);
	for (int d = 1; d <= 9; d++) {
		snprintf(buf, sizeof(buf), "%d", d);
		r->variant[d] = add(buf, 1, AGENTLANG_R_VARIANT);
	}
	add_list(&r->ext, exts, N_OF(exts), 1, AGENTLANG_R_EXT);
	r->ext_log = add(".log", 1, AGENTLANG_R_EXT);
	add_list(&r->kp, keyparts, N_OF(keyparts), 0, AGENTLANG_R_KEYPART);
	for (int i = 0; i < N_OF(keynames); i++) {
		r->kn.id[r->kn.n] = add(keynames[i].name, 1, AGENTLANG_R_KEYNAME);
		r->kn_type[r->kn.n++] = keynames[i].type;
	}

	/* Values: numbers as one start piece 0..99 and glue pairs, hex ids
	 * behind "0x", units, host prefixes and the word sets. */
	for (int i = 0; i < 100; i++) {
		snprintf(buf, sizeof(buf), "%d", i);
		r->num[i] = add(buf, 0, AGENTLANG_R_VALUE);
	}
	for (int i = 0; i < 256; i++) {
		snprintf(buf, sizeof(buf), "%02x", i);
		r->pair[i] = add(buf, 1, AGENTLANG_R_VALUE);
	}
	r->hex0x = add("0x", 0, AGENTLANG_R_VALUE);
	add_list(&r->unit, units, N_OF(units), 1, AGENTLANG_R_VALUE);
	add_list(&r->hostpfx, hostpfx, N_OF(hostpfx), 0, AGENTLANG_R_VALUE);
	add_list(&r->words[AL_V_LEVEL], w_level, N_OF(w_level), 0, AGENTLANG_R_VALUE);
	add_list(&r->words[AL_V_BOOL], w_bool, N_OF(w_bool), 0, AGENTLANG_R_VALUE);
	add_list(&r->words[AL_V_USER], w_user, N_OF(w_user), 0, AGENTLANG_R_VALUE);
	add_list(&r->words[AL_V_MODE], w_mode, N_OF(w_mode), 0, AGENTLANG_R_VALUE);
	add_list(&r->words[AL_V_REGION], w_region, N_OF(w_region), 0, AGENTLANG_R_VALUE);
	add_list(&r->words[AL_V_FORMAT], w_format, N_OF(w_format), 0, AGENTLANG_R_VALUE);
	add_list(&r->words[AL_V_DRIVER], w_driver, N_OF(w_driver), 0, AGENTLANG_R_VALUE);
	/* Log lines use the level words too (the same tokens). */
	add_list(&r->level, w_level, N_OF(w_level), 0, AGENTLANG_R_WORD);
	add_list(&r->logw, logwords, N_OF(logwords), 0, AGENTLANG_R_WORD);

	V.size = (V.n + 63) & ~63;
	for (int i = V.n; i < V.size; i++) {
		snprintf(buf, sizeof(buf), "<unused%d>", i);
		add(buf, 0, AGENTLANG_R_UNUSED);
	}
	V.hash = 2166136261u;
	for (int i = 0; i < V.size; i++)
		V.hash = (V.hash ^ fnv(V.piece[i], V.glue[i])) * 16777619u;
}

static void init(void)
{
	build();
	if (V.failed || V.n != V.size) {
		/* A list too long for the table: a bug in this file, caught by
		 * the unit tests; say so loudly rather than emit wrong ids. */
		fprintf(stderr, "agentlang: vocabulary does not fit (%d pieces)\n", V.n);
		abort();
	}
}

const struct al_roles *al_roles(void)
{
	pthread_once(&vocab_once, init);
	return &V.r;
}

int agentlang_vocab_size(void)
{
	al_roles();
	return V.size;
}

uint32_t agentlang_vocab_hash(void)
{
	al_roles();
	return V.hash;
}

const char *agentlang_piece(int id)
{
	al_roles();
	return id >= 0 && id < V.size ? V.piece[id] : NULL;
}

int agentlang_is_glue(int id)
{
	al_roles();
	return id >= 0 && id < V.size ? V.glue[id] : 0;
}

unsigned agentlang_roles(int id)
{
	al_roles();
	return id >= 0 && id < V.size ? V.roles[id] : 0;
}

int agentlang_lookup(const char *piece, int glue)
{
	al_roles();
	if (!piece || strlen(piece) >= PIECE_MAX)
		return -1;
	return find(piece, !!glue);
}
