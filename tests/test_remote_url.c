/*
 * test_remote_url.c - lib/remote: the URL parser, its redaction and the
 * cluster hash slot of a key, against known values (those of a real
 * server's CLUSTER KEYSLOT; test_remote_cluster asks one too).
 */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "lib/remote/remote.h"
#include "tests/helpers/helpers.h"

START_TEST(url_good)
{
	struct kvp_remote_url u;
	char err[256] = "";

	ck_assert_int_eq(kvp_remote_url_parse(&u, "redis://127.0.0.1:7000", err,
					      sizeof(err)), 0);
	ck_assert(!u.cluster);
	ck_assert_int_eq(u.nseeds, 1);
	ck_assert_str_eq(u.host[0], "127.0.0.1");
	ck_assert_int_eq(u.port[0], 7000);
	ck_assert_int_eq(u.db, 0);
	ck_assert_str_eq(u.user, "");
	ck_assert_str_eq(u.password, "");
	ck_assert_uint_eq(u.timeout_ms, 1000);
	ck_assert_uint_eq(u.queue, 256);

	ck_assert_int_eq(kvp_remote_url_parse(&u, "redis://cache.example", err,
					      sizeof(err)), 0);
	ck_assert_int_eq(u.port[0], 6379);

	ck_assert_int_eq(kvp_remote_url_parse(
				 &u, "redis://alice:p%40ss%2Fw@h:1/3?timeout_ms=50"
				     "&queue=8&connect_timeout_ms=70",
				 err, sizeof(err)), 0);
	ck_assert_str_eq(u.user, "alice");
	ck_assert_str_eq(u.password, "p@ss/w");
	ck_assert_str_eq(u.host[0], "h");
	ck_assert_int_eq(u.db, 3);
	ck_assert_uint_eq(u.timeout_ms, 50);
	ck_assert_uint_eq(u.connect_timeout_ms, 70);
	ck_assert_uint_eq(u.queue, 8);
	ck_assert_uint_eq(u.queue_bytes, 256u << 20);
	ck_assert_int_eq(kvp_remote_url_parse(&u, "redis://h?queue_bytes=1G",
					      err, sizeof(err)), 0);
	ck_assert_uint_eq(u.queue_bytes, 1u << 30);

	/* the password alone: the default user */
	ck_assert_int_eq(kvp_remote_url_parse(&u, "redis://s3cret@h:2", err,
					      sizeof(err)), 0);
	ck_assert_str_eq(u.user, "");
	ck_assert_str_eq(u.password, "s3cret");

	ck_assert_int_eq(kvp_remote_url_parse(
				 &u, "redis+cluster://10.0.0.1:7000,10.0.0.2:7001,"
				     "[::1]:7002?password_file=/run/pw",
				 err, sizeof(err)), 0);
	ck_assert(u.cluster);
	ck_assert_int_eq(u.nseeds, 3);
	ck_assert_str_eq(u.host[1], "10.0.0.2");
	ck_assert_int_eq(u.port[1], 7001);
	ck_assert_str_eq(u.host[2], "::1");
	ck_assert_int_eq(u.port[2], 7002);
	ck_assert_str_eq(u.password_file, "/run/pw");
}
END_TEST

START_TEST(url_bad)
{
	static const char *const bad[] = {
		NULL,
		"",
		"http://h:1",
		"rediss://h:1",
		"redis://",
		"redis://:7000",
		"redis://h:0",
		"redis://h:65536",
		"redis://h:12x",
		"redis://h:1/abc",
		"redis://h:1/-1",
		"redis://h:1,h:2",
		"redis+cluster://h:1/2",
		"redis://h:1?timeout_ms=0",
		"redis://h:1?timeout_ms=",
		"redis://h:1?nosuch=1",
		"redis://h:1?password_file=relative",
		"redis://h:1?queue",
		"redis://h:1?queue_bytes=10",
		"redis://h:1?queue_bytes=lots",
		"redis://u:@h:1",
		"redis://u:%zz@h:1",
		"redis://u:%00@h:1",
		"redis://[::1:1",
		"redis://[::1]x",
	};
	struct kvp_remote_url u;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char err[256] = "";

		ck_assert_msg(kvp_remote_url_parse(&u, bad[i], err,
						   sizeof(err)) == -EINVAL,
			      "accepted '%s'", bad[i] ? bad[i] : "(null)");
		ck_assert_msg(err[0], "no reason for '%s'", bad[i]);
	}
}
END_TEST

