/*
 * model.c - a model's lifecycle in Redis (docs/design.md "Redis layout"):
 * create, info, list, delete, a consistent read of the weights, and the
 * store's offsets of one partition for ingest.
 *
 * Writers take care of the one-writer rule: create and delete run as one
 * WATCH/MULTI/EXEC over meta and lease, and refuse to touch a model whose
 * lease is held by a running applier. Every command after a WATCH is sent
 * without retry, because a silent reconnect would drop the WATCH and let
 * the transaction run unguarded.
 *
 * Threads: as the connection they are given (one thread at a time).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "psstore/store/store_int.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
/* w:<k> holds little-endian float32 and the weights are sent as they lie in
 * memory; a big-endian host would need a byte swap on every pull and push. */
#error "freshet stores weights as little-endian float32: big-endian hosts are not supported"
#endif

/* Transactions retried this many times when a watched key changes. */
#define MODEL_TX_TRIES 5
/* Redis strings hold at most 512 MiB (proto-max-bulk-len). */
#define MODEL_MAX_FLOATS ((size_t)512 * 1024 * 1024 / sizeof(float))
/* Keys unlinked per UNLINK command. */
#define MODEL_UNLINK_BATCH 256
/* The suffixes of the keys every model may have; snapshots (snap:<v>) and
 * other shards are found by SCAN. */
static const char *const model_suffixes[] = {"meta",  "lease",    "ver",   "w:0",     "opt:0",
                                             "avg:0", "offsets",  "grads", "members", "versions",
                                             "snaps", "requests", "audit", "rounds",  "drops",
                                             "evals", "logend",   "rows",  "changes", "quarantine"};
#define NSUFFIXES (sizeof(model_suffixes) / sizeof(model_suffixes[0]))

/* A reply of the wrong shape: FR_ERR_REDIS naming the command. */
static fr_err_t unexpected(psstore_conn_t *c, const char *cmd)
{
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    return ps_fail(c, FR_ERR_REDIS, "redis %s: unexpected reply to %s", ep, cmd);
}

/*
 * Names become part of every key, between the braces of the hash tag, so a
 * brace, a glob character or a space would break the layout. The message
 * quotes a printable name and shows other bytes in hex.
 */
fr_err_t psstore_model_name_check(const char *name, char *errstr, size_t size)
{
    static const char rule[] = "names match [A-Za-z0-9._-]{1,64}";
    if (name == NULL || name[0] == '\0')
        return fr_errorf(FR_ERR_INVAL, errstr, size, "model name is empty (%s)", rule);
    size_t n = strlen(name);
    if (n > 64)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "model name is %zu characters long (%s)", n,
                         rule);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (fr_name_char(ch))
            continue;
        if (ch > ' ' && ch < 0x7f)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "model name '%s': '%c' is not allowed (%s)", name, ch, rule);
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "model name: byte 0x%02x at position %zu is not allowed (%s)", ch, i,
                         rule);
    }
    return FR_OK;
}

/* Checks the name for a function of this file, into c->errstr. */
static fr_err_t check_name(psstore_conn_t *c, const char *name)
{
    return psstore_model_name_check(name, c->errstr, sizeof(c->errstr));
}

/*
 * Parses a reply holding a decimal integer (a bulk string or an integer
 * reply). Returns 0, or -1 for nil, another type or trailing text.
 */
static int reply_int64(const redisReply *r, int64_t *v)
{
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER) {
        *v = r->integer;
        return 0;
    }
    if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS)
        return -1;
    char *end;
    errno = 0;
    long long x = strtoll(r->str, &end, 10);
    if (errno != 0 || end == r->str || *end != '\0')
        return -1;
    *v = x;
    return 0;
}

