/*
 * svc_applied.c - samples applied to a model, counted from its versions
 * stream: freshet compare follows a run with it and scores what it shows.
 * docs/design.md "Redis layout": the applier appends one versions entry per
 * applied update (a round: one for the round) with its samples n.
 *
 * Threads: one counter per thread (it borrows the caller's connection).
 */
#include <stdlib.h>

#include "app/app.h"

#define TAIL_FIRST 64      /* entries read by a poll when few are new   */
#define TAIL_MAX   1048576 /* the most one poll reads: far behind, it counts those */

fr_err_t app_applied_poll(psstore_conn_t *c, const char *model, app_applied_t *ap)
{
    size_t max = TAIL_FIRST, n = 0;
    psstore_version_entry_t *e = NULL;
    fr_err_t err = FR_OK;
    for (;;) {
        psstore_version_entry_t *grown = realloc(e, max * sizeof(*e));
        if (grown == NULL) {
            err = FR_ERR_NOMEM;
            goto out;
        }
        e = grown;
        if ((err = psstore_versions_tail(c, model, max, e, &n)) != FR_OK)
            goto out;
        /* newest first: all new and the stream holds more, read further back */
        if (n < max || e[n - 1].version <= ap->version || max >= TAIL_MAX)
            break;
        max *= 4;
    }
    for (size_t i = n; i-- > 0;) {
        if (e[i].version <= ap->version)
            continue;
        ap->version = e[i].version;
        if (e[i].rollback_from >= 0)
            continue;
        ap->samples += e[i].n;
        ap->versions++;
    }
out:
    free(e);
    return err;
}
