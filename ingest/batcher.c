/*
 * batcher.c - records of any number of partitions in, batches of at most B
 * samples out, each carrying the position intervals it covers (the
 * contract: ingest.h "Batching"; docs/design.md "Offsets", "Positions, not
 * records").
 *
 * Per partition a hash table entry keeps next, end, the skip list, the
 * quarantine and the generation; the open batch's ranges are computed only
 * when it is finalized, so taking a record costs one hash lookup, one
 * binary search of the skip list and one decode into the open buffers. A
 * finalized batch takes those buffers as they are (B rows, n written) and
 * the open batch goes on in fresh ones: the decode is a sample's only copy.
 * In freshet's processes (fr_mem_keep) the heap hands those fresh buffers
 * the pages of batches the trainers freed, so they are warm.
 *
 * Threads: one batcher belongs to one thread.
 */
#include <assert.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ingest/ingest.h"

/* Hash buckets allocated at first; doubled when partitions outnumber them. */
#define FIRST_BUCKETS ((size_t)16)

typedef struct part {
    struct part *chain; /* next partition in the same hash bucket   */
    uint64_t hash;
    char topic[INGEST_TOPIC_MAX + 1];
    int32_t partition;
    int64_t next;       /* position after the previous batch coverage, or the seek target */
    int64_t end;        /* position after the last record taken; == next when not held    */
    int64_t (*skip)[2]; /* [nskip] sorted disjoint [from, to), all >= the seek target      */
    size_t nskip;
    int64_t gen;
    int64_t skipped;     /* after the last record skipped as applied since the seek (0: none) */
    int64_t alone_to;    /* records below it go into batches of this partition alone */
    int64_t *quarantine; /* [nquarantine] sorted: positions rejected as quarantined */
    size_t nquarantine;
    int held; /* listed in bt->open */
} part_t;

struct ingest_batcher {
    ingest_schema_t schema;
    ingest_format_t format;
    size_t cap;  /* B */
    size_t d;    /* features */
    float *x;    /* open batch samples [B x d]; handed to each finalized batch */
    float *y;    /* [B] */
    int32_t *sp; /* [B]: each sample's partition, handed over like x */
    int64_t *so; /* [B]: each sample's offset */
    size_t n;    /* samples in the open batch */
    int64_t min_ts, max_ts;
    part_t **buckets; /* [nbuckets], a power of two */
    size_t nbuckets;
    size_t nparts;
    part_t **open; /* partitions the open batch holds; capacity >= nparts */
    size_t nopen;
    size_t capopen;
    const part_t *alone; /* the open batch holds records of this partition below its
                          * alone_to, and nothing else; NULL when it does not */
};

/* ------------------------------------------------------------------------
 * Batches.
 * ---------------------------------------------------------------------- */

void ingest_batch_destroy(ingest_batch_t *batch)
{
    if (batch == NULL)
        return;
    free(batch->x);
    free(batch->y);
    free(batch->partition);
    free(batch->offset);
    free(batch->ranges);
    free(batch);
}

/* Room for one range's topic: a batch's ranges allocation holds nranges
 * ranges, then one of these per range, which the range's topic points at. */
typedef char topic_slot_t[INGEST_TOPIC_MAX + 1];

/* The topic slots of a batch allocated for nranges ranges. */
static topic_slot_t *batch_topics(ingest_batch_t *batch, size_t nranges)
{
    return (topic_slot_t *)(void *)(batch->ranges + nranges);
}

/*
 * An empty batch with room for cap samples of d features (x and y stay
 * NULL when n is 0) and nranges zeroed ranges with their topic slots.
 * NULL when out of memory.
 */
