/*
 * test_reader.c - unit tests of the ingest file readers (ingest/dataset.c, idx.c, file.c):
 * ingest_dataset_load over csv, libsvm, f32 and IDX files, gzipped or not.
 *
 * Files are written into a private folder under FRESHET_BINARY_DIR; gzipped
 * copies are made with the gzip command. Nothing is skipped: the gzip command,
 * zlib (which the gzip cases need, as the partial and cut streams below always
 * have) and the Fashion-MNIST files (Debian's dataset-fashion-mnist) are all
 * installed by deploy/setup.sh, and a test whose tool or data is missing fails.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "ingest/ingest.h"
#include "ingest_fixtures.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

static char tmp_dir[512];

/* ------------------------------------------------------------------------
 * Helpers.
 * ---------------------------------------------------------------------- */

/* The path of name inside the test's folder (a static buffer per call site
 * is not needed: callers copy it). */
static void tmp_path(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s", tmp_dir, name);
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (len > 0)
        assert_int_equal(fwrite(data, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

static void write_text(const char *path, const char *text)
{
    write_file(path, text, strlen(text));
}

/* gzip -kf path, making path.gz; returns 0 when it worked. */
static int gzip_file(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "gzip -kf '%s'", path);
    return system(cmd);
}

/* Loads a .gz file that must load (zlib is part of every build the tests
 * run on). */
static void load_gz_ok(ingest_dataset_t *ds, const ingest_schema_t *s, ingest_format_t f,
                       const char *path, const char *labels)
{
    char err[512] = "";
    fr_err_t rc = ingest_dataset_load(ds, s, f, path, labels, err, sizeof(err));
    if (rc != FR_OK)
        fail_msg("load %s: %s", path, err);
}

/* Loads and expects success. */
static void load_ok(ingest_dataset_t *ds, const ingest_schema_t *s, ingest_format_t f,
                    const char *path, const char *labels)
{
    char err[512] = "";
    fr_err_t rc = ingest_dataset_load(ds, s, f, path, labels, err, sizeof(err));
    if (rc != FR_OK)
        fail_msg("load %s: %s (%s)", path, err, fr_strerror(rc));
}

/* Loads and expects the error rc with errstr containing want. */
static void load_fails(const ingest_schema_t *s, ingest_format_t f, const char *path,
                       const char *labels, fr_err_t want_rc, const char *want)
{
    char err[512] = "";
    ingest_dataset_t ds;
    fr_err_t rc = ingest_dataset_load(&ds, s, f, path, labels, err, sizeof(err));
    if (rc != want_rc || strstr(err, want) == NULL)
        fail_msg("load %s: got %d \"%s\", expected %d containing \"%s\"",
                 path != NULL ? path : "(null)", rc, err, want_rc, want);
    ingest_dataset_fini(&ds);
}

static void assert_same_dataset(const ingest_dataset_t *a, const ingest_dataset_t *b)
{
    assert_int_equal(a->n, b->n);
    assert_int_equal(a->features, b->features);
    if (a->n > 0) {
        assert_memory_equal(a->x, b->x, a->n * (size_t)a->features * sizeof(float));
        assert_memory_equal(a->y, b->y, a->n * sizeof(float));
    }
    assert_memory_equal(a->rejected, b->rejected, sizeof(a->rejected));
    assert_memory_equal(a->first_bad_line, b->first_bad_line, sizeof(a->first_bad_line));
}
/* ------------------------------------------------------------------------
 * csv and libsvm files.
 * ---------------------------------------------------------------------- */

static void test_load_csv_skips_header_and_blank_lines_and_counts_rejections(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_CLASS, 3);
    ingest_dataset_t ds;
    char path[600];

    tmp_path(path, sizeof(path), "mixed.csv");
    write_text(path, "label,a,b\n" /* 1: header, skipped */
                     "1,0.5,2\n"   /* 2 */
                     "\n"          /* 3: blank */
                     "  \t\r\n"    /* 4: blank */
                     "2,1,1\r\n"   /* 5 */
                     "x,1,1\n"     /* 6: bad_number (not the first line) */
                     "1,2\n"       /* 7: feature_count */
                     "1,nan,2\n"   /* 8: nonfinite */
                     "7,1,1\n"     /* 9: label_range */
                     "1,2\n"       /* 10: feature_count again */
                     "0,3,4");     /* 11: no final newline */
    load_ok(&ds, &s, INGEST_FORMAT_CSV, path, NULL);
    assert_int_equal(ds.n, 3);
    assert_int_equal(ds.features, 2);
    const float x[] = {0.5f, 2, 1, 1, 3, 4}, y[] = {1, 2, 0};
    assert_memory_equal(ds.x, x, sizeof(x));
    assert_memory_equal(ds.y, y, sizeof(y));
    assert_int_equal(ds.rejected[INGEST_REJECT_BAD_NUMBER], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_BAD_NUMBER], 6);
    assert_int_equal(ds.rejected[INGEST_REJECT_FEATURE_COUNT], 2);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_FEATURE_COUNT], 7);
    assert_int_equal(ds.rejected[INGEST_REJECT_NONFINITE], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_NONFINITE], 8);
    assert_int_equal(ds.rejected[INGEST_REJECT_LABEL_RANGE], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_LABEL_RANGE], 9);
    assert_int_equal(ds.rejected[INGEST_REJECT_INDEX_RANGE], 0);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_INDEX_RANGE], 0);
    assert_int_equal(ds.rejected[INGEST_OK], 0);
    ingest_dataset_fini(&ds);
    assert_null(ds.x);
    assert_int_equal(ds.n, 0);
}

