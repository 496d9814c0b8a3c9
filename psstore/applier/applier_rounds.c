/*
 * applier_rounds.c - membership and the rounds of the round modes
 * (docs/design.md "Membership" and docs/design.md "Training modes"): the
 * members hash as the applier last read it, and per worker group the open
 * round that holds gradients until its expected members arrived (or it
 * timed out), then applies their sample-weighted average as one update.
 *
 * Thread: the applier's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/applier/applier_int.h"

static int member_live(const psstore_applier_t *a, const seen_t *s, uint64_t now)
{
    return now - s->changed_ns <= (uint64_t)a->conf.member_timeout_ms * 1000000ull;
}

static const seen_t *find_seen(const psstore_applier_t *a, const char *id)
{
    for (size_t i = 0; i < a->nseen; i++)
        if (strcmp(a->seen[i].m.id, id) == 0)
            return &a->seen[i];
    return NULL;
}

static void round_forget_member(psstore_applier_t *a, const char *id);

/*
 * Reads the members hash. A member whose beat has not changed for
 * member_timeout is removed (only if its entry is still the one seen, so a
 * beat that lands meanwhile keeps it) and no open round waits for it.
 */
fr_err_t ps_applier_refresh_members(psstore_applier_t *a)
{
    size_t n = 0;
    fr_err_t err = ps_members_read(a->c, a->k_members, &a->mbuf, &n, &a->cap_mbuf);
    if (err != FR_OK)
        return err;
    uint64_t now = fr_clock_mono_ns();
    a->members_ns = now;
    if (n > a->cap_seen) {
        seen_t *grown = realloc(a->seen, n * sizeof(*grown));
        if (grown == NULL)
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        a->seen = grown;
        a->cap_seen = n;
    }
    /* carry each member's last change over; the list is small */
    uint64_t *since = calloc(n ? n : 1, sizeof(*since));
    if (since == NULL)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    for (size_t i = 0; i < n; i++) {
        const seen_t *old = find_seen(a, a->mbuf[i].id);
        since[i] = old != NULL && old->m.beat == a->mbuf[i].beat ? old->changed_ns : now;
    }
    for (size_t i = 0; i < n; i++)
        a->seen[i] = (seen_t){a->mbuf[i], since[i]};
    a->nseen = n;
    free(since);
    static const char *script = "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then "
                                "return redis.call('HDEL', KEYS[1], ARGV[1]) else return 0 end";
    for (size_t i = 0; i < a->nseen;) {
        seen_t *sn = &a->seen[i];
        if (member_live(a, sn, now)) {
            i++;
            continue;
        }
        char val[128];
        ps_member_format(&sn->m, val, sizeof(val));
        redisReply *r =
            ps_cmd(a->c, 1, &err, "EVAL %s 1 %s %s %s", script, a->k_members, sn->m.id, val);
        if (r == NULL)
            return err;
        freeReplyObject(r);
        fr_log(FR_LOG_INFO, "applier %s: member %s silent for %.1f s: removed", a->model, sn->m.id,
               (double)(now - sn->changed_ns) * 1e-9);
        char id[256];
        snprintf(id, sizeof(id), "%s", sn->m.id);
        a->seen[i] = a->seen[--a->nseen];
        round_forget_member(a, id);
    }
    return FR_OK;
}

int ps_applier_pushers(const psstore_applier_t *a)
{
    int live = 0;
    for (size_t i = 0; i < a->nseen; i++)
        live += !a->seen[i].m.idle;
    if (live > 0)
        return live;
    return a->conf.npushers > 0 ? a->conf.npushers : 1;
}

/* The group of a gradient's worker: its members entry's (read again when
 * it is not known yet), 0 for a worker that has none. */
static int worker_group(psstore_applier_t *a, const char *worker)
{
    const seen_t *s = find_seen(a, worker);
    if (s == NULL && fr_clock_mono_ns() - a->members_ns > 100000000ull &&
        ps_applier_refresh_members(a) == FR_OK)
        s = find_seen(a, worker);
    int g = s != NULL ? s->m.group : 0;
    return g >= 0 && g < MAX_GROUPS ? g : 0;
}

