/*
 * test_tunables.c - lib/tunables/tunables.c: the merged registry, parsing and
 * formatting of every type, bounds, environment loading and `name = value`
 * lines, each all or nothing.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/tunables/tunables.h"
#include "tests/helpers/helpers.h"

static struct kvp_config pc;
static struct kvp_kv_config kc;
static struct kvp_tunable_target tg;
static char err[KVP_TUNABLE_ERR_MAX];

static void setup(void)
{
	kvp_config_defaults(&pc);
	kvp_kv_config_defaults(&kc);
	tg.pager = &pc;
	tg.kv = &kc;
	err[0] = '\0';
}

static const struct kvp_tunable *T(const char *name)
{
	const struct kvp_tunable *t = kvp_tunable_find(name);

	ck_assert_msg(t != NULL, "tunable %s missing", name);
	return t;
}

static uint64_t parse_ok(const char *name, const char *text)
{
	uint64_t v = 12345;

	ck_assert_msg(kvp_tunable_parse(T(name), text, &v, err, sizeof(err)) ==
			  0,
		      "%s '%s': %s", name, text, err);
	return v;
}

static void parse_bad(const char *name, const char *text, const char *want)
{
	uint64_t v = 777;

	err[0] = '\0';
	ck_assert_int_eq(kvp_tunable_parse(T(name), text, &v, err, sizeof(err)),
			 -EINVAL);
	ck_assert_uint_eq(v, 777); /* untouched */
	ck_assert_msg(strstr(err, name) != NULL, "no name in '%s'", err);
	ck_assert_msg(strstr(err, "accepted") != NULL, "no range in '%s'", err);
	if (want)
		ck_assert_msg(strstr(err, want) != NULL, "'%s' lacks '%s'", err,
			      want);
}