static void test_load_csv_counts_a_numeric_first_line_that_fails(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    ingest_dataset_t ds;
    char path[600];

    /* "nan", "inf" and exponents are numbers, not a header. */
    tmp_path(path, sizeof(path), "first_nan.csv");
    write_text(path, "\n1,NaN,2e5\n0,1,1\n");
    load_ok(&ds, &s, INGEST_FORMAT_CSV, path, NULL);
    assert_int_equal(ds.n, 1);
    assert_int_equal(ds.rejected[INGEST_REJECT_NONFINITE], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_NONFINITE], 2);
    ingest_dataset_fini(&ds);

    tmp_path(path, sizeof(path), "first_short.csv");
    write_text(path, "1,2\n0,1,1\n");
    load_ok(&ds, &s, INGEST_FORMAT_CSV, path, NULL);
    assert_int_equal(ds.n, 1);
    assert_int_equal(ds.rejected[INGEST_REJECT_FEATURE_COUNT], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_FEATURE_COUNT], 1);
    ingest_dataset_fini(&ds);

    /* Only one header is skipped. */
    tmp_path(path, sizeof(path), "two_headers.csv");
    write_text(path, "y,a,b\ny,a,b\n0,1,1\n");
    load_ok(&ds, &s, INGEST_FORMAT_CSV, path, NULL);
    assert_int_equal(ds.n, 1);
    assert_int_equal(ds.rejected[INGEST_REJECT_BAD_NUMBER], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_BAD_NUMBER], 2);
    ingest_dataset_fini(&ds);
}

static void test_load_csv_grows_past_its_first_allocation(void **state)
{
    ingest_schema_t s = schema_of(3, INGEST_LABEL_REAL, 0);
    ingest_dataset_t ds;
    char path[600];
    const int rows = 5000;

    tmp_path(path, sizeof(path), "many.csv");
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    for (int i = 0; i < rows; i++)
        fprintf(fp, "%d,%d.5,%d,-%d\n", i, i, i * 2, i);
    fclose(fp);
    load_ok(&ds, &s, INGEST_FORMAT_CSV, path, NULL);
    assert_int_equal(ds.n, rows);
    for (int i = 0; i < rows; i += 499) {
        assert_true(same_float(ds.y[i], (float)i));
        assert_true(same_float(ds.x[3 * i], (float)i + 0.5f));
        assert_true(same_float(ds.x[3 * i + 1], (float)(2 * i)));
        assert_true(same_float(ds.x[3 * i + 2], -(float)i));
    }
    ingest_dataset_fini(&ds);
}

static void test_load_csv_counts_oversize_lines_and_keeps_long_legal_ones(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    ingest_dataset_t ds;
    char path[600];
    size_t big = (size_t)3 << 20;

    /* A 3 MiB line (over the default 1 MiB limit) between good ones. */
    tmp_path(path, sizeof(path), "oversize.csv");
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("1,1,1\n", fp);
    for (size_t i = 0; i < big / 2; i++)
        fputs("1,", fp);
    fputs("1\n2,2,2\n", fp);
    for (size_t i = 0; i < big; i++)
        fputc(' ', fp);
    fputs("\n3,3,3\n", fp); /* a line of blanks over the limit is oversize too */
    fclose(fp);
    load_ok(&ds, &s, INGEST_FORMAT_CSV, path, NULL);
    assert_int_equal(ds.n, 3);
    assert_true(same_float(ds.y[2], 3.0f));
    assert_int_equal(ds.rejected[INGEST_REJECT_OVERSIZE], 2);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_OVERSIZE], 2);
    ingest_dataset_fini(&ds);

    /* With a larger limit, a 2.5 MiB libsvm line is read whole. */
    s.max_record = (size_t)4 << 20;
    tmp_path(path, sizeof(path), "long.libsvm");
    fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("1", fp);
    for (size_t i = 0; i < ((size_t)5 << 19); i++)
        fputc(i % 2 ? ' ' : '\t', fp);
    fputs("2:7\n", fp);
    fclose(fp);
    load_ok(&ds, &s, INGEST_FORMAT_LIBSVM, path, NULL);
    assert_int_equal(ds.n, 1);
    assert_true(same_float(ds.x[1], 7.0f));
    ingest_dataset_fini(&ds);

    /* A small explicit limit applies to every line. */
    s.max_record = 6;
    tmp_path(path, sizeof(path), "small_limit.csv");
    /* The limit counts a line without its '\n' (but with a '\r'). */
    write_text(path, "1,2,3\n1,2,3.5\n1,2,3\r\n1,2,\t3\r\n       \n");
    load_ok(&ds, &s, INGEST_FORMAT_CSV, path, NULL);
    assert_int_equal(ds.n, 2);
    assert_int_equal(ds.rejected[INGEST_REJECT_OVERSIZE], 3);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_OVERSIZE], 2);
    ingest_dataset_fini(&ds);
}