/* As reply_int64 for an unsigned 64-bit decimal (the epoch). */
static int reply_uint64(const redisReply *r, uint64_t *v)
{
    if (r == NULL || r->type != REDIS_REPLY_STRING || r->str[0] < '0' || r->str[0] > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(r->str, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *v = x;
    return 0;
}

/* A fresh epoch: 64 random bits from the kernel, never 0 (0 stands for "no
 * epoch yet" in clients). FR_ERR_IO when the kernel gives none. */
static fr_err_t random_epoch(psstore_conn_t *c, uint64_t *epoch)
{
    for (int tries = 0; tries < 8; tries++)
        if (fr_random(epoch, sizeof(*epoch)) == FR_OK && *epoch != 0)
            return FR_OK;
    return ps_fail(c, FR_ERR_IO, "psstore: no random bytes for a new epoch: %s", strerror(errno));
}

/* ------------------------------------------------------------------------
 * Key lists
 * ---------------------------------------------------------------------- */
void ps_keylist_fini(ps_keylist_t *kl)
{
    for (size_t i = 0; i < kl->n; i++)
        free(kl->keys[i]);
    free(kl->keys);
    *kl = (ps_keylist_t){0};
}

/* Appends a copy of s[0..len). FR_ERR_NOMEM leaves kl as it was. */
static fr_err_t keylist_add(ps_keylist_t *kl, const char *s, size_t len)
{
    if (kl->n == kl->cap) {
        size_t cap = kl->cap ? kl->cap * 2 : 16;
        char **keys = realloc(kl->keys, cap * sizeof(*keys));
        if (keys == NULL)
            return FR_ERR_NOMEM;
        kl->keys = keys;
        kl->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return FR_ERR_NOMEM;
    memcpy(copy, s, len);
    copy[len] = '\0';
    kl->keys[kl->n++] = copy;
    return FR_OK;
}

/*
 * Runs SCAN MATCH pattern COUNT 1000 to the end and passes every key to
 * add(ctx, key, len). retry is as for ps_cmd_argv: 0 inside a WATCH, where
 * a reconnect would silently drop it. Returns FR_OK or the first error.
 */
static fr_err_t scan_all(psstore_conn_t *c, int retry, const char *pattern,
                         fr_err_t (*add)(void *ctx, const char *key, size_t len), void *ctx)
{
    char cursor[32] = "0";
    do {
        fr_err_t err;
        const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
        redisReply *r = ps_cmd_argv(c, retry, 6, argv, NULL, &err);
        if (r == NULL)
            return err;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY ||
            r->element[0]->len >= sizeof(cursor)) {
            freeReplyObject(r);
            return unexpected(c, "SCAN");
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len + 1);
        const redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements; i++) {
            if (keys->element[i]->type != REDIS_REPLY_STRING)
                continue;
            err = add(ctx, keys->element[i]->str, keys->element[i]->len);
            if (err != FR_OK) {
                freeReplyObject(r);
                return ps_fail(c, err, "psstore: out of memory listing keys");
            }
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return FR_OK;
}

static fr_err_t add_to_keylist(void *ctx, const char *key, size_t len)
{
    return keylist_add(ctx, key, len);
}

/*
 * Every key of model name: the fixed ones (whether they exist or not;
 * UNLINK ignores missing keys) and whatever SCAN finds under the model's
 * hash tag (snapshots, shards). The braces are escaped in the pattern so
 * that it reads as literal text whatever the glob syntax makes of them.
 */
fr_err_t ps_model_keys(psstore_conn_t *c, const char *name, ps_keylist_t *kl)
{
    char key[PS_KEY_MAX], pattern[PS_KEY_MAX];
    for (size_t i = 0; i < NSUFFIXES; i++) {
        ps_key(key, name, model_suffixes[i]);
        if (keylist_add(kl, key, strlen(key)) != FR_OK)
            return ps_fail(c, FR_ERR_NOMEM, "psstore: out of memory listing keys");
    }
    snprintf(pattern, sizeof(pattern), "freshet:\\{%s\\}:*", name);
    return scan_all(c, 0, pattern, add_to_keylist, kl);
}

/* Queues UNLINK for every key of kl, MODEL_UNLINK_BATCH per command; adds
 * the number of commands queued to *queued. */
fr_err_t ps_queue_unlink(psstore_conn_t *c, const ps_keylist_t *kl, size_t *queued)
{
    const char *argv[MODEL_UNLINK_BATCH + 1];
    argv[0] = "UNLINK";
    for (size_t i = 0; i < kl->n; i += MODEL_UNLINK_BATCH) {
        size_t n = kl->n - i < MODEL_UNLINK_BATCH ? kl->n - i : MODEL_UNLINK_BATCH;
        for (size_t j = 0; j < n; j++)
            argv[j + 1] = kl->keys[i + j];
        fr_err_t err = ps_pipeline_append(c, (int)n + 1, argv, NULL);
        if (err != FR_OK)
            return err;
        (*queued)++;
    }
    return FR_OK;
}

/*
 * Reads the replies of n queued commands and returns the last one (EXEC's)
 * or NULL with *err. Every reply is read even after an error reply, so the
 * connection stays in step; the first error is the one reported (a queued
 * command's error, rather than the EXECABORT that follows it).
 */
static redisReply *pipeline_finish(psstore_conn_t *c, size_t n, fr_err_t *err)
{
    char first_msg[sizeof(c->errstr)];
    fr_err_t first = FR_OK;
    redisReply *last = NULL;
    for (size_t i = 0; i < n; i++) {
        fr_err_t e;
        redisReply *r = ps_pipeline_read(c, &e);
        if (r == NULL) {
            if (first == FR_OK) {
                first = e;
                memcpy(first_msg, c->errstr, sizeof(first_msg));
            }
            if (c->ctx == NULL)
                break; /* the connection broke: no more replies will come */
            continue;
        }
        if (i == n - 1)
            last = r;
        else
            freeReplyObject(r);
    }
    if (first != FR_OK) {
        memcpy(c->errstr, first_msg, sizeof(c->errstr));
        freeReplyObject(last);
        *err = first;
        return NULL;
    }
    *err = FR_OK;
    return last;
}

/*
 * Abandons a pipeline that could not be queued in full: commands already
 * appended wait unsent in hiredis's buffer and must never go out, so the
 * connection is dropped (its WATCH with it); the next command reconnects.
 */
static void conn_drop(psstore_conn_t *c)
{
    ps_pipeline_discard(c);
}

/* Drops a WATCH after a refusal, so the connection can be reused. A failure
 * here is ignored: the refusal is what the caller reports. */
static void unwatch(psstore_conn_t *c)
{
    char saved[sizeof(c->errstr)];
    memcpy(saved, c->errstr, sizeof(saved));
    freeReplyObject(ps_cmd(c, 0, NULL, "UNWATCH"));
    memcpy(c->errstr, saved, sizeof(saved));
}

/*
 * The common start of create and delete: WATCH meta and lease, then
 * *exists = EXISTS meta and *leased = EXISTS lease. Returns FR_OK or an
 * error (the WATCH is then dropped).
 */
static fr_err_t watch_model(psstore_conn_t *c, const char *name, int *exists, int *leased)
{
    char meta[PS_KEY_MAX], lease[PS_KEY_MAX];
    ps_key(meta, name, "meta");
    ps_key(lease, name, "lease");
    fr_err_t err;
    redisReply *r = ps_cmd(c, 1, &err, "WATCH %s %s", meta, lease);
    if (r == NULL)
        return err;
    freeReplyObject(r);
    const char *argv[][2] = {{"EXISTS", meta}, {"EXISTS", lease}};
    int *out[] = {exists, leased};
    for (int i = 0; i < 2; i++) {
        r = ps_cmd_argv(c, 0, 2, argv[i], NULL, &err);
        if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
            if (r != NULL)
                err = unexpected(c, "EXISTS");
            freeReplyObject(r);
            unwatch(c);
            return err;
        }
        *out[i] = r->integer > 0;
        freeReplyObject(r);
    }
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Shards (docs/design.md "Shards")
 * ---------------------------------------------------------------------- */
fr_err_t ps_model_layout(psstore_conn_t *c, const char *model, int *S, size_t *bounds)
{
    char meta[PS_KEY_MAX];
    fr_err_t err;
    ps_key(meta, model, "meta");
    redisReply *r = ps_cmd(c, 1, &err, "HMGET %s layers shards bounds", meta);
    if (r == NULL)
        return err;
    *S = 1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        char ep[300];
        ps_endpoint(c, ep, sizeof(ep));
        err = ps_fail(c, FR_ERR_NOTFOUND, "redis %s: no model '%s'", ep, model);
    } else if (r->element[1]->type == REDIS_REPLY_STRING && strcmp(r->element[1]->str, "1") != 0) {
        int n = 0;
        const redisReply *b = r->element[2];
        if (b->type != REDIS_REPLY_STRING ||
            psstore_shard_bounds_parse(b->str, b->len, bounds, &n) != FR_OK ||
            n != atoi(r->element[1]->str))
            err = ps_fail(c, FR_ERR_PARSE, "model '%s': bad shards or bounds in its meta", model);
        else
            *S = n;
    }
    freeReplyObject(r);
    return err;
}

fr_err_t ps_model_shards(psstore_conn_t *c, const char *model, int *S)
{
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    fr_err_t err = ps_model_layout(c, model, S, bounds);
    return err == FR_ERR_NOTFOUND ? FR_OK : err;
}

fr_err_t ps_read_tag(psstore_conn_t *c, const char *model, char *tag)
{
    int S = 1;
    fr_err_t err = ps_model_shards(c, model, &S);
    if (err == FR_OK)
        ps_shard_tag(tag, model, 0, S);
    return err;
}

/* Unlinks every key of tag (its fixed keys and what SCAN finds under it).
 * The EXISTS first routes the keyless SCAN to the tag's node on a cluster. */
fr_err_t ps_unlink_tag(psstore_conn_t *c, const char *tag)
{
    char meta[PS_KEY_MAX];
    fr_err_t err;
    ps_key(meta, tag, "meta");
    redisReply *r = ps_cmd(c, 1, &err, "EXISTS %s", meta);
    if (r == NULL)
        return err;
    freeReplyObject(r);
    ps_keylist_t kl = {0};
    size_t queued = 0;
    err = ps_model_keys(c, tag, &kl);
    if (err == FR_OK)
        err = ps_queue_unlink(c, &kl, &queued);
    ps_keylist_fini(&kl);
    if (err != FR_OK) {
        ps_pipeline_discard(c);
        return err;
    }
    for (size_t i = 0; i < queued; i++) {
        r = ps_pipeline_read(c, &err);
        freeReplyObject(r);
        if (r == NULL && c->ctx == NULL)
            return err;
    }
    return err;
}

/* FR_ERR_STATE naming the shard when an applier holds the lease of one of
 * the S shards of model name (S = 1: the model's own lease). */
static fr_err_t shards_unleased(psstore_conn_t *c, const char *name, int S, const char *doing)
{
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX], lease[PS_KEY_MAX];
        fr_err_t err;
        ps_shard_tag(tag, name, k, S);
        ps_key(lease, tag, "lease");
        redisReply *r = ps_cmd(c, 1, &err, "EXISTS %s", lease);
        if (r == NULL)
            return err;
        int held = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
        freeReplyObject(r);
        if (held)
            return ps_fail(c, FR_ERR_STATE,
                           "model '%s' has a running applier (the lease of shard %d of %d is "
                           "held); stop it before %s the model",
                           name, k, S, doing);
    }
    return FR_OK;
}

/* Unlinks every shard key of name that any master holds, whatever shard
 * count wrote it (an interrupted create's leftovers too): SCAN of each
 * master for "freshet:{name/s*", then one UNLINK per key, routed by its
 * slot. */
static fr_err_t unlink_stale_shards(psstore_conn_t *c, const char *name)
{
    char pattern[PS_KEY_MAX];
    snprintf(pattern, sizeof(pattern), "freshet:\\{%s/s*", name);
    ps_keylist_t kl = {0};
    fr_err_t err = FR_OK;
    int nodes[PS_NODES_MAX];
    int n = ps_conn_masters(c, nodes, PS_NODES_MAX);
    for (int i = 0; i < n && err == FR_OK; i++) {
        ps_conn_pin(c, nodes[i]);
        err = scan_all(c, 1, pattern, add_to_keylist, &kl);
    }
    ps_conn_pin(c, -1);
    for (size_t i = 0; i < kl.n && err == FR_OK; i++) {
        const char *argv[] = {"UNLINK", kl.keys[i]};
        freeReplyObject(ps_cmd_argv(c, 1, 2, argv, NULL, &err));
    }
    ps_keylist_fini(&kl);
    return err;
}

