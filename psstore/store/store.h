/*
 * psstore.h - the public header of the parameter store: the
 * Redis-backed store (docs/design.md "Redis layout"): connections, model
 * lifecycle, offsets in the store, pull and push, training modes and
 * membership, the co-located channel, requests, snapshots, status and the
 * applier. It includes psstore/core.h, the Redis-free core (optimizers,
 * controller, offset intervals, replay requests), which a module that
 * needs only the core includes alone. Everything declared here needs
 * hiredis and is left out of FRESHET_CORE_ONLY builds.
 *
 * Threads: a connection, a client and an applier each belong to one
 * thread; the exceptions are said where they are declared.
 */
#ifndef FRESHET_PSSTORE_H
#define FRESHET_PSSTORE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "psstore/core.h"
#include "sparse/sparse.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Connection. A connection belongs to one thread.
 * ---------------------------------------------------------------------- */
#define PSSTORE_URL_SEEDS_MAX 16

typedef struct psstore_url {
    int unix_socket; /* 1 for unix:///path                              */
    char host[256];  /* the first host (seeds[0])                       */
    int port;        /* default 6379                                    */
    int nseeds;      /* hosts listed, 1..PSSTORE_URL_SEEDS_MAX (TCP):
                        more than one names a Redis Cluster            */
    struct {
        char host[256];
        int port;
    } seeds[PSSTORE_URL_SEEDS_MAX];
    char path[256]; /* unix socket path                                */
    int db;         /* default 0                                       */
    char user[128]; /* ACL user (may be empty)                         */
    char pass[256]; /* password (may be empty)                         */
} psstore_url_t;

/* Parses redis://[user:pass@]host[:port][,host[:port]...][/db] and
 * unix:///path[?db=N]. rediss:// is refused (hiredis 0.14 has no TLS: use
 * a TLS proxy). */
fr_err_t psstore_url_parse(const char *url, psstore_url_t *u, char *errstr, size_t size);

/* Redis Cluster's key slot (0..16383): CRC16 (XMODEM) of the key's hash
 * tag, the text between its first '{' and the next '}' when not empty,
 * else of the whole key. */
int psstore_key_slot(const char *key, size_t len);
uint16_t psstore_crc16(const void *p, size_t n);

typedef struct psstore_conn psstore_conn_t;

/* Connects (AUTH and SELECT as the URL says) with timeout_ms for the
 * connect and every command. NULL with errstr ("redis 127.0.0.1:6379:
 * Connection refused") when Redis cannot be reached. Caller frees with
 * psstore_conn_destroy(). A URL that names a Redis Cluster node (or
 * several hosts) gives a cluster connection: commands go to the node of
 * their key's slot, following MOVED and ASK and riding out a fail-over
 * (docs/design.md "Redis Cluster"). */
psstore_conn_t *psstore_conn_new(const char *url, int timeout_ms, char *errstr, size_t size);
void psstore_conn_destroy(psstore_conn_t *c);
/* Nonzero when c talks to a Redis Cluster. */
int psstore_conn_is_cluster(const psstore_conn_t *c);
/* The last error of this connection. */
const char *psstore_conn_error(const psstore_conn_t *c);
/* Refuses (FR_ERR_UNSUPPORTED) a Redis whose maxmemory-policy evicts keys;
 * warns once and succeeds where CONFIG is disabled. */
fr_err_t psstore_conn_check_policy(psstore_conn_t *c);
/* Stopping without waiting on a dead Redis: while fn(arg) returns nonzero
 * (its owner is stopping), a broken connection is tried once more and
 * not retried with backoff, so a command fails at once instead of after
 * the connection's timeout. Commands on a live connection are unaffected. */
typedef int (*psstore_cancel_fn)(void *arg);
void psstore_conn_set_cancel(psstore_conn_t *c, psstore_cancel_fn fn, void *arg);

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
 * where the shards' applied positions differ (core.h). */
