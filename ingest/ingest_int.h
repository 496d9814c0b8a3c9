/*
 * ingest_int.h - private declarations shared by the ingest sources
 * (codec.c, reader.c). Not part of the public API; everything here carries
 * the ingest_ prefix and is reentrant.
 */
#ifndef FRESHET_INGEST_INT_H
#define FRESHET_INGEST_INT_H

#include "ingest/ingest.h"

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
