/*
 * test_config.c - the INI configuration: defaults, file syntax, every error
 * with its exact wording, --set overrides, environment overrides and the
 * example file in deploy/.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/common.h"

/* The temporary INI file of the current test. */
static char conf_path[64];

/* Writes text to a fresh temporary file and remembers its path. */
static void write_conf(const char *text)
{
    snprintf(conf_path, sizeof(conf_path), "/tmp/freshet-test-config-XXXXXX");
    int fd = mkstemp(conf_path);
    assert_true(fd >= 0);
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
}

/* Loads text as a file into cfg; errstr receives the error, if any. */
static fr_err_t load_text(fr_config_t *cfg, const char *text, char *errstr, size_t size)
{
    write_conf(text);
    fr_err_t err = fr_config_load_file(cfg, conf_path, errstr, size);
    unlink(conf_path);
    return err;
}

/* Loads text into a fresh config and asserts the exact error: code and
 * "PATH:" followed by expected_after_path. */
static void assert_load_error(const char *text, fr_err_t code, const char *expected_after_path)
{
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    fr_err_t err = load_text(cfg, text, errstr, sizeof(errstr));
    char expected[512];
    snprintf(expected, sizeof(expected), "%s:%s", conf_path, expected_after_path);
    assert_string_equal(errstr, expected);
    assert_int_equal(err, code);
    fr_config_destroy(cfg);
}

/* Applies one --set and asserts the exact error. */
static void assert_set_error(const char *assignment, fr_err_t code, const char *expected)
{
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    assert_int_equal(fr_config_set(cfg, assignment, errstr, sizeof(errstr)), code);
    assert_string_equal(errstr, expected);
    fr_config_destroy(cfg);
}

/* Applies one --set and asserts it succeeds. */
static void assert_set_ok(fr_config_t *cfg, const char *assignment)
{
    char errstr[512] = "";
    fr_err_t err = fr_config_set(cfg, assignment, errstr, sizeof(errstr));
    if (err != FR_OK)
        fail_msg("--set %s failed: %s", assignment, errstr);
}

/* Whether "section.key=value" is accepted by --set. */
static int set_accepts(const char *assignment)
{
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512];
    fr_err_t err = fr_config_set(cfg, assignment, errstr, sizeof(errstr));
    fr_config_destroy(cfg);
    return err == FR_OK;
}

static void test_config_new_holds_every_default(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    assert_string_equal(fr_config_get(cfg, "model", "name"), "default");
    assert_string_equal(fr_config_get(cfg, "model", "layers"), "784-256-10");
    assert_string_equal(fr_config_get(cfg, "model", "loss"), "softmax");
    assert_int_equal(fr_config_get_int(cfg, "model", "seed"), 42);
    assert_string_equal(fr_config_get(cfg, "model", "init"), "");
    assert_string_equal(fr_config_get(cfg, "ingest", "topic"), "freshet.samples");
    assert_string_equal(fr_config_get(cfg, "ingest", "format"), "f32");
    assert_int_equal(fr_config_get_int(cfg, "ingest", "batch"), 64);
    assert_int_equal(fr_config_get_int(cfg, "ingest", "queue"), 16);
    assert_int_equal(fr_config_get_int(cfg, "ingest", "linger_ms"), 10);
    assert_string_equal(fr_config_get(cfg, "ingest", "start"), "earliest");
    assert_string_equal(fr_config_get(cfg, "redis", "url"), "redis://127.0.0.1:6379/0");
    assert_int_equal(fr_config_get_int(cfg, "trainer", "workers"), 2);
    assert_string_equal(fr_config_get(cfg, "trainer", "mode"), "async");
    assert_int_equal(fr_config_get_int(cfg, "trainer", "ssp_bound"), 3);
    assert_true(fr_config_get_double(cfg, "trainer", "member_timeout") == 10.0);
    assert_true(fr_config_get_double(cfg, "trainer", "round_timeout") == 5.0);
    assert_int_equal(fr_config_get_int(cfg, "trainer", "idle_ms"), 2000);
    assert_true(fr_config_get_double(cfg, "controller", "lr") == 0.05);
    assert_true(fr_config_get_double(cfg, "controller", "momentum") == 0.9);
    assert_int_equal(fr_config_get_int(cfg, "controller", "dc_ring"), 8);
    assert_int_equal(fr_config_get_bool(cfg, "controller", "dc_adaptive"), 0);
    assert_int_equal(fr_config_get_int(cfg, "psstore", "versions_keep"), 10000);
    assert_true(fr_config_get_double(cfg, "psstore", "snapshot_seconds") == 60.0);
    assert_int_equal(fr_config_get_int(cfg, "psstore", "lease_ms"), 5000);
    assert_string_equal(fr_config_get(cfg, "serve", "listen"), "127.0.0.1:8080");
    assert_string_equal(fr_config_get(cfg, "serve", "token"), "");
    assert_int_equal(fr_config_get_int(cfg, "serve", "refresh_ms"), 20);
    assert_string_equal(fr_config_get(cfg, "eval", "format"), "idx");
    assert_int_equal(fr_config_get_int(cfg, "eval", "every"), 100);
    assert_int_equal(fr_config_kafka_count(cfg), 0);
    fr_config_destroy(cfg);
}