static ingest_batch_t *batch_alloc(size_t n, size_t cap, size_t d, size_t nranges)
{
    ingest_batch_t *batch = calloc(1, sizeof(*batch));
    if (batch == NULL)
        return NULL;
    if (n > 0) {
        batch->x = malloc(cap * d * sizeof(float));
        batch->y = malloc(cap * sizeof(float));
        batch->partition = malloc(cap * sizeof(int32_t));
        batch->offset = malloc(cap * sizeof(int64_t));
        if (batch->x == NULL || batch->y == NULL || batch->partition == NULL ||
            batch->offset == NULL)
            goto err;
    }
    if (nranges > 0) {
        batch->ranges = calloc(nranges, sizeof(*batch->ranges) + sizeof(topic_slot_t));
        if (batch->ranges == NULL)
            goto err;
    }
    return batch;
err:
    ingest_batch_destroy(batch);
    return NULL;
}

/* ------------------------------------------------------------------------
 * Partitions: a chained hash table keyed by (topic, partition).
 * ---------------------------------------------------------------------- */

/* Nonzero when topic is a name of 1..INGEST_TOPIC_MAX characters. */
static int topic_ok(const char *topic)
{
    if (topic == NULL || topic[0] == '\0')
        return 0;
    for (size_t i = 1; i <= INGEST_TOPIC_MAX; i++)
        if (topic[i] == '\0')
            return 1;
    return 0;
}

/* FNV-1a over the topic's bytes, then the partition's (low byte first). */
static uint64_t part_hash(const char *topic, int32_t partition)
{
    uint32_t u = (uint32_t)partition;
    unsigned char le[4] = {u & 0xffu, (u >> 8) & 0xffu, (u >> 16) & 0xffu, u >> 24};
    return fr_fnv1a(fr_fnv1a(FR_FNV1A_SEED, topic, strlen(topic)), le, sizeof(le));
}

/* The partition's state, or NULL when it was never seeked (or revoked). */
static part_t *part_find(const ingest_batcher_t *bt, const char *topic, int32_t partition)
{
    uint64_t h = part_hash(topic, partition);
    for (part_t *p = bt->buckets[h & (bt->nbuckets - 1)]; p != NULL; p = p->chain)
        if (p->hash == h && p->partition == partition && strcmp(p->topic, topic) == 0)
            return p;
    return NULL;
}

/*
 * Makes room for one more partition: the hash table doubles when the
 * partitions would outnumber its buckets, and the open list grows so that
 * listing a partition there never allocates. FR_ERR_NOMEM changes nothing.
 */
static fr_err_t part_reserve(ingest_batcher_t *bt)
{
    if (FR_GROW(bt->open, bt->capopen, bt->nparts + 1) != FR_OK)
        return FR_ERR_NOMEM;
    if (bt->nparts + 1 > bt->nbuckets) {
        size_t nb = bt->nbuckets * 2;
        part_t **buckets = calloc(nb, sizeof(*buckets));
        if (buckets == NULL)
            return FR_ERR_NOMEM;
        for (size_t i = 0; i < bt->nbuckets; i++) {
            part_t *p = bt->buckets[i];
            while (p != NULL) {
                part_t *chain = p->chain;
                p->chain = buckets[p->hash & (nb - 1)];
                buckets[p->hash & (nb - 1)] = p;
                p = chain;
            }
        }
        free(bt->buckets);
        bt->buckets = buckets;
        bt->nbuckets = nb;
    }
    return FR_OK;
}

/* Links a new partition into the table; part_reserve() ran before it. */
static void part_insert(ingest_batcher_t *bt, part_t *p)
{
    size_t b = p->hash & (bt->nbuckets - 1);
    p->chain = bt->buckets[b];
    bt->buckets[b] = p;
    bt->nparts++;
}

/* Unlinks p from the table and frees it; p is not held. */
static void part_remove(ingest_batcher_t *bt, part_t *p)
{
    part_t **link = &bt->buckets[p->hash & (bt->nbuckets - 1)];
    while (*link != p)
        link = &(*link)->chain;
    *link = p->chain;
    bt->nparts--;
    free(p->skip);
    free(p->quarantine);
    free(p);
}

/* qsort order of the open list: by topic, then partition. */
static int part_cmp(const void *a, const void *b)
{
    const part_t *pa = *(const part_t *const *)a;
    const part_t *pb = *(const part_t *const *)b;
    int c = strcmp(pa->topic, pb->topic);
    if (c != 0)
        return c;
    return pa->partition < pb->partition ? -1 : pa->partition > pb->partition;
}

