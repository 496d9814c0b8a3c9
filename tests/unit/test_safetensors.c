/*
 * test_safetensors.c - the safetensors reader and writer (common/safetensors.c):
 * round trips, the exact bytes written, files laid out as Python's
 * safetensors writes them, every class of malformed input, and numpy
 * (Debian's python3-numpy) reading what we write.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/common.h"

/* ------------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------- */

static void put_le64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

/* An image with header length n (normally strlen(header)), the header text
 * and datalen data bytes (i & 0xff); the caller frees it. */
static uint8_t *make_image_n(uint64_t n, const char *header, size_t datalen, size_t *len)
{
    size_t hlen = strlen(header);
    *len = 8 + hlen + datalen;
    uint8_t *img = malloc(*len);
    assert_non_null(img);
    put_le64(img, n);
    memcpy(img + 8, header, hlen);
    for (size_t i = 0; i < datalen; i++)
        img[8 + hlen + i] = (uint8_t)i;
    return img;
}

static uint8_t *make_image(const char *header, size_t datalen, size_t *len)
{
    return make_image_n(strlen(header), header, datalen, len);
}

/* Parses img and asserts it is rejected with an error containing want. */
static void expect_reject_image(const uint8_t *img, size_t len, const char *want, const char *what)
{
    char err[512] = "";
    fr_st_file_t *st = fr_st_parse(img, len, err, sizeof err);
    if (st != NULL) {
        fr_st_destroy(st);
        fail_msg("accepted: %s", what);
    }
    if (strncmp(err, "safetensors: ", 13) != 0 || strstr(err, want) == NULL)
        fail_msg("error \"%s\" lacks \"%s\" for: %s", err, want, what);
}

/* Asserts that the image of header and datalen data bytes is rejected. */
static void expect_reject(const char *header, size_t datalen, const char *want)
{
    size_t len;
    uint8_t *img = make_image(header, datalen, &len);
    expect_reject_image(img, len, want, header);
    free(img);
}

static fr_st_file_t *parse_ok(const uint8_t *img, size_t len)
{
    char err[512] = "";
    fr_st_file_t *st = fr_st_parse(img, len, err, sizeof err);
    if (st == NULL)
        fail_msg("rejected: %s", err);
    return st;
}

static fr_st_file_t *parse_header_ok(const char *header, size_t datalen)
{
    size_t len;
    uint8_t *img = make_image(header, datalen, &len);
    fr_st_file_t *st = parse_ok(img, len);
    free(img);
    return st;
}

/* A path under the build directory, unique to this process. */
static void test_path(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/test_safetensors_%ld_%s", FRESHET_BINARY_DIR, (long)getpid(), name);
}

static void assert_tensor(const fr_st_tensor_t *t, const char *name, const char *dtype, int ndim,
                          const int64_t *shape, const void *data, size_t nbytes)
{
    assert_non_null(t);
    assert_string_equal(t->name, name);
    assert_string_equal(t->dtype, dtype);
    assert_int_equal(t->ndim, ndim);
    for (int d = 0; d < ndim; d++)
        assert_int_equal(t->shape[d], shape[d]);
    assert_int_equal(t->nbytes, nbytes);
    if (nbytes > 0)
        assert_memory_equal(t->data, data, nbytes);
}

/* Three tensors and metadata used by several tests. */
static const float sample_w[6] = {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f};
static const float sample_b[2] = {0.25f, -3.0f};
static const float sample_s[1] = {7.5f};
#define SAMPLE_NOTE "quote \" backslash \\ caf\xc3\xa9 \xf0\x9f\x98\x80"

static void sample(fr_st_tensor_t t[3], fr_st_kv_t meta[2])
{
    memset(t, 0, 3 * sizeof t[0]);
    t[0] = (fr_st_tensor_t){.name = "layers.0.weight",
                            .dtype = "F32",
                            .ndim = 2,
                            .shape = {2, 3},
                            .data = sample_w,
                            .nbytes = sizeof sample_w};
    t[1] = (fr_st_tensor_t){.name = "layers.0.bias",
                            .dtype = "F32",
                            .ndim = 1,
                            .shape = {2},
                            .data = sample_b,
                            .nbytes = sizeof sample_b};
    t[2] = (fr_st_tensor_t){
        .name = "scalar", .dtype = "F32", .ndim = 0, .data = sample_s, .nbytes = 4};
    meta[0] = (fr_st_kv_t){"format", "pt"};
    meta[1] = (fr_st_kv_t){"note", SAMPLE_NOTE};
}

/* ------------------------------------------------------------------------
 * Writing and reading back
 * ---------------------------------------------------------------------- */

static void test_safetensors_round_trips_tensors_and_metadata(void **state)
{
    static const float empty[1] = {0};
    fr_st_tensor_t t[4];
    fr_st_kv_t meta[4];
    sample(t, meta);
    t[3] = (fr_st_tensor_t){
        .name = "empty", .dtype = "F32", .ndim = 2, .shape = {0, 5}, .data = empty, .nbytes = 0};
    meta[2] = (fr_st_kv_t){"ctrl", "line\nfeed\ttab\x01one\x1f"};
    meta[3] = (fr_st_kv_t){"", "empty key"};
    uint8_t *img;
    size_t len;
    char err[256] = "";
    assert_int_equal(fr_st_encode(t, 4, meta, 4, &img, &len, err, sizeof err), FR_OK);

    fr_st_file_t *st = parse_ok(img, len);
    assert_int_equal(fr_st_count(st), 4);
    /* Data-offset order is the order written; the empty tensor comes last. */
    for (size_t i = 0; i < 4; i++) {
        const fr_st_tensor_t *got = fr_st_at(st, i);
        assert_tensor(got, t[i].name, "F32", t[i].ndim, t[i].shape, t[i].data, t[i].nbytes);
        assert_ptr_equal(fr_st_find(st, t[i].name), got);
    }
    assert_null(fr_st_at(st, 4));
    assert_null(fr_st_find(st, "layers.1.weight"));
    assert_string_equal(fr_st_meta(st, "format"), "pt");
    assert_string_equal(fr_st_meta(st, "note"), SAMPLE_NOTE);
    assert_string_equal(fr_st_meta(st, "ctrl"), "line\nfeed\ttab\x01one\x1f");
    assert_string_equal(fr_st_meta(st, ""), "empty key");
    assert_null(fr_st_meta(st, "missing"));
    fr_st_destroy(st);
    free(img);
}

