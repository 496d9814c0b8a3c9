/*
 * msg.c - gradient messages: one entry of the freshet:{m}:grads stream,
 * encoded as XADD arguments by pushers and decoded by the applier.
 *
 * The format is grads_int.h's. Decoding is strict, bounded by the given
 * lengths (values need not be NUL-terminated) and never crashes: every
 * problem is FR_ERR_PARSE with a one-line reason, because the stream is
 * written by other processes and a bad entry must be counted, not trusted.
 * The encoder checks the same rules, so that whatever it sends decodes.
 *
 * Both directions reuse their buffers: once a message of a given size has
 * been seen, neither allocates again. Reentrant; an args or msg struct
 * belongs to one thread at a time.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/grads/grads_int.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "msg.c sends float32 payloads as they lie in memory: little-endian hosts only"
#endif

#define PS_TOPIC_MAX   249 /* Kafka's limit on a topic name                  */
#define PS_WORKER_MAX  255 /* bytes of a worker id                           */
#define PS_REASON_MAX  63  /* bytes of an n = 0 reason                       */
#define PS_LOSS_MAX    64  /* longest loss text accepted, NUL included       */
#define PS_NUM_TEXT    24  /* room for one int64 or uint64 and its NUL       */
#define PS_RANGE_FIXED 72  /* ":p:from:to," of one range, numbers included   */
#define PS_SMALL       16  /* ranges checked for overlap pairwise, not sorted */
#define PS_QUOTE       40  /* bytes of a bad value quoted in a reason        */

/* The fields of a message, in the order the encoder writes them. */
enum {
    F_EPOCH,
    F_VER,
    F_GEN,
    F_WORKER,
    F_N,
    F_LOSS,
    F_REASON,
    F_RANGES,
    F_TS,
    F_NORM,
    F_G,
    F_COUNT
};

static const char *const field_names[F_COUNT] = {
    [F_EPOCH] = "epoch", [F_VER] = "ver",   [F_GEN] = "gen",       [F_WORKER] = "worker",
    [F_N] = "n",         [F_LOSS] = "loss", [F_REASON] = "reason", [F_RANGES] = "ranges",
    [F_TS] = "ts",       [F_NORM] = "norm", [F_G] = "g",
};

/* ------------------------------------------------------------------------
 * Small checks shared by both directions. All take explicit lengths.
 * ---------------------------------------------------------------------- */

/* Formats a reason into why (which may be NULL or 0 bytes) and returns
 * FR_ERR_PARSE, so that a decode error is one statement. */
static fr_err_t bad(char *why, size_t whysize, const char *fmt, ...) FR_PRINTF(3, 4);
static fr_err_t bad(char *why, size_t whysize, const char *fmt, ...)
{
    if (why != NULL && whysize > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whysize, fmt, ap);
        va_end(ap);
    }
    return FR_ERR_PARSE;
}

/* Copies up to PS_QUOTE bytes of s[len] into out as printable text (other
 * bytes become '?', a cut is marked "..."), for quoting bad input in a
 * reason without echoing binary or unbounded data. */
static const char *quote(char out[PS_QUOTE + 4], const char *s, size_t len)
{
    size_t n = len < PS_QUOTE ? len : PS_QUOTE, i;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[i] = ch >= 0x20 && ch < 0x7f && ch != '\'' ? (char)ch : '?';
    }
    if (len > n) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
    return out;
}

/* Parses s[len] as the whole-field decimal of an unsigned integer no
 * larger than max: digits only, no sign, no spaces, no overflow. Returns 0
 * and fills *out, or -1. */
