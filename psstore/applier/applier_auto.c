/*
 * applier_auto.c - mode auto (docs/design.md "Mode auto"): the applier
 * watches each worker's speed and the staleness it applies, one window at a
 * time, and picks a phase: async (every gradient at the adaptive rate),
 * backup (a worker much slower than the others becomes a backup worker:
 * its gradients count only while fresh) or ssp (workers keep within
 * ssp_bound clocks of the slowest, when staleness grows without a
 * straggler to blame). It leaves async at once when a window calls for it
 * and comes back after AUTO_CALM calm windows in a row.
 *
 * Every switch is logged, counted (freshet_mode_switches_total{from,to}),
 * written to meta (fields phase and mode_switches, fenced by the lease)
 * and published on the in-process channel; workers of other processes
 * read meta's phase once a second.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/applier/applier_int.h"

#define AUTO_WINDOW_NS  1000000000ull /* one decision per second          */
#define AUTO_SLOW_RATIO 3.0 /* a straggler: this many times slower than the others' median */
#define AUTO_CALM       3   /* calm windows before going back     */
#define AUTO_MIN_TAUS   20  /* applied gradients a staleness verdict needs */

static int cmp_dbl(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b;
}

void ps_auto_init(psstore_applier_t *a)
{
    auto_state_t *au = &a->au;
    fr_metrics_t *reg = a->conf.metrics;
    memset(au, 0, sizeof(*au));
    au->window_ns = fr_clock_mono_ns();
    if (reg == NULL || a->conf.mode != PSSTORE_MODE_AUTO)
        return;
    static const char *const labels[] = {"model", "from", "to"};
    fr_metric_t *m = fr_metrics_counter(reg, "freshet_mode_switches_total",
                                        "Phase switches of mode auto", 3, labels);
    for (int f = 0; m != NULL && f < PSSTORE_NPHASE; f++)
        for (int t = 0; t < PSSTORE_NPHASE; t++) {
            const char *v[] = {a->model, psstore_phase_name((psstore_phase_t)f),
                               psstore_phase_name((psstore_phase_t)t)};
            au->m_switch[f][t] = f != t ? fr_metric_series(m, v) : NULL;
        }
}

/* The index slot of id (as an entry keeps it: at most 127 bytes): its
 * entry's, or the free one where it would go. */
static int16_t *index_slot(auto_state_t *au, const char *id)
{
    size_t n = strnlen(id, sizeof(au->workers[0].id) - 1);
    size_t h = (size_t)fr_fnv1a(FR_FNV1A_SEED, id, n) & (AUTO_INDEX - 1);
    for (;;) {
        const char *at = au->index[h] != 0 ? au->workers[au->index[h] - 1].id : NULL;
        if (at == NULL || (strncmp(at, id, n) == 0 && at[n] == '\0'))
            return &au->index[h];
        h = (h + 1) & (AUTO_INDEX - 1);
    }
}

/* The window's entry of worker id, added when new (NULL when full): one
 * hash probe per gradient, on the applier's hot path. */
static auto_worker_t *worker_of(auto_state_t *au, const char *id)
{
    int16_t *slot = index_slot(au, id);
    if (*slot != 0)
        return &au->workers[*slot - 1];
    if (au->nworkers == AUTO_MAX_WORKERS)
        return NULL;
    auto_worker_t *w = &au->workers[au->nworkers++];
    memset(w, 0, sizeof(*w));
    snprintf(w->id, sizeof(w->id), "%s", id);
    *slot = (int16_t)au->nworkers;
    return w;
}

/* Indexes workers[0..nworkers) again, after entries moved. */
static void index_rebuild(auto_state_t *au)
{
    memset(au->index, 0, sizeof(au->index));
    for (int i = 0; i < au->nworkers; i++)
        *index_slot(au, au->workers[i].id) = (int16_t)(i + 1);
}

int ps_auto_backup_drop(psstore_applier_t *a, const psstore_grad_t *g)
{
    auto_state_t *au = &a->au;
    if (a->conf.mode != PSSTORE_MODE_AUTO || g->worker == NULL)
        return 0;
    auto_worker_t *w = worker_of(au, g->worker);
    if (w == NULL)
        return 0;
    int64_t tau = a->version - g->version;
    w->arrivals++;
    w->tau_sum += (double)tau; /* dropped ones too: a backup stays one */
    return au->phase == PSSTORE_PHASE_BACKUP && w->straggler && tau > ps_applier_pushers(a);
}

void ps_auto_note_tau(psstore_applier_t *a, const char *worker, int64_t tau)
{
    auto_state_t *au = &a->au;
    if (a->conf.mode != PSSTORE_MODE_AUTO)
        return;
    auto_worker_t *w = worker != NULL ? worker_of(au, worker) : NULL;
    if ((w == NULL || !w->straggler) && au->ntaus < AUTO_MAX_TAUS)
        au->taus[au->ntaus++] = tau;
}

/* The median of the others' v[j] (j != i) over the first n entries. */
static double median_others(const double *v, int n, int i)
{
    double o[AUTO_MAX_WORKERS];
    int k = 0;
    for (int j = 0; j < n; j++)
        if (j != i)
            o[k++] = v[j];
    qsort(o, (size_t)k, sizeof(o[0]), cmp_dbl);
    return o[(k - 1) / 2];
}

