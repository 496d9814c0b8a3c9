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
 * The header is parsed by libjansson (json_loadb, rejecting duplicate keys);
 * tensor names and metadata point into its tree, which the result owns.
 * Values the reader does not need (unknown fields of a tensor, which the
 * reference implementation ignores) are checked for syntax and skipped. It
 * rejects duplicate keys, invalid UTF-8, lone surrogates, \u0000 (names and
 * values are C strings here) and nesting deeper than ST_MAX_DEPTH; the
 * layout checks (dtypes, shapes, exact sizes, no holes or overlaps, the
 * file's exact size) are this file's own. A build without libjansson
 * (FRESHET_CORE_ONLY on a host without it) writes files but reads none:
 * reading fails with "built without libjansson".
 *
 * The writer is in safetensors_write.c; what both use is declared in
 * common_int.h.
 *
 * Every function is reentrant. A parsed fr_st_file_t is never modified, so
 * any number of threads may read one at the same time.
 */
#include <assert.h>
#include <ctype.h>
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

#ifdef FRESHET_HAVE_JANSSON
#include <jansson.h>
#endif

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
#define ST_MAX_DEPTH  64 /* JSON nesting accepted in skipped values */

/* One tensor while parsing and in the result. */
typedef struct st_entry {
    fr_st_tensor_t t;
    uint64_t begin, end; /* data_offsets */
    size_t esize;        /* bytes per element of t.dtype */
    size_t order;        /* position in the header: breaks ties between empty tensors */
} st_entry_t;

struct fr_st_file {
    uint8_t *mem;     /* owned: holds the image; tensor data points into it */
    st_entry_t *ents; /* [nents], by data offset */
    size_t nents;
    const fr_st_tensor_t **by_name; /* [nents], sorted by name, for fr_st_find */
    fr_st_kv_t *meta;               /* [nmeta], sorted by key, for fr_st_meta */
    size_t nmeta;
    void *root; /* owned: the header's json_t, which names and metadata point into */
};

/* Where a number is in the header text. */
typedef struct st_span {
    size_t at, len;
} st_span_t;

typedef struct st_parser {
    fr_st_errctx_t ec;
    const char *h;   /* the header text */
    size_t n;        /* its length */
    void *root;      /* its json_t tree */
    st_span_t *nums; /* every number of the text, in order */
    size_t nnums, capnums;
    size_t next_num; /* the next number of the tree walk */
    st_entry_t *ents;
    size_t nents, capents;
    fr_st_kv_t *meta;
    size_t nmeta, capmeta;
} st_parser_t;

#ifdef FRESHET_HAVE_JANSSON
static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8},
};
#endif

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

#ifdef FRESHET_HAVE_JANSSON
/* The element size of a dtype name, or 0 if the name is unknown. */
static size_t st_dtype_size(const char *name)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(name, st_dtypes[i].name) == 0)
            return st_dtypes[i].size;
    }
    return 0;
}
#endif

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

#ifdef FRESHET_HAVE_JANSSON
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
#endif

/* ------------------------------------------------------------------------
 * The header's JSON, read by libjansson
 *
 * jansson checks the syntax, UTF-8, escapes, surrogates, \u0000 and
 * duplicate keys (JSON_REJECT_DUPLICATES); its errors are reworded below
 * into the messages this reader has always given. Every number is decoded
 * as a real (JSON_DECODE_INT_AS_REAL), which never overflows where a 64-bit
 * integer would; the "shape" and "data_offsets" values are read again from
 * their text, exactly, by st_scan (below), which pairs the k-th number of
 * the tree, walked in document order (jansson keeps the order of an
 * object's keys), with the k-th number of the text.
 * ---------------------------------------------------------------------- */

fr_err_t fr__st_nomem(const fr_st_errctx_t *ec)
{
    return fr__st_fail(ec, FR_ERR_NOMEM, "out of memory");
}

#ifdef FRESHET_HAVE_JANSSON

static fr_err_t st_bad_json(st_parser_t *p, size_t at, const char *what)
{
    return fr__st_fail(&p->ec, FR_ERR_PARSE, "bad JSON at header byte %zu: %s", at, what);
}

