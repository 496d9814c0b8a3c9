/*
 * backend.cu - the CUDA backend: cuBLAS sgemm for the layer products and
 * freshet's own kernels for bias + ReLU, the ReLU gradient mask, the losses
 * with their gradients, the bias-gradient column sums, and the loss and
 * accuracy reductions (summed in double, as the CPU sums them). It computes
 * what trainer/cpu.c computes (see that file for the maths).
 *
 * Shapes: every array is row-major as in cpu.c. cuBLAS is column-major, so a
 * row-major [r x c] matrix is used as its column-major transpose [c x r]:
 *   forward   z^T [out x n] = W^T^T [out x k] . a^T [k x n]     (op T, N)
 *   backward  dW^T [k x out] = a^T [k x n] . delta [n x out]    (op N, T)
 *             delta_{l-1}^T [k x n] = W^T [k x out] . delta^T   (op N, N)
 *
 * One worker owns one state: its CUDA stream, its cuBLAS handle (with a
 * workspace of its own, so that the step can be captured in a graph), device
 * buffers sized for max_batch and allocated once (cudaMalloc, never managed
 * memory), and pinned host buffers the copies go through. Several workers
 * may share a device: each has its own stream. Every CUDA and cuBLAS status
 * is checked, and every launch is followed by cudaGetLastError(); errors
 * come back as FR_ERR_BACKEND with file:line and CUDA's message.
 *
 * Small batches (n <= GRAPH_MAX_BATCH) are captured once per batch size in a
 * CUDA graph and replayed: the launches of a step then cost one call. A
 * capture that fails is logged once and the step runs eagerly.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/backend.h"

#define GRAPH_MAX_BATCH  256
#define CUBLAS_WORKSPACE (4u << 20)
#define THREADS          256

/* Returns FR_ERR_BACKEND with the call site and CUDA's message on error. */
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return fr_errorf(FR_ERR_BACKEND, errstr, size, "cuda: %s:%d: %s: %s", __FILE__,        \
                             __LINE__, #call, cudaGetErrorString(e_));                             \
    } while (0)
#define CKB(call)                                                                                  \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return fr_errorf(FR_ERR_BACKEND, errstr, size, "cuda: %s:%d: %s: %s", __FILE__,        \
                             __LINE__, #call, cublasGetStatusString(s_));                          \
    } while (0)
/* After every kernel launch. */
#define CK_LAUNCH() CK(cudaGetLastError())

typedef struct cuda_state {
    const model_t *m;
    int max_batch, device;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *workspace;                  /* cuBLAS workspace (device)                  */
    float *w, *grad;                  /* device: weights, gradient [nparams]         */
    float *x, *y;                     /* device: the batch [max_batch x dims[0]], [max_batch] */
    float *act[MODEL_MAX_LAYERS + 1]; /* device: act[l] [max_batch x dims[l]], l >= 1 */
    float *delta[2];                  /* device: ping-pong [max_batch x widest]   */
    float *loss;                      /* device: per-sample losses [max_batch]    */
    int *right;                       /* device: per-sample 1 when classified right */
    int *bad;                         /* device: first sample with a bad label (or INT_MAX) */
    double *sum;                      /* device: [0] the batch's summed loss      */
    long long *hits;                  /* device: [0] the samples classified right */
    float *h_w, *h_grad, *h_x, *h_y;  /* pinned host copies                        */
    double *h_sum;
    long long *h_hits;
    int *h_bad;
    cudaGraphExec_t graph[GRAPH_MAX_BATCH + 1]; /* a captured step per batch size */
    int graph_failed;                           /* capture not possible here      */
    int loaded;
} cuda_state_t;

/* ---- kernels ------------------------------------------------------------- */

/* z[n x out] += b (each row); then ReLU when relu (NaN stays NaN). */
__global__ void k_bias_relu(float *z, const float *b, int n, int out, int relu)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * out)
        return;
    float v = z[i] + b[i % out];
    z[i] = relu ? (v < 0.0f ? 0.0f : v) : v;
}

/* d[i] = 0 where the activation a[i] <= 0 (ReLU' = 0 there). */
__global__ void k_relu_mask(float *d, const float *a, size_t count)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count && a[i] <= 0.0f)
        d[i] = 0.0f;
}