static void test_safetensors_writes_the_exact_byte_layout(void **state)
{
    static const float a[2] = {1.0f, -2.0f};
    static const char header[] =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}   ";
    static const uint8_t data[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};
    fr_st_tensor_t t = {
        .name = "a", .dtype = "F32", .ndim = 1, .shape = {2}, .data = a, .nbytes = 8};
    fr_st_kv_t meta = {"format", "pt"};
    uint8_t *img;
    size_t len;
    char err[256] = "";
    assert_int_equal(fr_st_encode(&t, 1, &meta, 1, &img, &len, err, sizeof err), FR_OK);

    /* 85 bytes of JSON padded with 3 spaces to 88, so 8 + 88 is a multiple of 8. */
    assert_int_equal(sizeof header - 1, 88);
    assert_int_equal(len, 8 + 88 + 8);
    static const uint8_t prefix[8] = {88, 0, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(img, prefix, 8);
    assert_int_equal(img[8], '{');
    assert_memory_equal(img + 8, header, 88);
    assert_memory_equal(img + 96, data, 8);
    free(img);
}

static void test_safetensors_pads_every_header_to_a_multiple_of_eight(void **state)
{
    static const float x[1] = {1};
    char name[40];
    for (size_t n = 1; n < 20; n++) {
        memset(name, 'n', n);
        name[n] = '\0';
        fr_st_tensor_t t = {.name = name, .dtype = "F32", .ndim = 0, .data = x, .nbytes = 4};
        uint8_t *img;
        size_t len;
        assert_int_equal(fr_st_encode(&t, 1, NULL, 0, &img, &len, NULL, 0), FR_OK);
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = (hlen << 8) | img[i];
        assert_int_equal((8 + hlen) % 8, 0);
        assert_int_equal(len, 8 + hlen + 4);
        assert_int_equal(img[8], '{');
        /* The JSON ends with '}' and only spaces follow it. */
        size_t end = 8 + hlen;
        while (img[end - 1] == ' ')
            end--;
        assert_int_equal(img[end - 1], '}');
        assert_true(8 + hlen - end < 8);
        free(img);
    }
}

static void test_safetensors_escapes_quotes_backslashes_and_control_characters(void **state)
{
    static const float x[1] = {1};
    fr_st_tensor_t t = {
        .name = "we\"ird\\name\n", .dtype = "F32", .ndim = 0, .data = x, .nbytes = 4};
    fr_st_kv_t meta = {"k\x01", "v\x1f\"\\/"};
    uint8_t *img;
    size_t len;
    assert_int_equal(fr_st_encode(&t, 1, &meta, 1, &img, &len, NULL, 0), FR_OK);
    char *text = strndup((const char *)img + 8, len - 8 - 4);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"k\\u0001\":\"v\\u001f\\\"\\\\/\""));
    assert_non_null(strstr(text, "\"we\\\"ird\\\\name\\u000a\":"));
    free(text);

    fr_st_file_t *st = parse_ok(img, len);
    assert_non_null(fr_st_find(st, "we\"ird\\name\n"));
    assert_string_equal(fr_st_meta(st, "k\x01"), "v\x1f\"\\/");
    fr_st_destroy(st);
    free(img);
}

static void test_safetensors_parses_a_python_style_file(void **state)
{
    /* As Python's writer lays it out: larger dtypes first, names sorted
     * within a dtype, "__metadata__" anywhere (here last), spaces between
     * tokens and as padding. */
    static const char header[] =
        "{\"b\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]}, "
        "\"a\" : {\"dtype\":\"F16\",\"shape\":[1, 2],\"data_offsets\":[16,20]},\n"
        "\"c\":{\"data_offsets\":[20,23],\"dtype\":\"U8\",\"shape\":[3]},"
        "\"__metadata__\": {\"format\": \"pt\", \"k\": \"v\"}}      ";
    uint8_t data[23];
    int64_t b[2] = {-5, 1234567890123};
    uint16_t a[2] = {0x3c00, 0xc000}; /* 1.0, -2.0 in F16 */
    memcpy(data, b, 16);
    memcpy(data + 16, a, 4);
    data[20] = 7;
    data[21] = 8;
    data[22] = 9;
    size_t len;
    uint8_t *img = make_image(header, 23, &len);
    memcpy(img + 8 + strlen(header), data, 23);

    fr_st_file_t *st = parse_ok(img, len);
    free(img);
    assert_int_equal(fr_st_count(st), 3);
    static const int64_t sb[1] = {2}, sa[2] = {1, 2}, sc[1] = {3};
    assert_tensor(fr_st_at(st, 0), "b", "I64", 1, sb, b, 16);
    assert_tensor(fr_st_at(st, 1), "a", "F16", 2, sa, a, 4);
    assert_tensor(fr_st_at(st, 2), "c", "U8", 1, sc, data + 20, 3);
    assert_ptr_equal(fr_st_find(st, "c"), fr_st_at(st, 2));
    assert_string_equal(fr_st_meta(st, "format"), "pt");
    assert_string_equal(fr_st_meta(st, "k"), "v");
    fr_st_destroy(st);
}

