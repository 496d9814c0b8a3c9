/*
 * ingest.h - the one public header of the ingest module.
 *
 * The record codecs and the file readers (the compute core, no Kafka),
 * batching by positions, and the Kafka side: the dev broker, the producer,
 * the consumer and the replay resolver (librdkafka).
 *
 * Threads: the codec functions are reentrant; a dataset belongs to its
 * owner and may be read by any number of threads once loaded.
 */
#ifndef FRESHET_INGEST_H
#define FRESHET_INGEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "psstore/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ingest_format {
    INGEST_FORMAT_CSV = 0,    /* "label,f1,...,fD"                                 */
    INGEST_FORMAT_LIBSVM = 1, /* "label idx:val ..." with 1-based indices, sparse  */
    INGEST_FORMAT_F32 = 2,    /* little-endian float32 label then D float32s       */
    INGEST_FORMAT_IDX = 3,    /* files only: IDX images + IDX labels (.gz or not)  */
} ingest_format_t;

/* Parses "csv", "libsvm", "f32" or "idx"; FR_ERR_INVAL otherwise. */
fr_err_t ingest_format_parse(const char *name, ingest_format_t *format);
const char *ingest_format_name(ingest_format_t format);

/* Why a record was rejected. Each has a stable name for metrics labels. */
typedef enum ingest_reject {
    INGEST_OK = 0,
    INGEST_REJECT_BAD_NUMBER,    /* "bad_number": a field is not a number       */
    INGEST_REJECT_FEATURE_COUNT, /* "feature_count": not exactly D features,
                                    or an f32 record of the wrong length         */
    INGEST_REJECT_INDEX_RANGE,   /* "index_range": libsvm index 0, > D, repeated
                                    or not increasing                           */
    INGEST_REJECT_LABEL_RANGE,   /* "label_range": label invalid for the loss   */
    INGEST_REJECT_NONFINITE,     /* "nonfinite": NaN or infinity                */
    INGEST_REJECT_OVERSIZE,      /* "oversize": longer than max_record bytes    */
    INGEST_REJECT_MAGNITUDE,     /* "magnitude": a feature beyond max_abs       */
    INGEST_REJECT_QUARANTINED,   /* "quarantined": a position a trainer found
                                    poisonous once (ingest_batcher_quarantine)   */
    INGEST_REJECT_COUNT
} ingest_reject_t;

const char *ingest_reject_name(ingest_reject_t reason);

/* What labels must look like. */
typedef enum ingest_label {
    INGEST_LABEL_CLASS = 0,  /* an integer in [0, classes) (softmax)            */
    INGEST_LABEL_BINARY = 1, /* a value in [0, 1] (logistic; soft labels allowed) */
    INGEST_LABEL_REAL = 2,   /* any finite value (mse)                          */
} ingest_label_t;

/* A record layout another module decodes (sparse models: trainer/schema_sparse.h's
 * trainer_sparse_decode): the record rec[len] into x[features] and *y;
 * INGEST_OK or the reason. Reentrant; arg is the schema's decode_arg. */
typedef ingest_reject_t (*ingest_decode_fn)(const void *arg, const void *rec, size_t len, float *x,
                                            float *y);

typedef struct ingest_schema {
    int features; /* D > 0                                                */
    ingest_label_t label;
    int classes;             /* for INGEST_LABEL_CLASS                               */
    size_t max_record;       /* bytes; 0 = 1 MiB for text formats, no limit for f32
                                (whose records must be exactly 4(D+1) bytes anyway) */
    ingest_decode_fn decode; /* NULL: the format's decoder; else this one, for
                                every format, records up to the text limit  */
    const void *decode_arg;
    int aux;       /* > 0: x[aux] of a decoded record takes the record's aux value (its
                      Kafka header freshet-p: a sparse model's planted probability) when
                      it has one (ingest_batcher_add_aux); 0: none */
    float max_abs; /* > 0: a record with a feature of larger magnitude is rejected
                      (magnitude): finite, but it overflows a gradient; 0: no limit.
                      Not applied to records a decode hook reads */
} ingest_schema_t;

