/*
 * test_batcher.c - unit tests of the batcher (ingest/batcher.c): records
 * in, batches of at most B samples out, each covering position intervals
 * per partition (docs/design.md "Positions, not records").
 *
 * Records are csv "label,offset,partition" lines (D = 2, real labels), so
 * every sample says which record it came from. Each record is passed from
 * a heap buffer of exactly its length, so AddressSanitizer catches a read
 * past it. The last tests are a randomized property test over 3 partitions,
 * and the same tests again with every record decoded ahead
 * (ingest_batcher_decode, then ingest_batcher_add_decoded), as the
 * consumer's decode helpers do.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ingest/ingest.h"

/* ------------------------------------------------------------------------
 * Helpers.
 * ---------------------------------------------------------------------- */

/* 1: add_rec decodes each record first and adds the result, as the
 * consumer's decode helpers do; 0: the batcher decodes it itself. */
static int decode_ahead;

static ingest_batcher_t *batcher(int b)
{
    ingest_schema_t s = {.features = 2, .label = INGEST_LABEL_REAL, .classes = 0, .max_record = 0};
    char err[256] = "";
    ingest_batcher_t *bt = ingest_batcher_new(&s, INGEST_FORMAT_CSV, b, err, sizeof(err));
    if (bt == NULL)
        fail_msg("ingest_batcher_new: %s", err);
    return bt;
}

/*
 * Adds the record of offset off of topic/partition: a good one reads
 * "1,off,partition"; a bad one has a bad number (bad = 1) or one feature
 * too few (bad = 2).
 */
static fr_err_t add_rec(ingest_batcher_t *bt, const char *topic, int32_t partition, int64_t off,
                        int64_t ts, int bad, ingest_reject_t *why, ingest_batch_t **full)
{
    char text[64];
    int len;
    if (bad == 1)
        len = snprintf(text, sizeof(text), "1,x%lld,%d", (long long)off, (int)partition);
    else if (bad == 2)
        len = snprintf(text, sizeof(text), "1,%lld", (long long)off);
    else
        len = snprintf(text, sizeof(text), "1,%lld,%d", (long long)off, (int)partition);
    char *rec = malloc((size_t)len);
    assert_non_null(rec);
    memcpy(rec, text, (size_t)len);
    fr_err_t err;
    if (decode_ahead) {
        float x[2] = {NAN, NAN}, y = NAN;
        ingest_reject_t r = ingest_batcher_decode(bt, rec, (size_t)len, x, &y);
        ingest_decoded_t pre = {x, y, r};
        free(rec); /* the batcher reads only the decoded row */
        return ingest_batcher_add_decoded(bt, topic, partition, off, ts, &pre, NAN, why, full);
    }
    err = ingest_batcher_add(bt, topic, partition, off, ts, rec, (size_t)len, why, full);
    free(rec);
    return err;
}

/* Adds a good record that must neither fail nor fill a batch. */
static void add_good(ingest_batcher_t *bt, const char *topic, int32_t partition, int64_t off)
{
    ingest_reject_t why = INGEST_REJECT_COUNT;
    ingest_batch_t *full = (ingest_batch_t *)1;
    assert_int_equal(add_rec(bt, topic, partition, off, 0, 0, &why, &full), FR_OK);
    assert_int_equal(why, INGEST_OK);
    assert_null(full);
}

/* Seeks to pos without skips, generation 0, expecting no flushed batch. */
static void seek_plain(ingest_batcher_t *bt, const char *topic, int32_t partition, int64_t pos)
{
    ingest_batch_t *flushed = (ingest_batch_t *)1;
    assert_int_equal(ingest_batcher_seek(bt, topic, partition, pos, NULL, 0, 0, &flushed), FR_OK);
    assert_null(flushed);
}

static void assert_range(const ingest_batch_t *b, size_t i, const char *topic, int32_t partition,
                         int64_t from, int64_t to)
{
    assert_true(i < b->nranges);
    assert_string_equal(b->ranges[i].topic, topic);
    assert_int_equal(b->ranges[i].partition, partition);
    assert_int_equal(b->ranges[i].from, from);
    assert_int_equal(b->ranges[i].to, to);
}

/* The offset encoded in sample i. */
static int64_t sample_off(const ingest_batch_t *b, size_t i)
{
    return (int64_t)b->x[i * 2];
}

/* ------------------------------------------------------------------------
 * Tests.
 * ---------------------------------------------------------------------- */

static void test_contiguous_records_make_full_batches_of_exactly_b(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(4);
    seek_plain(bt, "t", 0, 0);
    ingest_batch_t *got[2] = {NULL, NULL};
    int ngot = 0;
    for (int64_t off = 0; off < 10; off++) {
        ingest_reject_t why;
        ingest_batch_t *full = NULL;
        assert_int_equal(add_rec(bt, "t", 0, off, 0, 0, &why, &full), FR_OK);
        assert_int_equal(why, INGEST_OK);
        if (off == 3 || off == 7) {
            assert_non_null(full);
            got[ngot++] = full;
        } else {
            assert_null(full);
        }
    }
    for (int k = 0; k < 2; k++) {
        ingest_batch_t *b = got[k];
        assert_int_equal(b->n, 4);
        assert_int_equal(b->features, 2);
        assert_int_equal(b->nranges, 1);
        assert_range(b, 0, "t", 0, 4 * k, 4 * k + 4);
        assert_string_equal(b->reason, "");
        for (size_t i = 0; i < 4; i++) {
            assert_int_equal(sample_off(b, i), 4 * k + (int64_t)i);
            assert_true(b->x[i * 2 + 1] == 0.0f);
            assert_true(b->y[i] == 1.0f);
        }
        ingest_batch_destroy(b);
    }
    assert_true(ingest_batcher_holds(bt, "t", 0));
    ingest_batcher_destroy(bt);
}

