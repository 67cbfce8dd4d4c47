/*
 * kvpager.h - the public face of kvpager.
 *
 * Compile with: cc prog.c $(pkg-config --cflags --libs kvpager)
 *
 * One umbrella header: the paging engine (regions, stores, prefetch,
 * statistics), the KV layer, the remote tier, the tunables registry, the
 * instance registry and the debug view.  Every function returns 0 or
 * -errno; kvp_strerror() explains the codes.
 */
#ifndef KVPAGER_H
#define KVPAGER_H

#include "pager/pager.h"
#include "lib/tunables/tunables.h"
#include "lib/instance/instance.h"
#include "lib/view/fuse_view.h"
#include "lib/view/prom.h"
#include "lib/kv/kvcache.h"
#include "lib/remote/remote.h"

#endif /* KVPAGER_H */
