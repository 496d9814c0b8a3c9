/*
 * test_codec.c - unit tests of the ingest record codecs (ingest/codec.c):
 * format and reject names, decoding csv, libsvm and f32 records, labels,
 * and encoding read back by decoding.
 *
 * Every record is decoded from a heap buffer of exactly its length (no NUL
 * after it) into heap arrays of exactly D floats, so AddressSanitizer
 * catches any read past the record or write past x.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ingest/ingest.h"
#include "ingest_fixtures.h"

/* ------------------------------------------------------------------------
 * Helpers.
 * ---------------------------------------------------------------------- */

/*
 * Decodes len bytes of rec from a malloc'ed copy of exactly len bytes into
 * malloc'ed x[D] and y, then copies the results out (x_out may be NULL).
 */
static ingest_reject_t decode_bytes(const ingest_schema_t *s, ingest_format_t f, const void *rec,
                                    size_t len, float *x_out, float *y_out)
{
    size_t d = s->features > 0 ? (size_t)s->features : 1;
    char *copy = malloc(len > 0 ? len : 1);
    float *x = malloc(d * sizeof(float));
    float *y = malloc(sizeof(float));
    assert_non_null(copy);
    assert_non_null(x);
    assert_non_null(y);
    memcpy(copy, rec, len);
    ingest_reject_t r = ingest_decode(s, f, copy, len, x, y);
    if (x_out != NULL)
        memcpy(x_out, x, d * sizeof(float));
    if (y_out != NULL)
        *y_out = *y;
    free(copy);
    free(x);
    free(y);
    return r;
}

static ingest_reject_t decode_str(const ingest_schema_t *s, ingest_format_t f, const char *text,
                                  float *x, float *y)
{
    return decode_bytes(s, f, text, strlen(text), x, y);
}

static float ref_strtof(const char *s)
{
    return strtof(s, NULL);
}

/* ------------------------------------------------------------------------
 * Names.
 * ---------------------------------------------------------------------- */

static void test_format_parse_accepts_the_four_names_only(void **state)
{
    ingest_format_t f;
    const char *names[] = {"csv", "libsvm", "f32", "idx"};

    for (int i = 0; i < 4; i++) {
        assert_int_equal(ingest_format_parse(names[i], &f), FR_OK);
        assert_int_equal(f, (ingest_format_t)i);
        assert_string_equal(ingest_format_name(f), names[i]);
    }
    assert_int_equal(ingest_format_parse("CSV", &f), FR_ERR_INVAL);
    assert_int_equal(ingest_format_parse("", &f), FR_ERR_INVAL);
    assert_int_equal(ingest_format_parse("json", &f), FR_ERR_INVAL);
    assert_int_equal(ingest_format_parse(NULL, &f), FR_ERR_INVAL);
    assert_string_equal(ingest_format_name((ingest_format_t)42), "unknown");
}

static void test_reject_names_are_stable_metric_labels(void **state)
{
    assert_string_equal(ingest_reject_name(INGEST_OK), "ok");
    assert_string_equal(ingest_reject_name(INGEST_REJECT_BAD_NUMBER), "bad_number");
    assert_string_equal(ingest_reject_name(INGEST_REJECT_FEATURE_COUNT), "feature_count");
    assert_string_equal(ingest_reject_name(INGEST_REJECT_INDEX_RANGE), "index_range");
    assert_string_equal(ingest_reject_name(INGEST_REJECT_LABEL_RANGE), "label_range");
    assert_string_equal(ingest_reject_name(INGEST_REJECT_NONFINITE), "nonfinite");
    assert_string_equal(ingest_reject_name(INGEST_REJECT_OVERSIZE), "oversize");
    assert_string_equal(ingest_reject_name(INGEST_REJECT_MAGNITUDE), "magnitude");
    assert_string_equal(ingest_reject_name(INGEST_REJECT_COUNT), "unknown");
}

/* ------------------------------------------------------------------------
 * csv records.
 * ---------------------------------------------------------------------- */

static void test_decode_csv_reads_exact_values(void **state)
{
    ingest_schema_t s = schema_of(6, INGEST_LABEL_CLASS, 10);
    float x[6], y;

    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "3,0.1,-2.5,1e-3,255,-0,0x1p-2", x, &y),
                     INGEST_OK);
    assert_true(same_float(y, 3.0f));
    assert_true(same_float(x[0], 0.1f));
    assert_true(same_float(x[1], -2.5f));
    assert_true(same_float(x[2], 1e-3f));
    assert_true(same_float(x[3], 255.0f));
    assert_true(same_float(x[4], -0.0f));
    assert_true(same_float(x[5], 0.25f));
}

static void test_decode_csv_allows_blanks_around_fields_and_crlf(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    float x[2], y;
    const char *ok[] = {" 1 ,\t2.5\t, 3 ", "1,2.5,3\n", "1,2.5,3\r\n", "1,2.5,3\r",
                        "\t1, 2.5 ,3 \r\n"};

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, ok[i], x, &y), INGEST_OK);
        assert_true(same_float(y, 1.0f));
        assert_true(same_float(x[0], 2.5f));
        assert_true(same_float(x[1], 3.0f));
    }
}

static void test_decode_csv_never_reads_past_the_record(void **state)
{
    ingest_schema_t s = schema_of(3, INGEST_LABEL_REAL, 0);
    float x[3], y;
    /* The digits continue in the source buffer; only the first len bytes
     * are the record, and the copy holds nothing more. */
    const char *text = "1,2,3,45678";

    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, text, 7, x, &y), INGEST_OK);
    assert_true(same_float(x[2], 4.0f));
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, text, 6, x, &y), INGEST_REJECT_BAD_NUMBER);
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, text, 0, x, &y), INGEST_REJECT_BAD_NUMBER);
    /* libc's strtof is not instrumented, so ASan cannot see it read past
     * the record: bytes after len that would change the number must not. */
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_CSV, "1,2,3,0x1p3", 9, x, &y), INGEST_OK);
    assert_true(same_float(x[2], 1.0f));
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_CSV, "1,2,3,1e10", 9, x, &y), INGEST_OK);
    assert_true(same_float(x[2], 10.0f));
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_LIBSVM, "1 3:1e10", 7, x, &y), INGEST_OK);
    assert_true(same_float(x[2], 10.0f));
}

static void test_decode_csv_rejects_bad_numbers(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    float x[2], y;
    const char *bad[] = {
        "",          "1,2,",        ",1,2",   "1,,2",    "1,abc,2", "1,1.2.3,2", "1,1e,2",
        "1,--1,2",   "1,1 2,3",     "1,0x,2", "1,\v2,3", "1,2\n,3", "1;2;3",     " , , ",
        "1,2,3\n\n", "1,2,3\r\r\n", "1,+,2",  "1,.,2",   "1,e5,2",  "1,2,3 x",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (decode_str(&s, INGEST_FORMAT_CSV, bad[i], x, &y) != INGEST_REJECT_BAD_NUMBER)
            fail_msg("\"%s\" was not bad_number", bad[i]);
    }
    /* An embedded NUL ends strtof early: the field is not a number. */
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, "1,2\0003,4", 8, x, &y),
                     INGEST_REJECT_BAD_NUMBER);
}