static void test_config_getters_return_null_or_zero_for_unknown_or_mistyped_keys(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    assert_null(fr_config_get(cfg, "trainer", "nope"));
    assert_null(fr_config_get(cfg, "nope", "workers"));
    assert_null(fr_config_get(cfg, "kafka", "bootstrap.servers"));
    assert_int_equal(fr_config_get_int(cfg, "controller", "lr"), 0);
    assert_true(fr_config_get_double(cfg, "trainer", "workers") == 0.0);
    assert_int_equal(fr_config_get_bool(cfg, "trainer", "workers"), 0);
    assert_int_equal(fr_config_get_int(cfg, "model", "name"), 0);
    const char *key = "x", *value = "y";
    fr_config_kafka_at(cfg, 0, &key, &value);
    assert_null(key);
    assert_null(value);
    fr_config_destroy(cfg);
    fr_config_destroy(NULL);
}

static void test_config_load_file_applies_values_across_sections(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    const char *text = "[model]\n"
                       "name = mnist-v2\n"
                       "layers=784-128-64-10\r\n"
                       "  loss   =   logistic  \n"
                       "[trainer]\n"
                       "workers = 8\n"
                       "member_timeout = 2.5\n"
                       "[ controller ]\n"
                       "dc_adaptive = yes\n"
                       "lr = 1e-3\n"
                       "[serve]\n"
                       "token = s3cret\n";
    assert_int_equal(load_text(cfg, text, errstr, sizeof(errstr)), FR_OK);
    assert_string_equal(fr_config_get(cfg, "model", "name"), "mnist-v2");
    assert_string_equal(fr_config_get(cfg, "model", "layers"), "784-128-64-10");
    assert_string_equal(fr_config_get(cfg, "model", "loss"), "logistic");
    assert_int_equal(fr_config_get_int(cfg, "trainer", "workers"), 8);
    assert_true(fr_config_get_double(cfg, "trainer", "member_timeout") == 2.5);
    assert_int_equal(fr_config_get_bool(cfg, "controller", "dc_adaptive"), 1);
    assert_true(fr_config_get_double(cfg, "controller", "lr") == 1e-3);
    assert_string_equal(fr_config_get(cfg, "serve", "token"), "s3cret");
    /* Untouched keys keep their defaults. */
    assert_int_equal(fr_config_get_int(cfg, "ingest", "batch"), 64);
    fr_config_destroy(cfg);
}

