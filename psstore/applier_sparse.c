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
#include <stdlib.h>
#include <string.h>

#include "psstore/applier_int.h"

#define FIRST_CAP ((size_t)1 << 12) /* table slots at first; doubled at half full */

ps_sparse_t *ps_sparse_new(const psstore_sparse_conf_t *conf)
{
    ps_sparse_t *sp = calloc(1, sizeof(*sp));
    if (sp == NULL)
        return NULL;
    sp->spec = conf->spec;
    sp->optim = conf->optim;
    sp->rowlen = sparse_row_len(&sp->spec);
    sp->statelen = sparse_state_len(&sp->spec, &sp->optim);
    return sp;
}

void ps_sparse_clear(ps_sparse_t *sp)
{
    if (sp == NULL)
        return;
    free(sp->keys);
    free(sp->slot_of);
    free(sp->rows);
    free(sp->params);
    free(sp->state);
    free(sp->dirty);
    free(sp->dirty_list);
    free(sp->miss);
    free(sp->fields);
    free(sp->grad);
    sparse_spec_t spec = sp->spec;
    sparse_optim_t optim = sp->optim;
    size_t rowlen = sp->rowlen, statelen = sp->statelen;
    memset(sp, 0, sizeof(*sp));
    sp->spec = spec;
    sp->optim = optim;
    sp->rowlen = rowlen;
    sp->statelen = statelen;
}

void ps_sparse_free(ps_sparse_t *sp)
{
    ps_sparse_clear(sp);
    free(sp);
}

/* The table position of row: its slot + 1 in keys when held, else the
 * empty position where it would go (keys[pos] == 0). */
