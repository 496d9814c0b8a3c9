/*
 * store.h - the Redis-backed store of a model (fr_store; docs/design.md
 * "Redis layout"): names and lifecycle, the weights as readers see them,
 * the offsets kept in the store for ingest, the quarantine, training modes
 * and members, operator requests and snapshots. Its status reads are in
 * psstore/store/status.h, its sparse rows in psstore/store/rows_sparse.h.
 * Everything here needs hiredis and is left out of FRESHET_CORE_ONLY
 * builds.
 *
 * Threads: each call uses the connection it is given, which belongs to
 * one thread.
 */
#ifndef FRESHET_PSSTORE_STORE_H
#define FRESHET_PSSTORE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "psstore/positions/positions.h"
#include "psstore/redis/redis.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Model lifecycle. Names match [A-Za-z0-9._-]{1,64}.
 * ---------------------------------------------------------------------- */
fr_err_t psstore_model_name_check(const char *name, char *errstr, size_t size);

typedef struct psstore_model_spec {
    const char *layers; /* "784-256-10", validated by the caller      */
    const char *loss;   /* "softmax", ...                             */
    size_t nparams;     /* floats in the weights                      */
    int shards;         /* 0 or 1: one shard; up to PSSTORE_SHARDS_MAX */
    const char *sparse; /* a sparse model: its table, "fields:F,buckets:2^B,dim:D"
                           (meta's `sparse`; its w the dense part: the biases
                           and the tower, then a float a shard past 0); else NULL */
} psstore_model_spec_t;

/* Creates model name with weights w[nparams] as version 0 of a fresh
 * epoch (meta, ver, w:0, empty opt:0). FR_ERR_EXISTS unless force, which
 * deletes the old model's keys first in the same transaction; FR_ERR_STATE
 * while an applier holds the lease. */
fr_err_t psstore_model_create(psstore_conn_t *c, const char *name, const psstore_model_spec_t *spec,
                              const float *w, int force);

typedef struct psstore_model_info {
    char name[65];
    char layers[256];
    char loss[16];
    uint64_t epoch;
    int64_t version;
    int shards;
    size_t bytes; /* bytes of weights (all shards)                */
    int64_t created_ms;
    char stopped[256];     /* divergence guard's reason, "" while running */
    char sparse[160];      /* a sparse model's table and row initialisation, else "" */
    char mode[16];         /* the training mode its applier last ran ("" before any) */
    char phase[16];        /* mode auto: its phase (psstore_phase_name), else "" */
    int64_t mode_switches; /* mode auto: phase switches of the current applier */
    size_t nsnaps;         /* retained snapshots ...                        */
    int64_t snaps[64];     /* ... their versions, oldest first (at most 64) */
    char node[300];        /* the Redis that answered: on a cluster, the master
                              serving the model ("host:port", or a socket) */
    int slot;              /* the model's Redis Cluster slot; -1 on one Redis */
    /* shards (docs/design.md "Shards"): version and epoch above are the sums
     * of the shards' */
    int64_t shard_versions[PSSTORE_SHARDS_MAX];
    size_t bounds[PSSTORE_SHARDS_MAX + 1]; /* shard k: floats [bounds[k], bounds[k + 1]) */
} psstore_model_info_t;

/* FR_ERR_NOTFOUND when there is no such model. */
fr_err_t psstore_model_info(psstore_conn_t *c, const char *name, psstore_model_info_t *info);
/* Model names (SCAN for freshet:{*}:meta), sorted; caller frees each name
 * and the array with free(). */
fr_err_t psstore_model_list(psstore_conn_t *c, char ***names, size_t *count);
/* Deletes every key of the model; FR_ERR_STATE while an applier holds the
 * lease (then ask it with psstore_request_delete). */
fr_err_t psstore_model_delete(psstore_conn_t *c, const char *name);
/* psstore_model_weights, with the watermark of every partition read in
 * the same transaction: *offsets is "topic/partition=watermark,..." (every
 * position below a watermark is in these weights; malloc'ed, caller
 * frees; "" when none). */
fr_err_t psstore_model_weights_offsets(psstore_conn_t *c, const char *name, float *w, size_t n,
                                       uint64_t *epoch, int64_t *version, char **offsets);
/* psstore_model_weights_offsets with, for a sharded model (docs/design.md
 * "Shards"), each shard's version as read: shard_versions[PSSTORE_SHARDS_MAX]
 * and *nshards (1 for a model of one shard, whose version it then holds). */