static void test_safetensors_accepts_every_dtype(void **state)
{
    static const struct {
        const char *name;
        size_t size;
    } dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
                  {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                  {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        char header[128];
        snprintf(header, sizeof header,
                 "{\"x\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%zu]}}",
                 dtypes[i].name, 3 * dtypes[i].size);
        fr_st_file_t *st = parse_header_ok(header, 3 * dtypes[i].size);
        assert_string_equal(fr_st_at(st, 0)->dtype, dtypes[i].name);
        assert_int_equal(fr_st_at(st, 0)->nbytes, 3 * dtypes[i].size);
        fr_st_destroy(st);
    }
}

static void test_safetensors_decodes_unicode_escapes_in_names(void **state)
{
    static const char header[] = "{\"caf\\u00e9 \\ud83d\\ude00 \\/ \\\"q\\\" \\b\\f\\n\\r\\t\":"
                                 "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                                 "\"\xe2\x9c\x93\":{\"dtype\":\"U8\",\"shape\":[1],"
                                 "\"data_offsets\":[1,2]}}";
    fr_st_file_t *st = parse_header_ok(header, 2);
    assert_string_equal(fr_st_at(st, 0)->name, "caf\xc3\xa9 \xf0\x9f\x98\x80 / \"q\" \b\f\n\r\t");
    assert_string_equal(fr_st_at(st, 1)->name, "\xe2\x9c\x93");
    assert_non_null(fr_st_find(st, "\xe2\x9c\x93"));
    fr_st_destroy(st);
}

static void test_safetensors_accepts_scalars_and_empty_tensors(void **state)
{
    /* Empty tensors may share an offset with each other and with the start
     * of the next tensor; a 0 dimension makes 0 bytes whatever the others. */
    static const char header[] =
        "{\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
        "\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
        "\"z2\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807,0],\"data_offsets\":[8,8]},"
        "\"z3\":{\"dtype\":\"I8\",\"shape\":[3,0,2],\"data_offsets\":[8,8]}}";
    fr_st_file_t *st = parse_header_ok(header, 8);
    assert_int_equal(fr_st_count(st), 4);
    assert_string_equal(fr_st_at(st, 0)->name, "z1");
    assert_string_equal(fr_st_at(st, 1)->name, "s");
    assert_int_equal(fr_st_at(st, 1)->ndim, 0);
    assert_int_equal(fr_st_at(st, 1)->nbytes, 8);
    assert_string_equal(fr_st_at(st, 2)->name, "z2");
    assert_string_equal(fr_st_at(st, 3)->name, "z3");
    assert_int_equal(fr_st_at(st, 3)->nbytes, 0);
    fr_st_destroy(st);
}

static void test_safetensors_ignores_unknown_tensor_fields(void **state)
{
    static const char header[] =
        "{\"a\":{\"dtype\":\"U8\",\"extra\":{\"x\":[1,-2.5e+3,true,false,null,\"s\",{}],"
        "\"y\":[]},\"shape\":[1],\"n\":-0.0E-1,\"data_offsets\":[0,1]}}";
    fr_st_file_t *st = parse_header_ok(header, 1);
    assert_int_equal(fr_st_count(st), 1);
    fr_st_destroy(st);
}

static void test_safetensors_accepts_empty_header_and_null_metadata(void **state)
{
    fr_st_file_t *st = parse_header_ok("{}", 0);
    assert_int_equal(fr_st_count(st), 0);
    assert_null(fr_st_at(st, 0));
    assert_null(fr_st_find(st, "a"));
    assert_null(fr_st_meta(st, "format"));
    fr_st_destroy(st);

    st = parse_header_ok("{\"__metadata__\":null}   ", 0);
    assert_null(fr_st_meta(st, "format"));
    fr_st_destroy(st);

    st = parse_header_ok("{ \"__metadata__\" : { } }\t\r\n ", 0);
    assert_int_equal(fr_st_count(st), 0);
    fr_st_destroy(st);

    /* The writer with nothing to write still makes a valid file. */
    uint8_t *img;
    size_t len;
    assert_int_equal(fr_st_encode(NULL, 0, NULL, 0, &img, &len, NULL, 0), FR_OK);
    assert_int_equal(len, 16);
    st = parse_ok(img, len);
    assert_int_equal(fr_st_count(st), 0);
    fr_st_destroy(st);
    free(img);
}

static void test_safetensors_aligns_data_whatever_the_header_length(void **state)
{
    /* Header lengths of every residue mod 8, and the input at an odd
     * address: the parsed F32 data is still 8-byte aligned. */
    for (int pad = 0; pad < 8; pad++) {
        char header[128];
        snprintf(header, sizeof header,
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}%*s", pad, "");
        size_t len;
        uint8_t *img = make_image(header, 8, &len);
        uint8_t *odd = malloc(len + 1);
        assert_non_null(odd);
        memcpy(odd + 1, img, len);
        fr_st_file_t *st = parse_ok(odd + 1, len);
        assert_int_equal((uintptr_t)fr_st_at(st, 0)->data % 8, 0);
        assert_memory_equal(fr_st_at(st, 0)->data, img + len - 8, 8);
        fr_st_destroy(st);
        free(odd);
        free(img);
    }
}

static void test_safetensors_parse_copies_the_input(void **state)
{
    fr_st_tensor_t t[3];
    fr_st_kv_t meta[2];
    sample(t, meta);
    uint8_t *img;
    size_t len;
    assert_int_equal(fr_st_encode(t, 3, meta, 2, &img, &len, NULL, 0), FR_OK);
    fr_st_file_t *st = parse_ok(img, len);
    memset(img, 0xAB, len);
    free(img);
    assert_tensor(fr_st_find(st, "layers.0.weight"), "layers.0.weight", "F32", 2, t[0].shape,
                  sample_w, sizeof sample_w);
    assert_string_equal(fr_st_meta(st, "format"), "pt");
    fr_st_destroy(st);
}

static void test_safetensors_finds_each_of_many_tensors(void **state)
{
    /* Many tensors stay fast (sorted look-ups, no quadratic duplicate
     * checks) and keep the order they were written in. */
    enum { N = 20000 };
    fr_st_tensor_t *t = calloc(N, sizeof *t);
    char(*names)[16] = calloc(N, sizeof *names);
    float *v = calloc(N, sizeof *v);
    assert_non_null(t);
    assert_non_null(names);
    assert_non_null(v);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "t%05d", N - 1 - i); /* reverse name order */
        v[i] = (float)i;
        t[i] = (fr_st_tensor_t){
            .name = names[i], .dtype = "F32", .ndim = 1, .shape = {1}, .data = &v[i], .nbytes = 4};
    }
    uint8_t *img;
    size_t len;
    char err[256] = "";
    assert_int_equal(fr_st_encode(t, N, NULL, 0, &img, &len, err, sizeof err), FR_OK);
    fr_st_file_t *st = parse_ok(img, len);
    assert_int_equal(fr_st_count(st), N);
    for (int i = 0; i < N; i++) {
        const fr_st_tensor_t *got = fr_st_find(st, names[i]);
        assert_ptr_equal(got, fr_st_at(st, (size_t)i));
        assert_memory_equal(got->data, &v[i], 4);
    }
    fr_st_destroy(st);
    free(img);
    free(v);
    free(names);
    free(t);
}

static void test_safetensors_writes_and_reads_files_atomically(void **state)
{
    fr_st_tensor_t t[3];
    fr_st_kv_t meta[2];
    sample(t, meta);
    char path[512], tmp[600], err[512] = "";
    test_path(path, sizeof path, "model.safetensors");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());

    assert_int_equal(fr_st_write_file(path, t, 2, meta, 1, err, sizeof err), FR_OK);
    assert_int_not_equal(access(tmp, F_OK), 0);
    /* Writing again replaces the file as a whole. */
    assert_int_equal(fr_st_write_file(path, t, 3, meta, 2, err, sizeof err), FR_OK);
    assert_int_not_equal(access(tmp, F_OK), 0);

    fr_st_file_t *st = fr_st_read_file(path, err, sizeof err);
    if (st == NULL)
        fail_msg("%s", err);
    assert_int_equal(fr_st_count(st), 3);
    for (size_t i = 0; i < 3; i++)
        assert_tensor(fr_st_at(st, i), t[i].name, "F32", t[i].ndim, t[i].shape, t[i].data,
                      t[i].nbytes);
    assert_string_equal(fr_st_meta(st, "note"), SAMPLE_NOTE);
    fr_st_destroy(st);
    unlink(path);
}

