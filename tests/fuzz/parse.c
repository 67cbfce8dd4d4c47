/*
 * parse.c - fuzz the size and value parsers of lib/tunables/.
 *
 * Input: one byte choosing the parser (kvp_parse_bytes, or
 * kvp_tunable_parse of the n-th tunable), one byte of output buffer length
 * for the formatters, then the text.  Checked:
 *   - kvp_parse_bytes agrees with a reference written here from its
 *     contract (decimal, one optional K M G T P of either case, -ERANGE past
 *     2^64 - 1), and kvp_format_bytes of its value parses back to it;
 *   - kvp_tunable_parse accepts only values in the tunable's range, leaves
 *     *out alone and names the tunable in its message on failure, gives the
 *     same answer with white space around the text, and the value's
 *     formatted text parses back to the value;
 *   - the formatters never write past the length given and return the
 *     length they would have written (snprintf's contract).
 */
#include <ctype.h>
#include <errno.h>
#include <string.h>

#include "lib/tunables/tunables.h"
#include "tests/fuzz/fuzz.h"

/* kvp_parse_bytes as its header says it behaves. */
static int ref_parse_bytes(const char *s, uint64_t *out)
{
	static const char suffix[] = "KMGTP";
	unsigned __int128 v = 0;
	const char *p;
	bool over = false;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	for (; isdigit((unsigned char)*s); s++) {
		v = v * 10 + (unsigned)(*s - '0');
		if (v > UINT64_MAX) {
			over = true;
			v = UINT64_MAX; /* keep it bounded; the answer is fixed */
		}
	}
	if (*s) {
		p = strchr(suffix, toupper((unsigned char)*s));
		if (!p || !*p || s[1])
			return -EINVAL;
		v <<= 10 * (p - suffix + 1);
	}
	if (over || v > UINT64_MAX)
		return -ERANGE;
	*out = (uint64_t)v;
	return 0;
}

/*
 * A formatter's output into a buffer of @len bytes guarded by canaries:
 * nothing past @len is touched, the text is NUL-terminated and a prefix of
 * the untruncated one.
 */
#define GUARD 0xa5
static void check_truncation(const char *full, int full_len, const char *what,
			     int (*fmt)(const void *, char *, size_t),
			     const void *arg, size_t len)
{
	char buf[KVP_TUNABLE_VALUE_MAX + 16];
	int r;

	if (len > KVP_TUNABLE_VALUE_MAX)
		len = KVP_TUNABLE_VALUE_MAX;
	memset(buf, GUARD, sizeof(buf));
	r = fmt(arg, buf, len);
	FUZZ_CHECK(r == full_len, "%s: returned %d, untruncated %d", what, r,
		   full_len);
	for (size_t i = len; i < sizeof(buf); i++)
		FUZZ_CHECK((uint8_t)buf[i] == GUARD,
			   "%s: wrote byte %zu of a %zu-byte buffer", what, i,
			   len);
	if (len) {
		FUZZ_CHECK(memchr(buf, 0, len), "%s: not terminated", what);
		FUZZ_CHECK(!strncmp(buf, full, strlen(buf)),
			   "%s: '%s' is not a prefix of '%s'", what, buf, full);
	}
}

struct fmt_arg {
	const struct kvp_tunable *t;
	uint64_t v;
};

static int fmt_bytes(const void *arg, char *buf, size_t len)
{
	return kvp_format_bytes(((const struct fmt_arg *)arg)->v, buf, len);
}

static int fmt_value(const void *arg, char *buf, size_t len)
{
	const struct fmt_arg *a = arg;

	return kvp_tunable_format(a->t, a->v, buf, len);
}

static int fmt_range(const void *arg, char *buf, size_t len)
{
	return kvp_tunable_format_range(((const struct fmt_arg *)arg)->t, buf,
					len);
}

static void check_bytes(const char *text, size_t outlen)
{
	uint64_t got = 0, want = 0, back = 0;
	int r = kvp_parse_bytes(text, &got);
	int w = ref_parse_bytes(text, &want);
	char buf[64];
	struct fmt_arg a;
	int n;

	FUZZ_CHECK(r == w, "'%s': kvp_parse_bytes %d, contract %d", text, r,
		   w);
	if (r)
		return;
	FUZZ_CHECK(got == want, "'%s': %llu, contract %llu", text,
		   (unsigned long long)got, (unsigned long long)want);
	n = kvp_format_bytes(got, buf, sizeof(buf));
	FUZZ_CHECK(n > 0 && (size_t)n < sizeof(buf), "format %d", n);
	FUZZ_CHECK(kvp_parse_bytes(buf, &back) == 0 && back == got,
		   "%llu formats as '%s', which parses as %llu",
		   (unsigned long long)got, buf, (unsigned long long)back);
	a.v = got;
	check_truncation(buf, n, "kvp_format_bytes", fmt_bytes, &a, outlen);
}