static int parse_u64(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    if (len == 0 || len > 20)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned d = (unsigned char)s[i] - (unsigned)'0';
        if (d > 9 || v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* Parses s[len] as the whole-field decimal of an int64: an optional '-'
 * and digits. Returns 0 and fills *out, or -1. */
static int parse_i64(const char *s, size_t len, int64_t *out)
{
    if (len == 0)
        return -1;
    int neg = s[0] == '-';
    uint64_t mag;
    if (parse_u64(s + neg, len - (size_t)neg, neg ? (uint64_t)INT64_MAX + 1 : INT64_MAX, &mag))
        return -1;
    *out = neg ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    return 0;
}

/* Parses the loss: a decimal float as "%.17g" writes it. Spaces, hex
 * floats and "nan(...)" are refused before strtod sees them. Returns 0,
 * -1 on bad syntax, -2 on a non-finite value (NaN, infinity, overflow). */
static int parse_loss(const char *s, size_t len, double *out)
{
    char buf[PS_LOSS_MAX];
    if (len == 0 || len >= sizeof(buf))
        return -1;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        int ok = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                 ch == '+' || ch == '-' || ch == '.';
        if (!ok || ch == 'x' || ch == 'X')
            return -1;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    double v = strtod(buf, &end);
    if (end != buf + len)
        return -1;
    if (!isfinite(v))
        return -2;
    *out = v;
    return 0;
}

/* A worker id: 1..255 bytes, no control characters (UTF-8 is fine). */
static int worker_ok(const char *s, size_t len)
{
    if (len < 1 || len > PS_WORKER_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f)
            return 0;
    }
    return 1;
}

/* An n = 0 reason: 1..63 bytes of [a-z_]. */
static int reason_ok(const char *s, size_t len)
{
    if (len < 1 || len > PS_REASON_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || s[i] == '_'))
            return 0;
    return 1;
}

/* Nonzero when a and b cover a common position of the same partition. */
static int ranges_overlap(const psstore_range_t *a, const psstore_range_t *b)
{
    return a->partition == b->partition && a->from < b->to && b->from < a->to &&
           strcmp(a->topic, b->topic) == 0;
}

/* Looks for two ranges of r[n] that overlap, comparing every pair: right
 * for the few ranges of a usual batch. Returns 1 and their indexes, or 0. */
static int find_overlap_pairwise(const psstore_range_t *r, size_t n, size_t *ia, size_t *ib)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (ranges_overlap(&r[i], &r[j])) {
                *ia = i;
                *ib = j;
                return 1;
            }
    return 0;
}

/* qsort order for the overlap check: topic, partition, from. */
static int range_cmp(const void *pa, const void *pb)
{
    const psstore_range_t *a = pa, *b = pb;
    int c = strcmp(a->topic, b->topic);
    if (c != 0)
        return c;
    if (a->partition != b->partition)
        return a->partition < b->partition ? -1 : 1;
    return a->from < b->from ? -1 : a->from > b->from;
}

/* ------------------------------------------------------------------------
 * Encoding
 * ---------------------------------------------------------------------- */

/* Makes args->text hold at least need bytes, keeping what it holds.
 * FR_ERR_NOMEM leaves it as it was. */
static fr_err_t text_reserve(ps_grad_args_t *args, size_t need)
{
    return FR_GROW(args->text, args->text_cap, need);
}

/* Refuses a message the decoder would refuse: FR_ERR_INVAL, with the
 * reason left in args->text (NUL-terminated) when it could be stored. */
static fr_err_t refuse(ps_grad_args_t *args, const char *fmt, ...) FR_PRINTF(2, 3);
static fr_err_t refuse(ps_grad_args_t *args, const char *fmt, ...)
{
    args->argc = 0;
    if (text_reserve(args, 256) == FR_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(args->text, args->text_cap, fmt, ap);
        va_end(ap);
    }
    return FR_ERR_INVAL;
}

/* Checks every rule of the format on g before anything is written, and
 * adds up the text the numbers and ranges will need into *text_len. */
