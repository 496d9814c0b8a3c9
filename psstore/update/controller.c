/*
 * controller.c - the staleness-aware update controller of docs/design.md
 * "Staleness and the controller": non-finite rejection, clipping by global
 * L2 norm, the staleness bound, delay compensation (DC-ASGD, constant or
 * adaptive) and the learning-rate policies with linear warm-up.
 *
 * A controller belongs to one thread at a time (the applier of a shard).
 * Everything it needs is allocated once in psstore_ctl_new(): the weight
 * ring and the mean square of compensation only when compensation is on,
 * the staleness histogram only for the adaptive policy.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/update/update.h"

/* The adaptive policy's window of applied staleness values. */
#define TAU_WINDOW 1000
/* Below this many samples the adaptive policy uses the pusher count. */
#define TAU_MIN_SAMPLES 100
/* Staleness values are clipped to [0, TAU_BUCKETS - 1] in the histogram. A
 * power of two, for the Fenwick tree's descent. */
#define TAU_BUCKETS 65536
/* The epsilon of the adaptive compensation, inside the square root. */
#define DC_EPS 1e-7f

struct psstore_ctl {
    psstore_ctl_conf_t conf;
    size_t n;

    /* Delay compensation (dc_lambda > 0): ring of dc_ring weight vectors,
     * slot i holds version ring_version[i] for i < ring_used. */
    float *ring;           /* dc_ring * n floats, slot-major */
    int64_t *ring_version; /* dc_ring */
    int ring_used;
    int ring_next; /* the slot the next new version overwrites */
    float *ms;     /* n floats, the adaptive mean square (dc_adaptive) */

    /* Adaptive policy: the last TAU_WINDOW applied staleness values (clipped)
     * in arrival order, and a Fenwick tree of their counts per value, so
     * that inserting, evicting and finding the median are O(log buckets).
     * Counts never exceed TAU_WINDOW, so 16 bits suffice. */
    uint16_t *fen; /* TAU_BUCKETS + 1 nodes, 1-based; NULL unless adaptive */
    uint16_t window[TAU_WINDOW];
    size_t win_count;
    size_t win_next;

    psstore_ctl_stats_t stats;
};

/* ------------------------------------------------------------------------
 * Names
 * ---------------------------------------------------------------------- */
static const char *const policy_names[] = {"constant", "inverse", "delay", "adaptive"};

fr_err_t psstore_policy_parse(const char *name, psstore_policy_t *policy)
{
    if (name == NULL || policy == NULL)
        return FR_ERR_INVAL;
    for (size_t i = 0; i < sizeof(policy_names) / sizeof(policy_names[0]); i++) {
        if (strcmp(name, policy_names[i]) == 0) {
            *policy = (psstore_policy_t)i;
            return FR_OK;
        }
    }
    return FR_ERR_INVAL;
}

const char *psstore_policy_name(psstore_policy_t policy)
{
    switch (policy) {
    case PSSTORE_POLICY_CONSTANT:
    case PSSTORE_POLICY_INVERSE:
    case PSSTORE_POLICY_DELAY:
    case PSSTORE_POLICY_ADAPTIVE: return policy_names[policy];
    }
    return "unknown";
}

const char *psstore_outcome_name(psstore_outcome_t outcome)
{
    switch (outcome) {
    case PSSTORE_APPLY: return "applied";
    case PSSTORE_DROP_NONFINITE: return "nonfinite";
    case PSSTORE_DROP_STALENESS: return "staleness";
    }
    return "unknown";
}

/* ------------------------------------------------------------------------
 * Configuration and lifetime
 * ---------------------------------------------------------------------- */
void psstore_ctl_conf_init(psstore_ctl_conf_t *conf)
{
    memset(conf, 0, sizeof(*conf));
    conf->lr = fr_config_default_double("controller", "lr");
    /* the schema accepts the names these parsers know; were one not to
     * parse, the zeroed field is constant, and sgd below */
    psstore_policy_parse(fr_config_default("controller", "policy"), &conf->policy);
    conf->warmup = fr_config_default_int("controller", "warmup");
    conf->max_staleness = fr_config_default_int("controller", "max_staleness");
    conf->clip_norm = fr_config_default_double("controller", "clip_norm");
    conf->dc_lambda = fr_config_default_double("controller", "dc_lambda");
    conf->dc_adaptive = fr_config_default_bool("controller", "dc_adaptive");
    conf->dc_momentum = 0.95; /* no key: written here only */
    conf->dc_ring = (int)fr_config_default_int("controller", "dc_ring");
    psstore_optim_parse(fr_config_default("controller", "optimizer"), &conf->optim);
    conf->momentum = fr_config_default_double("controller", "momentum");
    conf->average = fr_config_default_int("controller", "average");
}

