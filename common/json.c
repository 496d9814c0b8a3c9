/*
 * json.c - the one JSON string escaper of the tree: serve's bodies and the
 * commands' JSON (model show, run's summary, compare's report) are written
 * by it, so a string reads the same wherever freshet writes it.
 *
 * Threads: any; no state.
 */
#include <string.h>

#include "common/common.h"
#include "common/common_int.h"

void fr_json_str(fr_buf_t *b, const char *s)
{
    fr_buf_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        /* RFC 3629 (no overlong forms, surrogates or code points past
         * U+10FFFF), as the safetensors reader checks names */
        size_t n = fr__st_utf8_len(p, strnlen((const char *)p, 4));
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            fr_buf_add(b, esc, 2);
        } else if (*p < 0x20 || *p == 0x7f || *p == '<') { /* '<': no "</script>" in a page */
            fr_buf_printf(b, "\\u%04x", *p);
        } else if (n == 0) { /* not UTF-8 (a path's %ff, a name from Redis): U+FFFD */
            fr_buf_puts(b, "\\ufffd");
        } else {
            fr_buf_add(b, (const char *)p, n);
            p += n;
            continue;
        }
        p++;
    }
    fr_buf_add(b, "\"", 1);
}