static bool st_is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* The index after the string that starts at h[i] (a '"'), or n. */
static size_t st_string_end(const char *h, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (h[i] == '\\')
            i++;
        else if (h[i] == '"')
            return i + 1;
    }
    return n;
}

/* Walks the header text, which jansson accepted: records where each number
 * is (p->nums, in document order) and refuses nesting deeper than
 * ST_MAX_DEPTH (a value inside ST_MAX_DEPTH open containers). */
static fr_err_t st_scan(st_parser_t *p)
{
    size_t level = 0;
    for (size_t i = 0; i < p->n;) {
        char c = p->h[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == ':') {
            i++;
            continue;
        }
        if (c == '}' || c == ']') {
            assert(level > 0); /* jansson matched the brackets */
            level -= level > 0;
            i++;
            continue;
        }
        if (level >= ST_MAX_DEPTH)
            return st_bad_json(p, i, "nesting too deep");
        if (c == '{' || c == '[') {
            level++;
            i++;
        } else if (c == '"') {
            i = st_string_end(p->h, p->n, i);
        } else if (c == '-' || st_is_digit(c)) {
            size_t start = i;
            while (i < p->n &&
                   (st_is_digit(p->h[i]) || (p->h[i] != '\0' && strchr("+-.eE", p->h[i]) != NULL)))
                i++;
            st_span_t *nv = st_grow(p->nums, &p->capnums, p->nnums, sizeof p->nums[0]);
            if (nv == NULL)
                return fr__st_nomem(&p->ec);
            p->nums = nv;
            p->nums[p->nnums++] = (st_span_t){start, i - start};
        } else {
            do /* true, false, null */
                i++;
            while (i < p->n && p->h[i] >= 'a' && p->h[i] <= 'z');
        }
    }
    return FR_OK;
}

/* The error for jansson's "invalid escape", which ends at pos: a string cut
 * short, a \u escape cut short or with bad digits, or an unknown escape. */
static fr_err_t st_escape_error(st_parser_t *p, size_t pos)
{
    size_t end = pos < p->n ? pos : p->n, b = SIZE_MAX;
    for (size_t i = end; i-- > 0 && end - i <= 6;) {
        if (p->h[i] != '\\')
            continue;
        if (i + 1 < p->n && p->h[i + 1] == 'u') {
            b = i; /* the escape jansson was reading, whatever ended it */
            break;
        }
        if (b == SIZE_MAX)
            b = i;
    }
    if (b == SIZE_MAX || b + 1 >= p->n)
        return st_bad_json(p, p->n, "unterminated string");
    if (p->h[b + 1] != 'u')
        return st_bad_json(p, b, "bad escape in string");
    size_t hex = 0;
    while (hex < 4 && b + 2 + hex < p->n && isxdigit((unsigned char)p->h[b + 2 + hex]))
        hex++;
    if (hex < 4 && b + 2 + hex == p->n)
        return st_bad_json(p, b, "truncated \\u escape");
    return st_bad_json(p, b, "bad hex digits in \\u escape");
}

/* The error for jansson's "invalid token", which ends at pos: a number with
 * a leading zero ("00"), another bad number, or a word that is no value. */
static fr_err_t st_token_error(st_parser_t *p, size_t pos)
{
    size_t end = pos < p->n ? pos : p->n, start = end;
    while (start > 0 && (isalnum((unsigned char)p->h[start - 1]) ||
                         (p->h[start - 1] != '\0' && strchr("+-.", p->h[start - 1]) != NULL)))
        start--;
    char c = start < p->n ? p->h[start] : '\0';
    if (c != '-' && !st_is_digit(c))
        return st_bad_json(p, start, "expected a value");
    size_t len = end - start;
    if (len > 0 && end < p->n && st_is_digit(p->h[end]) && p->h[end - 1] == '0' &&
        (len == 1 || (len == 2 && c == '-')))
        return fr__st_fail(&p->ec, FR_ERR_PARSE,
                           "bad JSON at header byte %zu: expected ',' after %.*s (a number has no "
                           "leading zeros)",
                           end, (int)len, p->h + start);
    return st_bad_json(p, start, "invalid number");
}

/* The error for a duplicate key, which ends at pos: named as a duplicate
 * tensor name or metadata key where it is one. */
