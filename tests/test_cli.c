/*
 * test_cli.c - lib/cli/cli.c: one option table makes the --help text,
 * getopt_long's tables and the lines the man pages and the completion
 * are made from; lib/cli/timeline.c: a decode's per-step figures kept in
 * bounded memory, every step summed into exactly one point.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/cli/cli.h"
#include "lib/cli/progress.h"
#include "lib/cli/timeline.h"
#include "tests/helpers/helpers.h"

static const struct kvp_cli_opt table[] = {
	{ "dir", 'd', 0, "DIR", "where files go" },
	{ "mode", 'M', 0, "K", "fast | slow | safe (fast)" },
	{ "out", 'o', 'o', "FILE", "write here\nsecond line" },
	{ "a-rather-long-option-name", 'L', 0, "BYTES", "wraps" },
	{ "quiet", 'q', 'q', NULL, "no progress" },
	{ "secret", 'S', 0, NULL, NULL },
	{ NULL, 'x', 'x', NULL, "short only" },
	{ 0 },
};

/* What @fn printed into a memstream, malloc'd. */
static char *capture(void (*fn)(FILE *))
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	fn(f);
	ck_assert_int_eq(fclose(f), 0);
	return buf;
}

static void usage_of_table(FILE *f)
{
	kvp_cli_usage(f, table);
}

static void lines_of_table(FILE *f)
{
	static const struct kvp_cli_cmd cmds[] = {
		{ "run", "run it" },
		{ NULL, NULL },
	};

	kvp_cli_cmds_print(f, NULL, cmds);
	kvp_cli_table_print(f, "run", table);
}

START_TEST(count_stops_at_the_end)
{
	ck_assert_uint_eq(kvp_cli_count(table), 7);
}
END_TEST

START_TEST(usage_lists_each_visible_option)
{
	char *u = capture(usage_of_table);

	ck_assert_ptr_nonnull(strstr(u, "  --dir DIR           where files go\n"));
	ck_assert_ptr_nonnull(strstr(u, "  -o, --out FILE      write here\n"
					"                      second line\n"));
	ck_assert_ptr_nonnull(strstr(u, "  --a-rather-long-option-name BYTES\n"
					"                      wraps\n"));
	ck_assert_ptr_nonnull(strstr(u, "  -q, --quiet         no progress\n"));
	ck_assert_ptr_nonnull(strstr(u, "  -x                  short only\n"));
	/* a hidden entry is left out */
	ck_assert_ptr_null(strstr(u, "secret"));
	free(u);
}
END_TEST

START_TEST(getopt_tables_match)
{
	struct option lo[8];
	char shorts[32];

	kvp_cli_getopt(table, "+", lo, shorts);
	ck_assert_str_eq(shorts, "+o:qx");
	ck_assert_str_eq(lo[0].name, "dir");
	ck_assert_int_eq(lo[0].has_arg, required_argument);
	ck_assert_int_eq(lo[0].val, 'd');
	ck_assert_str_eq(lo[4].name, "quiet");
	ck_assert_int_eq(lo[4].has_arg, no_argument);
	/* the hidden option still parses; the short-only one has no name */
	ck_assert_str_eq(lo[5].name, "secret");
	ck_assert_ptr_null(lo[6].name);
	ck_assert_int_eq(lo[6].val, 0);
}
END_TEST

START_TEST(table_lines_for_the_build)
{
	char *t = capture(lines_of_table);

	ck_assert_ptr_nonnull(strstr(t, "cmd\t-\trun\trun it\n"));
	ck_assert_ptr_nonnull(
	    strstr(t, "opt\trun\t-\t--dir\tDIR\tdir\twhere files go\n"));
	ck_assert_ptr_nonnull(strstr(t, "opt\trun\t-\t--mode\tK\t"
					"words:fast,slow,safe\t"));
	ck_assert_ptr_nonnull(strstr(t, "opt\trun\t-o\t--out\tFILE\tfile\t"
					"write here\\nsecond line\n"));
	ck_assert_ptr_nonnull(
	    strstr(t, "opt\trun\t-q\t--quiet\t-\t-\tno progress\n"));
	ck_assert_ptr_nonnull(strstr(t, "opt\trun\t-x\t-\t-\t-\tshort only\n"));
	ck_assert_ptr_null(strstr(t, "secret"));
	free(t);
}
END_TEST

START_TEST(table_asked_only_alone)
{
	char *a1[] = { "tool", "--cli-table", NULL };
	char *a2[] = { "tool", "--cli-table", "x", NULL };
	char *a3[] = { "tool", NULL };

	ck_assert(kvp_cli_table_asked(2, a1));
	ck_assert(!kvp_cli_table_asked(3, a2));
	ck_assert(!kvp_cli_table_asked(1, a3));
}
END_TEST

/* What kvp_progress writes to a stderr that is a file, not a terminal:
 * an update of 1/10 MiB, then of 3/10 MiB @age seconds later, then the
 * end. */