/* db[j] = sum over rows of d [n x out], summed in row order as cpu.c does. */
__global__ void k_column_sums(float *db, const float *d, int n, int out)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= out)
        return;
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += d[(size_t)i * out + j];
    db[j] = s;
}

/*
 * One thread per sample: the loss of logits z [n x c] against y [n] with
 * PyTorch's conventions (cpu.c's output_loss), its per-sample value in
 * loss[i], right[i] = 1 when classified right, and, when delta is not NULL,
 * d(mean loss)/dz. A class label outside [0, c) lowers *bad to i.
 */
__global__ void k_loss(float *delta, float *loss, int *right, int *bad, const float *z,
                       const float *y, int n, int c, int kind)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float *zi = z + (size_t)i * c;
    float yi = y[i], inv_n = 1.0f / (float)n;
    right[i] = 0;
    if (kind == MODEL_LOSS_SOFTMAX) {
        if (!(yi >= 0.0f && yi < (float)c)) {
            atomicMin(bad, i);
            loss[i] = 0.0f;
            return;
        }
        int label = (int)yi, arg = 0;
        float mx = zi[0];
        for (int j = 1; j < c; j++)
            if (zi[j] > mx) {
                mx = zi[j];
                arg = j;
            }
        float sum = 0.0f;
        for (int j = 0; j < c; j++)
            sum += expf(zi[j] - mx);
        loss[i] = mx + logf(sum) - zi[label];
        right[i] = arg == label;
        if (delta != NULL) {
            float *e = delta + (size_t)i * c, scale = inv_n / sum;
            for (int j = 0; j < c; j++)
                e[j] = expf(zi[j] - mx) * scale;
            e[label] -= inv_n;
        }
    } else if (kind == MODEL_LOSS_LOGISTIC) {
        float v = zi[0];
        loss[i] = fmaxf(v, 0.0f) - v * yi + log1pf(expf(-fabsf(v)));
        right[i] = (v > 0.0f) == (yi >= 0.5f);
        if (delta != NULL) {
            float sig = v >= 0.0f ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
            delta[i] = (sig - yi) * inv_n;
        }
    } else {
        float d = zi[0] - yi;
        loss[i] = d * d;
        if (delta != NULL)
            delta[i] = 2.0f * d * inv_n;
    }
}

/*
 * One block of THREADS: sum[0] = the per-sample losses summed in double,
 * hits[0] = the samples classified right. Each thread sums a stride of
 * samples in order, then the block adds the partial sums pairwise.
 */
__global__ void k_reduce(double *sum, long long *hits, const float *loss, const int *right, int n)
{
    __shared__ double s_loss[THREADS];
    __shared__ long long s_hits[THREADS];
    int t = threadIdx.x;
    double l = 0.0;
    long long h = 0;
    for (int i = t; i < n; i += THREADS) {
        l += (double)loss[i];
        h += right[i];
    }
    s_loss[t] = l;
    s_hits[t] = h;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if (t < half) {
            s_loss[t] += s_loss[t + half];
            s_hits[t] += s_hits[t + half];
        }
        __syncthreads();
    }
    if (t == 0) {
        sum[0] = s_loss[0];
        hits[0] = s_hits[0];
    }
}

static unsigned blocks(size_t count)
{
    return (unsigned)((count + THREADS - 1) / THREADS);
}

/* ---- the step ----------------------------------------------------------------- */

/*
 * Everything a batch of n samples needs on the stream, from the pinned
 * inputs to the pinned outputs: the copies in, the forward pass, the loss
 * and, when gradient is set, the backward pass and the gradient's copy out.
 * Enqueues only (so that it can be captured); the caller synchronises.
 */