/* ------------------------------------------------------------------------
 * Skip intervals and coverage.
 * ---------------------------------------------------------------------- */

/* The index of p's first skip interval that ends after pos (binary search). */
static size_t skip_first_after(const part_t *p, int64_t pos)
{
    size_t lo = 0, hi = p->nskip;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->skip[mid][1] <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Nonzero when offset is one of p's quarantined positions. */
static int quarantine_contains(const part_t *p, int64_t offset)
{
    size_t lo = 0, hi = p->nquarantine;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->quarantine[mid] < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < p->nquarantine && p->quarantine[lo] == offset;
}

/* Nonzero when offset lies inside one of p's skip intervals. */
static int skip_contains(const part_t *p, int64_t offset)
{
    size_t i = skip_first_after(p, offset);
    return i < p->nskip && p->skip[i][0] <= offset;
}

/*
 * The intervals of [from, to) of p outside its skip intervals, in order:
 * returns how many there are and, when out is not NULL, writes them there,
 * each with its own copy of the topic in topics[k]. Never an empty interval.
 */
static size_t cover_ranges(const part_t *p, int64_t from, int64_t to, ingest_range_t *out,
                           topic_slot_t *topics)
{
    size_t k = 0;
    int64_t cur = from;
    for (size_t i = skip_first_after(p, from); i < p->nskip && cur < to; i++) {
        if (p->skip[i][0] >= to)
            break;
        if (p->skip[i][0] > cur) {
            if (out != NULL) {
                out[k].topic = strcpy(topics[k], p->topic);
                out[k].partition = p->partition;
                out[k].from = cur;
                out[k].to = p->skip[i][0];
            }
            k++;
        }
        if (p->skip[i][1] > cur)
            cur = p->skip[i][1];
    }
    if (cur < to) {
        if (out != NULL) {
            out[k].topic = strcpy(topics[k], p->topic);
            out[k].partition = p->partition;
            out[k].from = cur;
            out[k].to = to;
        }
        k++;
    }
    return k;
}

/*
 * Checks a seek's skip list: each [from, to) non-empty, from >= pos, and
 * the intervals sorted and disjoint. FR_ERR_INVAL otherwise.
 */
static fr_err_t skip_check(int64_t pos, const int64_t (*skip)[2], size_t nskip)
{
    if (nskip > 0 && skip == NULL)
        return FR_ERR_INVAL;
    if (nskip > SIZE_MAX / sizeof(*skip))
        return FR_ERR_INVAL;
    int64_t floor = pos;
    for (size_t i = 0; i < nskip; i++) {
        if (skip[i][0] < floor || skip[i][1] <= skip[i][0])
            return FR_ERR_INVAL;
        floor = skip[i][1];
    }
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * The open batch.
 * ---------------------------------------------------------------------- */

#ifndef NDEBUG
/* Nonzero when a batch's ranges are as open_finalize promises: each
 * non-empty, sorted by topic, partition and from, and disjoint within a
 * partition. For assert() only. */
static int ranges_ordered(const ingest_batch_t *batch)
{
    for (size_t i = 0; i < batch->nranges; i++) {
        const ingest_range_t *r = &batch->ranges[i];
        if (r->from >= r->to)
            return 0;
        if (i == 0)
            continue;
        const ingest_range_t *q = &batch->ranges[i - 1];
        int c = strcmp(q->topic, r->topic);
        if (c > 0 || (c == 0 && q->partition > r->partition) ||
            (c == 0 && q->partition == r->partition && q->to > r->from))
            return 0;
    }
    return 1;
}
#endif

/*
 * Finalizes the open batch: its samples are copied into a batch of their
 * own, its ranges are [next, end) minus skips of each held partition
 * (sorted by topic, partition, from), and those partitions' next moves to
 * their end. The open batch is then empty. Returns NULL, changing
 * nothing, when out of memory. The open batch must hold something.
 */
static ingest_batch_t *open_finalize(ingest_batcher_t *bt)
{
    FR_ASSERT(bt->nopen > 0 && bt->nopen <= bt->nparts);
    size_t nranges = 0;
    for (size_t i = 0; i < bt->nopen; i++)
        nranges += cover_ranges(bt->open[i], bt->open[i]->next, bt->open[i]->end, NULL, NULL);
    ingest_batch_t *batch = batch_alloc(bt->n, bt->cap, bt->d, nranges);
    if (batch == NULL)
        return NULL;

    qsort(bt->open, bt->nopen, sizeof(*bt->open), part_cmp);
    batch->n = bt->n;
    batch->features = (int)bt->d;
    if (bt->n > 0) {
        /* no copy: the batch takes the open buffers, whose samples were
         * decoded in place, and the new empty ones become the open batch's */
        float *x = batch->x, *y = batch->y;
        int32_t *sp = batch->partition;
        int64_t *so = batch->offset;
        batch->x = bt->x;
        batch->y = bt->y;
        batch->partition = bt->sp;
        batch->offset = bt->so;
        bt->x = x;
        bt->y = y;
        bt->sp = sp;
        bt->so = so;
        batch->min_ts_ms = bt->min_ts;
        batch->max_ts_ms = bt->max_ts;
    } else {
        strcpy(batch->reason, "decode");
    }
    batch->generation = bt->open[0]->gen;
    for (size_t i = 0; i < bt->nopen; i++) {
        part_t *p = bt->open[i];
        FR_ASSERT(p->held && p->next <= p->end);
        batch->nranges += cover_ranges(p, p->next, p->end, batch->ranges + batch->nranges,
                                       batch_topics(batch, nranges) + batch->nranges);
        if (p->gen > batch->generation)
            batch->generation = p->gen;
        p->next = p->end;
        p->held = 0;
    }
    FR_ASSERT(batch->nranges == nranges); /* both passes agree: no write past ranges */
    bt->nopen = 0;
    bt->n = 0;
    bt->alone = NULL;
    assert(ranges_ordered(batch));
    return batch;
}

/* ------------------------------------------------------------------------
 * The batcher.
 * ---------------------------------------------------------------------- */

ingest_batcher_t *ingest_batcher_new(const ingest_schema_t *schema, ingest_format_t format,
                                     int batch, char *errstr, size_t size)
{
    if (schema == NULL || schema->features <= 0) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "batcher: the schema needs features > 0");
        return NULL;
    }
    if (schema->label == INGEST_LABEL_CLASS && schema->classes <= 0) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "batcher: class labels need classes > 0");
        return NULL;
    }
    if (schema->aux < 0 || schema->aux >= schema->features) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "batcher: the aux slot %d is not a feature",
                  schema->aux);
        return NULL;
    }
    if (schema->decode == NULL && format != INGEST_FORMAT_CSV && format != INGEST_FORMAT_LIBSVM &&
        format != INGEST_FORMAT_F32) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "batcher: records must be csv, libsvm or f32");
        return NULL;
    }
    if (batch <= 0 || (size_t)batch > SIZE_MAX / sizeof(float) / (size_t)schema->features) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "batcher: bad batch size %d", batch);
        return NULL;
    }

    ingest_batcher_t *bt = calloc(1, sizeof(*bt));
    if (bt == NULL)
        goto err;
    bt->schema = *schema;
    bt->format = format;
    bt->cap = (size_t)batch;
    bt->d = (size_t)schema->features;
    bt->x = malloc(bt->cap * bt->d * sizeof(float));
    bt->y = malloc(bt->cap * sizeof(float));
    bt->sp = malloc(bt->cap * sizeof(int32_t));
    bt->so = malloc(bt->cap * sizeof(int64_t));
    bt->buckets = calloc(FIRST_BUCKETS, sizeof(*bt->buckets));
    bt->open = malloc(FIRST_BUCKETS * sizeof(*bt->open));
    if (bt->x == NULL || bt->y == NULL || bt->sp == NULL || bt->so == NULL || bt->buckets == NULL ||
        bt->open == NULL)
        goto err;
    bt->nbuckets = FIRST_BUCKETS;
    bt->capopen = FIRST_BUCKETS;
    /* The open buffers are reused for every batch: pay their first touch
     * here rather than on the first records. */
    fr_mem_touch(bt->x, bt->cap * bt->d * sizeof(float));
    fr_mem_touch(bt->y, bt->cap * sizeof(float));
    return bt;
