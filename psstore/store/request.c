/*
 * request.c - operator requests appended to freshet:{m}:requests for the
 * applier, and reads of retained snapshots.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "psstore/store/store_int.h"

#define TOKEN_PREFIX "t:" /* a sharded model's request id: "t:<shards>:<token>" */

/*
 * XADD requests * <fields[nfields]> requested <unix ms>: on the model's
 * stream, or for a sharded model (docs/design.md "Shards") on every
 * shard's, each shard's applier executing it in a transaction of its own
 * slot. The shards' streams give different ids, so a sharded request
 * carries a random token, and its id is "t:<token>" (psstore_request_wait
 * looks for the token on every shard).
 */
static fr_err_t append_fields(psstore_conn_t *c, const char *model, const char *const *fields,
                              const size_t *lens, int nfields, char *id)
{
    char key[PS_KEY_MAX], now[32], token[40];
    fr_err_t err;
    if ((err = psstore_model_name_check(model, c->errstr, sizeof(c->errstr))) != FR_OK)
        return err;
    int S = 1;
    if ((err = ps_model_shards(c, model, &S)) != FR_OK)
        return err;
    snprintf(now, sizeof(now), "%lld", (long long)fr_clock_unix_ms());
    snprintf(token, sizeof(token), "%016llx", (unsigned long long)fr_random_u64());
    const char *argv[24] = {"XADD", key, "*"};
    size_t alens[24] = {4, 0, 1};
    int argc = 3;
    for (int i = 0; i < nfields && argc < 18; i++, argc++) {
        argv[argc] = fields[i];
        alens[argc] = lens != NULL ? lens[i] : strlen(fields[i]);
    }
    const char *tail[] = {"requested", now, "token", token};
    for (int i = 0; i < (S > 1 ? 4 : 2); i++, argc++) {
        argv[argc] = tail[i];
        alens[argc] = strlen(tail[i]);
    }
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX];
        ps_shard_tag(tag, model, k, S);
        ps_key(key, tag, "requests");
        alens[1] = strlen(key);
        redisReply *r = ps_cmd_argv(c, 0, argc, argv, alens, &err);
        if (r == NULL)
            return k == 0 ? err
                          : ps_fail(c, err,
                                    "model '%s': the request reached shards 0..%d of %d "
                                    "only: %s",
                                    model, k - 1, S, psstore_conn_error(c));
        if (S == 1)
            snprintf(id, 64, "%.*s", (int)r->len, r->str ? r->str : "");
        freeReplyObject(r);
    }
    if (S > 1) /* the shards too: the wait must not need meta (a delete removes it) */
        snprintf(id, 64, TOKEN_PREFIX "%d:%s", S, token);
    return FR_OK;
}

/* XADD requests * type <type> [version <v>] requested <unix ms>. */
static fr_err_t append(psstore_conn_t *c, const char *model, const char *type, int64_t version,
                       char *id)
{
    char ver[32];
    snprintf(ver, sizeof(ver), "%lld", (long long)version);
    const char *fields[] = {"type", type, "version", ver};
    return append_fields(c, model, fields, NULL, version >= 0 ? 4 : 2, id);
}

/* A sharded model rolls back every shard to the snapshot of the same id:
 * refused unless every shard retains it. */
fr_err_t psstore_request_rollback(psstore_conn_t *c, const char *model, int64_t version, char *id)
{
    if (version < 0)
        return ps_fail(c, FR_ERR_INVAL, "rollback: version must be >= 0");
    int S = 1;
    fr_err_t err = ps_model_shards(c, model, &S);
    if (err != FR_OK)
        return err;
    for (int k = 0; k < S && S > 1; k++) {
        char tag[PS_TAG_MAX], key[PS_KEY_MAX];
        ps_shard_tag(tag, model, k, S);
        ps_key_shard(key, tag, "snap", version);
        redisReply *r = ps_cmd(c, 1, &err, "EXISTS %s", key);
        if (r == NULL)
            return err;
        int held = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
        freeReplyObject(r);
        if (!held)
            return ps_fail(c, FR_ERR_NOTFOUND,
                           "model '%s': shard %d retains no snapshot %lld (a sharded model's "
                           "snapshots are complete once every shard took its part)",
                           model, k, (long long)version);
    }
    return append(c, model, "rollback", version, id);
}

fr_err_t psstore_request_delete(psstore_conn_t *c, const char *model, char *id)
{
    return append(c, model, "delete", -1, id);
}

