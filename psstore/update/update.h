/*
 * update.h - the update math of the parameter store, with no Redis
 * (fr_update): the optimizers, the served average, and the staleness-aware
 * controller of docs/design.md "Staleness and the controller". Pure
 * functions over plain memory, so the compute core builds with it; the
 * applier (psstore/applier/) runs them on the store's weights.
 *
 * Threads: the functions are reentrant; a psstore_ctl_t belongs to one
 * thread at a time (the applier of a shard).
 */
#ifndef FRESHET_PSSTORE_UPDATE_H
#define FRESHET_PSSTORE_UPDATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Optimizers, with PyTorch's semantics so results can be checked against it.
 * ---------------------------------------------------------------------- */
typedef enum psstore_optim {
    PSSTORE_OPTIM_SGD = 0,      /* w -= lr * g                                   */
    PSSTORE_OPTIM_MOMENTUM = 1, /* v = mu * v + g; w -= lr * v (torch.optim.SGD,
                                   no dampening, no Nesterov; v starts at 0)     */
    PSSTORE_OPTIM_ADAGRAD = 2,  /* s += g * g; w -= lr * g / (sqrt(s) + 1e-10)
                                   (torch.optim.Adagrad; s starts at 0)          */
} psstore_optim_t;

/* Parses "sgd", "momentum" or "adagrad"; FR_ERR_INVAL otherwise. */
fr_err_t psstore_optim_parse(const char *name, psstore_optim_t *optim);
const char *psstore_optim_name(psstore_optim_t optim);

/* Floats of optimizer state for n parameters: 0 for sgd, n otherwise. The
 * state starts zeroed. */
size_t psstore_optim_state_len(psstore_optim_t optim, size_t n);

/* One optimizer step in place: w[n] and state[state_len] are updated from
 * g[n]. momentum is used by PSSTORE_OPTIM_MOMENTUM only. Cannot fail. */
void psstore_optim_step(psstore_optim_t optim, float *w, float *state, const float *g, size_t n,
                        float lr, float momentum);

/* The served average (docs/design.md "The served average"): the weights a
 * model serves are an exponential moving average of its training weights,
 * taken after every update. The weight of the new weights after an update
 * of n samples, seen counting the samples averaged so far, these
 * included: 1 - exp(-n / h) with h = min(horizon, seen / 10), the last
 * tenth of what was seen while that is shorter than the horizon; 1 when h
 * is 0 (the average starts at the weights), 0 when n is. */
double psstore_average_weight(int64_t horizon, int64_t seen, int64_t n);
/* avg[i] += a * (w[i] - avg[i]) for i < n. */
void psstore_average_step(float *avg, const float *w, size_t n, float a);

/* ------------------------------------------------------------------------
 * The controller: turns one gradient computed on version v into an update
 * of the weights at version V (staleness tau = V - v), in the order of docs/design.md "Staleness
 * and the controller":
 *   1. reject non-finite gradients;
 *   2. clip by global L2 norm (clip_norm > 0);
 *   3. drop when tau > max_staleness (max_staleness > 0);
 *   4. delay compensation (dc_lambda > 0), constant or adaptive, from a ring
 *      of the last dc_ring versions of the weights;
 *   5. lr_eff = lr(t) * s(tau) by policy, with linear warm-up;
 *   6. the optimizer step.
 * ---------------------------------------------------------------------- */
typedef enum psstore_policy {
    PSSTORE_POLICY_CONSTANT = 0, /* s = 1                                       */
    PSSTORE_POLICY_INVERSE = 1,  /* s = 1 / max(1, tau)                          */
    PSSTORE_POLICY_DELAY = 2,    /* s = n / max(n, tau), n = concurrent pushers  */
    PSSTORE_POLICY_ADAPTIVE = 3, /* as delay, n = max(1, p50(tau) + 1) over the
                                    last 1000 applied gradients (the pusher
                                    count until 100 have been seen)            */
} psstore_policy_t;

fr_err_t psstore_policy_parse(const char *name, psstore_policy_t *policy);
const char *psstore_policy_name(psstore_policy_t policy);

typedef struct psstore_ctl_conf {
    double lr; /* base learning rate (> 0)                        */
    psstore_policy_t policy;
    int64_t warmup;        /* versions of linear warm-up; 0 = none            */
    int64_t max_staleness; /* 0 = unbounded                                   */
    double clip_norm;      /* 0 = off                                         */
    double dc_lambda;      /* 0 = no delay compensation                       */
    int dc_adaptive;       /* adaptive lambda_j = dc_lambda / sqrt(ms_j + 1e-7) */
    double dc_momentum;    /* m of the adaptive mean square (0.95)            */
    int dc_ring;           /* versions of weights kept for compensation       */
    psstore_optim_t optim;
    double momentum; /* mu of PSSTORE_OPTIM_MOMENTUM                    */
    int64_t average; /* samples the served average spans; 0 = off      */
} psstore_ctl_conf_t;

/* The defaults of [controller] (docs/operations.md "Configuration"), read from
 * the config schema (fr_config_default), and dc_momentum 0.95, which has no key. */
void psstore_ctl_conf_init(psstore_ctl_conf_t *conf);

