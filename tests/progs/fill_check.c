/*
 * fill_check - fill and check large buffers, knowing nothing of kvpager.
 *
 * Built without kvpager (plain libc) and run under LD_PRELOAD by
 * tests/t_preload.sh, so that every allocation below is what any program
 * would do.  Usage:
 *
 *   fill_check SIZE [TEST...]      SIZE in bytes, suffix K M G allowed
 *
 * TESTs: malloc realloc calloc align mmap dontneed mremap threads (the
 * default: all of these), fork, closefds, closefrom, stdclosed and signals.
 * Each prints "ok NAME" or "FAIL NAME: why"; the last lines are "vm
 * VmHWM_kB=N VmRSS_kB=N" from /proc/self/status and "fill_check: all ok"
 * (exit 0) or "fill_check: N failed" (exit 1).
 *
 * fork: the parent fills a buffer and forks twice.  Child "touch" reads the
 * buffer and reports; child "own" does not touch it, makes and checks a
 * buffer of its own and frees the inherited one.  Prints "fork touch:
 * exit N" or "fork touch: signal N", the same for "own", and checks the
 * parent's buffer afterwards.  A child that has not finished in 60 s is
 * killed and counts as failed (a hang).
 *
 * closefds: fills a buffer, closes every descriptor from 3 up as a daemon
 * does (a close loop, then close_range), checks the buffer, says how many
 * listening sockets are left open (the engine's /metrics listener) and
 * how many of them answer a scrape, then opens and closes files of its own
 * (the numbers the program owns must still close).
 *
 * closefrom: fills a buffer and opens files up to a lowered RLIMIT_NOFILE,
 * then refuses close_range(2) with ENOSYS (a seccomp filter, as before
 * Linux 5.9 or in a container) and calls closefrom(3): the program's files
 * must be closed (glibc closes one, then those listed in /proc/self/fd),
 * the buffer intact.
 *
 * stdclosed: as a program a daemon started with 0, 1 and 2 closed: makes
 * its first large allocation with them closed (stdout kept at 100 for the
 * report), fills and checks it, then opens /dev/null three times, which
 * must give 0, 1 and 2 (not the numbers after the engine's), and closes
 * them.  Run it first: the engine must start inside it.
 *
 * signals: a timer's handler (every 1 ms) reads a page of the buffer while
 * the program rewrites it: a handler that takes longer than the period
 * leaves the next signal to another thread, the pager's too if they let
 * it (all of them in the handler, faulting: a hang).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static size_t S;   /* the buffer size asked for */
static int failed; /* tests failed */

static uint64_t pat(size_t i, uint64_t seed)
{
	return (i * 0x9E3779B97F4A7C15ull) ^ seed;
}

static void fill(void *buf, size_t off, size_t len, uint64_t seed)
{
	uint64_t *w = buf;

	for (size_t i = off / 8; i < (off + len) / 8; i++)
		w[i] = pat(i, seed);
}

/* Index of the first wrong word in [off, off+len), or SIZE_MAX. */
static size_t check(const void *buf, size_t off, size_t len, uint64_t seed)
{
	const uint64_t *w = buf;

	for (size_t i = off / 8; i < (off + len) / 8; i++)
		if (w[i] != pat(i, seed))
			return i * 8;
	return SIZE_MAX;
}

static size_t check_zero(const void *buf, size_t off, size_t len)
{
	const uint64_t *w = buf;

	for (size_t i = off / 8; i < (off + len) / 8; i++)
		if (w[i])
			return i * 8;
	return SIZE_MAX;
}

static void result(const char *name, const char *why, size_t at)
{
	if (!why) {
		printf("ok %s\n", name);
	} else {
		failed++;
		if (at != SIZE_MAX)
			printf("FAIL %s: %s at byte %zu\n", name, why, at);
		else
			printf("FAIL %s: %s\n", name, why);
	}
	fflush(stdout);
}

#define EXPECT(name, cond, why)                                                \
	do {                                                                   \
		if (!(cond)) {                                                 \
			result(name, why, SIZE_MAX);                           \
			return;                                                \
		}                                                              \
	} while (0)