/* Unlinks the keys of shards 0..S-1 of name (S > 1). */
static fr_err_t unlink_shards(psstore_conn_t *c, const char *name, int S)
{
    for (int k = 0; k < S && S > 1; k++) {
        char tag[PS_TAG_MAX];
        ps_shard_tag(tag, name, k, S);
        fr_err_t err = ps_unlink_tag(c, tag);
        if (err != FR_OK)
            return err;
    }
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Create and delete
 * ---------------------------------------------------------------------- */

/*
 * Judges EXEC's reply r (freed here): FR_OK when every command ran,
 * FR_ERR_STATE for a nil EXEC (a watched key changed: try again),
 * FR_ERR_REDIS with the message when a command failed inside.
 */
static fr_err_t exec_result(psstore_conn_t *c, redisReply *r)
{
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    fr_err_t err = FR_OK;
    if (r->type == REDIS_REPLY_NIL) {
        err = FR_ERR_STATE;
    } else if (r->type != REDIS_REPLY_ARRAY) {
        err = ps_fail(c, FR_ERR_REDIS, "redis %s: unexpected reply to EXEC", ep);
    } else {
        for (size_t i = 0; i < r->elements; i++) {
            if (r->element[i]->type == REDIS_REPLY_ERROR) {
                err = ps_fail(c, FR_ERR_REDIS, "redis %s: %.400s", ep, r->element[i]->str);
                break;
            }
        }
    }
    freeReplyObject(r);
    return err;
}

/* The checks of psstore_model_create's arguments, into c->errstr. */
static fr_err_t check_spec(psstore_conn_t *c, const psstore_model_spec_t *spec, const float *w)
{
    psstore_model_info_t info;
    if (spec == NULL || w == NULL || spec->layers == NULL || spec->loss == NULL)
        return ps_fail(c, FR_ERR_INVAL, "psstore: create needs a spec and weights");
    if (spec->layers[0] == '\0' || strlen(spec->layers) >= sizeof(info.layers))
        return ps_fail(c, FR_ERR_INVAL, "psstore: layers must be 1..%zu characters",
                       sizeof(info.layers) - 1);
    if (spec->loss[0] == '\0' || strlen(spec->loss) >= sizeof(info.loss))
        return ps_fail(c, FR_ERR_INVAL, "psstore: loss must be 1..%zu characters",
                       sizeof(info.loss) - 1);
    if (spec->nparams == 0 || spec->nparams > MODEL_MAX_FLOATS)
        return ps_fail(c, FR_ERR_RANGE,
                       "psstore: %zu parameters: a model holds 1 to 2^27 floats (Redis strings "
                       "hold at most 512 MiB)",
                       spec->nparams);
    /* a sparse model's w is its dense part (the bias and the tower) on
     * shard 0, one float held at 0 on each other shard (docs/design.md
     * "Sparse models on shards") */
    if (spec->sparse != NULL) {
        sparse_spec_t table;
        sparse_optim_t optim;
        char why[200];
        if (psstore_sparse_meta_parse(spec->sparse, &table, &optim, why, sizeof(why)) != FR_OK)
            return ps_fail(c, FR_ERR_INVAL, "psstore: %s", why);
        size_t want = sparse_dense_len(&table) + (size_t)(spec->shards > 1 ? spec->shards - 1 : 0);
        if (spec->nparams != want)
            return ps_fail(c, FR_ERR_INVAL,
                           "psstore: a sparse model's w is its dense part (%zu floats) and a "
                           "float a shard past 0: %zu floats, not %zu",
                           sparse_dense_len(&table), want, spec->nparams);
    }
    return FR_OK;
}

/*
 * Queues MULTI, the unlinking of kl, the new keys of tag and EXEC: meta
 * (the fields of fields[nfields], then created, epoch and redis_run_id),
 * ver 0, w:0 = w[n] and an empty opt:0. For a model of one shard tag is
 * the model; for shard k of a sharded model, the shard's tag. The weights
 * go out as they lie in memory (%b), with no copy of our own.
 */
static fr_err_t queue_create(psstore_conn_t *c, const char *tag, const char *const *fields,
                             int nfields, const float *w, size_t n, const char *run_id,
                             uint64_t epoch, const ps_keylist_t *kl, size_t *queued)
{
    char meta[PS_KEY_MAX], ver[PS_KEY_MAX], wkey[PS_KEY_MAX], opt[PS_KEY_MAX];
    char created[32], epoch_s[32];
    ps_key(meta, tag, "meta");
    ps_key(ver, tag, "ver");
    ps_key_shard(wkey, tag, "w", 0);
    ps_key_shard(opt, tag, "opt", 0);
    snprintf(created, sizeof(created), "%" PRId64, fr_clock_unix_ms());
    snprintf(epoch_s, sizeof(epoch_s), "%" PRIu64, epoch);

    const char *multi[] = {"MULTI"};
    const char *hset[16] = {"HSET", meta};
    int nh = 2;
    for (int i = 0; i < nfields && nh < 10; i++)
        hset[nh++] = fields[i];
    const char *tail[] = {"created", created, "epoch", epoch_s, "redis_run_id", run_id};
    for (size_t i = 0; i < sizeof(tail) / sizeof(tail[0]); i++)
        hset[nh++] = tail[i];
    const char *set_ver[] = {"SET", ver, "0"};
    const char *set_w[] = {"SET", wkey, (const char *)w};
    size_t set_w_lens[] = {3, strlen(wkey), n * sizeof(float)};
    const char *set_opt[] = {"SET", opt, ""};
    const char *exec[] = {"EXEC"};

    fr_err_t err = ps_pipeline_append(c, 1, multi, NULL);
    if (err != FR_OK)
        return err;
    ++*queued;
    if (kl != NULL && (err = ps_queue_unlink(c, kl, queued)) != FR_OK)
        return err;
    const int argcs[] = {nh, 3, 3, 3, 1};
    const char **argvs[] = {hset, set_ver, set_w, set_opt, exec};
    const size_t *lens[] = {NULL, NULL, set_w_lens, NULL, NULL};
    for (int i = 0; i < 5; i++) {
        if ((err = ps_pipeline_append(c, argcs[i], argvs[i], lens[i])) != FR_OK)
            return err;
        ++*queued;
    }
    return err;
}

/*
 * Ends a transaction whose commands were queued (err: how queueing went):
 * reads every reply when queueing succeeded, drops the connection
 * otherwise. Returns exec_result's verdict, FR_ERR_STATE when the WATCH
 * fired, or the error that stopped it.
 */
static fr_err_t finish_tx(psstore_conn_t *c, fr_err_t err, size_t queued)
{
    redisReply *r = NULL;
    if (err == FR_OK)
        r = pipeline_finish(c, queued, &err);
    else
        conn_drop(c);
    if (r == NULL && err != FR_OK)
        return err;
    return exec_result(c, r);
}

/*
 * Creates the model in one transaction: WATCH meta and lease, refuse an
 * existing model unless force, refuse a model a running applier holds,
 * then MULTI, unlink every key the name has (an old model's, or leftovers
 * without meta, such as stale offsets that would make the new model skip
 * records), write meta, ver, w:0 and opt:0, EXEC. A nil EXEC (a watched key
 * changed) starts over, up to MODEL_TX_TRIES times.
 */
/*
 * A sharded model (docs/design.md "Shards"): its shards live in S slots, so
 * no one transaction covers them. The old model's keys go first, model
 * meta first of all (the model then no longer exists for anyone), then
 * each shard is written in a transaction of its own (its meta with its own
 * epoch and its range, ver 0, its slice of w), and the model's meta
 * (layers, loss, shards, bounds) last: the model exists once every shard
 * does. An interrupted create leaves no meta, and the next create --force
 * clears what it wrote.
 */
static fr_err_t write_shards(psstore_conn_t *c, const char *name, const psstore_model_spec_t *spec,
                             const float *w, int S, const size_t *bounds, int exists, int old_S);

static fr_err_t create_sharded(psstore_conn_t *c, const char *name,
                               const psstore_model_spec_t *spec, const float *w, int force,
                               int old_S, int exists)
{
    int S = spec->shards;
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    char ep[300];
    fr_err_t err;
    if (spec->sparse != NULL) { /* rows go by row % S; w is shard 0's dense part, a float a
                                   shard past it (check_spec) */
        bounds[0] = 0;
        for (int k = 1; k <= S; k++)
            bounds[k] = spec->nparams - (size_t)(S - k);
    } else if (psstore_shard_bounds(spec->layers, spec->nparams, S, bounds, c->errstr,
                                    sizeof(c->errstr)) != FR_OK) {
        return FR_ERR_INVAL;
    }
    ps_endpoint(c, ep, sizeof(ep));
    if (exists && !force)
        return ps_fail(c, FR_ERR_EXISTS, "redis %s: model '%s' already exists", ep, name);
    /* one creator at a time: the shards are written in several transactions,
     * and a second creator's clearing would remove the first one's shards
     * (several `freshet train` starting at once on a missing model). The
     * lock's tag is no model's and no shard's. */
    char lock[PS_KEY_MAX], token[32];
    snprintf(lock, sizeof(lock), "freshet:{%s/create}:lock", name);
    snprintf(token, sizeof(token), "%016llx", (unsigned long long)fr_random_u64());
    redisReply *r = ps_cmd(c, 1, &err, "SET %s %s NX PX 30000", lock, token);
    if (r == NULL)
        return err;
    int mine = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!mine) {
        int other_S = 1;
        size_t other[PSSTORE_SHARDS_MAX + 1];
        for (int waited = 0; waited < 15000; waited += 50) { /* its model appears, or not */
            if (ps_model_layout(c, name, &other_S, other) == FR_OK)
                return ps_fail(c, FR_ERR_EXISTS,
                               "redis %s: model '%s' was created meanwhile by another process", ep,
                               name);
            struct timespec ts = {0, 50000000L};
            nanosleep(&ts, NULL);
        }
        return ps_fail(c, FR_ERR_STATE,
                       "redis %s: model '%s' is being created by another process; try again", ep,
                       name);
    }
    /* under the lock, look again: another creator may have finished first */
    size_t now_bounds[PSSTORE_SHARDS_MAX + 1];
    err = ps_model_layout(c, name, &old_S, now_bounds);
    exists = err == FR_OK;
    if (err == FR_ERR_NOTFOUND || (err == FR_OK && force))
        err = write_shards(c, name, spec, w, S, bounds, exists, old_S);
    else if (err == FR_OK)
        err = ps_fail(c, FR_ERR_EXISTS, "redis %s: model '%s' already exists", ep, name);
    /* the lock goes whatever happened (compare-and-delete: ours only) */
    static const char unlock[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then return "
                                 "redis.call('DEL', KEYS[1]) end return 0";
    freeReplyObject(ps_cmd(c, 1, NULL, "EVAL %s 1 %s %s", unlock, lock, token));
    return err;
}

/* create_sharded's writes, under its lock. */
static fr_err_t write_shards(psstore_conn_t *c, const char *name, const psstore_model_spec_t *spec,
                             const float *w, int S, const size_t *bounds, int exists, int old_S)
{
    char text[PSSTORE_SHARDS_MAX * 21 + 1], created[32], shards_s[16];
    fr_err_t err;
    if (exists && (err = shards_unleased(c, name, old_S, "replacing")) != FR_OK)
        return err;
    if ((err = ps_unlink_tag(c, name)) != FR_OK || (err = unlink_stale_shards(c, name)) != FR_OK)
        return err;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX], meta[PS_KEY_MAX], run_id[64], ks[16], lo[24], hi[24];
        uint64_t epoch;
        ps_shard_tag(tag, name, k, S);
        ps_key(meta, tag, "meta");
        snprintf(ks, sizeof(ks), "%d", k);
        snprintf(lo, sizeof(lo), "%zu", bounds[k]);
        snprintf(hi, sizeof(hi), "%zu", bounds[k + 1]);
        if ((err = random_epoch(c, &epoch)) != FR_OK ||
            (err = ps_server_run_id(c, meta, run_id, sizeof(run_id))) != FR_OK)
            return err;
        const char *fields[] = {"shard", ks, "lo", lo, "hi", hi};
        size_t queued = 0;
        err = queue_create(c, tag, fields, 6, w + bounds[k], bounds[k + 1] - bounds[k], run_id,
                           epoch, NULL, &queued);
        if ((err = finish_tx(c, err, queued)) != FR_OK)
            return err;
    }
    char meta[PS_KEY_MAX];
    ps_key(meta, name, "meta");
    psstore_shard_bounds_format(text, sizeof(text), bounds, S);
    snprintf(created, sizeof(created), "%" PRId64, fr_clock_unix_ms());
    snprintf(shards_s, sizeof(shards_s), "%d", S);
    const char *hset[] = {"HSET",     meta,     "layers", spec->layers, "loss",
                          spec->loss, "shards", shards_s, "bounds",     text,
                          "created",  created,  "sparse", spec->sparse};
    int argc = spec->sparse != NULL ? 14 : 12; /* a sparse model names its table */
    redisReply *r = ps_cmd_argv(c, 1, argc, hset, NULL, &err);
    freeReplyObject(r);
    return err;
}

