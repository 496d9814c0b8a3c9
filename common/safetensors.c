/*
 * safetensors.c - reader of the safetensors format
 * (https://github.com/huggingface/safetensors), written from its description.
 *
 * An image is an 8-byte little-endian header length N, N bytes of UTF-8 JSON
 * header, then the data buffer that the tensors' data_offsets index.
 *
 * The reader owns one allocation holding the whole image, and tensor data
 * points into the data buffer: a 100 MB file costs one read and no second
 * copy. The image is placed in its allocation so that the data buffer
 * starts 8-byte aligned; a tensor is then aligned to its element size
 * whenever its offset is a multiple of it, which holds for every file from
 * fr_st_encode and from the Python safetensors library.
 *
 * The header's JSON is read in safetensors_header.c (by libjansson); the
 * layout checks (no holes or overlaps, the file's exact size) and the
 * look-ups are this file's. A build without libjansson
 * (FRESHET_CORE_ONLY on a host without it) writes files but reads none:
 * reading fails with "built without libjansson".
 *
 * The writer is in safetensors_write.c; what the three share is declared
 * in common_int.h.
 *
 * Every function is reentrant. A parsed fr_st_file_t is never modified, so
 * any number of threads may read one at the same time.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "common/common_int.h"

/* Tensor bytes are copied as they are, and the format stores them
 * little-endian: a big-endian host would need byte swapping everywhere. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "common/safetensors.c needs a little-endian host"
#endif
/* Offsets and sizes in the file are 64-bit; the project targets 64-bit hosts,
 * where every one of them that fits a file also fits a size_t. */
_Static_assert(sizeof(size_t) >= sizeof(uint64_t), "freshet needs a 64-bit size_t");

/* Bytes read at most from a stream (pipe, device) whose size is unknown:
 * 4 GiB of weights plus the largest header. */
#define ST_MAX_STREAM ((uint64_t)4 * 1024 * 1024 * 1024 + FR_ST_MAX_HEADER + 8)

struct fr_st_file {
    uint8_t *mem;        /* owned: holds the image; tensor data points into it */
    fr_st_entry_t *ents; /* [nents], by data offset */
    size_t nents;
    const fr_st_tensor_t **by_name; /* [nents], sorted by name, for fr_st_find */
    fr_st_kv_t *meta;               /* [nmeta], sorted by key, for fr_st_meta */
    size_t nmeta;
    void *root; /* owned: the header's json_t, which names and metadata point into */
};

/* ------------------------------------------------------------------------
 * Small helpers
 * ---------------------------------------------------------------------- */

/* Formats "safetensors: [path: ]message" into the context's errstr and
 * returns err. */
fr_err_t fr__st_fail(const fr_st_errctx_t *ec, fr_err_t err, const char *fmt, ...)
{
    if (ec->errstr == NULL || ec->size == 0)
        return err;
    int k = ec->path != NULL ? snprintf(ec->errstr, ec->size, "safetensors: %s: ", ec->path)
                             : snprintf(ec->errstr, ec->size, "safetensors: ");
    if (k >= 0 && (size_t)k < ec->size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ec->errstr + k, ec->size - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return err;
}

static uint64_t st_le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | b[i];
    return v;
}

/* Bytes to place before an image whose header is n bytes long so that its
 * data buffer (at 8 + n) starts 8-byte aligned in a malloc'ed block. */
static size_t st_data_pad(uint64_t n)
{
    return (size_t)((8 - n % 8) % 8);
}

/* Length of the valid UTF-8 sequence at s (avail >= 1 bytes there), or 0 if
 * it is invalid: a stray continuation byte, an overlong form, a surrogate, a
 * code point above U+10FFFF or a sequence cut short. */
size_t fr__st_utf8_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t n;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80; /* overlong */
        hi = c == 0xED ? 0x9F : 0xBF; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        lo = c == 0xF0 ? 0x90 : 0x80; /* overlong */
        hi = c == 0xF4 ? 0x8F : 0xBF; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++) {
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    }
    return n;
}