/* The registry holds both lists, each once, with sane entries. */
START_TEST(registry_merges_both_lists)
{
	size_t n = 0, i, j;

#define X(name, type, min, max, def, runtime, choices, doc)                    \
	ck_assert_ptr_nonnull(kvp_tunable_find(#name));                        \
	ck_assert_int_eq(kvp_tunable_find(#name)->owner, KVP_TUNABLE_PAGER);   \
	n++;
	KVP_PAGER_TUNABLES(X)
#undef X
#define X(name, type, min, max, def, runtime, choices, doc)                    \
	ck_assert_ptr_nonnull(kvp_tunable_find(#name));                        \
	ck_assert_int_eq(kvp_tunable_find(#name)->owner, KVP_TUNABLE_KV);      \
	n++;
	KVP_KV_TUNABLES(X)
#undef X
	ck_assert_uint_eq(kvp_tunables_count(), n);
	ck_assert_ptr_null(kvp_tunable_at(n));
	ck_assert_ptr_null(kvp_tunable_find("nope"));
	ck_assert_ptr_null(kvp_tunable_find(NULL));
	for (i = 0; i < n; i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);

		ck_assert(t->min <= t->def && t->def <= t->max);
		ck_assert(t->doc && t->doc[0]);
		ck_assert(t->type != KVP_T_CHOICE || t->choices);
		ck_assert(t->type != KVP_T_BOOL ||
			  (t->min == 0 && t->max == 1));
		for (j = 0; j < i; j++)
			ck_assert_str_ne(t->name, kvp_tunable_at(j)->name);
	}
	ck_assert_str_eq(kvp_tunable_unit(T("ram_budget_bytes")), "bytes");
	ck_assert_str_eq(kvp_tunable_unit(T("prefetch_depth_layers")),
			 "layers");
	ck_assert_str_eq(kvp_tunable_unit(T("io_depth")), "");
	ck_assert(T("ram_budget_bytes")->runtime);
	ck_assert(!T("io_depth")->runtime);
}
END_TEST

/* Defaults come from the declarations, the same as the engine's own. */
START_TEST(defaults_match_declarations)
{
	struct kvp_config a, b;
	struct kvp_kv_config k;
	struct kvp_tunable_target t2 = { .pager = &b, .kv = &k };

	kvp_config_defaults(&a);
	memset(&b, 0xa5, sizeof(b));
	memset(&k, 0xa5, sizeof(k));
	kvp_tunables_defaults(&t2);
	ck_assert_int_eq(memcmp(&a, &b, sizeof(a)), 0);
	ck_assert_uint_eq(b.ram_budget_bytes, 1ULL << 30);
	ck_assert_uint_eq(k.prefetch_depth_layers, 2);
	ck_assert_uint_eq(k.predictor, KVP_PREDICTOR_EXACT);
	ck_assert_int_eq(kvp_tunables_check(&t2, err, sizeof(err)), 0);
}
END_TEST

START_TEST(parse_bytes)
{
	ck_assert_uint_eq(parse_ok("ram_budget_bytes", "4194304"), 4u << 20);
	ck_assert_uint_eq(parse_ok("ram_budget_bytes", "512M"), 512u << 20);
	ck_assert_uint_eq(parse_ok("ram_budget_bytes", "512m"), 512u << 20);
	ck_assert_uint_eq(parse_ok("ram_budget_bytes", "4G"), 4ULL << 30);
	ck_assert_uint_eq(parse_ok("ram_budget_bytes", "4g\n"), 4ULL << 30);
	ck_assert_uint_eq(parse_ok("ram_budget_bytes", "  3t "), 3ULL << 40);
	ck_assert_uint_eq(parse_ok("ram_budget_bytes", "2048K"), 2u << 20);
	ck_assert_uint_eq(parse_ok("ram_budget_bytes", "1P"), 1ULL << 50);
	/* bounds are inclusive */
	ck_assert_uint_eq(parse_ok("ram_budget_bytes", "2M"), 2u << 20);
	parse_bad("ram_budget_bytes", "2047K", "out of range");
	parse_bad("ram_budget_bytes", "1025T", "out of range");
	parse_bad("ram_budget_bytes", "99999999999999999999", "out of range");
	parse_bad("ram_budget_bytes", "17000000000000000000", "out of range");
	parse_bad("ram_budget_bytes", "16777216T", "out of range");
	parse_bad("ram_budget_bytes", "4X", "not a size");
	parse_bad("ram_budget_bytes", "4MB", "not a size");
	parse_bad("ram_budget_bytes", "-4M", "not a size");
	parse_bad("ram_budget_bytes", "0x100000", "not a size");
	parse_bad("ram_budget_bytes", "1.5G", "not a size");
	parse_bad("ram_budget_bytes", "", "empty");
	parse_bad("ram_budget_bytes", " \n", "empty");
	parse_bad("ram_budget_bytes", "M", "not a size");
	/* too many digits is "out of range" only for a size (make fuzz) */
	parse_bad("ram_budget_bytes", "99999999999999999999MB", "not a size");
	parse_bad("ram_budget_bytes", "18448446744073609551\xca", "not a size");
	/* the range is shown with suffixes */
	parse_bad("ram_budget_bytes", "1K", "2M..1P");
}
END_TEST

START_TEST(parse_uint)
{
	ck_assert_uint_eq(parse_ok("io_depth", "1"), 1);
	ck_assert_uint_eq(parse_ok("io_depth", "4096"), 4096);
	ck_assert_uint_eq(parse_ok("io_depth", "0064\n"), 64);
	ck_assert_uint_eq(parse_ok("prefetch_depth_layers", "0"), 0);
	parse_bad("io_depth", "0", "1..4096");
	parse_bad("io_depth", "4097", "out of range");
	parse_bad("io_depth", "4k", "not an unsigned");
	parse_bad("io_depth", "-1", "not an unsigned");
	parse_bad("io_depth", "+5", "not an unsigned");
	parse_bad("io_depth", "5 6", "not an unsigned");
	parse_bad("io_depth", "abc", "'abc'");
	parse_bad("io_depth", "99999999999999999999x", "not an unsigned");
	parse_bad("prefetch_depth_layers", "17", "0..16");
}
END_TEST

/* No bool is declared yet: exercise the type with a local entry. */
START_TEST(parse_bool)
{
	const struct kvp_tunable b = { .name = "x_enabled",
				       .type = KVP_T_BOOL,
				       .min = 0,
				       .max = 1,
				       .doc = "test" };
	static const char *const yes[] = { "1",	 "true", "TRUE", "on",
					   "On", "yes",	 " 1\n" };
	static const char *const no[] = { "0",	 "false", "False",
					  "off", "OFF",	  "no" };
	static const char *const bad[] = { "2", "y", "enable", "", "10" };
	char buf[16];
	uint64_t v;
	size_t i;

	for (i = 0; i < sizeof(yes) / sizeof(*yes); i++) {
		ck_assert_int_eq(kvp_tunable_parse(&b, yes[i], &v, err, 99), 0);
		ck_assert_uint_eq(v, 1);
	}
	for (i = 0; i < sizeof(no) / sizeof(*no); i++) {
		ck_assert_int_eq(kvp_tunable_parse(&b, no[i], &v, err, 99), 0);
		ck_assert_uint_eq(v, 0);
	}
	for (i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		ck_assert_int_eq(
		    kvp_tunable_parse(&b, bad[i], &v, err, sizeof(err)),
		    -EINVAL);
		ck_assert(strstr(err, "0/1") != NULL);
	}
	kvp_tunable_format(&b, 1, buf, sizeof(buf));
	ck_assert_str_eq(buf, "1");
	kvp_tunable_format(&b, 0, buf, sizeof(buf));
	ck_assert_str_eq(buf, "0");
}
END_TEST

START_TEST(parse_choice)
{
	ck_assert_uint_eq(parse_ok("install_mode", "auto"), KVP_INSTALL_AUTO);
	ck_assert_uint_eq(parse_ok("install_mode", "move\n"), KVP_INSTALL_MOVE);
	ck_assert_uint_eq(parse_ok("install_mode", "COPY"), KVP_INSTALL_COPY);
	ck_assert_uint_eq(parse_ok("predictor", "lowrank"),
			  KVP_PREDICTOR_LOWRANK);
	parse_bad("install_mode", "mov", "auto move copy");
	parse_bad("install_mode", "moves", "not one of");
	parse_bad("install_mode", "1", "not one of");
	parse_bad("install_mode", "[move]", "not one of");
	parse_bad("predictor", "", "empty");
}
END_TEST

START_TEST(format_values)
{
	char buf[KVP_TUNABLE_VALUE_MAX], small[8];
	int n;

	kvp_tunable_format(T("install_mode"), KVP_INSTALL_MOVE, buf,
			   sizeof(buf));
	ck_assert_str_eq(buf, "auto [move] copy");
	kvp_tunable_format(T("install_mode"), KVP_INSTALL_AUTO, buf,
			   sizeof(buf));
	ck_assert_str_eq(buf, "[auto] move copy");
	kvp_tunable_format(T("predictor"), KVP_PREDICTOR_LOWRANK, buf,
			   sizeof(buf));
	ck_assert_str_eq(buf, "exact window [lowrank]");
	/* truncation keeps a terminated string and reports the full length */
	n = kvp_tunable_format(T("install_mode"), KVP_INSTALL_COPY, small,
			       sizeof(small));
	ck_assert_int_eq(n, (int)strlen("auto move [copy]"));
	ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
	kvp_tunable_format(T("ram_budget_bytes"), 1ULL << 30, buf, sizeof(buf));
	ck_assert_str_eq(buf, "1073741824");
	kvp_tunable_format(T("io_depth"), 64, buf, sizeof(buf));
	ck_assert_str_eq(buf, "64");
	kvp_tunable_format_range(T("io_depth"), buf, sizeof(buf));
	ck_assert_str_eq(buf, "1..4096");
	kvp_tunable_format_range(T("ram_budget_bytes"), buf, sizeof(buf));
	ck_assert_str_eq(buf, "2M..1P");
	kvp_tunable_format_range(&(struct kvp_tunable){ .type = KVP_T_BYTES,
							.min = 4096,
							.max = UINT64_MAX },
				 buf, sizeof(buf));
	ck_assert_str_eq(buf, "at least 4K");
	kvp_tunable_format_range(&(struct kvp_tunable){ .type = KVP_T_UINT,
							.max = UINT64_MAX },
				 buf, sizeof(buf));
	ck_assert_str_eq(buf, "at least 0");
	kvp_tunable_format_range(T("install_mode"), buf, sizeof(buf));
	ck_assert_str_eq(buf, "auto move copy");
	kvp_format_bytes(1000, buf, sizeof(buf));
	ck_assert_str_eq(buf, "1000");
	kvp_format_bytes(3ULL << 30, buf, sizeof(buf));
	ck_assert_str_eq(buf, "3G");
	kvp_format_bytes(0, buf, sizeof(buf));
	ck_assert_str_eq(buf, "0");
}
END_TEST

/* Every tunable's formatted default parses back to itself. */
START_TEST(format_parse_round_trip)
{
	char buf[KVP_TUNABLE_VALUE_MAX];
	size_t i;

	for (i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		uint64_t vals[2] = { t->min, t->max }, v;
		int k;

		for (k = 0; k < 2; k++) {
			kvp_tunable_format(t, vals[k], buf, sizeof(buf));
			if (t->type == KVP_T_CHOICE) {
				/* the bracketed name is the value */
				char *l = strchr(buf, '['),
				     *r = strchr(buf, ']');

				ck_assert(l && r);
				*r = '\0';
				memmove(buf, l + 1, strlen(l + 1) + 1);
			}
			ck_assert_int_eq(
			    kvp_tunable_parse(t, buf, &v, err, sizeof(err)), 0);
			ck_assert_uint_eq(v, vals[k]);
		}
	}
}
END_TEST

START_TEST(get_set_bounds)
{
	struct kvp_config before = pc;
	struct kvp_kv_config kbefore = kc;
	uint64_t v;

	ck_assert_int_eq(
	    kvp_tunable_set(&tg, T("io_depth"), 4096, err, sizeof(err)), 0);
	ck_assert_uint_eq(pc.io_depth, 4096);
	ck_assert_int_eq(kvp_tunable_get(&tg, T("io_depth"), &v), 0);
	ck_assert_uint_eq(v, 4096);
	ck_assert_int_eq(
	    kvp_tunable_set(&tg, T("io_depth"), 4097, err, sizeof(err)),
	    -EINVAL);
	ck_assert_uint_eq(pc.io_depth, 4096);
	ck_assert(strstr(err, "io_depth") && strstr(err, "1..4096"));
	ck_assert_int_eq(
	    kvp_tunable_set(&tg, T("io_depth"), 0, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(
	    kvp_tunable_set(&tg, T("install_mode"), 3, err, sizeof(err)),
	    -EINVAL);
	ck_assert_int_eq(
	    kvp_tunable_set(&tg, T("sink_tokens"), 9, err, sizeof(err)), 0);
	ck_assert_uint_eq(kc.sink_tokens, 9);
	/* the watermarks must stay ordered: refused, nothing changed */
	pc = before;
	kc = kbefore;
	ck_assert_int_eq(kvp_tunable_set(&tg, T("evict_low_watermark_percent"),
					 95, err, sizeof(err)),
			 -EINVAL);
	ck_assert(strstr(err, "evict_low_watermark_percent") != NULL);
	ck_assert_int_eq(memcmp(&pc, &before, sizeof(pc)), 0);
	ck_assert_int_eq(kvp_tunable_set(&tg, T("evict_low_watermark_percent"),
					 94, err, sizeof(err)),
			 0);
	/* a target lacking the owner is refused */
	{
		struct kvp_tunable_target only = { .pager = &pc };

		ck_assert_int_eq(kvp_tunable_get(&only, T("predictor"), &v),
				 -EINVAL);
		ck_assert_int_eq(
		    kvp_tunable_set(&only, T("predictor"), 1, err, sizeof(err)),
		    -EINVAL);
		ck_assert(strstr(err, "no kv config") != NULL);
	}
	/* check spots an out-of-range value put in by hand */
	kc.kv_block_tokens = 0;
	ck_assert_int_eq(kvp_tunables_check(&tg, err, sizeof(err)), -EINVAL);
	ck_assert(strstr(err, "kv_block_tokens") != NULL);
}
END_TEST

START_TEST(env_names)
{
	char buf[64];

	ck_assert_int_eq(
	    kvp_tunable_env_name(T("ram_budget_bytes"), buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "KVP_RAM_BUDGET_BYTES");
	ck_assert_int_eq(kvp_tunable_env_name(T("io_depth"), buf, 8), -EINVAL);
}
END_TEST

START_TEST(env_load_all)
{
	setenv("KVP_RAM_BUDGET_BYTES", "256m", 1);
	setenv("KVP_IO_DEPTH", "128", 1);
	setenv("KVP_INSTALL_MODE", "copy", 1);
	setenv("KVP_PREFETCH_DEPTH_LAYERS", "5", 1);
	setenv("KVP_PREDICTOR", "window", 1);
	setenv("KVP_UNRELATED_THING", "whatever", 1); /* not a tunable */
	ck_assert_int_eq(kvp_tunables_load_env(&tg, err, sizeof(err)), 0);
	ck_assert_uint_eq(pc.ram_budget_bytes, 256u << 20);
	ck_assert_uint_eq(pc.io_depth, 128);
	ck_assert_uint_eq(pc.install_mode, KVP_INSTALL_COPY);
	ck_assert_uint_eq(kc.prefetch_depth_layers, 5);
	ck_assert_uint_eq(kc.predictor, KVP_PREDICTOR_WINDOW);
	ck_assert_uint_eq(pc.io_batch, 16); /* unset: untouched */
}
END_TEST

/* One bad variable: nothing at all changes, the message says it all. */
START_TEST(env_load_all_or_nothing)
{
	struct kvp_config before = pc;
	struct kvp_kv_config kbefore = kc;

	setenv("KVP_RAM_BUDGET_BYTES", "256M", 1);
	setenv("KVP_PREFETCH_DEPTH_LAYERS", "7", 1);
	setenv("KVP_IO_DEPTH", "0", 1);
	ck_assert_int_eq(kvp_tunables_load_env(&tg, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(memcmp(&pc, &before, sizeof(pc)), 0);
	ck_assert_int_eq(memcmp(&kc, &kbefore, sizeof(kc)), 0);
	ck_assert_msg(strstr(err, "KVP_IO_DEPTH=0") != NULL, "%s", err);
	ck_assert_msg(strstr(err, "1..4096") != NULL, "%s", err);
	ck_assert_msg(strstr(err, "unset") != NULL, "%s", err);

	setenv("KVP_IO_DEPTH", "64", 1);
	setenv("KVP_INSTALL_MODE", "zero-copy", 1);
	ck_assert_int_eq(kvp_tunables_load_env(&tg, err, sizeof(err)), -EINVAL);
	ck_assert(strstr(err, "KVP_INSTALL_MODE=zero-copy") != NULL);
	ck_assert(strstr(err, "auto move copy") != NULL);
	ck_assert_int_eq(memcmp(&pc, &before, sizeof(pc)), 0);
	unsetenv("KVP_INSTALL_MODE");

	/* each valid alone, inconsistent together */
	setenv("KVP_EVICT_LOW_WATERMARK_PERCENT", "90", 1);
	setenv("KVP_EVICT_HIGH_WATERMARK_PERCENT", "80", 1);
	ck_assert_int_eq(kvp_tunables_load_env(&tg, err, sizeof(err)), -EINVAL);
	ck_assert(strstr(err, "watermark") != NULL);
	ck_assert_int_eq(memcmp(&pc, &before, sizeof(pc)), 0);
	ck_assert_int_eq(memcmp(&kc, &kbefore, sizeof(kc)), 0);

	/* a bad KV variable does not matter to a caller without KV config */
	unsetenv("KVP_EVICT_LOW_WATERMARK_PERCENT");
	unsetenv("KVP_EVICT_HIGH_WATERMARK_PERCENT");
	setenv("KVP_PREDICTOR", "oracle", 1);
	{
		struct kvp_tunable_target only = { .pager = &pc };

		ck_assert_int_eq(kvp_tunables_load_env(&only, err, sizeof(err)),
				 0);
		ck_assert_uint_eq(pc.ram_budget_bytes, 256u << 20);
	}
	ck_assert_int_eq(kvp_tunables_load_env(&tg, err, sizeof(err)), -EINVAL);
	ck_assert(strstr(err, "KVP_PREDICTOR=oracle") != NULL);
}
END_TEST

START_TEST(lines_apply)
{
	size_t changed = 99;
	const char *text = "# a comment\n"
			   "\n"
			   "  ram_budget_bytes = 64M\n"
			   "; another comment\n"
			   "install_mode=move\n"
			   "prefetch_depth_layers =3   \n"
			   "io_batch = 16\n" /* the default: not a change */
			   "prefetch_depth_layers = 4"; /* later wins, no \n */

	ck_assert_int_eq(
	    kvp_tunables_apply_lines(&tg, text, 0, &changed, err, sizeof(err)),
	    0);
	ck_assert_uint_eq(pc.ram_budget_bytes, 64u << 20);
	ck_assert_uint_eq(pc.install_mode, KVP_INSTALL_MOVE);
	ck_assert_uint_eq(kc.prefetch_depth_layers, 4);
	ck_assert_uint_eq(changed, 3);
	ck_assert_int_eq(
	    kvp_tunables_apply_lines(&tg, "", 0, &changed, err, sizeof(err)),
	    0);
	ck_assert_uint_eq(changed, 0);
	ck_assert_int_eq(
	    kvp_tunables_apply_lines(&tg, NULL, 0, NULL, err, sizeof(err)), 0);
}
END_TEST

static void lines_bad(const char *text, unsigned flags, const char *want)
{
	struct kvp_config before = pc;
	struct kvp_kv_config kbefore = kc;

	err[0] = '\0';
	ck_assert_int_eq(
	    kvp_tunables_apply_lines(&tg, text, flags, NULL, err, sizeof(err)),
	    -EINVAL);
	ck_assert_msg(strstr(err, want) != NULL, "'%s' lacks '%s'", err, want);
	ck_assert_int_eq(memcmp(&pc, &before, sizeof(pc)), 0);
	ck_assert_int_eq(memcmp(&kc, &kbefore, sizeof(kc)), 0);
}

START_TEST(lines_all_or_nothing)
{
	lines_bad("ram_budget_bytes = 64M\nfoo = 1\n", 0,
		  "line 2: 'foo' is not a tunable");
	lines_bad("ram_budget_bytes = 64M\ninstall_mode = fast\n", 0,
		  "line 2: install_mode: 'fast'");
	lines_bad("ram_budget_bytes 64M\n", 0,
		  "line 1: 'ram_budget_bytes 64M'"
		  " is not of the form");
	lines_bad("= 4\n", 0, "line 1: no tunable name");
	lines_bad("io_depth =\n", 0, "empty value");
	lines_bad("ram_budget_bytes = 64M\nio_depth = 8\n",
		  KVP_TUNABLES_RUNTIME_ONLY,
		  "io_depth cannot change on a running pager (set "
		  "KVP_IO_DEPTH");
	lines_bad("evict_low_watermark_percent = 96\n", 0, "watermark");
	lines_bad("prefetch_depth_layers = 3\nkv_block_tokens = 2\n",
		  KVP_TUNABLES_RUNTIME_ONLY, "line 2: kv_block_tokens cannot");
	{
		char longline[2048];

		memset(longline, 'a', sizeof(longline) - 1);
		longline[sizeof(longline) - 1] = '\0';
		lines_bad(longline, 0, "too long");
	}
	/* a non-runtime tunable at its current value is fine */
	ck_assert_int_eq(kvp_tunables_apply_lines(&tg,
						  "io_depth = 64\n"
						  "ram_budget_bytes = 8M\n",
						  KVP_TUNABLES_RUNTIME_ONLY,
						  NULL, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(pc.ram_budget_bytes, 8u << 20);
	/* the two watermarks moved together, in an order that only
	   works once both are applied */
	ck_assert_int_eq(
	    kvp_tunables_apply_lines(&tg,
				     "evict_low_watermark_percent = 97\n"
				     "evict_high_watermark_percent = 99\n",
				     0, NULL, err, sizeof(err)),
	    0);
	ck_assert_uint_eq(pc.evict_low_watermark_percent, 97);
}
END_TEST

static Suite *tunables_suite(void)
{
	Suite *s = suite_create("tunables");
	TCase *tc = kvp_test_tcase(s, "registry", 30);

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, registry_merges_both_lists);
	tcase_add_test(tc, defaults_match_declarations);
	tcase_add_test(tc, parse_bytes);
	tcase_add_test(tc, parse_uint);
	tcase_add_test(tc, parse_bool);
	tcase_add_test(tc, parse_choice);
	tcase_add_test(tc, format_values);
	tcase_add_test(tc, format_parse_round_trip);
	tcase_add_test(tc, get_set_bounds);
	tcase_add_test(tc, env_names);
	tcase_add_test(tc, env_load_all);
	tcase_add_test(tc, env_load_all_or_nothing);
	tcase_add_test(tc, lines_apply);
	tcase_add_test(tc, lines_all_or_nothing);
	return s;
}

int main(void)
{
	return kvp_test_run(tunables_suite());
}
