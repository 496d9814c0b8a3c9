/*
 * codec.c - the record codecs: csv, libsvm and f32 records into one sample
 * (x[D], y), with every malformed record answered by a named reason.
 *
 * Records come from Kafka and are not NUL-terminated: nothing here reads
 * past rec + len, and numbers are parsed from a bounded copy. Everything is
 * reentrant (no state, no locale changes). Numbers follow strtof() in the
 * current LC_NUMERIC locale; freshet never changes it from "C", so the
 * decimal point is '.'.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "ingest/ingest.h"
#include "ingest/ingest_int.h"

static const char *const format_names[] = {"csv", "libsvm", "f32", "idx"};

static const char *const reject_names[INGEST_REJECT_COUNT] = {
    "ok",        "bad_number", "feature_count", "index_range", "label_range",
    "nonfinite", "oversize",   "magnitude",     "quarantined",
};

fr_err_t ingest_format_parse(const char *name, ingest_format_t *format)
{
    if (name == NULL || format == NULL)
        return FR_ERR_INVAL;
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, format_names[i]) == 0) {
            *format = (ingest_format_t)i;
            return FR_OK;
        }
    }
    return FR_ERR_INVAL;
}

const char *ingest_format_name(ingest_format_t format)
{
    return (unsigned)format < 4 ? format_names[format] : "unknown";
}

const char *ingest_reject_name(ingest_reject_t reason)
{
    return (unsigned)reason < INGEST_REJECT_COUNT ? reject_names[reason] : "unknown";
}

size_t ingest_text_limit(const ingest_schema_t *schema)
{
    return schema->max_record != 0 ? schema->max_record : INGEST_DEFAULT_MAX_RECORD;
}

/*
 * The label rule of the schema (see ingest_int.h). Classes are compared in
 * double so that a very large class count is not rounded by float.
 */
ingest_reject_t ingest_label_check(const ingest_schema_t *schema, float y)
{
    if (!isfinite(y))
        return INGEST_REJECT_NONFINITE;
    switch (schema->label) {
    case INGEST_LABEL_CLASS:
        if (y < 0.0f || y != floorf(y) || (double)y >= (double)schema->classes)
            return INGEST_REJECT_LABEL_RANGE;
        return INGEST_OK;
    case INGEST_LABEL_BINARY: return y >= 0.0f && y <= 1.0f ? INGEST_OK : INGEST_REJECT_LABEL_RANGE;
    case INGEST_LABEL_REAL: return INGEST_OK;
    }
    return INGEST_REJECT_LABEL_RANGE; /* an unknown label kind accepts nothing */
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t';
}

#if FLT_EVAL_METHOD == 0
/* Powers of ten that float holds exactly (5^10 < 2^24). */
static const float pow10_exact[11] = {1e0f, 1e1f, 1e2f, 1e3f, 1e4f, 1e5f,
                                      1e6f, 1e7f, 1e8f, 1e9f, 1e10f};

