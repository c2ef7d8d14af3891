/*
 * ferry_errors.h — every status code of ferry, in one list.
 *
 * This list is the manual of ferry's errors: each code's name, number,
 * short message (what ferry_strerror() returns) and, in a comment after
 * it, what it means.  It is also the only place codes are defined: the
 * enum below, ferry_strerror() (lib/common/error.c) and the C and Python
 * tests (tests/unit/test_errors.c, tests/python/test_errors.py, which
 * holds python/ferry/errors.py to it) all expand or read this list, so a
 * code added here is known everywhere at once.
 *
 * Codes are stable ABI: new ones are appended within their area's range,
 * none is renumbered, no number is reused, no message is reworded.
 *
 * Range map (each area owns a block of numbers):
 *      0         FERRY_OK
 *      1..9      core               ferry.h           FERRY_ERR_*
 *     10..39     safetensors        ferry.h           FERRY_ERR_ST_*
 *     40..59     patch codec        ferry.h           FERRY_ERR_PATCH_*, _BASE/_TARGET/_SHAPE_MISMATCH
 *     60..79     store              ferry_store.h     FERRY_ERR_STORE_*
 *     80..99     sync               ferry_sync.h      FERRY_ERR_SYNC_*
 *    100..119    dock               ferry_dock.h      FERRY_ERR_DOCK_*
 *    120..139    loco               ferry_loco.h      FERRY_ERR_LOCO_*
 *    140..159    signatures         ferry_sign.h      FERRY_ERR_SIG_*
 *    160..179    sharding           ferry_shard.h     FERRY_ERR_SHARD_*
 * The Python binding raises one exception class per area (FormatError,
 * PatchError, StoreError, SyncError, DockError, LocoError, SignatureError,
 * ShardError; core codes raise FerryError itself, the base of them all).
 *
 * Every public header includes ferry.h, which includes this file, so the
 * codes are visible to whoever includes any one of them.
 *
 * Use: FERRY_ERRORS(X) expands X(NAME, number, "message") once per code,
 * in number order, for example
 *     #define NAME_OF(name, num, msg) case name: return #name;
 *     switch (code) { FERRY_ERRORS(NAME_OF) }
 */
#ifndef FERRY_ERRORS_H
#define FERRY_ERRORS_H

/* The line format X(FERRY_ERR_..., number, "message") is also read by
 * tests/python/test_errors.py: keep one code per line. */
