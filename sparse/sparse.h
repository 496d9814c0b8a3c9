/*
 * sparse.h - sparse models (docs/design.md "Sparse models"): categorical
 * values hashed to the rows of a 2^B table, each row a linear weight and
 * a D-dim embedding; hashed logistic regression (D = 0) and factorization
 * machines (Rendle 2010) scored in O(F * D); per-row Adagrad and
 * FTRL-Proximal (McMahan et al. 2013); the Criteo, libsvm and binary
 * record layouts, and a sample packed into a batch row. Beside it:
 * progressive validation (prog.h) and the synthetic click stream
 * (synth.h). sparse/ includes only common/.
 *
 * Everything here is plain computation on caller-owned memory: no I/O,
 * no threads, no globals. A batch belongs to one thread.
 */
#ifndef FRESHET_SPARSE_H
#define FRESHET_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define SPARSE_FIELDS_MAX  64   /* features of one record, at most         */
#define SPARSE_DIM_MAX     64   /* embedding width D, at most               */
#define SPARSE_BITS_MIN    4    /* a table of 2^4 rows, at least            */
#define SPARSE_BITS_MAX    30   /* 2^30 rows, at most (rows fit a uint32_t) */
#define SPARSE_VALUE_MAX   1e9  /* a feature value's magnitude, at most      */
#define SPARSE_TOWER_MAX   4    /* hidden layers of the dense tower, at most */
#define SPARSE_TOWER_WIDTH 1024 /* a hidden layer's width, at most          */
#define SPARSE_TOWER_PARAMS                                                                        \
    (1 << 20)                    /* the tower's parameters, at most: its                           \
                                    gradient rides with every batch */
#define SPARSE_CLASSES_MAX   256 /* classes of a softmax model, at most        */
#define SPARSE_CRITEO_INTS   13
#define SPARSE_CRITEO_CATS   26
#define SPARSE_CRITEO_FIELDS (SPARSE_CRITEO_INTS + SPARSE_CRITEO_CATS)

/* ------------------------------------------------------------------------
 * The model's shape: [model] sparse = fields:F,buckets:2^B,dim:D[,tower:H-H][,classes:C]
 * ---------------------------------------------------------------------- */

typedef struct sparse_spec {
    int fields; /* F: features of one record, at most                  */
    int bits;   /* B: the table has 2^B rows                            */
    int dim;    /* D: embedding width; 0 is hashed logistic regression  */
    int ntower; /* hidden layers of the dense tower; 0: none            */
    /* their widths, from the embeddings up */
    int tower[SPARSE_TOWER_MAX];
    int classes; /* C: a softmax over C classes; 0: one logistic output */
} sparse_spec_t;

/* Parses "fields:F,buckets:2^B,dim:D" (buckets also as a power of two
 * written out, "buckets:4194304"; dim defaults to 0), with optionally
 * ",tower:H1-H2..." (1 to SPARSE_TOWER_MAX hidden widths of 1 to
 * SPARSE_TOWER_WIDTH, SPARSE_TOWER_PARAMS parameters at most; dim 1 or
 * more) and ",classes:C" (a softmax over 2
 * to SPARSE_CLASSES_MAX classes; with dim 1 or more it needs a tower:
 * the FM's pairwise term is the same for every class, and a softmax
 * cancels it). FR_ERR_INVAL with errstr on anything else. */
fr_err_t sparse_spec_parse(const char *text, sparse_spec_t *spec, char *errstr, size_t size);

/* Writes the canonical text of spec ("fields:39,buckets:2^22,dim:8", then
 * ",tower:64-32" and ",classes:C" when it has them); snprintf's return. */
int sparse_spec_format(const sparse_spec_t *spec, char *buf, size_t size);

/* The model's outputs K: its classes under softmax, else 1. */
static inline int sparse_outputs(const sparse_spec_t *spec)
{
    return spec->classes > 0 ? spec->classes : 1;
}

/* Floats per row of parameters: the linear weights (one an output), then
 * the embedding. */
static inline size_t sparse_row_len(const sparse_spec_t *spec)
{
    return (size_t)sparse_outputs(spec) + (size_t)spec->dim;
}

/*
 * The dense part of a sparse model (docs/design.md "The dense tower"):
 * the bias (one an output), then the tower's parameters, layer after
 * layer, each its weights W[in][out] (input-major) then its biases b[out].
 * The first layer's input is the fields' embeddings, F * D floats (field
 * f's slot the sum of the embeddings of its features times their values,
 * a field beyond F folded onto f % F); the hidden layers are ReLU; the
 * last layer has one output per class (1 under the logistic loss), added
 * to the scores.
 */

