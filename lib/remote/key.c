/* key.c - a value's Redis keys (its base, its parts'); Redis Cluster's
 * hash slot of a key (CRC16 XMODEM, hash tags). */
#include <errno.h>
#include <string.h>

#include "lib/remote/remote_i.h"

void remote_hex(const void *buf, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";
	const unsigned char *p = buf;

	for (size_t i = 0; i < len; i++) {
		out[2 * i] = digits[p[i] >> 4];
		out[2 * i + 1] = digits[p[i] & 15];
	}
	out[2 * len] = '\0';
}

int remote_base_key(const void *ns, size_t ns_len, const void *key,
		    size_t keylen, char *buf, size_t len)
{
	size_t plen = strlen(REMOTE_KEY_PREFIX);
	size_t need = plen + 2 * ns_len + 1 + 2 * keylen;

	if (need + 1 > len)
		return -ENAMETOOLONG;
	memcpy(buf, REMOTE_KEY_PREFIX, plen);
	remote_hex(ns, ns_len, buf + plen);
	buf[plen + 2 * ns_len] = ':';
	remote_hex(key, keylen, buf + plen + 2 * ns_len + 1);
	return (int)need;
}

int remote_part_key(char *rkey, size_t base_len, uint32_t part)
{
	char *p = rkey + base_len, digits[10];
	int n = 0;

	*p++ = ':';
	do
		digits[n++] = (char)('0' + part % 10);
	while ((part /= 10));
	while (n)
		*p++ = digits[--n];
	*p = '\0';
	return (int)(p - rkey);
}

int kvp_remote_redis_key(const void *ns, size_t ns_len, const void *key,
			 size_t keylen, uint32_t part, char *buf, size_t len)
{
	int n = remote_base_key(ns, ns_len, key, keylen, buf, len);

	if (n < 0)
		return n;
	if ((size_t)n + PART_SUFFIX_MAX > len)
		return -ENAMETOOLONG;
	return remote_part_key(buf, (size_t)n, part);
}

int remote_rkey(const struct kvp_remote *r, const void *key, size_t keylen,
		char *buf)
{
	size_t nlen = strlen(r->ns_hex), plen = strlen(REMOTE_KEY_PREFIX);

	if (!key || !keylen || keylen > KVP_REMOTE_MAX_KEY)
		return -EINVAL;
	memcpy(buf, REMOTE_KEY_PREFIX, plen);
	memcpy(buf + plen, r->ns_hex, nlen);
	buf[plen + nlen] = ':';
	remote_hex(key, keylen, buf + plen + nlen + 1);
	return (int)(plen + nlen + 1 + 2 * keylen);
}

uint16_t kvp_remote_crc16(const void *buf, size_t len)
{
	const unsigned char *p = buf;
	uint16_t crc = 0;

	/* Bitwise: a table buys nothing next to a network round trip. */
	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (crc & 0x8000) ? (uint16_t)(crc << 1 ^ 0x1021)
					     : (uint16_t)(crc << 1);
	}
	return crc;
}

unsigned kvp_remote_key_slot(const void *key, size_t len)
{
	const char *k = key;
	const char *open = memchr(k, '{', len);

	/* Only the first '{' counts, and only with a '}' after it that
	 * leaves something between: Redis' rule, so "{}x" hashes whole. */
	if (open) {
		size_t off = (size_t)(open - k) + 1;
		const char *close = memchr(open + 1, '}', len - off);

		if (close && close > open + 1) {
			k = open + 1;
			len = (size_t)(close - k);
		}
	}
	return kvp_remote_crc16(k, len) & 16383;
}
