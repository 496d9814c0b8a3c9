/*
 * replayspec.c - replay requests: the verbs of kafka-consumer-groups
 * --reset-offsets turned into a symbolic request, the text form the store
 * keeps and back, and the questions a plan asks of a request (docs/design.md
 * "Replay"). Pure: libc only; no Kafka, no Redis, and no process time zone
 * (dates are converted with our own civil-calendar arithmetic).
 *
 * The stored text comes back from Redis, so its parser trusts nothing: it
 * reads exactly len bytes, accepts only the canonical form that
 * psstore_replay_format writes (no signs, blanks or leading zeros it would
 * not write), so that format(parse(t)) == t for every text it accepts, and
 * it range-checks every number before using it. The command-line verbs are
 * parsed as strictly, with errors that name the verb and quote the bad part.
 *
 * Times are kept as unix milliseconds between 0000-01-01T00:00:00.000Z and
 * 9999-12-31T23:59:59.999Z, the years an ISO 8601 date of four digits can
 * name; the formatter and the parser refuse anything outside.
 *
 * Threads: reentrant; a request belongs to its caller.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "psstore/positions/positions.h"

#define MS_PER_DAY  86400000LL
#define AT_MIN_MS   (-62167219200000LL) /* 0000-01-01T00:00:00.000Z */
#define AT_MAX_MS   253402300799999LL   /* 9999-12-31T23:59:59.999Z */
#define EXCERPT_MAX 40                  /* bytes of bad input quoted in an error */

/* ------------------------------------------------------------------------
 * Small helpers: characters, numbers, excerpts, the calendar.
 * ---------------------------------------------------------------------- */

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Nonzero when s[0..n) is a Kafka topic name: 1..PSSTORE_TOPIC_MAX
 * characters of [A-Za-z0-9._-], and not "." or ".." (Kafka refuses both). */
static int topic_valid(const char *s, size_t n)
{
    if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return 0;
    return psstore_topic_ok(s, n);
}

/* Nonzero when r->topic is "" or a valid NUL-terminated topic name. */
static int replay_topic_valid(const psstore_replay_t *r)
{
    const char *nul = memchr(r->topic, '\0', sizeof(r->topic));
    if (nul == NULL)
        return 0;
    size_t n = (size_t)(nul - r->topic);
    return n == 0 || topic_valid(r->topic, n);
}

/*
 * Copies at most EXCERPT_MAX bytes of s[0..n) into out for an error
 * message, each byte outside printable ASCII (and the quote) replaced by
 * '?', with "..." when cut. The input may be anything Redis or a client
 * sent; the excerpt is always safe to print.
 */
static void excerpt(char *out, size_t cap, const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && i < EXCERPT_MAX && k + 1 < cap; i++) {
        char c = s[i];
        out[k++] = (c >= 0x20 && c < 0x7f && c != '\'') ? c : '?';
    }
    if (n > EXCERPT_MAX && k + 4 < cap) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    if (cap > 0)
        out[k] = '\0';
}

/*
 * Parses s[0..n) as a decimal integer with an optional sign (when signs
 * is nonzero). Returns 0 with *v, -1 when it is not one (empty, other
 * characters), -2 when it does not fit in int64_t.
 */
static int parse_int64(const char *s, size_t n, int signs, int64_t *v)
{
    size_t i = 0;
    int neg = 0;
    if (signs && n > 0 && (s[0] == '+' || s[0] == '-')) {
        neg = s[0] == '-';
        i = 1;
    }
    if (i == n)
        return -1;
    /* accumulate as a negative number, whose range is the larger one */
    int64_t acc = 0;
    for (; i < n; i++) {
        if (!is_digit(s[i]))
            return -1;
        int d = s[i] - '0';
        if (acc < (INT64_MIN + d) / 10)
            return -2;
        acc = acc * 10 - d;
    }
    if (!neg && acc == INT64_MIN)
        return -2;
    *v = neg ? acc : -acc;
    return 0;
}

/* Parses s[0..n) as an integer exactly as "%" PRId64 writes it: no '+',
 * no leading zeros, no "-0". Returns 0 with *v, or -1. */
