/*
 * offsets.c - the interval arithmetic of docs/design.md "Offsets": per partition
 * a watermark (every position below it applied or dropped) and the applied
 * half-open spans [from, to) above it, kept sorted, disjoint, non-adjacent
 * and strictly above the watermark. Pure functions over one
 * psstore_partition_offsets_t; no Redis, so this file is part of the compute
 * core (fr_psstore_core). Reading the offsets from Redis lives in model.c.
 * This file is also the one place that writes and reads the text forms of
 * partitions, positions and intervals: "topic/partition" keys, "a-b" spans,
 * the grads stream's "topic:partition:from:to" ranges and the rewind
 * targets "topic/partition=target" (docs/design.md "Redis layout").
 *
 * Threads: a psstore_partition_offsets_t belongs to one thread at a time;
 * the functions keep no global state.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/positions/positions.h"

void psstore_poff_init(psstore_partition_offsets_t *po, int64_t watermark)
{
    po->watermark = watermark;
    po->generation = 0;
    po->spans = NULL;
    po->nspans = 0;
    po->cap = 0;
    po->alone_to = 0;
}

void psstore_poff_fini(psstore_partition_offsets_t *po)
{
    if (po == NULL)
        return;
    free(po->spans);
    psstore_poff_init(po, 0);
}

/*
 * The index of the first span whose end lies above pos (spans[i].to > pos),
 * or nspans when there is none. Spans are sorted and disjoint, so their ends
 * are increasing and a binary search applies.
 */
