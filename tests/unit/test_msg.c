/*
 * test_msg.c - unit tests of the gradient messages of the grads stream
 * (psstore/grads/msg.c): encode -> decode round trips and every malformed entry
 * the applier must refuse. No Redis: entries are built in memory, each
 * field name and value in a malloc of exactly its length, so that
 * AddressSanitizer catches a decoder that reads one byte too far.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "psstore/grads/grads_int.h"

#define NPARAMS 5
#define MAXF    32

/* One stream entry: field/value pairs, each in its own exact allocation. */
typedef struct entry {
    size_t n;
    char *f[MAXF], *v[MAXF];
    size_t flen[MAXF], vlen[MAXF];
} entry_t;

/* malloc(len) holding exactly s[len] (at least 1 byte so that malloc(0)
 * is never asked for; the length is what the decoder is given). */
static char *dup_exact(const char *s, size_t len)
{
    char *p = malloc(len ? len : 1);
    assert_non_null(p);
    if (len)
        memcpy(p, s, len);
    return p;
}

static void entry_add(entry_t *e, const char *f, const char *v, size_t vlen)
{
    assert_true(e->n < MAXF);
    e->flen[e->n] = strlen(f);
    e->f[e->n] = dup_exact(f, e->flen[e->n]);
    e->vlen[e->n] = vlen;
    e->v[e->n] = dup_exact(v, vlen);
    e->n++;
}

static int entry_find(const entry_t *e, const char *f)
{
    for (size_t i = 0; i < e->n; i++)
        if (e->flen[i] == strlen(f) && memcmp(e->f[i], f, e->flen[i]) == 0)
            return (int)i;
    return -1;
}

/* Replaces the value of field f (adds it when absent). */
static void entry_set_len(entry_t *e, const char *f, const char *v, size_t vlen)
{
    int i = entry_find(e, f);
    if (i < 0) {
        entry_add(e, f, v, vlen);
        return;
    }
    free(e->v[i]);
    e->v[i] = dup_exact(v, vlen);
    e->vlen[i] = vlen;
}

static void entry_set(entry_t *e, const char *f, const char *v)
{
    entry_set_len(e, f, v, strlen(v));
}

static void entry_del(entry_t *e, const char *f)
{
    int i = entry_find(e, f);
    assert_true(i >= 0);
    free(e->f[i]);
    free(e->v[i]);
    for (size_t k = (size_t)i + 1; k < e->n; k++) {
        e->f[k - 1] = e->f[k];
        e->v[k - 1] = e->v[k];
        e->flen[k - 1] = e->flen[k];
        e->vlen[k - 1] = e->vlen[k];
    }
    e->n--;
}

static void entry_free(entry_t *e)
{
    for (size_t i = 0; i < e->n; i++) {
        free(e->f[i]);
        free(e->v[i]);
    }
    e->n = 0;
}

/* The field/value pairs of an encoded XADD (argv[3..]) as an entry. */
static void entry_from_args(entry_t *e, const ps_grad_args_t *args)
{
    memset(e, 0, sizeof(*e));
    assert_true(args->argc >= 3 && (args->argc - 3) % 2 == 0);
    for (int i = 3; i < args->argc; i += 2) {
        char name[32];
        assert_true(args->lens[i] < sizeof(name));
        memcpy(name, args->argv[i], args->lens[i]);
        name[args->lens[i]] = '\0';
        entry_add(e, name, args->argv[i + 1], args->lens[i + 1]);
    }
}

static fr_err_t decode(ps_grad_msg_t *m, const entry_t *e, size_t nparams, char *why,
                       size_t whysize)
{
    return ps_grad_decode(m, e->n, (const char *const *)e->f, e->flen, (const char *const *)e->v,
                          e->vlen, nparams, why, whysize);
}

/* Decoding e must fail with a reason containing want. */
static void expect_bad_at(const entry_t *e, size_t nparams, const char *want, int line)
{
    ps_grad_msg_t m = {0};
    char why[256] = "";
    fr_err_t err = decode(&m, e, nparams, why, sizeof(why));
    if (err != FR_ERR_PARSE)
        fail_msg("line %d: decode returned %d, expected FR_ERR_PARSE (%s)", line, err, want);
    if (strstr(why, want) == NULL)
        fail_msg("line %d: why '%s' does not contain '%s'", line, why, want);
    assert_null(m.g.ranges);
    assert_int_equal(m.g.nranges, 0);
    ps_grad_msg_fini(&m);
}
#define expect_bad(e, want) expect_bad_at((e), NPARAMS, (want), __LINE__)

/* Decoding e must succeed. */
static void expect_ok_at(const entry_t *e, size_t nparams, int line)
{
    ps_grad_msg_t m = {0};
    char why[256] = "";
    if (decode(&m, e, nparams, why, sizeof(why)) != FR_OK)
        fail_msg("line %d: decode failed: %s", line, why);
    ps_grad_msg_fini(&m);
}
#define expect_ok(e) expect_ok_at((e), NPARAMS, __LINE__)

