/*
 * kvpctl - sysctl for running pagers, through their debug views.
 *
 *   kvpctl                      the running pagers (pid, mount, command)
 *   kvpctl -a                   every tunable and statistic, name = value
 *   kvpctl get NAME...          one value each (NAME or a path in the view,
 *                               e.g. regions/kv/resident_bytes)
 *   kvpctl set NAME=VALUE...    change tunables, all or none
 *   kvpctl list                 tunables: value, type, range, default, doc
 *   kvpctl stats [--watch S] [--count N]
 *                               statistics, or their rates every S seconds;
 *                               the prefix cache's (cache/NAME) and the
 *                               remote tier's (remote/NAME) too, when
 *                               the pager's program has one
 *   kvpctl load FILE            `name = value` lines, all or nothing
 *
 * A pager is chosen with -p PID or -m MOUNT; without either, the only pager
 * in the registry (lib/instance/instance.h).  Values are checked against the
 * tunables registry before anything is written, and a write the pager
 * refuses is reported with the pager's reason (its last_error file).
 * Exit status: 0 done, 1 failed, 2 bad usage.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/cli/cli.h"
#include "lib/instance/instance.h"
#include "lib/tunables/tunables.h"
#include "pager/stats.h"

static const char *const stat_names[] = {
#define X(n, k, d) #n,
	KVP_STATS(X)
#undef X
};
#define NSTATS (sizeof(stat_names) / sizeof(stat_names[0]))

static char mount_path[PATH_MAX]; /* of the chosen pager */
static bool value_only;		  /* -n */

/* The options and commands: --help, the man page and the completion. */
static const struct kvp_cli_opt opts[] = {
	{ NULL, 'a', 'a', NULL, "every tunable and statistic" },
	{ NULL, 'p', 'p', "PID", "the pager of process PID" },
	{ NULL, 'm', 'm', "MOUNT", "the pager whose view is at MOUNT" },
	{ NULL, 'n', 'n', NULL, "get: print values only" },
	{ "help", 'h', 'h', NULL, "this text" },
	{ 0 },
};

static const struct kvp_cli_cmd commands[] = {
	{ "get", "NAME...: values (a tunable, a statistic, or a path in the "
		 "view)" },
	{ "set", "NAME=VALUE...: change tunables" },
	{ "list", "tunables with values, ranges and docs" },
	{ "stats", "[--watch SECONDS] [--count N]: statistics, or live rates" },
	{ "load", "FILE: apply name = value lines, all or nothing (- is "
		  "stdin)" },
	{ NULL, NULL },
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvpctl [-p PID | -m MOUNT] [-n] [COMMAND]\n"
		"  (no command)        list the running pagers\n"
		"  get NAME...         values (a tunable, a statistic, or "
		"a path in the view)\n"
		"  set NAME=VALUE...   change tunables\n"
		"  list                tunables with values, ranges and "
		"docs\n"
		"  stats [--watch SECONDS] [--count N]\n"
		"                      statistics, or live rates\n"
		"  load FILE           apply name = value lines, all or "
		"nothing (- is stdin)\n");
	kvp_cli_usage(f, opts);
}

/* "kvpctl: <message>" on stderr, then exit(@status). */
static void vexit(int status, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0), noreturn));