/*
 * The phase this window calls for, marking the stragglers: a worker that
 * pushed AUTO_SLOW_RATIO times fewer gradients than the median of the
 * others is one, and so is a worker whose gradients were AUTO_SLOW_RATIO
 * times staler than the others' (plus the worker count: a few versions of
 * difference are concurrency), which is how a straggler shows when the
 * others are slowed too (more workers than cores): backup. Else a
 * staleness p99 above twice the workers calls for ssp; else async.
 * Workers that pushed nothing this window and the last are forgotten.
 */
static psstore_phase_t window_phase(auto_state_t *au, char *why, size_t size)
{
    int n = 0;
    for (int i = 0; i < au->nworkers;) {
        auto_worker_t *w = &au->workers[i];
        w->absent = w->arrivals == 0 ? w->absent + 1 : 0;
        if (w->absent >= 2) {
            au->workers[i] = au->workers[--au->nworkers];
            continue;
        }
        n++;
        i++;
    }
    index_rebuild(au);
    psstore_phase_t phase = PSSTORE_PHASE_ASYNC;
    snprintf(why, size, "%d workers at even speeds, staleness within bounds", n);
    double rate[AUTO_MAX_WORKERS], stale[AUTO_MAX_WORKERS];
    for (int i = 0; i < au->nworkers; i++) {
        const auto_worker_t *w = &au->workers[i];
        rate[i] = (double)w->arrivals;
        stale[i] = w->arrivals > 0 ? w->tau_sum / (double)w->arrivals : 0.0;
    }
    for (int i = 0; i < au->nworkers && n >= 2; i++) {
        auto_worker_t *w = &au->workers[i];
        double r = median_others(rate, au->nworkers, i);
        double st = median_others(stale, au->nworkers, i);
        int slow = rate[i] * AUTO_SLOW_RATIO < r;
        int old = w->arrivals > 0 && stale[i] > AUTO_SLOW_RATIO * st + (double)n;
        w->straggler = slow || old;
        if (!w->straggler || phase == PSSTORE_PHASE_BACKUP)
            continue;
        phase = PSSTORE_PHASE_BACKUP;
        if (slow)
            snprintf(why, size,
                     "worker %s pushed %u gradients in a window, the others' median %.0f", w->id,
                     w->arrivals, r);
        else
            snprintf(why, size,
                     "worker %s's gradients were %.1f versions stale on average, the others' %.1f",
                     w->id, stale[i], st);
    }
    if (phase == PSSTORE_PHASE_ASYNC && au->ntaus >= AUTO_MIN_TAUS && n >= 1) {
        qsort(au->taus, au->ntaus, sizeof(au->taus[0]), cmp_i64);
        int64_t p99 = au->taus[au->ntaus * 99 / 100];
        if (p99 > 2 * (int64_t)n) {
            phase = PSSTORE_PHASE_SSP;
            snprintf(why, size, "staleness p99 %lld above twice the %d workers", (long long)p99, n);
        }
    }
    return phase;
}

/* Makes phase the current one: log, counter, meta, channel. */
static fr_err_t switch_to(psstore_applier_t *a, psstore_phase_t phase, const char *why)
{
    auto_state_t *au = &a->au;
    psstore_phase_t from = au->phase;
    au->phase = phase;
    au->calm = 0;
    au->switches++;
    fr_log(FR_LOG_INFO, "applier %s: mode auto: %s -> %s (%s)", a->model, psstore_phase_name(from),
           psstore_phase_name(phase), why);
    if (au->m_switch[from][phase] != NULL)
        fr_series_add(au->m_switch[from][phase], 1);
    au->shown = 0;
    return FR_OK;
}

fr_err_t ps_auto_tick(psstore_applier_t *a)
{
    auto_state_t *au = &a->au;
    if (a->conf.mode != PSSTORE_MODE_AUTO)
        return FR_OK;
    uint64_t now = fr_clock_mono_ns();
    if (now - au->window_ns >= AUTO_WINDOW_NS) {
        char why[384];
        psstore_phase_t want = window_phase(au, why, sizeof(why));
        if (want == au->phase)
            au->calm = 0;
        else if (au->phase == PSSTORE_PHASE_ASYNC || ++au->calm >= AUTO_CALM)
            switch_to(a, want, why);
        for (int i = 0; i < au->nworkers; i++) {
            au->workers[i].arrivals = 0;
            au->workers[i].tau_sum = 0;
        }
        au->ntaus = 0;
        au->window_ns = now;
    }
    if (a->local != NULL)
        ps_local_set_phase(a->local, au->phase);
    if (au->shown)
        return FR_OK;
    char count[32];
    snprintf(count, sizeof(count), "%llu", (unsigned long long)au->switches);
    int done = 0;
    fr_err_t err = ps_applier_meta_set(a, &done, "phase", psstore_phase_name(au->phase),
                                       "mode_switches", count);
    au->shown = err == FR_OK && done;
    return err;
}
