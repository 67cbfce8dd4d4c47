/*
 * instance.h - the registry of running pagers, for kvpctl.
 *
 * A process that serves a pager's debug view writes one small file, named
 * by its pid, into the registry folder:
 *
 *   $KVP_RUNTIME_DIR                  if set (tests)
 *   $XDG_RUNTIME_DIR/kvpager          if XDG_RUNTIME_DIR is set
 *   /run/kvpager                      otherwise
 *
 * The file holds `key value` lines: pid, start (the process's start time in
 * clock ticks since boot, /proc/PID/stat field 22, so that a reused pid is
 * not mistaken for the pager), mount (the view's mount point) and comm.
 * Entries of processes that are gone are stale: listing reports them as
 * such and can remove them; their mount points are left for the FUSE view
 * to clean up (kvp_fuse_view_cleanup_stale).
 *
 * The folder must be the user's, mode 0700, and not a symlink: it is
 * opened and checked as lib/view/paths.h says, and created (0700) only in
 * a parent of the user's (so /run/kvpager only for root).  A folder that
 * fails the check is neither written nor read.
 *
 * Calls return 0 or -errno and take no locks.
 *
 * kvp_instance_open (below) is the convenience programs use to start a
 * pager the way kvpctl expects: tunables from the environment, the view
 * mounted at KVP_FUSE_MOUNT, the registry entry written.
 */
#ifndef KVP_INSTANCE_H
#define KVP_INSTANCE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "lib/view/fuse_view.h"
#include "lib/metrics/metrics_http.h"
#include "lib/kv/kv_tunables.h"
#include "pager/pager.h"

struct kvp_instance_entry {
	pid_t pid;		  /* the pager's process */
	bool alive;		  /* false: the process is gone */
	unsigned long long start; /* its start time, in clock ticks */
	char comm[32];		  /* its command name */
	char mount[4096];	  /* its view's mount point (PATH_MAX) */
};

/* kvp_instance_dir - the registry folder (see above) into @buf.
 * 0, or -ENAMETOOLONG. */
int kvp_instance_dir(char *buf, size_t len);

/*
 * kvp_instance_register - record this process as serving a view at @mount
 * (an absolute path).  Replaces an earlier entry of this process.  Written
 * to a temporary file and renamed, so that a reader never sees half an
 * entry.  Returns 0, or -errno with what failed and the remedy in @err
 * (if not NULL): -EINVAL (not an absolute path), the errors of
 * kvp_dir_open_owned (the folder is not the user's, is open to others, is
 * a symlink, or cannot be made), or of writing it; on failure no entry
 * is left.
 */
int kvp_instance_register(const char *mount, char *err, size_t errlen);

/* kvp_instance_unregister - remove this process's entry.  0 (also when
 * there was none) or -errno. */
int kvp_instance_unregister(void);

/* Flags of kvp_instance_list. */
#define KVP_INSTANCE_REMOVE_STALE                                              \
	(1u << 0) /* delete the files of stale
					       entries (still reported) */

/*
 * kvp_instance_list - every entry of the registry, sorted by pid, into a
 * malloc'd array *out of *n entries (NULL and 0 when empty; free with
 * free(3)).  Unreadable or malformed files are skipped.  A missing folder
 * is an empty registry.  Returns 0, or -errno with nothing allocated:
 * -ENOMEM, or the errors of kvp_dir_open_owned (a folder that is not the
 * user's, is open to others or is a symlink is not read).
 */
int kvp_instance_list(unsigned flags, struct kvp_instance_entry **out,
		      size_t *n);

/* kvp_instance_pid_alive - @pid exists and started at @start (0: any). */
bool kvp_instance_pid_alive(pid_t pid, unsigned long long start);

/* ---- a pager from the environment, with its view and registry entry ---- */

struct kvp_instance;

struct kvp_instance_opts {
	const struct kvp_config *cfg;	/* base config; NULL: defaults */
	const struct kvp_kv_config *kv; /* base KV config; NULL: defaults */
	bool no_env;			/* ignore the KVP_<NAME> variables */
	const char *mountpoint;		/* NULL: $KVP_FUSE_MOUNT; "": none */
	kvp_kv_apply_fn kv_apply;	/* the KV layer, if already known */
	void *kv_arg;
	const char *metrics_listen;	/* /metrics over HTTP at this address
					   (lib/metrics/metrics_http.h); NULL:
					   $KVP_METRICS_LISTEN; "": none */
};

/*
 * kvp_instance_open - the convenience programs use: a pager configured
 * from @o's base configs overlaid with the KVP_<NAME> environment variables
 * (kvp_tunables_load_env: all or nothing), and, when a mount point is
 * given (KVP_FUSE_MOUNT by default), its debug view mounted there and this
 * process registered (kvp_instance_register).  Stale registry entries are
 * removed first and their dead mounts cleaned up.  A registration that
 * fails only warns on stderr (kvpctl -m MOUNT still reaches the view).
 * Returns 0 and *out, or -errno with a message in @err (what failed and
 * the remedy) and nothing left behind.  With a metrics address (see
 * kvp_instance_opts), the view's Prometheus text is also served over
 * HTTP; an address that cannot be listened on fails the open.
 */
int kvp_instance_open(const struct kvp_instance_opts *o,
		      struct kvp_instance **out, char *err, size_t errlen);

/* kvp_instance_close - unregister, unmount, close the pager.  Regions
 * still open are closed with it (kvp_pager_close).  Safe with NULL. */
void kvp_instance_close(struct kvp_instance *in);

struct kvp_pager *kvp_instance_pager(const struct kvp_instance *in);
/* The view, or NULL when none was mounted. */
struct kvp_fuse_view *kvp_instance_view(const struct kvp_instance *in);
/* The view's tree (view_tree.h), mounted or not: what the view and
 * /metrics over HTTP show; a program registers its KV layer and tiers
 * with it (kvp_view_set_seqs, _set_cache, _set_remote). */
struct kvp_view *kvp_instance_tree(const struct kvp_instance *in);
/* The view's mount point, or NULL. */
const char *kvp_instance_mount(const struct kvp_instance *in);
/* "http://HOST:PORT/metrics" when metrics are served over HTTP, else NULL. */
const char *kvp_instance_metrics_url(const struct kvp_instance *in);
/* The KV config: from the environment, then as changed through the view. */
void kvp_instance_kv_config(const struct kvp_instance *in,
			    struct kvp_kv_config *out);

#endif /* KVP_INSTANCE_H */
