/*
 * schema_sparse.c - a sparse model's records through ingest's batcher: the
 * decode hook that parses a record of any sparse layout and packs it into
 * the batch's float row (sparse_pack), and the map from a layout's reject
 * word to ingest's reasons. It lives in the trainer so that neither
 * sparse/ nor ingest/ depends on the other (schema.c does the same for the
 * dense model).
 */
#include <string.h>

#include "trainer/schema_sparse.h"

/* The ingest reason a layout's reason is counted under. */
static ingest_reject_t reject_of(const char *reason)
{
    static const struct {
        const char *reason;
        ingest_reject_t why;
    } map[] = {
        {"label", INGEST_REJECT_LABEL_RANGE}, {"integer", INGEST_REJECT_BAD_NUMBER},
        {"value", INGEST_REJECT_BAD_NUMBER},  {"index", INGEST_REJECT_INDEX_RANGE},
        {"field", INGEST_REJECT_INDEX_RANGE},
    };
    for (size_t i = 0; reason != NULL && i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(reason, map[i].reason) == 0)
            return map[i].why;
    return INGEST_REJECT_FEATURE_COUNT; /* columns, features, fields, length */
}

ingest_reject_t trainer_sparse_decode(const void *decoder, const void *rec, size_t len, float *x,
                                      float *y)
{
    const trainer_sparse_decoder_t *d = decoder;
    sparse_sample_t s;
    const char *reason = NULL;
    if (sparse_parse_record(&d->spec, d->layout, rec, len, &s, &reason) != FR_OK)
        return reject_of(reason);
    sparse_pack(&s, d->spec.fields, x);
    *y = s.label;
    return INGEST_OK;
}
