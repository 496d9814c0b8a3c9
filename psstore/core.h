/*
 * core.h - the Redis-free core of the parameter store (fr_psstore_core):
 * the update math, optimizers and the staleness-aware controller of
 * docs/design.md "Staleness and the controller", the offset interval
 * arithmetic of docs/design.md "Offsets", and the replay request language
 * of docs/design.md "Replay". Pure functions over plain memory: no Redis,
 * so the compute core builds with it. psstore/psstore.h includes it and
 * adds the Redis-backed store.
 *
 * Threads: the functions are reentrant; a psstore_ctl_t belongs to one
 * thread at a time (the applier of a shard), and a
 * psstore_partition_offsets_t or a psstore_replay_t to its caller.
 */
#ifndef FRESHET_PSSTORE_CORE_H
#define FRESHET_PSSTORE_CORE_H

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

/* ------------------------------------------------------------------------
 * Offsets: per partition a watermark (every position below it applied or
 * dropped) and the applied half-open intervals [from, to) above it, kept
 * sorted, disjoint and non-adjacent (adjacent ones merge). Pure functions.
 * ---------------------------------------------------------------------- */
typedef struct psstore_span {
    int64_t from, to; /* [from, to), from < to */
} psstore_span_t;

typedef struct psstore_partition_offsets {
    int64_t watermark;
    int64_t generation;    /* replay generation of the last rewrite (0: none) */
    psstore_span_t *spans; /* above the watermark; malloc'ed, may be NULL */
    size_t nspans, cap;
} psstore_partition_offsets_t;

void psstore_poff_init(psstore_partition_offsets_t *po, int64_t watermark);
void psstore_poff_fini(psstore_partition_offsets_t *po);
/* Nonzero when any position of [from, to) is already applied (below the
 * watermark or inside a span): rule 1's test. */
int psstore_poff_overlaps(const psstore_partition_offsets_t *po, int64_t from, int64_t to);
/* Marks [from, to) applied (or dropped) and advances the watermark over
 * every span that now starts at it. The caller has checked overlaps. */
fr_err_t psstore_poff_mark(psstore_partition_offsets_t *po, int64_t from, int64_t to);
/* Replay: watermark = target and every span cleared (spans below a target
 * above the watermark are absorbed by it: their positions count as
 * applied). */
void psstore_poff_rewind(psstore_partition_offsets_t *po, int64_t target);
/* Text form stored in the offsets hash: "W" or "W;a-b,c-d", followed by
 * "@G" when the replay generation G is not 0. */
fr_err_t psstore_poff_format(const psstore_partition_offsets_t *po, char **out, size_t *len);
fr_err_t psstore_poff_parse(psstore_partition_offsets_t *po, const char *text, size_t len,
                            char *errstr, size_t size);

/* ------------------------------------------------------------------------
 * Replay requests (replayspec.c): an operator's rewind with the verbs of
 * kafka-consumer-groups --reset-offsets, kept symbolically in the store
 * (psstore_request_replay) and resolved per partition against Kafka by
 * the consumer that owns it (ingest_resolver_target; docs/design.md
 * "Replay"). Pure: no Kafka, no Redis.
 * ---------------------------------------------------------------------- */
#define PSSTORE_TOPIC_MAX 249 /* Kafka's longest topic name (INGEST_TOPIC_MAX) */

typedef enum psstore_replay_kind {
    PSSTORE_REPLAY_EARLIEST = 0, /* the log start                                   */
    PSSTORE_REPLAY_LATEST = 1,   /* the log end                                     */
    PSSTORE_REPLAY_OFFSET = 2,   /* the listed partitions to the listed offsets     */
    PSSTORE_REPLAY_DATETIME = 3, /* the first record with timestamp >= at_ms        */
    PSSTORE_REPLAY_SHIFT = 4,    /* the store's watermark + shift (may be negative) */
} psstore_replay_kind_t;

#define PSSTORE_REPLAY_MAX_PARTS 1024
/* A stored text is shorter than this (psstore_request_replay). */
#define PSSTORE_REPLAY_SPEC_MAX 32768

typedef struct psstore_replay {
    psstore_replay_kind_t kind;
    int64_t at_ms;                     /* DATETIME: unix milliseconds           */
    int64_t shift;                     /* SHIFT                                  */
    char topic[PSSTORE_TOPIC_MAX + 1]; /* "" = every topic of the model          */
    size_t nparts;                     /* OFFSET: the listed partitions ...      */
    struct {
        int32_t partition;
        int64_t offset;
    } parts[PSSTORE_REPLAY_MAX_PARTS]; /* ... in the order given, each once      */
} psstore_replay_t;

/* Builds r from one command-line verb and its argument (topic left ""):
 * "to-earliest" and "to-latest" (arg NULL), "to-offset" "P:O[,P:O...]",
 * "to-datetime" ISO 8601 "YYYY-MM-DDTHH:MM:SS[.fff][Z|+HH:MM|-HH:MM]" (no
 * zone: UTC), "by-duration" "PnDTnHnMnS" (any part may be absent, seconds
 * may have a fraction; the target is now_ms minus the duration), "shift-by"
 * N (a signed integer). FR_ERR_INVAL with errstr naming the verb and what is
 * wrong. */
fr_err_t psstore_replay_from_verb(psstore_replay_t *r, const char *verb, const char *arg,
                                  int64_t now_ms, char *errstr, size_t size);
/* The stored text: "earliest", "latest", "offset:P=O,P=O", "datetime:MS" or
 * "shift:N", followed by " topic=T" when a topic is set. FR_ERR_RANGE when
 * it does not fit in size bytes, FR_ERR_INVAL for a request the parser
 * would refuse (times outside the years 0000-9999, a bad topic, an empty
 * or repeated OFFSET list). */
fr_err_t psstore_replay_format(const psstore_replay_t *r, char *buf, size_t size);
/* Parses the stored text (len bytes, need not be NUL-terminated) back into
 * r. FR_ERR_INVAL with errstr on anything psstore_replay_format would not
 * write. */
fr_err_t psstore_replay_parse(psstore_replay_t *r, const char *text, size_t len, char *errstr,
                              size_t size);
/* Nonzero when r moves the partition: its topic matches (or r names none)
 * and, for OFFSET, the partition is listed (*offset then receives its
 * offset; offset may be NULL). */
int psstore_replay_applies(const psstore_replay_t *r, const char *topic, int32_t partition,
                           int64_t *offset);
/* A one-line description of the target for plans: "earliest", "latest",
 * "offset 42", "first record at or after 2026-11-29T20:00:00.000Z" or
 * "watermark - 100". */
void psstore_replay_describe(const psstore_replay_t *r, int32_t partition, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_CORE_H */