static void test_decode_csv_limits_a_field_to_63_bytes(void **state)
{
    ingest_schema_t s = schema_of(1, INGEST_LABEL_REAL, 0);
    char rec[128];
    float x[1], y;

    /* "1," then 62 zeros and a 5: a 63-byte number is still fine. */
    memcpy(rec, "1,", 2);
    memset(rec + 2, '0', 62);
    rec[64] = '5';
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, rec, 65, x, &y), INGEST_OK);
    assert_true(same_float(x[0], 5.0f));
    /* One more digit and it is bad_number, blanks around it not counting. */
    memset(rec + 2, '0', 63);
    rec[65] = '5';
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, rec, 66, x, &y), INGEST_REJECT_BAD_NUMBER);
    memcpy(rec, "1,  ", 4);
    memset(rec + 4, '0', 62);
    rec[66] = '5';
    memcpy(rec + 67, " \t", 2);
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, rec, 69, x, &y), INGEST_OK);
}

static void test_decode_csv_rejects_wrong_feature_count(void **state)
{
    ingest_schema_t s = schema_of(3, INGEST_LABEL_REAL, 0);
    float x[3], y;

    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1", x, &y), INGEST_REJECT_FEATURE_COUNT);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,2,3", x, &y),
                     INGEST_REJECT_FEATURE_COUNT);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,2,3,4,5", x, &y),
                     INGEST_REJECT_FEATURE_COUNT);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,2,3,4,5,6,7,8,9,10", x, &y),
                     INGEST_REJECT_FEATURE_COUNT);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,2,3,4", x, &y), INGEST_OK);
}

static void test_decode_csv_rejects_nonfinite_values(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    float x[2], y;
    const char *bad[] = {"1,nan,2",  "1,2,inf", "1,-inf,2", "1,NaN,2",  "1,Infinity,2",
                         "1,1e39,2", "inf,1,2", "nan,1,2",  "1,-1e40,2"};

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (decode_str(&s, INGEST_FORMAT_CSV, bad[i], x, &y) != INGEST_REJECT_NONFINITE)
            fail_msg("\"%s\" was not nonfinite", bad[i]);
    }
    /* Underflow is not an error: strtof gives a subnormal or zero. */
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,1e-40,1e-50", x, &y), INGEST_OK);
    assert_true(same_float(x[0], ref_strtof("1e-40")));
    assert_true(same_float(x[1], 0.0f));
}

/* A finite feature beyond max_abs (3e38: its gradient overflows) is
 * rejected as magnitude, in every dense format, after nonfinite; at the
 * bound and with no bound the record passes, and so does a large target
 * (an mse target of 3e7: a price in cents; a poisoned one is isolated by
 * the worker instead). */
static void test_features_beyond_max_abs_are_rejected(void **state)
{
    (void)state;
    ingest_schema_t s = schema_of(3, INGEST_LABEL_REAL, 0);
    s.max_abs = 1e6f;
    float x[3], y;
    static const struct {
        ingest_format_t format;
        const char *rec;
        ingest_reject_t want;
    } cases[] = {
        {INGEST_FORMAT_CSV, "1,3e38,3e38,3e38", INGEST_REJECT_MAGNITUDE},
        {INGEST_FORMAT_CSV, "1,0.5,-1000001,2", INGEST_REJECT_MAGNITUDE},
        {INGEST_FORMAT_LIBSVM, "1 2:2e6", INGEST_REJECT_MAGNITUDE},
        {INGEST_FORMAT_CSV, "1,nan,3e38,0", INGEST_REJECT_NONFINITE}, /* the documented order */
        {INGEST_FORMAT_CSV, "3e7,0,0,0", INGEST_OK},    /* targets are not bounded: prices */
        {INGEST_FORMAT_CSV, "1,1e6,-1e6,0", INGEST_OK}, /* at the bound */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (decode_str(&s, cases[i].format, cases[i].rec, x, &y) != cases[i].want)
            fail_msg("'%s': not %s", cases[i].rec, ingest_reject_name(cases[i].want));
    assert_true(x[0] == 1e6f && x[1] == -1e6f);
    float rec[4] = {1.0f, 3e38f, 0.0f, 1.0f}; /* f32: the label, then D features */
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_F32, rec, sizeof(rec), x, &y),
                     INGEST_REJECT_MAGNITUDE);
    s.max_abs = 0; /* no limit */
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,3e38,3e38,3e38", x, &y), INGEST_OK);
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_F32, rec, sizeof(rec), x, &y), INGEST_OK);
}

static void test_decode_csv_checks_reasons_in_the_documented_order(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_CLASS, 3);
    float x[2], y;

    /* bad_number before feature_count, nonfinite and label_range */
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "9,nan,x,1,1,1", x, &y),
                     INGEST_REJECT_BAD_NUMBER);
    /* feature_count before nonfinite and label_range */
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "9,nan", x, &y),
                     INGEST_REJECT_FEATURE_COUNT);
    /* nonfinite before label_range */
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "9,nan,1", x, &y), INGEST_REJECT_NONFINITE);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "9,1,1", x, &y), INGEST_REJECT_LABEL_RANGE);
    /* oversize before everything */
    s.max_record = 4;
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "xx,yy", x, &y), INGEST_REJECT_OVERSIZE);
}

static void test_decode_csv_rejects_oversize_records(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    float x[2], y;
    size_t mib = (size_t)1 << 20;
    char *big = malloc(mib + 1);

    s.max_record = 6;
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,2,34", x, &y), INGEST_OK);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,2,3\n", x, &y), INGEST_OK);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,2,345", x, &y), INGEST_REJECT_OVERSIZE);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "1,2,3\r\n", x, &y), INGEST_REJECT_OVERSIZE);
    /* The default limit is 1 MiB. */
    s.max_record = 0;
    assert_non_null(big);
    memset(big, ' ', mib + 1);
    memcpy(big, "1,2,3", 5);
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, big, mib, x, &y), INGEST_OK);
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, big, mib + 1, x, &y),
                     INGEST_REJECT_OVERSIZE);
    free(big);
}