static void test_flush_returns_the_final_partial_batch_and_then_nothing(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(4);
    assert_null(ingest_batcher_flush(bt));
    seek_plain(bt, "t", 0, 0);
    assert_null(ingest_batcher_flush(bt));
    for (int64_t off = 0; off < 6; off++) {
        ingest_batch_t *full = NULL;
        assert_int_equal(add_rec(bt, "t", 0, off, 0, 0, NULL, &full), FR_OK);
        ingest_batch_destroy(full);
    }
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_non_null(b);
    assert_int_equal(b->n, 2);
    assert_int_equal(b->nranges, 1);
    assert_range(b, 0, "t", 0, 4, 6);
    assert_int_equal(sample_off(b, 0), 4);
    assert_int_equal(sample_off(b, 1), 5);
    ingest_batch_destroy(b);
    assert_false(ingest_batcher_holds(bt, "t", 0));
    assert_null(ingest_batcher_flush(bt));
    ingest_batch_destroy(NULL);
    ingest_batcher_destroy(bt);
    ingest_batcher_destroy(NULL);
}

static void test_offset_holes_are_covered_by_the_batch_that_follows(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(16);
    seek_plain(bt, "t", 0, 0);
    const int64_t offs[] = {0, 1, 5, 6};
    for (size_t i = 0; i < 4; i++)
        add_good(bt, "t", 0, offs[i]);
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_non_null(b);
    assert_int_equal(b->n, 4);
    assert_int_equal(b->nranges, 1);
    assert_range(b, 0, "t", 0, 0, 7);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(sample_off(b, i), offs[i]);
    ingest_batch_destroy(b);

    /* A hole right after a flush is covered by the next batch. */
    add_good(bt, "t", 0, 20);
    b = ingest_batcher_flush(bt);
    assert_int_equal(b->n, 1);
    assert_range(b, 0, "t", 0, 7, 21);
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);
}

static void test_rejected_records_are_covered_and_counted_by_reason(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(3);
    seek_plain(bt, "t", 0, 0);
    const int bad[] = {0, 1, 0, 2, 0};
    const ingest_reject_t want[] = {INGEST_OK, INGEST_REJECT_BAD_NUMBER, INGEST_OK,
                                    INGEST_REJECT_FEATURE_COUNT, INGEST_OK};
    ingest_batch_t *full = NULL;
    for (int64_t off = 0; off < 5; off++) {
        ingest_reject_t why = INGEST_REJECT_COUNT;
        assert_int_equal(add_rec(bt, "t", 0, off, 0, bad[off], &why, &full), FR_OK);
        assert_int_equal(why, want[off]);
        if (off < 4)
            assert_null(full);
    }
    assert_non_null(full);
    assert_int_equal(full->n, 3);
    assert_int_equal(full->nranges, 1);
    assert_range(full, 0, "t", 0, 0, 5);
    assert_int_equal(sample_off(full, 0), 0);
    assert_int_equal(sample_off(full, 1), 2);
    assert_int_equal(sample_off(full, 2), 4);
    ingest_batch_destroy(full);

    /* Rejected records only: an n = 0 batch with reason "decode". */
    for (int64_t off = 5; off < 7; off++) {
        ingest_reject_t why = INGEST_OK;
        assert_int_equal(add_rec(bt, "t", 0, off, 0, 1, &why, &full), FR_OK);
        assert_int_equal(why, INGEST_REJECT_BAD_NUMBER);
        assert_null(full);
    }
    assert_true(ingest_batcher_holds(bt, "t", 0));
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_non_null(b);
    assert_int_equal(b->n, 0);
    assert_null(b->x);
    assert_null(b->y);
    assert_string_equal(b->reason, "decode");
    assert_int_equal(b->nranges, 1);
    assert_range(b, 0, "t", 0, 5, 7);
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);
}

/* Each sample carries its partition and offset; quarantined positions
 * are rejected (and covered) until the partition's next seek. */
static void test_quarantined_positions_are_rejected_until_the_next_seek(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(4);
    seek_plain(bt, "t", 0, 0);
    seek_plain(bt, "t", 1, 10);
    const int64_t q0[] = {1, 3, 3, 9}; /* 9: never read; 3 twice (sorted, duplicates allowed) */
    assert_int_equal(ingest_batcher_quarantine(bt, "t", 0, q0, 4), FR_OK);
    const int64_t unsorted[] = {5, 2};
    assert_int_equal(ingest_batcher_quarantine(bt, "t", 0, unsorted, 2), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_quarantine(bt, "t", 7, q0, 4), FR_ERR_NOTFOUND);
    assert_int_equal(ingest_batcher_quarantine(bt, "t", 0, NULL, 1), FR_ERR_INVAL);
    /* partition 1 has none: its offset 11 is learned */
    const struct {
        int32_t part;
        int64_t off;
        ingest_reject_t why;
    } recs[] = {{0, 0, INGEST_OK}, {0, 1, INGEST_REJECT_QUARANTINED}, {1, 10, INGEST_OK},
                {0, 2, INGEST_OK}, {0, 3, INGEST_REJECT_QUARANTINED}, {1, 11, INGEST_OK}};
    ingest_batch_t *full = NULL;
    for (size_t i = 0; i < 6; i++) {
        ingest_reject_t why = INGEST_REJECT_COUNT;
        assert_int_equal(add_rec(bt, "t", recs[i].part, recs[i].off, 0, 0, &why, &full), FR_OK);
        assert_int_equal(why, recs[i].why);
    }
    assert_non_null(full);
    assert_int_equal(full->n, 4);
    const int32_t want_part[] = {0, 1, 0, 1};
    const int64_t want_off[] = {0, 10, 2, 11};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(full->partition[i], want_part[i]);
        assert_int_equal(full->offset[i], want_off[i]);
        assert_int_equal(sample_off(full, i), want_off[i]);
    }
    assert_int_equal(full->nranges, 2);
    assert_range(full, 0, "t", 0, 0, 4); /* the quarantined positions covered */
    assert_range(full, 1, "t", 1, 10, 12);
    ingest_batch_destroy(full);

    /* a seek forgets the quarantine: the caller sets it again */
    seek_plain(bt, "t", 0, 0);
    for (int64_t off = 0; off < 4; off++) {
        ingest_reject_t why = INGEST_REJECT_COUNT;
        assert_int_equal(add_rec(bt, "t", 0, off, 0, 0, &why, &full), FR_OK);
        assert_int_equal(why, INGEST_OK);
    }
    assert_non_null(full);
    assert_int_equal(full->n, 4);
    ingest_batch_destroy(full);
    assert_string_equal(ingest_reject_name(INGEST_REJECT_QUARANTINED), "quarantined");
    ingest_batcher_destroy(bt);
}

