/*
 * test_redis_url.c - unit tests of psstore_url_parse: the forms of
 * [redis] url (docs/operations.md "Configuration"), credentials with special characters, IPv6,
 * unix sockets, a Redis Cluster's seeds, the refusal of rediss://, error
 * messages that never repeat a password; and Redis Cluster's key slots.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "psstore/psstore.h"
#include "psstore/redis/redis_int.h"

/* Parses url and fails the test unless it succeeds. */
static psstore_url_t parse_ok(const char *url)
{
    psstore_url_t u;
    char errstr[512] = "";
    fr_err_t err = psstore_url_parse(url, &u, errstr, sizeof(errstr));
    if (err != FR_OK)
        fail_msg("'%s' refused: %s", url, errstr);
    return u;
}

/* Parses url, expects err, and checks that the message mentions needle and
 * does not contain secret (when given). */
static void parse_bad(const char *url, fr_err_t expect, const char *needle, const char *secret)
{
    psstore_url_t u;
    char errstr[512] = "";
    fr_err_t err = psstore_url_parse(url, &u, errstr, sizeof(errstr));
    if (err != expect)
        fail_msg("'%s': got %d, expected %d (%s)", url ? url : "(null)", err, expect, errstr);
    if (needle != NULL && strstr(errstr, needle) == NULL)
        fail_msg("'%s': message '%s' lacks '%s'", url ? url : "(null)", errstr, needle);
    if (secret != NULL && strstr(errstr, secret) != NULL)
        fail_msg("'%s': message '%s' shows the password", url, errstr);
    assert_string_equal(u.pass, ""); /* no password is left behind on error */
}

static void test_url_host_alone_takes_the_defaults(void **state)
{
    (void)state;
    psstore_url_t u = parse_ok("redis://localhost");
    assert_false(u.unix_socket);
    assert_string_equal(u.host, "localhost");
    assert_int_equal(u.port, 6379);
    assert_int_equal(u.db, 0);
    assert_string_equal(u.user, "");
    assert_string_equal(u.pass, "");
    u = parse_ok("redis://localhost/");
    assert_int_equal(u.db, 0);
    u = parse_ok("REDIS://Redis.Example.COM");
    assert_string_equal(u.host, "Redis.Example.COM");
}

static void test_url_port_and_db(void **state)
{
    (void)state;
    psstore_url_t u = parse_ok("redis://127.0.0.1:6390/3");
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 6390);
    assert_int_equal(u.db, 3);
    u = parse_ok("redis://h:1");
    assert_int_equal(u.port, 1);
    u = parse_ok("redis://h:65535/15");
    assert_int_equal(u.port, 65535);
    assert_int_equal(u.db, 15);
    u = parse_ok("redis://my-host_1.internal/0");
    assert_string_equal(u.host, "my-host_1.internal");
}

static void test_url_credentials(void **state)
{
    (void)state;
    psstore_url_t u = parse_ok("redis://alice:s3cret@h:7000/2");
    assert_string_equal(u.user, "alice");
    assert_string_equal(u.pass, "s3cret");
    assert_string_equal(u.host, "h");
    assert_int_equal(u.port, 7000);
    assert_int_equal(u.db, 2);
    u = parse_ok("redis://:onlypass@h");
    assert_string_equal(u.user, "");
    assert_string_equal(u.pass, "onlypass");
    u = parse_ok("redis://bob:@h");
    assert_string_equal(u.user, "bob");
    assert_string_equal(u.pass, "");
    u = parse_ok("redis://:@h");
    assert_string_equal(u.user, "");
    assert_string_equal(u.pass, "");
}

static void test_url_passwords_with_special_characters(void **state)
{
    (void)state;
    /* percent-encoded */
    psstore_url_t u = parse_ok("redis://:p%40ss%3Aw%2Frd%25%20x@h");
    assert_string_equal(u.pass, "p@ss:w/rd% x");
    /* unencoded ':' and '@' in the password: the user ends at the first ':'
     * and the host starts after the last '@' */
    u = parse_ok("redis://u:a:b@c@h:6380/1");
    assert_string_equal(u.user, "u");
    assert_string_equal(u.pass, "a:b@c");
    assert_string_equal(u.host, "h");
    assert_int_equal(u.port, 6380);
    assert_int_equal(u.db, 1);
    /* a '/' and a '#' in the password */
    u = parse_ok("redis://:a/b#c@h/4");
    assert_string_equal(u.pass, "a/b#c");
    assert_int_equal(u.db, 4);
    /* a '%' that starts no escape stays literal */
    u = parse_ok("redis://:50%off%@h");
    assert_string_equal(u.pass, "50%off%");
    /* an encoded user name */
    u = parse_ok("redis://us%65r:x@h");
    assert_string_equal(u.user, "user");
}