/* Appends a random decimal of one of several shapes to out. */
static void random_number(fr_rng_t *rng, char *out, size_t size)
{
    const char *sign = fr_rng_below(rng, 4) == 0 ? "-" : "";
    uint64_t shape = fr_rng_below(rng, 6);
    uint64_t a = fr_rng_next(rng) >> (fr_rng_below(rng, 60) + 4);
    uint64_t b = fr_rng_next(rng) >> (fr_rng_below(rng, 60) + 4);
    int fd = (int)fr_rng_below(rng, 14) + 1;

    switch (shape) {
    case 0: /* small integers, the fast path */
        snprintf(out, size, "%s%llu", sign, (unsigned long long)(a % 20000000));
        break;
    case 1: { /* short decimals, mostly the fast path */
        char frac[16];
        for (int k = 0; k < fd; k++)
            frac[k] = (char)('0' + fr_rng_below(rng, 10));
        frac[fd] = '\0';
        snprintf(out, size, "%s%llu.%s", sign, (unsigned long long)(a % 1000), frac);
        break;
    }
    case 2: /* pixel-like values */
        snprintf(out, size, "%.*g", (int)fr_rng_below(rng, 10) + 1, (double)(a % 256) / 255.0);
        break;
    case 3: /* exponents */
        snprintf(out, size, "%s%llue%d", sign, (unsigned long long)(a % 100000),
                 (int)fr_rng_below(rng, 80) - 40);
        break;
    case 4: /* long mantissas: fall back to strtof */
        snprintf(out, size, "%s%llu.%llu", sign, (unsigned long long)a, (unsigned long long)b);
        break;
    default: /* leading zeros and a trailing point */
        snprintf(out, size, "%s000%llu.", sign, (unsigned long long)(a % 100000000));
        break;
    }
}

static void test_decode_csv_values_equal_strtof_bit_for_bit(void **state)
{
    ingest_schema_t s = schema_of(1, INGEST_LABEL_REAL, 0);
    fr_rng_t rng;
    char a[64], b[64], rec[160];
    float x[1], y;

    fr_rng_seed(&rng, 20261129);
    for (int i = 0; i < 200000; i++) {
        random_number(&rng, a, sizeof(a));
        random_number(&rng, b, sizeof(b));
        snprintf(rec, sizeof(rec), "%s,%s", a, b);
        ingest_reject_t r = decode_str(&s, INGEST_FORMAT_CSV, rec, x, &y);
        float ra = ref_strtof(a), rb = ref_strtof(b);
        if (!isfinite(ra) || !isfinite(rb)) {
            assert_int_equal(r, INGEST_REJECT_NONFINITE);
            continue;
        }
        if (r != INGEST_OK || !same_float(y, ra) || !same_float(x[0], rb))
            fail_msg("\"%s\": got %a,%a expected %a,%a (reason %s)", rec, y, x[0], ra, rb,
                     ingest_reject_name(r));
    }
}

/* The reference for one csv field: blanks trimmed, then at most 63 bytes
 * that strtof reads whole, not starting with other white space. Returns 0
 * with the value, -1 for bad_number. */
static int ref_field(const char *p, size_t len, float *out)
{
    while (len > 0 && (*p == ' ' || *p == '\t'))
        p++, len--;
    while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
        len--;
    if (len == 0 || len > 63 || isspace((unsigned char)p[0]))
        return -1;
    char buf[64], *end;
    memcpy(buf, p, len);
    buf[len] = '\0';
    *out = strtof(buf, &end);
    return end == buf + len ? 0 : -1;
}

/* The reference decision on a csv record of D features: field by field
 * (ref_field), then the count, then non-finite values; vals receives the
 * fields (at most REF_FIELDS). */
#define REF_FIELDS 128

