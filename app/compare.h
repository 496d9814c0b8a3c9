/*
 * compare.h - freshet compare: the runs of a grid (mode x workers x
 * straggler x seed), what each measured, their aggregates per cell and the
 * reports. The statistics (compare_stats.c) and the reports
 * (compare_report.c) are plain C on these structs, without Redis, so that
 * unit tests can check the arithmetic; svc_compare.c runs freshet run and
 * reads the store.
 *
 * Threads: main thread only.
 */
#ifndef FRESHET_APP_COMPARE_H
#define FRESHET_APP_COMPARE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CMP_NDROP      16  /* drop reasons kept per run                    */
#define CMP_CURVE_GRID 41  /* points of the mean curves in the reports     */
#define CMP_MODE_MAX   16  /* a mode's name: async, adaptive, ... auto     */
#define CMP_ERR_MAX    512 /* why a run failed                             */

/* One point of a learning curve: a holdout evaluation of the version's
 * weights, stamped with the version's time since the run's first version
 * and the samples applied up to it. */
typedef struct cmp_point {
    int64_t version;
    double t_s;      /* seconds since the first version's commit        */
    int64_t samples; /* cumulative n of the versions up to this version */
    double accuracy, loss;
} cmp_point_t;

/* A learning curve, ordered by version. Owns pts (free()). */
typedef struct cmp_curve {
    cmp_point_t *pts;
    size_t n;
} cmp_curve_t;

/* One freshet run of the grid, and what the store and its summary said. */
typedef struct cmp_run {
    char model[65];
    char mode[CMP_MODE_MAX];
    int workers;
    int straggler; /* 0: none; 1: --straggler applied */
    int64_t seed;
    int ok;                  /* ran and was measured                     */
    char error[CMP_ERR_MAX]; /* why not, when !ok                        */
    int exit_status;
    /* from the versions stream */
    int64_t samples, versions, last_version;
    double wall_s;        /* first version to last                    */
    double samples_per_s; /* samples after the first version / wall_s */
    double tau_p50, tau_p99, lr_eff_mean;
    int64_t round_entries; /* versions entries with k > 1 */
    /* from the drops stream */
    char drop_reason[CMP_NDROP][16];
    int64_t drops[CMP_NDROP];
    int ndrops;
    int64_t drops_total;
    /* from run's --summary (NAN when it is missing) */
    double waits_s, push_s, compute_s, rounds, failed_batches;
    /* the final weights, pulled from Redis and evaluated on [eval] */
    double accuracy, loss;
    int64_t final_version;
    cmp_curve_t curve;                 /* the evals stream, plus the final point */
    double target_t_s, target_samples; /* first point >= the target; NAN: never */
} cmp_run_t;

/* One mode in one cell (workers x straggler), over its seeds. */
typedef struct cmp_agg {
    char mode[CMP_MODE_MAX];
    int workers, straggler;
    int runs, ok; /* runs, and those measured          */
    int reached;  /* measured runs that reached target */
    double acc_mean, acc_sd, loss_mean, samples_mean;
    double t_target_mean, t_target_sd, s_target_mean; /* over reached runs; NAN: none */
    double sps_mean, speedup, tau_p50, tau_p99, lr_eff, waits_s, drops, rounds;
    double curve_t[CMP_CURVE_GRID], curve_t_acc[CMP_CURVE_GRID]; /* mean over seeds */
    double curve_s[CMP_CURVE_GRID], curve_s_acc[CMP_CURVE_GRID];
    char error[CMP_ERR_MAX]; /* the first failed run's error */
} cmp_agg_t;

/* The whole comparison. */
typedef struct cmp_grid {
    const char *config, *straggler; /* straggler: the --straggler text, or NULL */
    int64_t samples;                /* --samples per run                       */
    int seeds;
    double target; /* --target, or the default once the runs are done */
    int target_given;
    char chartjs[256]; /* Chart.js's file for the html report */
    cmp_run_t *runs;
    size_t nruns;
    cmp_agg_t *aggs;
    size_t naggs;
    /* the speed-up's baseline: mean samples/s of baseline_mode at
     * baseline_workers, no straggler */
    char baseline_mode[CMP_MODE_MAX];
    int baseline_workers;
    double baseline_sps;
} cmp_grid_t;

/* ---- compare_stats.c: the arithmetic ------------------------------------ */
/* The q-quantile (0..1) of v[n] by the nearest rank (ceil(q n)-th smallest),
 * as the applier's staleness percentiles; sorts v. NAN when n is 0. */
double cmp_quantile(double *v, size_t n, double q);
/* Mean and sample standard deviation (n - 1; 0 for one value) of v[n]
 * skipping NAN values; *count receives how many were used. NAN when none. */
void cmp_mean_sd(const double *v, size_t n, double *mean, double *sd, size_t *count);
/* The first point of c with accuracy >= target: its time and samples.
 * Returns 0, or -1 (and NAN in both) when none reached it. */
int cmp_first_crossing(const cmp_curve_t *c, double target, double *t_s, double *samples);
/* The accuracy of c at x, linear between the points around it, x being
 * time (by_samples 0) or samples (1); NAN beyond the last point or
 * before the first. */
double cmp_curve_at(const cmp_curve_t *c, int by_samples, double x);
/* Fills the per-cell aggregates of g->runs (g->aggs, allocated) and the
 * speed-up baseline; the target must be set (see cmp_default_target). 0,
 * or -1 when out of memory. */
int cmp_aggregate(cmp_grid_t *g);
/* frac x the best mean final accuracy of a cell, computed from the runs;
 * NAN when no run was measured. */
double cmp_default_target(const cmp_grid_t *g, double frac);
/* Sets each run's time and samples to g->target. */
void cmp_apply_target(cmp_grid_t *g);

/* ---- compare_verdict.c: the verdict, computed from the aggregates -------- */
#define CMP_VERDICT_MAX 128
typedef struct cmp_vline {
    char scope[64];     /* "2 workers, no straggler", or "seed claims" */
    char question[128]; /* "reached the target first", a claim, ...    */
    char status[24];    /* answered, none, held, did not hold, ...     */
    char text[1024];
} cmp_vline_t;
typedef struct cmp_verdict {
    cmp_vline_t lines[CMP_VERDICT_MAX];
    size_t n;
} cmp_verdict_t;
void cmp_verdict(const cmp_grid_t *g, cmp_verdict_t *v);

/* ---- compare_report.c: the reports --------------------------------------- */
/* DIR/report.json, DIR/report.md and DIR/report.html. 0, or -1 with errstr. */
int cmp_report_write(const cmp_grid_t *g, const char *dir, char *errstr, size_t size);

#endif