static fr_err_t enqueue_step(cuda_state_t *st, int n, int gradient, char *errstr, size_t size)
{
    const model_t *m = st->m;
    int c = m->dims[m->nlayers];
    const float one = 1.0f, zero = 0.0f;
    CK(cudaMemcpyAsync(st->x, st->h_x, (size_t)n * m->dims[0] * sizeof(float),
                       cudaMemcpyHostToDevice, st->stream));
    CK(cudaMemcpyAsync(st->y, st->h_y, (size_t)n * sizeof(float), cudaMemcpyHostToDevice,
                       st->stream));
    CK(cudaMemcpyAsync(st->bad, st->h_bad, sizeof(int), cudaMemcpyHostToDevice, st->stream));
    const float *in = st->x;
    for (int l = 0; l < m->nlayers; l++) {
        int k = m->dims[l], out = m->dims[l + 1];
        float *z = st->act[l + 1];
        CKB(cublasSgemm(st->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, k, &one, st->w + m->w_off[l], k,
                        in, k, &zero, z, out));
        k_bias_relu<<<blocks((size_t)n * out), THREADS, 0, st->stream>>>(z, st->w + m->b_off[l], n,
                                                                         out, l + 1 < m->nlayers);
        CK_LAUNCH();
        in = z;
    }
    float *d = gradient ? st->delta[0] : NULL;
    k_loss<<<blocks((size_t)n), THREADS, 0, st->stream>>>(
        d, st->loss, st->right, st->bad, st->act[m->nlayers], st->y, n, c, (int)m->loss);
    CK_LAUNCH();
    if (gradient) {
        int cur = 0;
        for (int l = m->nlayers - 1; l >= 0; l--) {
            int k = m->dims[l], out = m->dims[l + 1];
            const float *a_in = l > 0 ? st->act[l] : st->x;
            CKB(cublasSgemm(st->blas, CUBLAS_OP_N, CUBLAS_OP_T, k, out, n, &one, a_in, k, d, out,
                            &zero, st->grad + m->w_off[l], k));
            k_column_sums<<<blocks((size_t)out), THREADS, 0, st->stream>>>(st->grad + m->b_off[l],
                                                                           d, n, out);
            CK_LAUNCH();
            if (l == 0)
                break;
            float *dn = st->delta[cur ^ 1];
            CKB(cublasSgemm(st->blas, CUBLAS_OP_N, CUBLAS_OP_N, k, n, out, &one,
                            st->w + m->w_off[l], k, d, out, &zero, dn, k));
            k_relu_mask<<<blocks((size_t)n * k), THREADS, 0, st->stream>>>(dn, st->act[l],
                                                                           (size_t)n * k);
            CK_LAUNCH();
            d = dn;
            cur ^= 1;
        }
        CK(cudaMemcpyAsync(st->h_grad, st->grad, m->nparams * sizeof(float), cudaMemcpyDeviceToHost,
                           st->stream));
    }
    k_reduce<<<1, THREADS, 0, st->stream>>>(st->sum, st->hits, st->loss, st->right, n);
    CK_LAUNCH();
    CK(cudaMemcpyAsync(st->h_sum, st->sum, sizeof(double), cudaMemcpyDeviceToHost, st->stream));
    CK(cudaMemcpyAsync(st->h_hits, st->hits, sizeof(long long), cudaMemcpyDeviceToHost,
                       st->stream));
    CK(cudaMemcpyAsync(st->h_bad, st->bad, sizeof(int), cudaMemcpyDeviceToHost, st->stream));
    return FR_OK;
}

/*
 * Runs the gradient step of n samples: replays its graph when it has one
 * (capturing it on first use for small batches), else enqueues it eagerly;
 * then waits for the stream.
 */
static fr_err_t run_step(cuda_state_t *st, int n, int gradient, char *errstr, size_t size)
{
    int graphable = gradient && n <= GRAPH_MAX_BATCH && !st->graph_failed;
    if (graphable && st->graph[n] == NULL) {
        cudaGraph_t g = NULL;
        fr_err_t err = FR_OK;
        if (cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
            err = FR_ERR_BACKEND;
        if (err == FR_OK)
            err = enqueue_step(st, n, 1, errstr, size);
        cudaError_t end = cudaStreamEndCapture(st->stream, &g); /* ends a broken capture too */
        if (err == FR_OK && end == cudaSuccess &&
            cudaGraphInstantiate(&st->graph[n], g, 0) == cudaSuccess) {
            cudaGraphDestroy(g);
        } else {
            if (g != NULL)
                cudaGraphDestroy(g);
            st->graph[n] = NULL;
            st->graph_failed = 1;
            cudaGetLastError(); /* clear the capture's error */
            fr_log(FR_LOG_WARN,
                   "cuda: capturing the step in a CUDA graph failed (%s); "
                   "running it without graphs",
                   cudaGetErrorString(end != cudaSuccess ? end : cudaErrorUnknown));
        }
    }
    if (graphable && st->graph[n] != NULL) {
        CK(cudaGraphLaunch(st->graph[n], st->stream));
    } else {
        fr_err_t err = enqueue_step(st, n, gradient, errstr, size);
        if (err != FR_OK)
            return err;
    }
    CK(cudaStreamSynchronize(st->stream));
    return FR_OK;
}

/* ---- the backend interface ---------------------------------------------------- */

static int cuda_available(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: not an error here */
        return 0;
    }
    return n > 0;
}