static const float grad5[NPARAMS] = {1.5f, -2.25f, 0.0f, 1e-38f, -3.4e38f};
static const psstore_range_t ranges3[] = {
    {"events", 0, 100, 164},
    {"events.v2", 7, 5, 9},
    {"t_x-Y", 2147483647, 0, 1},
};

/* A full message with n = 64 samples and three ranges. */
static psstore_grad_t sample_grad(void)
{
    psstore_grad_t g = {
        .epoch = 0xfedcba9876543210ull,
        .version = 41,
        .generation = 3,
        .worker = "host-a/1234/0",
        .n = 64,
        .loss_sum = 123.456789012345,
        .reason = NULL,
        .ranges = ranges3,
        .nranges = 3,
        .g = grad5,
        .len = NPARAMS,
    };
    return g;
}

/* The entry of sample_grad(), encoded by ps_grad_encode. */
static void sample_entry(entry_t *e)
{
    ps_grad_args_t args = {0};
    psstore_grad_t g = sample_grad();
    assert_int_equal(ps_grad_encode(&args, "freshet:{m}:grads", &g), FR_OK);
    entry_from_args(e, &args);
    ps_grad_args_fini(&args);
}

/* An n = 0 entry (positions dropped for a reason). */
static void empty_entry(entry_t *e)
{
    memset(e, 0, sizeof(*e));
    entry_add(e, "epoch", "7", 1);
    entry_add(e, "ver", "0", 1);
    entry_add(e, "gen", "0", 1);
    entry_add(e, "worker", "w", 1);
    entry_add(e, "n", "0", 1);
    entry_add(e, "loss", "0", 1);
    entry_add(e, "reason", "decode", 6);
    entry_add(e, "ranges", "t:0:0:3", 7);
}

static void assert_same_grad(const psstore_grad_t *a, const psstore_grad_t *b)
{
    assert_true(a->epoch == b->epoch);
    assert_true(a->version == b->version);
    assert_true(a->generation == b->generation);
    assert_string_equal(a->worker, b->worker);
    assert_true(a->n == b->n);
    assert_memory_equal(&a->loss_sum, &b->loss_sum, sizeof(double)); /* bit-exact, -0 too */
    if (a->reason == NULL || b->reason == NULL)
        assert_true(a->reason == NULL && b->reason == NULL);
    else
        assert_string_equal(a->reason, b->reason);
    assert_true(a->ts_min_ms == b->ts_min_ms);
    assert_true(a->ts_max_ms == b->ts_max_ms);
    assert_int_equal(a->nranges, b->nranges);
    for (size_t i = 0; i < a->nranges; i++) {
        assert_string_equal(a->ranges[i].topic, b->ranges[i].topic);
        assert_int_equal(a->ranges[i].partition, b->ranges[i].partition);
        assert_true(a->ranges[i].from == b->ranges[i].from);
        assert_true(a->ranges[i].to == b->ranges[i].to);
    }
    assert_int_equal(a->len, b->len);
    if (a->len > 0) {
        float *copy = malloc(a->len * sizeof(float)); /* the payload may be unaligned */
        assert_non_null(copy);
        memcpy(copy, b->g, a->len * sizeof(float));
        assert_memory_equal(a->g, copy, a->len * sizeof(float));
        free(copy);
    }
}

/* ------------------------------------------------------------------------
 * Round trips
 * ---------------------------------------------------------------------- */
static void test_round_trip_keeps_every_field(void **state)
{
    (void)state;
    psstore_grad_t g = sample_grad();
    ps_grad_args_t args = {0};
    assert_int_equal(ps_grad_encode(&args, "freshet:{m}:grads", &g), FR_OK);
    assert_int_equal(args.argc, 3 + 2 * 8); /* no reason */
    assert_memory_equal(args.argv[0], "XADD", 4);
    assert_int_equal(args.lens[1], strlen("freshet:{m}:grads"));
    assert_memory_equal(args.argv[2], "*", 1);
    /* the payload goes by pointer, not copied */
    assert_ptr_equal(args.argv[args.argc - 1], (const char *)grad5);
    assert_int_equal(args.lens[args.argc - 1], sizeof(grad5));

    entry_t e;
    entry_from_args(&e, &args);
    int i = entry_find(&e, "ranges");
    assert_true(i >= 0);
    assert_int_equal(e.vlen[i], strlen("events:0:100:164,events.v2:7:5:9,t_x-Y:2147483647:0:1"));
    assert_memory_equal(e.v[i], "events:0:100:164,events.v2:7:5:9,t_x-Y:2147483647:0:1", e.vlen[i]);

    ps_grad_msg_t m = {0};
    char why[256] = "";
    assert_int_equal(decode(&m, &e, NPARAMS, why, sizeof(why)), FR_OK);
    assert_string_equal(why, "");
    assert_same_grad(&g, &m.g);
    assert_int_equal(m.payload_bytes, sizeof(grad5));
    assert_ptr_equal(m.payload, e.v[entry_find(&e, "g")]);
    ps_grad_msg_fini(&m);
    entry_free(&e);
    ps_grad_args_fini(&args);
    assert_null(args.text);
}

