/*
 * tunables.h - the one registry of kvpager's tunables.
 *
 * The registry is generated from KVP_PAGER_TUNABLES (pager/config.h) and
 * KVP_KV_TUNABLES (lib/kv/kv_tunables.h) and from nothing else: each entry has
 * a name (units in the name), a type, a range or choices, a default, a
 * runtime flag and a one-line doc.  The KVP_<NAME> environment variables,
 * the FUSE view's tunables/ files and `kvpctl list` all come from it.
 *
 * Values are uint64_t everywhere (a choice is the index of its name in the
 * choices string, a bool is 0 or 1).  Text forms:
 *   bytes   decimal with an optional suffix K M G T P (powers of 1024, case
 *           insensitive): 4096, 512M, 4g
 *   uint    decimal
 *   bool    0 1 true false on off yes no (case insensitive); shown 0 or 1
 *   choice  one of the names; shown as `auto [move] copy`
 * Leading and trailing white space (the newline of `echo`) is ignored.
 *
 * Every call that fails returns -EINVAL (or -ENOMEM where said), writes a
 * message to @err (if not NULL; lowercase, what failed first, then what is
 * accepted) and changes nothing.  No call takes a lock; the registry itself
 * is constant, the configs belong to the caller.
 */
#ifndef KVP_TUNABLES_H
#define KVP_TUNABLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/kv/kv_tunables.h"
#include "pager/config.h"

/* Which config struct a tunable lives in. */
enum kvp_tunable_owner { KVP_TUNABLE_PAGER, KVP_TUNABLE_KV };

struct kvp_tunable {
	const char *name;	    /* ram_budget_bytes */
	enum kvp_tunable_type type; /* KVP_T_* */
	uint64_t min, max;	    /* inclusive; for a choice 0..n-1 */
	uint64_t def;		    /* default */
	bool runtime;		    /* may change on a live pager */
	const char *choices;	    /* space separated names, or NULL */
	const char *doc;	    /* one line */
	enum kvp_tunable_owner owner;
	size_t offset; /* of its field in the owner's struct */
};

/* The pair of config structs a value is read from or written to.  Either
 * pointer may be NULL when the caller has no such config; a tunable of a
 * missing owner is then refused with -EINVAL ("no kv config"). */
struct kvp_tunable_target {
	struct kvp_config *pager;
	struct kvp_kv_config *kv;
};

/* Longest formatted value (a choice list, a 20-digit number) plus NUL. */
#define KVP_TUNABLE_VALUE_MAX 256
/* Longest error message written by these calls. */
#define KVP_TUNABLE_ERR_MAX 512

/* kvp_seterr - the message @fmt into @err of @len bytes, truncated; does
 * nothing when @err is NULL or @len 0.  The one way kvpager's calls fill
 * an (err, errlen) pair. */