/* The tower's parameters (0 without a tower). */
size_t sparse_tower_len(const sparse_spec_t *spec);

/* Floats of the dense part: the biases, then sparse_tower_len. */
static inline size_t sparse_dense_len(const sparse_spec_t *spec)
{
    return (size_t)sparse_outputs(spec) + sparse_tower_len(spec);
}

/* The initial dense part into dense[sparse_dense_len]: biases 0, each
 * layer's weights uniform on +-sqrt(6 / (in + out)) (Glorot) from seed
 * alone, biases 0. */
void sparse_dense_init(const sparse_spec_t *spec, uint64_t seed, float *dense);

/* splitmix64's output function: a good 64-bit mix of x (the seeded
 * streams of initial values and of the synthetic stream). */
uint64_t sparse_mix64(uint64_t x);

/* The row of value[len] of field (xxHash64 seeded by the field), in
 * [0, 2^bits). */
uint32_t sparse_hash(int field, const void *value, size_t len, int bits);

/* A categorical value's 64-bit id: xxHash64 of its text, seed 0. Records
 * carry either the text (Criteo, libsvm) or the id (the binary record). */
uint64_t sparse_value_id(const void *text, size_t len);

/* The row of id in field: sparse_hash of the id's 8 bytes little-endian.
 * Every layout maps a value to its row this way, so a value gives the same
 * row whichever layout carried it. */
uint32_t sparse_id_row(int field, uint64_t id, int bits);

/* ------------------------------------------------------------------------
 * Samples and batches
 * ---------------------------------------------------------------------- */

/* One record: n features, each a row, a value (1 for a categorical) and
 * the field it came from (the tower's input slot). */
typedef struct sparse_sample {
    float label; /* 0 or 1; under softmax the class, 0 .. C - 1 */
    int n;
    uint32_t row[SPARSE_FIELDS_MAX];
    float val[SPARSE_FIELDS_MAX];
    uint8_t field[SPARSE_FIELDS_MAX];
    float planted; /* the synthetic stream's click probability of the record (its
                      Kafka header freshet-p), NAN when it carries none */
} sparse_sample_t;

/*
 * A batch of samples with its distinct rows: what a worker pulls and
 * pushes. rows[nrows] in first-seen order; slot[i * SPARSE_FIELDS_MAX + k]
 * is the index in rows of sample i's feature k.
 */
typedef struct sparse_batch {
    size_t n, cap;
    sparse_sample_t *samples; /* [cap] */
    uint32_t *rows;           /* [nrows] distinct */
    size_t nrows;
    uint32_t *slot; /* [cap * SPARSE_FIELDS_MAX] */
    /* the dedup table: open addressing over row + 1 (0: empty) */
    uint32_t *table, *table_idx;
    size_t table_cap;
} sparse_batch_t;

/* A batch of up to cap samples; NULL out of memory. */
sparse_batch_t *sparse_batch_new(size_t cap);
void sparse_batch_destroy(sparse_batch_t *b);

/* Empties the batch (keeps its memory). */
void sparse_batch_clear(sparse_batch_t *b);

/* Appends a copy of s and indexes its rows. FR_ERR_RANGE when full,
 * FR_ERR_INVAL when s has more than SPARSE_FIELDS_MAX features. */
fr_err_t sparse_batch_add(sparse_batch_t *b, const sparse_sample_t *s);

/* ------------------------------------------------------------------------
 * Scores and gradients
 * ---------------------------------------------------------------------- */

/*
 * The logistic loss of each sample of b under the rows' parameters
 * params[nrows][sparse_row_len] (in b->rows order) and the dense part
 * dense[sparse_dense_len] (the biases, then the tower), and its gradient:
 * grad[nrows][sparse_row_len] and gdense[sparse_dense_len] receive the
 * sums over the batch (zeroed first). score = bias + sum_i w_i x_i +
 * sum_{i<j} <v_i, v_j> x_i x_j + tower(embeddings), the pairwise term in
 * O(n * D). Under softmax (spec->classes = C) the loss is -log p_y of
 * the scores s_c = bias_c + sum_i w_ic x_i + tower_c(embeddings). p[n]
 * (may be NULL) receives each sample's predicted probability (of a click;
 * under softmax, of its own class), computed before any update: the
 * progressive validation of docs/design.md. Returns the summed loss.
 */