static fr_err_t encode_check(ps_grad_args_t *args, const psstore_grad_t *g, size_t *text_len)
{
    if (g->n < 0)
        return refuse(args, "n = %" PRId64 " is negative", g->n);
    if (g->worker == NULL || !worker_ok(g->worker, strnlen(g->worker, PS_WORKER_MAX + 1)))
        return refuse(args, "bad worker id (1..255 bytes, no control characters)");
    if (!isfinite(g->loss_sum))
        return refuse(args, "loss %g is not finite", g->loss_sum);
    int has_reason = g->reason != NULL && g->reason[0] != '\0';
    if (g->n > 0 && has_reason)
        return refuse(args, "a reason given with n = %" PRId64 " > 0", g->n);
    if (g->n == 0 && (!has_reason || !reason_ok(g->reason, strnlen(g->reason, PS_REASON_MAX + 1))))
        return refuse(args, "n = 0 needs a reason of 1..63 bytes [a-z_]");
    if (g->n > 0 && (g->g == NULL || g->len == 0 || g->len > SIZE_MAX / sizeof(float)))
        return refuse(args, "n = %" PRId64 " without a gradient", g->n);
    if (g->n == 0 && g->len != 0)
        return refuse(args, "n = 0 with a gradient of %zu floats", g->len);
    if (g->nranges == 0 || g->ranges == NULL)
        return refuse(args, "no ranges: every batch covers positions");
    if (g->n > 0 && !(g->norm >= 0) && !isnan(g->norm))
        return refuse(args, "norm %g is negative", g->norm);
    if (g->n == 0 && g->norm != 0)
        return refuse(args, "n = 0 with a gradient norm");
    size_t need = 6 * PS_NUM_TEXT + 2 * PS_LOSS_MAX;
    for (size_t i = 0; i < g->nranges; i++) {
        const psstore_range_t *r = &g->ranges[i];
        size_t tlen = r->topic ? strnlen(r->topic, PS_TOPIC_MAX + 1) : 0;
        if (!psstore_topic_ok(r->topic, tlen))
            return refuse(args, "range %zu: bad topic (1..249 bytes [A-Za-z0-9._-])", i);
        if (r->partition < 0 || r->from < 0 || r->from >= r->to)
            return refuse(args,
                          "range %zu: bad partition %" PRId32 " or [%" PRId64 ", %" PRId64 ")", i,
                          r->partition, r->from, r->to);
        need += tlen + PS_RANGE_FIXED;
    }
    size_t ia, ib;
    if (find_overlap_pairwise(g->ranges, g->nranges, &ia, &ib))
        return refuse(args, "ranges %zu and %zu overlap", ia, ib);
    *text_len = need;
    return FR_OK;
}

/* Appends one formatted field value to args->text at *off (the caller has
 * reserved room) and records its offset and length. */
static void put(ps_grad_args_t *args, size_t *off, size_t *val_off, size_t *val_len,
                const char *fmt, ...) FR_PRINTF(5, 6);
static void put(ps_grad_args_t *args, size_t *off, size_t *val_off, size_t *val_len,
                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(args->text + *off, args->text_cap - *off, fmt, ap);
    va_end(ap);
    *val_off = *off;
    *val_len = n > 0 ? (size_t)n : 0;
    *off += *val_len;
}

/*
 * Builds "XADD key * epoch E ver V gen G worker W n N loss L [reason R]
 * ranges T:P:F:T,... [g <payload>]" into args. Numbers and the ranges
 * text are written into args->text, reused across calls; the worker, the
 * reason, the key and the payload are pointed at, not copied, so they
 * must outlive the use of args. FR_ERR_INVAL when g breaks a rule of the
 * format (args->text then holds the reason, args->argc is 0);
 * FR_ERR_NOMEM when the text buffer cannot grow.
 */
fr_err_t ps_grad_encode(ps_grad_args_t *args, const char *key, const psstore_grad_t *g)
{
    if (args == NULL)
        return FR_ERR_INVAL;
    if (key == NULL || g == NULL)
        return refuse(args, "no key or no message");
    size_t need = 0;
    fr_err_t err = encode_check(args, g, &need);
    if (err != FR_OK)
        return err;
    if (text_reserve(args, need) != FR_OK) {
        args->argc = 0;
        return FR_ERR_NOMEM;
    }
    /* Offsets first, pointers last: the text is not moved in between. */
    size_t off = 0, voff[F_COUNT] = {0}, vlen[F_COUNT] = {0};
    put(args, &off, &voff[F_EPOCH], &vlen[F_EPOCH], "%" PRIu64, g->epoch);
    put(args, &off, &voff[F_VER], &vlen[F_VER], "%" PRId64, g->version);
    put(args, &off, &voff[F_GEN], &vlen[F_GEN], "%" PRId64, g->generation);
    put(args, &off, &voff[F_N], &vlen[F_N], "%" PRId64, g->n);
    put(args, &off, &voff[F_LOSS], &vlen[F_LOSS], "%.17g", g->loss_sum);
    voff[F_RANGES] = off;
    vlen[F_RANGES] = (size_t)psstore_ranges_format(args->text + off, args->text_cap - off,
                                                   g->ranges, g->nranges);
    off += vlen[F_RANGES];
    if (g->ts_max_ms > 0)
        put(args, &off, &voff[F_TS], &vlen[F_TS], "%" PRId64 ":%" PRId64, g->ts_min_ms,
            g->ts_max_ms);
    if (g->norm != 0) /* NaN included: a slice of a non-finite gradient */
        put(args, &off, &voff[F_NORM], &vlen[F_NORM], "%.17g", g->norm);

    int argc = 0;
#define ARG(p, l)      (args->argv[argc] = (p), args->lens[argc] = (l), argc++)
#define FIELD(f, p, l) (ARG(field_names[f], strlen(field_names[f])), ARG((p), (l)))
    ARG("XADD", 4);
    ARG(key, strlen(key));
    ARG("*", 1);
    FIELD(F_EPOCH, args->text + voff[F_EPOCH], vlen[F_EPOCH]);
    FIELD(F_VER, args->text + voff[F_VER], vlen[F_VER]);
    FIELD(F_GEN, args->text + voff[F_GEN], vlen[F_GEN]);
    FIELD(F_WORKER, g->worker, strlen(g->worker));
    FIELD(F_N, args->text + voff[F_N], vlen[F_N]);
    FIELD(F_LOSS, args->text + voff[F_LOSS], vlen[F_LOSS]);
    if (g->n == 0)
        FIELD(F_REASON, g->reason, strlen(g->reason));
    FIELD(F_RANGES, args->text + voff[F_RANGES], vlen[F_RANGES]);
    if (g->ts_max_ms > 0)
        FIELD(F_TS, args->text + voff[F_TS], vlen[F_TS]);
    if (g->norm != 0)
        FIELD(F_NORM, args->text + voff[F_NORM], vlen[F_NORM]);
    if (g->n > 0)
        FIELD(F_G, (const char *)g->g, g->len * sizeof(float));
#undef FIELD
#undef ARG
    args->argc = argc;
    return FR_OK;
}

