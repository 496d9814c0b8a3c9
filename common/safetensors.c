/*
 * safetensors.c - reader and writer of the safetensors format
 * (https://github.com/huggingface/safetensors), written from its description.
 *
 * An image is an 8-byte little-endian header length N, N bytes of UTF-8 JSON
 * header, then the data buffer that the tensors' data_offsets index.
 *
 * The reader owns one allocation holding the whole image. JSON strings are
 * decoded in place inside the header (a decoded string is never longer than
 * its escaped form, so the text and its NUL fit where the quoted text was),
 * and tensor data points into the data buffer: a 100 MB file costs one read
 * and no second copy. The image is placed in its allocation so that the data
 * buffer starts 8-byte aligned; a tensor is then aligned to its element size
 * whenever its offset is a multiple of it, which holds for every file from
 * fr_st_encode and from the Python safetensors library.
 *
 * The JSON parser is a small recursive-descent one that knows the shape of a
 * header. Values it does not need (unknown fields of a tensor, which the
 * reference implementation ignores) are checked for syntax and skipped. It
 * rejects duplicate keys, invalid UTF-8, lone surrogates, \u0000 (names and
 * values are C strings here) and nesting deeper than ST_MAX_DEPTH.
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

/* Tensor bytes are copied as they are, and the format stores them
 * little-endian: a big-endian host would need byte swapping everywhere. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "common/safetensors.c needs a little-endian host"
#endif
/* Offsets and sizes in the file are 64-bit; the project targets 64-bit hosts,
 * where every one of them that fits a file also fits a size_t. */
_Static_assert(sizeof(size_t) >= sizeof(uint64_t), "freshet needs a 64-bit size_t");

#define ST_MAX_HEADER ((uint64_t)100 * 1024 * 1024) /* header bytes, as in the reference */
/* Bytes read at most from a stream (pipe, device) whose size is unknown:
 * 4 GiB of weights plus the largest header. */
#define ST_MAX_STREAM ((uint64_t)4 * 1024 * 1024 * 1024 + ST_MAX_HEADER + 8)
#define ST_MAX_DEPTH  64                        /* JSON nesting accepted in skipped values */
#define ST_SHOW       72                        /* bytes of a name quoted in a message */
#define ST_SHAPE_TEXT (FR_ST_MAX_DIMS * 22 + 4) /* "[d0, d1, ...]" */

/* One tensor while parsing and in the result. */
typedef struct st_entry {
    fr_st_tensor_t t;
    uint64_t begin, end; /* data_offsets */
    size_t esize;        /* bytes per element of t.dtype */
    size_t order;        /* position in the header: breaks ties between empty tensors */
} st_entry_t;

struct fr_st_file {
    uint8_t *mem;     /* owned: holds the image; names and data point into it */
    st_entry_t *ents; /* [nents], by data offset */
    size_t nents;
    const fr_st_tensor_t **by_name; /* [nents], sorted by name, for fr_st_find */
    fr_st_kv_t *meta;               /* [nmeta], sorted by key, for fr_st_meta */
    size_t nmeta;
};

/* Where errors go: the file name (NULL for a buffer) and the caller's buffer. */
typedef struct st_errctx {
    const char *path;
    char *errstr;
    size_t size;
} st_errctx_t;

typedef struct st_parser {
    st_errctx_t ec;
    char *h;    /* the header, decoded in place */
    size_t n;   /* its length */
    size_t pos; /* next byte to read */
    st_entry_t *ents;
    size_t nents, capents;
    fr_st_kv_t *meta;
    size_t nmeta, capmeta;
    bool seen_meta;
} st_parser_t;

/* A key seen in an object, kept to find duplicates. */
typedef struct st_key {
    const char *s;
    size_t at; /* header byte where the key starts */
} st_key_t;

typedef struct st_keys {
    st_key_t *v;
    size_t n, cap;
} st_keys_t;

/* A growing text buffer for the writer; oom sticks once an allocation fails. */
typedef struct st_buf {
    char *p;
    size_t len, cap;
    bool oom;
} st_buf_t;

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8},
};

/* ------------------------------------------------------------------------
 * Small helpers
 * ---------------------------------------------------------------------- */

/* Formats "safetensors: [path: ]message" into the context's errstr and
 * returns err. */
static fr_err_t st_fail(const st_errctx_t *ec, fr_err_t err, const char *fmt, ...) FR_PRINTF(3, 4);
static fr_err_t st_fail(const st_errctx_t *ec, fr_err_t err, const char *fmt, ...)
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

static void st_put_le64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
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
static size_t st_utf8_len(const unsigned char *s, size_t avail)
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

static bool st_utf8_valid(const char *s)
{
    size_t avail = strlen(s);
    const unsigned char *u = (const unsigned char *)s;
    while (avail > 0) {
        size_t k = st_utf8_len(u, avail);
        if (k == 0)
            return false;
        u += k;
        avail -= k;
    }
    return true;
}

/* Writes code point cp (at most U+10FFFF, not a surrogate) as UTF-8 at dst;
 * returns the number of bytes written (1 to 4). */