/*
 * Checks every field of conf for a shard of n parameters. Returns FR_OK, or
 * FR_ERR_INVAL with errstr naming the field and the value it got.
 */
static fr_err_t conf_validate(const psstore_ctl_conf_t *conf, size_t n, char *errstr, size_t size)
{
    if (n == 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "controller: n must be >= 1, got 0");
    if (!(conf->lr > 0) || !isfinite(conf->lr))
        return fr_errorf(FR_ERR_INVAL, errstr, size, "controller: lr must be > 0, got %g",
                         conf->lr);
    if ((unsigned)conf->policy > PSSTORE_POLICY_ADAPTIVE)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "controller: policy must be constant, inverse, delay or adaptive, "
                         "got %d",
                         (int)conf->policy);
    if ((unsigned)conf->optim > PSSTORE_OPTIM_ADAGRAD)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "controller: optim must be sgd, momentum or adagrad, got %d",
                         (int)conf->optim);
    if (conf->warmup < 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "controller: warmup must be >= 0, got %lld",
                         (long long)conf->warmup);
    if (conf->average < 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "controller: average must be >= 0, got %lld",
                         (long long)conf->average);
    if (conf->max_staleness < 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "controller: max_staleness must be >= 0, got %lld",
                         (long long)conf->max_staleness);
    if (!(conf->clip_norm >= 0) || !isfinite(conf->clip_norm))
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "controller: clip_norm must be >= 0 and finite, got %g", conf->clip_norm);
    if (!(conf->dc_lambda >= 0) || !isfinite(conf->dc_lambda))
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "controller: dc_lambda must be >= 0 and finite, got %g", conf->dc_lambda);
    if (!(conf->dc_momentum >= 0 && conf->dc_momentum < 1))
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "controller: dc_momentum must be in [0, 1), got %g", conf->dc_momentum);
    if (!(conf->momentum >= 0 && conf->momentum < 1))
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "controller: momentum must be in [0, 1), got %g", conf->momentum);
    if (conf->dc_lambda > 0 && conf->dc_ring < 1)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "controller: dc_ring must be >= 1 when dc_lambda > 0, got %d",
                         conf->dc_ring);
    if (conf->dc_lambda > 0 && n > SIZE_MAX / sizeof(float) / (size_t)conf->dc_ring)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "controller: dc_ring %d times %zu parameters is too large", conf->dc_ring,
                         n);
    return FR_OK;
}

/*
 * Validates conf, copies it and allocates, once, everything the controller
 * will use: the weight ring and the mean square only when dc_lambda > 0
 * (and the mean square only when adaptive), the staleness histogram only
 * for the adaptive policy. NULL with errstr on a bad conf or out of memory.
 */
psstore_ctl_t *psstore_ctl_new(const psstore_ctl_conf_t *conf, size_t n, char *errstr, size_t size)
{
    psstore_ctl_t *ctl = NULL;

    if (conf == NULL) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "controller: no configuration");
        return NULL;
    }
    if (conf_validate(conf, n, errstr, size) != FR_OK)
        return NULL;
    ctl = calloc(1, sizeof(*ctl));
    if (ctl == NULL)
        goto err;
    ctl->conf = *conf;
    ctl->n = n;
    if (conf->dc_lambda > 0) {
        ctl->ring = malloc((size_t)conf->dc_ring * n * sizeof(float));
        ctl->ring_version = calloc((size_t)conf->dc_ring, sizeof(int64_t));
        if (ctl->ring == NULL || ctl->ring_version == NULL)
            goto err;
        if (conf->dc_adaptive) {
            ctl->ms = calloc(n, sizeof(float));
            if (ctl->ms == NULL)
                goto err;
        }
    }
    if (conf->policy == PSSTORE_POLICY_ADAPTIVE) {
        ctl->fen = calloc(TAU_BUCKETS + 1, sizeof(uint16_t));
        if (ctl->fen == NULL)
            goto err;
    }
    return ctl;

err:
    psstore_ctl_destroy(ctl);
    fr_errorf(FR_ERR_NOMEM, errstr, size, "controller: out of memory for %zu parameters", n);
    return NULL;
}

void psstore_ctl_destroy(psstore_ctl_t *ctl)
{
    if (ctl == NULL)
        return;
    free(ctl->ring);
    free(ctl->ring_version);
    free(ctl->ms);
    free(ctl->fen);
    free(ctl);
}

