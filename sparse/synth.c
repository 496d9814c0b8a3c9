/*
 * synth.c - the synthetic click stream (docs/design.md "Sparse models"):
 * Criteo-layout records drawn from a planted factorization machine, so
 * that the best any learner can do (the Bayes-optimal logloss, the mean
 * binary entropy of the planted probabilities) is known per window.
 *
 * The planted parameters of value id of field f are normals computed from
 * (seed, f, id) alone, so a vocabulary of a million values costs no
 * memory. Field f has 10 * 10^(5f/25) values (10 to 10^6), drawn with a
 * Zipf law of exponent ZIPF_S. The linear weights have sd SIGMA_W and the
 * 4-dim embeddings sd SIGMA_V, scaled down for rare values (by
 * 1/sqrt(1 + rank / RANK_SCALE), its square root for the embeddings): as
 * in real click logs, the frequent values carry most of what can be
 * learned, and a value seen twice in ten million records little of it.
 * The bias is set by bisection for a click rate of BASE_CTR.
 *
 * Drift: each planted parameter is cos(t) a + sin(t) b of two independent
 * normals, t advancing by drift radians per window (a rotation that keeps
 * the parameters' spread, back where it started after 2 pi / drift
 * windows); and at each window each field, with probability
 * drift, maps its Zipf ranks to other values (new values become hot).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparse/sparse.h"
#include "sparse/synth.h"

#define FIELDS    SPARSE_CRITEO_CATS
#define PLANT_DIM 4
#define ZIPF_S    1.1
#define SIGMA_W   0.2
#define SIGMA_V   0.1667
#define BASE_CTR  0.03
#define CALIBRATE 20000
#define RANK_SCALE                                                                                 \
    100.0 /* parameters shrink as 1/sqrt(1 + rank / RANK_SCALE) */ /* records drawn to set the     \
                                                                      bias */

struct sparse_synth {
    uint64_t seed, rng;
    double drift;
    size_t window;
    double bias;
    double vocab[FIELDS];   /* values of each field                  */
    uint64_t shift[FIELDS]; /* rank -> value offset (hot values move) */
    int64_t records, clicks;
    int64_t win; /* the current window's index            */
    double win_sum, last, all_sum;
    int64_t win_n;
};

/* A uniform in (0, 1) from h. */
static double unit(uint64_t h)
{
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double next_unit(sparse_synth_t *g)
{
    g->rng = sparse_mix64(g->rng);
    return unit(g->rng);
}

/* A standard normal from key (Box-Muller on two hashes of it). */
static double normal(uint64_t key)
{
    uint64_t a = sparse_mix64(key), b = sparse_mix64(a ^ 0x5851F42D4C957F2Dull);
    return sqrt(-2.0 * log(unit(a))) * cos(6.283185307179586 * unit(b));
}

/* Planted parameter j (0: linear, 1..PLANT_DIM: embedding) of value id of
 * field f at angle t. */
static double planted(const sparse_synth_t *g, int f, uint64_t id, int j, double t)
{
    uint64_t key = g->seed ^ ((uint64_t)f << 56) ^ (id << 8) ^ (uint64_t)j;
    double a = normal(key);
    if (t == 0)
        return a;
    return cos(t) * a + sin(t) * normal(key ^ 0xA5A5A5A5A5A5A5A5ull);
}

/* A Zipf(ZIPF_S) rank in [0, V), continuous inversion. */
static uint64_t zipf_rank(double u, double V)
{
    const double a = 1.0 - ZIPF_S;
    double x = pow((pow(V + 1, a) - 1) * u + 1, 1 / a);
    uint64_t r = (uint64_t)x - 1;
    return r >= (uint64_t)V ? (uint64_t)V - 1 : r;
}

/* Draws one record's values ids[FIELDS] and returns its score without the
 * bias. */
static double draw(sparse_synth_t *g, uint64_t *ids)
{
    double t = g->drift * (double)g->win;
    double lin = 0, sum[PLANT_DIM] = {0}, sq = 0;
    for (int f = 0; f < FIELDS; f++) {
        uint64_t V = (uint64_t)g->vocab[f];
        uint64_t rank = zipf_rank(next_unit(g), g->vocab[f]);
        ids[f] = (rank + g->shift[f]) % V;
        double scale = 1.0 / sqrt(1.0 + (double)rank / RANK_SCALE);
        lin += SIGMA_W * scale * planted(g, f, ids[f], 0, t);
        for (int d = 0; d < PLANT_DIM; d++) {
            double v = SIGMA_V * sqrt(scale) * planted(g, f, ids[f], 1 + d, t);
            sum[d] += v;
            sq += v * v;
        }
    }
    double pair = 0;
    for (int d = 0; d < PLANT_DIM; d++)
        pair += sum[d] * sum[d];
    return lin + 0.5 * (pair - sq);
}

static double sigmoid(double s)
{
    return 1.0 / (1.0 + exp(-s));
}

/* Sets the bias so that the mean planted probability is BASE_CTR. */
static void calibrate(sparse_synth_t *g)
{
    double *score = malloc(CALIBRATE * sizeof(*score));
    uint64_t ids[FIELDS];
    uint64_t saved = g->rng;
    g->rng = sparse_mix64(g->seed ^ 0xCA11B4A7Eull);
    if (score == NULL) { /* a fixed guess: about right for these spreads */
        g->bias = log(BASE_CTR / (1 - BASE_CTR)) - 1.0;
        g->rng = saved;
        return;
    }
    for (int i = 0; i < CALIBRATE; i++)
        score[i] = draw(g, ids);
    double lo = -20, hi = 5;
    for (int it = 0; it < 60; it++) {
        double mid = 0.5 * (lo + hi), mean = 0;
        for (int i = 0; i < CALIBRATE; i++)
            mean += sigmoid(score[i] + mid);
        if (mean / CALIBRATE > BASE_CTR)
            hi = mid;
        else
            lo = mid;
    }
    g->bias = 0.5 * (lo + hi);
    g->rng = saved;
    free(score);
}

sparse_synth_t *sparse_synth_new(uint64_t seed, double drift, size_t window, char *errstr,
                                 size_t size)
{
    if (!(drift >= 0 && drift <= 1) || window == 0) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "synthetic ctr: drift must be 0..1 and the window at least 1 record");
        return NULL;
    }
    sparse_synth_t *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "synthetic ctr: out of memory");
        return NULL;
    }
    g->seed = sparse_mix64(seed);
    g->rng = sparse_mix64(g->seed ^ 0x5EED);
    g->drift = drift;
    g->window = window;
    g->last = NAN;
    for (int f = 0; f < FIELDS; f++)
        g->vocab[f] = round(10.0 * pow(10.0, 5.0 * f / (FIELDS - 1)));
    calibrate(g);
    return g;
}

