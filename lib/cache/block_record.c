/*
 * block_record.c - block keys and records (see block_record.h for the
 * format): BLAKE2b-256 and XChaCha20-Poly1305 from libsodium, XXH3-128
 * from libxxhash for the plain check, and the checks of older versions
 * (SHA-256 from OpenSSL's libcrypto, BLAKE2b-256).
 *
 * A mapped hit verifies every record it serves, gigabytes of them, and
 * it does so while the prefill computes: the check's cost comes out of
 * the model's math, even on an idle core.  XXH3-128 with AVX2 runs at
 * about 24 GB/s here, SHA-256 (SHA extensions) at 1.4, BLAKE2b at 0.6.  A plain
 * record's check guards against torn, lost and corrupted writes; it never
 * guarded against a writer (whoever can write the file can compute any
 * unkeyed digest again): sealed records do, with their tag.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include <openssl/evp.h>
#include <sodium.h>
#include <xxhash.h>
/* XXH3's output is stable from 0.8.0 on: an older library would write
 * records every other build rejects (and removes, as torn). */
#if XXH_VERSION_NUMBER < 800
#error "libxxhash 0.8.0 or later is needed (XXH3's digests change before it)"
#endif
#if defined(__x86_64__) || defined(__i386__)
/* The library's SSE2, AVX2 and AVX-512 versions, picked at run time. */
#include <xxh_x86dispatch.h>
#endif

#include "lib/cache/block_record.h"

#define OFF_VERSION 8
#define OFF_FLAGS   12
#define OFF_KEY	    16
#define OFF_LEN	    48
#define OFF_NONCE   56
#define OFF_CHECK   80
#define OFF_RESV    112
#define AD_BYTES    OFF_CHECK /* what the check covers of the header */

/* The domain of key hashes: a key of another use or version never equals
 * one of these. */
static const char key_domain[] = "kvpager prefix cache block key v1";

/* The domain of a cipher key's salt (kvp_rec_keyctx_cipher). */
static const char cipher_domain[] = "kvpager prefix cache cipher salt v1";

static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;
static int sodium_ok;

static void sodium_start(void)
{
	sodium_ok = sodium_init() >= 0;
}

static int need_sodium(void)
{
	pthread_once(&sodium_once, sodium_start);
	return sodium_ok ? 0 : -ENOSYS;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	uint8_t acc = 0;

	while (n--)
		acc |= *p++;
	return !acc;
}

int kvp_rec_hash(const void *data, size_t len, uint8_t out[32])
{
	int err = need_sodium();

	if (err)
		return err;
	crypto_generichash(out, 32, data, len, NULL, 0);
	return 0;
}

int kvp_rec_block_key(const struct kvp_rec_keyctx *ctx,
		      const struct kvp_rec_key *parent, const uint32_t *tokens,
		      uint32_t n, struct kvp_rec_key *out)
{
	static const struct kvp_rec_key none;
	crypto_generichash_state st;
	uint8_t word[4];
	uint32_t i;
	int err = need_sodium();

	if (err)
		return err;
	crypto_generichash_init(&st, NULL, 0, sizeof(out->b));
	crypto_generichash_update(&st, (const uint8_t *)key_domain,
				  sizeof(key_domain));
	crypto_generichash_update(&st, ctx->model, sizeof(ctx->model));
	for (i = 0; i < 8; i++) {
		put_le32(word, ctx->geo[i]);
		crypto_generichash_update(&st, word, 4);
	}
	crypto_generichash_update(&st, ctx->salt, sizeof(ctx->salt));
	crypto_generichash_update(&st, (parent ? parent : &none)->b,
				  sizeof(none.b));
	put_le32(word, n);
	crypto_generichash_update(&st, word, 4);
	for (i = 0; i < n; i++) {
		put_le32(word, tokens[i]);
		crypto_generichash_update(&st, word, 4);
	}
	crypto_generichash_final(&st, out->b, sizeof(out->b));
	return 0;
}

