/*
 * safetensors_write.c - the writer of the safetensors format (the reader
 * and the format's description are in safetensors.c): checks the tensors
 * and metadata, builds the header, and writes a file atomically.
 *
 * The header's JSON is written by hand rather than through libjansson: it
 * has a fixed shape of strings and integers, its exact bytes are part of
 * the contract (keys in the order given, padded with spaces to a multiple
 * of 8, the same image for the same tensors), and writing must work in a
 * build without libjansson.
 *
 * Every function is reentrant.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/common_int.h"

static void st_put_le64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static bool st_utf8_valid(const char *s)
{
    size_t avail = strlen(s);
    const unsigned char *u = (const unsigned char *)s;
    while (avail > 0) {
        size_t k = fr__st_utf8_len(u, avail);
        if (k == 0)
            return false;
        u += k;
        avail -= k;
    }
    return true;
}

static int st_cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* ------------------------------------------------------------------------
 * Writer
 * ---------------------------------------------------------------------- */

/* The dtypes the writer emits: 4-byte elements, copied as they are (F32
 * weights, I32 or U32 ids). */
static int st_dtype_writable(const char *dtype)
{
    return strcmp(dtype, "F32") == 0 || strcmp(dtype, "I32") == 0 || strcmp(dtype, "U32") == 0;
}

/* Checks one tensor given to the writer: a UTF-8 name other than
 * "__metadata__", a dtype of 4-byte elements (st_dtype_writable), a valid
 * shape and nbytes that matches it. */
static fr_err_t st_check_write_tensor(const fr_st_errctx_t *ec, const fr_st_tensor_t *t, size_t i)
{
    char shown[FR_ST_SHOW], shape[FR_ST_SHAPE_TEXT];
    uint64_t nbytes;
    if (t->name == NULL || !st_utf8_valid(t->name))
        return fr__st_fail(ec, FR_ERR_INVAL, "tensor %zu: name is NULL or not valid UTF-8", i);
    const char *name = fr__st_show(t->name, shown);
    if (strcmp(t->name, "__metadata__") == 0)
        return fr__st_fail(ec, FR_ERR_INVAL, "tensor name '__metadata__' is reserved");
    if (!st_dtype_writable(t->dtype))
        return fr__st_fail(ec, FR_ERR_INVAL,
                           "tensor '%s': only F32, I32 and U32 tensors can be written", name);
    if (t->ndim < 0 || t->ndim > FR_ST_MAX_DIMS)
        return fr__st_fail(ec, FR_ERR_INVAL, "tensor '%s': ndim %d is outside [0, %d]", name,
                           t->ndim, FR_ST_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return fr__st_fail(ec, FR_ERR_INVAL, "tensor '%s': negative dimension in shape %s",
                               name, fr__st_shape_text(t->shape, t->ndim, shape));
    }
    if (!fr__st_shape_bytes(t->shape, t->ndim, 4, &nbytes) || nbytes != t->nbytes)
        return fr__st_fail(ec, FR_ERR_INVAL,
                           "tensor '%s': nbytes %zu does not match shape %s of %s", name, t->nbytes,
                           fr__st_shape_text(t->shape, t->ndim, shape), t->dtype);
    if (t->data == NULL && t->nbytes > 0)
        return fr__st_fail(ec, FR_ERR_INVAL, "tensor '%s' has no data", name);
    return FR_OK;
}

/* Fails if two of the n strings are equal; what names them in the message. */
static fr_err_t st_check_unique(const fr_st_errctx_t *ec, const char **v, size_t n,
                                const char *what)
{
    char shown[FR_ST_SHOW];
    qsort(v, n, sizeof v[0], st_cmp_str_ptr);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(v[i - 1], v[i]) == 0)
            return fr__st_fail(ec, FR_ERR_INVAL, "duplicate %s '%s'", what,
                               fr__st_show(v[i], shown));
    }
    return FR_OK;
}

/* Checks all the writer's arguments; *datalen receives the data size. */
static fr_err_t st_check_write_args(const fr_st_errctx_t *ec, const fr_st_tensor_t *tensors,
                                    size_t ntensors, const fr_st_kv_t *meta, size_t nmeta,
                                    size_t *datalen)
{
    size_t most = ntensors > nmeta ? ntensors : nmeta;
    const char **names = NULL;
    fr_err_t err = FR_OK;
    *datalen = 0;
    for (size_t i = 0; i < ntensors; i++) {
        if ((err = st_check_write_tensor(ec, &tensors[i], i)) != FR_OK)
            return err;
        if (tensors[i].nbytes > SIZE_MAX - *datalen)
            return fr__st_fail(ec, FR_ERR_INVAL, "tensors too large");
        *datalen += tensors[i].nbytes;
    }
    for (size_t i = 0; i < nmeta; i++) {
        if (meta[i].key == NULL || meta[i].value == NULL || !st_utf8_valid(meta[i].key) ||
            !st_utf8_valid(meta[i].value))
            return fr__st_fail(ec, FR_ERR_INVAL,
                               "metadata entry %zu: key or value NULL or not valid UTF-8", i);
    }
    if (most < 2)
        return FR_OK;
    if ((names = malloc(most * sizeof names[0])) == NULL)
        return fr__st_nomem(ec);
    for (size_t i = 0; i < ntensors; i++)
        names[i] = tensors[i].name;
    err = st_check_unique(ec, names, ntensors, "tensor name");
    for (size_t i = 0; err == FR_OK && i < nmeta; i++)
        names[i] = meta[i].key;
    if (err == FR_OK)
        err = st_check_unique(ec, names, nmeta, "metadata key");
    free(names);
    return err;
}

