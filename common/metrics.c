/*
 * metrics.c - a registry of counters, gauges and histograms with labels,
 * rendered in the Prometheus text exposition format 0.0.4.
 *
 * Thread safety: one mutex per registry guards the lists of families and
 * series (registration, first use of a label combination, rendering).
 * Updates to a series never take it: values are doubles kept as their
 * IEEE-754 bit patterns in atomic uint64s and updated with a CAS loop;
 * histogram buckets are atomic counters.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

typedef enum metric_type {
    MT_COUNTER,
    MT_GAUGE,
    MT_HISTOGRAM,
} metric_type_t;

struct fr_series {
    fr_series_t *next; /* creation order */
    fr_metric_t *m;
    char *values[FR_METRICS_MAX_LABELS];
    _Atomic uint64_t bits;     /* counter/gauge value; histogram sum */
    _Atomic uint64_t *buckets; /* histogram: nbounds + 1 non-cumulative counts */
};

struct fr_metric {
    fr_metric_t *next; /* registration order */
    fr_metrics_t *reg;
    metric_type_t type;
    char *name;
    char *help;
    size_t nlabels;
    char *labels[FR_METRICS_MAX_LABELS];
    size_t nbounds;
    double *bounds;
    fr_series_t *head, *tail;
};

struct fr_metrics {
    pthread_mutex_t mu;
    fr_metric_t *head, *tail;
};

/* ------------------------------------------------------------------------
 * Atomic doubles
 * ---------------------------------------------------------------------- */

static uint64_t dbl_bits(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof(b));
    return b;
}

static double bits_dbl(uint64_t b)
{
    double v;
    memcpy(&v, &b, sizeof(v));
    return v;
}

/* Adds v to the double stored in *bits; lock-free. */
static void atomic_add_double(_Atomic uint64_t *bits, double v)
{
    uint64_t old = atomic_load_explicit(bits, memory_order_relaxed);
    uint64_t upd;
    do {
        upd = dbl_bits(bits_dbl(old) + v);
    } while (!atomic_compare_exchange_weak_explicit(bits, &old, upd, memory_order_relaxed,
                                                    memory_order_relaxed));
}

/* ------------------------------------------------------------------------
 * Registry and registration
 * ---------------------------------------------------------------------- */

fr_metrics_t *fr_metrics_new(void)
{
    fr_metrics_t *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return NULL;
    if (pthread_mutex_init(&reg->mu, NULL) != 0) {
        free(reg);
        return NULL;
    }
    return reg;
}

static void series_free(fr_series_t *s)
{
    for (size_t i = 0; i < FR_METRICS_MAX_LABELS; i++)
        free(s->values[i]);
    free(s->buckets);
    free(s);
}

static void metric_free(fr_metric_t *m)
{
    fr_series_t *s = m->head;
    while (s != NULL) {
        fr_series_t *next = s->next;
        series_free(s);
        s = next;
    }
    free(m->name);
    free(m->help);
    for (size_t i = 0; i < FR_METRICS_MAX_LABELS; i++)
        free(m->labels[i]);
    free(m->bounds);
    free(m);
}

/* Frees the registry, its families and series. No other thread may be
 * using it. NULL is a no-op. */
void fr_metrics_destroy(fr_metrics_t *reg)
{
    if (reg == NULL)
        return;
    fr_metric_t *m = reg->head;
    while (m != NULL) {
        fr_metric_t *next = m->next;
        metric_free(m);
        m = next;
    }
    pthread_mutex_destroy(&reg->mu);
    free(reg);
}

/* [a-zA-Z_:][a-zA-Z0-9_:]* for metric names (colon) or
 * [a-zA-Z_][a-zA-Z0-9_]* not starting "__" for label names. */
