/*
 * schema_sparse.h - a sparse model's records through ingest's batcher
 * (schema_sparse.c; docs/design.md "Sparse models"): the batcher's decode
 * hook for every sparse layout, which packs each record into one float
 * row (sparse.h's SPARSE_PACKED). It lives in the trainer, which uses both
 * sparse/ and ingest/, so that neither depends on the other, as
 * trainer_model_schema does for the dense model. Built with sparse models
 * only (libxxhash).
 *
 * Threads: the hook is reentrant; a decoder is read only while a batcher
 * uses it.
 */
#ifndef FRESHET_TRAINER_SCHEMA_SPARSE_H
#define FRESHET_TRAINER_SCHEMA_SPARSE_H

#include <stddef.h>

#include "ingest/ingest.h"
#include "sparse/sparse.h"

/* What the hook needs: the table and the layout. The schema's decode_arg
 * points at one; the caller owns it and keeps it while the batcher runs. */
typedef struct trainer_sparse_decoder {
    sparse_spec_t spec;
    sparse_layout_t layout;
} trainer_sparse_decoder_t;

/* The hook itself (an ingest_decode_fn, with decoder a
 * trainer_sparse_decoder_t): parses the record, packs it into
 * x[SPARSE_PACKED(spec.fields)] and its label into *y; a malformed record
 * is counted under the nearest ingest reason (label_range, bad_number,
 * index_range, else feature_count). */
ingest_reject_t trainer_sparse_decode(const void *decoder, const void *rec, size_t len, float *x,
                                      float *y);

#endif /* FRESHET_TRAINER_SCHEMA_SPARSE_H */