/* Frees the text buffer; args may be reused (it is zeroed). */
void ps_grad_args_fini(ps_grad_args_t *args)
{
    if (args == NULL)
        return;
    free(args->text);
    memset(args, 0, sizeof(*args));
}

/* ------------------------------------------------------------------------
 * Decoding
 * ---------------------------------------------------------------------- */

/* Makes m->ranges hold at least nranges entries (twice that: the upper
 * half is scratch for the sorted overlap check) and m->topics at least
 * topics bytes. Never shrinks. FR_ERR_NOMEM leaves both usable. */
static fr_err_t msg_reserve(ps_grad_msg_t *m, size_t nranges, size_t topics)
{
    if (nranges > SIZE_MAX / 4 / sizeof(psstore_range_t) || topics > SIZE_MAX / 4)
        return FR_ERR_NOMEM;
    if (FR_GROW(m->ranges, m->cap_ranges, 2 * nranges) != FR_OK)
        return FR_ERR_NOMEM;
    return FR_GROW(m->topics, m->cap_topics, topics);
}

/* Parses one "topic:partition:from:to" segment s[len] (range number i)
 * into *r (psstore_range_parse), copying the topic to m->topics at *toff. */
static fr_err_t decode_range(ps_grad_msg_t *m, size_t i, const char *s, size_t len, size_t *toff,
                             psstore_range_t *r, char *why, size_t whysize)
{
    char q[PS_QUOTE + 4];
    size_t tlen = 0;
    psstore_range_t v;
    switch (psstore_range_parse(s, len, &v, m->topics + *toff, m->cap_topics - *toff, &tlen)) {
    case PSSTORE_RANGE_OK: break;
    case PSSTORE_RANGE_EMPTY: return bad(why, whysize, "bad ranges: range %zu is empty", i);
    case PSSTORE_RANGE_SHAPE:
        return bad(why, whysize, "bad ranges: range %zu '%s' is not topic:partition:from:to", i,
                   quote(q, s, len));
    case PSSTORE_RANGE_TOPIC:
        return bad(why, whysize, "bad ranges: range %zu has a bad topic '%s'", i,
                   quote(q, s, tlen));
    case PSSTORE_RANGE_PARTITION: {
        const char *ps = s + tlen + 1, *pe = memchr(ps, ':', len - tlen - 1);
        return bad(why, whysize, "bad ranges: range %zu has a bad partition '%s'", i,
                   quote(q, ps, (size_t)(pe - ps)));
    }
    case PSSTORE_RANGE_POSITION:
        return bad(why, whysize, "bad ranges: range %zu '%s' has a bad position", i,
                   quote(q, s, len));
    case PSSTORE_RANGE_ORDER:
        return bad(why, whysize, "bad ranges: range %zu has from %" PRId64 " >= to %" PRId64, i,
                   v.from, v.to);
    }
    *r = v;
    *toff += tlen + 1;
    return FR_OK;
}