static void test_records_below_next_and_redeliveries_are_ignored(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(8);
    seek_plain(bt, "t", 0, 10);
    ingest_reject_t why = INGEST_REJECT_COUNT;
    ingest_batch_t *full = NULL;
    /* Below the seek target, even a bad one: ignored, not counted. */
    assert_int_equal(add_rec(bt, "t", 0, 5, 0, 1, &why, &full), FR_OK);
    assert_int_equal(why, INGEST_OK);
    assert_false(ingest_batcher_holds(bt, "t", 0));
    add_good(bt, "t", 0, 10);
    add_good(bt, "t", 0, 11);
    /* Redelivered while the first copies are still in the open batch. */
    add_good(bt, "t", 0, 11);
    add_good(bt, "t", 0, 10);
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_int_equal(b->n, 2);
    assert_int_equal(b->nranges, 1);
    assert_range(b, 0, "t", 0, 10, 12);
    ingest_batch_destroy(b);
    /* Redelivered after their batch went out. */
    add_good(bt, "t", 0, 11);
    assert_false(ingest_batcher_holds(bt, "t", 0));
    assert_null(ingest_batcher_flush(bt));
    ingest_batcher_destroy(bt);
}

static void test_skip_intervals_are_cut_out_of_coverage_and_their_records_ignored(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(100);
    const int64_t skip[1][2] = {{3, 5}};
    ingest_batch_t *flushed = NULL;
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 0, skip, 1, 0, &flushed), FR_OK);
    assert_null(flushed);
    for (int64_t off = 0; off < 10; off++)
        add_good(bt, "t", 0, off);
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_int_equal(b->n, 8);
    assert_int_equal(b->nranges, 2);
    assert_range(b, 0, "t", 0, 0, 3);
    assert_range(b, 1, "t", 0, 5, 10);
    for (size_t i = 0; i < b->n; i++)
        assert_true(sample_off(b, i) < 3 || sample_off(b, i) >= 5);
    ingest_batch_destroy(b);

    /* A hole across several skips; a skip at the seek target; a skip list
     * that the caller frees right after the seek (it is copied). */
    int64_t(*skips)[2] = malloc(3 * sizeof(*skips));
    assert_non_null(skips);
    const int64_t vals[3][2] = {{20, 22}, {25, 26}, {26, 28}};
    memcpy(skips, vals, sizeof(vals));
    assert_int_equal(
        ingest_batcher_seek(bt, "t", 0, 20, (const int64_t(*)[2])skips, 3, 0, &flushed), FR_OK);
    free(skips);
    add_good(bt, "t", 0, 21); /* skipped */
    assert_false(ingest_batcher_holds(bt, "t", 0));
    add_good(bt, "t", 0, 30);
    b = ingest_batcher_flush(bt);
    assert_int_equal(b->n, 1);
    assert_int_equal(b->nranges, 2);
    assert_range(b, 0, "t", 0, 22, 25);
    assert_range(b, 1, "t", 0, 28, 31);
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);
}

static void test_two_partitions_interleaved_make_one_batch_with_sorted_ranges(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(6);
    seek_plain(bt, "b", 0, 100);
    seek_plain(bt, "a", 1, 0);
    seek_plain(bt, "a", 0, 50);
    add_good(bt, "b", 0, 100);
    add_good(bt, "a", 1, 0);
    add_good(bt, "a", 0, 50);
    add_good(bt, "a", 1, 1);
    add_good(bt, "b", 0, 103);
    ingest_batch_t *full = NULL;
    assert_int_equal(add_rec(bt, "a", 1, 2, 0, 0, NULL, &full), FR_OK);
    assert_non_null(full);
    assert_int_equal(full->n, 6);
    assert_int_equal(full->nranges, 3);
    assert_range(full, 0, "a", 0, 50, 51);
    assert_range(full, 1, "a", 1, 0, 3);
    assert_range(full, 2, "b", 0, 100, 104);
    for (size_t i = 0; i < full->n; i++) {
        int32_t p = (int32_t)full->x[i * 2 + 1];
        assert_true(p == 0 || p == 1);
    }
    ingest_batch_destroy(full);

    /* Two partitions of one topic, nothing of the third. */
    add_good(bt, "a", 1, 3);
    add_good(bt, "a", 0, 52);
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_int_equal(b->nranges, 2);
    assert_range(b, 0, "a", 0, 51, 53);
    assert_range(b, 1, "a", 1, 3, 4);
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);
}

/* Adds a good record that must close the open batch first: returns it. */
static ingest_batch_t *add_closing(ingest_batcher_t *bt, const char *topic, int32_t partition,
                                   int64_t off)
{
    ingest_batch_t *full = NULL;
    assert_int_equal(add_rec(bt, topic, partition, off, 0, 0, NULL, &full), FR_OK);
    assert_non_null(full);
    return full;
}

/* Asserts that b holds exactly [from, to) of t/partition and n samples,
 * and frees it. */
static void assert_alone(ingest_batch_t *b, int32_t partition, int64_t from, int64_t to, size_t n)
{
    assert_non_null(b);
    assert_int_equal(b->n, n);
    assert_int_equal(b->nranges, 1);
    assert_range(b, 0, "t", partition, from, to);
    ingest_batch_destroy(b);
}

/*
 * Records below a partition's alone_to (a sharded model's positions that
 * some shard applied and another did not) make batches of that partition
 * alone, ending at alone_to; records from alone_to on mix as before, and
 * a seek forgets alone_to.
 */
