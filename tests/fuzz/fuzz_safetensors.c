/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors reader and
 * writer (common/safetensors.c). Built only with -DFRESHET_FUZZ=ON (clang,
 * ASan and UBSan); seeds are in tests/fuzz/corpus/safetensors/.
 *
 * Every input is parsed. A rejected input must come back with an error
 * message; an accepted one is walked completely (every tensor byte is read,
 * so ASan sees a pointer outside the image) and its invariants are checked:
 * tensors in data order and contiguous, each found by its name. An accepted
 * file whose tensors are all F32 is encoded again with fr_st_encode, the
 * result parsed and compared with the first parse, and encoded a second time,
 * which must give the same bytes. The public API has no way to list the
 * metadata, so only the keys freshet writes (and a few others) are compared.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_safetensors: check failed at line %d: %s\n", __LINE__, #cond);   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Metadata keys probed in every parsed file. */
static const char *const probe_keys[] = {
    "format", "freshet.version", "freshet.layers", "freshet.loss", "freshet.offsets", "", "k", "a",
    "note"};
#define NPROBE (sizeof probe_keys / sizeof probe_keys[0])

/* Reads every byte of every tensor and checks the invariants of a parsed
 * file. Returns true if all of its tensors are F32. */
static bool walk(const fr_st_file_t *st)
{
    volatile uint8_t sink = 0;
    bool all_f32 = true;
    const uint8_t *next = NULL;
    for (size_t i = 0; i < fr_st_count(st); i++) {
        const fr_st_tensor_t *t = fr_st_at(st, i);
        CHECK(t != NULL && t->name != NULL);
        CHECK(fr_st_find(st, t->name) == t);
        CHECK(memchr(t->dtype, '\0', sizeof t->dtype) != NULL);
        CHECK(t->ndim >= 0 && t->ndim <= FR_ST_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++)
            CHECK(t->shape[d] >= 0);
        /* Tensors come in data order with no gap between them. */
        CHECK(next == NULL || (const uint8_t *)t->data == next);
        next = (const uint8_t *)t->data + t->nbytes;
        const uint8_t *b = t->data;
        for (size_t k = 0; k < t->nbytes; k++)
            sink ^= b[k];
        if (strcmp(t->dtype, "F32") != 0)
            all_f32 = false;
    }
    CHECK(fr_st_at(st, fr_st_count(st)) == NULL);
    for (size_t i = 0; i < NPROBE; i++) {
        const char *v = fr_st_meta(st, probe_keys[i]);
        if (v != NULL)
            sink ^= (uint8_t)strlen(v);
    }
    (void)sink;
    return all_f32;
}

/* Encodes the tensors of st and the probed metadata it holds. */
static uint8_t *encode(const fr_st_file_t *st, size_t *len)
{
    size_t n = fr_st_count(st), nmeta = 0;
    fr_st_tensor_t *t = calloc(n ? n : 1, sizeof *t);
    fr_st_kv_t meta[NPROBE];
    char err[256];
    uint8_t *out = NULL;
    CHECK(t != NULL);
    for (size_t i = 0; i < n; i++)
        t[i] = *fr_st_at(st, i);
    for (size_t i = 0; i < NPROBE; i++) {
        const char *v = fr_st_meta(st, probe_keys[i]);
        if (v != NULL)
            meta[nmeta++] = (fr_st_kv_t){probe_keys[i], v};
    }
    fr_err_t rc = fr_st_encode(t, n, meta, nmeta, &out, len, err, sizeof err);
    if (rc != FR_OK)
        fprintf(stderr, "fuzz_safetensors: %s\n", err);
    CHECK(rc == FR_OK);
    free(t);
    return out;
}

/* Asserts that a and b hold the same tensors in the same order, with the
 * same bytes, and the same values for the probed metadata keys. */
static void check_same(const fr_st_file_t *a, const fr_st_file_t *b)
{
    CHECK(fr_st_count(a) == fr_st_count(b));
    for (size_t i = 0; i < fr_st_count(a); i++) {
        const fr_st_tensor_t *x = fr_st_at(a, i), *y = fr_st_at(b, i);
        CHECK(strcmp(x->name, y->name) == 0);
        CHECK(strcmp(x->dtype, y->dtype) == 0);
        CHECK(x->ndim == y->ndim);
        CHECK(memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof x->shape[0]) == 0);
        CHECK(x->nbytes == y->nbytes);
        CHECK(x->nbytes == 0 || memcmp(x->data, y->data, x->nbytes) == 0);
    }
    for (size_t i = 0; i < NPROBE; i++) {
        const char *u = fr_st_meta(a, probe_keys[i]), *v = fr_st_meta(b, probe_keys[i]);
        CHECK((u == NULL) == (v == NULL));
        CHECK(u == NULL || strcmp(u, v) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256] = "";
    fr_st_file_t *st = fr_st_parse(data, size, err, sizeof err);
    if (st == NULL) {
        CHECK(strncmp(err, "safetensors: ", 13) == 0);
        return 0;
    }
    if (walk(st)) {
        size_t len1, len2;
        uint8_t *img1 = encode(st, &len1);
        fr_st_file_t *again = fr_st_parse(img1, len1, err, sizeof err);
        if (again == NULL)
            fprintf(stderr, "fuzz_safetensors: re-parse failed: %s\n", err);
        CHECK(again != NULL);
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = (hlen << 8) | img1[i];
        CHECK(img1[8] == '{' && (8 + hlen) % 8 == 0);
        walk(again);
        check_same(st, again);
        uint8_t *img2 = encode(again, &len2);
        CHECK(len1 == len2 && memcmp(img1, img2, len1) == 0);
        free(img2);
        fr_st_destroy(again);
        free(img1);
    }
    fr_st_destroy(st);
    return 0;
}
