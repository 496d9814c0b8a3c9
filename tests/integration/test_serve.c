/*
 * test_serve.c - the HTTP service against a real redis-server and a real
 * applier, with curl as the client (docs/design.md "Snapshots and publishing").
 *
 * The test plays the trainers through the client API: each push is applied
 * by the applier thread, and serve (in this process, on a free port) must
 * publish exactly the weights Redis holds, with the right ETag, wake
 * long-poll clients, keep snapshots, refuse what it must, and render a
 * dashboard a headless Chromium loads without errors.
 */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/ssl.h>

#include "harness.h"
#include "psstore/psstore.h"
#include "serve/serve.h"

#define MODEL   "sv"
#define LAYERS  "5-4-3"
#define NPARAMS 39 /* 5*4 + 4 + 4*3 + 3 */
#define TOKEN   "t0ken-for-tests"
#define WAITERS 500

/* SSL_new, wrapped at link time (-Wl,--wrap=SSL_new in tests/CMakeLists.txt):
 * fails while ssl_new_fails is set, as it does out of memory */
static atomic_int ssl_new_fails;
SSL *__real_SSL_new(SSL_CTX *ctx);
SSL *__wrap_SSL_new(SSL_CTX *ctx);
SSL *__wrap_SSL_new(SSL_CTX *ctx)
{
    return atomic_load(&ssl_new_fails) ? NULL : __real_SSL_new(ctx);
}

static harness_redis_t redis;
static harness_applier_t applier;
static char tmp_dir[256];
static char errstr[512];
static fr_metrics_t *metrics;
static serve_t *srv;
static int port;
static psstore_client_t *client;
static int pushes;

/* ---- helpers ------------------------------------------------------------- */

static void http(harness_resp_t *r, const char *args, const char *path)
{
    harness_http(port, tmp_dir, r, args, path);
}

static void store_weights(float *w, uint64_t *epoch, int64_t *version)
{
    assert_int_equal(harness_model_weights(&redis, MODEL, w, NPARAMS, epoch, version), 0);
}

static int64_t redis_int(const char *fmt, const char *arg)
{
    char out[256];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), fmt, arg), 0);
    return strcmp(out, "(nil)") == 0 ? -1 : strtoll(out, NULL, 10);
}

/* Pushes one gradient on the current weights and waits for its version. */
static int64_t push(void)
{
    float w[NPARAMS], g[NPARAMS];
    uint64_t epoch;
    int64_t version, now;
    store_weights(w, &epoch, &version);
    harness_gradient(g, NPARAMS, 7000 + (uint64_t)pushes);
    psstore_range_t range = {"t", 0, pushes * 10, pushes * 10 + 10};
    psstore_grad_t gr = {.epoch = epoch,
                         .version = version,
                         .worker = "h/1/0",
                         .n = 10,
                         .loss_sum = 10.0 * (1.0 + pushes),
                         .ranges = &range,
                         .nranges = 1,
                         .g = g,
                         .len = NPARAMS,
                         /* samples 500 and 100 ms old at the push */
                         .ts_min_ms = fr_clock_unix_ms() - 500,
                         .ts_max_ms = fr_clock_unix_ms() - 100};
    pushes++;
    assert_int_equal(psstore_push(client, &gr, 2000), FR_OK);
    for (int i = 0; i < 500; i++) {
        store_weights(w, &epoch, &now);
        if (now > version)
            return now;
        harness_sleep_ms(5);
    }
    fail_msg("the applier did not apply a gradient within 2.5 s");
    return -1;
}

/* Waits until serve publishes version (ETag of the weights). */
static void await_version(int64_t version)
{
    harness_resp_t r;
    char want[64];
    for (int i = 0; i < 200; i++) {
        http(&r, "", "/v2/models/" MODEL "/weights?format=raw");
        int ok = r.code == 200 &&
                 harness_resp_header(&r, "X-Freshet-Version", want, sizeof(want)) == 0 &&
                 strtoll(want, NULL, 10) == version;
        harness_resp_free(&r);
        if (ok)
            return;
        harness_sleep_ms(20);
    }
    fail_msg("serve did not publish version %lld within 4 s", (long long)version);
}

static double series_value(const char *name, const char *model)
{
    size_t len;
    char *text = fr_metrics_render(metrics, &len);
    assert_non_null(text);
    char needle[256];
    if (model != NULL)
        snprintf(needle, sizeof(needle), "\n%s{model=\"%s\"} ", name, model);
    else
        snprintf(needle, sizeof(needle), "\n%s ", name);
    const char *p = strstr(text, needle);
    double v = p != NULL ? strtod(p + strlen(needle), NULL) : NAN;
    free(text);
    return v;
}

/* The value of name{model="MODEL",by="by"}. */
static double series_value_by(const char *name, const char *by)
{
    size_t len;
    char *text = fr_metrics_render(metrics, &len);
    assert_non_null(text);
    char needle[256];
    snprintf(needle, sizeof(needle), "\n%s{model=\"%s\",by=\"%s\"} ", name, MODEL, by);
    const char *p = strstr(text, needle);
    double v = p != NULL ? strtod(p + strlen(needle), NULL) : 0.0;
    free(text);
    return v;
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return kb;
}

/* The settings of the servers this test starts: a free port, this test's
 * store and model, the token. */
static void test_conf(serve_conf_t *conf)
{
    serve_conf_init(conf);
    conf->listen = "127.0.0.1:0";
    conf->redis_url = redis.url;
    conf->model = MODEL;
    conf->token = TOKEN;
    conf->metrics = metrics;
}

/* ---- tests ----------------------------------------------------------------- */
/* A connection to 127.0.0.1:to; fails the test when refused. */
static int raw_connect(int to)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)to)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Reads from fd until the server closes it (read 0 or an error) or
 * timeout_ms pass; the seconds it took, or -1 when it stayed open. Bytes
 * read go into out[size] ('\0'-ended) when out is not NULL. */
static double await_close(int fd, int timeout_ms, char *out, size_t size)
{
    uint64_t t0 = fr_clock_mono_ns();
    size_t got = 0;
    char sink[4096];
    for (;;) {
        int left = timeout_ms - (int)((fr_clock_mono_ns() - t0) / 1000000);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return -1;
        char *dst = out != NULL && got + 1 < size ? out + got : sink;
        size_t room = out != NULL && got + 1 < size ? size - 1 - got : sizeof(sink);
        ssize_t n = read(fd, dst, room);
        if (n <= 0)
            break;
        if (dst != sink)
            got += (size_t)n;
    }
    if (out != NULL)
        out[got] = '\0';
    return (double)(fr_clock_mono_ns() - t0) * 1e-9;
}