static fr_err_t st_dup_key_error(st_parser_t *p, size_t pos)
{
    char shown[FR_ST_SHOW];
    size_t end = pos < p->n ? pos : p->n, ks = end >= 2 ? end - 2 : 0;
    while (ks > 0 && (p->h[ks] != '"' || p->h[ks - 1] == '\\'))
        ks--; /* an escaped quote inside a key is never at its start */
    json_t *k = json_loadb(p->h + ks, end - ks, JSON_DECODE_ANY, NULL);
    fr__st_show(json_is_string(k) ? json_string_value(k) : "?", shown);
    json_decref(k);
    /* where the key is: the header object, the "__metadata__" object (as
     * it is spelled without escapes) or deeper */
    size_t level = 0;
    bool meta_key = false, in_meta = false;
    for (size_t i = 0; i < ks;) {
        char c = p->h[i];
        if (c == '"') {
            size_t e = st_string_end(p->h, p->n, i);
            if (level == 1)
                meta_key = e - i == 14 && memcmp(p->h + i, "\"__metadata__\"", 14) == 0;
            i = e;
            continue;
        }
        if (c == '{' || c == '[') {
            level++;
            if (level == 2)
                in_meta = meta_key && c == '{';
        } else if ((c == '}' || c == ']') && level > 0) {
            level--;
        }
        i++;
    }
    if (level == 1 && strcmp(shown, "__metadata__") != 0)
        return fr__st_fail(&p->ec, FR_ERR_PARSE, "duplicate tensor name '%s'", shown);
    if (level == 2 && in_meta)
        return fr__st_fail(&p->ec, FR_ERR_PARSE, "duplicate metadata key '%s'", shown);
    return fr__st_fail(&p->ec, FR_ERR_PARSE, "duplicate key \"%s\" at header byte %zu", shown, ks);
}

static bool st_starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/*
 * Rewords jansson's error je in this reader's terms ("bad JSON at header
 * byte N: expected ':'"). jansson's position counts the bytes it read, up
 * to the end of the token it names ("near 'x'"); the byte given is that
 * token's first. Messages jansson may add later are passed on as they are.
 */
static fr_err_t st_json_error(st_parser_t *p, const json_error_t *je)
{
    const char *text = je->text, *q = strstr(text, " near '");
    size_t pos = je->position > 0 ? (size_t)je->position : 0;
    char near[32] = "";
    if (pos > p->n)
        pos = p->n;
    size_t tok = pos;
    if (q != NULL) {
        const char *e = strrchr(q + 7, '\'');
        size_t nlen = e != NULL ? (size_t)(e - (q + 7)) : 0;
        snprintf(near, sizeof near, "%.*s", (int)nlen, q + 7);
        tok = nlen <= pos ? pos - nlen : 0;
    } else if (pos > 0 && p->h[pos - 1] == '\0') {
        tok = pos - 1; /* jansson reads a NUL byte as the end of its input */
    }
    switch (json_error_code(je)) {
    case json_error_out_of_memory: return fr__st_nomem(&p->ec);
    case json_error_stack_overflow: return st_bad_json(p, tok, "nesting too deep");
    case json_error_invalid_utf8: return st_bad_json(p, pos, "invalid UTF-8");
    case json_error_null_character:
    case json_error_null_byte_in_key:
        return st_bad_json(p, tok, "\\u0000 is not allowed in a string");
    case json_error_duplicate_key: return st_dup_key_error(p, pos);
    case json_error_numeric_overflow: return st_bad_json(p, tok, "number out of range");
    case json_error_end_of_input_expected:
        return st_bad_json(p, tok, "unexpected data after the header object");
    default: break;
    }
    if (st_starts(text, "premature end of input"))
        return st_bad_json(p, pos, "unterminated string");
    if (st_starts(text, "invalid escape"))
        return st_escape_error(p, pos);
    if (st_starts(text, "invalid Unicode"))
        return st_bad_json(p, tok, "unpaired surrogate in \\u escape");
    if (st_starts(text, "control character") || st_starts(text, "unexpected newline"))
        return st_bad_json(p, pos, "control character in string");
    if (st_starts(text, "invalid token"))
        return st_token_error(p, pos);
    if (st_starts(text, "':' expected"))
        return st_bad_json(p, tok, "expected ':'");
    if (st_starts(text, "'}' expected"))
        return st_bad_json(p, tok,
                           strcmp(near, "]") == 0 ? "expected '}' to close the object, not ']'"
                                                  : "expected ',' or '}'");
    if (st_starts(text, "']' expected"))
        return st_bad_json(p, tok,
                           strcmp(near, "}") == 0 ? "expected ']' to close the array, not '}'"
                                                  : "expected ',' or ']'");
    if (st_starts(text, "string or '}' expected"))
        return st_bad_json(p, tok, "expected a string key");
    if (st_starts(text, "unexpected token"))
        return st_bad_json(p, tok, "expected a value");
    return st_bad_json(p, tok, text);
}