static void test_records_below_alone_to_are_batched_apart_from_other_partitions(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(4);
    const int64_t skip0[][2] = {{3, 10}}, skip1[][2] = {{2, 10}};
    ingest_batch_t *flushed = NULL;
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 0, skip0, 1, 0, &flushed), FR_OK);
    assert_int_equal(ingest_batcher_seek(bt, "t", 1, 0, skip1, 1, 0, &flushed), FR_OK);
    seek_plain(bt, "t", 2, 10);
    assert_int_equal(ingest_batcher_alone(bt, "t", 0, 10), FR_OK);
    assert_int_equal(ingest_batcher_alone(bt, "t", 1, 10), FR_OK);

    add_good(bt, "t", 0, 0);
    assert_alone(add_closing(bt, "t", 1, 0), 0, 0, 1, 1); /* another partition below */
    assert_alone(add_closing(bt, "t", 0, 1), 1, 0, 1, 1);
    add_good(bt, "t", 0, 2);                                /* its own partition joins */
    assert_alone(add_closing(bt, "t", 2, 10), 0, 1, 3, 2);  /* a free record does not */
    assert_alone(add_closing(bt, "t", 1, 1), 2, 10, 11, 1); /* nor joins a free batch */
    assert_alone(add_closing(bt, "t", 1, 10), 1, 1, 2, 1);  /* its own, from alone_to on */
    add_good(bt, "t", 2, 11);                               /* from alone_to on, partitions mix */
    add_good(bt, "t", 0, 10);
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_int_equal(b->n, 3);
    assert_int_equal(b->nranges, 3);
    assert_range(b, 0, "t", 0, 10, 11); /* [3, 10) skipped */
    assert_range(b, 1, "t", 1, 10, 11);
    assert_range(b, 2, "t", 2, 11, 12);
    ingest_batch_destroy(b);

    assert_int_equal(ingest_batcher_alone(bt, "t", 3, 10), FR_ERR_NOTFOUND);
    assert_int_equal(ingest_batcher_alone(bt, "t", 0, -1), FR_ERR_INVAL);
    add_good(bt, "t", 0, 11);
    assert_int_equal(ingest_batcher_alone(bt, "t", 0, 20), FR_ERR_STATE); /* held */
    ingest_batch_destroy(ingest_batcher_flush(bt));

    /* a seek forgets alone_to */
    seek_plain(bt, "t", 0, 0);
    add_good(bt, "t", 0, 0);
    add_good(bt, "t", 2, 12);
    b = ingest_batcher_flush(bt);
    assert_int_equal(b->nranges, 2);
    ingest_batch_destroy(b);

    /* positions without a record below alone_to (a transaction marker, a
     * compacted record) come with the next record: it is batched alone
     * even at an offset from alone_to on */
    seek_plain(bt, "t", 0, 20);
    seek_plain(bt, "t", 1, 20);
    assert_int_equal(ingest_batcher_alone(bt, "t", 0, 25), FR_OK);
    add_good(bt, "t", 1, 20);
    assert_alone(add_closing(bt, "t", 0, 27), 1, 20, 21, 1);
    assert_alone(ingest_batcher_flush(bt), 0, 20, 28, 1);
    ingest_batcher_destroy(bt);
}

/*
 * With B = 1 the record that closes the open batch may fill the next at
 * once: that batch goes out with the next record (or flush), so that one
 * call never has two batches to return.
 */
static void test_a_batch_filled_right_after_a_closing_waits_for_the_next_record(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(1);
    seek_plain(bt, "t", 0, 0);
    seek_plain(bt, "t", 1, 0);
    assert_int_equal(ingest_batcher_alone(bt, "t", 0, 5), FR_OK);
    ingest_reject_t why = INGEST_OK;
    ingest_batch_t *full = NULL;
    assert_int_equal(add_rec(bt, "t", 1, 0, 0, 1, &why, &full), FR_OK); /* rejected: held */
    assert_int_equal(why, INGEST_REJECT_BAD_NUMBER);
    assert_null(full);
    full = add_closing(bt, "t", 0, 0); /* closes the rejected record's batch */
    assert_int_equal(full->n, 0);
    assert_string_equal(full->reason, "decode");
    assert_range(full, 0, "t", 1, 0, 1);
    ingest_batch_destroy(full);
    assert_alone(add_closing(bt, "t", 0, 1), 0, 0, 1, 1); /* the full one, waiting */
    assert_alone(ingest_batcher_flush(bt), 0, 1, 2, 1);
    assert_null(ingest_batcher_flush(bt));
    ingest_batcher_destroy(bt);
}

static void test_seek_and_revoke_flush_the_open_batch_only_when_it_holds_the_partition(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(8);
    seek_plain(bt, "t", 0, 0);
    seek_plain(bt, "t", 1, 0);
    add_good(bt, "t", 0, 0);
    add_good(bt, "t", 0, 1);
    assert_true(ingest_batcher_holds(bt, "t", 0));
    assert_false(ingest_batcher_holds(bt, "t", 1));
    assert_false(ingest_batcher_holds(bt, "u", 0));

    /* Not held: nothing flushed, the open batch stays. */
    seek_plain(bt, "t", 1, 5);
    ingest_batch_t *flushed = (ingest_batch_t *)1;
    assert_int_equal(ingest_batcher_revoke(bt, "t", 1, &flushed), FR_OK);
    assert_null(flushed);
    assert_int_equal(ingest_batcher_revoke(bt, "never", 3, &flushed), FR_OK);
    assert_null(flushed);
    assert_true(ingest_batcher_holds(bt, "t", 0));

    /* Held: a seek back flushes the whole open batch, then restarts. */
    seek_plain(bt, "t", 1, 0);
    add_good(bt, "t", 1, 0);
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 1, NULL, 0, 0, &flushed), FR_OK);
    assert_non_null(flushed);
    assert_int_equal(flushed->n, 3);
    assert_int_equal(flushed->nranges, 2);
    assert_range(flushed, 0, "t", 0, 0, 2);
    assert_range(flushed, 1, "t", 1, 0, 1);
    ingest_batch_destroy(flushed);
    assert_false(ingest_batcher_holds(bt, "t", 0));
    add_good(bt, "t", 0, 1); /* re-read after the seek back */
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_int_equal(b->n, 1);
    assert_range(b, 0, "t", 0, 1, 2);
    ingest_batch_destroy(b);

    /* Revoke of a held partition flushes, then the partition is unknown. */
    add_good(bt, "t", 0, 2);
    assert_int_equal(ingest_batcher_revoke(bt, "t", 0, &flushed), FR_OK);
    assert_non_null(flushed);
    assert_int_equal(flushed->n, 1);
    assert_range(flushed, 0, "t", 0, 2, 3);
    ingest_batch_destroy(flushed);
    assert_false(ingest_batcher_holds(bt, "t", 0));
    ingest_batch_t *full = NULL;
    assert_int_equal(add_rec(bt, "t", 0, 3, 0, 0, NULL, &full), FR_ERR_STATE);
    assert_null(full);
    ingest_batcher_destroy(bt);
}

