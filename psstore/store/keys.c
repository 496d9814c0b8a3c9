/*
 * keys.c - the key layout of docs/design.md "Redis layout": every key of model m
 * is "freshet:{m}:<suffix>", so that the hash tag {m} keeps all of them on
 * one Redis Cluster slot and one MULTI/EXEC can cover them. Also the list
 * of every key a model has (create --force, delete), and a model's shard
 * layout as its meta says (docs/design.md "Shards").
 *
 * Model names are checked (psstore_model_name_check: at most 64 bytes of
 * [A-Za-z0-9._-]) before they reach these functions, so every key fits in
 * PS_KEY_MAX bytes; a longer one would be truncated, never overflow.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/store/store_int.h"

void ps_key(char *key, const char *model, const char *suffix)
{
    snprintf(key, PS_KEY_MAX, "freshet:{%s}:%s", model, suffix);
}

void ps_key_shard(char *key, const char *model, const char *what, long long k)
{
    snprintf(key, PS_KEY_MAX, "freshet:{%s}:%s:%lld", model, what, k);
}

void ps_shard_tag(char *tag, const char *model, int k, int S)
{
    if (S <= 1)
        snprintf(tag, PS_TAG_MAX, "%s", model);
    else
        snprintf(tag, PS_TAG_MAX, "%s/s%d", model, k);
}

/* Keys unlinked per UNLINK command. */
#define MODEL_UNLINK_BATCH 256
/* The suffixes of the keys every model may have; snapshots (snap:<v>) and
 * other shards are found by SCAN. */
static const char *const model_suffixes[] = {"meta",  "lease",    "ver",   "w:0",     "opt:0",
                                             "avg:0", "offsets",  "grads", "members", "versions",
                                             "snaps", "requests", "audit", "rounds",  "drops",
                                             "evals", "logend",   "rows",  "changes", "quarantine"};
#define NSUFFIXES (sizeof(model_suffixes) / sizeof(model_suffixes[0]))

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
fr_err_t ps_keylist_add(ps_keylist_t *kl, const char *s, size_t len)
{
    if (FR_GROW(kl->keys, kl->cap, kl->n + 1) != FR_OK)
        return FR_ERR_NOMEM;
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
fr_err_t ps_scan(psstore_conn_t *c, int retry, const char *pattern,
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
            return ps_unexpected(c, "SCAN");
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

fr_err_t ps_keylist_add_key(void *ctx, const char *key, size_t len)
{
    return ps_keylist_add(ctx, key, len);
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
        if (ps_keylist_add(kl, key, strlen(key)) != FR_OK)
            return ps_fail(c, FR_ERR_NOMEM, "psstore: out of memory listing keys");
    }
    snprintf(pattern, sizeof(pattern), "freshet:\\{%s\\}:*", name);
    return ps_scan(c, 0, pattern, ps_keylist_add_key, kl);
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
