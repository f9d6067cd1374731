// SPDX-License-Identifier: MIT
/* Per-thread error messages: every failing call leaves a sentence here. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"

static _Thread_local char errbuf[1024];

const char *kvm_last_error(void)
{
	return errbuf;
}

int kvm_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	return -1;
}

int kvm_error_prefix(const char *fmt, ...)
{
	char old[sizeof(errbuf)];
	va_list ap;
	int n;

	memcpy(old, errbuf, sizeof(old));
	va_start(ap, fmt);
	n = vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	/* Bound the old text to what is left, so a long chain is cut, not lost. */
	if (n >= 0 && (size_t)n + 3 < sizeof(errbuf))
		snprintf(errbuf + n, sizeof(errbuf) - n, ": %.*s",
			 (int)(sizeof(errbuf) - n - 3), old);
	return -1;
}

char *kvm_data_dir(char *buf, size_t len)
{
	const char *e = getenv("KVMEM_HOME");
	int n;

	if (e && *e)
		n = snprintf(buf, len, "%s", e);
	else if ((e = getenv("XDG_DATA_HOME")) && *e)
		n = snprintf(buf, len, "%s/kvmem", e);
	else
		n = snprintf(buf, len, "%s/.local/share/kvmem",
			     getenv("HOME") ? getenv("HOME") : "/tmp");
	return (n < 0 || (size_t)n >= len) ? NULL : buf;
}