/* Builds the JSON header, padded with spaces to a multiple of 8 bytes. */
static void st_build_header(fr_buf_t *b, const fr_st_tensor_t *tensors, size_t ntensors,
                            const fr_st_kv_t *meta, size_t nmeta)
{
    char num[64];
    uint64_t off = 0;
    fr_buf_puts(b, "{");
    if (nmeta > 0) {
        fr_buf_puts(b, "\"__metadata__\":{");
        for (size_t i = 0; i < nmeta; i++) {
            if (i > 0)
                fr_buf_puts(b, ",");
            fr_json_str(b, meta[i].key);
            fr_buf_puts(b, ":");
            fr_json_str(b, meta[i].value);
        }
        fr_buf_puts(b, "}");
    }
    for (size_t i = 0; i < ntensors; i++) {
        const fr_st_tensor_t *t = &tensors[i];
        if (i > 0 || nmeta > 0)
            fr_buf_puts(b, ",");
        fr_json_str(b, t->name);
        fr_buf_puts(b, ":{\"dtype\":\"");
        fr_buf_puts(b, t->dtype);
        fr_buf_puts(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, d ? ",%" PRId64 : "%" PRId64, t->shape[d]);
            fr_buf_puts(b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off,
                 off + t->nbytes);
        fr_buf_puts(b, num);
        off += t->nbytes;
    }
    fr_buf_puts(b, "}");
    while (!b->failed && b->len % 8 != 0)
        fr_buf_puts(b, " ");
}

/* Validates the arguments, builds the header, then assembles prefix, header
 * and the tensors' bytes in the order given into one malloc'ed image. */
fr_err_t fr_st_encode(const fr_st_tensor_t *tensors, size_t ntensors, const fr_st_kv_t *meta,
                      size_t nmeta, uint8_t **out, size_t *len, char *errstr, size_t size)
{
    fr_st_errctx_t ec = {NULL, errstr, size};
    fr_buf_t hdr = {0};
    size_t datalen;
    fr_err_t err;
    if (out == NULL || len == NULL)
        return fr__st_fail(&ec, FR_ERR_INVAL, "fr_st_encode: NULL argument");
    *out = NULL;
    *len = 0;
    if ((ntensors > 0 && tensors == NULL) || (nmeta > 0 && meta == NULL))
        return fr__st_fail(&ec, FR_ERR_INVAL, "fr_st_encode: NULL argument");
    if ((err = st_check_write_args(&ec, tensors, ntensors, meta, nmeta, &datalen)) != FR_OK)
        return err;
    st_build_header(&hdr, tensors, ntensors, meta, nmeta);
    if (hdr.failed || hdr.len > FR_ST_MAX_HEADER || datalen > SIZE_MAX - 8 - hdr.len) {
        fr_buf_fini(&hdr);
        return hdr.failed ? fr__st_nomem(&ec)
                          : fr__st_fail(&ec, FR_ERR_INVAL, "header or data too large");
    }
    uint8_t *img = malloc(8 + hdr.len + datalen);
    if (img == NULL) {
        fr_buf_fini(&hdr);
        return fr__st_nomem(&ec);
    }
    st_put_le64(img, hdr.len);
    memcpy(img + 8, hdr.p, hdr.len);
    size_t off = 8 + hdr.len;
    for (size_t i = 0; i < ntensors; i++) {
        if (tensors[i].nbytes > 0)
            memcpy(img + off, tensors[i].data, tensors[i].nbytes);
        off += tensors[i].nbytes;
    }
    fr_buf_fini(&hdr);
    *out = img;
    *len = off;
    return FR_OK;
}

/* Writes all n bytes of buf to fd, retrying short writes and EINTR. */
static int st_write_all(int fd, const uint8_t *buf, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, buf, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -1;
        buf += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Flushes the directory holding path so that a rename in it survives a
 * crash. Best effort: the file itself is already complete and in place. */
static void st_sync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir =
        slash == NULL ? strdup(".") : strndup(path, slash == path ? 1 : (size_t)(slash - path));
    if (dir == NULL)
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

/* Encodes, writes "<path>.tmp.<pid>", fsyncs it and renames it over path,
 * so that readers see the old file or the new one, never a part. The
 * temporary file is removed on every error. Two threads of one process must
 * not write the same path at once (they would share the temporary name). */
fr_err_t fr_st_write_file(const char *path, const fr_st_tensor_t *tensors, size_t ntensors,
                          const fr_st_kv_t *meta, size_t nmeta, char *errstr, size_t size)
{
    fr_st_errctx_t ec = {NULL, errstr, size};
    uint8_t *img = NULL;
    size_t len;
    char *tmp = NULL;
    int fd = -1;
    fr_err_t err;
    if (path == NULL)
        return fr__st_fail(&ec, FR_ERR_INVAL, "fr_st_write_file: NULL path");
    if ((err = fr_st_encode(tensors, ntensors, meta, nmeta, &img, &len, errstr, size)) != FR_OK)
        return err;
    size_t tmpsize = strlen(path) + 32;
    if ((tmp = malloc(tmpsize)) == NULL) {
        err = fr__st_nomem(&ec);
        goto out;
    }
    snprintf(tmp, tmpsize, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        err = fr__st_fail(&ec, FR_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (st_write_all(fd, img, len) != 0 || fsync(fd) != 0) {
        err = fr__st_fail(&ec, FR_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        goto out;
    }
    int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        err = fr__st_fail(&ec, FR_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0) {
        err = fr__st_fail(&ec, FR_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        goto out;
    }
    st_sync_dir(path);
    err = FR_OK;
out:
    if (fd >= 0)
        close(fd);
    if (err != FR_OK && tmp != NULL)
        unlink(tmp);
    free(tmp);
    free(img);
    return err;
}
