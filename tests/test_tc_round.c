/* The CPU's tensor-core rounding (ms_backend.tc_round, engine option
 * tc_round): what CUDA's tensor-core mode is compared against (test_backend,
 * mitaseg doctor). The rounding helpers by hand; each GEMM op with tc_round
 * equals the plain op on pre-rounded operands, bit for bit; and, end to end on
 * the fixtures, how far that rounding alone moves masks and MiTA decisions
 * from the FP32 CPU run (printed: docs/gpu.md quotes these numbers). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/engine.h"
#include "app/model_file.h"
#include "app/selftest.h"
#include "kernels/linear.h"
#include "kernels/ops.h"
#include "testutil.h"

START_TEST(test_round_helpers)
{
    /* BF16 keeps 7 mantissa bits: 1 + 2^-8 is the tie between 1 and 1 + 2^-7 */
    ck_assert_float_eq(bf16_round(1.0f + 0x1p-8f), 1.0f);                 /* to even */
    ck_assert_float_eq(bf16_round(1.0f + 0x1p-7f + 0x1p-8f), 1.0f + 0x1p-6f); /* to even */
    ck_assert_float_eq(bf16_round(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
    ck_assert_float_eq(bf16_round(-3.0f), -3.0f);
    /* TF32 keeps 10: 1 + 2^-11 is a tie, rounded away from zero (cvt.rna) */
    ck_assert_float_eq(tf32_round(1.0f + 0x1p-11f), 1.0f + 0x1p-10f);
    ck_assert_float_eq(tf32_round(-(1.0f + 0x1p-11f)), -(1.0f + 0x1p-10f));
    ck_assert_float_eq(tf32_round(1.0f + 0x1p-11f - 0x1p-20f), 1.0f);
    ck_assert_float_eq(tf32_round(1.0f + 0x1p-10f), 1.0f + 0x1p-10f);
    ck_assert(isinf(tf32_round(INFINITY)) && tf32_round(-INFINITY) < 0);
    ck_assert(isnan(tf32_round(NAN)) && isnan(bf16_round(NAN)));
    /* subnormals: same rule on the bits */
    ck_assert_uint_eq(ms_float_bits(tf32_round(ms_bits_float(0x00001FFFu))), 0x00002000u);
    ck_assert_uint_eq(ms_float_bits(tf32_round(ms_bits_float(0x00000FFFu))), 0x00000000u);
}
END_TEST

static float *rnd(size_t n, uint32_t seed)
{
    float *x = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(x);
    rand_fill(x, n, seed, -1, 1);
    return x;
}

static float *rounded(const float *x, size_t n, bool bf16)
{
    float *y = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(y);
    for (size_t i = 0; i < n; i++) y[i] = bf16 ? bf16_round(x[i]) : tf32_round(x[i]);
    return y;
}

static ms_backend cpu(bool tc)
{
    ms_backend be;
    memset(&be, 0, sizeof be);
    be.device = MS_DEVICE_CPU;
    backend_set_threads(&be, 0);
    be.tc_round = tc;
    return be;
}

/* op(tc_round) == op(plain, rounded operands) bitwise, != op(plain). */
static void expect_rounded(const float *tc, const float *pre, const float *plain, size_t n,
                           const char *what)
{
    ck_assert_msg(memcmp(tc, pre, n * sizeof(float)) == 0, "%s: not the rounded operands' result",
                  what);
    ck_assert_msg(max_abs_diff(tc, plain, n) > 0, "%s: tc_round changed nothing", what);
}

START_TEST(test_ops_round)
{
    ms_backend plain = cpu(false), tc = cpu(true);
    { /* linear: BF16 */
        int n = 37, ci = 70, co = 19;
        size_t ni = (size_t)n * ci, nw = (size_t)co * ci, no = (size_t)n * co;
        float *x = rnd(ni, 1), *w = rnd(nw, 2), *b = rnd((size_t)co, 3);
        float *xr = rounded(x, ni, true), *wr = rounded(w, nw, true);
        float *o1 = malloc(no * 4), *o2 = malloc(no * 4), *o3 = malloc(no * 4);
        ck_assert_int_eq(op_linear(&tc, o1, x, w, b, n, ci, co, MS_ACT_GELU, false), MS_OK);
        ck_assert_int_eq(op_linear(&plain, o2, xr, wr, b, n, ci, co, MS_ACT_GELU, false), MS_OK);
        ck_assert_int_eq(op_linear(&plain, o3, x, w, b, n, ci, co, MS_ACT_GELU, false), MS_OK);
        expect_rounded(o1, o2, o3, no, "linear");
        /* the engine's dry run counts the rounded copies */
        ms_arena sizing;
        memset(&sizing, 0, sizeof sizing);
        arena_begin_sizing(&sizing);
        ms_backend dry = tc;
        dry.scratch = &sizing;
        dry.dry_run = true;
        ck_assert_int_eq(op_linear(&dry, NULL, NULL, NULL, NULL, n, ci, co, MS_ACT_NONE, false),
                         MS_OK);
        ck_assert_uint_ge(sizing.high, (ni + nw) * 4);
        ck_assert_uint_lt(sizing.high, (ni + nw) * 4 + 256);
        arena_free(&sizing);
        free(x); free(w); free(b); free(xr); free(wr); free(o1); free(o2); free(o3);
    }
    { /* conv2d: TF32; conv_transpose2x2: BF16 */
        int ci = 6, h = 11, wd = 9, co = 5;
        size_t ni = (size_t)ci * h * wd, nw = (size_t)co * ci * 9, no = (size_t)co * h * wd;
        size_t ntw = (size_t)ci * co * 4, nto = (size_t)co * 4 * h * wd;
        float *x = rnd(ni, 4), *w = rnd(nw, 5), *tw = rnd(ntw, 6), *b = rnd((size_t)co, 7);
        float *xr = rounded(x, ni, false), *wr = rounded(w, nw, false);
        float *xb = rounded(x, ni, true), *twb = rounded(tw, ntw, true);
        float *o1 = malloc(nto * 4), *o2 = malloc(nto * 4), *o3 = malloc(nto * 4);
        ck_assert_int_eq(op_conv2d(&tc, o1, x, w, b, ci, h, wd, co, 3, 3, 1, 1, MS_ACT_RELU), MS_OK);
        ck_assert_int_eq(op_conv2d(&plain, o2, xr, wr, b, ci, h, wd, co, 3, 3, 1, 1, MS_ACT_RELU),
                         MS_OK);
        ck_assert_int_eq(op_conv2d(&plain, o3, x, w, b, ci, h, wd, co, 3, 3, 1, 1, MS_ACT_RELU),
                         MS_OK);
        expect_rounded(o1, o2, o3, no, "conv2d");
        ck_assert_int_eq(op_conv_transpose2x2(&tc, o1, x, tw, b, ci, h, wd, co, MS_ACT_NONE), MS_OK);
        ck_assert_int_eq(op_conv_transpose2x2(&plain, o2, xb, twb, b, ci, h, wd, co, MS_ACT_NONE),
                         MS_OK);
        ck_assert_int_eq(op_conv_transpose2x2(&plain, o3, x, tw, b, ci, h, wd, co, MS_ACT_NONE),
                         MS_OK);
        expect_rounded(o1, o2, o3, nto, "conv_transpose2x2");
        free(x); free(w); free(tw); free(b); free(xr); free(wr); free(xb); free(twb);
        free(o1); free(o2); free(o3);
    }
}
END_TEST

/* Plain FP32 CPU against the CPU with tensor-core rounding, on every e2e
 * fixture: how much of a CUDA tensor-core run's difference from the FP32 CPU
 * is the rounding alone. The numbers are printed for docs/gpu.md; the test
 * asserts only that the engine option reaches the ops (logits move) and
 * that the moves stay bounded (random tiny models are touchy: pad_resize's
 * logits move 18%). */
START_TEST(test_fixture_agreement)
{
    const char *cases[] = {"full_none", "mita_d", "mita_sqrtd_conv", "pad_resize",
                           "posgrid",   "small_grid", "f16"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char mpath[96], gpath[96], mfull[4096];
        snprintf(mpath, sizeof mpath, "%s.model.safetensors", cases[i]);
        snprintf(gpath, sizeof gpath, "%s.golden.safetensors", cases[i]);
        snprintf(mfull, sizeof mfull, "%s", fixture_path(mpath));
        ms_model_file *g = NULL;
        ck_assert_msg(safetensors_open(&g, fixture_path(gpath)) == MS_OK, "%s", ms_last_error());
        const ms_tensor *it = model_file_find(g, "image");
        ck_assert_ptr_nonnull(it);
        ms_image img = {.h = (int)it->shape[0], .w = (int)it->shape[1], .rgb = (uint8_t *)it->data};
        ms_run_options ro = {.attention = -1, .record = true};
        ms_result r[2] = {{0}, {0}};
        for (int tc = 0; tc < 2; tc++) {
            ms_engine_options o = {.device = MS_DEV_CPU, .tc_round = tc == 1};
            ms_engine *e = NULL;
            ck_assert_msg(engine_init(&e, mfull, &o) == MS_OK, "%s", ms_last_error());
            ck_assert_msg(engine_run(e, &r[tc], &img, &ro) == MS_OK, "%s", ms_last_error());
            engine_free(e);
        }
        ms_agreement a;
        ck_assert_int_eq(result_compare(&a, &r[1], &r[0]), MS_OK);
        printf("tc rounding vs fp32, cpu, %-16s: masks %.2f%% equal, logits %.2e normwise, "
               "MiTA records %zu of %zu differ (%.2f%%)\n",
               cases[i], 100.0 * a.mask_same, a.logits_err, a.rec_diff, a.rec_total,
               a.rec_total ? 100.0 * (double)a.rec_diff / (double)a.rec_total : 0.0);
        ck_assert_msg(a.logits_err > 0 && a.logits_err < 0.5, "%s: logits moved %g", cases[i],
                      a.logits_err);
        result_free(&r[0]);
        result_free(&r[1]);
        model_file_close(g);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tc_round");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_round_helpers);
    tcase_add_test(tc, test_ops_round);
    tcase_add_test(tc, test_fixture_agreement);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