/* Copies s into out for an error message: at most FR_ST_SHOW - 4 bytes, cut at
 * a character boundary and followed by "..." when longer, with control
 * characters and invalid UTF-8 bytes replaced by '?', so that a hostile name
 * cannot break a log line. Returns out. */
const char *fr__st_show(const char *s, char out[FR_ST_SHOW])
{
    const unsigned char *u = (const unsigned char *)s;
    size_t avail = strlen(s), w = 0;
    while (avail > 0) {
        size_t k = fr__st_utf8_len(u, avail);
        if (w + (k ? k : 1) > FR_ST_SHOW - 4) {
            memcpy(out + w, "...", 3);
            w += 3;
            break;
        }
        if (k == 0 || (k == 1 && (u[0] < 0x20 || u[0] == 0x7F))) {
            out[w++] = '?';
            k = 1;
        } else {
            memcpy(out + w, u, k);
            w += k;
        }
        u += k;
        avail -= k;
    }
    out[w] = '\0';
    return out;
}

/* Formats a shape as "[2, 3]" into out. */
const char *fr__st_shape_text(const int64_t *shape, int ndim, char out[FR_ST_SHAPE_TEXT])
{
    size_t w = 0;
    out[w++] = '[';
    for (int d = 0; d < ndim && d < FR_ST_MAX_DIMS; d++)
        w += (size_t)snprintf(out + w, FR_ST_SHAPE_TEXT - w, d ? ", %" PRId64 : "%" PRId64,
                              shape[d]);
    snprintf(out + w, FR_ST_SHAPE_TEXT - w, "]");
    return out;
}

/* Bytes of a tensor of the given shape and element size. Returns false if
 * the count overflows 64 bits (a zero dimension makes it 0, whatever the
 * others are). */
bool fr__st_shape_bytes(const int64_t *shape, int ndim, size_t esize, uint64_t *nbytes)
{
    uint64_t count = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 0) {
            *nbytes = 0;
            return true;
        }
    }
    for (int d = 0; d < ndim; d++) {
        uint64_t dim = (uint64_t)shape[d];
        if (count > UINT64_MAX / dim)
            return false;
        count *= dim;
    }
    if (count > UINT64_MAX / esize)
        return false;
    *nbytes = count * esize;
    return true;
}

fr_err_t fr__st_nomem(const fr_st_errctx_t *ec)
{
    return fr__st_fail(ec, FR_ERR_NOMEM, "out of memory");
}

/* ------------------------------------------------------------------------
 * Whole-file checks and the result
 * ---------------------------------------------------------------------- */

/* Checks the length prefix of an image of len bytes and the header's first
 * byte; on success *n is the header length. */
static fr_err_t st_check_prefix(const fr_st_errctx_t *ec, const uint8_t *img, size_t len,
                                uint64_t *n)
{
    if (len < 8)
        return fr__st_fail(ec, FR_ERR_PARSE,
                           "file size %zu is too small for the 8-byte header length", len);
    *n = st_le64(img);
    if (*n < 2)
        return fr__st_fail(ec, FR_ERR_PARSE, "header length %" PRIu64 " is too small (minimum 2)",
                           *n);
    if (*n > FR_ST_MAX_HEADER)
        return fr__st_fail(ec, FR_ERR_PARSE,
                           "header length %" PRIu64 " exceeds the limit of %" PRIu64 " bytes", *n,
                           FR_ST_MAX_HEADER);
    if (*n > len - 8)
        return fr__st_fail(ec, FR_ERR_PARSE, "header length %" PRIu64 " exceeds file size %zu", *n,
                           len);
    if (img[8] != '{')
        return fr__st_fail(ec, FR_ERR_PARSE, "header does not start with '{'");
    return FR_OK;
}

static int st_cmp_offset(const void *a, const void *b)
{
    const fr_st_entry_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static int st_cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const fr_st_tensor_t *const *)a)->name,
                  (*(const fr_st_tensor_t *const *)b)->name);
}

