/*
 * test_common.c - errors, logging levels, the seeded RNG (pinned to values
 * of an independent Python implementation of splitmix64 + xoshiro256**),
 * memory touching, the process's core count and the one JSON string
 * escaper.
 */
#define _GNU_SOURCE /* sched_setaffinity */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/common.h"

/* Reference: a 20-line Python transcription of splitmix64 seeding and
 * xoshiro256** (Blackman and Vigna), run on 2026-11-29. */
static void test_rng_sequence_is_pinned_to_reference_values(void **state)
{
    fr_rng_t rng;
    fr_rng_seed(&rng, 0);
    assert_true(fr_rng_next(&rng) == 0x99ec5f36cb75f2b4ull);
    assert_true(fr_rng_next(&rng) == 0xbf6e1f784956452aull);
    assert_true(fr_rng_next(&rng) == 0x1a5f849d4933e6e0ull);
    fr_rng_seed(&rng, 42);
    assert_true(fr_rng_next(&rng) == 0x15780b2e0c2ec716ull);
    assert_true(fr_rng_next(&rng) == 0x6104d9866d113a7eull);
    assert_true(fr_rng_next(&rng) == 0xae17533239e499a1ull);
}

static void test_rng_uniform_and_below_stay_in_range(void **state)
{
    fr_rng_t rng;
    fr_rng_seed(&rng, 7);
    int counts[7] = {0};
    double sum = 0;
    for (int i = 0; i < 70000; i++) {
        double u = fr_rng_uniform(&rng);
        assert_true(u >= 0.0 && u < 1.0);
        sum += u;
        uint64_t k = fr_rng_below(&rng, 7);
        assert_true(k < 7);
        counts[k]++;
    }
    assert_true(sum / 70000 > 0.49 && sum / 70000 < 0.51);
    for (int k = 0; k < 7; k++)
        assert_true(counts[k] > 9500 && counts[k] < 10500);
    assert_int_equal(fr_rng_below(&rng, 1), 0);
}

static void test_shuffle_is_a_seeded_permutation(void **state)
{
    uint32_t a[1000], b[1000];
    for (uint32_t i = 0; i < 1000; i++)
        a[i] = b[i] = i;
    fr_rng_t r1, r2;
    fr_rng_seed(&r1, 3);
    fr_rng_seed(&r2, 3);
    fr_rng_shuffle(&r1, a, 1000);
    fr_rng_shuffle(&r2, b, 1000);
    assert_memory_equal(a, b, sizeof(a));
    int seen[1000] = {0}, moved = 0;
    for (uint32_t i = 0; i < 1000; i++) {
        seen[a[i]]++;
        moved += a[i] != i;
    }
    for (int i = 0; i < 1000; i++)
        assert_int_equal(seen[i], 1);
    assert_true(moved > 900);
}

/* FNV-1a 64 against the published test vectors, and continuation: hashing
 * "foo" then "bar" is hashing "foobar". */
static void test_fnv1a_matches_the_reference_vectors(void **state)
{
    (void)state;
    assert_true(fr_fnv1a(FR_FNV1A_SEED, "", 0) == 0xcbf29ce484222325ull);
    assert_true(fr_fnv1a(FR_FNV1A_SEED, "a", 1) == 0xaf63dc4c8601ec8cull);
    assert_true(fr_fnv1a(FR_FNV1A_SEED, "foobar", 6) == 0x85944171f73967e8ull);
    assert_true(fr_fnv1a(fr_fnv1a(FR_FNV1A_SEED, "foo", 3), "bar", 3) == 0x85944171f73967e8ull);
}

static void test_errors_have_descriptions_and_fill_errstr(void **state)
{
    assert_string_equal(fr_strerror(FR_OK), "success");
    assert_string_equal(fr_strerror(FR_ERR_REDIS), "Redis error");
    assert_string_equal(fr_strerror((fr_err_t)-999), "unknown error");
    char buf[16];
    assert_int_equal(fr_errorf(FR_ERR_PARSE, buf, sizeof(buf), "bad %s at %d", "thing", 12345),
                     FR_ERR_PARSE);
    assert_string_equal(buf, "bad thing at 12"); /* truncated, terminated */
    assert_int_equal(fr_errorf(FR_ERR_IO, NULL, 0, "ignored"), FR_ERR_IO);
}

static void test_log_levels_parse(void **state)
{
    fr_log_level_t level;
    assert_int_equal(fr_log_level_parse("debug", &level), FR_OK);
    assert_int_equal(level, FR_LOG_DEBUG);
    assert_int_equal(fr_log_level_parse("loud", &level), FR_ERR_INVAL);
    fr_log_set_level(FR_LOG_ERROR);
    assert_int_equal(fr_log_level(), FR_LOG_ERROR);
    fr_log_set_level(FR_LOG_INFO);
}

/* A warning repeated fast is written 10 times a second at most; the next
 * one after a second says how many were dropped; another call site and
 * info lines are not held back. */
static void same_fault(int i)
{
    fr_log(FR_LOG_WARN, "test: the same fault %d", i); /* one call site */
}