fr_err_t psstore_offsets_read(psstore_conn_t *c, const char *model, const char *topic,
                              int32_t partition, psstore_partition_offsets_t *po, int *found);

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
 * Sparse models (rows.c, applier_sparse.c; docs/design.md "Sparse models").
 * Rows live in the hash freshet:{m}:rows (field: the row as 4 bytes
 * little-endian; value: its 1 + D parameters, then its optimizer state,
 * float32 LE: one field a row to read and write); a row never written
 * reads as sparse_row_init's value. The dense part (the bias, then the
 * tower's parameters: sparse_dense_len floats) is the model's w:0, its
 * state opt:0. A gradient (psstore_grad_t.g) packs the m rows of a batch,
 * their gradients and the dense part's: [row bits x m, grad (K + D) x m,
 * dense], m (1 + K + D) + ndense floats (K = sparse_outputs), the rows'
 * 32 bits held as they are.
 * ---------------------------------------------------------------------- */

/* The floats of a packed gradient of m rows of rowlen floats
 * (sparse_row_len) and a dense part of ndense floats. */
static inline size_t psstore_sparse_grad_len(size_t m, size_t rowlen, size_t ndense)
{
    return m * (1 + rowlen) + ndense;
}

/* Packs rows[m], their gradients grads[m][rowlen] and the dense part's
 * gdense[ndense] into out[psstore_sparse_grad_len(m, rowlen, ndense)]. */
void psstore_sparse_pack(const uint32_t *rows, size_t m, const float *grads, size_t rowlen,
                         const float *gdense, size_t ndense, float *out);

/*
 * A worker's pull, in one transaction: the parameters of rows[n] (each
 * sparse_row_len floats, the stored value's first: spec and optim give its
 * size) into params[n][1 + D], found[i] = 1 where the store has row i
 * (absent rows are left as they were: the caller fills them with
 * sparse_row_init), the biases into bias[sparse_outputs] (past shard 0:
 * its one float, then zeros), the tower's parameters into
 * tower[sparse_tower_len] (may be NULL: not read; when given, the shard's
 * w:0 must be shard 0's whole dense part), and the epoch and version they
 * are. FR_ERR_NOTFOUND for a model that does not exist,
 * FR_ERR_PARSE for a row or a dense part of another size.
 */
fr_err_t psstore_rows_pull(psstore_conn_t *c, const char *model, const sparse_spec_t *spec,
                           const sparse_optim_t *optim, const uint32_t *rows, size_t n,
                           float *params, uint8_t *found, float *bias, float *tower,
                           uint64_t *epoch, int64_t *version);

/*
 * A sparse model of S shards (docs/design.md "Sparse models on shards"):
 * shard k holds the rows r with r % S == k, under its own tag, with its own
 * applier; shard 0's w:0 is the dense part. psstore_rows_pull in two halves
 * for shard k of S, so that the shards' transactions, each on the
 * connection of its node, overlap: send queues it (*queued replies to
 * read), recv reads it, with that shard's epoch and version (its bias: one
 * float 0 on shards 1..S-1, which have no tower: pass NULL).
 */
static inline int psstore_sparse_shard(uint32_t row, int S)
{
    return S > 1 ? (int)(row % (uint32_t)S) : 0;
}
/* Groups rows[n] by shard of S, keeping their order within a shard (a
 * counting sort): shard k's are sorted[off[k] .. off[k + 1]), and
 * sorted[j] = rows[order[j]]. off has S + 1 entries. */
void psstore_sparse_group(const uint32_t *rows, size_t n, int S, uint32_t *order, uint32_t *sorted,
                          size_t *off);
fr_err_t psstore_rows_pull_send(psstore_conn_t *c, const char *model, int k, int S,
                                const uint32_t *rows, size_t n, size_t *queued);
fr_err_t psstore_rows_pull_recv(psstore_conn_t *c, const char *model, const sparse_spec_t *spec,
                                const sparse_optim_t *optim, size_t n, size_t queued, float *params,
                                uint8_t *found, float *bias, float *tower, uint64_t *epoch,
                                int64_t *version);

/* Parses meta's `sparse` text ("fields:39,buckets:2^22,dim:8;optimizer:
 * ftrl;seed:42;init_std:0.01") into the table and what gives a row its
 * size and initial value (the optimizer's kind, seed and init_std; its
 * rates keep their defaults). FR_ERR_PARSE with errstr. */
fr_err_t psstore_sparse_meta_parse(const char *text, sparse_spec_t *spec, sparse_optim_t *optim,
                                   char *errstr, size_t size);

