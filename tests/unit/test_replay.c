/*
 * test_replay.c - unit tests of replay requests (psstore/positions/replayspec.c,
 * docs/design.md "Replay"): every verb and its errors, ISO 8601 dates with
 * zones and fractions against millisecond values computed independently
 * (Python's datetime), durations, the stored text and its round trip,
 * which partitions a request moves, the plan descriptions, and a parser
 * fed with garbage in buffers of exactly its length (so that ASan sees any
 * read past them).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/common.h"
#include "psstore/positions/positions.h"

#define NOW_MS 1795982400000LL /* 2026-11-29T20:00:00Z */

/* A request lives on the heap: it is ~16 KiB. */
static psstore_replay_t *new_replay(void)
{
    psstore_replay_t *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    return r;
}

/* Builds r from verb and arg, failing the test with the error on refusal. */
static void verb_ok(psstore_replay_t *r, const char *verb, const char *arg)
{
    char err[256] = "";
    fr_err_t rc = psstore_replay_from_verb(r, verb, arg, NOW_MS, err, sizeof(err));
    if (rc != FR_OK)
        fail_msg("%s '%s' refused: %s", verb, arg != NULL ? arg : "(null)", err);
}

/* Checks that verb arg is refused with FR_ERR_INVAL and an error holding
 * every one of the NULL-terminated needles. */
static void verb_bad(const char *verb, const char *arg, ...)
{
    psstore_replay_t *r = new_replay();
    char err[256] = "";
    fr_err_t rc = psstore_replay_from_verb(r, verb, arg, NOW_MS, err, sizeof(err));
    if (rc != FR_ERR_INVAL)
        fail_msg("%s '%s' gave %d, expected FR_ERR_INVAL", verb, arg != NULL ? arg : "(null)",
                 (int)rc);
    va_list ap;
    va_start(ap, arg);
    for (const char *needle; (needle = va_arg(ap, const char *)) != NULL;) {
        if (strstr(err, needle) == NULL)
            fail_msg("%s '%s': error '%s' lacks '%s'", verb, arg != NULL ? arg : "(null)", err,
                     needle);
    }
    va_end(ap);
    free(r);
}

/* The at_ms of to-datetime arg (which must be accepted). */
static int64_t datetime_ms(const char *arg)
{
    psstore_replay_t *r = new_replay();
    verb_ok(r, "to-datetime", arg);
    assert_int_equal(r->kind, PSSTORE_REPLAY_DATETIME);
    int64_t at = r->at_ms;
    free(r);
    return at;
}

/* The stored text of r (which must format). */
static void format_ok(const psstore_replay_t *r, char *buf, size_t size)
{
    fr_err_t rc = psstore_replay_format(r, buf, size);
    if (rc != FR_OK)
        fail_msg("format failed: %d", (int)rc);
}

/* Parses text from a heap copy of exactly its length (no NUL after it). */
static fr_err_t parse_exact(psstore_replay_t *r, const char *text, size_t len, char *err,
                            size_t size)
{
    char *copy = malloc(len > 0 ? len : 1);
    assert_non_null(copy);
    memcpy(copy, text, len);
    fr_err_t rc = psstore_replay_parse(r, copy, len, err, size);
    free(copy);
    return rc;
}

/* Checks that the stored text is refused with FR_ERR_INVAL. */
static void parse_bad(const char *text)
{
    psstore_replay_t *r = new_replay();
    char err[256] = "";
    if (parse_exact(r, text, strlen(text), err, sizeof(err)) != FR_ERR_INVAL)
        fail_msg("'%s' was accepted", text);
    assert_non_null(strstr(err, "is not a stored request"));
    free(r);
}

/* ------------------------------------------------------------------------
 * The verbs.
 * ---------------------------------------------------------------------- */

static void test_replay_earliest_and_latest_take_no_argument(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    verb_ok(r, "to-earliest", NULL);
    assert_int_equal(r->kind, PSSTORE_REPLAY_EARLIEST);
    assert_string_equal(r->topic, "");
    verb_ok(r, "to-latest", NULL);
    assert_int_equal(r->kind, PSSTORE_REPLAY_LATEST);
    verb_ok(r, "to-latest", ""); /* an empty argument is no argument */
    verb_bad("to-earliest", "5", "to-earliest", "takes no argument", NULL);
    verb_bad("to-latest", "x", "to-latest", "takes no argument", NULL);
    free(r);
}

static void test_replay_unknown_verbs_and_missing_arguments_are_named(void **state)
{
    (void)state;
    verb_bad("to-beginning", NULL, "unknown verb 'to-beginning'", NULL);
    verb_bad("--to-earliest", NULL, "unknown verb", NULL);
    verb_bad("", NULL, "unknown verb ''", NULL);
    verb_bad("to-offset", NULL, "to-offset: needs an argument", NULL);
    verb_bad("to-datetime", "", "to-datetime: needs an argument", NULL);
    verb_bad("by-duration", NULL, "by-duration: needs an argument", NULL);
    verb_bad("shift-by", NULL, "shift-by: needs an argument", NULL);
    psstore_replay_t *r = new_replay();
    char err[64];
    assert_int_equal(psstore_replay_from_verb(r, NULL, NULL, NOW_MS, err, sizeof(err)),
                     FR_ERR_INVAL);
    assert_int_equal(psstore_replay_from_verb(NULL, "to-latest", NULL, NOW_MS, NULL, 0),
                     FR_ERR_INVAL);
    free(r);
}