static void test_cover_makes_an_empty_batch_from_next_to_to_and_advances_next(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(8);
    const int64_t skip[1][2] = {{8, 10}};
    ingest_batch_t *flushed = NULL;
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 5, skip, 1, 3, &flushed), FR_OK);
    ingest_batch_t *b = ingest_batcher_cover(bt, "t", 0, 12, "retention");
    assert_non_null(b);
    assert_int_equal(b->n, 0);
    assert_string_equal(b->reason, "retention");
    assert_int_equal(b->generation, 3);
    assert_int_equal(b->nranges, 2);
    assert_range(b, 0, "t", 0, 5, 8);
    assert_range(b, 1, "t", 0, 10, 12);
    ingest_batch_destroy(b);

    add_good(bt, "t", 0, 11); /* below next now */
    assert_false(ingest_batcher_holds(bt, "t", 0));
    assert_null(ingest_batcher_cover(bt, "t", 0, 12, "start")); /* nothing to cover */
    assert_null(ingest_batcher_cover(bt, "t", 0, 20, ""));
    assert_null(ingest_batcher_cover(bt, "t", 0, 20, NULL));
    assert_null(ingest_batcher_cover(bt, "u", 0, 20, "start"));

    /* Held: refused, nothing changes. */
    add_good(bt, "t", 0, 12);
    assert_null(ingest_batcher_cover(bt, "t", 0, 20, "retention"));
    b = ingest_batcher_flush(bt);
    assert_int_equal(b->nranges, 1);
    assert_range(b, 0, "t", 0, 12, 13);
    ingest_batch_destroy(b);

    /* A long reason is cut to 31 characters. */
    b = ingest_batcher_cover(bt, "t", 0, 20, "a-reason-much-longer-than-thirty-one-characters");
    assert_non_null(b);
    assert_int_equal(strlen(b->reason), 31);
    assert_range(b, 0, "t", 0, 13, 20);
    ingest_batch_destroy(b);
    add_good(bt, "t", 0, 20);
    b = ingest_batcher_flush(bt);
    assert_range(b, 0, "t", 0, 20, 21);
    ingest_batch_destroy(b);

    /* Wholly skipped: no batch, but next moves. */
    const int64_t skip2[1][2] = {{30, 40}};
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 30, skip2, 1, 3, &flushed), FR_OK);
    assert_null(ingest_batcher_cover(bt, "t", 0, 35, "start"));
    b = ingest_batcher_cover(bt, "t", 0, 42, "start");
    assert_non_null(b);
    assert_int_equal(b->nranges, 1);
    assert_range(b, 0, "t", 0, 40, 42);
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);
}

static void test_timestamps_are_the_min_and_max_of_the_samples(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(4);
    seek_plain(bt, "t", 0, 0);
    const int64_t ts[] = {50, 20, 5, 80, 30};
    const int bad[] = {0, 0, 1, 0, 0};
    ingest_batch_t *full = NULL;
    for (int64_t off = 0; off < 5; off++)
        assert_int_equal(add_rec(bt, "t", 0, off, ts[off], bad[off], NULL, &full), FR_OK);
    assert_non_null(full);
    assert_int_equal(full->min_ts_ms, 20);
    assert_int_equal(full->max_ts_ms, 80);
    ingest_batch_destroy(full);
    add_good(bt, "t", 0, 5);
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_int_equal(b->min_ts_ms, 0);
    assert_int_equal(b->max_ts_ms, 0);
    ingest_batch_destroy(b);
    assert_int_equal(add_rec(bt, "t", 0, 6, 1000, 0, NULL, &full), FR_OK);
    assert_int_equal(add_rec(bt, "t", 0, 7, 999, 0, NULL, &full), FR_OK);
    b = ingest_batcher_flush(bt);
    assert_int_equal(b->min_ts_ms, 999);
    assert_int_equal(b->max_ts_ms, 1000);
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);
}

static void test_batches_carry_the_generation_of_their_partitions(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(4);
    ingest_batch_t *flushed = NULL;
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 0, NULL, 0, 7, &flushed), FR_OK);
    add_good(bt, "t", 0, 0);
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_int_equal(b->generation, 7);
    ingest_batch_destroy(b);

    /* A new generation flushes the old one's records first. */
    add_good(bt, "t", 0, 1);
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 0, NULL, 0, 8, &flushed), FR_OK);
    assert_non_null(flushed);
    assert_int_equal(flushed->generation, 7);
    assert_range(flushed, 0, "t", 0, 1, 2);
    ingest_batch_destroy(flushed);
    add_good(bt, "t", 0, 0);
    b = ingest_batcher_flush(bt);
    assert_int_equal(b->generation, 8);
    assert_range(b, 0, "t", 0, 0, 1);
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);
}

