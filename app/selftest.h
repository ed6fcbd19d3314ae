/* The self-test behind `mitaseg doctor` and `--device auto`: every op on a
 * device against the CPU on small random inputs (outputs poisoned with NaN
 * before each launch, so an unwritten element fails), and a bundled model
 * end to end. Library code: it fills rows, the command prints them.
 *
 * References: on a GPU, FP32 mode against the plain CPU ops, tensor-core
 * mode against the CPU with the same operand rounding (ms_backend.tc_round);
 * on the CPU, all threads against one thread, and the model against the
 * golden output of the independent Python reference. */
#ifndef MS_SELFTEST_H
#define MS_SELFTEST_H

#include "engine.h"

typedef struct {
    char op[32];         /* "linear", "model", ... */
    char device[48];     /* "cpu", "cuda:0 fp32", "cuda:0 tensor cores" */
    char reference[40];  /* what it was compared with */
    double err;          /* normwise: max|got - ref| / max|ref| */
    double tol;
    bool pass;
    char detail[160];    /* error message, mask agreement, ... */
} ms_selftest_row;

typedef struct {
    ms_selftest_row *rows;
    int count, cap;
    int failed;
} ms_selftest;

/* How two engine results agree: mask pixels equal, logits normwise error,
 * MiTA record entries (topk_idx and route, MiTA layers) that differ. */
typedef struct {
    double mask_same;    /* fraction, 0..1 */
    double logits_err;
    size_t rec_diff, rec_total;
} ms_agreement;
/* Sizes must match (else MS_ERR_ARG). */
ms_status result_compare(ms_agreement *a, const ms_result *got, const ms_result *ref);

/* Runs every op on the CPU (cuda NULL) or on the GPU of the CUDA context
 * cuda (an ms_cuda_ctx *, both precision modes), appending one row per op
 * and mode. Fails only when rows cannot be stored (MS_ERR_OOM); an op that
 * errs is a failed row. */
ms_status selftest_ops(ms_selftest *st, void *cuda, const char *label);
/* Runs model_path on the device (CPU or CUDA device index) and compares:
 * on the CPU with the golden file (tensors image, logits, mask, as
 * the golden files in tests/fixtures); on CUDA with the CPU engine, in FP32
 * and tensor-core mode. Appends rows; a missing file is a failed row. */
ms_status selftest_model(ms_selftest *st, ms_device_choice dev, int device_index,
                         const char *model_path, const char *golden_path);
void selftest_free(ms_selftest *st);

/* For --device auto: whether the GPU of cuda (device device_index) passes
 * selftest_ops. Run once per device and process, then cached (thread-safe).
 * why: the first failed row, when it fails. */
bool selftest_cuda_usable(void *cuda, int device_index, char *why, size_t why_len);

#endif