static void test_config_load_skips_comments_and_blank_lines_and_keeps_hash_in_values(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    const char *text = "\xEF\xBB\xBF# a comment before any section\n"
                       "; another comment\n"
                       "\n"
                       "   \t\n"
                       "[ingest] # the consumer\n"
                       "  # indented comment\n"
                       "topic = events#1 ; not a comment\n"
                       "[serve]\n"
                       "token = a#b\n";
    assert_int_equal(load_text(cfg, text, errstr, sizeof(errstr)), FR_OK);
    assert_string_equal(fr_config_get(cfg, "ingest", "topic"), "events#1 ; not a comment");
    assert_string_equal(fr_config_get(cfg, "serve", "token"), "a#b");
    fr_config_destroy(cfg);
}

static void test_config_load_strips_optional_double_quotes(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    const char *text = "[ingest]\n"
                       "topic = \"  spaced topic \"\n"
                       "batch = \"128\"\n"
                       "dead_letter_topic = \"\"\n"
                       "[model]\n"
                       "init = \"half\n";
    assert_int_equal(load_text(cfg, text, errstr, sizeof(errstr)), FR_OK);
    assert_string_equal(fr_config_get(cfg, "ingest", "topic"), "  spaced topic ");
    assert_int_equal(fr_config_get_int(cfg, "ingest", "batch"), 128);
    assert_string_equal(fr_config_get(cfg, "ingest", "dead_letter_topic"), "");
    assert_string_equal(fr_config_get(cfg, "model", "init"), "\"half");
    fr_config_destroy(cfg);
}

static void test_config_keeps_kafka_properties_in_order_and_replaces_duplicates(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    const char *text = "[kafka]\n"
                       "bootstrap.servers = 127.0.0.1:9092\n"
                       "security.protocol = sasl_ssl\n"
                       "sasl.password = p=ss#word\n"
                       "bootstrap.servers = broker:9093\n";
    assert_int_equal(load_text(cfg, text, errstr, sizeof(errstr)), FR_OK);
    assert_set_ok(cfg, "kafka.client.id=freshet-1");
    assert_set_ok(cfg, "kafka.security.protocol=ssl");
    assert_int_equal(fr_config_kafka_count(cfg), 4);
    static const char *const want[][2] = {
        {"bootstrap.servers", "broker:9093"},
        {"security.protocol", "ssl"},
        {"sasl.password", "p=ss#word"},
        {"client.id", "freshet-1"},
    };
    for (size_t i = 0; i < 4; i++) {
        const char *key = NULL, *value = NULL;
        fr_config_kafka_at(cfg, i, &key, &value);
        assert_string_equal(key, want[i][0]);
        assert_string_equal(value, want[i][1]);
    }
    fr_config_destroy(cfg);
}

static void test_config_rejects_unknown_key_with_file_and_line(void **state)
{
    (void)state;
    assert_load_error("[trainer]\nworkers = 3\n\nwrkers = 4\n", FR_ERR_INVAL,
                      "4: [trainer] wrkers: unknown key");
}

static void test_config_rejects_unknown_section_with_file_and_line(void **state)
{
    (void)state;
    assert_load_error("# x\n[trainers]\nworkers = 3\n", FR_ERR_INVAL,
                      "2: [trainers]: unknown section");
}

static void test_config_rejects_bad_integer_with_file_line_and_key(void **state)
{
    (void)state;
    assert_load_error("[model]\nname = a\n\n\n\n[trainer]\nworkers = abc\n", FR_ERR_INVAL,
                      "7: [trainer] workers: expected an integer in 1..1024, got 'abc'");
}

static void test_config_rejects_a_line_without_equals(void **state)
{
    (void)state;
    assert_load_error("[trainer]\nworkers 3\n", FR_ERR_PARSE,
                      "2: [trainer] workers 3: missing '=' (expected key = value)");
}

static void test_config_rejects_an_unterminated_section_header(void **state)
{
    (void)state;
    assert_load_error("[model\nname = x\n", FR_ERR_PARSE,
                      "1: [model: unterminated section header (missing ']')");
}

static void test_config_rejects_text_after_a_section_header(void **state)
{
    (void)state;
    assert_load_error("[model] name = x\n", FR_ERR_PARSE,
                      "1: [model] name = x: unexpected text after the section header");
}