static void test_bad_arguments_are_refused(void **state)
{
    (void)state;
    char err[256] = "";
    ingest_schema_t s = {.features = 2, .label = INGEST_LABEL_REAL, .classes = 0, .max_record = 0};
    assert_null(ingest_batcher_new(&s, INGEST_FORMAT_CSV, 0, err, sizeof(err)));
    assert_true(strlen(err) > 0);
    assert_null(ingest_batcher_new(&s, INGEST_FORMAT_IDX, 4, err, sizeof(err)));
    assert_null(ingest_batcher_new(NULL, INGEST_FORMAT_CSV, 4, err, sizeof(err)));
    ingest_schema_t s0 = s;
    s0.features = 0;
    assert_null(ingest_batcher_new(&s0, INGEST_FORMAT_CSV, 4, err, sizeof(err)));

    ingest_batcher_t *bt = batcher(4);
    ingest_batch_t *full = (ingest_batch_t *)1;
    ingest_reject_t why = INGEST_REJECT_COUNT;
    assert_int_equal(add_rec(bt, "t", 0, 0, 0, 0, &why, &full), FR_ERR_STATE);
    assert_null(full);
    assert_int_equal(why, INGEST_OK);

    ingest_batch_t *flushed = NULL;
    const int64_t unsorted[2][2] = {{5, 6}, {3, 4}};
    const int64_t overlapping[2][2] = {{3, 6}, {5, 8}};
    const int64_t below[1][2] = {{1, 4}};
    const int64_t empty[1][2] = {{4, 4}};
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 2, unsorted, 2, 0, &flushed), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 2, overlapping, 2, 0, &flushed), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 2, below, 1, 0, &flushed), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 2, empty, 1, 0, &flushed), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 2, NULL, 1, 0, &flushed), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, -1, NULL, 0, 0, &flushed), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 0, NULL, 0, 0, NULL), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_seek(bt, "", 0, 0, NULL, 0, 0, &flushed), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_seek(bt, NULL, 0, 0, NULL, 0, 0, &flushed), FR_ERR_INVAL);
    /* None of those created the partition. */
    assert_int_equal(add_rec(bt, "t", 0, 0, 0, 0, &why, &full), FR_ERR_STATE);

    char longest[INGEST_TOPIC_MAX + 1];
    char too_long[INGEST_TOPIC_MAX + 2];
    memset(longest, 'x', INGEST_TOPIC_MAX);
    longest[INGEST_TOPIC_MAX] = '\0';
    memset(too_long, 'x', INGEST_TOPIC_MAX + 1);
    too_long[INGEST_TOPIC_MAX + 1] = '\0';
    assert_int_equal(ingest_batcher_seek(bt, too_long, 0, 0, NULL, 0, 0, &flushed), FR_ERR_INVAL);
    assert_int_equal(add_rec(bt, too_long, 0, 0, 0, 0, &why, &full), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_revoke(bt, too_long, 0, &flushed), FR_ERR_INVAL);
    assert_null(ingest_batcher_cover(bt, too_long, 0, 5, "start"));
    seek_plain(bt, longest, 0, 0);
    add_good(bt, longest, 0, 0);
    assert_int_equal(add_rec(bt, longest, 0, -1, 0, 0, &why, &full), FR_ERR_INVAL);
    assert_int_equal(add_rec(bt, longest, 0, 1, 0, 0, &why, NULL), FR_ERR_INVAL);
    assert_int_equal(ingest_batcher_add(bt, longest, 0, 1, 0, NULL, 3, &why, &full), FR_ERR_INVAL);
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_string_equal(b->ranges[0].topic, longest);
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);
}

/* Many partitions force the partition table to grow; all stay findable. */
static void test_many_partitions_are_all_kept_apart(void **state)
{
    (void)state;
    ingest_batcher_t *bt = batcher(1000);
    for (int32_t p = 0; p < 300; p++)
        seek_plain(bt, p % 2 ? "odd" : "even", p, p);
    for (int32_t p = 0; p < 300; p++)
        add_good(bt, p % 2 ? "odd" : "even", p, p + 1);
    for (int32_t p = 0; p < 300; p += 7) {
        ingest_batch_t *flushed = NULL;
        assert_int_equal(ingest_batcher_revoke(bt, p % 2 ? "odd" : "even", p, &flushed), FR_OK);
        ingest_batch_destroy(flushed);
    }
    for (int32_t p = 0; p < 300; p++) {
        ingest_batch_t *full = NULL;
        fr_err_t want = p % 7 == 0 ? FR_ERR_STATE : FR_OK;
        assert_int_equal(add_rec(bt, p % 2 ? "odd" : "even", p, p + 2, 0, 0, NULL, &full), want);
    }
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_non_null(b);
    assert_int_equal(b->nranges, 300 - 43);
    for (size_t i = 0; i < b->nranges; i++) {
        assert_int_equal(b->ranges[i].from, b->ranges[i].partition + 2);
        assert_int_equal(b->ranges[i].to, b->ranges[i].partition + 3);
        if (i > 0) {
            int c = strcmp(b->ranges[i - 1].topic, b->ranges[i].topic);
            assert_true(c < 0 || (c == 0 && b->ranges[i - 1].partition < b->ranges[i].partition));
        }
    }
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);
}

/* ------------------------------------------------------------------------
 * The randomized property test.
 * ---------------------------------------------------------------------- */

#define NPART  3
#define MAXPOS 1024

typedef struct model {
    int64_t pos0;
    int64_t skip[4][2];
    size_t nskip;
    int64_t cursor;      /* the next fresh offset to send */
    int64_t sent_end;    /* position after the last offset sent, or pos0 */
    int64_t cover_end;   /* position every position below which must be covered */
    int sent[MAXPOS];    /* offsets sent once: the only ones Kafka can redeliver */
    int want[MAXPOS];    /* samples expected per offset: 0 or 1 */
    int covered[MAXPOS]; /* times a range covered the position */
    int sampled[MAXPOS]; /* times a sample of the offset came out */
    int64_t last_to;     /* end of the last range seen, ranges come in order */
} model_t;