START_TEST(url_password_never_shown)
{
	char buf[256], err[256] = "";
	struct kvp_remote_url u;

	ck_assert_str_eq(kvp_remote_url_redact("redis://alice:hunter2@h:1/2",
					       buf, sizeof(buf)),
			 "redis://alice:***@h:1/2");
	ck_assert_str_eq(kvp_remote_url_redact("redis://hunter2@h:1", buf,
					       sizeof(buf)),
			 "redis://***@h:1");
	ck_assert_str_eq(kvp_remote_url_redact("redis://h:1", buf, sizeof(buf)),
			 "redis://h:1");
	/* a bad URL's error does not echo the password either */
	ck_assert_int_eq(kvp_remote_url_parse(&u, "redis://a:hunter2@h:99999",
					      err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(strstr(err, "hunter2"));
	ck_assert_int_eq(kvp_remote_url_parse(&u, "redis://a:hunter2@h:1?x=1",
					      err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(strstr(err, "hunter2"));
	/* a '/' or '?' written as it is in a password: said so, and no
	 * piece of the password echoed as a host, a /db or an option */
	{
		static const char *const raw[] = {
			"redis://:hun/ter2@h:1", "redis://a:hun?ter2@h:1",
			"redis://a:hun/ter?2@h:1/2", "redis://hun?ter2@h",
			/* an '=' in the password is no option's */
			"redis://hun?ter2=x@h", "redis://hun?ter2&x=1@h",
			"redis://a:6379?ter2=1@h:1", "redis://hun/ter2=@h",
			"redis://h:1?timeout_ms=5&ter2@h",
			"redis://a:x@y?ter2=1@h",
		};

		for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
			ck_assert_int_eq(kvp_remote_url_parse(&u, raw[i], err,
							      sizeof(err)),
					 -EINVAL);
			ck_assert_msg(strstr(err, "%2F") &&
					      !strstr(err, "ter"),
				      "'%s': %s", raw[i], err);
		}
	}
	/* an '@' in an option's value is no password */
	ck_assert_int_eq(kvp_remote_url_parse(
				 &u, "redis://h:1?password_file=/run/a@b/pw",
				 err, sizeof(err)), 0);
	ck_assert_str_eq(u.password_file, "/run/a@b/pw");
	ck_assert_int_eq(kvp_remote_url_parse(
				 &u, "redis://h:1/2?timeout_ms=5&password_file="
				     "/run/a@b/p@w&queue=8",
				 err, sizeof(err)), 0);
	ck_assert_str_eq(u.password_file, "/run/a@b/p@w");
}
END_TEST

START_TEST(slot_known_values)
{
	/* CLUSTER KEYSLOT of Redis 7.0 */
	static const struct {
		const char *key;
		unsigned slot;
	} known[] = {
		{ "foo", 12182 },
		{ "bar", 5061 },
		{ "hello", 866 },
		{ "a", 15495 },
		{ "123456789", 12739 },
		{ "{user1000}.following", 3443 },
		{ "{user1000}.followers", 3443 },
		{ "foo{}{bar}", 8363 },
		{ "foo{{bar}}zap", 4015 },
		{ "foo{bar}{zap}", 5061 },
		{ "{}", 15257 },
		{ "", 0 },
	};

	/* CRC16/XMODEM's check value */
	ck_assert_uint_eq(kvp_remote_crc16("123456789", 9), 0x31c3);
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		ck_assert_msg(kvp_remote_key_slot(known[i].key,
						  strlen(known[i].key)) ==
				      known[i].slot,
			      "slot of '%s': %u, want %u", known[i].key,
			      kvp_remote_key_slot(known[i].key,
						  strlen(known[i].key)),
			      known[i].slot);
}
END_TEST

START_TEST(redis_key_format)
{
	char buf[256], part[64];
	const unsigned char ns[2] = { 0xab, 0x01 }, key[3] = { 0, 0xff, 0x10 };
	const char val[5] = "abcd";

	ck_assert_int_eq(kvp_remote_redis_key(ns, 2, key, 3, 0, buf,
					      sizeof(buf)),
			 (int)strlen("kvp:3:ab01:00ff10:0"));
	ck_assert_str_eq(buf, "kvp:3:ab01:00ff10:0");
	ck_assert_int_eq(kvp_remote_redis_key(ns, 2, key, 3, 4000000000u, buf,
					      sizeof(buf)),
			 (int)strlen("kvp:3:ab01:00ff10:4000000000"));
	ck_assert_str_eq(buf, "kvp:3:ab01:00ff10:4000000000");
	ck_assert_int_eq(kvp_remote_redis_key(ns, 2, key, 3, 0, buf, 19),
			 -ENAMETOOLONG);
	/* a part: the header remote.h gives, then the bytes */
	ck_assert_int_eq(kvp_remote_part_value(ns, 2, key, 3, val, 4,
					       0x0102030405060708ull, 0, part,
					       sizeof(part)),
			 KVP_REMOTE_PART_HEADER + 4);
	ck_assert_mem_eq(part, "KVPp\2\0\x28\0\0\0\0\0\1\0\0\0\4\0\0\0", 20);
	ck_assert_mem_eq(part + 32, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
	ck_assert_mem_eq(part + KVP_REMOTE_PART_HEADER, "abcd", 4);
	ck_assert_int_eq(kvp_remote_part_value(ns, 2, key, 3, val, 4, 1, 1,
					       part, sizeof(part)),
			 -EINVAL);
	ck_assert_int_eq(kvp_remote_part_value(ns, 2, key, 3, val, 4, 1, 0,
					       part,
					       KVP_REMOTE_PART_HEADER + 3),
			 -ENOSPC);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("remote_url");
	TCase *tc = kvp_test_tcase(s, "core", 30);

	tcase_add_test(tc, url_good);
	tcase_add_test(tc, url_bad);
	tcase_add_test(tc, url_password_never_shown);
	tcase_add_test(tc, slot_known_values);
	tcase_add_test(tc, redis_key_format);
	return kvp_test_run(s);
}
