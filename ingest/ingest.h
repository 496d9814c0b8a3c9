/*
 * ingest.h - the one public header of the ingest module.
 *
 * This release holds the record codecs and the file readers; the Kafka
 * consumer, batching and the producer join this header later.
 *
 * Threads: the codec functions are reentrant; a dataset belongs to its
 * owner and may be read by any number of threads once loaded.
 */
#ifndef FRESHET_INGEST_H
#define FRESHET_INGEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ingest_format {
    INGEST_FORMAT_CSV = 0,    /* "label,f1,...,fD"                                 */
    INGEST_FORMAT_LIBSVM = 1, /* "label idx:val ..." with 1-based indices, sparse  */
    INGEST_FORMAT_F32 = 2,    /* little-endian float32 label then D float32s       */
    INGEST_FORMAT_IDX = 3,    /* files only: IDX images + IDX labels (.gz or not)  */
} ingest_format_t;

/* Parses "csv", "libsvm", "f32" or "idx"; FR_ERR_INVAL otherwise. */
fr_err_t ingest_format_parse(const char *name, ingest_format_t *format);
const char *ingest_format_name(ingest_format_t format);

/* Why a record was rejected. Each has a stable name for metrics labels. */
typedef enum ingest_reject {
    INGEST_OK = 0,
    INGEST_REJECT_BAD_NUMBER,    /* "bad_number": a field is not a number       */
    INGEST_REJECT_FEATURE_COUNT, /* "feature_count": not exactly D features,
                                    or an f32 record of the wrong length         */
    INGEST_REJECT_INDEX_RANGE,   /* "index_range": libsvm index 0, > D, repeated
                                    or not increasing                           */
    INGEST_REJECT_LABEL_RANGE,   /* "label_range": label invalid for the loss   */
    INGEST_REJECT_NONFINITE,     /* "nonfinite": NaN or infinity                */
    INGEST_REJECT_OVERSIZE,      /* "oversize": longer than max_record bytes    */
    INGEST_REJECT_COUNT
} ingest_reject_t;

const char *ingest_reject_name(ingest_reject_t reason);

/* What labels must look like. */
typedef enum ingest_label {
    INGEST_LABEL_CLASS = 0,  /* an integer in [0, classes) (softmax)            */
    INGEST_LABEL_BINARY = 1, /* a value in [0, 1] (logistic; soft labels allowed) */
    INGEST_LABEL_REAL = 2,   /* any finite value (mse)                          */
} ingest_label_t;

typedef struct ingest_schema {
    int features; /* D > 0                                                */
    ingest_label_t label;
    int classes;       /* for INGEST_LABEL_CLASS                               */
    size_t max_record; /* bytes; 0 = 1 MiB for text formats, no limit for f32
                          (whose records must be exactly 4(D+1) bytes anyway) */
} ingest_schema_t;

/* Decodes one record (a csv or libsvm line without its newline, though a
 * trailing "\n" or "\r\n" is accepted; or one f32 record) into x[D] and *y.
 * Returns INGEST_OK or the reason; on rejection x and y may hold garbage
 * but nothing outside them is touched. Never reads past rec + len. */
ingest_reject_t ingest_decode(const ingest_schema_t *schema, ingest_format_t format,
                              const void *rec, size_t len, float *x, float *y);

/* A whole file in memory: n samples, x row-major [n x features], y[n]. */
typedef struct ingest_dataset {
    size_t n;
    int features;
    float *x;
    float *y;
    uint64_t rejected[INGEST_REJECT_COUNT];       /* records skipped, by reason */
    uint64_t first_bad_line[INGEST_REJECT_COUNT]; /* 1-based line (csv, libsvm:
                                                     physical lines, blank and
                                                     header lines counted),
                                                     record (f32) or sample
                                                     (idx) number of the
                                                     first rejection, 0 = none  */
} ingest_dataset_t;

/* Loads a data file (and for idx, its labels file) of the given format.
 * Files ending ".gz" are decompressed. csv and libsvm: one record a line,
 * blank lines ignored; f32: concatenated 4(D+1)-byte records; idx: images
 * (any dimensions whose product is D) scaled to [0,1] with labels from
 * labels_path. Rejected records are counted in ds->rejected and skipped; a
 * file that cannot be read or parsed at all is an error. ds is zeroed
 * first; release with ingest_dataset_fini(), also after an error. */
fr_err_t ingest_dataset_load(ingest_dataset_t *ds, const ingest_schema_t *schema,
                             ingest_format_t format, const char *data_path, const char *labels_path,
                             char *errstr, size_t size);
void ingest_dataset_fini(ingest_dataset_t *ds);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_INGEST_H */
