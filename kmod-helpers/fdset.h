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
 * Any number can be noted: the set grows by ranges (a bit per number up to
 * the highest noted, at most fd / 4 bytes), never shrinks, and is read
 * without a lock.  A bit stays set after the engine closes its descriptor
 * until kvp_fd_disown: the shim clears it in its close hook, the only
 * reader of the set.
 */
#ifndef KVP_FDSET_H
#define KVP_FDSET_H

#include <stdbool.h>

/*
 * kvp_fd_own - take @fd, just made by the engine and kept open, as the
 * engine's: moved to a number of 3 or more if it got 0, 1 or 2 (a program
 * started with its standard descriptors closed must get its own there, not
 * write its output into the engine's), then noted.  Returns the number to
 * use from now on, or -errno with @fd closed.  A negative @fd (the error of
 * the call that made it) is returned as it is.
 */
int kvp_fd_own(int fd);
/*
 * kvp_fd_note - note @fd as the engine's where a library keeps the number
 * (it cannot be moved: libfuse's, which makes 0, 1 and 2 /dev/null before
 * it opens /dev/fuse; libmicrohttpd's, made under kvp_fd_hold_std).  0,
 * -EBADF for a negative @fd, or -ENOMEM.
 */
int kvp_fd_note(int fd);
/*
 * kvp_fd_hold_std - take those of 0, 1 and 2 that are closed (eventfds),
 * while a library makes descriptors it keeps the numbers of: theirs are
 * then 3 and up, as kvp_fd_own's.  Returns which were taken, for
 * kvp_fd_release_std to close.
 */
unsigned kvp_fd_hold_std(void);
void kvp_fd_release_std(unsigned held);
void kvp_fd_disown(int fd);
bool kvp_fd_owned(int fd);
/* The lowest noted descriptor from @from up, or -1 when there is none. */
int kvp_fd_next_owned(unsigned from);
/* Disown @fd, then close(2) it: the engine's close of a noted one. */
int kvp_fd_close(int fd);

#endif