static void test_url_ipv6_in_brackets(void **state)
{
    (void)state;
    psstore_url_t u = parse_ok("redis://[::1]:6390/2");
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 6390);
    assert_int_equal(u.db, 2);
    u = parse_ok("redis://:pw@[fe80::1:2]");
    assert_string_equal(u.host, "fe80::1:2");
    assert_int_equal(u.port, 6379);
    assert_string_equal(u.pass, "pw");
    parse_bad("redis://[]:6379", FR_ERR_INVAL, "IPv6", NULL);
    parse_bad("redis://[::1:6379", FR_ERR_INVAL, "IPv6", NULL);
    parse_bad("redis://[zz::1]:6379", FR_ERR_INVAL, "IPv6", NULL);
    parse_bad("redis://::1:6379", FR_ERR_INVAL, "host", NULL);
}

static void test_url_unix_sockets(void **state)
{
    (void)state;
    psstore_url_t u = parse_ok("unix:///run/redis/redis.sock");
    assert_true(u.unix_socket);
    assert_string_equal(u.path, "/run/redis/redis.sock");
    assert_int_equal(u.db, 0);
    u = parse_ok("unix:///tmp/r.sock?db=5");
    assert_string_equal(u.path, "/tmp/r.sock");
    assert_int_equal(u.db, 5);
    u = parse_ok("unix://:pw@/tmp/r.sock");
    assert_string_equal(u.pass, "pw");
    assert_string_equal(u.path, "/tmp/r.sock");
    /* an '@' in the path is the path's */
    u = parse_ok("unix:///run/redis@main/redis.sock?db=1");
    assert_string_equal(u.path, "/run/redis@main/redis.sock");
    assert_string_equal(u.pass, "");
    u = parse_ok("unix://u:p@w@/run/redis@main/r.sock");
    assert_string_equal(u.user, "u");
    assert_string_equal(u.pass, "p@w");
    assert_string_equal(u.path, "/run/redis@main/r.sock");
    parse_bad("unix://relative.sock", FR_ERR_INVAL, "absolute path", NULL);
    parse_bad("unix://", FR_ERR_INVAL, "absolute path", NULL);
    parse_bad("unix:///tmp/r.sock?database=1", FR_ERR_INVAL, "db=N", NULL);
    parse_bad("unix:///tmp/r.sock?db=x", FR_ERR_INVAL, "db=N", NULL);
    parse_bad("unix:///tmp/r.sock?db=", FR_ERR_INVAL, "db=N", NULL);
    char longpath[200] = "unix:///";
    memset(longpath + 8, 'a', 150);
    longpath[158] = '\0';
    parse_bad(longpath, FR_ERR_INVAL, "longer than", NULL);
}

/* A Redis Cluster's seeds: hosts separated by commas, each with its
 * port; credentials for all before them, the database after the last. */
