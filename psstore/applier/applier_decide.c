/*
 * applier_decide.c - deciding one gradient (docs/design.md "One writer and
 * fencing"): its positions against the applied offsets (an older replay
 * generation or a duplicate is dropped), then the controller's verdict
 * (psstore/update/), then the step on the in-memory weights, the served
 * average and the version entry. Nothing here talks to Redis: the commit
 * (applier_commit.c) writes what was decided.
 *
 * Thread: the applier's.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "psstore/applier/applier_sparse.h"

/* ---- offsets ------------------------------------------------------------------ */

part_t *ps_applier_find_part(psstore_applier_t *a, const char *topic, int32_t partition, int create)
{
    char key[272];
    psstore_key_format(key, sizeof(key), topic, partition);
    for (size_t i = 0; i < a->nparts; i++)
        if (strcmp(a->parts[i].key, key) == 0)
            return &a->parts[i];
    if (!create)
        return NULL;
    if (FR_GROW(a->parts, a->cap_parts, a->nparts + 1) != FR_OK)
        return NULL;
    part_t *p = &a->parts[a->nparts++];
    memset(p, 0, sizeof(*p));
    snprintf(p->key, sizeof(p->key), "%s", key);
    /* a partition the store has never seen has watermark 0; a consumer
     * that starts it higher covers [0, start) with an n = 0 batch, so the
     * watermark never jumps over positions that may still arrive */
    psstore_poff_init(&p->po, 0);
    return p;
}

/* Nonzero when the gradient's batch was read before a replay rewrote one of
 * its partitions: its positions are read again under the new generation. */
static int is_older_generation(psstore_applier_t *a, const psstore_grad_t *g)
{
    for (size_t i = 0; i < g->nranges; i++) {
        part_t *p = ps_applier_find_part(a, g->ranges[i].topic, g->ranges[i].partition, 0);
        if (p != NULL && g->generation < p->po.generation)
            return 1;
    }
    return 0;
}

/* Rule 1: nonzero when any position of the gradient was already applied. */
static int is_duplicate(psstore_applier_t *a, const psstore_grad_t *g)
{
    for (size_t i = 0; i < g->nranges; i++) {
        const psstore_range_t *r = &g->ranges[i];
        part_t *p = ps_applier_find_part(a, r->topic, r->partition, 0);
        if (p != NULL && psstore_poff_overlaps(&p->po, r->from, r->to))
            return 1;
        /* two ranges of one gradient overlapping each other are a duplicate too */
        for (size_t j = 0; j < i; j++) {
            const psstore_range_t *q = &g->ranges[j];
            if (q->partition == r->partition && strcmp(q->topic, r->topic) == 0 &&
                q->from < r->to && r->from < q->to)
                return 1;
        }
    }
    return 0;
}

static fr_err_t mark_ranges(psstore_applier_t *a, const psstore_grad_t *g)
{
    for (size_t i = 0; i < g->nranges; i++) {
        const psstore_range_t *r = &g->ranges[i];
        part_t *p = ps_applier_find_part(a, r->topic, r->partition, 1);
        if (p == NULL)
            return FR_ERR_NOMEM;
        fr_err_t err = psstore_poff_mark(&p->po, r->from, r->to);
        if (err != FR_OK)
            return err;
        p->dirty = 1;
    }
    return FR_OK;
}

/* Appends audit entries for g's ranges with outcome (audit mode only). */
static void audit(psstore_applier_t *a, const psstore_grad_t *g, const char *outcome)
{
    if (!a->conf.audit)
        return;
    for (size_t i = 0; i < g->nranges; i++) {
        const psstore_range_t *r = &g->ranges[i];
        if (a->audit.len > 0)
            ps_buf_add(&a->audit, "\1", 1);
        ps_buf_kv(&a->audit, "topic", "%s", r->topic);
        ps_buf_kv(&a->audit, "partition", "%d", (int)r->partition);
        ps_buf_kv(&a->audit, "first", "%lld", (long long)r->from);
        ps_buf_kv(&a->audit, "last", "%lld", (long long)r->to - 1);
        ps_buf_kv(&a->audit, "version", "%lld", (long long)a->version);
        /* a rollback's re-application is in another epoch, a replay's in a
         * newer generation: neither is a double apply */
        ps_buf_kv(&a->audit, "epoch", "%llu", (unsigned long long)a->epoch);
        ps_buf_kv(&a->audit, "generation", "%lld", (long long)g->generation);
        ps_buf_kv(&a->audit, "outcome", "%s", outcome);
        ps_buf_kv(&a->audit, "worker", "%s", g->worker);
    }
}