static void test_health_models_and_errors(void **state)
{
    (void)state;
    harness_resp_t r;
    http(&r, "", "/livez");
    harness_expect(&r, 200, "\"live\":true");
    harness_resp_free(&r);
    const char *ready[] = {"/readyz", "/healthz", "/v2/health/ready", "/v2/models/" MODEL "/ready"};
    for (size_t i = 0; i < sizeof(ready) / sizeof(ready[0]); i++) {
        http(&r, "", ready[i]);
        harness_expect(&r, 200, NULL);
        harness_expect_header(&r, "Content-Type", "application/json");
        harness_resp_free(&r);
    }
    http(&r, "", "/v2/health/live");
    harness_expect(&r, 200, NULL);
    harness_resp_free(&r);

    http(&r, "", "/v2/models");
    harness_expect(&r, 200, "\"models\":[\"" MODEL "\"]");
    harness_expect(&r, 200, "\"default\":\"" MODEL "\"");
    harness_resp_free(&r);
    /* the applier writes its mode into meta when it takes the lease; serve
     * reads meta at least once a second */
    for (int i = 0; i < 30; i++) {
        http(&r, "", "/v2/models/" MODEL);
        if (strstr(r.body, "\"mode\":\"async\"") != NULL)
            break;
        harness_resp_free(&r);
        harness_sleep_ms(100);
    }
    harness_expect(&r, 200, "\"platform\":\"freshet\"");
    harness_expect(&r, 200, "\"name\":\"" MODEL "\"");
    harness_expect(&r, 200, "\"layers\":\"" LAYERS "\",\"loss\":\"softmax\"");
    harness_expect(&r, 200, "\"shape\":[-1,5]");
    harness_expect(&r, 200, "\"mode\":\"async\"");
    harness_resp_free(&r);

    /* errors: JSON with the right status, never a crash */
    struct {
        const char *args, *path;
        int code;
        const char *needle;
    } bad[] = {
        {"", "/v2/models/nope", 404, "no model 'nope'"},
        {"", "/v2/models/nope/weights", 404, "no model 'nope'"},
        {"", "/v2/models/b%7Bad/weights", 404, "names match"},
        {"", "/no/such/route", 404, "no route"},
        {"", "/v2/models/" MODEL "/weights?format=xml", 400, "format must be"},
        {"", "/v2/models/" MODEL "/weights?wait=3", 400, "wait needs after_version"},
        {"", "/v2/models/" MODEL "/weights?after_version=1&wait=31", 400, "0 to 30"},
        {"", "/v2/models/" MODEL "/weights?after_version=-4", 400, "after_version"},
        {"", "/v2/models/" MODEL "/versions/abc/weights", 400, "bad version"},
        {"", "/v2/models/" MODEL "/versions/999999/weights", 404, "retains no snapshot"},
        {"-X DELETE", "/v2/models/" MODEL, 405, "not allowed"},
        {"-X POST", "/v2/models/" MODEL "/weights", 405, "not allowed"},
        {"", "/v2/models/" MODEL "/replay", 405, "not allowed"},
        {"", "/v2/models/" MODEL "/weights?format=raw&%zz", 400, "malformed"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        http(&r, bad[i].args, bad[i].path);
        if (r.code != bad[i].code)
            fail_msg("%s %s: status %d, expected %d: %.*s", bad[i].args, bad[i].path, r.code,
                     bad[i].code, (int)r.len, r.body);
        harness_expect(&r, bad[i].code, bad[i].needle);
        harness_expect(&r, bad[i].code, "{\"error\":");
        harness_expect_header(&r, "Content-Type", "application/json");
        harness_resp_free(&r);
    }
    /* malformed HTTP: refused with 400 by the parser or by serve, and the
     * server goes on answering */
    static const char *const raw[] = {
        "GARBAGE\r\n\r\n",
        "GET /v2/models/%00x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
        char got[1024];
        harness_raw_exchange(port, raw[i], got, sizeof(got));
        if (strncmp(got, "HTTP/1.1 400 ", 13) != 0)
            fail_msg("request %zu was answered: %.100s", i, got);
    }
    char huge[40000];
    int hl = snprintf(huge, sizeof(huge), "GET /livez HTTP/1.1\r\nX: ");
    memset(huge + hl, 'a', 30000);
    snprintf(huge + hl + 30000, sizeof(huge) - (size_t)hl - 30000, "\r\n\r\n");
    char got[1024];
    harness_raw_exchange(port, huge, got, sizeof(got));
    assert_int_equal(strncmp(got, "HTTP/1.1 400 ", 13), 0); /* headers over 16 KiB */
    http(&r, "", "/livez");
    harness_expect(&r, 200, NULL);
    harness_resp_free(&r);

    /* a body over [serve] max_body (4096 here) is refused */
    char args[400], big[320];
    snprintf(big, sizeof(big), "%s/big.txt", tmp_dir);
    FILE *f = fopen(big, "w");
    assert_non_null(f);
    for (int i = 0; i < 10000; i++)
        fputc('a', f);
    fclose(f);
    snprintf(args, sizeof(args), "-H 'Authorization: Bearer " TOKEN "' --data-binary @%s", big);
    http(&r, args, "/v2/models/" MODEL "/rollback");
    assert_int_equal(r.code, 413);
    harness_resp_free(&r);
}

/* The JSON weights of r hold the first layer's 20 weights of w, to the
 * float. */
static void expect_json_weights(const harness_resp_t *r, const float *w)
{
    const char *data = strstr(r->body, "\"layers.0.weight\":{\"shape\":[4,5],\"data\":[");
    assert_non_null(data);
    data = strchr(strchr(data, '[') + 1, '[') + 1;
    for (int i = 0; i < 20; i++) {
        char *end;
        float x = strtof(data, &end);
        if (end == data || x != w[i])
            fail_msg("JSON weight %d: %.20s, want %.9g", i, data, (double)w[i]);
        data = end + 1;
    }
}

/* Every format of one version, checked against the same store state: it
 * stays one test (137 lines) because split up, each part would push and
 * wait for a version of its own, and the formats would no longer be
 * compared on the same weights. */
static void test_weights_equal_the_store_in_every_format(void **state)
{
    (void)state;
    push();
    int64_t v = push();
    await_version(v);
    float w[NPARAMS];
    uint64_t epoch;
    int64_t version;
    store_weights(w, &epoch, &version);
    assert_int_equal(version, v);
    char etag[64], num[32];
    snprintf(etag, sizeof(etag), "\"%llu-v%lld\"", (unsigned long long)epoch, (long long)version);

    harness_resp_t r;
    char path[320];
    snprintf(path, sizeof(path), "%s/w.safetensors", tmp_dir);
    http(&r, "", "/v2/models/" MODEL "/weights");
    harness_expect(&r, 200, NULL);
    harness_expect_header(&r, "ETag", etag);
    harness_expect_header(&r, "Cache-Control", "no-cache");
    harness_expect_header(&r, "Content-Type", "application/octet-stream");
    snprintf(num, sizeof(num), "%lld", (long long)version);
    harness_expect_header(&r, "X-Freshet-Version", num);
    snprintf(num, sizeof(num), "%llu", (unsigned long long)epoch);
    harness_expect_header(&r, "X-Freshet-Epoch", num);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(r.body, 1, r.len, f);
    fclose(f);
    /* the raw payload is the tail of the safetensors image */
    size_t st_len = r.len;
    char *st = r.body;
    r.body = NULL;
    http(&r, "", "/v2/models/" MODEL "/weights?format=raw");
    harness_expect(&r, 200, NULL);
    assert_int_equal(r.len, NPARAMS * sizeof(float));
    assert_memory_equal(r.body, w, NPARAMS * sizeof(float));
    assert_memory_equal(st + st_len - r.len, w, NPARAMS * sizeof(float));
    harness_expect_header(&r, "ETag", etag);
    harness_resp_free(&r);
    free(st);

    /* numpy reads the file as a client would, and it equals Redis's weights */
    char rawpath[320], cmd[2048];
    snprintf(rawpath, sizeof(rawpath), "%s/w.f32", tmp_dir);
    f = fopen(rawpath, "wb");
    assert_non_null(f);
    fwrite(w, sizeof(float), NPARAMS, f);
    fclose(f);
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 - %s %s %lld <<'EOF'\n"
             "import json, struct, sys\n"
             "import numpy as np\n"
             "b = open(sys.argv[1], 'rb').read()\n"
             "n = struct.unpack('<Q', b[:8])[0]\n"
             "assert n %% 8 == 0, 'header not padded to 8'\n"
             "h = json.loads(b[8:8 + n])\n"
             "meta = h.pop('__metadata__')\n"
             "assert meta['format'] == 'pt' and meta['freshet.version'] == sys.argv[3], meta\n"
             "assert meta['freshet.layers'] == '5-4-3' and meta['freshet.loss'] == 'softmax'\n"
             "assert meta['freshet.offsets'] == 't/0=20', meta\n"
             "data = b[8 + n:]\n"
             "end = max(t['data_offsets'][1] for t in h.values())\n"
             "assert end == len(data), 'file size is not exact'\n"
             "parts = []\n"
             "for l, (o, i) in enumerate([(4, 5), (3, 4)]):\n"
             "    for name, shape in (('weight', [o, i]), ('bias', [o])):\n"
             "        t = h['layers.%%d.%%s' %% (l, name)]\n"
             "        assert t['dtype'] == 'F32' and t['shape'] == shape, t\n"
             "        a, z = t['data_offsets']\n"
             "        parts.append(np.frombuffer(data[a:z], dtype='<f4').reshape(shape).ravel())\n"
             "got = np.concatenate(parts)\n"
             "want = np.fromfile(sys.argv[2], dtype='<f4')\n"
             "assert got.shape == want.shape and np.array_equal(got, want), (got, want)\n"
             "print('numpy: %%d floats equal' %% got.size)\n"
             "EOF",
             path, rawpath, (long long)version);
    assert_int_equal(system(cmd), 0);

    /* JSON: the same numbers, to the float */
    http(&r, "", "/v2/models/" MODEL "/weights?format=json");
    harness_expect(&r, 200, "\"layers.1.bias\":{\"shape\":[3]");
    harness_expect_header(&r, "Content-Type", "application/json");
    expect_json_weights(&r, w);
    harness_resp_free(&r);
    /* HEAD: the headers GET would send (Content-Length included), no body;
     * the connection stays usable for the next request */
    http(&r, "-I", "/v2/models/" MODEL "/weights");
    harness_expect(&r, 200, NULL);
    assert_true(r.len < 1024); /* (curl -I writes the headers as its output) */
    snprintf(num, sizeof(num), "%zu", st_len);
    harness_expect_header(&r, "Content-Length", num);
    harness_expect_header(&r, "ETag", etag);
    harness_resp_free(&r);
    char cmd2[512], both[4096];
    snprintf(cmd2, sizeof(cmd2),
             "curl -sS -I 'http://127.0.0.1:%d/v2/models/" MODEL "/weights' --next -sS "
             "'http://127.0.0.1:%d/livez'",
             port, port);
    FILE *pf = popen(cmd2, "r");
    assert_non_null(pf);
    size_t nboth = fread(both, 1, sizeof(both) - 1, pf);
    both[nboth] = '\0';
    assert_int_equal(pclose(pf), 0);
    if (nboth >= 2000 || strstr(both, "{\"live\":true}") == NULL)
        fail_msg("HEAD then GET on one connection gave %zu bytes: %.300s", nboth, both);

    /* If-None-Match with the current ETag: 304 and no body */
    char args[128];
    snprintf(args, sizeof(args), "-H 'If-None-Match: %s'", etag);
    http(&r, args, "/v2/models/" MODEL "/weights");
    assert_int_equal(r.code, 304);
    assert_int_equal(r.len, 0);
    harness_expect_header(&r, "ETag", etag);
    harness_resp_free(&r);
    http(&r, "-H 'If-None-Match: \"1-v1\"'", "/v2/models/" MODEL "/weights");
    assert_int_equal(r.code, 200);
    harness_resp_free(&r);

    /* the JSON request above made the loop encode the JSON; the next versions are
     * encoded by the follower, before they are published */
    double by_request = series_value_by("freshet_serve_json_encodes_total", "request");
    double by_follower = series_value_by("freshet_serve_json_encodes_total", "follower");
    assert_true(by_request >= 1);
    int64_t next = push();
    await_version(next);
    store_weights(w, &epoch, &version);
    assert_int_equal(version, next);
    http(&r, "", "/v2/models/" MODEL "/weights?format=json");
    char want[96];
    snprintf(want, sizeof(want), "\"version\":%lld,", (long long)next);
    harness_expect(&r, 200, want);
    expect_json_weights(&r, w);
    harness_resp_free(&r);
    assert_true(series_value_by("freshet_serve_json_encodes_total", "follower") >= by_follower + 1);
    assert_true(series_value_by("freshet_serve_json_encodes_total", "request") == by_request);
}

