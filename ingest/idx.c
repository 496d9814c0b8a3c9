/*
 * idx.c - IDX image/label pairs (MNIST, Fashion-MNIST): images scaled to
 * [0,1] with the labels of a file of their own, and the features an images
 * file's header declares.
 *
 * Headers are checked against the file's size before anything is
 * allocated for them, so a corrupt or hostile header cannot ask for more
 * memory than its file could fill.
 *
 * Threads: reentrant; a load touches only its own data set.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ingest/ingest_int.h"

/* Deflate never expands more than 1032:1, so a gzip file of n bytes holds
 * at most about 1032 n bytes of data. */
#define GZIP_MAX_RATIO 1032

/* ------------------------------------------------------------------------
 * IDX (http://yann.lecun.com/exdb/mnist/): a big-endian header
 * 0x00 0x00 type ndims, ndims 32-bit sizes, then the elements row-major.
 * ---------------------------------------------------------------------- */

#define IDX_MAX_DIMS 255

typedef struct idx_header {
    int ndims;
    uint32_t dims[IDX_MAX_DIMS];
} idx_header_t;

static const char *idx_type_name(unsigned type)
{
    switch (type) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    }
    return "unknown";
}

/* FR_OK when the source is at its end, FR_ERR_PARSE naming what followed. */
static fr_err_t idx_expect_end(ingest_source_t *src, const char *after, char *errstr, size_t size)
{
    unsigned char c;
    size_t got;
    fr_err_t rc = ingest_source_read(src, &c, 1, &got, errstr, size);

    if (rc != FR_OK)
        return rc;
    if (got != 0)
        return fr_errorf(FR_ERR_PARSE, errstr, size, "idx: %s: unexpected data after %s", src->path,
                         after);
    return FR_OK;
}

/*
 * Reads and checks an IDX header: the magic, element type 0x08 (the only
 * one needed: MNIST-style pixels and labels) and the dimension sizes.
 * FR_ERR_PARSE for a file that is not IDX or is cut short,
 * FR_ERR_UNSUPPORTED for another element type.
 */
static fr_err_t idx_read_header(ingest_source_t *src, idx_header_t *h, char *errstr, size_t size)
{
    unsigned char m[4], raw[4 * IDX_MAX_DIMS];
    size_t got;
    fr_err_t rc = ingest_source_read(src, m, 4, &got, errstr, size);

    if (rc != FR_OK)
        return rc;
    if (got < 4)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "idx: %s: truncated: expected a 4-byte IDX magic number, got %zu bytes",
                         src->path, got);
    if (m[0] != 0 || m[1] != 0)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "idx: %s: not an IDX file (magic %02x %02x %02x %02x, expected 00 00 "
                         "type ndims)",
                         src->path, m[0], m[1], m[2], m[3]);
    if (m[2] != 0x08)
        return fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                         "idx: %s: element type 0x%02x (%s) is not supported; only 0x08 "
                         "(unsigned byte) is",
                         src->path, m[2], idx_type_name(m[2]));
    h->ndims = m[3];
    if (h->ndims == 0)
        return fr_errorf(FR_ERR_PARSE, errstr, size, "idx: %s: the header has no dimensions",
                         src->path);
    rc = ingest_source_read(src, raw, 4 * (size_t)h->ndims, &got, errstr, size);
    if (rc != FR_OK)
        return rc;
    if (got < 4 * (size_t)h->ndims)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "idx: %s: truncated: expected %d dimension sizes in the header", src->path,
                         h->ndims);
    for (int i = 0; i < h->ndims; i++) {
        const unsigned char *b = raw + 4 * i;
        h->dims[i] = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
    }
    return FR_OK;
}

/*
 * Catches a header that declares more data than its file can hold before
 * anything is allocated for it: exactly for a plain file, by deflate's
 * largest ratio for a gzip file (whose stream is checked again as it is
 * read). want is the byte count after a header of hdr bytes, expected says
 * it in words ("3 images of 784 bytes").
 */