/* Parses the next number of the header as a non-negative integer (no sign,
 * fraction or exponent) that fits 64 bits, for field `field` of tensor
 * `name`; v is its node. Other JSON values are errors naming the field. */
static fr_err_t st_parse_uint(st_parser_t *p, const char *name, const char *field, const json_t *v,
                              uint64_t *out)
{
    char shown[FR_ST_SHOW];
    if (!json_is_number(v))
        return fr__st_fail(&p->ec, FR_ERR_PARSE,
                           "tensor '%s': \"%s\" must hold non-negative integers",
                           fr__st_show(name, shown), field);
    /* st_scan saw every number jansson did; a miscount would be a bug */
    if (p->next_num >= p->nnums)
        return fr__st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': \"%s\": a number was not found",
                           fr__st_show(name, shown), field);
    st_span_t t = p->nums[p->next_num++];
    const char *s = p->h + t.at;
    uint64_t x = 0;
    for (size_t i = 0; i < t.len; i++) {
        int d = s[i] - '0';
        if (d < 0 || d > 9)
            return fr__st_fail(&p->ec, FR_ERR_PARSE,
                               "tensor '%s': \"%s\" must hold non-negative integers, not %.*s",
                               fr__st_show(name, shown), field, (int)(t.len > 32 ? 32 : t.len), s);
        if (x > (UINT64_MAX - (uint64_t)d) / 10)
            return fr__st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': a \"%s\" value is too large",
                               fr__st_show(name, shown), field);
        x = x * 10 + (uint64_t)d;
    }
    *out = x;
    return FR_OK;
}

/* Steps over the numbers of a value this reader ignores. */
static void st_skip_numbers(st_parser_t *p, const json_t *v)
{
    const char *key;
    json_t *x;
    size_t i;
    if (json_is_number(v)) {
        p->next_num++;
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x) st_skip_numbers(p, x);
    } else if (json_is_object(v)) {
        json_object_foreach((json_t *)v, key, x) st_skip_numbers(p, x);
    }
}

/* ------------------------------------------------------------------------
 * Header structure
 * ---------------------------------------------------------------------- */

/* Reads the value of "dtype" into e. */
static fr_err_t st_parse_dtype(st_parser_t *p, st_entry_t *e, const json_t *v)
{
    char shown[FR_ST_SHOW], dshown[FR_ST_SHOW];
    if (!json_is_string(v))
        return fr__st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': \"dtype\" must be a string",
                           fr__st_show(e->t.name, shown));
    const char *dtype = json_string_value(v);
    e->esize = st_dtype_size(dtype);
    if (e->esize == 0)
        return fr__st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': unknown dtype '%s'",
                           fr__st_show(e->t.name, shown), fr__st_show(dtype, dshown));
    snprintf(e->t.dtype, sizeof e->t.dtype, "%s", dtype);
    return FR_OK;
}

/* Reads the value of "shape", an array of at most FR_ST_MAX_DIMS
 * non-negative integers ([] is a scalar), into e. */