static void test_replay_to_offset_keeps_partitions_in_the_order_given(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    verb_ok(r, "to-offset", "3:17,0:0,12:9223372036854775807");
    assert_int_equal(r->kind, PSSTORE_REPLAY_OFFSET);
    assert_int_equal(r->nparts, 3);
    assert_int_equal(r->parts[0].partition, 3);
    assert_int_equal(r->parts[0].offset, 17);
    assert_int_equal(r->parts[1].partition, 0);
    assert_int_equal(r->parts[1].offset, 0);
    assert_int_equal(r->parts[2].partition, 12);
    assert_true(r->parts[2].offset == INT64_MAX);
    verb_ok(r, "to-offset", "2147483647:1");
    assert_int_equal(r->nparts, 1);
    assert_int_equal(r->parts[0].partition, INT32_MAX);
    free(r);
}

static void test_replay_to_offset_rejects_bad_entries_with_their_text(void **state)
{
    (void)state;
    verb_bad("to-offset", "3:x", "to-offset: '3:x' is not P:O", NULL);
    verb_bad("to-offset", "3", "'3' is not P:O", NULL);
    verb_bad("to-offset", "0:1,", "'' is not P:O", NULL);
    verb_bad("to-offset", ",0:1", "'' is not P:O", NULL);
    verb_bad("to-offset", "0:1,,2:3", "'' is not P:O", NULL);
    verb_bad("to-offset", ":5", "':5' is not P:O", NULL);
    verb_bad("to-offset", "5:", "'5:' is not P:O", NULL);
    verb_bad("to-offset", " 1:5", "is not P:O", NULL);
    verb_bad("to-offset", "1:5 ", "is not P:O", NULL);
    verb_bad("to-offset", "1:2:3", "'1:2:3' is not P:O", NULL);
    verb_bad("to-offset", "1=2", "'1=2' is not P:O", NULL);
    verb_bad("to-offset", "-1:5", "'-1:5'", "partitions are 0 to 2147483647", NULL);
    verb_bad("to-offset", "2147483648:5", "partitions are 0 to", NULL);
    verb_bad("to-offset", "1:-5", "'1:-5'", "offsets are 0 to", NULL);
    verb_bad("to-offset", "1:9223372036854775808", "offsets are 0 to", NULL);
    verb_bad("to-offset", "1:5,2:6,1:7", "to-offset: partition 1 is listed twice", NULL);
    verb_bad("to-offset", "1:\x01\xff",
             "'1:?"
             "?' is not P:O",
             NULL);
}

static void test_replay_to_offset_takes_at_most_max_parts(void **state)
{
    (void)state;
    size_t cap = (PSSTORE_REPLAY_MAX_PARTS + 1) * 16;
    char *list = malloc(cap);
    assert_non_null(list);
    size_t len = 0;
    for (int i = 0; i < PSSTORE_REPLAY_MAX_PARTS; i++)
        len += (size_t)snprintf(list + len, cap - len, "%s%d:%d", i ? "," : "", i, 2 * i);
    psstore_replay_t *r = new_replay();
    verb_ok(r, "to-offset", list);
    assert_int_equal(r->nparts, PSSTORE_REPLAY_MAX_PARTS);
    assert_int_equal(r->parts[1023].partition, 1023);
    assert_int_equal(r->parts[1023].offset, 2046);
    snprintf(list + len, cap - len, ",5000:1");
    verb_bad("to-offset", list, "to-offset: more than 1024 partitions", NULL);
    free(list);
    free(r);
}

