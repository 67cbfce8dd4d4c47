/*
 * tunables.c - the registry generated from KVP_PAGER_TUNABLES and
 * KVP_KV_TUNABLES: parsing, formatting, environment and `name = value`
 * lines, each all or nothing.
 *
 * Every setter works on copies of the two config structs and writes the
 * caller's structs only after the whole change checked out, so that a
 * failure leaves nothing behind.
 */
#include "lib/tunables/tunables.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/*
 * One enumerator per tunable, over both lists: a name declared twice (in
 * one list or across the two) is a compile error here, so the merged
 * registry cannot hold duplicates.
 */
enum kvp_tunable_id {
#define X(name, type, min, max, def, runtime, choices, doc) KVP_TUNABLE_##name,
	KVP_PAGER_TUNABLES(X) KVP_KV_TUNABLES(X)
#undef X
	    KVP_TUNABLE_COUNT
};

/* One registry entry of tunable @n, a field of @cfg owned by @own. */
#define ENTRY(n, ty, mn, mx, df, rt, ch, dc, own, cfg)                         \
	[KVP_TUNABLE_##n] = { .name = #n,                                      \
			      .type = ty,                                      \
			      .min = (uint64_t)(mn),                           \
			      .max = (uint64_t)(mx),                           \
			      .def = (uint64_t)(df),                           \
			      .runtime = rt,                                   \
			      .choices = ch,                                   \
			      .doc = dc,                                       \
			      .owner = own,                                    \
			      .offset = offsetof(cfg, n) },
#define PAGER_ENTRY(n, ty, mn, mx, df, rt, ch, dc)                             \
	ENTRY(n, ty, mn, mx, df, rt, ch, dc, KVP_TUNABLE_PAGER,                \
	      struct kvp_config)
#define KV_ENTRY(n, ty, mn, mx, df, rt, ch, dc)                                \
	ENTRY(n, ty, mn, mx, df, rt, ch, dc, KVP_TUNABLE_KV,                   \
	      struct kvp_kv_config)

static const struct kvp_tunable registry[KVP_TUNABLE_COUNT] = {
	KVP_PAGER_TUNABLES(PAGER_ENTRY) KVP_KV_TUNABLES(KV_ENTRY)
};

#undef KV_ENTRY
#undef PAGER_ENTRY
#undef ENTRY

void kvp_seterr(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!err || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
}

size_t kvp_tunables_count(void)
{
	return KVP_TUNABLE_COUNT;
}

const struct kvp_tunable *kvp_tunable_at(size_t i)
{
	return i < KVP_TUNABLE_COUNT ? &registry[i] : NULL;
}

const struct kvp_tunable *kvp_tunable_find(const char *name)
{
	size_t i;

	if (!name)
		return NULL;
	for (i = 0; i < KVP_TUNABLE_COUNT; i++)
		if (!strcmp(registry[i].name, name))
			return &registry[i];
	return NULL;
}