static void test_config_rejects_an_empty_section_name_and_an_empty_key(void **state)
{
    (void)state;
    assert_load_error("[ ]\n", FR_ERR_PARSE, "1: []: empty section name");
    assert_load_error("[model]\n = x\n", FR_ERR_PARSE, "2: [model]: empty key");
    assert_load_error("[kafka]\n= x\n", FR_ERR_PARSE, "2: [kafka]: empty key");
}

static void test_config_rejects_a_key_outside_a_section(void **state)
{
    (void)state;
    assert_load_error("# header\nworkers = 3\n[trainer]\n", FR_ERR_PARSE,
                      "2: workers: key outside a section (add a [section] header above it)");
}

static void test_config_stops_at_the_first_bad_line(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    const char *text = "[ingest]\n"
                       "batch = 32\n"
                       "queue = 0\n"
                       "linger_ms = 5\n";
    assert_int_equal(load_text(cfg, text, errstr, sizeof(errstr)), FR_ERR_INVAL);
    assert_non_null(strstr(errstr, ":3: [ingest] queue: expected an integer in 1..1048576"));
    assert_int_equal(fr_config_get_int(cfg, "ingest", "batch"), 64); /* nothing applied */
    assert_int_equal(fr_config_get_int(cfg, "ingest", "queue"), 16);
    assert_int_equal(fr_config_get_int(cfg, "ingest", "linger_ms"), 10);
    fr_config_destroy(cfg);
}

static void test_config_reports_a_missing_file_as_io_error_with_path(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    const char *path = "/nonexistent/freshet/none.conf";
    assert_int_equal(fr_config_load_file(cfg, path, errstr, sizeof(errstr)), FR_ERR_IO);
    char expected[512];
    snprintf(expected, sizeof(expected), "%s: %s", path, strerror(ENOENT));
    assert_string_equal(errstr, expected);
    fr_config_destroy(cfg);
}

static void test_config_rejects_a_nul_byte_in_a_line(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    snprintf(conf_path, sizeof(conf_path), "/tmp/freshet-test-config-XXXXXX");
    int fd = mkstemp(conf_path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "[model]\nname = a\0b\n", 19), 19);
    close(fd);
    char errstr[512] = "";
    assert_int_equal(fr_config_load_file(cfg, conf_path, errstr, sizeof(errstr)), FR_ERR_PARSE);
    assert_non_null(strstr(errstr, ":2: NUL byte in line"));
    unlink(conf_path);
    fr_config_destroy(cfg);
}

static void test_config_set_overrides_a_key_after_the_file(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    assert_int_equal(load_text(cfg, "[trainer]\nworkers = 3\n", errstr, sizeof(errstr)), FR_OK);
    assert_set_ok(cfg, "trainer.workers=7");
    assert_int_equal(fr_config_get_int(cfg, "trainer", "workers"), 7);
    assert_string_equal(fr_config_get(cfg, "trainer", "workers"), "7");
    assert_set_ok(cfg, " trainer . mode = \"ssp\" ");
    assert_string_equal(fr_config_get(cfg, "trainer", "mode"), "ssp");
    assert_set_ok(cfg, "model.init=");
    assert_string_equal(fr_config_get(cfg, "model", "init"), "");
    fr_config_destroy(cfg);
}

static void test_config_set_splits_kafka_keys_at_the_first_dot(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    assert_set_ok(cfg, "kafka.bootstrap.servers=x:1");
    assert_set_ok(cfg, "kafka.sasl.jaas.config=a=b c=d");
    assert_int_equal(fr_config_kafka_count(cfg), 2);
    const char *key = NULL, *value = NULL;
    fr_config_kafka_at(cfg, 0, &key, &value);
    assert_string_equal(key, "bootstrap.servers");
    assert_string_equal(value, "x:1");
    fr_config_kafka_at(cfg, 1, &key, &value);
    assert_string_equal(key, "sasl.jaas.config");
    assert_string_equal(value, "a=b c=d");
    fr_config_destroy(cfg);
}