/* Decodes one record (a csv or libsvm line without its newline, though a
 * trailing "\n" or "\r\n" is accepted; or one f32 record; or whatever
 * schema->decode reads) into x[D] and *y.
 * Returns INGEST_OK or the reason; on rejection x and y may hold garbage
 * but nothing outside them is touched. Never reads past rec + len. */
ingest_reject_t ingest_decode(const ingest_schema_t *schema, ingest_format_t format,
                              const void *rec, size_t len, float *x, float *y);

/* A whole file in memory: n samples, x row-major [n x features], y[n]. */
typedef struct ingest_dataset {
    size_t n;
    int features;
    float *x;
    float *y;
    uint64_t rejected[INGEST_REJECT_COUNT];       /* records skipped, by reason */
    uint64_t first_bad_line[INGEST_REJECT_COUNT]; /* 1-based line (csv, libsvm:
                                                     physical lines, blank and
                                                     header lines counted),
                                                     record (f32) or sample
                                                     (idx) number of the
                                                     first rejection, 0 = none  */
} ingest_dataset_t;

/* Loads a data file (and for idx, its labels file) of the given format.
 * Files ending ".gz" are decompressed. csv and libsvm: one record a line,
 * blank lines ignored; f32: concatenated 4(D+1)-byte records; idx: images
 * (any dimensions whose product is D) scaled to [0,1] with labels from
 * labels_path. Rejected records are counted in ds->rejected and skipped; a
 * file that cannot be read or parsed at all is an error. ds is zeroed
 * first; release with ingest_dataset_fini(), also after an error. */
fr_err_t ingest_dataset_load(ingest_dataset_t *ds, const ingest_schema_t *schema,
                             ingest_format_t format, const char *data_path, const char *labels_path,
                             char *errstr, size_t size);
void ingest_dataset_fini(ingest_dataset_t *ds);

/* ------------------------------------------------------------------------
 * Record files (reader.c), read one record at a time: lines (text
 * layouts), or records each after its length as 4 bytes little-endian
 * (binary layouts). "-" is standard input; a name ending ".gz" is read
 * through zlib. One thread.
 * ---------------------------------------------------------------------- */
typedef struct ingest_file ingest_file_t;

/* Opens path for records of at most max bytes (1..2^30); NULL with errstr
 * (the path and the system's reason) when it cannot. */
ingest_file_t *ingest_file_open(const char *path, size_t max, char *errstr, size_t size);
void ingest_file_close(ingest_file_t *f);

/* The next line, without its "\n" or "\r\n", in *line[*len] (valid until
 * the next call). FR_ERR_NOTFOUND at the end; FR_ERR_RANGE for a line
 * longer than max, which is skipped (the next call reads on after it);
 * FR_ERR_IO or FR_ERR_PARSE (a corrupt gzip stream) with errstr. */
fr_err_t ingest_file_line(ingest_file_t *f, const char **line, size_t *len, char *errstr,
                          size_t size);

/* The next record after its length, in *rec[*len] (valid until the next
 * call). FR_ERR_NOTFOUND at the clean end; FR_ERR_PARSE when a length
 * exceeds max (not such a file) or the last record is cut short. */
fr_err_t ingest_file_framed(ingest_file_t *f, const void **rec, size_t *len, char *errstr,
                            size_t size);
/* The features a sample of the IDX images file at path (".gz" too) holds,
 * from its header alone: the product of all but its first dimension (28x28
 * images: 784) in *features. FR_ERR_IO, FR_ERR_UNSUPPORTED or FR_ERR_PARSE
 * (not an images file) with errstr. */
fr_err_t ingest_idx_features(const char *path, int *features, char *errstr, size_t size);

/* Encodes one sample (x[features], y) as a record of format (csv, libsvm
 * or f32) into buf of cap bytes: numbers as "%.9g" (exact for float32),
 * libsvm without zero features, f32 as 4(features+1) little-endian bytes.
 * Returns the record's length (no newline), or 0 when cap is too small or
 * the format is idx. ingest_decode reads back exactly x and y. */
