/*
 * request.c - operator requests appended to freshet:{m}:requests for the
 * applier, and reads of retained snapshots.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "psstore/psstore_int.h"

/* XADD requests * type <type> [version <v>] requested <unix ms>. */
static fr_err_t append(psstore_conn_t *c, const char *model, const char *type, int64_t version,
                       char *id)
{
    char key[PS_KEY_MAX], ver[32], now[32];
    fr_err_t err;
    if ((err = psstore_model_name_check(model, c->errstr, sizeof(c->errstr))) != FR_OK)
        return err;
    ps_key(key, model, "requests");
    snprintf(ver, sizeof(ver), "%lld", (long long)version);
    snprintf(now, sizeof(now), "%lld", (long long)fr_clock_unix_ms());
    redisReply *r =
        version >= 0
            ? ps_cmd(c, 0, &err, "XADD %s * type %s version %s requested %s", key, type, ver, now)
            : ps_cmd(c, 0, &err, "XADD %s * type %s requested %s", key, type, now);
    if (r == NULL)
        return err;
    snprintf(id, 64, "%.*s", (int)r->len, r->str ? r->str : "");
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_request_rollback(psstore_conn_t *c, const char *model, int64_t version, char *id)
{
    if (version < 0)
        return ps_fail(c, FR_ERR_INVAL, "rollback: version must be >= 0");
    return append(c, model, "rollback", version, id);
}

fr_err_t psstore_request_delete(psstore_conn_t *c, const char *model, char *id)
{
    return append(c, model, "delete", -1, id);
}

fr_err_t psstore_request_rewind(psstore_conn_t *c, const char *model, int64_t generation,
                                const psstore_rewind_t *targets, size_t ntargets, char *id)
{
    char key[PS_KEY_MAX], gen[32], now[32];
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
    ps_key(key, model, "requests");
    snprintf(gen, sizeof(gen), "%lld", (long long)generation);
    snprintf(now, sizeof(now), "%lld", (long long)fr_clock_unix_ms());
    redisReply *r =
        ps_cmd(c, 0, &err, "XADD %s * type rewind generation %s targets %b requested %s", key, gen,
               text, len, now);
    free(text);
    if (r == NULL)
        return err;
    snprintf(id, 64, "%.*s", (int)r->len, r->str ? r->str : "");
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_request_replay(psstore_conn_t *c, const char *model, const char *spec, char *id)
{
    char key[PS_KEY_MAX], now[32];
    fr_err_t err;
    if ((err = psstore_model_name_check(model, c->errstr, sizeof(c->errstr))) != FR_OK)
        return err;
    size_t len = spec != NULL ? strlen(spec) : 0;
    if (len == 0 || len >= PSSTORE_REPLAY_SPEC_MAX)
        return ps_fail(c, FR_ERR_INVAL, "replay: a request of 1..%d bytes is required",
                       PSSTORE_REPLAY_SPEC_MAX - 1);
    ps_key(key, model, "requests");
    snprintf(now, sizeof(now), "%lld", (long long)fr_clock_unix_ms());
    redisReply *r =
        ps_cmd(c, 0, &err, "XADD %s * type replay spec %b requested %s", key, spec, len, now);
    if (r == NULL)
        return err;
    snprintf(id, 64, "%.*s", (int)r->len, r->str ? r->str : "");
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_replay_current(psstore_conn_t *c, const char *model, int64_t *generation,
                                char *spec, size_t size, int64_t *requested_ms)
{
    char key[PS_KEY_MAX];
    fr_err_t err;
    ps_key(key, model, "meta");
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

fr_err_t psstore_grad_waiting(psstore_conn_t *c, const char *model, const char *id, int *waiting)
{
    char key[PS_KEY_MAX];
    fr_err_t err;
    ps_key(key, model, "grads");
    redisReply *r = ps_cmd(c, 1, &err, "XRANGE %s %s %s", key, id, id);
    if (r == NULL)
        return err;
    *waiting = r->type == REDIS_REPLY_ARRAY && r->elements > 0;
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_request_wait(psstore_conn_t *c, const char *model, const char *id, int timeout_ms)
{
    char key[PS_KEY_MAX];
    ps_key(key, model, "requests");
    for (int waited = 0;; waited += 20) {
        fr_err_t err;
        redisReply *r = ps_cmd(c, 1, &err, "XRANGE %s %s %s", key, id, id);
        if (r == NULL)
            return err;
        int pending = r->type == REDIS_REPLY_ARRAY && r->elements > 0;
        freeReplyObject(r);
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

fr_err_t psstore_lease_held(psstore_conn_t *c, const char *model, int *held)
{
    char key[PS_KEY_MAX];
    fr_err_t err;
    ps_key(key, model, "lease");
    redisReply *r = ps_cmd(c, 1, &err, "EXISTS %s", key);
    if (r == NULL)
        return err;
    *held = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_snapshot_weights(psstore_conn_t *c, const char *model, int64_t version, float *w,
                                  size_t n, uint64_t *epoch)
{
    char key[PS_KEY_MAX];
    fr_err_t err;
    ps_key_shard(key, model, "snap", version);
    redisReply *r = ps_cmd(c, 1, &err, "HMGET %s weights epoch", key);
    if (r == NULL)
        return err;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
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
    memcpy(w, r->element[0]->str, n * sizeof(float));
    *epoch = r->element[1]->type == REDIS_REPLY_STRING ? strtoull(r->element[1]->str, NULL, 10) : 0;
    freeReplyObject(r);
    return FR_OK;
}
