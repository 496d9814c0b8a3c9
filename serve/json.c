/*
 * json.c - the JSON pieces serve writes into its text buffer, the
 * reference-counted buffers responses are answered from, and the JSON form
 * of weights.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_int.h"

void sv_json_error(fr_buf_t *b, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    fr_buf_puts(b, "{\"error\":");
    fr_json_str(b, msg);
    fr_buf_puts(b, "}\n");
}

void sv_json_num(fr_buf_t *b, double v)
{
    if (!isfinite(v))
        fr_buf_puts(b, "null");
    else if (v == floor(v) && fabs(v) < 9e15)
        fr_buf_printf(b, "%.0f", v);
    else
        fr_buf_printf(b, "%.9g", v);
}

/* 10^k for k = -30..53: the scales that bring a finite nonzero float's
 * magnitude to [1e8, 1e9) (the compiler rounds each literal correctly). */
static const double pow10_tab[] = {
    1e-30, 1e-29, 1e-28, 1e-27, 1e-26, 1e-25, 1e-24, 1e-23, 1e-22, 1e-21, 1e-20, 1e-19,
    1e-18, 1e-17, 1e-16, 1e-15, 1e-14, 1e-13, 1e-12, 1e-11, 1e-10, 1e-9,  1e-8,  1e-7,
    1e-6,  1e-5,  1e-4,  1e-3,  1e-2,  1e-1,  1e0,   1e1,   1e2,   1e3,   1e4,   1e5,
    1e6,   1e7,   1e8,   1e9,   1e10,  1e11,  1e12,  1e13,  1e14,  1e15,  1e16,  1e17,
    1e18,  1e19,  1e20,  1e21,  1e22,  1e23,  1e24,  1e25,  1e26,  1e27,  1e28,  1e29,
    1e30,  1e31,  1e32,  1e33,  1e34,  1e35,  1e36,  1e37,  1e38,  1e39,  1e40,  1e41,
    1e42,  1e43,  1e44,  1e45,  1e46,  1e47,  1e48,  1e49,  1e50,  1e51,  1e52,  1e53};
#define POW10(k) pow10_tab[(k) + 30]

size_t sv_f32_text(float x, char out[SV_F32_TEXT_MAX])
{
    /* 9 significant digits name every float exactly. The scaling below
     * errs by a few double ulps, so a digit string may differ from the
     * correctly rounded one by one unit in the 9th digit (1e-8 of the value
     * at most), which is within half a float ulp (3e-8 at least): strtof
     * still gives back x. */
    size_t n = 0;
    if (!isfinite(x)) {
        memcpy(out, "null", 5);
        return 4;
    }
    double v = x;
    if (signbit(x)) {
        out[n++] = '-';
        v = -v;
    }
    if (v == 0.0) {
        out[n++] = '0';
        out[n] = '\0';
        return n;
    }
    /* the decimal exponent e of v: 2^(e2-1) <= v < 2^e2 gives e or e - 1 */
    int e2;
    frexp(v, &e2);
    int e = (int)floor((double)(e2 - 1) * 0.30102999566398120);
    double m = v * POW10(8 - e); /* 8 - e is within -30..53 for a float */
    if (m >= 999999999.5) {
        e++;
        m = v * POW10(8 - e);
    } else if (m < 99999999.5) { /* not expected; kept exact anyway */
        e--;
        m = v * POW10(8 - e);
    }
    uint64_t d = (uint64_t)(m + 0.5);
    if (d >= 1000000000u) { /* rounding carried into the next decade */
        d = 100000000u;
        e++;
    }
    char dig[9];
    for (int i = 8; i >= 0; i--) {
        dig[i] = (char)('0' + d % 10);
        d /= 10;
    }
    int nd = 9;
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    if (e >= 0 && e < 9) { /* 123.456 */
        for (int i = 0; i <= e; i++)
            out[n++] = i < nd ? dig[i] : '0';
        if (nd > e + 1) {
            out[n++] = '.';
            for (int i = e + 1; i < nd; i++)
                out[n++] = dig[i];
        }
    } else if (e < 0 && e >= -5) { /* 0.00123 */
        out[n++] = '0';
        out[n++] = '.';
        for (int i = -1; i > e; i--)
            out[n++] = '0';
        for (int i = 0; i < nd; i++)
            out[n++] = dig[i];
    } else { /* 1.23e-07, 1e+20 */
        out[n++] = dig[0];
        if (nd > 1) {
            out[n++] = '.';
            for (int i = 1; i < nd; i++)
                out[n++] = dig[i];
        }
        out[n++] = 'e';
        out[n++] = e < 0 ? '-' : '+';
        int a = e < 0 ? -e : e;
        out[n++] = (char)('0' + a / 10); /* two digits, as %g writes */
        out[n++] = (char)('0' + a % 10);
    }
    out[n] = '\0';
    return n;
}