static int name_valid(const char *name, int is_label)
{
    if (name == NULL || name[0] == '\0')
        return 0;
    if (is_label && name[0] == '_' && name[1] == '_')
        return 0;
    for (const char *p = name; *p != '\0'; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 (!is_label && c == ':') || (p != name && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

/* Checks label names: valid, distinct, and not "le" for a histogram. */
static int labels_valid(metric_type_t type, size_t nlabels, const char *const *label_names)
{
    if (nlabels > FR_METRICS_MAX_LABELS || (nlabels > 0 && label_names == NULL))
        return 0;
    for (size_t i = 0; i < nlabels; i++) {
        if (!name_valid(label_names[i], 1))
            return 0;
        if (type == MT_HISTOGRAM && strcmp(label_names[i], "le") == 0)
            return 0;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(label_names[i], label_names[j]) == 0)
                return 0;
        }
    }
    return 1;
}

/* Whether an existing family has exactly this type, labels and bounds. */
static int metric_same(const fr_metric_t *m, metric_type_t type, size_t nlabels,
                       const char *const *label_names, size_t nbounds, const double *bounds)
{
    if (m->type != type || m->nlabels != nlabels || m->nbounds != nbounds)
        return 0;
    for (size_t i = 0; i < nlabels; i++) {
        if (strcmp(m->labels[i], label_names[i]) != 0)
            return 0;
    }
    for (size_t i = 0; i < nbounds; i++) {
        if (m->bounds[i] != bounds[i])
            return 0;
    }
    return 1;
}

/* Allocates a series of m with copies of values (NULL values read as "");
 * not yet linked. NULL if out of memory. */
static fr_series_t *series_new(fr_metric_t *m, const char *const *values)
{
    fr_series_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->m = m;
    atomic_init(&s->bits, dbl_bits(0.0));
    for (size_t i = 0; i < m->nlabels; i++) {
        const char *v = (values != NULL && values[i] != NULL) ? values[i] : "";
        s->values[i] = strdup(v);
        if (s->values[i] == NULL)
            goto err;
    }
    if (m->type == MT_HISTOGRAM) {
        s->buckets = calloc(m->nbounds + 1, sizeof(*s->buckets));
        if (s->buckets == NULL)
            goto err;
        for (size_t i = 0; i <= m->nbounds; i++)
            atomic_init(&s->buckets[i], 0);
    }
    return s;
err:
    series_free(s);
    return NULL;
}

/* Builds a family (and, when it has no labels, its one series). NULL if
 * out of memory. */
static fr_metric_t *metric_new(fr_metrics_t *reg, metric_type_t type, const char *name,
                               const char *help, size_t nlabels, const char *const *label_names,
                               size_t nbounds, const double *bounds)
{
    fr_metric_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->reg = reg;
    m->type = type;
    m->nlabels = nlabels;
    m->nbounds = nbounds;
    m->name = strdup(name);
    m->help = strdup(help != NULL ? help : "");
    if (m->name == NULL || m->help == NULL)
        goto err;
    for (size_t i = 0; i < nlabels; i++) {
        m->labels[i] = strdup(label_names[i]);
        if (m->labels[i] == NULL)
            goto err;
    }
    if (nbounds > 0) {
        m->bounds = malloc(nbounds * sizeof(*m->bounds));
        if (m->bounds == NULL)
            goto err;
        memcpy(m->bounds, bounds, nbounds * sizeof(*m->bounds));
    }
    if (nlabels == 0) {
        m->head = m->tail = series_new(m, NULL);
        if (m->head == NULL)
            goto err;
    }
    return m;
err:
    metric_free(m);
    return NULL;
}

/* Validates, then returns the existing family of that name when it matches,
 * NULL when it does not, or a new family appended to the registry. */
static fr_metric_t *metrics_register(fr_metrics_t *reg, metric_type_t type, const char *name,
                                     const char *help, size_t nlabels,
                                     const char *const *label_names, size_t nbounds,
                                     const double *bounds)
{
    if (reg == NULL || !name_valid(name, 0) || !labels_valid(type, nlabels, label_names))
        return NULL;
    if (nbounds > 0 && bounds == NULL)
        return NULL;
    for (size_t i = 0; i < nbounds; i++) {
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return NULL;
    }

    pthread_mutex_lock(&reg->mu);
    fr_metric_t *m;
    for (m = reg->head; m != NULL; m = m->next) {
        if (strcmp(m->name, name) == 0)
            break;
    }
    if (m != NULL) {
        if (!metric_same(m, type, nlabels, label_names, nbounds, bounds))
            m = NULL;
    } else {
        m = metric_new(reg, type, name, help, nlabels, label_names, nbounds, bounds);
        if (m != NULL) {
            if (reg->tail != NULL)
                reg->tail->next = m;
            else
                reg->head = m;
            reg->tail = m;
        }
    }
    pthread_mutex_unlock(&reg->mu);
    return m;
}

fr_metric_t *fr_metrics_counter(fr_metrics_t *reg, const char *name, const char *help,
                                size_t nlabels, const char *const *label_names)
{
    return metrics_register(reg, MT_COUNTER, name, help, nlabels, label_names, 0, NULL);
}

fr_metric_t *fr_metrics_gauge(fr_metrics_t *reg, const char *name, const char *help, size_t nlabels,
                              const char *const *label_names)
{
    return metrics_register(reg, MT_GAUGE, name, help, nlabels, label_names, 0, NULL);
}

fr_metric_t *fr_metrics_histogram(fr_metrics_t *reg, const char *name, const char *help,
                                  size_t nbounds, const double *bounds, size_t nlabels,
                                  const char *const *label_names)
{
    return metrics_register(reg, MT_HISTOGRAM, name, help, nlabels, label_names, nbounds, bounds);
}

/* Finds or creates the series for these label values under the registry
 * mutex. The lookup is linear: label sets are low-cardinality by design and
 * hot paths keep the returned pointer. */
fr_series_t *fr_metric_series(fr_metric_t *m, const char *const *label_values)
{
    if (m == NULL)
        return NULL;
    fr_metrics_t *reg = m->reg;
    pthread_mutex_lock(&reg->mu);
    fr_series_t *s;
    for (s = m->head; s != NULL; s = s->next) {
        size_t i;
        for (i = 0; i < m->nlabels; i++) {
            const char *v =
                (label_values != NULL && label_values[i] != NULL) ? label_values[i] : "";
            if (strcmp(s->values[i], v) != 0)
                break;
        }
        if (i == m->nlabels)
            break;
    }
    if (s == NULL) {
        s = series_new(m, label_values);
        if (s != NULL) {
            if (m->tail != NULL)
                m->tail->next = s;
            else
                m->head = s;
            m->tail = s;
        }
    }
    pthread_mutex_unlock(&reg->mu);
    return s;
}

/* ------------------------------------------------------------------------
 * Updates. NULL series are ignored so that a failed registration degrades
 * to missing metrics, not a crash.
 * ---------------------------------------------------------------------- */

/* Counters only go up: negative and NaN increments are ignored. */
void fr_series_add(fr_series_t *s, double v)
{
    if (s == NULL || s->m->type == MT_HISTOGRAM)
        return;
    if (s->m->type == MT_COUNTER && !(v >= 0.0))
        return;
    atomic_add_double(&s->bits, v);
}

void fr_series_set(fr_series_t *s, double v)
{
    if (s == NULL || s->m->type != MT_GAUGE)
        return;
    atomic_store_explicit(&s->bits, dbl_bits(v), memory_order_relaxed);
}

/* Counts v in the first bucket whose bound is >= v (NaN in +Inf only, as
 * the Go client does) and adds it to the sum. */
void fr_series_observe(fr_series_t *s, double v)
{
    if (s == NULL || s->m->type != MT_HISTOGRAM)
        return;
    const double *bounds = s->m->bounds;
    size_t lo = 0, hi = s->m->nbounds;
    while (lo < hi) { /* first bound >= v; NaN compares false and lands at the end */
        size_t mid = lo + (hi - lo) / 2;
        if (bounds[mid] >= v)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (isnan(v))
        lo = s->m->nbounds;
    atomic_fetch_add_explicit(&s->buckets[lo], 1, memory_order_relaxed);
    atomic_add_double(&s->bits, v);
}

/* Sum of a histogram's buckets: its observation count. */
static uint64_t series_count(fr_series_t *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i <= s->m->nbounds; i++)
        n += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
    return n;
}

double fr_series_value(fr_series_t *s)
{
    if (s == NULL)
        return 0.0;
    if (s->m->type == MT_HISTOGRAM)
        return (double)series_count(s);
    return bits_dbl(atomic_load_explicit(&s->bits, memory_order_relaxed));
}

/* ------------------------------------------------------------------------
 * Rendering
 * ---------------------------------------------------------------------- */

/* Appends s escaped for HELP (backslash, newline) or, with quotes set, for
 * a label value (also double quote). */
static void buf_escaped(fr_buf_t *b, const char *s, int quotes)
{
    for (const char *p = s; *p != '\0'; p++) {
        if (*p == '\\')
            fr_buf_add(b, "\\\\", 2);
        else if (*p == '\n')
            fr_buf_add(b, "\\n", 2);
        else if (quotes && *p == '"')
            fr_buf_add(b, "\\\"", 2);
        else
            fr_buf_add(b, p, 1);
    }
}

/* Formats v as Prometheus reads it: NaN, +Inf, -Inf; integers below 2^53
 * without exponent or fraction; others in the shortest %.15g/%.16g/%.17g
 * form that reads back to the same double. buf holds at least 32 bytes. */
static void format_number(double v, char *buf, size_t size)
{
    if (isnan(v)) {
        snprintf(buf, size, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, size, "%s", v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == 0.0) {
        snprintf(buf, size, "0"); /* also -0 */
        return;
    }
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        snprintf(buf, size, "%.0f", v);
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

static void buf_number(fr_buf_t *b, double v)
{
    char num[40];
    format_number(v, num, sizeof(num));
    fr_buf_puts(b, num);
}

/* Appends "name{l1="v1",...,extra_name="extra_value"} " (no braces when
 * there is no label at all). */
static void buf_sample_head(fr_buf_t *b, const fr_metric_t *m, const char *suffix,
                            const fr_series_t *s, const char *le)
{
    fr_buf_puts(b, m->name);
    fr_buf_puts(b, suffix);
    if (m->nlabels > 0 || le != NULL) {
        fr_buf_add(b, "{", 1);
        for (size_t i = 0; i < m->nlabels; i++) {
            if (i > 0)
                fr_buf_add(b, ",", 1);
            fr_buf_puts(b, m->labels[i]);
            fr_buf_add(b, "=\"", 2);
            buf_escaped(b, s->values[i], 1);
            fr_buf_add(b, "\"", 1);
        }
        if (le != NULL) {
            fr_buf_puts(b, m->nlabels > 0 ? ",le=\"" : "le=\"");
            fr_buf_puts(b, le);
            fr_buf_add(b, "\"", 1);
        }
        fr_buf_add(b, "}", 1);
    }
    fr_buf_add(b, " ", 1);
}

/* Appends a histogram series: cumulative buckets, +Inf, _sum and _count.
 * Each bucket is read once, so the cumulative counts never decrease and
 * _count equals the +Inf bucket even while observations land. */
static void render_histogram(fr_buf_t *b, const fr_metric_t *m, fr_series_t *s)
{
    char le[40];
    uint64_t cum = 0;
    for (size_t i = 0; i <= m->nbounds; i++) {
        cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
        if (i < m->nbounds)
            format_number(m->bounds[i], le, sizeof(le));
        else
            snprintf(le, sizeof(le), "+Inf");
        buf_sample_head(b, m, "_bucket", s, le);
        buf_number(b, (double)cum);
        fr_buf_add(b, "\n", 1);
    }
    buf_sample_head(b, m, "_sum", s, NULL);
    buf_number(b, bits_dbl(atomic_load_explicit(&s->bits, memory_order_relaxed)));
    fr_buf_add(b, "\n", 1);
    buf_sample_head(b, m, "_count", s, NULL);
    buf_number(b, (double)cum);
    fr_buf_add(b, "\n", 1);
}

/* Renders every family under the registry mutex (series updates continue
 * meanwhile). The caller frees the result; NULL if out of memory. */
char *fr_metrics_render(fr_metrics_t *reg, size_t *len)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    fr_buf_t b = {0};
    if (reg == NULL)
        return NULL;

    pthread_mutex_lock(&reg->mu);
    for (const fr_metric_t *m = reg->head; m != NULL; m = m->next) {
        fr_buf_puts(&b, "# HELP ");
        fr_buf_puts(&b, m->name);
        fr_buf_add(&b, " ", 1);
        buf_escaped(&b, m->help, 0);
        fr_buf_puts(&b, "\n# TYPE ");
        fr_buf_puts(&b, m->name);
        fr_buf_add(&b, " ", 1);
        fr_buf_puts(&b, type_names[m->type]);
        fr_buf_add(&b, "\n", 1);
        for (fr_series_t *s = m->head; s != NULL; s = s->next) {
            if (m->type == MT_HISTOGRAM) {
                render_histogram(&b, m, s);
                continue;
            }
            buf_sample_head(&b, m, "", s, NULL);
            buf_number(&b, bits_dbl(atomic_load_explicit(&s->bits, memory_order_relaxed)));
            fr_buf_add(&b, "\n", 1);
        }
    }
    pthread_mutex_unlock(&reg->mu);

    return fr_buf_take(&b, len);
}
