/*
 * reader.c - whole data files into memory: csv, libsvm and f32 records
 * through the codecs, and IDX image/label pairs (MNIST, Fashion-MNIST).
 *
 * Files are streamed in chunks (through zlib's gzread for names ending
 * ".gz"), so a text file never needs to fit in memory twice. Rejected
 * records are counted and skipped; a file that cannot be opened, read or
 * framed is an error. Reentrant: a load touches only its own dataset.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef FRESHET_HAVE_ZLIB
#include <zlib.h>
#endif

#include "ingest/ingest.h"
#include "ingest/ingest_int.h"

/* Bytes asked of the file per read. */
#define READ_CHUNK ((size_t)1 << 20)

/* Rows allocated at first for csv and libsvm; doubled as needed. */
#define FIRST_ROWS ((size_t)1024)

/* ------------------------------------------------------------------------
 * Sources: a plain file or a gzip stream, read to the end.
 * ---------------------------------------------------------------------- */

typedef struct source {
    const char *path;
    long long disk; /* bytes on disk of a regular file, -1 when unknown */
    int compressed; /* read through zlib */
    FILE *fp;
#ifdef FRESHET_HAVE_ZLIB
    gzFile gz;
#endif
} source_t;

/* Deflate never expands more than 1032:1, so a gzip file of n bytes holds
 * at most about 1032 n bytes of data. */
#define GZIP_MAX_RATIO 1032

/* The size of a regular file open as fd, or -1. */
static long long fd_size(int fd)
{
    struct stat st;

    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return -1;
    return (long long)st.st_size;
}

static int path_is_gz(const char *path)
{
    size_t len = strlen(path);
    return len >= 3 && strcmp(path + len - 3, ".gz") == 0;
}

/*
 * Opens path for reading, through zlib when its name ends ".gz". Returns
 * FR_ERR_IO naming the path and the system's reason when it cannot be
 * opened, FR_ERR_UNSUPPORTED for a .gz file in a build without zlib. On
 * error there is nothing to close.
 */
static fr_err_t source_open(source_t *src, const char *path, char *errstr, size_t size)
{
    memset(src, 0, sizeof(*src));
    src->path = path;
    src->disk = -1;
    if (path_is_gz(path)) {
#ifdef FRESHET_HAVE_ZLIB
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return fr_errorf(FR_ERR_IO, errstr, size, "cannot open %s: %s", path, strerror(errno));
        src->disk = fd_size(fd);
        src->compressed = 1;
        src->gz = gzdopen(fd, "rb");
        if (src->gz == NULL) {
            close(fd);
            return fr_errorf(FR_ERR_NOMEM, errstr, size, "%s: zlib could not start", path);
        }
        gzbuffer(src->gz, 1u << 18);
        return FR_OK;
#else
        return fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                         "%s: this build has no zlib, so .gz files cannot be read "
                         "(rebuild with zlib, or gunzip the file first)",
                         path);
#endif
    }
    src->fp = fopen(path, "rb");
    if (src->fp == NULL)
        return fr_errorf(FR_ERR_IO, errstr, size, "cannot open %s: %s", path, strerror(errno));
    src->disk = fd_size(fileno(src->fp));
    return FR_OK;
}

static void source_close(source_t *src)
{
    if (src->fp != NULL)
        fclose(src->fp);
#ifdef FRESHET_HAVE_ZLIB
    if (src->gz != NULL)
        gzclose(src->gz);
#endif
    memset(src, 0, sizeof(*src));
}

/*
 * Reads up to want bytes into buf; *got < want only at the end of the data.
 * Returns FR_ERR_IO when the system fails a read, FR_ERR_PARSE when a gzip
 * stream is corrupt or cut short, with errstr naming the file.
 */