fr_err_t psstore_model_create(psstore_conn_t *c, const char *name, const psstore_model_spec_t *spec,
                              const float *w, int force)
{
    fr_err_t err;
    char ep[300], run_id[64];
    if ((err = check_name(c, name)) != FR_OK || (err = check_spec(c, spec, w)) != FR_OK)
        return err;
    int old_S = 1;
    size_t old_bounds[PSSTORE_SHARDS_MAX + 1];
    err = ps_model_layout(c, name, &old_S, old_bounds);
    if (err != FR_OK && err != FR_ERR_NOTFOUND)
        return err;
    int had = err == FR_OK;
    if (spec->shards > 1)
        return create_sharded(c, name, spec, w, force, old_S, had);
    if (had && force && old_S > 1) {
        /* one shard replacing S: the old shards' keys go first */
        if ((err = shards_unleased(c, name, old_S, "replacing")) != FR_OK ||
            (err = unlink_stale_shards(c, name)) != FR_OK)
            return err;
    }
    uint64_t epoch;
    char meta[PS_KEY_MAX];
    ps_key(meta, name, "meta");
    if ((err = random_epoch(c, &epoch)) != FR_OK ||
        (err = ps_server_run_id(c, meta, run_id, sizeof(run_id))) != FR_OK)
        return err;
    ps_endpoint(c, ep, sizeof(ep));

    for (int tries = 0; tries < MODEL_TX_TRIES; tries++) {
        int exists, leased;
        if ((err = watch_model(c, name, &exists, &leased)) != FR_OK)
            return err;
        if (exists && !force) {
            unwatch(c);
            return ps_fail(c, FR_ERR_EXISTS, "redis %s: model '%s' already exists", ep, name);
        }
        if (exists && leased) {
            unwatch(c);
            return ps_fail(c, FR_ERR_STATE,
                           "redis %s: model '%s' has a running applier (its lease is held); stop "
                           "it before replacing the model",
                           ep, name);
        }
        ps_keylist_t kl = {0};
        size_t queued = 0;
        err = ps_model_keys(c, name, &kl);
        const char *fields[] = {"layers", spec->layers, "loss",   spec->loss,
                                "shards", "1",          "sparse", spec->sparse};
        int nfields = spec->sparse != NULL ? 8 : 6; /* a sparse model names its table */
        if (err == FR_OK)
            err = queue_create(c, name, fields, nfields, w, spec->nparams, run_id, epoch, &kl,
                               &queued);
        ps_keylist_fini(&kl);
        if ((err = finish_tx(c, err, queued)) != FR_ERR_STATE)
            return err;
    }
    return ps_fail(c, FR_ERR_STATE,
                   "redis %s: model '%s' kept changing while it was being created; try again", ep,
                   name);
}

