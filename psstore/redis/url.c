/*
 * url.c - Redis URLs: redis://[user:pass@]host[:port][,host[:port]...][/db]
 * and unix:///path[?db=N], parsed into psstore_url_t, and how errors name
 * an endpoint. Error messages never quote the URL (it may hold a
 * password), only the host and port or the socket path taken from it.
 *
 * Threads: reentrant.
 */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include "psstore/redis/redis_int.h"

#define URL_FORMS "redis://[user:pass@]host[:port][,host[:port]...][/db] or unix:///path[?db=N]"

/* ------------------------------------------------------------------------
 * URLs
 * ---------------------------------------------------------------------- */

/* Nonzero when s starts with prefix, ignoring ASCII case. */
static int has_prefix(const char *s, const char *prefix)
{
    return strncasecmp(s, prefix, strlen(prefix)) == 0;
}

static int hex_value(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/*
 * Percent-decodes s[0..n) into out[size] (NUL-terminated). "%XX" with two
 * hex digits becomes that byte; a '%' not followed by two hex digits stays
 * literal, so a password such as "50%off" needs no encoding. Returns 0, or
 * -1 when the result does not fit or would hold a NUL byte.
 */
static int percent_decode(const char *s, size_t n, char *out, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)s[i];
        if (ch == '%' && i + 2 < n && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
            ch = hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]);
            i += 2;
            if (ch == 0)
                return -1;
        }
        if (o + 1 >= size)
            return -1;
        out[o++] = (char)ch;
    }
    out[o] = '\0';
    return 0;
}

/*
 * Parses a decimal integer s[0..n) in [min, max] (digits only). Returns 0
 * or -1.
 */
static int parse_int(const char *s, size_t n, long long min, long long max, int *out)
{
    if (n == 0 || n > 10)
        return -1;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

/*
 * Splits "user:pass" (s[0..n), the part before the last '@') into u->user
 * and u->pass, percent-decoded. The user ends at the first ':'; the password
 * may hold ':' and '@'. Returns FR_OK or FR_ERR_INVAL (the message quotes
 * neither).
 */
static fr_err_t parse_userinfo(const char *s, size_t n, psstore_url_t *u, char *errstr, size_t size)
{
    const char *colon = memchr(s, ':', n);
    if (colon == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "redis URL: write credentials as USER:PASSWORD@ or :PASSWORD@");
    if (percent_decode(s, (size_t)(colon - s), u->user, sizeof(u->user)) != 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "redis URL: the user name is longer than %zu bytes or holds %%00",
                         sizeof(u->user) - 1);
    if (percent_decode(colon + 1, n - (size_t)(colon + 1 - s), u->pass, sizeof(u->pass)) != 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "redis URL: the password is longer than %zu bytes or holds %%00",
                         sizeof(u->pass) - 1);
    return FR_OK;
}

/* Nonzero for the bytes a host name or an IPv4 address may hold. */
static int host_char(char ch)
{
    return isalnum((unsigned char)ch) || ch == '.' || ch == '-' || ch == '_';
}

/*
 * Parses "host[:port][/db]" or "[v6addr][:port][/db]" (s is what follows
 * "redis://" and the credentials).
 */
static fr_err_t parse_tcp(const char *s, psstore_url_t *u, char *errstr, size_t size)
{
    const char *host = s, *end;
    if (*s == '[') {
        host = s + 1;
        end = strchr(host, ']');
        if (end == NULL || end == host)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "redis URL: an IPv6 address goes in brackets: redis://[::1]:6379");
        for (const char *p = host; p < end; p++) {
            if (!isxdigit((unsigned char)*p) && *p != ':' && *p != '.')
                return fr_errorf(FR_ERR_INVAL, errstr, size,
                                 "redis URL: bad IPv6 address in brackets");
        }
        s = end + 1;
    } else {
        end = host;
        while (host_char(*end))
            end++;
        if (end == host)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "redis URL: no host (expected " URL_FORMS ")");
        s = end;
    }
    if ((size_t)(end - host) >= sizeof(u->host))
        return fr_errorf(FR_ERR_INVAL, errstr, size, "redis URL: host name too long");
    memcpy(u->host, host, (size_t)(end - host));
    u->host[end - host] = '\0';

    if (*s == ':') {
        const char *p = ++s;
        while (*s != '\0' && *s != '/')
            s++;
        if (parse_int(p, (size_t)(s - p), 1, 65535, &u->port) != 0)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "redis URL: the port of %s must be a number in 1..65535", u->host);
    }
    if (*s == '/') {
        const char *p = ++s;
        s += strlen(s);
        if (s > p && parse_int(p, (size_t)(s - p), 0, INT_MAX, &u->db) != 0)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "redis URL: the database after '/' must be a number >= 0");
    }
    if (*s != '\0')
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "redis URL: unexpected text after host %s (expected " URL_FORMS ")",
                         u->host);
    return FR_OK;
}

/*
 * Parses "host[:port],host[:port]...[/db]": the seeds of a Redis Cluster,
 * or one host. Only the last may carry the database.
 */