size_t ingest_encode(ingest_format_t format, const float *x, int features, float y, char *buf,
                     size_t cap);

/* ------------------------------------------------------------------------
 * Batching (batcher.c): records of any number of partitions in, batches of
 * at most B samples out, each carrying per partition the half-open
 * position intervals it covers (docs/design.md "Positions, not records"):
 * from the position after that partition's previous batch (or the seek
 * target) to the position after its last record, minus the intervals
 * skipped by rule 2. Offset holes and rejected records are covered by the
 * batch that follows them; a batch with no samples (n = 0) carries
 * positions only. Pure: no Kafka, no Redis. One thread.
 * ---------------------------------------------------------------------- */
#define INGEST_TOPIC_MAX PSSTORE_TOPIC_MAX /* Kafka's longest topic name: 249 */

/* One partition's positions [from, to): psstore's range type, so a batch's
 * ranges go to the store as they are. A batch's topics are held in its
 * ranges allocation (ingest_batch_destroy frees both). */
typedef psstore_range_t ingest_range_t;

typedef struct ingest_batch {
    size_t n; /* samples                                            */
    int features;
    float *x; /* [n x features], owned by the batch                  */
    float *y; /* [n]                                                 */
    /* where each sample came from: partition[i] and offset[i] ([n]; NULL
     * when n = 0 and for batches not made by a batcher); its topic is the
     * one of the range of that partition holding the offset */
    int32_t *partition;
    int64_t *offset;
    ingest_range_t *ranges;
    size_t nranges;
    int64_t min_ts_ms, max_ts_ms; /* Kafka timestamps of its samples (n > 0)   */
    int64_t generation;           /* replay generation of its partitions                 */
    uint64_t seq;                 /* the consumer's number for it (ingest_consumer_done) */
    char reason[32];              /* n = 0: why ("decode", "retention", "skipped"); else "" */
} ingest_batch_t;

/* Releases a batch from the batcher (x, y and ranges are separate
 * allocations). NULL is a no-op. */
void ingest_batch_destroy(ingest_batch_t *batch);

typedef struct ingest_batcher ingest_batcher_t;

/* A batcher of batch samples per batch, decoding with schema and format
 * (csv, libsvm or f32). NULL with errstr on bad arguments or out of
 * memory. Caller frees with ingest_batcher_destroy(). */
ingest_batcher_t *ingest_batcher_new(const ingest_schema_t *schema, ingest_format_t format,
                                     int batch, char *errstr, size_t size);
void ingest_batcher_destroy(ingest_batcher_t *bt);

/* A partition (re)starts at position pos under replay generation gen,
 * skipping the applied intervals skip[nskip] above it (rule 2; sorted,
 * disjoint, all >= pos). Records of the partition still held in the open
 * batch are flushed first: *flushed receives that batch, or NULL. */
fr_err_t ingest_batcher_seek(ingest_batcher_t *bt, const char *topic, int32_t partition,
                             int64_t pos, const int64_t (*skip)[2], size_t nskip, int64_t gen,
                             ingest_batch_t **flushed);

/* Records of the partition below position `to` (set after its seek, which
 * resets it to 0) go into batches that hold no other partition and no
 * position of it from `to` on. A sharded model's consumer sets it where
 * the shards' applied positions differ (psstore_partition_offsets_t's
 * alone_to). FR_ERR_NOTFOUND for a partition not seeked, FR_ERR_STATE
 * while the open batch holds it. */
fr_err_t ingest_batcher_alone(ingest_batcher_t *bt, const char *topic, int32_t partition,
                              int64_t to);

/* The partition is gone (revoked): its part of the open batch is flushed
 * through *flushed (NULL when there was none) and its state forgotten. */
fr_err_t ingest_batcher_revoke(ingest_batcher_t *bt, const char *topic, int32_t partition,
                               ingest_batch_t **flushed);