int kvp_rec_keyctx_cipher(struct kvp_rec_keyctx *ctx,
			  const struct kvp_rec_cipher *cipher)
{
	crypto_generichash_state st;
	int err = need_sodium();

	if (err)
		return err;
	crypto_generichash_init(&st, cipher->key, sizeof(cipher->key),
				sizeof(ctx->salt));
	crypto_generichash_update(&st, (const uint8_t *)cipher_domain,
				  sizeof(cipher_domain));
	crypto_generichash_update(&st, ctx->salt, sizeof(ctx->salt));
	crypto_generichash_final(&st, ctx->salt, sizeof(ctx->salt));
	sodium_memzero(&st, sizeof(st)); /* it held the key */
	return 0;
}

void kvp_rec_key_hex(const struct kvp_rec_key *k, char out[65])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < 32; i++) {
		out[2 * i] = digits[k->b[i] >> 4];
		out[2 * i + 1] = digits[k->b[i] & 15];
	}
	out[64] = 0;
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int kvp_rec_key_parse(const char *hex, struct kvp_rec_key *out)
{
	struct kvp_rec_key k;

	for (int i = 0; i < 32; i++) {
		int hi = hex_digit(hex[2 * i]), lo;

		if (hi < 0)
			return -EINVAL;
		lo = hex_digit(hex[2 * i + 1]);
		if (lo < 0)
			return -EINVAL;
		k.b[i] = (uint8_t)(hi << 4 | lo);
	}
	if (hex[64])
		return -EINVAL;
	*out = k;
	return 0;
}

/* The plain check of a record of version ver, over the header's first 80
 * bytes and the payload: XXH3-128 in canonical (big endian) form then 16
 * zeros (version 3), SHA-256 (2) or BLAKE2b-256 (1).  0, or -ENOMEM (no
 * memory for the digest's state). */
static int plain_check(uint32_t ver, const uint8_t *hdr, const void *payload,
		       uint64_t len, uint8_t out[32])
{
	crypto_generichash_state st;
	XXH3_state_t *xs;
	EVP_MD_CTX *md;
	int ok;

	if (ver == 3) {
		xs = XXH3_createState();
		if (!xs)
			return -ENOMEM;
		(void)XXH3_128bits_reset(xs);
		(void)XXH3_128bits_update(xs, hdr, AD_BYTES);
		(void)XXH3_128bits_update(xs, payload, len);
		XXH128_canonicalFromHash((XXH128_canonical_t *)out,
					 XXH3_128bits_digest(xs));
		XXH3_freeState(xs);
		memset(out + 16, 0, 16);
		return 0;
	}
	if (ver == 1) {
		crypto_generichash_init(&st, NULL, 0, 32);
		crypto_generichash_update(&st, hdr, AD_BYTES);
		crypto_generichash_update(&st, payload, len);
		crypto_generichash_final(&st, out, 32);
		return 0;
	}
	md = EVP_MD_CTX_new();
	ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) &&
	     EVP_DigestUpdate(md, hdr, AD_BYTES) &&
	     EVP_DigestUpdate(md, payload, len) &&
	     EVP_DigestFinal_ex(md, out, NULL);
	EVP_MD_CTX_free(md);
	return ok ? 0 : -ENOMEM;
}

int kvp_rec_seal(const struct kvp_rec_key *key, const void *payload,
		 uint64_t len, const struct kvp_rec_cipher *cipher, void *rec)
{
	uint8_t *h = rec;
	int err = need_sodium();

	if (err)
		return err;
	if (len > KVP_REC_MAX_PAYLOAD)
		return -EINVAL;
	memset(h, 0, KVP_REC_HEADER_BYTES);
	memcpy(h, KVP_REC_MAGIC, 8);
	put_le32(h + OFF_VERSION, KVP_REC_VERSION);
	put_le32(h + OFF_FLAGS, cipher ? KVP_REC_FLAG_SEALED : 0);
	memcpy(h + OFF_KEY, key->b, 32);
	put_le64(h + OFF_LEN, len);
	if (!cipher) {
		memcpy(h + KVP_REC_HEADER_BYTES, payload, len);
		return plain_check(KVP_REC_VERSION, h,
				   h + KVP_REC_HEADER_BYTES, len,
				   h + OFF_CHECK);
	}
	randombytes_buf(h + OFF_NONCE,
			crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
	crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
		h + KVP_REC_HEADER_BYTES, h + OFF_CHECK, NULL, payload, len, h,
		AD_BYTES, NULL, h + OFF_NONCE, cipher->key);
	return 0;
}

