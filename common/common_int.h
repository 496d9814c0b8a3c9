/*
 * common_int.h - private declarations shared by common's sources: the
 * pieces of the safetensors format that its reader (safetensors.c) and its
 * writer (safetensors_write.c) both use. Every function is reentrant.
 */
#ifndef FRESHET_COMMON_INT_H
#define FRESHET_COMMON_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define FR_ST_MAX_HEADER ((uint64_t)100 * 1024 * 1024) /* header bytes, as in the reference */
#define FR_ST_SHOW       72                            /* bytes of a name quoted in a message */
#define FR_ST_SHAPE_TEXT (FR_ST_MAX_DIMS * 22 + 4)     /* "[d0, d1, ...]" */

/* Where errors go: the file name (NULL for a buffer) and the caller's buffer. */
typedef struct fr_st_errctx {
    const char *path;
    char *errstr;
    size_t size;
} fr_st_errctx_t;

/* Formats "safetensors: [path: ]message" into the context's errstr and
 * returns err. */
fr_err_t fr__st_fail(const fr_st_errctx_t *ec, fr_err_t err, const char *fmt, ...) FR_PRINTF(3, 4);
/* fr__st_fail with FR_ERR_NOMEM and "out of memory". */
fr_err_t fr__st_nomem(const fr_st_errctx_t *ec);
/* Length of the valid UTF-8 sequence at s (avail >= 1 bytes there), or 0 if
 * it is invalid. */
size_t fr__st_utf8_len(const unsigned char *s, size_t avail);
/* s made safe for an error message (cut, control characters and invalid
 * UTF-8 replaced) in out; returns out. */
const char *fr__st_show(const char *s, char out[FR_ST_SHOW]);
/* A shape as "[2, 3]" in out; returns out. */
const char *fr__st_shape_text(const int64_t *shape, int ndim, char out[FR_ST_SHAPE_TEXT]);
/* Bytes of a tensor of the given shape and element size in *nbytes; false
 * if they overflow 64 bits. */
bool fr__st_shape_bytes(const int64_t *shape, int ndim, size_t esize, uint64_t *nbytes);

#endif