static void test_long_poll_times_out_and_wakes_on_a_push(void **state)
{
    (void)state;
    int64_t v = push();
    await_version(v);
    char path[256];
    harness_resp_t r;
    /* nothing newer within wait=1: 304 after a second (not sooner; and
     * within 10 s, 10 times the wait, so that only a request that waited
     * on past its second fails, however slow the machine) */
    snprintf(path, sizeof(path), "/v2/models/" MODEL "/weights?after_version=%lld&wait=1",
             (long long)v);
    uint64_t t0 = fr_clock_mono_ns();
    http(&r, "", path);
    double secs = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    assert_int_equal(r.code, 304);
    assert_true(secs >= 0.95 && secs < 10.0);
    harness_resp_free(&r);
    /* the same on a server that has not read the weights yet (they are
     * read for the request, W_FRESH): it reads version v, which the client
     * has, and waits the rest of the second */
    serve_conf_t conf;
    test_conf(&conf);
    conf.model = ""; /* so nothing follows MODEL before a request */
    serve_t *fresh = serve_new(&conf, errstr, sizeof(errstr));
    if (fresh == NULL)
        fail_msg("%s", errstr);
    assert_int_equal(serve_start(fresh, errstr, sizeof(errstr)), FR_OK);
    for (int i = 0; i < 100; i++) { /* the list, which reads no weights */
        harness_http(serve_port(fresh), tmp_dir, &r, "", "/v2/models");
        int listed = r.code == 200 && strstr(r.body, "\"" MODEL "\"") != NULL;
        harness_resp_free(&r);
        if (listed)
            break;
        harness_sleep_ms(20);
    }
    t0 = fr_clock_mono_ns();
    harness_http(serve_port(fresh), tmp_dir, &r, "", path);
    secs = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    char got[64] = "";
    assert_int_equal(harness_resp_header(&r, "X-Freshet-Version", got, sizeof(got)), 0);
    if (r.code != 304 || strtoll(got, NULL, 10) != v || secs < 0.95 || secs >= 10.0)
        fail_msg("a first long-poll for the current version: %d, version %s after %.2f s", r.code,
                 got, secs);
    harness_resp_free(&r);
    serve_destroy(fresh);
    /* an older after_version is answered at once, not after its wait of 20
     * s (10 s: half of it, whatever the machine's load) */
    snprintf(path, sizeof(path), "/v2/models/" MODEL "/weights?after_version=%lld&wait=20",
             (long long)v - 1);
    t0 = fr_clock_mono_ns();
    http(&r, "", path);
    assert_int_equal(r.code, 200);
    assert_true((double)(fr_clock_mono_ns() - t0) * 1e-9 < 10.0);
    harness_resp_free(&r);
    /* a waiting client gets the next version as soon as it exists */
    char cmd[512], out[320];
    snprintf(out, sizeof(out), "%s/lp.txt", tmp_dir);
    snprintf(cmd, sizeof(cmd),
             "curl -s -o /dev/null -D %s 'http://127.0.0.1:%d/v2/models/" MODEL
             "/weights?after_version=%lld&wait=20' &",
             out, port, (long long)v);
    assert_int_equal(system(cmd), 0);
    for (int i = 0; i < 1000 && series_value("freshet_http_longpoll_waiting", NULL) < 1; i++)
        harness_sleep_ms(10);
    assert_true(series_value("freshet_http_longpoll_waiting", NULL) == 1);
    int64_t next = push();
    t0 = fr_clock_mono_ns();
    size_t len = 0;
    char *h = NULL;
    for (int i = 0; i < 1000; i++) { /* within 10 s of the push: its wait is 20 */
        free(h);
        h = harness_read_file(out, &len);
        if (h != NULL && strstr(h, "\r\n\r\n") != NULL)
            break;
        harness_sleep_ms(10);
    }
    assert_non_null(h);
    char want[64];
    snprintf(want, sizeof(want), "X-Freshet-Version: %lld", (long long)next);
    if (strstr(h, "HTTP/1.1 200") == NULL || strstr(h, want) == NULL)
        fail_msg("long-poll answer: %s", h);
    free(h);
    fprintf(stderr, "long-poll answered %.1f ms after the version was committed\n",
            (double)(fr_clock_mono_ns() - t0) * 1e-6);
}

/* Opens a connection with a long-poll request for after_version; -1 on error. */
static int open_waiter(int64_t after)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof(req),
                     "GET /v2/models/" MODEL "/weights?format=raw&after_version=%lld&wait=25 "
                     "HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                     (long long)after);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    return fd;
}

static void test_500_waiters_wake_together_and_hangups_are_dropped(void **state)
{
    (void)state;
    int64_t v = push();
    await_version(v);
    long rss0 = rss_kb();
    static int fds[WAITERS];
    for (int i = 0; i < WAITERS; i++) {
        fds[i] = open_waiter(v);
        assert_true(fds[i] >= 0);
    }
    for (int i = 0; i < 500 && series_value("freshet_http_longpoll_waiting", NULL) < WAITERS; i++)
        harness_sleep_ms(10);
    assert_true(series_value("freshet_http_longpoll_waiting", NULL) == WAITERS);
    long rss1 = rss_kb();
    fprintf(stderr, "%d long-poll clients waiting: RSS +%ld kB\n", WAITERS, rss1 - rss0);
    assert_true(rss1 - rss0 < 16 * 1024); /* no thread, no buffer per client */

    /* a client that hangs up is dropped at once */
    close(fds[0]);
    fds[0] = -1;
    for (int i = 0; i < 100 && series_value("freshet_http_longpoll_waiting", NULL) > WAITERS - 1;
         i++)
        harness_sleep_ms(5);
    assert_true(series_value("freshet_http_longpoll_waiting", NULL) == WAITERS - 1);

    /* a new version: every other one is answered with it */
    float w[NPARAMS];
    uint64_t epoch;
    int64_t before;
    store_weights(w, &epoch, &before);
    int64_t next = push(); /* returns once Redis holds it */
    uint64_t t_commit = fr_clock_mono_ns(), t_last = 0;
    int answered = 0;
    static char buf[WAITERS][512];
    static size_t got[WAITERS];
    memset(got, 0, sizeof(got));
    struct pollfd pfd[WAITERS];
    while (answered < WAITERS - 1 && fr_clock_mono_ns() - t_commit < 10000000000ull) {
        int n = 0;
        for (int i = 1; i < WAITERS; i++)
            if (fds[i] >= 0)
                pfd[n++] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        if (poll(pfd, (nfds_t)n, 100) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (!(pfd[k].revents & (POLLIN | POLLHUP)))
                continue;
            int i = 1;
            while (fds[i] != pfd[k].fd)
                i++;
            ssize_t r = read(fds[i], buf[i] + got[i], sizeof(buf[i]) - 1 - got[i]);
            if (r > 0)
                got[i] += (size_t)r;
            buf[i][got[i]] = '\0';
            if (strstr(buf[i], "\r\n\r\n") != NULL || r <= 0) {
                close(fds[i]);
                fds[i] = -1;
                answered++;
                t_last = fr_clock_mono_ns();
            }
        }
    }
    assert_int_equal(answered, WAITERS - 1);
    char want[64];
    snprintf(want, sizeof(want), "X-Freshet-Version: %lld", (long long)next);
    for (int i = 1; i < WAITERS; i++)
        if (strstr(buf[i], "HTTP/1.1 200 OK") == NULL || strstr(buf[i], want) == NULL)
            fail_msg("client %d got: %s", i, buf[i]);
    /* all answered with the new version within 10 s (the loop's limit) of
     * the commit, long before their wait of 25 s ends: woken, not timed
     * out. How soon is a speed (within 50 ms on an idle machine, 385 ms at
     * 30% of a core): bench/longpoll.sh measures it */
    double ms = (double)(t_last - t_commit) * 1e-6;
    fprintf(stderr, "%d clients answered within %.1f ms of the commit\n", WAITERS - 1, ms);
    for (int i = 0; i < 200 && series_value("freshet_http_longpoll_waiting", NULL) > 0; i++)
        harness_sleep_ms(5);
    assert_true(series_value("freshet_http_longpoll_waiting", NULL) == 0);
}

static void test_snapshots_metadata_and_metrics(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++)
        push();
    int64_t v = push();
    await_version(v);
    /* snapshot_every 2, retain 3: the newest three even versions */
    char out[4096];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "ZRANGE freshet:{%s}:snaps 0 -1", MODEL), 0);
    int64_t snaps[8];
    int ns = 0;
    for (char *p = out; *p && ns < 8;) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        snaps[ns++] = x;
        p = end;
    }
    assert_int_equal(ns, 3);
    harness_resp_t r;
    char path[256];
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(c);
    for (int i = 0; i < ns; i++) {
        float w[NPARAMS];
        uint64_t epoch;
        assert_int_equal(psstore_snapshot_weights(c, MODEL, snaps[i], w, NPARAMS, &epoch), FR_OK);
        snprintf(path, sizeof(path), "/v2/models/" MODEL "/versions/%lld/weights?format=raw",
                 (long long)snaps[i]);
        /* a snapshot listed but not read yet answers 503 (Retry-After)
         * while the follower reads it: asked again, it is served */
        harness_await_code(port, tmp_dir, &r, path, 200, 50, 100);
        harness_expect(&r, 200, NULL);
        assert_int_equal(r.len, sizeof(w));
        assert_memory_equal(r.body, w, sizeof(w));
        char etag[64];
        snprintf(etag, sizeof(etag), "\"%llu-v%lld\"", (unsigned long long)epoch,
                 (long long)snaps[i]);
        harness_expect_header(&r, "ETag", etag);
        harness_expect_header(&r, "Cache-Control", "no-cache"); /* the URL has no epoch */
        harness_resp_free(&r);
    }
    psstore_conn_destroy(c);
    /* trimmed ones are gone */
    snprintf(path, sizeof(path), "/v2/models/" MODEL "/versions/%lld/weights",
             (long long)snaps[0] - 2);
    http(&r, "", path);
    harness_expect(&r, 404, "retains no snapshot");
    harness_resp_free(&r);
    /* metadata lists the snapshots and the latest */
    http(&r, "", "/v2/models/" MODEL);
    char versions[128];
    if (snaps[2] == v)
        snprintf(versions, sizeof(versions), "\"versions\":[\"%lld\",\"%lld\",\"%lld\"]",
                 (long long)snaps[0], (long long)snaps[1], (long long)snaps[2]);
    else
        snprintf(versions, sizeof(versions), "\"versions\":[\"%lld\",\"%lld\",\"%lld\",\"%lld\"]",
                 (long long)snaps[0], (long long)snaps[1], (long long)snaps[2], (long long)v);
    harness_expect(&r, 200, versions);
    harness_resp_free(&r);

    /* /metrics parses with prometheus_client and says what serve publishes */
    char file[320], cmd[2048];
    snprintf(file, sizeof(file), "%s/metrics.txt", tmp_dir);
    http(&r, "", "/metrics");
    harness_expect(&r, 200, NULL);
    harness_expect_header(&r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fwrite(r.body, 1, r.len, f);
    fclose(f);
    harness_resp_free(&r);
    snprintf(
        cmd, sizeof(cmd),
        "/usr/bin/python3 - %s %lld <<'EOF'\n"
        "import sys, time\n"
        "from prometheus_client.parser import text_string_to_metric_families\n"
        "fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}\n"
        "def val(fam, **labels):\n"
        "    for s in fams[fam].samples:\n"
        "        if all(s.labels.get(k) == v for k, v in labels.items()):\n"
        "            return s.value\n"
        "    raise SystemExit('no sample %%s %%s' %% (fam, labels))\n"
        "assert val('freshet_serve_model_version', model='sv') == float(sys.argv[2])\n"
        "pub = val('freshet_model_published_timestamp_seconds', model='sv')\n"
        "assert abs(pub - time.time()) < 60, pub\n"
        "assert val('freshet_http_requests', route='weights', code='200') >= 5\n"
        "assert fams['freshet_gradients_applied'].type == 'counter'\n"
        "assert val('freshet_model_version', model='sv') == float(sys.argv[2])\n"
        "print('prometheus_client: %%d families' %% len(fams))\n"
        "EOF",
        file, (long long)v);
    assert_int_equal(system(cmd), 0);
}

