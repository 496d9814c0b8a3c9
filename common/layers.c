/*
 * layers.c - the layer-list syntax, one parser for the config schema and
 * the model spec.
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

#include "common/common.h"

fr_err_t fr_layers_parse(const char *list, int *dims, int *ndims, char *errstr, size_t size)
{
    const char *p = list;
    int n = 0;
    *ndims = 0;
    for (;;) {
        if (!isdigit((unsigned char)*p))
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "model: bad layer list '%s' (expected widths joined by '-', e.g. "
                             "784-256-10)",
                             list);
        errno = 0;
        char *end;
        long v = strtol(p, &end, 10);
        if (errno != 0 || v < 1 || v > FR_WIDTH_MAX)
            return fr_errorf(FR_ERR_INVAL, errstr, size, "model: layer width in '%s' must be 1..%d",
                             list, FR_WIDTH_MAX);
        if (n == FR_LAYERS_MAX)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "model: '%s' has more than %d layer widths", list, FR_LAYERS_MAX);
        dims[n++] = (int)v;
        p = end;
        if (*p == '\0')
            break;
        if (*p != '-')
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "model: bad layer list '%s' (expected widths joined by '-', e.g. "
                             "784-256-10)",
                             list);
        p++;
    }
    if (n < 2)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "model: '%s' needs at least an input and an output width", list);
    *ndims = n;
    return FR_OK;
}