static void test_replay_to_datetime_converts_zones_and_fractions_exactly(void **state)
{
    (void)state;
    /* the process time zone must not matter */
    setenv("TZ", "America/St_Johns", 1);
    tzset();
    assert_true(datetime_ms("2026-11-29T20:00:00Z") == 1795982400000LL);
    assert_true(datetime_ms("2026-11-29T20:00:00") == 1795982400000LL);
    assert_true(datetime_ms("2026-11-29T21:30:00+01:30") == 1795982400000LL);
    assert_true(datetime_ms("2026-11-29T15:00:00-05:00") == 1795982400000LL);
    assert_true(datetime_ms("2026-11-29T20:00:00+00:00") == 1795982400000LL);
    assert_true(datetime_ms("2026-11-29T20:00:00-00:00") == 1795982400000LL);
    assert_true(datetime_ms("2026-11-29T20:00:00.5Z") == 1795982400500LL);
    assert_true(datetime_ms("2026-11-29T20:00:00.05Z") == 1795982400050LL);
    assert_true(datetime_ms("2026-11-29T20:00:00.123Z") == 1795982400123LL);
    /* beyond the millisecond: dropped, as Kafka's timestamps are */
    assert_true(datetime_ms("2026-11-29T20:00:00.123456") == 1795982400123LL);
    assert_true(datetime_ms("2026-11-29T20:00:00.999999999Z") == 1795982400999LL);
    assert_true(datetime_ms("1970-01-01T00:00:00Z") == 0);
    assert_true(datetime_ms("1969-12-31T23:59:59.999Z") == -1);
    assert_true(datetime_ms("2000-02-29T12:00:00Z") == 951825600000LL);
    assert_true(datetime_ms("2024-02-29T23:59:59.999+00:00") == 1709251199999LL);
    assert_true(datetime_ms("1900-03-01T00:00:00Z") == -2203891200000LL);
    assert_true(datetime_ms("2100-02-28T00:00:00Z") == 4107456000000LL);
    assert_true(datetime_ms("2026-01-01T00:30:00+23:59") == 1767141060000LL);
    assert_true(datetime_ms("0000-01-01T00:00:00Z") == -62167219200000LL);
    assert_true(datetime_ms("9999-12-31T23:59:59.999Z") == 253402300799999LL);
    unsetenv("TZ");
    tzset();
}

static void test_replay_to_datetime_rejects_what_is_not_a_date(void **state)
{
    (void)state;
    const char *shape[] = {
        "2026-11-29",
        "2026-11-29 20:00:00Z",
        "2026-11-29t20:00:00Z",
        "2026-11-29T20:00:00z",
        "2026-11-29T20:00Z",
        "26-11-29T20:00:00Z",
        "2026-1-29T20:00:00Z",
        "2026-11-29T20:00:00.Z",
        "2026-11-29T20:00:00.1234567890Z",
        "2026-11-29T20:00:00+0100",
        "2026-11-29T20:00:00+01",
        "2026-11-29T20:00:00+01:00Z",
        "2026-11-29T20:00:00ZZ",
        "+2026-11-29T20:00:00Z",
        "2026-11-29T20:00:00 ",
        "2026-11-29T20:00:0a",
        "2026-11-29T20:00:00,5Z",
    };
    for (size_t i = 0; i < sizeof(shape) / sizeof(shape[0]); i++)
        verb_bad("to-datetime", shape[i], "to-datetime: '", "is not YYYY-MM-DDTHH:MM:SS", NULL);
    verb_bad("to-datetime", "2026-02-29T00:00:00Z", "'2026-02-29T00:00:00Z' has no such date",
             NULL);
    verb_bad("to-datetime", "1900-02-29T00:00:00Z", "has no such date", NULL);
    verb_bad("to-datetime", "2026-13-01T00:00:00Z", "has no such date", NULL);
    verb_bad("to-datetime", "2026-00-01T00:00:00Z", "has no such date", NULL);
    verb_bad("to-datetime", "2026-04-31T00:00:00Z", "has no such date", NULL);
    verb_bad("to-datetime", "2026-11-00T00:00:00Z", "has no such date", NULL);
    verb_bad("to-datetime", "2026-11-29T24:00:00Z", "has no such time", NULL);
    verb_bad("to-datetime", "2026-11-29T23:60:00Z", "has no such time", NULL);
    verb_bad("to-datetime", "2026-11-29T23:59:60Z", "has no such time", NULL);
    verb_bad("to-datetime", "2026-11-29T20:00:00+24:00", "zone offset out of range", NULL);
    verb_bad("to-datetime", "2026-11-29T20:00:00-01:60", "zone offset out of range", NULL);
    verb_bad("to-datetime", "0000-01-01T00:00:00+00:01", "outside the years 0000 to 9999", NULL);
    verb_bad("to-datetime", "9999-12-31T23:59:59-00:01", "outside the years 0000 to 9999", NULL);
}

static void test_replay_by_duration_counts_back_from_now(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    static const struct {
        const char *arg;
        int64_t ms;
    } cases[] = {
        {"P1DT2H3M4.5S", 93784500},
        {"PT0S", 0},
        {"P0D", 0},
        {"P7D", 7 * 86400000LL},
        {"PT36H", 36 * 3600000LL},
        {"PT90M", 90 * 60000LL},
        {"PT1.5S", 1500},
        {"PT0.001S", 1},
        {"PT0.0009S", 0},
        {"PT1H30S", 3600000 + 30000},
        {"P1DT1M", 86400000 + 60000},
        {"P2DT3H", 2 * 86400000LL + 3 * 3600000LL},
        {"PT007M", 7 * 60000},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        verb_ok(r, "by-duration", cases[i].arg);
        assert_int_equal(r->kind, PSSTORE_REPLAY_DATETIME);
        if (r->at_ms != NOW_MS - cases[i].ms)
            fail_msg("%s: at %lld, expected %lld", cases[i].arg, (long long)r->at_ms,
                     (long long)(NOW_MS - cases[i].ms));
    }
    free(r);
}

