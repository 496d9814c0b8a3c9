/*
 * compare_verdict.c - the verdict of freshet compare, computed from the
 * aggregates: per cell (workers x straggler) which mode reached the
 * target first, which ended most accurate and what each cost; then which
 * of the seed article's claims held on this data (docs/design.md
 * "Training modes" names the modes, docs/operations.md "What compare reports" the claims).
 *
 * A difference of accuracy is decisive when it exceeds CMP_DECISIVE and,
 * with several seeds, the larger standard deviation of the two.
 *
 * Threads: any; no state.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/compare.h"
#include "common/common.h"

#define CMP_DECISIVE 0.005 /* half a point of accuracy */

static void vadd(cmp_verdict_t *v, const char *scope, const char *question, const char *status,
                 const char *fmt, ...) FR_PRINTF(5, 6);

static void vadd(cmp_verdict_t *v, const char *scope, const char *question, const char *status,
                 const char *fmt, ...)
{
    if (v->n == CMP_VERDICT_MAX)
        return;
    cmp_vline_t *l = &v->lines[v->n++];
    snprintf(l->scope, sizeof(l->scope), "%s", scope);
    snprintf(l->question, sizeof(l->question), "%s", question);
    snprintf(l->status, sizeof(l->status), "%s", status);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->text, sizeof(l->text), fmt, ap);
    va_end(ap);
}

/* The agg of mode in cell (workers, straggler), or NULL. */
static const cmp_agg_t *cell_mode(const cmp_grid_t *g, int workers, int straggler, const char *mode)
{
    for (size_t i = 0; i < g->naggs; i++) {
        const cmp_agg_t *a = &g->aggs[i];
        if (a->workers == workers && a->straggler == straggler && strcmp(a->mode, mode) == 0)
            return a->ok > 0 ? a : NULL;
    }
    return NULL;
}

/* +1 when a is decisively more accurate than b, -1 when less, 0 within noise. */
static int acc_order(const cmp_agg_t *a, const cmp_agg_t *b)
{
    double d = a->acc_mean - b->acc_mean, sd = fmax(a->acc_sd, b->acc_sd);
    if (fabs(d) <= CMP_DECISIVE || fabs(d) <= sd)
        return 0;
    return d > 0 ? 1 : -1;
}

static int reached_all(const cmp_agg_t *a)
{
    return a->ok > 0 && a->reached == a->ok;
}

/* The cell's questions: first to the target, most accurate, costs.
 * first and best receive the winners (NULL when none). */
static void verdict_cell(const cmp_grid_t *g, const cmp_agg_t *c0, cmp_verdict_t *v,
                         const cmp_agg_t **first, const cmp_agg_t **best)
{
    char scope[64], costs[1024] = "";
    snprintf(scope, sizeof(scope), "%d workers, %s", c0->workers,
             c0->straggler ? "straggler" : "no straggler");
    *first = *best = NULL;
    size_t len = 0;
    for (size_t i = 0; i < g->naggs; i++) {
        const cmp_agg_t *a = &g->aggs[i];
        if (a->workers != c0->workers || a->straggler != c0->straggler || a->ok == 0)
            continue;
        if (reached_all(a) && (*first == NULL || a->t_target_mean < (*first)->t_target_mean))
            *first = a;
        if (*best == NULL || a->acc_mean > (*best)->acc_mean)
            *best = a;
        len += (size_t)snprintf(costs + len, len < sizeof(costs) ? sizeof(costs) - len : 0,
                                "%s%s waits %.2f s, drops %.0f, staleness p50/p99 %.0f/%.0f",
                                len ? "; " : "", a->mode, a->waits_s, a->drops, a->tau_p50,
                                a->tau_p99);
    }
    if (*first != NULL)
        vadd(v, scope, "reached the target first", "answered",
             "%s reached %.4f first: %.2f s and %.0f samples after its first version (mean of "
             "%d run(s))",
             (*first)->mode, g->target, (*first)->t_target_mean, (*first)->s_target_mean,
             (*first)->ok);
    else
        vadd(v, scope, "reached the target first", "none",
             "no mode reached %.4f in all of its runs", g->target);
    if (*best != NULL) {
        const cmp_agg_t *second = NULL;
        for (size_t i = 0; i < g->naggs; i++) {
            const cmp_agg_t *a = &g->aggs[i];
            if (a != *best && a->workers == c0->workers && a->straggler == c0->straggler &&
                a->ok > 0 && (second == NULL || a->acc_mean > second->acc_mean))
                second = a;
        }
        vadd(v, scope, "ended most accurate", "answered",
             "%s ended most accurate: %.4f (sd %.4f)%s%s%s", (*best)->mode, (*best)->acc_mean,
             (*best)->acc_sd, second ? "; next " : "", second ? second->mode : "",
             second == NULL             ? ""
             : acc_order(*best, second) ? ", decisively ahead"
                                        : ", within noise");
    }
    vadd(v, scope, "what each cost", "answered", "%s", costs);
}