fr_err_t psstore_request_rewind(psstore_conn_t *c, const char *model, int64_t generation,
                                const psstore_rewind_t *targets, size_t ntargets, char *id)
{
    char gen[32];
    fr_err_t err;
    if ((err = psstore_model_name_check(model, c->errstr, sizeof(c->errstr))) != FR_OK)
        return err;
    if (generation < 1 || ntargets == 0)
        return ps_fail(c, FR_ERR_INVAL, "rewind: a generation >= 1 and at least one target");
    char *text = NULL;
    size_t len = 0, bad = 0;
    err = psstore_targets_format(targets, ntargets, &text, &len, &bad);
    if (err == FR_ERR_INVAL) {
        const psstore_rewind_t *t = &targets[bad];
        return ps_fail(c, FR_ERR_INVAL, "rewind: bad target %s/%d=%lld",
                       t->topic ? t->topic : "(null)", (int)t->partition, (long long)t->target);
    }
    if (err != FR_OK)
        return ps_fail(c, FR_ERR_NOMEM, "rewind: out of memory");
    snprintf(gen, sizeof(gen), "%lld", (long long)generation);
    const char *fields[] = {"type", "rewind", "generation", gen, "targets", text};
    const size_t lens[] = {4, 6, 10, strlen(gen), 7, len};
    err = append_fields(c, model, fields, lens, 6, id);
    free(text);
    return err;
}

fr_err_t psstore_request_replay(psstore_conn_t *c, const char *model, const char *spec, char *id)
{
    fr_err_t err;
    if ((err = psstore_model_name_check(model, c->errstr, sizeof(c->errstr))) != FR_OK)
        return err;
    size_t len = spec != NULL ? strlen(spec) : 0;
    if (len == 0 || len >= PSSTORE_REPLAY_SPEC_MAX)
        return ps_fail(c, FR_ERR_INVAL, "replay: a request of 1..%d bytes is required",
                       PSSTORE_REPLAY_SPEC_MAX - 1);
    const char *fields[] = {"type", "replay", "spec", spec};
    const size_t lens[] = {4, 6, 4, len};
    return append_fields(c, model, fields, lens, 4, id);
}

fr_err_t psstore_replay_current(psstore_conn_t *c, const char *model, int64_t *generation,
                                char *spec, size_t size, int64_t *requested_ms)
{
    char key[PS_KEY_MAX], tag[PS_TAG_MAX];
    fr_err_t err;
    if ((err = ps_read_tag(c, model, tag)) != FR_OK) /* sharded: shard 0 publishes it */
        return err;
    ps_key(key, tag, "meta");
    redisReply *r = ps_cmd(c, 1, &err, "HMGET %s replay_generation replay replay_requested", key);
    if (r == NULL)
        return err;
    *generation = 0;
    if (size > 0)
        spec[0] = '\0';
    if (requested_ms != NULL)
        *requested_ms = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[1]->type == REDIS_REPLY_STRING) {
        *generation = strtoll(r->element[0]->str, NULL, 10);
        if (size > 0)
            snprintf(spec, size, "%.*s", (int)r->element[1]->len, r->element[1]->str);
        if (requested_ms != NULL && r->element[2]->type == REDIS_REPLY_STRING)
            *requested_ms = strtoll(r->element[2]->str, NULL, 10);
    }
    freeReplyObject(r);
    return FR_OK;
}

/* A sharded model: the id is the last shard's entry (a worker pushes the
 * shards in order; psstore_client_last_id is the last one's). */
fr_err_t psstore_grad_waiting(psstore_conn_t *c, const char *model, const char *id, int *waiting)
{
    char key[PS_KEY_MAX], tag[PS_TAG_MAX];
    int S = 1;
    fr_err_t err = ps_model_shards(c, model, &S);
    if (err != FR_OK)
        return err;
    ps_shard_tag(tag, model, S - 1, S);
    ps_key(key, tag, "grads");
    redisReply *r = ps_cmd(c, 1, &err, "XRANGE %s %s %s", key, id, id);
    if (r == NULL)
        return err;
    *waiting = r->type == REDIS_REPLY_ARRAY && r->elements > 0;
    freeReplyObject(r);
    return FR_OK;
}

/* *pending = 1 while some shard's requests stream still holds the entry
 * with this token (a sharded model's request). */
static fr_err_t token_pending(psstore_conn_t *c, const char *model, const char *id, int *pending)
{
    char *end;
    long S = strtol(id, &end, 10);
    if (S < 2 || S > PSSTORE_SHARDS_MAX || *end != ':')
        return ps_fail(c, FR_ERR_INVAL, "request id 't:%.40s' is not one freshet made", id);
    const char *token = end + 1;
    fr_err_t err = FR_OK;
    *pending = 0;
    for (int k = 0; err == FR_OK && k < S && !*pending; k++) {
        char tag[PS_TAG_MAX], key[PS_KEY_MAX];
        ps_shard_tag(tag, model, k, (int)S);
        ps_key(key, tag, "requests");
        redisReply *r = ps_cmd(c, 1, &err, "XRANGE %s - +", key);
        for (size_t i = 0; r != NULL && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
            const redisReply *kv = r->element[i]->elements == 2 ? r->element[i]->element[1] : NULL;
            for (size_t f = 0; kv != NULL && f + 1 < kv->elements; f += 2)
                if (strcmp(kv->element[f]->str, "token") == 0 &&
                    kv->element[f + 1]->type == REDIS_REPLY_STRING &&
                    strcmp(kv->element[f + 1]->str, token) == 0)
                    *pending = 1;
        }
        freeReplyObject(r);
    }
    return err;
}

