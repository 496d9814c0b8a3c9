/*
 * applier_sparse.c - the applier of a sparse model (docs/design.md "Sparse
 * models"). A gradient carries the rows of its batch and their gradients
 * (psstore/store/rows_sparse.h). The applier keeps the rows it touched since
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

#include "psstore/applier/applier_sparse.h"

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

/* Eviction and the window run on the monotonic clock: a step of the wall
 * clock must not make every row look stale. */
static int64_t mono_ms(void)
{
    return (int64_t)(fr_clock_mono_ns() / 1000000u);
}

/* The monotonic clock ms milliseconds from now: a condition wait's deadline. */
static struct timespec deadline_in(int64_t ms)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    return until;
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
    pthread_mutex_init(&sp->step, NULL);
    pthread_condattr_t ca; /* a wait's deadline on the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sp->dcv, &ca);
    pthread_cond_init(&sp->wake, &ca);
    pthread_condattr_destroy(&ca);
    sp->inproc = conf->inproc;
    sp->spec = conf->spec;
    sp->optim = conf->optim;
    sp->rowlen = sparse_row_len(&sp->spec);
    sp->statelen = sparse_state_len(&sp->spec, &sp->optim);
    sp->vlen = sp->rowlen + sp->statelen;
    sp->min_count = conf->min_count;
    sp->ttl_ms = conf->ttl_ms;
    sp->delta_ms = conf->delta_ms > 0 ? conf->delta_ms : PS_DELTA_MS_DEFAULT;
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
    sp->complete = 0;
    atomic_store(&sp->accepting, 0);
    sp->window = 0;
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
    free(sp->touched);
    free(sp->evict);
    free(sp->blob);
    sp->touched = NULL;
    sp->evict = NULL;
    sp->blob = NULL;
    sp->nevict = sp->capevict = sp->capblob = 0;
    sp->sweeping = 0;
    sp->nmarks = 0;
    sp->reset_changes = 0;
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
    pthread_mutex_destroy(&sp->step);
    pthread_cond_destroy(&sp->wake);
    free(sp);
}

void ps_sparse_ready(ps_sparse_t *sp, int ready)
{
    if (sp == NULL)
        return;
    pthread_rwlock_wrlock(&sp->rw);
    sp->ready = ready;
    atomic_store(&sp->accepting, ready && sp->complete && sp->inproc);
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
    struct timespec until = deadline_in(timeout_ms);
    pthread_mutex_lock(&sp->dmu);
    while (!(sp->dec_ms > ms || (sp->dec_ms == ms && sp->dec_seq >= seq)))
        if (pthread_cond_timedwait(&sp->dcv, &sp->dmu, &until) != 0)
            break;
    *decided = sp->dec_ms > ms || (sp->dec_ms == ms && sp->dec_seq >= seq);
    pthread_mutex_unlock(&sp->dmu);
    return FR_OK;
}

fr_err_t psstore_applier_rows(psstore_applier_t *a, const uint32_t *rows, size_t n, float *params,
                              uint8_t *found, float *bias, float *tower, uint64_t *epoch,
                              int64_t *version, int *complete)
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
    /* shard 0's w: the biases, then the tower; the others' one float */
    size_t K = a->n == 1 ? 1 : (size_t)sparse_outputs(&sp->spec);
    memcpy(bias, a->w, K * sizeof(float));
    if (tower != NULL && a->n > K)
        memcpy(tower, a->w + K, (a->n - K) * sizeof(float));
    *epoch = a->epoch;
    *version = a->version;
    if (complete != NULL)
        *complete = sp->complete;
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
        uint32_t *dirty = vals ? realloc(sp->dirty, cap * sizeof(*dirty)) : NULL;
        if (dirty != NULL)
            sp->dirty = dirty;
        uint32_t *list = dirty ? realloc(sp->dirty_list, cap * sizeof(*list)) : NULL;
        if (list != NULL)
            sp->dirty_list = list;
        int64_t *touched = list ? realloc(sp->touched, cap * sizeof(*touched)) : NULL;
        if (touched == NULL)
            return FR_ERR_NOMEM;
        sp->touched = touched;
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

