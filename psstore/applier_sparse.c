/*
 * applier_sparse.c - the applier of a sparse model (docs/design.md "Sparse
 * models"). A gradient carries the rows of its batch and their gradients
 * (psstore.h "Sparse models"). The applier keeps the rows it touched since
 * it loaded, parameters and optimizer state, in an open-addressing table;
 * it reads a row from Redis the first time a gradient touches it (the
 * store holds every commit, and this applier is the only writer), steps it
 * with the per-row optimizer, and its next commit writes the rows that
 * changed in the same transaction as the offsets of the positions they
 * hold: exactly once holds as for dense weights. The bias is w:0.
 *
 * Thread: the applier's.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "psstore/applier_int.h"

#define FIRST_CAP ((size_t)1 << 12) /* table slots at first; doubled at half full */

/* The table position of row: its slot + 1 in keys when held, else the
 * empty position where it would go (keys[pos] == 0). */
static size_t probe(const ps_sparse_t *sp, uint32_t row)
{
    size_t mask = sp->cap - 1, pos = (row * (size_t)2654435761u) & mask;
    while (sp->keys[pos] != 0 && sp->keys[pos] != row + 1)
        pos = (pos + 1) & mask;
    return pos;
}

ps_sparse_t *ps_sparse_new(const psstore_sparse_conf_t *conf)
{
    ps_sparse_t *sp = calloc(1, sizeof(*sp));
    if (sp == NULL)
        return NULL;
    /* writer first: glibc's default lets readers in while the applier
     * waits, and enough workers reading would starve it of its lease */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&sp->rw, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&sp->dmu, NULL);
    pthread_condattr_t ca; /* a wait's deadline on the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sp->dcv, &ca);
    pthread_condattr_destroy(&ca);
    sp->spec = conf->spec;
    sp->optim = conf->optim;
    sp->rowlen = sparse_row_len(&sp->spec);
    sp->statelen = sparse_state_len(&sp->spec, &sp->optim);
    sp->vlen = sp->rowlen + sp->statelen;
    sp->min_count = conf->min_count;
    if (sp->min_count > 1 && (sp->sketch = calloc(PS_SKETCH_ROWS * PS_SKETCH_WIDTH, 1)) == NULL) {
        ps_sparse_free(sp);
        return NULL;
    }
    return sp;
}

void ps_sparse_clear(ps_sparse_t *sp)
{
    if (sp == NULL)
        return;
    pthread_rwlock_wrlock(&sp->rw);
    sp->ready = 0;
    free(sp->keys);
    free(sp->slot_of);
    free(sp->rows);
    free(sp->vals);
    free(sp->dirty);
    free(sp->dirty_list);
    free(sp->miss);
    free(sp->fields);
    free(sp->grad);
    free(sp->loaded);
    free(sp->got);
    sp->loaded = NULL;
    sp->got = NULL;
    sp->caploaded = sp->capgot = 0;
    sp->keys = sp->slot_of = sp->rows = sp->dirty_list = sp->miss = NULL;
    sp->vals = sp->grad = NULL;
    sp->dirty = NULL;
    sp->fields = NULL;
    sp->cap = sp->ndirty = sp->nslots = sp->capslots = 0;
    sp->nmiss = sp->capmiss = sp->capfields = sp->capgrad = 0;
    pthread_rwlock_unlock(&sp->rw);
}

void ps_sparse_free(ps_sparse_t *sp)
{
    if (sp == NULL)
        return;
    ps_sparse_clear(sp);
    free(sp->sketch);
    pthread_rwlock_destroy(&sp->rw);
    pthread_mutex_destroy(&sp->dmu);
    pthread_cond_destroy(&sp->dcv);
    free(sp);
}

void ps_sparse_ready(ps_sparse_t *sp, int ready)
{
    if (sp == NULL)
        return;
    pthread_rwlock_wrlock(&sp->rw);
    sp->ready = ready;
    pthread_rwlock_unlock(&sp->rw);
}

/* "ms-seq" into its two numbers; 0 when it is not a stream id. */
static int parse_id(const char *id, uint64_t *ms, uint64_t *seq)
{
    char *end;
    *ms = strtoull(id, &end, 10);
    if (end == id || *end != '-')
        return 0;
    const char *s = end + 1;
    *seq = strtoull(s, &end, 10);
    return end != s && *end == '\0';
}

