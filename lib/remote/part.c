/*
 * part.c - how a value is stored: as parts of at most KVP_REMOTE_PART_BYTES
 * under keys of their own, each behind a header that says whose part it
 * is, and of which publish (remote.h has the format).
 *
 * Why parts: Redis copies a GET's value into a reply buffer of its own
 * size.  From 8 MiB on, its allocator (jemalloc) gives every such buffer
 * fresh pages and hands them back at once, so each GET faults the whole
 * value in again (about 4.5 s of server CPU a GB on this VM, against 0.3 s
 * for values of 1 MiB with a few in flight).  Parts of 1 MiB keep every
 * reply buffer in memory the server reuses.
 */
#include <errno.h>
#include <string.h>

#include "lib/remote/remote_i.h"

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes)
{
	uint64_t v = 0;

	for (int i = bytes - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

uint64_t part_tag(const char *rkey, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)rkey[i]) * 0x100000001b3ull;
	return h;
}

uint32_t part_count(uint64_t total)
{
	return total ? (uint32_t)((total + KVP_REMOTE_PART_BYTES - 1) /
				  KVP_REMOTE_PART_BYTES)
		     : 1;
}

size_t part_len(uint64_t total, uint32_t i)
{
	uint64_t off = (uint64_t)i * KVP_REMOTE_PART_BYTES;

	if (off >= total)
		return 0;
	return total - off < KVP_REMOTE_PART_BYTES ? (size_t)(total - off)
						   : KVP_REMOTE_PART_BYTES;
}

void part_header(void *out, uint32_t i, uint64_t total, uint64_t tag,
		 uint64_t publish)
{
	unsigned char *h = out;

	put_le(h + 0, PART_MAGIC, 4);
	put_le(h + 4, PART_VERSION, 2);
	put_le(h + 6, KVP_REMOTE_PART_HEADER, 2);
	put_le(h + 8, i, 4);
	put_le(h + 12, part_count(total), 4);
	put_le(h + 16, total, 8);
	put_le(h + 24, tag, 8);
	put_le(h + 32, publish, 8);
}

int part_check(const void *hdr, uint32_t i, uint64_t tag, uint64_t *total,
	       uint64_t *publish)
{
	const unsigned char *h = hdr;
	uint64_t t = get_le(h + 16, 8);

	if (get_le(h + 0, 4) != PART_MAGIC || get_le(h + 4, 2) != PART_VERSION ||
	    get_le(h + 6, 2) != KVP_REMOTE_PART_HEADER ||
	    get_le(h + 8, 4) != i || get_le(h + 24, 8) != tag ||
	    t > KVP_REMOTE_MAX_VALUE || get_le(h + 12, 4) != part_count(t) ||
	    i >= part_count(t))
		return -EBADMSG;
	*total = t;
	*publish = get_le(h + 32, 8);
	return 0;
}

int kvp_remote_part_value(const void *ns, size_t ns_len, const void *key,
			  size_t keylen, const void *val, size_t len,
			  uint64_t publish, uint32_t part, void *out,
			  size_t outlen)
{
	char rkey[REMOTE_RKEY_MAX];
	int n = remote_base_key(ns, ns_len, key, keylen, rkey, sizeof(rkey));
	size_t plen = part_len(len, part);

	if (n < 0)
		return n;
	if (len > KVP_REMOTE_MAX_VALUE || part >= part_count(len))
		return -EINVAL;
	if (outlen < KVP_REMOTE_PART_HEADER + plen)
		return -ENOSPC;
	part_header(out, part, len, part_tag(rkey, (size_t)n), publish);
	if (plen)
		memcpy((char *)out + KVP_REMOTE_PART_HEADER,
		       (const char *)val + (size_t)part * KVP_REMOTE_PART_BYTES,
		       plen);
	return (int)(KVP_REMOTE_PART_HEADER + plen);
}