static int parse_canonical(const char *s, size_t n, int64_t *v)
{
    char back[24];
    if (n == 0 || n > 20 || parse_int64(s, n, 1, v) != 0)
        return -1;
    int len = snprintf(back, sizeof(back), "%" PRId64, *v);
    return (len > 0 && (size_t)len == n && memcmp(back, s, n) == 0) ? 0 : -1;
}

/* Days from 1970-01-01 to the proleptic Gregorian date y-m-d (H. Hinnant's
 * days_from_civil); valid for any year an int64_t day count can hold. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;                                   /* [0, 399]   */
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1; /* [0, 365]   */
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;           /* [0, 146096] */
    return era * 146097 + doe - 719468;
}

/* The inverse of days_from_civil (H. Hinnant's civil_from_days). */
static void civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

static int days_in_month(int64_t y, int m)
{
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : days[m - 1];
}

/* Reads exactly n digits at s as a number into *v; 0, or -1 when one of
 * them is not a digit. */
static int fixed_digits(const char *s, int n, int *v)
{
    int acc = 0;
    for (int i = 0; i < n; i++) {
        if (!is_digit(s[i]))
            return -1;
        acc = acc * 10 + (s[i] - '0');
    }
    *v = acc;
    return 0;
}

/* ------------------------------------------------------------------------
 * The verbs.
 * ---------------------------------------------------------------------- */

#define DATETIME_SHAPE "YYYY-MM-DDTHH:MM:SS[.fff][Z|+HH:MM|-HH:MM]"

/*
 * Parses "YYYY-MM-DDTHH:MM:SS[.f...][Z|+HH:MM|-HH:MM]" (no zone: UTC) into
 * unix milliseconds. The fraction may have 1 to 9 digits; digits beyond
 * the millisecond are dropped, as Kafka stamps records with the
 * millisecond the clock was in, so a record made at that instant still
 * counts as "at or after" it. Returns 0, or FR_ERR_INVAL with errstr.
 */
static fr_err_t parse_datetime(const char *arg, int64_t *at_ms, char *errstr, size_t size)
{
    char ex[EXCERPT_MAX + 8];
    size_t n = strlen(arg);
    excerpt(ex, sizeof(ex), arg, n);
    int y, mo, d, h, mi, s, ms = 0, zsign = 0, zh = 0, zm = 0;
    if (n < 19 || fixed_digits(arg, 4, &y) || arg[4] != '-' || fixed_digits(arg + 5, 2, &mo) ||
        arg[7] != '-' || fixed_digits(arg + 8, 2, &d) || arg[10] != 'T' ||
        fixed_digits(arg + 11, 2, &h) || arg[13] != ':' || fixed_digits(arg + 14, 2, &mi) ||
        arg[16] != ':' || fixed_digits(arg + 17, 2, &s))
        goto shape;
    const char *p = arg + 19, *end = arg + n;
    if (p < end && *p == '.') {
        int digits = 0;
        for (p++; p < end && is_digit(*p); p++, digits++) {
            if (digits < 3)
                ms = ms * 10 + (*p - '0');
        }
        if (digits < 1 || digits > 9)
            goto shape;
        for (; digits < 3; digits++)
            ms *= 10;
    }
    if (p < end && *p == 'Z') {
        p++;
    } else if (p < end && (*p == '+' || *p == '-')) {
        zsign = *p == '-' ? -1 : 1;
        if (end - p != 6 || fixed_digits(p + 1, 2, &zh) || p[3] != ':' ||
            fixed_digits(p + 4, 2, &zm))
            goto shape;
        p += 6;
    }
    if (p != end)
        goto shape;
    if (mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo))
        return fr_errorf(FR_ERR_INVAL, errstr, size, "to-datetime: '%s' has no such date", ex);
    if (h > 23 || mi > 59 || s > 59)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "to-datetime: '%s' has no such time", ex);
    if (zh > 23 || zm > 59)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "to-datetime: '%s' has a zone offset out of range", ex);
    /* local time = UTC + offset, so UTC = local time - offset */
    int64_t t = days_from_civil(y, mo, d) * MS_PER_DAY + ((int64_t)h * 3600 + mi * 60 + s) * 1000 +
                ms - (int64_t)zsign * (zh * 60 + zm) * 60000;
    if (t < AT_MIN_MS || t > AT_MAX_MS)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "to-datetime: '%s' is outside the years 0000 to 9999 in UTC", ex);
    *at_ms = t;
    return FR_OK;