static void test_safetensors_round_trips_a_large_tensor(void **state)
{
    enum { N = 4 * 1024 * 1024 }; /* 16 MiB */
    float *w = malloc(N * sizeof *w);
    assert_non_null(w);
    for (size_t i = 0; i < N; i++)
        w[i] = (float)i * 0.25f - 7.0f;
    fr_st_tensor_t t = {.name = "big",
                        .dtype = "F32",
                        .ndim = 2,
                        .shape = {1024, N / 1024},
                        .data = w,
                        .nbytes = N * sizeof *w};
    char path[512], err[512] = "";
    test_path(path, sizeof path, "big.safetensors");
    assert_int_equal(fr_st_write_file(path, &t, 1, NULL, 0, err, sizeof err), FR_OK);
    fr_st_file_t *st = fr_st_read_file(path, err, sizeof err);
    if (st == NULL)
        fail_msg("%s", err);
    assert_int_equal(fr_st_at(st, 0)->nbytes, N * sizeof *w);
    assert_int_equal((uintptr_t)fr_st_at(st, 0)->data % 8, 0);
    assert_memory_equal(fr_st_at(st, 0)->data, w, N * sizeof *w);
    fr_st_destroy(st);
    unlink(path);
    free(w);
}

static void test_safetensors_reports_a_missing_file_with_its_path(void **state)
{
    char path[512], err[512] = "";
    test_path(path, sizeof path, "does-not-exist.safetensors");
    assert_null(fr_st_read_file(path, err, sizeof err));
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "No such file"));

    /* A directory fails on read, with the path too. */
    assert_null(fr_st_read_file(FRESHET_BINARY_DIR, err, sizeof err));
    assert_non_null(strstr(err, FRESHET_BINARY_DIR));

    /* A malformed file names itself in the message. */
    test_path(path, sizeof path, "short.safetensors");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("abc", f);
    fclose(f);
    assert_null(fr_st_read_file(path, err, sizeof err));
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "file size 3 is too small"));
    unlink(path);
}

static void test_safetensors_reports_an_unwritable_path(void **state)
{
    fr_st_tensor_t t[3];
    fr_st_kv_t meta[2];
    sample(t, meta);
    char path[512], err[512] = "";
    test_path(path, sizeof path, "no-such-dir/model.safetensors");
    assert_int_equal(fr_st_write_file(path, t, 3, meta, 2, err, sizeof err), FR_ERR_IO);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "No such file"));

    /* A rename onto a directory fails after the temporary file was written:
     * the temporary file is removed. */
    char tmp[600];
    test_path(path, sizeof path, "dir.safetensors");
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(fr_st_write_file(path, t, 3, meta, 2, err, sizeof err), FR_ERR_IO);
    assert_non_null(strstr(err, "rename"));
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_int_not_equal(access(tmp, F_OK), 0);
    rmdir(path);
}

/* ------------------------------------------------------------------------
 * Malformed input
 * ---------------------------------------------------------------------- */

#define T_A "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"

static void test_safetensors_rejects_header_length_beyond_file_size(void **state)
{
    char err[256] = "";
    size_t len;
    uint8_t *img = make_image_n(999999, "{}", 110, &len);
    assert_int_equal(len, 120);
    assert_null(fr_st_parse(img, len, err, sizeof err));
    assert_string_equal(err, "safetensors: header length 999999 exceeds file size 120");
    free(img);

    img = make_image_n(3, "{}", 0, &len);
    expect_reject_image(img, len, "header length 3 exceeds file size 10", "length 3 of 2");
    free(img);
}

static void test_safetensors_rejects_header_length_below_two(void **state)
{
    size_t len;
    uint8_t *img = make_image_n(1, "{}", 0, &len);
    expect_reject_image(img, len, "header length 1 is too small (minimum 2)", "length 1");
    free(img);
    img = make_image_n(0, "{}", 0, &len);
    expect_reject_image(img, len, "header length 0 is too small", "length 0");
    free(img);
}

static void test_safetensors_rejects_header_length_above_the_limit(void **state)
{
    size_t len;
    uint8_t *img = make_image_n(100 * 1024 * 1024 + 1, "{}", 0, &len);
    expect_reject_image(img, len, "header length 104857601 exceeds the limit of 104857600",
                        "over the limit");
    free(img);
    img = make_image_n(UINT64_MAX, "{}", 0, &len);
    expect_reject_image(img, len, "exceeds the limit", "2^64 - 1");
    free(img);
}

static void test_safetensors_rejects_file_shorter_than_the_length_prefix(void **state)
{
    static const uint8_t img[7] = {2, 0, 0, 0, 0, 0, 0};
    for (size_t len = 0; len < 8; len++)
        expect_reject_image(img, len, "too small for the 8-byte header length", "short");
    char err[256] = "";
    assert_null(fr_st_parse(NULL, 0, err, sizeof err));
}

static void test_safetensors_rejects_truncated_data(void **state)
{
    expect_reject("{" T_A "}", 3, "file size 65 does not match header (expected 66)");
    expect_reject("{" T_A "}", 0, "does not match header (expected 66)");
}

static void test_safetensors_rejects_trailing_bytes_after_the_data(void **state)
{
    expect_reject("{" T_A "}", 5, "file size 67 does not match header (expected 66)");
    expect_reject("{}", 1, "file size 11 does not match header (expected 10)");
}

