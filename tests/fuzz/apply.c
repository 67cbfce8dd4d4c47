/*
 * apply.c - fuzz `name = value` lines: kvp_tunables_apply_lines, the parser
 * behind the view's apply file and `kvpctl load`.
 *
 * Input: one byte of flags (bit 0: KVP_TUNABLES_RUNTIME_ONLY; bits 1-2:
 * which configs the target has: both, engine only, KV only), then the text.
 * Starting from the defaults, checked:
 *   - all or nothing: on failure the configs are byte for byte unchanged
 *     and the message (lowercase, what failed first) is there;
 *   - on success the configs pass kvp_tunables_check, *changed counts the
 *     tunables whose value changed, and with RUNTIME_ONLY no tunable that
 *     cannot change at run time did;
 *   - applying the same text again succeeds and changes nothing;
 *   - the result, written back out as lines (as `kvpctl get` would show
 *     it), applied to fresh defaults, gives the same configs.
 */
#include <ctype.h>
#include <errno.h>
#include <string.h>

#include "lib/tunables/tunables.h"
#include "tests/fuzz/fuzz.h"

struct configs {
	struct kvp_config pager;  /* engine tunables */
	struct kvp_kv_config kv;  /* KV tunables */
	struct kvp_tunable_target tg; /* points into the two above, or NULL */
};

static void configs_init(struct configs *c, unsigned owners)
{
	memset(c, 0, sizeof(*c));
	c->tg.pager = owners != 2 ? &c->pager : NULL;
	c->tg.kv = owners != 1 ? &c->kv : NULL;
	kvp_tunables_defaults(&c->tg);
}

static bool configs_equal(const struct configs *a, const struct configs *b)
{
	return !memcmp(&a->pager, &b->pager, sizeof(a->pager)) &&
	       !memcmp(&a->kv, &b->kv, sizeof(a->kv));
}

/* The value of tunable @i in @c, or false when @c lacks its config. */
static bool value_at(const struct configs *c, size_t i, uint64_t *v)
{
	return kvp_tunable_get(&c->tg, kvp_tunable_at(i), v) == 0;
}

/* @c as `name = value` lines, each tunable's shown form. */
static void write_lines(const struct configs *c, char *buf, size_t len)
{
	size_t i, used = 0;

	buf[0] = '\0';
	for (i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		char shown[KVP_TUNABLE_VALUE_MAX], *v = shown, *end;
		uint64_t val;

		if (!value_at(c, i, &val))
			continue;
		kvp_tunable_format(t, val, shown, sizeof(shown));
		if (t->type == KVP_T_CHOICE) { /* "auto [move] copy" */
			v = strchr(shown, '[');
			FUZZ_CHECK(v && (end = strchr(v, ']')),
				   "%s: no current choice in '%s'", t->name,
				   shown);
			*end = '\0';
			v++;
		}
		used += (size_t)snprintf(buf + used, len - used, "%s = %s\n",
					 t->name, v);
		FUZZ_CHECK(used < len, "lines overflow %zu bytes", len);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_input in = { data, size };
	uint8_t flags_byte = fuzz_u8(&in);
	unsigned flags = flags_byte & 1 ? KVP_TUNABLES_RUNTIME_ONLY : 0;
	unsigned owners = (flags_byte >> 1) % 3;
	char *text = fuzz_rest_str(&in);
	char err[KVP_TUNABLE_ERR_MAX], lines[8192];
	struct configs before, c, back;
	size_t i, changed = 12345, diff = 0;
	int r;

	configs_init(&before, owners);
	configs_init(&c, owners);
	err[0] = '\0';
	r = kvp_tunables_apply_lines(&c.tg, text, flags, &changed, err,
				     sizeof(err));
	if (r) {
		FUZZ_CHECK(r == -EINVAL, "returned %d", r);
		FUZZ_CHECK(configs_equal(&c, &before),
			   "failed (%s) yet changed the configs", err);
		FUZZ_CHECK(changed == 12345, "failed yet set *changed");
		FUZZ_CHECK(err[0] && !isupper((unsigned char)err[0]) &&
			       !isspace((unsigned char)err[0]),
			   "message '%s'", err);
		goto out;
	}
	FUZZ_CHECK(kvp_tunables_check(&c.tg, err, sizeof(err)) == 0,
		   "applied, yet the configs do not check: %s", err);
	for (i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		uint64_t old, now;

		if (!value_at(&c, i, &now))
			continue;
		value_at(&before, i, &old);
		diff += old != now;
		FUZZ_CHECK(!(flags & KVP_TUNABLES_RUNTIME_ONLY) || t->runtime ||
			       old == now,
			   "%s changed %llu -> %llu under RUNTIME_ONLY",
			   t->name, (unsigned long long)old,
			   (unsigned long long)now);
	}
	FUZZ_CHECK(changed == diff, "*changed %zu, %zu tunables differ",
		   changed, diff);

	/* Idempotent: the same text again changes nothing. */
	before = c;
	before.tg.pager = c.tg.pager ? &before.pager : NULL;
	before.tg.kv = c.tg.kv ? &before.kv : NULL;
	r = kvp_tunables_apply_lines(&c.tg, text, flags, &changed, err,
				     sizeof(err));
	FUZZ_CHECK(r == 0 && changed == 0 && configs_equal(&c, &before),
		   "second apply: %d, %zu changed (%s)", r, changed,
		   r ? err : "");

	/* What is shown, applied to the defaults, gives the same configs. */
	write_lines(&c, lines, sizeof(lines));
	configs_init(&back, owners);
	r = kvp_tunables_apply_lines(&back.tg, lines, 0, NULL, err,
				     sizeof(err));
	FUZZ_CHECK(r == 0 && configs_equal(&back, &c),
		   "shown values do not apply back: %d (%s)\n%s", r, err,
		   lines);
out:
	free(text);
	return 0;
}