/* Tallies of a claim over the cells where the numbers speak to it. */
typedef struct tally {
    int held, failed, noise, cells;
    char where[512];
} tally_t;

static void tally_add(tally_t *t, int outcome, const cmp_agg_t *cell)
{
    size_t len = strlen(t->where);
    t->cells++;
    if (outcome > 0)
        t->held++;
    else if (outcome < 0)
        t->failed++;
    else
        t->noise++;
    snprintf(t->where + len, sizeof(t->where) - len, "%s%dw%s: %s", len ? ", " : "", cell->workers,
             cell->straggler ? "+straggler" : "",
             outcome > 0   ? "held"
             : outcome < 0 ? "did not hold"
                           : "within noise");
}

static void tally_say(cmp_verdict_t *v, const char *claim, const tally_t *t, const char *absent)
{
    if (t->cells == 0) {
        vadd(v, "seed claims", claim, "not measured", "%s", absent);
        return;
    }
    const char *status = t->held == t->cells             ? "held"
                         : t->failed == t->cells         ? "did not hold"
                         : t->held > 0 && t->failed == 0 ? "held where decisive"
                                                         : "mixed";
    vadd(v, "seed claims", claim, status, "%d of %d cell(s) held (%s)", t->held, t->cells,
         t->where);
}

/*
 * Auto's promise in its cell: within CMP_DECISIVE of the most accurate
 * mode and, where some mode reached the target in every run, reaching it
 * in every run within 1.2x of the fastest such mode's mean time. 1: held;
 * -1: did not (decisively less accurate, slower, or short of a target
 * another mode reached); 0: within noise (more than CMP_DECISIVE below the
 * best, but by no more than the seeds' sd). A cell where no mode reached
 * the target every time has no fastest time: accuracy alone decides.
 */
static int auto_outcome(const cmp_grid_t *g, const cmp_agg_t *au)
{
    const cmp_agg_t *best = au;
    double fastest = INFINITY;
    for (size_t i = 0; i < g->naggs; i++) {
        const cmp_agg_t *a = &g->aggs[i];
        if (a->workers != au->workers || a->straggler != au->straggler || a->ok == 0)
            continue;
        if (a->acc_mean > best->acc_mean)
            best = a;
        if (reached_all(a))
            fastest = fmin(fastest, a->t_target_mean);
    }
    if (isfinite(fastest) && (!reached_all(au) || au->t_target_mean > 1.2 * fastest))
        return -1;
    if (au->acc_mean >= best->acc_mean - CMP_DECISIVE)
        return 1;
    return acc_order(best, au) == 0 ? 0 : -1;
}

/* Claim 1 (sync ends more accurate), 2 (async wins with a straggler), 5
 * (a hybrid keeps sync's accuracy and is faster), and auto's promise. */