static void vexit(int status, const char *fmt, va_list ap)
{
	fputs("kvpctl: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	exit(status);
}

static void die(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vexit(1, fmt, ap);
}

static void bad_usage(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

/* As die, for a command line that cannot be right: exit status 2. */
static void bad_usage(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vexit(2, fmt, ap);
}

/* Option @opt's value @s: decimal digits only, whole, in [@min, @max]. */
static uint64_t parse_whole(const char *opt, const char *what, const char *s,
			    uint64_t min, uint64_t max)
{
	uint64_t v = 0;
	const char *c;

	for (c = s; *c; c++) {
		unsigned d = (unsigned)(*c - '0');

		if (d > 9 || v > (UINT64_MAX - d) / 10)
			break;
		v = v * 10 + d;
	}
	if (c == s || *c || v < min || v > max)
		bad_usage("%s takes %s from %llu to %llu, not '%s'", opt, what,
			  (unsigned long long)min, (unsigned long long)max, s);
	return v;
}

/* --watch's seconds: digits with an optional fraction ("2", "0.5"), no
 * sign, exponent, hex, nan or inf, in [WATCH_MIN_S, WATCH_MAX_S]. */
#define WATCH_MIN_S 0.01
#define WATCH_MAX_S 86400.0

static double parse_seconds(const char *opt, const char *s)
{
	size_t digits = strspn(s, "0123456789"), frac = 0;
	double v;

	if (s[digits] == '.')
		frac = strspn(s + digits + 1, "0123456789") + 1;
	v = strtod(s, NULL);
	if (digits + frac == 0 || (frac == 1 && !digits) || s[digits + frac] ||
	    !(v >= WATCH_MIN_S && v <= WATCH_MAX_S))
		bad_usage("%s takes seconds from %g to %g (such as 0.5), not "
			  "'%s'",
			  opt, WATCH_MIN_S, WATCH_MAX_S, s);
	return v;
}

/* nanosleep, whole through signals */
static void sleep_seconds(double s)
{
	struct timespec t = { (time_t)s,
			      (long)((s - (double)(time_t)s) * 1e9) };

	while (nanosleep(&t, &t) && errno == EINTR)
		;
}

/* ---- the view's files ---- */

/* The file @rel of the view, NUL-terminated and malloc'd; NULL and errno
 * on failure. */
static char *slurp(const char *rel, size_t *lenp)
{
	char path[PATH_MAX + 256], *buf = NULL, *nb;
	size_t cap = 0, len = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", mount_path, rel);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	for (;;) {
		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 8192;
			nb = realloc(buf, cap + 1);
			if (!nb)
				die("out of memory");
			buf = nb;
		}
		n = read(fd, buf + len, cap - len);
		if (n < 0) {
			int e = errno;

			close(fd);
			free(buf);
			errno = e;
			return NULL;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	if (lenp)
		*lenp = len;
	return buf;
}

/* The file's value without its newline, malloc'd; dies when unreadable. */
static char *value_of(const char *rel)
{
	char *s = slurp(rel, NULL);
	size_t n;

	if (!s) {
		if (errno == ENOTCONN)
			die("the view at %s is dead (its pager crashed?): "
			    "run fusermount3 -u -z %s",
			    mount_path, mount_path);
		die("cannot read %s/%s: %s", mount_path, rel, strerror(errno));
	}
	n = strlen(s);
	while (n && s[n - 1] == '\n')
		s[--n] = '\0';
	return s;
}

static uint64_t stat_value(const char *name)
{
	char rel[128], *s;
	uint64_t v;

	snprintf(rel, sizeof(rel), "stats/%s", name);
	s = value_of(rel);
	v = strtoull(s, NULL, 10);
	free(s);
	return v;
}

/* One write(2) of @text to @rel; 0 or -errno. */
static int put(const char *rel, const char *text, size_t len)
{
	char path[PATH_MAX + 256];
	ssize_t w;
	int fd, r = 0;

	snprintf(path, sizeof(path), "%s/%s", mount_path, rel);
	fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	w = write(fd, text, len);
	if (w < 0)
		r = -errno;
	else if ((size_t)w != len)
		r = -EIO;
	if (close(fd) && !r)
		r = -errno;
	return r;
}

/* The pager's own word on the last refused write, or "". */
static char *last_error(void)
{
	char *s = slurp("last_error", NULL);
	size_t n;

	if (!s)
		return strdup("");
	n = strlen(s);
	while (n && s[n - 1] == '\n')
		s[--n] = '\0';
	return s;
}

/* ---- choosing the pager ---- */

/* Why a registry folder is refused (lib/view/paths.h), for a message. */
static const char *registry_hint(int r)
{
	return r == -ENOMEM ? ""
			    : " (it must be a folder of yours, mode 0700, not "
			      "a symlink; KVP_RUNTIME_DIR names another)";
}

static void choose(pid_t pid, const char *mount)
{
	struct kvp_instance_entry *e;
	char dir[PATH_MAX + 8];
	size_t n, i, alive = 0, pick = 0;
	struct stat st;
	int r;

	if (mount) {
		if (!realpath(mount, mount_path)) {
			if (errno == ENOTCONN)
				die("the view at %s is dead (its pager "
				    "crashed?): run fusermount3 -u -z %s",
				    mount, mount);
			die("cannot use %s: %s", mount, strerror(errno));
		}
		snprintf(dir, sizeof(dir), "%s/pid", mount_path);
		if (stat(dir, &st) && errno == ENOTCONN)
			die("the view at %s is dead (its pager crashed?): run "
			    "fusermount3 -u -z %s",
			    mount_path, mount_path);
		if (stat(dir, &st))
			die("%s is not a kvpager view (no pid file there)",
			    mount_path);
		return;
	}
	kvp_instance_dir(dir, sizeof(dir));
	r = kvp_instance_list(0, &e, &n);
	if (r)
		die("cannot read the registry %s: %s%s", dir, strerror(-r),
		    registry_hint(r));
	for (i = 0; i < n; i++) {
		if (!e[i].alive || !e[i].mount[0])
			continue;
		if (pid ? e[i].pid == pid : true) {
			alive++;
			pick = i;
		}
	}
	if (pid && !alive)
		die("no running pager with pid %d in %s (kvpctl lists them)",
		    (int)pid, dir);
	if (!alive)
		die("no running pager found in %s: start one with "
		    "KVP_FUSE_MOUNT=DIR set, or name its view with -m MOUNT",
		    dir);
	if (alive > 1) {
		fprintf(stderr,
			"kvpctl: %zu pagers are running; choose one "
			"with -p PID:\n",
			alive);
		for (i = 0; i < n; i++)
			if (e[i].alive && e[i].mount[0])
				fprintf(stderr, "  %d %s\n", (int)e[i].pid,
					e[i].mount);
		exit(1);
	}
	snprintf(mount_path, sizeof(mount_path), "%s", e[pick].mount);
	free(e);
}

static int cmd_ps(void)
{
	struct kvp_instance_entry *e;
	char dir[PATH_MAX];
	size_t n, i, shown = 0;
	int r;

	kvp_instance_dir(dir, sizeof(dir));
	r = kvp_instance_list(0, &e, &n);
	if (r)
		die("cannot read the registry %s: %s%s", dir, strerror(-r),
		    registry_hint(r));
	for (i = 0; i < n; i++) {
		if (!e[i].alive)
			continue;
		if (!shown++)
			printf("%-8s %-16s %s\n", "PID", "COMMAND", "MOUNT");
		printf("%-8d %-16s %s\n", (int)e[i].pid, e[i].comm, e[i].mount);
	}
	if (!shown)
		printf("no running pager (registry: %s)\n", dir);
	free(e);
	return 0;
}

/* ---- commands ---- */

static void print_kv(const char *name, const char *value)
{
	if (value_only)
		printf("%s\n", value);
	else
		printf("%s = %s\n", name, value);
}

/* A tier's figures, "DIR/NAME = value" in the order the view lists
 * them: the prefix cache's (cache/) and the remote tier's (remote/),
 * whose folders are empty while the program has no such tier. */
static void print_tier(const char *dir)
{
	char rel[PATH_MAX], path[PATH_MAX + 256], *v;
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof(path), "%s/%s", mount_path, dir);
	d = opendir(path);
	if (!d)
		return;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(rel, sizeof(rel), "%s/%s", dir, e->d_name);
		v = slurp(rel, NULL); /* gone meanwhile: the tier closed */
		if (!v)
			continue;
		v[strcspn(v, "\n")] = '\0';
		print_kv(rel, v);
		free(v);
	}
	closedir(d);
}