/* A new slot for row at its empty table position pos (reserve() made
 * room), clean and never stepped; its value is the caller's to write. */
static size_t add_slot(ps_sparse_t *sp, size_t pos, uint32_t row)
{
    FR_ASSERT(sp->keys[pos] == 0 && sp->nslots < sp->capslots && 2 * sp->nslots < sp->cap);
    size_t s = sp->nslots++;
    sp->keys[pos] = row + 1;
    sp->slot_of[pos] = (uint32_t)s;
    sp->rows[s] = row;
    sp->dirty[s] = 0;
    sp->touched[s] = 0;
    return s;
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
    if (FR_GROW(sp->miss, sp->capmiss, m) != FR_OK ||
        FR_GROW(sp->fields, sp->capfields, 4 * m) != FR_OK)
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
    if (FR_GROW(sp->loaded, sp->caploaded, sp->nmiss * sp->vlen) != FR_OK ||
        FR_GROW(sp->got, sp->capgot, sp->nmiss) != FR_OK)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory for %zu rows", sp->nmiss);
    if (sp->complete) { /* the store holds no row the table lacks: nothing to read */
        memset(sp->got, 0, sp->nmiss);
        return FR_OK;
    }
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
        size_t s = add_slot(sp, pos, row);
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
    size_t per = 1 + sp->rowlen; /* then the shard's dense part, a->n floats */
    if (g->len < a->n || (g->len - a->n) % per != 0)
        return 0;
    *m = (g->len - a->n) / per;
    if (*m > (size_t)1 << sp->spec.bits) /* more rows than the table: no batch's */
        return 0;
    for (size_t i = 0; i < *m; i++) {
        uint32_t row;
        memcpy(&row, g->g + i, sizeof(row));
        if (row >> sp->spec.bits != 0 || psstore_sparse_shard(row, a->nshards) != a->shard)
            return 0; /* beyond the table, or another shard's row */
    }
    for (size_t i = *m; i < g->len; i++) {
        float v;
        memcpy(&v, g->g + i, sizeof(v));
        if (!isfinite(v))
            return -1;
    }
    return 1;
}

/* Out of memory for a step of m rows. In a worker's step (in_help) the
 * applier's connection belongs to the applier's thread, which may be in a
 * round trip on it: the message goes to the log, not to its errstr. */
static fr_err_t step_nomem(psstore_applier_t *a, size_t m)
{
    if (!a->in_help)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory for %zu rows", m);
    fr_log(FR_LOG_ERROR, "applier %s: out of memory for %zu rows in a worker's step", a->model, m);
    return FR_ERR_NOMEM;
}

