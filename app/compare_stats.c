/*
 * compare_stats.c - the arithmetic of freshet compare: quantiles, mean and
 * standard deviation, the first crossing of a target, curves resampled on
 * a common grid, and the aggregates of a mode in a cell over its seeds.
 * Pure C on app/compare.h's structs: no Redis, no I/O, unit-tested
 * (tests/unit/test_compare.c).
 *
 * Threads: any; no state.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "app/compare.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double cmp_quantile(double *v, size_t n, double q)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    size_t rank = (size_t)ceil(q * (double)n); /* 1-based */
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return v[rank - 1];
}

void cmp_mean_sd(const double *v, size_t n, double *mean, double *sd, size_t *count)
{
    double sum = 0, sq = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(v[i]))
            continue;
        sum += v[i];
        k++;
    }
    *count = k;
    if (k == 0) {
        *mean = *sd = NAN;
        return;
    }
    *mean = sum / (double)k;
    for (size_t i = 0; i < n; i++) {
        if (!isnan(v[i]))
            sq += (v[i] - *mean) * (v[i] - *mean);
    }
    *sd = k > 1 ? sqrt(sq / (double)(k - 1)) : 0.0;
}

int cmp_first_crossing(const cmp_curve_t *c, double target, double *t_s, double *samples)
{
    for (size_t i = 0; i < c->n; i++) {
        if (c->pts[i].accuracy >= target) {
            *t_s = c->pts[i].t_s;
            *samples = (double)c->pts[i].samples;
            return 0;
        }
    }
    *t_s = *samples = NAN;
    return -1;
}

static double point_x(const cmp_point_t *p, int by_samples)
{
    return by_samples ? (double)p->samples : p->t_s;
}

double cmp_curve_at(const cmp_curve_t *c, int by_samples, double x)
{
    if (c->n == 0 || x < point_x(&c->pts[0], by_samples) ||
        x > point_x(&c->pts[c->n - 1], by_samples))
        return NAN;
    for (size_t i = 1; i < c->n; i++) {
        double x0 = point_x(&c->pts[i - 1], by_samples), x1 = point_x(&c->pts[i], by_samples);
        if (x > x1)
            continue;
        if (x1 <= x0)
            return c->pts[i].accuracy;
        double f = (x - x0) / (x1 - x0);
        return c->pts[i - 1].accuracy + f * (c->pts[i].accuracy - c->pts[i - 1].accuracy);
    }
    return c->pts[c->n - 1].accuracy;
}

/* The agg of (mode, workers, straggler), appended when new; NULL when out
 * of memory. */
static cmp_agg_t *agg_find(cmp_grid_t *g, const cmp_run_t *r)
{
    for (size_t i = 0; i < g->naggs; i++) {
        cmp_agg_t *a = &g->aggs[i];
        if (strcmp(a->mode, r->mode) == 0 && a->workers == r->workers &&
            a->straggler == r->straggler)
            return a;
    }
    cmp_agg_t *grown = realloc(g->aggs, (g->naggs + 1) * sizeof(*grown));
    if (grown == NULL)
        return NULL;
    g->aggs = grown;
    cmp_agg_t *a = &g->aggs[g->naggs++];
    memset(a, 0, sizeof(*a));
    strcpy(a->mode, r->mode);
    a->workers = r->workers;
    a->straggler = r->straggler;
    return a;
}

/* The mean over a's measured runs of the double at offset off of cmp_run_t. */
static double runs_mean(const cmp_grid_t *g, const cmp_agg_t *a, size_t off, double *sd)
{
    double v[256];
    size_t k = 0, used;
    for (size_t i = 0; i < g->nruns && k < 256; i++) {
        const cmp_run_t *r = &g->runs[i];
        if (r->ok && strcmp(r->mode, a->mode) == 0 && r->workers == a->workers &&
            r->straggler == a->straggler)
            v[k++] = *(const double *)((const char *)r + off);
    }
    double mean, s;
    cmp_mean_sd(v, k, &mean, &s, &used);
    if (sd != NULL)
        *sd = s;
    return mean;
}
#define RUNS_MEAN(g, a, field, sd) runs_mean(g, a, offsetof(cmp_run_t, field), sd)

/* a's mean curves: each measured run's curve sampled on CMP_CURVE_GRID
 * points from 0 to the longest run's end, averaged where runs have data. */