shape:
    return fr_errorf(FR_ERR_INVAL, errstr, size, "to-datetime: '%s' is not %s", ex, DATETIME_SHAPE);
}

/* *acc += n * unit, or -1 (leaving *acc) when it would pass INT64_MAX.
 * n, unit >= 0 and *acc >= 0. */
static int add_scaled(int64_t *acc, int64_t n, int64_t unit)
{
    if (n > (INT64_MAX - *acc) / unit)
        return -1;
    *acc += n * unit;
    return 0;
}

/*
 * Reads one "<digits><unit>" part of a duration at *pp (fraction allowed
 * when frac_ok, seconds only) and adds it to *total_ms. Returns 1 when a
 * part with this unit was there, 0 when the next characters are not one
 * (*pp unchanged), -1 when it is malformed and -2 on overflow.
 */
static int duration_part(const char **pp, const char *end, char unit, int64_t unit_ms, int frac_ok,
                         int64_t *total_ms)
{
    const char *p = *pp, *q = p;
    while (q < end && is_digit(*q))
        q++;
    const char *digits_end = q;
    int64_t frac_ms = 0;
    if (frac_ok && q < end && *q == '.') {
        int nfrac = 0;
        for (q++; q < end && is_digit(*q); q++, nfrac++) {
            if (nfrac < 3)
                frac_ms = frac_ms * 10 + (*q - '0');
        }
        if (nfrac < 1 || nfrac > 9)
            return -1;
        for (; nfrac < 3; nfrac++)
            frac_ms *= 10;
    }
    if (q == end || *q != unit)
        return 0;
    if (digits_end == p)
        return -1;
    int64_t n;
    int rc = parse_int64(p, (size_t)(digits_end - p), 0, &n);
    if (rc != 0)
        return rc;
    if (add_scaled(total_ms, n, unit_ms) != 0 || add_scaled(total_ms, frac_ms, 1) != 0)
        return -2;
    *pp = q + 1;
    return 1;
}

/*
 * Parses an ISO 8601 duration "PnDTnHnMnS" as Java's Duration writes it
 * (the form kafka-consumer-groups --by-duration takes): days, then after
 * 'T' hours, minutes and seconds, each optional but at least one present,
 * seconds with an optional fraction of 1 to 9 digits. Returns 0 with
 * *dur_ms, or FR_ERR_INVAL with errstr.
 */
static fr_err_t parse_duration(const char *arg, int64_t *dur_ms, char *errstr, size_t size)
{
    char ex[EXCERPT_MAX + 8];
    size_t n = strlen(arg);
    excerpt(ex, sizeof(ex), arg, n);
    const char *p = arg, *end = arg + n;
    int64_t total = 0;
    int parts = 0, rc = 0;
    if (p == end || *p++ != 'P')
        goto shape;
    if ((rc = duration_part(&p, end, 'D', MS_PER_DAY, 0, &total)) < 0)
        goto bad;
    parts += rc;
    if (p < end && *p == 'T') {
        int tparts = 0;
        p++;
        static const struct {
            char unit;
            int64_t ms;
        } units[3] = {{'H', 3600000}, {'M', 60000}, {'S', 1000}};
        for (int i = 0; i < 3; i++) {
            if ((rc = duration_part(&p, end, units[i].unit, units[i].ms, units[i].unit == 'S',
                                    &total)) < 0)
                goto bad;
            tparts += rc;
        }
        if (tparts == 0)
            goto shape;
        parts += tparts;
    }
    if (p != end || parts == 0)
        goto shape;
    *dur_ms = total;
    return FR_OK;
bad:
    if (rc == -2)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "by-duration: '%s' is too long", ex);
shape:
    return fr_errorf(FR_ERR_INVAL, errstr, size, "by-duration: '%s' is not PnDTnHnMnS", ex);
}

/* Nonzero when parts[0..n) already lists partition. */
static int part_listed(const psstore_replay_t *r, size_t n, int32_t partition)
{
    for (size_t i = 0; i < n; i++) {
        if (r->parts[i].partition == partition)
            return 1;
    }
    return 0;
}

