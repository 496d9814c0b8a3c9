/*
 * rows_sparse.h - a sparse model's rows in the store (rows_sparse.c;
 * docs/design.md "Sparse models"): the packed gradient of a batch, a
 * worker's pull of its rows, the shards' rows, the rows' change stream and
 * scans for serve.
 *
 * Threads: each call uses the connection it is given, which belongs to
 * one thread.
 */
#ifndef FRESHET_PSSTORE_ROWS_SPARSE_H
#define FRESHET_PSSTORE_ROWS_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "psstore/store/store.h"
#include "sparse/sparse.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Sparse models (rows_sparse.c, applier_sparse.c; docs/design.md "Sparse models").
 * Rows live in the hash freshet:{m}:rows (field: the row as 4 bytes
 * little-endian; value: its 1 + D parameters, then its optimizer state,
 * float32 LE: one field a row to read and write); a row never written
 * reads as sparse_row_init's value. The dense part (the bias, then the
 * tower's parameters: sparse_dense_len floats) is the model's w:0, its
 * state opt:0. A gradient (psstore_grad_t.g) packs the m rows of a batch,
 * their gradients and the dense part's: [row bits x m, grad (K + D) x m,
 * dense], m (1 + K + D) + ndense floats (K = sparse_outputs), the rows'
 * 32 bits held as they are.
 * ---------------------------------------------------------------------- */

/* The floats of a packed gradient of m rows of rowlen floats
 * (sparse_row_len) and a dense part of ndense floats. */
static inline size_t psstore_sparse_grad_len(size_t m, size_t rowlen, size_t ndense)
{
    return m * (1 + rowlen) + ndense;
}

/* Packs rows[m], their gradients grads[m][rowlen] and the dense part's
 * gdense[ndense] into out[psstore_sparse_grad_len(m, rowlen, ndense)]. */
void psstore_sparse_pack(const uint32_t *rows, size_t m, const float *grads, size_t rowlen,
                         const float *gdense, size_t ndense, float *out);

/*
 * A worker's pull, in one transaction: the parameters of rows[n] (each
 * sparse_row_len floats, the stored value's first: spec and optim give its
 * size) into params[n][1 + D], found[i] = 1 where the store has row i
 * (absent rows are left as they were: the caller fills them with
 * sparse_row_init), the biases into bias[sparse_outputs] (past shard 0:
 * its one float, then zeros), the tower's parameters into
 * tower[sparse_tower_len] (may be NULL: not read; when given, the shard's
 * w:0 must be shard 0's whole dense part), and the epoch and version they
 * are. FR_ERR_NOTFOUND for a model that does not exist,
 * FR_ERR_PARSE for a row or a dense part of another size.
 */
fr_err_t psstore_rows_pull(psstore_conn_t *c, const char *model, const sparse_spec_t *spec,
                           const sparse_optim_t *optim, const uint32_t *rows, size_t n,
                           float *params, uint8_t *found, float *bias, float *tower,
                           uint64_t *epoch, int64_t *version);

/*
 * A sparse model of S shards (docs/design.md "Sparse models on shards"):
 * shard k holds the rows r with r % S == k, under its own tag, with its own
 * applier; shard 0's w:0 is the dense part. psstore_rows_pull in two halves
 * for shard k of S, so that the shards' transactions, each on the
 * connection of its node, overlap: send queues it (*queued replies to
 * read), recv reads it, with that shard's epoch and version (its bias: one
 * float 0 on shards 1..S-1, which have no tower: pass NULL).
 */
static inline int psstore_sparse_shard(uint32_t row, int S)
{
    return S > 1 ? (int)(row % (uint32_t)S) : 0;
}
/* Groups rows[n] by shard of S, keeping their order within a shard (a
 * counting sort): shard k's are sorted[off[k] .. off[k + 1]), and
 * sorted[j] = rows[order[j]]. off has S + 1 entries. */
void psstore_sparse_group(const uint32_t *rows, size_t n, int S, uint32_t *order, uint32_t *sorted,
                          size_t *off);
fr_err_t psstore_rows_pull_send(psstore_conn_t *c, const char *model, int k, int S,
                                const uint32_t *rows, size_t n, size_t *queued);