static void test_load_libsvm_reads_sparse_lines(void **state)
{
    ingest_schema_t s = schema_of(4, INGEST_LABEL_BINARY, 0);
    ingest_dataset_t ds;
    char path[600];

    tmp_path(path, sizeof(path), "data.libsvm");
    write_text(path, "1 1:0.5 4:2\n" /* 1 */
                     "\n"            /* 2 */
                     "0 2:1 2:3\n"   /* 3: index_range */
                     "0\r\n"         /* 4: no features */
                     "-1 1:1\n"      /* 5: label_range */
                     "1 5:1\n"       /* 6: index_range */
                     "1 1:x\n"       /* 7: bad_number */
                     "0.5 3:-inf\n"  /* 8: nonfinite */
                     "0.5 3:1");     /* 9 */
    load_ok(&ds, &s, INGEST_FORMAT_LIBSVM, path, NULL);
    assert_int_equal(ds.n, 3);
    const float x[] = {0.5f, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1, 0}, y[] = {1, 0, 0.5f};
    assert_memory_equal(ds.x, x, sizeof(x));
    assert_memory_equal(ds.y, y, sizeof(y));
    assert_int_equal(ds.rejected[INGEST_REJECT_INDEX_RANGE], 2);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_INDEX_RANGE], 3);
    assert_int_equal(ds.rejected[INGEST_REJECT_LABEL_RANGE], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_LABEL_RANGE], 5);
    assert_int_equal(ds.rejected[INGEST_REJECT_BAD_NUMBER], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_BAD_NUMBER], 7);
    assert_int_equal(ds.rejected[INGEST_REJECT_NONFINITE], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_NONFINITE], 8);
    ingest_dataset_fini(&ds);

    /* libsvm has no header rule: a first line of words is bad_number. */
    tmp_path(path, sizeof(path), "header.libsvm");
    write_text(path, "label features\n1 1:1\n");
    load_ok(&ds, &s, INGEST_FORMAT_LIBSVM, path, NULL);
    assert_int_equal(ds.n, 1);
    assert_int_equal(ds.rejected[INGEST_REJECT_BAD_NUMBER], 1);
    ingest_dataset_fini(&ds);
}

/* ------------------------------------------------------------------------
 * f32 files.
 * ---------------------------------------------------------------------- */

/* Writes n records of D=2 (label i % 2, features i and -i), record bad_at
 * (0-based, or -1) with a NaN feature, plus extra stray bytes. */
static void write_f32_file(const char *path, int n, int bad_at, size_t extra)
{
    size_t len = (size_t)n * 12 + extra;
    unsigned char *buf = calloc(1, len + 1);
    assert_non_null(buf);
    for (int i = 0; i < n; i++) {
        put_f32le(buf + 12 * i, (float)(i % 2));
        put_f32le(buf + 12 * i + 4, i == bad_at ? NAN : (float)i);
        put_f32le(buf + 12 * i + 8, -(float)i);
    }
    write_file(path, buf, len);
    free(buf);
}

static void test_load_f32_reads_records_and_counts_rejections(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_CLASS, 2);
    ingest_dataset_t ds;
    char path[600];

    tmp_path(path, sizeof(path), "data.f32");
    write_f32_file(path, 100000, 1, 0); /* more than one read chunk */
    load_ok(&ds, &s, INGEST_FORMAT_F32, path, NULL);
    assert_int_equal(ds.n, 99999);
    assert_int_equal(ds.rejected[INGEST_REJECT_NONFINITE], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_NONFINITE], 2);
    assert_true(same_float(ds.y[0], 0.0f));
    assert_true(same_float(ds.y[1], 0.0f)); /* record 3 */
    assert_true(same_float(ds.x[2], 2.0f));
    assert_true(same_float(ds.x[3], -2.0f));
    assert_true(same_float(ds.x[2 * 99998], 99999.0f));
    ingest_dataset_fini(&ds);
}

static void test_load_f32_rejects_a_partial_record(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    char path[600];

    tmp_path(path, sizeof(path), "partial.f32");
    write_f32_file(path, 3, -1, 5);
    load_fails(&s, INGEST_FORMAT_F32, path, NULL, FR_ERR_PARSE,
               "holds 41 bytes, not a whole number of 12-byte records");
}

