/*
 * status.h - what operators, serve and the dashboard read of a model
 * (status.c): the versions, drops and evals streams, retained snapshots,
 * membership, per-partition watermarks and log ends, and the wait for a
 * new version.
 *
 * Threads: each call uses the connection it is given, which belongs to
 * one thread.
 */
#ifndef FRESHET_PSSTORE_STATUS_H
#define FRESHET_PSSTORE_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "psstore/store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Status for operators and serve (status.c): the versions, drops and evals
 * streams, retained snapshots, membership, per-partition watermarks and
 * log ends. Reads, except the two reports other roles add: consumers'
 * log ends (freshet:{m}:logend) and holdout evaluations (freshet:{m}:evals).
 * ---------------------------------------------------------------------- */
#define PSSTORE_STREAM_ID_MAX 64

/* One entry of freshet:{m}:versions: an applied update (or a rollback). */
typedef struct psstore_version_entry {
    int64_t version;
    uint64_t epoch;
    int64_t tau;           /* staleness (a round: of its oldest gradient)       */
    double lr_eff;         /* effective learning rate                           */
    double loss;           /* mean training loss of the batch (or round)        */
    int64_t n;             /* samples                                           */
    int64_t k;             /* gradients averaged (1 outside rounds)             */
    int64_t t_ms;          /* unix ms of the apply                              */
    int64_t ts_min_ms;     /* Kafka timestamps of the oldest and newest sample  */
    int64_t ts_max_ms;     /* (0 when unknown)                                  */
    int64_t rollback_from; /* the snapshot restored, -1 for an update       */
    char worker[128];      /* the pusher ("group G" for a round)                */
} psstore_version_entry_t;

/* The newest max entries, newest first, into out[max]. */
fr_err_t psstore_versions_tail(psstore_conn_t *c, const char *model, size_t max,
                               psstore_version_entry_t *out, size_t *n);

/* Why the applier did not apply a gradient; the names (psstore_drop_name)
 * are the drops stream's reasons and the metrics' reason labels. */
typedef enum psstore_drop {
    PSSTORE_DROPPED_EPOCH = 0,     /* "epoch": computed on another epoch      */
    PSSTORE_DROPPED_REPLAY = 1,    /* "replay": older replay generation       */
    PSSTORE_DROPPED_DUPLICATE = 2, /* "duplicate": a position already applied */
    PSSTORE_DROPPED_MALFORMED = 3, /* "malformed": bad fields or length       */
    PSSTORE_DROPPED_NONFINITE = 4, /* "nonfinite"                             */
    PSSTORE_DROPPED_STALENESS = 5, /* "staleness": tau > max_staleness        */
    PSSTORE_DROPPED_EMPTY = 6,     /* "empty": an n = 0 batch (its reason)    */
    PSSTORE_DROPPED_STOPPED = 7,   /* "stopped": the divergence guard         */
    PSSTORE_DROPPED_BACKUP = 8,    /* "backup": late for its round (backup)   */
} psstore_drop_t;
#define PSSTORE_NDROP 9
const char *psstore_drop_name(psstore_drop_t d);

/* One entry of freshet:{m}:drops: a gradient the applier did not apply. */
typedef struct psstore_drop_entry {
    char worker[128];
    char reason[16]; /* psstore_drop_name() */
    int64_t n;       /* samples it held     */
    int64_t t_ms;
} psstore_drop_entry_t;

fr_err_t psstore_drops_tail(psstore_conn_t *c, const char *model, size_t max,
                            psstore_drop_entry_t *out, size_t *n);

/* Holdout evaluations: appended by the evaluator (MAXLEN ~ 1000); for a
 * sparse model, its progressive validation windows: each record scored
 * before the model learned from it (docs/design.md "Sparse models"). */
typedef struct psstore_eval_entry {
    int64_t version;
    double accuracy, loss; /* accuracy: NAN for a progressive window */
    double auc;            /* a progressive window's AUC; NAN for a holdout */
    double floor;          /* ... its Bayes floor; NAN when unknown         */
    int64_t n;             /* a progressive window's records; 0 for a holdout */
    int64_t t_ms;
} psstore_eval_entry_t;

fr_err_t psstore_eval_report(psstore_conn_t *c, const char *model, int64_t version, double accuracy,
                             double loss);
/* A progressive window of n records ending at version: their mean logloss,
 * AUC (NAN when the window held one class only) and Bayes floor (NAN when
 * the records carried no planted probability); a NAN is not written. */
fr_err_t psstore_eval_report_progressive(psstore_conn_t *c, const char *model, int64_t version,
                                         double logloss, double auc, double floor, size_t n);
fr_err_t psstore_evals_tail(psstore_conn_t *c, const char *model, size_t max,
                            psstore_eval_entry_t *out, size_t *n);

/* Retained snapshots (freshet:{m}:snaps): the newest max, oldest first. */
typedef struct psstore_snapshot_info {
    int64_t version;
    int64_t time_ms; /* unix ms it was taken */
} psstore_snapshot_info_t;

fr_err_t psstore_snapshots_list(psstore_conn_t *c, const char *model, psstore_snapshot_info_t *out,
                                size_t max, size_t *n);

/* psstore_members_read over a plain connection. */
fr_err_t psstore_members_list(psstore_conn_t *c, const char *model, psstore_member_t **members,
                              size_t *n, size_t *cap);

/* A consumer's view of a partition's log end and of the store's watermark
 * at the same tick, reported so that processes that do not talk to Kafka
 * can show the lag it measured. */
typedef struct psstore_logend {
    const char *topic;
    int32_t partition;
    int64_t log_end;
    int64_t watermark;
} psstore_logend_t;

fr_err_t psstore_logend_report(psstore_conn_t *c, const char *model, const psstore_logend_t *ends,
                               size_t n);

/* Every partition the store has a watermark or a reported log end for,
 * sorted by topic and partition, into *parts (grown, *cap its capacity;
 * caller frees). */
typedef struct psstore_partition_status {
    char topic[256];
    int32_t partition;
    int64_t watermark;  /* 0 when the store has none yet             */
    size_t spans;       /* applied intervals above it                */
    int64_t log_end;    /* -1 when no consumer reported one           */
    int64_t lag;        /* log end - the watermark of that report (-1) */
    int64_t log_end_ms; /* unix ms of that report                     */
} psstore_partition_status_t;

fr_err_t psstore_partitions_read(psstore_conn_t *c, const char *model,
                                 psstore_partition_status_t **parts, size_t *n, size_t *cap);

/* Following new versions: the id of the newest versions entry ("0-0" when
 * none) into id[PSSTORE_STREAM_ID_MAX]; and a wait of up to block_ms until
 * any of the n models' streams has an entry after ids[i] (XREAD BLOCK).
 * moved[i] is set for those, whose ids[i] then jump to the newest entry.
 * The connection's timeout must exceed block_ms. */
fr_err_t psstore_versions_last_id(psstore_conn_t *c, const char *model, char *id);
fr_err_t psstore_versions_wait(psstore_conn_t *c, const char *const *models, size_t n,
                               char (*ids)[PSSTORE_STREAM_ID_MAX], int block_ms, int *moved);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_STATUS_H */