int kvp_rec_peek(const void *rec, size_t rec_len, struct kvp_rec_key *key,
		 uint64_t *len, uint32_t *flags)
{
	const uint8_t *h = rec;
	uint64_t n;
	uint32_t f, ver;

	if (rec_len < KVP_REC_HEADER_BYTES || memcmp(h, KVP_REC_MAGIC, 8))
		return -EINVAL;
	ver = get_le32(h + OFF_VERSION);
	if (ver < 1 || ver > KVP_REC_VERSION)
		return -EPROTONOSUPPORT;
	f = get_le32(h + OFF_FLAGS);
	n = get_le64(h + OFF_LEN);
	if (f & ~KVP_REC_FLAG_SEALED || n > KVP_REC_MAX_PAYLOAD ||
	    !all_zero(h + OFF_RESV, KVP_REC_HEADER_BYTES - OFF_RESV))
		return -EINVAL;
	if (!(f & KVP_REC_FLAG_SEALED) &&
	    !all_zero(h + OFF_NONCE, OFF_CHECK - OFF_NONCE))
		return -EINVAL;
	/* a tag, or version 3's XXH3-128, fills half of the check */
	if ((f & KVP_REC_FLAG_SEALED || ver == 3) &&
	    !all_zero(h + OFF_CHECK + 16, 16))
		return -EINVAL;
	if (key)
		memcpy(key->b, h + OFF_KEY, 32);
	if (len)
		*len = n;
	if (flags)
		*flags = f;
	return 0;
}

int kvp_rec_open(void *rec, size_t rec_len, const struct kvp_rec_key *expect,
		 const struct kvp_rec_cipher *cipher, const void **payload,
		 uint64_t *len)
{
	uint8_t *h = rec, sum[32];
	uint64_t n;
	uint32_t f;
	int err = need_sodium();

	if (err)
		return err;
	err = kvp_rec_peek(rec, rec_len, NULL, &n, &f);
	if (err)
		return err;
	if (n > rec_len - KVP_REC_HEADER_BYTES)
		return -EINVAL;
	if (expect && memcmp(expect->b, h + OFF_KEY, 32))
		return -EKEYREJECTED;
	if (f & KVP_REC_FLAG_SEALED) {
		if (!cipher)
			return -ENOKEY;
		/* libsodium zeroes the output of a failed decryption: the
		 * tag is checked alone first (m NULL), so a refused record
		 * stays as it was */
		if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
			    NULL, NULL, h + KVP_REC_HEADER_BYTES, n,
			    h + OFF_CHECK, h, AD_BYTES, h + OFF_NONCE,
			    cipher->key))
			return -EBADMSG;
		if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
			    h + KVP_REC_HEADER_BYTES, NULL,
			    h + KVP_REC_HEADER_BYTES, n, h + OFF_CHECK, h,
			    AD_BYTES, h + OFF_NONCE, cipher->key))
			return -EBADMSG; /* not reached: checked above */
	} else {
		if (cipher)
			return -EACCES;
		err = plain_check(get_le32(h + OFF_VERSION), h,
				  h + KVP_REC_HEADER_BYTES, n, sum);
		if (err)
			return err;
		if (sodium_memcmp(sum, h + OFF_CHECK, 32))
			return -EBADMSG;
	}
	*payload = h + KVP_REC_HEADER_BYTES;
	*len = n;
	return 0;
}

const char *kvp_rec_strerror(int err)
{
	switch (err) {
	case 0:
		return "ok";
	case -EINVAL:
		return "torn or not a record";
	case -EPROTONOSUPPORT:
		return "other format version";
	case -EKEYREJECTED:
		return "other key";
	case -ENOKEY:
		return "sealed, no cipher key";
	case -EACCES:
		return "not sealed";
	case -EBADMSG:
		return "checksum or authentication failed";
	case -ENOSYS:
		return "libsodium cannot initialise";
	default:
		return "error";
	}
}
