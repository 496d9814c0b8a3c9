/*
 * bench_json.c - serve's JSON form of weights (GET .../weights?format=json)
 * against the obvious encoder measured in the same run: the same document
 * with each float through printf's "%.9g", the digits that name a float
 * exactly. serve makes the
 * JSON on its follower thread before a version is published while clients
 * ask for JSON, so its time delays each new version for all clients.
 *
 * usage: bench_json [LAYERS] [SECONDS]   (default 784-256-10 2)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_int.h"

/* Runs fn until seconds pass; returns milliseconds per call. */
static double ms_per_call(size_t (*fn)(const sv_view_t *), const sv_view_t *v, double seconds,
                          size_t *bytes)
{
    *bytes = fn(v); /* warm caches and pages */
    uint64_t t0 = fr_clock_mono_ns(), t;
    long calls = 0;
    do {
        *bytes = fn(v);
        calls++;
        t = fr_clock_mono_ns();
    } while ((double)(t - t0) * 1e-9 < seconds);
    return (double)(t - t0) * 1e-6 / (double)calls;
}

/* The length of an encoded document, which it frees. */
static size_t done(sv_blob_t *b)
{
    if (b == NULL) {
        fprintf(stderr, "bench_json: encoding failed\n");
        exit(1);
    }
    size_t len = b->len;
    sv_blob_unref(b);
    return len;
}

static size_t freshet_json(const sv_view_t *v)
{
    return done(sv_weights_json("bench", v));
}

/* The obvious writer: printf's "%.9g", null when not finite. */
static void printf_f32(fr_buf_t *b, float x)
{
    char num[32];
    int n = isfinite(x) ? snprintf(num, sizeof(num), "%.9g", (double)x)
                        : snprintf(num, sizeof(num), "null");
    fr_buf_add(b, num, (size_t)n);
}

/* The same document, each float by printf. */
static size_t printf_json(const sv_view_t *v)
{
    return done(sv_weights_json_by("bench", v, printf_f32));
}

int main(int argc, char **argv)
{
    const char *layers = argc > 1 ? argv[1] : "784-256-10";
    double seconds = argc > 2 ? atof(argv[2]) : 2.0;
    if (seconds <= 0) {
        fprintf(stderr, "usage: bench_json [LAYERS] [SECONDS]\n");
        return 2;
    }
    int dims[FR_LAYERS_MAX], ndims;
    char err[256];
    if (fr_layers_parse(layers, dims, &ndims, err, sizeof(err)) != FR_OK) {
        fprintf(stderr, "bench_json: %s\n", err);
        return 2;
    }
    size_t n = 0;
    for (int l = 0; l + 1 < ndims; l++)
        n += (size_t)dims[l + 1] * (size_t)dims[l] + (size_t)dims[l + 1];
    sv_view_t v;
    memset(&v, 0, sizeof(v));
    v.st = malloc(n * sizeof(float));
    if (v.st == NULL)
        return 1;
    v.raw_len = n * sizeof(float);
    v.version = 1;
    snprintf(v.layers, sizeof(v.layers), "%s", layers);
    snprintf(v.loss, sizeof(v.loss), "softmax");
    fr_rng_t rng; /* weights as initialized: small, of every magnitude */
    fr_rng_seed(&rng, 1);
    float *w = (float *)v.st;
    for (size_t i = 0; i < n; i++)
        w[i] = (float)(0.2 * fr_rng_uniform(&rng) - 0.1);
    size_t bytes_f, bytes_p;
    double f = ms_per_call(freshet_json, &v, seconds, &bytes_f);
    double p = ms_per_call(printf_json, &v, seconds, &bytes_p);
    printf("JSON of %s (%zu floats)\n", layers, n);
    printf("| encoder | ms per version | MB | speed-up |\n| --- | --- | --- | --- |\n");
    printf("| freshet (sv_weights_json) | %.1f | %.2f | %.1fx |\n", f, (double)bytes_f / 1e6,
           p / f);
    printf("| printf %%.9g per float | %.1f | %.2f | 1.0x |\n", p, (double)bytes_p / 1e6);
    free(v.st);
    return 0;
}