static fr_err_t st_parse_shape(st_parser_t *p, st_entry_t *e, const json_t *v)
{
    char shown[FR_ST_SHOW];
    const json_t *x;
    size_t i;
    if (!json_is_array(v))
        return fr__st_fail(&p->ec, FR_ERR_PARSE,
                           "tensor '%s': \"shape\" must be an array of non-negative integers",
                           fr__st_show(e->t.name, shown));
    e->t.ndim = 0;
    json_array_foreach(v, i, x)
    {
        uint64_t d;
        if (e->t.ndim == FR_ST_MAX_DIMS)
            return fr__st_fail(&p->ec, FR_ERR_PARSE,
                               "tensor '%s': shape has more than %d dimensions",
                               fr__st_show(e->t.name, shown), FR_ST_MAX_DIMS);
        fr_err_t err = st_parse_uint(p, e->t.name, "shape", x, &d);
        if (err != FR_OK)
            return err;
        if (d > (uint64_t)INT64_MAX)
            return fr__st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': a \"shape\" value is too large",
                               fr__st_show(e->t.name, shown));
        e->t.shape[e->t.ndim++] = (int64_t)d;
    }
    return FR_OK;
}

/* Reads the value of "data_offsets", exactly [begin, end], into e; its
 * values are checked in order, as they come, before its length. */
static fr_err_t st_parse_offsets(st_parser_t *p, st_entry_t *e, const json_t *v)
{
    char shown[FR_ST_SHOW];
    fr_err_t err;
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (n == 0)
        goto not_pair;
    if ((err = st_parse_uint(p, e->t.name, "data_offsets", json_array_get(v, 0), &e->begin)) !=
        FR_OK)
        return err;
    if (n == 1)
        goto not_pair;
    if ((err = st_parse_uint(p, e->t.name, "data_offsets", json_array_get(v, 1), &e->end)) != FR_OK)
        return err;
    if (n == 2)
        return FR_OK;
not_pair:
    return fr__st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': \"data_offsets\" must be [begin, end]",
                       fr__st_show(e->t.name, shown));
}

/* Checks that e's byte range matches its shape and dtype and sets nbytes. */
static fr_err_t st_check_tensor_size(st_parser_t *p, st_entry_t *e)
{
    char shown[FR_ST_SHOW], shape[FR_ST_SHAPE_TEXT], bytes[32];
    uint64_t nbytes = 0;
    bool ok = fr__st_shape_bytes(e->t.shape, e->t.ndim, e->esize, &nbytes);
    if (e->end < e->begin)
        return fr__st_fail(&p->ec, FR_ERR_PARSE,
                           "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                           "] end before they begin",
                           fr__st_show(e->t.name, shown), e->begin, e->end);
    if (ok && e->end - e->begin == nbytes) {
        e->t.nbytes = (size_t)nbytes;
        return FR_OK;
    }
    if (ok)
        snprintf(bytes, sizeof bytes, "%" PRIu64 " bytes", nbytes);
    else
        snprintf(bytes, sizeof bytes, "over 2^64 bytes");
    return fr__st_fail(&p->ec, FR_ERR_PARSE,
                       "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] do not match shape %s of %s (%s)",
                       fr__st_show(e->t.name, shown), e->begin, e->end,
                       fr__st_shape_text(e->t.shape, e->t.ndim, shape), e->t.dtype, bytes);
}

/* Reads one tensor's description {"dtype", "shape", "data_offsets", any
 * other field ignored, as the reference does} and appends it to p->ents. */
