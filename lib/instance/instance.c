/*
 * instance.c - the registry of running pagers (one file per pid), and a
 * pager opened from the environment with its view and registry entry.
 */
#include "lib/instance/instance.h"

#include "lib/tunables/tunables.h"
#include "lib/view/paths.h"
#include "lib/view/prom.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
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

int kvp_instance_register(const char *mount, char *err, size_t errlen)
{
	char dir[PATH_MAX], name[32], tmp[48], comm[32];
	unsigned long long start;
	pid_t pid = getpid();
	FILE *f = NULL;
	int dfd, fd, r;

	if (!mount || mount[0] != '/' || strchr(mount, '\n')) {
		kvp_seterr(err, errlen, "'%s' is not an absolute path",
			   mount ? mount : "(null)");
		return -EINVAL;
	}
	r = kvp_instance_dir(dir, sizeof(dir));
	if (r) {
		kvp_seterr(err, errlen, "the registry's path is too long");
		return r;
	}
	dfd = kvp_dir_open_owned(dir, KVP_DIR_CREATE | KVP_DIR_PRIVATE, err,
				 errlen);
	if (dfd < 0)
		return dfd;
	start = proc_start(pid, comm, sizeof(comm));
	snprintf(name, sizeof(name), "%d", (int)pid);
	snprintf(tmp, sizeof(tmp), ".%d.tmp", (int)pid);
	fd =
	    openat(dfd, tmp,
		   O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || !(f = fdopen(fd, "w"))) {
		r = -errno;
		if (fd >= 0)
			close(fd);
		goto fail;
	}
	fprintf(f, "pid %d\nstart %llu\nmount %s\ncomm %s\n", (int)pid, start,
		mount, comm);
	if (fflush(f) || ferror(f)) {
		r = errno ? -errno : -EIO;
		fclose(f);
		goto fail;
	}
	if (fclose(f)) {
		r = -errno;
		goto fail;
	}
	if (renameat(dfd, tmp, dfd, name)) {
		r = -errno;
		goto fail;
	}
	close(dfd);
	return 0;
fail:
	kvp_seterr(err, errlen, "cannot write %s/%s: %s", dir, name,
		   strerror(-r));
	unlinkat(dfd, tmp, 0);
	close(dfd);
	return r;
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
	int fd, r;

	*out = NULL;
	*n = 0;
	r = kvp_instance_dir(dir, sizeof(dir));
	if (r)
		return r;
	fd = kvp_dir_open_owned(dir, KVP_DIR_PRIVATE, NULL, 0);
	if (fd < 0)
		return fd == -ENOENT ? 0 : fd;
	d = fdopendir(fd);
	if (!d) {
		r = -errno;
		close(fd);
		return r;
	}
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

/* ---- a pager from the environment ---- */

struct kvp_instance {
	struct kvp_pager *pager;
	struct kvp_fuse_view *view; /* NULL: no mount */
	struct kvp_view *tree;	    /* the view's tree, or one of our own */
	bool own_tree;		    /* tree is ours (no mount) */
	struct kvp_kv_config kv;    /* the KV config at open */
	bool registered;
	struct kvp_metrics_http *metrics; /* NULL: not served over HTTP */
};

/* Registry entries of dead processes: remove them and their mounts. */
static void prune_stale(void)
{
	struct kvp_instance_entry *e;
	size_t n, i;

	if (kvp_instance_list(KVP_INSTANCE_REMOVE_STALE, &e, &n))
		return;
	for (i = 0; i < n; i++)
		if (!e[i].alive && e[i].mount[0])
			kvp_fuse_view_cleanup_stale(e[i].mount);
	free(e);
}

/* A scrape: the text the view's metrics file shows (the tiers that
 * registered with the tree included), mounted or not. */
static int render_metrics(void *arg, char **buf, size_t *len)
{
	struct kvp_instance *in = arg;

	return kvp_view_read(in->tree, "metrics", buf, len);
}

int kvp_instance_open(const struct kvp_instance_opts *o,
		      struct kvp_instance **out, char *err, size_t errlen)
{
	static const struct kvp_instance_opts none;
	struct kvp_fuse_view_opts vo = { 0 };
	struct kvp_config cfg;
	struct kvp_tunable_target tg = { .pager = &cfg };
	struct kvp_instance *in;
	const char *mnt, *addr;
	int r;

	*out = NULL;
	if (!o)
		o = &none;
	in = calloc(1, sizeof(*in));
	if (!in) {
		kvp_seterr(err, errlen, "cannot open a pager: out of memory");
		return -ENOMEM;
	}
	tg.kv = &in->kv;
	if (o->cfg)
		cfg = *o->cfg;
	else
		kvp_config_defaults(&cfg);
	if (o->kv)
		in->kv = *o->kv;
	else
		kvp_kv_config_defaults(&in->kv);
	if (!o->no_env) {
		r = kvp_tunables_load_env(&tg, err, errlen);
		if (r)
			goto err_free;
	}
	r = kvp_tunables_check(&tg, err, errlen);
	if (r)
		goto err_free;
	prune_stale();
	r = kvp_pager_open(&cfg, &in->pager);
	if (r) {
		kvp_seterr(err, errlen, "cannot open the pager: %s",
			   kvp_strerror(r));
		goto err_free;
	}
	mnt = o->mountpoint ? o->mountpoint : getenv("KVP_FUSE_MOUNT");
	if (mnt && *mnt) {
		char why[KVP_TUNABLE_ERR_MAX];

		vo.mountpoint = mnt;
		vo.kv = &in->kv;
		vo.kv_apply = o->kv_apply;
		vo.kv_arg = o->kv_arg;
		r = kvp_fuse_view_mount(in->pager, &vo, &in->view, why,
					sizeof(why));
		if (r) {
			kvp_seterr(err, errlen,
				   "cannot mount the debug view: %s (or unset "
				   "KVP_FUSE_MOUNT to run without the view)",
				   why);
			goto err_pager;
		}
		in->tree = kvp_fuse_view_tree(in->view);
		r = kvp_instance_register(kvp_fuse_view_path(in->view), why,
					  sizeof(why));
		if (r) {
			fprintf(stderr,
				"kvpager: cannot register for kvpctl: %s; use "
				"kvpctl -m %s\n",
				why, kvp_fuse_view_path(in->view));
		} else {
			in->registered = true;
		}
	}
	if (!in->view) {
		r = kvp_view_create(in->pager, &in->kv, o->kv_apply, o->kv_arg,
				    &in->tree);
		if (r) {
			kvp_seterr(err, errlen,
				   "cannot open a pager: out of memory");
			goto err_pager;
		}
		in->own_tree = true;
	}
	addr = o->metrics_listen ? o->metrics_listen
				 : getenv("KVP_METRICS_LISTEN");
	/* after the view: a scrape reads the view's KV config */
	if (addr && *addr) {
		char why[KVP_TUNABLE_ERR_MAX];

		r = kvp_metrics_http_start(addr, render_metrics, in,
					   &in->metrics, why, sizeof(why));
		if (r) {
			kvp_seterr(err, errlen, "%s", why);
			goto err_view;
		}
	}
	*out = in;
	return 0;

err_view:
	if (in->registered)
		kvp_instance_unregister();
	kvp_fuse_view_unmount(in->view);
	if (in->own_tree)
		kvp_view_destroy(in->tree);
err_pager:
	kvp_pager_close(in->pager);
err_free:
	free(in);
	return r;
}

void kvp_instance_close(struct kvp_instance *in)
{
	if (!in)
		return;
	if (in->registered)
		kvp_instance_unregister();
	/* before the view: a scrape reads the view's KV config */
	kvp_metrics_http_stop(in->metrics);
	kvp_fuse_view_unmount(in->view);
	if (in->own_tree)
		kvp_view_destroy(in->tree);
	kvp_pager_close(in->pager);
	free(in);
}

struct kvp_pager *kvp_instance_pager(const struct kvp_instance *in)
{
	return in->pager;
}

struct kvp_fuse_view *kvp_instance_view(const struct kvp_instance *in)
{
	return in->view;
}

struct kvp_view *kvp_instance_tree(const struct kvp_instance *in)
{
	return in->tree;
}

const char *kvp_instance_mount(const struct kvp_instance *in)
{
	return in->view ? kvp_fuse_view_path(in->view) : NULL;
}

const char *kvp_instance_metrics_url(const struct kvp_instance *in)
{
	return in->metrics ? kvp_metrics_http_url(in->metrics) : NULL;
}

void kvp_instance_kv_config(const struct kvp_instance *in,
			    struct kvp_kv_config *out)
{
	kvp_view_kv_config(in->tree, out);
}