static void test_replay_by_duration_rejects_malformed_durations(void **state)
{
    (void)state;
    const char *bad[] = {"P",      "PT",     "1D",    "p1d",    "P1d",   "PT1h",  "P1DT",
                         "PT1S2M", "PT1H1H", "P1.5D", "PT1.5M", "PT.5S", "PT1.S", "PT1.0000000001S",
                         "P-1D",   "-P1D",   "PT-5M", "P1W",    "PT5S ", " PT5S", "P1Y",
                         "PT5",    "P1D2H"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        verb_bad("by-duration", bad[i], "by-duration: '", "is not PnDTnHnMnS", NULL);
    verb_bad("by-duration", "P99999999999999999999D", "is too long", NULL);
    verb_bad("by-duration", "P106751991167300D", "is too long", NULL);
    /* fits in int64 but reaches before the year 0000 */
    verb_bad("by-duration", "P800000D", "outside the years 0000 to 9999", NULL);
}

static void test_replay_shift_by_takes_a_signed_integer(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    verb_ok(r, "shift-by", "-100");
    assert_int_equal(r->kind, PSSTORE_REPLAY_SHIFT);
    assert_true(r->shift == -100);
    verb_ok(r, "shift-by", "+5");
    assert_true(r->shift == 5);
    verb_ok(r, "shift-by", "0");
    assert_true(r->shift == 0);
    verb_ok(r, "shift-by", "-9223372036854775808");
    assert_true(r->shift == INT64_MIN);
    verb_ok(r, "shift-by", "9223372036854775807");
    assert_true(r->shift == INT64_MAX);
    verb_bad("shift-by", "9223372036854775808", "shift-by: '9223372036854775808' is out of range",
             NULL);
    verb_bad("shift-by", "-9223372036854775809", "is out of range", NULL);
    verb_bad("shift-by", "ten", "shift-by: 'ten' is not an integer", NULL);
    verb_bad("shift-by", "-", "is not an integer", NULL);
    verb_bad("shift-by", "5 ", "is not an integer", NULL);
    verb_bad("shift-by", "1e3", "is not an integer", NULL);
    free(r);
}

/* ------------------------------------------------------------------------
 * The stored text.
 * ---------------------------------------------------------------------- */

static void test_replay_format_writes_the_stored_text(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    char buf[256];
    verb_ok(r, "to-earliest", NULL);
    format_ok(r, buf, sizeof(buf));
    assert_string_equal(buf, "earliest");
    verb_ok(r, "to-latest", NULL);
    strcpy(r->topic, "rt");
    format_ok(r, buf, sizeof(buf));
    assert_string_equal(buf, "latest topic=rt");
    verb_ok(r, "to-offset", "3:17,0:0");
    format_ok(r, buf, sizeof(buf));
    assert_string_equal(buf, "offset:3=17,0=0");
    verb_ok(r, "to-datetime", "2026-11-29T20:00:00.250Z");
    strcpy(r->topic, "a.b_c-D9");
    format_ok(r, buf, sizeof(buf));
    assert_string_equal(buf, "datetime:1795982400250 topic=a.b_c-D9");
    verb_ok(r, "to-datetime", "1969-12-31T23:59:59.999Z");
    format_ok(r, buf, sizeof(buf));
    assert_string_equal(buf, "datetime:-1");
    verb_ok(r, "shift-by", "-20");
    format_ok(r, buf, sizeof(buf));
    assert_string_equal(buf, "shift:-20");
    verb_ok(r, "shift-by", "+5");
    format_ok(r, buf, sizeof(buf));
    assert_string_equal(buf, "shift:5");
    free(r);
}

/* The longest stored text: 1024 partitions near INT32_MAX at INT64_MAX and
 * a 249-character topic, 32006 bytes; the store keeps up to 32767
 * (positions.h PSSTORE_REPLAY_SPEC_MAX, 32768 with the NUL). */
static void test_replay_longest_stored_text_is_32006_bytes(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    char *buf = malloc(40000);
    assert_non_null(buf);
    r->kind = PSSTORE_REPLAY_OFFSET;
    r->nparts = PSSTORE_REPLAY_MAX_PARTS;
    for (size_t i = 0; i < r->nparts; i++) {
        r->parts[i].partition = INT32_MAX - (int32_t)i;
        r->parts[i].offset = INT64_MAX;
    }
    memset(r->topic, 'z', PSSTORE_TOPIC_MAX);
    format_ok(r, buf, 40000);
    assert_int_equal(strlen(buf), 32006);
    assert_int_equal(psstore_replay_format(r, buf, 32007), FR_OK);
    assert_int_equal(psstore_replay_format(r, buf, 32006), FR_ERR_RANGE);
    free(buf);
    free(r);
}

static void test_replay_format_refuses_small_buffers_and_invalid_requests(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    char buf[32];
    verb_ok(r, "to-latest", NULL);
    strcpy(r->topic, "rt");
    /* "latest topic=rt" is 15 bytes: 16 fit, 15 do not */
    assert_int_equal(psstore_replay_format(r, buf, 16), FR_OK);
    assert_string_equal(buf, "latest topic=rt");
    assert_int_equal(psstore_replay_format(r, buf, 15), FR_ERR_RANGE);
    assert_string_equal(buf, "");
    assert_int_equal(psstore_replay_format(r, NULL, 0), FR_ERR_RANGE);
    assert_int_equal(psstore_replay_format(r, buf, 1), FR_ERR_RANGE);

    /* requests the parser would refuse are not written */
    strcpy(r->topic, "bad topic");
    assert_int_equal(psstore_replay_format(r, buf, sizeof(buf)), FR_ERR_INVAL);
    memset(r->topic, 'a', sizeof(r->topic)); /* no NUL */
    assert_int_equal(psstore_replay_format(r, buf, sizeof(buf)), FR_ERR_INVAL);
    r->topic[0] = '\0';
    r->kind = (psstore_replay_kind_t)7;
    assert_int_equal(psstore_replay_format(r, buf, sizeof(buf)), FR_ERR_INVAL);
    r->kind = PSSTORE_REPLAY_OFFSET;
    r->nparts = 0;
    assert_int_equal(psstore_replay_format(r, buf, sizeof(buf)), FR_ERR_INVAL);
    r->nparts = PSSTORE_REPLAY_MAX_PARTS + 1;
    assert_int_equal(psstore_replay_format(r, buf, sizeof(buf)), FR_ERR_INVAL);
    verb_ok(r, "to-offset", "1:2,3:4");
    r->parts[1].partition = 1;
    assert_int_equal(psstore_replay_format(r, buf, sizeof(buf)), FR_ERR_INVAL);
    r->parts[1].partition = -3;
    assert_int_equal(psstore_replay_format(r, buf, sizeof(buf)), FR_ERR_INVAL);
    r->parts[1].partition = 3;
    r->parts[1].offset = -1;
    assert_int_equal(psstore_replay_format(r, buf, sizeof(buf)), FR_ERR_INVAL);
    r->kind = PSSTORE_REPLAY_DATETIME;
    r->at_ms = 253402300800000LL; /* 10000-01-01 */
    assert_int_equal(psstore_replay_format(r, buf, sizeof(buf)), FR_ERR_INVAL);
    assert_int_equal(psstore_replay_format(NULL, buf, sizeof(buf)), FR_ERR_INVAL);
    free(r);
}

/* Checks format(parse(text)) == text and that r re-formats to it. */
static void round_trip(const char *text)
{
    psstore_replay_t *r = new_replay();
    char err[256] = "", buf[64 * 1024];
    if (parse_exact(r, text, strlen(text), err, sizeof(err)) != FR_OK)
        fail_msg("'%.80s' refused: %s", text, err);
    format_ok(r, buf, sizeof(buf));
    assert_string_equal(buf, text);
    free(r);
}

static void test_replay_format_and_parse_round_trip(void **state)
{
    (void)state;
    round_trip("earliest");
    round_trip("latest");
    round_trip("earliest topic=rt");
    round_trip("offset:0=0");
    round_trip("offset:5=9223372036854775807,0=17,2147483647=3 topic=x");
    round_trip("datetime:1795982400000");
    round_trip("datetime:0");
    round_trip("datetime:-62167219200000");
    round_trip("datetime:253402300799999 topic=..a");
    round_trip("shift:-9223372036854775808");
    round_trip("shift:9223372036854775807");
    round_trip("shift:0 topic=t");

    /* random requests: r -> text -> r' -> text', text == text', r' == r */
    psstore_replay_t *r = new_replay(), *back = new_replay();
    char *buf = malloc(64 * 1024), *again = malloc(64 * 1024), err[256];
    assert_non_null(buf);
    assert_non_null(again);
    fr_rng_t rng;
    fr_rng_seed(&rng, 20261129);
    for (int iter = 0; iter < 2000; iter++) {
        memset(r, 0, sizeof(*r));
        r->kind = (psstore_replay_kind_t)fr_rng_below(&rng, 5);
        r->at_ms = -62167219200000LL + (int64_t)fr_rng_below(&rng, 315569520000000ULL);
        r->shift = (int64_t)fr_rng_next(&rng);
        r->nparts = 1 + fr_rng_below(&rng, iter % 100 == 0 ? PSSTORE_REPLAY_MAX_PARTS : 8);
        for (size_t i = 0; i < r->nparts; i++) {
            r->parts[i].partition = (int32_t)(i * 7 + fr_rng_below(&rng, 7)); /* distinct */
            r->parts[i].offset = (int64_t)(fr_rng_next(&rng) >> (1 + fr_rng_below(&rng, 63)));
        }
        size_t tlen = fr_rng_below(&rng, 3) == 0 ? 0 : 1 + fr_rng_below(&rng, PSSTORE_TOPIC_MAX);
        static const char chars[] = "abcXYZ019._-";
        for (size_t i = 0; i < tlen; i++)
            r->topic[i] = chars[fr_rng_below(&rng, sizeof(chars) - 1)];
        if (strcmp(r->topic, ".") == 0 || strcmp(r->topic, "..") == 0)
            r->topic[0] = 'a';
        format_ok(r, buf, 64 * 1024);
        if (parse_exact(back, buf, strlen(buf), err, sizeof(err)) != FR_OK)
            fail_msg("'%.80s' refused: %s", buf, err);
        format_ok(back, again, 64 * 1024);
        assert_string_equal(again, buf);
        assert_int_equal(back->kind, r->kind);
        assert_string_equal(back->topic, r->topic);
        if (r->kind == PSSTORE_REPLAY_DATETIME)
            assert_true(back->at_ms == r->at_ms);
        if (r->kind == PSSTORE_REPLAY_SHIFT)
            assert_true(back->shift == r->shift);
        if (r->kind == PSSTORE_REPLAY_OFFSET) {
            assert_int_equal(back->nparts, r->nparts);
            assert_memory_equal(back->parts, r->parts, r->nparts * sizeof(r->parts[0]));
        }
    }
    free(buf);
    free(again);
    free(r);
    free(back);
}

static void test_replay_parse_accepts_only_what_format_writes(void **state)
{
    (void)state;
    const char *bad[] = {
        "",
        "Earliest",
        "earliest ",
        " earliest",
        "earliest\n",
        "earliest topic=",
        "earliest topic=a b",
        "earliest topic=.",
        "earliest topic=..",
        "earliest topic=a/b",
        "earliest  topic=a",
        "earliest topics=a",
        "earliest topic=a topic=b",
        "latest:",
        "offset:",
        "offset:1",
        "offset:1=",
        "offset:=1",
        "offset:1:2",
        "offset:1=2,",
        "offset:,1=2",
        "offset:01=2",
        "offset:1=02",
        "offset:+1=2",
        "offset:1=+2",
        "offset:-1=2",
        "offset:1=-2",
        "offset:-0=2",
        "offset:2147483648=1",
        "offset:1=9223372036854775808",
        "offset:1=2,1=3",
        "datetime:",
        "datetime:+5",
        "datetime:05",
        "datetime:-0",
        "datetime:1.5",
        "datetime:253402300800000",
        "datetime:-62167219200001",
        "datetime:99999999999999999999",
        "shift:",
        "shift:+1",
        "shift:-",
        "shift:00",
        "shift:9223372036854775808",
        "shift:1 ",
        "to-earliest",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        parse_bad(bad[i]);

    /* a topic of 249 characters is fine, 250 is not */
    char text[300] = "latest topic=";
    memset(text + 13, 't', 249);
    text[13 + 249] = '\0';
    round_trip(text);
    strcat(text, "t");
    parse_bad(text);

    /* an embedded NUL is just a bad byte */
    psstore_replay_t *r = new_replay();
    char err[256];
    assert_int_equal(parse_exact(r, "latest\0", 7, err, sizeof(err)), FR_ERR_INVAL);
    assert_non_null(strstr(err, "'latest?'"));
    assert_int_equal(parse_exact(r,
                                 "shift:1\0"
                                 "0",
                                 9, err, sizeof(err)),
                     FR_ERR_INVAL);
    assert_int_equal(psstore_replay_parse(r, NULL, 0, err, sizeof(err)), FR_ERR_INVAL);
    assert_int_equal(psstore_replay_parse(r, NULL, 5, NULL, 0), FR_ERR_INVAL);
    assert_int_equal(psstore_replay_parse(NULL, "latest", 6, NULL, 0), FR_ERR_INVAL);
    free(r);
}

static void test_replay_parse_reads_exactly_len_bytes(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    char err[256];
    const char text[] = "shift:-20 topic=rtXXXX";
    assert_int_equal(psstore_replay_parse(r, text, 18, err, sizeof(err)), FR_OK);
    assert_int_equal(r->kind, PSSTORE_REPLAY_SHIFT);
    assert_true(r->shift == -20);
    assert_string_equal(r->topic, "rt");
    assert_int_equal(psstore_replay_parse(r, text, 9, err, sizeof(err)), FR_OK);
    assert_string_equal(r->topic, "");
    assert_int_equal(psstore_replay_parse(r, text, 8, err, sizeof(err)), FR_OK);
    assert_true(r->shift == -2);
    assert_int_equal(psstore_replay_parse(r, text, 7, err, sizeof(err)), FR_ERR_INVAL);
    assert_int_equal(psstore_replay_parse(r, text, 17, err, sizeof(err)), FR_OK);
    assert_string_equal(r->topic, "r");
    free(r);
}

static void test_replay_parse_takes_at_most_max_parts(void **state)
{
    (void)state;
    size_t cap = 7 + (PSSTORE_REPLAY_MAX_PARTS + 1) * 12;
    char *text = malloc(cap);
    assert_non_null(text);
    size_t len = (size_t)snprintf(text, cap, "offset:");
    for (int i = 0; i < PSSTORE_REPLAY_MAX_PARTS; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s%d=%d", i ? "," : "", i, i);
    round_trip(text);
    snprintf(text + len, cap - len, ",99999=1");
    psstore_replay_t *r = new_replay();
    char err[256];
    assert_int_equal(psstore_replay_parse(r, text, strlen(text), err, sizeof(err)), FR_ERR_INVAL);
    assert_non_null(strstr(err, "too many partitions"));
    free(text);
    free(r);
}

/*
 * Feeds the parser random bytes, random strings over its own alphabet and
 * mutations of valid texts, each from a buffer of exactly its length.
 * Whatever it accepts must re-format to the same bytes.
 */
static void test_replay_parse_of_garbage_never_crashes(void **state)
{
    (void)state;
    static const char *seeds[] = {"earliest",
                                  "latest topic=rt",
                                  "offset:3=17,0=0,12=5 topic=a.b",
                                  "datetime:1795982400000",
                                  "shift:-20 topic=x",
                                  "offset:1=2,3=4,5=6,7=8"};
    static const char alphabet[] = "earliestoffsetdatimshf:=,- topic0123456789.";
    psstore_replay_t *r = new_replay();
    char err[256], out[4096], text[128];
    fr_rng_t rng;
    fr_rng_seed(&rng, 7);
    int accepted = 0;
    for (int iter = 0; iter < 200000; iter++) {
        size_t len;
        int mode = (int)fr_rng_below(&rng, 3);
        if (mode == 0) { /* random bytes */
            len = fr_rng_below(&rng, sizeof(text));
            for (size_t i = 0; i < len; i++)
                text[i] = (char)fr_rng_below(&rng, 256);
        } else if (mode == 1) { /* the parser's own alphabet */
            len = fr_rng_below(&rng, 48);
            for (size_t i = 0; i < len; i++)
                text[i] = alphabet[fr_rng_below(&rng, sizeof(alphabet) - 1)];
        } else { /* a valid text, mutated */
            const char *seed = seeds[fr_rng_below(&rng, sizeof(seeds) / sizeof(seeds[0]))];
            len = strlen(seed);
            memcpy(text, seed, len);
            for (int k = (int)fr_rng_below(&rng, 3); k >= 0; k--) {
                size_t at = fr_rng_below(&rng, len + 1);
                int op = (int)fr_rng_below(&rng, 3);
                if (op == 0 && at < len) /* replace */
                    text[at] = alphabet[fr_rng_below(&rng, sizeof(alphabet) - 1)];
                else if (op == 1 && at < len) /* delete */
                    memmove(text + at, text + at + 1, --len - at);
                else if (len + 1 < sizeof(text)) { /* insert */
                    memmove(text + at + 1, text + at, len - at);
                    text[at] = alphabet[fr_rng_below(&rng, sizeof(alphabet) - 1)];
                    len++;
                }
            }
        }
        fr_err_t rc = parse_exact(r, text, len, err, sizeof(err));
        if (rc == FR_OK) {
            accepted++;
            format_ok(r, out, sizeof(out));
            if (strlen(out) != len || memcmp(out, text, len) != 0)
                fail_msg("'%.*s' accepted but formats as '%s'", (int)len, text, out);
        } else {
            assert_int_equal(rc, FR_ERR_INVAL);
            assert_true(strlen(err) < sizeof(err));
        }
    }
    assert_true(accepted > 0);
    free(r);
}

/* ------------------------------------------------------------------------
 * Questions of a request.
 * ---------------------------------------------------------------------- */

static void test_replay_applies_filters_by_topic_and_listed_partition(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    int64_t off = -7;
    verb_ok(r, "to-earliest", NULL);
    assert_true(psstore_replay_applies(r, "rt", 0, &off));
    assert_true(psstore_replay_applies(r, "other", 5, NULL));
    assert_true(off == -7); /* only OFFSET writes it */
    strcpy(r->topic, "rt");
    assert_true(psstore_replay_applies(r, "rt", 3, NULL));
    assert_false(psstore_replay_applies(r, "rt2", 3, NULL));
    assert_false(psstore_replay_applies(r, "r", 3, NULL));
    assert_false(psstore_replay_applies(r, NULL, 3, NULL));
    assert_false(psstore_replay_applies(r, "rt", -1, NULL));

    verb_ok(r, "to-offset", "3:17,0:0");
    assert_true(psstore_replay_applies(r, "any", 3, &off));
    assert_true(off == 17);
    assert_true(psstore_replay_applies(r, "any", 0, &off));
    assert_true(off == 0);
    assert_true(psstore_replay_applies(r, "any", 0, NULL));
    off = -7;
    assert_false(psstore_replay_applies(r, "any", 1, &off));
    assert_true(off == -7);
    strcpy(r->topic, "rt");
    assert_false(psstore_replay_applies(r, "other", 3, &off));
    assert_true(psstore_replay_applies(r, "rt", 3, &off));
    assert_false(psstore_replay_applies(NULL, "rt", 3, &off));
    free(r);
}

static void test_replay_describe_reads_as_a_plan(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    char buf[128];
    verb_ok(r, "to-earliest", NULL);
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "earliest");
    verb_ok(r, "to-latest", NULL);
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "latest");
    verb_ok(r, "to-offset", "0:42,1:7");
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "offset 42");
    psstore_replay_describe(r, 2, buf, sizeof(buf));
    assert_string_equal(buf, "unchanged (partition 2 not listed)");
    verb_ok(r, "to-datetime", "2026-11-29T21:00:00+01:00");
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "first record at or after 2026-11-29T20:00:00.000Z");
    verb_ok(r, "to-datetime", "1969-12-31T23:59:59.999Z");
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "first record at or after 1969-12-31T23:59:59.999Z");
    verb_ok(r, "to-datetime", "0000-03-01T00:00:00.007Z");
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "first record at or after 0000-03-01T00:00:00.007Z");
    verb_ok(r, "by-duration", "PT1H");
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "first record at or after 2026-11-29T19:00:00.000Z");
    verb_ok(r, "shift-by", "-100");
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "watermark - 100");
    verb_ok(r, "shift-by", "5");
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "watermark + 5");
    verb_ok(r, "shift-by", "-9223372036854775808");
    psstore_replay_describe(r, 0, buf, sizeof(buf));
    assert_string_equal(buf, "watermark - 9223372036854775808");
    /* cut to the buffer, never past it */
    verb_ok(r, "to-earliest", NULL);
    psstore_replay_describe(r, 0, buf, 4);
    assert_string_equal(buf, "ear");
    psstore_replay_describe(r, 0, NULL, 0);
    free(r);
}