/* Powers of ten that double holds exactly (5^22 < 2^53). */
static const double pow10_double[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                        1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                        1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/*
 * The value of the decimal m x 10^e, negated when neg, if it can be had
 * exactly (the two cases below); 0 when the general parser must decide.
 * Always inlined: called once a field, a call and its result through
 * memory cost a record of small integers about a quarter of its time.
 */
static inline __attribute__((always_inline)) int fast_value(uint64_t m, int e, int neg, float *out)
{
    float v;
    if (m == 0) {
        v = 0.0f;
    } else if (m <= (UINT64_C(1) << 24) && e <= 0 && e >= -10) {
        v = (float)m / pow10_exact[-e];
    } else {
        if (m >= (UINT64_C(1) << 53) || e < -22 || e > 22)
            return 0;
        double d = e >= 0 ? (double)m * pow10_double[e] : (double)m / pow10_double[-e];
        if (!(d >= FLT_MIN && d <= FLT_MAX))
            return 0;
        uint64_t bits;
        memcpy(&bits, &d, sizeof(bits));
        /* 29 bits of the double's fraction fall below a float's: a value of
         * exactly 1 << 28 there is a midpoint between two floats */
        if ((bits & ((UINT64_C(1) << 29) - 1)) == (UINT64_C(1) << 28))
            return 0;
        v = (float)d;
    }
    *out = neg ? -v : v;
    return 1;
}

/*
 * The fast path of parse_number(): a decimal ("-12", "0.5", "255.",
 * "1.23456789e-05") whose digits form an integer m with a decimal exponent
 * E. Two exact cases (Clinger's fast path):
 *  - m <= 2^24 and -10 <= E <= 0: m and 10^-E are exact floats, so the one
 *    float division is what a correctly rounded strtof() returns;
 *  - m < 2^53 and |E| <= 22: m and 10^|E| are exact doubles, so d = m x
 *    10^E is the correctly rounded double of the decimal. Rounding d to
 *    float then gives strtof()'s float unless d sits exactly on a midpoint
 *    between two floats (no float midpoint can lie strictly between the
 *    decimal and its nearest double, since midpoints are doubles); that
 *    case, subnormal and out-of-range results go to strtof().
 * Returns 1 with *out set, or 0 when the field needs the general parser.
 * Only used where float arithmetic is evaluated in its own type
 * (FLT_EVAL_METHOD == 0), so no extra rounding creeps in.
 */
static int parse_fast(const char *p, size_t len, float *out)
{
    size_t i = 0;
    int neg = 0, digits = 0, frac = -1, e10 = 0;
    uint64_t m = 0;

    if (p[0] == '-' || p[0] == '+') {
        neg = p[0] == '-';
        i = 1;
    }
    for (; i < len; i++) {
        char c = p[i];
        if (c >= '0' && c <= '9') {
            if (m > (UINT64_MAX - 9) / 10)
                return 0;
            m = m * 10 + (uint64_t)(c - '0');
            digits++;
            if (frac >= 0)
                frac++;
        } else if (c == '.' && frac < 0) {
            frac = 0;
        } else if ((c == 'e' || c == 'E') && digits > 0) {
            break;
        } else {
            return 0;
        }
    }
    if (digits == 0)
        return 0;
    if (i < len) { /* the exponent: 'e', an optional sign, 1 to 4 digits */
        int eneg = 0, edigits = 0;
        if (++i < len && (p[i] == '-' || p[i] == '+'))
            eneg = p[i++] == '-';
        for (; i < len; i++) {
            if (p[i] < '0' || p[i] > '9' || ++edigits > 4)
                return 0;
            e10 = e10 * 10 + (p[i] - '0');
        }
        if (edigits == 0)
            return 0;
        if (eneg)
            e10 = -e10;
    }
    return fast_value(m, e10 - (frac < 0 ? 0 : frac), neg, out);
}

/*
 * The run of digits at t (up to end) appended to *m (m x 10 + digit, each),
 * returning where the run ends. Eight bytes that are all digits are taken
 * at once (SWAR, the bytes of one 64-bit word, the first character in the
 * low byte): XOR with '0' turns a digit into its value 0..9 and any other
 * byte into 10..255, and adding 0x76 to a byte's low seven bits sets its
 * top bit exactly when they are 10 or more, with no carry into the next
 * byte; then pairs, fours and eights of digits are combined by three
 * multiplications. The loop goes on while a whole word is digits (a branch
 * taken, not a length computed from the data, so the next load does not
 * wait for this one) and the last bytes go one at a time. %.9g's fractions
 * ("0.123456791") are one word and a digit or two: csv decodes about a
 * quarter faster. m wraps past 19 digits; the caller declines those.
 */
static inline __attribute__((always_inline)) const char *scan_digits(const char *t, const char *end,
                                                                     uint64_t *m)
{
    uint64_t acc = *m;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t ones = UINT64_C(0x0101010101010101);
    while (end - t >= 8) {
        uint64_t a;
        memcpy(&a, t, sizeof(a));
        a ^= ones * '0';
        if (((((a & (ones * 0x7f)) + ones * 0x76) | a) & (ones * 0x80)) != 0)
            break;             /* not eight digits */
        a = a * 10 + (a >> 8); /* byte 2i: digits 2i and 2i + 1 */
        a = (((a & UINT64_C(0x000000ff000000ff)) * (100 + (UINT64_C(1000000) << 32))) +
             (((a >> 16) & UINT64_C(0x000000ff000000ff)) * (1 + (UINT64_C(10000) << 32)))) >>
            32;
        acc = acc * 100000000 + a;
        t += 8;
    }
#endif
    while (t < end && (unsigned)(*t - '0') < 10u)
        acc = acc * 10 + (uint64_t)(*t++ - '0');
    *m = acc;
    return t;
}

/*
 * csv's fused scanner: one pass over the field that starts at p (blanks,
 * an optional sign, digits with at most one '.', an optional exponent of 1
 * to 4 digits, blanks) up to its ',' or the record's end, the value made
 * by fast_value. *next receives the position after the ',', or NULL at the
 * record's end. Returns 0, having decided nothing, for any other form or
 * a value fast_value declines: the caller then takes the field the general
 * way, so the two agree on every input.
 */
static int scan_csv_field(const char *p, const char *end, float *out, const char **next)
{
    while (p < end && is_blank(*p))
        p++;
    int neg = 0;
    if (p < end && (*p == '-' || *p == '+'))
        neg = *p++ == '-';
    uint64_t m = 0;
    const char *t = p;
    while (t < end && (unsigned)(*t - '0') < 10u)
        m = m * 10 + (uint64_t)(*t++ - '0');
    int digits = (int)(t - p), frac = 0;
    if (t < end && *t == '.') {
        const char *f = ++t;
        t = scan_digits(t, end, &m); /* integer parts, mostly 1-3 digits, go one by one */
        frac = (int)(t - f);
    }
    digits += frac;
    if (digits == 0 || digits > 19) /* 19 digits cannot overflow m */
        return 0;
    int e10 = 0;
    if (t < end && (*t == 'e' || *t == 'E')) {
        int eneg = 0, edigits = 0;
        if (++t < end && (*t == '-' || *t == '+'))
            eneg = *t++ == '-';
        for (; t < end && (unsigned)(*t - '0') < 10u; t++) {
            if (++edigits > 4)
                return 0;
            e10 = e10 * 10 + (*t - '0');
        }
        if (edigits == 0)
            return 0;
        if (eneg)
            e10 = -e10;
    }
    while (t < end && is_blank(*t))
        t++;
    if ((t < end && *t != ',') || !fast_value(m, e10 - frac, neg, out))
        return 0;
    *next = t < end ? t + 1 : NULL;
    return 1;
}
#else
static int parse_fast(const char *p, size_t len, float *out)
{
    (void)p;
    (void)len;
    (void)out;
    return 0;
}

static int scan_csv_field(const char *p, const char *end, float *out, const char **next)
{
    (void)p;
    (void)end;
    (void)out;
    (void)next;
    return 0;
}
#endif

/*
 * Parses the number in [p, p + len), whose surrounding blanks are already
 * trimmed, with strtof()'s semantics: the whole field must be one number
 * ("1e-3", "-0", "nan", "inf" and hex floats included). Returns 0 with the
 * value (possibly NaN or infinite) in *out, or -1 when the field is empty,
 * longer than INGEST_MAX_NUMBER, or not entirely a number.
 */
static int parse_number(const char *p, size_t len, float *out)
{
    char buf[INGEST_MAX_NUMBER + 1];
    char *end;

    if (len == 0 || len > INGEST_MAX_NUMBER)
        return -1;
    if (parse_fast(p, len, out))
        return 0;
    /* strtof would skip leading white space of any kind; a field may not. */
    if (p[0] == ' ' || (p[0] >= '\t' && p[0] <= '\r'))
        return -1;
    memcpy(buf, p, len);
    buf[len] = '\0';
    float v = strtof(buf, &end);
    if (end != buf + len)
        return -1; /* trailing junk, an embedded NUL, or no number at all */
    *out = v;
    return 0;
}

/*
 * The checks every decoder ends with, in the documented order: non-finite
 * features or label, then the label rule. Stores the label, normalising a
 * class label of -0 to +0.
 */
static ingest_reject_t finish(const ingest_schema_t *schema, float label, int nonfinite, float *y)
{
    if (nonfinite)
        return INGEST_REJECT_NONFINITE;
    ingest_reject_t r = ingest_label_check(schema, label);
    if (r != INGEST_OK)
        return r;
    *y = schema->label == INGEST_LABEL_CLASS ? label + 0.0f : label;
    return INGEST_OK;
}

/*
 * One csv field at p: the fused scanner, else the field as a whole through
 * strtof. Sets *v, and *next to the position after the field's ',' (NULL
 * when it is the record's last). Returns -1 when the field is no number.
 */
static int csv_field(const char *p, const char *end, float *v, const char **next)
{
    if (scan_csv_field(p, end, v, next))
        return 0;
    const char *comma = memchr(p, ',', (size_t)(end - p));
    const char *s = p, *e = comma != NULL ? comma : end;
    while (s < e && is_blank(*s))
        s++;
    while (e > s && is_blank(e[-1]))
        e--;
    if (parse_number(s, (size_t)(e - s), v) != 0)
        return -1;
    *next = comma != NULL ? comma + 1 : NULL;
    return 0;
}

#if FLT_EVAL_METHOD == 0 && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CSV_SSE41 1

/*
 * csv with SSE4.1 (checked at run time), for the common form of a field:
 * an optional '-', digits with at most one '.', 1 to 15 bytes in all.
 * Two steps, so that no field waits for the one before it:
 *  - find the commas of 64 bytes at a time (four 16-byte compares, one
 *    64-bit mask), and walk the mask's bits: each gives a field's end,
 *    and the next field starts after it, known before this one is read;
 *  - read each field from one 16-byte load: byte masks of its digits, its
 *    '.' and its '-', checked against the field's length; two byte
 *    shuffles drop the sign and the '.' and move the n digits to the
 *    vector's end (zeros before them are leading zeros); three multiply-
 *    adds make two 8-digit halves, and m = high x 10^8 + low. The value
 *    is m / 10^f in double rounded to float (f: the digits after the
 *    '.'), fast_value's second case narrowed, exact as there.
 * A field of any other form (blanks, '+', an exponent, "nan", more than 15
 * bytes, a malformed one), one whose double lies on a float midpoint, and
 * the fields after the last 64-byte block that ends 16 bytes or more
 * before the record's end go to csv_field, so both paths agree on every
 * input (test_codec decides long records of random fields against a
 * field-by-field strtof reference; fuzz_codec looks for reads past the
 * record). The scalar scanner takes about 190 instructions for a field of
 * "0.123456791", this one about 100 (callgrind; docs/design.md "The csv
 * decoder").
 */

/* csv_drop[s][dot]: the shuffle that drops a sign (s = 1: byte 0) and the
 * '.' at byte dot (16: none), moving the bytes after them down. */
#define CSV_DROP_AT(s, dot, j) ((j) + (s) + ((j) + (s) >= (dot)))
#define CSV_DROP(s, dot, j)    (CSV_DROP_AT(s, dot, j) > 15 ? 0x80 : CSV_DROP_AT(s, dot, j))
#define CSV_DROP_ROW(s, dot)                                                                       \
    {                                                                                              \
        CSV_DROP(s, dot, 0), CSV_DROP(s, dot, 1), CSV_DROP(s, dot, 2), CSV_DROP(s, dot, 3),        \
            CSV_DROP(s, dot, 4), CSV_DROP(s, dot, 5), CSV_DROP(s, dot, 6), CSV_DROP(s, dot, 7),    \
            CSV_DROP(s, dot, 8), CSV_DROP(s, dot, 9), CSV_DROP(s, dot, 10), CSV_DROP(s, dot, 11),  \
            CSV_DROP(s, dot, 12), CSV_DROP(s, dot, 13), CSV_DROP(s, dot, 14), CSV_DROP(s, dot, 15) \
    }
#define CSV_DROP_ROWS(s)                                                                           \
    {                                                                                              \
        CSV_DROP_ROW(s, 0), CSV_DROP_ROW(s, 1), CSV_DROP_ROW(s, 2), CSV_DROP_ROW(s, 3),            \
            CSV_DROP_ROW(s, 4), CSV_DROP_ROW(s, 5), CSV_DROP_ROW(s, 6), CSV_DROP_ROW(s, 7),        \
            CSV_DROP_ROW(s, 8), CSV_DROP_ROW(s, 9), CSV_DROP_ROW(s, 10), CSV_DROP_ROW(s, 11),      \
            CSV_DROP_ROW(s, 12), CSV_DROP_ROW(s, 13), CSV_DROP_ROW(s, 14), CSV_DROP_ROW(s, 15),    \
            CSV_DROP_ROW(s, 16)                                                                    \
    }
static const uint8_t csv_drop[2][17][16]
    __attribute__((aligned(16))) = {CSV_DROP_ROWS(0), CSV_DROP_ROWS(1)};

/* csv_align[n]: the shuffle that moves n bytes from the front to the end,
 * zeros before them. */
#define CSV_ALIGN(n, j) ((j) >= 16 - (n) ? (j) - (16 - (n)) : 0x80)
#define CSV_ALIGN_ROW(n)                                                                           \
    {                                                                                              \
        CSV_ALIGN(n, 0), CSV_ALIGN(n, 1), CSV_ALIGN(n, 2), CSV_ALIGN(n, 3), CSV_ALIGN(n, 4),       \
            CSV_ALIGN(n, 5), CSV_ALIGN(n, 6), CSV_ALIGN(n, 7), CSV_ALIGN(n, 8), CSV_ALIGN(n, 9),   \
            CSV_ALIGN(n, 10), CSV_ALIGN(n, 11), CSV_ALIGN(n, 12), CSV_ALIGN(n, 13),                \
            CSV_ALIGN(n, 14), CSV_ALIGN(n, 15)                                                     \
    }
static const uint8_t csv_align[17][16] __attribute__((aligned(16))) = {
    CSV_ALIGN_ROW(0),  CSV_ALIGN_ROW(1),  CSV_ALIGN_ROW(2),  CSV_ALIGN_ROW(3),  CSV_ALIGN_ROW(4),
    CSV_ALIGN_ROW(5),  CSV_ALIGN_ROW(6),  CSV_ALIGN_ROW(7),  CSV_ALIGN_ROW(8),  CSV_ALIGN_ROW(9),
    CSV_ALIGN_ROW(10), CSV_ALIGN_ROW(11), CSV_ALIGN_ROW(12), CSV_ALIGN_ROW(13), CSV_ALIGN_ROW(14),
    CSV_ALIGN_ROW(15), CSV_ALIGN_ROW(16)};

/* 10^(k - 16) for k = 16..31, and 1 below: the divisor of a field with
 * k - 16 digits after its '.', or with none (k < 16). */
static const double csv_pow10[32] = {1,   1,   1,   1,   1,    1,    1,    1,    1,    1,   1,
                                     1,   1,   1,   1,   1,    1e0,  1e1,  1e2,  1e3,  1e4, 1e5,
                                     1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};

/* The field of len bytes (1..15) at s, 16 bytes of which may be read, in
 * the common form: 1 with *out set; 0, deciding nothing, otherwise. */
__attribute__((target("sse4.1"))) static inline int csv_field_sse41(const char *s, unsigned len,
                                                                    float *out)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)s);
    __m128i t = _mm_sub_epi8(v, _mm_set1_epi8('0')); /* digits: 0..9 */
    unsigned in = (1u << len) - 1;
    unsigned digit =
        (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(t, _mm_set1_epi8(9)), t)) & in;
    unsigned dots = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('.'))) & in;
    unsigned neg = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('-'))) & 1;
    if (((in & ~(digit | dots | neg)) | (dots & (dots - 1))) != 0 || digit == 0)
        return 0; /* another byte, a second '.', or no digit */
    unsigned dot = (unsigned)__builtin_ctz(dots | 0x10000);
    unsigned n = len - neg - (dots != 0);
    /* digits after the '.': len - 1 - dot, negative when there is none */
    int frac = (int)len - 1 - (int)dot;
    t = _mm_shuffle_epi8(t, _mm_load_si128((const __m128i *)(const void *)csv_drop[neg][dot]));
    t = _mm_shuffle_epi8(t, _mm_load_si128((const __m128i *)(const void *)csv_align[n]));
    t = _mm_maddubs_epi16(t, _mm_setr_epi8(10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1));
    t = _mm_madd_epi16(t, _mm_setr_epi16(100, 1, 100, 1, 100, 1, 100, 1));
    t = _mm_packus_epi32(t, t); /* 4 values of up to 4 digits, twice */
    t = _mm_madd_epi16(t, _mm_setr_epi16(10000, 1, 10000, 1, 10000, 1, 10000, 1));
    uint64_t halves = (uint64_t)_mm_cvtsi128_si64(t);
    uint64_t m = (halves & 0xffffffffu) * 100000000 + (halves >> 32);
    /* fast_value's second case, narrowed: m < 10^15 < 2^53 (at most 15
     * digits) and 10^frac are exact doubles, so d is m / 10^frac correctly
     * rounded, a normal float when m > 0 and 0 (or -0) when m = 0 */
    double d = (double)m / csv_pow10[frac + 16];
    uint64_t bits;
    memcpy(&bits, &d, sizeof(bits));
    if ((bits & ((UINT64_C(1) << 29) - 1)) == (UINT64_C(1) << 28))
        return 0;
    float f = (float)d;
    *out = neg ? -f : f;
    return 1;
}

