/*
 * source.c - a data file read to its end: a plain file, or a gzip stream
 * (zlib's gzread) for a name ending ".gz". The data set loaders (dataset.c,
 * idx.c) and the record files (file.c) read through it.
 *
 * Threads: a source belongs to the one load or record file that opened it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef FRESHET_HAVE_ZLIB
#include <zlib.h>
#endif

#include "ingest/ingest_int.h"

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
fr_err_t ingest_source_open(ingest_source_t *src, const char *path, char *errstr, size_t size)
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

void ingest_source_close(ingest_source_t *src)
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
fr_err_t ingest_source_read(ingest_source_t *src, void *buf, size_t want, size_t *got, char *errstr,
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