/* ---- deciding one gradient -------------------------------------------------------- */

/* Notes the Kafka timestamps of an applied batch for the freshness
 * figures, measured when the commit makes its version visible. */
void ps_applier_note_ts(psstore_applier_t *a, int64_t ts_min, int64_t ts_max)
{
    if (ts_max <= 0)
        return;
    if (FR_GROW(a->ts_pending, a->cap_ts_pending, a->nts_pending + 2) != FR_OK)
        return; /* a figure, not state: skip the sample */
    a->ts_pending[a->nts_pending++] = ts_min;
    a->ts_pending[a->nts_pending++] = ts_max;
}

/* Records the versions-stream entry of the update just applied. */
void ps_applier_version_entry(psstore_applier_t *a, const psstore_grad_t *g,
                              const psstore_decision_t *d)
{
    if (a->versions.len > 0)
        ps_buf_add(&a->versions, "\1", 1);
    ps_buf_kv(&a->versions, "version", "%lld", (long long)a->version);
    ps_buf_kv(&a->versions, "epoch", "%llu", (unsigned long long)a->epoch);
    ps_buf_kv(&a->versions, "tau", "%lld", (long long)d->tau);
    ps_buf_kv(&a->versions, "lr_eff", "%.9g", d->lr_eff);
    ps_buf_kv(&a->versions, "loss", "%.9g", g->loss_sum / (double)g->n);
    ps_buf_kv(&a->versions, "n", "%lld", (long long)g->n);
    ps_buf_kv(&a->versions, "worker", "%s", g->worker);
    ps_buf_kv(&a->versions, "t", "%lld", (long long)fr_clock_unix_ms());
    if (g->ts_min_ms > 0) /* the batch's oldest and newest Kafka timestamps */
        ps_buf_kv(&a->versions, "ts", "%lld:%lld", (long long)g->ts_min_ms,
                  (long long)g->ts_max_ms);
}
/* Audits g with outcome and marks its positions (applied or dropped by a
 * named rule: either way its samples were seen). */
fr_err_t ps_applier_decide_mark(psstore_applier_t *a, const psstore_grad_t *g, const char *outcome)
{
    audit(a, g, outcome);
    return mark_ranges(a, g);
}

/*
 * Decides and applies one decoded gradient in memory. The order is
 * docs/design.md "Offsets": epoch, rule 1 (duplicates mark nothing), then the
 * controller; a gradient the controller drops still marks its positions
 * (its samples were seen and dropped by a named rule).
 */
static fr_err_t applied(psstore_applier_t *a, const psstore_grad_t *g, const psstore_decision_t *d,
                        uint64_t t0);

/*
 * A sparse model's gradient (applier_sparse.c): a malformed one is dropped
 * as such, a non-finite one as non-finite (and counted by the divergence
 * guard); else its rows and the bias are stepped by the per-row optimizer,
 * which needs no staleness scaling of its own (its rates fall per
 * coordinate as updates accumulate).
 */
static fr_err_t decide_sparse(psstore_applier_t *a, const psstore_grad_t *g, uint64_t t0)
{
    size_t m = 0;
    int shape = ps_sparse_shape(a, g, &m);
    ps_applier_guard_record(a, shape < 0);
    if (!a->active) /* the guard stopped the model: the state is gone, the entry stays */
        return FR_OK;
    if (shape <= 0) {
        psstore_drop_t why = shape < 0 ? PSSTORE_DROPPED_NONFINITE : PSSTORE_DROPPED_MALFORMED;
        ps_applier_count_drop(a, why, g);
        audit(a, g, psstore_drop_name(why));
        return mark_ranges(a, g);
    }
    psstore_decision_t d = {.outcome = PSSTORE_APPLY,
                            .tau = a->version - g->version,
                            .scale = 1,
                            .lr_eff = a->sp->optim.lr};
    fr_err_t err = ps_sparse_apply(a, g, m); /* moves the version, under the table's lock */
    if (err != FR_OK)
        return err;
    return applied(a, g, &d, t0);
}