#define EXPECT_AT(name, at, why)                                               \
	do {                                                                   \
		size_t at_ = (at);                                             \
		if (at_ != SIZE_MAX) {                                         \
			result(name, why, at_);                                \
			return;                                                \
		}                                                              \
	} while (0)

static void t_malloc(void)
{
	char *p = malloc(S);

	EXPECT("malloc", p, "malloc failed");
	fill(p, 0, S, 1);
	EXPECT_AT("malloc", check(p, 0, S, 1), "pattern lost");
	/* A second pass: every block comes back from the store once. */
	EXPECT_AT("malloc", check(p, 0, S, 1), "pattern lost on re-read");
	free(p);
	result("malloc", NULL, 0);
}

static void t_realloc(void)
{
	size_t big = S + S / 4, small = S / 2;
	char *p = malloc(S), *q;

	EXPECT("realloc", p, "malloc failed");
	fill(p, 0, S, 2);
	q = realloc(p, big);
	EXPECT("realloc", q, "growing failed");
	EXPECT_AT("realloc", check(q, 0, S, 2), "contents lost growing");
	fill(q, S, big - S, 2);
	EXPECT_AT("realloc", check(q, 0, big, 2), "grown tail lost");
	p = realloc(q, small);
	EXPECT("realloc", p, "shrinking failed");
	EXPECT_AT("realloc", check(p, 0, small, 2), "contents lost shrinking");
	q = realloc(p, 4096); /* below any threshold: back to the heap */
	EXPECT("realloc", q, "shrinking to 4 KiB failed");
	EXPECT_AT("realloc", check(q, 0, 4096, 2), "contents lost to 4 KiB");
	p = realloc(q, S); /* and up again */
	EXPECT("realloc", p, "growing from 4 KiB failed");
	EXPECT_AT("realloc", check(p, 0, 4096, 2), "contents lost from 4 KiB");
	free(p);
	result("realloc", NULL, 0);
}

static void t_calloc(void)
{
	char *p = calloc(S / 8, 8);

	EXPECT("calloc", p, "calloc failed");
	EXPECT_AT("calloc", check_zero(p, 0, S), "not zero");
	fill(p, 0, S, 3);
	EXPECT_AT("calloc", check(p, 0, S, 3), "pattern lost");
	free(p);
	/* The same address may come back: it must be zeros again. */
	p = calloc(1, S);
	EXPECT("calloc", p, "second calloc failed");
	EXPECT_AT("calloc", check_zero(p, 0, S), "second calloc not zero");
	free(p);
	result("calloc", NULL, 0);
}

static void t_align(void)
{
	void *p = NULL, *q;

	EXPECT("align", !posix_memalign(&p, 2u << 20, S / 2),
	       "posix_memalign failed");
	EXPECT("align", !((uintptr_t)p & ((2u << 20) - 1)),
	       "posix_memalign misaligned");
	q = aligned_alloc(4096, S / 2);
	EXPECT("align", q && !((uintptr_t)q & 4095), "aligned_alloc");
	fill(p, 0, S / 2, 4);
	fill(q, 0, S / 2, 5);
	EXPECT_AT("align", check(p, 0, S / 2, 4), "posix_memalign pattern");
	EXPECT_AT("align", check(q, 0, S / 2, 5), "aligned_alloc pattern");
	free(p);
	free(q);
	p = valloc(S / 4);
	EXPECT("align", p && !((uintptr_t)p & 4095), "valloc");
	fill(p, 0, S / 4, 6);
	EXPECT_AT("align", check(p, 0, S / 4, 6), "valloc pattern");
	free(p);
	result("align", NULL, 0);
}