static ingest_reject_t ref_decode_csv(const char *rec, size_t len, size_t d, float *vals)
{
    /* the record's line end ("\n", "\r\n" or "\r") is not a field's */
    char body[4096];
    size_t blen = len;
    if (blen > 0 && rec[blen - 1] == '\n')
        blen--;
    if (blen > 0 && rec[blen - 1] == '\r')
        blen--;
    assert_true(blen < sizeof(body));
    memcpy(body, rec, blen);
    body[blen] = '\0';
    size_t nf = 0;
    int nonfinite = 0;
    for (const char *p = body;;) {
        const char *comma = strchr(p, ',');
        size_t flen = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (nf == REF_FIELDS || ref_field(p, flen, &vals[nf]) != 0)
            return INGEST_REJECT_BAD_NUMBER;
        nonfinite |= !isfinite(vals[nf]);
        nf++;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    if (nf != d + 1)
        return INGEST_REJECT_FEATURE_COUNT;
    return nonfinite ? INGEST_REJECT_NONFINITE : INGEST_OK;
}

/* Fails unless the decoder's decision (got, x[d], y) on the record named
 * what is the reference's (want, vals: the label, then the features).
 * Returns 1 when both decoded the record. */
static int agrees_with_reference(const char *what, ingest_reject_t got, ingest_reject_t want,
                                 const float *x, float y, const float *vals, size_t d)
{
    if (got != want)
        fail_msg("%s: %s, expected %s", what, ingest_reject_name(got), ingest_reject_name(want));
    if (got != INGEST_OK)
        return 0;
    if (!same_float(y, vals[0]))
        fail_msg("%s: label %a, expected %a", what, y, vals[0]);
    for (size_t j = 0; j < d; j++)
        if (!same_float(x[j], vals[j + 1]))
            fail_msg("%s: x[%zu] %a, expected %a", what, j, x[j], vals[j + 1]);
    return 1;
}

/* Records of short random fields over an alphabet of number syntax, blanks
 * and letters strtof knows (inf, nan, hex): the fused csv scanner and its
 * fallback together decide exactly what the field-by-field reference
 * decides, reason and bits. */
static void test_decode_csv_syntax_agrees_with_the_reference(void **state)
{
    enum { D = 3 };
    static const char alphabet[] = "0123456789012345678901234567890123456789..eE+-+- \t\r,xpnaif";
    ingest_schema_t s = schema_of(D, INGEST_LABEL_REAL, 0);
    fr_rng_t rng;
    char rec[160];
    float x[D], y;
    fr_rng_seed(&rng, 20261201);
    int ok = 0;
    for (int i = 0; i < 400000; i++) {
        size_t len = 0;
        if (i % 4 == 0) { /* anything */
            len = 1 + fr_rng_below(&rng, 40);
            for (size_t k = 0; k < len; k++)
                rec[k] = alphabet[fr_rng_below(&rng, sizeof(alphabet) - 1)];
        } else { /* D + 1 number-like fields, sometimes with one stray byte */
            for (int f = 0; f <= D; f++) {
                const char *blank = fr_rng_below(&rng, 6) == 0 ? " " : "";
                const char *sign = fr_rng_below(&rng, 3) == 0 ? "-" : "";
                char num[24];
                unsigned a = (unsigned)fr_rng_below(&rng, 100000);
                switch (fr_rng_below(&rng, 4)) {
                case 0: snprintf(num, sizeof(num), "%u", a); break;
                case 1: snprintf(num, sizeof(num), "%u.%u", a % 1000, a); break;
                case 2: snprintf(num, sizeof(num), ".%ue-%u", a, a % 12); break;
                default: snprintf(num, sizeof(num), "%ue+%u", a % 100, a % 40); break;
                }
                len += (size_t)snprintf(rec + len, sizeof(rec) - len, "%s%s%s%s%s", f ? "," : "",
                                        blank, sign, num, blank);
            }
            if (fr_rng_below(&rng, 3) == 0) /* one byte replaced */
                rec[fr_rng_below(&rng, len)] = alphabet[fr_rng_below(&rng, sizeof(alphabet) - 1)];
        }
        rec[len] = '\0';
        float vals[REF_FIELDS];
        ingest_reject_t want = ref_decode_csv(rec, len, D, vals);
        ingest_reject_t got = decode_bytes(&s, INGEST_FORMAT_CSV, rec, len, x, &y);
        ok += agrees_with_reference(rec, got, want, x, y, vals, D);
    }
    assert_true(ok > 100000); /* most number-like records are valid */
}

/*
 * Runs of digits of every length, at every distance from the record's end
 * and with every kind of byte breaking them: the scanner takes eight digits
 * at a time while eight bytes remain and are all digits, so the lengths
 * around multiples of eight, the last eight bytes of a record and a
 * stray byte at each position of a word (the neighbours of '0' and '9',
 * and bytes whose low seven bits are a digit's) must decide exactly as the
 * field-by-field reference does, reason and bits.
 */
static void test_decode_csv_digit_runs_of_every_length_agree_with_strtof(void **state)
{
    static const char strays[] = {'/', ':', 'x', ' ', '.', 'e', (char)0xb0, (char)0xb9, '\t'};
    static const int int_lengths[] = {0, 1, 2, 7, 8, 9, 16};
    fr_rng_t rng;
    fr_rng_seed(&rng, 20261203);
    char rec[160], field[64];
    float x[2], y, vals[REF_FIELDS];
    int clean = 0, clean_ok = 0, strayed_ok = 0;
    for (size_t il = 0; il < sizeof(int_lengths) / sizeof(int_lengths[0]); il++) {
        for (int fl = -1; fl <= 24; fl++) { /* -1: no '.' */
            for (int stray = -1; stray < (int)sizeof(strays); stray++) {
                for (int tail = 0; tail < 4; tail++) {
                    size_t n = 0;
                    for (int k = 0; k < int_lengths[il]; k++)
                        field[n++] = (char)('0' + fr_rng_below(&rng, 10));
                    if (fl >= 0)
                        field[n++] = '.';
                    for (int k = 0; k < fl; k++)
                        field[n++] = (char)('0' + fr_rng_below(&rng, 10));
                    if (n == 0)
                        field[n++] = '5';
                    if (stray >= 0) /* one byte of the field replaced */
                        field[fr_rng_below(&rng, n)] = strays[stray];
                    field[n] = '\0';
                    /* what follows: nothing, a short field, a long one, a
                     * short one after a blank (the distance to the end) */
                    static const char *const tails[] = {"", ",7", ",12345678901234", " ,3"};
                    int d = tail == 0 ? 1 : 2;
                    size_t len = (size_t)snprintf(rec, sizeof(rec), "1,%s%s", field, tails[tail]);
                    ingest_schema_t s = schema_of(d, INGEST_LABEL_REAL, 0);
                    ingest_reject_t want = ref_decode_csv(rec, len, (size_t)d, vals);
                    ingest_reject_t got = decode_bytes(&s, INGEST_FORMAT_CSV, rec, len, x, &y);
                    if (got != want)
                        fail_msg("\"%s\": %s, expected %s", rec, ingest_reject_name(got),
                                 ingest_reject_name(want));
                    clean += stray < 0;
                    if (got != INGEST_OK)
                        continue;
                    clean_ok += stray < 0;
                    strayed_ok += stray >= 0;
                    for (int j = 0; j < d; j++)
                        if (!same_float(x[j], vals[j + 1]))
                            fail_msg("\"%s\": x[%d] %a, expected %a", rec, j, x[j], vals[j + 1]);
                }
            }
        }
    }
    /* every clean field is a number but "." (no integer part and no
     * fraction, 4 records); most with a stray byte are not */
    assert_int_equal(clean, 7 * 26 * 4);
    assert_int_equal(clean_ok, clean - 4);
    assert_true(strayed_ok < 7 * 26 * 9 * 4 / 2);
}

/* One field for a long record: a number of one of random_number's shapes,
 * a run of digits around a '.' (up to 17 digits a side, signed or not), or
 * a few bytes of number syntax, blanks and letters. */
static void random_field(fr_rng_t *rng, char *out, size_t size)
{
    static const char alphabet[] = "0123456789..eE+-+- \t\rxpnaif";
    size_t n = 0;
    switch (fr_rng_below(rng, 4)) {
    case 0:
    case 1: random_number(rng, out, size); return;
    case 2: {
        if (fr_rng_below(rng, 4) == 0)
            out[n++] = '-';
        uint64_t a = fr_rng_below(rng, 18), b = fr_rng_below(rng, 19);
        for (uint64_t k = 0; k < a; k++)
            out[n++] = (char)('0' + fr_rng_below(rng, 10));
        if (b > 0)
            out[n++] = '.';
        for (uint64_t k = 1; k < b; k++)
            out[n++] = (char)('0' + fr_rng_below(rng, 10));
        if (n == 0)
            out[n++] = '7';
        break;
    }
    default: {
        uint64_t a = 1 + fr_rng_below(rng, 6);
        for (uint64_t k = 0; k < a; k++)
            out[n++] = alphabet[fr_rng_below(rng, sizeof(alphabet) - 1)];
        break;
    }
    }
    out[n] = '\0';
}

/*
 * Records of 20 to 100 fields of every shape (random_field), sometimes one
 * byte replaced, a field more or less: where a record is long enough the
 * decoder reads its fields 64 bytes of commas at a time and the common form
 * with vector instructions (docs/design.md "The csv decoder"), so fields of
 * every length land at every offset of a block, across blocks and near the
 * record's end. Each record must be decided exactly as the field-by-field
 * reference decides, reason and bits.
 */
static void test_decode_csv_long_records_agree_with_the_reference(void **state)
{
    fr_rng_t rng;
    fr_rng_seed(&rng, 20261204);
    /* at most 101 fields of under 80 bytes with their commas: rec never fills */
    static char rec[101 * 80 + 16];
    char field[80];
    float x[REF_FIELDS], y, vals[REF_FIELDS];
    int ok = 0, bad = 0;
    for (int i = 0; i < 30000; i++) {
        size_t d = 19 + fr_rng_below(&rng, 81), len = 0;
        size_t fields = d + 1;
        if (i % 10 == 0) /* a field too many or too few */
            fields += fr_rng_below(&rng, 2) == 0 ? 1 : (size_t)-1;
        /* most records in the common forms only, so that most are valid */
        int clean = i % 3 != 0;
        for (size_t f = 0; f < fields; f++) {
            if (clean) {
                do
                    random_field(&rng, field, sizeof(field));
                while (ref_field(field, strlen(field), &vals[0]) != 0);
            } else {
                random_field(&rng, field, sizeof(field));
            }
            len += (size_t)snprintf(rec + len, sizeof(rec) - len, "%s%s", f ? "," : "", field);
        }
        if (i % 7 == 0) /* one byte replaced */
            rec[fr_rng_below(&rng, len)] = ",.-5 x"[fr_rng_below(&rng, 6)];
        ingest_schema_t s = schema_of((int)d, INGEST_LABEL_REAL, 0);
        ingest_reject_t want = ref_decode_csv(rec, len, d, vals);
        ingest_reject_t got = decode_bytes(&s, INGEST_FORMAT_CSV, rec, len, x, &y);
        char what[48];
        snprintf(what, sizeof(what), "record %d (%zu bytes)", i, len);
        if (agrees_with_reference(what, got, want, x, y, vals, d))
            ok++;
        else
            bad++;
    }
    /* both outcomes are well represented */
    assert_true(ok > 10000);
    assert_true(bad > 5000);
}

/*
 * Fields whose nearest double lies exactly on a midpoint between two floats
 * though the decimal does not (".50004443526268" is a hair below the
 * midpoint, its double on it): rounding the double to float gives the
 * float above, strtof the one below. Such fields exist only with 14
 * digits after the point in the vector path's range (about 98,000 of
 * them, one random field in 2^29), so random records never meet one. Each
 * is placed inside a long record, where the vector path reads it, with
 * and without a sign, at several offsets; each must decode to strtof's
 * float, and the test data must be such a trap.
 */
static void test_decode_csv_fields_whose_double_is_a_float_midpoint_equal_strtof(void **state)
{
    static const char *const traps[] = {".50004443526268", ".50010547041893", ".50016650557518",
                                        ".50022754073143", ".50028857588768", ".50034961104393"};
    enum { D = 40 };
    ingest_schema_t s = schema_of(D, INGEST_LABEL_REAL, 0);
    char rec[1024], field[24];
    float x[D], y;
    for (size_t t = 0; t < sizeof(traps) / sizeof(traps[0]); t++) {
        for (int neg = 0; neg < 2; neg++) {
            snprintf(field, sizeof(field), "%s%s", neg ? "-" : "", traps[t]);
            float want = ref_strtof(field);
            float naive = (float)(strtod(field, NULL)); /* the double, rounded again */
            assert_false(same_float(naive, want));
            for (int at = 1; at < 20; at++) { /* the field is feature at - 1 */
                size_t len = (size_t)snprintf(rec, sizeof(rec), "1");
                for (int f = 1; f <= D; f++)
                    len += (size_t)snprintf(rec + len, sizeof(rec) - len, ",%s",
                                            f == at ? field : "0.25");
                assert_int_equal(decode_bytes(&s, INGEST_FORMAT_CSV, rec, len, x, &y), INGEST_OK);
                if (!same_float(x[at - 1], want))
                    fail_msg("\"%s\" as feature %d: %a, expected %a", field, at - 1, x[at - 1],
                             want);
            }
        }
    }
}

/* Decimals as other writers print floats ("%.9g" and friends, exponents),
 * and decimals on or next to the midpoint between two floats, where a
 * double-based shortcut could round twice: all equal strtof bit for bit. */
static void test_decode_csv_printed_floats_and_midpoints_equal_strtof(void **state)
{
    ingest_schema_t s = schema_of(1, INGEST_LABEL_REAL, 0);
    static const char *const formats[] = {"%.9g", "%.8g", "%.7g", "%.12g", "%.17g",
                                          "%.6e", "%.9e", "%.3f", "%.10f"};
    fr_rng_t rng;
    char num[128], rec[300];
    float x[1], y;
    fr_rng_seed(&rng, 424242);
    for (int i = 0; i < 300000; i++) {
        uint32_t bits = (uint32_t)fr_rng_next(&rng);
        float f;
        memcpy(&f, &bits, sizeof(f));
        if (!isfinite(f))
            continue;
        double v = f;
        if (i % 3 == 1) { /* the midpoint above f, and a hair either side */
            float up = nextafterf(f, INFINITY);
            if (!isfinite(up))
                continue;
            v = ((double)f + (double)up) / 2;
            if (i % 9 == 4)
                v = nextafter(v, INFINITY);
            else if (i % 9 == 7)
                v = nextafter(v, -INFINITY);
        }
        snprintf(num, sizeof(num), formats[fr_rng_below(&rng, 9)], v);
        snprintf(rec, sizeof(rec), "0,%s", num);
        float want = ref_strtof(num);
        ingest_reject_t r = decode_str(&s, INGEST_FORMAT_CSV, rec, x, &y);
        if (!isfinite(want)) {
            assert_int_equal(r, INGEST_REJECT_NONFINITE);
            continue;
        }
        if (r != INGEST_OK || !same_float(x[0], want))
            fail_msg("\"%s\": got %a expected %a (reason %s)", num, x[0], want,
                     ingest_reject_name(r));
    }
}

/* ------------------------------------------------------------------------
 * libsvm records.
 * ---------------------------------------------------------------------- */

static void test_decode_libsvm_reads_sparse_features(void **state)
{
    ingest_schema_t s = schema_of(5, INGEST_LABEL_REAL, 0);
    float x[5], y;

    assert_int_equal(decode_str(&s, INGEST_FORMAT_LIBSVM, "2.5 1:0.5 3:-1 5:7e2", x, &y),
                     INGEST_OK);
    assert_true(same_float(y, 2.5f));
    assert_true(same_float(x[0], 0.5f));
    assert_true(same_float(x[1], 0.0f));
    assert_true(same_float(x[2], -1.0f));
    assert_true(same_float(x[3], 0.0f));
    assert_true(same_float(x[4], 700.0f));
    assert_int_equal(decode_str(&s, INGEST_FORMAT_LIBSVM, "\t-1 \t +2:3 \r\n", x, &y), INGEST_OK);
    assert_true(same_float(y, -1.0f));
    assert_true(same_float(x[1], 3.0f));
}

static void test_decode_libsvm_allows_zero_features(void **state)
{
    ingest_schema_t s = schema_of(4, INGEST_LABEL_CLASS, 2);
    float x[4] = {9, 9, 9, 9}, y;

    assert_int_equal(decode_str(&s, INGEST_FORMAT_LIBSVM, "1", x, &y), INGEST_OK);
    assert_true(same_float(y, 1.0f));
    for (int i = 0; i < 4; i++)
        assert_true(same_float(x[i], 0.0f));
    assert_int_equal(decode_str(&s, INGEST_FORMAT_LIBSVM, "  0   \n", x, &y), INGEST_OK);
}

static void test_decode_libsvm_rejects_indices_out_of_range(void **state)
{
    ingest_schema_t s = schema_of(5, INGEST_LABEL_REAL, 0);
    float x[5], y;
    const char *bad[] = {"1 0:1",     "1 6:1",   "1 1:1 6:1",  "1 99999999999999999999:1",
                         "1 -1:1",    "1 -0:1",  "1 3:1 2:1",  "1 2:1 2:1",
                         "1 5:1 1:1", "1 9:nan", "1 0:inf 2:1"};

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (decode_str(&s, INGEST_FORMAT_LIBSVM, bad[i], x, &y) != INGEST_REJECT_INDEX_RANGE)
            fail_msg("\"%s\" was not index_range", bad[i]);
    }
    assert_int_equal(decode_str(&s, INGEST_FORMAT_LIBSVM, "1 5:1", x, &y), INGEST_OK);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_LIBSVM, "1 00005:1", x, &y), INGEST_OK);
}