/*
 * A server whose clients never ask for weights (freshet run's own, with
 * only the dashboard open) still lists the snapshots the applier retains:
 * in the stats, with published_ms, and in the metadata, without reading
 * any weights; a snapshot asked for is then read and served.
 */
static void test_snapshots_are_listed_without_reading_weights(void **state)
{
    (void)state;
    serve_conf_t conf;
    test_conf(&conf);
    fr_metrics_t *own = fr_metrics_new();
    conf.metrics = own;
    serve_t *p = serve_new(&conf, errstr, sizeof(errstr));
    assert_non_null(p);
    assert_int_equal(serve_start(p, errstr, sizeof(errstr)), FR_OK);
    int pt = serve_port(p);
    harness_resp_t r;
    harness_await_code(pt, tmp_dir, &r, "/readyz", 200, 250, 20); /* read once, for readiness */
    harness_resp_free(&r);
    char *text = fr_metrics_render(own, NULL);
    const char *line = strstr(text, "\nfreshet_serve_weights_reads_total{model=\"" MODEL "\"} ");
    assert_non_null(line);
    long reads = strtol(strchr(line, '}') + 2, NULL, 10);
    free(text);
    for (int i = 0; i < 4; i++) /* two more snapshots (snapshot_every 2) */
        push();
    int64_t newest = redis_int("ZRANGE freshet:{%s}:snaps -1 -1", MODEL);
    char out[4096], want[256];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "ZRANGE freshet:{%s}:snaps -1 -1 WITHSCORES", MODEL),
                     0);
    long long newest_ms = 0;
    assert_int_equal(
        sscanf(strchr(out, '\n') != NULL ? strchr(out, '\n') + 1 : out, "%lld", &newest_ms), 1);
    snprintf(want, sizeof(want), "{\"version\":%lld,\"time_ms\":%lld}]", (long long)newest,
             newest_ms);
    int listed = 0;
    for (int i = 0; i < 200 && !listed; i++) {
        harness_http(pt, tmp_dir, &r, "", "/v2/models/" MODEL "/stats");
        listed = r.code == 200 && strstr(r.body, want) != NULL;
        if (listed) {
            char pub[64];
            snprintf(pub, sizeof(pub), "\"published_ms\":%lld", newest_ms);
            harness_expect(&r, 200, pub);
        }
        harness_resp_free(&r);
        if (!listed)
            harness_sleep_ms(20);
    }
    if (!listed)
        fail_msg("the stats never listed snapshot %lld", (long long)newest);
    snprintf(want, sizeof(want), "\"%lld\"", (long long)newest);
    harness_http(pt, tmp_dir, &r, "", "/v2/models/" MODEL);
    harness_expect(&r, 200, want);
    harness_resp_free(&r);
    text = fr_metrics_render(own, NULL);
    line = strstr(text, "\nfreshet_serve_weights_reads_total{model=\"" MODEL "\"} ");
    assert_int_equal(strtol(strchr(line, '}') + 2, NULL, 10), reads); /* none read for it */
    free(text);
    /* asked for, the snapshot is read (503 meanwhile), then served */
    char path[128];
    snprintf(path, sizeof(path), "/v2/models/" MODEL "/versions/%lld/weights?format=raw",
             (long long)newest);
    harness_await_code(pt, tmp_dir, &r, path, 200, 200, 20);
    float w[NPARAMS];
    uint64_t epoch;
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(c);
    assert_int_equal(psstore_snapshot_weights(c, MODEL, newest, w, NPARAMS, &epoch), FR_OK);
    psstore_conn_destroy(c);
    assert_int_equal(r.code, 200);
    assert_int_equal(r.len, sizeof(w));
    assert_memory_equal(r.body, w, sizeof(w));
    harness_resp_free(&r);
    serve_destroy(p);
    fr_metrics_destroy(own);
}

static void test_stats_hold_the_store_s_numbers(void **state)
{
    (void)state;
    int64_t v = push();
    await_version(v);
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(c);
    assert_int_equal(psstore_eval_report(c, MODEL, v, 0.75, 0.5), FR_OK);
    psstore_logend_t ends[] = {{"t", 0, 1000, 10 * pushes}};
    assert_int_equal(psstore_logend_report(c, MODEL, ends, 1), FR_OK);
    psstore_conn_destroy(c);
    harness_resp_t r;
    char want[128];
    snprintf(want, sizeof(want), "\"version\":%lld,", (long long)v);
    int ok = 0;
    for (int i = 0; i < 40 && !ok; i++) {
        http(&r, "", "/v2/models/" MODEL "/stats");
        ok = r.code == 200 && strstr(r.body, want) != NULL &&
             strstr(r.body, "\"accuracy\":0.75") != NULL;
        if (!ok) {
            harness_resp_free(&r);
            harness_sleep_ms(100);
        }
    }
    if (!ok)
        fail_msg("stats never showed version %lld and the evaluation", (long long)v);
    harness_expect_header(&r, "Content-Type", "application/json");
    /* every push so far was applied at staleness 0 by worker h/1/0, with 10
     * samples; t/0 is marked up to 10 * pushes; its log end is 1000 */
    snprintf(want, sizeof(want), "\"counts\":[%d,0,0,0,0,0,0,0,0,0,0,0,0,0]", pushes);
    harness_expect(&r, 200, want);
    harness_expect(&r, 200, "\"p50\":0,\"p99\":0");
    snprintf(want, sizeof(want),
             "{\"topic\":\"t\",\"partition\":0,\"watermark\":%d,\"intervals\":0,\"log_end\":1000,"
             "\"lag\":%d",
             10 * pushes, 1000 - 10 * pushes);
    harness_expect(&r, 200, want);
    snprintf(want, sizeof(want), "{\"id\":\"h/1/0\",\"backend\":null");
    harness_expect(&r, 200, want);
    snprintf(want, sizeof(want), "\"gradients\":%d,\"last_tau\":0,\"dropped\":0", pushes);
    harness_expect(&r, 200, want);
    harness_expect(&r, 200, "\"mode\":\"async\"");
    harness_expect(&r, 200, "\"series\":[{\"t\":");
    /* freshness: every batch's samples were 500 and 100 ms old at the push,
     * applied within milliseconds */
    const char *fr = strstr(r.body, "\"freshness\":{\"p50_ms\":");
    assert_non_null(fr);
    long long p50 = 0, p99 = 0, nb = 0;
    assert_int_equal(sscanf(fr, "\"freshness\":{\"p50_ms\":%lld,\"p99_ms\":%lld,\"window\":%lld",
                            &p50, &p99, &nb),
                     3);
    assert_int_equal(nb, pushes);
    assert_true(p50 >= 100 && p50 < 1000);
    assert_true(p99 >= 500 && p99 < 1500);
    harness_resp_free(&r);
}