/* One record at offset of a partition that was seeked. Records below the
 * position after the last record taken from the partition (a redelivery,
 * or below the seek) or inside a skipped interval are ignored; others are
 * decoded: a good one becomes a sample, a bad one is counted in *why
 * (INGEST_OK for a sample or an ignored record) and covered by the next
 * batch. When the open batch reaches B samples it is returned through
 * *full (else NULL). A record that may not join the open batch
 * (ingest_batcher_alone) has the open batch returned through *full first
 * and starts the next; should that one fill at once (B = 1), it goes out
 * with the next record or flush. Timestamps are taken as given (-1: none). */
fr_err_t ingest_batcher_add(ingest_batcher_t *bt, const char *topic, int32_t partition,
                            int64_t offset, int64_t ts_ms, const void *rec, size_t len,
                            ingest_reject_t *why, ingest_batch_t **full);
/* The same with the record's aux value (NAN: none), written to x[aux] of
 * its sample when the schema has an aux slot. */
fr_err_t ingest_batcher_add_aux(ingest_batcher_t *bt, const char *topic, int32_t partition,
                                int64_t offset, int64_t ts_ms, const void *rec, size_t len,
                                float aux, ingest_reject_t *why, ingest_batch_t **full);
/* A record decoded ahead of its turn by ingest_batcher_decode: its row
 * x[D] (read only when why is INGEST_OK), label and reason. */
typedef struct ingest_decoded {
    const float *x;
    float y;
    ingest_reject_t why;
} ingest_decoded_t;
/* Decodes rec[len] exactly as ingest_batcher_add would, into x[D] and *y.
 * Reads nothing of bt but its schema and format, which never change, so
 * any thread may call it while the owner adds. */
ingest_reject_t ingest_batcher_decode(const ingest_batcher_t *bt, const void *rec, size_t len,
                                      float *x, float *y);
/* ingest_batcher_add_aux for a record decoded ahead: the same rules in the
 * same order (redelivery, skip, quarantine, batch boundaries), with pre's
 * result in place of decoding; a good row is copied in. FR_ERR_INVAL for
 * a NULL pre, or a good one without its row. */
fr_err_t ingest_batcher_add_decoded(ingest_batcher_t *bt, const char *topic, int32_t partition,
                                    int64_t offset, int64_t ts_ms, const ingest_decoded_t *pre,
                                    float aux, ingest_reject_t *why, ingest_batch_t **full);
/* Positions of a partition (sorted ascending, duplicates allowed) whose
 * records are rejected as INGEST_REJECT_QUARANTINED, covered like any
 * rejected record, until the partition's next seek: the store's
 * quarantine (docs/design.md "Poison in a batch"), set after each seek.
 * FR_ERR_NOTFOUND for a partition not seeked, FR_ERR_NOMEM. */
fr_err_t ingest_batcher_quarantine(ingest_batcher_t *bt, const char *topic, int32_t partition,
                                   const int64_t *pos, size_t n);
/* The Kafka header a record's aux value travels in: decimal text. */
#define INGEST_AUX_HEADER "freshet-p"

/* Flushes the open batch (linger_ms passed, a replay, shutdown); NULL when
 * it covers nothing. A batch of rejected records only is an n = 0 batch
 * with reason "decode". */
ingest_batch_t *ingest_batcher_flush(ingest_batcher_t *bt);

/* Covers [next, to) of a partition with an n = 0 batch of reason (e.g.
 * "retention" when the log start moved past the watermark, or "start" for a
 * partition first seen at a position above 0) and moves its next position
 * to `to`. NULL, changing nothing, when the open batch holds the partition,
 * the partition is unknown or to <= next; NULL with next moved when the
 * whole interval was skipped. */
ingest_batch_t *ingest_batcher_cover(ingest_batcher_t *bt, const char *topic, int32_t partition,
                                     int64_t to, const char *reason);