void ps_sparse_decided(ps_sparse_t *sp, const char *id)
{
    uint64_t ms, seq;
    if (sp == NULL || !parse_id(id, &ms, &seq))
        return;
    pthread_mutex_lock(&sp->dmu);
    if (ms > sp->dec_ms || (ms == sp->dec_ms && seq > sp->dec_seq)) {
        sp->dec_ms = ms;
        sp->dec_seq = seq;
    }
    pthread_cond_broadcast(&sp->dcv);
    pthread_mutex_unlock(&sp->dmu);
}

fr_err_t psstore_applier_decided_wait(psstore_applier_t *a, const char *id, int timeout_ms,
                                      int *decided)
{
    ps_sparse_t *sp = a->sp;
    uint64_t ms, seq;
    *decided = 0;
    if (sp == NULL || id == NULL || !parse_id(id, &ms, &seq))
        return FR_ERR_INVAL;
    pthread_rwlock_rdlock(&sp->rw);
    int ready = sp->ready;
    pthread_rwlock_unlock(&sp->rw);
    if (!ready) /* another process's applier decides: ask the store */
        return FR_ERR_STATE;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&sp->dmu);
    while (!(sp->dec_ms > ms || (sp->dec_ms == ms && sp->dec_seq >= seq)))
        if (pthread_cond_timedwait(&sp->dcv, &sp->dmu, &until) != 0)
            break;
    *decided = sp->dec_ms > ms || (sp->dec_ms == ms && sp->dec_seq >= seq);
    pthread_mutex_unlock(&sp->dmu);
    return FR_OK;
}

fr_err_t psstore_applier_rows(psstore_applier_t *a, const uint32_t *rows, size_t n, float *params,
                              uint8_t *found, float *bias, uint64_t *epoch, int64_t *version)
{
    ps_sparse_t *sp = a->sp;
    if (sp == NULL)
        return FR_ERR_INVAL;
    pthread_rwlock_rdlock(&sp->rw);
    if (!sp->ready) {
        pthread_rwlock_unlock(&sp->rw);
        return FR_ERR_STATE;
    }
    for (size_t i = 0; i < n; i++) {
        size_t pos = sp->cap > 0 ? probe(sp, rows[i]) : 0;
        found[i] = sp->cap > 0 && sp->keys[pos] != 0;
        if (found[i])
            memcpy(params + i * sp->rowlen, sp->vals + (size_t)sp->slot_of[pos] * sp->vlen,
                   sp->rowlen * sizeof(float));
    }
    *bias = a->w[0];
    *epoch = a->epoch;
    *version = a->version;
    pthread_rwlock_unlock(&sp->rw);
    return FR_OK;
}

/* Makes room for `more` rows: the table stays at most half full, the
 * slots' arrays grow. FR_ERR_NOMEM changes nothing that was held. */
static fr_err_t reserve(ps_sparse_t *sp, size_t more)
{
    size_t need = sp->nslots + more;
    if (need > sp->capslots) {
        size_t cap = sp->capslots ? sp->capslots : FIRST_CAP;
        while (cap < need)
            cap *= 2;
        uint32_t *rows = realloc(sp->rows, cap * sizeof(*rows));
        if (rows != NULL)
            sp->rows = rows;
        float *vals = rows ? realloc(sp->vals, cap * sp->vlen * sizeof(float)) : NULL;
        if (vals != NULL)
            sp->vals = vals;
        uint8_t *dirty = vals ? realloc(sp->dirty, cap) : NULL;
        if (dirty != NULL)
            sp->dirty = dirty;
        uint32_t *list = dirty ? realloc(sp->dirty_list, cap * sizeof(*list)) : NULL;
        if (list == NULL)
            return FR_ERR_NOMEM;
        sp->dirty_list = list;
        sp->capslots = cap;
    }
    if (2 * need > sp->cap) {
        size_t cap = sp->cap ? sp->cap : 2 * FIRST_CAP;
        while (cap < 2 * need)
            cap *= 2;
        uint32_t *keys = calloc(cap, sizeof(*keys)), *slot_of = malloc(cap * sizeof(*slot_of));
        if (keys == NULL || slot_of == NULL) {
            free(keys);
            free(slot_of);
            return FR_ERR_NOMEM;
        }
        free(sp->keys);
        free(sp->slot_of);
        sp->keys = keys;
        sp->slot_of = slot_of;
        sp->cap = cap;
        for (size_t s = 0; s < sp->nslots; s++) {
            size_t pos = probe(sp, sp->rows[s]);
            sp->keys[pos] = sp->rows[s] + 1;
            sp->slot_of[pos] = (uint32_t)s;
        }
    }
    return FR_OK;
}