err:
    fr_errorf(FR_ERR_NOMEM, errstr, size, "batcher: out of memory for %d samples of %d features",
              batch, schema->features);
    ingest_batcher_destroy(bt);
    return NULL;
}

void ingest_batcher_destroy(ingest_batcher_t *bt)
{
    if (bt == NULL)
        return;
    for (size_t i = 0; bt->buckets != NULL && i < bt->nbuckets; i++) {
        part_t *p = bt->buckets[i];
        while (p != NULL) {
            part_t *chain = p->chain;
            free(p->skip);
            free(p->quarantine);
            free(p);
            p = chain;
        }
    }
    free(bt->buckets);
    free(bt->open);
    free(bt->x);
    free(bt->y);
    free(bt->sp);
    free(bt->so);
    free(bt);
}

/*
 * Validates everything, allocates the skip copy (and the partition when it
 * is new) before flushing, so that an error leaves the batcher as it was.
 * A flush happens only when the open batch holds this partition.
 */
fr_err_t ingest_batcher_seek(ingest_batcher_t *bt, const char *topic, int32_t partition,
                             int64_t pos, const int64_t (*skip)[2], size_t nskip, int64_t gen,
                             ingest_batch_t **flushed)
{
    if (flushed != NULL)
        *flushed = NULL;
    if (bt == NULL || flushed == NULL || !topic_ok(topic) || pos < 0 || pos == INT64_MAX)
        return FR_ERR_INVAL;
    if (skip_check(pos, skip, nskip) != FR_OK)
        return FR_ERR_INVAL;

    int64_t(*copy)[2] = NULL;
    if (nskip > 0) {
        copy = malloc(nskip * sizeof(*copy));
        if (copy == NULL)
            return FR_ERR_NOMEM;
        memcpy(copy, skip, nskip * sizeof(*copy));
    }
    part_t *p = part_find(bt, topic, partition);
    part_t *fresh = NULL;
    if (p == NULL) {
        fresh = calloc(1, sizeof(*fresh));
        if (fresh == NULL || part_reserve(bt) != FR_OK)
            goto nomem;
        strcpy(fresh->topic, topic);
        fresh->partition = partition;
        fresh->hash = part_hash(topic, partition);
        part_insert(bt, fresh);
        p = fresh;
    } else if (p->held) {
        ingest_batch_t *batch = open_finalize(bt);
        if (batch == NULL)
            goto nomem;
        *flushed = batch;
    }
    free(p->skip);
    p->skip = copy;
    p->nskip = nskip;
    p->next = pos;
    p->end = pos;
    p->skipped = 0;
    p->alone_to = 0;
    p->gen = gen;
    free(p->quarantine);
    p->quarantine = NULL;
    p->nquarantine = 0;
    return FR_OK;
nomem:
    free(fresh);
    free(copy);
    return FR_ERR_NOMEM;
}

