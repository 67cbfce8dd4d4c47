/*
 * dirty_then_check - dirty a buffer in two phases, then check all of it.
 *
 *   dirty_then_check FIRST_MB SECOND_MB GOFILE
 *
 * Knows nothing of kvpager (plain libc; run under LD_PRELOAD by
 * tests/t_preload_eio.sh).  Allocates one buffer of FIRST_MB + SECOND_MB
 * MiB, writes a pattern over the first FIRST_MB MiB and prints "phase 1
 * done"; waits (up to 300 s) until GOFILE exists; writes the rest, reads
 * the whole buffer back and prints "all ok" (exit 0) or "FAIL ..." (exit 1).
 * Under a store whose writes fail, phase 1 makes dirty data the pager
 * cannot write back; the test lets the store recover before phase 2.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t pat(size_t i)
{
	return (i * 0x9E3779B97F4A7C15ull) ^ 0x5DEECE66Dull;
}

int main(int argc, char **argv)
{
	size_t first, total, words;
	uint64_t *buf;
	int waited;

	if (argc != 4) {
		fprintf(stderr, "usage: %s FIRST_MB SECOND_MB GOFILE\n",
			argv[0]);
		return 2;
	}
	first = strtoull(argv[1], NULL, 10) << 20;
	total = first + (strtoull(argv[2], NULL, 10) << 20);
	buf = malloc(total);
	if (!buf) {
		perror("malloc");
		return 2;
	}
	for (size_t i = 0; i < first / 8; i++)
		buf[i] = pat(i);
	printf("phase 1 done\n");
	fflush(stdout);
	for (waited = 0; access(argv[3], F_OK); waited++) {
		if (waited == 30000) {
			printf("FAIL: %s did not appear in 300 s\n", argv[3]);
			return 1;
		}
		nanosleep(&(struct timespec){ .tv_nsec = 10000000 }, NULL);
	}
	words = total / 8;
	for (size_t i = first / 8; i < words; i++)
		buf[i] = pat(i);
	for (size_t i = 0; i < words; i++)
		if (buf[i] != pat(i)) {
			printf("FAIL: word at byte %zu is %#llx, wrote %#llx\n",
			       i * 8, (unsigned long long)buf[i],
			       (unsigned long long)pat(i));
			return 1;
		}
	printf("all ok\n");
	free(buf);
	return 0;
}