/* Grows a scratch array to n elements of size bytes. */
static int scratch(void **p, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap)
        return 0;
    void *q = realloc(*p, n * size);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

/*
 * Reads the rows of g the table does not hold from Redis (one pipeline of
 * HMGETs) into the scratch: sp->miss their rows, sp->loaded their values
 * and sp->got whether the store has them. No lock: only this thread
 * changes the table, and nothing of it changes here.
 */
static fr_err_t read_missing(psstore_applier_t *a, const float *packed, size_t m)
{
    ps_sparse_t *sp = a->sp;
    sp->nmiss = 0;
    if (scratch((void **)&sp->miss, &sp->capmiss, m, sizeof(uint32_t)) != 0 ||
        scratch((void **)&sp->fields, &sp->capfields, 4 * m, 1) != 0)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory for %zu rows", m);
    for (size_t i = 0; i < m; i++) {
        uint32_t row;
        memcpy(&row, packed + i, sizeof(row));
        if (sp->cap > 0 && sp->keys[probe(sp, row)] != 0)
            continue;
        ps_row_field(row, sp->fields + 4 * sp->nmiss);
        sp->miss[sp->nmiss++] = row;
    }
    if (sp->nmiss == 0)
        return FR_OK;
    if (scratch((void **)&sp->loaded, &sp->caploaded, sp->nmiss * sp->vlen, sizeof(float)) != 0 ||
        scratch((void **)&sp->got, &sp->capgot, sp->nmiss, 1) != 0)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory for %zu rows", sp->nmiss);
    char rows_key[PS_KEY_MAX];
    ps_key(rows_key, a->model, "rows");
    size_t queued = 0;
    fr_err_t err = ps_rows_queue(a->c, rows_key, sp->fields, sp->nmiss, &queued);
    if (err != FR_OK) {
        ps_pipeline_discard(a->c);
        return err;
    }
    for (size_t k = 0; k < queued; k++) {
        fr_err_t e;
        redisReply *r = ps_pipeline_read(a->c, &e);
        if (r == NULL) {
            err = err == FR_OK ? e : err;
            if (a->c->ctx == NULL)
                break;
            continue;
        }
        size_t at = k * PS_ROWS_CHUNK;
        size_t n = sp->nmiss - at < PS_ROWS_CHUNK ? sp->nmiss - at : PS_ROWS_CHUNK;
        if (err == FR_OK)
            err = ps_rows_take(a->c, r, sp->vlen, sp->vlen, sp->loaded + at * sp->vlen,
                               sp->got + at, n);
        freeReplyObject(r);
    }
    return err;
}

/*
 * Admission (docs/design.md "Sparse models"): counts one more gradient
 * naming row, a row the store lacks, in the count-min sketch, and says
 * whether it has now been named min_count times. Rare values, most of a
 * hashed categorical vocabulary, then never cost the store a row. The
 * sketch overcounts only (collisions), so a row may be admitted early,
 * never late; it lives in the applier and starts again with it.
 */
static int admitted(ps_sparse_t *sp, uint32_t row)
{
    if (sp->sketch == NULL)
        return 1;
    unsigned least = 255;
    for (int k = 0; k < PS_SKETCH_ROWS; k++) {
        uint8_t *c = sp->sketch + (size_t)k * PS_SKETCH_WIDTH +
                     sparse_hash(k, &row, sizeof(row), PS_SKETCH_BITS);
        if (*c < 255)
            ++*c;
        least = *c < least ? *c : least;
    }
    return least >= (unsigned)sp->min_count;
}