static fr_err_t idx_check_room(const ingest_source_t *src, uint64_t hdr, uint64_t want,
                               const char *expected, char *errstr, size_t size)
{
    if (src->disk < 0)
        return FR_OK;
    uint64_t disk = (uint64_t)src->disk;
    if (!src->compressed && hdr + want > disk)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "idx: %s: truncated: expected %s, got %llu bytes", src->path, expected,
                         (unsigned long long)(disk > hdr ? disk - hdr : 0));
    if (src->compressed && want / GZIP_MAX_RATIO > disk)
        return fr_errorf(
            FR_ERR_PARSE, errstr, size,
            "idx: %s: truncated: expected %s, more than a %llu-byte gzip file can hold", src->path,
            expected, (unsigned long long)disk);
    return FR_OK;
}

/*
 * Reads a whole IDX labels file (1 dimension) into *labels (malloc'ed,
 * caller frees) and *n. FR_ERR_PARSE for any other shape, a short file or
 * trailing data.
 */
static fr_err_t idx_read_labels(const char *path, unsigned char **labels, size_t *n, char *errstr,
                                size_t size)
{
    ingest_source_t src;
    idx_header_t h;
    size_t got;
    fr_err_t rc = ingest_source_open(&src, path, errstr, size);

    *labels = NULL;
    if (rc != FR_OK)
        return rc;
    rc = idx_read_header(&src, &h, errstr, size);
    if (rc != FR_OK)
        goto out;
    if (h.ndims != 1) {
        rc = fr_errorf(FR_ERR_PARSE, errstr, size,
                       "idx: %s: a labels file has 1 dimension, this one has %d", path, h.ndims);
        goto out;
    }
    *n = h.dims[0];
    char expected[64];
    snprintf(expected, sizeof(expected), "%zu labels", *n);
    rc = idx_check_room(&src, 4 + 4 * (uint64_t)h.ndims, *n, expected, errstr, size);
    if (rc != FR_OK)
        goto out;
    *labels = malloc(*n > 0 ? *n : 1);
    if (*labels == NULL) {
        rc = fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory for %zu labels", *n);
        goto out;
    }
    rc = ingest_source_read(&src, *labels, *n, &got, errstr, size);
    if (rc == FR_OK && got < *n)
        rc = fr_errorf(FR_ERR_PARSE, errstr, size,
                       "idx: %s: truncated: expected %zu labels, got %zu", path, *n, got);
    if (rc == FR_OK)
        rc = idx_expect_end(&src, "the labels", errstr, size);
out:
    ingest_source_close(&src);
    return rc;
}

/*
 * The features of an images header: the product of all but the first
 * dimension, with that shape as text in shape ("28x28"). Anything above
 * 2^32 stays above it (and below 2^64). The header has 2 dimensions or more.
 */
static uint64_t idx_image_features(const idx_header_t *h, char *shape, size_t shape_size)
{
    size_t used = 0;
    uint64_t inner = 1;

    shape[0] = '\0';
    for (int i = 1; i < h->ndims; i++) {
        if (inner <= UINT32_MAX)
            inner *= h->dims[i]; /* stays below 2^64; anything above 2^32 cannot match D */
        if (used < shape_size) {
            int k = snprintf(shape + used, shape_size - used, "%s%u", i > 1 ? "x" : "",
                             (unsigned)h->dims[i]);
            used += k > 0 ? (size_t)k : 0;
        }
    }
    return inner;
}

/* FR_ERR_PARSE unless an images header has at least 2 dimensions. */
static fr_err_t idx_check_image_dims(const idx_header_t *h, const char *path, char *errstr,
                                     size_t size)
{
    if (h->ndims < 2)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "idx: %s: an images file has at least 2 dimensions, this one has %d", path,
                         h->ndims);
    return FR_OK;
}

/*
 * Checks an images header against the model: at least 2 dimensions, the
 * product of all but the first equal to D ("28x28 = 784 features"), and as
 * many images as labels.
 */
static fr_err_t idx_check_images(const idx_header_t *h, const char *path, const char *labels_path,
                                 size_t nlabels, int d, char *errstr, size_t size)
{
    char shape[128];
    fr_err_t rc = idx_check_image_dims(h, path, errstr, size);

    if (rc != FR_OK)
        return rc;
    uint64_t inner = idx_image_features(h, shape, sizeof(shape));
    if (inner != (uint64_t)d)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "idx: images are %s = %llu features, the model expects %d", shape,
                         (unsigned long long)inner, d);
    if (h->dims[0] != nlabels)
        return fr_errorf(FR_ERR_PARSE, errstr, size, "idx: %s has %u images but %s has %zu labels",
                         path, (unsigned)h->dims[0], labels_path, nlabels);
    return FR_OK;
}