/* Parses the ranges value s[len] into m->ranges/m->topics and checks that
 * no two ranges overlap (the applier marks them one after the other). */
static fr_err_t decode_ranges(ps_grad_msg_t *m, const char *s, size_t len, size_t *nranges,
                              char *why, size_t whysize)
{
    if (len == 0)
        return bad(why, whysize, "bad ranges: empty (every batch covers positions)");
    size_t n = 1;
    for (size_t k = 0; k < len; k++)
        n += s[k] == ',';
    /* A segment holds its topic plus at least ":p:f:t" (6 bytes) where the
     * copy needs the topic plus a NUL: len + 1 bytes always suffice. */
    if (msg_reserve(m, n, len + 1) != FR_OK) {
        bad(why, whysize, "out of memory for %zu ranges", n);
        return FR_ERR_NOMEM;
    }
    size_t toff = 0, start = 0;
    for (size_t i = 0; i < n; i++) {
        size_t end = start;
        while (end < len && s[end] != ',')
            end++;
        fr_err_t err =
            decode_range(m, i, s + start, end - start, &toff, &m->ranges[i], why, whysize);
        if (err != FR_OK)
            return err;
        start = end + 1;
    }
    size_t ia, ib;
    if (n <= PS_SMALL) {
        if (find_overlap_pairwise(m->ranges, n, &ia, &ib))
            return bad(why, whysize, "bad ranges: ranges %zu and %zu overlap", ia, ib);
    } else {
        psstore_range_t *sorted = m->ranges + n;
        memcpy(sorted, m->ranges, n * sizeof(*sorted));
        qsort(sorted, n, sizeof(*sorted), range_cmp);
        for (size_t i = 1; i < n; i++)
            if (ranges_overlap(&sorted[i - 1], &sorted[i]))
                return bad(why, whysize, "bad ranges: two ranges of %s:%" PRId32 " overlap",
                           sorted[i].topic, sorted[i].partition);
    }
    *nranges = n;
    return FR_OK;
}

/* Finds each field's index in the entry; unknown, duplicate and missing
 * fields are refused here, before any value is looked at. */
static fr_err_t decode_index(size_t nfields, const char *const *fields, const size_t *flens,
                             const char *const *vals, const size_t *vlens, int idx[F_COUNT],
                             char *why, size_t whysize)
{
    char q[PS_QUOTE + 4];
    for (int f = 0; f < F_COUNT; f++)
        idx[f] = -1;
    if (nfields > 0 && (fields == NULL || flens == NULL || vals == NULL || vlens == NULL))
        return bad(why, whysize, "no field arrays");
    for (size_t i = 0; i < nfields; i++) {
        if ((fields[i] == NULL && flens[i] > 0) || (vals[i] == NULL && vlens[i] > 0))
            return bad(why, whysize, "field %zu has no data", i);
        int f = 0;
        while (f < F_COUNT && !(flens[i] == strlen(field_names[f]) &&
                                memcmp(fields[i], field_names[f], flens[i]) == 0))
            f++;
        if (f == F_COUNT)
            return bad(why, whysize, "unknown field '%s'", quote(q, fields[i], flens[i]));
        if (idx[f] >= 0)
            return bad(why, whysize, "duplicate field '%s'", field_names[f]);
        idx[f] = (int)i;
    }
    static const int required[] = {F_EPOCH, F_VER, F_GEN, F_WORKER, F_N, F_LOSS, F_RANGES};
    for (size_t k = 0; k < sizeof(required) / sizeof(required[0]); k++)
        if (idx[required[k]] < 0)
            return bad(why, whysize, "missing field '%s'", field_names[required[k]]);
    return FR_OK;
}

/* Parses "min:max" (Kafka timestamps of a batch's samples, unix ms) with
 * 0 < min <= max. Returns 0 or -1. */
static int parse_ts(const char *s, size_t len, int64_t *min, int64_t *max)
{
    const char *colon = memchr(s, ':', len);
    if (colon == NULL || parse_i64(s, (size_t)(colon - s), min) ||
        parse_i64(colon + 1, len - (size_t)(colon - s) - 1, max) || *min <= 0 || *min > *max)
        return -1;
    return 0;
}