/*
 * Reading a sparse model for serving (docs/design.md "Serving sparse
 * models"). Every commit that changes rows adds an entry "<version>-0" to
 * the stream freshet:{m}:changes naming the rows it wrote and those it
 * evicted; entries older than [sparse] delta_seconds are trimmed and
 * meta's delta_floor says from which version the history is whole.
 */
typedef struct psstore_rows_page {
    /* the sums of the shards' epochs and of at[] (the model's at S = 1) */
    uint64_t epoch;
    int64_t version;
    /* each of the S shards' versions: delta: the page covers (since[k],
     * at[k]] on shard k, the next since; scan: when the page was read */
    int shards;
    int64_t at[PSSTORE_SHARDS_MAX];
    /* delta: the oldest since answered, and the store's version when it was
     * read (expired: the expired shard's) */
    int64_t floor, head;
    /* delta: since is older than floor, or newer than the model, or the
     * model was created again, on shard expired_shard: reload the table;
     * nothing else set */
    int expired, expired_shard;
    int more;        /* delta: entries after at[] remain; scan: pages remain */
    int64_t time_ms; /* delta: when the newest commit it holds was written (0: none) */
    int nbias;       /* the table's outputs (sparse_outputs):    */
    float bias[SPARSE_CLASSES_MAX]; /* bias[nbias], shard 0's                   */
    size_t ntower;                  /* the tower's parameters (shard 0's w:0 after the biases), */
    float *tower;                   /* tower[ntower]: sparse_tower_len of the table            */
    size_t n;                       /* rows present, ids[n], params[n][1 + D] */
    uint32_t *ids;
    float *params;
    size_t ngone; /* delta: rows deleted since, gone[ngone] */
    uint32_t *gone;
    size_t cap; /* the buffers, kept from call to call */
    uint8_t *found;
} psstore_rows_page_t;

/*
 * The rows changed or evicted after since[k] on each shard k of S (one
 * version at S = 1), from at most max_entries commits and about max_rows
 * rows a shard (a commit is never split): present rows with their
 * parameters (the latest, which may be newer than page->at), deleted ones
 * in gone. page->more when entries remain. The caller zeroes page before
 * the first call and frees it with psstore_rows_page_fini.
 */
fr_err_t psstore_rows_delta(psstore_conn_t *c, const char *model, int S, const int64_t *since,
                            const sparse_spec_t *spec, const sparse_optim_t *optim,
                            size_t max_entries, size_t max_rows, psstore_rows_page_t *page);
/*
 * One page of the whole table (HSCAN from cursor, about count rows), with
 * the store's epochs, versions and bias at that moment; *next is the cursor
 * of the next page ("0" after the last). A model of S > 1 shards reads
 * shard after shard: its cursors are "k.c" (HSCAN cursor c of shard k;
 * "0" is shard 0's first page). A client reads every page, then follows
 * with psstore_rows_delta since the first page's at[]. FR_ERR_INVAL for a
 * cursor of another shape.
 */
fr_err_t psstore_rows_scan(psstore_conn_t *c, const char *model, int S, const sparse_spec_t *spec,
                           const sparse_optim_t *optim, const char *cursor, size_t count,
                           psstore_rows_page_t *page, char next[48]);
void psstore_rows_page_fini(psstore_rows_page_t *page);

/* ------------------------------------------------------------------------
 * The in-process fast path of a sparse model (applier_sparse.c): freshet
 * run's workers read the rows its applier holds, and wait for their last
 * gradient to be decided rather than committed.
 * ---------------------------------------------------------------------- */
typedef struct psstore_applier psstore_applier_t;

/* Copies the rows among rows[n] that applier a holds into params[n][1 + D]
 * (found[i] = 1; rows it does not hold are untouched, found[i] = 0: the
 * store has their value), the biases into bias[sparse_outputs] (one
 * float past shard 0), the tower's parameters into
 * tower[sparse_tower_len] (may be NULL; shard 0's applier only), and the
 * epoch and version they are at, which may be newer than the store's.
 * FR_ERR_STATE while a holds no lease (read the store instead),
 * FR_ERR_INVAL for a dense model. Thread-safe. */
fr_err_t psstore_applier_rows(psstore_applier_t *a, const uint32_t *rows, size_t n, float *params,
                              uint8_t *found, float *bias, float *tower, uint64_t *epoch,
                              int64_t *version);