/*
 * The features of [p, end) that end in a ',' within whole 64-byte blocks,
 * 16 bytes or more from end, into x[k..d) (counting, not storing, those
 * past d). Returns where the first field not read starts, or NULL when a
 * field is no number; *k is the count of features read, *nonfinite set
 * when one of them was not finite.
 */
__attribute__((target("sse4.1"))) static const char *
csv_blocks_sse41(const char *p, const char *end, float *x, size_t d, size_t *k, int *nonfinite)
{
    const __m128i comma = _mm_set1_epi8(',');
    const char *s = p;
    size_t i = *k;
    /* a field ends in its block, so it starts at most 63 bytes into it: 16
     * bytes can be read from its start while 80 remain from the block's */
    for (const char *b = p; end - b >= 80; b += 64) {
        uint64_t commas = 0;
        for (int j = 0; j < 4; j++) {
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + 16 * j));
            commas |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, comma)) << (16 * j);
        }
        while (commas != 0) {
            const char *e = b + __builtin_ctzll(commas);
            commas &= commas - 1;
            size_t len = (size_t)(e - s);
            float v;
            if (len - 1 >= 15 || !csv_field_sse41(s, (unsigned)len, &v)) {
                const char *next;
                if (csv_field(s, end, &v, &next) != 0)
                    return NULL;
                if (!isfinite(v))
                    *nonfinite = 1;
            }
            if (i < d)
                x[i] = v;
            i++;
            s = e + 1;
        }
    }
    *k = i;
    return s;
}