fr_err_t ingest_batcher_revoke(ingest_batcher_t *bt, const char *topic, int32_t partition,
                               ingest_batch_t **flushed)
{
    if (flushed != NULL)
        *flushed = NULL;
    if (bt == NULL || flushed == NULL || !topic_ok(topic))
        return FR_ERR_INVAL;
    part_t *p = part_find(bt, topic, partition);
    if (p == NULL)
        return FR_OK;
    if (p->held) {
        ingest_batch_t *batch = open_finalize(bt);
        if (batch == NULL)
            return FR_ERR_NOMEM;
        *flushed = batch;
    }
    part_remove(bt, p);
    return FR_OK;
}

/* Whether p's next record would bring positions below its alone_to into
 * the batch: its coverage starts at the first position from end that is
 * not skipped, whatever the record's offset (positions without a record,
 * such as transaction markers, come with the record after them). */
static int below_alone(const part_t *p)
{
    int64_t start = p->end;
    size_t i = skip_first_after(p, start);
    if (i < p->nskip && p->skip[i][0] <= start)
        start = p->skip[i][1];
    return start < p->alone_to;
}

/*
 * Whether the next record of p may join the open batch (which holds
 * something). A record below its partition's alone_to joins only a batch
 * of that partition alone, and a batch of such records takes no other:
 * for a sharded model those positions are applied on some shards and not
 * on others, and a batch mixing two partitions whose gaps lie on different
 * shards would overlap every shard's applied positions in part, so every
 * shard would drop it, each time it is read again (docs/design.md
 * "Shards").
 */