/* ------------------------------------------------------------------------
 * Errors common to every format.
 * ---------------------------------------------------------------------- */

static void test_load_of_a_missing_file_is_an_io_error_naming_it(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    char path[600];

    tmp_path(path, sizeof(path), "no-such-file.csv");
    load_fails(&s, INGEST_FORMAT_CSV, path, NULL, FR_ERR_IO, "no-such-file.csv");
    load_fails(&s, INGEST_FORMAT_CSV, path, NULL, FR_ERR_IO, strerror(ENOENT));
    load_fails(&s, INGEST_FORMAT_F32, "", NULL, FR_ERR_IO, strerror(ENOENT));
    load_fails(&s, INGEST_FORMAT_LIBSVM, tmp_dir, NULL, FR_ERR_IO, tmp_dir);
    tmp_path(path, sizeof(path), "no-such-file.csv.gz");
    ingest_dataset_t ds;
    char err[512] = "";
    fr_err_t rc = ingest_dataset_load(&ds, &s, INGEST_FORMAT_CSV, path, NULL, err, sizeof(err));
    assert_int_equal(rc, FR_ERR_IO);
    assert_non_null(strstr(err, "no-such-file.csv.gz"));
    ingest_dataset_fini(&ds);
}

static void test_load_of_an_empty_file_gives_no_samples(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    ingest_dataset_t ds;
    char path[600];

    tmp_path(path, sizeof(path), "empty");
    write_file(path, "", 0);
    for (int f = INGEST_FORMAT_CSV; f <= INGEST_FORMAT_F32; f++) {
        load_ok(&ds, &s, (ingest_format_t)f, path, NULL);
        assert_int_equal(ds.n, 0);
        ingest_dataset_fini(&ds);
    }
    tmp_path(path, sizeof(path), "blank.csv");
    write_text(path, "\n\n  \n");
    load_ok(&ds, &s, INGEST_FORMAT_CSV, path, NULL);
    assert_int_equal(ds.n, 0);
    for (int r = 0; r < INGEST_REJECT_COUNT; r++)
        assert_int_equal(ds.rejected[r], 0);
    ingest_dataset_fini(&ds);
}

static void test_load_checks_its_arguments(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_CLASS, 0);
    char path[600];

    tmp_path(path, sizeof(path), "args.csv");
    write_text(path, "1,1,1\n");
    load_fails(&s, INGEST_FORMAT_CSV, path, NULL, FR_ERR_INVAL, "classes");
    s = schema_of(0, INGEST_LABEL_REAL, 0);
    load_fails(&s, INGEST_FORMAT_CSV, path, NULL, FR_ERR_INVAL, "features");
    s = schema_of(2, INGEST_LABEL_REAL, 0);
    load_fails(&s, INGEST_FORMAT_CSV, NULL, NULL, FR_ERR_INVAL, "no data file");
    load_fails(&s, INGEST_FORMAT_CSV, path, path, FR_ERR_INVAL, "only used with idx");
    load_fails(&s, (ingest_format_t)7, path, NULL, FR_ERR_INVAL, "unknown format");
    assert_int_equal(ingest_dataset_load(NULL, &s, INGEST_FORMAT_CSV, path, NULL, NULL, 0),
                     FR_ERR_INVAL);
    ingest_dataset_fini(NULL);
}

/* ------------------------------------------------------------------------
 * gzip.
 * ---------------------------------------------------------------------- */

/* Loads path and path.gz and expects the same dataset. */
static void expect_gz_same(const ingest_schema_t *s, ingest_format_t f, const char *path)
{
    char gz[700];
    ingest_dataset_t plain, packed;

    assert_int_equal(gzip_file(path), 0);
    snprintf(gz, sizeof(gz), "%s.gz", path);
    load_ok(&plain, s, f, path, NULL);
    load_gz_ok(&packed, s, f, gz, NULL);
    assert_true(plain.n > 0);
    assert_same_dataset(&plain, &packed);
    ingest_dataset_fini(&plain);
    ingest_dataset_fini(&packed);
}