static int csv_sse41(void)
{
    return __builtin_cpu_supports("sse4.1");
}
#endif

/*
 * "label,f1,...,fD": fields separated by ',', each optionally surrounded by
 * spaces or tabs. A malformed field is reported before a wrong field count
 * (the whole record is scanned, storing only the first D features), and
 * both before non-finite values and the label rule.
 */
static ingest_reject_t decode_csv(const ingest_schema_t *schema, const char *p, const char *end,
                                  float *x, float *y)
{
    size_t d = (size_t)schema->features, k = 0; /* features read */
    int nonfinite = 0;
    float label, v;
    const char *next;

    if (csv_field(p, end, &label, &next) != 0)
        return INGEST_REJECT_BAD_NUMBER;
    nonfinite = !isfinite(label);
#ifdef CSV_SSE41
    /* the features in whole blocks; it stops before the record's end, so
     * the last field is always read below */
    if (next != NULL && csv_sse41()) {
        next = csv_blocks_sse41(next, end, x, d, &k, &nonfinite);
        if (next == NULL)
            return INGEST_REJECT_BAD_NUMBER;
    }
#endif
    while (next != NULL) {
        if (csv_field(next, end, &v, &next) != 0)
            return INGEST_REJECT_BAD_NUMBER;
        if (!isfinite(v))
            nonfinite = 1;
        if (k < d)
            x[k] = v;
        k++;
    }
    if (k != d)
        return INGEST_REJECT_FEATURE_COUNT;
    return finish(schema, label, nonfinite, y);
}