static void test_url_several_hosts_name_a_cluster(void **state)
{
    (void)state;
    psstore_url_t u = parse_ok("redis://:pw@10.0.0.1:7000,10.0.0.2,[::1]:7002");
    assert_int_equal(u.nseeds, 3);
    assert_string_equal(u.seeds[0].host, "10.0.0.1");
    assert_int_equal(u.seeds[0].port, 7000);
    assert_string_equal(u.seeds[1].host, "10.0.0.2");
    assert_int_equal(u.seeds[1].port, 6379);
    assert_string_equal(u.seeds[2].host, "::1");
    assert_int_equal(u.seeds[2].port, 7002);
    assert_string_equal(u.host, "10.0.0.1"); /* the first host is the one tried first */
    assert_int_equal(u.port, 7000);
    assert_string_equal(u.pass, "pw");
    u = parse_ok("redis://h1:1,h2:2/0");
    assert_int_equal(u.nseeds, 2);
    assert_int_equal(u.seeds[1].port, 2);
    u = parse_ok("redis://h");
    assert_int_equal(u.nseeds, 1);
    parse_bad("redis://h1/0,h2", FR_ERR_INVAL, "after the last host", NULL);
    parse_bad("redis://h1,,h2", FR_ERR_INVAL, "no host", NULL);
    parse_bad("redis://h1,", FR_ERR_INVAL, "no host", NULL);
    parse_bad("redis://h1,h2:0", FR_ERR_INVAL, "1..65535", NULL);
    char many[400] = "redis://";
    for (int i = 0; i < PSSTORE_URL_SEEDS_MAX + 1; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sh%d", i ? "," : "", i);
    parse_bad(many, FR_ERR_INVAL, "more than 16 hosts", NULL);
}

/* Redis Cluster's CRC16 (XMODEM) and key slots: the check value of the
 * CRC catalogue, and slots as `CLUSTER KEYSLOT` gives them (test_cluster
 * compares many more against a real server). */
static void test_key_slots(void **state)
{
    (void)state;
    assert_int_equal(psstore_crc16("123456789", 9), 0x31c3);
    assert_int_equal(psstore_crc16("", 0), 0);
    assert_int_equal(psstore_key_slot("foo", 3), 12182);
    assert_int_equal(psstore_key_slot("bar", 3), 5061);
    /* the hash tag: only what is between the first { and the next } */
    assert_int_equal(psstore_key_slot("{foo}x", 6), 12182);
    assert_int_equal(psstore_key_slot("freshet:{foo}:w:0", 17), 12182);
    assert_int_equal(psstore_key_slot("a{foo}{bar}", 11), 12182);
    /* an empty or unclosed tag: the whole key */
    assert_int_equal(psstore_key_slot("{}foo", 5), psstore_crc16("{}foo", 5) & 16383);
    assert_int_equal(psstore_key_slot("{foo", 4), psstore_crc16("{foo", 4) & 16383);
}

/* Reply builders for the slot map test: hiredis's reply tree by hand. */
static redisReply *r_int(long long v)
{
    redisReply *r = calloc(1, sizeof(*r));
    r->type = REDIS_REPLY_INTEGER;
    r->integer = v;
    return r;
}

static redisReply *r_str(const char *s)
{
    redisReply *r = calloc(1, sizeof(*r));
    r->type = s ? REDIS_REPLY_STRING : REDIS_REPLY_NIL;
    r->str = s ? strdup(s) : NULL;
    r->len = s ? strlen(s) : 0;
    return r;
}

static redisReply *r_arr(size_t n, ...)
{
    redisReply *r = calloc(1, sizeof(*r));
    r->type = REDIS_REPLY_ARRAY;
    r->elements = n;
    r->element = calloc(n, sizeof(*r->element));
    va_list ap;
    va_start(ap, n);
    for (size_t i = 0; i < n; i++)
        r->element[i] = va_arg(ap, redisReply *);
    va_end(ap);
    return r;
}

/* CLUSTER SLOTS as Redis 7 answers it: ranges of [from, to, master,
 * replicas...]; an empty endpoint is the node asked, "?" or nil one the
 * cluster does not know (its slots stay without a node); MOVED and ASK
 * name host:port, IPv6 included. */
static void test_cluster_slot_map_and_redirections(void **state)
{
    (void)state;
    ps_cluster_t *cl = ps_cluster_new();
    assert_non_null(cl);
    redisReply *slots =
        r_arr(4,
              r_arr(4, r_int(0), r_int(5460), r_arr(3, r_str("10.0.0.1"), r_int(7000), r_str("a")),
                    r_arr(3, r_str("10.0.0.4"), r_int(7003), r_str("d"))),
              r_arr(3, r_int(5461), r_int(10922), r_arr(3, r_str(""), r_int(7001), r_str("b"))),
              r_arr(3, r_int(10923), r_int(16000), r_arr(3, r_str("?"), r_int(7002), r_str("c"))),
              r_arr(3, r_int(16001), r_int(16383), r_arr(3, r_str(NULL), r_int(7002), r_str("c"))));
    assert_int_equal(ps_cluster_load_slots(cl, slots, "10.0.0.9"), 10923);
    int a = cl->slot_node[0], b = cl->slot_node[5461];
    assert_true(a >= 0 && b >= 0 && a != b);
    assert_int_equal(cl->slot_node[5460], a);
    assert_string_equal(cl->nodes[a].host, "10.0.0.1");
    assert_int_equal(cl->nodes[a].port, 7000);
    assert_string_equal(cl->nodes[b].host, "10.0.0.9"); /* the node asked */
    assert_int_equal(cl->nodes[b].port, 7001);
    assert_int_equal(cl->slot_node[10923], -1);
    assert_int_equal(cl->slot_node[16383], -1);
    int masters[8];
    assert_int_equal(ps_cluster_masters(cl, masters, 8), 2);
    /* a reply that is no map leaves the map as it was */
    redisReply *bad = r_arr(1, r_arr(3, r_int(0), r_int(99999), r_arr(2, r_str("h"), r_int(1))));
    assert_int_equal(ps_cluster_load_slots(cl, bad, "h"), -1);
    assert_int_equal(cl->slot_node[0], a);
    freeReplyObject(slots);
    freeReplyObject(bad);

    int ask, slot, port;
    char host[256];
    const char *moved = "MOVED 3999 127.0.0.1:6381";
    assert_int_equal(
        ps_cluster_redirect(moved, strlen(moved), &ask, &slot, host, sizeof(host), &port), 0);
    assert_int_equal(ask, 0);
    assert_int_equal(slot, 3999);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 6381);
    const char *asking = "ASK 16383 fe80::1:7000";
    assert_int_equal(
        ps_cluster_redirect(asking, strlen(asking), &ask, &slot, host, sizeof(host), &port), 0);
    assert_int_equal(ask, 1);
    assert_string_equal(host, "fe80::1");
    assert_int_equal(port, 7000);
    const char *bads[] = {"MOVED 16384 h:1", "MOVED x h:1", "ASK 1 h", "ASK 1 h:0", "ERR x"};
    for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++)
        assert_int_equal(
            ps_cluster_redirect(bads[i], strlen(bads[i]), &ask, &slot, host, sizeof(host), &port),
            -1);
    /* the key of a command: the first argument after the name that starts
     * with freshet:, never SCAN's pattern */
    const char *set[] = {"SET", "freshet:{foo}:ver", "1"};
    const char *scan[] = {"SCAN", "0", "MATCH", "freshet:\\{foo\\}:*"};
    const char *multi[] = {"MULTI"};
    assert_int_equal(ps_argv_slot(3, set, NULL), 12182);
    assert_int_equal(ps_argv_slot(4, scan, NULL), -1);
    assert_int_equal(ps_argv_slot(1, multi, NULL), -1);
    const char resp[] = "*3\r\n$3\r\nSET\r\n$17\r\nfreshet:{foo}:ver\r\n$1\r\n1\r\n";
    assert_int_equal(ps_resp_slot(resp, sizeof(resp) - 1), 12182);
    assert_int_equal(ps_resp_slot(resp, 20), -1); /* cut short */
    ps_cluster_free(cl);
}