static int may_join(const ingest_batcher_t *bt, const part_t *p)
{
    if (bt->alone != NULL)
        return bt->alone == p && below_alone(p);
    return !below_alone(p);
}

/*
 * Takes one record: ignored below the partition's end or inside a skip
 * interval; otherwise decoded into the next row of the open buffers, and
 * the partition's coverage extends to offset + 1 whether the record is
 * good or not. The sample that fills the batch finalizes it; if that runs
 * out of memory, the record's effects are undone and FR_ERR_NOMEM says it
 * was not taken.
 */
static fr_err_t add_record(ingest_batcher_t *bt, const char *topic, int32_t partition,
                           int64_t offset, int64_t ts_ms, const void *rec, size_t len,
                           const ingest_decoded_t *pre, float aux, ingest_reject_t *why,
                           ingest_batch_t **full);

fr_err_t ingest_batcher_add(ingest_batcher_t *bt, const char *topic, int32_t partition,
                            int64_t offset, int64_t ts_ms, const void *rec, size_t len,
                            ingest_reject_t *why, ingest_batch_t **full)
{
    return ingest_batcher_add_aux(bt, topic, partition, offset, ts_ms, rec, len, NAN, why, full);
}

fr_err_t ingest_batcher_add_aux(ingest_batcher_t *bt, const char *topic, int32_t partition,
                                int64_t offset, int64_t ts_ms, const void *rec, size_t len,
                                float aux, ingest_reject_t *why, ingest_batch_t **full)
{
    return add_record(bt, topic, partition, offset, ts_ms, rec, len, NULL, aux, why, full);
}

ingest_reject_t ingest_batcher_decode(const ingest_batcher_t *bt, const void *rec, size_t len,
                                      float *x, float *y)
{
    if (bt == NULL || x == NULL || y == NULL || (rec == NULL && len > 0))
        return INGEST_REJECT_BAD_NUMBER;
    return ingest_decode(&bt->schema, bt->format, rec, len, x, y);
}

fr_err_t ingest_batcher_add_decoded(ingest_batcher_t *bt, const char *topic, int32_t partition,
                                    int64_t offset, int64_t ts_ms, const ingest_decoded_t *pre,
                                    float aux, ingest_reject_t *why, ingest_batch_t **full)
{
    if (pre == NULL || (pre->why == INGEST_OK && pre->x == NULL)) {
        if (why != NULL)
            *why = INGEST_OK;
        if (full != NULL)
            *full = NULL;
        return FR_ERR_INVAL;
    }
    return add_record(bt, topic, partition, offset, ts_ms, NULL, 0, pre, aux, why, full);
}

/*
 * ingest_batcher_add_aux's body: the record rec[len], or (pre not NULL) the
 * result of decoding it ahead, copied into the open row when good.
 */
