/* What this x86 CPU and its OS run, read from CPUID and XCR0: one place for
 * the checks behind the CPU kernel paths (kernels/cpu_path.c) and behind
 * the OpenBLAS core mitaseg asks for (app/omp_env/omp_env.c, which runs in
 * a constructor before OpenBLAS's and links nothing but libc, hence header
 * only). Elsewhere than x86 every check says no. */
#ifndef MS_CPU_FEATURES_H
#define MS_CPU_FEATURES_H

#include <stdbool.h>
#include <stddef.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
/* XCR0's bits for the register state the OS saves (0 without OSXSAVE). */
static inline unsigned cpu_features_xcr0(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return lo;
}
#endif

/* x86-64-v3: AVX2, FMA, BMI1/2, F16C, MOVBE and LZCNT (the compiler may use
 * all of them), read from CPUID (clang's __builtin_cpu_supports does not
 * know the last three), with the OS saving the YMM state. */
static inline bool cpu_features_has_v3(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    unsigned a, b, c, d, c_ext = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    unsigned a2, b2, d2;
    if (__get_cpuid(0x80000001u, &a2, &b2, &c_ext, &d2) == 0) c_ext = 0;
    bool f16c = c & (1u << 29), movbe = c & (1u << 22), lzcnt = c_ext & (1u << 5);
    return (cpu_features_xcr0() & 0x6u) == 0x6u && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
           __builtin_cpu_supports("bmi2") && f16c && movbe && lzcnt;
#else
    return false;
#endif
}

/* x86-64-v4: v3 and AVX-512 F, BW, CD, DQ and VL, with an OS that saves the
 * opmask and all 512-bit registers (XCR0 bits 1-2 and 5-7; a hypervisor may
 * hide them although CPUID lists the instructions). */
static inline bool cpu_features_has_v4(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return (cpu_features_xcr0() & 0xe6u) == 0xe6u && cpu_features_has_v3() &&
           __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

/* The OpenBLAS core (an OPENBLAS_CORETYPE name) whose kernels fit this
 * CPU's instruction set, or NULL for none of these. OpenBLAS picks its core
 * from a table of CPU models, and a model newer than its build falls back to
 * its oldest x86-64 kernels (0.3.21 on a 2-core Xeon of family 6 model 207:
 * Prescott's SSE3 sgemm, 56 GF/s against 200 with Cooperlake's). Where it
 * knows the CPU it picks the same as this: Cooperlake's kernels for AVX-512
 * with BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and 5; its sgemm is
 * SkylakeX's), SkylakeX's for AVX-512, on AVX2 Zen's for AMD (Haswell's
 * kernels, Zen's block sizes) and Haswell's for others. */
static inline const char *cpu_features_openblas_core(void)
{
#if defined(__x86_64__) || defined(__i386__)
    if (cpu_features_has_v4()) {
        unsigned a = 0, b, c, d;
        bool bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
        return bf16 ? "Cooperlake" : "SkylakeX";
    }
    if (cpu_features_has_v3()) {
        __builtin_cpu_init();
        return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
    }
#endif
    return NULL;
}

#endif