/* Waits up to timeout_ms until applier a decided the grads entry id
 * (applied or dropped; committed or not): *decided. FR_ERR_STATE while a
 * holds no lease (another process's applier decides: psstore_applied_wait
 * asks the store). Thread-safe. */
fr_err_t psstore_applier_decided_wait(psstore_applier_t *a, const char *id, int timeout_ms,
                                      int *decided);

/* ------------------------------------------------------------------------
 * Gradients between processes (the freshet:{m}:grads stream).
 * ---------------------------------------------------------------------- */
typedef struct psstore_grad {
    uint64_t epoch;     /* epoch of the weights it was computed on      */
    int64_t version;    /* version of those weights                     */
    int64_t generation; /* replay generation of the batch               */
    const char *worker; /* "<host>/<pid>/<n>"                           */
    int64_t n;          /* samples; 0 = positions dropped with reason   */
    double loss_sum;    /* sum of per-sample losses                     */
    const char *reason; /* n = 0: why ("decode", "retention"); else NULL */
    const psstore_range_t *ranges;
    size_t nranges;
    const float *g;                    /* gradient of the batch-mean loss, len floats  */
    size_t len;                        /* 0 when n = 0                                 */
    int64_t ts_min_ms, ts_max_ms;      /* Kafka timestamps of its oldest and newest
                                          samples (unix ms); 0 when unknown    */
    double norm;                       /* a shard's slice: the L2 norm of the whole gradient
                                          (NaN when it was not finite), so that every shard
                                          clips and rejects alike; 0: the slice's own norm   */
    const struct psstore_shard_at *at; /* a sharded model: the (epoch, version)
                                          of each shard it was computed on
                                          (psstore_client_at); NULL: the
                                          client's last pull, or epoch and
                                          version for one shard            */
    int sq_known;                      /* in-process pushes (psstore_local) only: sq is
                                          psstore_sum_squares(g, len), so the applier
                                          makes no pass of its own over g before its
                                          step. Never sent to Redis; a slice drops it */
    double sq;
} psstore_grad_t;

/* A sharded model as a worker holds it (docs/design.md "Shards"): the
 * (epoch, version) of each shard its weights were pulled at, and the
 * model's (epoch, version) they add up to (sums: the version changes
 * whenever a shard's does, and equals the shard's at S = 1). */
typedef struct psstore_shard_at {
    int n; /* shards; 0 for a model of one shard */
    uint64_t epoch;
    int64_t version;
    uint64_t epochs[PSSTORE_SHARDS_MAX];
    int64_t versions[PSSTORE_SHARDS_MAX];
    size_t bounds[PSSTORE_SHARDS_MAX + 1]; /* shard k: [bounds[k], bounds[k + 1]) */
    int torn;                              /* a pull failed after copying some slices: the next pull
                                              reports a change, so the backend loads them */
} psstore_shard_at_t;

/* The trainer-facing client of one worker thread. */
typedef struct psstore_client psstore_client_t;

/* A client of model name with nparams parameters; max_pending bounds the
 * gradients waiting in the stream (docs/design.md "Staleness and the controller"). NULL with
 * errstr when Redis is unreachable or the model does not exist or has
 * another size. Caller frees with psstore_client_destroy(). */
psstore_client_t *psstore_client_new(const char *url, const char *model, size_t nparams,
                                     int64_t max_pending, char *errstr, size_t size);
void psstore_client_destroy(psstore_client_t *cl);
const char *psstore_client_error(const psstore_client_t *cl);
/* psstore_conn_set_cancel for the client's connection. */
void psstore_client_set_cancel(psstore_client_t *cl, psstore_cancel_fn fn, void *arg);

/* Pulls the weights when the store holds another (epoch, version) than
 * (*epoch, *version): fills w[nparams], updates both and sets *changed.
 * One round trip when nothing changed; the weights, epoch and version are
 * read in one transaction, never a torn mix. */
fr_err_t psstore_pull(psstore_client_t *cl, float *w, uint64_t *epoch, int64_t *version,
                      int *changed);

/* A sharded model: each shard's (epoch, version) of the weights the last
 * pull left in the caller's buffer (psstore_pull and psstore_local_pull_at
 * keep it), for the gradient's `at`; NULL for a model of one shard. */
psstore_shard_at_t *psstore_client_at(psstore_client_t *cl);

/* Appends g to the grads stream, first waiting while more than max_pending
 * entries wait to be applied (up to timeout_ms; FR_ERR_TIMEOUT after). */