static char *map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static void t_mmap(void)
{
	size_t q = S / 4 & ~(size_t)4095;
	char *p = map(S);

	EXPECT("mmap", p, "mmap failed");
	EXPECT_AT("mmap", check_zero(p, 0, S), "fresh mapping not zero");
	fill(p, 0, S, 7);
	/* Punch the second quarter out, and one page at the start. */
	EXPECT("mmap", !munmap(p + q, q), "munmap of the middle failed");
	EXPECT("mmap", !munmap(p, 4096), "munmap of the first page failed");
	EXPECT_AT("mmap", check(p, 4096, q - 4096, 7), "first quarter lost");
	EXPECT_AT("mmap", check(p, 2 * q, S - 2 * q, 7), "second half lost");
	/* Unmap the rest piece by piece. */
	EXPECT("mmap", !munmap(p + 4096, q - 4096), "munmap 1");
	EXPECT("mmap", !munmap(p + 2 * q, S - 2 * q), "munmap 2");
	/* And a whole one. */
	p = map(S);
	EXPECT("mmap", p, "second mmap failed");
	fill(p, 0, S, 8);
	EXPECT_AT("mmap", check(p, 0, S, 8), "second pattern lost");
	EXPECT("mmap", !munmap(p, S), "whole munmap failed");
	result("mmap", NULL, 0);
}

static void t_dontneed(void)
{
	size_t q = S / 4 & ~(size_t)4095, small = (1u << 20) + 8192;
	char *p = map(S);

	EXPECT("dontneed", p, "mmap failed");
	fill(p, 0, S, 9);
	/* The first quarter was written first: with a buffer larger than
	 * the budget it has been evicted to the store by now. */
	EXPECT("dontneed", !madvise(p, q, MADV_DONTNEED), "madvise failed");
	/* Three pages inside a block, away from block edges. */
	EXPECT("dontneed", !madvise(p + 2 * q + small, 12288, MADV_DONTNEED),
	       "madvise of 3 pages failed");
	EXPECT_AT("dontneed", check_zero(p, 0, q), "dropped quarter not zero");
	EXPECT_AT("dontneed", check_zero(p, 2 * q + small, 12288),
		  "dropped pages not zero");
	EXPECT_AT("dontneed", check(p, q, q + small, 9), "kept data lost");
	EXPECT_AT("dontneed",
		  check(p, 2 * q + small + 12288, S - 2 * q - small - 12288, 9),
		  "kept tail lost");
	/* Dropped memory is memory: write it again and read it back. */
	fill(p, 0, q, 10);
	EXPECT_AT("dontneed", check(p, 0, q, 10), "rewritten quarter lost");
	EXPECT_AT("dontneed", check(p, q, q + small, 9), "kept data lost (2)");
	munmap(p, S);
	result("dontneed", NULL, 0);
}

static void t_mremap(void)
{
	size_t h = S / 2 & ~(size_t)4095;
	char *p = map(h), *q;

	EXPECT("mremap", p, "mmap failed");
	fill(p, 0, h, 11);
	q = mremap(p, h, S, MREMAP_MAYMOVE);
	EXPECT("mremap", q != MAP_FAILED, "growing failed");
	EXPECT_AT("mremap", check(q, 0, h, 11), "contents lost growing");
	EXPECT_AT("mremap", check_zero(q, h, (S & ~(size_t)4095) - h),
		  "grown part not zero");
	p = mremap(q, S, h / 2, 0);
	EXPECT("mremap", p == q, "shrinking in place failed");
	EXPECT_AT("mremap", check(p, 0, h / 2, 11), "contents lost shrinking");
	munmap(p, h / 2);
	result("mremap", NULL, 0);
}

#define NTHREADS 4

struct slice {
	char *shared; /* the buffer all threads share */
	size_t off, len;
	int id;
	const char *why;
	size_t at;
};

static pthread_barrier_t barrier;

static void *thread_main(void *arg)
{
	struct slice *s = arg;
	size_t other = (s->off + s->len) % (s->len * NTHREADS), own_len;
	char *own;

	fill(s->shared, s->off, s->len, 12);
	pthread_barrier_wait(&barrier);
	/* A neighbour's slice, written by another thread. */
	s->at = check(s->shared, other, s->len, 12);
	if (s->at != SIZE_MAX) {
		s->why = "a neighbour's slice lost";
		return NULL;
	}
	/* A buffer of its own, made and freed while the others run. */
	own_len = S / NTHREADS;
	own = malloc(own_len);
	if (!own) {
		s->why = "malloc in a thread failed";
		return NULL;
	}
	fill(own, 0, own_len, 100 + s->id);
	s->at = check(own, 0, own_len, 100 + s->id);
	if (s->at != SIZE_MAX)
		s->why = "a thread's own buffer lost";
	free(own);
	if (!s->why) {
		s->at = check(s->shared, s->off, s->len, 12);
		if (s->at != SIZE_MAX)
			s->why = "its own slice lost";
	}
	return NULL;
}