fr_err_t psstore_model_weights_shards(psstore_conn_t *c, const char *name, float *w, size_t n,
                                      uint64_t *epoch, int64_t *version, char **offsets,
                                      int64_t *shard_versions, int *nshards);
/* The model's current version alone (its layout, then a GET per shard):
 * a cheap test of whether the weights moved; a sharded model's is the sum
 * of its shards'. FR_ERR_NOTFOUND when there is no such model. */
fr_err_t psstore_model_version(psstore_conn_t *c, const char *name, int64_t *version);
/* Reads the weights model name serves (n floats) with their epoch and
 * version in one transaction, never a torn mix: the served average
 * (docs/design.md "The served average") when its applier keeps one, else
 * the training weights. FR_ERR_RANGE when the stored weights are not n
 * floats. The _offsets and _shards variants above serve the same. */
fr_err_t psstore_model_weights(psstore_conn_t *c, const char *name, float *w, size_t n,
                               uint64_t *epoch, int64_t *version);
/* psstore_model_weights, but always the training weights (w:0): what the
 * workers pull and the optimizer steps. */
fr_err_t psstore_model_weights_training(psstore_conn_t *c, const char *name, float *w, size_t n,
                                        uint64_t *epoch, int64_t *version);

/* ------------------------------------------------------------------------
 * Offsets in the store, for ingest: where a partition starts and which
 * intervals above it to skip. Reads the store, never a cache.
 * ---------------------------------------------------------------------- */
/* Fills po (initialised by the caller) from freshet:{m}:offsets. *found = 0
 * and po untouched when the store has never seen the partition. A sharded
 * model's po is the shard with the lowest watermark, and po->alone_to says
 * where the shards' applied positions differ (positions.h). */
fr_err_t psstore_offsets_read(psstore_conn_t *c, const char *model, const char *topic,
                              int32_t partition, psstore_partition_offsets_t *po, int *found);
/* psstore_offsets_read of partitions[n] of topic at once, into po[n]
 * (initialised by the caller) and found[n], each as psstore_offsets_read
 * gives it, in a fixed number of round trips whatever n (docs/design.md
 * "Offsets"): the shard count, then one HMGET a shard (512 fields a
 * command), pipelined (a round trip a shard on a Redis Cluster). On error
 * po[] holds part of the answer: the caller still psstore_poff_fini()s
 * each. */
fr_err_t psstore_offsets_read_many(psstore_conn_t *c, const char *model, const char *topic,
                                   const int32_t *partitions, size_t n,
                                   psstore_partition_offsets_t *po, int *found);

/* The quarantine (quarantine.c; docs/design.md "Poison in a batch"): the
 * positions whose record a trainer found poisonous, rejected when read
 * again. add: every position of the n ranges, in one command;
 * FR_ERR_RANGE when that would take the model past 100,000 of them. read:
 * the partition's positions >= from, sorted, into *offsets (caller frees;
 * NULL when none). */
fr_err_t psstore_quarantine_add(psstore_conn_t *c, const char *model, const psstore_range_t *pos,
                                size_t n);
fr_err_t psstore_quarantine_read(psstore_conn_t *c, const char *model, const char *topic,
                                 int32_t partition, int64_t from, int64_t **offsets, size_t *n);

/* The partitions the store keeps offsets for, as "topic/partition" keys
 * sorted by topic and partition; caller frees each and the array. */
fr_err_t psstore_offsets_keys(psstore_conn_t *c, const char *model, char ***keys, size_t *n);

/* ------------------------------------------------------------------------
 * Training modes and membership (docs/design.md "Training modes"): the
 * modes, mode auto's phases, and a worker's entry in freshet:{m}:members
 * (members.c). The worker's side (heartbeats, rounds) is in
 * psstore/grads/grads.h.
 * ---------------------------------------------------------------------- */
typedef enum psstore_mode {
    PSSTORE_MODE_ASYNC = 0,    /* apply each gradient on arrival              */
    PSSTORE_MODE_SYNC = 1,     /* one averaged update per round of all members */
    PSSTORE_MODE_BACKUP = 2,   /* as sync, the round closes at K of them       */
    PSSTORE_MODE_GROUPS = 3,   /* a sync round per group, groups asynchronous  */
    PSSTORE_MODE_SSP = 4,      /* async; clocks at most s ahead of the slowest */
    PSSTORE_MODE_ADAPTIVE = 5, /* async with the adaptive policy               */
    PSSTORE_MODE_AUTO = 6,     /* adaptive, switching to backup or ssp phases  */
} psstore_mode_t;

