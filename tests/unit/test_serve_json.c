/*
 * test_serve_json.c - serve's JSON pieces: the float text of the JSON
 * weights reads back as the same float, for every kind of float.
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

#include "common/common.h"
#include "serve/serve_int.h"

static float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

static uint32_t to_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

/* text is a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int json_number(const char *t)
{
    if (*t == '-')
        t++;
    if (*t == '0')
        t++;
    else if (*t >= '1' && *t <= '9')
        while (*t >= '0' && *t <= '9')
            t++;
    else
        return 0;
    if (*t == '.') {
        if (!(*++t >= '0' && *t <= '9'))
            return 0;
        while (*t >= '0' && *t <= '9')
            t++;
    }
    if (*t == 'e' || *t == 'E') {
        t++;
        if (*t == '+' || *t == '-')
            t++;
        if (!(*t >= '0' && *t <= '9'))
            return 0;
        while (*t >= '0' && *t <= '9')
            t++;
    }
    return *t == '\0';
}

/* x's text is a JSON number that strtof reads back bit for bit, with at
 * most 9 significant digits and no trailing zero after a point. */
static void round_trips(float x)
{
    char t[SV_F32_TEXT_MAX];
    size_t n = sv_f32_text(x, t);
    assert_int_equal(n, strlen(t));
    if (!json_number(t))
        fail_msg("%a: '%s' is not a JSON number", (double)x, t);
    float back = strtof(t, NULL);
    if (to_bits(back) != to_bits(x))
        fail_msg("%a (%.9g): '%s' reads back as %a", (double)x, (double)x, t, (double)back);
    int digits = 0;
    const char *p = t;
    while (*p == '-' || *p == '0' || *p == '.')
        p++; /* leading zeros are not significant */
    for (; *p != '\0' && *p != 'e'; p++)
        digits += *p >= '0' && *p <= '9';
    assert_true(digits <= 9);
    const char *dot = strchr(t, '.');
    if (dot != NULL) {
        const char *end = strchr(t, 'e') != NULL ? strchr(t, 'e') : t + n;
        assert_true(end[-1] != '0');
    }
}

static void test_text_of_chosen_floats(void **state)
{
    (void)state;
    const struct {
        float x;
        const char *text;
    } cases[] = {
        {0.0f, "0"},
        {-0.0f, "-0"},
        {1.0f, "1"},
        {-2.5f, "-2.5"},
        {100.0f, "100"},
        {123456792.0f, "123456792"},
        {1e9f, "1e+09"},
        {0.1f, "0.100000001"},
        {0.00123f, "0.00123000005"},
        {1e-5f, "9.99999975e-06"},
        {3.0e-7f, "3.00000011e-07"},
        {3.4028235e38f, "3.40282347e+38"},
        {1.17549435e-38f, "1.17549435e-38"},
        {1.4e-45f, "1.40129846e-45"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char t[SV_F32_TEXT_MAX];
        sv_f32_text(cases[i].x, t);
        if (strcmp(t, cases[i].text) != 0)
            fail_msg("%.9g: '%s', want '%s'", (double)cases[i].x, t, cases[i].text);
        /* the same digits as printf's %.9g, trailing zeros aside */
        char g[64];
        snprintf(g, sizeof(g), "%.9g", (double)cases[i].x);
        assert_true(strtof(g, NULL) == strtof(t, NULL));
    }
    char t[SV_F32_TEXT_MAX];
    sv_f32_text(NAN, t);
    assert_string_equal(t, "null");
    sv_f32_text(-INFINITY, t);
    assert_string_equal(t, "null");
}

/* Every power of two and its neighbours, every exponent's extremes, the
 * subnormals' edges, and a million random bit patterns. */
static void test_every_kind_of_float_reads_back(void **state)
{
    (void)state;
    for (int e = -149; e <= 127; e++) {
        float p = ldexpf(1.0f, e);
        round_trips(p);
        round_trips(-p);
        round_trips(nextafterf(p, 0.0f));
        round_trips(nextafterf(p, INFINITY));
    }
    for (uint32_t u = 1; u < 100000; u++) {
        round_trips(from_bits(u));               /* the smallest subnormals */
        round_trips(from_bits(0x7f7fffffu - u)); /* the largest floats */
        round_trips(from_bits(0x3f800000u + u)); /* just above 1 */
    }
    for (int k = -45; k <= 38; k++) { /* powers of ten and their neighbours */
        char t[32];
        snprintf(t, sizeof(t), "1e%d", k);
        float p = strtof(t, NULL);
        round_trips(p);
        round_trips(nextafterf(p, 0.0f));
        round_trips(nextafterf(p, INFINITY));
    }
    fr_rng_t rng;
    fr_rng_seed(&rng, 42);
    int tested = 0;
    for (int i = 0; i < 1000000; i++) {
        float x = from_bits((uint32_t)fr_rng_next(&rng));
        if (!isfinite(x))
            continue;
        round_trips(x);
        tested++;
    }
    assert_true(tested > 990000);
}

/* The JSON numbers of weights are read by strtof as the weights. */
static void test_json_buffer_holds_the_floats(void **state)
{
    (void)state;
    const float w[] = {0.5f, -1e-20f, 3.14159274f, 0.0f, 65504.0f};
    fr_buf_t b = {0};
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        if (i > 0)
            fr_buf_add(&b, ",", 1);
        sv_json_f32(&b, w[i]);
    }
    size_t len;
    char *text = fr_buf_take(&b, &len);
    assert_non_null(text);
    assert_string_equal(text, "0.5,-9.99999968e-21,3.14159274,0,65504");
    assert_int_equal(len, strlen(text));
    const char *p = text;
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        char *end;
        assert_true(strtof(p, &end) == w[i]);
        p = end + 1;
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_of_chosen_floats),
        cmocka_unit_test(test_every_kind_of_float_reads_back),
        cmocka_unit_test(test_json_buffer_holds_the_floats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