/* Opens group g's round: it expects the group's live, non-idle members. */
static fr_err_t round_open(psstore_applier_t *a, int g)
{
    FR_ASSERT(g >= 0 && g < MAX_GROUPS); /* worker_group maps any other to 0 */
    round_t *r = &a->rounds[g];
    if (fr_clock_mono_ns() - a->members_ns > 100000000ull) {
        fr_err_t err = ps_applier_refresh_members(a);
        if (err != FR_OK)
            return err;
    }
    if (r->sum == NULL) {
        if ((r->sum = malloc(a->n * sizeof(double))) == NULL)
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        fr_mem_touch(r->sum, a->n * sizeof(double));
    }
    if (a->nseen > r->cap_expected) {
        char(*e)[256] = realloc(r->expected, a->nseen * sizeof(*e));
        uint8_t *ar = e != NULL ? realloc(r->arrived, a->nseen) : NULL;
        if (e != NULL)
            r->expected = e;
        if (ar == NULL)
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        r->arrived = ar;
        r->cap_expected = a->nseen;
    }
    uint64_t now = fr_clock_mono_ns();
    r->nexpected = r->narrived = r->nheld = 0;
    for (size_t i = 0; i < a->nseen; i++) {
        const seen_t *sn = &a->seen[i];
        if (sn->m.group == g && !sn->m.idle && member_live(a, sn, now)) {
            snprintf(r->expected[r->nexpected], 256, "%s", sn->m.id);
            r->arrived[r->nexpected++] = 0;
        }
    }
    memset(r->sum, 0, a->n * sizeof(double));
    r->nsamples = 0;
    r->loss_sum = 0;
    r->min_version = INT64_MAX;
    r->version = a->version;
    r->opened_ns = now;
    r->open = 1;
    return FR_OK;
}

/* A round closes once every expected member (backup: all but `backups`
 * of them) arrived, or round_timeout after its first gradient. */
static int round_ready(const psstore_applier_t *a, const round_t *r, int *timed_out)
{
    *timed_out = 0;
    if (!r->open || r->nheld == 0)
        return 0;
    /* only an expected member's first gradient counts as an arrival */
    FR_ASSERT(r->narrived <= r->nexpected);
    size_t need = r->nexpected;
    if (a->conf.mode == PSSTORE_MODE_BACKUP)
        need = r->nexpected > (size_t)a->conf.backups ? r->nexpected - (size_t)a->conf.backups : 1;
    if (r->narrived >= need)
        return 1;
    *timed_out =
        fr_clock_mono_ns() - r->opened_ns >= (uint64_t)a->conf.round_timeout_ms * 1000000ull;
    return *timed_out;
}

/* Rebuilds a held gradient as the psstore_grad_t marking and auditing take. */
static psstore_grad_t held_grad(const held_t *h)
{
    return (psstore_grad_t){.version = h->version,
                            .generation = h->generation,
                            .worker = h->worker,
                            .n = h->n,
                            .loss_sum = h->loss_sum,
                            .ranges = h->ranges,
                            .nranges = h->nranges};
}

/*
 * Closes group g's round: the sample-weighted average of its gradients goes
 * through the controller (staleness from the oldest version among them) as
 * one update; each gradient's positions are marked and its entry
 * acknowledged by the commit that writes the update.
 */
static fr_err_t round_close(psstore_applier_t *a, int g)
{
    round_t *r = &a->rounds[g];
    int64_t before = a->version;
    FR_ASSERT(r->open && r->nheld > 0); /* rounds_close and round_take close only these */
    for (size_t j = 0; j < a->n; j++)
        a->g[j] = (float)(r->sum[j] / (double)r->nsamples);
    psstore_decision_t d;
    psstore_outcome_t out =
        psstore_ctl_prepare(a->ctl, a->g, a->version, r->min_version, a->w, (int)r->nheld, &d);
    const char *outcome = "applied";
    if (out == PSSTORE_APPLY) {
        if (a->conf.sync_lr_linear)
            d.lr_eff *= (double)r->nheld;
        psstore_ctl_apply(a->ctl, a->w, a->opt, a->g, &d);
        a->version++;
        psstore_ctl_record(a->ctl, a->version, a->w);
        ps_applier_average(a, r->nsamples);
        a->weights_dirty = 1;
        a->last_loss = r->loss_sum / (double)r->nsamples;
        char worker[32];
        snprintf(worker, sizeof(worker), "group %d", g);
        psstore_grad_t sum = {.worker = worker, .n = r->nsamples, .loss_sum = r->loss_sum};
        for (size_t i = 0; i < r->nheld; i++) {
            if (r->held[i].ts_min_ms <= 0)
                continue;
            if (sum.ts_min_ms == 0 || r->held[i].ts_min_ms < sum.ts_min_ms)
                sum.ts_min_ms = r->held[i].ts_min_ms;
            if (r->held[i].ts_max_ms > sum.ts_max_ms)
                sum.ts_max_ms = r->held[i].ts_max_ms;
        }
        ps_applier_version_entry(a, &sum, &d);
        ps_buf_kv(&a->versions, "k", "%zu", r->nheld);
        a->samples += r->nsamples;
        pthread_mutex_lock(&a->lock);
        a->stats.applied += r->nheld;
        a->stats.rounds++;
        a->stats.lr_eff = d.lr_eff;
        for (size_t i = 0; i < r->nheld; i++)
            a->taus[a->ntaus++ % TAU_RING] = before - r->held[i].version;
        pthread_mutex_unlock(&a->lock);
        for (size_t i = 0; i < r->nheld; i++)
            ps_applier_note_ts(a, r->held[i].ts_min_ms, r->held[i].ts_max_ms);
        fr_series_add(a->m_applied, (double)r->nheld);
        fr_series_observe(a->m_stale, (double)d.tau);
        fr_series_set(a->m_lr, d.lr_eff);
        fr_series_set(a->m_loss, a->last_loss);
    } else {
        psstore_drop_t why =
            out == PSSTORE_DROP_NONFINITE ? PSSTORE_DROPPED_NONFINITE : PSSTORE_DROPPED_STALENESS;
        outcome = psstore_drop_name(why);
        for (size_t i = 0; i < r->nheld; i++) {
            psstore_grad_t hg = held_grad(&r->held[i]);
            ps_applier_count_drop(a, why, &hg);
        }
    }
    fr_err_t err = FR_OK;
    for (size_t i = 0; i < r->nheld && err == FR_OK; i++) {
        psstore_grad_t hg = held_grad(&r->held[i]);
        err = ps_applier_decide_mark(a, &hg, outcome);
        if (r->held[i].id[0] == '\0')
            continue;
        if (err != FR_OK)
            break;
        if (ps_buf_add(&a->ids, r->held[i].id, strlen(r->held[i].id) + 1) != 0)
            err = ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        else
            a->nids++; /* counted only when listed: the commit acks what ids holds */
    }
    r->open = 0;
    r->nheld = 0;
    a->closed[g]++;
    a->local_rounds[g]++;
    return err;
}