static void test_config_set_errors_name_the_key(void **state)
{
    (void)state;
    assert_set_error("trainer.workers=abc", FR_ERR_INVAL,
                     "--set trainer.workers: expected an integer in 1..1024, got 'abc'");
    assert_set_error("trainer.wrkers=3", FR_ERR_INVAL, "--set trainer.wrkers: unknown key");
    assert_set_error("bogus.x=1", FR_ERR_INVAL, "--set bogus: unknown section [bogus]");
    assert_set_error("trainer.workers", FR_ERR_PARSE,
                     "--set trainer.workers: expected section.key=value");
    assert_set_error("workers=3", FR_ERR_PARSE, "--set workers: expected section.key=value");
    assert_set_error("kafka.=x", FR_ERR_PARSE, "--set kafka: empty key");
    assert_set_error("model.name=a b", FR_ERR_INVAL,
                     "--set model.name: expected a name of 1 to 64 characters from "
                     "[A-Za-z0-9._-], got 'a b'");
}

static void test_config_checks_enum_values(void **state)
{
    (void)state;
    assert_true(set_accepts("model.loss=mse"));
    assert_true(set_accepts("ingest.format=libsvm"));
    assert_true(set_accepts("ingest.start=latest"));
    assert_true(set_accepts("trainer.backend=cuda"));
    assert_true(set_accepts("trainer.mode=adaptive"));
    assert_true(set_accepts("trainer.sync_lr_scale=linear"));
    assert_true(set_accepts("controller.policy=delay"));
    assert_true(set_accepts("controller.optimizer=adagrad"));
    assert_true(set_accepts("eval.format=csv"));
    assert_false(set_accepts("ingest.format=idx")); /* idx is for [eval] only */
    assert_false(set_accepts("model.loss=Softmax"));
    assert_false(set_accepts("model.loss=soft"));
    assert_false(set_accepts("model.loss="));
    assert_set_error(
        "trainer.mode=fast", FR_ERR_INVAL,
        "--set trainer.mode: expected one of async|sync|backup|groups|ssp|adaptive|auto, "
        "got 'fast'");
}

static void test_config_checks_bool_spellings(void **state)
{
    (void)state;
    static const char *const yes[] = {"true", "yes", "on", "1", "TRUE", "Yes"};
    static const char *const no[] = {"false", "no", "off", "0", "Off"};
    char assignment[64];
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        fr_config_t *cfg = fr_config_new();
        assert_non_null(cfg);
        snprintf(assignment, sizeof(assignment), "psstore.audit=%s", yes[i]);
        assert_set_ok(cfg, assignment);
        assert_int_equal(fr_config_get_bool(cfg, "psstore", "audit"), 1);
        fr_config_destroy(cfg);
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        fr_config_t *cfg = fr_config_new();
        assert_non_null(cfg);
        assert_set_ok(cfg, "psstore.audit=true");
        snprintf(assignment, sizeof(assignment), "psstore.audit=%s", no[i]);
        assert_set_ok(cfg, assignment);
        assert_int_equal(fr_config_get_bool(cfg, "psstore", "audit"), 0);
        fr_config_destroy(cfg);
    }
    assert_set_error("serve.protect_reads=maybe", FR_ERR_INVAL,
                     "--set serve.protect_reads: expected a boolean (true/false, yes/no, on/off, "
                     "1/0), got 'maybe'");
    assert_false(set_accepts("serve.protect_reads=2"));
    assert_false(set_accepts("serve.protect_reads="));
}

