/*
 * bench_decode.c - the record codecs on their own: nanoseconds a field of
 * ingest_decode over 784-feature records, against libc's strtof on the
 * same fields in the same run.
 *
 * The records are bench_consume's: csv with "%.9g" features in [0, 1)
 * (mostly "0.123456791"), csv with integer features 0..255 ("37"), and f32.
 * A set of RECORDS records (16, about 150 KB of csv, so that the caches
 * hold them and the figure is the decoder's, not the memory's) is decoded
 * PASSES times a repetition; each format's figure is the fastest of REPS
 * repetitions and their median, as this machine's other tenants only ever
 * slow a repetition down. The baseline splits each csv record at its commas
 * and reads every field with strtof from a NUL-terminated copy, the way a
 * decoder without a fast path would (bench_consume measures the consumer
 * around the decoder; docs/design.md "Decoding ahead").
 *
 * Every decode is checked against strtof's value of the field, and the
 * program exits 1 on a mismatch.
 *
 * usage: bench_decode [REPS]   (default 25)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_records.h"
#include "common/common.h"
#include "ingest/ingest.h"

#define FEATURES BENCH_FEATURES
#define RECORDS  16
#define PASSES   16
#define MAX_REPS 200
#define REC_CAP  16384

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct figure {
    double best, median; /* ns a field */
} figure_t;

static figure_t summarise(double *ns, int reps)
{
    qsort(ns, (size_t)reps, sizeof(double), cmp_double);
    return (figure_t){ns[0], ns[reps / 2]};
}

static char recs[RECORDS][REC_CAP];
static size_t lens[RECORDS];

/* strtof on every field of a csv record: the baseline. Returns the sum of
 * the values (so that nothing is optimised away). */
static double strtof_record(const char *p, size_t len, float *x)
{
    char field[64];
    double sum = 0;
    size_t n = 0;
    for (const char *end = p + len; p < end;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        size_t flen = (size_t)((comma != NULL ? comma : end) - p);
        if (flen >= sizeof(field))
            return NAN; /* not one of this benchmark's fields */
        memcpy(field, p, flen);
        field[flen] = '\0';
        float v = strtof(field, NULL);
        if (n > 0)
            x[n - 1] = v;
        sum += v;
        n++;
        p = comma != NULL ? comma + 1 : end;
    }
    return sum;
}

/* One format: builds the records, checks one decode of each against
 * strtof (csv) or the values written (f32), then times both. Returns 0, or
 * -1 when a check fails. */
static int run(ingest_format_t format, int ints, const char *name, int reps)
{
    ingest_schema_t s;
    memset(&s, 0, sizeof(s));
    s.features = FEATURES;
    s.label = INGEST_LABEL_CLASS;
    s.classes = BENCH_CLASSES;
    static float x[FEATURES], want[FEATURES];
    float y;
    size_t bytes = 0;
    for (int r = 0; r < RECORDS; r++) {
        for (int j = 0; j < FEATURES; j++)
            x[j] = bench_feature(ints, (uint64_t)r, j);
        lens[r] = ingest_encode(format, x, FEATURES, bench_label((uint64_t)r), recs[r], REC_CAP);
        if (lens[r] == 0)
            return -1;
        bytes += lens[r];
        if (ingest_decode(&s, format, recs[r], lens[r], x, &y) != INGEST_OK)
            return -1;
        if (format == INGEST_FORMAT_CSV) {
            strtof_record(recs[r], lens[r], want);
        } else {
            for (int j = 0; j < FEATURES; j++)
                want[j] = bench_feature(ints, (uint64_t)r, j);
        }
        if (memcmp(x, want, sizeof(x)) != 0 || y != bench_label((uint64_t)r)) {
            fprintf(stderr, "bench_decode: %s record %d decodes other than strtof\n", name, r);
            return -1;
        }
    }
    double fields = (double)PASSES * RECORDS * (FEATURES + 1);
    double ns[MAX_REPS], base[MAX_REPS];
    volatile double sink = 0;
    for (int k = 0; k < reps; k++) {
        uint64_t t0 = fr_clock_mono_ns();
        for (int p = 0; p < PASSES; p++)
            for (int r = 0; r < RECORDS; r++)
                if (ingest_decode(&s, format, recs[r], lens[r], x, &y) != INGEST_OK)
                    return -1;
        ns[k] = (double)(fr_clock_mono_ns() - t0) / fields;
        if (format != INGEST_FORMAT_CSV)
            continue;
        t0 = fr_clock_mono_ns();
        for (int p = 0; p < PASSES; p++)
            for (int r = 0; r < RECORDS; r++)
                sink += strtof_record(recs[r], lens[r], x);
        base[k] = (double)(fr_clock_mono_ns() - t0) / fields;
    }
    (void)sink;
    figure_t f = summarise(ns, reps);
    printf("  %-8s %6zu %12.2f %12.2f", name, bytes / RECORDS, f.best, f.median);
    if (format == INGEST_FORMAT_CSV) {
        figure_t b = summarise(base, reps);
        printf(" %12.2f %12.2f %8.2fx", b.best, b.median, b.best / f.best);
    }
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 25;
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: bench_decode [REPS]   (1..%d, default 25)\n", MAX_REPS);
        return 2;
    }
    printf("bench_decode: %d records of %d features, %d passes a repetition, %d repetitions; "
           "ns a field, fastest and median repetition\n",
           RECORDS, FEATURES, PASSES, reps);
    printf("  %-8s %6s %12s %12s %12s %12s %9s\n", "format", "bytes", "decode best", "median",
           "strtof best", "median", "speed-up");
    if (run(INGEST_FORMAT_CSV, 0, "csv", reps) != 0 ||
        run(INGEST_FORMAT_CSV, 1, "csv-int", reps) != 0 ||
        run(INGEST_FORMAT_F32, 0, "f32", reps) != 0) {
        fprintf(stderr, "bench_decode: a check failed\n");
        return 1;
    }
    return 0;
}
