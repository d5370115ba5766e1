/* Adder convolution CPU kernels: plain C (no torch headers), compiled on first use and loaded
 * with ctypes (see build.py). Both kernels work on one zero-padded channels-last image at a time
 * in a private scratch buffer, with implicit indexing (no im2col), so memory stays O(one image).
 *
 *   forward:    y[n,o,p]  = -sum_{i,j,c} |xpad[n, p*s + (i,j)*d, c] - w[o,c,i,j]|
 *   grad_input: gx[n,...] = sum over outputs touching it of g[n,o,p] * clamp(w - x, -1, 1)
 *
 * The forward register-blocks P output pixels x V*VL output channels (abs-difference in
 * registers); the input gradient register-blocks P pixels x VL input channels and scatters
 * into the padded per-image buffer (images are independent, so callers may split the batch
 * across threads without races). Both are instantiated for float and double by including
 * adder_cpu_body.h twice; vector code uses GCC/Clang vector extensions, with AVX-512/AVX
 * min/max intrinsics when available. Do not build with -ffast-math: on many GCC versions a
 * -ffast-math shared object sets flush-to-zero for the whole process when loaded. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#define VBYTES 64
#define NREG 32
#elif defined(__AVX__)
#include <immintrin.h>
#define VBYTES 32
#define NREG 16
#else
#define VBYTES 16
#define NREG 16
#endif

/* Register tiles: forward P pixels x (V vectors of output channels); grad P pixels x 1 vector. */
#if NREG == 32
#define FWD_P1 24 /* V = 1 */
#define FWD_P2 12 /* V = 2 */
#define GIN_P 8
#else
#define FWD_P1 12
#define FWD_P2 6
#define GIN_P 4
#endif

/* Channels summed in registers before the partial sum is added to the running total. */
#define FWD_KC 32

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SUF)

/* float instantiation */
#define T float
#define SUF _f
#define IT int32_t
#define VL (VBYTES / 4)
#if VBYTES == 64
#define VMIN(a, b) ((VEC)_mm512_min_ps((__m512)(a), (__m512)(b)))
#define VMAX(a, b) ((VEC)_mm512_max_ps((__m512)(a), (__m512)(b)))
#elif VBYTES == 32
#define VMIN(a, b) ((VEC)_mm256_min_ps((__m256)(a), (__m256)(b)))
#define VMAX(a, b) ((VEC)_mm256_max_ps((__m256)(a), (__m256)(b)))
#endif
#include "adder_cpu_body.h"
#undef T
#undef SUF
#undef IT
#undef VL
#undef VMIN
#undef VMAX

/* double instantiation */
#define T double
#define SUF _d
#define IT int64_t
#define VL (VBYTES / 8)
#if VBYTES == 64
#define VMIN(a, b) ((VEC)_mm512_min_pd((__m512d)(a), (__m512d)(b)))
#define VMAX(a, b) ((VEC)_mm512_max_pd((__m512d)(a), (__m512d)(b)))
#elif VBYTES == 32
#define VMIN(a, b) ((VEC)_mm256_min_pd((__m256d)(a), (__m256d)(b)))
#define VMAX(a, b) ((VEC)_mm256_max_pd((__m256d)(a), (__m256d)(b)))
#endif
#include "adder_cpu_body.h"

/* 1 when built with OpenMP (the *_ranges entry points run in parallel), else 0. */
int adder_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* Vector width in bytes: Python pads channel counts to multiples of VBYTES / sizeof(T). */
int adder_vbytes(void) { return VBYTES; }
