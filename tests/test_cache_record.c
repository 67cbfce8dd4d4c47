/* test_cache_record.c - block keys and records: chains, salts, seal and
 * open, and every way a record can be wrong. */
#include <check.h>
#include <errno.h>
#include <openssl/evp.h>
#include <sodium.h>
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cache/block_record.h"
#include "tests/helpers/helpers.h"

static void ctx_init(struct kvp_rec_keyctx *c, const char *model,
		     const char *salt)
{
	memset(c, 0, sizeof(*c));
	ck_assert_int_eq(kvp_rec_hash(model, strlen(model), c->model), 0);
	if (salt)
		ck_assert_int_eq(kvp_rec_hash(salt, strlen(salt), c->salt), 0);
	c->geo[0] = 5;
	c->geo[1] = 8;
	c->geo[2] = 4;
	c->geo[3] = 8;
	c->geo[5] = 16;
}

START_TEST(keys_chain)
{
	struct kvp_rec_keyctx c, other;
	struct kvp_rec_key k1, k2, k2b, kx;
	uint32_t t[32];
	char hex[65];
	int i;

	for (i = 0; i < 32; i++)
		t[i] = (uint32_t)i * 7;
	ctx_init(&c, "stories260K", NULL);
	kvp_rec_block_key(&c, NULL, t, 16, &k1);
	kvp_rec_block_key(&c, &k1, t + 16, 16, &k2);
	kvp_rec_block_key(&c, &k1, t + 16, 16, &k2b);
	ck_assert_mem_eq(k2.b, k2b.b, 32); /* deterministic */
	ck_assert(memcmp(k1.b, k2.b, 32));
	/* the same tokens under another parent: another key */
	kvp_rec_block_key(&c, NULL, t + 16, 16, &kx);
	ck_assert(memcmp(kx.b, k2.b, 32));
	/* one token changed */
	t[3]++;
	kvp_rec_block_key(&c, NULL, t, 16, &kx);
	ck_assert(memcmp(kx.b, k1.b, 32));
	t[3]--;
	/* another salt, model or geometry */
	ctx_init(&other, "stories260K", "tenant-a");
	kvp_rec_block_key(&other, NULL, t, 16, &kx);
	ck_assert(memcmp(kx.b, k1.b, 32));
	ctx_init(&other, "stories15M", NULL);
	kvp_rec_block_key(&other, NULL, t, 16, &kx);
	ck_assert(memcmp(kx.b, k1.b, 32));
	ctx_init(&other, "stories260K", NULL);
	other.geo[4] = 1;
	kvp_rec_block_key(&other, NULL, t, 16, &kx);
	ck_assert(memcmp(kx.b, k1.b, 32));
	/* a cipher key's blocks are named apart from plain ones, from
	 * another cipher key's and from another salt's under the key */
	{
		struct kvp_rec_cipher ca, cb;
		struct kvp_rec_keyctx sa, sa2;
		struct kvp_rec_key ka;

		memset(ca.key, 0x42, 32);
		memset(cb.key, 0x43, 32);
		ctx_init(&sa, "stories260K", NULL);
		ck_assert_int_eq(kvp_rec_keyctx_cipher(&sa, &ca), 0);
		/* BLAKE2b-256 keyed with the cipher key of the domain
		 * string (and its NUL) and the salt (zeros here) */
		ck_assert_int_eq(kvp_rec_key_parse("bb346c11a929321f638c360f5b"
						   "82e109a75ca2cac7d6455db72b"
						   "4300c1782358",
						   &ka),
				 0);
		ck_assert_mem_eq(sa.salt, ka.b, 32);
		kvp_rec_block_key(&sa, NULL, t, 16, &ka);
		ck_assert(memcmp(ka.b, k1.b, 32));
		ctx_init(&sa2, "stories260K", NULL);
		kvp_rec_keyctx_cipher(&sa2, &ca);
		kvp_rec_block_key(&sa2, NULL, t, 16, &kx);
		ck_assert_mem_eq(kx.b, ka.b, 32); /* deterministic */
		ctx_init(&sa2, "stories260K", NULL);
		kvp_rec_keyctx_cipher(&sa2, &cb);
		kvp_rec_block_key(&sa2, NULL, t, 16, &kx);
		ck_assert(memcmp(kx.b, ka.b, 32));
		ctx_init(&sa2, "stories260K", "tenant-a");
		kvp_rec_keyctx_cipher(&sa2, &ca);
		kvp_rec_block_key(&sa2, NULL, t, 16, &kx);
		ck_assert(memcmp(kx.b, ka.b, 32));
	}
	/* hex round trip */
	kvp_rec_key_hex(&k2, hex);
	ck_assert_uint_eq(strlen(hex), 64);
	ck_assert_int_eq(kvp_rec_key_parse(hex, &kx), 0);
	ck_assert_mem_eq(kx.b, k2.b, 32);
	hex[10] = 'g';
	ck_assert_int_eq(kvp_rec_key_parse(hex, &kx), -EINVAL);
	ck_assert_int_eq(kvp_rec_key_parse("abcd", &kx), -EINVAL);
}
END_TEST