static void verdict_claims_cell(const cmp_grid_t *g, const cmp_agg_t *c, tally_t *t1, tally_t *t2,
                                tally_t *t5, tally_t *ta)
{
    static const char *const hybrids[] = {"adaptive", "backup", "groups", "ssp"};
    const cmp_agg_t *as = cell_mode(g, c->workers, c->straggler, "async");
    const cmp_agg_t *sy = cell_mode(g, c->workers, c->straggler, "sync");
    if (as != NULL && sy != NULL)
        tally_add(t1, acc_order(sy, as), c);
    if (as != NULL && sy != NULL && c->straggler && reached_all(as) && reached_all(sy))
        tally_add(t2, as->t_target_mean < sy->t_target_mean ? 1 : -1, c);
    if (sy != NULL && reached_all(sy)) {
        int any = -1, seen = 0;
        for (size_t h = 0; h < sizeof(hybrids) / sizeof(hybrids[0]); h++) {
            const cmp_agg_t *a = cell_mode(g, c->workers, c->straggler, hybrids[h]);
            if (a == NULL)
                continue;
            seen = 1;
            if (acc_order(a, sy) >= 0 && reached_all(a) && a->t_target_mean < sy->t_target_mean)
                any = 1;
        }
        if (seen)
            tally_add(t5, any, c);
    }
    const cmp_agg_t *au = cell_mode(g, c->workers, c->straggler, "auto");
    if (au != NULL)
        tally_add(ta, au->ok > 0 ? auto_outcome(g, au) : -1, c);
}

void cmp_verdict(const cmp_grid_t *g, cmp_verdict_t *v)
{
    tally_t t1 = {0}, t2 = {0}, t5 = {0}, ta = {0}, t6 = {0};
    char winners[CMP_MODE_MAX] = "";
    int one_winner = 1;
    v->n = 0;
    for (size_t i = 0; i < g->naggs; i++) {
        const cmp_agg_t *c = &g->aggs[i];
        int seen = 0; /* the first agg of its cell stands for the cell */
        for (size_t j = 0; j < i; j++)
            seen |= g->aggs[j].workers == c->workers && g->aggs[j].straggler == c->straggler;
        if (seen)
            continue;
        const cmp_agg_t *first, *best;
        verdict_cell(g, c, v, &first, &best);
        verdict_claims_cell(g, c, &t1, &t2, &t5, &ta);
        if (first != NULL && best != NULL) {
            tally_add(&t6, strcmp(first->mode, best->mode) != 0 ? 1 : -1, c);
            if (winners[0] == '\0')
                snprintf(winners, sizeof(winners), "%s", first->mode);
            one_winner &= strcmp(winners, first->mode) == 0 && strcmp(winners, best->mode) == 0;
        }
    }
    tally_say(v, "1. synchronous ends more accurate than asynchronous", &t1,
              "needs modes async and sync");
    tally_say(v, "2. with a straggler, asynchronous reaches the target sooner than synchronous",
              &t2, "needs modes async and sync, --straggler, and both reaching the target");
    vadd(v, "seed claims", "3. engineering cost", "not measured",
         "a matter of code and operations, not of these numbers (the staleness and waits "
         "above are its symptoms)");
    vadd(v, "seed claims", "4. when to choose which", "not measured",
         "the cells above answer it for this data and this machine");
    tally_say(v, "5. a hybrid keeps synchronous accuracy and reaches the target sooner", &t5,
              "needs sync and a hybrid mode (adaptive, backup, groups, ssp) reaching the target");
    if (t6.cells == 0)
        vadd(v, "seed claims", "6. no universal optimum", "not measured",
             "no cell had a mode reaching the target");
    else
        vadd(v, "seed claims", "6. no universal optimum", one_winner ? "did not hold" : "held",
             "%s",
             one_winner ? "one mode was both first and most accurate in every cell"
                        : "the fastest and the most accurate mode differ by cell");
    if (ta.cells > 0)
        tally_say(v, "auto: within 0.5 points of the best accuracy and 1.2x the fastest time", &ta,
                  "");
}
