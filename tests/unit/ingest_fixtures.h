/*
 * ingest_fixtures.h - the helpers test_codec.c and test_reader.c share:
 * a schema in one call, bitwise float equality, a little-endian float.
 */
#ifndef FRESHET_TEST_INGEST_FIXTURES_H
#define FRESHET_TEST_INGEST_FIXTURES_H

#include <stdint.h>
#include <string.h>

#include "ingest/ingest.h"

static inline ingest_schema_t schema_of(int d, ingest_label_t label, int classes)
{
    ingest_schema_t s = {.features = d, .label = label, .classes = classes, .max_record = 0};
    return s;
}

/* Bitwise float equality, so that -0 and +0 (and NaN payloads) differ. */
static inline int same_float(float a, float b)
{
    return memcmp(&a, &b, sizeof(a)) == 0;
}

static inline void put_f32le(unsigned char *p, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
}

#endif