double sparse_fm_grad(const sparse_spec_t *spec, const sparse_batch_t *b, const float *params,
                      const float *dense, float *grad, float *gdense, float *p);

/* The scores of one sample by the O(n^2 * D) definition, in double,
 * with its features' parameters given per feature:
 * params[n][sparse_row_len], and the dense part dense[sparse_dense_len]
 * (the biases first), into score[sparse_outputs]; returns score[0]. The
 * reference sparse_fm_grad is tested against. */
double sparse_fm_reference(const sparse_spec_t *spec, const sparse_sample_t *s,
                           const double *params, const double *dense, double *score);

/* The logistic loss of probability p against label y, clamped away from
 * 0 and 1 by 1e-7 as scikit-learn's log_loss does. */
double sparse_logloss(double p, double y);

/* ------------------------------------------------------------------------
 * Per-row optimizers
 * ---------------------------------------------------------------------- */

typedef enum sparse_optim_kind {
    SPARSE_OPTIM_ADAGRAD, /* every coordinate: torch.optim.Adagrad             */
    SPARSE_OPTIM_FTRL,    /* linear weights and bias: FTRL-Proximal; embeddings: Adagrad */
} sparse_optim_kind_t;

typedef struct sparse_optim {
    sparse_optim_kind_t kind;
    float lr;       /* Adagrad's learning rate (embeddings under FTRL too) */
    float alpha;    /* FTRL: per-coordinate rate alpha / (beta + sqrt(n)) */
    float beta;     /* FTRL                                               */
    float l1, l2;   /* FTRL: regularization of the linear weights         */
    float init_std; /* embeddings start uniform with this standard deviation */
    uint64_t seed;  /* of the embeddings' initial values                  */
} sparse_optim_t;

/* Fills o with the defaults of kind: lr 0.02, alpha 0.1, beta 1, l1 0,
 * l2 0, init_std 0.01, seed 0 (bench/README.md "Sparse models": the best
 * of a small grid on the synthetic stream). */
void sparse_optim_defaults(sparse_optim_t *o, sparse_optim_kind_t kind);

/* Parses "adagrad" or "ftrl". */
fr_err_t sparse_optim_parse(const char *name, sparse_optim_kind_t *kind);
const char *sparse_optim_name(sparse_optim_kind_t kind);

/* Floats of optimizer state per row, K = sparse_outputs: Adagrad K + D
 * (the squared sums); FTRL 2K + D (z and n of each linear weight, then
 * the embedding's sums). */
size_t sparse_state_len(const sparse_spec_t *spec, const sparse_optim_t *o);

/* A row never written: linear weights 0, embedding from (seed, row)
 * alone, state 0. Any process computes the same value. */
void sparse_row_init(const sparse_spec_t *spec, const sparse_optim_t *o, uint32_t row, float *param,
                     float *state);

/* One step of row (param[sparse_row_len], state[sparse_state_len]) on
 * grad[sparse_row_len].
 * A coordinate whose gradient is not finite, or whose state would
 * overflow, is left unchanged. */
void sparse_row_step(const sparse_spec_t *spec, const sparse_optim_t *o, float *param, float *state,
                     const float *grad);

/* One step of the bias (its state: 2 floats) on gradient g; FTRL without
 * regularization, Adagrad as for a row. */
void sparse_bias_step(const sparse_optim_t *o, float *bias, float *state, float g);

/* Floats of the dense part's state: 2 a bias, then one per tower
 * parameter (Adagrad's squared sums). */
static inline size_t sparse_dense_state_len(const sparse_spec_t *spec)
{
    return 2 * (size_t)sparse_outputs(spec) + sparse_tower_len(spec);
}

/* One step of the dense part dense[sparse_dense_len] (state
 * [sparse_dense_state_len]) on gdense: each bias by sparse_bias_step, the
 * tower by Adagrad at o->lr, a coordinate whose gradient is not finite
 * left unchanged. */
void sparse_dense_step(const sparse_spec_t *spec, const sparse_optim_t *o, float *dense,
                       float *state, const float *gdense);

/* ------------------------------------------------------------------------
 * Record layouts. Each returns FR_OK with *s filled, or FR_ERR_PARSE with
 * *reason a short static word ("columns", "label", "integer", "index",
 * "value", "features"): the record is rejected and counted.
 * ---------------------------------------------------------------------- */