static void t_threads(void)
{
	size_t len = S / NTHREADS & ~(size_t)7;
	struct slice sl[NTHREADS] = { 0 };
	pthread_t th[NTHREADS];
	char *shared = malloc(len * NTHREADS);

	EXPECT("threads", shared, "malloc failed");
	pthread_barrier_init(&barrier, NULL, NTHREADS);
	for (int i = 0; i < NTHREADS; i++) {
		sl[i] =
		    (struct slice){ shared, i * len, len, i, NULL, SIZE_MAX };
		EXPECT("threads",
		       !pthread_create(&th[i], NULL, thread_main, &sl[i]),
		       "pthread_create failed");
	}
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&barrier);
	for (int i = 0; i < NTHREADS; i++)
		if (sl[i].why) {
			result("threads", sl[i].why, sl[i].at);
			return;
		}
	EXPECT_AT("threads", check(shared, 0, len * NTHREADS, 12),
		  "shared buffer lost");
	free(shared);
	result("threads", NULL, 0);
}

/* Wait for @pid for up to 60 s; print and return its status (-1: hung). */
static int wait_child(pid_t pid, const char *name)
{
	struct timespec ts = { 0, 10 * 1000 * 1000 };
	int st;

	for (int i = 0; i < 6000; i++) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid) {
			if (WIFSIGNALED(st))
				printf("fork %s: signal %d\n", name,
				       WTERMSIG(st));
			else
				printf("fork %s: exit %d\n", name,
				       WEXITSTATUS(st));
			fflush(stdout);
			return st;
		}
		nanosleep(&ts, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	printf("fork %s: hung (killed after 60 s)\n", name);
	return -1;
}

static void t_fork(void)
{
	char *p = malloc(S);
	pid_t pid;
	int st;

	EXPECT("fork", p, "malloc failed");
	fill(p, 0, S, 13);
	fflush(stdout);
	pid = fork();
	EXPECT("fork", pid >= 0, "fork failed");
	if (pid == 0) /* touch: read the inherited buffer */
		_exit(check(p, 0, S, 13) == SIZE_MAX ? 0 : 3);
	st = wait_child(pid, "touch");
	EXPECT("fork", st != -1, "the child that touched the buffer hung");
	pid = fork();
	EXPECT("fork", pid >= 0, "fork failed");
	if (pid == 0) { /* own: leave it alone, use memory of its own */
		char *q = malloc(S / 2);

		if (!q)
			_exit(4);
		fill(q, 0, S / 2, 14);
		if (check(q, 0, S / 2, 14) != SIZE_MAX)
			_exit(5);
		free(q);
		free(p);
		_exit(0);
	}
	st = wait_child(pid, "own");
	EXPECT("fork", st != -1, "the child that left the buffer alone hung");
	EXPECT("fork", WIFEXITED(st) && !WEXITSTATUS(st),
	       "the child with its own buffer failed");
	EXPECT_AT("fork", check(p, 0, S, 13), "the parent's buffer lost");
	free(p);
	result("fork", NULL, 0);
}

/* 1 when the server listening on @listener answers GET /metrics with 200
 * (in a minute: a server gone deaf is a failure, not a hang). */
static int scrape(int listener)
{
	static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
	struct timeval minute = { 60, 0 };
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char head[12];
	int s, ok = 0;

	if (getsockname(listener, (struct sockaddr *)&ss, &len))
		return 0;
	s = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return 0;
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &minute, sizeof(minute));
	if (!connect(s, (struct sockaddr *)&ss, len) &&
	    write(s, req, sizeof(req) - 1) == (ssize_t)sizeof(req) - 1 &&
	    recv(s, head, sizeof(head), MSG_WAITALL) == (ssize_t)sizeof(head))
		ok = !memcmp(head, "HTTP/1.1 200", sizeof(head));
	close(s);
	return ok;
}