/*
 * Deletes every key of the model in one transaction, as create replaces
 * one: FR_ERR_NOTFOUND without meta, FR_ERR_STATE while an applier holds
 * the lease (docs/design.md "One writer and fencing": only the lease holder writes the model).
 */
fr_err_t psstore_model_delete(psstore_conn_t *c, const char *name)
{
    fr_err_t err;
    char ep[300];
    if ((err = check_name(c, name)) != FR_OK)
        return err;
    int S = 1;
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    err = ps_model_layout(c, name, &S, bounds);
    if (err != FR_OK && err != FR_ERR_NOTFOUND)
        return err;
    if (S > 1) {
        /* the model's own keys first (meta: the model is gone for everyone),
         * then each shard's; shards cannot be in one transaction */
        if ((err = shards_unleased(c, name, S, "deleting")) != FR_OK ||
            (err = ps_unlink_tag(c, name)) != FR_OK)
            return err;
        return unlink_shards(c, name, S);
    }
    ps_endpoint(c, ep, sizeof(ep));
    for (int tries = 0; tries < MODEL_TX_TRIES; tries++) {
        int exists, leased;
        if ((err = watch_model(c, name, &exists, &leased)) != FR_OK)
            return err;
        if (!exists || leased) {
            unwatch(c);
            if (!exists)
                return ps_fail(c, FR_ERR_NOTFOUND, "redis %s: no model '%s'", ep, name);
            return ps_fail(c, FR_ERR_STATE,
                           "redis %s: model '%s' has a running applier (its lease is held); "
                           "stop it before deleting the model",
                           ep, name);
        }
        ps_keylist_t kl = {0};
        size_t queued = 0;
        const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
        err = ps_model_keys(c, name, &kl);
        if (err == FR_OK && (err = ps_pipeline_append(c, 1, multi, NULL)) == FR_OK)
            queued++;
        if (err == FR_OK)
            err = ps_queue_unlink(c, &kl, &queued);
        if (err == FR_OK && (err = ps_pipeline_append(c, 1, exec, NULL)) == FR_OK)
            queued++;
        ps_keylist_fini(&kl);
        if ((err = finish_tx(c, err, queued)) != FR_ERR_STATE)
            return err;
    }
    return ps_fail(c, FR_ERR_STATE,
                   "redis %s: model '%s' kept changing while it was being deleted; try again", ep,
                   name);
}

/* ------------------------------------------------------------------------
 * Reading
 * ---------------------------------------------------------------------- */

/*
 * Runs the read-only transaction "MULTI, cmds..., EXEC" and returns EXEC's
 * reply (an array of ncmds replies; caller frees) or NULL with err. Being
 * read-only it is run again once when the connection broke on the way.
 */
static redisReply *read_tx(psstore_conn_t *c, int ncmds, const int *argcs,
                           const char *const *const *argvs, fr_err_t *err)
{
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    for (int attempt = 0; attempt < 2; attempt++) {
        size_t queued = 0;
        *err = ps_pipeline_append(c, 1, multi, NULL);
        for (int i = 0; *err == FR_OK && i < ncmds; i++)
            *err = ps_pipeline_append(c, argcs[i], (const char **)argvs[i], NULL);
        if (*err == FR_OK)
            *err = ps_pipeline_append(c, 1, exec, NULL);
        if (*err != FR_OK) {
            conn_drop(c);
            return NULL;
        }
        queued = (size_t)ncmds + 2;
        redisReply *r = pipeline_finish(c, queued, err);
        if (r != NULL && (r->type != REDIS_REPLY_ARRAY || r->elements != (size_t)ncmds)) {
            freeReplyObject(r);
            *err = unexpected(c, "EXEC");
            return NULL;
        }
        if (r != NULL || c->ctx != NULL)
            return r;
    }
    return NULL;
}

void ps_reply_copy(char *buf, size_t size, const redisReply *r)
{
    size_t n = 0;
    if (r != NULL && r->type == REDIS_REPLY_STRING) {
        n = r->len < size - 1 ? r->len : size - 1;
        memcpy(buf, r->str, n);
    }
    buf[n] = '\0';
}

static int cmp_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Fills info from the fields of an HGETALL meta reply (field, value, ...). */
static void info_from_meta(psstore_model_info_t *info, const redisReply *meta)
{
    for (size_t i = 0; i + 1 < meta->elements; i += 2) {
        const redisReply *f = meta->element[i], *v = meta->element[i + 1];
        int64_t x;
        if (f->type != REDIS_REPLY_STRING)
            continue;
        if (strcmp(f->str, "layers") == 0)
            ps_reply_copy(info->layers, sizeof(info->layers), v);
        else if (strcmp(f->str, "loss") == 0)
            ps_reply_copy(info->loss, sizeof(info->loss), v);
        else if (strcmp(f->str, "sparse") == 0)
            ps_reply_copy(info->sparse, sizeof(info->sparse), v);
        else if (strcmp(f->str, "stopped") == 0)
            ps_reply_copy(info->stopped, sizeof(info->stopped), v);
        else if (strcmp(f->str, "mode") == 0)
            ps_reply_copy(info->mode, sizeof(info->mode), v);
        else if (strcmp(f->str, "phase") == 0)
            ps_reply_copy(info->phase, sizeof(info->phase), v);
        else if (strcmp(f->str, "mode_switches") == 0 && reply_int64(v, &x) == 0)
            info->mode_switches = x;
        else if (strcmp(f->str, "epoch") == 0)
            reply_uint64(v, &info->epoch);
        else if (strcmp(f->str, "shards") == 0 && reply_int64(v, &x) == 0 && x > 0 && x < 1 << 20)
            info->shards = (int)x;
        else if (strcmp(f->str, "created") == 0 && reply_int64(v, &x) == 0)
            info->created_ms = x;
    }
}

/*
 * Reads meta, ver, the size of w:0 and the newest 64 retained snapshots in
 * one transaction. snaps maps each version (member) to the unix ms it was
 * taken (score), so score order is version order; the versions are sorted
 * all the same. FR_ERR_NOTFOUND without meta.
 */
static fr_err_t info_one(psstore_conn_t *c, const char *name, psstore_model_info_t *info)
{
    fr_err_t err;
    char ep[300], meta[PS_KEY_MAX], ver[PS_KEY_MAX], wkey[PS_KEY_MAX], snaps[PS_KEY_MAX];
    ps_endpoint(c, ep, sizeof(ep));
    ps_key(meta, name, "meta");
    ps_key(ver, name, "ver");
    ps_key_shard(wkey, name, "w", 0);
    ps_key(snaps, name, "snaps");
    const char *hgetall[] = {"HGETALL", meta}, *get[] = {"GET", ver}, *strlen_[] = {"STRLEN", wkey};
    const char *zrange[] = {"ZRANGE", snaps, "-64", "-1"};
    const int argcs[] = {2, 2, 2, 4};
    const char *const *argvs[] = {hgetall, get, strlen_, zrange};
    redisReply *r = read_tx(c, 4, argcs, argvs, &err);
    if (r == NULL)
        return err;
    ps_endpoint(c, ep, sizeof(ep)); /* on a cluster, the model's master */
    const redisReply *m = r->element[0], *v = r->element[1], *len = r->element[2],
                     *sn = r->element[3];
    int64_t version = 0, bytes = 0;
    psstore_model_info_t probe = {.shards = 1};
    if (m->type == REDIS_REPLY_ARRAY)
        info_from_meta(&probe, m);
    if (m->type != REDIS_REPLY_ARRAY || m->elements == 0) {
        err = ps_fail(c, FR_ERR_NOTFOUND, "redis %s: no model '%s'", ep, name);
    } else if (probe.shards == 1 &&
               (reply_int64(v, &version) != 0 || reply_int64(len, &bytes) != 0)) {
        err = ps_fail(c, FR_ERR_PARSE, "redis %s: model '%s' has no valid ver", ep, name);
    } else {
        memset(info, 0, sizeof(*info));
        snprintf(info->name, sizeof(info->name), "%s", name);
        info->shards = 1;
        info_from_meta(info, m);
        info->version = version;
        info->bytes = (size_t)bytes;
        for (size_t i = 0; sn->type == REDIS_REPLY_ARRAY && i < sn->elements && i < 64; i++) {
            if (reply_int64(sn->element[i], &info->snaps[info->nsnaps]) == 0)
                info->nsnaps++;
        }
        qsort(info->snaps, info->nsnaps, sizeof(info->snaps[0]), cmp_int64);
        snprintf(info->node, sizeof(info->node), "%s", ep);
        info->slot = psstore_conn_is_cluster(c) ? psstore_key_slot(meta, strlen(meta)) : -1;
    }
    freeReplyObject(r);
    return err;
}

