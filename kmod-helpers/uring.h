/*
 * uring.h - io_uring ring set-up (liburing) and opcode probing.
 *
 * The rings themselves are used through liburing by pager/; this file owns
 * only how a ring is created, so that kernel differences (SINGLE_ISSUER,
 * COOP_TASKRUN, registered buffers and files) are absorbed here.
 */
#ifndef KVP_URING_H
#define KVP_URING_H

#include <liburing.h>
#include <stdbool.h>

/* Ring set-up flags. */
#define KVP_URING_SINGLE_ISSUER (1u << 0) /* only one thread submits */

/*
 * kvp_uring_init - io_uring_queue_init_params with @entries SQ entries,
 * asking for the cheapest flags the kernel accepts (SINGLE_ISSUER and
 * COOP_TASKRUN when asked and supported, retried without them on -EINVAL).
 * Returns 0 or -errno; on failure @ring is not initialised.
 */
int kvp_uring_init(struct io_uring *ring, unsigned entries, unsigned flags);

/* kvp_uring_exit - io_uring_queue_exit. */
void kvp_uring_exit(struct io_uring *ring);

/*
 * kvp_uring_supports - whether the kernel implements opcode @op
 * (IORING_OP_READ, _WRITE, _READ_FIXED ...).  False when io_uring itself
 * is missing.
 */
bool kvp_uring_supports(int op);

#endif /* KVP_URING_H */