/* A shard's slice carries the whole gradient's norm ("norm"), NaN for a
 * gradient that was not finite; an unsharded one carries none. */
static void test_round_trip_of_a_slice_carries_the_whole_norm(void **state)
{
    (void)state;
    const double norms[] = {0.0, 3.25, 1e-30, 7e300, NAN, INFINITY};
    for (size_t i = 0; i < sizeof(norms) / sizeof(norms[0]); i++) {
        psstore_grad_t g = sample_grad();
        g.norm = norms[i];
        ps_grad_args_t args = {0};
        assert_int_equal(ps_grad_encode(&args, "k", &g), FR_OK);
        entry_t e;
        entry_from_args(&e, &args);
        assert_int_equal(entry_find(&e, "norm") >= 0, norms[i] != 0);
        ps_grad_msg_t m = {0};
        char why[256] = "";
        assert_int_equal(decode(&m, &e, NPARAMS, why, sizeof(why)), FR_OK);
        assert_same_grad(&g, &m.g);
        if (isnan(norms[i]) || isinf(norms[i]))
            assert_true(isnan(m.g.norm)); /* not finite: rejected alike by every shard */
        else
            assert_true(m.g.norm == norms[i]);
        ps_grad_msg_fini(&m);
        entry_free(&e);
        ps_grad_args_fini(&args);
    }
    /* a negative norm is refused by the encoder and the decoder */
    psstore_grad_t g = sample_grad();
    g.norm = -1;
    ps_grad_args_t args = {0};
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    ps_grad_args_fini(&args);
    entry_t e;
    sample_entry(&e);
    entry_add(&e, "norm", "-2", 2);
    expect_bad(&e, "bad norm '-2'");
    entry_set(&e, "norm", "x1");
    expect_bad(&e, "bad norm");
    entry_free(&e);
    empty_entry(&e);
    entry_add(&e, "norm", "1", 1);
    expect_bad(&e, "bad norm");
    entry_free(&e);
}

static void test_round_trip_of_an_empty_batch_with_reason(void **state)
{
    (void)state;
    psstore_range_t r = {"in", 3, 1000, 2000};
    psstore_grad_t g = {.epoch = 1,
                        .version = 5,
                        .generation = 0,
                        .worker = "h/1/2",
                        .n = 0,
                        .loss_sum = 0.0,
                        .reason = "retention",
                        .ranges = &r,
                        .nranges = 1};
    ps_grad_args_t args = {0};
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_OK);
    assert_int_equal(args.argc, 3 + 2 * 8); /* reason, no payload */
    entry_t e;
    entry_from_args(&e, &args);
    assert_true(entry_find(&e, "g") < 0);
    ps_grad_msg_t m = {0};
    char why[256];
    assert_int_equal(decode(&m, &e, NPARAMS, why, sizeof(why)), FR_OK);
    assert_same_grad(&g, &m.g);
    assert_null(m.g.g);
    assert_null(m.payload);
    /* an empty "g" is as good as none */
    entry_set(&e, "g", "");
    assert_int_equal(decode(&m, &e, NPARAMS, why, sizeof(why)), FR_OK);
    assert_string_equal(m.g.reason, "retention");
    assert_int_equal(m.g.len, 0);
    ps_grad_msg_fini(&m);
    entry_free(&e);
    ps_grad_args_fini(&args);
}

static void test_round_trip_of_extreme_values(void **state)
{
    (void)state;
    char worker[256];
    memset(worker, 'w', 255);
    worker[255] = '\0';
    memcpy(worker, "h\xc3\xa9/1/0", 7); /* UTF-8 is fine */
    char topic[250];
    memset(topic, 'T', 249);
    topic[249] = '\0';
    psstore_range_t r[2] = {{topic, 0, INT64_MAX - 1, INT64_MAX}, {topic, 1, 0, INT64_MAX}};
    float one = 1.0f;
    double losses[] = {-0.0, 1e-300, -1.7976931348623157e308, 5e-324, 0.1, 3.0};
    for (size_t k = 0; k < sizeof(losses) / sizeof(losses[0]); k++) {
        psstore_grad_t g = {.epoch = UINT64_MAX,
                            .version = INT64_MAX,
                            .generation = INT64_MIN,
                            .worker = worker,
                            .n = INT64_MAX,
                            .loss_sum = losses[k],
                            .ranges = r,
                            .nranges = 2,
                            .g = &one,
                            .len = 1};
        ps_grad_args_t args = {0};
        assert_int_equal(ps_grad_encode(&args, "k", &g), FR_OK);
        entry_t e;
        entry_from_args(&e, &args);
        ps_grad_msg_t m = {0};
        char why[256];
        if (decode(&m, &e, 1, why, sizeof(why)) != FR_OK)
            fail_msg("loss %g: %s", losses[k], why);
        assert_same_grad(&g, &m.g);
        ps_grad_msg_fini(&m);
        entry_free(&e);
        ps_grad_args_fini(&args);
    }
}