/*
 * Parses "P:O[,P:O...]" into r->parts: partitions in [0, INT32_MAX],
 * offsets >= 0, each partition once, at most PSSTORE_REPLAY_MAX_PARTS.
 * Returns 0, or FR_ERR_INVAL with errstr quoting the bad entry.
 */
static fr_err_t parse_offset_list(psstore_replay_t *r, const char *arg, char *errstr, size_t size)
{
    char ex[EXCERPT_MAX + 8];
    const char *p = arg;
    r->nparts = 0;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        int64_t part = 0, off = 0;
        int rp = -1, ro = -1;
        if (colon != NULL) {
            size_t plen = (size_t)(colon - p);
            rp = parse_int64(p, plen, 1, &part);
            ro = parse_int64(colon + 1, len - plen - 1, 1, &off);
        }
        excerpt(ex, sizeof(ex), p, len);
        if (rp == -1 || ro == -1)
            return fr_errorf(FR_ERR_INVAL, errstr, size, "to-offset: '%s' is not P:O", ex);
        if (rp != 0 || part < 0 || part > INT32_MAX)
            return fr_errorf(FR_ERR_INVAL, errstr, size, "to-offset: '%s': partitions are 0 to %d",
                             ex, INT32_MAX);
        if (ro != 0 || off < 0)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "to-offset: '%s': offsets are 0 to %" PRId64, ex, INT64_MAX);
        if (part_listed(r, r->nparts, (int32_t)part))
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "to-offset: partition %" PRId64 " is listed twice", part);
        if (r->nparts == PSSTORE_REPLAY_MAX_PARTS)
            return fr_errorf(FR_ERR_INVAL, errstr, size, "to-offset: more than %d partitions",
                             PSSTORE_REPLAY_MAX_PARTS);
        r->parts[r->nparts].partition = (int32_t)part;
        r->parts[r->nparts].offset = off;
        r->nparts++;
        if (comma == NULL)
            return FR_OK;
        p = comma + 1;
    }
}

/*
 * Builds r from a verb and its argument (see positions.h). r is zeroed first,
 * so its topic is "". Returns FR_OK, or FR_ERR_INVAL with errstr naming
 * the verb and quoting what is wrong; r then holds nothing useful.
 */
fr_err_t psstore_replay_from_verb(psstore_replay_t *r, const char *verb, const char *arg,
                                  int64_t now_ms, char *errstr, size_t size)
{
    if (r == NULL || verb == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "replay: no verb");
    memset(r, 0, sizeof(*r));
    int no_arg = strcmp(verb, "to-earliest") == 0 || strcmp(verb, "to-latest") == 0;
    int takes_arg = strcmp(verb, "to-offset") == 0 || strcmp(verb, "to-datetime") == 0 ||
                    strcmp(verb, "by-duration") == 0 || strcmp(verb, "shift-by") == 0;
    if (!no_arg && !takes_arg) {
        char ex[EXCERPT_MAX + 8];
        excerpt(ex, sizeof(ex), verb, strlen(verb));
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "replay: unknown verb '%s' (to-earliest, to-latest, to-offset, "
                         "to-datetime, by-duration or shift-by)",
                         ex);
    }
    if (no_arg && arg != NULL && arg[0] != '\0')
        return fr_errorf(FR_ERR_INVAL, errstr, size, "%s: takes no argument", verb);
    if (takes_arg && (arg == NULL || arg[0] == '\0'))
        return fr_errorf(FR_ERR_INVAL, errstr, size, "%s: needs an argument", verb);

    if (strcmp(verb, "to-earliest") == 0) {
        r->kind = PSSTORE_REPLAY_EARLIEST;
    } else if (strcmp(verb, "to-latest") == 0) {
        r->kind = PSSTORE_REPLAY_LATEST;
    } else if (strcmp(verb, "to-offset") == 0) {
        r->kind = PSSTORE_REPLAY_OFFSET;
        return parse_offset_list(r, arg, errstr, size);
    } else if (strcmp(verb, "to-datetime") == 0) {
        r->kind = PSSTORE_REPLAY_DATETIME;
        return parse_datetime(arg, &r->at_ms, errstr, size);
    } else if (strcmp(verb, "by-duration") == 0) {
        int64_t dur = 0;
        fr_err_t err = parse_duration(arg, &dur, errstr, size);
        if (err != FR_OK)
            return err;
        /* dur >= 0 and AT_MIN_MS < 0: neither sum nor difference overflows */
        if (now_ms < AT_MIN_MS + dur || now_ms - dur > AT_MAX_MS)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "by-duration: the target falls outside the years 0000 to 9999");
        r->kind = PSSTORE_REPLAY_DATETIME;
        r->at_ms = now_ms - dur;
    } else {
        char ex[EXCERPT_MAX + 8];
        excerpt(ex, sizeof(ex), arg, strlen(arg));
        int rc = parse_int64(arg, strlen(arg), 1, &r->shift);
        if (rc == -1)
            return fr_errorf(FR_ERR_INVAL, errstr, size, "shift-by: '%s' is not an integer", ex);
        if (rc == -2)
            return fr_errorf(FR_ERR_INVAL, errstr, size, "shift-by: '%s' is out of range", ex);
        r->kind = PSSTORE_REPLAY_SHIFT;
    }
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * The stored text.
 * ---------------------------------------------------------------------- */