static void test_safetensors_rejects_bad_json(void **state)
{
    static const struct {
        const char *header, *want;
    } cases[] = {
        {"{\"a\" {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         "bad JSON at header byte 5: expected ':'"},
        {"{\"a", "bad JSON at header byte 3: unterminated string"},
        {"{\"a\\", "unterminated string"},
        {"{" T_A ",}", "expected a string key"},
        {"{" T_A " " T_A "}", "expected ',' or '}'"},
        {"{" T_A, "expected ',' or '}'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,],\"data_offsets\":[0,4]}}", "expected a value"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1 1],\"data_offsets\":[0,4]}}",
         "expected ',' or ']'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[00,4]}}", "expected ','"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4}}", "expected ']'"},
        {"{\"a\":{\"dtype\":\"F32\" \"shape\":[1],\"data_offsets\":[0,4]}}", "expected ',' or '}'"},
        {"{\"a\\q\":{}}", "bad escape in string"},
        {"{\"a\\u12\":{}}", "bad hex digits in \\u escape"},
        {"{\"a\\u12", "truncated \\u escape"},
        {"{\"a\\ud800\":{}}", "unpaired surrogate"},
        {"{\"a\\ud800\\u0041\":{}}", "unpaired surrogate"},
        {"{\"a\\udc00\":{}}", "unpaired surrogate"},
        {"{\"a\\u0000\":{}}", "\\u0000 is not allowed"},
        {"{\"a\x01\":{}}", "control character in string"},
        {"{\"a\n\":{}}", "control character in string"},
        {"{\"a\xff\":{}}", "invalid UTF-8"},
        {"{\"a\xc0\xaf\":{}}", "invalid UTF-8"},         /* overlong '/' */
        {"{\"a\xed\xa0\x80\":{}}", "invalid UTF-8"},     /* encoded surrogate */
        {"{\"a\xf4\x90\x80\x80\":{}}", "invalid UTF-8"}, /* above U+10FFFF */
        {"{\"a\xe2\x9c\":{}}", "invalid UTF-8"},         /* cut short */
        {"{a:1}", "bad JSON at header byte 1: expected a string key"},
        {"{}x", "bad JSON at header byte 2: unexpected data after the header object"},
        {"{}{}", "unexpected data after the header object"},
        {"{\"a\":{\"dtype\":\"U8\",\"x\":tru,\"shape\":[1],\"data_offsets\":[0,1]}}",
         "expected a value"},
        {"{\"a\":{\"dtype\":\"U8\",\"x\":1.,\"shape\":[1],\"data_offsets\":[0,1]}}",
         "invalid number"},
        {"{\"a\":{\"dtype\":\"U8\",\"x\":-,\"shape\":[1],\"data_offsets\":[0,1]}}",
         "invalid number"},
        {"{\"a\":{\"dtype\":\"U8\",\"x\":1e,\"shape\":[1],\"data_offsets\":[0,1]}}",
         "invalid number"},
        {"{\"a\":{\"dtype\":\"U8\",\"x\":NaN,\"shape\":[1],\"data_offsets\":[0,1]}}",
         "expected a value"},
        {"{\"a\":{\"dtype\":\"U8\",\"x\":{\"k\" 1},\"shape\":[1],\"data_offsets\":[0,1]}}",
         "expected ':'"},
        {"{\"a\":{\"dtype\":\"U8\",\"x\":[1 2],\"shape\":[1],\"data_offsets\":[0,1]}}",
         "expected ',' or ']'"},
        {"{\"__metadata__\":{\"k\":\"v\"", "expected ',' or '}'"},
        {"{\"__metadata__\":{\"k\" \"v\"}}", "expected ':'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len, hlen = strlen(cases[i].header);
        uint8_t *img = malloc(8 + hlen);
        assert_non_null(img);
        put_le64(img, hlen);
        memcpy(img + 8, cases[i].header, hlen);
        len = 8 + hlen;
        expect_reject_image(img, len, cases[i].want, cases[i].header);
        free(img);
    }
    /* A NUL byte in the padding is not white space. */
    static const uint8_t nul[12] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', 0};
    expect_reject_image(nul, sizeof nul, "byte 3: unexpected data after the header object",
                        "NUL in padding");
}

static void test_safetensors_rejects_nesting_beyond_the_depth_limit(void **state)
{
    char header[512];
    int deep = 70;
    size_t w = (size_t)snprintf(header, sizeof header, "{\"a\":{\"x\":");
    for (int i = 0; i < deep; i++)
        header[w++] = '[';
    for (int i = 0; i < deep; i++)
        header[w++] = ']';
    snprintf(header + w, sizeof header - w,
             ",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    expect_reject(header, 1, "nesting too deep");

    /* 60 levels are fine. */
    deep = 60;
    w = (size_t)snprintf(header, sizeof header, "{\"a\":{\"x\":");
    for (int i = 0; i < deep; i++)
        header[w++] = '[';
    for (int i = 0; i < deep; i++)
        header[w++] = ']';
    snprintf(header + w, sizeof header - w,
             ",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    fr_st_destroy(parse_header_ok(header, 1));
}

static void test_safetensors_rejects_missing_fields(void **state)
{
    expect_reject("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                  "tensor 'a': missing \"dtype\"");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
                  "tensor 'a': missing \"shape\"");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
                  "tensor 'a': missing \"data_offsets\"");
    expect_reject("{\"a\":{}}", 0, "tensor 'a': missing \"dtype\"");
    expect_reject("{\"a\":5}", 0, "tensor 'a': value must be an object");
    expect_reject("{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                  "tensor 'a': \"dtype\" must be a string");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4,
                  "tensor 'a': \"shape\" must be an array");
}

static void test_safetensors_rejects_unknown_dtype(void **state)
{
    expect_reject("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                  "tensor 'a': unknown dtype 'F33'");
    expect_reject("{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                  "unknown dtype 'f32'");
    expect_reject("{\"a\":{\"dtype\":\"F8_E4M3FNUZ\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                  "unknown dtype 'F8_E4M3FNUZ'");
    expect_reject("{\"a\":{\"dtype\":\"\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                  "unknown dtype ''");
}

static void test_safetensors_rejects_offsets_not_matching_the_shape(void **state)
{
    char err[512] = "";
    size_t len;
    uint8_t *img = make_image(
        "{\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 12,
        &len);
    assert_null(fr_st_parse(img, len, err, sizeof err));
    assert_string_equal(err, "safetensors: tensor 'layers.0.weight': data_offsets [0, 12] do not "
                             "match shape [2, 3] of F32 (24 bytes)");
    free(img);
    expect_reject("{\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
                  "do not match shape [] of I64 (8 bytes)");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]}}", 4,
                  "do not match shape [0] of F32 (0 bytes)");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                  "\"data_offsets\":[0,0]}}",
                  0, "(over 2^64 bytes)");
    expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,0]}}", 4,
                  "tensor 'a': data_offsets [4, 0] end before they begin");
}

static void test_safetensors_rejects_hole_between_tensors(void **state)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                  12, "hole in data between byte 4 and 8");
}

static void test_safetensors_rejects_overlapping_tensors(void **state)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                  8, "tensors 'a' and 'b' overlap at data bytes [4, 8)");
    /* An empty tensor inside another one overlaps too. */
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                  8, "overlap");
    /* Two tensors on the same bytes. */
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                  4, "overlap");
}