static fr_err_t source_read(source_t *src, void *buf, size_t want, size_t *got, char *errstr,
                            size_t size)
{
    *got = 0;
#ifdef FRESHET_HAVE_ZLIB
    if (src->gz != NULL) {
        while (*got < want) {
            size_t chunk = want - *got;
            if (chunk > (1u << 30))
                chunk = 1u << 30;
            int r = gzread(src->gz, (char *)buf + *got, (unsigned)chunk);
            if (r < 0) {
                int zerr;
                const char *msg = gzerror(src->gz, &zerr);
                if (zerr == Z_ERRNO)
                    return fr_errorf(FR_ERR_IO, errstr, size, "cannot read %s: %s", src->path,
                                     strerror(errno));
                return fr_errorf(FR_ERR_PARSE, errstr, size, "%s: gzip: %s", src->path, msg);
            }
            if (r == 0) {
                /* gzread reports a stream cut short as a plain end of
                 * file; gzerror tells the two apart. */
                int zerr;
                gzerror(src->gz, &zerr);
                if (zerr == Z_BUF_ERROR)
                    return fr_errorf(FR_ERR_PARSE, errstr, size,
                                     "%s: gzip: unexpected end of file (the file is cut short)",
                                     src->path);
                break;
            }
            *got += (size_t)r;
        }
        return FR_OK;
    }
#endif
    *got = fread(buf, 1, want, src->fp);
    if (*got < want && ferror(src->fp))
        return fr_errorf(FR_ERR_IO, errstr, size, "cannot read %s: %s", src->path, strerror(errno));
    return FR_OK;
}

/* FR_OK when the source is at its end, FR_ERR_PARSE naming what followed. */
static fr_err_t source_expect_end(source_t *src, const char *after, char *errstr, size_t size)
{
    unsigned char c;
    size_t got;
    fr_err_t rc = source_read(src, &c, 1, &got, errstr, size);

    if (rc != FR_OK)
        return rc;
    if (got != 0)
        return fr_errorf(FR_ERR_PARSE, errstr, size, "idx: %s: unexpected data after %s", src->path,
                         after);
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Dataset bookkeeping.
 * ---------------------------------------------------------------------- */

/*
 * Makes room for at least rows samples, doubling from *cap (or setting it
 * exactly when exact is non-zero). On failure ds keeps its old arrays, so
 * ingest_dataset_fini() still frees everything.
 */
static fr_err_t dataset_reserve(ingest_dataset_t *ds, size_t *cap, size_t rows, int exact,
                                char *errstr, size_t size)
{
    size_t d = (size_t)ds->features, ncap = *cap;

    if (rows <= *cap)
        return FR_OK;
    if (exact) {
        ncap = rows;
    } else {
        if (ncap < FIRST_ROWS)
            ncap = FIRST_ROWS;
        while (ncap < rows && ncap <= SIZE_MAX / 2)
            ncap *= 2;
    }
    if (ncap < rows || ncap > SIZE_MAX / sizeof(float) / d)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "too many samples (%zu of %zu features)", rows,
                         d);
    float *nx = realloc(ds->x, ncap * d * sizeof(float));
    if (nx == NULL)
        goto nomem;
    ds->x = nx;
    float *ny = realloc(ds->y, ncap * sizeof(float));
    if (ny == NULL)
        goto nomem;
    ds->y = ny;
    *cap = ncap;
    return FR_OK;
nomem:
    return fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory for %zu samples of %zu features",
                     ncap, d);
}

/* Gives back the rows allocated beyond n (realloc may move them; a failed
 * shrink keeps the larger arrays, which is harmless). */
static void dataset_shrink(ingest_dataset_t *ds, size_t cap)
{
    if (ds->n == 0 || ds->n >= cap)
        return;
    float *nx = realloc(ds->x, ds->n * (size_t)ds->features * sizeof(float));
    if (nx != NULL)
        ds->x = nx;
    float *ny = realloc(ds->y, ds->n * sizeof(float));
    if (ny != NULL)
        ds->y = ny;
}