typedef enum psstore_outcome {
    PSSTORE_APPLY = 0,
    PSSTORE_DROP_NONFINITE = 1, /* the gradient had a NaN or an infinity */
    PSSTORE_DROP_STALENESS = 2, /* tau > max_staleness                   */
} psstore_outcome_t;

/* Reason names for metrics labels: "applied", "nonfinite", "staleness". */
const char *psstore_outcome_name(psstore_outcome_t outcome);

/* What the controller decided for one gradient, for metrics and the
 * versions stream. tau and norm are always filled (norm is NaN or +Inf for a
 * non-finite gradient); on a drop, n_eff, scale and lr_eff are 0. n_eff is 0
 * for the constant and inverse policies, which have no n. */
typedef struct psstore_decision {
    psstore_outcome_t outcome;
    int64_t tau;   /* staleness                                   */
    double norm;   /* L2 norm of the gradient before clipping      */
    int clipped;   /* 1 when clipping scaled the gradient          */
    int dc;        /* 1 compensated, 0 off or tau 0, -1 v left the ring */
    double n_eff;  /* the n of the delay/adaptive policies         */
    double scale;  /* s(tau)                                       */
    double lr_eff; /* lr(t) * s(tau)                               */
} psstore_decision_t;

typedef struct psstore_ctl psstore_ctl_t;

/* A controller for a shard of n parameters; conf is copied. NULL with errstr
 * on a bad conf or out of memory. Caller frees with psstore_ctl_destroy(). */
psstore_ctl_t *psstore_ctl_new(const psstore_ctl_conf_t *conf, size_t n, char *errstr, size_t size);
void psstore_ctl_destroy(psstore_ctl_t *ctl);

/* Forgets the weight ring, the adaptive mean square and the staleness
 * window: called when the epoch changes (new lineage of weights). */
void psstore_ctl_reset(psstore_ctl_t *ctl);

/* Records w[n] as the weights of version (after an apply, at start-up and
 * after a reset), for delay compensation. Cheap when compensation is off. */
void psstore_ctl_record(psstore_ctl_t *ctl, int64_t version, const float *w);

/* Steps 1-5 for gradient g[n] computed on version_read while the store is at
 * version_now with weights w_now[n] (may be NULL when compensation is off);
 * npushers is the number of concurrent pushers (>= 1). g is modified in
 * place (clipping, compensation). Fills *d and returns its outcome; on
 * PSSTORE_APPLY the staleness enters the adaptive window, after this
 * gradient's own decision. */
psstore_outcome_t psstore_ctl_prepare(psstore_ctl_t *ctl, float *g, int64_t version_now,
                                      int64_t version_read, const float *w_now, int npushers,
                                      psstore_decision_t *d);

/* As psstore_ctl_prepare for g, a shard's slice of a gradient whose whole
 * L2 norm is whole_norm (NaN or infinite when the gradient was not
 * finite; 0: the slice's own, as psstore_ctl_prepare): rejection and
 * clipping follow the whole gradient, so every shard decides alike
 * (docs/design.md "Shards"). */
psstore_outcome_t psstore_ctl_prepare_whole(psstore_ctl_t *ctl, float *g, int64_t version_now,
                                            int64_t version_read, const float *w_now, int npushers,
                                            double whole_norm, psstore_decision_t *d);

/* The sum of squares of g[n] in double: non-finite when an entry is NaN or
 * infinite (or above 1.8e19 in magnitude), so one pass is both the
 * controller's finiteness check and its norm. The order is fixed: in each
 * block of 4096 entries, float lane k of 16 sums the squares of entries
 * i + k in order, the block's last (its length mod 16) in double, then the
 * 16 lanes in order, and the blocks in double. The same function on the
 * same floats gives the same bits, which lets a worker compute it for the
 * applier (psstore_grad_t.sq). */
double psstore_sum_squares(const float *g, size_t n);

/* As psstore_ctl_prepare for g, whose sum of squares sq the caller already
 * has from psstore_sum_squares over exactly these n floats (a gradient's
 * worker computed it while the gradient was in its cache): no pass over g
 * before the step, with the decision psstore_ctl_prepare would take. */
psstore_outcome_t psstore_ctl_prepare_sq(psstore_ctl_t *ctl, float *g, int64_t version_now,
                                         int64_t version_read, const float *w_now, int npushers,
                                         double sq, psstore_decision_t *d);

/* Step 6: the optimizer step w -= ... with d->lr_eff; state has
 * psstore_optim_state_len() floats. Does nothing unless d->outcome is
 * PSSTORE_APPLY. */
void psstore_ctl_apply(const psstore_ctl_t *ctl, float *w, float *state, const float *g,
                       const psstore_decision_t *d);

/* Counters since creation. */
typedef struct psstore_ctl_stats {
    uint64_t applied;
    uint64_t dropped_nonfinite;
    uint64_t dropped_staleness;
    uint64_t clipped;
    uint64_t dc_applied;
    uint64_t dc_missed; /* v had left the ring: compensation skipped */
} psstore_ctl_stats_t;

void psstore_ctl_stats(const psstore_ctl_t *ctl, psstore_ctl_stats_t *stats);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_UPDATE_H */
