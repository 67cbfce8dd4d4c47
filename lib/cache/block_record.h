/*
 * block_record.h - the prefix cache's block keys and the record that
 * carries one KV block wherever it is stored (a cache directory's file, a
 * remote store's value).
 *
 * A KEY names a whole prefix, not just a block: it is BLAKE2b-256
 * (libsodium's crypto_generichash) of a domain string, the key context
 * (the model's identity, the KV geometry and dtype, the payload's kind,
 * the namespace salt), the parent block's key (zeros for a sequence's
 * first block) and the block's token ids.  Two sequences that share their
 * first n blocks of tokens share those n keys; a block written under one
 * salt, model or geometry is never named under another.  A cache that
 * seals binds its cipher key into the salt (kvp_rec_keyctx_cipher), so
 * that blocks of two cipher keys, or of a key and none, never share a
 * name: one never takes the other's place.
 *
 * A RECORD is a 128-byte header and the payload, all integers little
 * endian:
 *
 *   offset size  field
 *        0    8  magic "KVPCBLK\n"
 *        8    4  format version (KVP_REC_VERSION, 3; 1 and 2 are still
 *                read)
 *       12    4  flags: bit 0 sealed (encrypted); other bits zero
 *       16   32  key
 *       48    8  payload length in bytes
 *       56   24  nonce (sealed: random; plain: zeros)
 *       80   32  check: plain, XXH3-128 (canonical, big endian) of
 *                bytes 0..79 and the payload, then 16 zeros (version
 *                2: SHA-256, version 1: BLAKE2b-256, 32 bytes);
 *                sealed, the 16-byte Poly1305 tag of
 *                XChaCha20-Poly1305 (IETF) with bytes 0..79 as
 *                associated data, then 16 zeros
 *      112   16  zeros (reserved)
 *      128    n  payload (sealed: its ciphertext, same length)
 *
 * So a record proves its key, version and length along with its payload:
 * a torn, truncated, corrupted or (sealed) tampered record, or one sealed
 * under another cipher key, fails verification and is never served.
 * Bytes past 128 + n (padding of an O_DIRECT file) are ignored.
 *
 * Thread safety: every function is reentrant; a cipher is read only.
 */
#ifndef KVP_BLOCK_RECORD_H
#define KVP_BLOCK_RECORD_H

#include <stddef.h>
#include <stdint.h>

#define KVP_REC_MAGIC	     "KVPCBLK\n"
/* 3: the plain check is XXH3-128, about 17 times faster than version 2's
 * SHA-256 here (which was 3 times faster than version 1's BLAKE2b): a
 * mapped hit pays it per byte, beside the prefill's math. */
#define KVP_REC_VERSION	     3u
#define KVP_REC_HEADER_BYTES 128u
#define KVP_REC_KEY_BYTES    32u
#define KVP_REC_FLAG_SEALED  1u
/* A payload larger than this is refused (a length field that is garbage
 * must not make a reader allocate it). */
#define KVP_REC_MAX_PAYLOAD (1ull << 32)

struct kvp_rec_key {
	uint8_t b[KVP_REC_KEY_BYTES];
};

/*
 * What every key of a cache binds besides its tokens.  model: a hash of
 * the model's identity (its weights' hash, or a name the user gives:
 * kvp_rec_hash); geo: the geometry and dtype words the caller defines
 * (layers, heads, KV heads, head dim, dtype, tokens per block, payload
 * kind ...; unused words zero); salt: the namespace's hash (zeros: the
 * default namespace).
 */
struct kvp_rec_keyctx {
	uint8_t model[32];
	uint32_t geo[8];
	uint8_t salt[32];
};

/* A cipher key for sealed records (32 bytes, XChaCha20-Poly1305). */
struct kvp_rec_cipher {
	uint8_t key[32];
};

/* BLAKE2b-256 of len bytes at data into out (a model's or salt's id).
 * Returns 0, or -ENOSYS when libsodium cannot initialise. */
int kvp_rec_hash(const void *data, size_t len, uint8_t out[32]);