/* The end of the token (a run of non-blank bytes) that starts at p. */
static const char *token_end(const char *p, const char *end)
{
    while (p < end && !is_blank(*p))
        p++;
    return p;
}

/*
 * A libsvm index: an optional sign and one or more decimal digits. Returns 0
 * and the value in *idx, saturated far above any feature count (a negative
 * index is returned as 0, which is out of range); -1 when malformed.
 */
static int parse_index(const char *p, const char *end, uint64_t *idx)
{
    int neg = 0;
    uint64_t v = 0;

    if (p < end && (*p == '+' || *p == '-')) {
        neg = *p == '-';
        p++;
    }
    if (p == end)
        return -1;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        if (v < (UINT64_C(1) << 40))
            v = v * 10 + (uint64_t)(*p - '0');
    }
    *idx = neg ? 0 : v;
    return 0;
}

/*
 * "label idx:val idx:val ..." separated by spaces or tabs, indices 1-based
 * and strictly increasing in 1..D, missing features 0. As in csv, every
 * token is checked for syntax before the indices are judged, and both
 * before non-finite values and the label rule.
 */
static ingest_reject_t decode_libsvm(const ingest_schema_t *schema, const char *p, const char *end,
                                     float *x, float *y)
{
    uint64_t d = (uint64_t)schema->features, prev = 0;
    int nonfinite = 0, index_bad = 0;
    float label;

    memset(x, 0, (size_t)d * sizeof(float));
    while (p < end && is_blank(*p))
        p++;
    const char *t = token_end(p, end);
    if (parse_number(p, (size_t)(t - p), &label) != 0)
        return INGEST_REJECT_BAD_NUMBER; /* also an empty record */
    nonfinite = !isfinite(label);
    for (;;) {
        uint64_t idx;
        float v;

        p = t;
        while (p < end && is_blank(*p))
            p++;
        if (p == end)
            break;
        t = token_end(p, end);
        const char *colon = memchr(p, ':', (size_t)(t - p));
        if (colon == NULL || parse_index(p, colon, &idx) != 0 ||
            parse_number(colon + 1, (size_t)(t - colon - 1), &v) != 0)
            return INGEST_REJECT_BAD_NUMBER;
        if (!isfinite(v))
            nonfinite = 1;
        if (idx == 0 || idx > d || idx <= prev) {
            index_bad = 1;
        } else {
            x[idx - 1] = v;
            prev = idx;
        }
    }
    if (index_bad)
        return INGEST_REJECT_INDEX_RANGE;
    return finish(schema, label, nonfinite, y);
}