static void test_encode_refuses_inconsistent_messages(void **state)
{
    (void)state;
    ps_grad_args_t args = {0};
    psstore_range_t bad_topic[] = {{"a:b", 0, 0, 1}}, comma[] = {{"a,b", 0, 0, 1}},
                    empty_topic[] = {{"", 0, 0, 1}}, no_topic[] = {{NULL, 0, 0, 1}},
                    flat[] = {{"t", 0, 5, 5}}, back[] = {{"t", 0, 6, 5}},
                    negp[] = {{"t", -1, 0, 1}}, negf[] = {{"t", 0, -1, 1}},
                    overlap[] = {{"t", 0, 0, 10}, {"t", 0, 9, 12}};
    struct {
        const psstore_range_t *r;
        size_t n;
    } rs[] = {{bad_topic, 1}, {comma, 1}, {empty_topic, 1}, {no_topic, 1}, {flat, 1},
              {back, 1},      {negp, 1},  {negf, 1},        {overlap, 2},  {ranges3, 0}};
    for (size_t k = 0; k < sizeof(rs) / sizeof(rs[0]); k++) {
        psstore_grad_t g = sample_grad();
        g.ranges = rs[k].r;
        g.nranges = rs[k].n;
        if (ps_grad_encode(&args, "k", &g) != FR_ERR_INVAL)
            fail_msg("ranges case %zu was accepted", k);
        assert_int_equal(args.argc, 0);
        assert_true(strlen(args.text) > 0); /* the reason */
    }
    psstore_grad_t g = sample_grad();
    g.g = NULL; /* n > 0 without payload */
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g = sample_grad();
    g.len = 0;
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g = sample_grad();
    g.reason = "decode"; /* a reason with samples */
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g = sample_grad();
    g.n = 0; /* no reason, and a payload */
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g.len = 0;
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g.reason = "Bad-Reason";
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g.reason = "decode";
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_OK);
    g = sample_grad();
    g.n = -1;
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g = sample_grad();
    g.loss_sum = NAN;
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g.loss_sum = -INFINITY;
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g = sample_grad();
    const char *workers[] = {NULL, "", "a\nb", "a\x7f"};
    for (size_t k = 0; k < 4; k++) {
        g.worker = workers[k];
        assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    }
    char long_worker[300];
    memset(long_worker, 'w', 256);
    long_worker[256] = '\0';
    g.worker = long_worker;
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_ERR_INVAL);
    g = sample_grad();
    assert_int_equal(ps_grad_encode(&args, NULL, &g), FR_ERR_INVAL);
    assert_int_equal(ps_grad_encode(&args, "k", NULL), FR_ERR_INVAL);
    ps_grad_args_fini(&args);
}

/* ------------------------------------------------------------------------
 * Malformed entries
 * ---------------------------------------------------------------------- */
static void test_decode_refuses_an_unknown_field(void **state)
{
    (void)state;
    entry_t e;
    sample_entry(&e);
    entry_add(&e, "foo", "1", 1);
    expect_bad(&e, "unknown field 'foo'");
    entry_free(&e);
    sample_entry(&e);
    entry_add(&e, "Epoch", "1", 1); /* names are case-sensitive */
    expect_bad(&e, "unknown field 'Epoch'");
    entry_free(&e);
    sample_entry(&e);
    entry_add(&e, "", "1", 1);
    expect_bad(&e, "unknown field ''");
    entry_free(&e);
    sample_entry(&e);
    entry_add(&e, "epoch\n\x01", "1", 1);        /* quoted printably */
    expect_bad(&e, "unknown field 'epoch\?\?'"); /* \? keeps ?? from being a trigraph */
    entry_free(&e);
}