static void test_load_reads_gzipped_csv_libsvm_and_f32_alike(void **state)
{
    ingest_schema_t s = schema_of(2, INGEST_LABEL_REAL, 0);
    char path[600], gz[700];

    tmp_path(path, sizeof(path), "gz.csv");
    write_text(path, "y,a,b\n1,2,3\n\nx\n4,5,6\r\n7,8,9");
    expect_gz_same(&s, INGEST_FORMAT_CSV, path);
    tmp_path(path, sizeof(path), "gz.libsvm");
    write_text(path, "1 1:2\n3 2:4 1:1\n5 2:6\n");
    expect_gz_same(&s, INGEST_FORMAT_LIBSVM, path);
    tmp_path(path, sizeof(path), "gz.f32");
    write_f32_file(path, 70000, 5, 0);
    expect_gz_same(&s, INGEST_FORMAT_F32, path);

    /* A gzip stream's size is known only at its end: still an error. */
    tmp_path(path, sizeof(path), "gz_partial.f32");
    write_f32_file(path, 4, -1, 7);
    assert_int_equal(gzip_file(path), 0);
    snprintf(gz, sizeof(gz), "%s.gz", path);
    load_fails(&s, INGEST_FORMAT_F32, gz, NULL, FR_ERR_PARSE, "holds 55 bytes");

    /* A cut gzip stream is malformed input. */
    tmp_path(path, sizeof(path), "cut.csv.gz");
    char cmd[1400];
    snprintf(cmd, sizeof(cmd), "head -c 300 '%s/gz.f32.gz' > '%s'", tmp_dir, path);
    assert_int_equal(system(cmd), 0);
    load_fails(&s, INGEST_FORMAT_CSV, path, NULL, FR_ERR_PARSE, "cut.csv.gz");
}

/* ------------------------------------------------------------------------
 * IDX.
 * ---------------------------------------------------------------------- */

/* Writes an IDX file: magic 00 00 type ndims, big-endian dims, then data. */
static void write_idx(const char *path, int type, int ndims, const uint32_t *dims,
                      const unsigned char *data, size_t len)
{
    unsigned char *buf = malloc(4 + 4 * (size_t)ndims + len + 1);
    size_t at = 0;

    assert_non_null(buf);
    buf[at++] = 0;
    buf[at++] = 0;
    buf[at++] = (unsigned char)type;
    buf[at++] = (unsigned char)ndims;
    for (int i = 0; i < ndims; i++) {
        buf[at++] = (unsigned char)(dims[i] >> 24);
        buf[at++] = (unsigned char)(dims[i] >> 16);
        buf[at++] = (unsigned char)(dims[i] >> 8);
        buf[at++] = (unsigned char)dims[i];
    }
    memcpy(buf + at, data, len);
    write_file(path, buf, at + len);
    free(buf);
}

static const unsigned char idx_pixels[3 * 6] = {0,  255, 128, 1,  2,  3,  /* image 0 */
                                                10, 20,  30,  40, 50, 60, /* image 1 */
                                                7,  7,   7,   7,  7,  254};
static const unsigned char idx_labels[3] = {0, 5, 2};

/* Writes the standard small pair: 3 images of 2x3, labels 0 5 2. */
static void write_small_idx(char *img, char *lbl, size_t size)
{
    const uint32_t idims[3] = {3, 2, 3}, ldims[1] = {3};

    tmp_path(img, size, "small-images-idx3-ubyte");
    tmp_path(lbl, size, "small-labels-idx1-ubyte");
    write_idx(img, 0x08, 3, idims, idx_pixels, sizeof(idx_pixels));
    write_idx(lbl, 0x08, 1, ldims, idx_labels, sizeof(idx_labels));
}

static void test_load_idx_scales_pixels_and_skips_bad_labels(void **state)
{
    ingest_schema_t s = schema_of(6, INGEST_LABEL_CLASS, 3);
    ingest_dataset_t ds;
    char img[600], lbl[600], gimg[700], glbl[700];

    write_small_idx(img, lbl, sizeof(img));
    load_ok(&ds, &s, INGEST_FORMAT_IDX, img, lbl);
    assert_int_equal(ds.n, 2);
    assert_int_equal(ds.features, 6);
    assert_int_equal(ds.rejected[INGEST_REJECT_LABEL_RANGE], 1);
    assert_int_equal(ds.first_bad_line[INGEST_REJECT_LABEL_RANGE], 2);
    assert_true(same_float(ds.y[0], 0.0f));
    assert_true(same_float(ds.y[1], 2.0f));
    for (int j = 0; j < 6; j++) {
        assert_true(same_float(ds.x[j], (float)idx_pixels[j] / 255.0f));
        assert_true(same_float(ds.x[6 + j], (float)idx_pixels[12 + j] / 255.0f));
    }
    assert_true(same_float(ds.x[1], 1.0f));
    assert_true(same_float(ds.x[0], 0.0f));

    /* The same through gzip, also mixed with a plain labels file. */
    assert_int_equal(gzip_file(img), 0);
    assert_int_equal(gzip_file(lbl), 0);
    ingest_dataset_t gz;
    snprintf(gimg, sizeof(gimg), "%s.gz", img);
    snprintf(glbl, sizeof(glbl), "%s.gz", lbl);
    load_gz_ok(&gz, &s, INGEST_FORMAT_IDX, gimg, glbl);
    assert_same_dataset(&ds, &gz);
    ingest_dataset_fini(&gz);
    load_gz_ok(&gz, &s, INGEST_FORMAT_IDX, gimg, lbl);
    assert_same_dataset(&ds, &gz);
    ingest_dataset_fini(&gz);
    ingest_dataset_fini(&ds);

    /* Any dimensions whose product is D: 3 images of 6x1x1. */
    const uint32_t flat[4] = {3, 6, 1, 1};
    write_idx(img, 0x08, 4, flat, idx_pixels, sizeof(idx_pixels));
    s.classes = 10;
    load_ok(&ds, &s, INGEST_FORMAT_IDX, img, lbl);
    assert_int_equal(ds.n, 3);
    ingest_dataset_fini(&ds);
}