const char *kvp_tunable_unit(const struct kvp_tunable *t)
{
	static const char *const units[] = { "bytes",  "percent", "layers",
					     "tokens", "threads", "seconds",
					     "us",     "ms" };
	const char *last = strrchr(t->name, '_');
	size_t i;

	if (!last)
		return "";
	for (i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (!strcmp(last + 1, units[i]))
			return units[i];
	return "";
}

/* The @i-th name of a space-separated list, as [*start, *start + *len). */
static bool choice_at(const char *choices, uint64_t i, const char **start,
		      size_t *len)
{
	const char *s = choices;
	uint64_t k = 0;

	while (s && *s) {
		size_t n;

		while (*s == ' ')
			s++;
		n = strcspn(s, " ");
		if (!n)
			break;
		if (k++ == i) {
			*start = s;
			*len = n;
			return true;
		}
		s += n;
	}
	return false;
}

int kvp_format_bytes(uint64_t v, char *buf, size_t len)
{
	static const char suffix[] = "KMGTP";
	int i;

	if (v)
		for (i = 4; i >= 0; i--) {
			uint64_t unit = 1ULL << (10 * (i + 1));

			if (v % unit == 0)
				return snprintf(buf, len, "%llu%c",
						(unsigned long long)(v / unit),
						suffix[i]);
		}
	return snprintf(buf, len, "%llu", (unsigned long long)v);
}

int kvp_tunable_format_range(const struct kvp_tunable *t, char *buf, size_t len)
{
	char lo[32], hi[32];

	switch (t->type) {
	case KVP_T_BYTES:
		kvp_format_bytes(t->min, lo, sizeof(lo));
		kvp_format_bytes(t->max, hi, sizeof(hi));
		/* no bound above but 64 bits: 2^64 - 1 says nothing */
		if (t->max == UINT64_MAX)
			return snprintf(buf, len, "at least %s", lo);
		return snprintf(buf, len, "%s..%s", lo, hi);
	case KVP_T_BOOL:
		return snprintf(buf, len, "0/1");
	case KVP_T_CHOICE:
		return snprintf(buf, len, "%s", t->choices ? t->choices : "");
	case KVP_T_UINT:
	default:
		if (t->max == UINT64_MAX)
			return snprintf(buf, len, "at least %llu",
					(unsigned long long)t->min);
		return snprintf(buf, len, "%llu..%llu",
				(unsigned long long)t->min,
				(unsigned long long)t->max);
	}
}

int kvp_tunable_format(const struct kvp_tunable *t, uint64_t v, char *buf,
		       size_t len)
{
	const char *name;
	size_t n, used = 0;
	uint64_t i;
	int w;

	if (t->type == KVP_T_BOOL)
		return snprintf(buf, len, "%d", v ? 1 : 0);
	if (t->type != KVP_T_CHOICE)
		return snprintf(buf, len, "%llu", (unsigned long long)v);
	if (len)
		buf[0] = '\0';
	for (i = 0; choice_at(t->choices, i, &name, &n); i++) {
		w = snprintf(buf + (used < len ? used : len),
			     used < len ? len - used : 0, "%s%s%.*s%s",
			     i ? " " : "", i == v ? "[" : "", (int)n, name,
			     i == v ? "]" : "");
		used += (size_t)w;
	}
	return (int)used;
}

/* @s with leading and trailing white space dropped, into @buf. */
static bool trim_copy(const char *s, char *buf, size_t len)
{
	size_t n;

	while (isspace((unsigned char)*s))
		s++;
	n = strlen(s);
	while (n && isspace((unsigned char)s[n - 1]))
		n--;
	if (n >= len)
		return false;
	memcpy(buf, s, n);
	buf[n] = '\0';
	return true;
}

/*
 * Decimal digits only: no sign, no hex, no octal surprise.  *end is set past
 * the digits even when they overflow (-ERANGE), so that the caller can tell
 * a number too large from text that is no number at all.
 */
static int parse_decimal(const char *s, uint64_t *out, const char **end)
{
	uint64_t v = 0;
	bool over = false;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	for (; isdigit((unsigned char)*s); s++) {
		unsigned d = (unsigned)(*s - '0');

		over = over || v > (UINT64_MAX - d) / 10;
		v = v * 10 + d;
	}
	*end = s;
	if (over)
		return -ERANGE;
	*out = v;
	return 0;
}

int kvp_parse_bytes(const char *s, uint64_t *out)
{
	static const char suffix[] = "KMGTP";
	const char *end, *p;
	uint64_t v = 0;
	int shift = 0, r = parse_decimal(s, &v, &end);

	if (r == -EINVAL)
		return r;
	if (*end) {
		p = strchr(suffix, toupper((unsigned char)*end));
		if (!p || end[1])
			return -EINVAL;
		shift = 10 * (int)(p - suffix + 1);
	}
	if (r || v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = v << shift;
	return 0;
}

int kvp_tunable_parse(const struct kvp_tunable *t, const char *text,
		      uint64_t *out, char *err, size_t errlen)
{
	char s[KVP_TUNABLE_VALUE_MAX], range[KVP_TUNABLE_VALUE_MAX];
	const char *end, *what = NULL;
	uint64_t v = 0;
	int r;

	kvp_tunable_format_range(t, range, sizeof(range));
	if (!text || !trim_copy(text, s, sizeof(s))) {
		kvp_seterr(err, errlen, "%s: value too long; accepted: %s",
			   t->name, range);
		return -EINVAL;
	}
	if (!s[0]) {
		kvp_seterr(err, errlen, "%s: empty value; accepted: %s",
			   t->name, range);
		return -EINVAL;
	}
	switch (t->type) {
	case KVP_T_BYTES:
		r = kvp_parse_bytes(s, &v);
		if (r == -ERANGE)
			what = "is out of range";
		else if (r)
			what = "is not a size (a number with an optional K M "
			       "G T P suffix)";
		break;
	case KVP_T_UINT:
		r = parse_decimal(s, &v, &end);
		if (r == -EINVAL || *end)
			what = "is not an unsigned decimal integer";
		else if (r)
			what = "is out of range";
		break;
	case KVP_T_BOOL:
		if (!strcasecmp(s, "1") || !strcasecmp(s, "true") ||
		    !strcasecmp(s, "on") || !strcasecmp(s, "yes"))
			v = 1;
		else if (!strcasecmp(s, "0") || !strcasecmp(s, "false") ||
			 !strcasecmp(s, "off") || !strcasecmp(s, "no"))
			v = 0;
		else
			what = "is not a boolean (0 1 true false on off)";
		break;
	case KVP_T_CHOICE: {
		const char *name;
		size_t n;
		uint64_t i;

		what = "is not one of the choices";
		for (i = 0; choice_at(t->choices, i, &name, &n); i++)
			if (n == strlen(s) && !strncasecmp(name, s, n)) {
				v = i;
				what = NULL;
				break;
			}
		break;
	}
	default:
		what = "has a type this registry does not know";
	}
	if (!what && (v < t->min || v > t->max))
		what = "is out of range";
	if (what) {
		kvp_seterr(err, errlen, "%s: '%s' %s; accepted: %s", t->name, s,
			   what, range);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

int kvp_option_parse(const char *name, enum kvp_tunable_type type, uint64_t min,
		     uint64_t max, const char *text, uint64_t *out, char *err,
		     size_t errlen)
{
	const struct kvp_tunable t = {
		.name = name, .type = type, .min = min, .max = max
	};

	return kvp_tunable_parse(&t, text, out, err, errlen);
}

static uint64_t *field(const struct kvp_tunable_target *tg,
		       const struct kvp_tunable *t)
{
	char *base =
	    t->owner == KVP_TUNABLE_PAGER ? (char *)tg->pager : (char *)tg->kv;

	return base ? (uint64_t *)(base + t->offset) : NULL;
}

int kvp_tunable_get(const struct kvp_tunable_target *tg,
		    const struct kvp_tunable *t, uint64_t *out)
{
	uint64_t *f = field(tg, t);

	if (!f)
		return -EINVAL;
	*out = *f;
	return 0;
}

/* Range and consistency of the staged configs (pager may be NULL). */
static int check_all(const struct kvp_config *pager,
		     const struct kvp_kv_config *kv, char *err, size_t errlen)
{
	const struct kvp_tunable_target tg = {
		.pager = (struct kvp_config *)pager,
		.kv = (struct kvp_kv_config *)kv,
	};
	char range[KVP_TUNABLE_VALUE_MAX];
	const char *bad = NULL;
	size_t i;

	for (i = 0; i < KVP_TUNABLE_COUNT; i++) {
		const struct kvp_tunable *t = &registry[i];
		uint64_t *f = field(&tg, t);

		if (f && (*f < t->min || *f > t->max)) {
			kvp_tunable_format_range(t, range, sizeof(range));
			kvp_seterr(err, errlen,
				   "%s: %llu is out of range; accepted: %s",
				   t->name, (unsigned long long)*f, range);
			return -EINVAL;
		}
	}
	if (pager && kvp_config_check(pager, &bad)) {
		if (bad && strstr(bad, "watermark"))
			kvp_seterr(
			    err, errlen,
			    "%s: evict_low_watermark_percent (%llu) must "
			    "stay below evict_high_watermark_percent (%llu)",
			    bad,
			    (unsigned long long)
				pager->evict_low_watermark_percent,
			    (unsigned long long)
				pager->evict_high_watermark_percent);
		else
			kvp_seterr(
			    err, errlen,
			    "%s: inconsistent with the rest of the engine "
			    "config",
			    bad ? bad : "config");
		return -EINVAL;
	}
	return 0;
}

int kvp_tunables_check(const struct kvp_tunable_target *tg, char *err,
		       size_t errlen)
{
	return check_all(tg->pager, tg->kv, err, errlen);
}

/* Staged copies of the configs of @tg: changes go here first. */
struct stage {
	struct kvp_config pager;
	struct kvp_kv_config kv;
	struct kvp_tunable_target tg;
};

static void stage_init(struct stage *st, const struct kvp_tunable_target *tg)
{
	memset(st, 0, sizeof(*st));
	if (tg->pager)
		st->pager = *tg->pager;
	if (tg->kv)
		st->kv = *tg->kv;
	st->tg.pager = tg->pager ? &st->pager : NULL;
	st->tg.kv = tg->kv ? &st->kv : NULL;
}

static void stage_commit(struct stage *st, const struct kvp_tunable_target *tg)
{
	if (tg->pager)
		*tg->pager = st->pager;
	if (tg->kv)
		*tg->kv = st->kv;
}

static const char *owner_missing(const struct kvp_tunable *t)
{
	return t->owner == KVP_TUNABLE_PAGER ? "no engine config to set it in"
					     : "no kv config to set it in";
}

int kvp_tunable_set(const struct kvp_tunable_target *tg,
		    const struct kvp_tunable *t, uint64_t v, char *err,
		    size_t errlen)
{
	struct stage st;
	int r;

	stage_init(&st, tg);
	if (!field(&st.tg, t)) {
		kvp_seterr(err, errlen, "%s: %s", t->name, owner_missing(t));
		return -EINVAL;
	}
	*field(&st.tg, t) = v;
	r = check_all(st.tg.pager, st.tg.kv, err, errlen);
	if (r)
		return r;
	stage_commit(&st, tg);
	return 0;
}

void kvp_tunables_defaults(const struct kvp_tunable_target *tg)
{
	size_t i;

	for (i = 0; i < KVP_TUNABLE_COUNT; i++) {
		uint64_t *f = field(tg, &registry[i]);

		if (f)
			*f = registry[i].def;
	}
}

void kvp_kv_config_defaults(struct kvp_kv_config *kv)
{
	const struct kvp_tunable_target tg = { .kv = kv };

	kvp_tunables_defaults(&tg);
}

int kvp_tunable_env_name(const struct kvp_tunable *t, char *buf, size_t len)
{
	size_t i, n = strlen(t->name);

	if (len < n + 5)
		return -EINVAL;
	memcpy(buf, "KVP_", 4);
	for (i = 0; i < n; i++)
		buf[4 + i] = (char)toupper((unsigned char)t->name[i]);
	buf[4 + n] = '\0';
	return 0;
}

int kvp_tunables_load_env(const struct kvp_tunable_target *tg, char *err,
			  size_t errlen)
{
	char env[96], msg[KVP_TUNABLE_ERR_MAX];
	const char *first = NULL;
	struct stage st;
	size_t i;
	int r;

	stage_init(&st, tg);
	for (i = 0; i < KVP_TUNABLE_COUNT; i++) {
		const struct kvp_tunable *t = &registry[i];
		const char *val;
		uint64_t v;

		if (!field(&st.tg, t))
			continue;
		kvp_tunable_env_name(t, env, sizeof(env));
		val = getenv(env);
		if (!val)
			continue;
		r = kvp_tunable_parse(t, val, &v, msg, sizeof(msg));
		if (r) {
			/* msg is "name: 'value' why; accepted: ..." */
			const char *why = strchr(msg, ':');

			kvp_seterr(err, errlen,
				   "%s=%s:%s (fix or unset the variable)", env,
				   val, why ? why + 1 : msg);
			return r;
		}
		*field(&st.tg, t) = v;
		if (!first)
			first = t->name;
	}
	r = check_all(st.tg.pager, st.tg.kv, msg, sizeof(msg));
	if (r) {
		kvp_seterr(
		    err, errlen,
		    "the KVP_* environment variables are inconsistent: %s "
		    "(fix or unset them)",
		    msg);
		return r;
	}
	stage_commit(&st, tg);
	return 0;
}

int kvp_tunables_apply_lines(const struct kvp_tunable_target *tg,
			     const char *text, unsigned flags, size_t *changed,
			     char *err, size_t errlen)
{
	char msg[KVP_TUNABLE_ERR_MAX];
	const char *line = text ? text : "";
	struct stage st;
	unsigned lineno = 0;
	size_t i, n = 0;
	int r;

	stage_init(&st, tg);
	while (*line) {
		const char *eol = strchr(line, '\n');
		size_t len = eol ? (size_t)(eol - line) : strlen(line);
		char buf[KVP_TUNABLE_VALUE_MAX * 2], name[128];
		const struct kvp_tunable *t;
		char *eq, *p;
		uint64_t v;

		lineno++;
		if (len >= sizeof(buf)) {
			kvp_seterr(err, errlen,
				   "line %u: too long (at most %zu "
				   "characters)",
				   lineno, sizeof(buf) - 1);
			return -EINVAL;
		}
		memcpy(buf, line, len);
		buf[len] = '\0';
		line = eol ? eol + 1 : line + len;

		p = buf;
		while (isspace((unsigned char)*p))
			p++;
		if (!*p || *p == '#' || *p == ';')
			continue;
		eq = strchr(p, '=');
		if (!eq) {
			kvp_seterr(
			    err, errlen,
			    "line %u: '%s' is not of the form name = value",
			    lineno, p);
			return -EINVAL;
		}
		*eq = '\0';
		if (!trim_copy(p, name, sizeof(name)) || !name[0]) {
			kvp_seterr(err, errlen,
				   "line %u: no tunable name before "
				   "'='",
				   lineno);
			return -EINVAL;
		}
		t = kvp_tunable_find(name);
		if (!t) {
			kvp_seterr(err, errlen,
				   "line %u: '%s' is not a tunable "
				   "(kvpctl list shows them)",
				   lineno, name);
			return -EINVAL;
		}
		if (!field(&st.tg, t)) {
			kvp_seterr(err, errlen, "line %u: %s: %s", lineno, name,
				   owner_missing(t));
			return -EINVAL;
		}
		r = kvp_tunable_parse(t, eq + 1, &v, msg, sizeof(msg));
		if (r) {
			kvp_seterr(err, errlen, "line %u: %s", lineno, msg);
			return r;
		}
		if ((flags & KVP_TUNABLES_RUNTIME_ONLY) && !t->runtime &&
		    v != *field(tg, t)) {
			char env[96];

			kvp_tunable_env_name(t, env, sizeof(env));
			kvp_seterr(err, errlen,
				   "line %u: %s cannot change on a "
				   "running pager (set %s before it starts)",
				   lineno, name, env);
			return -EINVAL;
		}
		*field(&st.tg, t) = v;
	}
	r = check_all(st.tg.pager, st.tg.kv, msg, sizeof(msg));
	if (r) {
		kvp_seterr(err, errlen, "%s", msg);
		return r;
	}
	for (i = 0; i < KVP_TUNABLE_COUNT; i++) {
		uint64_t *a = field(&st.tg, &registry[i]);
		uint64_t *b = field(tg, &registry[i]);

		if (a && *a != *b)
			n++;
	}
	stage_commit(&st, tg);
	if (changed)
		*changed = n;
	return 0;
}