static void test_decode_refuses_a_missing_field(void **state)
{
    (void)state;
    const char *required[] = {"epoch", "ver", "gen", "worker", "n", "loss", "ranges"};
    for (size_t k = 0; k < sizeof(required) / sizeof(required[0]); k++) {
        entry_t e;
        sample_entry(&e);
        entry_del(&e, required[k]);
        char want[64];
        snprintf(want, sizeof(want), "missing field '%s'", required[k]);
        expect_bad(&e, want);
        entry_free(&e);
    }
    entry_t e;
    sample_entry(&e);
    entry_del(&e, "g");
    expect_bad(&e, "missing field 'g'");
    entry_free(&e);
    empty_entry(&e);
    entry_del(&e, "reason");
    expect_bad(&e, "missing field 'reason'");
    entry_free(&e);

    /* no fields at all, with or without arrays */
    ps_grad_msg_t m = {0};
    char why[128];
    assert_int_equal(ps_grad_decode(&m, 0, NULL, NULL, NULL, NULL, NPARAMS, why, sizeof(why)),
                     FR_ERR_PARSE);
    assert_non_null(strstr(why, "missing field 'epoch'"));
    /* a NULL why is allowed */
    assert_int_equal(ps_grad_decode(&m, 0, NULL, NULL, NULL, NULL, NPARAMS, NULL, 0), FR_ERR_PARSE);
    ps_grad_msg_fini(&m);
}

static void test_decode_refuses_a_duplicate_field(void **state)
{
    (void)state;
    const char *fields[] = {"epoch", "ver", "gen", "worker", "n", "loss", "ranges", "g"};
    for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++) {
        entry_t e;
        sample_entry(&e);
        int i = entry_find(&e, fields[k]);
        entry_add(&e, fields[k], e.v[i], e.vlen[i]); /* same value twice is still bad */
        char want[64];
        snprintf(want, sizeof(want), "duplicate field '%s'", fields[k]);
        expect_bad(&e, want);
        entry_free(&e);
    }
    entry_t e;
    empty_entry(&e);
    entry_add(&e, "reason", "decode", 6);
    expect_bad(&e, "duplicate field 'reason'");
    entry_free(&e);
}