static void key_of(struct kvp_rec_key *k, uint8_t v)
{
	memset(k->b, v, sizeof(k->b));
}

/* A record of len pattern bytes under key 0x11, sealed with cipher. */
static uint8_t *make_rec(size_t len, const struct kvp_rec_cipher *cipher,
			 uint8_t **payload)
{
	struct kvp_rec_key k;
	uint8_t *rec = calloc(1, kvp_rec_size(len) + 64);

	*payload = malloc(len + 8);
	kvp_test_fill(*payload, (len + 7) & ~(size_t)7, 42, 0);
	key_of(&k, 0x11);
	ck_assert_int_eq(kvp_rec_seal(&k, *payload, len, cipher, rec), 0);
	return rec;
}

static void check_open(const uint8_t *rec, size_t n, const uint8_t *want,
		       size_t len, const struct kvp_rec_key *expect,
		       const struct kvp_rec_cipher *cipher, int result)
{
	uint8_t *copy = malloc(n);
	const void *p;
	uint64_t got;

	memcpy(copy, rec, n);
	ck_assert_int_eq(kvp_rec_open(copy, n, expect, cipher, &p, &got),
			 result);
	if (!result) {
		ck_assert_uint_eq(got, len);
		ck_assert_mem_eq(p, want, len);
	} else {
		/* a refused record is left as it was */
		ck_assert_mem_eq(copy, rec, n);
	}
	free(copy);
}

START_TEST(plain_round_trip)
{
	struct kvp_rec_key k, other;
	uint8_t *payload, *rec = make_rec(1000, NULL, &payload);
	size_t n = kvp_rec_size(1000);

	key_of(&k, 0x11);
	key_of(&other, 0x22);
	check_open(rec, n, payload, 1000, &k, NULL, 0);
	check_open(rec, n, payload, 1000, NULL, NULL, 0);
	check_open(rec, n + 64, payload, 1000, &k, NULL, 0); /* padding */
	check_open(rec, n, payload, 1000, &other, NULL, -EKEYREJECTED);
	ck_assert_str_eq(kvp_rec_strerror(-EKEYREJECTED), "other key");
	free(rec);
	free(payload);
}
END_TEST