static void test_repeated_warnings_are_rate_limited(void **state)
{
    (void)state;
    char path[] = "/tmp/freshet-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(STDERR_FILENO);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    for (int i = 0; i < 100; i++)
        same_fault(i);
    fr_log(FR_LOG_WARN, "test: another fault");
    for (int i = 0; i < 30; i++)
        fr_log(FR_LOG_INFO, "test: progress %d", i);
    struct timespec ts = {1, 100000000}; /* past the window */
    nanosleep(&ts, NULL);
    same_fault(100);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char text[16384];
    ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    close(fd);
    unlink(path);
    assert_true(n > 0);
    text[n] = '\0';
    int same = 0, other = 0, info = 0;
    for (const char *p = text; (p = strstr(p, "test: ")) != NULL; p++) {
        same += strncmp(p, "test: the same fault", 20) == 0;
        other += strncmp(p, "test: another fault", 19) == 0;
        info += strncmp(p, "test: progress", 14) == 0;
    }
    assert_int_equal(same, 11); /* 10 in the first second, then one */
    assert_int_equal(other, 1);
    assert_int_equal(info, 30);
    assert_non_null(strstr(text, "the same fault 9\n"));
    assert_null(strstr(text, "the same fault 10\n"));
    assert_non_null(strstr(text, "the same fault 100 (90 more like this dropped"));
}

static void test_mem_touch_keeps_contents(void **state)
{
    size_t n = 3 * 4096 + 17;
    unsigned char *p = malloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31);
    fr_mem_touch(p, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(p[i], (unsigned char)(i * 31));
    fr_mem_touch(p, 0);
    free(p);
}

static void test_clocks_move_forward(void **state)
{
    uint64_t a = fr_clock_mono_ns(), b = fr_clock_mono_ns();
    assert_true(b >= a);
    assert_true(fr_clock_unix_ms() > 1700000000000LL); /* after 2023 */
}

/* fr_cpu_count is the affinity mask's size: all the cores this process may
 * use, and 1 once it is narrowed to one (as taskset or a cpuset would). */
static void test_cpu_count_follows_the_affinity_mask(void **state)
{
    (void)state;
    cpu_set_t all, one;
    assert_int_equal(sched_getaffinity(0, sizeof(all), &all), 0);
    assert_int_equal(fr_cpu_count(), CPU_COUNT(&all));
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
    int narrowed = fr_cpu_count();
    assert_int_equal(sched_setaffinity(0, sizeof(all), &all), 0);
    assert_int_equal(narrowed, 1);
}

/* fr_json_str, the one JSON string escaper (serve's bodies, the commands'
 * JSON): quote and backslash escaped, control characters, DEL and '<' as
 * \u00XX, well-formed UTF-8 kept, and each byte of anything else written
 * as U+FFFD, so that every JSON text freshet writes is valid UTF-8. */
static void test_json_strings_are_escaped_and_valid_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"", "\"\""},
        {"plain", "\"plain\""},
        {"q\"b\\", "\"q\\\"b\\\\\""},
        {"tab\tnl\n", "\"tab\\u0009nl\\u000a\""},
        {"\x01\x1f\x7f", "\"\\u0001\\u001f\\u007f\""},
        {"</script>", "\"\\u003c/script>\""},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
         "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""},        /* 2, 3, 4 bytes */
        {"\xf4\x8f\xbf\xbf", "\"\xf4\x8f\xbf\xbf\""},             /* U+10FFFF */
        {"/v2/\xff\xfe", "\"/v2/\\ufffd\\ufffd\""},               /* a path's %ff%fe */
        {"\x80x", "\"\\ufffdx\""},                                /* a stray continuation */
        {"\xc0\xaf", "\"\\ufffd\\ufffd\""},                       /* overlong '/' */
        {"\xe0\x80\xaf", "\"\\ufffd\\ufffd\\ufffd\""},            /* overlong, 3 bytes */
        {"\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\""},            /* a surrogate */
        {"\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\""}, /* past U+10FFFF */
        {"\xf5\x80", "\"\\ufffd\\ufffd\""},                       /* no such lead byte */
        {"cut \xe2\x82", "\"cut \\ufffd\\ufffd\""},               /* truncated at the end */
        {"\xe2\x82"
         "x",
         "\"\\ufffd\\ufffdx\""},                       /* truncated before 'x' */
        {"\xf0\x9f\x98", "\"\\ufffd\\ufffd\\ufffd\""}, /* 4 bytes cut at 3 */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fr_buf_t b = {0};
        fr_json_str(&b, cases[i].in);
        assert_false(b.failed);
        size_t len;
        char *text = fr_buf_take(&b, &len);
        assert_non_null(text);
        assert_string_equal(text, cases[i].out);
        assert_int_equal(len, strlen(cases[i].out));
        free(text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_sequence_is_pinned_to_reference_values),
        cmocka_unit_test(test_rng_uniform_and_below_stay_in_range),
        cmocka_unit_test(test_shuffle_is_a_seeded_permutation),
        cmocka_unit_test(test_fnv1a_matches_the_reference_vectors),
        cmocka_unit_test(test_errors_have_descriptions_and_fill_errstr),
        cmocka_unit_test(test_log_levels_parse),
        cmocka_unit_test(test_mem_touch_keeps_contents),
        cmocka_unit_test(test_repeated_warnings_are_rate_limited),
        cmocka_unit_test(test_clocks_move_forward),
        cmocka_unit_test(test_cpu_count_follows_the_affinity_mask),
        cmocka_unit_test(test_json_strings_are_escaped_and_valid_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