/* Nonzero while the open batch holds anything of the partition. */
int ingest_batcher_holds(const ingest_batcher_t *bt, const char *topic, int32_t partition);
/* The open batch's coverage of a partition, [*next, *end): next is the
 * position after the partition's previous batch (or its seek target), end
 * the position after the last record taken (end == next while the open
 * batch holds nothing of it). FR_ERR_NOTFOUND for a partition not seeked. */
fr_err_t ingest_batcher_position(const ingest_batcher_t *bt, const char *topic, int32_t partition,
                                 int64_t *next, int64_t *end);
/* The position after the last record of the partition skipped as applied
 * (its skip list) since its seek, 0 when none. */
fr_err_t ingest_batcher_skipped(const ingest_batcher_t *bt, const char *topic, int32_t partition,
                                int64_t *skipped);

/* ------------------------------------------------------------------------
 * Kafka (librdkafka), for services; not in FRESHET_CORE_ONLY builds.
 * ---------------------------------------------------------------------- */

/* The dev broker: librdkafka's mock cluster, in this process. */
typedef struct ingest_broker ingest_broker_t;

/* nbrokers mock brokers (1..16) on loopback; NULL with errstr on failure.
 * Caller frees with ingest_broker_destroy(). */
ingest_broker_t *ingest_broker_new(int nbrokers, char *errstr, size_t size);
void ingest_broker_destroy(ingest_broker_t *b);
/* Creates topic with partitions (replication 1). */
fr_err_t ingest_broker_topic(ingest_broker_t *b, const char *topic, int partitions, char *errstr,
                             size_t size);
/* "127.0.0.1:port,..." (borrowed for the life of b). */
const char *ingest_broker_bootstraps(const ingest_broker_t *b);
/* Takes every broker down (up = 0) or brings them back (up = 1). */
fr_err_t ingest_broker_set_up(ingest_broker_t *b, int up);

/* A producer (freshet produce, dead-letter topics). Thread-safe, as
 * librdkafka's producer is. */
typedef struct ingest_producer ingest_producer_t;

/* props: nprops key/value pairs of librdkafka properties, passed verbatim
 * after bootstrap.servers. NULL with errstr on a bad property. */
ingest_producer_t *ingest_producer_new(const char *bootstrap, const char *const (*props)[2],
                                       size_t nprops, char *errstr, size_t size);
void ingest_producer_destroy(ingest_producer_t *p);
/* Queues one message (partition -1: by key, or librdkafka's default
 * partitioner without key); the payload is copied. header (may be NULL) is
 * one name=value header, e.g. the reason of a dead letter. Waits while the
 * local queue is full. */
fr_err_t ingest_producer_send(ingest_producer_t *p, const char *topic, int32_t partition,
                              const void *key, size_t klen, const void *value, size_t vlen,
                              const char *header_name, const char *header_value);
/* Waits up to timeout_ms for every queued message; counts deliveries. */
fr_err_t ingest_producer_flush(ingest_producer_t *p, int timeout_ms, uint64_t *delivered,
                               uint64_t *failed);
const char *ingest_producer_error(const ingest_producer_t *p);
/* The partition count of topic from the cluster's metadata, waiting up to
 * timeout_ms: > 0, or a negative fr_err_t (FR_ERR_NOTFOUND, FR_ERR_KAFKA,
 * FR_ERR_TIMEOUT). */
int ingest_producer_partitions(ingest_producer_t *p, const char *topic, int timeout_ms);

/* ------------------------------------------------------------------------
 * The Kafka consumer (consumer.c): a consumer-group member that decodes
 * records into batches (above) and hands them to the trainers through a
 * bounded queue, starting each assigned partition where the store says
 * (docs/design.md "Offsets").
 *
 * Threads: ingest_consumer_start runs one poll thread per consumer. The
 * rebalance callback runs inside rd_kafka_consumer_poll (and
 * rd_kafka_consumer_close) on that poll thread, as do decoding, batching,
 * dead letters, pause/resume and the Kafka commits; the poll thread owns
 * the store connection it reads offsets with. librdkafka's log callback
 * runs on librdkafka's threads and only hands the line to fr_log.
 * ingest_consumer_next and ingest_consumer_stats are thread-safe; new,
 * start, stop and destroy belong to the owner's thread.
 * ---------------------------------------------------------------------- */
