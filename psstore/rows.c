/*
 * rows.c - the rows of a sparse model in Redis (psstore.h "Sparse models",
 * docs/design.md "Sparse models"): a worker's pull of the rows of its
 * batch, and the row reads the applier shares with it.
 *
 * Rows are fields of one hash per model, named by the row's 4 bytes
 * little-endian; reads ask for PS_ROWS_CHUNK fields per HMGET, all queued
 * at once, so a batch of a few thousand rows costs one round trip.
 */
#include <stdlib.h>
#include <string.h>

#include "psstore/psstore_int.h"

void ps_row_field(uint32_t row, unsigned char f[4])
{
    f[0] = (unsigned char)row;
    f[1] = (unsigned char)(row >> 8);
    f[2] = (unsigned char)(row >> 16);
    f[3] = (unsigned char)(row >> 24);
}

void psstore_sparse_pack(const uint32_t *rows, size_t m, const float *grads, int dim, float gbias,
                         float *out)
{
    memcpy(out, rows, m * sizeof(uint32_t));
    memcpy(out + m, grads, m * (size_t)(1 + dim) * sizeof(float));
    out[m * (size_t)(2 + dim)] = gbias;
}

fr_err_t ps_rows_queue(psstore_conn_t *c, const char *key, const unsigned char *fields, size_t n,
                       size_t *queued)
{
    const char *argv[PS_ROWS_CHUNK + 2] = {"HMGET", key};
    size_t lens[PS_ROWS_CHUNK + 2] = {5, strlen(key)};
    for (size_t at = 0; at < n; at += PS_ROWS_CHUNK) {
        size_t k = n - at < PS_ROWS_CHUNK ? n - at : PS_ROWS_CHUNK;
        for (size_t i = 0; i < k; i++) {
            argv[2 + i] = (const char *)fields + 4 * (at + i);
            lens[2 + i] = 4;
        }
        fr_err_t err = ps_pipeline_append(c, (int)k + 2, argv, lens);
        if (err != FR_OK)
            return err;
        ++*queued;
    }
    return FR_OK;
}

fr_err_t ps_rows_take(psstore_conn_t *c, const redisReply *r, size_t len, size_t keep, float *out,
                      uint8_t *found, size_t n)
{
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != n)
        return ps_fail(c, FR_ERR_REDIS, "rows: unexpected reply to HMGET");
    for (size_t i = 0; i < n; i++) {
        const redisReply *v = r->element[i];
        if (v->type == REDIS_REPLY_NIL) {
            if (found != NULL)
                found[i] = 0;
            continue;
        }
        if (v->type != REDIS_REPLY_STRING || v->len != len * sizeof(float))
            return ps_fail(c, FR_ERR_PARSE, "rows: a value of %zu bytes, expected %zu",
                           v->type == REDIS_REPLY_STRING ? (size_t)v->len : (size_t)0,
                           len * sizeof(float));
        memcpy(out + i * keep, v->str, keep * sizeof(float));
        if (found != NULL)
            found[i] = 1;
    }
    return FR_OK;
}

/*
 * MULTI, HGET meta epoch, GET ver, GET w:0, HMGET rows (in chunks), EXEC;
 * the EXEC's reply holds them in that order.
 */
fr_err_t psstore_rows_pull(psstore_conn_t *c, const char *model, const sparse_spec_t *spec,
                           const sparse_optim_t *optim, const uint32_t *rows, size_t n,
                           float *params, uint8_t *found, float *bias, uint64_t *epoch,
                           int64_t *version)
{
    fr_err_t err;
    if ((err = psstore_model_name_check(model, c->errstr, sizeof(c->errstr))) != FR_OK)
        return err;
    unsigned char *fields = malloc(n > 0 ? 4 * n : 1);
    if (fields == NULL)
        return ps_fail(c, FR_ERR_NOMEM, "rows: out of memory");
    for (size_t i = 0; i < n; i++)
        ps_row_field(rows[i], fields + 4 * i);
    char meta[PS_KEY_MAX], ver[PS_KEY_MAX], w[PS_KEY_MAX], key[PS_KEY_MAX];
    ps_key(meta, model, "meta");
    ps_key(ver, model, "ver");
    ps_key_shard(w, model, "w", 0);
    ps_key(key, model, "rows");
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    const char *hget[] = {"HGET", meta, "epoch"}, *get_ver[] = {"GET", ver}, *get_w[] = {"GET", w};
    size_t queued = 0;
    err = ps_pipeline_append(c, 1, multi, NULL);
    const char **argvs[] = {hget, get_ver, get_w};
    const int argcs[] = {3, 2, 2};
    for (int i = 0; i < 3 && err == FR_OK; i++)
        err = ps_pipeline_append(c, argcs[i], argvs[i], NULL);
    queued = err == FR_OK ? 4 : 0;
    if (err == FR_OK)
        err = ps_rows_queue(c, key, fields, n, &queued);
    if (err == FR_OK && (err = ps_pipeline_append(c, 1, exec, NULL)) == FR_OK)
        queued++;
    free(fields);
    if (err != FR_OK) {
        ps_pipeline_discard(c);
        return err;
    }
    redisReply *r = NULL;
    for (size_t i = 0; i < queued; i++) { /* +OK, QUEUED..., then EXEC's array */
        fr_err_t e;
        redisReply *x = ps_pipeline_read(c, &e);
        if (x == NULL && err == FR_OK)
            err = e;
        if (i + 1 == queued)
            r = x;
        else if (x != NULL)
            freeReplyObject(x);
        if (x == NULL && c->ctx == NULL)
            break;
    }
    size_t chunks = (n + PS_ROWS_CHUNK - 1) / PS_ROWS_CHUNK;
    if (err == FR_OK && (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 3 + chunks))
        err = ps_fail(c, FR_ERR_REDIS, "rows: the pull's transaction did not run");
    if (err == FR_OK && r->element[0]->type != REDIS_REPLY_STRING)
        err = ps_fail(c, FR_ERR_NOTFOUND, "model '%s' does not exist", model);
    if (err == FR_OK && (r->element[2]->type != REDIS_REPLY_STRING || r->element[2]->len != 4))
        err = ps_fail(c, FR_ERR_PARSE, "model '%s': its bias (w:0) is not one float", model);
    if (err == FR_OK) {
        *epoch = strtoull(r->element[0]->str, NULL, 10);
        *version =
            r->element[1]->type == REDIS_REPLY_STRING ? strtoll(r->element[1]->str, NULL, 10) : 0;
        memcpy(bias, r->element[2]->str, 4);
        size_t keep = sparse_row_len(spec), len = keep + sparse_state_len(spec, optim);
        for (size_t k = 0; k < chunks && err == FR_OK; k++) {
            size_t at = k * PS_ROWS_CHUNK, m = n - at < PS_ROWS_CHUNK ? n - at : PS_ROWS_CHUNK;
            err = ps_rows_take(c, r->element[3 + k], len, keep, params + at * keep, found + at, m);
        }
    }
    if (r != NULL)
        freeReplyObject(r);
    return err;
}
