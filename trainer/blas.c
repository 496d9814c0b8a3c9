/*
 * blas.c - the one place that calls BLAS.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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

/*
 * OpenBLAS 0.3.21 falls back to its generic Prescott (SSE3) kernels on CPUs
 * it does not recognise, such as recent Xeons, and its sgemm then runs 3-4
 * times slower than it could. We leave the choice to the operator (the
 * OPENBLAS_CORETYPE environment variable) but say so once.
 */
#ifdef FRESHET_HAVE_OPENBLAS
static void warn_generic_core(void)
{
#if defined(__x86_64__)
    static atomic_int warned;
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") != NULL || core == NULL || strcmp(core, "Prescott") != 0)
        return;
    const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                         : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                           : NULL;
    if (better != NULL && atomic_exchange(&warned, 1) == 0)
        fr_log(FR_LOG_WARN,
               "trainer: OpenBLAS did not recognise this CPU and uses its generic Prescott "
               "kernels; OPENBLAS_CORETYPE=%s makes sgemm several times faster",
               better);
#endif
}
#endif

static void blas_setup(void)
{
#ifdef FRESHET_HAVE_OPENBLAS
    if (getenv("OPENBLAS_NUM_THREADS") == NULL)
        openblas_set_num_threads(1);
    warn_generic_core();
#endif
}

/* Once per process: the setting is process-wide and must not change while
 * another worker is inside sgemm. */
void trainer_blas_single_thread(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_setup);
}