static fr_err_t add_record(ingest_batcher_t *bt, const char *topic, int32_t partition,
                           int64_t offset, int64_t ts_ms, const void *rec, size_t len,
                           const ingest_decoded_t *pre, float aux, ingest_reject_t *why,
                           ingest_batch_t **full)
{
    if (why != NULL)
        *why = INGEST_OK;
    if (full != NULL)
        *full = NULL;
    if (bt == NULL || full == NULL || !topic_ok(topic) || offset < 0 || offset == INT64_MAX ||
        (rec == NULL && len > 0))
        return FR_ERR_INVAL;
    part_t *p = part_find(bt, topic, partition);
    if (p == NULL)
        return FR_ERR_STATE;
    if (offset < p->end)
        return FR_OK; /* a redelivery */
    if (skip_contains(p, offset)) {
        if (offset + 1 > p->skipped)
            p->skipped = offset + 1;
        return FR_OK; /* applied already (rule 2) */
    }
    int quarantined = p->nquarantine > 0 && quarantine_contains(p, offset);
    /* A batch left full by the last record (below), or one this record
     * may not join, goes out first; the record then starts the next. */
    ingest_batch_t *before = NULL;
    if (bt->nopen > 0 && (bt->n == bt->cap || !may_join(bt, p))) {
        if ((before = open_finalize(bt)) == NULL)
            return FR_ERR_NOMEM;
        *full = before;
    }
    const part_t *old_alone = bt->alone;
    if (below_alone(p))
        bt->alone = p;

    FR_ASSERT(bt->n < bt->cap); /* a full batch went out above: the row is free */
    ingest_reject_t r;
    if (quarantined) {
        r = INGEST_REJECT_QUARANTINED;
    } else if (pre != NULL) {
        r = pre->why;
        if (r == INGEST_OK) {
            memcpy(bt->x + bt->n * bt->d, pre->x, bt->d * sizeof(float));
            bt->y[bt->n] = pre->y;
        }
    } else {
        r = ingest_decode(&bt->schema, bt->format, rec, len, bt->x + bt->n * bt->d, bt->y + bt->n);
    }
    if (why != NULL)
        *why = r;
    int64_t old_end = p->end;
    int was_held = p->held;
    p->end = offset + 1;
    if (!p->held) {
        FR_ASSERT(bt->nopen < bt->capopen); /* part_reserve keeps capopen >= nparts */
        p->held = 1;
        bt->open[bt->nopen++] = p;
    }
    if (r != INGEST_OK)
        return FR_OK;
    if (bt->schema.aux > 0 && !isnan(aux))
        bt->x[bt->n * bt->d + (size_t)bt->schema.aux] = aux;
    bt->sp[bt->n] = partition;
    bt->so[bt->n] = offset;

    int64_t old_min = bt->min_ts, old_max = bt->max_ts;
    if (bt->n == 0 || ts_ms < bt->min_ts)
        bt->min_ts = ts_ms;
    if (bt->n == 0 || ts_ms > bt->max_ts)
        bt->max_ts = ts_ms;
    bt->n++;
    if (bt->n < bt->cap || before != NULL)
        return FR_OK; /* a full batch after a flush waits for the next record or flush */
    *full = open_finalize(bt);
    if (*full != NULL)
        return FR_OK;

    /* Out of memory: undo this record (open_finalize changed nothing). */
    bt->n--;
    bt->min_ts = old_min;
    bt->max_ts = old_max;
    p->end = old_end;
    bt->alone = old_alone;
    if (!was_held) {
        FR_ASSERT(bt->nopen > 0 && bt->open[bt->nopen - 1] == p); /* p was listed last */
        p->held = 0;
        bt->nopen--;
    }
    if (why != NULL)
        *why = INGEST_OK;
    return FR_ERR_NOMEM;
}

ingest_batch_t *ingest_batcher_flush(ingest_batcher_t *bt)
{
    if (bt == NULL || bt->nopen == 0)
        return NULL;
    ingest_batch_t *batch = open_finalize(bt);
    if (batch == NULL)
        fr_log(FR_LOG_WARN, "batcher: out of memory flushing %zu samples; kept open", bt->n);
    return batch;
}

/*
 * An n = 0 batch covering [next, to) of one partition minus its skips;
 * ingest.h says when it returns NULL instead.
 */