fr_err_t psstore_push(psstore_client_t *cl, const psstore_grad_t *g, int timeout_ms);
/* A sparse model's client (psstore.h "Sparse models"): its gradients pack
 * a batch's rows, so their length varies; the applier checks each one. */
void psstore_client_any_length(psstore_client_t *cl);
/* Pushes parts[k] to shard k's grads stream, k < n (the model's shards:
 * a sparse model's worker pushes each shard the gradient of its rows, with
 * that shard's epoch and version), each as psstore_push would, but every
 * shard's room check and then every XADD in flight at once: n shards in
 * two round trips' time. A failure leaves the shards that added theirs
 * holding it (the gap rule reads the batch again; they drop it as a
 * duplicate). psstore_client_last_id(cl) is then the last shard's entry,
 * psstore_client_last_id(psstore_client_shard(cl, k)) shard k's. */
fr_err_t psstore_push_each(psstore_client_t *cl, const psstore_grad_t *parts, int n,
                           int timeout_ms);
/* Shard k's own client (cl itself for a model of one shard; NULL for no
 * such shard): a sparse model's worker pushes each shard the gradient of
 * that shard's rows, and waits on each shard's entry. It belongs to cl. */
psstore_client_t *psstore_client_shard(psstore_client_t *cl, int k);
/* The connection of client cl (of its shard's node), for the reads a
 * worker makes besides pulls and pushes (a sparse model's rows): one
 * connection a shard serves both. It belongs to cl and its thread. */
psstore_conn_t *psstore_client_conn(psstore_client_t *cl);
/* psstore_quarantine_add on the client's model (the model's own tag, its
 * shards' too). */
fr_err_t psstore_client_quarantine(psstore_client_t *cl, const psstore_range_t *pos, size_t n);

/* The stream id of the last gradient this client pushed ("" before any). */
const char *psstore_client_last_id(const psstore_client_t *cl);
/* *waiting = 1 while gradient id (psstore_client_last_id) is still in the
 * grads stream, waiting for the applier; it leaves once applied or dropped. */
fr_err_t psstore_grad_waiting(psstore_conn_t *c, const char *model, const char *id, int *waiting);

/* Bytes this client moved to and from Redis (payloads). */
uint64_t psstore_client_bytes(const psstore_client_t *cl);

/* ------------------------------------------------------------------------
 * Training modes and membership (docs/design.md "Training modes"). Workers
 * heartbeat into freshet:{m}:members; in the round modes (sync, backup,
 * groups) the applier counts each group's closed rounds in
 * freshet:{m}:rounds, which workers wait on.
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

/* Writes m as the worker's entry (a heartbeat; the caller increments beat). */
fr_err_t psstore_member_beat(psstore_client_t *cl, const psstore_member_t *m);
/* Removes the worker's entry (a clean stop). */
fr_err_t psstore_member_leave(psstore_client_t *cl, const char *id);
/* Reads every entry into *members (grown as needed, *cap its capacity;
 * caller frees); entries that do not parse are skipped. */
fr_err_t psstore_members_read(psstore_client_t *cl, psstore_member_t **members, size_t *n,
                              size_t *cap);
/* The number of rounds the applier has closed for group (0 before any). */
fr_err_t psstore_round_read(psstore_client_t *cl, int group, int64_t *round);
/* Reads the count into *now and, while it is not past round, waits up to
 * block_ms (1..1000) for the applier's next transaction that closes a
 * round or publishes a version (XREAD BLOCK on the versions and drops
 * streams), then reads it again: no polling. The caller loops until *now
 * passes round or its own limit. */
fr_err_t psstore_round_wait(psstore_client_t *cl, int group, int64_t round, int block_ms,
                            int64_t *now);
/* The in-flight bound on the stream path (docs/design.md "Staleness and the
 * controller"): *applied = 1 once the applier has decided the pushed entry
 * `id` (applied or dropped, and committed: the entry left the grads
 * stream), else after blocking up to block_ms on the versions and drops
 * streams *applied = 0 and the caller looks again. */
fr_err_t psstore_applied_wait(psstore_client_t *cl, const char *id, int block_ms, int *applied);
/* Mode auto: the phase the applier holding the lease wrote into meta
 * (async when none). */