static void test_replay_and_rollback_need_the_token(void **state)
{
    (void)state;
    harness_resp_t r;
    const char *posts[][2] = {
        {"-X POST -d verb=to-earliest -d execute=true", "/v2/models/" MODEL "/replay"},
        {"-X POST -d version=2", "/v2/models/" MODEL "/rollback"},
    };
    uint64_t epoch0;
    int64_t v0;
    float w0[NPARAMS];
    store_weights(w0, &epoch0, &v0);
    for (size_t i = 0; i < 2; i++) {
        char args[256];
        http(&r, posts[i][0], posts[i][1]);
        harness_expect(&r, 401, "bearer token");
        harness_expect_header(&r, "WWW-Authenticate", "Bearer realm=\"freshet\"");
        harness_resp_free(&r);
        snprintf(args, sizeof(args), "%s -H 'Authorization: Bearer wrong-token'", posts[i][0]);
        http(&r, args, posts[i][1]);
        harness_expect(&r, 401, "bearer token");
        harness_resp_free(&r);
        snprintf(args, sizeof(args), "%s -H 'Authorization: Bearer " TOKEN "x'", posts[i][0]);
        http(&r, args, posts[i][1]);
        harness_expect(&r, 401, NULL);
        harness_resp_free(&r);
    }
    /* the token is checked before the body is read: a malformed body
     * without it is a 401 too, saying nothing of the body */
    static const char *const junk[] = {
        "-X POST -H 'Content-Type: application/json' -d '{\"version\":'",
        "-X POST -d '%zz'",
        "-X POST -H 'Content-Type: text/plain' -d version=2",
    };
    for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
        http(&r, junk[i], "/v2/models/" MODEL "/rollback");
        harness_expect(&r, 401, "bearer token");
        harness_resp_free(&r);
    }
    /* nothing changed: no request, same weights, no replay published */
    assert_int_equal(redis_int("XLEN freshet:{%s}:requests", MODEL), 0);
    assert_int_equal(redis_int("HGET freshet:{%s}:meta replay_generation", MODEL), -1);
    float w[NPARAMS];
    uint64_t epoch;
    int64_t v;
    store_weights(w, &epoch, &v);
    assert_true(epoch == epoch0 && v == v0);

    /* with the token: a dry run changes nothing, then bad input is a 400 */
    http(&r, "-H 'Authorization: Bearer " TOKEN "' -d verb=shift-by -d arg=-5",
         "/v2/models/" MODEL "/replay");
    char want[160];
    snprintf(want, sizeof(want),
             "\"plan\":[{\"topic\":\"t\",\"partition\":0,\"watermark\":%d,\"log_end\":1000,"
             "\"target\":\"watermark - 5\"}]",
             10 * pushes);
    harness_expect(&r, 200, "\"dry_run\":true");
    harness_expect(&r, 200, want);
    harness_resp_free(&r);
    assert_int_equal(redis_int("XLEN freshet:{%s}:requests", MODEL), 0);
    http(&r, "-H 'Authorization: Bearer " TOKEN "' -d verb=to-offset -d arg=x:y",
         "/v2/models/" MODEL "/replay");
    harness_expect(&r, 400, "to-offset");
    harness_resp_free(&r);
    http(&r, "-H 'Authorization: Bearer " TOKEN "' -d verb=sideways",
         "/v2/models/" MODEL "/replay");
    harness_expect(&r, 400, NULL);
    harness_resp_free(&r);
    http(&r, "-H 'Authorization: Bearer " TOKEN "' -d version=abc",
         "/v2/models/" MODEL "/rollback");
    harness_expect(&r, 400, "version");
    harness_resp_free(&r);
    /* the same fields as a JSON object: the dry run's plan is the form's */
    http(&r,
         "-H 'Authorization: Bearer " TOKEN "' -H 'Content-Type: application/json; charset=utf-8' "
         "-d '{\"verb\": \"shift-by\", \"arg\": -5, \"execute\": false}'",
         "/v2/models/" MODEL "/replay");
    harness_expect(&r, 200, "\"dry_run\":true");
    harness_expect(&r, 200, want);
    harness_resp_free(&r);
    /* bad JSON bodies, with the token: 400 saying what, or 415 */
    static const char *const bad_json[][2] = {
        {"{\"version\":", "malformed JSON body"},
        {"[2]", "must be an object"},
        {"{\"version\": null}", "JSON member 'version'"},
        {"{\"version\": [2]}", "JSON member 'version'"},
        {"{\"version\": 2, \"version\": 3}", "malformed JSON body"},
        {"{\"version\": \"abc\"}", "version"},
    };
    for (size_t i = 0; i < sizeof(bad_json) / sizeof(bad_json[0]); i++) {
        char args[256];
        snprintf(args, sizeof(args),
                 "-H 'Authorization: Bearer " TOKEN "' -H 'Content-Type: application/json' -d '%s'",
                 bad_json[i][0]);
        http(&r, args, "/v2/models/" MODEL "/rollback");
        harness_expect(&r, 400, bad_json[i][1]);
        harness_resp_free(&r);
    }
    http(&r, "-H 'Authorization: Bearer " TOKEN "' -H 'Content-Type: text/plain' -d version=2",
         "/v2/models/" MODEL "/rollback");
    harness_expect(&r, 415, "application/json");
    harness_resp_free(&r);
    assert_int_equal(redis_int("XLEN freshet:{%s}:requests", MODEL), 0);

    /* executed: the applier publishes the replay under generation 1 */
    http(&r, "-H 'Authorization: Bearer " TOKEN "' -d verb=to-earliest -d execute=true",
         "/v2/models/" MODEL "/replay");
    harness_expect(&r, 202, "\"request_id\":");
    harness_resp_free(&r);
    int64_t gen = -1;
    for (int i = 0; i < 200 && gen != 1; i++) {
        gen = redis_int("HGET freshet:{%s}:meta replay_generation", MODEL);
        harness_sleep_ms(10);
    }
    assert_int_equal(gen, 1);

    /* rollback to a retained snapshot: a new epoch, version + 1, its weights */
    char out[512];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "ZRANGE freshet:{%s}:snaps 0 0", MODEL), 0);
    int64_t snap = strtoll(out, NULL, 10);
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(c);
    float ws[NPARAMS];
    uint64_t sep;
    assert_int_equal(psstore_snapshot_weights(c, MODEL, snap, ws, NPARAMS, &sep), FR_OK);
    psstore_conn_destroy(c);
    store_weights(w0, &epoch0, &v0);
    char body[160]; /* as JSON: the version a number */
    snprintf(body, sizeof(body),
             "-H 'Authorization: Bearer " TOKEN "' -H 'Content-Type: application/json' "
             "-d '{\"version\": %lld}'",
             (long long)snap);
    http(&r, body, "/v2/models/" MODEL "/rollback");
    harness_expect(&r, 202, "\"request_id\":");
    harness_resp_free(&r);
    for (int i = 0; i < 200; i++) {
        store_weights(w, &epoch, &v);
        if (epoch != epoch0)
            break;
        harness_sleep_ms(10);
    }
    assert_true(epoch != epoch0);
    assert_int_equal(v, v0 + 1);
    assert_memory_equal(w, ws, sizeof(ws));
    await_version(v);
    char etag[64];
    snprintf(etag, sizeof(etag), "\"%llu-v%lld\"", (unsigned long long)epoch, (long long)v);
    http(&r, "", "/v2/models/" MODEL "/weights?format=raw");
    harness_expect_header(&r, "ETag", etag);
    assert_memory_equal(r.body, ws, sizeof(ws));
    harness_resp_free(&r);
}

static void test_dashboard_loads_in_chromium_with_data(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        push();
    harness_resp_t r;
    http(&r, "", "/dashboard");
    harness_expect(&r, 200, "<html");
    harness_expect_header(&r, "Content-Type", "text/html; charset=utf-8");
    harness_resp_free(&r);
    http(&r, "", "/dashboard/chart.min.js");
    harness_expect(&r, 200, "Chart.js");
    harness_resp_free(&r);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "mkdir -p artifacts && bash %s/tests/integration/dashboard_check.sh "
             "'http://127.0.0.1:%d/dashboard?model=" MODEL "' artifacts 10",
             FRESHET_SOURCE_DIR, port);
    int rc = system(cmd);
    if (rc != 0)
        fail_msg("dashboard check failed (status %d)", rc);
    size_t len = 0;
    char *png = harness_read_file("artifacts/dashboard.png", &len);
    assert_non_null(png);
    assert_true(len > 10000 && memcmp(png, "\x89PNG", 4) == 0);
    free(png);
}

static void test_tls_serves_https(void **state)
{
    (void)state;
    char cert[320], key[320], cmd[1200];
    snprintf(cert, sizeof(cert), "%s/cert.pem", tmp_dir);
    snprintf(key, sizeof(key), "%s/key.pem", tmp_dir);
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 -newkey rsa:2048 -nodes -keyout %s -out %s -days 1 "
             "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 2>/dev/null",
             key, cert);
    assert_int_equal(system(cmd), 0);
    serve_conf_t conf;
    test_conf(&conf);
    conf.token = ""; /* (and so replay and rollback are refused) */
    conf.tls_cert = cert;
    conf.tls_key = key;
    serve_t *tls = serve_new(&conf, errstr, sizeof(errstr));
    if (tls == NULL)
        fail_msg("%s", errstr);
    assert_int_equal(serve_start(tls, errstr, sizeof(errstr)), FR_OK);
    int p = serve_port(tls);
    char out[320];
    snprintf(out, sizeof(out), "%s/tls.bin", tmp_dir);
    snprintf(cmd, sizeof(cmd),
             "for i in $(seq 50); do curl -sf --cacert %s -o %s "
             "https://127.0.0.1:%d/v2/models/" MODEL "/weights?format=raw && exit 0; "
             "sleep 0.1; done; exit 1",
             cert, out, p);
    assert_int_equal(system(cmd), 0);
    size_t len;
    char *body = harness_read_file(out, &len);
    float w[NPARAMS];
    uint64_t epoch;
    int64_t v;
    store_weights(w, &epoch, &v);
    assert_int_equal(len, sizeof(w));
    assert_memory_equal(body, w, sizeof(w));
    free(body);
    /* plain HTTP on the TLS port gets no answer */
    harness_resp_t r;
    harness_http(p, tmp_dir, &r, "--max-time 2", "/livez");
    assert_int_not_equal(r.code, 200);
    harness_resp_free(&r);
    /* nor when no TLS session can be made for the connection (evhttp would
     * take a plain one instead): no answer, counted, and the connection
     * closed within a sweep */
    double errors0 = series_value("freshet_http_accept_errors_total", NULL);
    atomic_store(&ssl_new_fails, 1);
    harness_http(p, tmp_dir, &r, "--max-time 2", "/livez");
    assert_int_equal(r.code, 0);
    harness_resp_free(&r);
    harness_http(p, tmp_dir, &r, "--max-time 2 -X POST", "/v2/models/" MODEL "/rollback");
    assert_int_equal(r.code, 0);
    harness_resp_free(&r);
    atomic_store(&ssl_new_fails, 0);
    assert_true(series_value("freshet_http_accept_errors_total", NULL) - errors0 == 2);
    assert_int_equal(system(cmd), 0); /* and TLS works again */
    serve_destroy(tls);

    /* a key that does not match is refused at start */
    conf.tls_key = cert;
    assert_null(serve_new(&conf, errstr, sizeof(errstr)));
    assert_non_null(strstr(errstr, "TLS"));
}

static void test_protect_reads_needs_the_token_for_reads(void **state)
{
    (void)state;
    serve_conf_t conf;
    test_conf(&conf);
    conf.protect_reads = 1;
    serve_t *p = serve_new(&conf, errstr, sizeof(errstr));
    if (p == NULL)
        fail_msg("%s", errstr);
    assert_int_equal(serve_start(p, errstr, sizeof(errstr)), FR_OK);
    harness_resp_t r;
    harness_await_code(serve_port(p), tmp_dir, &r, "/readyz", 200, 100, 20); /* health stays open */
    harness_expect(&r, 200, NULL);
    harness_resp_free(&r);
    const char *reads[] = {"/v2/models", "/v2/models/" MODEL "/weights", "/metrics",
                           "/v2/models/" MODEL "/stats"};
    for (size_t i = 0; i < sizeof(reads) / sizeof(reads[0]); i++) {
        harness_http(serve_port(p), tmp_dir, &r, "", reads[i]);
        harness_expect(&r, 401, "bearer token");
        harness_resp_free(&r);
        harness_http(serve_port(p), tmp_dir, &r, "-H 'Authorization: Bearer " TOKEN "'", reads[i]);
        if (r.code != 200 && !(i == 3 && r.code == 503))
            fail_msg("%s with the token: %d", reads[i], r.code);
        harness_resp_free(&r);
    }
    harness_http(serve_port(p), tmp_dir, &r, "", "/livez");
    harness_expect(&r, 200, NULL);
    harness_resp_free(&r);
    serve_destroy(p);
}

static void test_readiness_follows_the_store_and_the_guard(void **state)
{
    (void)state;
    harness_resp_t r;
    /* the divergence guard's stop (written as the applier writes it) */
    char out[64];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HSET freshet:{%s}:meta stopped %s", MODEL,
                                         "loss-not-finite"),
                     0);
    harness_await_code(port, tmp_dir, &r, "/readyz", 503, 100, 20);
    harness_expect(&r, 503, "stopped by the divergence guard: loss-not-finite");
    harness_resp_free(&r);
    http(&r, "", "/v2/models/" MODEL "/ready");
    harness_expect(&r, 503, "divergence guard");
    harness_resp_free(&r);
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HDEL freshet:{%s}:meta stopped", MODEL), 0);
    harness_await_code(port, tmp_dir, &r, "/readyz", 200, 100, 20);
    harness_expect(&r, 200, NULL);
    harness_resp_free(&r);

    /* Redis gone: not ready, stats 503; the weights held are still served */
    harness_applier_stop(&applier, NULL);
    kill(redis.pid, SIGSTOP); /* accepts connections, answers nothing */
    harness_await_code(port, tmp_dir, &r, "/readyz", 503, 100, 50);
    harness_expect(&r, 503, "store unreachable");
    harness_resp_free(&r);
    http(&r, "--max-time 3", "/v2/models/" MODEL "/stats");
    harness_expect(&r, 503, "store unreachable");
    harness_resp_free(&r);
    http(&r, "--max-time 3", "/v2/models/" MODEL "/weights?format=raw");
    harness_expect(&r, 200, NULL);
    assert_int_equal(r.len, NPARAMS * sizeof(float));
    harness_resp_free(&r);
    http(&r, "--max-time 3 -H 'Authorization: Bearer " TOKEN "' -d version=1",
         "/v2/models/" MODEL "/rollback");
    harness_expect(&r, 503, "store unreachable");
    harness_resp_free(&r);
    kill(redis.pid, SIGCONT);
    harness_await_code(port, tmp_dir, &r, "/readyz", 200, 200, 50);
    harness_expect(&r, 200, "\"ready\":true");
    harness_resp_free(&r);
}

