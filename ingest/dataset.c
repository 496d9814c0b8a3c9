/*
 * dataset.c - whole data files into memory: csv, libsvm and f32 records
 * through the codecs; IDX image/label pairs are idx.c's.
 *
 * Files are streamed in chunks (source.c, through zlib for names ending
 * ".gz"), so a text file never needs to fit in memory twice. Rejected
 * records are counted and skipped; a file that cannot be opened, read or
 * framed is an error.
 *
 * Threads: reentrant; a load touches only its own data set.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ingest/ingest_int.h"

/* ------------------------------------------------------------------------
 * Dataset bookkeeping.
 * ---------------------------------------------------------------------- */

/*
 * Makes room for at least rows samples: exactly rows when exact is
 * non-zero (a count known from the file's size or header), else x's rows
 * and y grow in step with fr_grow from the same capacity *cap. On failure
 * ds keeps arrays it owns, so ingest_dataset_fini() still frees everything.
 */
fr_err_t ingest_dataset_reserve(ingest_dataset_t *ds, size_t *cap, size_t rows, int exact,
                                char *errstr, size_t size)
{
    size_t d = (size_t)ds->features;

    if (rows <= *cap)
        return FR_OK;
    if (rows > SIZE_MAX / sizeof(float) / d)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "too many samples (%zu of %zu features)", rows,
                         d);
    if (!exact) {
        size_t xcap = *cap, ycap = *cap;
        if (fr_grow((void **)&ds->x, &xcap, rows, d * sizeof(float)) != FR_OK ||
            FR_GROW(ds->y, ycap, rows) != FR_OK)
            goto nomem;
        FR_ASSERT(xcap == ycap); /* the same doubling from the same capacity */
        *cap = xcap;
        return FR_OK;
    }
    float *nx = realloc(ds->x, rows * d * sizeof(float));
    if (nx == NULL)
        goto nomem;
    ds->x = nx;
    float *ny = realloc(ds->y, rows * sizeof(float));
    if (ny == NULL)
        goto nomem;
    ds->y = ny;
    *cap = rows;
    return FR_OK;
nomem:
    return fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory for %zu samples of %zu features",
                     rows, d);
}

/* Gives back the rows allocated beyond n (realloc may move them; a failed
 * shrink keeps the larger arrays, which is harmless). */
void ingest_dataset_shrink(ingest_dataset_t *ds, size_t cap)
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

void ingest_dataset_reject(ingest_dataset_t *ds, ingest_reject_t r, uint64_t where)
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
    fr_err_t rc = ingest_dataset_reserve(ds, &st->cap, ds->n + 1, 0, errstr, size);
    if (rc != FR_OK)
        return rc;
    ingest_reject_t r = ingest_decode(st->schema, st->format, p, len,
                                      ds->x + ds->n * (size_t)ds->features, ds->y + ds->n);
    int first = !st->seen_record;
    st->seen_record = 1;
    if (r == INGEST_OK)
        ds->n++;
    else if (!(first && st->format == INGEST_FORMAT_CSV && looks_like_header(p, len)))
        ingest_dataset_reject(ds, r, st->line);
    return FR_OK;
}

/*
 * Reads a csv or libsvm source line by line. A line longer than the record
 * limit is counted as oversize as soon as that is certain and discarded up
 * to its newline, so the buffer never holds more than one record's worth
 * (plus a read chunk).
 */
static fr_err_t load_text(text_state_t *st, ingest_source_t *src, char *errstr, size_t size)
{
    size_t limit = ingest_text_limit(st->schema), cap = INGEST_READ_CHUNK, have = 0;
    int skipping = 0, eof = 0;
    fr_err_t rc = FR_OK;
    char *buf = malloc(cap);

    if (buf == NULL)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory reading %s", src->path);
    while (!eof) {
        size_t got;
        rc = ingest_source_read(src, buf + have, cap - have, &got, errstr, size);
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
            ingest_dataset_reject(st->ds, INGEST_REJECT_OVERSIZE, st->line);
            skipping = 1;
            have = 0;
        } else if (have == cap && FR_GROW(buf, cap, cap + 1) != FR_OK) {
            rc = fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory for a line of %s", src->path);
            goto out;
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
static fr_err_t load_f32(ingest_dataset_t *ds, const ingest_schema_t *schema, ingest_source_t *src,
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
        rc = ingest_dataset_reserve(ds, &cap, (size_t)fsize / rec, 1, errstr, size);
        if (rc != FR_OK)
            return rc;
    }
    size_t per = INGEST_READ_CHUNK / rec > 0 ? INGEST_READ_CHUNK / rec : 1;
    unsigned char *buf = malloc(per * rec);
    if (buf == NULL)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "out of memory reading %s", src->path);
    for (;;) {
        size_t got;
        rc = ingest_source_read(src, buf, per * rec, &got, errstr, size);
        if (rc != FR_OK)
            break;
        total += got;
        for (size_t i = 0; i + rec <= got; i += rec) {
            rc = ingest_dataset_reserve(ds, &cap, ds->n + 1, 0, errstr, size);
            if (rc != FR_OK)
                goto out;
            ingest_reject_t r = ingest_decode(schema, INGEST_FORMAT_F32, buf + i, rec,
                                              ds->x + ds->n * d, ds->y + ds->n);
            recno++;
            if (r == INGEST_OK)
                ds->n++;
            else
                ingest_dataset_reject(ds, r, recno);
        }
        if (got < per * rec) {
            if (got % rec != 0)
                rc = f32_bad_size(src->path, total, rec, (int)d, errstr, size);
            break;
        }
    }
    if (rc == FR_OK)
        ingest_dataset_shrink(ds, cap);
out:
    free(buf);
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
    ingest_source_t src;

    if (ds == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: no dataset given");
    memset(ds, 0, sizeof(*ds));
    fr_err_t rc = check_args(schema, format, data_path, labels_path, errstr, size);
    if (rc != FR_OK)
        return rc;
    ds->features = schema->features;
    rc = ingest_source_open(&src, data_path, errstr, size);
    if (rc != FR_OK)
        return rc;
    switch (format) {
    case INGEST_FORMAT_CSV:
    case INGEST_FORMAT_LIBSVM: {
        text_state_t st = {.ds = ds, .schema = schema, .format = format};
        rc = load_text(&st, &src, errstr, size);
        if (rc == FR_OK)
            ingest_dataset_shrink(ds, st.cap);
        break;
    }
    case INGEST_FORMAT_F32: rc = load_f32(ds, schema, &src, errstr, size); break;
    case INGEST_FORMAT_IDX:
        rc = ingest_idx_load(ds, schema, &src, labels_path, errstr, size);
        break;
    }
    ingest_source_close(&src);
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