/* A record before hashing: label and n (field, id) pairs, each of value
 * 1 (categorical). */
typedef struct sparse_ids {
    float label;
    int n;
    uint8_t field[SPARSE_FIELDS_MAX];
    uint64_t id[SPARSE_FIELDS_MAX];
} sparse_ids_t;

/* The binary record (for throughput: no text to scan): byte 0 the label
 * (0 or 1; under softmax the class, 0 .. C - 1), byte 1 the count n (0..64), then n times the field
 * (1 byte) and the value's id (8 bytes, little-endian): 2 + 9n bytes. In files, each record follows
 * its length as 4 bytes little-endian. */
#define SPARSE_BINARY_MAX (2 + 9 * SPARSE_FIELDS_MAX)

/* Writes r as a binary record into out[cap]; its length, or 0 when cap is
 * too small or r does not fit the layout. */
size_t sparse_encode_binary(const sparse_ids_t *r, uint8_t *out, size_t cap);

/* A binary record: reasons "length", "label", "features" (more than
 * spec->fields), "field" (a field of 64 or more). */
fr_err_t sparse_parse_binary(const sparse_spec_t *spec, const uint8_t *rec, size_t len,
                             sparse_sample_t *s, const char **reason);

/* A Criteo line's ids (what sparse_parse_criteo hashes into rows). */
fr_err_t sparse_criteo_ids(const char *line, size_t len, sparse_ids_t *r, const char **reason);

/* A Criteo display-ads line: label, 13 integer features, 26 categorical
 * hex strings, tab-separated; empty fields allowed (the feature is
 * absent). Integers are bucketed (v > 2: 3 + floor(ln(v)^2)), the bucket
 * being the id, as field k; categoricals as field 13 + k, by
 * sparse_value_id of their text. Needs spec->fields >= 39. A
 * trailing newline is ignored. */
fr_err_t sparse_parse_criteo(const sparse_spec_t *spec, const char *line, size_t len,
                             sparse_sample_t *s, const char **reason);

/* A libsvm line: "label index:value ..." with any index text (hashed,
 * field 0); label 0/1 or -1/+1 (under softmax an integer 0 .. C - 1);
 * values within +-SPARSE_VALUE_MAX. At most spec->fields features. */
fr_err_t sparse_parse_libsvm(const sparse_spec_t *spec, const char *line, size_t len,
                             sparse_sample_t *s, const char **reason);

/* The layouts by name: "criteo", "libsvm", "binary". */
typedef enum sparse_layout {
    SPARSE_LAYOUT_CRITEO = 0,
    SPARSE_LAYOUT_LIBSVM = 1,
    SPARSE_LAYOUT_BINARY = 2,
} sparse_layout_t;

/* FR_ERR_INVAL for a name that is none of them. */
fr_err_t sparse_layout_parse(const char *name, sparse_layout_t *layout);

/* A record of layout: sparse_parse_criteo, _libsvm or _binary. */
fr_err_t sparse_parse_record(const sparse_spec_t *spec, sparse_layout_t layout, const void *rec,
                             size_t len, sparse_sample_t *s, const char **reason);

/* ------------------------------------------------------------------------
 * Sparse records through ingest's batcher (stream.c; the decode hook is
 * trainer/schema_sparse.h's): a sample packed into one float row of
 * 2 + 3F floats, [n, row_1..row_F, val_1..val_F, field_1..field_F,
 * planted], each row's 32 bits held as they are in a float slot (the
 * batcher only moves rows). SPARSE_PACKED(F) is the batcher schema's
 * feature count; SPARSE_PLANTED_SLOT(F) the slot the batcher fills from a
 * record's freshet-p header (ingest_schema_t.aux).
 * ---------------------------------------------------------------------- */
#define SPARSE_PACKED(fields)       (2 + 3 * (fields))
#define SPARSE_PLANTED_SLOT(fields) (1 + 3 * (fields))

/* Packs s (at most fields features) into x[SPARSE_PACKED(fields)]. */
void sparse_pack(const sparse_sample_t *s, int fields, float *x);

/* Unpacks x into *s with label; FR_ERR_PARSE when x holds no packed sample
 * of at most fields features and rows below 2^bits. */
fr_err_t sparse_unpack(const float *x, int fields, int bits, float label, sparse_sample_t *s);

#endif /* FRESHET_SPARSE_H */