fr_err_t psstore_phase_read(psstore_client_t *cl, psstore_phase_t *phase);

/* ------------------------------------------------------------------------
 * The co-located fast path (docs/design.md "The co-located fast path"): in freshet run
 * the workers and the applier share a process, and gradients and weights
 * pass in memory. The channel is open while the applier attached to it
 * (psstore_applier_set_local) holds the lease; workers use the Redis path
 * otherwise. Any thread.
 * ---------------------------------------------------------------------- */
typedef struct psstore_local psstore_local_t;

/* A channel for nparams-float models with `slots` queued gradients at
 * most (the backpressure bound of the in-memory path). */
psstore_local_t *psstore_local_new(size_t nparams, size_t slots, char *errstr, size_t size);
/* A channel for a sharded model (docs/design.md "Shards"): one channel per
 * shard of bounds[S + 1], each attached to its shard's applier (S = 1: as
 * psstore_local_new). Pushes fan the slices out with each shard's
 * (epoch, version) from the gradient's `at`; pulls go through
 * psstore_local_pull_at; rounds and the in-flight wait cover every shard. */
psstore_local_t *psstore_local_new_shards(const size_t *bounds, int S, size_t slots, char *errstr,
                                          size_t size);
void psstore_local_destroy(psstore_local_t *l);
/* Nonzero while the attached applier holds the lease and takes gradients. */
int psstore_local_open(psstore_local_t *l);
/* As psstore_pull, from the applier's memory; FR_ERR_STATE when closed. */
fr_err_t psstore_local_pull(psstore_local_t *l, float *w, uint64_t *epoch, int64_t *version,
                            int *changed);
/* As psstore_local_pull without the copy: *w (NULL at first, then what
 * the last call gave) points at the applier's current weights, which the
 * caller holds, unchanged, until its next call or psstore_local_unhold.
 * When they moved since *w, *epoch and *version, the old ones are let go
 * and *changed is set. Each caller holds one version at most; a holder
 * costs the channel a model-sized buffer while the applier moves on. Not
 * for a sharded channel (FR_ERR_INVAL); FR_ERR_STATE when closed, and *w is
 * then still held. */
fr_err_t psstore_local_hold(psstore_local_t *l, const float **w, uint64_t *epoch, int64_t *version,
                            int *changed);
/* Lets go of weights w that psstore_local_hold gave (NULL: nothing). */
void psstore_local_unhold(psstore_local_t *l, const float *w);
/* A sharded channel: as psstore_local_pull, each shard's slice when that
 * shard moved since at (FR_ERR_STATE when any shard's channel is closed;
 * the slices pulled so far stay consistent with at). */
fr_err_t psstore_local_pull_at(psstore_local_t *l, float *w, psstore_shard_at_t *at, int *changed);
/* Queues a copy of g for the applier, waiting up to timeout_ms for a free
 * slot (FR_ERR_TIMEOUT); FR_ERR_STATE when the channel is closed (or
 * closes meanwhile): the caller abandons the batch, which the gap rule
 * reads again. *ticket (when not NULL) receives the push's ticket for
 * psstore_local_wait_applied. */
fr_err_t psstore_local_push(psstore_local_t *l, const psstore_grad_t *g, int timeout_ms,
                            uint64_t *ticket);
/* As psstore_local_push, without copying the gradient: g->g must be *buf, a
 * malloc'ed buffer of nparams floats, and on FR_OK the slot keeps it while
 * *buf receives the slot's previous buffer (same size, already touched) for
 * the caller's next gradient. Any other result leaves *buf as it was. The
 * caller frees whatever *buf holds at the end, as the channel frees its
 * slots'. It saves a copy of the model (813 KB for 784-256-10) per push. */
fr_err_t psstore_local_push_swap(psstore_local_t *l, const psstore_grad_t *g, float **buf,
                                 int timeout_ms, uint64_t *ticket);
/* As psstore_local_push_swap, for a pusher that is about to wait for the
 * gradient (psstore_local_wait_applied, the in-flight bound): when the
 * applier is between steps, its step (take what is queued, decide,
 * publish) runs in the calling thread instead of waking the applier's
 * thread and then being woken by it, two thread switches that cost more
 * than the step on a loaded machine (docs/design.md "The co-located fast
 * path"). When the applier is inside a step of its own (a stream read, a
 * commit being built; not while a commit waits for Redis) or not taking
 * gradients, the gradient is left to it and it is woken. */
