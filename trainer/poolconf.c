/*
 * poolconf.c - the workers' per-worker settings from the configuration:
 * "[trainer] slowdown" (stragglers for experiments) and "[trainer]
 * devices". Pure: built in every configuration.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/trainer.h"

fr_err_t trainer_slowdown_parse(const char *text, int n, double *factors, char *errstr, size_t size)
{
    return trainer_slowdown_parse_timed(text, n, factors, NULL, errstr, size);
}

fr_err_t trainer_slowdown_parse_timed(const char *text, int n, double *factors, double *seconds,
                                      char *errstr, size_t size)
{
    for (int i = 0; i < n; i++) {
        factors[i] = 1.0;
        if (seconds != NULL)
            seconds[i] = 0.0;
    }
    for (const char *p = text != NULL ? text : ""; *p != '\0';) {
        char *end;
        errno = 0;
        long worker = strtol(p, &end, 10);
        if (end == p || *end != ':' || errno != 0 || worker < 0 || worker >= n)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "[trainer] slowdown: '%s': expected <worker>:<factor> with worker "
                             "in 0..%d",
                             p, n - 1);
        const char *f = end + 1;
        double factor = strtod(f, &end);
        double secs = 0.0;
        if (end != f && *end == ':') { /* <worker>:<factor>:<seconds> */
            const char *s = end + 1;
            secs = strtod(s, &end);
            if (end == s || errno != 0 || !isfinite(secs) || secs <= 0)
                return fr_errorf(FR_ERR_INVAL, errstr, size,
                                 "[trainer] slowdown: '%s': the duration must be seconds > 0", s);
        }
        if (end == f || errno != 0 || !isfinite(factor) || factor < 1.0 ||
            (*end != ',' && *end != '\0') || (*end == ',' && end[1] == '\0'))
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "[trainer] slowdown: '%s': the factor must be a number >= 1", f);
        factors[worker] = factor;
        if (seconds != NULL)
            seconds[worker] = secs;
        p = *end == ',' ? end + 1 : end;
    }
    return FR_OK;
}

fr_err_t trainer_devices_parse(const char *text, int n, int *devices, char *errstr, size_t size)
{
    int given = 0;
    const char *p = text != NULL ? text : "";
    while (*p != '\0' && given < n) {
        char *end;
        errno = 0;
        long d = strtol(p, &end, 10);
        if (end == p || errno != 0 || d < 0 || d > 1023 || (*end != ',' && *end != '\0') ||
            (*end == ',' && end[1] == '\0'))
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "[trainer] devices: '%s': expected a list of device numbers", p);
        devices[given++] = (int)d;
        p = *end == ',' ? end + 1 : end;
    }
    for (int i = 0; i < n; i++)
        devices[i] = given > 0 ? devices[i % given] : 0;
    return FR_OK;
}