/*
 * kvp_rec_block_key - the key of a block of n tokens whose parent block has
 * key parent (NULL: the sequence's first block) under ctx.  Returns 0 or
 * -ENOSYS (libsodium).
 */
int kvp_rec_block_key(const struct kvp_rec_keyctx *ctx,
		      const struct kvp_rec_key *parent, const uint32_t *tokens,
		      uint32_t n, struct kvp_rec_key *out);

/*
 * kvp_rec_keyctx_cipher - bind cipher into ctx: its salt becomes the
 * BLAKE2b-256 of a domain string and the salt, keyed with the cipher key
 * (a pseudorandom function of the key: the keys derived from ctx say
 * nothing of it).  So the keys of a cache that seals differ from those of
 * every other cipher key and from plain ones, under any salt.  Returns 0
 * or -ENOSYS (libsodium).
 */
int kvp_rec_keyctx_cipher(struct kvp_rec_keyctx *ctx,
			  const struct kvp_rec_cipher *cipher);

/* The key as 64 lowercase hex digits and a NUL into out. */
void kvp_rec_key_hex(const struct kvp_rec_key *k, char out[65]);
/* 64 hex digits (either case) to a key: 0 or -EINVAL. */
int kvp_rec_key_parse(const char *hex, struct kvp_rec_key *out);

/* Bytes of the record of a payload of len bytes. */
static inline uint64_t kvp_rec_size(uint64_t len)
{
	return KVP_REC_HEADER_BYTES + len;
}

/*
 * kvp_rec_seal - write the record of payload (len bytes) under key into rec
 * (kvp_rec_size(len) bytes; payload may not overlap it): sealed with
 * cipher, or plain with its checksum when cipher is NULL.  Returns 0,
 * -EINVAL (len over KVP_REC_MAX_PAYLOAD), -ENOSYS (libsodium), -ENOMEM
 * (no memory for the checksum's digest state).
 */
int kvp_rec_seal(const struct kvp_rec_key *key, const void *payload,
		 uint64_t len, const struct kvp_rec_cipher *cipher, void *rec);

/*
 * kvp_rec_open - verify the record in rec (rec_len bytes: the record and
 * any padding) and, when it is sealed, decrypt its payload in place.  On 0,
 * *payload points into rec (at byte 128) and *len is its length.
 *   expect: the key the reader asked for (NULL: any key, e.g. a scan);
 *   cipher: the reader's cipher key (NULL: plain records only).
 * Returns 0 or, with rec unchanged:
 *   -EINVAL          not a record: short, bad magic, a length past rec_len
 *                    or over the limit, unknown flags, reserved bytes set
 *                    (a torn or partial write, or garbage)
 *   -EPROTONOSUPPORT a format version other than 1, 2 or 3
 *   -EKEYREJECTED    a valid header naming another key than expect
 *   -ENOKEY          sealed, and no cipher was given
 *   -EACCES          plain, and a cipher was given (a reader that encrypts
 *                    at rest serves only what authenticates)
 *   -EBADMSG         the checksum or the authentication tag does not match
 *                    (corrupt, torn, tampered, or another cipher key)
 *   -ENOSYS          libsodium cannot initialise
 *   -ENOMEM          no memory for the plain check's digest state
 */
int kvp_rec_open(void *rec, size_t rec_len, const struct kvp_rec_key *expect,
		 const struct kvp_rec_cipher *cipher, const void **payload,
		 uint64_t *len);

/*
 * kvp_rec_peek - the header's key and payload length, checking the magic,
 * version, flags and reserved bytes but not the payload (a directory
 * scan).  Same errors as kvp_rec_open but -EKEYREJECTED, -ENOKEY, -EACCES
 * and -EBADMSG; rec_len is the bytes at rec (at least the header).
 */
int kvp_rec_peek(const void *rec, size_t rec_len, struct kvp_rec_key *key,
		 uint64_t *len, uint32_t *flags);

/* A short lowercase name for a kvp_rec_open error ("torn", "version",
 * "other key", "no cipher key", "unsealed", "checksum", ...). */
const char *kvp_rec_strerror(int err);

#endif /* KVP_BLOCK_RECORD_H */
