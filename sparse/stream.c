/*
 * stream.c - sparse records through ingest's batcher (docs/design.md
 * "Sparse models"): a record of any sparse layout is decoded by the
 * batcher's schema hook (trainer/schema_sparse.c, which knows both sides)
 * into one float row of the batch, packed as [n, row_1..row_F,
 * val_1..val_F, field_1..field_F, planted] with each row's 32 bits
 * stored as they are in a float slot. The batcher moves rows of floats and
 * never computes on them, so a batch carries sparse samples without a
 * second representation or a copy; the trainer unpacks them. Nothing here
 * includes ingest: the packing is plain floats.
 */
#include <math.h>
#include <string.h>

#include "sparse/sparse.h"

fr_err_t sparse_layout_parse(const char *name, sparse_layout_t *layout)
{
    static const char *const names[] = {"criteo", "libsvm", "binary"};
    for (int k = 0; name != NULL && k < 3; k++)
        if (strcmp(name, names[k]) == 0) {
            *layout = (sparse_layout_t)k;
            return FR_OK;
        }
    return FR_ERR_INVAL;
}

fr_err_t sparse_parse_record(const sparse_spec_t *spec, sparse_layout_t layout, const void *rec,
                             size_t len, sparse_sample_t *s, const char **reason)
{
    s->planted = NAN; /* no layout carries it: a Kafka header does */
    switch (layout) {
    case SPARSE_LAYOUT_CRITEO: return sparse_parse_criteo(spec, rec, len, s, reason);
    case SPARSE_LAYOUT_LIBSVM: return sparse_parse_libsvm(spec, rec, len, s, reason);
    case SPARSE_LAYOUT_BINARY: return sparse_parse_binary(spec, rec, len, s, reason);
    }
    *reason = "layout";
    return FR_ERR_INVAL;
}

void sparse_pack(const sparse_sample_t *s, int fields, float *x)
{
    x[0] = (float)s->n;
    for (int k = 0; k < fields; k++) {
        uint32_t row = k < s->n ? s->row[k] : 0;
        memcpy(&x[1 + k], &row, sizeof(row));
        x[1 + fields + k] = k < s->n ? s->val[k] : 0.0f;
        x[1 + 2 * fields + k] = k < s->n ? (float)s->field[k] : 0.0f;
    }
    x[SPARSE_PLANTED_SLOT(fields)] = s->planted;
}

fr_err_t sparse_unpack(const float *x, int fields, int bits, float label, sparse_sample_t *s)
{
    if (!(x[0] >= 0.0f && x[0] <= (float)fields))
        return FR_ERR_PARSE;
    int n = (int)x[0];
    if ((float)n != x[0])
        return FR_ERR_PARSE;
    s->label = label;
    s->n = n;
    s->planted = x[SPARSE_PLANTED_SLOT(fields)];
    for (int k = 0; k < n; k++) {
        memcpy(&s->row[k], &x[1 + k], sizeof(s->row[k]));
        s->val[k] = x[1 + fields + k];
        float f = x[1 + 2 * fields + k];
        if (s->row[k] >> bits != 0 || !(f >= 0.0f && f < (float)SPARSE_FIELDS_MAX) ||
            f != (float)(int)f)
            return FR_ERR_PARSE;
        s->field[k] = (uint8_t)f;
    }
    return FR_OK;
}