static void print_tiers(void)
{
	print_tier("cache");
	print_tier("remote");
}

static int cmd_all(void)
{
	char rel[128], *v;
	size_t i;

	for (i = 0; i < kvp_tunables_count(); i++) {
		snprintf(rel, sizeof(rel), "tunables/%s",
			 kvp_tunable_at(i)->name);
		v = value_of(rel);
		print_kv(kvp_tunable_at(i)->name, v);
		free(v);
	}
	for (i = 0; i < NSTATS; i++) {
		snprintf(rel, sizeof(rel), "stats/%s", stat_names[i]);
		v = value_of(rel);
		print_kv(stat_names[i], v);
		free(v);
	}
	print_tiers();
	return 0;
}

static bool is_stat(const char *name)
{
	size_t i;

	for (i = 0; i < NSTATS; i++)
		if (!strcmp(stat_names[i], name))
			return true;
	return false;
}

/* A tunable or a statistic by its name, else any file of the view by its
 * path (pid, regions/kv/resident_bytes); never one outside it (..). */
static int cmd_get(int argc, char **argv)
{
	char rel[PATH_MAX], path[2 * PATH_MAX], *v;
	struct stat st;
	int i;

	for (i = 0; i < argc; i++) {
		const char *name = argv[i];

		if (kvp_tunable_find(name))
			snprintf(rel, sizeof(rel), "tunables/%s", name);
		else if (is_stat(name))
			snprintf(rel, sizeof(rel), "stats/%s", name);
		else
			snprintf(rel, sizeof(rel), "%s", name);
		snprintf(path, sizeof(path), "%s/%s", mount_path, rel);
		if (strstr(name, "..") || (stat(path, &st) && errno == ENOENT))
			die("unknown name '%s': not a tunable, a statistic or "
			    "a file of the view (kvpctl list shows tunables, "
			    "kvpctl -a all, ls %s the files)",
			    name, mount_path);
		v = value_of(rel);
		print_kv(name, v);
		free(v);
	}
	return 0;
}