/* Nonzero when a round closed since the last commit or is ready to: its
 * workers wait for the commit. */
int ps_applier_rounds_waiting(const psstore_applier_t *a)
{
    if (!psstore_mode_rounds(a->conf.mode))
        return 0;
    for (int g = 0; g < MAX_GROUPS; g++) {
        int timed_out;
        if (a->closed[g] > 0 || round_ready(a, &a->rounds[g], &timed_out))
            return 1;
    }
    return 0;
}

/* Closes every round that is ready (or, with all set, every one holding a
 * gradient: before a request rewrites offsets or weights). */
fr_err_t ps_applier_rounds_close(psstore_applier_t *a, int all)
{
    for (int g = 0; g < MAX_GROUPS; g++) {
        round_t *r = &a->rounds[g];
        int timed_out;
        if (!r->open || r->nheld == 0 || !(all || round_ready(a, r, &timed_out)))
            continue;
        if (!all && timed_out)
            fr_log(FR_LOG_INFO,
                   "applier %s: round of group %d closed after %lld ms with %zu of %zu members",
                   a->model, g, (long long)a->conf.round_timeout_ms, r->narrived, r->nexpected);
        fr_err_t err = round_close(a, g);
        if (err != FR_OK)
            return err;
    }
    return FR_OK;
}

/* A member left: no round waits for it any more. */
static void round_forget_member(psstore_applier_t *a, const char *id)
{
    for (int g = 0; g < MAX_GROUPS; g++) {
        round_t *r = &a->rounds[g];
        for (size_t i = 0; r->open && i < r->nexpected; i++) {
            if (strcmp(r->expected[i], id) != 0 || r->arrived[i])
                continue;
            r->nexpected--;
            memcpy(r->expected[i], r->expected[r->nexpected], 256);
            r->arrived[i] = r->arrived[r->nexpected];
            FR_ASSERT(r->narrived <= r->nexpected); /* the one removed had not arrived */
            break;
        }
    }
}

/* Nonzero when stream entry id is held in an open round already (our own
 * pending entries are read again after a claim). */
int ps_applier_is_held(const psstore_applier_t *a, const char *id, size_t len)
{
    for (int g = 0; g < MAX_GROUPS; g++) {
        const round_t *r = &a->rounds[g];
        for (size_t i = 0; r->open && i < r->nheld; i++)
            if (strlen(r->held[i].id) == len && memcmp(r->held[i].id, id, len) == 0)
                return 1;
    }
    return 0;
}

/* Rule 1 inside the open rounds: a position some held gradient covers. */
int ps_applier_overlaps_held(const psstore_applier_t *a, const psstore_grad_t *g)
{
    for (int k = 0; k < MAX_GROUPS; k++) {
        const round_t *r = &a->rounds[k];
        for (size_t h = 0; r->open && h < r->nheld; h++) {
            const held_t *hd = &r->held[h];
            for (size_t i = 0; i < g->nranges; i++)
                for (size_t j = 0; j < hd->nranges; j++)
                    if (g->ranges[i].partition == hd->ranges[j].partition &&
                        g->ranges[i].from < hd->ranges[j].to &&
                        hd->ranges[j].from < g->ranges[i].to &&
                        strcmp(g->ranges[i].topic, hd->ranges[j].topic) == 0)
                        return 1;
        }
    }
    return 0;
}