static size_t st_utf8_put(char *dst, uint32_t cp)
{
    unsigned char *d = (unsigned char *)dst;
    if (cp < 0x80) {
        d[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (unsigned char)(0xC0 | (cp >> 6));
        d[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (unsigned char)(0xE0 | (cp >> 12));
        d[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (unsigned char)(0xF0 | (cp >> 18));
    d[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Copies s into out for an error message: at most ST_SHOW - 4 bytes, cut at
 * a character boundary and followed by "..." when longer, with control
 * characters and invalid UTF-8 bytes replaced by '?', so that a hostile name
 * cannot break a log line. Returns out. */
static const char *st_show(const char *s, char out[ST_SHOW])
{
    const unsigned char *u = (const unsigned char *)s;
    size_t avail = strlen(s), w = 0;
    while (avail > 0) {
        size_t k = st_utf8_len(u, avail);
        if (w + (k ? k : 1) > ST_SHOW - 4) {
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
static const char *st_shape_text(const int64_t *shape, int ndim, char out[ST_SHAPE_TEXT])
{
    size_t w = 0;
    out[w++] = '[';
    for (int d = 0; d < ndim && d < FR_ST_MAX_DIMS; d++)
        w += (size_t)snprintf(out + w, ST_SHAPE_TEXT - w, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    snprintf(out + w, ST_SHAPE_TEXT - w, "]");
    return out;
}

/* The element size of a dtype name, or 0 if the name is unknown. */
static size_t st_dtype_size(const char *name)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(name, st_dtypes[i].name) == 0)
            return st_dtypes[i].size;
    }
    return 0;
}

/* Bytes of a tensor of the given shape and element size. Returns false if
 * the count overflows 64 bits (a zero dimension makes it 0, whatever the
 * others are). */
static bool st_shape_bytes(const int64_t *shape, int ndim, size_t esize, uint64_t *nbytes)
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

/* Makes room for one more element of size el in v (capacity *cap, n in
 * use), doubling. Returns the array to use from now on, or NULL if out of
 * memory (v is then unchanged and still owned by the caller). */
static void *st_grow(void *v, size_t *cap, size_t n, size_t el)
{
    if (n < *cap)
        return v;
    size_t ncap = *cap ? *cap * 2 : 16;
    if (ncap < *cap || ncap > SIZE_MAX / el)
        return NULL;
    void *nv = realloc(v, ncap * el);
    if (nv != NULL)
        *cap = ncap;
    return nv;
}

static int st_cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* ------------------------------------------------------------------------
 * JSON lexing
 * ---------------------------------------------------------------------- */

static fr_err_t st_bad_json(st_parser_t *p, size_t at, const char *what)
{
    return st_fail(&p->ec, FR_ERR_PARSE, "bad JSON at header byte %zu: %s", at, what);
}

static fr_err_t st_nomem(const st_errctx_t *ec)
{
    return st_fail(ec, FR_ERR_NOMEM, "out of memory");
}

/* The byte at the read position, or -1 at the end of the header. */
static int st_peek(const st_parser_t *p)
{
    return p->pos < p->n ? (unsigned char)p->h[p->pos] : -1;
}

static void st_skip_ws(st_parser_t *p)
{
    while (p->pos < p->n) {
        char c = p->h[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

/* Skips white space and consumes c, or fails with "expected 'c'". */
static fr_err_t st_expect(st_parser_t *p, char c)
{
    char what[16];
    st_skip_ws(p);
    if (st_peek(p) == (unsigned char)c) {
        p->pos++;
        return FR_OK;
    }
    snprintf(what, sizeof what, "expected '%c'", c);
    return st_bad_json(p, p->pos, what);
}

/* The value of four hex digits at s, or -1. */
static int32_t st_hex4(const char *s)
{
    int32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Decodes the \u escape at *r (one, or a surrogate pair as two) to UTF-8 at
 * *w, advancing both. Lone surrogates and \u0000 are errors. */
static fr_err_t st_decode_u(st_parser_t *p, size_t *r, size_t *w)
{
    size_t at = *r, used = 6;
    if (p->n - at < 6)
        return st_bad_json(p, at, "truncated \\u escape");
    int32_t v = st_hex4(p->h + at + 2);
    if (v < 0)
        return st_bad_json(p, at, "bad hex digits in \\u escape");
    uint32_t cp = (uint32_t)v;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        int32_t lo = -1;
        if (p->n - at >= 12 && p->h[at + 6] == '\\' && p->h[at + 7] == 'u')
            lo = st_hex4(p->h + at + 8);
        if (lo < 0xDC00 || lo > 0xDFFF)
            return st_bad_json(p, at, "unpaired surrogate in \\u escape");
        cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
        used = 12;
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        return st_bad_json(p, at, "unpaired surrogate in \\u escape");
    } else if (cp == 0) {
        return st_bad_json(p, at, "\\u0000 is not allowed in a string");
    }
    /* All hex digits are read; the output (at most 4 bytes) lands at or
     * before them since *w <= *r. */
    *w += st_utf8_put(p->h + *w, cp);
    *r += used;
    return FR_OK;
}

/* Decodes the escape sequence at *r to *w, advancing both. */
static fr_err_t st_decode_escape(st_parser_t *p, size_t *r, size_t *w)
{
    char c;
    if (p->n - *r < 2)
        return st_bad_json(p, *r, "unterminated string");
    switch (p->h[*r + 1]) {
    case '"': c = '"'; break;
    case '\\': c = '\\'; break;
    case '/': c = '/'; break;
    case 'b': c = '\b'; break;
    case 'f': c = '\f'; break;
    case 'n': c = '\n'; break;
    case 'r': c = '\r'; break;
    case 't': c = '\t'; break;
    case 'u': return st_decode_u(p, r, w);
    default: return st_bad_json(p, *r, "bad escape in string");
    }
    p->h[(*w)++] = c;
    *r += 2;
    return FR_OK;
}

/* Parses the JSON string at the read position (a '"') and decodes it in
 * place: on success *out points at its NUL-terminated UTF-8 text inside the
 * header, valid for the life of the header, and the read position is past
 * the closing quote. The write index never passes the read index, so bytes
 * not yet read are never overwritten. */
static fr_err_t st_parse_string(st_parser_t *p, char **out)
{
    char *h = p->h;
    size_t start = p->pos + 1, r = start, w = start;
    for (;;) {
        if (r >= p->n)
            return st_bad_json(p, r, "unterminated string");
        unsigned char c = (unsigned char)h[r];
        if (c == '"')
            break;
        if (c == '\\') {
            fr_err_t err = st_decode_escape(p, &r, &w);
            if (err != FR_OK)
                return err;
        } else if (c < 0x20) {
            return st_bad_json(p, r, "control character in string");
        } else if (c < 0x80) {
            h[w++] = (char)c;
            r++;
        } else {
            size_t k = st_utf8_len((const unsigned char *)h + r, p->n - r);
            if (k == 0)
                return st_bad_json(p, r, "invalid UTF-8 in string");
            memmove(h + w, h + r, k);
            w += k;
            r += k;
        }
    }
    h[w] = '\0';
    *out = h + start;
    p->pos = r + 1;
    return FR_OK;
}

static bool st_is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* Consumes a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static fr_err_t st_scan_number(st_parser_t *p)
{
    size_t start = p->pos;
    if (st_peek(p) == '-')
        p->pos++;
    if (st_peek(p) == '0') {
        p->pos++;
    } else if (st_is_digit(st_peek(p))) {
        while (st_is_digit(st_peek(p)))
            p->pos++;
    } else {
        return st_bad_json(p, start, "invalid number");
    }
    if (st_peek(p) == '.') {
        p->pos++;
        if (!st_is_digit(st_peek(p)))
            return st_bad_json(p, start, "invalid number");
        while (st_is_digit(st_peek(p)))
            p->pos++;
    }
    if (st_peek(p) == 'e' || st_peek(p) == 'E') {
        p->pos++;
        if (st_peek(p) == '+' || st_peek(p) == '-')
            p->pos++;
        if (!st_is_digit(st_peek(p)))
            return st_bad_json(p, start, "invalid number");
        while (st_is_digit(st_peek(p)))
            p->pos++;
    }
    return FR_OK;
}

/* Parses a non-negative integer (no sign, fraction or exponent) that fits 64
 * bits, for field `field` of tensor `name`. Other JSON values are errors
 * naming the field. */
static fr_err_t st_parse_uint(st_parser_t *p, const char *name, const char *field, uint64_t *v)
{
    char shown[ST_SHOW];
    st_skip_ws(p);
    size_t start = p->pos;
    int c = st_peek(p);
    if (c != '-' && !st_is_digit(c)) {
        if (c == '"' || c == '{' || c == '[' || c == 't' || c == 'f' || c == 'n')
            return st_fail(&p->ec, FR_ERR_PARSE,
                           "tensor '%s': \"%s\" must hold non-negative integers",
                           st_show(name, shown), field);
        return st_bad_json(p, start, "expected a value");
    }
    fr_err_t err = st_scan_number(p);
    if (err != FR_OK)
        return err;
    uint64_t x = 0;
    for (size_t i = start; i < p->pos; i++) {
        int d = p->h[i] - '0';
        if (d < 0 || d > 9)
            return st_fail(&p->ec, FR_ERR_PARSE,
                           "tensor '%s': \"%s\" must hold non-negative integers, not %.*s",
                           st_show(name, shown), field,
                           (int)(p->pos - start > 32 ? 32 : p->pos - start), p->h + start);
        if (x > (UINT64_MAX - (uint64_t)d) / 10)
            return st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': a \"%s\" value is too large",
                           st_show(name, shown), field);
        x = x * 10 + (uint64_t)d;
    }
    *v = x;
    return FR_OK;
}

static fr_err_t st_skip_value(st_parser_t *p, int depth);

/* Records key (starting at header byte at) in keys. */
static fr_err_t st_keys_push(st_parser_t *p, st_keys_t *keys, const char *key, size_t at)
{
    st_key_t *nv = st_grow(keys->v, &keys->cap, keys->n, sizeof keys->v[0]);
    if (nv == NULL)
        return st_nomem(&p->ec);
    keys->v = nv;
    keys->v[keys->n].s = key;
    keys->v[keys->n].at = at;
    keys->n++;
    return FR_OK;
}

static int st_cmp_key(const void *a, const void *b)
{
    const st_key_t *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c != 0 ? c : (x->at > y->at) - (x->at < y->at);
}

/* Fails if two keys of one object are equal; sorting keeps this
 * O(n log n) for an object with many keys. */
static fr_err_t st_keys_check(st_parser_t *p, st_keys_t *keys)
{
    char shown[ST_SHOW];
    if (keys->n < 2)
        return FR_OK;
    qsort(keys->v, keys->n, sizeof keys->v[0], st_cmp_key);
    for (size_t i = 1; i < keys->n; i++) {
        if (strcmp(keys->v[i - 1].s, keys->v[i].s) == 0)
            return st_fail(&p->ec, FR_ERR_PARSE, "duplicate key \"%s\" at header byte %zu",
                           st_show(keys->v[i].s, shown), keys->v[i].at);
    }
    return FR_OK;
}

/* Checks and skips the object at the read position (a '{'). */
static fr_err_t st_skip_object(st_parser_t *p, int depth)
{
    st_keys_t keys = {0};
    fr_err_t err = FR_OK;
    p->pos++;
    st_skip_ws(p);
    while (st_peek(p) != '}') {
        char *key;
        if (keys.n > 0 && (err = st_expect(p, ',')) != FR_OK)
            goto out;
        st_skip_ws(p);
        size_t at = p->pos;
        if (st_peek(p) != '"') {
            err = st_bad_json(p, at, "expected a string key");
            goto out;
        }
        if ((err = st_parse_string(p, &key)) != FR_OK ||
            (err = st_keys_push(p, &keys, key, at)) != FR_OK ||
            (err = st_expect(p, ':')) != FR_OK || (err = st_skip_value(p, depth + 1)) != FR_OK)
            goto out;
        st_skip_ws(p);
        if (st_peek(p) != ',' && st_peek(p) != '}') {
            err = st_bad_json(p, p->pos, "expected ',' or '}'");
            goto out;
        }
    }
    p->pos++;
    err = st_keys_check(p, &keys);
out:
    free(keys.v);
    return err;
}

/* Checks and skips the array at the read position (a '['). */
static fr_err_t st_skip_array(st_parser_t *p, int depth)
{
    p->pos++;
    st_skip_ws(p);
    if (st_peek(p) == ']') {
        p->pos++;
        return FR_OK;
    }
    for (;;) {
        fr_err_t err = st_skip_value(p, depth + 1);
        if (err != FR_OK)
            return err;
        st_skip_ws(p);
        if (st_peek(p) == ',') {
            p->pos++;
        } else if (st_peek(p) == ']') {
            p->pos++;
            return FR_OK;
        } else {
            return st_bad_json(p, p->pos, "expected ',' or ']'");
        }
    }
}

/* Consumes the literal word (true, false, null) at the read position. */
static fr_err_t st_skip_literal(st_parser_t *p, const char *word)
{
    size_t len = strlen(word);
    if (p->n - p->pos < len || memcmp(p->h + p->pos, word, len) != 0)
        return st_bad_json(p, p->pos, "expected a value");
    p->pos += len;
    return FR_OK;
}

/* Checks the syntax of any JSON value at the read position and skips it.
 * depth counts the enclosing containers; deeper than ST_MAX_DEPTH fails, so
 * the recursion is bounded. */
static fr_err_t st_skip_value(st_parser_t *p, int depth)
{
    char *s;
    if (depth > ST_MAX_DEPTH)
        return st_bad_json(p, p->pos, "nesting too deep");
    st_skip_ws(p);
    int c = st_peek(p);
    switch (c) {
    case '{': return st_skip_object(p, depth);
    case '[': return st_skip_array(p, depth);
    case '"': return st_parse_string(p, &s);
    case 't': return st_skip_literal(p, "true");
    case 'f': return st_skip_literal(p, "false");
    case 'n': return st_skip_literal(p, "null");
    default:
        if (c == '-' || st_is_digit(c))
            return st_scan_number(p);
        return st_bad_json(p, p->pos, "expected a value");
    }
}

/* ------------------------------------------------------------------------
 * Header structure
 * ---------------------------------------------------------------------- */

/* Parses the value of "dtype" into e. */
static fr_err_t st_parse_dtype(st_parser_t *p, st_entry_t *e)
{
    char shown[ST_SHOW], dshown[ST_SHOW];
    char *dtype;
    st_skip_ws(p);
    if (st_peek(p) != '"')
        return st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': \"dtype\" must be a string",
                       st_show(e->t.name, shown));
    fr_err_t err = st_parse_string(p, &dtype);
    if (err != FR_OK)
        return err;
    e->esize = st_dtype_size(dtype);
    if (e->esize == 0)
        return st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': unknown dtype '%s'",
                       st_show(e->t.name, shown), st_show(dtype, dshown));
    snprintf(e->t.dtype, sizeof e->t.dtype, "%s", dtype);
    return FR_OK;
}

/* Parses the value of "shape", an array of at most FR_ST_MAX_DIMS
 * non-negative integers ([] is a scalar), into e. */
static fr_err_t st_parse_shape(st_parser_t *p, st_entry_t *e)
{
    char shown[ST_SHOW];
    st_skip_ws(p);
    if (st_peek(p) != '[')
        return st_fail(&p->ec, FR_ERR_PARSE,
                       "tensor '%s': \"shape\" must be an array of non-negative integers",
                       st_show(e->t.name, shown));
    p->pos++;
    e->t.ndim = 0;
    st_skip_ws(p);
    if (st_peek(p) == ']') {
        p->pos++;
        return FR_OK;
    }
    for (;;) {
        uint64_t v;
        if (e->t.ndim == FR_ST_MAX_DIMS)
            return st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': shape has more than %d dimensions",
                           st_show(e->t.name, shown), FR_ST_MAX_DIMS);
        fr_err_t err = st_parse_uint(p, e->t.name, "shape", &v);
        if (err != FR_OK)
            return err;
        if (v > (uint64_t)INT64_MAX)
            return st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': a \"shape\" value is too large",
                           st_show(e->t.name, shown));
        e->t.shape[e->t.ndim++] = (int64_t)v;
        st_skip_ws(p);
        if (st_peek(p) == ']') {
            p->pos++;
            return FR_OK;
        }
        if (st_peek(p) != ',')
            return st_bad_json(p, p->pos, "expected ',' or ']'");
        p->pos++;
    }
}

/* Parses the value of "data_offsets", exactly [begin, end], into e. */
static fr_err_t st_parse_offsets(st_parser_t *p, st_entry_t *e)
{
    char shown[ST_SHOW];
    fr_err_t err;
    st_skip_ws(p);
    if (st_peek(p) != '[')
        goto not_pair;
    p->pos++;
    st_skip_ws(p);
    if (st_peek(p) == ']')
        goto not_pair;
    if ((err = st_parse_uint(p, e->t.name, "data_offsets", &e->begin)) != FR_OK)
        return err;
    st_skip_ws(p);
    if (st_peek(p) == ']')
        goto not_pair;
    if ((err = st_expect(p, ',')) != FR_OK ||
        (err = st_parse_uint(p, e->t.name, "data_offsets", &e->end)) != FR_OK)
        return err;
    st_skip_ws(p);
    if (st_peek(p) == ',')
        goto not_pair;
    return st_expect(p, ']');
not_pair:
    return st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': \"data_offsets\" must be [begin, end]",
                   st_show(e->t.name, shown));
}

/* Checks that e's byte range matches its shape and dtype and sets nbytes. */
static fr_err_t st_check_tensor_size(st_parser_t *p, st_entry_t *e)
{
    char shown[ST_SHOW], shape[ST_SHAPE_TEXT], bytes[32];
    uint64_t nbytes = 0;
    bool ok = st_shape_bytes(e->t.shape, e->t.ndim, e->esize, &nbytes);
    if (e->end < e->begin)
        return st_fail(&p->ec, FR_ERR_PARSE,
                       "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin",
                       st_show(e->t.name, shown), e->begin, e->end);
    if (ok && e->end - e->begin == nbytes) {
        e->t.nbytes = (size_t)nbytes;
        return FR_OK;
    }
    if (ok)
        snprintf(bytes, sizeof bytes, "%" PRIu64 " bytes", nbytes);
    else
        snprintf(bytes, sizeof bytes, "over 2^64 bytes");
    return st_fail(&p->ec, FR_ERR_PARSE,
                   "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                   "] do not match shape %s of %s (%s)",
                   st_show(e->t.name, shown), e->begin, e->end,
                   st_shape_text(e->t.shape, e->t.ndim, shape), e->t.dtype, bytes);
}

/* Parses one tensor's description {"dtype", "shape", "data_offsets", any
 * other field skipped} and appends it to p->ents. */
static fr_err_t st_parse_tensor(st_parser_t *p, const char *name)
{
    char shown[ST_SHOW];
    st_entry_t e;
    st_keys_t keys = {0};
    bool have_dtype = false, have_shape = false, have_offsets = false;
    fr_err_t err = FR_OK;
    memset(&e, 0, sizeof e);
    e.t.name = name;
    e.order = p->nents;
    st_skip_ws(p);
    if (st_peek(p) != '{') {
        err = st_fail(&p->ec, FR_ERR_PARSE,
                      "tensor '%s': value must be an object with dtype, shape and data_offsets",
                      st_show(name, shown));
        goto out;
    }
    p->pos++;
    st_skip_ws(p);
    while (st_peek(p) != '}') {
        char *key;
        if (keys.n > 0 && (err = st_expect(p, ',')) != FR_OK)
            goto out;
        st_skip_ws(p);
        size_t at = p->pos;
        if (st_peek(p) != '"') {
            err = st_bad_json(p, at, "expected a string key");
            goto out;
        }
        if ((err = st_parse_string(p, &key)) != FR_OK ||
            (err = st_keys_push(p, &keys, key, at)) != FR_OK || (err = st_expect(p, ':')) != FR_OK)
            goto out;
        if (strcmp(key, "dtype") == 0) {
            have_dtype = true;
            err = st_parse_dtype(p, &e);
        } else if (strcmp(key, "shape") == 0) {
            have_shape = true;
            err = st_parse_shape(p, &e);
        } else if (strcmp(key, "data_offsets") == 0) {
            have_offsets = true;
            err = st_parse_offsets(p, &e);
        } else {
            err = st_skip_value(p, 3); /* an unknown field, ignored as the reference does */
        }
        if (err != FR_OK)
            goto out;
        st_skip_ws(p);
        if (st_peek(p) != ',' && st_peek(p) != '}') {
            err = st_bad_json(p, p->pos, "expected ',' or '}'");
            goto out;
        }
    }
    p->pos++;
    if ((err = st_keys_check(p, &keys)) != FR_OK)
        goto out;
    if (!have_dtype || !have_shape || !have_offsets) {
        err = st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': missing \"%s\"", st_show(name, shown),
                      !have_dtype   ? "dtype"
                      : !have_shape ? "shape"
                                    : "data_offsets");
        goto out;
    }
    if ((err = st_check_tensor_size(p, &e)) != FR_OK)
        goto out;
    st_entry_t *nents = st_grow(p->ents, &p->capents, p->nents, sizeof e);
    if (nents == NULL) {
        err = st_nomem(&p->ec);
        goto out;
    }
    p->ents = nents;
    p->ents[p->nents++] = e;
out:
    free(keys.v);
    return err;
}

/* Parses the "__metadata__" value: an object of strings (null, which the
 * reference reader also takes, means none). */
static fr_err_t st_parse_metadata(st_parser_t *p)
{
    char shown[ST_SHOW];
    fr_err_t err;
    if (p->seen_meta)
        return st_fail(&p->ec, FR_ERR_PARSE, "duplicate key \"__metadata__\" at header byte %zu",
                       p->pos);
    p->seen_meta = true;
    st_skip_ws(p);
    if (st_peek(p) == 'n')
        return st_skip_literal(p, "null");
    if (st_peek(p) != '{')
        return st_fail(&p->ec, FR_ERR_PARSE, "\"__metadata__\" must be an object of strings");
    p->pos++;
    st_skip_ws(p);
    for (bool first = true; st_peek(p) != '}'; first = false) {
        char *key, *value;
        if (!first && (err = st_expect(p, ',')) != FR_OK)
            return err;
        st_skip_ws(p);
        if (st_peek(p) != '"')
            return st_bad_json(p, p->pos, "expected a string key");
        if ((err = st_parse_string(p, &key)) != FR_OK || (err = st_expect(p, ':')) != FR_OK)
            return err;
        st_skip_ws(p);
        if (st_peek(p) != '"')
            return st_fail(&p->ec, FR_ERR_PARSE, "metadata value for key '%s' is not a string",
                           st_show(key, shown));
        if ((err = st_parse_string(p, &value)) != FR_OK)
            return err;
        fr_st_kv_t *nmeta = st_grow(p->meta, &p->capmeta, p->nmeta, sizeof p->meta[0]);
        if (nmeta == NULL)
            return st_nomem(&p->ec);
        p->meta = nmeta;
        p->meta[p->nmeta].key = key;
        p->meta[p->nmeta].value = value;
        p->nmeta++;
        st_skip_ws(p);
        if (st_peek(p) != ',' && st_peek(p) != '}')
            return st_bad_json(p, p->pos, "expected ',' or '}'");
    }
    p->pos++;
    return FR_OK;
}

/* Parses the whole header: one object of tensors and "__metadata__", then
 * only white space (the padding) to its end. */
static fr_err_t st_parse_header(st_parser_t *p)
{
    fr_err_t err;
    if ((err = st_expect(p, '{')) != FR_OK)
        return err;
    st_skip_ws(p);
    for (bool first = true; st_peek(p) != '}'; first = false) {
        char *key;
        if (!first && (err = st_expect(p, ',')) != FR_OK)
            return err;
        st_skip_ws(p);
        if (st_peek(p) != '"')
            return st_bad_json(p, p->pos, "expected a string key");
        if ((err = st_parse_string(p, &key)) != FR_OK || (err = st_expect(p, ':')) != FR_OK)
            return err;
        if (strcmp(key, "__metadata__") == 0)
            err = st_parse_metadata(p);
        else
            err = st_parse_tensor(p, key);
        if (err != FR_OK)
            return err;
        st_skip_ws(p);
        if (st_peek(p) != ',' && st_peek(p) != '}')
            return st_bad_json(p, p->pos, "expected ',' or '}'");
    }
    p->pos++;
    st_skip_ws(p);
    if (p->pos != p->n)
        return st_bad_json(p, p->pos, "unexpected data after the header object");
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Whole-file checks and the result
 * ---------------------------------------------------------------------- */

/* Checks the length prefix of an image of len bytes and the header's first
 * byte; on success *n is the header length. */
static fr_err_t st_check_prefix(const st_errctx_t *ec, const uint8_t *img, size_t len, uint64_t *n)
{
    if (len < 8)
        return st_fail(ec, FR_ERR_PARSE, "file size %zu is too small for the 8-byte header length",
                       len);
    *n = st_le64(img);
    if (*n < 2)
        return st_fail(ec, FR_ERR_PARSE, "header length %" PRIu64 " is too small (minimum 2)", *n);
    if (*n > ST_MAX_HEADER)
        return st_fail(ec, FR_ERR_PARSE,
                       "header length %" PRIu64 " exceeds the limit of %" PRIu64 " bytes", *n,
                       ST_MAX_HEADER);
    if (*n > len - 8)
        return st_fail(ec, FR_ERR_PARSE, "header length %" PRIu64 " exceeds file size %zu", *n,
                       len);
    if (img[8] != '{')
        return st_fail(ec, FR_ERR_PARSE, "header does not start with '{'");
    return FR_OK;
}

static int st_cmp_offset(const void *a, const void *b)
{
    const st_entry_t *x = a, *y = b;
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
static fr_err_t st_check_layout(st_parser_t *p, uint8_t *img, size_t len)
{
    char s1[ST_SHOW], s2[ST_SHOW];
    uint64_t pos = 0;
    for (size_t i = 0; i < p->nents; i++) {
        const st_entry_t *e = &p->ents[i];
        if (e->begin > pos && i == 0)
            return st_fail(&p->ec, FR_ERR_PARSE,
                           "data does not start at byte 0: first tensor '%s' begins at byte "
                           "%" PRIu64,
                           st_show(e->t.name, s1), e->begin);
        if (e->begin > pos)
            return st_fail(&p->ec, FR_ERR_PARSE,
                           "hole in data between byte %" PRIu64 " and %" PRIu64, pos, e->begin);
        if (e->begin < pos)
            return st_fail(&p->ec, FR_ERR_PARSE,
                           "tensors '%s' and '%s' overlap at data bytes [%" PRIu64 ", %" PRIu64 ")",
                           st_show(p->ents[i - 1].t.name, s1), st_show(e->t.name, s2), e->begin,
                           e->end < pos ? e->end : pos);
        pos = e->end;
    }
    uint64_t start = 8 + (uint64_t)p->n; /* p->n <= ST_MAX_HEADER: no overflow */
    if (pos > UINT64_MAX - start)
        return st_fail(&p->ec, FR_ERR_PARSE,
                       "file size %zu does not match header (data ends at offset %" PRIu64 ")", len,
                       pos);
    if (start + pos != len)
        return st_fail(&p->ec, FR_ERR_PARSE,
                       "file size %zu does not match header (expected %" PRIu64 ")", len,
                       start + pos);
    for (size_t i = 0; i < p->nents; i++)
        p->ents[i].t.data = img + start + p->ents[i].begin;
    return FR_OK;
}

/* Sorts the tensors by name and the metadata by key for the look-ups, and
 * fails on a duplicate of either. */
static fr_err_t st_index(st_parser_t *p, fr_st_file_t *st)
{
    char shown[ST_SHOW];
    st->by_name = malloc((p->nents ? p->nents : 1) * sizeof st->by_name[0]);
    if (st->by_name == NULL)
        return st_nomem(&p->ec);
    for (size_t i = 0; i < p->nents; i++)
        st->by_name[i] = &p->ents[i].t;
    qsort(st->by_name, p->nents, sizeof st->by_name[0], st_cmp_tensor_name);
    for (size_t i = 1; i < p->nents; i++) {
        if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0)
            return st_fail(&p->ec, FR_ERR_PARSE, "duplicate tensor name '%s'",
                           st_show(st->by_name[i]->name, shown));
    }
    if (p->nmeta > 0)
        qsort(p->meta, p->nmeta, sizeof p->meta[0], st_cmp_kv);
    for (size_t i = 1; i < p->nmeta; i++) {
        if (strcmp(p->meta[i - 1].key, p->meta[i].key) == 0)
            return st_fail(&p->ec, FR_ERR_PARSE, "duplicate metadata key '%s'",
                           st_show(p->meta[i].key, shown));
    }
    return FR_OK;
}

/* Parses the image img[0..len), which lies inside the allocation mem.
 * Takes ownership of mem in every case: the result keeps it, or it is freed
 * on error. The header is modified in place (strings decoded). */
static fr_st_file_t *st_parse_owned(uint8_t *mem, uint8_t *img, size_t len, const char *path,
                                    char *errstr, size_t size)
{
    st_parser_t p;
    fr_st_file_t *st = NULL;
    uint64_t n = 0;
    memset(&p, 0, sizeof p);
    p.ec.path = path;
    p.ec.errstr = errstr;
    p.ec.size = size;
    if (st_check_prefix(&p.ec, img, len, &n) != FR_OK)
        goto err;
    p.h = (char *)img + 8;
    p.n = (size_t)n;
    if (st_parse_header(&p) != FR_OK)
        goto err;
    st = calloc(1, sizeof *st);
    if (st == NULL) {
        st_nomem(&p.ec);
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
    return st;
err:
    if (st != NULL)
        free(st->by_name);
    free(st);
    free(p.ents);
    free(p.meta);
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
    st_errctx_t ec = {NULL, errstr, size};
    uint64_t n = 0;
    if (buf == NULL && len > 0) {
        st_fail(&ec, FR_ERR_INVAL, "NULL buffer");
        return NULL;
    }
    /* Reject a bad prefix before copying what may be a large buffer. */
    if (st_check_prefix(&ec, buf, len, &n) != FR_OK)
        return NULL;
    size_t pad = st_data_pad(n);
    uint8_t *mem = len <= SIZE_MAX - pad ? malloc(len + pad) : NULL;
    if (mem == NULL) {
        st_nomem(&ec);
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
static fr_err_t st_slurp(const st_errctx_t *ec, int fd, const uint8_t *prefix, size_t got,
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
        return st_nomem(ec);
    memcpy(*mem + *pad, prefix, got);
    used = *pad + got;
    /* Refuse a bad length prefix before reading on: /dev/zero or a stream
     * that is no safetensors must not be read to its end. */
    if (got == 8) {
        uint64_t n = st_le64(prefix);
        if (n < 2)
            return st_fail(ec, FR_ERR_PARSE, "header length %" PRIu64 " is too small (minimum 2)",
                           n);
        if (n > ST_MAX_HEADER)
            return st_fail(ec, FR_ERR_PARSE,
                           "header length %" PRIu64 " exceeds the limit of %" PRIu64 " bytes", n,
                           ST_MAX_HEADER);
        if (hint > 0 && n > hint - 8)
            return st_fail(ec, FR_ERR_PARSE, "header length %" PRIu64 " exceeds file size %zu", n,
                           hint);
    }
    while (got == 8) {
        if (hint == 0 && used - *pad > ST_MAX_STREAM)
            return st_fail(ec, FR_ERR_PARSE, "more than %llu bytes from a stream: not a model file",
                           (unsigned long long)ST_MAX_STREAM);
        if (hint == 0 && used - *pad > 8 && (*mem)[*pad + 8] != '{')
            return st_fail(ec, FR_ERR_PARSE, "header does not start with '{'");
        if (used == cap) {
            uint8_t *nm = cap <= SIZE_MAX / 2 ? realloc(*mem, cap * 2) : NULL;
            if (nm == NULL)
                return st_nomem(ec);
            *mem = nm;
            cap *= 2;
        }
        ssize_t k = read(fd, *mem + used, cap - used);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return st_fail(ec, FR_ERR_IO, "cannot read: %s", strerror(errno));
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
    st_errctx_t ec = {path, errstr, size};
    uint8_t prefix[8], *mem = NULL;
    size_t got, pad = 0, len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st_fail(&ec, FR_ERR_IO, "cannot open: %s", strerror(errno));
        return NULL;
    }
    fr_err_t err = st_read_full(fd, prefix, sizeof prefix, &got) != 0
                       ? st_fail(&ec, FR_ERR_IO, "cannot read: %s", strerror(errno))
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

/* ------------------------------------------------------------------------
 * Writer
 * ---------------------------------------------------------------------- */

static void st_buf_put(st_buf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->cap - b->len < n) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap - b->len < n) {
            if (ncap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            ncap *= 2;
        }
        char *np = realloc(b->p, ncap);
        if (np == NULL) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void st_buf_puts(st_buf_t *b, const char *s)
{
    st_buf_put(b, s, strlen(s));
}

/* Appends s as a JSON string: quotes and backslashes escaped, control
 * characters as \u00XX, everything else (valid UTF-8) as it is. */
static void st_buf_put_json(st_buf_t *b, const char *s)
{
    const char *run = s;
    st_buf_put(b, "\"", 1);
    for (const char *c = s; *c != '\0'; c++) {
        unsigned char u = (unsigned char)*c;
        if (u != '"' && u != '\\' && u >= 0x20)
            continue;
        char esc[8];
        st_buf_put(b, run, (size_t)(c - run));
        if (u < 0x20)
            snprintf(esc, sizeof esc, "\\u%04x", u);
        else
            snprintf(esc, sizeof esc, "\\%c", u);
        st_buf_puts(b, esc);
        run = c + 1;
    }
    st_buf_puts(b, run);
    st_buf_put(b, "\"", 1);
}

/* Checks one tensor given to the writer: a UTF-8 name other than
 * "__metadata__", dtype F32, a valid shape and nbytes that matches it. */
static fr_err_t st_check_write_tensor(const st_errctx_t *ec, const fr_st_tensor_t *t, size_t i)
{
    char shown[ST_SHOW], shape[ST_SHAPE_TEXT];
    uint64_t nbytes;
    if (t->name == NULL || !st_utf8_valid(t->name))
        return st_fail(ec, FR_ERR_INVAL, "tensor %zu: name is NULL or not valid UTF-8", i);
    const char *name = st_show(t->name, shown);
    if (strcmp(t->name, "__metadata__") == 0)
        return st_fail(ec, FR_ERR_INVAL, "tensor name '__metadata__' is reserved");
    if (memcmp(t->dtype, "F32", 4) != 0)
        return st_fail(ec, FR_ERR_INVAL, "tensor '%s': only F32 tensors can be written", name);
    if (t->ndim < 0 || t->ndim > FR_ST_MAX_DIMS)
        return st_fail(ec, FR_ERR_INVAL, "tensor '%s': ndim %d is outside [0, %d]", name, t->ndim,
                       FR_ST_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return st_fail(ec, FR_ERR_INVAL, "tensor '%s': negative dimension in shape %s", name,
                           st_shape_text(t->shape, t->ndim, shape));
    }
    if (!st_shape_bytes(t->shape, t->ndim, 4, &nbytes) || nbytes != t->nbytes)
        return st_fail(ec, FR_ERR_INVAL, "tensor '%s': nbytes %zu does not match shape %s of F32",
                       name, t->nbytes, st_shape_text(t->shape, t->ndim, shape));
    if (t->data == NULL && t->nbytes > 0)
        return st_fail(ec, FR_ERR_INVAL, "tensor '%s' has no data", name);
    return FR_OK;
}

/* Fails if two of the n strings are equal; what names them in the message. */
static fr_err_t st_check_unique(const st_errctx_t *ec, const char **v, size_t n, const char *what)
{
    char shown[ST_SHOW];
    qsort(v, n, sizeof v[0], st_cmp_str_ptr);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(v[i - 1], v[i]) == 0)
            return st_fail(ec, FR_ERR_INVAL, "duplicate %s '%s'", what, st_show(v[i], shown));
    }
    return FR_OK;
}

/* Checks all the writer's arguments; *datalen receives the data size. */
static fr_err_t st_check_write_args(const st_errctx_t *ec, const fr_st_tensor_t *tensors,
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
            return st_fail(ec, FR_ERR_INVAL, "tensors too large");
        *datalen += tensors[i].nbytes;
    }
    for (size_t i = 0; i < nmeta; i++) {
        if (meta[i].key == NULL || meta[i].value == NULL || !st_utf8_valid(meta[i].key) ||
            !st_utf8_valid(meta[i].value))
            return st_fail(ec, FR_ERR_INVAL,
                           "metadata entry %zu: key or value NULL or not valid UTF-8", i);
    }
    if (most < 2)
        return FR_OK;
    if ((names = malloc(most * sizeof names[0])) == NULL)
        return st_nomem(ec);
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
static void st_build_header(st_buf_t *b, const fr_st_tensor_t *tensors, size_t ntensors,
                            const fr_st_kv_t *meta, size_t nmeta)
{
    char num[64];
    uint64_t off = 0;
    st_buf_puts(b, "{");
    if (nmeta > 0) {
        st_buf_puts(b, "\"__metadata__\":{");
        for (size_t i = 0; i < nmeta; i++) {
            if (i > 0)
                st_buf_puts(b, ",");
            st_buf_put_json(b, meta[i].key);
            st_buf_puts(b, ":");
            st_buf_put_json(b, meta[i].value);
        }
        st_buf_puts(b, "}");
    }
    for (size_t i = 0; i < ntensors; i++) {
        const fr_st_tensor_t *t = &tensors[i];
        if (i > 0 || nmeta > 0)
            st_buf_puts(b, ",");
        st_buf_put_json(b, t->name);
        st_buf_puts(b, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, d ? ",%" PRId64 : "%" PRId64, t->shape[d]);
            st_buf_puts(b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off,
                 off + t->nbytes);
        st_buf_puts(b, num);
        off += t->nbytes;
    }
    st_buf_puts(b, "}");
    while (!b->oom && b->len % 8 != 0)
        st_buf_puts(b, " ");
}

/* Validates the arguments, builds the header, then assembles prefix, header
 * and the tensors' bytes in the order given into one malloc'ed image. */
fr_err_t fr_st_encode(const fr_st_tensor_t *tensors, size_t ntensors, const fr_st_kv_t *meta,
                      size_t nmeta, uint8_t **out, size_t *len, char *errstr, size_t size)
{
    st_errctx_t ec = {NULL, errstr, size};
    st_buf_t hdr = {0};
    size_t datalen;
    fr_err_t err;
    if (out == NULL || len == NULL)
        return st_fail(&ec, FR_ERR_INVAL, "fr_st_encode: NULL argument");
    *out = NULL;
    *len = 0;
    if ((ntensors > 0 && tensors == NULL) || (nmeta > 0 && meta == NULL))
        return st_fail(&ec, FR_ERR_INVAL, "fr_st_encode: NULL argument");
    if ((err = st_check_write_args(&ec, tensors, ntensors, meta, nmeta, &datalen)) != FR_OK)
        return err;
    st_build_header(&hdr, tensors, ntensors, meta, nmeta);
    if (hdr.oom || hdr.len > ST_MAX_HEADER || datalen > SIZE_MAX - 8 - hdr.len) {
        free(hdr.p);
        return hdr.oom ? st_nomem(&ec) : st_fail(&ec, FR_ERR_INVAL, "header or data too large");
    }
    uint8_t *img = malloc(8 + hdr.len + datalen);
    if (img == NULL) {
        free(hdr.p);
        return st_nomem(&ec);
    }
    st_put_le64(img, hdr.len);
    memcpy(img + 8, hdr.p, hdr.len);
    size_t off = 8 + hdr.len;
    for (size_t i = 0; i < ntensors; i++) {
        if (tensors[i].nbytes > 0)
            memcpy(img + off, tensors[i].data, tensors[i].nbytes);
        off += tensors[i].nbytes;
    }
    free(hdr.p);
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
    st_errctx_t ec = {NULL, errstr, size};
    uint8_t *img = NULL;
    size_t len;
    char *tmp = NULL;
    int fd = -1;
    fr_err_t err;
    if (path == NULL)
        return st_fail(&ec, FR_ERR_INVAL, "fr_st_write_file: NULL path");
    if ((err = fr_st_encode(tensors, ntensors, meta, nmeta, &img, &len, errstr, size)) != FR_OK)
        return err;
    size_t tmpsize = strlen(path) + 32;
    if ((tmp = malloc(tmpsize)) == NULL) {
        err = st_nomem(&ec);
        goto out;
    }
    snprintf(tmp, tmpsize, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        err = st_fail(&ec, FR_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (st_write_all(fd, img, len) != 0 || fsync(fd) != 0) {
        err = st_fail(&ec, FR_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        goto out;
    }
    int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        err = st_fail(&ec, FR_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0) {
        err = st_fail(&ec, FR_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
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