fr_err_t psstore_local_push_help(psstore_local_t *l, const psstore_grad_t *g, float **buf,
                                 int timeout_ms, uint64_t *ticket);
/* Waits until the push of `ticket` has been decided by the applier and,
 * when applied, is in the weights psstore_local_pull returns (the
 * in-flight bound, docs/design.md "Staleness and the controller"): FR_OK,
 * FR_ERR_TIMEOUT after timeout_ms, FR_ERR_STATE when the channel closed
 * first (the gradient was lost). */
fr_err_t psstore_local_wait_applied(psstore_local_t *l, uint64_t ticket, int timeout_ms);
/* Mode auto: the phase the attached applier runs (FR_ERR_STATE when the
 * channel is closed; *phase is then the last one set). */
fr_err_t psstore_local_phase(psstore_local_t *l, psstore_phase_t *phase);
/* Round modes: the rounds group closed since the channel opened (as
 * psstore_round_read counts them in Redis), published together with the
 * weights they produced; and a wait until that count passes round
 * (FR_ERR_TIMEOUT after timeout_ms, FR_ERR_STATE when closed). Groups
 * below PS_LOCAL_GROUPS. */
#define PS_LOCAL_GROUPS 256
fr_err_t psstore_local_round(psstore_local_t *l, int group, int64_t *round);
fr_err_t psstore_local_round_wait(psstore_local_t *l, int group, int64_t round, int timeout_ms);

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

/* ------------------------------------------------------------------------
 * The applier: the single writer of a model (docs/design.md "One writer and fencing").
 * Belongs to one thread; psstore_applier_stats may be called from others.
 * ---------------------------------------------------------------------- */
/* A sparse model's applier (docs/design.md "Sparse models"): the table's
 * shape and the per-row optimizer. */
typedef struct psstore_sparse_conf {
    int enabled; /* 0: a dense model */
    sparse_spec_t spec;
    sparse_optim_t optim;
    int min_count;    /* admission: a row the store lacks is created at its
                         min_count-th gradient, counted in a sketch (1..255;
                         0 or 1: at its first) */
    int64_t ttl_ms;   /* eviction: a row not stepped for this long is deleted
                         and published as a tombstone (0: never) */
    int64_t delta_ms; /* the changes stream keeps this much history: a
                         delta since an older version is refused (> 0) */
} psstore_sparse_conf_t;

typedef struct psstore_applier_conf {
    const char *url;
    const char *model;
    int shard; /* a sharded model: the shard this applier writes (0..S-1;
                  docs/design.md "Shards"); ignored for a model of one */
    psstore_ctl_conf_t ctl;
    int64_t lease_ms;             /* lease time-to-live                        */
    int64_t commit_ms;            /* group commit window; 0 = every gradient   */
    int64_t versions_keep;        /* MAXLEN ~ of the versions stream           */
    int64_t snapshot_every;       /* versions between snapshots; 0 = never     */
    double snapshot_seconds;      /* seconds between snapshots; 0 = never      */
    int64_t snapshot_retain;      /* snapshots kept                            */
    int audit;                    /* append applied/dropped intervals to audit */
    int64_t sample_limit;         /* stop reading gradients once this many samples
                                     were applied (0: never; freshet run --samples) */
    int commit_drained;           /* end a commit window as soon as the stream has
                                     nothing to read: its pushers wait for the
                                     commit ([trainer] in_flight > 0)          */
    int npushers;                 /* concurrent pushers for the delay policy   */
    psstore_mode_t mode;          /* rounds in sync, backup and groups         */
    int backups;                  /* mode backup: a round closes at members - backups */
    int sync_lr_linear;           /* rounds: lr times the gradients averaged   */
    int64_t member_timeout_ms;    /* silence before a member is removed      */
    int64_t round_timeout_ms;     /* a round closes with whoever arrived      */
    int wait_replicas;            /* WAIT for this many replicas after each commit
                                     ([redis] wait_replicas; 0: none)          */
    int64_t wait_timeout_ms;      /* ... for at most this long                 */
    int requests_only;            /* execute requests only, leave gradients waiting
                                     (the CLI acting while no applier runs)      */
    psstore_sparse_conf_t sparse; /* a sparse model's table and optimizer      */
    fr_metrics_t *metrics;        /* where to export metrics; may be NULL      */
} psstore_applier_conf_t;