/* Parses the numeric fields and the worker into g and m. */
static fr_err_t decode_scalars(ps_grad_msg_t *m, psstore_grad_t *g, const int idx[F_COUNT],
                               const char *const *vals, const size_t *vlens, char *why,
                               size_t whysize)
{
    char q[PS_QUOTE + 4];
#define VAL(f) vals[idx[f]], vlens[idx[f]]
    if (parse_u64(VAL(F_EPOCH), UINT64_MAX, &g->epoch))
        return bad(why, whysize, "bad epoch '%s'", quote(q, VAL(F_EPOCH)));
    if (parse_i64(VAL(F_VER), &g->version))
        return bad(why, whysize, "bad ver '%s'", quote(q, VAL(F_VER)));
    if (parse_i64(VAL(F_GEN), &g->generation))
        return bad(why, whysize, "bad gen '%s'", quote(q, VAL(F_GEN)));
    if (parse_i64(VAL(F_N), &g->n) || g->n < 0)
        return bad(why, whysize, "bad n '%s'", quote(q, VAL(F_N)));
    int rc = parse_loss(VAL(F_LOSS), &g->loss_sum);
    if (rc == -2)
        return bad(why, whysize, "loss '%s' is not finite", quote(q, VAL(F_LOSS)));
    if (rc != 0)
        return bad(why, whysize, "bad loss '%s'", quote(q, VAL(F_LOSS)));
    if (!worker_ok(VAL(F_WORKER)))
        return bad(why, whysize, "bad worker '%s' (%zu bytes; 1..255 without control characters)",
                   quote(q, VAL(F_WORKER)), vlens[idx[F_WORKER]]);
    memcpy(m->worker, VAL(F_WORKER));
    m->worker[vlens[idx[F_WORKER]]] = '\0';
    g->worker = m->worker;
    g->ts_min_ms = g->ts_max_ms = 0;
    if (idx[F_TS] >= 0 && parse_ts(VAL(F_TS), &g->ts_min_ms, &g->ts_max_ms) != 0)
        return bad(why, whysize, "bad ts '%s' (min:max unix ms, 0 < min <= max)",
                   quote(q, VAL(F_TS)));
    g->norm = 0;
    if (idx[F_NORM] >= 0) {
        /* the whole gradient's norm, carried by a shard's slice: NaN or
         * infinite when the gradient was not finite */
        rc = parse_loss(VAL(F_NORM), &g->norm);
        if (rc == -2)
            g->norm = NAN;
        else if (rc != 0 || g->norm < 0 || g->n == 0)
            return bad(why, whysize, "bad norm '%s' (>= 0, nan or inf, with n > 0)",
                       quote(q, VAL(F_NORM)));
    }
#undef VAL
    return FR_OK;
}

/* Checks the reason and the payload against n and nparams. */
static fr_err_t decode_tail(ps_grad_msg_t *m, psstore_grad_t *g, const int idx[F_COUNT],
                            const char *const *vals, const size_t *vlens, size_t nparams, char *why,
                            size_t whysize)
{
    char q[PS_QUOTE + 4];
    if (g->n > 0 && idx[F_REASON] >= 0)
        return bad(why, whysize, "reason '%s' given with n = %" PRId64 " > 0",
                   quote(q, vals[idx[F_REASON]], vlens[idx[F_REASON]]), g->n);
    if (g->n == 0) {
        if (idx[F_REASON] < 0)
            return bad(why, whysize, "missing field 'reason' (required when n = 0)");
        const char *r = vals[idx[F_REASON]];
        size_t rlen = vlens[idx[F_REASON]];
        if (!reason_ok(r, rlen))
            return bad(why, whysize, "bad reason '%s' (1..63 bytes [a-z_])", quote(q, r, rlen));
        memcpy(m->reason, r, rlen);
        m->reason[rlen] = '\0';
        g->reason = m->reason;
        if (idx[F_G] >= 0 && vlens[idx[F_G]] > 0)
            return bad(why, whysize, "payload of %zu bytes with n = 0, expected none",
                       vlens[idx[F_G]]);
        return FR_OK;
    }
    if (idx[F_G] < 0)
        return bad(why, whysize, "missing field 'g' (n = %" PRId64 ")", g->n);
    size_t bytes = vlens[idx[F_G]];
    if (nparams == 0 && bytes > 0 && bytes % sizeof(float) == 0)
        nparams = bytes / sizeof(float); /* any length (a sparse model's): its applier checks */
    if (nparams == 0 || nparams > SIZE_MAX / sizeof(float) || bytes != nparams * sizeof(float))
        return bad(why, whysize, "payload of %zu bytes, expected %zu", bytes,
                   nparams <= SIZE_MAX / sizeof(float) ? nparams * sizeof(float) : SIZE_MAX);
    m->payload = vals[idx[F_G]];
    m->payload_bytes = bytes;
    g->g = (const float *)m->payload;
    g->len = nparams;
    return FR_OK;
}

