// SPDX-License-Identifier: MIT
/*
 * Per-thread errors: every failing call leaves a code (a positive errno
 * value) and a sentence naming the file, the object and what is wrong.
 * Callers branch on the code; the sentence is for people.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"

static _Thread_local char errbuf[1024];
static _Thread_local int errcode;

const char *kvmem_last_error(void)
{
	return errbuf;
}

int kvmem_last_errno(void)
{
	return errcode;
}

int kvmem_error(int err, const char *fmt, ...)
{
	char msg[sizeof(errbuf)];
	va_list ap;

	/* Format aside first: an argument may be kvmem_last_error() itself. */
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	memcpy(errbuf, msg, sizeof(errbuf));
	errcode = err > 0 ? err : EIO;
	return -errcode;
}

int kvmem_error_prefix(const char *fmt, ...)
{
	char old[sizeof(errbuf)];
	va_list ap;
	int n;

	if (!errcode)
		errcode = EIO;
	memcpy(old, errbuf, sizeof(old));
	va_start(ap, fmt);
	n = vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	/* Bound the old text to what is left, so a long chain is cut, not lost. */
	if (n >= 0 && (size_t)n + 3 < sizeof(errbuf))
		snprintf(errbuf + n, sizeof(errbuf) - n, ": %.*s",
			 (int)(sizeof(errbuf) - n - 3), old);
	return -errcode;
}

int kvmem_fail(void)
{
	return -(errcode ? errcode : EIO);
}

void kvmem_error_clear(void)
{
	errcode = 0;
	errbuf[0] = 0;
}

char *kvmem_data_dir(char *buf, size_t len)
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
