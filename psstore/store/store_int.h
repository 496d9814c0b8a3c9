/*
 * store_int.h - the store's private declarations, for psstore/'s store,
 * grads and applier folders: keys and shard tags, the layout of a model
 * read from its meta, key lists, sparse rows' fields, member entries, and
 * reply helpers.
 */
#ifndef FRESHET_PSSTORE_STORE_INT_H
#define FRESHET_PSSTORE_STORE_INT_H

#include "psstore/redis/redis_int.h"
#include "psstore/store/rows_sparse.h"
#include "psstore/store/status.h"
#include "psstore/store/store.h"

/* ------------------------------------------------------------------------
 * Reply helpers (model.c, model_read.c, status.c).
 * ---------------------------------------------------------------------- */
/* psstore_model_name_check into c->errstr (model.c). */
fr_err_t ps_check_name(psstore_conn_t *c, const char *name);
/* Copies a bulk string reply into buf[size] (truncating); "" for any other
 * reply or NULL (model_read.c). */
void ps_reply_copy(char *buf, size_t size, const redisReply *r);
/* The id of the newest entry of the stream at key ("0-0" when none or no
 * stream) into id[PSSTORE_STREAM_ID_MAX] (status.c). */
fr_err_t ps_stream_last_id(psstore_conn_t *c, const char *key, char *id);

/* ------------------------------------------------------------------------
 * Keys (keys.c): every key of model m shares the hash tag {m}.
 * ---------------------------------------------------------------------- */
#define PS_KEY_MAX 128
/* Writes "freshet:{m}:<suffix>" into key[PS_KEY_MAX]. */
void ps_key(char *key, const char *model, const char *suffix);
/* "freshet:{m}:w:<k>", "opt:<k>", "snap:<v>" */
void ps_key_shard(char *key, const char *model, const char *what, long long k);

/* Shards (docs/design.md "Shards"): the keys of shard k of a model of S > 1
 * shards carry the tag "m/s<k>" ('/' is not allowed in model names, so no
 * model's tag is a shard's); S = 1 keeps the model's own tag. Every
 * per-shard key (ver, w:0, opt:0, offsets, grads, lease, versions, snaps,
 * snap:<v>, audit, rounds, drops, requests and a meta of the shard's own)
 * is ps_key(tag, ...), so one shard's transaction stays in one slot. */
#define PS_TAG_MAX 80
void ps_shard_tag(char *tag, const char *model, int k, int S);
/* The model's shards and their bounds, from its meta (fields shards and
 * bounds): *S = 1 (bounds untouched) for a model of one shard.
 * FR_ERR_NOTFOUND without meta, FR_ERR_PARSE for bounds that do not
 * parse. */
fr_err_t ps_model_layout(psstore_conn_t *c, const char *model, int *S, size_t *bounds);
/* The model's shard count alone: 1 for a model of one shard, and also when
 * the model has no meta (the caller then acts on one-shard keys, which do
 * not exist either, and reports the absence its own way). */
fr_err_t ps_model_shards(psstore_conn_t *c, const char *model, int *S);
/* The tag status reads go to: the model's for S = 1, shard 0's otherwise
 * (its versions, drops and snapshots stand for the model's). */
fr_err_t ps_read_tag(psstore_conn_t *c, const char *model, char *tag);

/* ------------------------------------------------------------------------
 * Every key of a model (model.c), for create --force, delete and the
 * applier's delete request.
 * ---------------------------------------------------------------------- */
typedef struct ps_keylist {
    char **keys;
    size_t n, cap;
} ps_keylist_t;

void ps_keylist_fini(ps_keylist_t *kl);
/* The model's fixed keys (whether they exist or not) and whatever SCAN
 * finds under its hash tag (snapshots, shards), without retrying a lost
 * connection (callers WATCH next). */
fr_err_t ps_model_keys(psstore_conn_t *c, const char *name, ps_keylist_t *kl);
/* Unlinks every key under tag (its fixed keys and what SCAN finds),
 * outside any transaction: a shard's, or a sharded model's own keys. */
fr_err_t ps_unlink_tag(psstore_conn_t *c, const char *tag);
/* Runs SCAN MATCH pattern COUNT 1000 to the end and passes every key to
 * add(ctx, key, len); retry as for ps_cmd_argv (0 inside a WATCH). FR_OK
 * or the first error. ps_keylist_add_key is the add that fills a key
 * list (ctx). */
fr_err_t ps_scan(psstore_conn_t *c, int retry, const char *pattern,
                 fr_err_t (*add)(void *ctx, const char *key, size_t len), void *ctx);
fr_err_t ps_keylist_add_key(void *ctx, const char *key, size_t len);
/* Appends a copy of s[0..len) to kl. FR_ERR_NOMEM leaves kl as it was. */
fr_err_t ps_keylist_add(ps_keylist_t *kl, const char *s, size_t len);
/* Pipelines UNLINK of every key of kl in batches; adds the commands queued
 * to *queued. */
fr_err_t ps_queue_unlink(psstore_conn_t *c, const ps_keylist_t *kl, size_t *queued);

/* ------------------------------------------------------------------------
 * Sparse rows (rows_sparse.c), shared by the worker's pull and the applier.
 * ---------------------------------------------------------------------- */
#define PS_ROWS_CHUNK 512 /* fields per HMGET or HSET */

/* The hash field of a row: its 4 bytes little-endian. */
void ps_row_field(uint32_t row, unsigned char f[4]);
/* Appends HMGET key for the n fields (4 bytes each), PS_ROWS_CHUNK a
 * command, to c's pipeline; counts the commands in *queued. */
fr_err_t ps_rows_queue(psstore_conn_t *c, const char *key, const unsigned char *fields, size_t n,
                       size_t *queued);
/* The row of a rows hash field (its 4 bytes, little-endian). */
uint32_t ps_field_row(const char *f);
/* Copies the first keep floats of each of an HMGET reply's n values of
 * len floats into out[n][keep]; found[i] (may be NULL) says which were
 * there (absent ones are left as they were). FR_ERR_PARSE for a value of
 * another size. */
fr_err_t ps_rows_take(psstore_conn_t *c, const redisReply *r, size_t len, size_t keep, float *out,
                      uint8_t *found, size_t n);

/* ------------------------------------------------------------------------
 * Membership entries (members.c).
 * ---------------------------------------------------------------------- */
/* Writes m's value ("<backend> <group> <clock> <idle> <beat>") into buf;
 * its length, or -1 when it does not fit. */
int ps_member_format(const psstore_member_t *m, char *buf, size_t size);
/* Parses one entry; 0, or -1 when it is not one. */
int ps_member_parse(const char *id, size_t idlen, const char *val, size_t vlen,
                    psstore_member_t *m);
/* HGETALL of a members hash into *members (grown, *cap its capacity). */
fr_err_t ps_members_read(psstore_conn_t *c, const char *key, psstore_member_t **members, size_t *n,
                         size_t *cap);

#endif