static size_t first_ending_after(const psstore_partition_offsets_t *po, int64_t pos)
{
    size_t lo = 0, hi = po->nspans;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (po->spans[mid].to > pos)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

int psstore_poff_overlaps(const psstore_partition_offsets_t *po, int64_t from, int64_t to)
{
    if (from >= to)
        return 0; /* an empty interval holds no position */
    if (from < po->watermark)
        return 1;
    size_t i = first_ending_after(po, from);
    return i < po->nspans && po->spans[i].from < to;
}

/*
 * Makes room for one more span. FR_ERR_NOMEM leaves po unchanged.
 */
static fr_err_t reserve_one(psstore_partition_offsets_t *po)
{
    return FR_GROW(po->spans, po->cap, po->nspans + 1);
}

/* Removes spans[i] keeping the order. */
static void remove_span(psstore_partition_offsets_t *po, size_t i)
{
    memmove(po->spans + i, po->spans + i + 1, (po->nspans - i - 1) * sizeof(po->spans[0]));
    po->nspans--;
}

/*
 * Inserts [from, to) (which overlaps nothing) at its sorted place, merging
 * it with a neighbour that ends where it starts or starts where it ends,
 * then lets the watermark swallow a span that starts at it. Because
 * neighbours merge, at most one span can start at the watermark afterwards.
 */
fr_err_t psstore_poff_mark(psstore_partition_offsets_t *po, int64_t from, int64_t to)
{
    if (from >= to || psstore_poff_overlaps(po, from, to))
        return FR_ERR_INVAL;
    if (from == po->watermark) {
        po->watermark = to;
    } else {
        size_t i = first_ending_after(po, from); /* spans[i] starts at or after to */
        int join_prev = i > 0 && po->spans[i - 1].to == from;
        int join_next = i < po->nspans && po->spans[i].from == to;
        if (join_prev && join_next) {
            po->spans[i - 1].to = po->spans[i].to;
            remove_span(po, i);
        } else if (join_prev) {
            po->spans[i - 1].to = to;
        } else if (join_next) {
            po->spans[i].from = from;
        } else {
            if (reserve_one(po) != FR_OK)
                return FR_ERR_NOMEM;
            memmove(po->spans + i + 1, po->spans + i, (po->nspans - i) * sizeof(po->spans[0]));
            po->spans[i] = (psstore_span_t){from, to};
            po->nspans++;
        }
    }
    if (po->nspans > 0 && po->spans[0].from == po->watermark) {
        po->watermark = po->spans[0].to;
        remove_span(po, 0);
    }
    return FR_OK;
}

/*
 * Replay: watermark = target, and the spans at or above target are cleared.
 * A rewind below the watermark forgets every span (they all lie above it).
 * A move forward (to-latest, say) makes every position below target count
 * as done: spans below it are then covered by the watermark and dropped, so
 * the invariant "spans lie strictly above the watermark" keeps holding and
 * overlaps() still reports their positions as applied.
 */
void psstore_poff_rewind(psstore_partition_offsets_t *po, int64_t target)
{
    po->watermark = target;
    po->nspans = 0;
}

/*
 * Formats "W" or "W;a-b,c-d" into a malloc'ed NUL-terminated string (caller
 * frees *out); *len excludes the NUL. FR_ERR_NOMEM on allocation failure.
 */
fr_err_t psstore_poff_format(const psstore_partition_offsets_t *po, char **out, size_t *len)
{
    /* 20 digits per number, a separator each: 42 bytes per span. */
    if (po->nspans > (SIZE_MAX - 32) / 42)
        return FR_ERR_NOMEM;
    size_t cap = 32 + po->nspans * 42;
    char *s = malloc(cap);
    if (s == NULL)
        return FR_ERR_NOMEM;
    size_t n = (size_t)snprintf(s, cap, "%" PRId64, po->watermark);
    if (po->nspans > 0) {
        s[n++] = ';';
        n += (size_t)psstore_spans_format(s + n, cap - n, po->spans, po->nspans);
    }
    if (po->generation != 0)
        n += (size_t)snprintf(s + n, cap - n, "@%" PRId64, po->generation);
    *out = s;
    if (len != NULL)
        *len = n;
    return FR_OK;
}

/*
 * Reads a non-negative decimal int64 at text[*i..len): digits only (no sign,
 * no spaces), at most INT64_MAX. Advances *i. Returns 0, or -1 when there is
 * no digit or the value overflows.
 */
static int parse_pos(const char *text, size_t len, size_t *i, int64_t *v)
{
    size_t start = *i;
    uint64_t x = 0;
    while (*i < len && text[*i] >= '0' && text[*i] <= '9') {
        unsigned d = (unsigned)(text[*i] - '0');
        if (x > ((uint64_t)INT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
        (*i)++;
    }
    if (*i == start)
        return -1;
    *v = (int64_t)x;
    return 0;
}

/*
 * Parses s[len] whole as a decimal of at most 20 bytes no larger than max
 * (the grads stream's bound on a field). Returns 0, or -1.
 */
static int parse_field(const char *s, size_t len, int64_t max, int64_t *v)
{
    size_t i = 0;
    if (len == 0 || len > 20 || parse_pos(s, len, &i, v) != 0 || i != len || *v > max)
        return -1;
    return 0;
}

/*
 * Parses the text form written by psstore_poff_format. Only the canonical
 * form is accepted: a watermark, then optionally ';' and comma-separated
 * spans "a-b" with watermark < a < b, each starting after the previous one
 * ended (sorted, disjoint, not adjacent). On success po's old spans are
 * replaced; on error (FR_ERR_PARSE, or FR_ERR_NOMEM) po is unchanged and
 * errstr says what is wrong, quoting no more than the offending number.
 */
fr_err_t psstore_poff_parse(psstore_partition_offsets_t *po, const char *text, size_t len,
                            char *errstr, size_t size)
{
    psstore_partition_offsets_t tmp;
    psstore_poff_init(&tmp, 0);
    size_t i = 0;
    /* a trailing "@G" is the replay generation */
    const char *at = text != NULL ? memchr(text, '@', len) : NULL;
    if (at != NULL) {
        size_t g = (size_t)(at - text) + 1;
        if (parse_pos(text, len, &g, &tmp.generation) != 0 || g != len)
            return fr_errorf(FR_ERR_PARSE, errstr, size,
                             "offsets: expected a replay generation after '@'");
        len = (size_t)(at - text);
    }
    if (text == NULL || parse_pos(text, len, &i, &tmp.watermark) != 0)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "offsets: expected a non-negative watermark at the start");
    if (i < len && text[i] != ';')
        return fr_errorf(FR_ERR_PARSE, errstr, size, "offsets: unexpected byte at %zu", i);
    if (i < len) {
        fr_err_t err = psstore_spans_parse(&tmp, text, len, i + 1, errstr, size);
        if (err != FR_OK) {
            psstore_poff_fini(&tmp);
            return err;
        }
    }
    psstore_poff_fini(po);
    *po = tmp;
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Text forms (positions.h "Text forms of partitions, positions and intervals")
 * ---------------------------------------------------------------------- */

int psstore_topic_ok(const char *s, size_t len)
{
    if (s == NULL || len < 1 || len > PSSTORE_TOPIC_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        if (!fr_name_char((unsigned char)s[i]))
            return 0;
    }
    return 1;
}

int psstore_key_format(char *buf, size_t size, const char *topic, int32_t partition)
{
    return snprintf(buf, size, "%s/%" PRId32, topic, partition);
}

fr_err_t psstore_key_split(const char *s, size_t len, size_t *tlen, int32_t *partition)
{
    if (s == NULL)
        return FR_ERR_PARSE;
    size_t slash = len;
    for (size_t i = len; i > 0; i--)
        if (s[i - 1] == '/') {
            slash = i - 1;
            break;
        }
    int64_t p;
    if (slash == len || slash == 0 || parse_field(s + slash + 1, len - slash - 1, INT32_MAX, &p))
        return FR_ERR_PARSE;
    *tlen = slash;
    *partition = (int32_t)p;
    return FR_OK;
}

fr_err_t psstore_key_parse(const char *s, size_t len, char *topic, size_t tsize, int32_t *partition)
{
    size_t tlen;
    int32_t p;
    if (psstore_key_split(s, len, &tlen, &p) != FR_OK || tlen >= tsize)
        return FR_ERR_PARSE;
    memcpy(topic, s, tlen);
    topic[tlen] = '\0';
    *partition = p;
    return FR_OK;
}

int psstore_key_cmp(const char *x, const char *y)
{
    size_t lx = strlen(x), ly = strlen(y);
    int32_t px = 0, py = 0;
    if (psstore_key_split(x, lx, &lx, &px) != FR_OK)
        px = 0;
    if (psstore_key_split(y, ly, &ly, &py) != FR_OK)
        py = 0;
    int c = memcmp(x, y, lx < ly ? lx : ly);
    if (c != 0 || lx != ly)
        return c != 0 ? c : (lx < ly ? -1 : 1);
    return (px > py) - (px < py);
}

int psstore_span_format(char *buf, size_t size, psstore_span_t sp)
{
    return snprintf(buf, size, "%" PRId64 "-%" PRId64, sp.from, sp.to);
}

/* Writes the n items one(items, i, ...) formats, separated by ',', as
 * snprintf does: at most size bytes, NUL-terminated when size > 0; returns
 * the length the whole text needs. */
static int join_format(char *buf, size_t size, const void *items, size_t n,
                       int (*one)(char *buf, size_t size, const void *items, size_t i))
{
    size_t total = 0;
    if (size > 0)
        buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t off = total < size ? total : size;
        if (i > 0) {
            if (off + 1 < size)
                buf[off] = ',', buf[off + 1] = '\0';
            total++;
            off = total < size ? total : size;
        }
        total += (size_t)one(buf + off, size - off, items, i);
    }
    return (int)total;
}

static int span_at(char *buf, size_t size, const void *items, size_t i)
{
    return psstore_span_format(buf, size, ((const psstore_span_t *)items)[i]);
}

int psstore_spans_format(char *buf, size_t size, const psstore_span_t *spans, size_t n)
{
    return join_format(buf, size, spans, n, span_at);
}

fr_err_t psstore_span_parse(const char *s, size_t len, psstore_span_t *sp)
{
    size_t i = 0;
    psstore_span_t v;
    if (s == NULL || parse_pos(s, len, &i, &v.from) != 0 || i >= len || s[i] != '-')
        return FR_ERR_PARSE;
    i++;
    if (parse_pos(s, len, &i, &v.to) != 0 || i != len || v.from >= v.to)
        return FR_ERR_PARSE;
    *sp = v;
    return FR_OK;
}

/*
 * The span list of the offsets text: each span "a-b" must start above the
 * end of the one before (the first above the watermark), so the list is
 * sorted, disjoint and not adjacent. The error texts name the byte of the
 * whole offsets text.
 */
fr_err_t psstore_spans_parse(psstore_partition_offsets_t *po, const char *text, size_t len,
                             size_t start, char *errstr, size_t size)
{
    int64_t prev_end = po->nspans > 0 ? po->spans[po->nspans - 1].to : po->watermark;
    size_t i = start;
    for (;;) {
        psstore_span_t sp;
        if (parse_pos(text, len, &i, &sp.from) != 0 || i >= len || text[i] != '-')
            return fr_errorf(FR_ERR_PARSE, errstr, size,
                             "offsets: expected a span FROM-TO at byte %zu", i);
        i++;
        if (parse_pos(text, len, &i, &sp.to) != 0 || (i < len && text[i] != ','))
            return fr_errorf(FR_ERR_PARSE, errstr, size,
                             "offsets: expected a span end and ',' at byte %zu", i);
        if (sp.from >= sp.to || sp.from <= prev_end)
            return fr_errorf(FR_ERR_PARSE, errstr, size,
                             "offsets: span %" PRId64 "-%" PRId64
                             " is empty, unsorted, overlapping, adjacent or not above %" PRId64,
                             sp.from, sp.to, prev_end);
        if (reserve_one(po) != FR_OK)
            return fr_errorf(FR_ERR_NOMEM, errstr, size, "offsets: out of memory");
        po->spans[po->nspans++] = sp;
        prev_end = sp.to;
        if (i >= len)
            return FR_OK;
        i++; /* the ',' before the next span: one must follow */
    }
}

int psstore_range_format(char *buf, size_t size, const psstore_range_t *r)
{
    return snprintf(buf, size, "%s:%" PRId32 ":%" PRId64 ":%" PRId64, r->topic, r->partition,
                    r->from, r->to);
}

static int range_at(char *buf, size_t size, const void *items, size_t i)
{
    return psstore_range_format(buf, size, &((const psstore_range_t *)items)[i]);
}

int psstore_ranges_format(char *buf, size_t size, const psstore_range_t *ranges, size_t n)
{
    return join_format(buf, size, ranges, n, range_at);
}

psstore_range_fault_t psstore_range_parse(const char *s, size_t len, psstore_range_t *r,
                                          char *topic, size_t tsize, size_t *tlen)
{
    size_t colon[3], ncolons = 0;
    if (s == NULL || len == 0)
        return PSSTORE_RANGE_EMPTY;
    for (size_t k = 0; k < len; k++) {
        if (s[k] != ':')
            continue;
        if (ncolons < 3)
            colon[ncolons] = k;
        ncolons++;
    }
    if (ncolons != 3)
        return PSSTORE_RANGE_SHAPE;
    *tlen = colon[0];
    if (!psstore_topic_ok(s, colon[0]) || colon[0] >= tsize)
        return PSSTORE_RANGE_TOPIC;
    int64_t p, from, to;
    if (parse_field(s + colon[0] + 1, colon[1] - colon[0] - 1, INT32_MAX, &p))
        return PSSTORE_RANGE_PARTITION;
    if (parse_field(s + colon[1] + 1, colon[2] - colon[1] - 1, INT64_MAX, &from) ||
        parse_field(s + colon[2] + 1, len - colon[2] - 1, INT64_MAX, &to))
        return PSSTORE_RANGE_POSITION;
    if (from >= to) {
        r->from = from; /* for the caller's message */
        r->to = to;
        return PSSTORE_RANGE_ORDER;
    }
    memcpy(topic, s, colon[0]);
    topic[colon[0]] = '\0';
    *r = (psstore_range_t){topic, (int32_t)p, from, to};
    return PSSTORE_RANGE_OK;
}

/* Nonzero when a rewind target can be written so that it parses back. */
static int target_ok(const psstore_rewind_t *t)
{
    return t->topic != NULL && t->partition >= 0 && t->target >= 0 &&
           strlen(t->topic) <= PSSTORE_TOPIC_MAX && strpbrk(t->topic, "/=,") == NULL;
}

fr_err_t psstore_targets_format(const psstore_rewind_t *targets, size_t n, char **out, size_t *len,
                                size_t *bad)
{
    /* a topic, '/', 10 digits, '=', 19 digits, ',': under 300 bytes each */
    for (size_t i = 0; i < n; i++)
        if (!target_ok(&targets[i])) {
            if (bad != NULL)
                *bad = i;
            return FR_ERR_INVAL;
        }
    if (n > (SIZE_MAX - 1) / 300)
        return FR_ERR_NOMEM;
    size_t cap = n * 300 + 1, off = 0;
    char *s = malloc(cap);
    if (s == NULL)
        return FR_ERR_NOMEM;
    s[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            s[off++] = ',';
        off +=
            (size_t)psstore_key_format(s + off, cap - off, targets[i].topic, targets[i].partition);
        off += (size_t)snprintf(s + off, cap - off, "=%" PRId64, targets[i].target);
    }
    *out = s;
    if (len != NULL)
        *len = off;
    return FR_OK;
}

fr_err_t psstore_keyval_parse(const char *s, size_t len, char *topic, size_t tsize,
                              int32_t *partition, size_t *voff)
{
    const char *eq = s != NULL ? memchr(s, '=', len) : NULL;
    if (eq == NULL || psstore_key_parse(s, (size_t)(eq - s), topic, tsize, partition) != FR_OK)
        return FR_ERR_PARSE;
    *voff = (size_t)(eq - s) + 1;
    return FR_OK;
}

fr_err_t psstore_target_parse(const char *s, size_t len, char *topic, size_t tsize,
                              int32_t *partition, int64_t *target)
{
    size_t voff, i;
    int64_t v;
    int32_t p;
    char t[PSSTORE_TOPIC_MAX + 1];
    if (psstore_keyval_parse(s, len, t, sizeof(t), &p, &voff) != FR_OK)
        return FR_ERR_PARSE;
    i = voff;
    if (parse_pos(s, len, &i, &v) != 0 || i != len || strlen(t) >= tsize)
        return FR_ERR_PARSE;
    memcpy(topic, t, strlen(t) + 1);
    *partition = p;
    *target = v;
    return FR_OK;
}

/*
 * One allocation: the n ranges, then their topics NUL-terminated, each
 * range's topic pointing at its copy.
 */
psstore_range_t *psstore_ranges_dup(const psstore_range_t *ranges, size_t n)
{
    if (ranges == NULL || n == 0 || n > SIZE_MAX / 2 / sizeof(*ranges))
        return NULL;
    size_t bytes = n * sizeof(*ranges);
    for (size_t i = 0; i < n; i++) {
        size_t tlen = strlen(ranges[i].topic) + 1;
        if (tlen > SIZE_MAX - bytes)
            return NULL;
        bytes += tlen;
    }
    psstore_range_t *dup = malloc(bytes);
    if (dup == NULL)
        return NULL;
    char *t = (char *)(dup + n);
    for (size_t i = 0; i < n; i++) {
        size_t tlen = strlen(ranges[i].topic) + 1;
        memcpy(t, ranges[i].topic, tlen);
        dup[i] = ranges[i];
        dup[i].topic = t;
        t += tlen;
    }
    return dup;
}
