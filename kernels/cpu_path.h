/* Which build of the vectorised CPU kernels runs. Every *_simd.c in kernels/ is
 * compiled three times: for baseline x86-64 (suffix _base), for x86-64-v3
 * (AVX2, FMA, F16C; suffix _v3) and for x86-64-v4 (AVX-512 F/BW/CD/DQ/VL,
 * 512-bit vectors; suffix _v4). The engine picks the best the CPU has at run
 * time, so a single binary runs on any x86-64 CPU. MS_CPU_PATH=base|v3|v4 in
 * the environment (read once) asks for a lower path; the op tests run on
 * every path the CPU has. Other architectures build the base path only. */
#ifndef MS_CPU_PATH_H
#define MS_CPU_PATH_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ordered: a CPU that runs a path runs every lower one. */
typedef enum { MS_CPU_PATH_BASE = 0, MS_CPU_PATH_V3 = 1, MS_CPU_PATH_V4 = 2 } ms_cpu_path;
#define MS_CPU_PATH_COUNT 3

/* The path in use: the best the CPU supports unless MS_CPU_PATH or
 * cpu_path_set chose another. */
ms_cpu_path cpu_path_get(void);
/* Chooses a path (tests, doctor); MS_ERR_UNSUPPORTED where this build or
 * CPU cannot run it. Not thread-safe against running ops. */
ms_status cpu_path_set(ms_cpu_path p);
bool cpu_path_supported(ms_cpu_path p);
const char *cpu_path_name(ms_cpu_path p);

/* In a *_simd.c file: MS_SIMD_FN(name) is name_base, name_v3 or name_v4 (the
 * build defines MS_SIMD_V; any other build of the file is the base one). */
#ifndef MS_SIMD_V
#define MS_SIMD_V base
#endif
#define MS_SIMD_CAT2_(a, b) a##_##b
#define MS_SIMD_CAT_(a, b) MS_SIMD_CAT2_(a, b)
#define MS_SIMD_FN(name) MS_SIMD_CAT_(name, MS_SIMD_V)

/* Declares every build of a function: MS_SIMD_DECLARE(float, f, (int n)). */
#define MS_SIMD_DECLARE(ret, name, args) \
    ret name##_base args;                \
    ret name##_v3 args;                  \
    ret name##_v4 args

/* Calls the build of fn that the current path selects. */
#if defined(MS_SIMD_HAVE_V4)
#define MS_SIMD_CALL(fn, ...)                                                             \
    (cpu_path_get() == MS_CPU_PATH_V4   ? fn##_v4(__VA_ARGS__)                            \
     : cpu_path_get() == MS_CPU_PATH_V3 ? fn##_v3(__VA_ARGS__)                            \
                                        : fn##_base(__VA_ARGS__))
#elif defined(MS_SIMD_HAVE_V3)
#define MS_SIMD_CALL(fn, ...) \
    (cpu_path_get() == MS_CPU_PATH_V3 ? fn##_v3(__VA_ARGS__) : fn##_base(__VA_ARGS__))
#else
#define MS_SIMD_CALL(fn, ...) fn##_base(__VA_ARGS__)
#endif

#ifdef __cplusplus
}
#endif
#endif