static void test_safetensors_rejects_data_not_starting_at_zero(void **state)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                  "data does not start at byte 0: first tensor 'a' begins at byte 4");
}

static void test_safetensors_rejects_duplicate_tensor_names(void **state)
{
    expect_reject("{" T_A ",\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                  "duplicate tensor name 'a'");
    /* The same name spelled with an escape is the same name. */
    expect_reject("{" T_A ",\"\\u0061\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                  8, "duplicate tensor name 'a'");
}

static void test_safetensors_rejects_duplicate_keys(void **state)
{
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
                  "\"data_offsets\":[0,4]}}",
                  4, "duplicate key \"dtype\"");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
                  "\"shape\":[1]}}",
                  4, "duplicate key \"shape\"");
    expect_reject("{\"a\":{\"dtype\":\"U8\",\"x\":{\"q\":1,\"r\":2,\"q\":3},\"shape\":[1],"
                  "\"data_offsets\":[0,1]}}",
                  1, "duplicate key \"q\"");
    expect_reject("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate metadata key 'k'");
    expect_reject("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key \"__metadata__\"");
}

static void test_safetensors_rejects_non_string_metadata_value(void **state)
{
    expect_reject("{\"__metadata__\":{\"k\":1}}", 0, "metadata value for key 'k' is not a string");
    expect_reject("{\"__metadata__\":{\"k\":null}}", 0, "metadata value for key 'k'");
    expect_reject("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, "metadata value for key 'k'");
    expect_reject("{\"__metadata__\":[\"k\"]}", 0, "\"__metadata__\" must be an object");
    expect_reject("{\"__metadata__\":\"pt\"}", 0, "\"__metadata__\" must be an object");
}

static void test_safetensors_rejects_header_not_starting_with_brace(void **state)
{
    expect_reject(" {}", 0, "header does not start with '{'");
    expect_reject("[]", 0, "header does not start with '{'");
    expect_reject("\xef\xbb\xbf{}", 0, "header does not start with '{'"); /* a BOM */
}

static void test_safetensors_rejects_bad_shapes_and_offsets(void **state)
{
    static const struct {
        const char *shape, *offsets, *want;
    } cases[] = {
        {"[-1]", "[0,4]", "tensor 'a': \"shape\" must hold non-negative integers, not -1"},
        {"[1.0]", "[0,4]", "\"shape\" must hold non-negative integers, not 1.0"},
        {"[1e0]", "[0,4]", "\"shape\" must hold non-negative integers, not 1e0"},
        {"[\"1\"]", "[0,4]", "\"shape\" must hold non-negative integers"},
        {"[[1]]", "[0,4]", "\"shape\" must hold non-negative integers"},
        {"[99999999999999999999]", "[0,4]", "tensor 'a': a \"shape\" value is too large"},
        {"[9223372036854775808]", "[0,4]", "a \"shape\" value is too large"},
        {"[1,1,1,1,1,1,1,1,1]", "[0,4]", "tensor 'a': shape has more than 8 dimensions"},
        {"[1]", "[0,-4]", "\"data_offsets\" must hold non-negative integers, not -4"},
        {"[1]", "[0,4.0]", "\"data_offsets\" must hold non-negative integers, not 4.0"},
        {"[1]", "[0,18446744073709551616]", "a \"data_offsets\" value is too large"},
        {"[1]", "[0,4,8]", "tensor 'a': \"data_offsets\" must be [begin, end]"},
        {"[1]", "[0]", "\"data_offsets\" must be [begin, end]"},
        {"[1]", "[]", "\"data_offsets\" must be [begin, end]"},
        {"[1]", "{}", "\"data_offsets\" must be [begin, end]"},
        {"[1]", "[null,4]", "\"data_offsets\" must hold non-negative integers"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char header[256];
        snprintf(header, sizeof header,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":%s}}", cases[i].shape,
                 cases[i].offsets);
        expect_reject(header, 4, cases[i].want);
    }
    /* A file whose data would end past 2^64. */
    expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[18446744073709551615],"
                  "\"data_offsets\":[0,18446744073709551615]}}",
                  0, "a \"shape\" value is too large");
    expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807],"
                  "\"data_offsets\":[0,9223372036854775807]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807],"
                  "\"data_offsets\":[9223372036854775807,18446744073709551614]}}",
                  0, "does not match header (data ends at offset 18446744073709551614)");
}

static void test_safetensors_rejects_every_truncation_of_a_valid_file(void **state)
{
    fr_st_tensor_t t[3];
    fr_st_kv_t meta[2];
    sample(t, meta);
    uint8_t *img;
    size_t len;
    assert_int_equal(fr_st_encode(t, 3, meta, 2, &img, &len, NULL, 0), FR_OK);
    for (size_t n = 0; n < len; n++) {
        /* An exact-size copy, so that ASan sees any read past the end. */
        uint8_t *cut = malloc(n ? n : 1);
        assert_non_null(cut);
        memcpy(cut, img, n);
        char err[256] = "";
        fr_st_file_t *st = fr_st_parse(cut, n, err, sizeof err);
        if (st != NULL)
            fail_msg("a truncation to %zu of %zu bytes parsed", n, len);
        assert_true(strncmp(err, "safetensors: ", 13) == 0);
        free(cut);
    }
    free(img);
}

static void test_safetensors_survives_single_byte_corruption(void **state)
{
    static const uint8_t values[] = {0,   ' ', '"', '\\', '{', '}', '[',  ']',  ',',
                                     ':', '0', '9', '-',  'e', '.', 0x80, 0xC3, 0xFF};
    fr_st_tensor_t t[3];
    fr_st_kv_t meta[2];
    sample(t, meta);
    uint8_t *img;
    size_t len;
    assert_int_equal(fr_st_encode(t, 3, meta, 2, &img, &len, NULL, 0), FR_OK);
    uint8_t *copy = malloc(len);
    assert_non_null(copy);
    size_t parsed = 0, rejected = 0;
    for (size_t i = 0; i < len; i++) {
        for (size_t v = 0; v < sizeof values; v++) {
            memcpy(copy, img, len);
            copy[i] = values[v];
            char err[256] = "";
            fr_st_file_t *st = fr_st_parse(copy, len, err, sizeof err);
            if (st != NULL) {
                /* Whatever parses is consistent: every tensor lies in the data. */
                for (size_t k = 0; k < fr_st_count(st); k++) {
                    const fr_st_tensor_t *x = fr_st_at(st, k);
                    assert_ptr_equal(fr_st_find(st, x->name), x);
                }
                parsed++;
            } else {
                assert_true(strncmp(err, "safetensors: ", 13) == 0);
                rejected++;
            }
            fr_st_destroy(st);
        }
    }
    assert_true(parsed > 0);
    assert_true(rejected > 0);
    free(copy);
    free(img);
}

