/*
 * schema.c - the record schema a model's input implies: ingest decodes
 * records against it. It lives in the trainer, which uses both the model
 * and ingest, so that neither of those two depends on the other.
 */
#include <string.h>

#include "trainer/trainer.h"

void trainer_model_schema(const model_t *m, ingest_schema_t *schema)
{
    memset(schema, 0, sizeof(*schema));
    schema->features = m->dims[0];
    switch (m->loss) {
    case MODEL_LOSS_SOFTMAX:
        schema->label = INGEST_LABEL_CLASS;
        schema->classes = m->dims[m->nlayers];
        break;
    case MODEL_LOSS_LOGISTIC: schema->label = INGEST_LABEL_BINARY; break;
    case MODEL_LOSS_MSE: schema->label = INGEST_LABEL_REAL; break;
    }
}