#define FERRY_ERRORS(X) \
    /* ---- 1..9 core (ferry.h) ---------------------------------------- */ \
    X(FERRY_ERR_NOMEM, 1, "out of memory") \
        /* an allocation failed */ \
    X(FERRY_ERR_ARG, 2, "invalid argument") \
        /* invalid argument from the caller */ \
    X(FERRY_ERR_IO, 3, "I/O error") \
        /* open/read/write/fsync/rename/mmap failed */ \
    X(FERRY_ERR_UNSUPPORTED, 4, "unsupported") \
        /* valid input this build cannot handle */ \
    X(FERRY_ERR_NOT_FOUND, 5, "not found") \
        /* named tensor / file / object absent */ \
    X(FERRY_ERR_LIMIT, 6, "size limit exceeded") \
        /* a declared size exceeds a hard bound */ \
    X(FERRY_ERR_INTERNAL, 7, "internal error: an invariant does not hold") \
        /* a bug in ferry (FERRY_ASSERT): the message names file:line */ \
    \
    /* ---- 10..39 safetensors (ferry.h; lib/io) ----------------------- */ \
    X(FERRY_ERR_ST_TRUNCATED, 10, "safetensors: truncated file") \
        /* file shorter than its header says */ \
    X(FERRY_ERR_ST_HEADER_SIZE, 11, "safetensors: invalid header length") \
        /* header length 0, or over the bound */ \
    X(FERRY_ERR_ST_JSON, 12, "safetensors: malformed JSON header") \
        /* header is not a well-formed JSON object */ \
    X(FERRY_ERR_ST_DTYPE, 13, "safetensors: invalid dtype") \
        /* unknown or missing dtype */ \
    X(FERRY_ERR_ST_SHAPE, 14, "safetensors: invalid shape") \
        /* shape malformed or element count overflows */ \
    X(FERRY_ERR_ST_OFFSETS, 15, "safetensors: invalid data offsets") \
        /* data_offsets malformed, unsorted, gapped, overlapping or out of \
           bounds */ \
    X(FERRY_ERR_ST_SIZE, 16, "safetensors: tensor size mismatch") \
        /* byte length != elements x dtype size */ \
    X(FERRY_ERR_ST_TRAILING, 17, "safetensors: trailing bytes") \
        /* bytes after the last tensor */ \
    X(FERRY_ERR_ST_METADATA, 18, "safetensors: invalid __metadata__") \
        /* __metadata__ is not a string map */ \
    X(FERRY_ERR_ST_DUPLICATE, 19, "safetensors: duplicate tensor name") \
        /* a tensor name appears twice */ \
    X(FERRY_ERR_ST_INDEX, 20, "safetensors: invalid sharded index") \
        /* sharded index malformed or inconsistent */ \
    \
    /* ---- 40..59 patch codec (ferry.h; lib/codec) -------------------- */ \
    X(FERRY_ERR_PATCH_MAGIC, 40, "patch: bad magic (not a ferry patch)") \
        /* not a ferry patch */ \
    X(FERRY_ERR_PATCH_VERSION, 41, "patch: unsupported format version") \
        /* format version this build cannot read */ \
    X(FERRY_ERR_PATCH_TRUNCATED, 42, "patch: truncated") \
        /* patch ends before a declared field */ \
    X(FERRY_ERR_PATCH_CORRUPT, 43, "patch: corrupt") \
        /* a field is out of range or inconsistent */ \
    X(FERRY_ERR_PATCH_CHECKSUM, 44, "patch: checksum mismatch") \
        /* the patch's own checksum does not match */ \
    X(FERRY_ERR_BASE_MISMATCH, 45, "patch: base model mismatch") \
        /* base model is not the one the patch needs */ \
    X(FERRY_ERR_TARGET_MISMATCH, 46, "patch: result does not match target hash") \
        /* result does not hash to the declared target */ \
    X(FERRY_ERR_SHAPE_MISMATCH, 47, "patch: structure change not allowed in place") \
        /* in-place target differs in structure */ \
    \
    /* ---- 60..79 store (ferry_store.h) ------------------------------- */ \
    X(FERRY_ERR_STORE_URL, 60, "store: malformed or unsupported URL") \
        /* malformed or unsupported URL, endpoint or option */ \
    X(FERRY_ERR_STORE_KEY, 61, "store: invalid key") \
        /* invalid key or prefix (see "Keys" in ferry_store.h) */ \
    X(FERRY_ERR_STORE_NOT_FOUND, 62, "store: no such object") \
        /* no such object (or no such root directory) */ \
    X(FERRY_ERR_STORE_CONFLICT, 63, "store: compare-and-swap conflict") \
        /* compare-and-swap precondition failed */ \
    X(FERRY_ERR_STORE_AUTH, 64, "store: authentication failed") \
        /* credentials missing, incomplete or rejected (401/403) */ \
    X(FERRY_ERR_STORE_TIMEOUT, 65, "store: deadline passed") \
        /* the call's deadline passed (retries included) */ \
    X(FERRY_ERR_STORE_HTTP, 66, "store: unexpected HTTP status") \
        /* unexpected HTTP status (4xx, or 5xx after the retries) */ \
    X(FERRY_ERR_STORE_NET, 67, "store: network error") \
        /* connection failures outlasted options.max_attempts */ \
    X(FERRY_ERR_STORE_READONLY, 68, "store: read-only store") \
        /* write to a read-only store (http://, https://) */ \
    X(FERRY_ERR_STORE_CORRUPT, 69, "store: corrupt or malformed answer") \
        /* malformed response, short read, bad listing */ \
    X(FERRY_ERR_STORE_RANGE, 70, "store: range past the end of the object") \
        /* range starts past the end of the object */ \
    X(FERRY_ERR_STORE_CANCELED, 71, "store: canceled") \
        /* the progress callback asked to stop */ \
    \
    /* ---- 80..99 sync (ferry_sync.h) --------------------------------- */ \
    X(FERRY_ERR_SYNC_CONFLICT, 80, "sync: another publisher moved HEAD") \
        /* HEAD was moved by another publisher (the message names it and its \
           version); the publisher handle stays fenced */ \
    X(FERRY_ERR_SYNC_MANIFEST, 81, "sync: malformed or inconsistent manifest") \
        /* HEAD, a manifest, the compaction index or a local state file is \
           malformed or inconsistent (names the key) */ \
    X(FERRY_ERR_SYNC_CORRUPT, 82, "sync: object does not match its manifest") \
        /* an object does not match its manifest: size, base or target hash, \
           checksum (names the key) */ \
    X(FERRY_ERR_SYNC_NOT_YET, 83, "sync: version not published yet") \
        /* the version asked for is newer than HEAD, or the run has no \
           version yet */ \
    X(FERRY_ERR_SYNC_GONE, 84, "sync: version no longer retained") \
        /* the version asked for is older than what the store still retains \
           (GC) */ \
    X(FERRY_ERR_SYNC_NO_PATH, 85, "sync: no verified path to the version") \
        /* every path to the target failed verification (names the last \
           object) */ \
    X(FERRY_ERR_SYNC_SHAPE, 86, "sync: model structure differs") \
        /* memory mode: the target's tensors differ in name, dtype or shape \
           from the caller's */ \
    X(FERRY_ERR_SYNC_BACKWARDS, 87, "sync: HEAD moved backwards") \
        /* HEAD is below a version already seen (a store restored or a run \
           recreated): refused */ \
    X(FERRY_ERR_SYNC_TIMEOUT, 88, "sync: no new version in time") \
        /* ferry_subscriber_wait: no newer version in time */ \
    X(FERRY_ERR_SYNC_RUN, 89, "sync: invalid run name") \
        /* invalid run name */ \
    X(FERRY_ERR_SYNC_FOREIGN, 90, "sync: a version of another run (run id differs)") \
        /* HEAD (or the state, cache or index read with it) carries another \
           run id than the one this handle pinned: a version copied from \
           another store or prefix, or a run restarted (names both ids) */ \
    \
    /* ---- 100..119 dock (ferry_dock.h) ------------------------------- \
       The first ten are the reasons a stored object is rejected (each is \
       counted apart in ferry_dock_stats.rejected_by_code); \
       FERRY_ERR_DOCK_CURSOR and after are failures of a call. */ \
    X(FERRY_ERR_DOCK_MAGIC, 100, "dock: bad magic (not a dock batch)") \
        /* object does not start with "FDCK" */ \
    X(FERRY_ERR_DOCK_FORMAT, 101, "dock: unsupported batch format") \
        /* unknown format version or header length */ \
    X(FERRY_ERR_DOCK_TRUNCATED, 102, "dock: truncated batch") \
        /* shorter than the header, or than header + payload */ \
    X(FERRY_ERR_DOCK_LENGTH, 103, "dock: hostile or inconsistent payload length") \
        /* payload length over the bound, or bytes after the payload */ \
    X(FERRY_ERR_DOCK_HEADER, 104, "dock: batch header field out of range") \
        /* a header field out of range (run id length or characters, \
           reserved bits, padding) */ \
    X(FERRY_ERR_DOCK_CHECKSUM, 105, "dock: batch checksum mismatch") \
        /* XXH3-128 of header and payload does not match */ \
    X(FERRY_ERR_DOCK_RUN, 106, "dock: batch of another run") \
        /* an intact batch of another run */ \
    X(FERRY_ERR_DOCK_KEY, 107, "dock: not a batch key") \
        /* an object under RUN/traj/ whose name is not a batch key */ \
    X(FERRY_ERR_DOCK_MISPLACED, 108, "dock: batch header disagrees with its key") \
        /* header's version / island / seq differ from its key's */ \
    X(FERRY_ERR_DOCK_FUTURE, 109, "dock: batch from a future policy version") \
        /* ASYNC: batch version > trainer version */ \
    X(FERRY_ERR_DOCK_CURSOR, 110, "dock: malformed cursor") \
        /* the cursor object is malformed, of another run, or (a ring \
           given) not signed by a publisher key as the ring requires */ \
    X(FERRY_ERR_DOCK_REGRESSED, 111, "dock: trainer version went backwards") \
        /* trainer_version below one this run's consumer already used */ \
    X(FERRY_ERR_DOCK_CONTENDED, 112, "dock: cursor contended by another consumer") \
        /* the cursor kept changing under us (another consumer) */ \
    X(FERRY_ERR_DOCK_SIGNATURE, 113, "dock: batch unsigned, wrongly signed or by a key not enrolled") \
        /* (keys enrolled) batch unsigned, signed by a key not enrolled for \
           its island, or forged: quarantined */ \
    X(FERRY_ERR_DOCK_REPLAY, 114, "dock: replayed batch (island and sequence already taken)") \
        /* (keys enrolled) a signed batch whose (island, seq) was already \
           taken or dropped: quarantined */ \
    X(FERRY_ERR_DOCK_ROLLBACK, 115, "dock: cursor gone or moved backwards") \
        /* the cursor this consumer held (or the one resume_commits names) \
           is gone, or was replaced by one that lost what it recorded */ \
    \
    /* ---- 120..139 loco (ferry_loco.h) ------------------------------- */ \
    X(FERRY_ERR_LOCO_MAGIC, 120, "loco: bad magic (not a loco payload)") \
        /* not a loco payload */ \
    X(FERRY_ERR_LOCO_VERSION, 121, "loco: unsupported payload version or kind") \
        /* format version or kind this build cannot read */ \
    X(FERRY_ERR_LOCO_TRUNCATED, 122, "loco: truncated payload") \
        /* payload ends before its header or body */ \
    X(FERRY_ERR_LOCO_CORRUPT, 123, "loco: corrupt payload") \
        /* inconsistent lengths, bad zstd frame, bad or non-minimal varint, \
           reserved field not 0 */ \
    X(FERRY_ERR_LOCO_CHECKSUM, 124, "loco: payload checksum mismatch") \
        /* the payload's XXH3-64 does not match */ \
    X(FERRY_ERR_LOCO_INDEX, 125, "loco: index out of range") \
        /* an index at or past n */ \
    X(FERRY_ERR_LOCO_COUNT, 126, "loco: more entries than weights") \
        /* more entries than weights */ \
    X(FERRY_ERR_LOCO_VALUE, 127, "loco: non-finite value") \
        /* a non-finite value (sent or received) */ \
    X(FERRY_ERR_LOCO_SIZE, 128, "loco: payload for a model of another size") \
        /* payload for a model of another size */ \
    X(FERRY_ERR_LOCO_ROUND, 129, "loco: payload of another round or rank") \
        /* payload of another round or rank */ \
    X(FERRY_ERR_LOCO_TRAILING, 130, "loco: trailing bytes after the payload") \
        /* bytes after the body */ \
    X(FERRY_ERR_LOCO_MPI, 131, "loco: MPI call failed") \
        /* an MPI call failed */ \
    X(FERRY_ERR_LOCO_DIVERGED, 132, "loco: ranks hold different weights") \
        /* ranks hold different weights */ \
    X(FERRY_ERR_LOCO_PEER, 133, "loco: another rank failed") \
        /* another rank failed this round */ \
    X(FERRY_ERR_LOCO_MODE, 134, "loco: call not valid in this mode") \
        /* call not valid in this mode */ \
    \
    /* ---- 140..159 signatures (ferry_sign.h) ------------------------- */ \
    X(FERRY_ERR_SIG_MISSING, 140, "signature: unsigned, and signatures are required") \
        /* trusted keys are set, the record is unsigned */ \
    X(FERRY_ERR_SIG_MALFORMED, 141, "signature: trailer cut short or garbled") \
        /* a signature trailer that is cut short or garbled */ \
    X(FERRY_ERR_SIG_UNTRUSTED, 142, "signature: signed by a key that is not trusted") \
        /* signed by a key that is not trusted (for that island) */ \
    X(FERRY_ERR_SIG_INVALID, 143, "signature: does not verify (forged or altered)") \
        /* a trusted key's signature that does not verify (forged or altered \
           bytes) */ \
    X(FERRY_ERR_SIG_DIGEST, 144, "signature: object does not match its signed digest") \
        /* an object whose SHA-256 is not its signed manifest's, or a signed \
           manifest that gives no digest */ \
    X(FERRY_ERR_SIG_KEY, 145, "signature: key file unreadable, malformed or unsafe") \
        /* a key file unreadable, malformed, not Ed25519, or a private key \
           readable by group or others */ \
    \
    /* ---- 160..179 sharding (ferry_shard.h) -------------------------- */ \
    X(FERRY_ERR_SHARD_PARTS, 160, "shard: parts overlap, leave a gap, repeat or changed layout") \
        /* parts overlap, leave a gap, are given twice, or disagree on a \
           tensor's dtype or shape, or the part layout changed from the \
           previous version (names the tensor, rows and ranks) */ \
    X(FERRY_ERR_SHARD_FOREIGN, 161, "shard: token or part record of another run, version or publish") \
        /* a token or part record of another run, version or publish, or a \
           record whose base is not the previous version */ \
    X(FERRY_ERR_SHARD_WORLD, 162, "shard: rank missing, repeated, out of range or rank count changed") \
        /* rank out of range, a rank's record missing or given twice, or the \
           rank count differs from the run's previous version */ \
    X(FERRY_ERR_SHARD_REGION, 163, "shard: region outside its tensor or naming none") \
        /* a region names no tensor of the version, or lies outside its \
           tensor */ \
    X(FERRY_ERR_SHARD_KIND, 164, "shard: sharded call on a single-rank run (or the reverse)") \
        /* a sharded call on a run whose HEAD is a single-rank version, or \
           the reverse */ \
    X(FERRY_ERR_SHARD_INDEX, 165, "shard: a rank object's tile index is malformed") \
        /* the tile index at the end of a rank object: wrong magic, a tile \
           count other than the manifest's, lengths that overflow or do not \
           end where the index starts, a section outside its object (names \
           the object and field) */

/* FERRY_OK and every code of the list.  ferry_strerror() names any of
 * them ("unknown error" for a number not in the list). */
#define FERRY_ERROR_ENUM_ENTRY_(name, num, msg) name = num,
enum ferry_status {
    FERRY_OK = 0,
    FERRY_ERRORS(FERRY_ERROR_ENUM_ENTRY_)
};
#undef FERRY_ERROR_ENUM_ENTRY_

#endif