static int in_skip(const model_t *m, int64_t off)
{
    for (size_t i = 0; i < m->nskip; i++)
        if (off >= m->skip[i][0] && off < m->skip[i][1])
            return 1;
    return 0;
}

/* Checks one batch's shape and records what it covers and holds. */
static void take_batch(model_t *m, ingest_batch_t *b, size_t cap, int full)
{
    if (b == NULL)
        return;
    assert_true(b->n <= cap);
    if (full)
        assert_int_equal(b->n, cap);
    if (b->n == 0)
        assert_true(strcmp(b->reason, "decode") == 0 || strcmp(b->reason, "retention") == 0);
    else
        assert_string_equal(b->reason, "");
    assert_true(b->nranges > 0);
    for (size_t i = 0; i < b->nranges; i++) {
        const ingest_range_t *r = &b->ranges[i];
        assert_string_equal(r->topic, "t");
        assert_true(r->partition >= 0 && r->partition < NPART);
        assert_true(r->from < r->to);
        assert_true(r->from >= 0 && r->to <= MAXPOS);
        if (i > 0 && b->ranges[i - 1].partition == r->partition)
            assert_true(b->ranges[i - 1].to < r->from); /* separate, sorted */
        if (i > 0)
            assert_true(b->ranges[i - 1].partition <= r->partition);
        model_t *mp = &m[r->partition];
        assert_true(r->from >= mp->last_to); /* a partition's batches come in order */
        mp->last_to = r->to;
        for (int64_t o = r->from; o < r->to; o++)
            mp->covered[o]++;
    }
    for (size_t i = 0; i < b->n; i++) {
        int64_t off = (int64_t)b->x[2 * i];
        int32_t p = (int32_t)b->x[2 * i + 1];
        assert_true(p >= 0 && p < NPART && off >= 0 && off < MAXPOS);
        m[p].sampled[off]++;
    }
    ingest_batch_destroy(b);
}

/* One random stream over NPART partitions; see the file comment. */
static void run_random_stream(uint64_t seed)
{
    fr_rng_t rng;
    fr_rng_seed(&rng, seed);
    size_t cap = 1 + fr_rng_below(&rng, 7);
    ingest_batcher_t *bt = batcher((int)cap);
    model_t *m = calloc(NPART, sizeof(*m));
    assert_non_null(m);

    for (int32_t p = 0; p < NPART; p++) {
        model_t *mp = &m[p];
        mp->pos0 = (int64_t)fr_rng_below(&rng, 20);
        int64_t at = mp->pos0;
        mp->nskip = fr_rng_below(&rng, 5);
        for (size_t i = 0; i < mp->nskip; i++) {
            at += (int64_t)fr_rng_below(&rng, 30);
            mp->skip[i][0] = at;
            at += 1 + (int64_t)fr_rng_below(&rng, 6);
            mp->skip[i][1] = at;
        }
        mp->cursor = mp->pos0 > 3 ? mp->pos0 - 3 : 0; /* a few records below the seek */
        mp->sent_end = mp->pos0;
        mp->cover_end = mp->pos0;
        mp->last_to = mp->pos0;
        ingest_batch_t *flushed = NULL;
        assert_int_equal(ingest_batcher_seek(bt, "t", p, mp->pos0, (const int64_t(*)[2])mp->skip,
                                             mp->nskip, 0, &flushed),
                         FR_OK);
        assert_null(flushed);
    }

    for (int step = 0; step < 600; step++) {
        int32_t p = (int32_t)fr_rng_below(&rng, NPART);
        model_t *mp = &m[p];
        uint64_t act = fr_rng_below(&rng, 100);
        if (mp->cursor >= MAXPOS - 12)
            continue;
        if (act < 80) {
            if (fr_rng_below(&rng, 10) < 3)
                mp->cursor += 1 + (int64_t)fr_rng_below(&rng, 5); /* an offset hole */
            int64_t off = mp->cursor++;
            mp->sent[off] = 1;
            int bad = fr_rng_below(&rng, 100) < 15 ? 1 + (int)fr_rng_below(&rng, 2) : 0;
            ingest_reject_t why = INGEST_REJECT_COUNT;
            ingest_batch_t *full = NULL;
            assert_int_equal(add_rec(bt, "t", p, off, 0, bad, &why, &full), FR_OK);
            int taken = off >= mp->pos0 && !in_skip(mp, off);
            assert_int_equal(why != INGEST_OK, taken && bad);
            if (taken) {
                mp->want[off] = !bad;
                mp->sent_end = off + 1;
                if (mp->cover_end < off + 1)
                    mp->cover_end = off + 1;
            }
            take_batch(m, full, cap, 1);
        } else if (act < 90) {
            /* A redelivery of something sent before: always ignored. */
            int64_t lo = mp->pos0 > 3 ? mp->pos0 - 3 : 0;
            if (mp->cursor <= lo)
                continue;
            int64_t off = lo + (int64_t)fr_rng_below(&rng, (uint64_t)(mp->cursor - lo));
            if (!mp->sent[off])
                continue; /* an offset hole is never delivered */
            ingest_reject_t why = INGEST_REJECT_COUNT;
            ingest_batch_t *full = NULL;
            assert_int_equal(add_rec(bt, "t", p, off, 0, (int)fr_rng_below(&rng, 2), &why, &full),
                             FR_OK);
            assert_int_equal(why, INGEST_OK);
            assert_null(full);
        } else if (act < 96) {
            take_batch(m, ingest_batcher_flush(bt), cap, 0);
        } else if (!ingest_batcher_holds(bt, "t", p)) {
            /* Retention: the log start moved past this partition's next. */
            int64_t to = mp->cursor + 1 + (int64_t)fr_rng_below(&rng, 6);
            if (to <= mp->pos0)
                continue;
            take_batch(m, ingest_batcher_cover(bt, "t", p, to, "retention"), cap, 0);
            mp->cursor = to;
            mp->cover_end = to;
        }
    }
    take_batch(m, ingest_batcher_flush(bt), cap, 0);
    for (int32_t p = 0; p < NPART; p++)
        assert_false(ingest_batcher_holds(bt, "t", p));

    for (int32_t p = 0; p < NPART; p++) {
        const model_t *mp = &m[p];
        for (int64_t o = 0; o < MAXPOS; o++) {
            int want_cov = o >= mp->pos0 && o < mp->cover_end && !in_skip(mp, o);
            if (mp->covered[o] != want_cov || mp->sampled[o] != mp->want[o])
                fail_msg("seed %llu partition %d position %lld: covered %d (want %d), "
                         "sampled %d (want %d)",
                         (unsigned long long)seed, (int)p, (long long)o, mp->covered[o], want_cov,
                         mp->sampled[o], mp->want[o]);
        }
    }
    free(m);
    ingest_batcher_destroy(bt);
}

