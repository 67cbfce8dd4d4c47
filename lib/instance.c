/*
 * instance.c - the registry of running pagers (one file per pid).
 */
#include "lib/instance.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kvp_instance_dir(char *buf, size_t len)
{
	const char *d = getenv("KVP_RUNTIME_DIR");
	int n;

	if (d && *d)
		n = snprintf(buf, len, "%s", d);
	else if ((d = getenv("XDG_RUNTIME_DIR")) && *d)
		n = snprintf(buf, len, "%s/kvpager", d);
	else
		n = snprintf(buf, len, "/run/kvpager");
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* mkdir -p of @path, the last level 0700. */
static int make_dir(const char *path)
{
	char tmp[PATH_MAX];
	size_t i, n = strlen(path);

	if (n >= sizeof(tmp))
		return -ENAMETOOLONG;
	memcpy(tmp, path, n + 1);
	for (i = 1; i < n; i++) {
		if (tmp[i] != '/')
			continue;
		tmp[i] = '\0';
		if (mkdir(tmp, 0755) && errno != EEXIST)
			return -errno;
		tmp[i] = '/';
	}
	if (mkdir(tmp, 0700) && errno != EEXIST)
		return -errno;
	return 0;
}

/* Field 22 of /proc/@pid/stat, 0 if unreadable. */
static unsigned long long proc_start(pid_t pid, char *comm, size_t commlen)
{
	char path[64], buf[1024], *p, *q;
	unsigned long long start = 0;
	ssize_t n;
	int fd, field;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* comm is in parentheses and may hold spaces: skip to the last ')' */
	p = strchr(buf, '(');
	q = strrchr(buf, ')');
	if (!p || !q || q < p)
		return 0;
	if (comm && commlen) {
		size_t len = (size_t)(q - p - 1);

		if (len >= commlen)
			len = commlen - 1;
		memcpy(comm, p + 1, len);
		comm[len] = '\0';
	}
	p = q + 2; /* field 3, the state */
	for (field = 3; field < 22 && p; field++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	if (p)
		start = strtoull(p, NULL, 10);
	return start;
}

bool kvp_instance_pid_alive(pid_t pid, unsigned long long start)
{
	if (pid <= 0)
		return false;
	if (kill(pid, 0) && errno == ESRCH)
		return false;
	if (start && proc_start(pid, NULL, 0) != start)
		return false;
	return true;
}

int kvp_instance_register(const char *mount)
{
	char dir[PATH_MAX], path[PATH_MAX + 32], tmp[PATH_MAX + 32], comm[32];
	unsigned long long start;
	pid_t pid = getpid();
	FILE *f;
	int r;

	if (!mount || mount[0] != '/' || strchr(mount, '\n'))
		return -EINVAL;
	r = kvp_instance_dir(dir, sizeof(dir));
	if (r)
		return r;
	r = make_dir(dir);
	if (r)
		return r;
	start = proc_start(pid, comm, sizeof(comm));
	snprintf(path, sizeof(path), "%s/%d", dir, (int)pid);
	snprintf(tmp, sizeof(tmp), "%s/.%d.tmp", dir, (int)pid);
	f = fopen(tmp, "we");
	if (!f)
		return -errno;
	fprintf(f, "pid %d\nstart %llu\nmount %s\ncomm %s\n", (int)pid, start,
		mount, comm);
	if (fflush(f) || ferror(f)) {
		r = errno ? -errno : -EIO;
		fclose(f);
		unlink(tmp);
		return r;
	}
	if (fclose(f)) {
		r = -errno;
		unlink(tmp);
		return r;
	}
	if (rename(tmp, path)) {
		r = -errno;
		unlink(tmp);
		return r;
	}
	return 0;
}

int kvp_instance_unregister(void)
{
	char dir[PATH_MAX], path[PATH_MAX + 32];
	int r = kvp_instance_dir(dir, sizeof(dir));

	if (r)
		return r;
	snprintf(path, sizeof(path), "%s/%d", dir, (int)getpid());
	if (unlink(path) && errno != ENOENT)
		return -errno;
	return 0;
}

/* @src into @dst of @len, truncated. */
static void copy_str(char *dst, size_t len, const char *src)
{
	size_t n = strlen(src);

	if (n >= len)
		n = len - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
}

static bool read_entry(const char *path, struct kvp_instance_entry *e)
{
	char line[PATH_MAX + 16];
	bool have_pid = false;
	FILE *f = fopen(path, "re");

	if (!f)
		return false;
	memset(e, 0, sizeof(*e));
	while (fgets(line, sizeof(line), f)) {
		size_t n = strlen(line);

		if (n && line[n - 1] == '\n')
			line[--n] = '\0';
		if (!strncmp(line, "pid ", 4)) {
			e->pid = (pid_t)atoi(line + 4);
			have_pid = e->pid > 0;
		} else if (!strncmp(line, "start ", 6)) {
			e->start = strtoull(line + 6, NULL, 10);
		} else if (!strncmp(line, "mount ", 6)) {
			copy_str(e->mount, sizeof(e->mount), line + 6);
		} else if (!strncmp(line, "comm ", 5)) {
			copy_str(e->comm, sizeof(e->comm), line + 5);
		}
	}
	fclose(f);
	return have_pid;
}

static int by_pid(const void *a, const void *b)
{
	const struct kvp_instance_entry *x = a, *y = b;

	return (x->pid > y->pid) - (x->pid < y->pid);
}

int kvp_instance_list(unsigned flags, struct kvp_instance_entry **out,
		      size_t *n)
{
	struct kvp_instance_entry *v = NULL, *nv;
	char dir[PATH_MAX], path[PATH_MAX + 300];
	size_t cnt = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int r;

	*out = NULL;
	*n = 0;
	r = kvp_instance_dir(dir, sizeof(dir));
	if (r)
		return r;
	d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	while ((de = readdir(d))) {
		struct kvp_instance_entry e;
		const char *c;

		for (c = de->d_name; isdigit((unsigned char)*c); c++)
			;
		if (c == de->d_name || *c)
			continue; /* not a pid: ".", "..", temporaries */
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (!read_entry(path, &e) || e.pid != atoi(de->d_name))
			continue;
		e.alive = kvp_instance_pid_alive(e.pid, e.start);
		if (!e.alive && (flags & KVP_INSTANCE_REMOVE_STALE))
			unlink(path);
		if (cnt == cap) {
			cap = cap ? cap * 2 : 8;
			nv = realloc(v, cap * sizeof(*v));
			if (!nv) {
				free(v);
				closedir(d);
				return -ENOMEM;
			}
			v = nv;
		}
		v[cnt++] = e;
	}
	closedir(d);
	if (cnt)
		qsort(v, cnt, sizeof(*v), by_pid);
	*out = v;
	*n = cnt;
	return 0;
}
