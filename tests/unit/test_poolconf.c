/*
 * test_poolconf.c - the workers' per-worker settings: [trainer] slowdown
 * and [trainer] devices, exact values and every refusal.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "trainer/trainer.h"

static void test_slowdown_sets_the_listed_workers_and_leaves_the_others_at_one(void **state)
{
    (void)state;
    double f[3];
    char errstr[256];
    assert_int_equal(trainer_slowdown_parse("1:10,0:2.5", 3, f, errstr, sizeof(errstr)), FR_OK);
    assert_true(f[0] == 2.5 && f[1] == 10.0 && f[2] == 1.0);
    assert_int_equal(trainer_slowdown_parse("", 3, f, errstr, sizeof(errstr)), FR_OK);
    assert_true(f[0] == 1.0 && f[1] == 1.0 && f[2] == 1.0);
}

static void test_slowdown_refuses_bad_entries(void **state)
{
    (void)state;
    static const char *const bad[] = {"3:2",     "0:0.5", "0:x",   "a", "0:2,",
                                      "0:2;1:3", "-1:2",  "0:inf", "1"};
    double f[3];
    char errstr[256];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        errstr[0] = '\0';
        if (trainer_slowdown_parse(bad[i], 3, f, errstr, sizeof(errstr)) != FR_ERR_INVAL)
            fail_msg("slowdown '%s' accepted", bad[i]);
        assert_non_null(strstr(errstr, "[trainer] slowdown"));
    }
}

static void test_devices_repeat_a_short_list_and_default_to_zero(void **state)
{
    (void)state;
    int d[5];
    char errstr[256];
    assert_int_equal(trainer_devices_parse("0,1", 5, d, errstr, sizeof(errstr)), FR_OK);
    int want[] = {0, 1, 0, 1, 0};
    assert_memory_equal(d, want, sizeof(want));
    assert_int_equal(trainer_devices_parse("", 5, d, errstr, sizeof(errstr)), FR_OK);
    int zero[5] = {0};
    assert_memory_equal(d, zero, sizeof(zero));
    assert_int_equal(trainer_devices_parse("2,0,1,3,3,7", 3, d, errstr, sizeof(errstr)), FR_OK);
    assert_true(d[0] == 2 && d[1] == 0 && d[2] == 1);
    assert_int_equal(trainer_devices_parse("x", 2, d, errstr, sizeof(errstr)), FR_ERR_INVAL);
    assert_int_equal(trainer_devices_parse("-1", 2, d, errstr, sizeof(errstr)), FR_ERR_INVAL);
    assert_int_equal(trainer_devices_parse("0,,1", 2, d, errstr, sizeof(errstr)), FR_ERR_INVAL);
    assert_int_equal(trainer_devices_parse("0,", 2, d, errstr, sizeof(errstr)), FR_ERR_INVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slowdown_sets_the_listed_workers_and_leaves_the_others_at_one),
        cmocka_unit_test(test_slowdown_refuses_bad_entries),
        cmocka_unit_test(test_devices_repeat_a_short_list_and_default_to_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
