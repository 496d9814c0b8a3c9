/*
 * fuzz_codec.c - libFuzzer target for ingest_decode().
 *
 * The first input byte chooses the case, the rest is the record:
 *   sel % 3        format: 0 csv, 1 libsvm, 2 f32
 *   (sel / 3) % 3  label kind: 0 class, 1 binary, 2 real
 *   sel / 9        0..28: classes = 1 + (sel / 9) % 10, and a small
 *                  explicit max_record (40 bytes) when sel / 9 >= 20
 * The record is copied into a heap buffer of exactly its length and decoded
 * with D = 7 into heap arrays of exactly 7 floats and 1 float, so ASan
 * reports any read past the record or write past x or y. On INGEST_OK every
 * feature must be finite and the label must obey the schema's rule; an f32
 * record must also have had exactly 4 * (D + 1) bytes.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ingest/ingest.h"

#define FUZZ_D 7

/* Whether y is a label the schema accepts. */
static int label_ok(const ingest_schema_t *s, float y)
{
    if (!isfinite(y))
        return 0;
    switch (s->label) {
    case INGEST_LABEL_CLASS: return y >= 0.0f && y == floorf(y) && y < (float)s->classes;
    case INGEST_LABEL_BINARY: return y >= 0.0f && y <= 1.0f;
    case INGEST_LABEL_REAL: return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned sel = data[0];
    const ingest_format_t formats[3] = {INGEST_FORMAT_CSV, INGEST_FORMAT_LIBSVM, INGEST_FORMAT_F32};
    ingest_schema_t s = {
        .features = FUZZ_D,
        .label = (ingest_label_t)((sel / 3) % 3),
        .classes = 1 + (int)((sel / 9) % 10),
        .max_record = sel / 9 >= 20 ? 40 : 0,
    };
    ingest_format_t format = formats[sel % 3];
    size_t len = size - 1;
    unsigned char *rec = malloc(len > 0 ? len : 1);
    float *x = malloc(FUZZ_D * sizeof(float));
    float *y = malloc(sizeof(float));

    if (rec == NULL || x == NULL || y == NULL)
        abort();
    memcpy(rec, data + 1, len);
    ingest_reject_t r = ingest_decode(&s, format, rec, len, x, y);
    if ((unsigned)r >= INGEST_REJECT_COUNT) {
        fprintf(stderr, "unknown reason %d\n", (int)r);
        abort();
    }
    if (r == INGEST_OK) {
        for (int i = 0; i < FUZZ_D; i++) {
            if (!isfinite(x[i])) {
                fprintf(stderr, "x[%d] = %f accepted\n", i, x[i]);
                abort();
            }
        }
        if (!label_ok(&s, *y)) {
            fprintf(stderr, "label %a accepted for kind %d, classes %d\n", *y, (int)s.label,
                    s.classes);
            abort();
        }
        if (format == INGEST_FORMAT_F32 && len != 4 * (FUZZ_D + 1)) {
            fprintf(stderr, "f32 record of %zu bytes accepted\n", len);
            abort();
        }
        if (s.max_record != 0 && len > s.max_record) {
            fprintf(stderr, "record of %zu bytes accepted over max_record %zu\n", len,
                    s.max_record);
            abort();
        }
    }
    free(rec);
    free(x);
    free(y);
    return 0;
}