/* An append-only writer into a caller's buffer that remembers overflow. */
typedef struct writer {
    char *buf;
    size_t size, len;
    int overflow;
} writer_t;

static void FR_PRINTF(2, 3) put(writer_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = w->len < w->size ? w->size - w->len : 0;
    int n = vsnprintf(room > 0 ? w->buf + w->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= room)
        w->overflow = 1;
    else
        w->len += (size_t)n;
}

/*
 * Nonzero when r is a request that psstore_replay_parse could read back:
 * a known kind, at_ms within the years 0000..9999 for DATETIME, 1 to
 * PSSTORE_REPLAY_MAX_PARTS distinct partitions >= 0 with offsets >= 0 for
 * OFFSET, and a valid topic or "".
 */
static int replay_valid(const psstore_replay_t *r)
{
    if (!replay_topic_valid(r))
        return 0;
    switch (r->kind) {
    case PSSTORE_REPLAY_EARLIEST:
    case PSSTORE_REPLAY_LATEST:
    case PSSTORE_REPLAY_SHIFT: return 1;
    case PSSTORE_REPLAY_DATETIME: return r->at_ms >= AT_MIN_MS && r->at_ms <= AT_MAX_MS;
    case PSSTORE_REPLAY_OFFSET:
        if (r->nparts < 1 || r->nparts > PSSTORE_REPLAY_MAX_PARTS)
            return 0;
        for (size_t i = 0; i < r->nparts; i++) {
            if (r->parts[i].partition < 0 || r->parts[i].offset < 0 ||
                part_listed(r, i, r->parts[i].partition))
                return 0;
        }
        return 1;
    }
    return 0;
}

/*
 * Writes r's stored text into buf (see positions.h). Returns FR_OK,
 * FR_ERR_RANGE when it does not fit in size bytes, or FR_ERR_INVAL when r
 * is not a request the parser would accept back (unknown kind, bad topic,
 * an OFFSET list that is empty, too long, negative or repeats a
 * partition). On error buf holds "" (when size > 0).
 */
fr_err_t psstore_replay_format(const psstore_replay_t *r, char *buf, size_t size)
{
    if (buf == NULL && size > 0)
        return FR_ERR_INVAL;
    writer_t w = {buf, size, 0, 0};
    if (r == NULL || !replay_valid(r)) {
        if (size > 0)
            buf[0] = '\0';
        return FR_ERR_INVAL;
    }
    switch (r->kind) {
    case PSSTORE_REPLAY_EARLIEST: put(&w, "earliest"); break;
    case PSSTORE_REPLAY_LATEST: put(&w, "latest"); break;
    case PSSTORE_REPLAY_DATETIME: put(&w, "datetime:%" PRId64, r->at_ms); break;
    case PSSTORE_REPLAY_SHIFT: put(&w, "shift:%" PRId64, r->shift); break;
    case PSSTORE_REPLAY_OFFSET:
        put(&w, "offset:");
        for (size_t i = 0; i < r->nparts && !w.overflow; i++)
            put(&w, "%s%" PRId32 "=%" PRId64, i > 0 ? "," : "", r->parts[i].partition,
                r->parts[i].offset);
        break;
    }
    if (r->topic[0] != '\0')
        put(&w, " topic=%s", r->topic);
    if (w.overflow) {
        if (size > 0)
            buf[0] = '\0';
        return FR_ERR_RANGE;
    }
    return FR_OK;
}