START_TEST(plain_damage)
{
	struct kvp_rec_key k;
	uint8_t *payload, *rec = make_rec(4096, NULL, &payload);
	size_t n = kvp_rec_size(4096), i;
	uint8_t *bad = malloc(n);

	key_of(&k, 0x11);
	/* truncated anywhere: torn */
	check_open(rec, n - 1, payload, 4096, &k, NULL, -EINVAL);
	check_open(rec, 100, payload, 4096, &k, NULL, -EINVAL);
	check_open(rec, 0, payload, 4096, &k, NULL, -EINVAL);
	/* one flipped bit anywhere (0x10 of byte 48 makes the length
	 * 4112, past the buffer; of byte 49, 0: its check fails; the
	 * check's last 16 bytes are zeros, as reserved bytes are) */
	for (i = 0; i < n; i += 3) {
		int want = -EBADMSG;

		if (i < 8 || (i >= 12 && i < 16) || (i >= 50 && i < 80) ||
		    (i >= 96 && i < 128) || i == 48)
			want = -EINVAL;
		else if (i < 12)
			want = -EPROTONOSUPPORT;
		memcpy(bad, rec, n);
		bad[i] ^= 0x10;
		check_open(bad, n, payload, 4096, NULL, NULL, want);
	}
	/* the key field changed: other key for a reader that asked */
	memcpy(bad, rec, n);
	bad[20] ^= 1;
	check_open(bad, n, payload, 4096, &k, NULL, -EKEYREJECTED);
	check_open(bad, n, payload, 4096, NULL, NULL, -EBADMSG);
	/* another version (0, or one after this one) */
	memcpy(bad, rec, n);
	bad[8] = 0;
	check_open(bad, n, payload, 4096, &k, NULL, -EPROTONOSUPPORT);
	bad[8] = KVP_REC_VERSION + 1;
	check_open(bad, n, payload, 4096, &k, NULL, -EPROTONOSUPPORT);
	/* zeros where a record was never written */
	memset(bad, 0, n);
	check_open(bad, n, payload, 4096, &k, NULL, -EINVAL);
	free(bad);
	free(rec);
	free(payload);
}
END_TEST

/* A plain record rewritten as kvpager wrote it with version @ver: its
 * check is BLAKE2b-256 (1) or SHA-256 (2) over the header's first 80
 * bytes and the payload. */
static void rewrite_as(uint8_t *rec, size_t len, uint8_t ver)
{
	crypto_generichash_state st;
	unsigned int got = 0;
	EVP_MD_CTX *md;

	rec[8] = ver;
	if (ver == 1) {
		ck_assert_int_ge(sodium_init(), 0);
		crypto_generichash_init(&st, NULL, 0, 32);
		crypto_generichash_update(&st, rec, 80);
		crypto_generichash_update(&st, rec + 128, len);
		crypto_generichash_final(&st, rec + 80, 32);
		return;
	}
	md = EVP_MD_CTX_new();
	ck_assert(md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) &&
		  EVP_DigestUpdate(md, rec, 80) &&
		  EVP_DigestUpdate(md, rec + 128, len) &&
		  EVP_DigestFinal_ex(md, rec + 80, &got));
	EVP_MD_CTX_free(md);
	ck_assert_uint_eq(got, 32);
}

/* Records of versions 1 and 2 are still read; the version field says
 * which check a record carries, and no version's check passes as
 * another's. */
START_TEST(older_versions_still_read)
{
	struct kvp_rec_key k;
	uint8_t *payload, *rec = make_rec(4096, NULL, &payload);
	size_t n = kvp_rec_size(4096);
	uint8_t ver;

	key_of(&k, 0x11);
	ck_assert_uint_eq(rec[8], 3); /* written as version 3 */
	for (ver = 1; ver <= 2; ver++) {
		uint8_t *old = malloc(n);

		memcpy(old, rec, n);
		old[8] = ver; /* version 3's check under an older version */
		check_open(old, n, payload, 4096, &k, NULL, -EBADMSG);
		rewrite_as(old, 4096, ver);
		check_open(old, n, payload, 4096, &k, NULL, 0);
		/* its check does not pass as the other older version's,
		 * nor as version 3's (whose last 16 bytes are zeros) */
		old[8] = 3 - ver;
		check_open(old, n, payload, 4096, &k, NULL, -EBADMSG);
		old[8] = 3;
		check_open(old, n, payload, 4096, &k, NULL, -EINVAL);
		memset(old + 96, 0, 16);
		check_open(old, n, payload, 4096, &k, NULL, -EBADMSG);
		free(old);
	}
	free(rec);
	free(payload);
}
END_TEST

/* Version 3's check is exactly XXH3-128, canonical (big endian), of
 * bytes 0..79 and the payload, then 16 zeros: computed here without the
 * library's code, at lengths that take each of XXH3's paths. */