static void cuda_destroy(void *state)
{
    cuda_state_t *st = (cuda_state_t *)state;
    if (st == NULL)
        return;
    cudaSetDevice(st->device);
    for (int n = 0; n <= GRAPH_MAX_BATCH; n++)
        if (st->graph[n] != NULL)
            cudaGraphExecDestroy(st->graph[n]);
    if (st->blas != NULL)
        cublasDestroy(st->blas);
    if (st->stream != NULL)
        cudaStreamDestroy(st->stream);
    void *dev[] = {st->workspace, st->w,   st->grad,     st->x,        st->y,   st->loss,
                   st->right,     st->bad, st->delta[0], st->delta[1], st->sum, st->hits};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        cudaFree(dev[i]);
    for (int l = 1; l <= MODEL_MAX_LAYERS; l++)
        cudaFree(st->act[l]);
    void *host[] = {st->h_w, st->h_grad, st->h_x, st->h_y, st->h_sum, st->h_hits, st->h_bad};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        cudaFreeHost(host[i]);
    free(st);
}

/* Allocates count bytes on the device into *p (zeroed). */
static fr_err_t dalloc(void **p, size_t count, char *errstr, size_t size)
{
    CK(cudaMalloc(p, count));
    CK(cudaMemset(*p, 0, count));
    return FR_OK;
}

static fr_err_t halloc(void **p, size_t count, char *errstr, size_t size)
{
    CK(cudaMallocHost(p, count));
    memset(*p, 0, count);
    return FR_OK;
}

static fr_err_t create_buffers(cuda_state_t *st, char *errstr, size_t size)
{
    const model_t *m = st->m;
    size_t nb = (size_t)st->max_batch, widest = 0, np = m->nparams;
    for (int l = 1; l <= m->nlayers; l++)
        if ((size_t)m->dims[l] > widest)
            widest = (size_t)m->dims[l];
    fr_err_t err;
    CK(cudaSetDevice(st->device));
    CK(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
    CKB(cublasCreate(&st->blas));
    CKB(cublasSetStream(st->blas, st->stream));
    /* the default math: no TF32 for sgemm, so results match the CPU's fp32 */
    CKB(cublasSetMathMode(st->blas, CUBLAS_DEFAULT_MATH));
    if ((err = dalloc(&st->workspace, CUBLAS_WORKSPACE, errstr, size)) != FR_OK)
        return err;
    CKB(cublasSetWorkspace(st->blas, st->workspace, CUBLAS_WORKSPACE));
    struct {
        void **p;
        size_t bytes;
    } dev[] = {
        {(void **)&st->w, np * sizeof(float)},
        {(void **)&st->grad, np * sizeof(float)},
        {(void **)&st->x, nb * (size_t)m->dims[0] * sizeof(float)},
        {(void **)&st->y, nb * sizeof(float)},
        {(void **)&st->loss, nb * sizeof(float)},
        {(void **)&st->right, nb * sizeof(int)},
        {(void **)&st->bad, sizeof(int)},
        {(void **)&st->sum, sizeof(double)},
        {(void **)&st->hits, sizeof(long long)},
        {(void **)&st->delta[0], nb * widest * sizeof(float)},
        {(void **)&st->delta[1], nb * widest * sizeof(float)},
    };
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if ((err = dalloc(dev[i].p, dev[i].bytes, errstr, size)) != FR_OK)
            return err;
    for (int l = 1; l <= m->nlayers; l++)
        if ((err = dalloc((void **)&st->act[l], nb * (size_t)m->dims[l] * sizeof(float), errstr,
                          size)) != FR_OK)
            return err;
    struct {
        void **p;
        size_t bytes;
    } host[] = {
        {(void **)&st->h_w, np * sizeof(float)},
        {(void **)&st->h_grad, np * sizeof(float)},
        {(void **)&st->h_x, nb * (size_t)m->dims[0] * sizeof(float)},
        {(void **)&st->h_y, nb * sizeof(float)},
        {(void **)&st->h_sum, sizeof(double)},
        {(void **)&st->h_hits, sizeof(long long)},
        {(void **)&st->h_bad, sizeof(int)},
    };
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        if ((err = halloc(host[i].p, host[i].bytes, errstr, size)) != FR_OK)
            return err;
    return FR_OK;
}

static fr_err_t cuda_create(void **state, const model_t *m, int max_batch, int device, char *errstr,
                            size_t size)
{
    if (max_batch < 1)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "cuda: max batch must be >= 1");
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
        cudaGetLastError();
        return fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                         "cuda: device %d does not exist (%d visible)", device, count);
    }
    cuda_state_t *st = (cuda_state_t *)calloc(1, sizeof(*st));
    if (st == NULL)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "cuda: out of memory");
    st->m = m;
    st->max_batch = max_batch;
    st->device = device;
    fr_err_t err = create_buffers(st, errstr, size);
    if (err != FR_OK) {
        cuda_destroy(st);
        return err;
    }
    *state = st;
    return FR_OK;
}