static void test_load_idx_requires_a_labels_file(void **state)
{
    ingest_schema_t s = schema_of(6, INGEST_LABEL_CLASS, 10);
    char img[600], lbl[600];

    write_small_idx(img, lbl, sizeof(img));
    load_fails(&s, INGEST_FORMAT_IDX, img, NULL, FR_ERR_INVAL, "labels file is required");
    tmp_path(lbl, sizeof(lbl), "missing-labels");
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_IO, "missing-labels");
}

static void test_load_idx_rejects_truncated_files(void **state)
{
    ingest_schema_t s = schema_of(6, INGEST_LABEL_CLASS, 10);
    char img[600], lbl[600];
    const uint32_t idims[3] = {3, 2, 3}, ldims[1] = {3};

    write_small_idx(img, lbl, sizeof(img));
    write_idx(img, 0x08, 3, idims, idx_pixels, sizeof(idx_pixels) - 2);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE,
               "truncated: expected 3 images of 6 bytes, got 16 bytes");
    write_file(img, "\0\0\x08\x03\0\0", 6);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "expected 3 dimension sizes");
    write_file(img, "\0\0", 2);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "expected a 4-byte IDX magic");
    write_file(img, "", 0);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "truncated");

    write_small_idx(img, lbl, sizeof(img));
    write_idx(lbl, 0x08, 1, ldims, idx_labels, 2);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE,
               "truncated: expected 3 labels, got 2");

    /* A header that claims 4e9 items fails before anything that size is
     * allocated, plain or gzipped. */
    const uint32_t huge[1] = {4000000000u};
    write_idx(lbl, 0x08, 1, huge, idx_labels, 3);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE,
               "truncated: expected 4000000000 labels, got 3 bytes");
    assert_int_equal(gzip_file(lbl), 0);
    char glbl[700];
    snprintf(glbl, sizeof(glbl), "%s.gz", lbl);
    load_fails(&s, INGEST_FORMAT_IDX, img, glbl, FR_ERR_PARSE, "more than a");

    /* Pixels cut short inside a gzip stream are found as it is read. */
    char gimg[700];
    write_small_idx(img, lbl, sizeof(img));
    write_idx(img, 0x08, 3, idims, idx_pixels, sizeof(idx_pixels) - 2);
    assert_int_equal(gzip_file(img), 0);
    snprintf(gimg, sizeof(gimg), "%s.gz", img);
    load_fails(&s, INGEST_FORMAT_IDX, gimg, lbl, FR_ERR_PARSE,
               "truncated: expected 3 images of 6 bytes, got 16 bytes");
}

static void test_load_idx_rejects_mismatched_shapes_and_counts(void **state)
{
    ingest_schema_t s = schema_of(6, INGEST_LABEL_CLASS, 10);
    char img[600], lbl[600];
    const uint32_t four[1] = {4}, two_d[2] = {3, 1}, one_d[1] = {18};
    const unsigned char labels4[4] = {0, 1, 2, 3};

    write_small_idx(img, lbl, sizeof(img));
    s.features = 7;
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE,
               "idx: images are 2x3 = 6 features, the model expects 7");
    s.features = 6;

    write_idx(lbl, 0x08, 1, four, labels4, 4);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "has 3 images but");
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "has 4 labels");

    write_idx(lbl, 0x08, 2, two_d, idx_labels, 3);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "this one has 2");

    write_small_idx(img, lbl, sizeof(img));
    write_idx(img, 0x08, 1, one_d, idx_pixels, sizeof(idx_pixels));
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "at least 2 dimensions");
}

static void test_load_idx_rejects_other_types_magic_and_trailing_data(void **state)
{
    ingest_schema_t s = schema_of(6, INGEST_LABEL_CLASS, 10);
    char img[600], lbl[600];
    const uint32_t idims[3] = {3, 2, 3}, ldims[1] = {3};
    unsigned char more[sizeof(idx_pixels) + 1];

    write_small_idx(img, lbl, sizeof(img));
    write_idx(img, 0x0D, 3, idims, idx_pixels, sizeof(idx_pixels));
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_UNSUPPORTED,
               "element type 0x0d (float) is not supported");
    write_file(img, "P5\n28 28\n255\n", 13);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "not an IDX file");

    memcpy(more, idx_pixels, sizeof(idx_pixels));
    more[sizeof(idx_pixels)] = 9;
    write_idx(img, 0x08, 3, idims, more, sizeof(more));
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "unexpected data after the images");
    write_small_idx(img, lbl, sizeof(img));
    write_idx(lbl, 0x08, 1, ldims, more, 4);
    load_fails(&s, INGEST_FORMAT_IDX, img, lbl, FR_ERR_PARSE, "unexpected data after the labels");
}

