// SPDX-License-Identifier: MIT
/*
 * Counters: kept in the pager, saved as text in DIR/stats ("name value" per
 * line) at each commit and close, so `kvmem stat` reads them without BPF.
 * The file is advisory (replaced by rename, not fsynced): losing the last
 * update in a crash loses counts, never data.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
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

static int parse_stats(FILE *f, kvmem_pager_stats *s)
{
	char name[64];
	uint64_t v;

	memset(s, 0, sizeof(*s));
	while (fscanf(f, "%63s %" SCNu64, name, &v) == 2)
		for (size_t i = 0; i < N_FIELDS; i++)
			if (!strcmp(name, fields[i].name))
				*field(s, i) = v;
	return 0;
}

int kvmem_workspace_stats(const char *dir, kvmem_pager_stats *s)
{
	char path[PATH_MAX + 16];
	FILE *f;

	snprintf(path, sizeof(path), "%s/stats", dir);
	f = fopen(path, "r");
	if (!f) {
		memset(s, 0, sizeof(*s));
		return kvmem_error(errno, "%s: %s", path, strerror(errno));
	}
	parse_stats(f, s);
	fclose(f);
	return 0;
}

void kvmem_pager_stats_get(const kvmem_pager *p, kvmem_pager_stats *s)
{
	*s = p->st;
}

void kvmem_pager_stats_total(const kvmem_pager *p, kvmem_pager_stats *s)
{
	kvmem_pager_stats t = p->base;

	for (size_t i = 0; i < N_FIELDS; i++)
		*field(&t, i) += *field((kvmem_pager_stats *)&p->st, i);
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
	int fd = openat(p->dirfd, "stats", O_RDONLY | O_CLOEXEC);
	FILE *f;

	memset(&p->base, 0, sizeof(p->base));
	if (fd < 0)
		return;
	f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return;
	}
	parse_stats(f, &p->base);
	fclose(f);
}

void stats_save(kvmem_pager *p)
{
	kvmem_pager_stats t;
	FILE *f;
	int fd;

	if (p->rdonly)
		return;
	kvmem_pager_stats_total(p, &t);
	fd = openat(p->dirfd, "stats.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		return;
	}
	for (size_t i = 0; i < N_FIELDS; i++)
		fprintf(f, "%s %" PRIu64 "\n", fields[i].name, *field(&t, i));
	if (fclose(f) == 0)
		renameat(p->dirfd, "stats.tmp", p->dirfd, "stats");
	else
		unlinkat(p->dirfd, "stats.tmp", 0);
}