/* Nonzero when s[0..n) is exactly the NUL-terminated word. */
static int equals(const char *s, size_t n, const char *word)
{
    return strlen(word) == n && memcmp(s, word, n) == 0;
}

/* Nonzero when s[0..n) starts with prefix. */
static int starts(const char *s, size_t n, const char *prefix)
{
    size_t k = strlen(prefix);
    return n >= k && memcmp(s, prefix, k) == 0;
}

/*
 * Parses the "P=O,P=O" list of a stored OFFSET request (s[0..n)) into r.
 * Returns 0 or -1 with why set to a static reason.
 */
static int parse_stored_parts(psstore_replay_t *r, const char *s, size_t n, const char **why)
{
    const char *p = s, *end = s + n;
    r->nparts = 0;
    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *item_end = comma != NULL ? comma : end;
        const char *eq = memchr(p, '=', (size_t)(item_end - p));
        int64_t part, off;
        if (eq == NULL || parse_canonical(p, (size_t)(eq - p), &part) != 0 ||
            parse_canonical(eq + 1, (size_t)(item_end - eq - 1), &off) != 0) {
            *why = "an entry is not P=O";
            return -1;
        }
        if (part < 0 || part > INT32_MAX || off < 0) {
            *why = "a partition or offset is out of range";
            return -1;
        }
        if (part_listed(r, r->nparts, (int32_t)part)) {
            *why = "a partition is listed twice";
            return -1;
        }
        if (r->nparts == PSSTORE_REPLAY_MAX_PARTS) {
            *why = "too many partitions";
            return -1;
        }
        r->parts[r->nparts].partition = (int32_t)part;
        r->parts[r->nparts].offset = off;
        r->nparts++;
        if (comma == NULL)
            return 0;
        p = comma + 1;
    }
}

/*
 * Parses a stored request (see positions.h): exactly the text
 * psstore_replay_format writes, nothing else. r is zeroed first. Returns
 * FR_OK, or FR_ERR_INVAL with errstr saying what is wrong and quoting the
 * start of the text (non-printable bytes shown as '?').
 */
fr_err_t psstore_replay_parse(psstore_replay_t *r, const char *text, size_t len, char *errstr,
                              size_t size)
{
    char ex[EXCERPT_MAX + 8];
    const char *why = "unknown kind";
    if (r == NULL || (text == NULL && len > 0))
        return fr_errorf(FR_ERR_INVAL, errstr, size, "replay: no request");
    memset(r, 0, sizeof(*r));
    excerpt(ex, sizeof(ex), text, len);

    /* " topic=T" after the first blank; topic characters exclude blanks */
    const char *blank = len > 0 ? memchr(text, ' ', len) : NULL;
    size_t body = blank != NULL ? (size_t)(blank - text) : len;
    if (blank != NULL) {
        if (!starts(blank, len - body, " topic=") || !topic_valid(blank + 7, len - body - 7)) {
            why = "bad topic";
            goto err;
        }
        size_t tlen = len - body - 7;
        memcpy(r->topic, blank + 7, tlen);
        r->topic[tlen] = '\0';
    }

    int64_t v;
    if (equals(text, body, "earliest")) {
        r->kind = PSSTORE_REPLAY_EARLIEST;
    } else if (equals(text, body, "latest")) {
        r->kind = PSSTORE_REPLAY_LATEST;
    } else if (starts(text, body, "datetime:")) {
        if (parse_canonical(text + 9, body - 9, &v) != 0 || v < AT_MIN_MS || v > AT_MAX_MS) {
            why = "bad datetime";
            goto err;
        }
        r->kind = PSSTORE_REPLAY_DATETIME;
        r->at_ms = v;
    } else if (starts(text, body, "shift:")) {
        if (parse_canonical(text + 6, body - 6, &v) != 0) {
            why = "bad shift";
            goto err;
        }
        r->kind = PSSTORE_REPLAY_SHIFT;
        r->shift = v;
    } else if (starts(text, body, "offset:")) {
        r->kind = PSSTORE_REPLAY_OFFSET;
        if (parse_stored_parts(r, text + 7, body - 7, &why) != 0)
            goto err;
    } else {
        goto err;
    }
    return FR_OK;
err:
    memset(r, 0, sizeof(*r));
    return fr_errorf(FR_ERR_INVAL, errstr, size, "replay: '%s' is not a stored request: %s", ex,
                     why);
}

