// SPDX-License-Identifier: MIT
/*
 * Counters: kept in the pager, saved as text beside the workspace (DIR/stats,
 * or the RADOS object "stats"; "name value" per line) at each commit and at
 * the close of a writer that wrote (one that did not leaves the store as it
 * found it), so `kvmem stat` reads them without BPF.
 * The file is advisory (replaced by rename, not fsynced): losing the last
 * update in a crash loses counts, never data; one that is not a regular
 * file is ignored. Counters saturate at 2^64 - 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pager/pager_int.h"

static const struct {
	const char *name, *what;
	size_t off;
} fields[] = {
#define KVMEM_STAT_ROW(n, w) { #n, w, offsetof(kvmem_pager_stats, n) },
	KVMEM_PAGER_STATS(KVMEM_STAT_ROW)
#undef KVMEM_STAT_ROW
};
#define N_FIELDS (sizeof(fields) / sizeof(fields[0]))

static uint64_t *field(kvmem_pager_stats *s, size_t i)
{
	return (uint64_t *)((char *)s + fields[i].off);
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* "name value" lines; unknown names are skipped, a value past 2^64 - 1
 * reads as 2^64 - 1 (the counters saturate, they never wrap). */
static void parse_stats(FILE *f, kvmem_pager_stats *s)
{
	char line[256];

	while (fgets(line, sizeof(line), f)) {
		char *sp = strchr(line, ' '), *end;
		unsigned long long v;

		if (!sp)
			continue;
		*sp = 0;
		if (sp[1] < '0' || sp[1] > '9')
			continue;
		errno = 0;
		v = strtoull(sp + 1, &end, 10);
		if (errno == ERANGE)
			v = UINT64_MAX;
		for (size_t i = 0; i < N_FIELDS; i++)
			if (!strcmp(line, fields[i].name))
				*field(s, i) = v;
	}
}

void kvmem_pager_stats_get(const kvmem_pager *p, kvmem_pager_stats *s)
{
	pager_lock(p);	/* another pager may evict this one's pages */
	*s = p->st;
	pager_unlock(p);
}

void kvmem_pager_stats_total(const kvmem_pager *p, kvmem_pager_stats *s)
{
	kvmem_pager_stats t = p->base;

	pager_lock(p);
	for (size_t i = 0; i < N_FIELDS; i++)
		*field(&t, i) = sat_add(*field(&t, i), *field((kvmem_pager_stats *)&p->st, i));
	pager_unlock(p);
	*s = t;
}

void kvmem_pager_stats_print(const kvmem_pager_stats *s, FILE *f)
{
	double hits = s->host_hits, all = s->host_hits + s->host_misses;

	for (size_t i = 0; i < N_FIELDS; i++)
		fprintf(f, "%-20s %14" PRIu64 "  %s\n", fields[i].name,
			*field((kvmem_pager_stats *)s, i), fields[i].what);
	fprintf(f, "%-20s %14.4f  host hits / fetched pages\n", "host_hit_rate",
		all ? hits / all : 0.0);
	if (s->read_ns)
		fprintf(f, "%-20s %14.1f  MB/s while reads were outstanding\n", "read_rate",
			s->bytes_in / (s->read_ns / 1e9) / 1e6);
}

void stats_load(kvmem_pager *p)
{
	if (stats_read(p->ws, &p->base) < 0)
		kvmem_error_clear();	/* none yet, or not usable: counts start at 0 */
}

void stats_save(kvmem_pager *p)
{
	kvmem_pager_stats t;
	char *text = NULL;
	size_t len = 0;
	FILE *f;

	if (p->rdonly)
		return;
	kvmem_pager_stats_total(p, &t);
	f = open_memstream(&text, &len);
	if (!f)
		return;
	for (size_t i = 0; i < N_FIELDS; i++)
		fprintf(f, "%s %" PRIu64 "\n", fields[i].name, *field(&t, i));
	/* Advisory: a failure to save them costs counts, never data (and
	 * sets no message: close may be reporting another failure). */
	if (fclose(f) == 0)
		p->ws->ops->aux_write(p->ws, "stats", text, len, 0);
	free(text);
}

int stats_read(struct ws_store *ws, kvmem_pager_stats *st)
{
	char *text;
	size_t len;
	FILE *f;
	int rc;

	memset(st, 0, sizeof(*st));
	if ((rc = ws->ops->aux_read(ws, "stats", &text, &len)) < 0)
		return rc;
	f = fmemopen(text, len ? len : 1, "r");
	if (!f) {
		free(text);
		return kvmem_error(errno, "%s/stats: %s", ws->name, strerror(errno));
	}
	if (len)
		parse_stats(f, st);
	fclose(f);
	free(text);
	return 0;
}
