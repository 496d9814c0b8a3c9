/*
 * ingest_int.h - private declarations shared by the ingest sources
 * (codec.c, source.c, dataset.c, idx.c, file.c, resolver.c). Not part of
 * the public API; everything here carries the ingest_ prefix and is
 * reentrant.
 */
#ifndef FRESHET_INGEST_INT_H
#define FRESHET_INGEST_INT_H

#include <stdio.h>

#include "ingest/ingest.h"

/* Bytes asked of a file per read. */
#define INGEST_READ_CHUNK ((size_t)1 << 20)

/* The record size limit of text formats when schema->max_record is 0. */
#define INGEST_DEFAULT_MAX_RECORD ((size_t)1 << 20)

/* The longest csv or libsvm number, in bytes, after the surrounding blanks
 * are trimmed; a longer field is "bad_number". */
#define INGEST_MAX_NUMBER 63

/*
 * Checks a label against the schema's rule: INGEST_REJECT_NONFINITE for NaN
 * or infinity, INGEST_REJECT_LABEL_RANGE for a value the loss cannot take
 * (a class that is not an integer in [0, classes), a binary label outside
 * [0, 1]), INGEST_OK otherwise.
 */
ingest_reject_t ingest_label_check(const ingest_schema_t *schema, float y);

/* The line length above which a text record is "oversize" for schema. */
size_t ingest_text_limit(const ingest_schema_t *schema);

/* ------------------------------------------------------------------------
 * Sources (source.c): a data file read to its end, plain or through zlib
 * (gz is zlib's gzFile, NULL without zlib). One thread per source.
 * ---------------------------------------------------------------------- */
typedef struct ingest_source {
    const char *path;
    long long disk;      /* bytes on disk of a regular file, -1 when unknown */
    int compressed;      /* read through zlib */
    FILE *fp;            /* a plain file, or NULL */
    struct gzFile_s *gz; /* a gzip stream, or NULL */
} ingest_source_t;

/* Opens path for reading, through zlib when its name ends ".gz". FR_ERR_IO
 * naming the path and the system's reason when it cannot be opened,
 * FR_ERR_UNSUPPORTED for a .gz file in a build without zlib; on error there
 * is nothing to close. */
fr_err_t ingest_source_open(ingest_source_t *src, const char *path, char *errstr, size_t size);
/* Closes what src holds and zeroes it. */
void ingest_source_close(ingest_source_t *src);
/* Reads up to want bytes into buf; *got < want only at the end of the
 * data. FR_ERR_IO when the system fails a read, FR_ERR_PARSE when a gzip
 * stream is corrupt or cut short, with errstr naming the file. */
fr_err_t ingest_source_read(ingest_source_t *src, void *buf, size_t want, size_t *got, char *errstr,
                            size_t size);

/* ------------------------------------------------------------------------
 * Data set bookkeeping (dataset.c), for the loaders of each format.
 * ---------------------------------------------------------------------- */

/* Makes room for at least rows samples in ds, whose capacity is *cap rows:
 * exactly rows when exact is non-zero, else doubling. On failure ds keeps
 * its old arrays, so ingest_dataset_fini() still frees everything. */
fr_err_t ingest_dataset_reserve(ingest_dataset_t *ds, size_t *cap, size_t rows, int exact,
                                char *errstr, size_t size);
/* Gives back the rows allocated beyond ds->n (cap rows were allocated). */
void ingest_dataset_shrink(ingest_dataset_t *ds, size_t cap);
/* Counts a record rejected for r at where (a line, record or sample
 * number), the first such one in first_bad_line. */
void ingest_dataset_reject(ingest_dataset_t *ds, ingest_reject_t r, uint64_t where);

/* Loads IDX images from src (open, nothing read yet) with the labels of
 * labels_path into ds (idx.c; see ingest_dataset_load). */
fr_err_t ingest_idx_load(ingest_dataset_t *ds, const ingest_schema_t *schema, ingest_source_t *src,
                         const char *labels_path, char *errstr, size_t size);

/*
 * One ListOffsets question (resolver.c): the offset of topic/partition for
 * ts (a time in ms, -2 for the log start, -1 for the log end) within
 * timeout_ms, through rd_kafka_offsets_for_times, which keeps to its
 * timeout while the brokers are down (rd_kafka_query_watermark_offsets
 * before librdkafka 2.3.0 waits for them forever, librdkafka issue #2588).
 * Returns librdkafka's error code: 0 with *offset set (-1 where the broker
 * has no answer for a time).
 */
typedef struct rd_kafka_s rd_kafka_t;
int ingest_list_offset(rd_kafka_t *rk, const char *topic, int32_t partition, int64_t ts,
                       int timeout_ms, int64_t *offset);

#endif /* FRESHET_INGEST_INT_H */
