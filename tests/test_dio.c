/*
 * test_dio.c - kmod-helpers/dio.c: O_DIRECT opening and alignment.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kmod-helpers/dio.h"
#include "tests/helpers/helpers.h"

START_TEST(test_disk_file)
{
	char path[] = "/var/tmp/kvp-test-dio-XXXXXX";
	struct kvp_dio_align a;
	bool direct = false;
	void *buf;
	int fd, dfd;

	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 1 << 20), 0);
	ck_assert_int_eq(kvp_dio_alignment(fd, &a), 0);
	ck_assert(a.direct);
	ck_assert(kvp_test_pow2(a.mem_align) && kvp_test_pow2(a.offset_align));
	ck_assert_uint_le(a.offset_align, 4096);
	ck_assert_ptr_nonnull(a.source);

	dfd = kvp_dio_open(path, O_RDWR, 0, &direct);
	ck_assert_int_ge(dfd, 0);
	ck_assert(direct);
	ck_assert(fcntl(dfd, F_GETFL) & O_DIRECT);
	/* A transfer at the reported alignment works ... */
	ck_assert_int_eq(posix_memalign(&buf, 4096, 8192), 0);
	memset(buf, 0x5a, 8192);
	ck_assert_int_eq(pwrite(dfd, (char *)buf + a.mem_align, a.offset_align,
				a.offset_align),
			 (ssize_t)a.offset_align);
	/* ... and a misaligned offset is refused, so it is O_DIRECT. */
	if (a.offset_align > 1)
		ck_assert_int_lt(pread(dfd, buf, a.offset_align, 1), 0);
	free(buf);
	close(dfd);
	close(fd);
	unlink(path);
}
END_TEST

START_TEST(test_open_create)
{
	char path[64];
	bool direct = false;
	struct stat st;
	int fd;

	snprintf(path, sizeof(path), "/var/tmp/kvp-test-dio-c%d",
		 (int)getpid());
	unlink(path);
	fd = kvp_dio_open(path, O_RDWR | O_CREAT | O_EXCL, 0600, &direct);
	ck_assert_int_ge(fd, 0);
	ck_assert(direct);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0600);
	close(fd);
	ck_assert_int_eq(
	    kvp_dio_open(path, O_RDWR | O_CREAT | O_EXCL, 0600, &direct),
	    -EEXIST);
	unlink(path);
	ck_assert_int_eq(kvp_dio_open(path, O_RDONLY, 0, &direct), -ENOENT);
}
END_TEST

START_TEST(test_tmpfs)
{
	char path[] = "/dev/shm/kvp-test-dio-XXXXXX";
	struct kvp_dio_align a;
	bool direct;
	int fd, dfd;

	fd = mkstemp(path);
	if (fd < 0)
		return; /* no /dev/shm: nothing to check */
	ck_assert_int_eq(kvp_dio_alignment(fd, &a), 0);
	dfd = kvp_dio_open(path, O_RDWR, 0, &direct);
	ck_assert_int_ge(dfd, 0);
	/* tmpfs has O_DIRECT since 6.6; both answers must agree. */
	ck_assert_int_eq(direct, a.direct);
	ck_assert(kvp_test_pow2(a.mem_align) && kvp_test_pow2(a.offset_align));
	close(dfd);
	close(fd);
	unlink(path);
}
END_TEST

START_TEST(test_refused)
{
	struct kvp_dio_align a;
	char dir[64], tag[32], path[128];
	bool direct = true;
	int fd;

	/* ramfs refuses O_DIRECT */
	snprintf(tag, sizeof(tag), "kvp-test-dio-%d", (int)getpid());
	if (!kvp_test_mount(dir, sizeof(dir), "/tmp", tag, "ramfs",
			    "mode=0700"))
		return;
	snprintf(path, sizeof(path), "%s/f", dir);
	fd = kvp_dio_open(path, O_RDWR | O_CREAT | O_EXCL, 0600, &direct);
	ck_assert_int_ge(fd, 0);
	ck_assert(!direct);
	ck_assert(!(fcntl(fd, F_GETFL) & O_DIRECT));
	ck_assert_int_eq(pwrite(fd, "x", 1, 3), 1);
	ck_assert_int_eq(kvp_dio_alignment(fd, &a), 0);
	ck_assert(!a.direct);
	close(fd);
	kvp_test_unmount(dir);
}
END_TEST

START_TEST(test_bad_input)
{
	struct kvp_dio_align a;
	bool direct;

	ck_assert_int_lt(kvp_dio_alignment(-1, &a), 0);
	ck_assert_int_eq(kvp_dio_alignment(0, NULL), -EINVAL);
	ck_assert_int_eq(kvp_dio_alignment(1000000, &a), -EBADF);
	ck_assert_int_eq(kvp_dio_open(NULL, O_RDONLY, 0, &direct), -EINVAL);
	ck_assert_int_eq(kvp_dio_open("/var/tmp", O_RDONLY, 0, NULL), -EINVAL);
}
END_TEST

static Suite *dio_suite(void)
{
	Suite *s = suite_create("dio");
	TCase *tc = kvp_test_tcase(s, "core", 20);

	tcase_add_test(tc, test_disk_file);
	tcase_add_test(tc, test_open_create);
	tcase_add_test(tc, test_tmpfs);
	tcase_add_test(tc, test_refused);
	tcase_add_test(tc, test_bad_input);
	return s;
}

int main(void)
{
	return kvp_test_run(dio_suite());
}