/* The current choice of a formatted choice list: the bracketed name. */
static bool bracketed(const char *list, char *name, size_t len)
{
	const char *open = strchr(list, '['), *close;

	if (!open || !(close = strchr(open, ']')) ||
	    (size_t)(close - open - 1) >= len)
		return false;
	memcpy(name, open + 1, (size_t)(close - open - 1));
	name[close - open - 1] = '\0';
	return true;
}

static void check_tunable(const struct kvp_tunable *t, const char *text,
			  size_t outlen)
{
	const uint64_t sentinel = 0x5eed5eed5eed5eedULL;
	char err[KVP_TUNABLE_ERR_MAX], shown[KVP_TUNABLE_VALUE_MAX];
	char again[KVP_TUNABLE_VALUE_MAX + 8], name[KVP_TUNABLE_VALUE_MAX];
	uint64_t v = sentinel, v2 = sentinel;
	struct fmt_arg a = { t, 0 };
	int r, r2, n;

	err[0] = '\0';
	r = kvp_tunable_parse(t, text, &v, err, sizeof(err));
	FUZZ_CHECK(r == 0 || r == -EINVAL, "%s: returned %d", t->name, r);
	if (r) {
		FUZZ_CHECK(v == sentinel, "%s: *out changed on failure",
			   t->name);
		FUZZ_CHECK(!strncmp(err, t->name, strlen(t->name)) &&
			       err[strlen(t->name)] == ':',
			   "%s: message does not name it: '%s'", t->name, err);
		FUZZ_CHECK(strstr(err, "accepted: "),
			   "%s: message says not what is accepted: '%s'",
			   t->name, err);
	} else {
		FUZZ_CHECK(v >= t->min && v <= t->max,
			   "%s: '%s' accepted as %llu, outside %llu..%llu",
			   t->name, text, (unsigned long long)v,
			   (unsigned long long)t->min,
			   (unsigned long long)t->max);
	}

	/* White space around the text changes nothing (echo's newline). */
	if (strlen(text) + 4 < sizeof(again)) {
		snprintf(again, sizeof(again), " \t%s\n", text);
		r2 = kvp_tunable_parse(t, again, &v2, NULL, 0);
		FUZZ_CHECK(r2 == r && (r || v2 == v),
			   "%s: '%s' gave %d/%llu, with white space %d/%llu",
			   t->name, text, r, (unsigned long long)v, r2,
			   (unsigned long long)v2);
	}

	a.v = r ? t->def : v;
	n = kvp_tunable_format(t, a.v, shown, sizeof(shown));
	FUZZ_CHECK(n > 0 && (size_t)n < sizeof(shown), "%s: format %d",
		   t->name, n);
	check_truncation(shown, n, "kvp_tunable_format", fmt_value, &a,
			 outlen);
	/* What the view shows is what a write of it sets. */
	if (t->type != KVP_T_CHOICE)
		snprintf(name, sizeof(name), "%s", shown);
	else
		FUZZ_CHECK(bracketed(shown, name, sizeof(name)),
			   "%s: no current choice in '%s'", t->name, shown);
	v2 = sentinel;
	FUZZ_CHECK(kvp_tunable_parse(t, name, &v2, err, sizeof(err)) == 0 &&
		       v2 == a.v,
		   "%s: %llu is shown as '%s', which parses as %llu (%s)",
		   t->name, (unsigned long long)a.v, shown,
		   (unsigned long long)v2, err);

	n = kvp_tunable_format_range(t, shown, sizeof(shown));
	FUZZ_CHECK(n > 0 && (size_t)n < sizeof(shown), "%s: range %d",
		   t->name, n);
	check_truncation(shown, n, "kvp_tunable_format_range", fmt_range, &a,
			 outlen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_input in = { data, size };
	size_t which = fuzz_u8(&in) % (kvp_tunables_count() + 1);
	size_t outlen = fuzz_u8(&in);
	char *text = fuzz_rest_str(&in);

	if (which == kvp_tunables_count())
		check_bytes(text, outlen);
	else
		check_tunable(kvp_tunable_at(which), text, outlen);
	free(text);
	return 0;
}