static void test_random_streams_cover_every_position_once_and_every_sample_once(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 400; seed++)
        run_random_stream(seed);
}

/* Records decoded ahead make the very same batches: the tests of
 * rejection, quarantine, redeliveries, skips and the random streams pass
 * unchanged through ingest_batcher_add_decoded, and a call without a
 * decoded record, or a good one without its row, is refused. */
static void test_records_decoded_ahead_make_the_same_batches(void **state)
{
    decode_ahead = 1;
    test_rejected_records_are_covered_and_counted_by_reason(state);
    test_quarantined_positions_are_rejected_until_the_next_seek(state);
    test_records_below_next_and_redeliveries_are_ignored(state);
    test_skip_intervals_are_cut_out_of_coverage_and_their_records_ignored(state);
    test_random_streams_cover_every_position_once_and_every_sample_once(state);
    decode_ahead = 0;

    ingest_batcher_t *bt = batcher(4);
    seek_plain(bt, "t", 0, 0);
    ingest_reject_t why = INGEST_REJECT_COUNT;
    ingest_batch_t *full = (ingest_batch_t *)1;
    assert_int_equal(ingest_batcher_add_decoded(bt, "t", 0, 0, 0, NULL, NAN, &why, &full),
                     FR_ERR_INVAL);
    assert_int_equal(why, INGEST_OK);
    assert_null(full);
    ingest_decoded_t rowless = {NULL, 1.0f, INGEST_OK};
    assert_int_equal(ingest_batcher_add_decoded(bt, "t", 0, 0, 0, &rowless, NAN, &why, &full),
                     FR_ERR_INVAL);
    /* a rejected record needs no row; it is covered like any other */
    ingest_decoded_t bad = {NULL, 0.0f, INGEST_REJECT_BAD_NUMBER};
    assert_int_equal(ingest_batcher_add_decoded(bt, "t", 0, 0, 0, &bad, NAN, &why, &full), FR_OK);
    assert_int_equal(why, INGEST_REJECT_BAD_NUMBER);
    ingest_batch_t *b = ingest_batcher_flush(bt);
    assert_non_null(b);
    assert_int_equal(b->n, 0);
    assert_range(b, 0, "t", 0, 0, 1);
    ingest_batch_destroy(b);
    ingest_batcher_destroy(bt);

    /* the aux slot takes the record's aux value over the decoded row's */
    ingest_schema_t s = {.features = 2, .label = INGEST_LABEL_REAL, .aux = 1};
    char err[256] = "";
    bt = ingest_batcher_new(&s, INGEST_FORMAT_CSV, 2, err, sizeof(err));
    assert_non_null(bt);
    seek_plain(bt, "t", 0, 0);
    const float row[2] = {5.0f, 6.0f};
    ingest_decoded_t good = {row, 1.0f, INGEST_OK};
    assert_int_equal(ingest_batcher_add_decoded(bt, "t", 0, 0, 0, &good, 0.25f, &why, &full),
                     FR_OK);
    assert_null(full);
    assert_int_equal(ingest_batcher_add_decoded(bt, "t", 0, 1, 0, &good, NAN, &why, &full), FR_OK);
    assert_non_null(full);
    assert_int_equal(full->n, 2);
    const float want[4] = {5.0f, 0.25f, 5.0f, 6.0f};
    assert_memory_equal(full->x, want, sizeof(want));
    assert_true(full->y[0] == 1.0f && full->y[1] == 1.0f);
    ingest_batch_destroy(full);
    ingest_batcher_destroy(bt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contiguous_records_make_full_batches_of_exactly_b),
        cmocka_unit_test(test_flush_returns_the_final_partial_batch_and_then_nothing),
        cmocka_unit_test(test_offset_holes_are_covered_by_the_batch_that_follows),
        cmocka_unit_test(test_rejected_records_are_covered_and_counted_by_reason),
        cmocka_unit_test(test_quarantined_positions_are_rejected_until_the_next_seek),
        cmocka_unit_test(test_records_below_next_and_redeliveries_are_ignored),
        cmocka_unit_test(test_skip_intervals_are_cut_out_of_coverage_and_their_records_ignored),
        cmocka_unit_test(test_two_partitions_interleaved_make_one_batch_with_sorted_ranges),
        cmocka_unit_test(test_records_below_alone_to_are_batched_apart_from_other_partitions),
        cmocka_unit_test(test_a_batch_filled_right_after_a_closing_waits_for_the_next_record),
        cmocka_unit_test(
            test_seek_and_revoke_flush_the_open_batch_only_when_it_holds_the_partition),
        cmocka_unit_test(test_cover_makes_an_empty_batch_from_next_to_to_and_advances_next),
        cmocka_unit_test(test_timestamps_are_the_min_and_max_of_the_samples),
        cmocka_unit_test(test_batches_carry_the_generation_of_their_partitions),
        cmocka_unit_test(test_bad_arguments_are_refused),
        cmocka_unit_test(test_many_partitions_are_all_kept_apart),
        cmocka_unit_test(test_random_streams_cover_every_position_once_and_every_sample_once),
        cmocka_unit_test(test_records_decoded_ahead_make_the_same_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