void kvp_seterr(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Number of tunables, and the i-th in declaration order (pager first). */
size_t kvp_tunables_count(void);
const struct kvp_tunable *kvp_tunable_at(size_t i);
/* By exact name; NULL if there is none. */
const struct kvp_tunable *kvp_tunable_find(const char *name);

/* "bytes", "percent", "layers", ... : the unit carried by the name's last
 * word, or "" when the name carries none. */
const char *kvp_tunable_unit(const struct kvp_tunable *t);

/*
 * kvp_tunable_parse - @text to a value of @t, range checked.  Returns 0 and
 * *out, or -EINVAL with a message such as
 * "io_depth: 'abc' is not an unsigned integer; accepted: 1..4096".
 */
int kvp_tunable_parse(const struct kvp_tunable *t, const char *text,
		      uint64_t *out, char *err, size_t errlen);

/*
 * kvp_option_parse - @text as the value of a command-line option named
 * @name ("--reads") of @type (KVP_T_BYTES or KVP_T_UINT) within [@min,
 * @max], by kvp_tunable_parse: the tools take and refuse the same texts
 * as a tunable, whole values only (no sign, fraction, nan or inf).
 * Returns 0 and *out, or -EINVAL with a message such as "--reads: '-1' is
 * not an unsigned decimal integer; accepted: 1..4294967295".
 */
int kvp_option_parse(const char *name, enum kvp_tunable_type type, uint64_t min,
		     uint64_t max, const char *text, uint64_t *out, char *err,
		     size_t errlen);

/*
 * kvp_tunable_format - @v as shown in a tunables/ file, without a newline:
 * a decimal number, 0 or 1, or the choices with the current one bracketed.
 * Returns the length written (as snprintf), truncating to @len.
 */
int kvp_tunable_format(const struct kvp_tunable *t, uint64_t v, char *buf,
		       size_t len);

/* kvp_tunable_format_range - what @t accepts: "1..4096", "2M..1P",
 * "at least 4K" (max UINT64_MAX), "0/1", "auto move copy".  Returns the
 * length, as snprintf. */
int kvp_tunable_format_range(const struct kvp_tunable *t, char *buf,
			     size_t len);

/* kvp_parse_bytes - a size as every kvpager interface takes it: a decimal
 * number with an optional K, M, G, T or P suffix (powers of 1024, either
 * case): "512M", "4g", "2048".  0 and *out, -EINVAL (not a size) or -ERANGE
 * (over 2^64 - 1). */
int kvp_parse_bytes(const char *s, uint64_t *out);

/* kvp_format_bytes - @v with the largest suffix that divides it exactly
 * (2097152 -> "2M", 1000 -> "1000"). */
int kvp_format_bytes(uint64_t v, char *buf, size_t len);

/* Read @t's value from @tg.  0, or -EINVAL if @tg lacks its owner. */
int kvp_tunable_get(const struct kvp_tunable_target *tg,
		    const struct kvp_tunable *t, uint64_t *out);

/*
 * kvp_tunable_set - store @v into @tg after checking it against @t's range
 * and, for an engine tunable, against the whole engine config
 * (kvp_config_check: the watermarks must stay ordered).  On failure @tg is
 * unchanged.
 */
int kvp_tunable_set(const struct kvp_tunable_target *tg,
		    const struct kvp_tunable *t, uint64_t v, char *err,
		    size_t errlen);

/* Every tunable of the configs present in @tg to its default. */
void kvp_tunables_defaults(const struct kvp_tunable_target *tg);

/* kvp_kv_config_defaults - @kv to the KV tunables' defaults. */
void kvp_kv_config_defaults(struct kvp_kv_config *kv);

/*
 * kvp_tunables_check - every value of @tg in range and the engine config
 * consistent.  0, or -EINVAL naming the first offending tunable.
 */
int kvp_tunables_check(const struct kvp_tunable_target *tg, char *err,
		       size_t errlen);

/* kvp_tunable_env_name - "KVP_IO_DEPTH" for io_depth, into @buf. */
int kvp_tunable_env_name(const struct kvp_tunable *t, char *buf, size_t len);

/*
 * kvp_tunables_load_env - read every KVP_<NAME> variable that is set into
 * @tg, all or nothing: the values are parsed and checked together and @tg
 * changes only when all are valid.  Variables of a config @tg lacks are
 * ignored.  On error the message names the variable, the bad value and
 * what is accepted, e.g. "KVP_IO_DEPTH=0: out of range; accepted: 1..4096
 * (fix or unset the variable)".  Returns 0 or -EINVAL.
 */
int kvp_tunables_load_env(const struct kvp_tunable_target *tg, char *err,
			  size_t errlen);

/*
 * kvp_env_unknown_next - the environment's next KVP_ variable, from
 * environ[*pos], that nothing of kvpager reads (not a tunable's, nor the
 * library's, the preload shim's or the tests'): 1 with *pos past it and
 * @msg "KVP_X is not a variable kvpager reads: ignored (did you mean
 * KVP_Y?)", KVP_Y the nearest name that is read; 0 when none is left.
 * Start with *pos = 0.
 */
int kvp_env_unknown_next(size_t *pos, char *msg, size_t len);

/* Flags of kvp_tunables_apply_lines. */
#define KVP_TUNABLES_RUNTIME_ONLY                                              \
	(1u << 0) /* refuse to change a tunable that
					       is not runtime (a live pager) */

/*
 * kvp_tunables_apply_lines - apply @text, lines of `name = value` (blank
 * lines and lines starting with # or ; are ignored; a later line for the
 * same name wins), to @tg, all or nothing.  With KVP_TUNABLES_RUNTIME_ONLY
 * a line that would change a non-runtime tunable is an error (the same
 * value is accepted).  Errors name the line: "line 3: 'foo' is not a
 * tunable (kvpctl list shows them)".  If @changed is not NULL, it gets the
 * number of tunables whose value changed.  Returns 0 or -EINVAL.
 */
int kvp_tunables_apply_lines(const struct kvp_tunable_target *tg,
			     const char *text, unsigned flags, size_t *changed,
			     char *err, size_t errlen);

#endif /* KVP_TUNABLES_H */