/* ------------------------------------------------------------------------
 * Writer arguments, NULL handling
 * ---------------------------------------------------------------------- */

static void expect_encode_inval(const fr_st_tensor_t *t, size_t nt, const fr_st_kv_t *meta,
                                size_t nmeta, const char *want)
{
    uint8_t *img = (uint8_t *)"untouched";
    size_t len = 99;
    char err[256] = "";
    assert_int_equal(fr_st_encode(t, nt, meta, nmeta, &img, &len, err, sizeof err), FR_ERR_INVAL);
    assert_null(img);
    if (strstr(err, want) == NULL)
        fail_msg("error \"%s\" lacks \"%s\"", err, want);
}

/* Integer tensors (a sparse model's row ids) are written with their dtype
 * and read back bit for bit, beside F32 ones. */
static void test_safetensors_encode_integer_tensors(void **state)
{
    (void)state;
    static const uint32_t ids[3] = {7, 4000000000u, 0};
    static const int32_t neg[2] = {-5, 2147483647};
    static const float w[2] = {0.5f, -1.25f};
    fr_st_tensor_t t[3] = {
        {.name = "ids", .dtype = "U32", .ndim = 1, .shape = {3}, .data = ids, .nbytes = 12},
        {.name = "neg", .dtype = "I32", .ndim = 1, .shape = {2}, .data = neg, .nbytes = 8},
        {.name = "w", .dtype = "F32", .ndim = 2, .shape = {1, 2}, .data = w, .nbytes = 8},
    };
    uint8_t *img = NULL;
    size_t len = 0;
    char err[256] = "";
    assert_int_equal(fr_st_encode(t, 3, NULL, 0, &img, &len, err, sizeof err), FR_OK);
    fr_st_file_t *st = fr_st_parse(img, len, err, sizeof err);
    assert_non_null(st);
    const fr_st_tensor_t *a = fr_st_find(st, "ids"), *b = fr_st_find(st, "neg");
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(a->dtype, "U32");
    assert_string_equal(b->dtype, "I32");
    assert_int_equal(a->nbytes, 12);
    assert_memory_equal(a->data, ids, 12);
    assert_memory_equal(b->data, neg, 8);
    assert_string_equal(fr_st_find(st, "w")->dtype, "F32");
    fr_st_destroy(st);
    free(img);
}

static void test_safetensors_encode_rejects_invalid_tensors(void **state)
{
    static const float x[6] = {0};
    fr_st_tensor_t ok = {
        .name = "a", .dtype = "F32", .ndim = 2, .shape = {2, 3}, .data = x, .nbytes = 24};
    fr_st_tensor_t t[2] = {ok, ok};
    fr_st_kv_t meta[2] = {{"k", "v"}, {"k2", "v"}};

    memcpy(t[0].dtype, "F16", 4);
    expect_encode_inval(t, 1, NULL, 0, "tensor 'a': only F32, I32 and U32 tensors can be written");
    t[0] = ok;
    t[0].nbytes = 20;
    expect_encode_inval(t, 1, NULL, 0, "tensor 'a': nbytes 20 does not match shape [2, 3] of F32");
    t[0] = ok;
    t[0].ndim = 9;
    expect_encode_inval(t, 1, NULL, 0, "ndim 9 is outside [0, 8]");
    t[0].ndim = -1;
    expect_encode_inval(t, 1, NULL, 0, "ndim -1 is outside [0, 8]");
    t[0] = ok;
    t[0].shape[1] = -3;
    expect_encode_inval(t, 1, NULL, 0, "negative dimension in shape [2, -3]");
    t[0] = ok;
    t[0].data = NULL;
    expect_encode_inval(t, 1, NULL, 0, "tensor 'a' has no data");
    t[0] = ok;
    expect_encode_inval(t, 2, NULL, 0, "duplicate tensor name 'a'");
    t[1].name = "__metadata__";
    expect_encode_inval(t, 2, NULL, 0, "'__metadata__' is reserved");
    t[1].name = "bad\xff";
    expect_encode_inval(t, 2, NULL, 0, "tensor 1: name is NULL or not valid UTF-8");
    t[1].name = NULL;
    expect_encode_inval(t, 2, NULL, 0, "tensor 1: name is NULL");
    meta[1].key = "k";
    expect_encode_inval(&ok, 1, meta, 2, "duplicate metadata key 'k'");
    meta[1].key = "k2";
    meta[1].value = NULL;
    expect_encode_inval(&ok, 1, meta, 2, "metadata entry 1");
    meta[1].value = "\xc0\x80";
    expect_encode_inval(&ok, 1, meta, 2, "metadata entry 1");
    expect_encode_inval(NULL, 1, NULL, 0, "NULL argument");

    char err[64];
    assert_int_equal(fr_st_encode(&ok, 1, NULL, 0, NULL, NULL, err, sizeof err), FR_ERR_INVAL);
    char path[512];
    test_path(path, sizeof path, "never.safetensors");
    t[0] = ok;
    t[0].nbytes = 1;
    assert_int_equal(fr_st_write_file(path, t, 1, NULL, 0, err, sizeof err), FR_ERR_INVAL);
    assert_int_not_equal(access(path, F_OK), 0);
}

static void test_safetensors_destroy_and_getters_accept_null(void **state)
{
    fr_st_destroy(NULL);
    assert_int_equal(fr_st_count(NULL), 0);
    assert_null(fr_st_at(NULL, 0));
    assert_null(fr_st_find(NULL, "a"));
    assert_null(fr_st_meta(NULL, "a"));
    /* A NULL or zero-size errstr is allowed. */
    assert_null(fr_st_parse((const uint8_t *)"x", 1, NULL, 0));
    char err[4] = "zzz";
    assert_null(fr_st_parse((const uint8_t *)"x", 1, err, 0));
    assert_string_equal(err, "zzz");
    assert_null(fr_st_parse((const uint8_t *)"x", 1, err, sizeof err));
    assert_string_equal(err, "saf");
}

/* ------------------------------------------------------------------------
 * numpy reads what we write
 * ---------------------------------------------------------------------- */

/* Parses the file by the format's description alone (json + numpy), as an
 * independent reader would, and checks every value. */