/* A little-endian float32 at an address of any alignment. */
static float load_f32le(const unsigned char *b)
{
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

#define FLT_MAX_BITS 0x7f7fffff /* FLT_MAX's bits: above them, an infinity or a NaN */

/*
 * Whether some x[i] has a magnitude above the float whose bits are t (t >=
 * 0): with the sign bit cleared a float's bits are a nonnegative int32,
 * and finite magnitudes order as those do, above which lie the infinities
 * and then the NaNs. One pass of four-lane compares and ORs (the vector
 * extensions of GCC and clang: plain SSE2 on x86-64), where a test and
 * branch per value kept the loop scalar.
 */
static int any_magnitude_above(const float *x, size_t n, int32_t t)
{
    typedef int32_t i32x4 __attribute__((vector_size(16)));
    const i32x4 magnitude = {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX};
    const i32x4 limit = {t, t, t, t};
    i32x4 any = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        i32x4 v;
        memcpy(&v, x + i, sizeof(v));
        any |= (v & magnitude) > limit; /* -1 in a lane above the limit */
    }
    int32_t found = any[0] | any[1] | any[2] | any[3];
    for (; i < n; i++) {
        int32_t v;
        memcpy(&v, x + i, sizeof(v));
        found |= (v & INT32_MAX) > t;
    }
    return found != 0;
}

