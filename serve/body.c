/*
 * body.c - the body of a POST (replay and rollback; docs/http.md
 * "`POST /v2/models/{m}/replay`"): a form (application/x-www-form-urlencoded, or no
 * Content-Type) or a JSON object (application/json) of parameters, added
 * to the query string's. The caller reads it only after the bearer token
 * was checked, so a client without the token learns nothing about its
 * body, not even that it was malformed.
 *
 * JSON is parsed by libjansson (duplicate keys refused); each member is
 * one parameter: a string as it is, a number as its decimal text, true
 * and false as those words. A member of another kind (null, an array, an
 * object) is refused by name: these routes take no structured values.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "serve/http_int.h"

/* The media type of the body (its Content-Type up to any ';', spaces
 * trimmed) into out[size]; "" when there is none. */
static void media_type(struct evhttp_request *req, char *out, size_t size)
{
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
    out[0] = '\0';
    if (ct == NULL)
        return;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    size_t n = strcspn(ct, ";");
    while (n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
        n--;
    snprintf(out, size, "%.*s", (int)(n < size ? n : size - 1), ct);
}

/* A form body's parameters into params. */
static int form_params(const char *body, size_t len, struct evkeyvalq *params, char *why,
                       size_t size)
{
    struct evkeyvalq form;
    TAILQ_INIT(&form);
    if (strlen(body) != len || evhttp_parse_query_str(body, &form) != 0) {
        evhttp_clear_headers(&form);
        snprintf(why, size, "malformed form body");
        return -1;
    }
    for (struct evkeyval *kv = form.tqh_first; kv != NULL; kv = kv->next.tqe_next)
        evhttp_add_header(params, kv->key, kv->value);
    evhttp_clear_headers(&form);
    return 0;
}

/* A JSON object's members into params. */
static int json_params(const char *body, size_t len, struct evkeyvalq *params, char *why,
                       size_t size)
{
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        snprintf(why, size, "malformed JSON body: %s (line %d, column %d)", jerr.text, jerr.line,
                 jerr.column);
        return -1;
    }
    int rc = 0;
    if (!json_is_object(root)) {
        snprintf(why, size, "the JSON body must be an object of parameters");
        rc = -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (rc != 0)
            break;
        char text[64];
        const char *val = text;
        if (json_is_string(v))
            val = json_string_value(v);
        else if (json_is_integer(v))
            snprintf(text, sizeof(text), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        else if (json_is_real(v))
            snprintf(text, sizeof(text), "%.17g", json_real_value(v));
        else if (json_is_boolean(v))
            snprintf(text, sizeof(text), "%s", json_is_true(v) ? "true" : "false");
        else {
            snprintf(why, size,
                     "JSON member '%.64s': a parameter is a string, a number or a "
                     "boolean",
                     key);
            rc = -1;
            break;
        }
        if (evhttp_add_header(params, key, val) != 0) { /* a CR or LF in it */
            snprintf(why, size, "JSON member '%.64s' cannot be a parameter", key);
            rc = -1;
        }
    }
    json_decref(root);
    return rc;
}

int sv_body_params(struct evhttp_request *req, struct evkeyvalq *params, int *code, char *why,
                   size_t size)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    char type[128];
    media_type(req, type, sizeof(type));
    int json = strcasecmp(type, "application/json") == 0;
    if (!json && type[0] != '\0' && strcasecmp(type, "application/x-www-form-urlencoded") != 0) {
        *code = 415;
        snprintf(why, size,
                 "Content-Type %.64s: send application/json or application/x-www-form-urlencoded",
                 type);
        return -1;
    }
    *code = 400;
    if (len == 0)
        return 0;
    char *body = malloc(len + 1); /* at most [serve] max_body: libevent refused larger */
    if (body == NULL) {
        *code = 503;
        snprintf(why, size, "out of memory for a body of %zu bytes", len);
        return -1;
    }
    evbuffer_copyout(in, body, len);
    body[len] = '\0';
    int rc = json ? json_params(body, len, params, why, size)
                  : form_params(body, len, params, why, size);
    free(body);
    return rc;
}