static void test_decode_refuses_bad_numbers(void **state)
{
    (void)state;
    struct {
        const char *field, *value, *want;
    } cases[] = {
        {"epoch", "12x", "bad epoch '12x'"},
        {"epoch", "", "bad epoch ''"},
        {"epoch", " 12", "bad epoch"},
        {"epoch", "12 ", "bad epoch"},
        {"epoch", "+12", "bad epoch"},
        {"epoch", "-1", "bad epoch"},
        {"epoch", "0x10", "bad epoch"},
        {"epoch", "18446744073709551616", "bad epoch"},
        {"epoch", "99999999999999999999", "bad epoch"},
        {"epoch", "000000000000000000001", "bad epoch"}, /* over 20 digits */
        {"ver", "9223372036854775808", "bad ver"},
        {"ver", "-9223372036854775809", "bad ver"},
        {"ver", "-", "bad ver"},
        {"ver", "1.0", "bad ver"},
        {"ver", "--1", "bad ver"},
        {"gen", "1e3", "bad gen"},
        {"gen", "", "bad gen"},
        {"n", "-1", "bad n '-1'"},
        {"n", "64\n", "bad n '64?'"},
        {"n", "9223372036854775808", "bad n"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        entry_t e;
        sample_entry(&e);
        entry_set(&e, cases[k].field, cases[k].value);
        expect_bad(&e, cases[k].want);
        entry_free(&e);
    }
    /* the limits themselves are fine */
    struct {
        const char *field, *value;
    } edges[] = {{"epoch", "18446744073709551615"}, {"epoch", "0"}, {"ver", "-9223372036854775808"},
                 {"ver", "9223372036854775807"},    {"gen", "-1"},  {"n", "9223372036854775807"}};
    for (size_t k = 0; k < sizeof(edges) / sizeof(edges[0]); k++) {
        entry_t e;
        sample_entry(&e);
        entry_set(&e, edges[k].field, edges[k].value);
        expect_ok(&e);
        entry_free(&e);
    }
}

/* The optional ts field: Kafka timestamps of the batch's oldest and newest
 * samples round-trip; malformed ones make the message malformed. */
static void test_timestamps_round_trip_and_bad_ones_are_refused(void **state)
{
    (void)state;
    psstore_grad_t g = sample_grad();
    g.ts_min_ms = 1764460800123;
    g.ts_max_ms = 1764460800456;
    ps_grad_args_t args = {0};
    assert_int_equal(ps_grad_encode(&args, "freshet:{m}:grads", &g), FR_OK);
    assert_int_equal(args.argc, 3 + 2 * 9);
    entry_t e;
    entry_from_args(&e, &args);
    int i = entry_find(&e, "ts");
    assert_true(i >= 0);
    assert_int_equal(e.vlen[i], strlen("1764460800123:1764460800456"));
    assert_memory_equal(e.v[i], "1764460800123:1764460800456", e.vlen[i]);
    ps_grad_msg_t m = {0};
    char why[256] = "";
    assert_int_equal(decode(&m, &e, NPARAMS, why, sizeof(why)), FR_OK);
    assert_same_grad(&g, &m.g);
    ps_grad_msg_fini(&m);
    entry_free(&e);
    ps_grad_args_fini(&args);
    const char *bad[] = {"", "5", "5:", ":5", "0:5", "6:5", "-1:5", "5:x", "5:5:5", "1e3:2000"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        sample_entry(&e);
        entry_add(&e, "ts", bad[k], strlen(bad[k]));
        expect_bad(&e, "bad ts");
        entry_free(&e);
    }
    sample_entry(&e);
    entry_add(&e, "ts", "5:5", 3);
    expect_ok(&e);
    entry_free(&e);
}

static void test_decode_refuses_a_non_finite_or_bad_loss(void **state)
{
    (void)state;
    const char *nonfinite[] = {"nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e309"};
    for (size_t k = 0; k < sizeof(nonfinite) / sizeof(nonfinite[0]); k++) {
        entry_t e;
        sample_entry(&e);
        entry_set(&e, "loss", nonfinite[k]);
        expect_bad(&e, "is not finite");
        entry_free(&e);
    }
    const char *bad[] = {"", " 1", "1 ", "0x1p3", "abc", "1,5", "1.5f", "nan(1)", "--1", "1e"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        entry_t e;
        sample_entry(&e);
        entry_set(&e, "loss", bad[k]);
        expect_bad(&e, "bad loss");
        entry_free(&e);
    }
    char longloss[80];
    memset(longloss, '1', 79);
    longloss[79] = '\0';
    entry_t e;
    sample_entry(&e);
    entry_set(&e, "loss", longloss);
    expect_bad(&e, "bad loss");
    entry_set(&e, "loss", "-2.5e-3");
    expect_ok(&e);
    entry_set(&e, "loss", "1e-999"); /* underflows to 0: finite */
    expect_ok(&e);
    entry_free(&e);
}

static void test_decode_refuses_a_payload_of_the_wrong_length(void **state)
{
    (void)state;
    entry_t e;
    sample_entry(&e);
    entry_set_len(&e, "g", (const char *)grad5, 12);
    expect_bad_at(&e, 4, "payload of 12 bytes, expected 16", __LINE__);
    entry_set_len(&e, "g", (const char *)grad5, 17);
    expect_bad_at(&e, 4, "payload of 17 bytes, expected 16", __LINE__);
    entry_set_len(&e, "g", (const char *)grad5, 0);
    expect_bad_at(&e, 4, "payload of 0 bytes, expected 16", __LINE__);
    entry_set_len(&e, "g", (const char *)grad5, 16);
    expect_ok_at(&e, 4, __LINE__);
    expect_ok_at(&e, 0, __LINE__); /* 0: any whole number of floats (a sparse model's) */
    entry_set_len(&e, "g", (const char *)grad5, 17);
    expect_bad_at(&e, 0, "payload of 17 bytes, expected 0", __LINE__);
    entry_set_len(&e, "g", (const char *)grad5, 0);
    expect_bad_at(&e, 0, "payload of 0 bytes, expected 0", __LINE__);
    entry_set_len(&e, "g", (const char *)grad5, 16);
    expect_bad_at(&e, SIZE_MAX / 2, "payload of 16 bytes", __LINE__); /* 4 * nparams overflows */
    entry_free(&e);
    empty_entry(&e);
    entry_set_len(&e, "g", (const char *)grad5, 4);
    expect_bad(&e, "payload of 4 bytes with n = 0");
    entry_free(&e);
}

static void test_decode_refuses_a_reason_with_samples_and_bad_reasons(void **state)
{
    (void)state;
    entry_t e;
    sample_entry(&e);
    entry_add(&e, "reason", "decode", 6);
    expect_bad(&e, "reason 'decode' given with n = 64 > 0");
    entry_set(&e, "reason", "");
    expect_bad(&e, "given with n = 64");
    entry_free(&e);
    char long_reason[70];
    memset(long_reason, 'r', 64);
    long_reason[64] = '\0';
    const char *bad[] = {"", "Decode", "a-b", "a b", "x1", long_reason};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        empty_entry(&e);
        entry_set(&e, "reason", bad[k]);
        expect_bad(&e, "bad reason");
        entry_free(&e);
    }
    long_reason[63] = '\0';
    empty_entry(&e);
    entry_set(&e, "reason", long_reason);
    expect_ok(&e);
    entry_set(&e, "reason", "dead_letter");
    expect_ok(&e);
    entry_free(&e);
}

