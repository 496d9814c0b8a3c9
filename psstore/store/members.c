/*
 * members.c - training modes and membership (docs/design.md "Training modes",
 * "Membership"): the mode names, and the text of one worker's entry in
 * freshet:{m}:members.
 *
 * An entry maps the worker id to "<backend> <group> <clock> <idle> <beat>":
 * the backend name, the worker's group, its SSP clock (gradients pushed,
 * counted from where it joined), 1 while it has waited longer than
 * idle_ms for data, and a counter the worker increments at every heartbeat.
 * Readers judge liveness by watching beat change on their own clock, so no
 * two machines' clocks are ever compared.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/store/store_int.h"

static const char *const mode_names[] = {"async", "sync",     "backup", "groups",
                                         "ssp",   "adaptive", "auto"};
static const char *const phase_names[] = {"async", "backup", "ssp"};

const char *psstore_phase_name(psstore_phase_t phase)
{
    return (unsigned)phase < PSSTORE_NPHASE ? phase_names[phase] : "unknown";
}

psstore_phase_t psstore_phase_parse(const char *name)
{
    for (int i = 0; name != NULL && i < PSSTORE_NPHASE; i++)
        if (strcmp(name, phase_names[i]) == 0)
            return (psstore_phase_t)i;
    return PSSTORE_PHASE_ASYNC;
}

fr_err_t psstore_mode_parse(const char *name, psstore_mode_t *mode)
{
    if (name == NULL || mode == NULL)
        return FR_ERR_INVAL;
    for (size_t i = 0; i < sizeof(mode_names) / sizeof(mode_names[0]); i++) {
        if (strcmp(name, mode_names[i]) == 0) {
            *mode = (psstore_mode_t)i;
            return FR_OK;
        }
    }
    return FR_ERR_INVAL;
}

const char *psstore_mode_name(psstore_mode_t mode)
{
    return (unsigned)mode < sizeof(mode_names) / sizeof(mode_names[0]) ? mode_names[mode]
                                                                       : "unknown";
}

int psstore_mode_rounds(psstore_mode_t mode)
{
    return mode == PSSTORE_MODE_SYNC || mode == PSSTORE_MODE_BACKUP || mode == PSSTORE_MODE_GROUPS;
}

int ps_member_format(const psstore_member_t *m, char *buf, size_t size)
{
    int n = snprintf(buf, size, "%s %d %" PRId64 " %d %" PRIu64, m->backend[0] ? m->backend : "-",
                     m->group, m->clock, m->idle ? 1 : 0, m->beat);
    return n < 0 || (size_t)n >= size ? -1 : n;
}

int ps_member_parse(const char *id, size_t idlen, const char *val, size_t vlen, psstore_member_t *m)
{
    char text[128];
    if (idlen == 0 || idlen >= sizeof(m->id) || vlen == 0 || vlen >= sizeof(text))
        return -1;
    memcpy(text, val, vlen);
    text[vlen] = '\0';
    memset(m, 0, sizeof(*m));
    memcpy(m->id, id, idlen);
    m->id[idlen] = '\0';
    int idle, used = 0;
    if (sscanf(text, "%15s %d %" SCNd64 " %d %" SCNu64 "%n", m->backend, &m->group, &m->clock,
               &idle, &m->beat, &used) != 5 ||
        (size_t)used != vlen || m->group < 0 || m->clock < 0 || (idle != 0 && idle != 1))
        return -1;
    m->idle = idle;
    return 0;
}

fr_err_t ps_members_read(psstore_conn_t *c, const char *key, psstore_member_t **members, size_t *n,
                         size_t *cap)
{
    fr_err_t err;
    redisReply *r = ps_cmd(c, 1, &err, "HGETALL %s", key);
    if (r == NULL)
        return err;
    *n = 0;
    if (r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return ps_fail(c, FR_ERR_REDIS, "redis: HGETALL %s: unexpected reply", key);
    }
    size_t want = r->elements / 2;
    if (want > *cap) {
        psstore_member_t *grown = realloc(*members, want * sizeof(*grown));
        if (grown == NULL) {
            freeReplyObject(r);
            return ps_fail(c, FR_ERR_NOMEM, "members: out of memory");
        }
        *members = grown;
        *cap = want;
    }
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        /* an entry that does not parse is skipped: a member that cannot be
         * read cannot be waited for */
        if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING &&
            ps_member_parse(k->str, k->len, v->str, v->len, &(*members)[*n]) == 0)
            (*n)++;
    }
    freeReplyObject(r);
    return FR_OK;
}