static void dataset_reject(ingest_dataset_t *ds, ingest_reject_t r, uint64_t where)
{
    ds->rejected[r]++;
    if (ds->first_bad_line[r] == 0)
        ds->first_bad_line[r] = where;
}

/* ------------------------------------------------------------------------
 * csv and libsvm: one record a line.
 * ---------------------------------------------------------------------- */

typedef struct text_state {
    ingest_dataset_t *ds;
    const ingest_schema_t *schema;
    ingest_format_t format;
    size_t cap;      /* rows allocated in ds */
    uint64_t line;   /* 1-based number of the line being handled */
    int seen_record; /* a non-blank line was seen: no header after it */
} text_state_t;

static int is_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

static int is_blank_line(const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (!is_space(p[i]))
            return 0;
    }
    return 1;
}

/* Whether p[i..] starts with word, ignoring ASCII case. */
static int has_word(const char *p, size_t len, size_t i, const char *word)
{
    size_t n = strlen(word);

    if (len - i < n)
        return 0;
    for (size_t k = 0; k < n; k++) {
        if ((p[i + k] | 0x20) != word[k])
            return 0;
    }
    return 1;
}

/*
 * The csv header rule: a line holds a header when it contains an ASCII
 * letter that cannot belong to a number, i.e. one other than the exponent
 * 'e'/'E' and outside the words "nan", "inf" and "infinity". The loader
 * applies it only to the first non-blank line, and only when that line was
 * rejected, so "1,nan,2" as a first line is still counted as nonfinite while
 * "label,pixel1,..." is skipped silently.
 */
static int looks_like_header(const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) || c == 'e' || c == 'E')
            continue;
        if (has_word(p, len, i, "infinity"))
            i += 7;
        else if (has_word(p, len, i, "inf") || has_word(p, len, i, "nan"))
            i += 2;
        else
            return 1;
    }
    return 0;
}

/*
 * Handles one line (without its '\n'): blank lines are skipped, a first
 * csv line that looks like a header is skipped, anything else is decoded
 * straight into the next row of the dataset and counted if rejected. A line
 * over the record limit is oversize even when blank, as it is when
 * load_text() meets it across reads.
 */
static fr_err_t text_line(text_state_t *st, const char *p, size_t len, char *errstr, size_t size)
{
    ingest_dataset_t *ds = st->ds;

    st->line++;
    if (len <= ingest_text_limit(st->schema) && is_blank_line(p, len))
        return FR_OK;
    fr_err_t rc = dataset_reserve(ds, &st->cap, ds->n + 1, 0, errstr, size);
    if (rc != FR_OK)
        return rc;
    ingest_reject_t r = ingest_decode(st->schema, st->format, p, len,
                                      ds->x + ds->n * (size_t)ds->features, ds->y + ds->n);
    int first = !st->seen_record;
    st->seen_record = 1;
    if (r == INGEST_OK)
        ds->n++;
    else if (!(first && st->format == INGEST_FORMAT_CSV && looks_like_header(p, len)))
        dataset_reject(ds, r, st->line);
    return FR_OK;
}

/*
 * Reads a csv or libsvm source line by line. A line longer than the record
 * limit is counted as oversize as soon as that is certain and discarded up
 * to its newline, so the buffer never holds more than one record's worth
 * (plus a read chunk).
 */
