/*
 * paths.h - small file-system helpers shared by the debug view and the
 * instance registry.
 */
#ifndef KVP_PATHS_H
#define KVP_PATHS_H

/* kvp_mkdir_p - mkdir -p @path: parents 0755, the last level 0700.
 * Returns 0 (also when it exists) or -errno (-ENAMETOOLONG). */
int kvp_mkdir_p(const char *path);

#endif /* KVP_PATHS_H */
