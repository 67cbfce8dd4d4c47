/*
 * test_instance.c - lib/instance/instance.c: the registry of running pagers.
 *
 * Each test points KVP_RUNTIME_DIR at a fresh folder: register, list,
 * unregister, stale entries of dead processes and of reused pids, junk.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/instance/instance.h"
#include "tests/helpers/helpers.h"

static char dir[64];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/kvp-inst-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	strcat(dir, "/reg"); /* made by register */
	setenv("KVP_RUNTIME_DIR", dir, 1);
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%.*s'", (int)strlen(dir) - 4, dir);
	if (system(cmd))
		fprintf(stderr, "cleanup of %s failed\n", dir);
}

static void write_file(const char *name, const char *text)
{
	char path[256];
	FILE *f;

	mkdir(dir, 0700);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static pid_t dead_pid(void)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(0);
	waitpid(pid, NULL, 0);
	return pid;
}

START_TEST(dir_choice)
{
	char buf[256];

	ck_assert_int_eq(kvp_instance_dir(buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, dir);
	unsetenv("KVP_RUNTIME_DIR");
	setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
	ck_assert_int_eq(kvp_instance_dir(buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/run/user/4242/kvpager");
	unsetenv("XDG_RUNTIME_DIR");
	ck_assert_int_eq(kvp_instance_dir(buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/run/kvpager");
	ck_assert_int_eq(kvp_instance_dir(buf, 4), -ENAMETOOLONG);
}
END_TEST

START_TEST(register_list_unregister)
{
	struct kvp_instance_entry *e;
	struct stat st;
	size_t n;

	ck_assert_int_eq(kvp_instance_list(0, &e, &n), 0); /* no folder yet */
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(e);
	ck_assert_int_eq(kvp_instance_register("relative/path", NULL, 0),
			 -EINVAL);
	ck_assert_int_eq(kvp_instance_register("/mnt/kvp-a", NULL, 0), 0);
	ck_assert_int_eq(stat(dir, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0700);
	ck_assert_int_eq(kvp_instance_register("/mnt/kvp-b", NULL, 0),
			 0); /* replaces */
	ck_assert_int_eq(kvp_instance_list(0, &e, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(e[0].pid, getpid());
	ck_assert(e[0].alive);
	ck_assert_uint_gt(e[0].start, 0);
	ck_assert_str_eq(e[0].mount, "/mnt/kvp-b");
	ck_assert_str_eq(e[0].comm, "test_instance");
	free(e);
	ck_assert_int_eq(kvp_instance_unregister(), 0);
	ck_assert_int_eq(kvp_instance_unregister(), 0);
	ck_assert_int_eq(kvp_instance_list(0, &e, &n), 0);
	ck_assert_uint_eq(n, 0);
}
END_TEST

START_TEST(stale_entries)
{
	struct kvp_instance_entry *e;
	char name[32], text[256];
	pid_t dead = dead_pid();
	size_t n;

	snprintf(name, sizeof(name), "%d", (int)dead);
	snprintf(text, sizeof(text), "pid %d\nstart 1\nmount /mnt/dead\n",
		 (int)dead);
	write_file(name, text);
	/* pid 1 is alive but did not start at tick 7: a reused pid */
	write_file("1", "pid 1\nstart 7\nmount /mnt/reused\n");
	/* junk is skipped */
	write_file("notapid", "pid 5\n");
	write_file("12", "no pid line\n");
	write_file("13", "pid 14\n"); /* name and content disagree */
	ck_assert_int_eq(kvp_instance_register("/mnt/me", NULL, 0), 0);

	ck_assert_int_eq(kvp_instance_list(0, &e, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_int_eq(e[0].pid, 1); /* sorted */
	ck_assert(!e[0].alive);
	ck_assert_str_eq(e[0].mount, "/mnt/reused");
	ck_assert(e[1].pid == dead || e[2].pid == dead);
	free(e);

	ck_assert_int_eq(kvp_instance_list(KVP_INSTANCE_REMOVE_STALE, &e, &n),
			 0);
	ck_assert_uint_eq(n, 3); /* still reported, once */
	free(e);
	ck_assert_int_eq(kvp_instance_list(0, &e, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(e[0].pid, getpid());
	ck_assert(e[0].alive);
	free(e);
	ck_assert(!kvp_instance_pid_alive(dead, 0));
	ck_assert(kvp_instance_pid_alive(getpid(), 0));
	ck_assert(!kvp_instance_pid_alive(0, 0));
}
END_TEST

/* KVP_RUNTIME_DIR at @rel under the test's folder; register's result. */
static int register_at(const char *rel, char *err, size_t len)
{
	char path[160];

	snprintf(path, sizeof(path), "%.*s/%s", (int)strlen(dir) - 4, dir, rel);
	setenv("KVP_RUNTIME_DIR", path, 1);
	return kvp_instance_register("/mnt/x", err, len);
}

/* A folder of the test's, made with @mode and given to @uid. */
static void make_dir(const char *rel, mode_t mode, uid_t uid)
{
	char path[160];

	snprintf(path, sizeof(path), "%.*s/%s", (int)strlen(dir) - 4, dir, rel);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_int_eq(chmod(path, mode), 0);
	ck_assert_int_eq(chown(path, uid, uid), 0);
}

static bool exists(const char *rel)
{
	char path[160];
	struct stat st;

	snprintf(path, sizeof(path), "%.*s/%s", (int)strlen(dir) - 4, dir, rel);
	return lstat(path, &st) == 0;
}

/*
 * The registry's folder is opened, never followed, and must be ours and
 * closed to others.  Before, a symlink planted by another uid was
 * followed and written through, and a missing path was made with all
 * its parents.
 */
START_TEST(hostile_runtime_dirs)
{
	struct kvp_instance_entry *e;
	char err[512], target[160], link[160];
	struct stat st;
	size_t n;

	if (geteuid() != 0) { /* planting as another uid needs chown */
		printf("hostile_runtime_dirs: not run: needs root\n");
		return;
	}
	make_dir("target", 0700, getuid());
	snprintf(target, sizeof(target), "%.*s/target", (int)strlen(dir) - 4,
		 dir);
	snprintf(link, sizeof(link), "%.*s/link", (int)strlen(dir) - 4, dir);
	ck_assert_int_eq(symlink(target, link), 0);
	ck_assert_int_eq(lchown(link, 65534, 65534), 0);
	ck_assert_int_eq(register_at("link", err, sizeof(err)), -ELOOP);
	ck_assert_msg(strstr(err, "symbolic link") != NULL, "%s", err);
	ck_assert_int_eq(kvp_instance_list(0, &e, &n), -ELOOP);
	{
		char p[200];

		snprintf(p, sizeof(p), "%s/%d", target, (int)getpid());
		ck_assert_int_eq(stat(p, &st), -1);
	}

	make_dir("theirs", 0700, 65534);
	ck_assert_int_eq(register_at("theirs", err, sizeof(err)), -EPERM);
	ck_assert_msg(strstr(err, "belongs to uid 65534") != NULL, "%s", err);
	ck_assert_int_eq(register_at("theirs/reg", err, sizeof(err)), -EPERM);
	ck_assert_msg(strstr(err, "will not create") != NULL, "%s", err);
	ck_assert(!exists("theirs/reg"));

	make_dir("wide", 0755, getuid());
	ck_assert_int_eq(register_at("wide", err, sizeof(err)), -EPERM);
	ck_assert_msg(strstr(err, "open to others (mode 0755)") != NULL, "%s",
		      err);

	ck_assert_int_eq(register_at("none/reg", err, sizeof(err)), -ENOENT);
	ck_assert(!exists("none"));

	ck_assert_int_eq(register_at("mine", err, sizeof(err)), 0);
	ck_assert_int_eq(kvp_instance_list(0, &e, &n), 0);
	ck_assert_uint_eq(n, 1);
	free(e);
	ck_assert_int_eq(kvp_instance_unregister(), 0);
}
END_TEST

/* Tunables from the environment, all or nothing; no mount unless asked. */
START_TEST(open_from_env)
{
	struct kvp_instance_opts o = { 0 };
	struct kvp_instance *in = (struct kvp_instance *)1;
	char err[512];
	struct kvp_config cfg;
	struct kvp_kv_config kv;
	int r;

	unsetenv("KVP_FUSE_MOUNT");
	setenv("KVP_RAM_BUDGET_BYTES", "8M", 1);
	setenv("KVP_PREFETCH_DEPTH_LAYERS", "3", 1);
	setenv("KVP_IO_DEPTH", "0", 1);
	ck_assert_int_eq(kvp_instance_open(&o, &in, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(in);
	ck_assert_msg(strstr(err, "KVP_IO_DEPTH=0") != NULL, "%s", err);
	unsetenv("KVP_IO_DEPTH");
	r = kvp_instance_open(&o, &in, err, sizeof(err));
	if (r == -EPERM) /* no userfaultfd here: the rest needs a pager */
		return;
	ck_assert_msg(r == 0, "%s", err);
	kvp_pager_config(kvp_instance_pager(in), &cfg);
	ck_assert_uint_eq(cfg.ram_budget_bytes, 8u << 20);
	kvp_instance_kv_config(in, &kv);
	ck_assert_uint_eq(kv.prefetch_depth_layers, 3);
	ck_assert_ptr_null(kvp_instance_view(in));
	ck_assert_ptr_null(kvp_instance_mount(in));
	kvp_instance_close(in);
	/* no_env: the variables are not read */
	o.no_env = true;
	setenv("KVP_IO_DEPTH", "0", 1);
	ck_assert_int_eq(kvp_instance_open(&o, &in, err, sizeof(err)), 0);
	kvp_pager_config(kvp_instance_pager(in), &cfg);
	ck_assert_uint_eq(cfg.ram_budget_bytes, 1ULL << 30);
	kvp_instance_close(in);
	kvp_instance_close(NULL);
}
END_TEST

static Suite *instance_suite(void)
{
	Suite *s = suite_create("instance");
	TCase *tc = kvp_test_tcase(s, "registry", 30);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, dir_choice);
	tcase_add_test(tc, register_list_unregister);
	tcase_add_test(tc, stale_entries);
	tcase_add_test(tc, hostile_runtime_dirs);
	tcase_add_test(tc, open_from_env);
	return s;
}

int main(void)
{
	return kvp_test_run(instance_suite());
}
