/*
 * test_offsets.c - unit tests of the offset interval arithmetic
 * (psstore_poff_*, docs/design.md "Offsets"): marks in and out of order, merges,
 * the watermark's advance, every boundary of the overlap test, rewinds, the
 * text form, and a randomized comparison against a bitmap model; then the
 * text forms of offsets.c (keys, spans, ranges, rewind targets): round
 * trips, rejections, and reads bounded by the given length.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "psstore/positions/positions.h"

/* Checks po against the expected watermark and spans {from, to, ...}. */
static void expect_state(const psstore_partition_offsets_t *po, int64_t watermark, size_t nspans,
                         const int64_t *bounds, int line)
{
    if (po->watermark != watermark)
        fail_msg("line %d: watermark %lld, expected %lld", line, (long long)po->watermark,
                 (long long)watermark);
    if (po->nspans != nspans)
        fail_msg("line %d: %zu spans, expected %zu", line, po->nspans, nspans);
    for (size_t i = 0; i < nspans; i++) {
        if (po->spans[i].from != bounds[2 * i] || po->spans[i].to != bounds[2 * i + 1])
            fail_msg("line %d: span %zu is [%lld, %lld), expected [%lld, %lld)", line, i,
                     (long long)po->spans[i].from, (long long)po->spans[i].to,
                     (long long)bounds[2 * i], (long long)bounds[2 * i + 1]);
    }
}
#define EXPECT(po, wm, ...)                                                                        \
    do {                                                                                           \
        const int64_t b_[] = {0, __VA_ARGS__};                                                     \
        expect_state((po), (wm), (sizeof(b_) / sizeof(b_[0]) - 1) / 2, b_ + 1, __LINE__);          \
    } while (0)

#define MARK_OK(po, a, b) assert_int_equal(psstore_poff_mark((po), (a), (b)), FR_OK)

/* The text form of po, for comparisons (static buffer). */
static const char *text_of(const psstore_partition_offsets_t *po)
{
    static char buf[4096];
    char *s = NULL;
    size_t len = 0;
    assert_int_equal(psstore_poff_format(po, &s, &len), FR_OK);
    assert_int_equal(strlen(s), len);
    snprintf(buf, sizeof(buf), "%s", s);
    free(s);
    return buf;
}

/* ------------------------------------------------------------------------
 * Marking
 * ---------------------------------------------------------------------- */
static void test_offsets_start_empty_at_the_watermark(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 17);
    EXPECT(&po, 17);
    assert_null(po.spans);
    psstore_poff_fini(&po);
    psstore_poff_fini(&po); /* twice is harmless */
    psstore_poff_fini(NULL);
}

static void test_offsets_mark_in_order_advances_the_watermark(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 0);
    MARK_OK(&po, 0, 10);
    EXPECT(&po, 10);
    MARK_OK(&po, 10, 11);
    MARK_OK(&po, 11, 64);
    EXPECT(&po, 64);
    assert_string_equal(text_of(&po), "64");
    psstore_poff_fini(&po);
}

static void test_offsets_mark_out_of_order_keeps_sorted_spans(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 0);
    MARK_OK(&po, 50, 60);
    EXPECT(&po, 0, 50, 60);
    MARK_OK(&po, 20, 30);
    EXPECT(&po, 0, 20, 30, 50, 60);
    MARK_OK(&po, 80, 90);
    EXPECT(&po, 0, 20, 30, 50, 60, 80, 90);
    MARK_OK(&po, 35, 40);
    EXPECT(&po, 0, 20, 30, 35, 40, 50, 60, 80, 90);
    assert_string_equal(text_of(&po), "0;20-30,35-40,50-60,80-90");
    psstore_poff_fini(&po);
}

static void test_offsets_adjacent_marks_merge(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 0);
    MARK_OK(&po, 10, 20);
    MARK_OK(&po, 20, 25); /* joins the end of [10, 20) */
    EXPECT(&po, 0, 10, 25);
    MARK_OK(&po, 5, 10); /* joins its start */
    EXPECT(&po, 0, 5, 25);
    MARK_OK(&po, 30, 40);
    MARK_OK(&po, 25, 30); /* fills the gap: both sides merge */
    EXPECT(&po, 0, 5, 40);
    MARK_OK(&po, 41, 42); /* not adjacent: a new span */
    EXPECT(&po, 0, 5, 40, 41, 42);
    psstore_poff_fini(&po);
}

