/*
 * uring.c - io_uring ring set-up; the contract is in uring.h.
 */
#include "kmod-helpers/uring.h"
#include "kmod-helpers/fdset.h"

#include <errno.h>
#include <string.h>

int kvp_uring_init(struct io_uring *ring, unsigned entries, unsigned flags)
{
	struct io_uring_params p;
	unsigned want[3];
	unsigned n = 0, i;
	int err = -EINVAL;

	if (!ring || !entries)
		return -EINVAL;
	/*
	 * Cheapest first.  COOP_TASKRUN (5.19) spares an IPI per completion;
	 * a task sleeping in poll(2) is still woken to run the completion,
	 * so an eventfd registered on the ring keeps working.  SINGLE_ISSUER
	 * (6.0) is only asked for: it ties the ring to the creating task.
	 * DEFER_TASKRUN is never used: it would post completions (and signal
	 * an eventfd) only when the owner enters io_uring_enter(2).
	 */
	if (flags & KVP_URING_SINGLE_ISSUER)
		want[n++] =
		    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER;
	want[n++] = IORING_SETUP_COOP_TASKRUN;
	want[n++] = 0;
	for (i = 0; i < n; i++) {
		memset(&p, 0, sizeof(p));
		p.flags = want[i];
		err = io_uring_queue_init_params(entries, ring, &p);
		if (err != -EINVAL)
			break;
	}
	if (err)
		return err;
	/* liburing keeps the number in these two (no registered ring fd) */
	ring->ring_fd = ring->enter_ring_fd = kvp_fd_own(ring->ring_fd);
	if (ring->ring_fd < 0) {
		err = ring->ring_fd; /* closed: the exit's close(-errno) fails */
		io_uring_queue_exit(ring);
	}
	return err;
}

void kvp_uring_exit(struct io_uring *ring)
{
	kvp_fd_disown(ring->ring_fd); /* liburing closes it by syscall */
	io_uring_queue_exit(ring);
}

bool kvp_uring_supports(int op)
{
	struct io_uring_probe *probe;
	bool yes;

	probe = io_uring_get_probe();
	if (!probe)
		return false;
	yes = op >= 0 && io_uring_opcode_supported(probe, op);
	io_uring_free_probe(probe);
	return yes;
}