/* ------------------------------------------------------------------------
 * Questions of a request.
 * ---------------------------------------------------------------------- */

/*
 * Nonzero when r moves topic/partition (see positions.h). A request with a
 * topic matches only that topic; a NULL topic matches only a request with
 * none. For OFFSET, *offset (when offset is not NULL) receives the listed
 * offset; otherwise *offset is left alone.
 */
int psstore_replay_applies(const psstore_replay_t *r, const char *topic, int32_t partition,
                           int64_t *offset)
{
    if (r == NULL || partition < 0 || !replay_topic_valid(r))
        return 0;
    if (r->topic[0] != '\0' && (topic == NULL || strcmp(r->topic, topic) != 0))
        return 0;
    if (r->kind != PSSTORE_REPLAY_OFFSET)
        return 1;
    size_t n = r->nparts <= PSSTORE_REPLAY_MAX_PARTS ? r->nparts : PSSTORE_REPLAY_MAX_PARTS;
    for (size_t i = 0; i < n; i++) {
        if (r->parts[i].partition == partition) {
            if (offset != NULL)
                *offset = r->parts[i].offset;
            return 1;
        }
    }
    return 0;
}

/*
 * Writes a one-line description of r's target for partition into buf
 * (see positions.h), cut to size. An OFFSET request that does not list the
 * partition reads "unchanged (partition P not listed)"; a shift of zero
 * reads "watermark + 0". Never fails; buf NULL or size 0 writes nothing.
 */
void psstore_replay_describe(const psstore_replay_t *r, int32_t partition, char *buf, size_t size)
{
    if (buf == NULL || size == 0)
        return;
    if (r == NULL) {
        snprintf(buf, size, "nothing");
        return;
    }
    int64_t off;
    switch (r->kind) {
    case PSSTORE_REPLAY_EARLIEST: snprintf(buf, size, "earliest"); return;
    case PSSTORE_REPLAY_LATEST: snprintf(buf, size, "latest"); return;
    case PSSTORE_REPLAY_OFFSET:
        if (psstore_replay_applies(r, r->topic, partition, &off))
            snprintf(buf, size, "offset %" PRId64, off);
        else
            snprintf(buf, size, "unchanged (partition %" PRId32 " not listed)", partition);
        return;
    case PSSTORE_REPLAY_SHIFT:
        if (r->shift < 0) /* negated as unsigned: INT64_MIN has no positive twin */
            snprintf(buf, size, "watermark - %" PRIu64, -(uint64_t)r->shift);
        else
            snprintf(buf, size, "watermark + %" PRId64, r->shift);
        return;
    case PSSTORE_REPLAY_DATETIME: {
        if (r->at_ms < AT_MIN_MS || r->at_ms > AT_MAX_MS) {
            snprintf(buf, size, "first record at or after %" PRId64 " ms", r->at_ms);
            return;
        }
        int64_t days = r->at_ms / MS_PER_DAY, rem = r->at_ms % MS_PER_DAY, y;
        if (rem < 0) {
            rem += MS_PER_DAY;
            days--;
        }
        int m, d;
        civil_from_days(days, &y, &m, &d);
        snprintf(buf, size, "first record at or after %04" PRId64 "-%02d-%02dT%02d:%02d:%02d.%03dZ",
                 y, m, d, (int)(rem / 3600000), (int)(rem / 60000 % 60), (int)(rem / 1000 % 60),
                 (int)(rem % 1000));
        return;
    }
    }
    snprintf(buf, size, "unknown replay kind %d", (int)r->kind);
}