static int st_cmp_kv(const void *a, const void *b)
{
    return strcmp(((const fr_st_kv_t *)a)->key, ((const fr_st_kv_t *)b)->key);
}

/* Checks that the tensors (sorted by offset) cover the data buffer exactly,
 * from byte 0 without holes or overlaps, and that the image of len bytes
 * ends where the data does; points each tensor's data into the buffer. */
static fr_err_t st_check_layout(fr_st_parser_t *p, uint8_t *img, size_t len)
{
    char s1[FR_ST_SHOW], s2[FR_ST_SHOW];
    uint64_t pos = 0;
    for (size_t i = 0; i < p->nents; i++) {
        const fr_st_entry_t *e = &p->ents[i];
        if (e->begin > pos && i == 0)
            return fr__st_fail(&p->ec, FR_ERR_PARSE,
                               "data does not start at byte 0: first tensor '%s' begins at byte "
                               "%" PRIu64,
                               fr__st_show(e->t.name, s1), e->begin);
        if (e->begin > pos)
            return fr__st_fail(&p->ec, FR_ERR_PARSE,
                               "hole in data between byte %" PRIu64 " and %" PRIu64, pos, e->begin);
        if (e->begin < pos)
            return fr__st_fail(&p->ec, FR_ERR_PARSE,
                               "tensors '%s' and '%s' overlap at data bytes [%" PRIu64 ", %" PRIu64
                               ")",
                               fr__st_show(p->ents[i - 1].t.name, s1), fr__st_show(e->t.name, s2),
                               e->begin, e->end < pos ? e->end : pos);
        pos = e->end;
    }
    uint64_t start = 8 + (uint64_t)p->n; /* p->n <= FR_ST_MAX_HEADER: no overflow */
    if (pos > UINT64_MAX - start)
        return fr__st_fail(&p->ec, FR_ERR_PARSE,
                           "file size %zu does not match header (data ends at offset %" PRIu64 ")",
                           len, pos);
    if (start + pos != len)
        return fr__st_fail(&p->ec, FR_ERR_PARSE,
                           "file size %zu does not match header (expected %" PRIu64 ")", len,
                           start + pos);
    for (size_t i = 0; i < p->nents; i++)
        p->ents[i].t.data = img + start + p->ents[i].begin;
    return FR_OK;
}

/* Sorts the tensors by name and the metadata by key for the look-ups, and
 * fails on a duplicate of either. */
static fr_err_t st_index(fr_st_parser_t *p, fr_st_file_t *st)
{
    char shown[FR_ST_SHOW];
    st->by_name = malloc((p->nents ? p->nents : 1) * sizeof st->by_name[0]);
    if (st->by_name == NULL)
        return fr__st_nomem(&p->ec);
    for (size_t i = 0; i < p->nents; i++)
        st->by_name[i] = &p->ents[i].t;
    qsort(st->by_name, p->nents, sizeof st->by_name[0], st_cmp_tensor_name);
    for (size_t i = 1; i < p->nents; i++) {
        if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0)
            return fr__st_fail(&p->ec, FR_ERR_PARSE, "duplicate tensor name '%s'",
                               fr__st_show(st->by_name[i]->name, shown));
    }
    if (p->nmeta > 0)
        qsort(p->meta, p->nmeta, sizeof p->meta[0], st_cmp_kv);
    for (size_t i = 1; i < p->nmeta; i++) {
        if (strcmp(p->meta[i - 1].key, p->meta[i].key) == 0)
            return fr__st_fail(&p->ec, FR_ERR_PARSE, "duplicate metadata key '%s'",
                               fr__st_show(p->meta[i].key, shown));
    }
    return FR_OK;
}

/* Parses the image img[0..len), which lies inside the allocation mem.
 * Takes ownership of mem in every case: the result keeps it, or it is freed
 * on error. */