/* Exactly 4(D+1) bytes: the label, then D features, all little-endian. */
static ingest_reject_t decode_f32(const ingest_schema_t *schema, const unsigned char *p, size_t len,
                                  float *x, float *y)
{
    size_t d = (size_t)schema->features;

    if (len != 4 * (d + 1))
        return INGEST_REJECT_FEATURE_COUNT;
    float label = load_f32le(p);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(x, p + 4, 4 * d); /* the record's layout is the host's own */
#else
    for (size_t i = 0; i < d; i++)
        x[i] = load_f32le(p + 4 * (i + 1));
#endif
    int nonfinite = !isfinite(label) || any_magnitude_above(x, d, FLT_MAX_BITS);
    return finish(schema, label, nonfinite, y);
}

/*
 * Decodes one record (see ingest.h). A schema without features (or a NULL
 * schema or output) accepts nothing: every record is "feature_count". The
 * idx format has no records of its own and answers "bad_number".
 */
static ingest_reject_t decode_dense(const ingest_schema_t *schema, ingest_format_t format,
                                    const void *rec, size_t len, float *x, float *y);

ingest_reject_t ingest_decode(const ingest_schema_t *schema, ingest_format_t format,
                              const void *rec, size_t len, float *x, float *y)
{
    if (schema == NULL || schema->decode != NULL || schema->features <= 0 || x == NULL)
        return decode_dense(schema, format, rec, len, x, y);
    ingest_reject_t r = decode_dense(schema, format, rec, len, x, y);
    if (r != INGEST_OK || !(schema->max_abs > 0.0f))
        return r;
    /* after nonfinite, so every x[i] is finite: |x[i]| > max_abs exactly
     * when its magnitude bits exceed max_abs's (an infinite max_abs: never) */
    int32_t limit;
    memcpy(&limit, &schema->max_abs, sizeof(limit));
    if (any_magnitude_above(x, (size_t)schema->features, limit))
        return INGEST_REJECT_MAGNITUDE;
    return INGEST_OK;
}