static void test_offsets_watermark_advances_over_several_spans(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 100);
    MARK_OK(&po, 110, 120);
    MARK_OK(&po, 130, 140);
    MARK_OK(&po, 105, 110); /* joins [110, 120) but leaves [100, 105) open */
    EXPECT(&po, 100, 105, 120, 130, 140);
    MARK_OK(&po, 120, 130); /* one span 105..140 */
    EXPECT(&po, 100, 105, 140);
    MARK_OK(&po, 100, 105); /* the hole at the watermark closes: all swallowed */
    EXPECT(&po, 140);
    MARK_OK(&po, 150, 160);
    MARK_OK(&po, 140, 150); /* starts at the watermark and meets a span */
    EXPECT(&po, 160);
    psstore_poff_fini(&po);
}

static void test_offsets_mark_refuses_empty_and_overlapping_intervals(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 10);
    MARK_OK(&po, 20, 30);
    assert_int_equal(psstore_poff_mark(&po, 40, 40), FR_ERR_INVAL);
    assert_int_equal(psstore_poff_mark(&po, 45, 40), FR_ERR_INVAL);
    assert_int_equal(psstore_poff_mark(&po, 5, 12), FR_ERR_INVAL);  /* below the watermark */
    assert_int_equal(psstore_poff_mark(&po, 9, 10), FR_ERR_INVAL);  /* last position below */
    assert_int_equal(psstore_poff_mark(&po, 15, 21), FR_ERR_INVAL); /* into a span */
    assert_int_equal(psstore_poff_mark(&po, 29, 35), FR_ERR_INVAL); /* out of a span */
    assert_int_equal(psstore_poff_mark(&po, 22, 25), FR_ERR_INVAL); /* inside */
    assert_int_equal(psstore_poff_mark(&po, 15, 35), FR_ERR_INVAL); /* around */
    EXPECT(&po, 10, 20, 30);                                        /* unchanged */
    psstore_poff_fini(&po);
}

/* Many spans force the array to grow; marking the holes then empties it. */
static void test_offsets_many_spans_grow_and_collapse(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 0);
    for (int64_t i = 999; i >= 1; i--)
        MARK_OK(&po, 2 * i, 2 * i + 1);
    assert_int_equal(po.nspans, 999);
    assert_true(psstore_poff_overlaps(&po, 1000, 1001));
    assert_false(psstore_poff_overlaps(&po, 1001, 1002));
    for (int64_t i = 999; i >= 1; i--)
        MARK_OK(&po, 2 * i + 1, 2 * i + 2);
    EXPECT(&po, 0, 2, 2000);
    MARK_OK(&po, 0, 2);
    EXPECT(&po, 2000);
    psstore_poff_fini(&po);
}

/* ------------------------------------------------------------------------
 * Overlaps at every boundary
 * ---------------------------------------------------------------------- */
static void test_offsets_overlaps_at_every_boundary(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 10);
    MARK_OK(&po, 20, 30);
    MARK_OK(&po, 40, 50);
    /* the watermark: position 9 is applied, 10 is not */
    assert_true(psstore_poff_overlaps(&po, 0, 5));
    assert_true(psstore_poff_overlaps(&po, 9, 10));
    assert_true(psstore_poff_overlaps(&po, 9, 15));
    assert_false(psstore_poff_overlaps(&po, 10, 20));
    assert_false(psstore_poff_overlaps(&po, 10, 11));
    /* half-open ends touch without overlapping */
    assert_false(psstore_poff_overlaps(&po, 15, 20));
    assert_false(psstore_poff_overlaps(&po, 30, 40));
    assert_false(psstore_poff_overlaps(&po, 50, 51));
    assert_false(psstore_poff_overlaps(&po, 50, 1000));
    /* one position inside, at either end of a span */
    assert_true(psstore_poff_overlaps(&po, 15, 21));
    assert_true(psstore_poff_overlaps(&po, 29, 35));
    assert_true(psstore_poff_overlaps(&po, 20, 21));
    assert_true(psstore_poff_overlaps(&po, 29, 30));
    assert_true(psstore_poff_overlaps(&po, 49, 50));
    /* inside, around one span, around both */
    assert_true(psstore_poff_overlaps(&po, 22, 25));
    assert_true(psstore_poff_overlaps(&po, 35, 55));
    assert_true(psstore_poff_overlaps(&po, 19, 51));
    /* an empty or reversed interval holds no position */
    assert_false(psstore_poff_overlaps(&po, 25, 25));
    assert_false(psstore_poff_overlaps(&po, 5, 5));
    assert_false(psstore_poff_overlaps(&po, 25, 22));
    psstore_poff_fini(&po);
}

/* ------------------------------------------------------------------------
 * Rewind
 * ---------------------------------------------------------------------- */
