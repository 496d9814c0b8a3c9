/*
 * rows_sparse.c - the rows of a sparse model in Redis (rows_sparse.h,
 * docs/design.md "Sparse models"): a worker's pull of the rows of its
 * batch, and the row reads the applier shares with it.
 *
 * Rows are fields of one hash per model, named by the row's 4 bytes
 * little-endian; reads ask for PS_ROWS_CHUNK fields per HMGET, all queued
 * at once, so a batch of a few thousand rows costs one round trip.
 */
#include <stdlib.h>
#include <string.h>

#include "psstore/store/store_int.h"

void ps_row_field(uint32_t row, unsigned char f[4])
{
    f[0] = (unsigned char)row;
    f[1] = (unsigned char)(row >> 8);
    f[2] = (unsigned char)(row >> 16);
    f[3] = (unsigned char)(row >> 24);
}

void psstore_sparse_group(const uint32_t *rows, size_t n, int S, uint32_t *order, uint32_t *sorted,
                          size_t *off)
{
    size_t at[PSSTORE_SHARDS_MAX + 1] = {0};
    for (size_t i = 0; i < n; i++)
        at[psstore_sparse_shard(rows[i], S) + 1]++;
    for (int k = 0; k < S; k++)
        at[k + 1] += at[k];
    memcpy(off, at, ((size_t)S + 1) * sizeof(*off));
    for (size_t i = 0; i < n; i++) {
        size_t j = at[psstore_sparse_shard(rows[i], S)]++;
        order[j] = (uint32_t)i;
        sorted[j] = rows[i];
    }
}

