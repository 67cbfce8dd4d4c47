/*
 * env.c - the shim's environment; see preload_i.h.
 *
 * Read once, by the library's constructor (the environment is in place by
 * then; earlier allocations, made by the dynamic loader, are small and are
 * forwarded).  The engine's tunables come from the project's registry
 * (lib/tunables/tunables.h: KVP_RAM_BUDGET_BYTES, KVP_IO_DEPTH, ...); the shim's own
 * variables are parsed by the same code, through descriptors of the same
 * form that are not part of the registry.
 */
#include "lib/preload/preload_i.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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
	kvp_preload_say("%s; using the default", msg);
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
		bad_value(err); /* "KVP_X: 'v' is not ...; accepted: ..." */
		return t->def;
	}
	if (i == OWN_BLOCK && (v & (v - 1))) {
		snprintf(msg, sizeof(msg),
			 "%s=%s: not a power of two; accepted: 4K 8K .. 2M",
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

void kvp_preload_env_load(void)
{
	struct kvp_tunable_target tg = { .pager = &kvp_env.cfg };
	char err[KVP_TUNABLE_ERR_MAX];

	if (kvp_env.loaded)
		return;
	kvp_env.strict = read_own(OWN_STRICT);
	kvp_env.stats = read_own(OWN_STATS);
	kvp_env.min_bytes = read_own(OWN_MIN);
	kvp_env.block_bytes = read_own(OWN_BLOCK);
	kvp_env.backing_dir = read_path("KVP_BACKING_DIR");
	kvp_env.fuse_mount = read_path("KVP_FUSE_MOUNT");
	kvp_config_defaults(&kvp_env.cfg);
	/* All or nothing: on a bad variable every engine tunable keeps its
	 * default. */
	if (kvp_tunables_load_env(&tg, err, sizeof(err)))
		bad_value(err);
	__atomic_store_n(&kvp_env.loaded, true, __ATOMIC_RELEASE);
}
