/* The instruction set both kernel libraries (adder_cpu.c, adder_int.c) are compiled for, read from the
 * compiler's target: build.py's ADDERNET_CPU_ISA picks the -march flags, ADDERNET_PLAIN_C forces the
 * portable path that non-x86 machines compile, and ADDERNET_EMULATE_AVX512 the AVX-512 path for an AVX2 target
 * (tests only: emulate_avx512.h).
 *
 *   ISA_LEVEL  4 AVX-512 (F, BW, DQ, VL) with FMA, 3 AVX2 with FMA, 2 SSE2, 1 plain C (GCC vector
 *              extensions only); a level has every instruction of the levels below it
 *   ISA_NAME   "avx512", "avx2", "sse2" or "plain C": what adder_path() reports
 *   VBYTES     bytes of a vector register: 64, 32, 16 (SSE2 and plain C)
 *   NREG       vector registers: 32 with AVX-512, else 16
 *
 * Every library also exports adder_path() and adder_openmp() from here, and the geometry struct (geometry.h). */
#ifndef ADDERNET_ISA_H
#define ADDERNET_ISA_H

#if defined(ADDERNET_EMULATE_AVX512) /* the AVX-512 path on an AVX2 host, for tests (emulate_avx512.h) */
#define ISA_LEVEL 4
#elif defined(ADDERNET_PLAIN_C)
#define ISA_LEVEL 1
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && \
    defined(__FMA__)
#define ISA_LEVEL 4
#elif defined(__AVX2__) && defined(__FMA__)
#define ISA_LEVEL 3
#elif defined(__SSE2__)
#define ISA_LEVEL 2
#else
#define ISA_LEVEL 1
#endif

#define ISA_AVX512 (ISA_LEVEL >= 4)
#define ISA_AVX2 (ISA_LEVEL >= 3)
#define ISA_SSE2 (ISA_LEVEL >= 2)

#if defined(ADDERNET_EMULATE_AVX512)
#include "emulate_avx512.h"
#elif ISA_AVX2
#include <immintrin.h>
#elif ISA_SSE2
#include <emmintrin.h>
#endif

#if ISA_AVX512
#define ISA_NAME "avx512"
#define VBYTES 64
#define NREG 32
#elif ISA_AVX2
#define ISA_NAME "avx2"
#define VBYTES 32
#define NREG 16
#elif ISA_SSE2
#define ISA_NAME "sse2"
#define VBYTES 16
#define NREG 16
#else
#define ISA_NAME "plain C"
#define VBYTES 16
#define NREG 16
#endif

/* The compiled path, for tests and benchmark reports. */
const char *adder_path(void) { return ISA_NAME; }

/* 1 when built with OpenMP (the entry points taking ranges run them in parallel), else 0. */
int adder_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

#endif
