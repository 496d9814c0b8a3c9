/*
 * positions.h - positions in Kafka's partitions, with no Redis
 * (fr_positions): the offset interval arithmetic of docs/design.md
 * "Offsets", the replay request language of docs/design.md "Replay", and
 * the cuts of a model into shards of docs/design.md "Shards". Pure
 * functions over plain memory, so the compute core and ingest build with
 * it; psstore/store/ keeps these positions in Redis.
 *
 * Threads: the functions are reentrant; a psstore_partition_offsets_t or a
 * psstore_replay_t belongs to its caller.
 */
#ifndef FRESHET_PSSTORE_POSITIONS_H
#define FRESHET_PSSTORE_POSITIONS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Offsets: per partition a watermark (every position below it applied or
 * dropped) and the applied half-open intervals [from, to) above it, kept
 * sorted, disjoint and non-adjacent (adjacent ones merge). Pure functions.
 * ---------------------------------------------------------------------- */
#define PSSTORE_TOPIC_MAX 249 /* Kafka's longest topic name (INGEST_TOPIC_MAX) */

typedef struct psstore_span {
    int64_t from, to; /* [from, to), from < to */
} psstore_span_t;

/* One batch's positions [from, to) in one partition (docs/design.md
 * "Positions, not records"): THE partition interval of freshet, carried by
 * ingest's batches (ingest_range_t is this type), the grads stream's
 * messages and the applier. from and to are a psstore_span_t's members in
 * its order (psstore_range_span). */
typedef struct psstore_range {
    const char *topic; /* borrowed from whoever owns the array */
    int32_t partition;
    int64_t from, to; /* [from, to) */
} psstore_range_t;

/* The interval of r as a span. */
static inline psstore_span_t psstore_range_span(const psstore_range_t *r)
{
    return (psstore_span_t){r->from, r->to};
}

/* A copy of ranges[n] in one allocation that also holds a copy of each
 * topic, so it outlives the original's owner; the caller frees it with
 * free(). NULL when n is 0 or out of memory. */
psstore_range_t *psstore_ranges_dup(const psstore_range_t *ranges, size_t n);