/*
 * A sharded model's info adds up its shards' (docs/design.md "Shards"):
 * the version and epoch are the sums of theirs (the version then changes
 * whenever a shard's does), bytes the whole vector's; the mode, phase and
 * snapshots are shard 0's (snapshots are coordinated: every shard takes
 * shard 0's), the guard's reason the first stopped shard's.
 */
fr_err_t psstore_model_info(psstore_conn_t *c, const char *name, psstore_model_info_t *info)
{
    fr_err_t err;
    if ((err = check_name(c, name)) != FR_OK || (err = info_one(c, name, info)) != FR_OK)
        return err;
    info->shard_versions[0] = info->version;
    info->bounds[0] = 0;
    info->bounds[1] = info->bytes / sizeof(float);
    if (info->shards <= 1)
        return FR_OK;
    int S = 1;
    if ((err = ps_model_layout(c, name, &S, info->bounds)) != FR_OK)
        return err;
    info->shards = S;
    info->epoch = 0;
    info->version = 0;
    info->bytes = 0;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX];
        psstore_model_info_t sh;
        ps_shard_tag(tag, name, k, S);
        if ((err = info_one(c, tag, &sh)) != FR_OK)
            return ps_fail(c, err, "model '%s', shard %d: %s", name, k, psstore_conn_error(c));
        info->epoch += sh.epoch;
        info->version += sh.version;
        info->shard_versions[k] = sh.version;
        info->bytes += sh.bytes;
        if (info->stopped[0] == '\0' && sh.stopped[0] != '\0')
            snprintf(info->stopped, sizeof(info->stopped), "shard %d: %.200s", k, sh.stopped);
        if (k == 0) {
            memcpy(info->mode, sh.mode, sizeof(info->mode));
            memcpy(info->phase, sh.phase, sizeof(info->phase));
            info->mode_switches = sh.mode_switches;
            info->nsnaps = sh.nsnaps;
            memcpy(info->snaps, sh.snaps, sizeof(info->snaps));
        }
    }
    return FR_OK;
}

/* Reads the weights, their epoch and version in one transaction (see
 * psstore.h); the only copy is from hiredis's reply into w. */
/* "topic/partition=watermark,..." of an HGETALL offsets reply (malloc'ed,
 * "" when empty); NULL when out of memory. */
static char *watermarks_text(const redisReply *o)
{
    size_t np = o->type == REDIS_REPLY_ARRAY ? o->elements / 2 : 0, len = 0;
    char *text = malloc(np * 300 + 1);
    if (text == NULL)
        return NULL;
    text[0] = '\0';
    for (size_t i = 0; i < np; i++) {
        const redisReply *k = o->element[2 * i], *val = o->element[2 * i + 1];
        psstore_partition_offsets_t po;
        psstore_poff_init(&po, 0);
        if (k->type == REDIS_REPLY_STRING && val->type == REDIS_REPLY_STRING && k->len < 270 &&
            psstore_poff_parse(&po, val->str, val->len, NULL, 0) == FR_OK)
            len += (size_t)snprintf(text + len, 300, "%s%.*s=%lld", len ? "," : "", (int)k->len,
                                    k->str, (long long)po.watermark);
        psstore_poff_fini(&po);
    }
    return text;
}

/* The served weights (or with training set the training weights), epoch
 * and version in one transaction; with offsets != NULL also the watermark
 * of every partition, as "topic/partition=watermark,...". */
static fr_err_t read_one(psstore_conn_t *c, const char *name, int training, float *w, size_t n,
                         uint64_t *epoch, int64_t *version, char **offsets)
{
    fr_err_t err;
    char ep[300], meta[PS_KEY_MAX], ver[PS_KEY_MAX], wkey[PS_KEY_MAX], avg[PS_KEY_MAX];
    char off[PS_KEY_MAX];
    if (offsets != NULL)
        *offsets = NULL;
    ps_endpoint(c, ep, sizeof(ep));
    ps_key(meta, name, "meta");
    ps_key(ver, name, "ver");
    ps_key_shard(wkey, name, "w", 0);
    ps_key_shard(avg, name, "avg", 0);
    ps_key(off, name, "offsets");
    /* the served weights: the average when the applier keeps one (and it
     * is as long as the weights), else the weights; one of them crosses */
    static const char served[] = "local a = redis.call('GET', KEYS[1]) "
                                 "if a and #a == redis.call('STRLEN', KEYS[2]) then return a end "
                                 "return redis.call('GET', KEYS[2])";
    const char *hget[] = {"HGET", meta, "epoch"}, *get_ver[] = {"GET", ver},
               *get_w[] = {"GET", wkey}, *get_served[] = {"EVAL", served, "2", avg, wkey},
               *get_off[] = {"HGETALL", off};
    const int argcs[] = {3, 2, training ? 2 : 5, 2};
    const char *const *argvs[] = {hget, get_ver, training ? get_w : get_served, get_off};
    redisReply *r = read_tx(c, offsets != NULL ? 4 : 3, argcs, argvs, &err);
    if (r == NULL)
        return err;
    const redisReply *e = r->element[0], *v = r->element[1], *wr = r->element[2];
    uint64_t ep64;
    int64_t version64;
    char *text = NULL;
    if (e->type == REDIS_REPLY_NIL || wr->type != REDIS_REPLY_STRING) {
        err = ps_fail(c, FR_ERR_NOTFOUND, "redis %s: no model '%s'", ep, name);
    } else if (reply_uint64(e, &ep64) != 0 || reply_int64(v, &version64) != 0) {
        err = ps_fail(c, FR_ERR_PARSE, "redis %s: model '%s' has a bad epoch or ver", ep, name);
    } else if (wr->len != n * sizeof(float)) {
        err = ps_fail(c, FR_ERR_RANGE,
                      "redis %s: model '%s' holds %zu bytes of weights, expected %zu (%zu floats)",
                      ep, name, wr->len, n * sizeof(float), n);
    } else if (offsets != NULL && (text = watermarks_text(r->element[3])) == NULL) {
        err = ps_fail(c, FR_ERR_NOMEM, "out of memory");
    } else {
        memcpy(w, wr->str, wr->len);
        if (epoch != NULL)
            *epoch = ep64;
        if (version != NULL)
            *version = version64;
        if (offsets != NULL)
            *offsets = text;
    }
    freeReplyObject(r);
    return err;
}

/* Folds one shard's "t/p=w,..." into *merged, the lowest watermark of each
 * partition over the shards so far (a partition a shard lacks counts 0:
 * none of its positions is applied on that shard). first: merged is the
 * first shard's list. NULL when out of memory (merged is then freed). */
