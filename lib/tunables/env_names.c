/*
 * env_names.c - the KVP_ variables kvpager reads, and a KVP_ name in the
 * environment that none of them is: a misspelt tunable would otherwise
 * be ignored without a word (KVP_RAM_BUDGET_BYTE=512M leaves the budget
 * as it was).  Used by the tools that read the tunables from the
 * environment and by the preload shim.
 *
 * No allocation: the shim calls this from its constructor.
 */
#include "lib/tunables/tunables.h"

#include <stdio.h>
#include <string.h>

/*
 * The KVP_ variables read that are not tunables.  A variable read
 * anywhere must be here, or every tool that checks names it as unknown.
 */
static const char *const other_vars[] = {
	/* the library: lib/instance, lib/device, lib/model, lib/remote */
	"KVP_FUSE_MOUNT",
	"KVP_RUNTIME_DIR",
	"KVP_METRICS_LISTEN",
	"KVP_CUDA_LIB",
	"KVP_CACHE_DIR",
	"KVP_CACHE_SALT",
	"KVP_CACHE_MODEL_ID",
	"KVP_CACHE_KEY_FILE",
	"KVP_CACHE_KEY",
	"KVP_CACHE_CAPACITY",
	"KVP_CACHE_WRITE_BEHIND",
	"KVP_REMOTE_URL",
	/* the preload shim: lib/preload/env.c */
	"KVP_BACKING_DIR",
	"KVP_PRELOAD_STRICT",
	"KVP_PRELOAD_STATS",
	"KVP_PRELOAD_MIN_BYTES",
	"KVP_PRELOAD_BLOCK_BYTES",
	/* the tests: tests/, tests/gpu/ (they run the tools) */
	"KVP_TEST_DEVICE",
	"KVP_TEST_ONLY",
	"KVP_TEST_TIMEOUT",
	"KVP_MODEL_FILE",
	"KVP_GPU_PREBUILT",
	"KVP_T_PRELOAD_BUDGET_MB",
	"KVP_T_PRELOAD_SLACK_MB",
};
#define NOTHER (sizeof(other_vars) / sizeof(other_vars[0]))

/* Levenshtein distance of @a and @b, counted up to 63 characters each. */
static unsigned edit_distance(const char *a, const char *b)
{
	unsigned row[64], i, j, diag, up;
	size_t na = strnlen(a, 63), nb = strnlen(b, 63);

	for (j = 0; j <= nb; j++)
		row[j] = j;
	for (i = 1; i <= na; i++) {
		diag = row[0];
		row[0] = i;
		for (j = 1; j <= nb; j++) {
			up = row[j];
			row[j] = a[i - 1] == b[j - 1] ? diag : diag + 1;
			if (up + 1 < row[j])
				row[j] = up + 1;
			if (row[j - 1] + 1 < row[j])
				row[j] = row[j - 1] + 1;
			diag = up;
		}
	}
	return row[nb];
}

/* The @i-th name kvpager reads (into @buf), or NULL past the last. */
static const char *known_var(size_t i, char *buf, size_t len)
{
	size_t nt = kvp_tunables_count();

	if (i < nt) {
		kvp_tunable_env_name(kvp_tunable_at(i), buf, len);
		return buf;
	}
	return i - nt < NOTHER ? other_vars[i - nt] : NULL;
}

int kvp_env_unknown_next(size_t *pos, char *msg, size_t len)
{
	extern char **environ;
	char name[96], buf[96], nearest[96];
	const char *k;
	size_t i;

	for (; environ && environ[*pos]; ++*pos) {
		const char *e = environ[*pos];
		size_t n = strcspn(e, "=");
		unsigned best = ~0u, d;

		if (strncmp(e, "KVP_", 4) || n >= sizeof(name))
			continue;
		memcpy(name, e, n);
		name[n] = '\0';
		for (i = 0; (k = known_var(i, buf, sizeof(buf))); i++) {
			d = edit_distance(name, k);
			if (d < best) {
				best = d;
				snprintf(nearest, sizeof(nearest), "%s", k);
			}
		}
		if (!best)
			continue;
		snprintf(msg, len,
			 "%s is not a variable kvpager reads: ignored (did "
			 "you mean %s?)",
			 name, nearest);
		++*pos;
		return 1;
	}
	return 0;
}