/*
 * Decodes one entry's nfields field/value pairs (binary safe, bounded by
 * flens/vlens) into m, which must start zeroed and may be reused: its
 * ranges and topics buffers grow to the largest message seen and are kept.
 * On success m->g is the message; g.g points into the "g" value (maybe
 * unaligned), the rest is owned by m. On FR_ERR_PARSE why names the first
 * problem and m->g is zeroed; FR_ERR_NOMEM (a valid entry too large for
 * memory) is not the entry's fault and must not be counted as malformed.
 */
fr_err_t ps_grad_decode(ps_grad_msg_t *m, size_t nfields, const char *const *fields,
                        const size_t *flens, const char *const *vals, const size_t *vlens,
                        size_t nparams, char *why, size_t whysize)
{
    if (why != NULL && whysize > 0)
        why[0] = '\0';
    if (m == NULL)
        return bad(why, whysize, "no message");
    memset(&m->g, 0, sizeof(m->g));
    m->payload = NULL;
    m->payload_bytes = 0;

    int idx[F_COUNT];
    psstore_grad_t g = {0};
    size_t nranges = 0;
    fr_err_t err = decode_index(nfields, fields, flens, vals, vlens, idx, why, whysize);
    if (err == FR_OK)
        err = decode_scalars(m, &g, idx, vals, vlens, why, whysize);
    if (err == FR_OK)
        err = decode_ranges(m, vals[idx[F_RANGES]], vlens[idx[F_RANGES]], &nranges, why, whysize);
    if (err == FR_OK)
        err = decode_tail(m, &g, idx, vals, vlens, nparams, why, whysize);
    if (err != FR_OK) {
        m->payload = NULL;
        m->payload_bytes = 0;
        return err;
    }
    g.ranges = m->ranges;
    g.nranges = nranges;
    m->g = g;
    return FR_OK;
}

/* Frees the buffers of m and zeroes it (ready for reuse). */
void ps_grad_msg_fini(ps_grad_msg_t *m)
{
    if (m == NULL)
        return;
    free(m->ranges);
    free(m->topics);
    memset(m, 0, sizeof(*m));
}

fr_err_t ps_ranges_copy(const psstore_range_t *ranges, size_t n, psstore_range_t **dst, size_t *cap,
                        char **topics, size_t *tcap)
{
    size_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += strlen(ranges[i].topic) + 1;
    if (n > *cap) {
        psstore_range_t *r = realloc(*dst, n * sizeof(*r));
        if (r == NULL)
            return FR_ERR_NOMEM;
        *dst = r;
        *cap = n;
    }
    if (need > *tcap) {
        char *t = realloc(*topics, need);
        if (t == NULL)
            return FR_ERR_NOMEM;
        *topics = t;
        *tcap = need;
    }
    char *t = *topics;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(ranges[i].topic) + 1;
        memcpy(t, ranges[i].topic, len);
        (*dst)[i] = ranges[i];
        (*dst)[i].topic = t;
        t += len;
    }
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Slices of a sharded model's gradient (docs/design.md "Shards")
 * ---------------------------------------------------------------------- */
double ps_grad_norm(const psstore_grad_t *g)
{
    if (g->n <= 0 || g->g == NULL)
        return 0;
    /* the worker's sum when it sent one, taken by the controller's own
     * function: every shard then drops what the unsharded model would */
    double sq = g->sq_known ? g->sq : psstore_sum_squares(g->g, g->len);
    return isfinite(sq) ? sqrt(sq) : NAN;
}

void ps_grad_slice(const psstore_grad_t *g, const psstore_shard_at_t *at, int k, double norm,
                   psstore_grad_t *slice)
{
    *slice = *g;
    slice->epoch = at->epochs[k];
    slice->version = at->versions[k];
    slice->at = NULL;
    slice->sq_known = 0; /* the whole gradient's, not the slice's */
    if (g->n > 0) {
        slice->g = g->g + at->bounds[k];
        slice->len = at->bounds[k + 1] - at->bounds[k];
        slice->norm = norm;
    }
}