static void test_url_rediss_is_refused_with_a_pointer_to_a_proxy(void **state)
{
    (void)state;
    parse_bad("rediss://h:6380", FR_ERR_UNSUPPORTED, "TLS proxy", NULL);
    parse_bad("rediss://:topsecret@h:6380/0", FR_ERR_UNSUPPORTED, "stunnel", "topsecret");
    parse_bad("REDISS://h", FR_ERR_UNSUPPORTED, "hiredis 0.14 has no TLS", NULL);
}

static void test_url_bad_ports(void **state)
{
    (void)state;
    const char *bad[] = {"redis://h:0",     "redis://h:65536",   "redis://h:99999999999",
                         "redis://h:",      "redis://h:-1",      "redis://h:abc",
                         "redis://h:63 79", "redis://h:6379x/0", "redis://h:+6379"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        parse_bad(bad[i], FR_ERR_INVAL, NULL, NULL);
    parse_bad("redis://h:0", FR_ERR_INVAL, "1..65535", NULL);
    /* a password written where the port goes is not repeated */
    parse_bad("redis://h:hunter2", FR_ERR_INVAL, "port", "hunter2");
}

static void test_url_bad_databases_and_trailing_text(void **state)
{
    (void)state;
    parse_bad("redis://h/x", FR_ERR_INVAL, "database", NULL);
    parse_bad("redis://h/-1", FR_ERR_INVAL, "database", NULL);
    parse_bad("redis://h/1/2", FR_ERR_INVAL, "database", NULL);
    parse_bad("redis://h/99999999999", FR_ERR_INVAL, "database", NULL);
    parse_bad("redis://h?db=1", FR_ERR_INVAL, "unexpected", NULL);
}

static void test_url_other_schemes_and_garbage_are_refused_clearly(void **state)
{
    (void)state;
    parse_bad("http://x", FR_ERR_INVAL, "unsupported scheme 'http'", NULL);
    parse_bad("tcp://u:pw123@h:6379", FR_ERR_INVAL, "scheme 'tcp'", "pw123");
    parse_bad("localhost:6379", FR_ERR_INVAL, "redis://", NULL);
    parse_bad("u:pw123@localhost", FR_ERR_INVAL, "redis://", "pw123");
    parse_bad("", FR_ERR_INVAL, "empty", NULL);
    parse_bad(NULL, FR_ERR_INVAL, "empty", NULL);
    parse_bad("redis://", FR_ERR_INVAL, "no host", NULL);
    parse_bad("redis://:pw123@", FR_ERR_INVAL, "no host", "pw123");
    parse_bad("redis://h ost", FR_ERR_INVAL, "control characters", NULL);
    parse_bad("redis://h\n", FR_ERR_INVAL, "control characters", NULL);
    parse_bad("redis://pw123@h", FR_ERR_INVAL, "USER:PASSWORD@", "pw123");
    parse_bad("redis://:p%00w@h", FR_ERR_INVAL, "password", NULL);
}

static void test_url_long_credentials_are_refused(void **state)
{
    (void)state;
    char url[1024];
    int n = snprintf(url, sizeof(url), "redis://:");
    memset(url + n, 'p', 300);
    snprintf(url + n + 300, sizeof(url) - (size_t)n - 300, "@h");
    parse_bad(url, FR_ERR_INVAL, "password is longer", "pppppppp");
    n = snprintf(url, sizeof(url), "redis://");
    memset(url + n, 'u', 200);
    snprintf(url + n + 200, sizeof(url) - (size_t)n - 200, ":pw@h");
    parse_bad(url, FR_ERR_INVAL, "user name is longer", NULL);
    n = snprintf(url, sizeof(url), "redis://");
    memset(url + n, 'h', 300);
    url[n + 300] = '\0';
    parse_bad(url, FR_ERR_INVAL, "host name too long", NULL);
}

/* psstore_conn_new reports URL errors the same way, before any network. */
static void test_url_errors_reach_conn_new(void **state)
{
    (void)state;
    char errstr[512] = "";
    assert_null(psstore_conn_new("http://x", 100, errstr, sizeof(errstr)));
    assert_non_null(strstr(errstr, "unsupported scheme"));
    assert_null(psstore_conn_new("rediss://:sekrit@h", 100, errstr, sizeof(errstr)));
    assert_non_null(strstr(errstr, "TLS proxy"));
    assert_null(strstr(errstr, "sekrit"));
    assert_string_equal(psstore_conn_error(NULL), "redis: no connection");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_host_alone_takes_the_defaults),
        cmocka_unit_test(test_url_port_and_db),
        cmocka_unit_test(test_url_credentials),
        cmocka_unit_test(test_url_passwords_with_special_characters),
        cmocka_unit_test(test_url_ipv6_in_brackets),
        cmocka_unit_test(test_url_unix_sockets),
        cmocka_unit_test(test_url_rediss_is_refused_with_a_pointer_to_a_proxy),
        cmocka_unit_test(test_url_bad_ports),
        cmocka_unit_test(test_url_bad_databases_and_trailing_text),
        cmocka_unit_test(test_url_other_schemes_and_garbage_are_refused_clearly),
        cmocka_unit_test(test_url_long_credentials_are_refused),
        cmocka_unit_test(test_url_errors_reach_conn_new),
        cmocka_unit_test(test_url_several_hosts_name_a_cluster),
        cmocka_unit_test(test_key_slots),
        cmocka_unit_test(test_cluster_slot_map_and_redirections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