fr_err_t psstore_rows_pull_recv(psstore_conn_t *c, const char *model, const sparse_spec_t *spec,
                                const sparse_optim_t *optim, size_t n, size_t queued, float *params,
                                uint8_t *found, float *bias, float *tower, uint64_t *epoch,
                                int64_t *version);

/* Parses meta's `sparse` text ("fields:39,buckets:2^22,dim:8;optimizer:
 * ftrl;seed:42;init_std:0.01") into the table and what gives a row its
 * size and initial value (the optimizer's kind, seed and init_std; its
 * rates keep their defaults). FR_ERR_PARSE with errstr. */
fr_err_t psstore_sparse_meta_parse(const char *text, sparse_spec_t *spec, sparse_optim_t *optim,
                                   char *errstr, size_t size);

/*
 * Reading a sparse model for serving (docs/design.md "Serving sparse
 * models"). Every commit that changes rows adds an entry "<version>-0" to
 * the stream freshet:{m}:changes naming the rows it wrote and those it
 * evicted; entries older than [sparse] delta_seconds are trimmed and
 * meta's delta_floor says from which version the history is whole.
 */
typedef struct psstore_rows_page {
    /* the sums of the shards' epochs and of at[] (the model's at S = 1) */
    uint64_t epoch;
    int64_t version;
    /* each of the S shards' versions: delta: the page covers (since[k],
     * at[k]] on shard k, the next since; scan: when the page was read */
    int shards;
    int64_t at[PSSTORE_SHARDS_MAX];
    /* delta: the oldest since answered, and the store's version when it was
     * read (expired: the expired shard's) */
    int64_t floor, head;
    /* delta: since is older than floor, or newer than the model, or the
     * model was created again, on shard expired_shard: reload the table;
     * nothing else set */
    int expired, expired_shard;
    int more;        /* delta: entries after at[] remain; scan: pages remain */
    int64_t time_ms; /* delta: when the newest commit it holds was written (0: none) */
    int nbias;       /* the table's outputs (sparse_outputs):    */
    float bias[SPARSE_CLASSES_MAX]; /* bias[nbias], shard 0's                   */
    size_t ntower;                  /* the tower's parameters (shard 0's w:0 after the biases), */
    float *tower;                   /* tower[ntower]: sparse_tower_len of the table            */
    size_t n;                       /* rows present, ids[n], params[n][1 + D] */
    uint32_t *ids;
    float *params;
    size_t ngone; /* delta: rows deleted since, gone[ngone] */
    uint32_t *gone;
    size_t cap; /* the buffers, kept from call to call */
    uint8_t *found;
} psstore_rows_page_t;

/*
 * The rows changed or evicted after since[k] on each shard k of S (one
 * version at S = 1), from at most max_entries commits and about max_rows
 * rows a shard (a commit is never split): present rows with their
 * parameters (the latest, which may be newer than page->at), deleted ones
 * in gone. page->more when entries remain. The caller zeroes page before
 * the first call and frees it with psstore_rows_page_fini.
 */
fr_err_t psstore_rows_delta(psstore_conn_t *c, const char *model, int S, const int64_t *since,
                            const sparse_spec_t *spec, const sparse_optim_t *optim,
                            size_t max_entries, size_t max_rows, psstore_rows_page_t *page);
/*
 * One page of the whole table (HSCAN from cursor, about count rows), with
 * the store's epochs, versions and bias at that moment; *next is the cursor
 * of the next page ("0" after the last). A model of S > 1 shards reads
 * shard after shard: its cursors are "k.c" (HSCAN cursor c of shard k;
 * "0" is shard 0's first page). A client reads every page, then follows
 * with psstore_rows_delta since the first page's at[]. FR_ERR_INVAL for a
 * cursor of another shape.
 */
fr_err_t psstore_rows_scan(psstore_conn_t *c, const char *model, int S, const sparse_spec_t *spec,
                           const sparse_optim_t *optim, const char *cursor, size_t count,
                           psstore_rows_page_t *page, char next[48]);
void psstore_rows_page_fini(psstore_rows_page_t *page);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_ROWS_SPARSE_H */