fr_err_t ps_sparse_apply(psstore_applier_t *a, const psstore_grad_t *g, size_t m)
{
    ps_sparse_t *sp = a->sp;
    /* a complete table: a row it lacks is absent, added where its probe
     * ends (one probe a row); else those the store holds are read first */
    int complete = sp->complete;
    fr_err_t err = complete ? FR_OK : read_missing(a, g->g, m);
    if (err == FR_OK && FR_GROW(sp->grad, sp->capgrad, sp->rowlen) != FR_OK)
        err = step_nomem(a, m);
    if (err != FR_OK)
        return err;
    int64_t now_ms = sp->ttl_ms > 0 ? mono_ms() : 0;
    pthread_rwlock_wrlock(&sp->rw);
    if ((complete ? reserve(sp, m) : insert_missing(sp)) != FR_OK) {
        pthread_rwlock_unlock(&sp->rw);
        return step_nomem(a, m);
    }
    for (size_t i = 0; i < m; i++) {
        uint32_t row;
        memcpy(&row, g->g + i, sizeof(row));
        size_t pos = probe(sp, row);
        if (sp->keys[pos] == 0) {
            if (!complete || !admitted(sp, row))
                continue; /* not admitted yet */
            size_t s = add_slot(sp, pos, row);
            float *v = sp->vals + s * sp->vlen;
            sparse_row_init(&sp->spec, &sp->optim, row, v, v + sp->rowlen);
        }
        size_t s = sp->slot_of[pos];
        FR_ASSERT(s < sp->nslots && sp->rows[s] == row); /* the table and its slots agree */
        memcpy(sp->grad, g->g + m + i * sp->rowlen, sp->rowlen * sizeof(float));
        sparse_row_step(&sp->spec, &sp->optim, sp->vals + s * sp->vlen,
                        sp->vals + s * sp->vlen + sp->rowlen, sp->grad);
        sp->touched[s] = now_ms;
        if (!sp->dirty[s]) {
            FR_ASSERT(sp->ndirty < sp->nslots + 1); /* a slot is listed once */
            sp->dirty_list[sp->ndirty++] = (uint32_t)s;
            sp->dirty[s] = (uint32_t)sp->ndirty;
        }
    }
    /* the dense part (the bias and the tower) is shard 0's; the other
     * shards' w:0 stays 0 */
    if (a->shard == 0)
        sparse_dense_step(&sp->spec, &sp->optim, a->w, a->opt, g->g + g->len - a->n);
    a->version++;
    pthread_rwlock_unlock(&sp->rw);
    return FR_OK;
}

uint64_t ps_sparse_unwritten(ps_sparse_t *sp)
{
    if (sp == NULL || sp->decided <= sp->committed_upto)
        return 0;
    uint64_t n = sp->decided - sp->committed_upto;
    sp->committed_upto = sp->queued_upto = sp->decided;
    atomic_fetch_add(&sp->lost, 1);
    return n;
}

void ps_sparse_committed(ps_sparse_t *sp)
{
    if (sp == NULL)
        return;
    sp->queued_upto = sp->decided;
    for (size_t i = 0; i < sp->ndirty; i++)
        sp->dirty[sp->dirty_list[i]] = 0;
    sp->ndirty = 0;
    sp->nevict = 0; /* deleted, or (state dropped) still in the store */
    sp->window = 0;
}

uint64_t psstore_applier_sparse_lost(psstore_applier_t *a)
{
    return a != NULL && a->sp != NULL ? atomic_load(&a->sp->lost) : 0;
}

int ps_sparse_holds(const ps_sparse_t *sp, uint32_t row)
{
    return sp->cap > 0 && sp->keys[probe(sp, row)] != 0;
}

/* ---- eviction and the changes stream --------------------------------------------- */

/*
 * docs/design.md "Serving sparse models". Eviction is a sweep of the rows
 * hash, SWEEP_COUNT fields an HSCAN step, one step per SWEEP_STEP_NS
 * elapsed (100,000 rows a second; up to SWEEP_BURST steps a call catch up
 * after an idle poll), a new sweep a quarter of the ttl (between 100 ms and
 * a minute) after the last ended. A row is stale when its last step is ttl
 * ago on the monotonic clock: the table's time for a row it holds; for one
 * it does not, the time this applier loaded (nothing stepped it since), so
 * a restart postpones eviction and never hastens it.
 */
#define SWEEP_COUNT   "1024"
#define SWEEP_STEP_NS 10000000ull
#define SWEEP_BURST   32
#define EVICT_MAX     65536 /* rows one commit deletes at most */

/* The home position of row in the table. */
static size_t home(const ps_sparse_t *sp, uint32_t row)
{
    return (row * (size_t)2654435761u) & (sp->cap - 1);
}

/* Removes the row at table position pos (held, not dirty): backward-shift
 * deletion keeps every probe chain unbroken, and the last slot moves into
 * the freed one, so slots stay dense (a dirty last slot keeps its place in
 * dirty_list, now naming the freed slot). Under the write lock. */