typedef struct ingest_consumer ingest_consumer_t;

typedef struct ingest_consumer_conf {
    const char *bootstrap;         /* may be NULL when props name bootstrap.servers */
    const char *const (*props)[2]; /* nprops librdkafka properties, passed verbatim */
    size_t nprops;                 /* (they override everything but the two below) */
    const char *topic;             /* the topic to subscribe to                      */
    const char *group_id;          /* NULL or "": "freshet.<model>"                   */
    const char *redis_url;         /* the store that holds the offsets               */
    const char *model;             /* the model whose offsets decide where to start  */
    ingest_schema_t schema;        /* how to decode                                  */
    ingest_format_t format;        /* csv, libsvm or f32                             */
    int batch;                     /* samples per batch, > 0                         */
    int queue;                     /* queue capacity in batches, > 0                 */
    int linger_ms;                 /* flush a batch this long after its first record */
    int start_latest;              /* partitions the store never saw: 0 earliest, 1 latest */
    const char *dead_letter_topic; /* NULL or "": rejected records are only counted  */
    int gap_timeout_ms;            /* rule 3 after this long; 0: 10 s, < 0: never    */
    fr_metrics_t *metrics;         /* may be NULL                                    */
    int whole_topic;    /* 1: every partition of the topic, without joining the group (one
                           process owns the topic: freshet run); 0: the consumer group */
    int decode_threads; /* helpers that decode a backlog's text records beside the poll
                           thread (consumer_decode.c); 0: none; < 0: 1 where the machine
                           has 2 or more cores. Never for f32, whose decode is a copy */
} ingest_consumer_conf_t;

typedef struct ingest_consumer_stats {
    uint64_t consumed;                      /* records received from Kafka              */
    uint64_t rejected[INGEST_REJECT_COUNT]; /* records rejected, by reason              */
    uint64_t batches;                       /* batches queued (n = 0 ones included)     */
    uint64_t dead_letters;                  /* rejected records sent to the dead-letter topic */
    uint64_t pauses;                        /* times the queue filled and paused Kafka  */
    uint64_t gap_seeks;                     /* seeks back to a stuck watermark (rule 3) */
    uint64_t rewinds;                       /* partitions rewound by replays            */
    uint64_t retention_skips;   /* fetches below the log start: records retention deleted
                                   before they were read, marked dropped ("retention") */
    uint64_t fetch_wakeups;     /* librdkafka below 2.1: times the poll thread woke a fetcher
                                   stopped by its prefetch limit (consumer.c) */
    uint64_t decoded_ahead;     /* records the decode helpers decoded, off the poll thread
                                   (consumer_decode.c) */
    uint64_t rebalance_drained; /* records a rebalance found held in a decode window and
                                   handed to the batcher before it (consumer.c) */
    int paused;                 /* partitions paused now                    */
    int assigned;               /* partitions assigned now                  */
    int64_t lag; /* records between the log ends and the store's watermarks, summed over
                    the assigned partitions (as of the last second's tick) */
} ingest_consumer_stats_t;

/* A consumer of conf (copied: the caller's strings may go after the call;
 * metrics is borrowed for the consumer's life). Always sets
 * enable.auto.offset.store=false and enable.auto.commit=false: Kafka's
 * committed offsets follow the store, never the reverse. NULL with errstr
 * on a bad argument or property. Caller frees with ingest_consumer_destroy(). */
ingest_consumer_t *ingest_consumer_new(const ingest_consumer_conf_t *conf, char *errstr,
                                       size_t size);
/* Subscribes and starts the poll thread. FR_ERR_STATE when already
 * started; FR_ERR_KAFKA or FR_ERR_NOMEM otherwise on failure (then no
 * thread runs). */
fr_err_t ingest_consumer_start(ingest_consumer_t *c);
/* The next batch, waiting up to timeout_ms (0: no wait); NULL on timeout,
 * or at once when the consumer stopped and the queue is empty. The caller
 * owns the batch and frees it with ingest_batch_destroy(). */