static void test_offsets_rewind_below_clears_every_span(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 100);
    MARK_OK(&po, 120, 130);
    MARK_OK(&po, 150, 160);
    psstore_poff_rewind(&po, 40);
    EXPECT(&po, 40);
    assert_false(psstore_poff_overlaps(&po, 40, 200));
    assert_true(psstore_poff_overlaps(&po, 39, 40));
    MARK_OK(&po, 120, 130); /* the cleared positions can be applied again */
    psstore_poff_fini(&po);
}

/*
 * Moving the watermark forward over spans (--to-latest, say): positions
 * below the target stay applied (the spans below it are absorbed by the
 * watermark), those at or above it are cleared, including the upper part
 * of a span that straddles the target.
 */
static void test_offsets_rewind_forward_keeps_positions_below_and_clears_above(void **state)
{
    (void)state;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 0);
    MARK_OK(&po, 10, 20);
    MARK_OK(&po, 30, 40);
    MARK_OK(&po, 50, 60);
    psstore_poff_rewind(&po, 35);
    EXPECT(&po, 35);
    assert_true(psstore_poff_overlaps(&po, 10, 20));
    assert_true(psstore_poff_overlaps(&po, 34, 35));
    assert_false(psstore_poff_overlaps(&po, 35, 100));
    assert_string_equal(text_of(&po), "35");
    psstore_poff_rewind(&po, 35); /* to the watermark itself: nothing to clear */
    EXPECT(&po, 35);
    psstore_poff_fini(&po);
}

/* ------------------------------------------------------------------------
 * Text form
 * ---------------------------------------------------------------------- */
static void test_offsets_format_and_parse_round_trip(void **state)
{
    (void)state;
    const char *texts[] = {"0",
                           "7",
                           "9223372036854775807",
                           "5;6-7",
                           "0;1-2,3-4,10-20",
                           "100;9000000000000-9000000000001"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        psstore_partition_offsets_t po;
        char why[256];
        psstore_poff_init(&po, 0);
        if (psstore_poff_parse(&po, texts[i], strlen(texts[i]), why, sizeof(why)) != FR_OK)
            fail_msg("'%s': %s", texts[i], why);
        assert_string_equal(text_of(&po), texts[i]);
        psstore_poff_fini(&po);
    }
    /* from marks to text and back */
    psstore_partition_offsets_t a, b;
    psstore_poff_init(&a, 3);
    MARK_OK(&a, 8, 9);
    MARK_OK(&a, 100, 250);
    MARK_OK(&a, 12, 13);
    psstore_poff_init(&b, 0);
    const char *t = text_of(&a);
    assert_string_equal(t, "3;8-9,12-13,100-250");
    assert_int_equal(psstore_poff_parse(&b, t, strlen(t), NULL, 0), FR_OK);
    EXPECT(&b, 3, 8, 9, 12, 13, 100, 250);
    /* parse replaces what b held; a text need not be NUL-terminated */
    assert_int_equal(psstore_poff_parse(&b, "42;50-60XXXX", 8, NULL, 0), FR_OK);
    EXPECT(&b, 42, 50, 60);
    psstore_poff_fini(&a);
    psstore_poff_fini(&b);
}

static void test_offsets_parse_rejects_malformed_text(void **state)
{
    (void)state;
    const char *bad[] = {
        "",                         /* empty */
        ";",                        /* no watermark */
        "-1",                       /* negative */
        "+5",                       /* a sign */
        " 5",                       /* spaces */
        "5 ",                       /*  */
        "abc",                      /* garbage */
        "5x",                       /* trailing garbage */
        "5;",                       /* ';' and nothing */
        "5;6",                      /* no '-' */
        "5;6-",                     /* no end */
        "5;-7",                     /* no start */
        "5;6-7,",                   /* trailing ',' */
        "5;6-7;8-9",                /* a second ';' */
        "5;7-6",                    /* reversed */
        "5;6-6",                    /* empty */
        "5;3-8",                    /* below the watermark */
        "5;5-8",                    /* at the watermark (would be merged) */
        "5;10-20,1-2",              /* unsorted */
        "5;10-20,15-30",            /* overlapping */
        "5;10-20,20-30",            /* adjacent (would be merged) */
        "5;10--20",                 /* negative end */
        "5;-10-20",                 /*  */
        "9223372036854775808",      /* overflow */
        "5;6-99999999999999999999", /* overflow */
        "0x10",                     /* hex */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        psstore_partition_offsets_t po;
        char why[256] = "";
        psstore_poff_init(&po, 77);
        MARK_OK(&po, 80, 90);
        fr_err_t err = psstore_poff_parse(&po, bad[i], strlen(bad[i]), why, sizeof(why));
        if (err != FR_ERR_PARSE)
            fail_msg("'%s' was accepted (%d)", bad[i], err);
        assert_true(strlen(why) > 0);
        EXPECT(&po, 77, 80, 90); /* left unchanged */
        psstore_poff_fini(&po);
    }
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 0);
    assert_int_equal(psstore_poff_parse(&po, NULL, 0, NULL, 0), FR_ERR_PARSE);
    psstore_poff_fini(&po);
}