fr_err_t ps_applier_decide(psstore_applier_t *a, const psstore_grad_t *g)
{
    if (g->epoch != a->epoch) {
        fr_log(FR_LOG_DEBUG, "applier %s: dropped a gradient of epoch %llu (now %llu)", a->model,
               (unsigned long long)g->epoch, (unsigned long long)a->epoch);
        ps_applier_count_drop(a, PSSTORE_DROPPED_EPOCH, g);
        return FR_OK;
    }
    if (is_older_generation(a, g)) {
        ps_applier_count_drop(a, PSSTORE_DROPPED_REPLAY, g);
        audit(a, g, "replay");
        return FR_OK;
    }
    if (is_duplicate(a, g) || ps_applier_overlaps_held(a, g)) {
        ps_applier_count_drop(a, PSSTORE_DROPPED_DUPLICATE, g);
        audit(a, g, "duplicate");
        return FR_OK;
    }
    if (g->n == 0) {
        ps_applier_count_drop(a, PSSTORE_DROPPED_EMPTY, g);
        audit(a, g, g->reason ? g->reason : "empty");
        return mark_ranges(a, g);
    }
    if (psstore_mode_rounds(a->conf.mode) && !isfinite(g->norm)) {
        /* a slice of a non-finite gradient, finite on this shard: every
         * shard drops it, as the unsharded round would its whole */
        ps_applier_guard_record(a, 1);
        ps_applier_count_drop(a, PSSTORE_DROPPED_NONFINITE, g);
        audit(a, g, psstore_drop_name(PSSTORE_DROPPED_NONFINITE));
        return mark_ranges(a, g);
    }
    if (psstore_mode_rounds(a->conf.mode))
        return ps_applier_round_take(a, g);
    if (ps_auto_backup_drop(a, g)) { /* mode auto's backup phase */
        ps_applier_count_drop(a, PSSTORE_DROPPED_BACKUP, g);
        audit(a, g, psstore_drop_name(PSSTORE_DROPPED_BACKUP));
        return mark_ranges(a, g);
    }
    uint64_t t0 = fr_clock_mono_ns();
    if (a->sp != NULL)
        return decide_sparse(a, g, t0);
    float *gw = a->cur_g; /* the controller works in place */
    if (gw == NULL) {
        gw = a->g;
        memcpy(gw, g->g, a->n * sizeof(float));
    }
    psstore_decision_t d;
    /* an in-process gradient comes with its sum of squares, taken by its
     * worker while the gradient was in that core's cache: no cold pass
     * here before the step (docs/design.md "The co-located fast path") */
    int summed = g->sq_known && g->norm == 0;
    psstore_outcome_t out =
        summed ? psstore_ctl_prepare_sq(a->ctl, gw, a->version, g->version, a->w,
                                        ps_applier_pushers(a), g->sq, &d)
               : psstore_ctl_prepare_whole(a->ctl, gw, a->version, g->version, a->w,
                                           ps_applier_pushers(a), g->norm, &d);
    if (summed)
        fr_series_add(a->m_summed, 1);
    ps_applier_guard_record(a, out == PSSTORE_DROP_NONFINITE);
    if (out != PSSTORE_APPLY) {
        psstore_drop_t why =
            out == PSSTORE_DROP_NONFINITE ? PSSTORE_DROPPED_NONFINITE : PSSTORE_DROPPED_STALENESS;
        ps_applier_count_drop(a, why, g);
        audit(a, g, psstore_drop_name(why));
        return mark_ranges(a, g);
    }
    psstore_ctl_apply(a->ctl, a->w, a->opt, gw, &d);
    a->version++;
    psstore_ctl_record(a->ctl, a->version, a->w);
    ps_applier_average(a, g->n);
    return applied(a, g, &d, t0);
}

/* The bookkeeping of an applied gradient (a->version already moved): the
 * version entry, audit, stats, metrics, and its positions marked. */
static fr_err_t applied(psstore_applier_t *a, const psstore_grad_t *g, const psstore_decision_t *d,
                        uint64_t t0)
{
    a->weights_dirty = 1;
    a->last_loss = g->loss_sum / (double)g->n;
    ps_applier_note_ts(a, g->ts_min_ms, g->ts_max_ms);
    audit(a, g, "applied");
    ps_applier_version_entry(a, g, d);
    ps_auto_note_tau(a, g->worker, d->tau);
    a->samples += g->n;
    pthread_mutex_lock(&a->lock);
    a->stats.applied++;
    a->stats.lr_eff = d->lr_eff;
    a->taus[a->ntaus++ % TAU_RING] = d->tau;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_applied, 1);
    fr_series_observe(a->m_stale, (double)d->tau);
    fr_series_set(a->m_lr, d->lr_eff);
    fr_series_set(a->m_loss, a->last_loss);
    fr_series_observe(a->m_latency, (double)(fr_clock_mono_ns() - t0) * 1e-9);
    return mark_ranges(a, g);
}