static fr_err_t cuda_load(void *state, const float *w, char *errstr, size_t size)
{
    cuda_state_t *st = (cuda_state_t *)state;
    size_t bytes = st->m->nparams * sizeof(float);
    CK(cudaSetDevice(st->device));
    memcpy(st->h_w, w, bytes); /* pinned: the copy is one DMA */
    CK(cudaMemcpyAsync(st->w, st->h_w, bytes, cudaMemcpyHostToDevice, st->stream));
    CK(cudaStreamSynchronize(st->stream));
    st->loaded = 1;
    return FR_OK;
}

/* The checks, the step, and the losses summed in double in sample order. */
static fr_err_t step(cuda_state_t *st, double *loss_sum, int64_t *correct, float *grad,
                     const float *x, const float *y, int n, char *errstr, size_t size)
{
    const model_t *m = st->m;
    if (n < 1 || n > st->max_batch)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "cuda: batch of %d outside 1..%d", n,
                         st->max_batch);
    if (!st->loaded)
        return fr_errorf(FR_ERR_STATE, errstr, size, "cuda: no weights loaded");
    CK(cudaSetDevice(st->device));
    memcpy(st->h_x, x, (size_t)n * m->dims[0] * sizeof(float));
    memcpy(st->h_y, y, (size_t)n * sizeof(float));
    *st->h_bad = INT32_MAX;
    fr_err_t err = run_step(st, n, grad != NULL, errstr, size);
    if (err != FR_OK)
        return err;
    if (*st->h_bad != INT32_MAX) {
        int i = *st->h_bad;
        return fr_errorf(FR_ERR_RANGE, errstr, size, "cuda: label %g of sample %d is not a class",
                         (double)y[i], i);
    }
    *loss_sum = *st->h_sum;
    if (correct != NULL)
        *correct = m->loss == MODEL_LOSS_MSE ? 0 : (int64_t)*st->h_hits;
    if (grad != NULL)
        memcpy(grad, st->h_grad, m->nparams * sizeof(float));
    return FR_OK;
}

static fr_err_t cuda_gradient(void *state, float *grad, double *loss_sum, const float *x,
                              const float *y, int n, char *errstr, size_t size)
{
    return step((cuda_state_t *)state, loss_sum, NULL, grad, x, y, n, errstr, size);
}

static fr_err_t cuda_evaluate(void *state, double *loss_sum, int64_t *correct, const float *x,
                              const float *y, int n, char *errstr, size_t size)
{
    return step((cuda_state_t *)state, loss_sum, correct, NULL, x, y, n, errstr, size);
}

static const trainer_backend_ops_t fcuda_backend_ops = {
    "cuda", cuda_available, cuda_create, cuda_destroy, cuda_load, cuda_gradient, cuda_evaluate,
};

/* The module's one export, which trainer/backend.c looks up by name. */
extern "C" __attribute__((visibility("default"))) const trainer_backend_module_t fcuda_module = {
    TRAINER_BACKEND_ABI,
    sizeof(trainer_backend_ops_t),
    sizeof(model_t),
    &fcuda_backend_ops,
};