/* ---- fixture ------------------------------------------------------------------ */

/* ---- predictions --------------------------------------------------------- */

/* The class probabilities of x under w (5-4-3, ReLU, softmax), in double:
 * the reference a prediction is checked against. */
static void ref_forward(const float *w, const float *x, double p[3])
{
    double h[4], z[3], top = -INFINITY, sum = 0.0;
    for (int o = 0; o < 4; o++) {
        h[o] = w[20 + o];
        for (int i = 0; i < 5; i++)
            h[o] += (double)w[o * 5 + i] * x[i];
        h[o] = h[o] > 0.0 ? h[o] : 0.0;
    }
    for (int o = 0; o < 3; o++) {
        z[o] = w[24 + 12 + o];
        for (int i = 0; i < 4; i++)
            z[o] += (double)w[24 + o * 4 + i] * h[i];
        top = z[o] > top ? z[o] : top;
    }
    for (int o = 0; o < 3; o++)
        sum += (p[o] = exp(z[o] - top));
    for (int o = 0; o < 3; o++)
        p[o] /= sum;
}

/* The numbers of output name's data in an infer answer; their count. */
static size_t output_data(const harness_resp_t *r, const char *name, double *v, size_t cap)
{
    char needle[64];
    snprintf(needle, sizeof(needle), "{\"name\":\"%s\"", name);
    const char *p = strstr(r->body, needle);
    if (p == NULL)
        return 0;
    p = strstr(p, "\"data\":[");
    assert_non_null(p);
    p += 8;
    size_t n = 0;
    while (*p != ']' && n < cap) {
        char *end;
        v[n++] = strtod(p, &end);
        assert_true(end != p);
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* POSTs body (JSON) to model m's infer route of the server on port pt. */
static void infer_at(int pt, harness_resp_t *r, const char *m, const char *body, const char *extra)
{
    char path[128];
    snprintf(path, sizeof(path), "/v2/models/%s/infer", m);
    harness_post_json(pt, tmp_dir, r, path, body, extra);
}

static void infer(harness_resp_t *r, const char *body)
{
    infer_at(port, r, MODEL, body, "");
}

/* Three samples as a request body, flat or as nested rows, with extra
 * members. */
static void infer_body(char *out, size_t size, const float x[3][5], int nested, const char *extra)
{
    size_t len = (size_t)snprintf(out, size,
                                  "{%s\"inputs\":[{\"name\":\"x\",\"shape\":[3,5],\"datatype\":"
                                  "\"FP32\",\"data\":[",
                                  extra);
    for (int i = 0; i < 3; i++) {
        len += (size_t)snprintf(out + len, size - len, "%s%s", i ? "," : "", nested ? "[" : "");
        for (int k = 0; k < 5; k++)
            len += (size_t)snprintf(out + len, size - len, "%s%.9g", k ? "," : "", x[i][k]);
        len += (size_t)snprintf(out + len, size - len, "%s", nested ? "]" : "");
    }
    snprintf(out + len, size - len, "]}]}");
}

/* The answer holds w's predictions for x: probabilities to 1e-6, argmax
 * exact, model_version v. */
static void expect_predictions(const harness_resp_t *r, const float *w, const float x[3][5],
                               int64_t v)
{
    harness_expect(r, 200, "\"model_name\":\"" MODEL "\"");
    char want[64];
    snprintf(want, sizeof(want), "\"model_version\":\"%lld\"", (long long)v);
    harness_expect(r, 200, want);
    snprintf(want, sizeof(want), "%lld", (long long)v);
    harness_expect_header(r, "X-Freshet-Version", want);
    harness_expect(r, 200, "\"shape\":[3,3]");
    double probs[16], arg[16];
    assert_int_equal(output_data(r, "probabilities", probs, 16), 9);
    assert_int_equal(output_data(r, "argmax", arg, 16), 3);
    for (int i = 0; i < 3; i++) {
        double p[3];
        ref_forward(w, x[i], p);
        int best = 0;
        for (int c = 0; c < 3; c++) {
            if (fabs(probs[i * 3 + c] - p[c]) > 1e-6)
                fail_msg("sample %d class %d: %.9g, the double forward pass %.9g", i, c,
                         probs[i * 3 + c], p[c]);
            best = p[c] > p[best] ? c : best;
        }
        assert_int_equal((int)arg[i], best);
    }
}

/* Pushes a gradient, waits until serve publishes its version, and reads
 * the store's weights into w; the version. */
static int64_t push_and_read(float *w)
{
    int64_t v = push();
    await_version(v);
    uint64_t epoch;
    int64_t version;
    store_weights(w, &epoch, &version);
    assert_int_equal(version, v);
    return v;
}

static void test_infer_predicts_as_a_double_forward_pass(void **state)
{
    (void)state;
    float w[NPARAMS], x[3][5];
    uint64_t epoch;
    int64_t version, v = push_and_read(w);
    harness_gradient(&x[0][0], 15, 99);
    for (int k = 0; k < 5; k++)
        x[2][k] *= 40.0f; /* large activations: the softmax must not overflow */
    double before = series_value("freshet_serve_predictions_total", MODEL);
    before = isnan(before) ? 0.0 : before; /* none yet */
    char body[4096];
    harness_resp_t r;
    for (int nested = 0; nested < 2; nested++) { /* flat and as rows: the same */
        infer_body(body, sizeof(body), x, nested, "\"id\":\"req-7\",");
        infer(&r, body);
        expect_predictions(&r, w, x, v);
        harness_expect(&r, 200, "\"id\":\"req-7\"");
        harness_resp_free(&r);
    }
    assert_true(series_value("freshet_serve_predictions_total", MODEL) - before == 6.0);
    /* one output asked for: that one only */
    infer_body(body, sizeof(body), x, 0, "\"outputs\":[{\"name\":\"argmax\"}],");
    infer(&r, body);
    harness_expect(&r, 200, "\"argmax\"");
    assert_null(strstr(r.body, "probabilities"));
    harness_resp_free(&r);

    /* a retained snapshot by parameters.version: its weights, its version */
    push();
    v = push();
    await_version(v);
    int64_t snap = redis_int("ZRANGE freshet:{%s}:snaps -2 -2", MODEL);
    assert_true(snap > 0 && snap < v);
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(c);
    float ws[NPARAMS];
    assert_int_equal(psstore_snapshot_weights(c, MODEL, snap, ws, NPARAMS, &epoch), FR_OK);
    psstore_conn_destroy(c);
    char extra[128];
    snprintf(extra, sizeof(extra), "\"parameters\":{\"version\":%lld},", (long long)snap);
    infer_body(body, sizeof(body), x, 0, extra);
    for (int i = 0; i < 100; i++) { /* serve lists the snapshot once it read it */
        infer(&r, body);
        if (r.code == 200)
            break;
        harness_resp_free(&r);
        harness_sleep_ms(20);
    }
    expect_predictions(&r, ws, x, snap);
    harness_resp_free(&r);
    /* the latest again: the newest weights */
    store_weights(w, &epoch, &version);
    infer_body(body, sizeof(body), x, 1, "");
    infer(&r, body);
    expect_predictions(&r, w, x, version);
    harness_resp_free(&r);

    /* what is refused, and why */
    static const struct {
        const char *body;
        int code;
        const char *says;
    } bad[] = {
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,4],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}]}",
         400, "takes 5 features"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[2,5],\"datatype\":\"FP32\",\"data\":[1,2,3]}]}",
         400, "holds 3 numbers"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,5],\"datatype\":\"FP32\",\"data\":[1,2,3,4,"
         "1e39]}]}",
         400, "beyond float32"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,5],\"datatype\":\"FP32\",\"data\":[1,2,\"3\","
         "4,5]}]}",
         400, "data[2] is not a number"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,5],\"datatype\":\"INT8\",\"data\":[1,2,3,4,5]}"
         "]}",
         400, "datatype"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[0,5],\"datatype\":\"FP32\",\"data\":[]}]}", 400,
         "shape"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,5],\"datatype\":\"FP32\",\"data\":[1,2,3,4,5]}"
         "],\"outputs\":[{\"name\":\"score\"}]}",
         400, "gives no score"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,5],\"datatype\":\"FP32\",\"data\":[1,2,3,4,5]}"
         "],\"parameters\":{\"version\":999999}}",
         404, "no snapshot of version 999999"},
        {"{\"inputs\":[]}", 400, "one input tensor"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[2,5],\"datatype\":\"FP32\",\"data\":[[1,2,3,4,5],"
         "[1]]}]}",
         400, "data[1] must be a row of 5 numbers"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[65536,5],\"datatype\":\"FP32\",\"data\":[1]}]}",
         400, "asks for more numbers than the body holds"},
        {"{\"inputs\":[{\"name\":\"x\"", 400, "malformed JSON"},
        {"[1,2]", 400, "one input tensor"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        infer(&r, bad[i].body);
        if (r.code != bad[i].code || strstr(r.body, bad[i].says) == NULL)
            fail_msg("%s: %d %s, expected %d '%s'", bad[i].body, r.code, r.body, bad[i].code,
                     bad[i].says);
        harness_resp_free(&r);
    }
    infer_at(port, &r, "nosuch", body, "");
    harness_expect(&r, 404, "no model 'nosuch'");
    harness_resp_free(&r);
    infer_at(port, &r, MODEL, body, "-H 'Content-Type: text/plain'");
    harness_expect(&r, 415, "application/json");
    harness_resp_free(&r);
    http(&r, "", "/v2/models/" MODEL "/infer");
    harness_expect(&r, 405, "POST");
    harness_resp_free(&r);
    /* the metadata names what infer takes and gives */
    http(&r, "", "/v2/models/" MODEL);
    harness_expect(&r, 200, "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[-1,5]}]");
    harness_expect(&r, 200, "{\"name\":\"argmax\",\"datatype\":\"INT64\",\"shape\":[-1]}");
    harness_resp_free(&r);
}