/* Adds g (its values gw, checked and clipped) to its group's round. */
static fr_err_t round_hold(psstore_applier_t *a, round_t *r, const psstore_grad_t *g,
                           const float *gw)
{
    size_t had = r->cap_held;
    if (FR_GROW(r->held, r->cap_held, r->nheld + 1) != FR_OK)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    memset(r->held + had, 0, (r->cap_held - had) * sizeof(*r->held));
    held_t *h = &r->held[r->nheld];
    if (ps_ranges_copy(g->ranges, g->nranges, &h->ranges, &h->cap_ranges, &h->topics,
                       &h->cap_topics) != FR_OK)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    h->nranges = g->nranges;
    /* the entry is acknowledged by the commit that closes the round, not
     * by the next one: it leaves ids (it is the last there) */
    h->id[0] = '\0'; /* a gradient of the in-process channel has none */
    if (a->cur_id != LOCAL_ID) {
        FR_ASSERT(a->cur_id < a->ids.len && a->nids > 0);
        snprintf(h->id, sizeof(h->id), "%s", a->ids.p + a->cur_id);
        a->ids.len = a->cur_id;
        a->nids--;
    }
    snprintf(h->worker, sizeof(h->worker), "%s", g->worker);
    h->version = g->version;
    h->generation = g->generation;
    h->n = g->n;
    h->loss_sum = g->loss_sum;
    h->ts_min_ms = g->ts_min_ms;
    h->ts_max_ms = g->ts_max_ms;
    r->nheld++;
    if (r->nheld == 1)
        r->opened_ns = fr_clock_mono_ns();
    double n = (double)g->n;
    for (size_t j = 0; j < a->n; j++)
        r->sum[j] += n * (double)gw[j];
    r->nsamples += g->n;
    r->loss_sum += g->loss_sum;
    if (g->version < r->min_version)
        r->min_version = g->version;
    for (size_t i = 0; i < r->nexpected; i++) {
        if (!r->arrived[i] && strcmp(r->expected[i], g->worker) == 0) {
            r->arrived[i] = 1;
            r->narrived++;
            FR_ASSERT(r->narrived <= r->nexpected);
            break;
        }
    }
    return FR_OK;
}

/*
 * The round modes' part of deciding a gradient with samples (epoch, replay
 * and rule 1 passed): non-finite ones are refused, the rest clipped and
 * held in the round of the worker's group; in mode backup one computed
 * before the round's version is late and dropped (reason "backup").
 */
fr_err_t ps_applier_round_take(psstore_applier_t *a, const psstore_grad_t *g)
{
    float *gw = a->cur_g;
    if (gw == NULL) {
        gw = a->g;
        memcpy(gw, g->g, a->n * sizeof(float));
    }
    double norm2 = 0;
    int finite = 1;
    for (size_t j = 0; j < a->n; j++) {
        if (!isfinite(gw[j]))
            finite = 0;
        norm2 += (double)gw[j] * gw[j];
    }
    ps_applier_guard_record(a, !finite);
    if (!finite) {
        ps_applier_count_drop(a, PSSTORE_DROPPED_NONFINITE, g);
        return ps_applier_decide_mark(a, g, "nonfinite");
    }
    /* a shard's slice is clipped by the whole gradient's norm, as every
     * shard does; the round's average then needs no clip of its own (an
     * average of vectors of norm <= c has norm <= c, and so its slices) */
    double c = a->conf.ctl.clip_norm, norm = g->norm != 0 ? g->norm : sqrt(norm2);
    if (c > 0 && norm > c) {
        float scale = (float)(c / norm);
        for (size_t j = 0; j < a->n; j++)
            gw[j] *= scale;
    }
    int grp = worker_group(a, g->worker);
    round_t *r = &a->rounds[grp];
    fr_err_t err;
    if (!r->open && (err = round_open(a, grp)) != FR_OK)
        return err;
    if (a->conf.mode == PSSTORE_MODE_BACKUP && g->version < r->version) {
        ps_applier_count_drop(a, PSSTORE_DROPPED_BACKUP, g);
        return ps_applier_decide_mark(a, g, "backup");
    }
    if ((err = round_hold(a, r, g, gw)) != FR_OK)
        return err;
    int timed_out;
    return round_ready(a, r, &timed_out) ? round_close(a, grp) : FR_OK;
}