static fr_err_t load_text(text_state_t *st, source_t *src, char *errstr, size_t size)
{
    size_t limit = ingest_text_limit(st->schema), cap = READ_CHUNK, have = 0;
    int skipping = 0, eof = 0;
    fr_err_t rc = FR_OK;
    char *buf = malloc(cap);

    if (buf == NULL)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory reading %s", src->path);
    while (!eof) {
        size_t got;
        rc = source_read(src, buf + have, cap - have, &got, errstr, size);
        if (rc != FR_OK)
            goto out;
        eof = got < cap - have;
        char *ls = buf, *from = buf + have, *end = buf + have + got, *nl;
        while ((nl = memchr(from, '\n', (size_t)(end - from))) != NULL) {
            if (skipping)
                skipping = 0; /* the end of an oversize line, counted already */
            else if ((rc = text_line(st, ls, (size_t)(nl - ls), errstr, size)) != FR_OK)
                goto out;
            ls = from = nl + 1;
        }
        have = (size_t)(end - ls);
        if (skipping) {
            have = 0;
            continue;
        }
        if (eof) {
            if (have > 0)
                rc = text_line(st, ls, have, errstr, size);
            break;
        }
        memmove(buf, ls, have);
        if (have > limit) {
            st->line++;
            st->seen_record = 1;
            dataset_reject(st->ds, INGEST_REJECT_OVERSIZE, st->line);
            skipping = 1;
            have = 0;
        } else if (have == cap) {
            char *nbuf = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (nbuf == NULL) {
                rc = fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory for a line of %s",
                               src->path);
                goto out;
            }
            buf = nbuf;
            cap *= 2;
        }
    }
out:
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------
 * f32: concatenated 4(D+1)-byte records.
 * ---------------------------------------------------------------------- */

static fr_err_t f32_bad_size(const char *path, unsigned long long bytes, size_t rec, int d,
                             char *errstr, size_t size)
{
    return fr_errorf(FR_ERR_PARSE, errstr, size,
                     "f32: %s holds %llu bytes, not a whole number of %zu-byte records "
                     "(a float32 label and %d float32 features each)",
                     path, bytes, rec, d);
}

/*
 * Decodes every record of an f32 source. A plain file's size is checked
 * (and x sized exactly) before anything is decoded; a gzip stream's total
 * is known only at its end, so its arrays grow as records arrive.
 */
static fr_err_t load_f32(ingest_dataset_t *ds, const ingest_schema_t *schema, source_t *src,
                         char *errstr, size_t size)
{
    size_t d = (size_t)schema->features, cap = 0;
    unsigned long long total = 0;
    uint64_t recno = 0;
    fr_err_t rc = FR_OK;

    if (d > SIZE_MAX / 4 - 1)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "f32: %zu features is too many", d);
    size_t rec = 4 * (d + 1);
    long long fsize = src->compressed ? -1 : src->disk;
    if (fsize >= 0) {
        if ((unsigned long long)fsize % rec != 0)
            return f32_bad_size(src->path, (unsigned long long)fsize, rec, (int)d, errstr, size);
        rc = dataset_reserve(ds, &cap, (size_t)fsize / rec, 1, errstr, size);
        if (rc != FR_OK)
            return rc;
    }
    size_t per = READ_CHUNK / rec > 0 ? READ_CHUNK / rec : 1;
    unsigned char *buf = malloc(per * rec);
    if (buf == NULL)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory reading %s", src->path);
    for (;;) {
        size_t got;
        rc = source_read(src, buf, per * rec, &got, errstr, size);
        if (rc != FR_OK)
            break;
        total += got;
        for (size_t i = 0; i + rec <= got; i += rec) {
            rc = dataset_reserve(ds, &cap, ds->n + 1, 0, errstr, size);
            if (rc != FR_OK)
                goto out;
            ingest_reject_t r = ingest_decode(schema, INGEST_FORMAT_F32, buf + i, rec,
                                              ds->x + ds->n * d, ds->y + ds->n);
            recno++;
            if (r == INGEST_OK)
                ds->n++;
            else
                dataset_reject(ds, r, recno);
        }
        if (got < per * rec) {
            if (got % rec != 0)
                rc = f32_bad_size(src->path, total, rec, (int)d, errstr, size);
            break;
        }
    }
    if (rc == FR_OK)
        dataset_shrink(ds, cap);
out:
    free(buf);
    return rc;
}

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

/*
 * Reads and checks an IDX header: the magic, element type 0x08 (the only
 * one needed: MNIST-style pixels and labels) and the dimension sizes.
 * FR_ERR_PARSE for a file that is not IDX or is cut short,
 * FR_ERR_UNSUPPORTED for another element type.
 */