static void remove_at(ps_sparse_t *sp, size_t pos)
{
    size_t mask = sp->cap - 1, s = sp->slot_of[pos], hole = pos;
    FR_ASSERT(sp->keys[pos] != 0 && s < sp->nslots && !sp->dirty[s]);
    for (size_t j = (pos + 1) & mask; sp->keys[j] != 0; j = (j + 1) & mask) {
        size_t h = home(sp, sp->keys[j] - 1);
        /* the entry at j may fill the hole unless its home lies in (hole, j] */
        int in_between = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
        if (in_between)
            continue;
        sp->keys[hole] = sp->keys[j];
        sp->slot_of[hole] = sp->slot_of[j];
        hole = j;
    }
    sp->keys[hole] = 0;
    size_t last = --sp->nslots;
    if (s != last) {
        sp->rows[s] = sp->rows[last];
        memcpy(sp->vals + s * sp->vlen, sp->vals + last * sp->vlen, sp->vlen * sizeof(float));
        sp->dirty[s] = sp->dirty[last];
        if (sp->dirty[s]) { /* stepped since the last commit was queued: listed at its new slot */
            FR_ASSERT(sp->dirty_list[sp->dirty[s] - 1] == last);
            sp->dirty_list[sp->dirty[s] - 1] = (uint32_t)s;
        }
        sp->touched[s] = sp->touched[last];
        sp->slot_of[probe(sp, sp->rows[s])] = (uint32_t)s;
    }
}

/* Notes that version was the committed one now. */
static void mark(ps_sparse_t *sp, int64_t version)
{
    int64_t now_ms = mono_ms();
    /* one mark a 1/128th of the window (at least a second): the ring covers
     * twice the window */
    int64_t every = sp->delta_ms / 128 > 1000 ? sp->delta_ms / 128 : 1000;
    if (sp->nmarks > 0 && now_ms - sp->mark_ms[sp->nmarks - 1] < every)
        return;
    if (sp->nmarks == PS_MARKS) {
        memmove(sp->mark_ms, sp->mark_ms + 1, (PS_MARKS - 1) * sizeof(int64_t));
        memmove(sp->mark_v, sp->mark_v + 1, (PS_MARKS - 1) * sizeof(int64_t));
        sp->nmarks--;
    }
    sp->mark_ms[sp->nmarks] = now_ms;
    sp->mark_v[sp->nmarks++] = version;
}

int ps_sparse_trim_due(const ps_sparse_t *sp)
{
    return sp != NULL && ps_sparse_version_before(sp, sp->delta_ms) > sp->floor;
}

int64_t ps_sparse_version_before(const ps_sparse_t *sp, int64_t age_ms)
{
    int64_t v = -1, then = mono_ms() - age_ms;
    for (size_t i = 0; i < sp->nmarks && sp->mark_ms[i] <= then; i++)
        v = sp->mark_v[i];
    return v;
}

/* The fields and values of an HSCAN reply r ([cursor, [f, v, ...]]); NULL,
 * with r freed and the connection's error set, when it is not one. */
static const redisReply *hscan_fields(psstore_applier_t *a, redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        ps_fail(a->c, FR_ERR_REDIS, "applier: unexpected reply to HSCAN");
        return NULL;
    }
    return r->element[1];
}

/*
 * The whole table into memory at the load (docs/design.md "The store
 * written behind"): HSCAN of the rows hash, PRELOAD_COUNT fields a step.
 * The table then holds every row the store holds (complete), so a row it
 * lacks is absent: no gradient and no pull reads Redis for it. A store of
 * more than PS_PRELOAD_MAX rows, or one holding a value of another size,
 * is read row by row as gradients touch it, as before.
 */
#define PRELOAD_COUNT "4096"

