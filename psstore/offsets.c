/*
 * offsets.c - the interval arithmetic of docs/design.md "Offsets": per partition
 * a watermark (every position below it applied or dropped) and the applied
 * half-open spans [from, to) above it, kept sorted, disjoint, non-adjacent
 * and strictly above the watermark. Pure functions over one
 * psstore_partition_offsets_t; no Redis, so this file is part of the compute
 * core (fr_psstore_core). Reading the offsets from Redis lives in model.c.
 *
 * Threads: a psstore_partition_offsets_t belongs to one thread at a time;
 * the functions keep no global state.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/core.h"

void psstore_poff_init(psstore_partition_offsets_t *po, int64_t watermark)
{
    po->watermark = watermark;
    po->generation = 0;
    po->spans = NULL;
    po->nspans = 0;
    po->cap = 0;
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
    if (po->nspans < po->cap)
        return FR_OK;
    size_t cap = po->cap ? po->cap * 2 : 8;
    if (cap > SIZE_MAX / sizeof(po->spans[0]))
        return FR_ERR_NOMEM;
    psstore_span_t *spans = realloc(po->spans, cap * sizeof(po->spans[0]));
    if (spans == NULL)
        return FR_ERR_NOMEM;
    po->spans = spans;
    po->cap = cap;
    return FR_OK;
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
    for (size_t i = 0; i < po->nspans; i++)
        n += (size_t)snprintf(s + n, cap - n, "%c%" PRId64 "-%" PRId64, i == 0 ? ';' : ',',
                              po->spans[i].from, po->spans[i].to);
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
    int64_t prev_end = tmp.watermark;
    while (i < len) {
        i++; /* ';' before the first span, ',' before the others: a span must follow */
        psstore_span_t sp;
        if (parse_pos(text, len, &i, &sp.from) != 0 || i >= len || text[i] != '-') {
            psstore_poff_fini(&tmp);
            return fr_errorf(FR_ERR_PARSE, errstr, size,
                             "offsets: expected a span FROM-TO at byte %zu", i);
        }
        i++;
        if (parse_pos(text, len, &i, &sp.to) != 0 || (i < len && text[i] != ',')) {
            psstore_poff_fini(&tmp);
            return fr_errorf(FR_ERR_PARSE, errstr, size,
                             "offsets: expected a span end and ',' at byte %zu", i);
        }
        if (sp.from >= sp.to || sp.from <= prev_end) {
            psstore_poff_fini(&tmp);
            return fr_errorf(FR_ERR_PARSE, errstr, size,
                             "offsets: span %" PRId64 "-%" PRId64
                             " is empty, unsorted, overlapping, adjacent or not above %" PRId64,
                             sp.from, sp.to, prev_end);
        }
        if (reserve_one(&tmp) != FR_OK) {
            psstore_poff_fini(&tmp);
            return fr_errorf(FR_ERR_NOMEM, errstr, size, "offsets: out of memory");
        }
        tmp.spans[tmp.nspans++] = sp;
        prev_end = sp.to;
    }
    psstore_poff_fini(po);
    *po = tmp;
    return FR_OK;
}