/* Checks NAME=VALUE @arg against the registry (no pager needed) and
 * appends it to @text as a `name = value` line; a line that cannot be
 * right is the command line's: exit 2 with the reason. */
static void set_line(const char *arg, FILE *text)
{
	char name[128], err[KVP_TUNABLE_ERR_MAX], env[160];
	const struct kvp_tunable *t;
	const char *eq = strchr(arg, '='), *val;
	uint64_t v;
	size_t n;

	if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof(name))
		bad_usage("set: '%s' is not NAME=VALUE", arg);
	memcpy(name, arg, (size_t)(eq - arg));
	name[eq - arg] = '\0';
	val = eq + 1;
	t = kvp_tunable_find(name);
	if (!t) {
		if (is_stat(name))
			bad_usage("%s is a statistic: it cannot be set", name);
		bad_usage("unknown tunable '%s' (kvpctl list shows them)",
			  name);
	}
	if (kvp_tunable_parse(t, val, &v, err, sizeof(err)))
		bad_usage("%s; nothing was changed", err);
	if (!t->runtime) {
		kvp_tunable_env_name(t, env, sizeof(env));
		bad_usage("%s cannot change on a running pager: set %s before "
			  "it starts",
			  name, env);
	}
	/* parsed whole: no line break but at its ends, trimmed here */
	while (isspace((unsigned char)*val))
		val++;
	n = strlen(val);
	while (n && isspace((unsigned char)val[n - 1]))
		n--;
	fprintf(text, "%s = %.*s\n", name, (int)n, val);
}

/* The NAME=VALUE arguments as `name = value` lines, every one checked
 * (set_line) before a pager is looked for. */
static char *set_text(int argc, char **argv, size_t *len)
{
	char *text = NULL;
	FILE *f;
	int i;

	if (argc < 1)
		bad_usage("set: give NAME=VALUE (kvpctl list shows the names)");
	f = open_memstream(&text, len);
	if (!f)
		die("out of memory");
	for (i = 0; i < argc; i++)
		set_line(argv[i], f);
	if (fclose(f))
		die("out of memory");
	return text;
}

/* The lines of set_text in one write to apply: the pager takes all of
 * them or none. */
static int cmd_set(char *text, size_t len)
{
	int r = put("apply", text, len);

	if (r) {
		char *why = last_error();

		die("refused by the pager: %s; nothing was changed",
		    *why ? why : strerror(-r));
	}
	free(text);
	return 0;
}