/* ingest_decode without the magnitude rule. */
static ingest_reject_t decode_dense(const ingest_schema_t *schema, ingest_format_t format,
                                    const void *rec, size_t len, float *x, float *y)
{
    const char *p = rec != NULL ? (const char *)rec : "";

    if (rec == NULL)
        len = 0;
    if (schema == NULL || schema->features <= 0 || x == NULL || y == NULL)
        return INGEST_REJECT_FEATURE_COUNT;
    if (schema->decode != NULL) {
        if (len > ingest_text_limit(schema))
            return INGEST_REJECT_OVERSIZE;
        return schema->decode(schema->decode_arg, p, len, x, y);
    }
    switch (format) {
    case INGEST_FORMAT_F32:
        if (schema->max_record != 0 && len > schema->max_record)
            return INGEST_REJECT_OVERSIZE;
        return decode_f32(schema, (const unsigned char *)p, len, x, y);
    case INGEST_FORMAT_CSV:
    case INGEST_FORMAT_LIBSVM:
        if (len > ingest_text_limit(schema))
            return INGEST_REJECT_OVERSIZE;
        if (len > 0 && p[len - 1] == '\n')
            len--;
        if (len > 0 && p[len - 1] == '\r')
            len--;
        if (format == INGEST_FORMAT_CSV)
            return decode_csv(schema, p, p + len, x, y);
        return decode_libsvm(schema, p, p + len, x, y);
    case INGEST_FORMAT_IDX: break;
    }
    return INGEST_REJECT_BAD_NUMBER;
}

/*
 * Appends the shortest-safe text of v ("%.9g", which float32 reads back
 * exactly) after prefix (may be "") at buf + *off. The text is formatted
 * into a local buffer first so that a record may fill buf exactly, with no
 * room for a NUL. Returns 0, or -1 when it does not fit in cap.
 */
static int put_number(char *buf, size_t cap, size_t *off, const char *prefix, float v)
{
    char tmp[64];
    int n = snprintf(tmp, sizeof(tmp), "%s%.9g", prefix, (double)v);
    if (n < 0 || (size_t)n >= sizeof(tmp) || (size_t)n > cap - *off)
        return -1;
    memcpy(buf + *off, tmp, (size_t)n);
    *off += (size_t)n;
    return 0;
}

/* A float32 as 4 little-endian bytes at an address of any alignment. */
static void store_f32le(unsigned char *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    b[0] = (unsigned char)u;
    b[1] = (unsigned char)(u >> 8);
    b[2] = (unsigned char)(u >> 16);
    b[3] = (unsigned char)(u >> 24);
}

/*
 * Encodes one sample (see ingest.h). libsvm omits features equal to +0 but
 * writes -0 ("i:-0"), so that decoding gives back the very same bits. No
 * NUL is written. Returns 0 for a bad argument (no features, NULL x or buf)
 * as for a cap too small or the idx format; buf may then hold a partial
 * record.
 */
size_t ingest_encode(ingest_format_t format, const float *x, int features, float y, char *buf,
                     size_t cap)
{
    size_t off = 0, d = features > 0 ? (size_t)features : 0;
    char prefix[32];

    if (d == 0 || x == NULL || buf == NULL)
        return 0;
    switch (format) {
    case INGEST_FORMAT_F32:
        if (d > SIZE_MAX / 4 - 1 || cap < 4 * (d + 1))
            return 0;
        store_f32le((unsigned char *)buf, y);
        for (size_t i = 0; i < d; i++)
            store_f32le((unsigned char *)buf + 4 * (i + 1), x[i]);
        return 4 * (d + 1);
    case INGEST_FORMAT_CSV:
        if (put_number(buf, cap, &off, "", y) != 0)
            return 0;
        for (size_t i = 0; i < d; i++) {
            if (put_number(buf, cap, &off, ",", x[i]) != 0)
                return 0;
        }
        return off;
    case INGEST_FORMAT_LIBSVM:
        if (put_number(buf, cap, &off, "", y) != 0)
            return 0;
        for (size_t i = 0; i < d; i++) {
            if (x[i] == 0.0f && !signbit(x[i]))
                continue;
            snprintf(prefix, sizeof(prefix), " %zu:", i + 1);
            if (put_number(buf, cap, &off, prefix, x[i]) != 0)
                return 0;
        }
        return off;
    case INGEST_FORMAT_IDX: break;
    }
    return 0;
}