void psstore_sparse_pack(const uint32_t *rows, size_t m, const float *grads, size_t rowlen,
                         const float *gdense, size_t ndense, float *out)
{
    memcpy(out, rows, m * sizeof(uint32_t));
    memcpy(out + m, grads, m * rowlen * sizeof(float));
    memcpy(out + m * (1 + rowlen), gdense, ndense * sizeof(float));
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
 * MULTI, HGET meta epoch, GET ver, GET w:0, HMGET rows (in chunks), EXEC,
 * under the tag of shard k of S (the model's own at S = 1); the EXEC's
 * reply holds them in that order. Queued and sent (so that the next
 * shard's send overlaps this one's round trip): psstore_rows_pull_recv
 * reads it.
 */
fr_err_t psstore_rows_pull_send(psstore_conn_t *c, const char *model, int k, int S,
                                const uint32_t *rows, size_t n, size_t *queued)
{
    fr_err_t err;
    *queued = 0;
    if ((err = psstore_model_name_check(model, c->errstr, sizeof(c->errstr))) != FR_OK)
        return err;
    if (S < 1 || S > PSSTORE_SHARDS_MAX || k < 0 || k >= S)
        return ps_fail(c, FR_ERR_INVAL, "rows: shard %d of %d", k, S);
    unsigned char *fields = malloc(n > 0 ? 4 * n : 1);
    if (fields == NULL)
        return ps_fail(c, FR_ERR_NOMEM, "rows: out of memory");
    for (size_t i = 0; i < n; i++)
        ps_row_field(rows[i], fields + 4 * i);
    char tag[PS_TAG_MAX], meta[PS_KEY_MAX], ver[PS_KEY_MAX], w[PS_KEY_MAX], key[PS_KEY_MAX];
    ps_shard_tag(tag, model, k, S);
    ps_key(meta, tag, "meta");
    ps_key(ver, tag, "ver");
    ps_key_shard(w, tag, "w", 0);
    ps_key(key, tag, "rows");
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    const char *hget[] = {"HGET", meta, "epoch"}, *get_ver[] = {"GET", ver}, *get_w[] = {"GET", w};
    err = ps_pipeline_append(c, 1, multi, NULL);
    const char **argvs[] = {hget, get_ver, get_w};
    const int argcs[] = {3, 2, 2};
    for (int i = 0; i < 3 && err == FR_OK; i++)
        err = ps_pipeline_append(c, argcs[i], argvs[i], NULL);
    *queued = err == FR_OK ? 4 : 0;
    if (err == FR_OK)
        err = ps_rows_queue(c, key, fields, n, queued);
    if (err == FR_OK && (err = ps_pipeline_append(c, 1, exec, NULL)) == FR_OK)
        ++*queued;
    free(fields);
    if (err != FR_OK) {
        ps_pipeline_discard(c);
        *queued = 0;
        return err;
    }
    return ps_pipeline_flush(c);
}

fr_err_t psstore_rows_pull_recv(psstore_conn_t *c, const char *model, const sparse_spec_t *spec,
                                const sparse_optim_t *optim, size_t n, size_t queued, float *params,
                                uint8_t *found, float *bias, float *tower, uint64_t *epoch,
                                int64_t *version)
{
    fr_err_t err = FR_OK;
    size_t ndense = sparse_dense_len(spec);
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
    /* w:0: the dense part on shard 0 (a caller that asks for the tower
     * reads shard 0: it must have all of it), one float on the others */
    if (err == FR_OK && (r->element[2]->type != REDIS_REPLY_STRING ||
                         (r->element[2]->len != 4 && (size_t)r->element[2]->len != ndense * 4) ||
                         (tower != NULL && (size_t)r->element[2]->len != ndense * 4)))
        err = ps_fail(c, FR_ERR_PARSE, "model '%s': its dense part (w:0) is not %zu floats", model,
                      ndense);
    if (err == FR_OK) {
        *epoch = strtoull(r->element[0]->str, NULL, 10);
        *version =
            r->element[1]->type == REDIS_REPLY_STRING ? strtoll(r->element[1]->str, NULL, 10) : 0;
        /* the biases (one float past shard 0: the others 0), then the tower */
        size_t K = (size_t)sparse_outputs(spec), wlen = (size_t)r->element[2]->len;
        memset(bias, 0, K * 4);
        memcpy(bias, r->element[2]->str, wlen == 4 ? 4 : K * 4);
        if (tower != NULL)
            memcpy(tower, r->element[2]->str + K * 4, (ndense - K) * 4);
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

fr_err_t psstore_rows_pull(psstore_conn_t *c, const char *model, const sparse_spec_t *spec,
                           const sparse_optim_t *optim, const uint32_t *rows, size_t n,
                           float *params, uint8_t *found, float *bias, float *tower,
                           uint64_t *epoch, int64_t *version)
{
    size_t queued = 0;
    fr_err_t err = psstore_rows_pull_send(c, model, 0, 1, rows, n, &queued);
    if (err != FR_OK)
        return err;
    return psstore_rows_pull_recv(c, model, spec, optim, n, queued, params, found, bias, tower,
                                  epoch, version);
}

fr_err_t psstore_sparse_meta_parse(const char *text, sparse_spec_t *spec, sparse_optim_t *optim,
                                   char *errstr, size_t size)
{
    char table[96];
    const char *semi = strchr(text, ';');
    size_t len = semi != NULL ? (size_t)(semi - text) : strlen(text);
    if (len >= sizeof(table)) {
        snprintf(errstr, size, "sparse model '%.60s...': table text too long", text);
        return FR_ERR_PARSE;
    }
    memcpy(table, text, len);
    table[len] = '\0';
    if (sparse_spec_parse(table, spec, errstr, size) != FR_OK)
        return FR_ERR_PARSE;
    sparse_optim_defaults(optim, SPARSE_OPTIM_FTRL);
    for (const char *p = semi; p != NULL && *p == ';'; p = strchr(p + 1, ';')) {
        const char *item = p + 1;
        char *end;
        if (strncmp(item, "optimizer:", 10) == 0) {
            char name[16];
            size_t n = strcspn(item + 10, ";");
            snprintf(name, sizeof(name), "%.*s", (int)(n < 15 ? n : 15), item + 10);
            if (sparse_optim_parse(name, &optim->kind) != FR_OK) {
                snprintf(errstr, size, "sparse model: unknown optimizer '%s'", name);
                return FR_ERR_PARSE;
            }
        } else if (strncmp(item, "seed:", 5) == 0) {
            optim->seed = strtoull(item + 5, &end, 10);
            if (end == item + 5 || (*end != ';' && *end != '\0')) {
                snprintf(errstr, size, "sparse model: bad seed in '%s'", text);
                return FR_ERR_PARSE;
            }
        } else if (strncmp(item, "init_std:", 9) == 0) {
            optim->init_std = strtof(item + 9, &end);
            if (end == item + 9 || (*end != ';' && *end != '\0') || !(optim->init_std >= 0)) {
                snprintf(errstr, size, "sparse model: bad init_std in '%s'", text);
                return FR_ERR_PARSE;
            }
        }
    }
    return FR_OK;
}

void psstore_rows_page_fini(psstore_rows_page_t *page)
{
    free(page->ids);
    free(page->params);
    free(page->gone);
    free(page->found);
    free(page->tower);
    memset(page, 0, sizeof(*page));
}

/* Room in page for the biases and the tower of spec's table (no tower
 * without one). */
static fr_err_t page_tower(psstore_conn_t *c, psstore_rows_page_t *page, const sparse_spec_t *spec)
{
    page->nbias = sparse_outputs(spec);
    size_t n = sparse_tower_len(spec);
    if (n == page->ntower)
        return FR_OK;
    float *t = n > 0 ? realloc(page->tower, n * sizeof(float)) : NULL;
    if (n > 0 && t == NULL)
        return ps_fail(c, FR_ERR_NOMEM, "rows: out of memory for a tower of %zu floats", n);
    if (n == 0)
        free(page->tower);
    page->tower = t;
    page->ntower = n;
    return FR_OK;
}

/* Room for n rows of keep floats in page (and n tombstones). */
static fr_err_t page_reserve(psstore_conn_t *c, psstore_rows_page_t *page, size_t n, size_t keep)
{
    if (n <= page->cap)
        return FR_OK;
    uint32_t *ids = realloc(page->ids, n * sizeof(*ids));
    if (ids != NULL)
        page->ids = ids;
    float *params = ids ? realloc(page->params, n * keep * sizeof(float)) : NULL;
    if (params != NULL)
        page->params = params;
    uint8_t *found = params ? realloc(page->found, n) : NULL;
    if (found != NULL)
        page->found = found;
    uint32_t *gone = found ? realloc(page->gone, n * sizeof(*gone)) : NULL;
    if (gone == NULL)
        return ps_fail(c, FR_ERR_NOMEM, "rows: out of memory for %zu rows", n);
    page->gone = gone;
    page->cap = n;
    return FR_OK;
}

/* Sends the n commands (string arguments) inside MULTI/EXEC and returns
 * EXEC's array of n replies (caller frees), or NULL with the error. */
static redisReply *transaction(psstore_conn_t *c, int n, const char **argv[], const int argc[],
                               fr_err_t *err)
{
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    *err = ps_pipeline_append(c, 1, multi, NULL);
    for (int i = 0; i < n && *err == FR_OK; i++)
        *err = ps_pipeline_append(c, argc[i], argv[i], NULL);
    if (*err == FR_OK)
        *err = ps_pipeline_append(c, 1, exec, NULL);
    if (*err != FR_OK) {
        ps_pipeline_discard(c);
        return NULL;
    }
    redisReply *r = NULL;
    for (int i = 0; i < n + 2; i++) {
        fr_err_t e;
        redisReply *x = ps_pipeline_read(c, &e);
        if (x == NULL && *err == FR_OK)
            *err = e;
        if (i == n + 1)
            r = x;
        else if (x != NULL)
            freeReplyObject(x);
        if (x == NULL && c->ctx == NULL)
            break;
    }
    if (*err == FR_OK && (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != (size_t)n))
        *err = ps_fail(c, FR_ERR_REDIS, "rows: a read's transaction did not run");
    if (*err != FR_OK) {
        if (r != NULL)
            freeReplyObject(r);
        return NULL;
    }
    return r;
}

uint32_t ps_field_row(const char *f)
{
    const unsigned char *b = (const unsigned char *)f;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* The rows and tombstones blobs of a changes entry [id, [f, v, ...]], and
 * its time; 0 when it is not one. */
static int entry_parts(const redisReply *e, int64_t *version, int64_t *t, const redisReply **rows,
                       const redisReply **gone)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
        e->element[0]->type != REDIS_REPLY_STRING || e->element[1]->type != REDIS_REPLY_ARRAY)
        return 0;
    *version = strtoll(e->element[0]->str, NULL, 10);
    *rows = *gone = NULL;
    *t = 0;
    const redisReply *kv = e->element[1];
    for (size_t i = 0; i + 1 < kv->elements; i += 2) {
        const redisReply *k = kv->element[i], *v = kv->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            return 0;
        if (strcmp(k->str, "rows") == 0)
            *rows = v;
        else if (strcmp(k->str, "gone") == 0)
            *gone = v;
        else if (strcmp(k->str, "t") == 0)
            *t = strtoll(v->str, NULL, 10);
    }
    return *rows != NULL && *gone != NULL;
}

/* A growable list of rows. */
typedef struct row_list {
    uint32_t *v;
    size_t n, cap;
} row_list_t;

/* Appends a blob's rows (4 bytes each); -1 out of memory. */
static int list_add(row_list_t *l, const redisReply *blob)
{
    size_t more = blob->len / 4;
    if (FR_GROW(l->v, l->cap, l->n + more) != FR_OK)
        return -1;
    for (size_t k = 0; k + 4 <= blob->len; k += 4)
        l->v[l->n++] = ps_field_row(blob->str + k);
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

#define DELTA_PAGE  16   /* changes entries an XRANGE reads */
#define DELTA_CHUNK 4096 /* rows a transaction reads        */

/*
 * Lists the rows the changes entries after *version name, whole entries
 * until about max_rows rows or max_entries entries, in XRANGEs of
 * DELTA_PAGE entries (entries are only ever trimmed from the old end, so
 * reading on from the last id read misses none). Moves *version, *time_ms
 * and *more.
 */
static fr_err_t list_changes(psstore_conn_t *c, const char *model, const char *key,
                             size_t max_entries, size_t max_rows, int64_t *version, int *more,
                             int64_t *time_ms, row_list_t *l)
{
    size_t entries = 0;
    for (;;) {
        char from[32];
        snprintf(from, sizeof(from), "%lld-0", (long long)*version + 1);
        fr_err_t err;
        redisReply *r = ps_cmd(c, 0, &err, "XRANGE %s %s + COUNT %d", key, from, DELTA_PAGE);
        if (r == NULL)
            return err;
        if (r->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            return ps_fail(c, FR_ERR_REDIS, "rows: unexpected XRANGE reply");
        }
        for (size_t i = 0; i < r->elements; i++) {
            int64_t v, t;
            const redisReply *rows, *gone;
            if (!entry_parts(r->element[i], &v, &t, &rows, &gone)) {
                freeReplyObject(r);
                return ps_fail(c, FR_ERR_PARSE, "model '%s': a changes entry of another shape",
                               model);
            }
            size_t named = (rows->len + gone->len) / 4;
            if (entries > 0 && (entries == max_entries || l->n + named > max_rows)) {
                *more = 1; /* a commit is never split: the next call starts at it */
                freeReplyObject(r);
                return FR_OK;
            }
            if (list_add(l, rows) != 0 || list_add(l, gone) != 0) {
                freeReplyObject(r);
                return ps_fail(c, FR_ERR_NOMEM, "rows: out of memory for %zu rows", l->n);
            }
            entries++;
            *version = v;
            *time_ms = t > *time_ms ? t : *time_ms;
        }
        int last_page = r->elements < DELTA_PAGE;
        freeReplyObject(r);
        if (last_page)
            return FR_OK;
    }
}

/* The values of rows v[n] of shard k of S, DELTA_CHUNK rows a transaction
 * (a large commit never holds Redis in one), into page's buffers from
 * index base; the biases, read at least once, into bias (and on shard 0
 * the tower into page->tower). Sets
 * page->expired when the shard's epoch is no longer epoch (the model was
 * created again in between). */
static fr_err_t read_values(psstore_conn_t *c, const char *model, int k, int S,
                            const sparse_spec_t *spec, const sparse_optim_t *optim,
                            const uint32_t *v, size_t n, size_t base, uint64_t epoch,
                            psstore_rows_page_t *page, float *bias)
{
    size_t keep = sparse_row_len(spec);
    fr_err_t err = FR_OK;
    for (size_t at = 0; (at < n || at == 0) && err == FR_OK && !page->expired;
         at += DELTA_CHUNK) { /* once at least: the bias */
        size_t m = n - at < DELTA_CHUNK ? n - at : DELTA_CHUNK, queued = 0;
        uint64_t e;
        int64_t now;
        err = psstore_rows_pull_send(c, model, k, S, n > 0 ? v + at : NULL, m, &queued);
        if (err == FR_OK)
            err = psstore_rows_pull_recv(c, model, spec, optim, m, queued,
                                         n > 0 ? page->params + (base + at) * keep : NULL,
                                         n > 0 ? page->found + base + at : NULL, bias,
                                         k == 0 ? page->tower : NULL, &e, &now);
        if (err == FR_OK && e != epoch)
            page->expired = 1;
    }
    return err;
}

/* Shard k's part of a delta since since (the model's at S = 1), appended
 * to page; its epoch into *epoch. */
static fr_err_t shard_delta(psstore_conn_t *c, const char *model, int k, int S, int64_t since,
                            const sparse_spec_t *spec, const sparse_optim_t *optim,
                            size_t max_entries, size_t max_rows, psstore_rows_page_t *page,
                            uint64_t *epoch)
{
    fr_err_t err;
    char tag[PS_TAG_MAX], meta[PS_KEY_MAX], ver[PS_KEY_MAX], changes[PS_KEY_MAX];
    ps_shard_tag(tag, model, k, S);
    ps_key(meta, tag, "meta");
    ps_key(ver, tag, "ver");
    ps_key(changes, tag, "changes");
    const char *hget_e[] = {"HGET", meta, "epoch"}, *hget_f[] = {"HGET", meta, "delta_floor"};
    const char *get_ver[] = {"GET", ver};
    const char **argv[] = {hget_e, hget_f, get_ver};
    const int argc[] = {3, 3, 2};
    redisReply *r = transaction(c, 3, argv, argc, &err);
    if (r == NULL)
        return err;
    if (r->element[0]->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return ps_fail(c, FR_ERR_NOTFOUND, "model '%s' does not exist", model);
    }
    *epoch = strtoull(r->element[0]->str, NULL, 10);
    page->floor =
        r->element[1]->type == REDIS_REPLY_STRING ? strtoll(r->element[1]->str, NULL, 10) : 0;
    page->head =
        r->element[2]->type == REDIS_REPLY_STRING ? strtoll(r->element[2]->str, NULL, 10) : 0;
    freeReplyObject(r);
    /* older than the history kept, or newer than the model (created again,
     * or writes lost): the client's rows are of another history */
    if (since < page->floor || since > page->head) {
        page->expired = 1;
        page->expired_shard = k;
        return FR_OK;
    }
    row_list_t l = {0};
    err = list_changes(c, model, changes, max_entries > 0 ? max_entries : 1, max_rows, &page->at[k],
                       &page->more, &page->time_ms, &l);
    size_t n = 0;
    if (err == FR_OK && l.n > 0) { /* distinct rows */
        qsort(l.v, l.n, sizeof(uint32_t), cmp_u32);
        for (size_t i = 0; i < l.n; i++)
            if (n == 0 || l.v[i] != l.v[n - 1])
                l.v[n++] = l.v[i];
    }
    size_t keep = sparse_row_len(spec), base = page->n;
    if (err == FR_OK)
        err = page_reserve(c, page, page->n + page->ngone + n, keep);
    if (err == FR_OK)
        err = page_tower(c, page, spec);
    float bias[SPARSE_CLASSES_MAX];
    if (err == FR_OK && (n > 0 || k == 0))
        err = read_values(c, model, k, S, spec, optim, l.v, n, base, *epoch, page, bias);
    if (err == FR_OK && !page->expired) {
        if (k == 0)
            memcpy(page->bias, bias, (size_t)page->nbias * sizeof(float));
        /* present rows move down in place; the rest are tombstones */
        for (size_t i = 0; i < n; i++) {
            if (!page->found[base + i]) {
                page->gone[page->ngone++] = l.v[i];
                continue;
            }
            if (page->n != base + i)
                memmove(page->params + page->n * keep, page->params + (base + i) * keep,
                        keep * sizeof(float));
            page->ids[page->n++] = l.v[i];
        }
    }
    if (page->expired)
        page->expired_shard = k;
    free(l.v);
    return err;
}

fr_err_t psstore_rows_delta(psstore_conn_t *c, const char *model, int S, const int64_t *since,
                            const sparse_spec_t *spec, const sparse_optim_t *optim,
                            size_t max_entries, size_t max_rows, psstore_rows_page_t *page)
{
    fr_err_t err;
    if ((err = psstore_model_name_check(model, c->errstr, sizeof(c->errstr))) != FR_OK)
        return err;
    if (S < 1 || S > PSSTORE_SHARDS_MAX)
        return ps_fail(c, FR_ERR_INVAL, "rows: %d shards", S);
    page->n = page->ngone = 0;
    page->expired = page->more = page->expired_shard = 0;
    page->time_ms = 0;
    page->epoch = 0;
    memset(page->bias, 0, sizeof(page->bias));
    page->shards = S;
    for (int k = 0; k < S; k++)
        page->at[k] = since[k];
    /* each shard its share of the rows (at least one commit each) */
    size_t share = max_rows / (size_t)S > 0 ? max_rows / (size_t)S : 1;
    for (int k = 0; k < S && err == FR_OK && !page->expired; k++) {
        uint64_t epoch = 0;
        err = shard_delta(c, model, k, S, since[k], spec, optim, max_entries, share, page, &epoch);
        page->epoch += epoch;
    }
    page->version = 0;
    for (int k = 0; k < S; k++)
        page->version += page->at[k];
    return err;
}

/* "k.c" (S > 1; "0": shard 0 from its start) or "c" into the shard and
 * its HSCAN cursor; -1 when it is no cursor of S shards. */
static int parse_cursor(const char *cursor, int S, int *k, char hscan[32])
{
    const char *dot = strchr(cursor, '.');
    *k = 0;
    if (dot == NULL) {
        if ((S > 1 && strcmp(cursor, "0") != 0) || strlen(cursor) >= 32)
            return -1;
        snprintf(hscan, 32, "%s", cursor);
    } else {
        char *end;
        long x = strtol(cursor, &end, 10);
        if (S == 1 || end != dot || end == cursor || x < 0 || x >= S || strlen(dot + 1) >= 32 ||
            dot[1] == '\0')
            return -1;
        *k = (int)x;
        snprintf(hscan, 32, "%s", dot + 1);
    }
    return hscan[0] != '\0' && strspn(hscan, "0123456789") == strlen(hscan) ? 0 : -1;
}

fr_err_t psstore_rows_scan(psstore_conn_t *c, const char *model, int S, const sparse_spec_t *spec,
                           const sparse_optim_t *optim, const char *cursor, size_t count,
                           psstore_rows_page_t *page, char next[48])
{
    fr_err_t err;
    if ((err = psstore_model_name_check(model, c->errstr, sizeof(c->errstr))) != FR_OK)
        return err;
    int k;
    char at[32], tag[PS_TAG_MAX];
    if (S < 1 || S > PSSTORE_SHARDS_MAX || parse_cursor(cursor, S, &k, at) != 0)
        return ps_fail(c, FR_ERR_INVAL, "rows: '%.40s' is no cursor of a model of %d shard%s",
                       cursor, S, S == 1 ? "" : "s");
    ps_shard_tag(tag, model, k, S);
    char meta[PS_KEY_MAX], ver[PS_KEY_MAX], w[PS_KEY_MAX], key[PS_KEY_MAX], cnt[32];
    ps_key(meta, tag, "meta");
    ps_key(ver, tag, "ver");
    ps_key_shard(w, tag, "w", 0);
    ps_key(key, tag, "rows");
    snprintf(cnt, sizeof(cnt), "%zu", count > 0 ? count : 1);
    const char *hget[] = {"HGET", meta, "epoch"}, *get_ver[] = {"GET", ver}, *get_w[] = {"GET", w};
    const char *hscan[] = {"HSCAN", key, at, "COUNT", cnt};
    const char **argv[] = {hget, get_ver, get_w, hscan};
    const int argc[] = {3, 2, 2, 5};
    redisReply *r = transaction(c, 4, argv, argc, &err);
    if (r == NULL)
        return err;
    page->n = page->ngone = 0;
    page->expired = page->more = page->expired_shard = 0;
    page->time_ms = 0;
    page->shards = S;
    if (r->element[0]->type != REDIS_REPLY_STRING)
        err = ps_fail(c, FR_ERR_NOTFOUND, "model '%s' does not exist", model);
    else if (r->element[2]->type != REDIS_REPLY_STRING ||
             (size_t)r->element[2]->len != 4 * (k == 0 ? sparse_dense_len(spec) : 1))
        err = ps_fail(c, FR_ERR_PARSE, "model '%s': its dense part (w:0) is not %zu floats", model,
                      k == 0 ? sparse_dense_len(spec) : 1);
    const redisReply *sc = r->element[3];
    if (err == FR_OK &&
        (sc->type != REDIS_REPLY_ARRAY || sc->elements != 2 ||
         sc->element[0]->type != REDIS_REPLY_STRING || sc->element[1]->type != REDIS_REPLY_ARRAY))
        err = ps_fail(c, FR_ERR_REDIS, "rows: unexpected HSCAN reply (is the cursor right?)");
    size_t keep = sparse_row_len(spec), len = keep + sparse_state_len(spec, optim);
    if (err == FR_OK)
        err = page_reserve(c, page, sc->element[1]->elements / 2, keep);
    if (err == FR_OK)
        err = page_tower(c, page, spec);
    if (err == FR_OK) {
        page->epoch = strtoull(r->element[0]->str, NULL, 10);
        page->at[k] =
            r->element[1]->type == REDIS_REPLY_STRING ? strtoll(r->element[1]->str, NULL, 10) : 0;
        if (k == 0) { /* the biases, then the tower */
            memcpy(page->bias, r->element[2]->str, (size_t)page->nbias * sizeof(float));
            if (page->ntower > 0)
                memcpy(page->tower, r->element[2]->str + (size_t)page->nbias * sizeof(float),
                       page->ntower * sizeof(float));
        }
        const char *hnext = sc->element[0]->str;
        if (S == 1)
            snprintf(next, 48, "%s", hnext);
        else if (strcmp(hnext, "0") != 0)
            snprintf(next, 48, "%d.%s", k, hnext);
        else if (k + 1 < S) /* the shard is read: the next one's first page */
            snprintf(next, 48, "%d.0", k + 1);
        else
            snprintf(next, 48, "0");
        const redisReply *kv = sc->element[1];
        for (size_t i = 0; i + 1 < kv->elements && err == FR_OK; i += 2) {
            const redisReply *f = kv->element[i], *v = kv->element[i + 1];
            if (f->type != REDIS_REPLY_STRING || f->len != 4 || v->type != REDIS_REPLY_STRING ||
                v->len != len * sizeof(float)) {
                err = ps_fail(c, FR_ERR_PARSE, "model '%s': a row of another size", model);
                break;
            }
            page->ids[page->n] = ps_field_row(f->str);
            memcpy(page->params + page->n * keep, v->str, keep * sizeof(float));
            page->n++;
        }
        page->more = strcmp(next, "0") != 0;
    }
    freeReplyObject(r);
    /* the other shards' versions and epochs (and shard 0's biases) now: a
     * client follows the table with a delta since the first page's */
    for (int j = 0; j < S && S > 1 && err == FR_OK; j++) {
        if (j == k)
            continue;
        size_t queued = 0;
        float bias[SPARSE_CLASSES_MAX];
        uint64_t e;
        err = psstore_rows_pull_send(c, model, j, S, NULL, 0, &queued);
        if (err == FR_OK)
            err = psstore_rows_pull_recv(c, model, spec, optim, 0, queued, NULL, NULL, bias,
                                         j == 0 ? page->tower : NULL, &e, &page->at[j]);
        if (err == FR_OK) {
            page->epoch += e;
            if (j == 0)
                memcpy(page->bias, bias, (size_t)page->nbias * sizeof(float));
        }
    }
    page->version = 0;
    for (int j = 0; j < S; j++)
        page->version += page->at[j];
    return err;
}