START_TEST(v3_check_is_xxh3_128)
{
	static const size_t lens[] = { 0, 1, 100, 160, 161, 1000, 1024,
				       4096, 100000 };
	size_t i;

	for (i = 0; i < sizeof(lens) / sizeof(*lens); i++) {
		uint8_t *payload, *rec = make_rec(lens[i], NULL, &payload);
		uint8_t *cat = malloc(80 + lens[i] + 1), zero[16] = { 0 };
		XXH128_canonical_t c;

		memcpy(cat, rec, 80);
		memcpy(cat + 80, payload, lens[i]);
		XXH128_canonicalFromHash(&c, XXH3_128bits(cat, 80 + lens[i]));
		ck_assert_uint_eq(rec[8], 3);
		ck_assert_mem_eq(rec + 80, c.digest, 16);
		ck_assert_mem_eq(rec + 96, zero, 16);
		free(cat);
		free(rec);
		free(payload);
	}
}
END_TEST

START_TEST(sealed)
{
	struct kvp_rec_cipher c1, c2;
	struct kvp_rec_key k;
	uint8_t *payload, *rec, *plain, *ppay, *bad;
	size_t n = kvp_rec_size(3000), i;

	memset(c1.key, 0xa5, 32);
	memset(c2.key, 0x5a, 32);
	key_of(&k, 0x11);
	rec = make_rec(3000, &c1, &payload);
	/* at rest it is not the payload */
	ck_assert(memcmp(rec + 128, payload, 3000));
	check_open(rec, n, payload, 3000, &k, &c1, 0);
	check_open(rec, n, payload, 3000, &k, &c2, -EBADMSG);
	check_open(rec, n, payload, 3000, &k, NULL, -ENOKEY);
	/* a plain record where sealed ones are expected */
	plain = make_rec(3000, NULL, &ppay);
	check_open(plain, n, ppay, 3000, &k, &c1, -EACCES);
	/* tampered anywhere in the authenticated part */
	bad = malloc(n);
	for (i = 16; i < n; i += 61) {
		if (i >= 48 && i < 56)
			continue; /* length: torn or tag */
		if (i >= 96 && i < 128)
			continue; /* zeros past the tag: torn */
		memcpy(bad, rec, n);
		bad[i] ^= 4;
		check_open(bad, n, payload, 3000, NULL, &c1, -EBADMSG);
	}
	/* two seals of one payload differ (random nonce) */
	{
		uint8_t *p2, *rec2 = make_rec(3000, &c1, &p2);

		ck_assert(memcmp(rec2 + 56, rec + 56, 24));
		free(rec2);
		free(p2);
	}
	free(bad);
	free(plain);
	free(ppay);
	free(rec);
	free(payload);
}
END_TEST

START_TEST(limits)
{
	struct kvp_rec_key k, got;
	uint8_t rec[KVP_REC_HEADER_BYTES];
	uint64_t len;
	uint32_t flags;

	key_of(&k, 3);
	ck_assert_int_eq(kvp_rec_seal(&k, "", KVP_REC_MAX_PAYLOAD + 1, NULL,
				      rec),
			 -EINVAL);
	/* an empty payload is a record */
	ck_assert_int_eq(kvp_rec_seal(&k, "", 0, NULL, rec), 0);
	ck_assert_int_eq(kvp_rec_peek(rec, sizeof(rec), &got, &len, &flags),
			 0);
	ck_assert_mem_eq(got.b, k.b, 32);
	ck_assert_uint_eq(len, 0);
	ck_assert_uint_eq(flags, 0);
	ck_assert_int_eq(kvp_rec_peek(rec, 127, &got, &len, &flags), -EINVAL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache_record");
	TCase *tc = kvp_test_tcase(s, "record", 60);

	tcase_add_test(tc, keys_chain);
	tcase_add_test(tc, plain_round_trip);
	tcase_add_test(tc, plain_damage);
	tcase_add_test(tc, older_versions_still_read);
	tcase_add_test(tc, v3_check_is_xxh3_128);
	tcase_add_test(tc, sealed);
	tcase_add_test(tc, limits);
	return kvp_test_run(s);
}