static fr_err_t preload(psstore_applier_t *a)
{
    ps_sparse_t *sp = a->sp;
    char key[PS_KEY_MAX], cursor[32] = "0";
    ps_key(key, a->model, "rows");
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 1, &err, "HLEN %s", key);
    if (r == NULL)
        return err;
    long long stored = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    if (stored < 0 || stored > PS_PRELOAD_MAX) {
        fr_log(FR_LOG_INFO, "applier %s: the store holds %lld rows: read as gradients touch them",
               a->model, stored);
        return FR_OK;
    }
    uint64_t t0 = fr_clock_mono_ns();
    size_t bad = 0;
    do {
        /* a long read keeps the lease (renewed a third of it after the last) */
        if ((err = ps_applier_renew(a)) != FR_OK)
            return err;
        if (!a->active)
            return ps_fail(a->c, FR_ERR_STATE, "applier: lease lost while reading the table");
        r = ps_cmd(a->c, 1, &err, "HSCAN %s %s COUNT %s", key, cursor, PRELOAD_COUNT);
        if (r == NULL)
            return err;
        const redisReply *kv = hscan_fields(a, r);
        if (kv == NULL)
            return FR_ERR_REDIS;
        pthread_rwlock_wrlock(&sp->rw);
        if (reserve(sp, kv->elements / 2) != FR_OK) {
            pthread_rwlock_unlock(&sp->rw);
            freeReplyObject(r);
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory for the table");
        }
        for (size_t i = 0; i + 1 < kv->elements; i += 2) {
            const redisReply *f = kv->element[i], *v = kv->element[i + 1];
            if (f->type != REDIS_REPLY_STRING || f->len != 4 || v->type != REDIS_REPLY_STRING ||
                v->len != sp->vlen * sizeof(float)) {
                bad++;
                continue;
            }
            uint32_t row = ps_field_row(f->str);
            size_t pos = probe(sp, row);
            if (row >> sp->spec.bits != 0 || sp->keys[pos] != 0)
                continue; /* not a row of the table; HSCAN may return a field twice */
            size_t s = add_slot(sp, pos, row);
            memcpy(sp->vals + s * sp->vlen, v->str, sp->vlen * sizeof(float));
        }
        pthread_rwlock_unlock(&sp->rw);
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    if (bad > 0)
        fr_log(FR_LOG_WARN,
               "applier %s: %zu stored rows are not %zu floats: rows are read as "
               "gradients touch them",
               a->model, bad, sp->vlen);
    else if (stored > 0)
        fr_log(FR_LOG_INFO, "applier %s: %zu rows read into memory in %.0f ms", a->model,
               sp->nslots, (double)(fr_clock_mono_ns() - t0) * 1e-6);
    sp->complete = bad == 0;
    return FR_OK;
}

fr_err_t ps_sparse_load(psstore_applier_t *a)
{
    ps_sparse_t *sp = a->sp;
    if (sp == NULL)
        return FR_OK;
    sp->load_ms = mono_ms();
    sp->nmarks = 0;
    mark(sp, a->version);
    sp->sweeping = 0;
    sp->sweep_ns = fr_clock_mono_ns();
    sp->nevict = 0;
    sp->reset_changes = 0;
    char key[PS_KEY_MAX];
    ps_key(key, a->model, "changes");
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 1, &err, "XREVRANGE %s + - COUNT 1", key);
    if (r == NULL)
        return err;
    int64_t last = -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
        r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements >= 1 &&
        r->element[0]->element[0]->type == REDIS_REPLY_STRING)
        last = strtoll(r->element[0]->element[0]->str, NULL, 10);
    freeReplyObject(r);
    r = ps_cmd(a->c, 1, &err, "HGET %s delta_floor", a->k_meta);
    if (r == NULL)
        return err;
    sp->floor = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
    freeReplyObject(r);
    sp->floor_next = sp->floor;
    sp->entry_version = last >= 0 ? last : sp->floor;
    if (last > a->version) {
        /* the stream is ahead of the weights (the store lost writes):
         * start it again, and refuse deltas from any version it named */
        sp->reset_changes = 1;
        sp->entry_version = a->version;
        sp->floor_next = last;
    }
    /* every commit that moves the version adds an entry, so the stream
     * ends at the version, unless it was written before the stream
     * existed: a delta across that is refused */
    if (sp->entry_version < a->version && sp->floor_next < a->version)
        sp->floor_next = a->version;
    return preload(a);
}