static const char numpy_check_py[] =
    "import json, struct, sys\n"
    "import numpy as np\n"
    "b = open(sys.argv[1], 'rb').read()\n"
    "n = struct.unpack('<Q', b[:8])[0]\n"
    "assert b[8:9] == b'{' and (8 + n) % 8 == 0, n\n"
    "h = json.loads(b[8:8 + n].decode('utf-8'))\n"
    "meta = h.pop('__metadata__')\n"
    "note = 'quote \" backslash ' + chr(92) + ' caf' + chr(0xe9) + ' ' + chr(0x1F600)\n"
    "assert meta == {'format': 'pt', 'note': note}, meta\n"
    "assert list(h) == ['layers.0.weight', 'layers.0.bias', 'scalar'], list(h)\n"
    "data = b[8 + n:]\n"
    "end = 0\n"
    "a = {}\n"
    "for name, info in sorted(h.items(), key=lambda kv: kv[1]['data_offsets']):\n"
    "    begin, stop = info['data_offsets']\n"
    "    assert begin == end and info['dtype'] == 'F32', (name, info)\n"
    "    a[name] = np.frombuffer(data[begin:stop], dtype='<f4').reshape(info['shape'])\n"
    "    end = stop\n"
    "assert end == len(data), (end, len(data))\n"
    "w = np.arange(6, dtype=np.float32).reshape(2, 3) * np.float32(0.5) - np.float32(1)\n"
    "assert np.array_equal(a['layers.0.weight'], w), a['layers.0.weight']\n"
    "assert np.array_equal(a['layers.0.bias'], np.array([0.25, -3.0], dtype=np.float32))\n"
    "assert a['scalar'].shape == () and a['scalar'] == np.float32(7.5)\n";

static void test_safetensors_numpy_reads_a_written_file(void **state)
{
    /* numpy is the independent reader the test is about: its absence is a
     * failure (deploy/setup.sh installs it) */
    if (system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0)
        fail_msg("/usr/bin/python3 cannot import numpy (Debian: apt-get install python3-numpy)");
    fr_st_tensor_t t[3];
    fr_st_kv_t meta[2];
    sample(t, meta);
    char path[512], script[512], cmd[1200], err[512] = "";
    test_path(path, sizeof path, "numpy.safetensors");
    test_path(script, sizeof script, "numpy_check.py");
    assert_int_equal(fr_st_write_file(path, t, 3, meta, 2, err, sizeof err), FR_OK);
    FILE *f = fopen(script, "w");
    assert_non_null(f);
    fputs(numpy_check_py, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s'", script, path);
    int rc = system(cmd);
    unlink(script);
    unlink(path);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
}

/* A device or stream with a bad length prefix is refused after 8 bytes,
 * not read to its end (/dev/zero never ends). */
static void test_safetensors_stream_with_bad_prefix_is_refused_at_once(void **state)
{
    char err[256];
    assert_null(fr_st_read_file("/dev/zero", err, sizeof(err)));
    assert_non_null(strstr(err, "header length 0 is too small"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_round_trips_tensors_and_metadata),
        cmocka_unit_test(test_safetensors_writes_the_exact_byte_layout),
        cmocka_unit_test(test_safetensors_pads_every_header_to_a_multiple_of_eight),
        cmocka_unit_test(test_safetensors_escapes_quotes_backslashes_and_control_characters),
        cmocka_unit_test(test_safetensors_parses_a_python_style_file),
        cmocka_unit_test(test_safetensors_accepts_every_dtype),
        cmocka_unit_test(test_safetensors_decodes_unicode_escapes_in_names),
        cmocka_unit_test(test_safetensors_accepts_scalars_and_empty_tensors),
        cmocka_unit_test(test_safetensors_ignores_unknown_tensor_fields),
        cmocka_unit_test(test_safetensors_accepts_empty_header_and_null_metadata),
        cmocka_unit_test(test_safetensors_aligns_data_whatever_the_header_length),
        cmocka_unit_test(test_safetensors_parse_copies_the_input),
        cmocka_unit_test(test_safetensors_finds_each_of_many_tensors),
        cmocka_unit_test(test_safetensors_writes_and_reads_files_atomically),
        cmocka_unit_test(test_safetensors_round_trips_a_large_tensor),
        cmocka_unit_test(test_safetensors_reports_a_missing_file_with_its_path),
        cmocka_unit_test(test_safetensors_reports_an_unwritable_path),
        cmocka_unit_test(test_safetensors_rejects_header_length_beyond_file_size),
        cmocka_unit_test(test_safetensors_rejects_header_length_below_two),
        cmocka_unit_test(test_safetensors_rejects_header_length_above_the_limit),
        cmocka_unit_test(test_safetensors_rejects_file_shorter_than_the_length_prefix),
        cmocka_unit_test(test_safetensors_rejects_truncated_data),
        cmocka_unit_test(test_safetensors_rejects_trailing_bytes_after_the_data),
        cmocka_unit_test(test_safetensors_rejects_bad_json),
        cmocka_unit_test(test_safetensors_rejects_nesting_beyond_the_depth_limit),
        cmocka_unit_test(test_safetensors_rejects_missing_fields),
        cmocka_unit_test(test_safetensors_rejects_unknown_dtype),
        cmocka_unit_test(test_safetensors_rejects_offsets_not_matching_the_shape),
        cmocka_unit_test(test_safetensors_rejects_hole_between_tensors),
        cmocka_unit_test(test_safetensors_rejects_overlapping_tensors),
        cmocka_unit_test(test_safetensors_rejects_data_not_starting_at_zero),
        cmocka_unit_test(test_safetensors_rejects_duplicate_tensor_names),
        cmocka_unit_test(test_safetensors_rejects_duplicate_keys),
        cmocka_unit_test(test_safetensors_rejects_non_string_metadata_value),
        cmocka_unit_test(test_safetensors_rejects_header_not_starting_with_brace),
        cmocka_unit_test(test_safetensors_rejects_bad_shapes_and_offsets),
        cmocka_unit_test(test_safetensors_rejects_every_truncation_of_a_valid_file),
        cmocka_unit_test(test_safetensors_survives_single_byte_corruption),
        cmocka_unit_test(test_safetensors_encode_integer_tensors),
        cmocka_unit_test(test_safetensors_encode_rejects_invalid_tensors),
        cmocka_unit_test(test_safetensors_destroy_and_getters_accept_null),
        cmocka_unit_test(test_safetensors_numpy_reads_a_written_file),
        cmocka_unit_test(test_safetensors_stream_with_bad_prefix_is_refused_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