/*
 * Forgets the weight ring, the mean square and the staleness window, for a
 * new epoch. The memory is kept for reuse; the counters are not reset (they
 * count since creation).
 */
void psstore_ctl_reset(psstore_ctl_t *ctl)
{
    ctl->ring_used = 0;
    ctl->ring_next = 0;
    if (ctl->ms != NULL)
        memset(ctl->ms, 0, ctl->n * sizeof(float));
    if (ctl->fen != NULL)
        memset(ctl->fen, 0, (TAU_BUCKETS + 1) * sizeof(uint16_t));
    ctl->win_count = 0;
    ctl->win_next = 0;
}

void psstore_ctl_stats(const psstore_ctl_t *ctl, psstore_ctl_stats_t *stats)
{
    *stats = ctl->stats;
}

/* ------------------------------------------------------------------------
 * The weight ring
 * ---------------------------------------------------------------------- */

/* The slot holding version, or -1 when it is not (or no longer) in the ring. */
static int ring_find(const psstore_ctl_t *ctl, int64_t version)
{
    for (int i = 0; i < ctl->ring_used; i++) {
        if (ctl->ring_version[i] == version)
            return i;
    }
    return -1;
}

/*
 * Copies w as the weights of version. A version already in the ring is
 * overwritten in place; a new one takes the slot of the oldest recorded, so
 * the ring keeps the dc_ring most recently recorded versions. Does nothing
 * when compensation is off.
 */
void psstore_ctl_record(psstore_ctl_t *ctl, int64_t version, const float *w)
{
    if (ctl->ring == NULL)
        return;
    int slot = ring_find(ctl, version);
    if (slot < 0) {
        slot = ctl->ring_next;
        ctl->ring_next = (ctl->ring_next + 1) % ctl->conf.dc_ring;
        if (ctl->ring_used < ctl->conf.dc_ring)
            ctl->ring_used++;
        ctl->ring_version[slot] = version;
    }
    memcpy(ctl->ring + (size_t)slot * ctl->n, w, ctl->n * sizeof(float));
}

/* ------------------------------------------------------------------------
 * The staleness window of the adaptive policy
 * ---------------------------------------------------------------------- */

/* Adds delta (+1 or -1, as a wrapping uint16 add) to the count of value. */
static void fen_add(uint16_t *fen, unsigned value, int delta)
{
    for (unsigned i = value + 1; i <= TAU_BUCKETS; i += i & (0u - i))
        fen[i] = (uint16_t)(fen[i] + delta);
}

/* The value at 0-based rank k among the counted values (k < total count). */
static unsigned fen_kth(const uint16_t *fen, unsigned k)
{
    unsigned pos = 0;
    for (unsigned step = TAU_BUCKETS; step > 0; step >>= 1) {
        if (pos + step <= TAU_BUCKETS && fen[pos + step] <= k) {
            pos += step;
            k -= fen[pos];
        }
    }
    return pos; /* node pos + 1 holds value pos */
}

/* Appends an applied staleness to the window, evicting the oldest of a full
 * window. Only called when the histogram exists (policy adaptive). */
static void window_push(psstore_ctl_t *ctl, int64_t tau)
{
    uint16_t value = (uint16_t)(tau > TAU_BUCKETS - 1 ? TAU_BUCKETS - 1 : tau);

    if (ctl->win_count == TAU_WINDOW)
        fen_add(ctl->fen, ctl->window[ctl->win_next], -1);
    else
        ctl->win_count++;
    ctl->window[ctl->win_next] = value;
    fen_add(ctl->fen, value, +1);
    ctl->win_next = (ctl->win_next + 1) % TAU_WINDOW;
}

/* The lower median of the window: the element at index (count - 1) / 2 of
 * the sorted window. The window is not empty. */
static unsigned window_p50(const psstore_ctl_t *ctl)
{
    return fen_kth(ctl->fen, (unsigned)((ctl->win_count - 1) / 2));
}

/* ------------------------------------------------------------------------
 * Steps 1-5
 * ---------------------------------------------------------------------- */

/*
 * Sum of squares (see update.h): 16 float lanes (vectorisable; C forbids
 * the compiler to reassociate one chain of additions itself) over blocks
 * of 4096, the block sums added in double, so the error stays near float's
 * epsilon. A NaN or an infinity anywhere makes the sum non-finite, so this
 * one pass is both the finiteness check and the norm. An entry above
 * 1.8e19 in magnitude overflows its float lane: such a gradient counts as
 * non-finite too.
 */