/* Concurrent requests get the answers they would get alone, batched or
 * not; infer = false turns the route off; a full queue answers 503. */
static void test_infer_batches_and_bounds_its_queue(void **state)
{
    (void)state;
    float w[NPARAMS];
    int64_t v = push_and_read(w);
    /* 40 clients at once, each its own samples */
    enum { N = 40 };
    char cmd[8192];
    size_t len = 0;
    float xs[N][3][5];
    for (int k = 0; k < N; k++) {
        char body[2048], file[320];
        harness_gradient(&xs[k][0][0], 15, 500 + (uint64_t)k);
        infer_body(body, sizeof(body), xs[k], k & 1, "");
        snprintf(file, sizeof(file), "%s/in%d.json", tmp_dir, k);
        FILE *f = fopen(file, "w");
        assert_non_null(f);
        fputs(body, f);
        fclose(f);
        len +=
            (size_t)snprintf(cmd + len, sizeof(cmd) - len,
                             "curl -sS -o %s/out%d.json -H 'Content-Type: application/json' "
                             "--data-binary @%s http://127.0.0.1:%d/v2/models/" MODEL "/infer & ",
                             tmp_dir, k, file, port);
    }
    snprintf(cmd + len, sizeof(cmd) - len, "wait");
    double batches = series_value("freshet_serve_infer_batches_total", MODEL);
    batches = isnan(batches) ? 0.0 : batches;
    assert_int_equal(system(cmd), 0);
    for (int k = 0; k < N; k++) {
        char file[320];
        snprintf(file, sizeof(file), "%s/out%d.json", tmp_dir, k);
        harness_resp_t r = {.code = 200};
        r.body = harness_read_file(file, &r.len);
        assert_non_null(r.body);
        snprintf(r.headers, sizeof(r.headers), "X-Freshet-Version: %lld\r\n", (long long)v);
        expect_predictions(&r, w, xs[k], v);
        free(r.body);
    }
    double ran = series_value("freshet_serve_infer_batches_total", MODEL) - batches;
    assert_true(ran >= 1 && ran <= N);
    print_message("40 concurrent requests ran in %.0f forward passes\n", ran);

    /* infer = false: no route; a queue of two with one thread: the third of
     * three requests waiting on a model whose weights cannot be read gets 503 */
    serve_conf_t conf;
    test_conf(&conf);
    conf.infer = 0;
    serve_t *off = serve_new(&conf, errstr, sizeof(errstr));
    assert_non_null(off);
    assert_int_equal(serve_start(off, errstr, sizeof(errstr)), FR_OK);
    harness_resp_t r;
    char body[2048];
    infer_body(body, sizeof(body), xs[0], 0, "");
    infer_at(serve_port(off), &r, MODEL, body, "");
    harness_expect(&r, 404, "[serve] infer = false");
    harness_resp_free(&r);
    serve_destroy(off);
    /* a read: behind the token when reads are */
    test_conf(&conf);
    conf.protect_reads = 1;
    serve_t *pr = serve_new(&conf, errstr, sizeof(errstr));
    assert_non_null(pr);
    assert_int_equal(serve_start(pr, errstr, sizeof(errstr)), FR_OK);
    infer_at(serve_port(pr), &r, MODEL, body, "");
    harness_expect(&r, 401, "bearer token");
    harness_resp_free(&r);
    infer_at(serve_port(pr), &r, MODEL, body, "-H 'Authorization: Bearer " TOKEN "'");
    expect_predictions(&r, w, xs[0], v);
    harness_resp_free(&r);
    serve_destroy(pr);

    float w0[NPARAMS];
    harness_gradient(w0, NPARAMS, 3);
    assert_int_equal(harness_model_create(&redis, "cold", LAYERS, "softmax", w0, NPARAMS), 0);
    test_conf(&conf);
    conf.infer_threads = 1;
    conf.infer_queue = 2;
    serve_t *q = serve_new(&conf, errstr, sizeof(errstr));
    assert_non_null(q);
    assert_int_equal(serve_start(q, errstr, sizeof(errstr)), FR_OK);
    for (int i = 0; i < 200; i++) { /* listed: known, never read */
        harness_http(serve_port(q), tmp_dir, &r, "", "/v2/models");
        int listed = r.code == 200 && strstr(r.body, "\"cold\"") != NULL;
        harness_resp_free(&r);
        if (listed)
            break;
        harness_sleep_ms(20);
    }
    kill(redis.pid, SIGSTOP); /* the follower cannot read cold's weights */
    char file[320];
    snprintf(file, sizeof(file), "%s/cold.json", tmp_dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
    snprintf(cmd, sizeof(cmd),
             "for k in 1 2; do curl -sS -o %s/cold$k.out -w '%%{http_code}' -H 'Content-Type: "
             "application/json' --data-binary @%s http://127.0.0.1:%d/v2/models/cold/infer > "
             "%s/cold$k.code & sleep 0.3; done",
             tmp_dir, file, serve_port(q), tmp_dir);
    assert_int_equal(system(cmd), 0);
    /* the two wait in the queue (a worker looks at them every 2 ms and puts
     * them back): a third is refused, unless it came in the instant a
     * worker held them (then it waits too: tried again) */
    int refused = 0;
    for (int t = 0; t < 5 && !refused; t++) {
        infer_at(serve_port(q), &r, "cold", body, "--max-time 1");
        refused = r.code == 503 && strstr(r.body, "too many infer requests waiting") != NULL;
        if (refused)
            harness_expect_header(&r, "Retry-After", "1");
        harness_resp_free(&r);
    }
    assert_true(refused);
    kill(redis.pid, SIGCONT);
    snprintf(cmd, sizeof(cmd), "wait; sleep 0.1"); /* the two waiting get their answers */
    for (int k = 1; k <= 2; k++) {
        char path[320], *code = NULL;
        size_t n;
        snprintf(path, sizeof(path), "%s/cold%d.code", tmp_dir, k);
        for (int i = 0; i < 300 && (code == NULL || n < 3); i++) {
            free(code);
            code = harness_read_file(path, &n);
            if (code == NULL || n < 3)
                harness_sleep_ms(20);
        }
        assert_non_null(code);
        if (strcmp(code, "200") != 0)
            fail_msg("waiting request %d: %s", k, code);
        free(code);
    }
    serve_destroy(q);
}

/* ---- the HTTP edge ----------------------------------------------------------- */

/* Requests a handler must not see are refused before routing, each
 * answer says nosniff, JSON carries no invalid UTF-8, and a Host not
 * allowed (a rebinding page's name) reads nothing. */
static void test_the_edge_refuses_what_it_must(void **state)
{
    (void)state;
    char out[4096], req[512];
    static const char *const bad[] = {
        /* two lengths: libevent framed by the first; the second request is smuggled */
        "POST /v2/models/" MODEL "/replay HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
        "Content-Length: 45\r\n\r\nGET /v2/models HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "GET /v2/models HTTP/1.1\r\nHost: localhost\r\nContent-Length : 5\r\n\r\nhello",
        "GET /v2/models HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding : chunked\r\n\r\n",
        "GET /v2/models HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n",
    };
    double refused = series_value("freshet_http_refused_total", NULL);
    refused = isnan(refused) ? 0 : refused;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        harness_raw_exchange(port, bad[i], out, sizeof(out));
        if (strncmp(out, "HTTP/1.1 400", 12) != 0 || strstr(out, "malformed request") == NULL ||
            strstr(out, "Connection: close") == NULL)
            fail_msg("request %zu: %.300s", i, out);
        /* nothing after the refused request was answered (closed) */
        assert_null(strstr(strstr(out, "\r\n\r\n"), "HTTP/1.1"));
    }
    assert_true(series_value("freshet_http_refused_total", NULL) - refused == 4.0);

    /* Host: the listen address, loopback names, with or without a port */
    static const char *const hosts[] = {"127.0.0.1", "localhost:1234", "LOCALHOST", "[::1]:8080"};
    for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
        snprintf(req, sizeof(req), "GET /livez HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                 hosts[i]);
        harness_raw_exchange(port, req, out, sizeof(out));
        if (strncmp(out, "HTTP/1.1 200", 12) != 0)
            fail_msg("Host %s: %.200s", hosts[i], out);
        assert_non_null(strstr(out, "X-Content-Type-Options: nosniff"));
    }
    harness_resp_t r;
    http(&r, "-H 'Host: attacker.example'", "/v2/models/" MODEL "/weights");
    harness_expect(&r, 403, "allowed_hosts");
    harness_expect_header(&r, "X-Content-Type-Options", "nosniff");
    harness_resp_free(&r);
    /* a server told to answer that name does */
    serve_conf_t conf;
    test_conf(&conf);
    conf.allowed_hosts = "models.example, attacker.example";
    serve_t *p = serve_new(&conf, errstr, sizeof(errstr));
    assert_non_null(p);
    assert_int_equal(serve_start(p, errstr, sizeof(errstr)), FR_OK);
    harness_http(serve_port(p), tmp_dir, &r, "-H 'Host: Attacker.Example:80'", "/livez");
    harness_expect(&r, 200, "live");
    harness_resp_free(&r);
    harness_http(serve_port(p), tmp_dir, &r, "", "/livez"); /* 127.0.0.1: not listed now */
    harness_expect(&r, 403, "allowed_hosts");
    harness_resp_free(&r);
    serve_destroy(p);

    /* a path of invalid UTF-8 comes back as U+FFFD, never raw */
    http(&r, "", "/v2/%ff%fe");
    harness_expect(&r, 404, "\\ufffd\\ufffd");
    assert_null(memchr(r.body, 0xff, r.len));
    harness_expect_header(&r, "X-Content-Type-Options", "nosniff");
    harness_resp_free(&r);
}

/*
 * [serve] header_timeout (1 s here): a connection that sends half a
 * request line, or nothing, or trickles its header a byte at a time, is
 * closed after it (slowloris); a request that arrived whole may wait longer (a 3 s long-poll is
 * answered 304), and a kept-alive connection idle for 2 s still serves its next request.
 */