static char *progress_text(bool quiet, double age)
{
	struct kvp_progress p;
	FILE *f = tmpfile();
	int saved = dup(2);
	static char buf[512];
	size_t n;

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(dup2(fileno(f), 2), 2);
	kvp_progress_start(&p, "tool", "fill", quiet);
	ck_assert(!p.tty);
	kvp_progress_update(&p, 1, 10, "MiB"); /* within the interval */
	p.last -= age;
	p.t0 -= age;
	kvp_progress_update(&p, 3, 10, "MiB");
	kvp_progress_done(&p, 10, 10, "MiB");
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

START_TEST(progress_lines_off_a_terminal)
{
	/* a line once the interval has passed, none before, no bar */
	ck_assert_str_eq(progress_text(false, KVP_PROGRESS_LINE_S + 1),
			 "tool: fill 3/10 MiB (30%), 6 s\n");
	ck_assert_str_eq(progress_text(false, 0), "");
	/* --quiet: nothing */
	ck_assert_str_eq(progress_text(true, KVP_PROGRESS_LINE_S + 1), "");
}
END_TEST

/* Step i of a run: T_step i ms, T_compute 2i, T_load 3i, i faults. */
static void timeline_steps(struct kvp_timeline *t, uint64_t from, uint64_t to)
{
	for (uint64_t i = from; i < to; i++)
		kvp_timeline_add(t, &(struct kvp_timeline_step){
					.t_step_s = i * 1e-3,
					.t_compute_s = 2 * i * 1e-3,
					.t_load_s = 3 * i * 1e-3,
					.demand_faults = i });
}

START_TEST(timeline_keeps_every_step_then_merges)
{
	struct kvp_timeline t;
	uint64_t next = 0, faults = 0, i;
	double tstep = 0;

	ck_assert_int_eq(kvp_timeline_init(&t, 3), -EINVAL);
	ck_assert_int_eq(kvp_timeline_init(&t, 0), -EINVAL);
	ck_assert_int_eq(kvp_timeline_init(&t, 8), 0);
	/* up to the cap, a point per step */
	timeline_steps(&t, 0, 7);
	ck_assert_uint_eq(t.n, 7);
	ck_assert_uint_eq(t.per, 1);
	ck_assert_uint_eq(t.pt[6].first, 6);
	ck_assert_uint_eq(t.pt[6].demand_faults, 6);
	/* the eighth fills it: pairs merge, 4 points of 2 steps */
	timeline_steps(&t, 7, 8);
	ck_assert_uint_eq(t.n, 4);
	ck_assert_uint_eq(t.per, 2);
	ck_assert_uint_eq(t.pt[1].first, 2);
	ck_assert_uint_eq(t.pt[1].steps, 2);
	ck_assert_uint_eq(t.pt[1].demand_faults, 2 + 3);
	ck_assert_uint_eq(t.pt[4].steps, 0);
	/* a long run stays within the cap; every step is in one point, in
	 * order, and the sums are kept */
	timeline_steps(&t, 8, 1001);
	ck_assert_uint_eq(t.steps, 1001);
	/* merged at 8, 16, ..., 512 steps: 7 points of 128, 105 filling */
	ck_assert_uint_eq(t.per, 128);
	ck_assert_uint_eq(t.n, 7);
	ck_assert_uint_eq(t.pt[7].steps, 105);
	for (i = 0; i <= t.n && t.pt[i].steps; i++) {
		ck_assert_uint_eq(t.pt[i].first, next);
		ck_assert(i == t.n ? t.pt[i].steps < t.per
				   : t.pt[i].steps == t.per);
		next += t.pt[i].steps;
		faults += t.pt[i].demand_faults;
		tstep += t.pt[i].t_step_s;
		ck_assert(t.pt[i].t_load_s > 2.99 * t.pt[i].t_step_s &&
			  t.pt[i].t_load_s < 3.01 * t.pt[i].t_step_s);
	}
	ck_assert_uint_eq(next, 1001);
	ck_assert_uint_eq(faults, 1000 * 1001 / 2);
	ck_assert(tstep > 500.49 && tstep < 500.51);
	kvp_timeline_free(&t);
	kvp_timeline_free(&t); /* twice is fine */
}
END_TEST

static Suite *cli_suite(void)
{
	Suite *s = suite_create("cli");
	TCase *tc = kvp_test_tcase(s, "tables", 30);

	tcase_add_test(tc, count_stops_at_the_end);
	tcase_add_test(tc, usage_lists_each_visible_option);
	tcase_add_test(tc, getopt_tables_match);
	tcase_add_test(tc, table_lines_for_the_build);
	tcase_add_test(tc, table_asked_only_alone);
	tcase_add_test(tc, progress_lines_off_a_terminal);
	tcase_add_test(tc, timeline_keeps_every_step_then_merges);
	return s;
}

int main(void)
{
	return kvp_test_run(cli_suite());
}