/* The listening sockets open in this process: the engine's /metrics
 * listener, under KVP_METRICS_LISTEN, once the program closed its own;
 * *answered: how many of them answer a scrape. */
static int listeners(int *answered)
{
	int n = 0;

	*answered = 0;
	for (int fd = 0; fd < 1024; fd++) {
		int on = 0;
		socklen_t len = sizeof(on);

		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) ||
		    !on)
			continue;
		n++;
		*answered += scrape(fd);
	}
	return n;
}

static void t_closefds(void)
{
	char *p = malloc(S);
	int fds[8], n, answered;

	EXPECT("closefds", p, "malloc failed");
	fill(p, 0, S, 14);
	for (int fd = 3; fd < 1024; fd++)
		close(fd);
	EXPECT_AT("closefds", check(p, 0, S, 14),
		  "pattern lost after closing every descriptor");
	fill(p, 0, S, 15);
	EXPECT("closefds", !close_range(3, ~0u, 0), "close_range failed");
	EXPECT_AT("closefds", check(p, 0, S, 15),
		  "pattern lost after close_range");
	n = listeners(&answered);
	printf("closefds: %d listening sockets left open, %d answer "
	       "/metrics\n",
	       n, answered);
	for (int i = 0; i < 8; i++)
		fds[i] = open("/dev/null", O_RDONLY);
	for (int i = 0; i < 8; i++)
		EXPECT("closefds", fds[i] >= 0 && !close(fds[i]),
		       "a descriptor of the program's own did not close");
	free(p);
	result("closefds", NULL, 0);
}

/* This thread's close_range(2) fails with ENOSYS from here on. */
static int refuse_close_range(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
			 offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_close_range, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { sizeof(f) / sizeof(f[0]), f };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		return -1;
	return syscall(SYS_close_range, 1000, 1000, 0) == -1 &&
			       errno == ENOSYS
		   ? 0
		   : -1;
}

