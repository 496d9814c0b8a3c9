/*
 * common_int.h - private declarations shared by common's sources: the
 * pieces of the safetensors format that its reader (safetensors.c), the
 * reader's header parser (safetensors_header.c) and its writer
 * (safetensors_write.c) share. Every function is reentrant.
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

/* One tensor while parsing and in the result. */
typedef struct fr_st_entry {
    fr_st_tensor_t t;
    uint64_t begin, end; /* data_offsets */
    size_t esize;        /* bytes per element of t.dtype */
    size_t order;        /* position in the header: breaks ties between empty tensors */
} fr_st_entry_t;

/* Where a number is in the header text. */
typedef struct fr_st_span {
    size_t at, len;
} fr_st_span_t;

/* The reader's state while it parses one image: the header text, and what
 * the header parser found in it. */
typedef struct fr_st_parser {
    fr_st_errctx_t ec;
    const char *h;      /* the header text */
    size_t n;           /* its length */
    void *root;         /* its json_t tree */
    fr_st_span_t *nums; /* every number of the text, in order */
    size_t nnums, capnums;
    size_t next_num; /* the next number of the tree walk */
    fr_st_entry_t *ents;
    size_t nents, capents;
    fr_st_kv_t *meta;
    size_t nmeta, capmeta;
} fr_st_parser_t;

/* Parses the header p->h[0..p->n) (safetensors_header.c): one object of
 * tensors and "__metadata__", then only white space (the padding) to its
 * end. Appends each tensor, its size checked against its shape and dtype,
 * to p->ents in header order, and each metadata pair to p->meta; the
 * layout is the caller's to check. The tree, which the names and metadata
 * point into, is left in p->root, also on error: the caller frees it with
 * fr__st_header_free. FR_ERR_UNSUPPORTED in a build without libjansson. */
fr_err_t fr__st_header_parse(fr_st_parser_t *p);
/* Frees a header's tree (p->root); NULL is a no-op. */
void fr__st_header_free(void *root);

#endif