static fr_err_t idx_read_header(source_t *src, idx_header_t *h, char *errstr, size_t size)
{
    unsigned char m[4], raw[4 * IDX_MAX_DIMS];
    size_t got;
    fr_err_t rc = source_read(src, m, 4, &got, errstr, size);

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
    rc = source_read(src, raw, 4 * (size_t)h->ndims, &got, errstr, size);
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
static fr_err_t idx_check_room(const source_t *src, uint64_t hdr, uint64_t want,
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
    source_t src;
    idx_header_t h;
    size_t got;
    fr_err_t rc = source_open(&src, path, errstr, size);

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
    rc = source_read(&src, *labels, *n, &got, errstr, size);
    if (rc == FR_OK && got < *n)
        rc = fr_errorf(FR_ERR_PARSE, errstr, size,
                       "idx: %s: truncated: expected %zu labels, got %zu", path, *n, got);
    if (rc == FR_OK)
        rc = source_expect_end(&src, "the labels", errstr, size);
out:
    source_close(&src);
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
    source_t src;
    idx_header_t h;
    char shape[128];

    if (path == NULL || features == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: no images file given");
    fr_err_t rc = source_open(&src, path, errstr, size);
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
    source_close(&src);
    return rc;
}

/*
 * Loads IDX images scaled to [0,1] (pixel / 255.0f) with the labels of
 * labels_path. Samples whose label breaks the schema's rule are counted
 * (first_bad_line is then the 1-based sample number) and skipped.
 */
static fr_err_t load_idx(ingest_dataset_t *ds, const ingest_schema_t *schema, source_t *src,
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
        (rc = dataset_reserve(ds, &cap, nlabels, 1, errstr, size)) != FR_OK)
        goto out;
    for (int k = 0; k < 256; k++)
        scale[k] = (float)k / 255.0f;
    size_t per = READ_CHUNK / d > 0 ? READ_CHUNK / d : 1;
    if (per > nlabels)
        per = nlabels > 0 ? nlabels : 1;
    buf = malloc(per * d);
    if (buf == NULL) {
        rc = fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory reading %s", src->path);
        goto out;
    }
    while (done < nlabels) {
        size_t want = (nlabels - done < per ? nlabels - done : per), got;
        if ((rc = source_read(src, buf, want * d, &got, errstr, size)) != FR_OK)
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
                dataset_reject(ds, r, done + 1);
                continue;
            }
            const unsigned char *px = buf + i * d;
            float *row = ds->x + ds->n * d;
            for (size_t j = 0; j < d; j++)
                row[j] = scale[px[j]];
            ds->y[ds->n++] = label;
        }
    }
    rc = source_expect_end(src, "the images", errstr, size);
    if (rc == FR_OK)
        dataset_shrink(ds, cap);
out:
    free(buf);
    free(labels);
    return rc;
}

/* ------------------------------------------------------------------------
 * The public entry points.
 * ---------------------------------------------------------------------- */