void sparse_synth_destroy(sparse_synth_t *g)
{
    free(g);
}

/* The binary entropy of p, in nats. */
static double entropy(double p)
{
    return p <= 0 || p >= 1 ? 0 : -(p * log(p) + (1 - p) * log1p(-p));
}

/* Closes the window when the record count reached its end. */
static void window_roll(sparse_synth_t *g)
{
    if (g->win_n < (int64_t)g->window)
        return;
    g->last = g->win_sum / (double)g->win_n;
    g->win++;
    g->win_sum = 0;
    g->win_n = 0;
    for (int f = 0; f < FIELDS && g->drift > 0; f++)
        if (next_unit(g) < g->drift)
            g->shift[f] = sparse_mix64(g->rng ^ (uint64_t)f) % (uint64_t)g->vocab[f];
}

size_t sparse_synth_next(sparse_synth_t *g, char *buf, size_t size, double *p)
{
    uint64_t ids[FIELDS];
    window_roll(g);
    double prob = sigmoid(g->bias + draw(g, ids));
    int click = next_unit(g) < prob;
    size_t n = 0;
    int w = snprintf(buf, size, "%d", click);
    n = w > 0 ? (size_t)w : 0;
    for (int k = 0; k < SPARSE_CRITEO_INTS && n < size; k++) {
        double u = next_unit(g);
        w = u < 0.2 ? snprintf(buf + n, size - n, "\t") /* missing */
                    : snprintf(buf + n, size - n, "\t%lld",
                               (long long)floor(exp(next_unit(g) * 6.0)) - 1);
        n += w > 0 ? (size_t)w : 0;
    }
    for (int f = 0; f < FIELDS && n < size; f++) {
        uint32_t h = (uint32_t)sparse_mix64(g->seed ^ 0xC0FFEEull ^ ((uint64_t)f << 48) ^ ids[f]);
        w = snprintf(buf + n, size - n, "\t%08x", h);
        n += w > 0 ? (size_t)w : 0;
    }
    if (n >= size)
        n = size > 0 ? size - 1 : 0;
    g->records++;
    g->clicks += click;
    double h = entropy(prob);
    g->win_sum += h;
    g->all_sum += h;
    g->win_n++;
    if (p != NULL)
        *p = prob;
    return n;
}

void sparse_synth_floor(const sparse_synth_t *g, sparse_synth_floor_t *f)
{
    f->window = g->win;
    f->current = g->win_n > 0 ? g->win_sum / (double)g->win_n : NAN;
    f->last = g->last;
    f->overall = g->records > 0 ? g->all_sum / (double)g->records : NAN;
    f->ctr = g->records > 0 ? (double)g->clicks / (double)g->records : NAN;
}