static fr_err_t parse_hosts(const char *s, psstore_url_t *u, char *errstr, size_t size)
{
    char piece[300];
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t n = comma ? (size_t)(comma - s) : strlen(s);
        if (u->nseeds == PSSTORE_URL_SEEDS_MAX)
            return fr_errorf(FR_ERR_INVAL, errstr, size, "redis URL: more than %d hosts",
                             PSSTORE_URL_SEEDS_MAX);
        if (n >= sizeof(piece))
            return fr_errorf(FR_ERR_INVAL, errstr, size, "redis URL: host name too long");
        memcpy(piece, s, n);
        piece[n] = '\0';
        if (comma != NULL && memchr(piece, '/', n) != NULL)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "redis URL: the database goes after the last host only");
        u->port = 6379;
        fr_err_t err = parse_tcp(piece, u, errstr, size);
        if (err != FR_OK)
            return err;
        snprintf(u->seeds[u->nseeds].host, sizeof(u->seeds[0].host), "%s", u->host);
        u->seeds[u->nseeds].port = u->port;
        u->nseeds++;
        if (comma == NULL)
            break;
        s = comma + 1;
    }
    snprintf(u->host, sizeof(u->host), "%s", u->seeds[0].host);
    u->port = u->seeds[0].port;
    return FR_OK;
}

/* Parses "/path[?db=N]" (what follows "unix://" and the credentials). */
static fr_err_t parse_unix(const char *s, psstore_url_t *u, char *errstr, size_t size)
{
    if (*s != '/')
        return fr_errorf(
            FR_ERR_INVAL, errstr, size,
            "redis URL: a unix socket needs an absolute path: unix:///path/redis.sock");
    const char *q = strchr(s, '?');
    size_t n = q ? (size_t)(q - s) : strlen(s);
    if (n >= sizeof(((struct sockaddr_un *)0)->sun_path) || n >= sizeof(u->path))
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "redis URL: the unix socket path is longer than %zu bytes",
                         sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    memcpy(u->path, s, n);
    u->path[n] = '\0';
    u->unix_socket = 1;
    if (q != NULL) {
        if (strncmp(q, "?db=", 4) != 0 || parse_int(q + 4, strlen(q + 4), 0, INT_MAX, &u->db) != 0)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "redis URL: after the socket path only ?db=N is understood");
    }
    return FR_OK;
}

/*
 * Parses a Redis URL (see psstore/redis/redis.h). Error messages never quote the URL,
 * which may hold a password: they name the part that is wrong.
 */
fr_err_t psstore_url_parse(const char *url, psstore_url_t *u, char *errstr, size_t size)
{
    memset(u, 0, sizeof(*u));
    u->port = 6379;
    if (url == NULL || *url == '\0')
        return fr_errorf(FR_ERR_INVAL, errstr, size, "redis URL is empty (expected " URL_FORMS ")");
    for (const char *p = url; *p != '\0'; p++) {
        if ((unsigned char)*p <= ' ' || *p == 0x7f)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "redis URL: spaces and control characters must be percent-encoded");
    }
    if (has_prefix(url, "rediss://"))
        return fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                         "rediss:// is not supported: hiredis 0.14 has no TLS; put a TLS proxy "
                         "(stunnel, spiped) in front of Redis and use redis://");
    int is_unix = has_prefix(url, "unix://");
    if (!is_unix && !has_prefix(url, "redis://")) {
        const char *sep = strstr(url, "://");
        size_t n = sep ? (size_t)(sep - url) : 0;
        int scheme_ok = n > 0 && n <= 16;
        for (size_t i = 0; scheme_ok && i < n; i++)
            scheme_ok =
                isalnum((unsigned char)url[i]) || url[i] == '+' || url[i] == '-' || url[i] == '.';
        if (scheme_ok)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "redis URL: unsupported scheme '%.*s' (expected " URL_FORMS ")",
                             (int)n, url);
        return fr_errorf(FR_ERR_INVAL, errstr, size, "redis URL: expected " URL_FORMS);
    }
    /* Credentials end at the last '@' (the password may hold unencoded ':'
     * and '@'); for a socket, at the last '@' that a '/' follows, so that
     * paths such as /run/redis@main/redis.sock keep theirs. */
    const char *rest = url + (is_unix ? strlen("unix://") : strlen("redis://"));
    const char *at = NULL;
    for (const char *p = rest; !(is_unix && rest[0] == '/') && *p != '\0'; p++) {
        if (*p == '@' && (!is_unix || p[1] == '/'))
            at = p;
    }
    fr_err_t err = FR_OK;
    if (at != NULL)
        err = parse_userinfo(rest, (size_t)(at - rest), u, errstr, size);
    if (err == FR_OK)
        err = is_unix ? parse_unix(at ? at + 1 : rest, u, errstr, size)
                      : parse_hosts(at ? at + 1 : rest, u, errstr, size);
    if (err != FR_OK) {
        explicit_bzero(u->pass, sizeof(u->pass));
        return err;
    }
    return FR_OK;
}

/* Writes "host:port", "[v6]:port" or the socket path: how errors name Redis. */
void ps_endpoint(const psstore_conn_t *c, char *buf, size_t size)
{
    const psstore_url_t *u = &c->url;
    if (c->cl != NULL && c->cl->cur >= 0) {
        const ps_node_t *nd = &c->cl->nodes[c->cl->cur];
        snprintf(buf, size, strchr(nd->host, ':') ? "[%s]:%d" : "%s:%d", nd->host, nd->port);
    } else if (u->unix_socket)
        snprintf(buf, size, "%s", u->path);
    else if (strchr(u->host, ':') != NULL)
        snprintf(buf, size, "[%s]:%d", u->host, u->port);
    else
        snprintf(buf, size, "%s:%d", u->host, u->port);
}
