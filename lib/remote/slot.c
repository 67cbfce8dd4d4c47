/* slot.c - Redis Cluster's hash slot of a key (CRC16 XMODEM, hash tags). */
#include <string.h>

#include "lib/remote/remote.h"

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