void sv_json_f32(fr_buf_t *b, float x)
{
    char text[SV_F32_TEXT_MAX];
    size_t n = sv_f32_text(x, text);
    fr_buf_add(b, text, n);
}

sv_blob_t *sv_blob_new(char *data, size_t len)
{
    sv_blob_t *b = malloc(sizeof(*b));
    if (b == NULL) {
        free(data);
        return NULL;
    }
    atomic_init(&b->refs, 1);
    b->data = data;
    b->len = len;
    return b;
}

sv_blob_t *sv_blob_ref(sv_blob_t *b)
{
    if (b != NULL)
        atomic_fetch_add(&b->refs, 1);
    return b;
}

void sv_blob_unref(sv_blob_t *b)
{
    if (b != NULL && atomic_fetch_sub(&b->refs, 1) == 1) {
        free(b->data);
        free(b);
    }
}

sv_view_t *sv_view_ref(sv_view_t *v)
{
    if (v != NULL)
        atomic_fetch_add(&v->refs, 1);
    return v;
}

void sv_view_unref(sv_view_t *v)
{
    if (v != NULL && atomic_fetch_sub(&v->refs, 1) == 1) {
        free(v->st);
        free(v->offsets);
        sv_blob_unref(v->json);
        free(v);
    }
}

/* Both entry points below; inlined into each, so that serve's own writer
 * is called directly, 200K times a version. */
static inline sv_blob_t *weights_json(const char *model, const sv_view_t *v, sv_f32_writer_t put)
{
    const char *layers = v->layers, *loss = v->loss;
    int dims[FR_LAYERS_MAX], ndims;
    if (fr_layers_parse(layers, dims, &ndims, NULL, 0) != FR_OK)
        return NULL;
    const float *w = (const float *)(v->st + v->raw_off);
    fr_buf_t b = {0};
    fr_buf_puts(&b, "{\"model\":");
    fr_json_str(&b, model);
    fr_buf_printf(&b,
                  ",\"epoch\":\"%llu\",\"version\":%lld,\"layers\":", (unsigned long long)v->epoch,
                  (long long)v->version);
    fr_json_str(&b, layers);
    fr_buf_puts(&b, ",\"loss\":");
    fr_json_str(&b, loss);
    fr_buf_puts(&b, ",\"tensors\":{");
    size_t off = 0;
    for (int l = 0; l + 1 < ndims; l++) {
        size_t rows = (size_t)dims[l + 1], cols = (size_t)dims[l];
        for (int part = 0; part < 2; part++) {
            size_t count = part == 0 ? rows * cols : rows;
            if (off + count > v->raw_len / sizeof(float)) {
                fr_buf_fini(&b);
                return NULL;
            }
            fr_buf_printf(&b, "%s\"layers.%d.%s\":{\"shape\":", l || part ? "," : "", l,
                          part == 0 ? "weight" : "bias");
            if (part == 0)
                fr_buf_printf(&b, "[%zu,%zu]", rows, cols);
            else
                fr_buf_printf(&b, "[%zu]", rows);
            fr_buf_puts(&b, ",\"data\":[");
            for (size_t i = 0; i < count; i++) {
                float x;
                memcpy(&x, w + off + i, sizeof(x)); /* st + raw_off may be unaligned */
                if (i > 0)
                    fr_buf_add(&b, ",", 1);
                put(&b, x); /* null for a non-finite weight */
            }
            fr_buf_puts(&b, "]}");
            off += count;
        }
    }
    fr_buf_puts(&b, "}}\n");
    size_t len;
    char *text = fr_buf_take(&b, &len);
    return text != NULL ? sv_blob_new(text, len) : NULL;
}

sv_blob_t *sv_weights_json(const char *model, const sv_view_t *v)
{
    return weights_json(model, v, sv_json_f32);
}

sv_blob_t *sv_weights_json_by(const char *model, const sv_view_t *v, sv_f32_writer_t put)
{
    return weights_json(model, v, put);
}
