/*
 * blas.c - the one place that calls BLAS.
 */
#include <stdlib.h>

#include "trainer/trainer_int.h"

#ifdef FRESHET_HAVE_OPENBLAS
#include <cblas.h>
#endif

/*
 * Plain loop nest, i-p-j order so the innermost loop streams over rows of
 * op(B) and C. Slow but exact to the usual float rounding.
 */
void trainer_sgemm_ref(int transa, int transb, int m, int n, int k, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    for (int i = 0; i < m; i++) {
        float *c = C + (size_t)i * ldc;
        for (int j = 0; j < n; j++)
            c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        for (int p = 0; p < k; p++) {
            float a = alpha * (transa ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p]);
            if (a == 0.0f)
                continue;
            if (transb) {
                for (int j = 0; j < n; j++)
                    c[j] += a * B[(size_t)j * ldb + p];
            } else {
                const float *b = B + (size_t)p * ldb;
                for (int j = 0; j < n; j++)
                    c[j] += a * b[j];
            }
        }
    }
}

void trainer_sgemm(int transa, int transb, int m, int n, int k, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
#ifdef FRESHET_HAVE_OPENBLAS
    cblas_sgemm(CblasRowMajor, transa ? CblasTrans : CblasNoTrans,
                transb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    trainer_sgemm_ref(transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

void trainer_blas_single_thread(void)
{
#ifdef FRESHET_HAVE_OPENBLAS
    if (getenv("OPENBLAS_NUM_THREADS") == NULL)
        openblas_set_num_threads(1);
#endif
}
