/*
 * env.c - the shim's environment; see preload_i.h.
 *
 * Read once, by the library's constructor (the environment is in place by
 * then; earlier allocations, made by the dynamic loader, are small and are
 * forwarded).  The engine's tunables come from the project's registry
 * (lib/tunables/tunables.h: KVP_RAM_BUDGET_BYTES, KVP_IO_DEPTH, ...); the
 * shim's own variables are parsed by the same code, through descriptors of
 * the same form that are not part of the registry.
 *
 * Each variable stands alone: a bad one is named and ignored, the others
 * apply (a program run with KVP_IO_DEPTH=0 still gets its 16M budget).  A
 * KVP_ name that nothing reads is named with the nearest one that is.
 */
#include "lib/preload/preload_i.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/tunables/tunables.h"

struct kvp_preload_env kvp_env = {
	.min_bytes = UINT64_MAX, /* nothing is served before the constructor */
};

void kvp_preload_say(const char *fmt, ...)
{
	char buf[768];
	va_list ap;
	int n, k;

	n = snprintf(buf, sizeof(buf), "kvpager-preload: ");
	va_start(ap, fmt);
	k = vsnprintf(buf + n, sizeof(buf) - n - 1, fmt, ap);
	va_end(ap);
	if (k < 0)
		k = 0;
	n += k;
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	(void)!write(2, buf, n);
}

/* The shim's own variables, in the registry's form (not in the registry:
 * they mean nothing to a pager that is not the shim's). */
#define OWN(n, ty, lo, hi, d, text)                                            \
	{                                                                      \
		.name = n, .type = ty, .min = lo, .max = hi, .def = d,         \
		.doc = text                                                    \
	}
static const struct kvp_tunable own[] = {
	OWN("KVP_PRELOAD_STRICT", KVP_T_BOOL, 0, 1, 0,
	    "abort instead of falling back to the normal allocator"),
	OWN("KVP_PRELOAD_STATS", KVP_T_BOOL, 0, 1, 0,
	    "print the shim's and the pager's totals at exit"),
	OWN("KVP_PRELOAD_MIN_BYTES", KVP_T_BYTES, 4096, 1ULL << 50, 1ULL << 30,
	    "smallest allocation backed by the pager"),
	OWN("KVP_PRELOAD_BLOCK_BYTES", KVP_T_BYTES, 4096, 2ULL << 20,
	    2ULL << 20, "block size of the shim's regions"),
};
#undef OWN

enum { OWN_STRICT, OWN_STATS, OWN_MIN, OWN_BLOCK };

static void bad_value(const char *msg)
{
	if (kvp_env.strict) {
		kvp_preload_say("%s; aborting (KVP_PRELOAD_STRICT=1)", msg);
		abort();
	}
	kvp_preload_say("%s", msg);
}

static uint64_t read_own(unsigned i)
{
	const struct kvp_tunable *t = &own[i];
	char err[KVP_TUNABLE_ERR_MAX], msg[KVP_TUNABLE_ERR_MAX + 64];
	const char *s = getenv(t->name);
	uint64_t v;

	if (!s)
		return t->def;
	if (kvp_tunable_parse(t, s, &v, err, sizeof(err))) {
		/* err is "KVP_X: 'v' is not ...; accepted: ..." */
		snprintf(msg, sizeof(msg), "%s; ignored, the default stays",
			 err);
		bad_value(msg);
		return t->def;
	}
	if (i == OWN_BLOCK && (v & (v - 1))) {
		snprintf(msg, sizeof(msg),
			 "%s=%s: not a power of two; accepted: 4K 8K .. 2M; "
			 "ignored, the default stays",
			 t->name, s);
		bad_value(msg);
		return t->def;
	}
	return v;
}

static const char *read_path(const char *var)
{
	const char *s = getenv(var);

	return s && *s ? s : NULL;
}

/* Engine tunables read at most; the registry has about 30. */
#define MAX_ENGINE_VARS 128

/*
 * Each KVP_<ENGINE TUNABLE> into kvp_env.cfg on its own.  A value that
 * does not parse or is out of range is named and ignored.  Values that
 * parse are set by kvp_tunable_set, which checks the whole engine config
 * (the watermarks stay ordered): one that fits only after another is set
 * is retried, and one that never fits is named and ignored.
 */
static void load_engine_vars(void)
{
	struct kvp_tunable_target tg = { .pager = &kvp_env.cfg };
	const struct kvp_tunable *pend[MAX_ENGINE_VARS];
	char err[KVP_TUNABLE_ERR_MAX],
	    msg[KVP_TUNABLE_ERR_MAX + KVP_TUNABLE_VALUE_MAX + 256];
	char name[96], value[KVP_TUNABLE_VALUE_MAX];
	uint64_t v, vals[MAX_ENGINE_VARS];
	size_t i, n = 0, left;
	bool progress = true;

	for (i = 0; i < kvp_tunables_count() && n < MAX_ENGINE_VARS; i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		const char *s;

		if (t->owner != KVP_TUNABLE_PAGER)
			continue; /* the shim runs no KV layer */
		kvp_tunable_env_name(t, name, sizeof(name));
		s = getenv(name);
		if (!s)
			continue;
		if (kvp_tunable_parse(t, s, &v, err, sizeof(err))) {
			/* err is "name: 'value' why; accepted: ..." */
			kvp_tunable_format(t, t->def, value, sizeof(value));
			snprintf(msg, sizeof(msg),
				 "%s=%s:%s; ignored, %s stays %s", name, s,
				 strchr(err, ':') ? strchr(err, ':') + 1 : err,
				 t->name, value);
			bad_value(msg);
			continue;
		}
		pend[n] = t;
		vals[n++] = v;
	}
	for (left = n; left && progress;) {
		progress = false;
		for (i = 0; i < n; i++)
			if (pend[i] && !kvp_tunable_set(&tg, pend[i], vals[i],
							err, sizeof(err))) {
				pend[i] = NULL;
				left--;
				progress = true;
			}
	}
	for (i = 0; i < n; i++) {
		if (!pend[i])
			continue;
		kvp_tunable_env_name(pend[i], name, sizeof(name));
		kvp_tunable_set(&tg, pend[i], vals[i], err, sizeof(err));
		snprintf(msg, sizeof(msg),
			 "%s=%s does not fit the others: %s; "
			 "ignored",
			 name, getenv(name), err);
		bad_value(msg);
	}
}

/* Name each KVP_ variable that nothing reads, with the nearest that is. */
static void warn_unknown_vars(void)
{
	char msg[256];
	size_t pos = 0;

	while (kvp_env_unknown_next(&pos, msg, sizeof(msg)))
		kvp_preload_say("%s", msg);
}

void kvp_preload_env_load(void)
{
	if (kvp_env.loaded)
		return;
	kvp_env.strict = read_own(OWN_STRICT);
	kvp_env.stats = read_own(OWN_STATS);
	kvp_env.min_bytes = read_own(OWN_MIN);
	kvp_env.block_bytes = read_own(OWN_BLOCK);
	kvp_env.backing_dir = read_path("KVP_BACKING_DIR");
	kvp_env.fuse_mount = read_path("KVP_FUSE_MOUNT");
	kvp_config_defaults(&kvp_env.cfg);
	/* A program's pages are touched at random as often as in order:
	 * read what a fault needs, not the shim's whole 2 MiB block. */
	kvp_env.cfg.fault_around_bytes = KVP_FAULT_AROUND_PROGRAM;
	load_engine_vars();
	warn_unknown_vars();
	__atomic_store_n(&kvp_env.loaded, true, __ATOMIC_RELEASE);
}
