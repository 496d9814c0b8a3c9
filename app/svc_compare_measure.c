/*
 * svc_compare_measure.c - what freshet compare reads after each run: the
 * versions stream (samples, versions, wall time, samples/s, staleness,
 * lr_eff, rounds), the evals stream (the learning curve, each evaluation
 * stamped with its version's time and the samples applied up to it), the
 * drops stream, run's --summary (waits) and the final weights, scored on
 * the [eval] holdout set here, as freshet eval scores an export.
 *
 * Threads: main thread only.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "app/compare.h"
#include "trainer/trainer.h"

#define EVALS_MAX 2000 /* the evals stream keeps about 1000 */

/* The figures of the versions stream; by_version[v] (t_ms, cumulative
 * samples) for v in 0..last, allocated, the caller frees. */
typedef struct vstamp {
    int64_t t_ms, samples;
    int seen;
} vstamp_t;

static int measure_versions(psstore_conn_t *c, cmp_run_t *r, size_t keep, vstamp_t **stamps)
{
    psstore_version_entry_t *e = malloc(keep * sizeof(*e));
    double *tau = malloc(keep * sizeof(double));
    size_t n = 0, k = 0;
    int rc = -1;
    if (e == NULL || tau == NULL) {
        snprintf(r->error, sizeof(r->error), "out of memory");
        goto out;
    }
    if (psstore_versions_tail(c, r->model, keep, e, &n) != FR_OK || n == 0) {
        snprintf(r->error, sizeof(r->error), "versions stream: %s",
                 n == 0 ? "empty: nothing was applied" : psstore_conn_error(c));
        goto out;
    }
    r->last_version = e[0].version;
    *stamps = calloc((size_t)r->last_version + 1, sizeof(vstamp_t));
    if (*stamps == NULL) {
        snprintf(r->error, sizeof(r->error), "out of memory");
        goto out;
    }
    int64_t t0 = 0, t1 = 0, n0 = 0, cum = 0;
    double lr = 0;
    for (size_t i = n; i-- > 0;) { /* oldest first */
        const psstore_version_entry_t *v = &e[i];
        if (v->rollback_from >= 0 || v->version < 0 || v->version > r->last_version)
            continue;
        if (k == 0)
            t0 = v->t_ms, n0 = v->n;
        t1 = v->t_ms;
        cum += v->n;
        (*stamps)[v->version] = (vstamp_t){v->t_ms, cum, 1};
        tau[k++] = (double)v->tau;
        lr += v->lr_eff;
        r->round_entries += v->k > 1;
    }
    r->samples = cum;
    r->versions = (int64_t)k;
    r->wall_s = (double)(t1 - t0) / 1000.0;
    r->samples_per_s = r->wall_s > 0 ? (double)(cum - n0) / r->wall_s : NAN;
    r->lr_eff_mean = k > 0 ? lr / (double)k : NAN;
    r->tau_p50 = cmp_quantile(tau, k, 0.50);
    r->tau_p99 = cmp_quantile(tau, k, 0.99);
    (*stamps)[0] = (vstamp_t){t0, 0, 1}; /* version 0: before the first update */
    rc = 0;
out:
    free(e);
    free(tau);
    return rc;
}

/* Appends a point stamped from stamps; skipped when its version has no
 * entry. Returns 0 or -1 when out of memory. */
static int curve_add(cmp_run_t *r, const vstamp_t *stamps, int64_t version, double acc, double loss)
{
    if (version < 0 || version > r->last_version || !stamps[version].seen)
        return 0;
    cmp_point_t *grown = realloc(r->curve.pts, (r->curve.n + 1) * sizeof(*grown));
    if (grown == NULL)
        return -1;
    r->curve.pts = grown;
    grown[r->curve.n++] = (cmp_point_t){
        .version = version,
        .t_s = (double)(stamps[version].t_ms - stamps[0].t_ms) / 1000.0,
        .samples = stamps[version].samples,
        .accuracy = acc,
        .loss = loss,
    };
    return 0;
}