static void test_config_checks_integer_ranges(void **state)
{
    (void)state;
    assert_true(set_accepts("ingest.batch=1"));
    assert_true(set_accepts("ingest.batch=65536"));
    assert_false(set_accepts("ingest.batch=0"));
    assert_false(set_accepts("ingest.batch=65537"));
    assert_true(set_accepts("ingest.queue=1048576"));
    assert_false(set_accepts("ingest.queue=1048577"));
    assert_true(set_accepts("ingest.linger_ms=600000"));
    assert_false(set_accepts("ingest.linger_ms=600001"));
    assert_true(set_accepts("model.seed=9223372036854775807"));
    assert_false(set_accepts("model.seed=9223372036854775808"));
    assert_false(set_accepts("model.seed=-1"));
    assert_false(set_accepts("model.seed=12x"));
    assert_false(set_accepts("model.seed=1.5"));
    assert_false(set_accepts("model.seed="));
    assert_true(set_accepts("psstore.lease_ms=100"));
    assert_false(set_accepts("psstore.lease_ms=99"));
    assert_false(set_accepts("trainer.groups=0"));
    assert_true(set_accepts("controller.dc_ring=1024"));
    assert_false(set_accepts("controller.dc_ring=1025"));
    assert_set_error("ingest.batch=0", FR_ERR_INVAL,
                     "--set ingest.batch: expected an integer in 1..65536, got '0'");
    assert_set_error("trainer.backups=-2", FR_ERR_INVAL,
                     "--set trainer.backups: expected an integer >= 0, got '-2'");
}

static void test_config_checks_double_ranges(void **state)
{
    (void)state;
    assert_true(set_accepts("controller.lr=0.5"));
    assert_true(set_accepts("controller.lr=1e-9"));
    assert_false(set_accepts("controller.lr=0"));
    assert_false(set_accepts("controller.lr=-0.1"));
    assert_false(set_accepts("controller.lr=nan"));
    assert_false(set_accepts("controller.lr=inf"));
    assert_false(set_accepts("controller.lr=1e400"));
    assert_false(set_accepts("controller.lr=0.1x"));
    assert_false(set_accepts("controller.lr="));
    assert_true(set_accepts("controller.momentum=0"));
    assert_true(set_accepts("controller.momentum=0.999"));
    assert_false(set_accepts("controller.momentum=1"));
    assert_true(set_accepts("controller.clip_norm=0"));
    assert_false(set_accepts("controller.clip_norm=-1"));
    assert_true(set_accepts("psstore.snapshot_seconds=0"));
    assert_false(set_accepts("psstore.gap_timeout=0"));
    assert_set_error("controller.lr=0", FR_ERR_INVAL,
                     "--set controller.lr: expected a number > 0, got '0'");
    assert_set_error("controller.momentum=1", FR_ERR_INVAL,
                     "--set controller.momentum: expected a number in [0, 1), got '1'");
    assert_set_error("controller.dc_lambda=-1", FR_ERR_INVAL,
                     "--set controller.dc_lambda: expected a number >= 0, got '-1'");
}

static void test_config_checks_model_name(void **state)
{
    (void)state;
    char assignment[128];
    assert_true(set_accepts("model.name=mnist_v2.1-a"));
    assert_false(set_accepts("model.name="));
    assert_false(set_accepts("model.name=a/b"));
    assert_false(set_accepts("model.name=caf\xC3\xA9"));
    snprintf(assignment, sizeof(assignment), "model.name=%064d", 0);
    assert_true(set_accepts(assignment));
    snprintf(assignment, sizeof(assignment), "model.name=%065d", 0);
    assert_false(set_accepts(assignment));
}

static void test_config_checks_model_layers(void **state)
{
    (void)state;
    assert_true(set_accepts("model.layers=784-10"));
    assert_true(set_accepts("model.layers=1-1048576"));
    assert_true(set_accepts("model.layers=1-2-3-4-5-6-7-8-9-10-11-12-13-14-15-16"));
    assert_false(set_accepts("model.layers=1-2-3-4-5-6-7-8-9-10-11-12-13-14-15-16-17"));
    assert_false(set_accepts("model.layers=784"));
    assert_false(set_accepts("model.layers="));
    assert_false(set_accepts("model.layers=784--10"));
    assert_false(set_accepts("model.layers=-784-10"));
    assert_false(set_accepts("model.layers=784-10-"));
    assert_false(set_accepts("model.layers=0-10"));
    assert_false(set_accepts("model.layers=784-1048577"));
    assert_false(set_accepts("model.layers=784-a"));
    assert_false(set_accepts("model.layers=784 - 10"));
    assert_false(set_accepts("model.layers=99999999999999999999999-1"));
    assert_set_error("model.layers=784", FR_ERR_INVAL,
                     "--set model.layers: expected 2 to 16 layer widths in 1..1048576 joined by "
                     "'-', got '784'");
}