static void test_decode_libsvm_rejects_malformed_tokens(void **state)
{
    ingest_schema_t s = schema_of(5, INGEST_LABEL_REAL, 0);
    float x[5], y;
    const char *bad[] = {"",        "   ",        "x 1:1",       "1 2",     "1 :3",
                         "1 2:",    "1 a:1",      "1 2:x",       "1 2::3",  "1 2:3:4",
                         "1 1.5:2", "1 2:3 # hi", "1 qid:3 2:1", "1,2:3",   "1 2 :3",
                         "1 0:x",   "1 2:3\n\n",  "1 2:3\v",     "1 0x2:1", "1 +:1"};

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (decode_str(&s, INGEST_FORMAT_LIBSVM, bad[i], x, &y) != INGEST_REJECT_BAD_NUMBER)
            fail_msg("\"%s\" was not bad_number", bad[i]);
    }
}

static void test_decode_libsvm_rejects_nonfinite_values(void **state)
{
    ingest_schema_t s = schema_of(3, INGEST_LABEL_REAL, 0);
    float x[3], y;

    assert_int_equal(decode_str(&s, INGEST_FORMAT_LIBSVM, "1 2:inf", x, &y),
                     INGEST_REJECT_NONFINITE);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_LIBSVM, "nan 1:1", x, &y),
                     INGEST_REJECT_NONFINITE);
    assert_int_equal(decode_str(&s, INGEST_FORMAT_LIBSVM, "1 1:1 3:-1e39", x, &y),
                     INGEST_REJECT_NONFINITE);
}

