/*
 * fdset.h - the descriptors the engine owns, process-wide.
 *
 * The engine notes each descriptor it keeps open (the userfaultfd, the
 * stores' files, rings and eventfds, /proc/self/maps and mem) so that the
 * preload shim's close hooks can refuse to close them for a program that
 * closes every descriptor it did not open itself (a daemon's close loop,
 * closefrom(3)): without its userfaultfd a region reads as zeros, and a
 * store's number would be reused by the program's next file.
 *
 * Descriptors from KVP_FDSET_MAX up are not noted.  A bit stays set after
 * the engine closes its descriptor until kvp_fd_disown: the shim clears it
 * in its close hook, the only reader of the set.
 */
#ifndef KVP_FDSET_H
#define KVP_FDSET_H

#include <stdbool.h>

#define KVP_FDSET_MAX 65536

/* Note @fd as the engine's (ignored when negative or too large). */
void kvp_fd_own(int fd);
void kvp_fd_disown(int fd);
bool kvp_fd_owned(int fd);
/* Disown @fd, then close(2) it: the engine's close of a noted one. */
int kvp_fd_close(int fd);

#endif