static char *watermarks_min(char *merged, const char *shard, int first)
{
    if (first)
        return strdup(shard);
    size_t cap = strlen(merged) + strlen(shard) + 2, len = 0;
    char *out = malloc(cap * 2), *copy = strdup(merged);
    if (out == NULL || copy == NULL) {
        free(out);
        free(copy);
        free(merged);
        return NULL;
    }
    out[0] = '\0';
    /* every partition of merged: min with the shard's (0 when it lacks it) */
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strrchr(tok, '=');
        if (eq == NULL)
            continue;
        long long wm = atoll(eq + 1), other = 0;
        size_t klen = (size_t)(eq - tok);
        for (const char *p = shard; *p != '\0';) {
            const char *end = strchr(p, ','), *peq = strchr(p, '=');
            if (end == NULL)
                end = p + strlen(p);
            if (peq != NULL && peq < end && (size_t)(peq - p) == klen && memcmp(p, tok, klen) == 0)
                other = atoll(peq + 1);
            p = *end ? end + 1 : end;
        }
        len += (size_t)snprintf(out + len, cap * 2 - len, "%s%.*s=%lld", len ? "," : "", (int)klen,
                                tok, wm < other ? wm : other);
    }
    /* partitions only the shard has: 0 on the others */
    for (const char *p = shard; *p != '\0';) {
        const char *end = strchr(p, ','), *peq = strchr(p, '=');
        if (end == NULL)
            end = p + strlen(p);
        if (peq != NULL && peq < end) {
            size_t klen = (size_t)(peq - p);
            int seen = 0;
            for (const char *q = merged; *q != '\0' && !seen;) {
                const char *qe = strchr(q, ','), *qeq = strchr(q, '=');
                if (qe == NULL)
                    qe = q + strlen(q);
                seen =
                    qeq != NULL && qeq < qe && (size_t)(qeq - q) == klen && memcmp(q, p, klen) == 0;
                q = *qe ? qe + 1 : qe;
            }
            if (!seen && len + klen + 8 < cap * 2)
                len += (size_t)snprintf(out + len, cap * 2 - len, "%s%.*s=0", len ? "," : "",
                                        (int)klen, p);
        }
        p = *end ? end + 1 : end;
    }
    free(copy);
    free(merged);
    return out;
}

/*
 * The weights of model name: one transaction for a model of one shard; for
 * a sharded one (docs/design.md "Shards"), one per shard, assembled, with
 * the sums of the shards' epochs and versions and the lowest watermark of
 * every partition over the shards. The shards are read one after another,
 * so the vector may mix a shard read before and one read after some
 * update: each slice is one shard's consistent state at one instant.
 */
static fr_err_t read_weights(psstore_conn_t *c, const char *name, int training, float *w, size_t n,
                             uint64_t *epoch, int64_t *version, char **offsets,
                             int64_t *shard_versions, int *nshards)
{
    fr_err_t err;
    if (offsets != NULL)
        *offsets = NULL;
    if ((err = check_name(c, name)) != FR_OK)
        return err;
    int S = 1;
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    if ((err = ps_model_layout(c, name, &S, bounds)) != FR_OK && err != FR_ERR_NOTFOUND)
        return err;
    if (nshards != NULL)
        *nshards = S;
    if (S == 1) {
        err = read_one(c, name, training, w, n, epoch, version, offsets);
        if (err == FR_OK && shard_versions != NULL && version != NULL)
            shard_versions[0] = *version;
        return err;
    }
    if (bounds[S] != n)
        return ps_fail(c, FR_ERR_RANGE, "model '%s' holds %zu floats of weights, expected %zu",
                       name, bounds[S], n);
    uint64_t esum = 0;
    int64_t vsum = 0;
    char *merged = NULL;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX], *text = NULL;
        uint64_t e = 0;
        int64_t v = 0;
        ps_shard_tag(tag, name, k, S);
        err = read_one(c, tag, training, w + bounds[k], bounds[k + 1] - bounds[k], &e, &v,
                       offsets != NULL ? &text : NULL);
        if (err != FR_OK) {
            free(merged);
            return ps_fail(c, err, "model '%s', shard %d: %s", name, k, psstore_conn_error(c));
        }
        esum += e;
        vsum += v;
        if (shard_versions != NULL)
            shard_versions[k] = v;
        if (offsets != NULL) {
            merged = watermarks_min(merged, text, k == 0);
            free(text);
            if (merged == NULL)
                return ps_fail(c, FR_ERR_NOMEM, "out of memory");
        }
    }
    if (epoch != NULL)
        *epoch = esum;
    if (version != NULL)
        *version = vsum;
    if (offsets != NULL)
        *offsets = merged;
    return FR_OK;
}

fr_err_t psstore_model_weights(psstore_conn_t *c, const char *name, float *w, size_t n,
                               uint64_t *epoch, int64_t *version)
{
    return read_weights(c, name, 0, w, n, epoch, version, NULL, NULL, NULL);
}

fr_err_t psstore_model_weights_training(psstore_conn_t *c, const char *name, float *w, size_t n,
                                        uint64_t *epoch, int64_t *version)
{
    return read_weights(c, name, 1, w, n, epoch, version, NULL, NULL, NULL);
}

fr_err_t psstore_model_weights_offsets(psstore_conn_t *c, const char *name, float *w, size_t n,
                                       uint64_t *epoch, int64_t *version, char **offsets)
{
    return read_weights(c, name, 0, w, n, epoch, version, offsets, NULL, NULL);
}

fr_err_t psstore_model_weights_shards(psstore_conn_t *c, const char *name, float *w, size_t n,
                                      uint64_t *epoch, int64_t *version, char **offsets,
                                      int64_t *shard_versions, int *nshards)
{
    return read_weights(c, name, 0, w, n, epoch, version, offsets, shard_versions, nshards);
}

static fr_err_t version_one(psstore_conn_t *c, const char *name, int64_t *version);

/* A sharded model's version is the sum of its shards'. */
fr_err_t psstore_model_version(psstore_conn_t *c, const char *name, int64_t *version)
{
    fr_err_t err;
    if ((err = check_name(c, name)) != FR_OK)
        return err;
    int S = 1;
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    if ((err = ps_model_layout(c, name, &S, bounds)) != FR_OK)
        return err;
    int64_t sum = 0;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX];
        int64_t v = 0;
        ps_shard_tag(tag, name, k, S);
        if ((err = version_one(c, tag, &v)) != FR_OK)
            return err;
        sum += v;
    }
    *version = sum;
    return FR_OK;
}

static fr_err_t version_one(psstore_conn_t *c, const char *name, int64_t *version)
{
    fr_err_t err;
    char key[PS_KEY_MAX];
    ps_key(key, name, "ver");
    redisReply *r = ps_cmd(c, 1, &err, "GET %s", key);
    if (r == NULL)
        return err;
    if (r->type == REDIS_REPLY_NIL)
        err = ps_fail(c, FR_ERR_NOTFOUND, "no model '%s'", name);
    else if (reply_int64(r, version) != 0)
        err = ps_fail(c, FR_ERR_PARSE, "model '%s' has a bad ver", name);
    freeReplyObject(r);
    return err;
}

/* Adds the model name of a key "freshet:{m}:meta" to the list; other keys
 * that happen to match the pattern are skipped. */