FR_VECTOR_LOOP double psstore_sum_squares(const float *restrict g, size_t n)
{
    /* the 16 lanes as two vectors of 8: written as a loop over an array
     * of 16, GCC vectorised the outer loop with permutes instead, 1.3
     * cycles a float; lane k still sums entries i + k in order, so the
     * bits are those of that loop */
    typedef float f32x8 __attribute__((vector_size(32)));
    double total = 0;
    size_t i = 0;
    while (i < n) {
        size_t end = n - i > 4096 ? i + 4096 : n;
        f32x8 lo = {0}, hi = {0};
        for (; i + 16 <= end; i += 16) {
            f32x8 a, b;
            memcpy(&a, g + i, sizeof(a));
            memcpy(&b, g + i + 8, sizeof(b));
            lo += a * a;
            hi += b * b;
        }
        double block = 0;
        for (; i < end; i++)
            block += (double)g[i] * (double)g[i];
        for (int k = 0; k < 8; k++)
            block += lo[k];
        for (int k = 0; k < 8; k++)
            block += hi[k];
        total += block;
    }
    return total;
}

static void scale_in_place(float *restrict g, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        g[i] *= s;
}

/* ms = m * ms + (1 - m) * g * g, per coordinate. */
static void ms_update(float *restrict ms, const float *restrict g, size_t n, float m)
{
    float one_m = 1.0f - m;
    for (size_t i = 0; i < n; i++)
        ms[i] = m * ms[i] + one_m * g[i] * g[i];
}

/* g += lambda * g * g * (w_now - w_v) with a constant lambda. */
static void dc_constant(float *restrict g, const float *restrict w_now, const float *restrict w_v,
                        size_t n, float lambda)
{
    for (size_t i = 0; i < n; i++)
        g[i] += lambda * g[i] * g[i] * (w_now[i] - w_v[i]);
}

/* g += lambda_j * g * g * (w_now - w_v), lambda_j = dc_lambda / sqrt(ms_j + eps). */
static void dc_adaptive(float *restrict g, const float *restrict w_now, const float *restrict w_v,
                        const float *restrict ms, size_t n, float dc_lambda)
{
    for (size_t i = 0; i < n; i++) {
        float lambda = dc_lambda / sqrtf(ms[i] + DC_EPS);
        g[i] += lambda * g[i] * g[i] * (w_now[i] - w_v[i]);
    }
}

/*
 * Step 4 on a gradient that will be applied: updates the adaptive mean
 * square (every applied gradient, also at tau 0, so that it tracks the
 * stream) and compensates g when tau > 0 and version_read is still in the
 * ring. Sets d->dc and the counters.
 */
static void compensate(psstore_ctl_t *ctl, float *g, int64_t version_read, const float *w_now,
                       psstore_decision_t *d)
{
    const psstore_ctl_conf_t *conf = &ctl->conf;

    d->dc = 0;
    if (ctl->ring == NULL)
        return;
    if (ctl->ms != NULL)
        ms_update(ctl->ms, g, ctl->n, (float)conf->dc_momentum);
    if (d->tau == 0)
        return;
    int slot = w_now != NULL ? ring_find(ctl, version_read) : -1;
    if (slot < 0) {
        d->dc = -1;
        ctl->stats.dc_missed++;
        return;
    }
    const float *w_v = ctl->ring + (size_t)slot * ctl->n;
    if (ctl->ms != NULL)
        dc_adaptive(g, w_now, w_v, ctl->ms, ctl->n, (float)conf->dc_lambda);
    else
        dc_constant(g, w_now, w_v, ctl->n, (float)conf->dc_lambda);
    d->dc = 1;
    ctl->stats.dc_applied++;
}

/*
 * Step 5: fills d->n_eff, d->scale and d->lr_eff for d->tau. n_eff is 0
 * for the policies that have no n (constant, inverse). The adaptive policy
 * reads the window of gradients applied before this one.
 */
static void policy_decide(const psstore_ctl_t *ctl, int64_t version_now, int npushers,
                          psstore_decision_t *d)
{
    const psstore_ctl_conf_t *conf = &ctl->conf;
    double tau = (double)d->tau;
    double n = npushers > 1 ? (double)npushers : 1.0;
    double s = 1.0;

    d->n_eff = 0.0;
    switch (conf->policy) {
    case PSSTORE_POLICY_CONSTANT: break;
    case PSSTORE_POLICY_INVERSE: s = 1.0 / (tau > 1.0 ? tau : 1.0); break;
    case PSSTORE_POLICY_ADAPTIVE:
        /* the median staleness seen, but never more than the pushers: what
         * concurrency explains keeps the full rate, a queue's staleness
         * (typical or not) is damped as the delay policy would */
        if (ctl->win_count >= TAU_MIN_SAMPLES && (double)window_p50(ctl) + 1.0 < n)
            n = (double)window_p50(ctl) + 1.0;
        /* fall through */
    case PSSTORE_POLICY_DELAY:
        d->n_eff = n;
        s = n / (tau > n ? tau : n);
        break;
    }

    double lr = conf->lr;
    if (conf->warmup > 0) {
        double t = version_now > 0 ? (double)version_now : 0.0;
        double f = (t + 1.0) / (double)conf->warmup;
        lr *= f < 1.0 ? f : 1.0;
    }
    d->scale = s;
    d->lr_eff = lr * s;
}