static size_t probe(const ps_sparse_t *sp, uint32_t row)
{
    size_t mask = sp->cap - 1, pos = (row * (size_t)2654435761u) & mask;
    while (sp->keys[pos] != 0 && sp->keys[pos] != row + 1)
        pos = (pos + 1) & mask;
    return pos;
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
        float *params = rows ? realloc(sp->params, cap * sp->rowlen * sizeof(float)) : NULL;
        if (params != NULL)
            sp->params = params;
        float *state =
            params ? realloc(sp->state, cap * (sp->statelen ? sp->statelen : 1) * sizeof(float))
                   : NULL;
        if (state != NULL)
            sp->state = state;
        uint8_t *dirty = state ? realloc(sp->dirty, cap) : NULL;
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

/* Forgets the last n slots (rows inserted by a read that failed): the
 * table is built again from the slots left. */
static void forget_last(ps_sparse_t *sp, size_t n)
{
    sp->nslots -= n;
    memset(sp->keys, 0, sp->cap * sizeof(*sp->keys));
    for (size_t s = 0; s < sp->nslots; s++) {
        size_t pos = probe(sp, sp->rows[s]);
        sp->keys[pos] = sp->rows[s] + 1;
        sp->slot_of[pos] = (uint32_t)s;
    }
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
 * Adds the rows of g the table does not hold, read from Redis (rows and
 * rowopt, one pipeline), or at their initial value where the store has
 * none.
 */
static fr_err_t load_missing(psstore_applier_t *a, const float *packed, size_t m)
{
    ps_sparse_t *sp = a->sp;
    sp->nmiss = 0;
    if (scratch((void **)&sp->miss, &sp->capmiss, m, sizeof(uint32_t)) != 0 ||
        scratch((void **)&sp->fields, &sp->capfields, 4 * m, 1) != 0 || reserve(sp, m) != FR_OK)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory for %zu rows", m);
    for (size_t i = 0; i < m; i++) {
        uint32_t row;
        memcpy(&row, packed + i, sizeof(row));
        size_t pos = probe(sp, row);
        if (sp->keys[pos] != 0)
            continue;
        size_t s = sp->nslots++;
        sp->keys[pos] = row + 1;
        sp->slot_of[pos] = (uint32_t)s;
        sp->rows[s] = row;
        sp->dirty[s] = 0;
        sparse_row_init(&sp->spec, &sp->optim, row, sp->params + s * sp->rowlen,
                        sp->state + s * sp->statelen);
        ps_row_field(row, sp->fields + 4 * sp->nmiss);
        sp->miss[sp->nmiss++] = (uint32_t)s;
    }
    if (sp->nmiss == 0)
        return FR_OK;
    char rows_key[PS_KEY_MAX], opt_key[PS_KEY_MAX];
    ps_key(rows_key, a->model, "rows");
    ps_key(opt_key, a->model, "rowopt");
    size_t queued = 0;
    fr_err_t err = ps_rows_queue(a->c, rows_key, sp->fields, sp->nmiss, &queued);
    if (err == FR_OK)
        err = ps_rows_queue(a->c, opt_key, sp->fields, sp->nmiss, &queued);
    if (err != FR_OK) {
        ps_pipeline_discard(a->c);
        forget_last(sp, sp->nmiss);
        return err;
    }
    size_t chunks = queued / 2, len[2] = {sp->rowlen, sp->statelen};
    float *tmp = NULL;
    size_t captmp = 0;
    for (size_t k = 0; k < queued; k++) {
        fr_err_t e;
        redisReply *r = ps_pipeline_read(a->c, &e);
        if (r == NULL) {
            err = err == FR_OK ? e : err;
            if (a->c->ctx == NULL)
                break;
            continue;
        }
        size_t which = k / chunks, at = (k % chunks) * PS_ROWS_CHUNK;
        size_t n = sp->nmiss - at < PS_ROWS_CHUNK ? sp->nmiss - at : PS_ROWS_CHUNK;
        if (err == FR_OK && len[which] > 0 &&
            scratch((void **)&tmp, &captmp, n * len[which], sizeof(float)) != 0)
            err = ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        uint8_t found[PS_ROWS_CHUNK];
        if (err == FR_OK && len[which] > 0)
            err = ps_rows_take(a->c, r, len[which], tmp, found, n);
        for (size_t i = 0; err == FR_OK && len[which] > 0 && i < n; i++) {
            if (!found[i])
                continue;
            uint32_t s = sp->miss[at + i];
            float *dst = which == 0 ? sp->params + s * sp->rowlen : sp->state + s * sp->statelen;
            memcpy(dst, tmp + i * len[which], len[which] * sizeof(float));
        }
        freeReplyObject(r);
    }
    free(tmp);
    if (err != FR_OK)
        forget_last(sp, sp->nmiss); /* their values are not the store's */
    return err;
}

int ps_sparse_shape(const psstore_applier_t *a, const psstore_grad_t *g, size_t *m)
{
    const ps_sparse_t *sp = a->sp;
    size_t per = 2 + (size_t)sp->spec.dim;
    if (g->len < 1 || (g->len - 1) % per != 0)
        return 0;
    *m = (g->len - 1) / per;
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
    fr_err_t err = load_missing(a, g->g, m);
    if (err != FR_OK)
        return err;
    if (scratch((void **)&sp->grad, &sp->capgrad, sp->rowlen, sizeof(float)) != 0)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    for (size_t i = 0; i < m; i++) {
        uint32_t row;
        memcpy(&row, g->g + i, sizeof(row));
        size_t s = sp->slot_of[probe(sp, row)];
        memcpy(sp->grad, g->g + m + i * sp->rowlen, sp->rowlen * sizeof(float));
        sparse_row_step(&sp->spec, &sp->optim, sp->params + s * sp->rowlen,
                        sp->state + s * sp->statelen, sp->grad);
        if (!sp->dirty[s]) {
            sp->dirty[s] = 1;
            sp->dirty_list[sp->ndirty++] = (uint32_t)s;
        }
    }
    float gb;
    memcpy(&gb, g->g + g->len - 1, sizeof(gb));
    sparse_bias_step(&sp->optim, &a->w[0], a->opt, gb);
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
