/*
 * safetensors_header.c - the safetensors header's JSON: the tensors'
 * dtype, shape and data_offsets, and the "__metadata__" strings, read into
 * the reader's parser (safetensors.c checks the layout they describe).
 *
 * The header is parsed by libjansson (json_loadb, rejecting duplicate keys);
 * tensor names and metadata point into its tree, which the result owns.
 * Values the reader does not need (unknown fields of a tensor, which the
 * reference implementation ignores) are checked for syntax and skipped. It
 * rejects duplicate keys, invalid UTF-8, lone surrogates, \u0000 (names and
 * values are C strings here) and nesting deeper than ST_MAX_DEPTH; dtypes,
 * shapes and each tensor's exact size are checked here. Without libjansson
 * every header fails with "built without libjansson".
 *
 * jansson checks the syntax, UTF-8, escapes, surrogates, \u0000 and
 * duplicate keys (JSON_REJECT_DUPLICATES); its errors are reworded below
 * into the messages this reader has always given. Every number is decoded
 * as a real (JSON_DECODE_INT_AS_REAL), which never overflows where a 64-bit
 * integer would; the "shape" and "data_offsets" values are read again from
 * their text, exactly, by st_scan (below), which pairs the k-th number of
 * the tree, walked in document order (jansson keeps the order of an
 * object's keys), with the k-th number of the text.
 *
 * Every function is reentrant.
 */
#include <assert.h>
#include <ctype.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FRESHET_HAVE_JANSSON
#include <jansson.h>
#endif

#include "common/common.h"
#include "common/common_int.h"

#define ST_MAX_DEPTH 64 /* JSON nesting accepted in skipped values */

#ifdef FRESHET_HAVE_JANSSON
static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8},
};

/* The element size of a dtype name, or 0 if the name is unknown. */
static size_t st_dtype_size(const char *name)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(name, st_dtypes[i].name) == 0)
            return st_dtypes[i].size;
    }
    return 0;
}

static fr_err_t st_bad_json(fr_st_parser_t *p, size_t at, const char *what)
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
static fr_err_t st_scan(fr_st_parser_t *p)
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
            if (FR_GROW(p->nums, p->capnums, p->nnums + 1) != FR_OK)
                return fr__st_nomem(&p->ec);
            p->nums[p->nnums++] = (fr_st_span_t){start, i - start};
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
static fr_err_t st_escape_error(fr_st_parser_t *p, size_t pos)
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
static fr_err_t st_token_error(fr_st_parser_t *p, size_t pos)
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
static fr_err_t st_dup_key_error(fr_st_parser_t *p, size_t pos)
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
static fr_err_t st_json_error(fr_st_parser_t *p, const json_error_t *je)
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
static fr_err_t st_parse_uint(fr_st_parser_t *p, const char *name, const char *field,
                              const json_t *v, uint64_t *out)
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
    fr_st_span_t t = p->nums[p->next_num++];
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
static void st_skip_numbers(fr_st_parser_t *p, const json_t *v)
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
static fr_err_t st_parse_dtype(fr_st_parser_t *p, fr_st_entry_t *e, const json_t *v)
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
static fr_err_t st_parse_shape(fr_st_parser_t *p, fr_st_entry_t *e, const json_t *v)
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
static fr_err_t st_parse_offsets(fr_st_parser_t *p, fr_st_entry_t *e, const json_t *v)
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
static fr_err_t st_check_tensor_size(fr_st_parser_t *p, fr_st_entry_t *e)
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
static fr_err_t st_parse_tensor(fr_st_parser_t *p, const char *name, const json_t *v)
{
    char shown[FR_ST_SHOW];
    fr_st_entry_t e;
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
    if (FR_GROW(p->ents, p->capents, p->nents + 1) != FR_OK)
        return fr__st_nomem(&p->ec);
    p->ents[p->nents++] = e;
    return FR_OK;
}

/* Reads the "__metadata__" value: an object of strings (null, which the
 * reference reader also takes, means none). */
static fr_err_t st_parse_metadata(fr_st_parser_t *p, const json_t *v)
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
        if (FR_GROW(p->meta, p->capmeta, p->nmeta + 1) != FR_OK)
            return fr__st_nomem(&p->ec);
        p->meta[p->nmeta].key = key;
        p->meta[p->nmeta].value = json_string_value(x);
        p->nmeta++;
    }
    return FR_OK;
}

/* Parses the whole header: one object of tensors and "__metadata__", then
 * only white space (the padding) to its end. The tree, which the names and
 * metadata point into, is left in p->root for the result to own. */
fr_err_t fr__st_header_parse(fr_st_parser_t *p)
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

void fr__st_header_free(void *root)
{
    json_decref(root);
}

#else /* !FRESHET_HAVE_JANSSON */

/* A FRESHET_CORE_ONLY build on a host without libjansson (no pkg-config,
 * or no libjansson-dev): files are still written (fr_st_encode needs no
 * JSON reader), but no header can be read. */
fr_err_t fr__st_header_parse(fr_st_parser_t *p)
{
    return fr__st_fail(&p->ec, FR_ERR_UNSUPPORTED,
                       "built without libjansson: cannot read the header (Debian: apt-get install "
                       "libjansson-dev, then build again)");
}

void fr__st_header_free(void *root)
{
    (void)root;
}

#endif /* FRESHET_HAVE_JANSSON */