/*
 * The features a sample of an IDX images file (see ingest.h): its header
 * only is read. FR_ERR_PARSE for a header that is not one of images or
 * whose images have no features or more than INT_MAX.
 */
fr_err_t ingest_idx_features(const char *path, int *features, char *errstr, size_t size)
{
    ingest_source_t src;
    idx_header_t h;
    char shape[128];

    if (path == NULL || features == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: no images file given");
    fr_err_t rc = ingest_source_open(&src, path, errstr, size);
    if (rc != FR_OK)
        return rc;
    if ((rc = idx_read_header(&src, &h, errstr, size)) == FR_OK &&
        (rc = idx_check_image_dims(&h, path, errstr, size)) == FR_OK) {
        uint64_t inner = idx_image_features(&h, shape, sizeof(shape));
        if (inner == 0 || inner > INT_MAX)
            rc = fr_errorf(FR_ERR_PARSE, errstr, size,
                           "idx: %s: images of %s = %llu features are not supported", path, shape,
                           (unsigned long long)inner);
        else
            *features = (int)inner;
    }
    ingest_source_close(&src);
    return rc;
}

/*
 * Loads IDX images scaled to [0,1] (pixel / 255.0f) with the labels of
 * labels_path. Samples whose label breaks the schema's rule are counted
 * (first_bad_line is then the 1-based sample number) and skipped.
 */
fr_err_t ingest_idx_load(ingest_dataset_t *ds, const ingest_schema_t *schema, ingest_source_t *src,
                         const char *labels_path, char *errstr, size_t size)
{
    size_t d = (size_t)schema->features, nlabels = 0, cap = 0, done = 0;
    unsigned char *labels = NULL, *buf = NULL;
    idx_header_t h;
    float scale[256];
    char expected[96];
    fr_err_t rc = idx_read_labels(labels_path, &labels, &nlabels, errstr, size);

    if (rc != FR_OK)
        goto out;
    if ((rc = idx_read_header(src, &h, errstr, size)) != FR_OK ||
        (rc = idx_check_images(&h, src->path, labels_path, nlabels, schema->features, errstr,
                               size)) != FR_OK)
        goto out;
    snprintf(expected, sizeof(expected), "%zu images of %zu bytes", nlabels, d);
    if ((rc = idx_check_room(src, 4 + 4 * (uint64_t)h.ndims, (uint64_t)nlabels * d, expected,
                             errstr, size)) != FR_OK ||
        (rc = ingest_dataset_reserve(ds, &cap, nlabels, 1, errstr, size)) != FR_OK)
        goto out;
    for (int k = 0; k < 256; k++)
        scale[k] = (float)k / 255.0f;
    size_t per = INGEST_READ_CHUNK / d > 0 ? INGEST_READ_CHUNK / d : 1;
    if (per > nlabels)
        per = nlabels > 0 ? nlabels : 1;
    buf = malloc(per * d);
    if (buf == NULL) {
        rc = fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory reading %s", src->path);
        goto out;
    }
    while (done < nlabels) {
        size_t want = (nlabels - done < per ? nlabels - done : per), got;
        if ((rc = ingest_source_read(src, buf, want * d, &got, errstr, size)) != FR_OK)
            goto out;
        if (got < want * d) {
            rc = fr_errorf(FR_ERR_PARSE, errstr, size,
                           "idx: %s: truncated: expected %s, got %llu bytes", src->path, expected,
                           (unsigned long long)(done * d + got));
            goto out;
        }
        for (size_t i = 0; i < want; i++, done++) {
            float label = (float)labels[done];
            ingest_reject_t r = ingest_label_check(schema, label);
            if (r != INGEST_OK) {
                ingest_dataset_reject(ds, r, done + 1);
                continue;
            }
            const unsigned char *px = buf + i * d;
            float *row = ds->x + ds->n * d;
            for (size_t j = 0; j < d; j++)
                row[j] = scale[px[j]];
            ds->y[ds->n++] = label;
        }
    }
    rc = idx_expect_end(src, "the images", errstr, size);
    if (rc == FR_OK)
        ingest_dataset_shrink(ds, cap);
out:
    free(buf);
    free(labels);
    return rc;
}
