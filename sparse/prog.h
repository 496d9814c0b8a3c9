/*
 * prog.h - progressive validation of a sparse model (prog.c;
 * docs/design.md "Sparse models"): each prediction is made before the
 * model learns from its record, so the mean loss of the predictions is a
 * holdout loss that needs no holdout. Figures per window of records, and
 * the AUC they use.
 *
 * Threads: a sparse_prog_t belongs to one thread.
 */
#ifndef FRESHET_SPARSE_PROG_H
#define FRESHET_SPARSE_PROG_H

#include <stddef.h>
#include <stdint.h>

typedef struct sparse_prog sparse_prog_t;

typedef struct sparse_prog_window {
    int64_t index;  /* 0, 1, ... */
    size_t n;       /* records   */
    double logloss; /* mean      */
    double auc;     /* NAN when the window holds one class only */
    double ctr;     /* positives over records */
    double floor;   /* the Bayes-optimal logloss, the mean binary entropy of the
                       records' planted probabilities; NAN unless every record
                       of the window carried one */
} sparse_prog_window_t;

/* Windows of window records; NULL out of memory. */
sparse_prog_t *sparse_prog_new(size_t window);
void sparse_prog_destroy(sparse_prog_t *pv);

/* Adds the prediction p of a record labelled y (0 or 1). Returns 1 when
 * the record closed a window, whose figures are then in *w; else 0. */
int sparse_prog_add(sparse_prog_t *pv, float p, float y, sparse_prog_window_t *w);
/* The same for a record whose planted click probability is known (NAN:
 * not known), which gives the window its floor. */
int sparse_prog_add_planted(sparse_prog_t *pv, float p, float y, float planted,
                            sparse_prog_window_t *w);

/* The figures of the records of the open window (n = 0 when none). */
void sparse_prog_open(sparse_prog_t *pv, sparse_prog_window_t *w);

/* Predictions of a softmax model: each p the probability of the record's
 * own class, added with y = 1, so that the windows' logloss is the
 * multi-class one; their AUC and click rate are then NaN. */
void sparse_prog_multiclass(sparse_prog_t *pv);

/* The mean logloss over every record so far, and their count. */
double sparse_prog_mean(const sparse_prog_t *pv, int64_t *n);

/* The area under the ROC curve of p[n] against labels y[n] (ties count
 * one half), sorting idx[n] as scratch; NAN when one class is missing or
 * a prediction is NaN. */
double sparse_auc(const float *p, const float *y, uint32_t *idx, size_t n);

#endif /* FRESHET_SPARSE_PROG_H */