void ps_applier_average(psstore_applier_t *a, int64_t n)
{
    if (a->avg == NULL)
        return;
    a->avg_seen += n;
    double wt = psstore_average_weight(a->conf.ctl.average, a->avg_seen, n);
    psstore_average_step(a->avg, a->w, a->n, (float)wt);
}

fr_err_t ps_applier_average_start(psstore_applier_t *a, const redisReply *stored)
{
    const void *avg =
        stored != NULL && stored->type == REDIS_REPLY_STRING && stored->len == a->n * sizeof(float)
            ? stored->str
            : NULL;
    /* a requests-only applier applies no update: it keeps the average it is
     * given, so that a rollback it executes serves what the snapshot served */
    int keep = a->sp == NULL && (a->conf.requests_only ? avg != NULL : a->conf.ctl.average > 0);
    if (!keep) {
        free(a->avg);
        a->avg = NULL;
        a->avg_stale = a->sp == NULL;
        return FR_OK;
    }
    if (a->avg == NULL && (a->avg = malloc(a->n * sizeof(float))) == NULL)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    memcpy(a->avg, avg != NULL ? avg : a->w, a->n * sizeof(float));
    a->avg_seen = avg != NULL ? a->conf.ctl.average * 10 : 0;
    return FR_OK;
}

int ps_applier_reading(const psstore_applier_t *a)
{
    return a->stopped[0] == '\0' &&
           (a->conf.sample_limit <= 0 || a->samples < a->conf.sample_limit);
}

static fr_err_t take_entry_(psstore_applier_t *a, const redisReply *entry);

/* Decodes one stream entry [id, [f, v, ...]] and decides it; a sparse
 * model's workers in this process learn that it was (psstore_applier_decided_wait). */
fr_err_t ps_applier_take_entry(psstore_applier_t *a, const redisReply *entry)
{
    fr_err_t err = take_entry_(a, entry);
    if (a->sp != NULL && err == FR_OK && entry->type == REDIS_REPLY_ARRAY && entry->elements >= 2 &&
        entry->element[0]->type == REDIS_REPLY_STRING)
        ps_sparse_decided(a->sp, entry->element[0]->str);
    return err;
}

static fr_err_t take_entry_(psstore_applier_t *a, const redisReply *entry)
{
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements < 2 ||
        entry->element[0]->type != REDIS_REPLY_STRING)
        return FR_OK;
    const redisReply *id = entry->element[0], *kv = entry->element[1];
    if (ps_applier_is_held(a, id->str, id->len))
        return FR_OK;
    a->cur_id = a->ids.len;
    if (ps_buf_add(&a->ids, id->str, id->len) || ps_buf_add(&a->ids, "", 1))
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    a->nids++;
    if (kv->type != REDIS_REPLY_ARRAY) /* deleted meanwhile: only acknowledge */
        return FR_OK;
    size_t nf = kv->elements / 2;
    const char *fields[32], *vals[32];
    size_t flens[32], vlens[32];
    char why[256] = "too many fields";
    fr_err_t err = FR_ERR_PARSE;
    if (nf <= 32 && kv->elements % 2 == 0) {
        for (size_t i = 0; i < nf; i++) {
            fields[i] = kv->element[2 * i]->str;
            flens[i] = kv->element[2 * i]->len;
            vals[i] = kv->element[2 * i + 1]->str;
            vlens[i] = kv->element[2 * i + 1]->len;
        }
        /* a sparse gradient's length is its batch's rows: checked by decide */
        err = ps_grad_decode(&a->msg, nf, fields, flens, vals, vlens, a->sp ? 0 : a->n, why,
                             sizeof(why));
    }
    if (err != FR_OK) {
        fr_log(FR_LOG_WARN, "applier %s: malformed gradient %.*s: %s", a->model, (int)id->len,
               id->str, why);
        ps_applier_count_drop(a, PSSTORE_DROPPED_MALFORMED, NULL);
        return FR_OK;
    }
    pthread_mutex_lock(&a->lock);
    a->stats.bytes += a->msg.payload_bytes;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_bytes, (double)a->msg.payload_bytes);
    return ps_applier_decide(a, &a->msg.g);
}