/* Every date of years 1600..2400 at noon against a day counter, and the
 * description of each reads back as the same date. */
static void test_replay_calendar_matches_a_day_counter(void **state)
{
    (void)state;
    psstore_replay_t *r = new_replay();
    /* 1600-01-01 is 135140 days before 1970-01-01 */
    int64_t day = -135140;
    char arg[64], want[96], buf[128];
    for (int y = 1600; y <= 2400; y++) {
        int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        int mdays[12] = {31, 28 + leap, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        for (int m = 1; m <= 12; m++) {
            for (int d = 1; d <= mdays[m - 1]; d++, day++) {
                snprintf(arg, sizeof(arg), "%04d-%02d-%02dT12:00:00Z", y, m, d);
                verb_ok(r, "to-datetime", arg);
                if (r->at_ms != day * 86400000LL + 43200000LL)
                    fail_msg("%s: %lld, expected day %lld", arg, (long long)r->at_ms,
                             (long long)day);
                psstore_replay_describe(r, 0, buf, sizeof(buf));
                snprintf(want, sizeof(want),
                         "first record at or after %04d-%02d-%02dT12:00:00.000Z", y, m, d);
                assert_string_equal(buf, want);
            }
        }
    }
    assert_true(day == 157420); /* 2401-01-01 */
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_earliest_and_latest_take_no_argument),
        cmocka_unit_test(test_replay_unknown_verbs_and_missing_arguments_are_named),
        cmocka_unit_test(test_replay_to_offset_keeps_partitions_in_the_order_given),
        cmocka_unit_test(test_replay_to_offset_rejects_bad_entries_with_their_text),
        cmocka_unit_test(test_replay_to_offset_takes_at_most_max_parts),
        cmocka_unit_test(test_replay_to_datetime_converts_zones_and_fractions_exactly),
        cmocka_unit_test(test_replay_to_datetime_rejects_what_is_not_a_date),
        cmocka_unit_test(test_replay_by_duration_counts_back_from_now),
        cmocka_unit_test(test_replay_by_duration_rejects_malformed_durations),
        cmocka_unit_test(test_replay_shift_by_takes_a_signed_integer),
        cmocka_unit_test(test_replay_format_writes_the_stored_text),
        cmocka_unit_test(test_replay_longest_stored_text_is_32006_bytes),
        cmocka_unit_test(test_replay_format_refuses_small_buffers_and_invalid_requests),
        cmocka_unit_test(test_replay_format_and_parse_round_trip),
        cmocka_unit_test(test_replay_parse_accepts_only_what_format_writes),
        cmocka_unit_test(test_replay_parse_reads_exactly_len_bytes),
        cmocka_unit_test(test_replay_parse_takes_at_most_max_parts),
        cmocka_unit_test(test_replay_parse_of_garbage_never_crashes),
        cmocka_unit_test(test_replay_applies_filters_by_topic_and_listed_partition),
        cmocka_unit_test(test_replay_describe_reads_as_a_plan),
        cmocka_unit_test(test_replay_calendar_matches_a_day_counter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
