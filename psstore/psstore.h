/*
 * psstore.h - the whole parameter store in one include, for the commands
 * (app/), the tests and the benchmarks: its public headers, one a folder
 * (docs/design.md "Source layout"). serve, ingest's consumer and the
 * trainers include only those they use; nothing inside psstore/ includes
 * this file.
 *
 *   positions/positions.h  offsets, replay specs, shard cuts (no Redis)
 *   update/update.h        optimizers, the served average, the controller (no Redis)
 *   redis/redis.h          URLs and the connection to Redis or a Redis Cluster
 *   store/store.h          a model's keys, lifecycle, reads, offsets, modes, requests
 *   store/status.h         what operators and serve read: versions, drops, evals, lag
 *   store/rows_sparse.h    a sparse model's rows
 *   grads/grads.h          pull and push, membership, the in-process channel
 *   applier/applier.h      the single writer
 */
#ifndef FRESHET_PSSTORE_H
#define FRESHET_PSSTORE_H

#include "psstore/applier/applier.h"
#include "psstore/grads/grads.h"
#include "psstore/positions/positions.h"
#include "psstore/redis/redis.h"
#include "psstore/store/rows_sparse.h"
#include "psstore/store/status.h"
#include "psstore/store/store.h"
#include "psstore/update/update.h"

#endif /* FRESHET_PSSTORE_H */