static void test_decode_libsvm_never_reads_past_the_record(void **state)
{
    ingest_schema_t s = schema_of(3, INGEST_LABEL_REAL, 0);
    float x[3], y;
    const char *text = "1 1:2 3:45";

    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_LIBSVM, text, 9, x, &y), INGEST_OK);
    assert_true(same_float(x[2], 4.0f));
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_LIBSVM, text, 8, x, &y),
                     INGEST_REJECT_BAD_NUMBER);
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_LIBSVM, text, 7, x, &y),
                     INGEST_REJECT_BAD_NUMBER);
    s.max_record = 5;
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_LIBSVM, text, 6, x, &y),
                     INGEST_REJECT_OVERSIZE);
}

/* ------------------------------------------------------------------------
 * f32 records.
 * ---------------------------------------------------------------------- */

static void test_decode_f32_reads_little_endian_values_at_any_alignment(void **state)
{
    ingest_schema_t s = schema_of(3, INGEST_LABEL_REAL, 0);
    const float v[4] = {-1.5f, 0.1f, 3e-40f, -0.0f};
    unsigned char raw[1 + 16];
    float x[3], y;

    for (int off = 0; off <= 1; off++) {
        for (int i = 0; i < 4; i++)
            put_f32le(raw + off + 4 * i, v[i]);
        assert_int_equal(decode_bytes(&s, INGEST_FORMAT_F32, raw + off, 16, x, &y), INGEST_OK);
        assert_true(same_float(y, v[0]));
        for (int i = 0; i < 3; i++)
            assert_true(same_float(x[i], v[i + 1]));
    }
    /* The bytes, spelled out: 1.0f is 00 00 80 3f in little endian. */
    const unsigned char one[16] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0x80, 0xbf};
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_F32, one, 16, x, &y), INGEST_OK);
    assert_true(same_float(y, 1.0f));
    assert_true(same_float(x[0], 2.0f));
    assert_true(same_float(x[2], -1.0f));
}

static void test_decode_f32_rejects_wrong_lengths(void **state)
{
    ingest_schema_t s = schema_of(3, INGEST_LABEL_REAL, 0);
    unsigned char raw[64] = {0};
    float x[3], y;
    const size_t lens[] = {0, 1, 4, 12, 15, 17, 20, 64};

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
        assert_int_equal(decode_bytes(&s, INGEST_FORMAT_F32, raw, lens[i], x, &y),
                         INGEST_REJECT_FEATURE_COUNT);
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_F32, raw, 16, x, &y), INGEST_OK);
}

static void test_decode_f32_rejects_nonfinite_values(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    unsigned char raw[12];
    float x[2], y;

    for (int pos = 0; pos < 3; pos++) {
        for (int i = 0; i < 3; i++)
            put_f32le(raw + 4 * i, 1.0f);
        put_f32le(raw + 4 * pos, pos == 1 ? INFINITY : NAN);
        assert_int_equal(decode_bytes(&s, INGEST_FORMAT_F32, raw, 12, x, &y),
                         INGEST_REJECT_NONFINITE);
    }
}

/* Every position of records of 1 to 13 features, and of 784: a NaN, an
 * infinity of either sign, or the largest finite value of either sign
 * beside values of every magnitude class (zeros, subnormals, FLT_MAX) is
 * told apart exactly, in the vector lanes and in the tail alike; so is a
 * feature a hair above the magnitude bound, or exactly on it. */
static void test_decode_f32_finds_a_bad_value_at_every_position(void **state)
{
    (void)state;
    static const float fill[] = {0.0f, -0.0f, 1e-45f, -1e-40f, 1.0f, -2.5f, 3e38f, -3e38f};
    static const int dims[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 784};
    for (size_t k = 0; k < sizeof(dims) / sizeof(dims[0]); k++) {
        int d = dims[k];
        ingest_schema_t s = schema_of(d, INGEST_LABEL_REAL, 0);
        size_t len = 4 * ((size_t)d + 1);
        unsigned char *raw = malloc(len);
        float *x = malloc((size_t)d * sizeof(float)), y;
        assert_non_null(raw);
        assert_non_null(x);
        for (int pos = 0; pos < d; pos++) {
            static const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
            for (size_t b = 0; b < 6; b++) {
                put_f32le(raw, 1.0f);
                for (int i = 0; i < d; i++)
                    put_f32le(raw + 4 * (i + 1), fill[(size_t)(i + pos) % 8]);
                float v = b < 4 ? bad[b] : b == 4 ? FLT_MAX : -FLT_MAX;
                put_f32le(raw + 4 * (pos + 1), v);
                s.max_abs = 0;
                ingest_reject_t want = b < 4 ? INGEST_REJECT_NONFINITE : INGEST_OK;
                if (ingest_decode(&s, INGEST_FORMAT_F32, raw, len, x, &y) != want)
                    fail_msg("D %d, position %d, value %a: not %s", d, pos, v,
                             ingest_reject_name(want));
                if (want == INGEST_OK && !same_float(x[pos], v))
                    fail_msg("D %d, position %d: %a read as %a", d, pos, v, x[pos]);
            }
            /* the magnitude bound: on it is fine, a hair above is not */
            s.max_abs = 1e6f;
            for (int i = 0; i < d; i++)
                put_f32le(raw + 4 * (i + 1), (float)((i % 5) - 2));
            for (int sign = -1; sign <= 1; sign += 2) {
                put_f32le(raw + 4 * (pos + 1), (float)sign * 1e6f);
                assert_int_equal(ingest_decode(&s, INGEST_FORMAT_F32, raw, len, x, &y), INGEST_OK);
                put_f32le(raw + 4 * (pos + 1), (float)sign * nextafterf(1e6f, INFINITY));
                assert_int_equal(ingest_decode(&s, INGEST_FORMAT_F32, raw, len, x, &y),
                                 INGEST_REJECT_MAGNITUDE);
            }
        }
        free(raw);
        free(x);
    }
}