/*
 * The real Fashion-MNIST files. The expected pixel sums were computed once
 * with /usr/bin/python3's gzip module over the raw files:
 *   im = gzip.open(".../train-images-idx3-ubyte.gz").read()
 *   sum(im[16:16 + 784])  -> 76247 (train), 33456 (t10k)
 *   sum(im[16:])          -> 3431114169 (train), 573469082 (t10k)
 */
static void check_fashion_mnist(const char *split, size_t n, int first_label, uint64_t first_sum,
                                uint64_t total_sum)
{
    ingest_schema_t s = schema_of(784, INGEST_LABEL_CLASS, 10);
    ingest_dataset_t ds;
    char img[256], lbl[256], err[512] = "";

    snprintf(img, sizeof(img), "%s/%s-images-idx3-ubyte.gz", FMNIST_DIR, split);
    snprintf(lbl, sizeof(lbl), "%s/%s-labels-idx1-ubyte.gz", FMNIST_DIR, split);
    uint64_t t0 = fr_clock_mono_ns();
    fr_err_t rc = ingest_dataset_load(&ds, &s, INGEST_FORMAT_IDX, img, lbl, err, sizeof(err));
    double secs = (double)(fr_clock_mono_ns() - t0) / 1e9;
    if (rc != FR_OK)
        fail_msg("%s", err);
    print_message("fashion-mnist %s: %zu samples loaded in %.3f s\n", split, ds.n, secs);
    assert_int_equal(ds.n, n);
    assert_int_equal(ds.features, 784);
    assert_true(same_float(ds.y[0], (float)first_label));
    for (int r = 0; r < INGEST_REJECT_COUNT; r++)
        assert_int_equal(ds.rejected[r], 0);
    uint64_t sum = 0, total = 0;
    float lo = 1, hi = 0;
    for (size_t i = 0; i < n * 784; i++) {
        float v = ds.x[i];
        long k = lrintf(v * 255.0f);
        assert_true(same_float(v, (float)k / 255.0f));
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        total += (uint64_t)k;
        if (i < 784)
            sum += (uint64_t)k;
    }
    assert_true(lo == 0.0f && hi == 1.0f);
    assert_int_equal(sum, first_sum);
    assert_int_equal(total, total_sum);
    for (size_t i = 0; i < n; i++)
        assert_true(ds.y[i] >= 0 && ds.y[i] <= 9 && ds.y[i] == floorf(ds.y[i]));
    ingest_dataset_fini(&ds);
}

static void test_load_fashion_mnist_train_and_test_sets(void **state)
{
    struct stat st;

    if (stat(FMNIST_DIR, &st) != 0)
        fail_msg("%s is missing (Debian: apt-get install dataset-fashion-mnist; deploy/setup.sh "
                 "installs it)",
                 FMNIST_DIR);
    check_fashion_mnist("train", 60000, 9, 76247, 3431114169ull);
    check_fashion_mnist("t10k", 10000, 9, 33456, 573469082ull);
}

/* ------------------------------------------------------------------------
 * The private folder.
 * ---------------------------------------------------------------------- */