/* The evals stream as the curve, oldest first. */
static int measure_evals(psstore_conn_t *c, cmp_run_t *r, const vstamp_t *stamps)
{
    psstore_eval_entry_t *ev = malloc(EVALS_MAX * sizeof(*ev));
    size_t n = 0;
    int rc = -1;
    if (ev == NULL || psstore_evals_tail(c, r->model, EVALS_MAX, ev, &n) != FR_OK) {
        snprintf(r->error, sizeof(r->error), "evals stream: %s",
                 ev == NULL ? "out of memory" : psstore_conn_error(c));
        goto out;
    }
    for (size_t i = n; i-- > 0;) {
        if (curve_add(r, stamps, ev[i].version, ev[i].accuracy, ev[i].loss) != 0)
            goto out;
    }
    rc = 0;
out:
    free(ev);
    return rc;
}

static int measure_drops(psstore_conn_t *c, cmp_run_t *r, size_t keep)
{
    psstore_drop_entry_t *d = malloc(keep * sizeof(*d));
    size_t n = 0;
    if (d == NULL || psstore_drops_tail(c, r->model, keep, d, &n) != FR_OK) {
        snprintf(r->error, sizeof(r->error), "drops stream: %s",
                 d == NULL ? "out of memory" : psstore_conn_error(c));
        free(d);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        int j = 0;
        while (j < r->ndrops && strcmp(r->drop_reason[j], d[i].reason) != 0)
            j++;
        if (j == r->ndrops && r->ndrops < CMP_NDROP)
            snprintf(r->drop_reason[r->ndrops++], sizeof(r->drop_reason[0]), "%s", d[i].reason);
        if (j < r->ndrops)
            r->drops[j]++;
        r->drops_total++;
    }
    free(d);
    return 0;
}

/* run's --summary: waits and push time of the workers, the applier's
 * rounds; NAN where the file or a key is missing. */
static void measure_summary(cmp_run_t *r, const char *path)
{
    r->waits_s = r->push_s = r->compute_s = r->rounds = r->failed_batches = NAN;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char text[8192];
    size_t len = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[len] = '\0';
    double v;
    if (app_json_find_num(text, "wait_ns", &v) == 0)
        r->waits_s = v * 1e-9;
    if (app_json_find_num(text, "push_ns", &v) == 0)
        r->push_s = v * 1e-9;
    if (app_json_find_num(text, "compute_ns", &v) == 0)
        r->compute_s = v * 1e-9;
    if (app_json_find_num(text, "rounds", &v) == 0)
        r->rounds = v;
    if (app_json_find_num(text, "failed", &v) == 0)
        r->failed_batches = v;
}

int app_compare_measure(psstore_conn_t *c, const app_holdout_t *h, size_t keep, const char *summary,
                        struct cmp_run *r)
{
    vstamp_t *stamps = NULL;
    int rc = -1;
    if (measure_versions(c, r, keep, &stamps) != 0 || measure_evals(c, r, stamps) != 0 ||
        measure_drops(c, r, keep) != 0)
        goto out;
    measure_summary(r, summary);
    uint64_t epoch;
    double loss = 0;
    int64_t right = 0;
    if (psstore_model_weights(c, r->model, h->w, h->m->nparams, &epoch, &r->final_version) !=
        FR_OK) {
        snprintf(r->error, sizeof(r->error), "final weights: %s", psstore_conn_error(c));
        goto out;
    }
    if (trainer_backend_load(h->be, h->w) != FR_OK ||
        trainer_backend_evaluate(h->be, &loss, &right, h->ds->x, h->ds->y, h->ds->n) != FR_OK) {
        snprintf(r->error, sizeof(r->error), "holdout: %s", trainer_backend_error(h->be));
        goto out;
    }
    r->accuracy = (double)right / (double)h->ds->n;
    r->loss = loss / (double)h->ds->n;
    /* the final point, unless the last evaluation was of these weights */
    if ((r->curve.n == 0 || r->curve.pts[r->curve.n - 1].version < r->final_version) &&
        curve_add(r, stamps, r->final_version, r->accuracy, r->loss) != 0) {
        snprintf(r->error, sizeof(r->error), "out of memory");
        goto out;
    }
    rc = 0;
out:
    free(stamps);
    return rc;
}