static void test_decode_f32_is_oversize_only_with_an_explicit_limit(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    unsigned char raw[64] = {0};
    float x[2], y;

    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_F32, raw, 64, x, &y),
                     INGEST_REJECT_FEATURE_COUNT);
    s.max_record = 16;
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_F32, raw, 64, x, &y), INGEST_REJECT_OVERSIZE);
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_F32, raw, 12, x, &y), INGEST_OK);
    s.max_record = 8;
    assert_int_equal(decode_bytes(&s, INGEST_FORMAT_F32, raw, 12, x, &y), INGEST_REJECT_OVERSIZE);
}

/* ------------------------------------------------------------------------
 * Labels.
 * ---------------------------------------------------------------------- */

static void expect_label(const ingest_schema_t *s, const char *label, ingest_reject_t want)
{
    char rec[64];
    float x[1], y;

    snprintf(rec, sizeof(rec), "%s,0", label);
    ingest_reject_t r = decode_str(s, INGEST_FORMAT_CSV, rec, x, &y);
    if (r != want)
        fail_msg("label \"%s\": %s, expected %s", label, ingest_reject_name(r),
                 ingest_reject_name(want));
    if (r == INGEST_OK && !same_float(y, ref_strtof(label)) && ref_strtof(label) != 0.0f)
        fail_msg("label \"%s\" decoded as %a", label, y);
}

static void test_class_labels_are_integers_below_classes(void **state)
{
    ingest_schema_t s = schema_of(1, INGEST_LABEL_CLASS, 3);
    float x[1], y;

    expect_label(&s, "0", INGEST_OK);
    expect_label(&s, "1", INGEST_OK);
    expect_label(&s, "2.0", INGEST_OK);
    expect_label(&s, "2e0", INGEST_OK);
    expect_label(&s, "3", INGEST_REJECT_LABEL_RANGE);
    expect_label(&s, "-1", INGEST_REJECT_LABEL_RANGE);
    expect_label(&s, "1.5", INGEST_REJECT_LABEL_RANGE);
    expect_label(&s, "0.0000001", INGEST_REJECT_LABEL_RANGE);
    expect_label(&s, "nan", INGEST_REJECT_NONFINITE);
    expect_label(&s, "inf", INGEST_REJECT_NONFINITE);
    /* -0 is class 0, stored as +0. */
    assert_int_equal(decode_str(&s, INGEST_FORMAT_CSV, "-0,1", x, &y), INGEST_OK);
    assert_true(same_float(y, 0.0f));
    /* A schema with no classes accepts no class label. */
    s.classes = 0;
    expect_label(&s, "0", INGEST_REJECT_LABEL_RANGE);
}

static void test_binary_labels_lie_in_the_unit_interval(void **state)
{
    ingest_schema_t s = schema_of(1, INGEST_LABEL_BINARY, 0);

    expect_label(&s, "0", INGEST_OK);
    expect_label(&s, "1", INGEST_OK);
    expect_label(&s, "0.25", INGEST_OK);
    expect_label(&s, "-0", INGEST_OK);
    expect_label(&s, "-0.01", INGEST_REJECT_LABEL_RANGE);
    expect_label(&s, "1.01", INGEST_REJECT_LABEL_RANGE);
    expect_label(&s, "2", INGEST_REJECT_LABEL_RANGE);
    expect_label(&s, "-1", INGEST_REJECT_LABEL_RANGE);
    expect_label(&s, "nan", INGEST_REJECT_NONFINITE);
}

static void test_real_labels_accept_any_finite_value(void **state)
{
    ingest_schema_t s = schema_of(1, INGEST_LABEL_REAL, 0);

    expect_label(&s, "-1e30", INGEST_OK);
    expect_label(&s, "3.5", INGEST_OK);
    expect_label(&s, "1e-45", INGEST_OK);
    expect_label(&s, "-inf", INGEST_REJECT_NONFINITE);
    expect_label(&s, "1e39", INGEST_REJECT_NONFINITE);
}

static void test_decode_refuses_idx_records_and_schemas_without_features(void **state)
{
    ingest_schema_t s = schema_of(1, INGEST_LABEL_REAL, 0);
    float x[1], y;

    assert_int_equal(decode_str(&s, INGEST_FORMAT_IDX, "1,2", x, &y), INGEST_REJECT_BAD_NUMBER);
    assert_int_equal(decode_str(&s, (ingest_format_t)9, "1,2", x, &y), INGEST_REJECT_BAD_NUMBER);
    assert_int_equal(ingest_decode(NULL, INGEST_FORMAT_CSV, "1,2", 3, x, &y),
                     INGEST_REJECT_FEATURE_COUNT);
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_CSV, NULL, 3, x, &y),
                     INGEST_REJECT_BAD_NUMBER);
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_CSV, "1,2", 3, NULL, &y),
                     INGEST_REJECT_FEATURE_COUNT);
    s.features = 0;
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_CSV, "1", 1, x, &y),
                     INGEST_REJECT_FEATURE_COUNT);
    s.features = -3;
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_F32, "1234", 4, x, &y),
                     INGEST_REJECT_FEATURE_COUNT);
}

/* ------------------------------------------------------------------------
 * Encoding (ingest_encode), read back by ingest_decode.
 * ---------------------------------------------------------------------- */

/*
 * A random finite float: a quarter are +0 or -0 (so libsvm records are
 * sparse and signed zeros are covered), the rest random bit patterns,
 * subnormals included, with infinities and NaNs redrawn.
 */
static float random_float(fr_rng_t *rng)
{
    uint64_t pick = fr_rng_below(rng, 8);
    if (pick == 0)
        return 0.0f;
    if (pick == 1)
        return -0.0f;
    for (;;) {
        uint32_t u = (uint32_t)fr_rng_next(rng);
        float f;
        memcpy(&f, &u, sizeof(f));
        if (isfinite(f))
            return f;
    }
}