static void agg_curves(const cmp_grid_t *g, cmp_agg_t *a)
{
    double t_end = 0, s_end = 0;
    for (size_t i = 0; i < g->nruns; i++) {
        const cmp_run_t *r = &g->runs[i];
        if (!r->ok || r->curve.n == 0 || strcmp(r->mode, a->mode) != 0 ||
            r->workers != a->workers || r->straggler != a->straggler)
            continue;
        t_end = fmax(t_end, r->curve.pts[r->curve.n - 1].t_s);
        s_end = fmax(s_end, (double)r->curve.pts[r->curve.n - 1].samples);
    }
    for (int j = 0; j < CMP_CURVE_GRID; j++) {
        a->curve_t[j] = t_end * j / (CMP_CURVE_GRID - 1);
        a->curve_s[j] = s_end * j / (CMP_CURVE_GRID - 1);
        double st = 0, ss = 0;
        int nt = 0, ns = 0;
        for (size_t i = 0; i < g->nruns; i++) {
            const cmp_run_t *r = &g->runs[i];
            if (!r->ok || strcmp(r->mode, a->mode) != 0 || r->workers != a->workers ||
                r->straggler != a->straggler)
                continue;
            double x = cmp_curve_at(&r->curve, 0, a->curve_t[j]);
            double y = cmp_curve_at(&r->curve, 1, a->curve_s[j]);
            if (!isnan(x))
                st += x, nt++;
            if (!isnan(y))
                ss += y, ns++;
        }
        a->curve_t_acc[j] = nt > 0 ? st / nt : NAN;
        a->curve_s_acc[j] = ns > 0 ? ss / ns : NAN;
    }
}

double cmp_default_target(const cmp_grid_t *g, double frac)
{
    /* the cells' means need the aggregates: compute them on a copy */
    cmp_grid_t tmp = *g;
    tmp.aggs = NULL;
    tmp.naggs = 0;
    tmp.target = INFINITY;
    if (cmp_aggregate(&tmp) != 0)
        return NAN;
    double best = NAN;
    for (size_t i = 0; i < tmp.naggs; i++) {
        if (!isnan(tmp.aggs[i].acc_mean) && !(tmp.aggs[i].acc_mean <= best))
            best = tmp.aggs[i].acc_mean;
    }
    free(tmp.aggs);
    return isnan(best) ? NAN : frac * best;
}

void cmp_apply_target(cmp_grid_t *g)
{
    for (size_t i = 0; i < g->nruns; i++) {
        cmp_run_t *r = &g->runs[i];
        cmp_first_crossing(&r->curve, g->target, &r->target_t_s, &r->target_samples);
    }
}

/* The speed-up baseline: async (else the first mode) at the smallest
 * workers, no straggler. */
static void baseline(cmp_grid_t *g)
{
    const char *mode = g->nruns > 0 ? g->runs[0].mode : "async";
    int workers = 0;
    for (size_t i = 0; i < g->nruns; i++) {
        if (strcmp(g->runs[i].mode, "async") == 0)
            mode = "async";
        if (workers == 0 || g->runs[i].workers < workers)
            workers = g->runs[i].workers;
    }
    snprintf(g->baseline_mode, sizeof(g->baseline_mode), "%s", mode);
    g->baseline_workers = workers;
    g->baseline_sps = NAN;
    for (size_t i = 0; i < g->naggs; i++) {
        const cmp_agg_t *a = &g->aggs[i];
        if (strcmp(a->mode, mode) == 0 && a->workers == workers && !a->straggler)
            g->baseline_sps = a->sps_mean;
    }
}

int cmp_aggregate(cmp_grid_t *g)
{
    for (size_t i = 0; i < g->nruns; i++) {
        cmp_run_t *r = &g->runs[i];
        cmp_agg_t *a = agg_find(g, r);
        if (a == NULL)
            return -1;
        a->runs++;
        a->ok += r->ok;
        a->reached += r->ok && !isnan(r->target_t_s);
        if (!r->ok && a->error[0] == '\0')
            snprintf(a->error, sizeof(a->error), "%s", r->error);
    }
    for (size_t i = 0; i < g->naggs; i++) {
        cmp_agg_t *a = &g->aggs[i];
        a->acc_mean = RUNS_MEAN(g, a, accuracy, &a->acc_sd);
        a->loss_mean = RUNS_MEAN(g, a, loss, NULL);
        a->t_target_mean = RUNS_MEAN(g, a, target_t_s, &a->t_target_sd);
        a->s_target_mean = RUNS_MEAN(g, a, target_samples, NULL);
        a->sps_mean = RUNS_MEAN(g, a, samples_per_s, NULL);
        a->tau_p50 = RUNS_MEAN(g, a, tau_p50, NULL);
        a->tau_p99 = RUNS_MEAN(g, a, tau_p99, NULL);
        a->lr_eff = RUNS_MEAN(g, a, lr_eff_mean, NULL);
        a->waits_s = RUNS_MEAN(g, a, waits_s, NULL);
        a->rounds = RUNS_MEAN(g, a, rounds, NULL);
        double drops[256], samples[256];
        size_t k = 0, used;
        for (size_t j = 0; j < g->nruns && k < 256; j++) {
            const cmp_run_t *r = &g->runs[j];
            if (r->ok && strcmp(r->mode, a->mode) == 0 && r->workers == a->workers &&
                r->straggler == a->straggler) {
                drops[k] = (double)r->drops_total;
                samples[k++] = (double)r->samples;
            }
        }
        double sd;
        cmp_mean_sd(drops, k, &a->drops, &sd, &used);
        cmp_mean_sd(samples, k, &a->samples_mean, &sd, &used);
        agg_curves(g, a);
    }
    baseline(g);
    for (size_t i = 0; i < g->naggs; i++)
        g->aggs[i].speedup = g->aggs[i].sps_mean / g->baseline_sps;
    return 0;
}