static void test_decode_refuses_bad_ranges(void **state)
{
    (void)state;
    char long_topic[300];
    memset(long_topic, 't', 250);
    strcpy(long_topic + 250, ":0:0:1");
    struct {
        const char *value, *want;
    } cases[] = {
        {"", "bad ranges: empty"},
        {"t:0:5:5", "bad ranges: range 0 has from 5 >= to 5"},
        {"t:0:6:5", "from 6 >= to 5"},
        {"t:-1:0:5", "bad ranges: range 0 has a bad partition '-1'"},
        {"t:2147483648:0:1", "bad partition"},
        {"t::0:1", "bad partition ''"},
        {"t:0:-1:5", "bad position"},
        {"t:0:0:-5", "bad position"},
        {"t:0:0:9223372036854775808", "bad position"},
        {"t:0:1x:5", "bad position"},
        {"t y:0:0:1", "bad topic 't y'"},
        {"t/x:0:0:1", "bad topic"},
        {"t\x01:0:0:1", "bad topic 't?'"},
        {":0:0:1", "bad topic ''"},
        {long_topic, "bad topic"},
        {"t:0:0", "is not topic:partition:from:to"},
        {"t:0:0:1:2", "is not topic:partition:from:to"},
        {"t", "is not topic:partition:from:to"},
        {"t:0:0:1,", "bad ranges: range 1 is empty"},
        {",t:0:0:1", "bad ranges: range 0 is empty"},
        {"t:0:0:1,,u:0:0:1", "range 1 is empty"},
        {"t:0:0:1,u:0:0", "range 1 'u:0:0' is not topic:partition:from:to"},
        {"t:0:0:10,t:0:5:15", "bad ranges: ranges 0 and 1 overlap"},
        {"t:0:0:10,u:0:0:10,t:0:9:10", "ranges 0 and 2 overlap"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        entry_t e;
        sample_entry(&e);
        entry_set(&e, "ranges", cases[k].value);
        expect_bad(&e, cases[k].want);
        entry_free(&e);
    }
    /* Many ranges (the sorted check) with one overlap far apart. */
    char big[2048] = "";
    for (int i = 0; i < 40; i++) {
        char one[40];
        snprintf(one, sizeof(one), "%st%d:%d:%d:%d", i ? "," : "", i % 3, i % 5, i * 10,
                 i * 10 + 5);
        strcat(big, one);
    }
    entry_t e;
    sample_entry(&e);
    entry_set(&e, "ranges", big);
    expect_ok(&e);
    strcat(big, ",t0:0:2:3"); /* i = 0 is t0:0:[0,5) */
    entry_set(&e, "ranges", big);
    expect_bad(&e, "bad ranges: two ranges of t0:0 overlap");
    /* Adjacent intervals of one partition and equal intervals of different
     * partitions or topics do not overlap. */
    entry_set(&e, "ranges", "t:0:0:5,t:0:5:10,t:1:0:5,u:0:0:5");
    expect_ok(&e);
    entry_free(&e);
}

static void test_decode_refuses_a_bad_worker(void **state)
{
    (void)state;
    char w[300];
    memset(w, 'w', 256);
    w[256] = '\0';
    const char *bad[] = {"", "a\nb", "tab\there", "del\x7f", w};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        entry_t e;
        sample_entry(&e);
        entry_set(&e, "worker", bad[k]);
        expect_bad(&e, "bad worker");
        entry_free(&e);
    }
    entry_t e;
    sample_entry(&e);
    entry_set_len(&e, "worker", "a\0b", 3); /* NUL is a control character */
    expect_bad(&e, "bad worker 'a?b' (3 bytes");
    w[255] = '\0';
    entry_set(&e, "worker", w);
    expect_ok(&e);
    entry_set(&e, "worker", "h\xc3\xa9te/1/0");
    expect_ok(&e);
    entry_free(&e);
}

/* ------------------------------------------------------------------------
 * Bounds and buffers
 * ---------------------------------------------------------------------- */
static void test_decode_reads_only_the_given_lengths(void **state)
{
    (void)state;
    /* Values followed by more digits in memory: the lengths rule. */
    entry_t e;
    empty_entry(&e);
    entry_set_len(&e, "epoch", "12345", 2);
    entry_set_len(&e, "ranges", "t:0:0:3,garbage", 7);
    entry_set_len(&e, "worker", "wxyz", 1);
    ps_grad_msg_t m = {0};
    char why[256];
    assert_int_equal(decode(&m, &e, NPARAMS, why, sizeof(why)), FR_OK);
    assert_true(m.g.epoch == 12);
    assert_int_equal(m.g.nranges, 1);
    assert_string_equal(m.g.worker, "w");
    ps_grad_msg_fini(&m);
    entry_free(&e);
}