static void test_encode_then_decode_gives_back_the_same_bits_in_all_formats(void **state)
{
    const ingest_format_t formats[] = {INGEST_FORMAT_CSV, INGEST_FORMAT_LIBSVM, INGEST_FORMAT_F32};
    fr_rng_t rng;
    char buf[4096];

    fr_rng_seed(&rng, 20261130);
    for (int i = 0; i < 20000; i++) {
        int d = (int)fr_rng_below(&rng, 17) + 1;
        ingest_schema_t s = schema_of(d, INGEST_LABEL_REAL, 0);
        float x[17], back[17], y = random_float(&rng), yb;
        for (int k = 0; k < d; k++)
            x[k] = random_float(&rng);
        for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++) {
            size_t len = ingest_encode(formats[f], x, d, y, buf, sizeof(buf));
            assert_true(len > 0);
            if (formats[f] == INGEST_FORMAT_F32)
                assert_int_equal(len, 4 * (size_t)(d + 1));
            else
                assert_null(memchr(buf, '\n', len));
            ingest_reject_t r = decode_bytes(&s, formats[f], buf, len, back, &yb);
            if (r != INGEST_OK)
                fail_msg("%s record \"%.*s\" rejected: %s", ingest_format_name(formats[f]),
                         formats[f] == INGEST_FORMAT_F32 ? 0 : (int)len, buf,
                         ingest_reject_name(r));
            assert_memory_equal(&yb, &y, sizeof(float));
            assert_memory_equal(back, x, (size_t)d * sizeof(float));
        }
    }
}

static void test_encode_writes_the_documented_text(void **state)
{
    const float x[4] = {0.5f, 0.0f, -3.0f, 0.1f};
    char buf[128];
    size_t len;

    len = ingest_encode(INGEST_FORMAT_CSV, x, 4, 7.0f, buf, sizeof(buf));
    assert_int_equal(len, strlen("7,0.5,0,-3,0.100000001"));
    assert_memory_equal(buf, "7,0.5,0,-3,0.100000001", len);
    len = ingest_encode(INGEST_FORMAT_LIBSVM, x, 4, 1.0f, buf, sizeof(buf));
    assert_int_equal(len, strlen("1 1:0.5 3:-3 4:0.100000001"));
    assert_memory_equal(buf, "1 1:0.5 3:-3 4:0.100000001", len);
    len = ingest_encode(INGEST_FORMAT_F32, x, 1, 1.0f, buf, sizeof(buf));
    assert_int_equal(len, 8);
    assert_memory_equal(buf, "\x00\x00\x80\x3f\x00\x00\x00\x3f", 8); /* 1.0f, 0.5f */
}

static void test_encode_returns_zero_when_the_buffer_is_too_small(void **state)
{
    const float x[3] = {1.25f, -2.0f, 1e-7f};
    const ingest_format_t formats[] = {INGEST_FORMAT_CSV, INGEST_FORMAT_LIBSVM, INGEST_FORMAT_F32};
    char buf[256];

    for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++) {
        size_t need = ingest_encode(formats[f], x, 3, 4.0f, buf, sizeof(buf));
        assert_true(need > 0);
        /* exactly the record's length is enough: no NUL is written */
        char *exact = malloc(need);
        assert_non_null(exact);
        assert_int_equal(ingest_encode(formats[f], x, 3, 4.0f, exact, need), need);
        assert_memory_equal(exact, buf, need);
        free(exact);
        for (size_t cap = 0; cap < need; cap++)
            assert_int_equal(ingest_encode(formats[f], x, 3, 4.0f, buf, cap), 0);
    }
    assert_int_equal(ingest_encode(INGEST_FORMAT_IDX, x, 3, 4.0f, buf, sizeof(buf)), 0);
    assert_int_equal(ingest_encode(INGEST_FORMAT_CSV, x, 0, 4.0f, buf, sizeof(buf)), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_parse_accepts_the_four_names_only),
        cmocka_unit_test(test_reject_names_are_stable_metric_labels),
        cmocka_unit_test(test_decode_csv_reads_exact_values),
        cmocka_unit_test(test_decode_csv_allows_blanks_around_fields_and_crlf),
        cmocka_unit_test(test_decode_csv_never_reads_past_the_record),
        cmocka_unit_test(test_decode_csv_rejects_bad_numbers),
        cmocka_unit_test(test_decode_csv_limits_a_field_to_63_bytes),
        cmocka_unit_test(test_decode_csv_rejects_wrong_feature_count),
        cmocka_unit_test(test_decode_csv_rejects_nonfinite_values),
        cmocka_unit_test(test_decode_csv_checks_reasons_in_the_documented_order),
        cmocka_unit_test(test_features_beyond_max_abs_are_rejected),
        cmocka_unit_test(test_decode_csv_rejects_oversize_records),
        cmocka_unit_test(test_decode_csv_values_equal_strtof_bit_for_bit),
        cmocka_unit_test(test_decode_csv_printed_floats_and_midpoints_equal_strtof),
        cmocka_unit_test(test_decode_csv_long_records_agree_with_the_reference),
        cmocka_unit_test(test_decode_csv_fields_whose_double_is_a_float_midpoint_equal_strtof),
        cmocka_unit_test(test_decode_csv_syntax_agrees_with_the_reference),
        cmocka_unit_test(test_decode_csv_digit_runs_of_every_length_agree_with_strtof),
        cmocka_unit_test(test_decode_libsvm_reads_sparse_features),
        cmocka_unit_test(test_decode_libsvm_allows_zero_features),
        cmocka_unit_test(test_decode_libsvm_rejects_indices_out_of_range),
        cmocka_unit_test(test_decode_libsvm_rejects_malformed_tokens),
        cmocka_unit_test(test_decode_libsvm_rejects_nonfinite_values),
        cmocka_unit_test(test_decode_libsvm_never_reads_past_the_record),
        cmocka_unit_test(test_decode_f32_reads_little_endian_values_at_any_alignment),
        cmocka_unit_test(test_decode_f32_rejects_wrong_lengths),
        cmocka_unit_test(test_decode_f32_rejects_nonfinite_values),
        cmocka_unit_test(test_decode_f32_finds_a_bad_value_at_every_position),
        cmocka_unit_test(test_decode_f32_is_oversize_only_with_an_explicit_limit),
        cmocka_unit_test(test_class_labels_are_integers_below_classes),
        cmocka_unit_test(test_binary_labels_lie_in_the_unit_interval),
        cmocka_unit_test(test_real_labels_accept_any_finite_value),
        cmocka_unit_test(test_decode_refuses_idx_records_and_schemas_without_features),
        cmocka_unit_test(test_encode_then_decode_gives_back_the_same_bits_in_all_formats),
        cmocka_unit_test(test_encode_writes_the_documented_text),
        cmocka_unit_test(test_encode_returns_zero_when_the_buffer_is_too_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