static fr_err_t st_parse_tensor(st_parser_t *p, const char *name, const json_t *v)
{
    char shown[FR_ST_SHOW];
    st_entry_t e;
    bool have_dtype = false, have_shape = false, have_offsets = false;
    const char *key;
    json_t *f;
    fr_err_t err = FR_OK;
    memset(&e, 0, sizeof e);
    e.t.name = name;
    e.order = p->nents;
    if (!json_is_object(v))
        return fr__st_fail(
            &p->ec, FR_ERR_PARSE,
            "tensor '%s': value must be an object with dtype, shape and data_offsets",
            fr__st_show(name, shown));
    json_object_foreach((json_t *)v, key, f)
    {
        if (strcmp(key, "dtype") == 0) {
            have_dtype = true;
            err = st_parse_dtype(p, &e, f);
        } else if (strcmp(key, "shape") == 0) {
            have_shape = true;
            err = st_parse_shape(p, &e, f);
        } else if (strcmp(key, "data_offsets") == 0) {
            have_offsets = true;
            err = st_parse_offsets(p, &e, f);
        } else {
            st_skip_numbers(p, f);
        }
        if (err != FR_OK)
            return err;
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return fr__st_fail(&p->ec, FR_ERR_PARSE, "tensor '%s': missing \"%s\"",
                           fr__st_show(name, shown),
                           !have_dtype   ? "dtype"
                           : !have_shape ? "shape"
                                         : "data_offsets");
    if ((err = st_check_tensor_size(p, &e)) != FR_OK)
        return err;
    st_entry_t *nents = st_grow(p->ents, &p->capents, p->nents, sizeof e);
    if (nents == NULL)
        return fr__st_nomem(&p->ec);
    p->ents = nents;
    p->ents[p->nents++] = e;
    return FR_OK;
}

/* Reads the "__metadata__" value: an object of strings (null, which the
 * reference reader also takes, means none). */
static fr_err_t st_parse_metadata(st_parser_t *p, const json_t *v)
{
    char shown[FR_ST_SHOW];
    const char *key;
    json_t *x;
    if (json_is_null(v))
        return FR_OK;
    if (!json_is_object(v))
        return fr__st_fail(&p->ec, FR_ERR_PARSE, "\"__metadata__\" must be an object of strings");
    json_object_foreach((json_t *)v, key, x)
    {
        if (!json_is_string(x))
            return fr__st_fail(&p->ec, FR_ERR_PARSE, "metadata value for key '%s' is not a string",
                               fr__st_show(key, shown));
        fr_st_kv_t *nmeta = st_grow(p->meta, &p->capmeta, p->nmeta, sizeof p->meta[0]);
        if (nmeta == NULL)
            return fr__st_nomem(&p->ec);
        p->meta = nmeta;
        p->meta[p->nmeta].key = key;
        p->meta[p->nmeta].value = json_string_value(x);
        p->nmeta++;
    }
    return FR_OK;
}

/* Parses the whole header: one object of tensors and "__metadata__", then
 * only white space (the padding) to its end. The tree, which the names and
 * metadata point into, is left in p->root for the result to own. */
static fr_err_t st_parse_header(st_parser_t *p)
{
    json_error_t je;
    const char *key;
    json_t *v;
    fr_err_t err;
    p->root = json_loadb(p->h, p->n, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
    if (p->root == NULL)
        return st_json_error(p, &je);
    if ((err = st_scan(p)) != FR_OK)
        return err;
    json_object_foreach((json_t *)p->root, key, v)
    {
        err =
            strcmp(key, "__metadata__") == 0 ? st_parse_metadata(p, v) : st_parse_tensor(p, key, v);
        if (err != FR_OK)
            return err;
    }
    return FR_OK;
}

static void st_root_free(void *root)
{
    json_decref(root);
}

#else /* !FRESHET_HAVE_JANSSON */

/* A FRESHET_CORE_ONLY build on a host without libjansson (no pkg-config,
 * or no libjansson-dev): files are still written (fr_st_encode needs no
 * JSON reader), but no header can be read. */
static fr_err_t st_parse_header(st_parser_t *p)
{
    return fr__st_fail(&p->ec, FR_ERR_UNSUPPORTED,
                       "built without libjansson: cannot read the header (Debian: apt-get install "
                       "libjansson-dev, then build again)");
}

static void st_root_free(void *root)
{
    (void)root;
}

#endif /* FRESHET_HAVE_JANSSON */

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
    char s1[FR_ST_SHOW], s2[FR_ST_SHOW];
    uint64_t pos = 0;
    for (size_t i = 0; i < p->nents; i++) {
        const st_entry_t *e = &p->ents[i];
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
static fr_err_t st_index(st_parser_t *p, fr_st_file_t *st)
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
    st_parser_t p;
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
    if (st_parse_header(&p) != FR_OK)
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
    st_root_free(p.root);
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
        if (used == cap) {
            uint8_t *nm = cap <= SIZE_MAX / 2 ? realloc(*mem, cap * 2) : NULL;
            if (nm == NULL)
                return fr__st_nomem(ec);
            *mem = nm;
            cap *= 2;
        }
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
    st_root_free(st->root);
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