/* The defaults of [psstore], [controller] and the round settings of [trainer]
 * (docs/operations.md "Configuration"), read from the config schema
 * (fr_config_default), except commit_ms 0 and npushers 1: a library caller
 * commits every gradient and pushes from one thread unless it says otherwise. */
void psstore_applier_conf_init(psstore_applier_conf_t *conf);
/* An applier of conf->model (strings are copied). It connects, checks the
 * eviction policy and the model, and starts as a standby. NULL with errstr
 * on failure. Caller frees with psstore_applier_destroy(). */
psstore_applier_t *psstore_applier_new(const psstore_applier_conf_t *conf, char *errstr,
                                       size_t size);
void psstore_applier_destroy(psstore_applier_t *a);
/* Attaches the in-process channel (before the applier's first poll; l must
 * outlive it): the applier opens it whenever it holds the lease, takes its
 * gradients before the stream's, and publishes its weights there. */
void psstore_applier_set_local(psstore_applier_t *a, psstore_local_t *l);

/* One turn: takes or renews the lease (a standby returns FR_OK at once when
 * another applier holds it), executes requests, reads up to a batch of
 * gradients (blocking at most block_ms), applies and commits them. Losing
 * the lease (a nil EXEC) drops the in-memory state and returns to standby.
 * Errors are Redis errors; bad gradients are counted, not errors. */
fr_err_t psstore_applier_poll(psstore_applier_t *a, int block_ms);

/* Nonzero once the first poll's attempt at the lease has ended: the lease
 * taken (and the in-process channel opened), held by another applier, or
 * failed. Any thread. freshet run starts its consumer after it, so that
 * the first gradients go through the channel (docs/design.md "The
 * co-located fast path"). */
int psstore_applier_tried(psstore_applier_t *a);

/* Polls until *stop is nonzero, retrying with backoff on Redis errors;
 * commits what it holds and releases the lease before returning. *stop is
 * set from another thread (or a signal handler): it is read with
 * atomic_load, and stop must outlive the call. */
fr_err_t psstore_applier_run(psstore_applier_t *a, const atomic_int *stop);

/* Why a gradient was not applied; names are the metrics' reason labels. */
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

typedef struct psstore_applier_stats {
    int active; /* holds the lease                           */
    uint64_t epoch;
    int64_t version;
    uint64_t applied;                /* gradients applied                         */
    int64_t samples;                 /* samples applied (what conf.sample_limit counts) */
    uint64_t rounds;                 /* rounds closed (sync, backup, groups)      */
    uint64_t dropped[PSSTORE_NDROP]; /* by psstore_drop_t              */
    uint64_t commits;                /* transactions that wrote weights           */
    uint64_t commit_ns;              /* their time, from the lease's WATCH to EXEC's
                                        reply (the applier applies nothing meanwhile) */
    uint64_t fenced;                 /* transactions refused: lease lost          */
    uint64_t unreplicated;           /* commits fewer than wait_replicas replicas
                                        acknowledged within wait_timeout_ms       */
    uint64_t bytes;                  /* payload bytes read and written            */
    uint64_t evicted;                /* a sparse model's rows deleted after its ttl */
    char stopped[256];               /* divergence guard reason, "" if running    */
    double lr_eff;                   /* of the last applied gradient              */
    int64_t tau_p50;                 /* staleness percentiles over the last 256   */
    int64_t tau_p99;                 /* applied gradients; -1 before any          */
    int64_t fresh_p50_ms;            /* freshness: ms from a sample's Kafka timestamp to the
                                        commit of the version holding it, over the oldest
                                        and newest sample of the last 256 applied batches;
                                        -1 before any */
    int64_t fresh_p99_ms;
} psstore_applier_stats_t;

const char *psstore_drop_name(psstore_drop_t d);

void psstore_applier_stats(psstore_applier_t *a, psstore_applier_stats_t *stats);
/* stats.samples alone, without the lock and the percentiles: cheap enough
 * to poll every few milliseconds (freshet run --samples). Any thread. */
int64_t psstore_applier_samples(psstore_applier_t *a);

/* The last Redis error of the applier's connection (one line). */
const char *psstore_applier_error(const psstore_applier_t *a);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_H */
