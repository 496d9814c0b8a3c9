/*
 * prog.c - progressive validation of a sparse model: the logloss and the
 * AUC of predictions made before each update, per window of records
 * (docs/design.md "Sparse models").
 */
#include <math.h>
#include <stdlib.h>

#include "sparse/prog.h"
#include "sparse/sparse.h"

struct sparse_prog {
    size_t window, n;
    float *p, *y;  /* [window] the open window's predictions and labels */
    uint32_t *idx; /* [window] scratch of the AUC */
    int64_t index, total;
    double loss, total_loss;
    double entropy; /* the open window's planted probabilities' entropy, summed */
    size_t planted; /* ... over this many of its records                      */
    int multiclass; /* sparse_prog_multiclass: no AUC or click rate            */
};

sparse_prog_t *sparse_prog_new(size_t window)
{
    sparse_prog_t *pv = calloc(1, sizeof(*pv));
    if (pv == NULL || window == 0)
        goto fail;
    pv->window = window;
    pv->p = malloc(window * sizeof(*pv->p));
    pv->y = malloc(window * sizeof(*pv->y));
    pv->idx = malloc(window * sizeof(*pv->idx));
    if (pv->p == NULL || pv->y == NULL || pv->idx == NULL)
        goto fail;
    return pv;
fail:
    sparse_prog_destroy(pv);
    return NULL;
}

void sparse_prog_destroy(sparse_prog_t *pv)
{
    if (pv == NULL)
        return;
    free(pv->p);
    free(pv->y);
    free(pv->idx);
    free(pv);
}

/* Sifts idx[i] down the max-heap idx[0..n) keyed by p. */
static void sift_down(uint32_t *idx, const float *p, size_t i, size_t n)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && p[idx[c + 1]] > p[idx[c]])
            c++;
        if (!(p[idx[c]] > p[idx[i]]))
            return;
        uint32_t t = idx[i];
        idx[i] = idx[c];
        idx[c] = t;
        i = c;
    }
}

/* Sorts idx[n] by p ascending: heapsort, in place and reentrant (qsort
 * takes no context for its comparison). */
static void sort_by_p(uint32_t *idx, const float *p, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down(idx, p, i, n);
    for (size_t end = n; end-- > 1;) {
        uint32_t t = idx[0];
        idx[0] = idx[end];
        idx[end] = t;
        sift_down(idx, p, 0, end);
    }
}

double sparse_auc(const float *p, const float *y, uint32_t *idx, size_t n)
{
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(p[i]))
            return NAN; /* no order to rank */
        idx[i] = (uint32_t)i;
        pos += y[i] > 0.5f;
    }
    if (pos == 0 || pos == n)
        return NAN;
    sort_by_p(idx, p, n);
    /* Mann-Whitney: the positives' rank sum, tied predictions sharing
     * their mean rank */
    double rank_sum = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i, tied_pos = 0;
        while (j < n && p[idx[j]] == p[idx[i]])
            tied_pos += y[idx[j++]] > 0.5f;
        rank_sum += (double)tied_pos * 0.5 * (double)(i + 1 + j); /* mean rank of i+1..j */
        i = j;
    }
    double neg = (double)(n - pos);
    return (rank_sum - (double)pos * ((double)pos + 1) / 2) / ((double)pos * neg);
}

/* The figures of the open window. */
static void window_figures(sparse_prog_t *pv, sparse_prog_window_t *w)
{
    size_t pos = 0;
    for (size_t i = 0; i < pv->n; i++)
        pos += pv->y[i] > 0.5f;
    w->index = pv->index;
    w->n = pv->n;
    w->logloss = pv->n > 0 ? pv->loss / (double)pv->n : NAN;
    w->ctr = pv->n > 0 && !pv->multiclass ? (double)pos / (double)pv->n : NAN;
    w->auc = pv->multiclass ? NAN : sparse_auc(pv->p, pv->y, pv->idx, pv->n);
    w->floor = pv->n > 0 && pv->planted == pv->n ? pv->entropy / (double)pv->n : NAN;
}

int sparse_prog_add(sparse_prog_t *pv, float p, float y, sparse_prog_window_t *w)
{
    return sparse_prog_add_planted(pv, p, y, NAN, w);
}

int sparse_prog_add_planted(sparse_prog_t *pv, float p, float y, float planted,
                            sparse_prog_window_t *w)
{
    if (planted >= 0.0f && planted <= 1.0f) { /* its expected logloss: the entropy */
        double q = planted;
        pv->entropy += q > 0 && q < 1 ? -(q * log(q) + (1 - q) * log(1 - q)) : 0.0;
        pv->planted++;
    }
    double l = sparse_logloss(p, y);
    pv->p[pv->n] = p;
    pv->y[pv->n] = y;
    pv->n++;
    pv->loss += l;
    pv->total_loss += l;
    pv->total++;
    if (pv->n < pv->window)
        return 0;
    window_figures(pv, w);
    pv->index++;
    pv->n = 0;
    pv->loss = 0;
    pv->entropy = 0;
    pv->planted = 0;
    return 1;
}

void sparse_prog_multiclass(sparse_prog_t *pv)
{
    pv->multiclass = 1;
}

void sparse_prog_open(sparse_prog_t *pv, sparse_prog_window_t *w)
{
    window_figures(pv, w);
}

double sparse_prog_mean(const sparse_prog_t *pv, int64_t *n)
{
    if (n != NULL)
        *n = pv->total;
    return pv->total > 0 ? pv->total_loss / (double)pv->total : NAN;
}