static void test_slow_connections_time_out_and_long_polls_do_not(void **state)
{
    (void)state;
    int64_t v = push();
    await_version(v);
    serve_conf_t conf;
    test_conf(&conf);
    conf.header_timeout_s = 1;
    serve_t *sv = serve_new(&conf, errstr, sizeof(errstr));
    if (sv == NULL)
        fail_msg("%s", errstr);
    assert_int_equal(serve_start(sv, errstr, sizeof(errstr)), FR_OK);
    int sport = serve_port(sv);

    int half = raw_connect(sport), silent = raw_connect(sport);
    const char partial[] = "GET /livez HTTP/1.1\r\nHo";
    assert_int_equal(write(half, partial, sizeof(partial) - 1), (ssize_t)sizeof(partial) - 1);
    double t_half = await_close(half, 5000, NULL, 0), t_silent = await_close(silent, 5000, NULL, 0);
    close(half);
    close(silent);
    fr_log(FR_LOG_INFO, "closed after %.2f s (half a request) and %.2f s (nothing sent)", t_half,
           t_silent);
    assert_true(t_half >= 0.9 && t_half < 3.0);
    assert_true(t_silent >= 0 && t_silent < 3.0); /* measured from after the first close */

    /* a header trickled a byte every 200 ms is never inactive, yet it is
     * closed once the first request is overdue */
    int trickle = raw_connect(sport);
    const char slow[] = "GET /livez HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    uint64_t t0 = fr_clock_mono_ns();
    double t_trickle = -1;
    for (size_t i = 0; i < sizeof(slow) - 1 && t_trickle < 0; i++) {
        struct pollfd pt = {.fd = trickle, .events = POLLIN};
        char c;
        if (send(trickle, &slow[i], 1, MSG_NOSIGNAL) != 1 ||
            (poll(&pt, 1, 200) == 1 && read(trickle, &c, 1) <= 0))
            t_trickle = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    }
    close(trickle);
    fr_log(FR_LOG_INFO, "a trickled header closed after %.2f s", t_trickle);
    assert_true(t_trickle >= 0.9 && t_trickle < 3.0);

    char path[256];
    snprintf(path, sizeof(path), "/v2/models/" MODEL "/weights?after_version=%lld&wait=3",
             (long long)v);
    harness_resp_t r;
    t0 = fr_clock_mono_ns();
    harness_http(sport, tmp_dir, &r, "", path);
    double secs = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    if (r.code != 304 || secs < 2.9)
        fail_msg("a 3 s long-poll: %d after %.2f s (%s)", r.code, secs, r.body);
    harness_resp_free(&r);

    int keep = raw_connect(sport);
    const char req[] = "GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    char out[2048];
    for (int i = 0; i < 2; i++) {
        if (i == 1)
            harness_sleep_ms(2000); /* idle past the header timeout */
        assert_int_equal(write(keep, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
        struct pollfd p = {.fd = keep, .events = POLLIN};
        assert_int_equal(poll(&p, 1, 3000), 1);
        ssize_t n = read(keep, out, sizeof(out) - 1);
        assert_true(n > 0);
        out[n] = '\0';
        if (strncmp(out, "HTTP/1.1 200", 12) != 0)
            fail_msg("request %d on the kept-alive connection: %.40s", i + 1, out);
    }
    close(keep);
    serve_destroy(sv);
}

/*
 * [serve] max_connections (4 here): with four connections open the fifth
 * is not accepted (its request waits unanswered in the backlog) until one
 * of the four closes; then it is answered.
 */
static void test_connections_beyond_the_cap_wait(void **state)
{
    (void)state;
    serve_conf_t conf;
    test_conf(&conf);
    conf.max_connections = 4;
    serve_t *sv = serve_new(&conf, errstr, sizeof(errstr));
    if (sv == NULL)
        fail_msg("%s", errstr);
    assert_int_equal(serve_start(sv, errstr, sizeof(errstr)), FR_OK);
    int sport = serve_port(sv), idle[4];
    double capped = series_value("freshet_http_connection_cap_total", NULL);
    capped = isnan(capped) ? 0 : capped;
    for (int i = 0; i < 4; i++)
        idle[i] = raw_connect(sport);
    /* the server has taken the four and stopped accepting (it counts the
     * cap reached once) */
    for (int i = 0; i < 1000 && !(series_value("freshet_http_connection_cap_total", NULL) > capped);
         i++)
        harness_sleep_ms(10);
    if (!(series_value("freshet_http_connection_cap_total", NULL) > capped))
        fail_msg("the server did not reach its cap of 4 connections in 10 s");
    int fifth = raw_connect(sport); /* the kernel completes it: the backlog */
    const char req[] = "GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    assert_int_equal(write(fifth, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
    struct pollfd p = {.fd = fifth, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 1000), 0); /* not accepted: no answer */
    close(idle[0]);
    char out[2048];
    double t = await_close(fifth, 3000, out, sizeof(out));
    if (t < 0 || strncmp(out, "HTTP/1.1 200", 12) != 0)
        fail_msg("the fifth connection after one closed: %.2f s, '%.40s'", t, out);
    close(fifth);
    for (int i = 1; i < 4; i++)
        close(idle[i]);
    serve_destroy(sv);
}

/* With no descriptor left, accept() fails: the listener pauses instead of
 * spinning (the process uses almost no CPU meanwhile, and logs a few
 * lines), connections already open keep being served, and once
 * descriptors are free again new connections are accepted. */
static void test_descriptor_exhaustion_pauses_accept(void **state)
{
    (void)state;
    harness_resp_t r;
    http(&r, "", "/livez"); /* the loop is up */
    harness_resp_free(&r);
    int held = socket(AF_INET, SOCK_STREAM, 0); /* one connection kept open across it */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(held, (struct sockaddr *)&a, sizeof(a)), 0);
    harness_sleep_ms(100);
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    int probe = dup(0), fds[64], nfds = 0; /* the lowest free descriptor: the limit goes there */
    close(probe);
    low = old;
    low.rlim_cur = (rlim_t)probe + 8;
    double errors0 = series_value("freshet_http_accept_errors_total", NULL);
    errors0 = isnan(errors0) ? 0 : errors0;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    /* connect until the process is out of descriptors: the server's accept()
     * fails for the connections the kernel queued */
    while (nfds < 64) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            break;
        fds[nfds++] = fd;
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
            break;
    }
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    harness_sleep_ms(1000);
    getrusage(RUSAGE_SELF, &ru1);
    double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
                 (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                 (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) * 1e-6 +
                 (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) * 1e-6;
    double errors = series_value("freshet_http_accept_errors_total", NULL) - errors0;
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    print_message("out of descriptors for 1 s: %.0f accept() failures, %.3f s of CPU\n", errors,
                  cpu);
    assert_true(errors >= 1 && errors <= 40); /* paused 10, 20, 40 ... ms: not spinning */
    assert_true(cpu < 0.5);
    /* the connection held all along is served; new ones are accepted again */
    const char *get = "GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    assert_int_equal(write(held, get, strlen(get)), (ssize_t)strlen(get));
    char out[1024] = "";
    struct pollfd pf = {.fd = held, .events = POLLIN};
    assert_true(poll(&pf, 1, 3000) > 0);
    assert_true(read(held, out, sizeof(out) - 1) > 0);
    assert_non_null(strstr(out, "200 OK"));
    close(held);
    harness_await_code(port, tmp_dir, &r, "/livez", 200, 100, 20);
    harness_expect(&r, 200, "live");
    harness_resp_free(&r);
}

static int setup(void **state)
{
    (void)state;
    if (harness_tmpdir(tmp_dir, "serve") != 0 || harness_redis_start(&redis, NULL) != 0)
        return -1;
    float w[NPARAMS];
    harness_gradient(w, NPARAMS, 1);
    if (harness_model_create(&redis, MODEL, LAYERS, "softmax", w, NPARAMS) != 0)
        return -1;
    psstore_applier_conf_t ac;
    psstore_applier_conf_init(&ac);
    ac.url = redis.url;
    ac.model = MODEL;
    ac.ctl.lr = 0.1;
    ac.commit_ms = 0;
    ac.lease_ms = 1000;
    ac.snapshot_every = 2;
    ac.snapshot_seconds = 0;
    ac.snapshot_retain = 3;
    metrics = fr_metrics_new();
    ac.metrics = metrics;
    if (harness_applier_start(&applier, &ac) != 0)
        return -1;
    client = psstore_client_new(redis.url, MODEL, NPARAMS, 100, errstr, sizeof(errstr));
    if (client == NULL) {
        fprintf(stderr, "%s\n", errstr);
        return -1;
    }
    serve_conf_t conf;
    test_conf(&conf);
    conf.max_body = 4096;
    srv = serve_new(&conf, errstr, sizeof(errstr));
    if (srv == NULL || serve_start(srv, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "%s\n", errstr);
        return -1;
    }
    port = serve_port(srv);
    signal(SIGPIPE, SIG_IGN);
    /* ready once the first weights are read */
    harness_resp_t r;
    harness_await_code(port, tmp_dir, &r, "/readyz", 200, 250, 20);
    int code = r.code;
    harness_resp_free(&r);
    if (code == 200)
        return 0;
    fprintf(stderr, "serve never became ready\n");
    return -1;
}

static int teardown(void **state)
{
    (void)state;
    serve_destroy(srv);
    psstore_client_destroy(client);
    harness_applier_stop(&applier, NULL);
    harness_redis_stop(&redis);
    fr_metrics_destroy(metrics);
    harness_kill_children();
    harness_rmdir(tmp_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_models_and_errors),
        cmocka_unit_test(test_weights_equal_the_store_in_every_format),
        cmocka_unit_test(test_long_poll_times_out_and_wakes_on_a_push),
        cmocka_unit_test(test_500_waiters_wake_together_and_hangups_are_dropped),
        cmocka_unit_test(test_snapshots_metadata_and_metrics),
        cmocka_unit_test(test_snapshots_are_listed_without_reading_weights),
        cmocka_unit_test(test_stats_hold_the_store_s_numbers),
        cmocka_unit_test(test_replay_and_rollback_need_the_token),
        cmocka_unit_test(test_dashboard_loads_in_chromium_with_data),
        cmocka_unit_test(test_tls_serves_https),
        cmocka_unit_test(test_protect_reads_needs_the_token_for_reads),
        cmocka_unit_test(test_infer_predicts_as_a_double_forward_pass),
        cmocka_unit_test(test_infer_batches_and_bounds_its_queue),
        cmocka_unit_test(test_the_edge_refuses_what_it_must),
        cmocka_unit_test(test_descriptor_exhaustion_pauses_accept),
        cmocka_unit_test(test_slow_connections_time_out_and_long_polls_do_not),
        cmocka_unit_test(test_connections_beyond_the_cap_wait),
        /* last: it stops the applier (the guard) */
        cmocka_unit_test(test_readiness_follows_the_store_and_the_guard),
    };
    /* TEST_FILTER=pattern runs the matching tests only (while debugging) */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