static fr_err_t add_model_name(void *ctx, const char *key, size_t len)
{
    static const char head[] = "freshet:{", tail[] = "}:meta";
    size_t hl = sizeof(head) - 1, tl = sizeof(tail) - 1;
    if (len <= hl + tl || len - hl - tl > 64 || memcmp(key, head, hl) != 0 ||
        memcmp(key + len - tl, tail, tl) != 0)
        return FR_OK;
    for (size_t i = hl; i < len - tl; i++) {
        if (!fr_name_char((unsigned char)key[i]))
            return FR_OK;
    }
    return keylist_add(ctx, key + hl, len - hl - tl);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* SCANs for meta keys; SCAN may return a key twice, so the sorted list is
 * made unique. */
fr_err_t psstore_model_list(psstore_conn_t *c, char ***names, size_t *count)
{
    ps_keylist_t kl = {0};
    fr_err_t err = FR_OK;
    int nodes[PS_NODES_MAX]; /* a cluster: every master holds some models */
    int n = ps_conn_masters(c, nodes, PS_NODES_MAX);
    for (int i = 0; i < n && err == FR_OK; i++) {
        ps_conn_pin(c, nodes[i]);
        err = scan_all(c, 1, "freshet:*:meta", add_model_name, &kl);
    }
    ps_conn_pin(c, -1);
    if (err != FR_OK) {
        ps_keylist_fini(&kl);
        return err;
    }
    if (kl.n > 1)
        qsort(kl.keys, kl.n, sizeof(kl.keys[0]), cmp_str);
    size_t out = 0;
    for (size_t i = 0; i < kl.n; i++) {
        if (out > 0 && strcmp(kl.keys[out - 1], kl.keys[i]) == 0)
            free(kl.keys[i]);
        else
            kl.keys[out++] = kl.keys[i];
    }
    *names = kl.keys;
    *count = out;
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Offsets (the interval arithmetic is in offsets.c, part of the core)
 * ---------------------------------------------------------------------- */
/*
 * HGET offsets "<topic>/<partition>" (retried once on a broken connection:
 * a read), parsed into po. A value that does not parse is FR_ERR_PARSE
 * naming the partition: the store is the source of truth and guessing
 * would skip or repeat records.
 */
static fr_err_t offsets_one(psstore_conn_t *c, const char *model, const char *topic,
                            int32_t partition, psstore_partition_offsets_t *po, int *found);

/* The position after the last one po applied. */
static int64_t poff_end(const psstore_partition_offsets_t *po)
{
    return po->nspans > 0 ? po->spans[po->nspans - 1].to : po->watermark;
}

/* Nonzero when a and b applied the same positions. */
static int poff_same_positions(const psstore_partition_offsets_t *a,
                               const psstore_partition_offsets_t *b)
{
    if (a->watermark != b->watermark || a->nspans != b->nspans)
        return 0;
    for (size_t i = 0; i < a->nspans; i++)
        if (a->spans[i].from != b->spans[i].from || a->spans[i].to != b->spans[i].to)
            return 0;
    return 1;
}
/*
 * A sharded model (docs/design.md "Shards"): a position counts as applied
 * when every shard applied it, so a partition starts at the lowest
 * watermark over the shards, and the intervals to skip above it are those
 * of the shard with that watermark (the first such shard): a batch read
 * again is then made only of positions that shard lacks, so that shard
 * applies it whatever the others hold, and every re-read makes progress.
 * (Skipping what every shard applied instead would let a batch overlap
 * each shard's applied positions in part, and every shard drop it.) A
 * shard that never saw the partition has applied nothing of it; *found
 * when any shard saw it. The generation is the oldest of the shards': a
 * replay's rewrite that some shard has not executed (a request that
 * reached only some shards, a write lost in a fail-over) is then sent
 * again by its consumer, and the shards that have it ignore it; meanwhile
 * they drop the batches of the older generation, read again once every
 * shard is at the newer one. Where the shards applied different positions,
 * po->alone_to is the end of the furthest: each partition's re-read then
 * skips another shard's intervals, so a batch mixing two partitions could
 * hold positions that every shard applied in part (the consumer batches
 * them apart, ingest_batcher_alone).
 */
fr_err_t psstore_offsets_read(psstore_conn_t *c, const char *model, const char *topic,
                              int32_t partition, psstore_partition_offsets_t *po, int *found)
{
    fr_err_t err;
    if ((err = check_name(c, model)) != FR_OK)
        return err;
    if (topic == NULL || topic[0] == '\0' || strlen(topic) > 249 || partition < 0)
        return ps_fail(c, FR_ERR_INVAL, "psstore: bad topic or partition");
    int S = 1;
    if ((err = ps_model_shards(c, model, &S)) != FR_OK)
        return err;
    if (S == 1)
        return offsets_one(c, model, topic, partition, po, found);
    *found = 0;
    int64_t generation = INT64_MAX, top = 0;
    int differ = 0;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX];
        int f = 0;
        psstore_partition_offsets_t sh;
        psstore_poff_init(&sh, 0);
        ps_shard_tag(tag, model, k, S);
        err = offsets_one(c, tag, topic, partition, &sh, &f);
        generation = sh.generation < generation ? sh.generation : generation;
        if (err == FR_OK && k > 0 && !poff_same_positions(&sh, po))
            differ = 1;
        if (err == FR_OK && poff_end(&sh) > top)
            top = poff_end(&sh);
        if (err == FR_OK && (k == 0 || sh.watermark < po->watermark)) {
            psstore_partition_offsets_t keep = *po; /* the lowest so far: swap in sh */
            *po = sh;
            sh = keep;
        }
        psstore_poff_fini(&sh);
        if (err != FR_OK)
            return err;
        *found |= f;
    }
    po->generation = generation; /* a rewrite some shard lacks is sent again */
    po->alone_to = differ ? top : 0;
    return FR_OK;
}

static fr_err_t offsets_one(psstore_conn_t *c, const char *model, const char *topic,
                            int32_t partition, psstore_partition_offsets_t *po, int *found)
{
    fr_err_t err;
    char ep[300], key[PS_KEY_MAX], field[PSSTORE_KEY_MAX], why[256];
    ps_endpoint(c, ep, sizeof(ep));
    ps_key(key, model, "offsets");
    psstore_key_format(field, sizeof(field), topic, partition);
    *found = 0;
    redisReply *r = ps_cmd(c, 1, &err, "HGET %s %s", key, field);
    if (r == NULL)
        return err;
    if (r->type == REDIS_REPLY_STRING) {
        err = psstore_poff_parse(po, r->str, r->len, why, sizeof(why));
        if (err != FR_OK)
            ps_fail(c, err, "redis %s: model '%s', %s: %s", ep, model, field, why);
        else
            *found = 1;
    } else if (r->type != REDIS_REPLY_NIL) {
        err = ps_fail(c, FR_ERR_REDIS, "redis %s: unexpected reply to HGET %s", ep, key);
    }
    freeReplyObject(r);
    return err;
}

/* Orders "topic/partition" keys by topic, then partition number. */
static int offsets_key_cmp(const void *a, const void *b)
{
    return psstore_key_cmp(*(const char *const *)a, *(const char *const *)b);
}

static fr_err_t offsets_keys_one(psstore_conn_t *c, const char *model, char ***keys, size_t *n);

/* A sharded model: the union of its shards' partitions, sorted, once each. */
fr_err_t psstore_offsets_keys(psstore_conn_t *c, const char *model, char ***keys, size_t *n)
{
    fr_err_t err;
    *keys = NULL;
    *n = 0;
    if ((err = check_name(c, model)) != FR_OK)
        return err;
    int S = 1;
    if ((err = ps_model_shards(c, model, &S)) != FR_OK)
        return err;
    if (S == 1)
        return offsets_keys_one(c, model, keys, n);
    char **all = NULL;
    size_t nall = 0;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX], **part = NULL;
        size_t np = 0;
        ps_shard_tag(tag, model, k, S);
        if ((err = offsets_keys_one(c, tag, &part, &np)) != FR_OK)
            break;
        char **grown = realloc(all, (nall + np + 1) * sizeof(*all));
        if (grown == NULL) {
            for (size_t i = 0; i < np; i++)
                free(part[i]);
            free(part);
            err = ps_fail(c, FR_ERR_NOMEM, "psstore: out of memory");
            break;
        }
        all = grown;
        memcpy(all + nall, part, np * sizeof(*part));
        nall += np;
        free(part);
    }
    if (err != FR_OK) {
        for (size_t i = 0; i < nall; i++)
            free(all[i]);
        free(all);
        return err;
    }
    if (nall > 1)
        qsort(all, nall, sizeof(*all), offsets_key_cmp);
    size_t out = 0;
    for (size_t i = 0; i < nall; i++) {
        if (out > 0 && strcmp(all[out - 1], all[i]) == 0)
            free(all[i]);
        else
            all[out++] = all[i];
    }
    *keys = all;
    *n = out;
    return FR_OK;
}

static fr_err_t offsets_keys_one(psstore_conn_t *c, const char *model, char ***keys, size_t *n)
{
    fr_err_t err;
    char key[PS_KEY_MAX];
    *keys = NULL;
    *n = 0;
    ps_key(key, model, "offsets");
    redisReply *r = ps_cmd(c, 1, &err, "HKEYS %s", key);
    if (r == NULL)
        return err;
    size_t count = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
    char **out = count > 0 ? calloc(count, sizeof(*out)) : NULL;
    if (count > 0 && out == NULL) {
        freeReplyObject(r);
        return ps_fail(c, FR_ERR_NOMEM, "psstore: out of memory");
    }
    for (size_t i = 0; i < count; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_STRING || (out[*n] = strndup(e->str, e->len)) == NULL)
            continue;
        (*n)++;
    }
    freeReplyObject(r);
    qsort(out, *n, sizeof(*out), offsets_key_cmp);
    *keys = out;
    return FR_OK;
}