/*
 * Steps 1-5 for g[n] (n of the controller) in the order of docs/design.md "Staleness and the
 * controller". g is left untouched when it is non-finite; it is clipped (and maybe compensated) in
 * place otherwise, also when it is then dropped for staleness. w_now may be NULL when compensation
 * is off. Fills *d (norm is NaN or +Inf for a non-finite gradient; n_eff, scale, lr_eff are 0 on a
 * drop) and returns its outcome. Cannot fail.
 */
psstore_outcome_t psstore_ctl_prepare(psstore_ctl_t *ctl, float *g, int64_t version_now,
                                      int64_t version_read, const float *w_now, int npushers,
                                      psstore_decision_t *d)
{
    return psstore_ctl_prepare_whole(ctl, g, version_now, version_read, w_now, npushers, 0, d);
}

/* Steps 1-5 with sq, the sum of squares of g[n] (psstore_sum_squares). */
static psstore_outcome_t prepare(psstore_ctl_t *ctl, float *g, int64_t version_now,
                                 int64_t version_read, const float *w_now, int npushers,
                                 double whole_norm, double sq, psstore_decision_t *d)
{
    const psstore_ctl_conf_t *conf = &ctl->conf;

    memset(d, 0, sizeof(*d));
    /* A negative staleness is a caller bug; treat it as fresh. The
     * subtraction is done unsigned so that absurd versions cannot overflow. */
    if (version_now > version_read) {
        uint64_t tau = (uint64_t)version_now - (uint64_t)version_read;
        d->tau = tau > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)tau;
    }

    d->norm = sqrt(sq);
    if (whole_norm != 0 && isfinite(sq)) { /* a shard's slice: decide on the whole */
        d->norm = whole_norm;
        sq = whole_norm * whole_norm;
    }
    if (!isfinite(sq)) {
        d->outcome = PSSTORE_DROP_NONFINITE;
        ctl->stats.dropped_nonfinite++;
        return d->outcome;
    }

    if (conf->clip_norm > 0 && d->norm > conf->clip_norm) {
        scale_in_place(g, ctl->n, (float)(conf->clip_norm / d->norm));
        d->clipped = 1;
        ctl->stats.clipped++;
    }

    if (conf->max_staleness > 0 && d->tau > conf->max_staleness) {
        d->outcome = PSSTORE_DROP_STALENESS;
        ctl->stats.dropped_staleness++;
        return d->outcome;
    }

    compensate(ctl, g, version_read, w_now, d);
    policy_decide(ctl, version_now, npushers, d);

    d->outcome = PSSTORE_APPLY;
    if (ctl->fen != NULL)
        window_push(ctl, d->tau);
    ctl->stats.applied++;
    return d->outcome;
}

psstore_outcome_t psstore_ctl_prepare_whole(psstore_ctl_t *ctl, float *g, int64_t version_now,
                                            int64_t version_read, const float *w_now, int npushers,
                                            double whole_norm, psstore_decision_t *d)
{
    return prepare(ctl, g, version_now, version_read, w_now, npushers, whole_norm,
                   psstore_sum_squares(g, ctl->n), d);
}

psstore_outcome_t psstore_ctl_prepare_sq(psstore_ctl_t *ctl, float *g, int64_t version_now,
                                         int64_t version_read, const float *w_now, int npushers,
                                         double sq, psstore_decision_t *d)
{
    return prepare(ctl, g, version_now, version_read, w_now, npushers, 0, sq, d);
}

/* Step 6: the optimizer step with d->lr_eff. A decision other than
 * PSSTORE_APPLY is a caller bug; it leaves w and state untouched rather than
 * step with a gradient that was rejected. */
void psstore_ctl_apply(const psstore_ctl_t *ctl, float *w, float *state, const float *g,
                       const psstore_decision_t *d)
{
    if (d->outcome != PSSTORE_APPLY)
        return;
    psstore_optim_step(ctl->conf.optim, w, state, g, ctl->n, (float)d->lr_eff,
                       (float)ctl->conf.momentum);
}
