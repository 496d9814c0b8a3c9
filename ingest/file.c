/*
 * file.c - record files read one record at a time (records.h "Record
 * files"): lines, or records each after its length. The buffer holds the
 * records not yet returned; it grows to the longest record allowed, and a
 * line longer is skipped to its newline.
 *
 * Threads: a record file belongs to one thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef FRESHET_HAVE_ZLIB
#include <zlib.h>
#endif

#include "ingest/ingest_int.h"

struct ingest_file {
    ingest_source_t src;
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
    f->cap = max + 8 <= INGEST_READ_CHUNK ? INGEST_READ_CHUNK : max + 8;
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
    ingest_source_close(&f->src);
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
        fr_err_t err =
            ingest_source_read(&f->src, f->buf + f->end, f->cap - f->end, &got, errstr, size);
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