/* Checks the arguments of ingest_dataset_load() that need no file. */
static fr_err_t check_args(const ingest_schema_t *schema, ingest_format_t format,
                           const char *data_path, const char *labels_path, char *errstr,
                           size_t size)
{
    if (schema == NULL || schema->features <= 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: the schema needs features > 0");
    if (schema->label == INGEST_LABEL_CLASS && schema->classes <= 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: class labels need classes > 0");
    if ((unsigned)format > INGEST_FORMAT_IDX)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: unknown format %d", (int)format);
    if (data_path == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: no data file given");
    if (format == INGEST_FORMAT_IDX && labels_path == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "idx: %s: a labels file is required (IDX keeps labels in a file of "
                         "their own)",
                         data_path);
    if (format != INGEST_FORMAT_IDX && labels_path != NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "%s: a labels file is only used with idx; %s records carry their label",
                         ingest_format_name(format), ingest_format_name(format));
    return FR_OK;
}

/*
 * Loads a data file (see ingest.h). Errors: FR_ERR_INVAL for bad
 * arguments, FR_ERR_IO when a file cannot be opened or read,
 * FR_ERR_UNSUPPORTED for .gz without zlib or an IDX element type other than
 * unsigned byte, FR_ERR_PARSE for a file that cannot be framed (f32 size,
 * IDX header, shape, counts, truncation, corrupt gzip), FR_ERR_NOMEM.
 * Whatever happens, ds owns its arrays and ingest_dataset_fini() frees them.
 */
fr_err_t ingest_dataset_load(ingest_dataset_t *ds, const ingest_schema_t *schema,
                             ingest_format_t format, const char *data_path, const char *labels_path,
                             char *errstr, size_t size)
{
    source_t src;

    if (ds == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: no dataset given");
    memset(ds, 0, sizeof(*ds));
    fr_err_t rc = check_args(schema, format, data_path, labels_path, errstr, size);
    if (rc != FR_OK)
        return rc;
    ds->features = schema->features;
    rc = source_open(&src, data_path, errstr, size);
    if (rc != FR_OK)
        return rc;
    switch (format) {
    case INGEST_FORMAT_CSV:
    case INGEST_FORMAT_LIBSVM: {
        text_state_t st = {.ds = ds, .schema = schema, .format = format};
        rc = load_text(&st, &src, errstr, size);
        if (rc == FR_OK)
            dataset_shrink(ds, st.cap);
        break;
    }
    case INGEST_FORMAT_F32: rc = load_f32(ds, schema, &src, errstr, size); break;
    case INGEST_FORMAT_IDX: rc = load_idx(ds, schema, &src, labels_path, errstr, size); break;
    }
    source_close(&src);
    return rc;
}

void ingest_dataset_fini(ingest_dataset_t *ds)
{
    if (ds == NULL)
        return;
    free(ds->x);
    free(ds->y);
    memset(ds, 0, sizeof(*ds));
}

/* ------------------------------------------------------------------------
 * Record files read one record at a time (ingest.h "Record files"): lines,
 * or records each after its length. The buffer holds the records not yet
 * returned; it grows to the longest record allowed, and a line longer is
 * skipped to its newline.
 * ---------------------------------------------------------------------- */

struct ingest_file {
    source_t src;
    int std;   /* "-": standard input, not closed */
    char *buf; /* [cap]: data read, [start, end) not yet returned */
    size_t cap, start, end, max;
    unsigned long long records; /* framed records returned */
    int eof;
};

ingest_file_t *ingest_file_open(const char *path, size_t max, char *errstr, size_t size)
{
    if (path == NULL || max == 0 || max > ((size_t)1 << 30)) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: bad file or record limit");
        return NULL;
    }
    ingest_file_t *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "ingest: out of memory");
        return NULL;
    }
    f->max = max;
    /* room for a record, its length or its "\r\n", and more to read */
    f->cap = max + 8 <= READ_CHUNK ? READ_CHUNK : max + 8;
    if ((f->buf = malloc(f->cap)) == NULL) {
        free(f);
        fr_errorf(FR_ERR_NOMEM, errstr, size, "ingest: out of memory");
        return NULL;
    }
    int std = strcmp(path, "-") == 0;
    memset(&f->src, 0, sizeof(f->src));
    f->src.path = std ? "standard input" : path;
    f->src.disk = -1;
#ifdef FRESHET_HAVE_ZLIB
    /* through zlib whatever the name: it reads plain data as it is, so a
     * gzip stream is recognised by its content (zcat-free pipes too) */
    int fd = std ? dup(0) : open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && (f->src.gz = gzdopen(fd, "rb")) == NULL)
        close(fd);
    if (f->src.gz != NULL) {
        gzbuffer(f->src.gz, 1u << 18);
        f->src.compressed = 1;
        return f;
    }
#else
    if ((f->src.fp = std ? stdin : fopen(path, "rb")) != NULL) {
        f->std = std;
        return f;
    }
#endif
    fr_errorf(FR_ERR_IO, errstr, size, "cannot open %s: %s", f->src.path, strerror(errno));
    free(f->buf);
    free(f);
    return NULL;
}