static void test_config_applies_environment_overrides(void **state)
{
    (void)state;
    fr_config_t *cfg = fr_config_new();
    assert_non_null(cfg);
    char errstr[512] = "";
    unsetenv("FRESHET_TOKEN");
    unsetenv("FRESHET_REDIS_URL");
    assert_int_equal(fr_config_apply_env(cfg, errstr, sizeof(errstr)), FR_OK);
    assert_string_equal(fr_config_get(cfg, "serve", "token"), "");
    assert_string_equal(fr_config_get(cfg, "redis", "url"), "redis://127.0.0.1:6379/0");

    assert_int_equal(load_text(cfg, "[serve]\ntoken = from-file\n", errstr, sizeof(errstr)), FR_OK);
    setenv("FRESHET_TOKEN", "from-env", 1);
    setenv("FRESHET_REDIS_URL", "unix:///run/redis.sock", 1);
    assert_int_equal(fr_config_apply_env(cfg, errstr, sizeof(errstr)), FR_OK);
    assert_string_equal(fr_config_get(cfg, "serve", "token"), "from-env");
    assert_string_equal(fr_config_get(cfg, "redis", "url"), "unix:///run/redis.sock");
    unsetenv("FRESHET_TOKEN");
    unsetenv("FRESHET_REDIS_URL");
    fr_config_destroy(cfg);
}

/* Reads a whole file into a malloc'ed NUL-terminated buffer. */
static char *read_whole_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
    } while (got > 0);
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static void test_config_example_file_matches_write_example(void **state)
{
    (void)state;
    char *generated = NULL;
    size_t genlen = 0;
    FILE *mem = open_memstream(&generated, &genlen);
    assert_non_null(mem);
    fr_config_write_example(mem);
    fclose(mem);

    size_t len = 0;
    char *file = read_whole_file(FRESHET_SOURCE_DIR "/deploy/freshet.conf.example", &len);
    assert_int_equal(len, genlen);
    assert_memory_equal(file, generated, len);
    free(file);
    free(generated);
}

/* Loads the example and checks that every "key = value" line in it holds
 * the default, so the example documents exactly what fr_config_new sets. */
static void test_config_example_file_loads_and_shows_every_default(void **state)
{
    (void)state;
    const char *path = FRESHET_SOURCE_DIR "/deploy/freshet.conf.example";
    fr_config_t *cfg = fr_config_new();
    fr_config_t *defaults = fr_config_new();
    assert_non_null(cfg);
    assert_non_null(defaults);
    char errstr[512] = "";
    fr_err_t err = fr_config_load_file(cfg, path, errstr, sizeof(errstr));
    if (err != FR_OK)
        fail_msg("%s", errstr);
    assert_int_equal(fr_config_kafka_count(cfg), 0);

    size_t len = 0;
    char *text = read_whole_file(path, &len);
    char section[64] = "";
    int nkeys = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (line[0] == '[') {
            snprintf(section, sizeof(section), "%.*s", (int)(strcspn(line + 1, "]")), line + 1);
            continue;
        }
        if (line[0] == '#')
            continue;
        char *eq = strstr(line, " =");
        assert_non_null(eq);
        *eq = '\0';
        const char *value = eq[2] == ' ' ? eq + 3 : eq + 2;
        assert_non_null(fr_config_get(defaults, section, line));
        assert_string_equal(fr_config_get(defaults, section, line), value);
        assert_string_equal(fr_config_get(cfg, section, line), value);
        nkeys++;
    }
    assert_int_equal(nkeys, 82);
    free(text);
    fr_config_destroy(cfg);
    fr_config_destroy(defaults);
}