static int cmd_list(bool have_pager)
{
	char range[KVP_TUNABLE_VALUE_MAX], def[KVP_TUNABLE_VALUE_MAX];
	char rel[128];
	size_t i;

	for (i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		const char *unit = kvp_tunable_unit(t);
		char *cur = NULL;
		const char *kind = t->type == KVP_T_CHOICE ? "one of"
				   : t->type == KVP_T_BOOL ? "bool"
				   : *unit		   ? unit
							   : "count";

		kvp_tunable_format_range(t, range, sizeof(range));
		if (t->type == KVP_T_BYTES)
			kvp_format_bytes(t->def, def, sizeof(def));
		else
			kvp_tunable_format(t, t->def, def, sizeof(def));
		if (have_pager) {
			snprintf(rel, sizeof(rel), "tunables/%s", t->name);
			cur = value_of(rel);
		}
		printf("%s = %s\n", t->name, cur ? cur : def);
		printf("    %s\n    %s %s, default %s, %s\n", t->doc, kind,
		       range, def, t->runtime ? "runtime" : "at start only");
		free(cur);
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct sample {
	double t;
	uint64_t faults, demand, read, written, hit, late, resident;
};

static void take(struct sample *s)
{
	s->t = now_s();
	s->demand = stat_value("demand_faults_total");
	s->faults = s->demand + stat_value("zero_fills_total");
	s->read = stat_value("bytes_read_total");
	s->written = stat_value("bytes_written_total");
	s->hit = stat_value("prefetch_hit_total");
	s->late = stat_value("prefetch_late_total");
	s->resident = stat_value("resident_bytes");
}

/* stats' options, parsed before a pager is looked for: a bad value is a
 * usage error (exit 2) whether or not one runs. */
struct stats_opts {
	double watch; /* 0: print once */
	uint64_t count;	/* 0: for ever */
};

static struct stats_opts parse_stats(int argc, char **argv)
{
	struct stats_opts o = { 0, 0 };
	int i;

	for (i = 0; i < argc; i++) {
		bool has_value = i + 1 < argc;

		if (!strcmp(argv[i], "--watch") && has_value)
			o.watch = parse_seconds("stats --watch", argv[++i]);
		else if (!strcmp(argv[i], "--count") && has_value)
			o.count =
			    parse_whole("stats --count", "a number of lines",
					argv[++i], 0, UINT32_MAX);
		else if (!strcmp(argv[i], "--watch") ||
			 !strcmp(argv[i], "--count"))
			bad_usage("stats: %s needs a value", argv[i]);
		else
			bad_usage("stats: unknown argument '%s' (--watch "
				  "SECONDS, --count N)",
				  argv[i]);
	}
	return o;
}

static int cmd_stats(struct stats_opts o)
{
	double watch = o.watch;
	uint64_t count = o.count, k;
	struct sample a, b;

	if (watch == 0) {
		char rel[128], *v;
		size_t j;

		for (j = 0; j < NSTATS; j++) {
			snprintf(rel, sizeof(rel), "stats/%s", stat_names[j]);
			v = value_of(rel);
			print_kv(stat_names[j], v);
			free(v);
		}
		print_tiers();
		return 0;
	}
	/* hit rate: prefetched blocks used / blocks the program needed
	   that were not resident (hits + demand faults) */
	printf("%10s %10s %10s %10s %8s %12s\n", "faults/s", "read GB/s",
	       "write GB/s", "hits/s", "hit %", "resident MiB");
	fflush(stdout);
	take(&a);
	for (k = 0; count == 0 || k < count; k++) {
		double dt;
		uint64_t need;
		char hit[16];

		sleep_seconds(watch);
		take(&b);
		dt = b.t - a.t;
		need = (b.hit - a.hit) + (b.demand - a.demand);
		if (need)
			snprintf(hit, sizeof(hit), "%.1f",
				 100.0 * (double)(b.hit - a.hit) /
				     (double)need);
		else
			snprintf(hit, sizeof(hit), "-");
		printf("%10.1f %10.3f %10.3f %10.1f %8s %12.1f\n",
		       (double)(b.faults - a.faults) / dt,
		       (double)(b.read - a.read) / dt / 1e9,
		       (double)(b.written - a.written) / dt / 1e9,
		       (double)(b.hit - a.hit) / dt, hit,
		       (double)b.resident / (1024.0 * 1024.0));
		fflush(stdout);
		a = b;
	}
	return 0;
}

/* The view's current values, as configs to check a load against. */
static void current(struct kvp_config *cfg, struct kvp_kv_config *kv)
{
	struct kvp_tunable_target tg = { .pager = cfg, .kv = kv };
	char rel[128], err[KVP_TUNABLE_ERR_MAX];
	size_t i;

	kvp_tunables_defaults(&tg);
	for (i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		char *s, *v;
		uint64_t x;

		snprintf(rel, sizeof(rel), "tunables/%s", t->name);
		s = value_of(rel);
		v = s;
		if (t->type == KVP_T_CHOICE) {
			/* "a [b] c": the bracketed one */
			char *l = strchr(s, '['), *r = strchr(s, ']');

			if (l && r && r > l) {
				*r = '\0';
				v = l + 1;
			}
		}
		if (kvp_tunable_parse(t, v, &x, err, sizeof(err)) == 0)
			*(uint64_t *)((t->owner == KVP_TUNABLE_PAGER
					   ? (char *)cfg
					   : (char *)kv) +
				      t->offset) = x;
		free(s);
	}
}

/* The lines of @f (opened by main; @name: its name, - for stdin), checked
 * against the pager's values and applied all or nothing. */
static int cmd_load(const char *name, FILE *f)
{
	char err[KVP_TUNABLE_ERR_MAX], *text = NULL;
	struct kvp_config cfg;
	struct kvp_kv_config kv;
	struct kvp_tunable_target tg = { .pager = &cfg, .kv = &kv };
	size_t len = 0, cap = 0, changed;
	int r;

	for (;;) {
		size_t n;

		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 8192;
			text = realloc(text, cap + 1);
			if (!text)
				die("out of memory");
		}
		n = fread(text + len, 1, cap - len, f);
		len += n;
		if (n == 0)
			break;
	}
	if (ferror(f))
		die("cannot read %s: %s", name, strerror(errno));
	if (f != stdin)
		fclose(f);
	text[len] = '\0';
	if (strlen(text) != len)
		die("%s: not a text file (it holds a NUL byte)", name);
	current(&cfg, &kv);
	if (kvp_tunables_apply_lines(&tg, text, KVP_TUNABLES_RUNTIME_ONLY,
				     &changed, err, sizeof(err)))
		die("%s: %s; nothing was changed", name, err);
	r = put("apply", text, len);
	if (r) {
		char *why = last_error();

		die("%s refused by the pager: %s; nothing was changed", name,
		    *why ? why : strerror(-r));
	}
	printf("%s: %zu tunable%s changed\n", name, changed,
	       changed == 1 ? "" : "s");
	free(text);
	return 0;
}

int main(int argc, char **argv)
{
	struct option longopts[sizeof(opts) / sizeof(opts[0])];
	char shorts[3 * sizeof(opts) / sizeof(opts[0]) + 2];
	const char *mount = NULL, *cmd;
	bool all = false;
	pid_t pid = 0;
	int c;

	if (kvp_cli_table_asked(argc, argv)) {
		kvp_cli_cmds_print(stdout, NULL, commands);
		kvp_cli_table_print(stdout, NULL, opts);
		return 0;
	}
	kvp_cli_getopt(opts, "+", longopts, shorts);
	while ((c = getopt_long(argc, argv, shorts, longopts, NULL)) != -1) {
		switch (c) {
		case 'a':
			all = true;
			break;
		case 'p':
			pid = (pid_t)parse_whole("-p", "a process id", optarg,
						 1, INT_MAX);
			break;
		case 'm':
			mount = optarg;
			break;
		case 'n':
			value_only = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	argc -= optind;
	argv += optind;
	cmd = argc ? argv[0] : NULL;
	if (!cmd && !all) {
		if (pid || mount) {
			choose(pid, mount);
			printf("%s\n", mount_path);
			return 0;
		}
		return cmd_ps();
	}
	if (all) {
		if (cmd) {
			fprintf(stderr, "kvpctl: -a takes no command\n");
			return 2;
		}
		choose(pid, mount);
		return cmd_all();
	}
	if (!strcmp(cmd, "list")) {
		/* the docs need no pager; values when one runs */
		struct kvp_instance_entry *e;
		size_t n, i, alive = 0;

		if (argc > 1)
			bad_usage("list takes no argument, not '%s'", argv[1]);

		if (!pid && !mount && !kvp_instance_list(0, &e, &n)) {
			for (i = 0; i < n; i++)
				alive += e[i].alive && e[i].mount[0];
			free(e);
			if (alive != 1)
				return cmd_list(false);
		}
		choose(pid, mount);
		return cmd_list(true);
	}
	if (!strcmp(cmd, "stats")) {
		struct stats_opts so = parse_stats(argc - 1, argv + 1);

		choose(pid, mount);
		return cmd_stats(so);
	}
	/* what the command line gets wrong is said before a pager is
	 * looked for */
	if (!strcmp(cmd, "get")) {
		if (argc < 2)
			bad_usage("get: name a tunable, a statistic or a file "
				  "of the view (kvpctl list, kvpctl -a)");
		choose(pid, mount);
		return cmd_get(argc - 1, argv + 1);
	}
	if (!strcmp(cmd, "set")) {
		size_t len;
		char *text = set_text(argc - 1, argv + 1, &len);

		choose(pid, mount);
		return cmd_set(text, len);
	}
	if (!strcmp(cmd, "load")) {
		FILE *f;

		if (argc != 2)
			bad_usage("load: give one FILE of name = value lines "
				  "(- for stdin)");
		f = strcmp(argv[1], "-") ? fopen(argv[1], "re") : stdin;
		if (!f)
			bad_usage("cannot open %s: %s", argv[1],
				  strerror(errno));
		choose(pid, mount);
		return cmd_load(argv[1], f);
	}
	fprintf(stderr, "kvpctl: unknown command '%s'\n", cmd);
	usage(stderr);
	return 2;
}
