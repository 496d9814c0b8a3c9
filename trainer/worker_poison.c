/*
 * worker_poison.c - a batch whose gradient is not finite (docs/design.md
 * "Poison in a batch"): each sample's gradient is computed alone, the
 * poisonous ones are dropped and their positions quarantined, and the
 * batch's gradient is that of the samples kept.
 *
 * Threads: the worker's own.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trainer/worker_int.h"

/* Whether the loss and every gradient entry are finite: x * 0 is 0 for a
 * finite x and NaN for NaN or an infinity, summed in 8 lanes (a pass at
 * memory speed). A batch's gradient needs it only when its sum of squares
 * is not finite, which an entry above 1.8e19 also makes; each sample's
 * gradient while isolating a non-finite one does. */
int trainer_worker_finite_all(const float *g, size_t n, double loss)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += g[i + (size_t)k] * 0.0f;
    for (; i < n; i++)
        acc[0] += g[i] * 0.0f;
    float sum = 0.0f;
    for (int k = 0; k < 8; k++)
        sum += acc[k];
    return isfinite(loss) && sum == 0.0f;
}

/*
 * The positions of the samples trainer_worker_isolate_nonfinite dropped (wk->iso_drop[n],
 * indices into b) go to the store's quarantine, so that a re-read of their
 * partitions (a rollback, a replay, the gap rule) rejects them instead of
 * learning them under other weights. A batch not made by a batcher has no
 * positions; a store that fails is logged (the sample, still poisonous,
 * would be dropped again).
 */
static void quarantine(worker_t *wk, const ingest_batch_t *b, size_t n)
{
    if (b->partition == NULL || b->offset == NULL || wk->cl == NULL)
        return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t s = wk->iso_drop[i];
        const char *topic = NULL;
        for (size_t r = 0; r < b->nranges && topic == NULL; r++)
            if (b->ranges[r].partition == b->partition[s] && b->ranges[r].from <= b->offset[s] &&
                b->offset[s] < b->ranges[r].to)
                topic = b->ranges[r].topic;
        if (topic != NULL) /* (always: every sample's position is in a range) */
            wk->iso_pos[k++] =
                (psstore_range_t){topic, b->partition[s], b->offset[s], b->offset[s] + 1};
    }
    if (k == 0)
        return;
    const psstore_range_t *q = &wk->iso_pos[0];
    if (psstore_client_quarantine(wk->cl, wk->iso_pos, k) != FR_OK)
        fr_log(FR_LOG_WARN, "worker %s: quarantine of %zu position(s) (%s/%d@%lld...): %s", wk->id,
               k, q->topic, (int)q->partition, (long long)q->from, psstore_client_error(wk->cl));
    else
        fr_log(FR_LOG_INFO,
               "worker %s: %zu position(s) quarantined (%s/%d@%lld...): a re-read "
               "rejects them",
               wk->id, k, q->topic, (int)q->partition, (long long)q->from);
}

/*
 * Per-sample isolation (docs/design.md "Poison in a batch"): the batch's
 * loss or gradient is not finite. Each sample's gradient is computed alone;
 * the samples whose own is not finite are dropped and counted, and the
 * batch's gradient (into wk->g, its loss into *loss) is computed again over
 * the others, whose positions, like the dropped ones', the batch's ranges
 * still cover. Returns the samples kept (0: every one was poison),
 * ISO_DIVERGED when every sample alone is finite or the rest still is not
 * (the weights themselves diverged: the divergence guard's case), or
 * ISO_ERROR (logged) when memory or the backend failed.
 */
int64_t trainer_worker_isolate_nonfinite(worker_t *wk, const ingest_batch_t *b, double *loss)
{
    trainer_pool_t *p = wk->pool;
    size_t n = b->n, d = (size_t)b->features, np = p->m.nparams;
    if (n > wk->iso_cap) {
        free(wk->iso_x);
        free(wk->iso_y);
        wk->iso_x = malloc(n * d * sizeof(float));
        wk->iso_y = malloc(n * sizeof(float));
        wk->iso_cap = wk->iso_x != NULL && wk->iso_y != NULL ? n : 0;
    }
    if (n > wk->iso_drop_cap) {
        free(wk->iso_drop);
        free(wk->iso_pos);
        wk->iso_drop = malloc(n * sizeof(*wk->iso_drop));
        wk->iso_pos = malloc(n * sizeof(*wk->iso_pos));
        wk->iso_drop_cap = wk->iso_drop != NULL && wk->iso_pos != NULL ? n : 0;
    }
    if (wk->iso_g == NULL)
        wk->iso_g = malloc(np * sizeof(float));
    if (wk->iso_cap < n || wk->iso_drop_cap < n || wk->iso_g == NULL) {
        fr_log(FR_LOG_ERROR, "worker %s: out of memory isolating a non-finite sample", wk->id);
        return ISO_ERROR;
    }
    size_t kept = 0, dropped = 0;
    for (size_t i = 0; i < n; i++) {
        double one = 0;
        if (trainer_backend_gradient(wk->be, wk->iso_g, &one, b->x + i * d, b->y + i, 1) != FR_OK) {
            fr_log(FR_LOG_ERROR, "worker %s: %s", wk->id, trainer_backend_error(wk->be));
            return ISO_ERROR;
        }
        if (!trainer_worker_finite_all(wk->iso_g, np, one)) {
            wk->iso_drop[dropped++] = i;
            continue;
        }
        memcpy(wk->iso_x + kept * d, b->x + i * d, d * sizeof(float));
        wk->iso_y[kept++] = b->y[i];
    }
    if (kept == n)
        return ISO_DIVERGED;
    if (kept > 0) {
        if (trainer_backend_gradient(wk->be, wk->g, loss, wk->iso_x, wk->iso_y, (int)kept) !=
            FR_OK) {
            fr_log(FR_LOG_ERROR, "worker %s: %s", wk->id, trainer_backend_error(wk->be));
            return ISO_ERROR;
        }
        if (!trainer_worker_finite_all(wk->g, np, *loss))
            return ISO_DIVERGED;
    }
    atomic_fetch_add(&p->poisoned, n - kept);
    if (p->m_poison != NULL)
        fr_series_add(p->m_poison, (double)(n - kept));
    quarantine(wk, b, dropped);
    fr_log(FR_LOG_WARN,
           "worker %s: %zu of %zu samples gave a non-finite loss or gradient: dropped, the "
           "other %zu learned",
           wk->id, n - kept, n, kept);
    return (int64_t)kept;
}