/* A file with an error on line 3 changes nothing, not even lines 1-2. */
static void test_config_bad_file_changes_nothing(void **state)
{
    const char *path = FRESHET_BINARY_DIR "/test_config_partial.ini";
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("[trainer]\nworkers = 7\nmode = nonsense\n[kafka]\nacks = all\n", f);
    fclose(f);
    fr_config_t *cfg = fr_config_new();
    char err[256];
    assert_int_equal(fr_config_set(cfg, "kafka.linger.ms=5", err, sizeof(err)), FR_OK);
    assert_int_not_equal(fr_config_load_file(cfg, path, err, sizeof(err)), FR_OK);
    assert_non_null(strstr(err, ":3: [trainer] mode"));
    assert_int_equal(fr_config_get_int(cfg, "trainer", "workers"), 2);
    assert_int_equal(fr_config_kafka_count(cfg), 1);
    /* a good file applies over what was there */
    f = fopen(path, "w");
    fputs("[trainer]\nworkers = 7\n[kafka]\nacks = all\n", f);
    fclose(f);
    assert_int_equal(fr_config_load_file(cfg, path, err, sizeof(err)), FR_OK);
    assert_int_equal(fr_config_get_int(cfg, "trainer", "workers"), 7);
    assert_int_equal(fr_config_kafka_count(cfg), 2);
    fr_config_destroy(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_bad_file_changes_nothing),
        cmocka_unit_test(test_config_new_holds_every_default),
        cmocka_unit_test(test_config_getters_return_null_or_zero_for_unknown_or_mistyped_keys),
        cmocka_unit_test(test_config_load_file_applies_values_across_sections),
        cmocka_unit_test(test_config_load_skips_comments_and_blank_lines_and_keeps_hash_in_values),
        cmocka_unit_test(test_config_load_strips_optional_double_quotes),
        cmocka_unit_test(test_config_keeps_kafka_properties_in_order_and_replaces_duplicates),
        cmocka_unit_test(test_config_rejects_unknown_key_with_file_and_line),
        cmocka_unit_test(test_config_rejects_unknown_section_with_file_and_line),
        cmocka_unit_test(test_config_rejects_bad_integer_with_file_line_and_key),
        cmocka_unit_test(test_config_rejects_a_line_without_equals),
        cmocka_unit_test(test_config_rejects_an_unterminated_section_header),
        cmocka_unit_test(test_config_rejects_text_after_a_section_header),
        cmocka_unit_test(test_config_rejects_an_empty_section_name_and_an_empty_key),
        cmocka_unit_test(test_config_rejects_a_key_outside_a_section),
        cmocka_unit_test(test_config_stops_at_the_first_bad_line),
        cmocka_unit_test(test_config_reports_a_missing_file_as_io_error_with_path),
        cmocka_unit_test(test_config_rejects_a_nul_byte_in_a_line),
        cmocka_unit_test(test_config_set_overrides_a_key_after_the_file),
        cmocka_unit_test(test_config_set_splits_kafka_keys_at_the_first_dot),
        cmocka_unit_test(test_config_set_errors_name_the_key),
        cmocka_unit_test(test_config_checks_enum_values),
        cmocka_unit_test(test_config_checks_bool_spellings),
        cmocka_unit_test(test_config_checks_integer_ranges),
        cmocka_unit_test(test_config_checks_double_ranges),
        cmocka_unit_test(test_config_checks_model_name),
        cmocka_unit_test(test_config_checks_model_layers),
        cmocka_unit_test(test_config_applies_environment_overrides),
        cmocka_unit_test(test_config_example_file_matches_write_example),
        cmocka_unit_test(test_config_example_file_loads_and_shows_every_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
