/*
 * trainer_int.h - private declarations shared by the trainer's sources.
 */
#ifndef FRESHET_TRAINER_INT_H
#define FRESHET_TRAINER_INT_H

#include "trainer/trainer.h"

/*
 * Row-major single-precision GEMM: C[m x n] = alpha * op(A) * op(B) + beta * C
 * where op(A) is [m x k] and op(B) is [k x n]; trans* nonzero transposes.
 * OpenBLAS's cblas_sgemm where the build has it, else a plain C loop nest
 * (correct but slow; only FRESHET_CORE_ONLY builds on hosts without
 * OpenBLAS use it).
 */
void trainer_sgemm(int transa, int transb, int m, int n, int k, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* The same loop nest, always built, so tests can compare BLAS against it. */
void trainer_sgemm_ref(int transa, int transb, int m, int n, int k, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* Limits this process's BLAS to one thread unless OPENBLAS_NUM_THREADS is
 * set: workers run one BLAS thread each (docs/design.md "Performance model"). */
void trainer_blas_single_thread(void);

#endif
