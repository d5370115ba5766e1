/* Adder convolution CPU kernels: plain C (no torch headers), compiled on first use and loaded
 * with ctypes (see build.py). Both kernels work on one image at a time with implicit indexing (no
 * im2col), so memory stays O(one image): the forward reads an unpadded input in place and a padded one
 * from a zero-bordered copy (in the input's own order where that pays); the input gradient works on a
 * zero-padded channels-last copy in a private scratch buffer.
 *
 *   forward:    y[n,o,p]  = -sum_{i,j,c} |xpad[n, p*s + (i,j)*d, c] - w[o,c,i,j]|
 *   grad_input: gx[n,...] = sum over outputs touching it of g[n,o,p] * clamp(w - x, -1, 1)
 *
 * The forward register-blocks P output pixels x V*VL output channels (abs-difference in
 * registers); the input gradient register-blocks P pixels x VL input channels and scatters
 * into the padded per-image buffer (images, and groups within an image, are independent, so callers
 * may split the batch, or one image's groups, across threads without races). Both are instantiated for float and double by including
 * adder_cpu_body.h twice; vector code uses GCC/Clang vector extensions, with AVX-512/AVX
 * min/max/FMA intrinsics when available.
 *
 * Port balance: on x86 cores with two add and two FMA pipes (Zen 2-4; Intel runs adds on its FMA
 * pipes anyway) the subtractions x - w are issued as fma(x, 1, -w), which rounds once, exactly
 * like the subtraction, but runs on the FMA pipes, leaving the add pipes to abs-sum / min-max:
 * measured 8 -> 10 elements/cycle for the forward mix and 5.6 -> 8 for the input gradient's. Do not build with -ffast-math: on many GCC versions a
 * -ffast-math shared object sets flush-to-zero for the whole process when loaded. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "geometry.h"
#include "isa.h"

/* Register tiles: forward P pixels x (V vectors of output channels); grad P pixels x 1 vector.
 * With 32 vector registers the forward tile is bounded by the general-purpose registers, not the
 * vector ones: each pixel of a tile needs its own input pointer, and x86-64 has 16; 24 pixels spilled
 * those pointers every channel step and measured 1.1-1.6x slower than 12 (Zen 4, float32, 1 thread). */
#if NREG == 32
#define FWD_P1 12 /* V = 1 */
#define FWD_P2 8  /* V = 2 */
#define GIN_P 8
#else
#define FWD_P1 12
#define FWD_P2 6
#define GIN_P 4
#endif

/* The largest image the forward reads plane by plane (adder_cpu_body.h): channels, and C*H*W*sizeof(T) bytes. */
#define PLANES_CHANNELS 64
#define PLANES_BYTES (256 * 1024)

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
#if ISA_AVX512
#define VMIN(a, b) ((VEC)_mm512_min_ps((__m512)(a), (__m512)(b)))
#define VMAX(a, b) ((VEC)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define VFMA(a, b, c) ((VEC)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#elif ISA_AVX2
#define VMIN(a, b) ((VEC)_mm256_min_ps((__m256)(a), (__m256)(b)))
#define VMAX(a, b) ((VEC)_mm256_max_ps((__m256)(a), (__m256)(b)))
#define VFMA(a, b, c) ((VEC)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#endif
#include "adder_cpu_body.h"
#undef T
#undef SUF
#undef IT
#undef VL
#undef VMIN
#undef VMAX
#undef VFMA

/* double instantiation */
#define T double
#define SUF _d
#define IT int64_t
#define VL (VBYTES / 8)
#if ISA_AVX512
#define VMIN(a, b) ((VEC)_mm512_min_pd((__m512d)(a), (__m512d)(b)))
#define VMAX(a, b) ((VEC)_mm512_max_pd((__m512d)(a), (__m512d)(b)))
#define VFMA(a, b, c) ((VEC)_mm512_fmadd_pd((__m512d)(a), (__m512d)(b), (__m512d)(c)))
#elif ISA_AVX2
#define VMIN(a, b) ((VEC)_mm256_min_pd((__m256d)(a), (__m256d)(b)))
#define VMAX(a, b) ((VEC)_mm256_max_pd((__m256d)(a), (__m256d)(b)))
#define VFMA(a, b, c) ((VEC)_mm256_fmadd_pd((__m256d)(a), (__m256d)(b), (__m256d)(c)))
#endif
#include "adder_cpu_body.h"

/* Vector width in bytes: Python pads channel counts to multiples of VBYTES / sizeof(T). */
int adder_vbytes(void) { return VBYTES; }