static int make_tmp_dir(void **state)
{
    snprintf(tmp_dir, sizeof(tmp_dir), "%s/test_reader.%ld", FRESHET_BINARY_DIR, (long)getpid());
    return mkdir(tmp_dir, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

static int remove_tmp_dir(void **state)
{
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The next line of f, which must be want. */
static void next_line(ingest_file_t *f, const char *want)
{
    const char *line;
    size_t len;
    char err[256];
    assert_int_equal(ingest_file_line(f, &line, &len, err, sizeof(err)), FR_OK);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(line, want, len);
}

/*
 * Record files, plain and gzip: lines without their "\n" or "\r\n" (a
 * blank line is a record of length 0, the last line needs no newline), a
 * line over the limit refused and skipped to its newline, however the
 * reads cut it; records after their length, with a cut or foreign file
 * named by its record.
 */
static void test_record_files_give_lines_and_framed_records(void **state)
{
    (void)state;
    char path[600], gz[620], err[256];
    static char text[3 * 1024 * 1024];
    size_t n = 0;
    n += (size_t)sprintf(text + n, "one\r\n\ntwo\n");
    memset(text + n, 'x', 2 * 1024 * 1024 + 17); /* longer than a read and than the limit */
    n += 2 * 1024 * 1024 + 17;
    n += (size_t)sprintf(text + n, "\nthree\nfour");
    tmp_path(path, sizeof(path), "records.txt");
    write_file(path, text, n);
    assert_int_equal(gzip_file(path), 0);
    snprintf(gz, sizeof(gz), "%s.gz", path);
    for (int k = 0; k < 2; k++) {
        ingest_file_t *f = ingest_file_open(k == 0 ? path : gz, 100, err, sizeof(err));
        assert_non_null(f);
        next_line(f, "one");
        next_line(f, "");
        next_line(f, "two");
        const char *line;
        size_t len;
        assert_int_equal(ingest_file_line(f, &line, &len, err, sizeof(err)), FR_ERR_RANGE);
        assert_non_null(strstr(err, "a line longer than 100 bytes"));
        next_line(f, "three");
        next_line(f, "four");
        assert_int_equal(ingest_file_line(f, &line, &len, err, sizeof(err)), FR_ERR_NOTFOUND);
        ingest_file_close(f);
    }

    /* framed: 3 bytes, 0 bytes, 5 bytes; then the same cut inside the last */
    const unsigned char framed[] = {3, 0, 0, 0, 'a', 'b', 'c', 0,   0,   0,
                                    0, 5, 0, 0, 0,   '1', '2', '3', '4', '5'};
    tmp_path(path, sizeof(path), "records.bin");
    write_file(path, framed, sizeof(framed));
    ingest_file_t *f = ingest_file_open(path, 16, err, sizeof(err));
    assert_non_null(f);
    const void *rec;
    size_t len;
    size_t want[] = {3, 0, 5};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ingest_file_framed(f, &rec, &len, err, sizeof(err)), FR_OK);
        assert_int_equal(len, want[i]);
    }
    assert_memory_equal(rec, "12345", 5);
    assert_int_equal(ingest_file_framed(f, &rec, &len, err, sizeof(err)), FR_ERR_NOTFOUND);
    ingest_file_close(f);
    write_file(path, framed, sizeof(framed) - 2);
    assert_non_null(f = ingest_file_open(path, 16, err, sizeof(err)));
    assert_int_equal(ingest_file_framed(f, &rec, &len, err, sizeof(err)), FR_OK);
    assert_int_equal(ingest_file_framed(f, &rec, &len, err, sizeof(err)), FR_OK);
    assert_int_equal(ingest_file_framed(f, &rec, &len, err, sizeof(err)), FR_ERR_PARSE);
    assert_non_null(strstr(err, "record 3: a length of 5 bytes, cut short"));
    ingest_file_close(f);
    assert_non_null(f = ingest_file_open(path, 4, err, sizeof(err))); /* 5 > 4 */
    assert_int_equal(ingest_file_framed(f, &rec, &len, err, sizeof(err)), FR_OK);
    assert_int_equal(ingest_file_framed(f, &rec, &len, err, sizeof(err)), FR_OK);
    assert_int_equal(ingest_file_framed(f, &rec, &len, err, sizeof(err)), FR_ERR_PARSE);
    assert_non_null(strstr(err, "record 3: a length of 5 bytes, more than 4"));
    ingest_file_close(f);
    tmp_path(path, sizeof(path), "absent");
    assert_null(ingest_file_open(path, 16, err, sizeof(err)));
    assert_non_null(strstr(err, "cannot open"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_csv_skips_header_and_blank_lines_and_counts_rejections),
        cmocka_unit_test(test_load_csv_counts_a_numeric_first_line_that_fails),
        cmocka_unit_test(test_load_csv_grows_past_its_first_allocation),
        cmocka_unit_test(test_load_csv_counts_oversize_lines_and_keeps_long_legal_ones),
        cmocka_unit_test(test_load_libsvm_reads_sparse_lines),
        cmocka_unit_test(test_load_f32_reads_records_and_counts_rejections),
        cmocka_unit_test(test_load_f32_rejects_a_partial_record),
        cmocka_unit_test(test_load_of_a_missing_file_is_an_io_error_naming_it),
        cmocka_unit_test(test_load_of_an_empty_file_gives_no_samples),
        cmocka_unit_test(test_load_checks_its_arguments),
        cmocka_unit_test(test_load_reads_gzipped_csv_libsvm_and_f32_alike),
        cmocka_unit_test(test_load_idx_scales_pixels_and_skips_bad_labels),
        cmocka_unit_test(test_load_idx_requires_a_labels_file),
        cmocka_unit_test(test_load_idx_rejects_truncated_files),
        cmocka_unit_test(test_load_idx_rejects_mismatched_shapes_and_counts),
        cmocka_unit_test(test_load_idx_rejects_other_types_magic_and_trailing_data),
        cmocka_unit_test(test_load_fashion_mnist_train_and_test_sets),
        cmocka_unit_test(test_record_files_give_lines_and_framed_records),
    };
    return cmocka_run_group_tests(tests, make_tmp_dir, remove_tmp_dir);
}