/* ------------------------------------------------------------------------
 * Randomized against a bitmap
 * ---------------------------------------------------------------------- */
#define UNIVERSE 2000

/* Checks po's watermark, spans and overlap answers against the bitmap. */
static void check_against_bitmap(const psstore_partition_offsets_t *po, const unsigned char *bit)
{
    int64_t wm = 0;
    while (wm < UNIVERSE && bit[wm])
        wm++;
    if (po->watermark != wm)
        fail_msg("watermark %lld, bitmap says %lld", (long long)po->watermark, (long long)wm);
    /* spans are exactly the maximal runs of set bits above the watermark */
    size_t k = 0;
    for (int64_t p = wm; p < UNIVERSE;) {
        if (!bit[p]) {
            p++;
            continue;
        }
        int64_t q = p;
        while (q < UNIVERSE && bit[q])
            q++;
        if (k >= po->nspans || po->spans[k].from != p || po->spans[k].to != q)
            fail_msg("span %zu: expected [%lld, %lld)", k, (long long)p, (long long)q);
        k++;
        p = q;
    }
    assert_int_equal(k, po->nspans);
}

static void test_offsets_random_marks_match_a_bitmap_model(void **state)
{
    (void)state;
    static unsigned char bit[UNIVERSE];
    memset(bit, 0, sizeof(bit));
    fr_rng_t rng;
    fr_rng_seed(&rng, 20260101);
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 0);
    int applied = 0;
    for (int iter = 0; iter < 10000; iter++) {
        int64_t from = (int64_t)fr_rng_below(&rng, UNIVERSE);
        int64_t len = 1 + (int64_t)fr_rng_below(&rng, iter % 3 == 0 ? 40 : 6);
        int64_t to = from + len > UNIVERSE ? UNIVERSE : from + len;
        int expect = 0;
        for (int64_t p = from; p < to; p++)
            expect |= bit[p];
        assert_int_equal(psstore_poff_overlaps(&po, from, to), expect);
        /* also probe a random interval, marked or not */
        int64_t a = (int64_t)fr_rng_below(&rng, UNIVERSE),
                b = a + 1 + (int64_t)fr_rng_below(&rng, 8);
        int probe = 0;
        for (int64_t p = a; p < b && p < UNIVERSE; p++)
            probe |= bit[p];
        if (b <= UNIVERSE)
            assert_int_equal(psstore_poff_overlaps(&po, a, b), probe);
        fr_err_t err = psstore_poff_mark(&po, from, to);
        if (expect) {
            assert_int_equal(err, FR_ERR_INVAL);
        } else {
            assert_int_equal(err, FR_OK);
            memset(bit + from, 1, (size_t)(to - from));
            applied++;
        }
        check_against_bitmap(&po, bit);
        if (iter % 500 == 0) { /* the text form round-trips at every stage */
            psstore_partition_offsets_t copy;
            psstore_poff_init(&copy, 0);
            char *s;
            size_t n;
            assert_int_equal(psstore_poff_format(&po, &s, &n), FR_OK);
            assert_int_equal(psstore_poff_parse(&copy, s, n, NULL, 0), FR_OK);
            check_against_bitmap(&copy, bit);
            free(s);
            psstore_poff_fini(&copy);
        }
        if (iter == 6000) { /* a rewind midway, then more marks */
            int64_t target = po.watermark / 2;
            psstore_poff_rewind(&po, target);
            memset(bit + target, 0, UNIVERSE - (size_t)target);
            check_against_bitmap(&po, bit);
        }
    }
    assert_true(applied > 100);
    psstore_poff_fini(&po);
}

/* The replay generation rides after '@' and survives a round trip. */
static void test_offsets_generation_round_trips(void **state)
{
    psstore_partition_offsets_t po, back;
    psstore_poff_init(&po, 0);
    psstore_poff_init(&back, 0);
    assert_int_equal(psstore_poff_parse(&po, "7;9-12@3", 8, NULL, 0), FR_OK);
    assert_int_equal(po.watermark, 7);
    assert_int_equal(po.generation, 3);
    assert_int_equal(po.nspans, 1);
    char *text;
    size_t len;
    assert_int_equal(psstore_poff_format(&po, &text, &len), FR_OK);
    assert_int_equal(len, 8);
    assert_memory_equal(text, "7;9-12@3", 8);
    free(text);
    assert_int_equal(psstore_poff_parse(&back, "7@", 2, NULL, 0), FR_ERR_PARSE);
    assert_int_equal(psstore_poff_parse(&back, "7@1x", 4, NULL, 0), FR_ERR_PARSE);
    psstore_poff_fini(&po);
    psstore_poff_fini(&back);
}

