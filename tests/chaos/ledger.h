/*
 * ledger.h - exactly once from the weights (docs/operations.md "The ledger:
 * exactly once from the weights"): the chaos suite's model is one whose
 * weights are a sum over the multiset of records applied, and ledger.py
 * recomputes that sum with numpy from what the topic holds.
 */
#ifndef FRESHET_CHAOS_LEDGER_H
#define FRESHET_CHAOS_LEDGER_H

#include <stdint.h>

#include "harness.h"

/* The ledger model's features, its layers and its learning rate (2^-10, as
 * config text: every step is exact in float32). */
#define LEDGER_FEATURES 8
#define LEDGER_LAYERS   "8-1"
#define LEDGER_LR       "0.0009765625"
/* The initial bias (ledger.py's B0): the store's bias is LEDGER_B0 + 2^-10
 * times the records applied. */
#define LEDGER_B0 (-8192.0)

/* Record k of the stream, f32 [label, x...]: label 1, each feature -1, 0
 * or 1. */
void ledger_record(int64_t k, float v[1 + LEDGER_FEATURES]);

/* Writes the initial weights into path ([model] init), what ledger.py
 * says into log; 0 or -1. */
int ledger_init(const char *path, const char *log);

/*
 * Reads what the topic's nparts partitions hold (from where the last check
 * stopped to their ends; the producer must be held still), waits up to
 * wait_ms for the store's bias to count every record that must train, and
 * has ledger.py compare the store's weights with the recomputation. The
 * store is (*node)() at each read (a fail-over may move it). Returns 0 when
 * they agree, -1 with ledger.py's report (always printed) otherwise.
 */
int ledger_check(const char *bootstrap, const char *topic, int nparts, const char *model,
                 const harness_redis_t *(*node)(void), const char *dir, int wait_ms);

/* Closes the topic reader. */
void ledger_fini(void);

#endif /* FRESHET_CHAOS_LEDGER_H */