void ingest_file_close(ingest_file_t *f)
{
    if (f == NULL)
        return;
    if (f->std)
        f->src.fp = NULL; /* standard input stays open */
    source_close(&f->src);
    free(f->buf);
    free(f);
}

/* Reads until [start, end) holds at least want bytes or the file ends:
 * moves what is left to the front and fills the rest of the buffer. */
static fr_err_t file_fill(ingest_file_t *f, size_t want, char *errstr, size_t size)
{
    while (!f->eof && f->end - f->start < want) {
        if (f->start > 0) {
            memmove(f->buf, f->buf + f->start, f->end - f->start);
            f->end -= f->start;
            f->start = 0;
        }
        size_t got = 0;
        fr_err_t err = source_read(&f->src, f->buf + f->end, f->cap - f->end, &got, errstr, size);
        if (err != FR_OK)
            return err;
        f->end += got;
        if (got == 0)
            f->eof = 1;
    }
    return FR_OK;
}

fr_err_t ingest_file_line(ingest_file_t *f, const char **line, size_t *len, char *errstr,
                          size_t size)
{
    int skipping = 0; /* inside a line longer than max */
    size_t scanned = 0;
    for (;;) {
        char *s = f->buf + f->start;
        char *nl = memchr(s + scanned, '\n', f->end - f->start - scanned);
        if (nl != NULL || (f->eof && f->end > f->start)) {
            size_t n = nl != NULL ? (size_t)(nl - s) : f->end - f->start;
            f->start += n + (nl != NULL);
            if (n > 0 && s[n - 1] == '\r')
                n--;
            if (skipping || n > f->max)
                return fr_errorf(FR_ERR_RANGE, errstr, size, "%s: a line longer than %zu bytes",
                                 f->src.path, f->max);
            *line = s;
            *len = n;
            return FR_OK;
        }
        if (f->eof)
            return skipping ? fr_errorf(FR_ERR_RANGE, errstr, size,
                                        "%s: a line longer than %zu bytes", f->src.path, f->max)
                            : FR_ERR_NOTFOUND;
        if (f->end - f->start > f->max + 1) { /* no newline within max + "\r": drop it */
            skipping = 1;
            f->start = f->end;
        }
        scanned = f->end - f->start;
        fr_err_t err = file_fill(f, f->end - f->start + 1, errstr, size);
        if (err != FR_OK)
            return err;
    }
}

fr_err_t ingest_file_framed(ingest_file_t *f, const void **rec, size_t *len, char *errstr,
                            size_t size)
{
    fr_err_t err = file_fill(f, 4, errstr, size);
    if (err != FR_OK)
        return err;
    if (f->end == f->start)
        return FR_ERR_NOTFOUND;
    const unsigned char *h = (const unsigned char *)f->buf + f->start;
    size_t n = f->end - f->start < 4
                   ? SIZE_MAX
                   : (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
    unsigned long long k = f->records + 1;
    if (n == SIZE_MAX)
        return fr_errorf(FR_ERR_PARSE, errstr, size, "%s: record %llu: its length is cut short",
                         f->src.path, k);
    if (n > f->max)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "%s: record %llu: a length of %zu bytes, more than %zu: not records each "
                         "after their length",
                         f->src.path, k, n, f->max);
    if ((err = file_fill(f, 4 + n, errstr, size)) != FR_OK)
        return err;
    if (f->end - f->start < 4 + n)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "%s: record %llu: a length of %zu bytes, cut short", f->src.path, k, n);
    *rec = f->buf + f->start + 4;
    *len = n;
    f->start += 4 + n;
    f->records++;
    return FR_OK;
}