/* ------------------------------------------------------------------------
 * Text forms: keys, spans, ranges, rewind targets
 * ---------------------------------------------------------------------- */

/* "topic/partition" splits at its last '/' and round-trips. */
static void test_text_key_round_trips_and_rejects_bad_keys(void **state)
{
    char buf[PSSTORE_KEY_MAX], topic[PSSTORE_TOPIC_MAX + 1];
    int32_t p = -1;
    assert_int_equal(psstore_key_format(buf, sizeof(buf), "fashion", 3), 9);
    assert_string_equal(buf, "fashion/3");
    assert_int_equal(psstore_key_parse(buf, 9, topic, sizeof(topic), &p), FR_OK);
    assert_string_equal(topic, "fashion");
    assert_int_equal(p, 3);
    assert_int_equal(psstore_key_parse("a/b/2147483647", 14, topic, sizeof(topic), &p), FR_OK);
    assert_string_equal(topic, "a/b");
    assert_int_equal(p, INT32_MAX);
    /* the length bounds the read: "t/12" cut to "t/1" */
    assert_int_equal(psstore_key_parse("t/12", 3, topic, sizeof(topic), &p), FR_OK);
    assert_int_equal(p, 1);
    const char *bad[] = {"t", "/1", "t/", "t/+1", "t/-1", "t/ 1", "t/1x", "t/2147483648", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(psstore_key_parse(bad[i], strlen(bad[i]), topic, sizeof(topic), &p),
                         FR_ERR_PARSE);
    assert_int_equal(psstore_key_parse("abc/1", 5, topic, 3, &p), FR_ERR_PARSE);
    size_t tlen = 0;
    assert_int_equal(psstore_key_split("ab/7", 4, &tlen, &p), FR_OK);
    assert_int_equal(tlen, 2);
    assert_int_equal(p, 7);
    assert_true(psstore_key_cmp("a/10", "a/9") > 0);
    assert_true(psstore_key_cmp("a/1", "b/0") < 0);
    assert_true(psstore_key_cmp("ab/0", "a/5") > 0);
    assert_int_equal(psstore_key_cmp("x/4", "x/4"), 0);
}

/* "a-b" and "a-b,c-d" round-trip; the list parser keeps the offsets rules. */
static void test_text_spans_round_trip_and_reject_bad_lists(void **state)
{
    char buf[128];
    psstore_span_t sp = {0, 0};
    assert_int_equal(psstore_span_format(buf, sizeof(buf), (psstore_span_t){5, 9}), 3);
    assert_string_equal(buf, "5-9");
    assert_int_equal(psstore_span_parse(buf, 3, &sp), FR_OK);
    assert_int_equal(sp.from, 5);
    assert_int_equal(sp.to, 9);
    const char *bad[] = {"", "5", "5-", "-9", "9-5", "5-5", "5-9,", "+5-9", "5-9x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(psstore_span_parse(bad[i], strlen(bad[i]), &sp), FR_ERR_PARSE);
    assert_int_equal(psstore_span_parse("5-91", 3, &sp), FR_OK); /* reads 3 bytes only */
    assert_int_equal(sp.to, 9);

    const psstore_span_t spans[] = {{3, 5}, {7, 8}, {INT64_MAX - 1, INT64_MAX}};
    int n = psstore_spans_format(buf, sizeof(buf), spans, 3);
    assert_string_equal(buf, "3-5,7-8,9223372036854775806-9223372036854775807");
    assert_int_equal(n, (int)strlen(buf));
    char small[6];
    assert_int_equal(psstore_spans_format(small, sizeof(small), spans, 3), n);
    assert_string_equal(small, "3-5,7");
    assert_int_equal(psstore_spans_format(buf, sizeof(buf), spans, 0), 0);
    assert_string_equal(buf, "");

    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 2);
    char err[128];
    assert_int_equal(psstore_spans_parse(&po, "x;3-5,7-8", 9, 2, err, sizeof(err)), FR_OK);
    assert_int_equal(po.nspans, 2);
    assert_int_equal(po.spans[1].to, 8);
    psstore_poff_fini(&po);
    psstore_poff_init(&po, 2);
    assert_int_equal(psstore_spans_parse(&po, "3-5,5-8", 7, 0, err, sizeof(err)), FR_ERR_PARSE);
    assert_string_equal(err, "offsets: span 5-8 is empty, unsorted, overlapping, adjacent or not "
                             "above 5");
    psstore_poff_fini(&po); /* a failed parse keeps the spans read before the fault */
    psstore_poff_init(&po, 2);
    assert_int_equal(psstore_spans_parse(&po, "3-5,", 4, 0, err, sizeof(err)), FR_ERR_PARSE);
    assert_string_equal(err, "offsets: expected a span FROM-TO at byte 4");
    psstore_poff_fini(&po);
    psstore_poff_init(&po, 2);
    assert_int_equal(psstore_spans_parse(&po, "3-5;", 4, 0, err, sizeof(err)), FR_ERR_PARSE);
    assert_string_equal(err, "offsets: expected a span end and ',' at byte 3");
    psstore_poff_fini(&po);
}

/* "topic:partition:from:to" round-trips and names each fault. */
static void test_text_ranges_round_trip_and_name_each_fault(void **state)
{
    const psstore_range_t in[] = {{"events", 0, 10, 42}, {"a.b-c_D", 3, 0, INT64_MAX}};
    char buf[256], topic[PSSTORE_TOPIC_MAX + 1];
    int n = psstore_ranges_format(buf, sizeof(buf), in, 2);
    assert_string_equal(buf, "events:0:10:42,a.b-c_D:3:0:9223372036854775807");
    assert_int_equal(n, (int)strlen(buf));
    assert_int_equal(psstore_range_format(buf, sizeof(buf), &in[1]), 31);
    psstore_range_t r = {0};
    size_t tlen = 0;
    assert_int_equal(psstore_range_parse(buf, 31, &r, topic, sizeof(topic), &tlen),
                     PSSTORE_RANGE_OK);
    assert_string_equal(r.topic, "a.b-c_D");
    assert_ptr_equal(r.topic, topic);
    assert_int_equal(tlen, 7);
    assert_int_equal(r.partition, 3);
    assert_int_equal(r.from, 0);
    assert_int_equal(r.to, INT64_MAX);
    psstore_span_t sp = psstore_range_span(&r);
    assert_int_equal(sp.from, 0);
    assert_int_equal(sp.to, INT64_MAX);
    static const struct {
        const char *text;
        psstore_range_fault_t fault;
    } bad[] = {
        {"", PSSTORE_RANGE_EMPTY},
        {"t:0:1", PSSTORE_RANGE_SHAPE},
        {"t:0:1:2:3", PSSTORE_RANGE_SHAPE},
        {":0:1:2", PSSTORE_RANGE_TOPIC},
        {"a/b:0:1:2", PSSTORE_RANGE_TOPIC},
        {"t:-1:1:2", PSSTORE_RANGE_PARTITION},
        {"t:2147483648:1:2", PSSTORE_RANGE_PARTITION},
        {"t::1:2", PSSTORE_RANGE_PARTITION},
        {"t:0:+1:2", PSSTORE_RANGE_POSITION},
        {"t:0:1:9223372036854775808", PSSTORE_RANGE_POSITION},
        {"t:0:000000000000000000001:2", PSSTORE_RANGE_POSITION},
        {"t:0:5:5", PSSTORE_RANGE_ORDER},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        psstore_range_t v = {"untouched", 9, 1, 2};
        assert_int_equal(
            psstore_range_parse(bad[i].text, strlen(bad[i].text), &v, topic, sizeof(topic), &tlen),
            bad[i].fault);
        assert_string_equal(v.topic, "untouched");
    }
    psstore_range_t v;
    assert_int_equal(psstore_range_parse("t:0:7:3", 7, &v, topic, sizeof(topic), &tlen),
                     PSSTORE_RANGE_ORDER);
    assert_int_equal(v.from, 7);
    assert_int_equal(v.to, 3);
    char longt[PSSTORE_TOPIC_MAX + 10];
    memset(longt, 'a', PSSTORE_TOPIC_MAX + 1);
    memcpy(longt + PSSTORE_TOPIC_MAX + 1, ":0:1:2", 6);
    assert_int_equal(
        psstore_range_parse(longt, PSSTORE_TOPIC_MAX + 7, &v, topic, sizeof(topic), &tlen),
        PSSTORE_RANGE_TOPIC);
    /* the length bounds the read */
    assert_int_equal(psstore_range_parse("t:0:1:23", 7, &v, topic, sizeof(topic), &tlen),
                     PSSTORE_RANGE_OK);
    assert_int_equal(v.to, 2);
}

/* A copy of ranges owns its topics. */
static void test_text_ranges_dup_copies_the_topics(void **state)
{
    char t0[] = "abc", t1[] = "de";
    const psstore_range_t in[] = {{t0, 1, 2, 3}, {t1, 4, 5, 6}};
    psstore_range_t *dup = psstore_ranges_dup(in, 2);
    assert_non_null(dup);
    t0[0] = t1[0] = 'x';
    assert_string_equal(dup[0].topic, "abc");
    assert_string_equal(dup[1].topic, "de");
    assert_int_equal(dup[1].partition, 4);
    assert_int_equal(dup[1].to, 6);
    free(dup);
    assert_null(psstore_ranges_dup(in, 0));
}

/* "topic/partition=target,..." round-trips and refuses unwritable targets. */
static void test_text_targets_round_trip_and_reject_bad_items(void **state)
{
    const psstore_rewind_t t[] = {{"fashion", 3, 104}, {"a.b", 0, 0}};
    char *text = NULL;
    size_t len = 0, bad = 99;
    assert_int_equal(psstore_targets_format(t, 2, &text, &len, &bad), FR_OK);
    assert_string_equal(text, "fashion/3=104,a.b/0=0");
    assert_int_equal(len, strlen(text));
    char topic[PSSTORE_TOPIC_MAX + 1];
    int32_t p;
    int64_t target;
    assert_int_equal(psstore_target_parse(text, 13, topic, sizeof(topic), &p, &target), FR_OK);
    assert_string_equal(topic, "fashion");
    assert_int_equal(p, 3);
    assert_int_equal(target, 104);
    free(text);
    const psstore_rewind_t badt[] = {{"ok", 0, 1}, {"a/b", 0, 1}, {"c", -1, 1}, {"d", 0, -1}};
    for (size_t i = 1; i < 4; i++) {
        const psstore_rewind_t pair[] = {badt[0], badt[i]};
        assert_int_equal(psstore_targets_format(pair, 2, &text, &len, &bad), FR_ERR_INVAL);
        assert_int_equal(bad, 1);
    }
    const char *badi[] = {"t/1", "t/1=", "t=5", "t/x=5", "t/1=-5", "t/1=+5", "t/1=5x", "/1=5"};
    for (size_t i = 0; i < sizeof(badi) / sizeof(badi[0]); i++)
        assert_int_equal(
            psstore_target_parse(badi[i], strlen(badi[i]), topic, sizeof(topic), &p, &target),
            FR_ERR_PARSE);
    size_t voff = 0;
    assert_int_equal(psstore_keyval_parse("t/2=7;9-12@3", 12, topic, sizeof(topic), &p, &voff),
                     FR_OK);
    assert_string_equal(topic, "t");
    assert_int_equal(p, 2);
    assert_int_equal(voff, 4);
}

/* ------------------------------------------------------------------------
 * Shards: the cut of the vector, its text and shard lists
 * ---------------------------------------------------------------------- */
static void test_shard_bounds_cut_at_rows_balanced_by_bytes(void **state)
{
    (void)state;
    size_t b[PSSTORE_SHARDS_MAX + 1];
    char err[256];
    /* 784-256-10: W1 rows of 784 floats up to 200,704, b1 to 200,960, W2
     * rows of 256 to 203,520, b2 to 203,530 */
    assert_int_equal(psstore_shard_bounds("784-256-10", 203530, 2, b, err, sizeof(err)), FR_OK);
    assert_true(b[0] == 0 && b[2] == 203530);
    assert_true(b[1] == 101920); /* row 130 of W1: 130 * 784, the nearest to 101,765 */
    assert_int_equal(psstore_shard_bounds("784-256-10", 203530, 4, b, err, sizeof(err)), FR_OK);
    const size_t four[] = {0, 50960, 101920, 152880, 203530}; /* rows 65, 130, 195 */
    assert_memory_equal(b, four, sizeof(four));
    for (int k = 0; k < 4; k++) /* each within a row (784 floats) of a quarter */
        assert_true(labs((long)(b[k + 1] - b[k]) - 203530 / 4) <= 784);
    /* 3-64-1: the cut falls at a row start or at b1's start or end */
    assert_int_equal(psstore_shard_bounds("3-64-1", 321, 4, b, err, sizeof(err)), FR_OK);
    const size_t small[] = {0, 81, 159, 256, 321};
    assert_memory_equal(b, small, sizeof(small));
    /* one shard: the whole vector */
    assert_int_equal(psstore_shard_bounds("3-64-1", 321, 1, b, err, sizeof(err)), FR_OK);
    assert_true(b[0] == 0 && b[1] == 321);
    /* as many shards as cut points + 1, and no more */
    assert_int_equal(psstore_shard_bounds("3-1", 4, 2, b, err, sizeof(err)), FR_OK);
    assert_true(b[1] == 3);
    assert_int_equal(psstore_shard_bounds("3-1", 4, 3, b, err, sizeof(err)), FR_ERR_INVAL);
    assert_non_null(strstr(err, "fewer than the 2"));
    assert_int_equal(psstore_shard_bounds("3-64-1", 320, 2, b, err, sizeof(err)), FR_ERR_INVAL);
    assert_non_null(strstr(err, "do not hold 320"));
    assert_int_equal(psstore_shard_bounds("3-64-1", 321, 0, b, err, sizeof(err)), FR_ERR_INVAL);
    assert_int_equal(psstore_shard_bounds("3-64-1", 321, 65, b, err, sizeof(err)), FR_ERR_INVAL);
}

static void test_shard_bounds_text_round_trips(void **state)
{
    (void)state;
    const size_t b[] = {0, 81, 159, 256, 321};
    char text[128];
    assert_int_equal(psstore_shard_bounds_format(text, sizeof(text), b, 4), 16);
    assert_string_equal(text, "0,81,159,256,321");
    size_t back[PSSTORE_SHARDS_MAX + 1];
    int S = 0;
    assert_int_equal(psstore_shard_bounds_parse(text, strlen(text), back, &S), FR_OK);
    assert_int_equal(S, 4);
    assert_memory_equal(back, b, sizeof(b));
    const char *bad[] = {"", "0", "1,5", "0,5,5", "0,5,3", "0,,5", "0,5,", "0,x", "0;5"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(psstore_shard_bounds_parse(bad[i], strlen(bad[i]), back, &S),
                         FR_ERR_PARSE);
}

static void test_shard_lists_parse_ranges_and_refuse_others(void **state)
{
    (void)state;
    uint64_t mask = 0;
    char err[256];
    assert_int_equal(psstore_shard_list_parse("0-3", 4, &mask, err, sizeof(err)), FR_OK);
    assert_true(mask == 0xf);
    assert_int_equal(psstore_shard_list_parse("2-3", 4, &mask, err, sizeof(err)), FR_OK);
    assert_true(mask == 0xc);
    assert_int_equal(psstore_shard_list_parse("0,2", 4, &mask, err, sizeof(err)), FR_OK);
    assert_true(mask == 0x5);
    assert_int_equal(psstore_shard_list_parse("1", 2, &mask, err, sizeof(err)), FR_OK);
    assert_true(mask == 0x2);
    assert_int_equal(psstore_shard_list_parse("63", 0, &mask, err, sizeof(err)), FR_OK);
    assert_true(mask == 1ull << 63);
    assert_int_equal(psstore_shard_list_parse("0-4", 4, &mask, err, sizeof(err)), FR_ERR_INVAL);
    assert_non_null(strstr(err, "not within 0-3"));
    const char *bad[] = {"", "a", "1-", "-1", "3-1", "0,", "0,,1", "1 2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(psstore_shard_list_parse(bad[i], 4, &mask, err, sizeof(err)),
                         FR_ERR_INVAL);
        assert_true(mask == 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offsets_generation_round_trips),
        cmocka_unit_test(test_offsets_start_empty_at_the_watermark),
        cmocka_unit_test(test_offsets_mark_in_order_advances_the_watermark),
        cmocka_unit_test(test_offsets_mark_out_of_order_keeps_sorted_spans),
        cmocka_unit_test(test_offsets_adjacent_marks_merge),
        cmocka_unit_test(test_offsets_watermark_advances_over_several_spans),
        cmocka_unit_test(test_offsets_mark_refuses_empty_and_overlapping_intervals),
        cmocka_unit_test(test_offsets_many_spans_grow_and_collapse),
        cmocka_unit_test(test_offsets_overlaps_at_every_boundary),
        cmocka_unit_test(test_offsets_rewind_below_clears_every_span),
        cmocka_unit_test(test_offsets_rewind_forward_keeps_positions_below_and_clears_above),
        cmocka_unit_test(test_offsets_format_and_parse_round_trip),
        cmocka_unit_test(test_offsets_parse_rejects_malformed_text),
        cmocka_unit_test(test_offsets_random_marks_match_a_bitmap_model),
        cmocka_unit_test(test_text_key_round_trips_and_rejects_bad_keys),
        cmocka_unit_test(test_text_spans_round_trip_and_reject_bad_lists),
        cmocka_unit_test(test_text_ranges_round_trip_and_name_each_fault),
        cmocka_unit_test(test_text_ranges_dup_copies_the_topics),
        cmocka_unit_test(test_text_targets_round_trip_and_reject_bad_items),
        cmocka_unit_test(test_shard_bounds_cut_at_rows_balanced_by_bytes),
        cmocka_unit_test(test_shard_bounds_text_round_trips),
        cmocka_unit_test(test_shard_lists_parse_ranges_and_refuse_others),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