static fr_st_file_t *st_parse_owned(uint8_t *mem, uint8_t *img, size_t len, const char *path,
                                    char *errstr, size_t size)
{
    fr_st_parser_t p;
    fr_st_file_t *st = NULL;
    uint64_t n = 0;
    memset(&p, 0, sizeof p);
    p.ec.path = path;
    p.ec.errstr = errstr;
    p.ec.size = size;
    if (st_check_prefix(&p.ec, img, len, &n) != FR_OK)
        goto err;
    p.h = (const char *)img + 8;
    p.n = (size_t)n;
    if (fr__st_header_parse(&p) != FR_OK)
        goto err;
    st = calloc(1, sizeof *st);
    if (st == NULL) {
        fr__st_nomem(&p.ec);
        goto err;
    }
    if (p.nents > 0)
        qsort(p.ents, p.nents, sizeof p.ents[0], st_cmp_offset);
    if (st_index(&p, st) != FR_OK || st_check_layout(&p, img, len) != FR_OK)
        goto err;
    st->mem = mem;
    st->ents = p.ents;
    st->nents = p.nents;
    st->meta = p.meta;
    st->nmeta = p.nmeta;
    st->root = p.root;
    free(p.nums);
    return st;
err:
    if (st != NULL)
        free(st->by_name);
    free(st);
    free(p.ents);
    free(p.meta);
    free(p.nums);
    fr__st_header_free(p.root);
    free(mem);
    return NULL;
}

/* ------------------------------------------------------------------------
 * Reader API
 * ---------------------------------------------------------------------- */

/* Copies buf into one allocation (placed so the data buffer is aligned) and
 * parses the copy, which the result then owns. */
fr_st_file_t *fr_st_parse(const uint8_t *buf, size_t len, char *errstr, size_t size)
{
    fr_st_errctx_t ec = {NULL, errstr, size};
    uint64_t n = 0;
    if (buf == NULL && len > 0) {
        fr__st_fail(&ec, FR_ERR_INVAL, "NULL buffer");
        return NULL;
    }
    /* Reject a bad prefix before copying what may be a large buffer. */
    if (st_check_prefix(&ec, buf, len, &n) != FR_OK)
        return NULL;
    size_t pad = st_data_pad(n);
    uint8_t *mem = len <= SIZE_MAX - pad ? malloc(len + pad) : NULL;
    if (mem == NULL) {
        fr__st_nomem(&ec);
        return NULL;
    }
    memcpy(mem + pad, buf, len);
    return st_parse_owned(mem, mem + pad, len, NULL, errstr, size);
}

/* Reads up to want bytes from fd into dst, stopping early only at end of
 * file; *got receives the count. Returns -1 with errno set on a read error. */