fr_err_t psstore_request_wait(psstore_conn_t *c, const char *model, const char *id, int timeout_ms)
{
    char key[PS_KEY_MAX];
    ps_key(key, model, "requests");
    int sharded = strncmp(id, TOKEN_PREFIX, strlen(TOKEN_PREFIX)) == 0;
    for (int waited = 0;; waited += 20) {
        fr_err_t err;
        int pending = 0;
        if (sharded) {
            if ((err = token_pending(c, model, id + strlen(TOKEN_PREFIX), &pending)) != FR_OK)
                return err;
        } else {
            redisReply *r = ps_cmd(c, 1, &err, "XRANGE %s %s %s", key, id, id);
            if (r == NULL)
                return err;
            pending = r->type == REDIS_REPLY_ARRAY && r->elements > 0;
            freeReplyObject(r);
        }
        if (!pending)
            return FR_OK;
        if (waited >= timeout_ms)
            return ps_fail(c, FR_ERR_TIMEOUT,
                           "request %s of model '%s' not executed within %d ms: is the applier "
                           "running and not stopped?",
                           id, model, timeout_ms);
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
    }
}

/* A sharded model: held when any shard's lease is. */
fr_err_t psstore_lease_held(psstore_conn_t *c, const char *model, int *held)
{
    int S = 1;
    fr_err_t err = ps_model_shards(c, model, &S);
    if (err != FR_OK)
        return err;
    *held = 0;
    for (int k = 0; k < S && !*held; k++) {
        char tag[PS_TAG_MAX], key[PS_KEY_MAX];
        ps_shard_tag(tag, model, k, S);
        ps_key(key, tag, "lease");
        redisReply *r = ps_cmd(c, 1, &err, "EXISTS %s", key);
        if (r == NULL)
            return err;
        *held = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
        freeReplyObject(r);
    }
    return FR_OK;
}

static fr_err_t snapshot_one(psstore_conn_t *c, const char *model, int64_t version, float *w,
                             size_t n, uint64_t *epoch);

/* A sharded model: every shard's part of snapshot `version`, assembled; the
 * epoch is the sum of the shards'. */
fr_err_t psstore_snapshot_weights(psstore_conn_t *c, const char *model, int64_t version, float *w,
                                  size_t n, uint64_t *epoch)
{
    int S = 1;
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    fr_err_t err = ps_model_layout(c, model, &S, bounds);
    if (err != FR_OK && err != FR_ERR_NOTFOUND)
        return err;
    if (S == 1)
        return snapshot_one(c, model, version, w, n, epoch);
    if (bounds[S] != n)
        return ps_fail(c, FR_ERR_RANGE, "model '%s' holds %zu floats, expected %zu", model,
                       bounds[S], n);
    *epoch = 0;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX];
        uint64_t e = 0;
        ps_shard_tag(tag, model, k, S);
        if ((err = snapshot_one(c, tag, version, w + bounds[k], bounds[k + 1] - bounds[k], &e)) !=
            FR_OK)
            return err;
        *epoch += e;
    }
    return FR_OK;
}

static fr_err_t snapshot_one(psstore_conn_t *c, const char *model, int64_t version, float *w,
                             size_t n, uint64_t *epoch)
{
    char key[PS_KEY_MAX];
    fr_err_t err;
    ps_key_shard(key, model, "snap", version);
    redisReply *r = ps_cmd(c, 1, &err, "HMGET %s weights epoch avg", key);
    if (r == NULL)
        return err;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return ps_fail(c, FR_ERR_NOTFOUND, "model '%s' retains no snapshot of version %lld", model,
                       (long long)version);
    }
    if (r->element[0]->len != n * sizeof(float)) {
        size_t got = r->element[0]->len;
        freeReplyObject(r);
        return ps_fail(c, FR_ERR_RANGE, "snapshot %lld of '%s' holds %zu bytes, expected %zu",
                       (long long)version, model, got, n * sizeof(float));
    }
    /* the served average of that version when the snapshot kept one */
    const redisReply *avg = r->element[2];
    int served = avg->type == REDIS_REPLY_STRING && avg->len == n * sizeof(float);
    memcpy(w, served ? avg->str : r->element[0]->str, n * sizeof(float));
    *epoch = r->element[1]->type == REDIS_REPLY_STRING ? strtoull(r->element[1]->str, NULL, 10) : 0;
    freeReplyObject(r);
    return FR_OK;
}
