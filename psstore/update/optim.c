/*
 * optim.c - the optimizers of the parameter store: sgd, momentum and
 * adagrad, with PyTorch's float32 semantics (torch.optim.SGD and
 * torch.optim.Adagrad with their defaults), so that a step here can be
 * checked against a step there.
 *
 * Everything here is reentrant. The loops are plain and use restrict
 * pointers so that the compiler vectorizes them.
 */
#include <math.h>
#include <string.h>

#include "psstore/update/update.h"

/* torch.optim.Adagrad's default eps. */
#define ADAGRAD_EPS 1e-10f

fr_err_t psstore_optim_parse(const char *name, psstore_optim_t *optim)
{
    if (name == NULL || optim == NULL)
        return FR_ERR_INVAL;
    if (strcmp(name, "sgd") == 0)
        *optim = PSSTORE_OPTIM_SGD;
    else if (strcmp(name, "momentum") == 0)
        *optim = PSSTORE_OPTIM_MOMENTUM;
    else if (strcmp(name, "adagrad") == 0)
        *optim = PSSTORE_OPTIM_ADAGRAD;
    else
        return FR_ERR_INVAL;
    return FR_OK;
}

const char *psstore_optim_name(psstore_optim_t optim)
{
    switch (optim) {
    case PSSTORE_OPTIM_SGD: return "sgd";
    case PSSTORE_OPTIM_MOMENTUM: return "momentum";
    case PSSTORE_OPTIM_ADAGRAD: return "adagrad";
    }
    return "unknown";
}

size_t psstore_optim_state_len(psstore_optim_t optim, size_t n)
{
    switch (optim) {
    case PSSTORE_OPTIM_SGD: return 0;
    case PSSTORE_OPTIM_MOMENTUM:
    case PSSTORE_OPTIM_ADAGRAD: return n;
    }
    return 0;
}

/* w -= lr * g, as param.add_(grad, alpha=-lr). */
FR_VECTOR_LOOP static void step_sgd(float *restrict w, const float *restrict g, size_t n, float lr)
{
    for (size_t i = 0; i < n; i++)
        w[i] -= lr * g[i];
}

/*
 * buf = mu * buf + g; w -= lr * buf. torch.optim.SGD (dampening 0, no
 * Nesterov) sets buf = g on the first step; with buf starting at 0 the same
 * formula gives exactly that, since mu * 0 + g == g in float.
 */
static void step_momentum(float *restrict w, float *restrict buf, const float *restrict g, size_t n,
                          float lr, float mu)
{
    for (size_t i = 0; i < n; i++) {
        float b = mu * buf[i] + g[i];
        buf[i] = b;
        w[i] -= lr * b;
    }
}

/*
 * s += g * g; w -= lr * (g / (sqrt(s) + eps)), in the order of torch's
 * state_sum.addcmul_(g, g); std = state_sum.sqrt().add_(eps);
 * param.addcdiv_(g, std, value=-lr) (lr_decay 0, initial accumulator 0).
 */
static void step_adagrad(float *restrict w, float *restrict sum, const float *restrict g, size_t n,
                         float lr)
{
    for (size_t i = 0; i < n; i++) {
        float s = sum[i] + g[i] * g[i];
        sum[i] = s;
        w[i] -= lr * (g[i] / (sqrtf(s) + ADAGRAD_EPS));
    }
}

/*
 * One optimizer step in place. state holds psstore_optim_state_len(optim, n)
 * floats (unused for sgd, may then be NULL). An unknown optim leaves w
 * untouched: the controller validates it before any step is taken.
 */
void psstore_optim_step(psstore_optim_t optim, float *w, float *state, const float *g, size_t n,
                        float lr, float momentum)
{
    switch (optim) {
    case PSSTORE_OPTIM_SGD: step_sgd(w, g, n, lr); break;
    case PSSTORE_OPTIM_MOMENTUM: step_momentum(w, state, g, n, lr, momentum); break;
    case PSSTORE_OPTIM_ADAGRAD: step_adagrad(w, state, g, n, lr); break;
    }
}

double psstore_average_weight(int64_t horizon, int64_t seen, int64_t n)
{
    double h = fmin((double)horizon, (double)seen / 10);
    if (n <= 0)
        return 0;
    return h > 0 ? -expm1(-(double)n / h) : 1;
}

void psstore_average_step(float *restrict avg, const float *restrict w, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        avg[i] += a * (w[i] - avg[i]);
}