static int st_read_full(int fd, uint8_t *dst, size_t want, size_t *got)
{
    *got = 0;
    while (*got < want) {
        ssize_t k = read(fd, dst + *got, want - *got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -1;
        if (k == 0)
            break;
        *got += (size_t)k;
    }
    return 0;
}

/* Reads all of fd into one allocation, leaving room for the alignment pad
 * that the 8-byte prefix (already read into prefix[0..got)) asks for. On
 * success *mem is malloc'ed and the image is (*mem)[pad .. pad + *len). */
static fr_err_t st_slurp(const fr_st_errctx_t *ec, int fd, const uint8_t *prefix, size_t got,
                         uint8_t **mem, size_t *pad, size_t *len)
{
    struct stat sb;
    size_t hint = 0, used, cap;
    *pad = got == 8 ? st_data_pad(st_le64(prefix)) : 0;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0)
        hint = (size_t)sb.st_size;
    cap = *pad + (hint > got ? hint : got) + 1; /* + 1: EOF shows without growing */
    *mem = malloc(cap);
    if (*mem == NULL)
        return fr__st_nomem(ec);
    memcpy(*mem + *pad, prefix, got);
    used = *pad + got;
    /* Refuse a bad length prefix before reading on: /dev/zero or a stream
     * that is no safetensors must not be read to its end. */
    if (got == 8) {
        uint64_t n = st_le64(prefix);
        if (n < 2)
            return fr__st_fail(ec, FR_ERR_PARSE,
                               "header length %" PRIu64 " is too small (minimum 2)", n);
        if (n > FR_ST_MAX_HEADER)
            return fr__st_fail(ec, FR_ERR_PARSE,
                               "header length %" PRIu64 " exceeds the limit of %" PRIu64 " bytes",
                               n, FR_ST_MAX_HEADER);
        if (hint > 0 && n > hint - 8)
            return fr__st_fail(ec, FR_ERR_PARSE, "header length %" PRIu64 " exceeds file size %zu",
                               n, hint);
    }
    while (got == 8) {
        if (hint == 0 && used - *pad > ST_MAX_STREAM)
            return fr__st_fail(ec, FR_ERR_PARSE,
                               "more than %llu bytes from a stream: not a model file",
                               (unsigned long long)ST_MAX_STREAM);
        if (hint == 0 && used - *pad > 8 && (*mem)[*pad + 8] != '{')
            return fr__st_fail(ec, FR_ERR_PARSE, "header does not start with '{'");
        if (used == cap && FR_GROW(*mem, cap, cap + 1) != FR_OK)
            return fr__st_nomem(ec);
        ssize_t k = read(fd, *mem + used, cap - used);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return fr__st_fail(ec, FR_ERR_IO, "cannot read: %s", strerror(errno));
        if (k == 0)
            break;
        used += (size_t)k;
    }
    *len = used - *pad;
    return FR_OK;
}

/* Reads the file with one pass into one buffer that the result owns (tensor
 * data points into it), then parses it. */
fr_st_file_t *fr_st_read_file(const char *path, char *errstr, size_t size)
{
    fr_st_errctx_t ec = {path, errstr, size};
    uint8_t prefix[8], *mem = NULL;
    size_t got, pad = 0, len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fr__st_fail(&ec, FR_ERR_IO, "cannot open: %s", strerror(errno));
        return NULL;
    }
    fr_err_t err = st_read_full(fd, prefix, sizeof prefix, &got) != 0
                       ? fr__st_fail(&ec, FR_ERR_IO, "cannot read: %s", strerror(errno))
                       : st_slurp(&ec, fd, prefix, got, &mem, &pad, &len);
    close(fd);
    if (err != FR_OK) {
        free(mem);
        return NULL;
    }
    return st_parse_owned(mem, mem + pad, len, path, errstr, size);
}

void fr_st_destroy(fr_st_file_t *st)
{
    if (st == NULL)
        return;
    free(st->by_name);
    free(st->ents);
    free(st->meta);
    free(st->mem);
    fr__st_header_free(st->root);
    free(st);
}

size_t fr_st_count(const fr_st_file_t *st)
{
    return st != NULL ? st->nents : 0;
}

const fr_st_tensor_t *fr_st_at(const fr_st_file_t *st, size_t i)
{
    return st != NULL && i < st->nents ? &st->ents[i].t : NULL;
}

/* Binary search over the name index. */
const fr_st_tensor_t *fr_st_find(const fr_st_file_t *st, const char *name)
{
    if (st == NULL || name == NULL)
        return NULL;
    fr_st_tensor_t key;
    const fr_st_tensor_t *kp = &key;
    key.name = name;
    const fr_st_tensor_t **hit =
        bsearch(&kp, st->by_name, st->nents, sizeof st->by_name[0], st_cmp_tensor_name);
    return hit != NULL ? *hit : NULL;
}

/* Binary search over the sorted metadata. */
const char *fr_st_meta(const fr_st_file_t *st, const char *key)
{
    if (st == NULL || key == NULL || st->nmeta == 0)
        return NULL;
    fr_st_kv_t kv = {key, NULL};
    const fr_st_kv_t *hit = bsearch(&kv, st->meta, st->nmeta, sizeof st->meta[0], st_cmp_kv);
    return hit != NULL ? hit->value : NULL;
}