ingest_batch_t *ingest_consumer_next(ingest_consumer_t *c, int timeout_ms);
/* The trainer is done with a batch from ingest_consumer_next: its
 * gradient was pushed as stream entry stream_id (psstore_client_last_id),
 * or, with stream_id NULL or "", the batch was abandoned. Until then the
 * batch counts as computing, and after a push as waiting in the stream
 * while the entry is there: rule 3 (the gap rule) seeks back to a stuck
 * watermark only when no such outstanding batch holds it, so every batch
 * taken must be reported. Call before destroying the batch. Thread-safe. */
void ingest_consumer_done(ingest_consumer_t *c, const ingest_batch_t *batch, const char *stream_id);
/* A batch reported done was lost after all: its gradient was dropped by
 * the in-process channel (the applier lost its lease) or its push failed.
 * For the next gap_timeout the gap rule reads a stuck watermark again
 * after 1 s instead of gap_timeout (docs/design.md "Offsets"). Any
 * thread. */
void ingest_consumer_lost(ingest_consumer_t *c);
/* Stops the poll thread: the open batch is flushed into the queue, the
 * partitions are revoked (their batches queued too) and the group left.
 * Batches still queued remain available to ingest_consumer_next. Idempotent. */
void ingest_consumer_stop(ingest_consumer_t *c);
/* Stops, drops queued batches, flushes dead letters (up to 5 s) and frees.
 * NULL is a no-op. */
void ingest_consumer_destroy(ingest_consumer_t *c);
/* A consistent enough snapshot of the counters (each read atomically). */
void ingest_consumer_stats(ingest_consumer_t *c, ingest_consumer_stats_t *st);

/* ------------------------------------------------------------------------
 * Replay resolution against Kafka (resolver.c): the log bounds of a
 * partition and the offset a replay request means for it. Used by the
 * owning consumer and by `freshet replay`'s dry run. One thread.
 * ---------------------------------------------------------------------- */
typedef struct ingest_resolver ingest_resolver_t;

/* A resolver with its own librdkafka consumer handle (no group, never
 * commits). props as for the producer. NULL with errstr. */
ingest_resolver_t *ingest_resolver_new(const char *bootstrap, const char *const (*props)[2],
                                       size_t nprops, char *errstr, size_t size);
void ingest_resolver_destroy(ingest_resolver_t *rs);
const char *ingest_resolver_error(const ingest_resolver_t *rs);
/* The partitions of topic from the cluster's metadata, ascending; caller
 * frees *parts. FR_ERR_NOTFOUND when the topic does not exist. */
fr_err_t ingest_resolver_partitions(ingest_resolver_t *rs, const char *topic, int32_t **parts,
                                    size_t *n);
/* Resolves r for one partition whose store watermark is watermark (-1 when
 * the store has never seen it: SHIFT then counts from the log start):
 * EARLIEST -> log start, LATEST -> log end, OFFSET -> the listed offset,
 * SHIFT -> watermark + shift, DATETIME -> the offset of the first record
 * whose timestamp is >= at_ms (rd_kafka_offsets_for_times; where the broker
 * answers -1 though records exist, a binary search on the timestamps of the
 * records themselves), or the log end when there is none. The target is
 * clamped to [*lo, *hi], the log start and end, which are returned too
 * (all three written only on success). Timestamps are assumed not to
 * decrease along a partition, as Kafka's own time index assumes.
 * FR_ERR_INVAL when r does not apply to the partition; FR_ERR_NOTFOUND for
 * an unknown topic or partition; FR_ERR_KAFKA with the resolver's error
 * when Kafka does not answer within timeout_ms. */
fr_err_t ingest_resolver_target(ingest_resolver_t *rs, const psstore_replay_t *r, const char *topic,
                                int32_t partition, int64_t watermark, int timeout_ms,
                                int64_t *target, int64_t *lo, int64_t *hi);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_INGEST_H */