static void test_decode_survives_random_corruption(void **state)
{
    (void)state;
    /* Flip, truncate and extend values of a valid entry: every outcome must
     * be FR_OK or FR_ERR_PARSE, and ASan must stay quiet. */
    fr_rng_t rng;
    fr_rng_seed(&rng, 42);
    ps_grad_msg_t m = {0};
    char why[256];
    int ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        entry_t e;
        if (it % 2)
            sample_entry(&e);
        else
            empty_entry(&e);
        size_t i = (size_t)fr_rng_below(&rng, e.n);
        char buf[512];
        size_t len = e.vlen[i] < sizeof(buf) ? e.vlen[i] : sizeof(buf);
        memcpy(buf, e.v[i], len);
        switch (fr_rng_below(&rng, 3)) {
        case 0:
            if (len)
                buf[fr_rng_below(&rng, len)] = (char)fr_rng_below(&rng, 256);
            break;
        case 1: len = (size_t)fr_rng_below(&rng, len + 1); break;
        default:
            if (len < sizeof(buf))
                buf[len++] = ",:0-9aZ\0"[fr_rng_below(&rng, 8)];
            break;
        }
        char name[32];
        memcpy(name, e.f[i], e.flen[i]);
        name[e.flen[i]] = '\0';
        entry_set_len(&e, name, buf, len);
        fr_err_t err = decode(&m, &e, NPARAMS, why, sizeof(why));
        assert_true(err == FR_OK || err == FR_ERR_PARSE);
        if (err == FR_OK)
            ok++;
        else
            bad++;
        entry_free(&e);
    }
    assert_true(ok > 0 && bad > 0);
    ps_grad_msg_fini(&m);
}

static void test_buffers_are_reused_without_growth(void **state)
{
    (void)state;
    entry_t e;
    sample_entry(&e);
    ps_grad_msg_t m = {0};
    char why[256];
    assert_int_equal(decode(&m, &e, NPARAMS, why, sizeof(why)), FR_OK);
    psstore_range_t *ranges = m.ranges;
    char *topics = m.topics;
    size_t cap_ranges = m.cap_ranges, cap_topics = m.cap_topics;
    assert_true(cap_ranges >= 3 && cap_topics > 0);
    for (int i = 0; i < 1000; i++) {
        /* a failure in between does not lose the buffers either */
        if (i == 500) {
            entry_set(&e, "n", "x");
            assert_int_equal(decode(&m, &e, NPARAMS, why, sizeof(why)), FR_ERR_PARSE);
            assert_null(m.g.worker);
            entry_set(&e, "n", "64");
        }
        assert_int_equal(decode(&m, &e, NPARAMS, why, sizeof(why)), FR_OK);
        assert_int_equal(m.g.nranges, 3);
    }
    assert_ptr_equal(m.ranges, ranges);
    assert_ptr_equal(m.topics, topics);
    assert_int_equal(m.cap_ranges, cap_ranges);
    assert_int_equal(m.cap_topics, cap_topics);
    ps_grad_msg_fini(&m);
    assert_null(m.ranges);
    ps_grad_msg_fini(&m); /* twice is harmless */
    entry_free(&e);

    ps_grad_args_t args = {0};
    psstore_grad_t g = sample_grad();
    assert_int_equal(ps_grad_encode(&args, "k", &g), FR_OK);
    char *text = args.text;
    size_t text_cap = args.text_cap;
    for (int i = 0; i < 1000; i++) {
        g.version = i * 1000003LL;
        g.loss_sum = i / 7.0;
        assert_int_equal(ps_grad_encode(&args, "k", &g), FR_OK);
    }
    assert_ptr_equal(args.text, text);
    assert_int_equal(args.text_cap, text_cap);
    ps_grad_args_fini(&args);
    ps_grad_args_fini(NULL);
    ps_grad_msg_fini(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_keeps_every_field),
        cmocka_unit_test(test_round_trip_of_an_empty_batch_with_reason),
        cmocka_unit_test(test_round_trip_of_extreme_values),
        cmocka_unit_test(test_round_trip_of_a_slice_carries_the_whole_norm),
        cmocka_unit_test(test_encode_refuses_inconsistent_messages),
        cmocka_unit_test(test_decode_refuses_an_unknown_field),
        cmocka_unit_test(test_decode_refuses_a_missing_field),
        cmocka_unit_test(test_decode_refuses_a_duplicate_field),
        cmocka_unit_test(test_decode_refuses_bad_numbers),
        cmocka_unit_test(test_decode_refuses_a_non_finite_or_bad_loss),
        cmocka_unit_test(test_timestamps_round_trip_and_bad_ones_are_refused),
        cmocka_unit_test(test_decode_refuses_a_payload_of_the_wrong_length),
        cmocka_unit_test(test_decode_refuses_a_reason_with_samples_and_bad_reasons),
        cmocka_unit_test(test_decode_refuses_bad_ranges),
        cmocka_unit_test(test_decode_refuses_a_bad_worker),
        cmocka_unit_test(test_decode_reads_only_the_given_lengths),
        cmocka_unit_test(test_decode_survives_random_corruption),
        cmocka_unit_test(test_buffers_are_reused_without_growth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
