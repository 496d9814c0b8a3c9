/*
 * records.h - the records freshet trains on, without Kafka: their formats,
 * the schema they are checked against, the codec (decode, encode), and the
 * files that hold them (whole data sets, record files read one record at
 * a time, IDX headers). The compute core (fr_ingest_core) builds it.
 *
 * Included by ingest/ingest.h, the module's public header, which the rest
 * of freshet includes.
 *
 * Threads: the codec functions are reentrant; a data set belongs to its
 * owner and may be read by any number of threads once loaded; a record
 * file belongs to one thread.
 */
#ifndef FRESHET_INGEST_RECORDS_H
#define FRESHET_INGEST_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Formats, the schema and the codec (codec.c).
 * ---------------------------------------------------------------------- */
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
    INGEST_REJECT_MAGNITUDE,     /* "magnitude": a feature beyond max_abs       */
    INGEST_REJECT_QUARANTINED,   /* "quarantined": a position a trainer found
                                    poisonous once (ingest_batcher_quarantine)   */
    INGEST_REJECT_COUNT
} ingest_reject_t;

const char *ingest_reject_name(ingest_reject_t reason);

/* What labels must look like. */
typedef enum ingest_label {
    INGEST_LABEL_CLASS = 0,  /* an integer in [0, classes) (softmax)            */
    INGEST_LABEL_BINARY = 1, /* a value in [0, 1] (logistic; soft labels allowed) */
    INGEST_LABEL_REAL = 2,   /* any finite value (mse)                          */
} ingest_label_t;

/* A record layout another module decodes (sparse models: trainer/schema_sparse.h's
 * trainer_sparse_decode): the record rec[len] into x[features] and *y;
 * INGEST_OK or the reason. Reentrant; arg is the schema's decode_arg. */
typedef ingest_reject_t (*ingest_decode_fn)(const void *arg, const void *rec, size_t len, float *x,
                                            float *y);

typedef struct ingest_schema {
    int features; /* D > 0                                                */
    ingest_label_t label;
    int classes;             /* for INGEST_LABEL_CLASS                               */
    size_t max_record;       /* bytes; 0 = 1 MiB for text formats, no limit for f32
                                (whose records must be exactly 4(D+1) bytes anyway) */
    ingest_decode_fn decode; /* NULL: the format's decoder; else this one, for
                                every format, records up to the text limit  */
    const void *decode_arg;
    int aux;       /* > 0: x[aux] of a decoded record takes the record's aux value (its
                      Kafka header freshet-p: a sparse model's planted probability) when
                      it has one (ingest_batcher_add_aux); 0: none */
    float max_abs; /* > 0: a record with a feature of larger magnitude is rejected
                      (magnitude): finite, but it overflows a gradient; 0: no limit.
                      Not applied to records a decode hook reads */
} ingest_schema_t;

/* Decodes one record (a csv or libsvm line without its newline, though a
 * trailing "\n" or "\r\n" is accepted; or one f32 record; or whatever
 * schema->decode reads) into x[D] and *y.
 * Returns INGEST_OK or the reason; on rejection x and y may hold garbage
 * but nothing outside them is touched. Never reads past rec + len. */
ingest_reject_t ingest_decode(const ingest_schema_t *schema, ingest_format_t format,
                              const void *rec, size_t len, float *x, float *y);

/* Encodes one sample (x[features], y) as a record of format (csv, libsvm
 * or f32) into buf of cap bytes: numbers as "%.9g" (exact for float32),
 * libsvm without zero features, f32 as 4(features+1) little-endian bytes.
 * Returns the record's length (no newline), or 0 when cap is too small or
 * the format is idx. ingest_decode reads back exactly x and y. */
size_t ingest_encode(ingest_format_t format, const float *x, int features, float y, char *buf,
                     size_t cap);

/* ------------------------------------------------------------------------
 * Data sets (dataset.c, idx.c): whole files loaded into memory.
 * ---------------------------------------------------------------------- */

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

/* The features a sample of the IDX images file at path (".gz" too) holds,
 * from its header alone: the product of all but its first dimension (28x28
 * images: 784) in *features. FR_ERR_IO, FR_ERR_UNSUPPORTED or FR_ERR_PARSE
 * (not an images file) with errstr. */
fr_err_t ingest_idx_features(const char *path, int *features, char *errstr, size_t size);

/* ------------------------------------------------------------------------
 * Record files (file.c), read one record at a time: lines (text
 * layouts), or records each after its length as 4 bytes little-endian
 * (binary layouts). "-" is standard input; a name ending ".gz" is read
 * through zlib. One thread.
 * ---------------------------------------------------------------------- */
typedef struct ingest_file ingest_file_t;

/* Opens path for records of at most max bytes (1..2^30); NULL with errstr
 * (the path and the system's reason) when it cannot. */
ingest_file_t *ingest_file_open(const char *path, size_t max, char *errstr, size_t size);
void ingest_file_close(ingest_file_t *f);

/* The next line, without its "\n" or "\r\n", in *line[*len] (valid until
 * the next call). FR_ERR_NOTFOUND at the end; FR_ERR_RANGE for a line
 * longer than max, which is skipped (the next call reads on after it);
 * FR_ERR_IO or FR_ERR_PARSE (a corrupt gzip stream) with errstr. */
fr_err_t ingest_file_line(ingest_file_t *f, const char **line, size_t *len, char *errstr,
                          size_t size);

/* The next record after its length, in *rec[*len] (valid until the next
 * call). FR_ERR_NOTFOUND at the clean end; FR_ERR_PARSE when a length
 * exceeds max (not such a file) or the last record is cut short. */
fr_err_t ingest_file_framed(ingest_file_t *f, const void **rec, size_t *len, char *errstr,
                            size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_INGEST_RECORDS_H */