fr_err_t psstore_mode_parse(const char *name, psstore_mode_t *mode);
const char *psstore_mode_name(psstore_mode_t mode);
/* Nonzero for the modes whose applier averages rounds: sync, backup, groups. */
int psstore_mode_rounds(psstore_mode_t mode);
/* Mode auto's phases (docs/design.md "Mode auto"): async (every gradient at
 * the adaptive rate), backup (a straggler's stale gradients are dropped)
 * and ssp (workers keep within ssp_bound clocks of the slowest). The
 * applier publishes the phase in meta (field "phase") and on the
 * in-process channel. */
typedef enum psstore_phase {
    PSSTORE_PHASE_ASYNC = 0,
    PSSTORE_PHASE_BACKUP = 1,
    PSSTORE_PHASE_SSP = 2,
} psstore_phase_t;
#define PSSTORE_NPHASE 3
const char *psstore_phase_name(psstore_phase_t phase);
/* "" and unknown names read as async. */
psstore_phase_t psstore_phase_parse(const char *name);

/* One worker's entry in freshet:{m}:members. */
typedef struct psstore_member {
    char id[256];     /* "<host>/<pid>/<n>"                                */
    char backend[16]; /* "cpu", "cuda"                                     */
    int group;        /* >= 0                                              */
    int64_t clock;    /* SSP clock: gradients pushed, from where it joined */
    int idle;         /* 1 after idle_ms without data                      */
    uint64_t beat;    /* incremented by every heartbeat                    */
} psstore_member_t;

/* ------------------------------------------------------------------------
 * Operator requests (freshet:{m}:requests) and snapshots. A request is
 * executed by the applier holding the lease, in its next transaction, and
 * then deleted from the stream.
 * ---------------------------------------------------------------------- */
/* Appends a rollback to retained snapshot version (restored as a new version
 * of a new epoch, with its offsets) or a deletion of the whole model. The
 * stream id of the request goes to id[64]. */
fr_err_t psstore_request_rollback(psstore_conn_t *c, const char *model, int64_t version, char *id);
fr_err_t psstore_request_delete(psstore_conn_t *c, const char *model, char *id);

/* Appends the rewrite of a replay (docs/design.md "Replay"): for each target the
 * applier sets the watermark, clears every applied interval and records
 * generation, so gradients of an older generation for those partitions are
 * dropped (reason "replay") and mark nothing. */
fr_err_t psstore_request_rewind(psstore_conn_t *c, const char *model, int64_t generation,
                                const psstore_rewind_t *targets, size_t ntargets, char *id);
/* An operator's replay (docs/design.md "Replay"), kept symbolically: spec is
 * the text form of the request (psstore_replay_format), opaque to Redis, of
 * fewer than PSSTORE_REPLAY_SPEC_MAX bytes. The applier publishes it in the
 * model's meta under the next replay generation; the consumers owning the
 * partitions resolve it and append the rewrites (psstore_request_rewind). */
fr_err_t psstore_request_replay(psstore_conn_t *c, const char *model, const char *spec, char *id);
/* The replay the applier last published: its generation (0 when there has
 * been none, spec then ""), its text into spec[size] and when it was
 * requested (unix ms; requested_ms may be NULL). */
fr_err_t psstore_replay_current(psstore_conn_t *c, const char *model, int64_t *generation,
                                char *spec, size_t size, int64_t *requested_ms);
/* Waits up to timeout_ms until request id has been executed (left the
 * stream). FR_ERR_TIMEOUT otherwise. */
fr_err_t psstore_request_wait(psstore_conn_t *c, const char *model, const char *id, int timeout_ms);
/* *held = 1 when some applier holds the model's lease. */
fr_err_t psstore_lease_held(psstore_conn_t *c, const char *model, int *held);
/* Reads retained snapshot version of model: the n floats it serves (its
 * served average when it kept one, else its weights) and the epoch they
 * belong to. FR_ERR_NOTFOUND when it is not retained,
 * FR_ERR_RANGE when it does not hold n floats. */
fr_err_t psstore_snapshot_weights(psstore_conn_t *c, const char *model, int64_t version, float *w,
                                  size_t n, uint64_t *epoch);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_STORE_H */
