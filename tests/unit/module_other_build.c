/*
 * module_other_build.c - a CUDA module as another build of freshet would
 * make it: its interface number differs from this build's. test_trainer
 * points FRESHET_CUDA_MODULE at it and checks that the loader refuses it
 * before touching what it exports (trainer/backend.c).
 */
#include <stddef.h>

#include "model/model.h"
#include "trainer/backend.h"

__attribute__((visibility("default"))) const trainer_backend_module_t fcuda_module = {
    TRAINER_BACKEND_ABI + 1,
    sizeof(trainer_backend_ops_t),
    sizeof(model_t),
    NULL,
};