typedef struct psstore_partition_offsets {
    int64_t watermark;
    int64_t generation;    /* replay generation of the last rewrite (0: none) */
    psstore_span_t *spans; /* above the watermark; malloc'ed, may be NULL */
    size_t nspans, cap;
    /* A sharded model's read (psstore_offsets_read): positions below it
     * are applied on some shards and not on others, so a batch of them
     * must hold no other partition; 0 when every shard holds the same. */
    int64_t alone_to;
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
 * Text forms of partitions, positions and intervals (offsets.c): the one
 * place that writes and reads them. Formatters write at most size bytes
 * (NUL included) and return the length of the whole text, as snprintf
 * does. Parsers take a length (the text need not be NUL-terminated), never
 * read past it, and accept only what the formatter writes: positions,
 * partitions and targets are plain decimals (no sign, no spaces).
 * ---------------------------------------------------------------------- */
/* "topic/partition" with its NUL: 249 + '/' + 10 digits + 1. */
#define PSSTORE_KEY_MAX (PSSTORE_TOPIC_MAX + 12)

/* Nonzero when s[len] is a Kafka topic name: 1..249 bytes [A-Za-z0-9._-]. */
int psstore_topic_ok(const char *s, size_t len);

/* "topic/partition": the field of the offsets and logend hashes, the key
 * of a snapshot's offsets lines and of a rewind target. */
int psstore_key_format(char *buf, size_t size, const char *topic, int32_t partition);
/* Splits the key s[len] at its last '/': a topic of *tlen >= 1 bytes and
 * a partition of 0..INT32_MAX. FR_ERR_PARSE otherwise. */
fr_err_t psstore_key_split(const char *s, size_t len, size_t *tlen, int32_t *partition);
/* As psstore_key_split, copying the topic NUL-terminated to topic[tsize];
 * FR_ERR_PARSE also when it does not fit. */
fr_err_t psstore_key_parse(const char *s, size_t len, char *topic, size_t tsize,
                           int32_t *partition);
/* qsort order of NUL-terminated keys: by topic bytes, then partition number
 * (a key that does not split sorts as a topic with partition 0). */
int psstore_key_cmp(const char *x, const char *y);

/* "a-b": the span [a, b). */
int psstore_span_format(char *buf, size_t size, psstore_span_t sp);
/* "a-b,c-d": spans[n], as the offsets text lists them after its ';'. */
int psstore_spans_format(char *buf, size_t size, const psstore_span_t *spans, size_t n);
/* Parses s[len] as one span "a-b" with 0 <= a < b. FR_ERR_PARSE otherwise. */
fr_err_t psstore_span_parse(const char *s, size_t len, psstore_span_t *sp);
/* Parses the span list at text[start..len) (the offsets text after its
 * ';'; at least one span) and appends its spans to po: each non-empty and
 * starting above the end of the one before, the first above po's
 * watermark. FR_ERR_PARSE with errstr naming the byte of text at fault,
 * or FR_ERR_NOMEM; po keeps what it had then plus the spans read. */
fr_err_t psstore_spans_parse(psstore_partition_offsets_t *po, const char *text, size_t len,
                             size_t start, char *errstr, size_t size);

/* "topic:partition:from:to": one range of the grads stream's ranges field. */
int psstore_range_format(char *buf, size_t size, const psstore_range_t *r);
/* "t:p:f:t,t:p:f:t": the whole ranges field of ranges[n]. */
int psstore_ranges_format(char *buf, size_t size, const psstore_range_t *ranges, size_t n);
/* What psstore_range_parse found wrong, for its caller's message. */
typedef enum psstore_range_fault {
    PSSTORE_RANGE_OK = 0,
    PSSTORE_RANGE_EMPTY,     /* no bytes at all                            */
    PSSTORE_RANGE_SHAPE,     /* not four fields separated by ':'           */
    PSSTORE_RANGE_TOPIC,     /* the topic breaks psstore_topic_ok          */
    PSSTORE_RANGE_PARTITION, /* the partition is not a decimal 0..INT32_MAX */
    PSSTORE_RANGE_POSITION,  /* from or to is not a decimal 0..INT64_MAX    */
    PSSTORE_RANGE_ORDER,     /* from >= to                                 */
} psstore_range_fault_t;
/* Parses s[len] as one range into *r, copying its topic NUL-terminated to
 * topic[tsize] (r->topic then points there; tsize > PSSTORE_TOPIC_MAX
 * always suffices). *tlen receives the topic's length in s once the shape
 * is right. r is untouched unless PSSTORE_RANGE_OK is returned, but for
 * PSSTORE_RANGE_ORDER, which leaves the positions in r->from and r->to. */
psstore_range_fault_t psstore_range_parse(const char *s, size_t len, psstore_range_t *r,
                                          char *topic, size_t tsize, size_t *tlen);

/* One partition's replay target, resolved against Kafka by its consumer. */
typedef struct psstore_rewind {
    const char *topic;
    int32_t partition;
    int64_t target; /* the new watermark */
} psstore_rewind_t;

/* "topic/partition=target,...": the targets of a rewind request, into a
 * malloc'ed NUL-terminated text (caller frees *out; *len excludes the
 * NUL). FR_ERR_INVAL when a target has a negative partition or target, a
 * topic longer than 249 bytes or holding '/', '=' or ',' (*bad receives its
 * index); FR_ERR_NOMEM. */
fr_err_t psstore_targets_format(const psstore_rewind_t *targets, size_t n, char **out, size_t *len,
                                size_t *bad);
/* Splits s[len], "topic/partition=value" (a rewind target, or a line of a
 * snapshot's offsets), at its first '=': the key parses as with
 * psstore_key_parse into topic[tsize] and *partition, and the value is
 * s[*voff..len). FR_ERR_PARSE otherwise. */
fr_err_t psstore_keyval_parse(const char *s, size_t len, char *topic, size_t tsize,
                              int32_t *partition, size_t *voff);
/* Parses one target "topic/partition=target" of s[len]. FR_ERR_PARSE
 * otherwise. */
fr_err_t psstore_target_parse(const char *s, size_t len, char *topic, size_t tsize,
                              int32_t *partition, int64_t *target);

/* ------------------------------------------------------------------------
 * Replay requests (replayspec.c): an operator's rewind with the verbs of
 * kafka-consumer-groups --reset-offsets, kept symbolically in the store
 * (psstore_request_replay) and resolved per partition against Kafka by
 * the consumer that owns it (ingest_resolver_target; docs/design.md
 * "Replay"). Pure: no Kafka, no Redis.
 * ---------------------------------------------------------------------- */
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

/* ------------------------------------------------------------------------
 * Shards (docs/design.md "Shards"): a model's flat vector cut into S
 * contiguous ranges, shard k holding [bounds[k], bounds[k + 1]).
 * ---------------------------------------------------------------------- */
#define PSSTORE_SHARDS_MAX 64

/* Cuts the nparams floats of an MLP with these layers ("784-256-10", the
 * layout of model/model.h) into S ranges at row boundaries of the weight
 * matrices (or where a bias vector starts or ends), each cut at the
 * candidate nearest to k * nparams / S: balanced by bytes as far as rows
 * allow. bounds[S + 1] receives 0 = bounds[0] < ... < bounds[S] = nparams.
 * FR_ERR_INVAL with errstr when S is outside 1..PSSTORE_SHARDS_MAX, the
 * layers do not parse or do not hold nparams floats, or the model has
 * fewer cut points than shards. */
fr_err_t psstore_shard_bounds(const char *layers, size_t nparams, int S, size_t *bounds,
                              char *errstr, size_t size);
/* Parses "0,1000,2000" (S + 1 increasing numbers from 0) into bounds; *S
 * receives the number of shards. FR_ERR_PARSE otherwise. */
fr_err_t psstore_shard_bounds_parse(const char *text, size_t len, size_t *bounds, int *S);
/* Writes bounds[S + 1] as "0,1000,2000" into buf; the length written. */
int psstore_shard_bounds_format(char *buf, size_t size, const size_t *bounds, int S);
/* Parses "0-3", "2" or "0,2-3" into a mask of the shards of S listed
 * (bit k for shard k). FR_ERR_INVAL with errstr on anything else or a
 * shard outside 0..S-1 (S <= 0: any below PSSTORE_SHARDS_MAX). */
fr_err_t psstore_shard_list_parse(const char *text, int S, uint64_t *mask, char *errstr,
                                  size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_POSITIONS_H */