/* Adds the rows read_missing read (a row g names twice once), at the
 * store's value or their initial one; a row the store lacks only once it
 * is admitted. Under the write lock. */
static fr_err_t insert_missing(ps_sparse_t *sp)
{
    if (sp->nmiss == 0)
        return FR_OK;
    if (reserve(sp, sp->nmiss) != FR_OK)
        return FR_ERR_NOMEM;
    for (size_t i = 0; i < sp->nmiss; i++) {
        uint32_t row = sp->miss[i];
        size_t pos = probe(sp, row);
        if (sp->keys[pos] != 0 || (!sp->got[i] && !admitted(sp, row)))
            continue;
        size_t s = sp->nslots++;
        sp->keys[pos] = row + 1;
        sp->slot_of[pos] = (uint32_t)s;
        sp->rows[s] = row;
        sp->dirty[s] = 0;
        float *v = sp->vals + s * sp->vlen;
        if (sp->got[i])
            memcpy(v, sp->loaded + i * sp->vlen, sp->vlen * sizeof(float));
        else
            sparse_row_init(&sp->spec, &sp->optim, row, v, v + sp->rowlen);
    }
    return FR_OK;
}

int ps_sparse_shape(const psstore_applier_t *a, const psstore_grad_t *g, size_t *m)
{
    const ps_sparse_t *sp = a->sp;
    size_t per = 2 + (size_t)sp->spec.dim;
    if (g->len < 1 || (g->len - 1) % per != 0)
        return 0;
    *m = (g->len - 1) / per;
    if (*m > (size_t)1 << sp->spec.bits) /* more rows than the table: no batch's */
        return 0;
    for (size_t i = 0; i < *m; i++) {
        uint32_t row;
        memcpy(&row, g->g + i, sizeof(row));
        if (row >> sp->spec.bits != 0)
            return 0;
    }
    for (size_t i = *m; i < g->len; i++) {
        float v;
        memcpy(&v, g->g + i, sizeof(v));
        if (!isfinite(v))
            return -1;
    }
    return 1;
}

fr_err_t ps_sparse_apply(psstore_applier_t *a, const psstore_grad_t *g, size_t m)
{
    ps_sparse_t *sp = a->sp;
    fr_err_t err = read_missing(a, g->g, m);
    if (err == FR_OK && scratch((void **)&sp->grad, &sp->capgrad, sp->rowlen, sizeof(float)) != 0)
        err = ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    if (err != FR_OK)
        return err;
    pthread_rwlock_wrlock(&sp->rw);
    if (insert_missing(sp) != FR_OK) {
        pthread_rwlock_unlock(&sp->rw);
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory for %zu rows", sp->nmiss);
    }
    for (size_t i = 0; i < m; i++) {
        uint32_t row;
        memcpy(&row, g->g + i, sizeof(row));
        size_t pos = probe(sp, row);
        if (sp->keys[pos] == 0) /* not admitted yet */
            continue;
        size_t s = sp->slot_of[pos];
        memcpy(sp->grad, g->g + m + i * sp->rowlen, sp->rowlen * sizeof(float));
        sparse_row_step(&sp->spec, &sp->optim, sp->vals + s * sp->vlen,
                        sp->vals + s * sp->vlen + sp->rowlen, sp->grad);
        if (!sp->dirty[s]) {
            sp->dirty[s] = 1;
            sp->dirty_list[sp->ndirty++] = (uint32_t)s;
        }
    }
    float gb;
    memcpy(&gb, g->g + g->len - 1, sizeof(gb));
    sparse_bias_step(&sp->optim, &a->w[0], a->opt, gb);
    a->version++;
    pthread_rwlock_unlock(&sp->rw);
    return FR_OK;
}

void ps_sparse_committed(ps_sparse_t *sp)
{
    if (sp == NULL)
        return;
    for (size_t i = 0; i < sp->ndirty; i++)
        sp->dirty[sp->dirty_list[i]] = 0;
    sp->ndirty = 0;
}