/* One HSCAN step of the sweep: the stale rows among those it returns
 * leave the table and join sp->evict. */
static fr_err_t sweep_step(psstore_applier_t *a)
{
    ps_sparse_t *sp = a->sp;
    char key[PS_KEY_MAX];
    ps_key(key, a->model, "rows");
    fr_err_t err;
    ps_applier_step_pause(a); /* in-process steps go on meanwhile */
    redisReply *r = ps_cmd(a->c, 1, &err, "HSCAN %s %s COUNT %s", key, sp->cursor, SWEEP_COUNT);
    ps_applier_step_resume(a);
    if (r == NULL)
        return err;
    const redisReply *kv = hscan_fields(a, r);
    if (kv == NULL)
        return FR_ERR_REDIS;
    if (FR_GROW(sp->evict, sp->capevict, sp->nevict + kv->elements / 2) != FR_OK) {
        freeReplyObject(r);
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    }
    int64_t stale_before = mono_ms() - sp->ttl_ms;
    size_t before = sp->nevict;
    pthread_rwlock_wrlock(&sp->rw);
    for (size_t i = 0; i + 1 < kv->elements; i += 2) {
        const redisReply *f = kv->element[i];
        if (f->type != REDIS_REPLY_STRING || f->len != 4)
            continue; /* not a row's field: not ours to delete */
        uint32_t row = ps_field_row(f->str);
        size_t pos = sp->cap > 0 ? probe(sp, row) : 0;
        if (sp->cap > 0 && sp->keys[pos] != 0) {
            size_t slot = sp->slot_of[pos];
            if (sp->touched[slot] > stale_before || sp->dirty[slot])
                continue; /* stepped within the ttl, or since the last commit */
            remove_at(sp, pos);
        } else if (sp->load_ms > stale_before) {
            continue;
        }
        sp->evict[sp->nevict++] = row;
    }
    if (sp->nevict > before) { /* a change of the model: deltas name it by a version */
        a->version++;
        a->weights_dirty = 1;
    }
    pthread_rwlock_unlock(&sp->rw);
    snprintf(sp->cursor, sizeof(sp->cursor), "%s", r->element[0]->str);
    if (strcmp(sp->cursor, "0") == 0)
        sp->sweeping = 0; /* the sweep is over; sweep_ns starts the pause */
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t ps_sparse_sweep(psstore_applier_t *a)
{
    ps_sparse_t *sp = a->sp;
    if (sp == NULL)
        return FR_OK;
    mark(sp, a->committed); /* idle too: the window needs times */
    if (sp->ttl_ms <= 0)
        return FR_OK;
    uint64_t now_ns = fr_clock_mono_ns();
    if (!sp->sweeping) {
        int64_t pause = sp->ttl_ms / 4 < 100     ? 100
                        : sp->ttl_ms / 4 > 60000 ? 60000
                                                 : sp->ttl_ms / 4;
        if (now_ns - sp->sweep_ns < (uint64_t)pause * 1000000ull)
            return FR_OK;
        sp->sweeping = 1;
        sp->sweep_ns = now_ns - SWEEP_STEP_NS; /* one step at once */
        snprintf(sp->cursor, sizeof(sp->cursor), "0");
    }
    /* a step per SWEEP_STEP_NS since the last: an idle applier polls every
     * 200 ms and catches up (at most SWEEP_BURST steps a call) */
    uint64_t due = (now_ns - sp->sweep_ns) / SWEEP_STEP_NS;
    if (due == 0)
        return FR_OK;
    sp->sweep_ns = now_ns;
    for (uint64_t k = 0; k < due && k < SWEEP_BURST && sp->sweeping && sp->nevict < EVICT_MAX;
         k++) {
        fr_err_t err = sweep_step(a);
        if (err != FR_OK)
            return err;
    }
    return FR_OK;
}

void ps_sparse_commit_done(psstore_applier_t *a, int64_t version, int entry)
{
    ps_sparse_t *sp = a->sp;
    if (sp == NULL)
        return;
    if (entry)
        sp->entry_version = version;
    sp->committed_upto = sp->queued_upto;
    sp->floor = sp->floor_next;
    sp->reset_changes = 0;
    mark(sp, version);
}

/* ---- in-process steps (docs/design.md "The store written behind") ------------------ */

void ps_sparse_step_enter(ps_sparse_t *sp)
{
    if (sp != NULL && sp->inproc)
        pthread_mutex_lock(&sp->step);
}

void ps_sparse_step_leave(ps_sparse_t *sp)
{
    if (sp != NULL && sp->inproc)
        pthread_mutex_unlock(&sp->step);
}

/* The window is due for its commit before its time: rows or gradients. */
static int window_full(const ps_sparse_t *sp, size_t times)
{
    return sp->ndirty >= times * PS_WINDOW_ROWS || sp->window >= times * PS_WINDOW_GRADS;
}

int psstore_applier_sparse_accepting(psstore_applier_t *a)
{
    return a->sp != NULL && a->sp->inproc && atomic_load(&a->sp->accepting);
}

fr_err_t psstore_applier_sparse_step(psstore_applier_t *a, const psstore_grad_t *g)
{
    ps_sparse_t *sp = a->sp;
    /* a standby, a load under way: no wait for the lock a poll holds */
    if (!psstore_applier_sparse_accepting(a))
        return FR_ERR_STATE;
    pthread_mutex_lock(&sp->step);
    /* ready and complete change only under this lock (the poll holds it) */
    if (!a->active || !sp->ready || !sp->complete || !ps_applier_reading(a) ||
        a->help_err != FR_OK) {
        pthread_mutex_unlock(&sp->step);
        return FR_ERR_STATE;
    }
    if (window_full(sp, 4)) { /* a commit in flight and the next window full */
        pthread_cond_signal(&sp->wake);
        pthread_mutex_unlock(&sp->step);
        return FR_ERR_AGAIN;
    }
    a->in_help = 1; /* no Redis from here: a commit may be waiting on it */
    a->cur_id = LOCAL_ID;
    fr_err_t err = ps_applier_decide(a, g);
    a->in_help = 0;
    sp->decided++; /* even half applied: it must be written to count */
    if (err != FR_OK)
        a->help_err = err; /* the applier's thread reloads before any commit */
    sp->window++;
    if (window_full(sp, 1))
        pthread_cond_signal(&sp->wake);
    pthread_mutex_unlock(&sp->step);
    return err;
}

fr_err_t ps_sparse_window_wait(psstore_applier_t *a, int block_ms)
{
    ps_sparse_t *sp = a->sp;
    int nread = 0;
    fr_err_t err = ps_applier_read_stream_once(a, &nread); /* other processes' trainers */
    if (err != FR_OK)
        return err;
    /* commit_ms 0: the first gradient ends the window, within block_ms */
    int64_t wait_ms = a->conf.commit_ms > 0 ? a->conf.commit_ms : block_ms;
    struct timespec until = deadline_in(wait_ms);
    while (a->active && a->help_err == FR_OK && !window_full(sp, 1) &&
           !(a->conf.commit_ms == 0 && (sp->window > 0 || nread > 0)))
        if (pthread_cond_timedwait(&sp->wake, &sp->step, &until) != 0)
            break;
    if (a->help_err != FR_OK) { /* a step failed: reload before anything commits */
        err = a->help_err;
        a->help_err = FR_OK;
    }
    return err;
}
