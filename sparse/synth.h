/*
 * synth.h - the synthetic click stream (synth.c; docs/design.md "Sparse
 * models"): Criteo-layout lines drawn from a planted factorization
 * machine, with drift, and the Bayes-optimal logloss of what it drew. The
 * stream of freshet produce --synthetic ctr, of the tests and of the
 * benchmarks; the model itself (sparse.h) does not use it.
 *
 * Threads: a generator belongs to one thread.
 */
#ifndef FRESHET_SPARSE_SYNTH_H
#define FRESHET_SPARSE_SYNTH_H

#include <stddef.h>
#include <stdint.h>

typedef struct sparse_synth sparse_synth_t;

/*
 * A generator of Criteo-layout lines from a planted FM over 26
 * categorical fields (Zipf-distributed vocabularies from 10 to 10^6
 * values, planted linear weights and 4-dim embeddings, a bias set for a
 * click rate of about 3%) and 13 integer columns that carry no signal.
 * drift > 0 turns the planted weights by drift radians per window of
 * window records and, with probability drift per field and window, makes
 * other values of the field the frequent ones. Same seed, same stream.
 */
sparse_synth_t *sparse_synth_new(uint64_t seed, double drift, size_t window, char *errstr,
                                 size_t size);
void sparse_synth_destroy(sparse_synth_t *g);

/* Writes the next record (no newline) into buf[size] (512 bytes
 * suffice); its length. *p (may be NULL) receives its planted click
 * probability. */
size_t sparse_synth_next(sparse_synth_t *g, char *buf, size_t size, double *p);

/* The Bayes-optimal logloss of the records so far in the current window
 * (the mean binary entropy of their planted probabilities), the index of
 * that window, and the mean of the finished windows. */
typedef struct sparse_synth_floor {
    int64_t window;
    double current; /* this window so far               */
    double last;    /* the last finished window, or NAN */
    double overall; /* every record so far              */
    double ctr;     /* the clicks so far over the records */
} sparse_synth_floor_t;
void sparse_synth_floor(const sparse_synth_t *g, sparse_synth_floor_t *f);

#endif /* FRESHET_SPARSE_SYNTH_H */