ingest_batch_t *ingest_batcher_cover(ingest_batcher_t *bt, const char *topic, int32_t partition,
                                     int64_t to, const char *reason)
{
    if (bt == NULL || !topic_ok(topic) || reason == NULL || reason[0] == '\0')
        return NULL;
    part_t *p = part_find(bt, topic, partition);
    if (p == NULL || p->held || to <= p->next)
        return NULL;
    size_t nranges = cover_ranges(p, p->next, to, NULL, NULL);
    if (nranges == 0) {
        p->next = p->end = to;
        return NULL;
    }
    ingest_batch_t *batch = batch_alloc(0, bt->cap, bt->d, nranges);
    if (batch == NULL) {
        fr_log(FR_LOG_WARN, "batcher: out of memory covering %s[%d] up to %lld", topic,
               (int)partition, (long long)to);
        return NULL;
    }
    batch->features = (int)bt->d;
    batch->nranges = cover_ranges(p, p->next, to, batch->ranges, batch_topics(batch, nranges));
    batch->generation = p->gen;
    size_t k = strlen(reason);
    if (k > sizeof(batch->reason) - 1)
        k = sizeof(batch->reason) - 1;
    memcpy(batch->reason, reason, k);
    batch->reason[k] = '\0';
    p->next = p->end = to;
    return batch;
}

int ingest_batcher_holds(const ingest_batcher_t *bt, const char *topic, int32_t partition)
{
    if (bt == NULL || !topic_ok(topic))
        return 0;
    const part_t *p = part_find(bt, topic, partition);
    return p != NULL && p->held;
}

/* A seeked partition's state, or NULL with *err (FR_ERR_INVAL for a bad
 * topic, FR_ERR_NOTFOUND for a partition not seeked). */
static const part_t *part_lookup(const ingest_batcher_t *bt, const char *topic, int32_t partition,
                                 fr_err_t *err)
{
    const part_t *p = bt != NULL && topic_ok(topic) ? part_find(bt, topic, partition) : NULL;
    *err = p != NULL ? FR_OK : bt == NULL || !topic_ok(topic) ? FR_ERR_INVAL : FR_ERR_NOTFOUND;
    return p;
}

fr_err_t ingest_batcher_alone(ingest_batcher_t *bt, const char *topic, int32_t partition,
                              int64_t to)
{
    if (bt == NULL || !topic_ok(topic) || to < 0)
        return FR_ERR_INVAL;
    part_t *p = part_find(bt, topic, partition);
    if (p == NULL)
        return FR_ERR_NOTFOUND;
    if (p->held)
        return FR_ERR_STATE;
    p->alone_to = to;
    return FR_OK;
}

fr_err_t ingest_batcher_quarantine(ingest_batcher_t *bt, const char *topic, int32_t partition,
                                   const int64_t *pos, size_t n)
{
    if (bt == NULL || !topic_ok(topic) || (pos == NULL && n > 0))
        return FR_ERR_INVAL;
    for (size_t i = 1; i < n; i++)
        if (pos[i] < pos[i - 1])
            return FR_ERR_INVAL;
    part_t *p = part_find(bt, topic, partition);
    if (p == NULL)
        return FR_ERR_NOTFOUND;
    int64_t *copy = NULL;
    if (n > 0) {
        if (n > SIZE_MAX / sizeof(*copy) || (copy = malloc(n * sizeof(*copy))) == NULL)
            return FR_ERR_NOMEM;
        memcpy(copy, pos, n * sizeof(*copy));
    }
    free(p->quarantine);
    p->quarantine = copy;
    p->nquarantine = n;
    return FR_OK;
}

fr_err_t ingest_batcher_skipped(const ingest_batcher_t *bt, const char *topic, int32_t partition,
                                int64_t *skipped)
{
    fr_err_t err;
    const part_t *p = part_lookup(bt, topic, partition, &err);
    if (p != NULL)
        *skipped = p->skipped;
    return err;
}

fr_err_t ingest_batcher_position(const ingest_batcher_t *bt, const char *topic, int32_t partition,
                                 int64_t *next, int64_t *end)
{
    fr_err_t err;
    const part_t *p = part_lookup(bt, topic, partition, &err);
    if (p != NULL) {
        *next = p->next;
        *end = p->end;
    }
    return err;
}