static void t_closefrom(void)
{
	struct rlimit was, low;
	char *p = malloc(S);
	int fds[1024], n = 0, top = 0, open_after = 0;

	EXPECT("closefrom", p, "malloc failed");
	fill(p, 0, S, 21);
	/* Every number below the limit taken: /proc/self/fd cannot be
	 * listed until one of those to be closed is. */
	for (int fd = 0; fd < 1024; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			top = fd;
	getrlimit(RLIMIT_NOFILE, &was);
	low = was;
	low.rlim_cur = (rlim_t)top + 9;
	EXPECT("closefrom", !setrlimit(RLIMIT_NOFILE, &low),
	       "cannot lower RLIMIT_NOFILE");
	while (n < 1024 && (fds[n] = open("/dev/null", O_RDONLY)) >= 0)
		n++;
	EXPECT("closefrom", !refuse_close_range(),
	       "cannot refuse close_range with a seccomp filter");
	closefrom(3);
	setrlimit(RLIMIT_NOFILE, &was);
	for (int i = 0; i < n; i++)
		open_after += fds[i] >= 3 && fcntl(fds[i], F_GETFD) >= 0;
	printf("closefrom: %d of the program's %d files left open\n",
	       open_after, n);
	EXPECT("closefrom", n >= 8 && !open_after,
	       "closefrom left the program's files open");
	EXPECT_AT("closefrom", check(p, 0, S, 21),
		  "pattern lost after closefrom");
	free(p);
	result("closefrom", NULL, 0);
}

static void t_stdclosed(void)
{
	int report = fcntl(1, F_DUPFD_CLOEXEC, 100), got[3], closed = 1;
	size_t bad;
	char *p;

	for (int fd = 0; fd < 3; fd++)
		close(fd);
	p = malloc(S); /* the engine starts here, its descriptors made */
	if (p)
		fill(p, 0, S, 20);
	bad = p ? check(p, 0, S, 20) : SIZE_MAX;
	for (int i = 0; i < 3; i++)
		got[i] = open("/dev/null", O_RDWR);
	for (int i = 0; i < 3; i++)
		closed &= got[i] >= 0 && !close(got[i]);
	if (dup2(report, 1) != 1 || dup2(report, 2) != 2)
		dprintf(report, "FAIL stdclosed: 1 and 2 cannot be had back "
				"(%s): the engine's?\n", strerror(errno));
	close(report);
	printf("stdclosed: the program's opens got %d %d %d\n", got[0], got[1],
	       got[2]);
	EXPECT("stdclosed", p, "malloc failed");
	EXPECT_AT("stdclosed", bad, "pattern lost");
	EXPECT("stdclosed", got[0] == 0 && got[1] == 1 && got[2] == 2,
	       "the program's opens did not get 0, 1 and 2");
	EXPECT("stdclosed", closed,
	       "the program's own 0, 1 or 2 did not close");
	free(p);
	result("stdclosed", NULL, 0);
}

static char *sig_buf;
static volatile sig_atomic_t sig_count;
static volatile uint64_t sig_sink;

static void sig_read(int signo)
{
	static uint64_t x = 1;

	(void)signo;
	x = x * 6364136223846793005ull + 1442695040888963407ull;
	sig_sink += (unsigned char)sig_buf[(x >> 33) % (S / 4096) * 4096];
	sig_count++;
}

static void t_signals(void)
{
	struct sigaction sa = { .sa_handler = sig_read, .sa_flags = SA_RESTART };
	struct itimerval it = { { 0, 1000 }, { 0, 1000 } };

	sig_buf = malloc(S);
	EXPECT("signals", sig_buf, "malloc failed");
	fill(sig_buf, 0, S, 16);
	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
	for (uint64_t round = 17; round < 19; round++)
		fill(sig_buf, 0, S, round);
	memset(&it, 0, sizeof(it));
	setitimer(ITIMER_REAL, &it, NULL);
	signal(SIGALRM, SIG_DFL);
	EXPECT_AT("signals", check(sig_buf, 0, S, 18), "pattern lost");
	printf("signals: %d handled\n", (int)sig_count);
	free(sig_buf);
	result("signals", NULL, 0);
}

static void print_vm(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long hwm = -1, rss = -1;

	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		sscanf(line, "VmHWM: %ld", &hwm);
		sscanf(line, "VmRSS: %ld", &rss);
	}
	fclose(f);
	printf("vm VmHWM_kB=%ld VmRSS_kB=%ld\n", hwm, rss);
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	switch (*end) {
	case 'k':
	case 'K':
		v <<= 10;
		end++;
		break;
	case 'm':
	case 'M':
		v <<= 20;
		end++;
		break;
	case 'g':
	case 'G':
		v <<= 30;
		end++;
		break;
	default:
		break;
	}
	if (*end || v < (1u << 22))
		return -1;
	*out = (size_t)v & ~(size_t)63;
	return 0;
}

static const struct {
	const char *name;
	void (*fn)(void);
	int by_default;
} tests[] = {
	{ "malloc", t_malloc, 1 }, { "realloc", t_realloc, 1 },
	{ "calloc", t_calloc, 1 }, { "align", t_align, 1 },
	{ "mmap", t_mmap, 1 },	   { "dontneed", t_dontneed, 1 },
	{ "mremap", t_mremap, 1 }, { "threads", t_threads, 1 },
	{ "fork", t_fork, 0 },	   { "closefds", t_closefds, 0 },
	{ "closefrom", t_closefrom, 0 }, { "stdclosed", t_stdclosed, 0 },
	{ "signals", t_signals, 0 },
};

int main(int argc, char **argv)
{
	size_t n = sizeof(tests) / sizeof(tests[0]);

	if (argc < 2 || parse_size(argv[1], &S)) {
		fprintf(stderr, "usage: fill_check SIZE (>= 4M) [TEST...]\n");
		return 2;
	}
	for (size_t i = 0; i < n; i++) {
		int run = argc == 2 && tests[i].by_default;

		for (int a = 2; a < argc; a++)
			run |= !strcmp(argv[a], tests[i].name);
		if (run)
			tests[i].fn();
	}
	print_vm();
	if (failed)
		printf("fill_check: %d failed\n", failed);
	else
		printf("fill_check: all ok\n");
	return failed ? 1 : 0;
}
