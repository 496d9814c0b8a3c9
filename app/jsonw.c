/*
 * jsonw.c - the JSON text the commands write (model show, run's summary,
 * compare's report): strings escaped by common's one escaper
 * (fr_json_str), numbers that are never NaN or infinity (null instead),
 * and the one reader compare needs for run's summary, whose keys are
 * unique by design.
 *
 * Threads: any; no state.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"

void app_json_str(FILE *out, const char *s)
{
    /* common's escaper (fr_json_str), written out; a string too large to
     * hold (out of memory) is written as "" */
    fr_buf_t b = {0};
    fr_json_str(&b, s);
    size_t len;
    char *text = fr_buf_take(&b, &len);
    if (text != NULL)
        fwrite(text, 1, len, out);
    else
        fputs("\"\"", out);
    free(text);
}

void app_json_num(FILE *out, double v)
{
    if (!isfinite(v))
        fputs("null", out);
    else if (v == floor(v) && fabs(v) < 9e15)
        fprintf(out, "%.0f", v);
    else
        fprintf(out, "%.9g", v);
}

int app_json_find_num(const char *text, const char *key, double *v)
{
    char pat[80];
    int len = snprintf(pat, sizeof(pat), "\"%s\":", key);
    if (len <= 0 || (size_t)len >= sizeof(pat))
        return -1;
    const char *p = strstr(text, pat);
    if (p == NULL)
        return -1;
    char *end;
    double x = strtod(p + len, &end);
    if (end == p + len)
        return -1;
    *v = x;
    return 0;
}
