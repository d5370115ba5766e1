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
 * Port balance: on AMD Zen cores, with two add and two FMA pipes, the subtractions x - w are issued as
 * fma(x, 1, -w), which rounds once, exactly like the subtraction, but runs on the FMA pipes, leaving the add pipes
 * to abs-sum / min-max: measured 8 -> 10 elements/cycle for the forward mix and 5.6 -> 8 for the input gradient's
 * (Zen 3 and Zen 4). Intel cores run adds on their FMA ports anyway, and there the FMA only costs a register copy (it
 * overwrites an operand; an add does not): a plain add of the negated operand is 1.02-1.14x faster on a Sapphire
 * Rapids-class Xeon (ResNet-20's layers). ADDERNET_SUB_ON_FMA (below) chooses; both forms give the same bits. The
 * input-gradient tile that also sums the weight gradient's product term (gin_tile_w) puts 4 more FMAs per output
 * channel on the FMA pipes, so it subtracts with a plain add on every core: on a Zen 3 its ResNet-20 layers ran
 * 1.10-1.22x as fast in one run and 0.91-1.03x in another, and the compiler no longer spilled x to the stack.
 * Do not build with -ffast-math: on many GCC versions a -ffast-math shared object sets flush-to-zero for the whole
 * process when loaded. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "geometry.h"
#include "isa.h"

/* "Port balance" above: build.py passes -DADDERNET_SUB_ON_FMA=1 on an AMD CPU */
#ifndef ADDERNET_SUB_ON_FMA
#define ADDERNET_SUB_ON_FMA 0
#endif

/* Register tiles: forward P pixels x (V vectors of output channels); grad P pixels x 1 vector.
 * With 32 vector registers the forward tile is bounded by the general-purpose registers, not the
 * vector ones: each pixel of a tile needs its own input pointer, and x86-64 has 16; 24 pixels spilled
 * those pointers every channel step and measured 1.1-1.6x slower than 12 (Zen 4, float32, 1 thread). */
#if NREG == 32
#define FWD_P1 12 /* V = 1 */
#define FWD_P2 8  /* V = 2 */
#define FWD_P2M 8 /* V = 2, the min form */
#define GIN_P 8
#define FWD_PO 12 /* the 1x1 forward along the pixels: output channels per tile */
#define FWD_PK 8  /* and a min-form layer's along the pixels (pk_tile): 16 accumulators */
#else
#define FWD_P1 12
#define FWD_P2 6
#define FWD_P2M 5 /* 10 accumulators, the 2 weight vectors, x, a min and the constant 1: 6 pixels spilled an accumulator
                   * to the stack, a chain through memory every channel step */
#define GIN_P 4
#define FWD_PO 5 /* 10 accumulators, 2 pixel vectors, the broadcast weight, the abs mask, a temporary */
#define FWD_PK 4 /* 8 accumulators, 2 pixel vectors, the broadcast weight, a min, the constant 1 */
#endif

/* The largest image the forward reads plane by plane (adder_cpu_body.h): channels, and C*H*W*sizeof(T) bytes. */
#define PLANES_CHANNELS 64
#define PLANES_BYTES (256 * 1024)
#define PV_CHANNELS 256 /* and the most input channels per group a 1x1 layer reads plane by plane along its pixels */
/* The most input channels per group of a layer whose min-form forward runs along its pixels (pk_tile): ResNet-20's
 * 16-channel 3x3 forward ran 1.02-1.11x as fast that way, its 32-channel one 0.93-0.99x and its 64-channel one
 * 0.91-0.93x (AVX2 code) (Intel Xeon, 1 thread). */
#define PK_CHANNELS 16

/* The input gradient reads a tile of g (GIN_P pixels x Og channels) in place, when its pixels are consecutive in
 * memory, only if the tile runs fewer than this many blocks of the weight; else it packs the tile first, into one
 * dense block that stays in L1 for all of them: in place it is a cache line per channel, 4 KiB apart in 32x32 planes
 * (L1's set stride). Packed, the input gradient of ResNet-20's 16->16 and 32->32 layers ran 1.05-1.20x and
 * 1.07-1.10x as fast (two runs), and 1x1 layers of 2 and 4 blocks 0.77x and 0.92x (Zen 3, AVX2). */
#define GIN_DIRECT_BLOCKS 8

/* Channels summed in registers before the partial sum is added to the running total. */
#define FWD_KC 32

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SUF)

#if ISA_AVX2 /* the float kernels' NCHW stores and copies, in 256-bit registers (AVX-512 builds too) */
#define STORE_RUNS_F 1
/* r[k][p] = r[p][k]: an 8x8 block of floats transposed in registers. */
static inline void transpose8_f(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int p = 0; p < 8; p += 2) {
        t[p] = _mm256_unpacklo_ps(r[p], r[p + 1]);
        t[p + 1] = _mm256_unpackhi_ps(r[p], r[p + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}

/* dst[k * ds + p] = src[p * ss + k] for p, k < 8: the copies between NCHW images and channels-last scratch, a block
 * of 8 pixels x 8 channels at a time (elementwise, a 56x56 image of 256 channels took about 45% of a 1x1 layer's
 * forward kernel). */
static inline void transpose_block_f(const float *src, int64_t ss, float *dst, int64_t ds) {
    __m256 r[8];
    for (int p = 0; p < 8; p++) r[p] = _mm256_loadu_ps(src + p * ss);
    transpose8_f(r);
    for (int k = 0; k < 8; k++) _mm256_storeu_ps(dst + k * ds, r[k]);
}

/* The first m <= 8 lanes of v at p, in plain stores of 8, 4, 2 and 1 lanes: AVX2's masked store (vmaskmovps) is
 * microcoded on AMD Zen cores, 13 cycles each on a Zen 3 against 2 for the plain parts (scripts/cpu_peak.c), which
 * made the stores of ResNet-20's 1x1 layers cost more than their arithmetic. */
static inline void store_first_f(float *p, __m256 v, int m) {
    if (m == 8) {
        _mm256_storeu_ps(p, v);
        return;
    }
    __m128 h = _mm256_castps256_ps128(v);
    if (m >= 4) {
        _mm_storeu_ps(p, h);
        p += 4, m -= 4, h = _mm256_extractf128_ps(v, 1);
    }
    if (m >= 2) {
        _mm_storel_pi((__m64 *)p, h);
        p += 2, m -= 2, h = _mm_movehl_ps(h, h);
    }
    if (m) _mm_store_ss(p, h);
}

/* The forward's NCHW store for float: an 8-pixel x VL-channel block of a tile transposed in registers into runs of
 * pixels, one vector store per channel (masked with AVX-512, in plain parts with AVX2), in place of VL * 8 element
 * stores; the pixels are consecutive in y (an NCHW output whose planes are contiguous). rows[p] points at pixel p's
 * channels; m <= 8 pixels and the first nc <= VL channels are stored at y + c * cstride. Only a copy: the stored
 * values are those of the element loop. */
#if ISA_AVX512
static void store_runs_f(const float *const rows[8], float *y, int64_t cstride, int m, int nc) {
    __m512 r[8], t[8], u[8];
    for (int p = 0; p < 8; p++) r[p] = _mm512_xor_ps(_mm512_loadu_ps(rows[p]), _mm512_set1_ps(-0.0f));
    for (int p = 0; p < 8; p += 2) {
        t[p] = _mm512_unpacklo_ps(r[p], r[p + 1]);
        t[p + 1] = _mm512_unpackhi_ps(r[p], r[p + 1]);
    }
    /* per 128-bit lane L: u[k] holds channel 4L+k of pixels 0-3, u[4+k] of pixels 4-7 */
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const __mmask8 mask = (__mmask8)((1u << m) - 1);
    for (int k = 0; k < 4; k++) {
        const __m512 a = _mm512_permutex2var_ps(u[k], lo, u[4 + k]), b = _mm512_permutex2var_ps(u[k], hi, u[4 + k]);
        const __m256 run[4] = {_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1), _mm512_castps512_ps256(b),
                               _mm512_extractf32x8_ps(b, 1)};
        for (int j = 0; j < 4; j++)
            if (4 * j + k < nc) _mm256_mask_storeu_ps(y + (4 * j + k) * cstride, mask, run[j]);
    }
}
#else
static void store_runs_f(const float *const rows[8], float *y, int64_t cstride, int m, int nc) {
    __m256 r[8];
    for (int p = 0; p < 8; p++) r[p] = _mm256_xor_ps(_mm256_loadu_ps(rows[p]), _mm256_set1_ps(-0.0f));
    transpose8_f(r);
    for (int k = 0; k < nc; k++) store_first_f(y + k * cstride, r[k], m); /* nc <= VL = 8 */
}
#endif
#endif

/* float instantiation */
#define T float
#define SUF _f
#define IT int32_t
#define VL (VBYTES / 4)
#if ISA_AVX512
#define VMIN(a, b) ((VEC)_mm512_min_ps((__m512)(a), (__m512)(b)))
#define VMAX(a, b) ((VEC)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define VFMA(a, b, c) ((VEC)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#if !ADDERNET_SUB_ON_FMA && !defined(ADDERNET_EMULATE_AVX512)
/* clamp(d, -1, 1) in one instruction: vrangeps, the smaller magnitude of d and 1 with d's sign. The same bits as
 * min(1, max(-1, d)) for every float but NaN (checked over all 2^32), which it turns into 1: the input gradient uses it
 * only where d = w - x cannot be NaN. The input gradient's mix with the weight gradient's FMA (sub, range, fma, fma
 * against sub, max, min, fma, fma) ran 1.28-1.29x as fast on an Intel Xeon (scripts/cpu_peak.c); not measured on AMD
 * cores, which keep max and min. */
#define VCLAMP1(d) ((VEC)_mm512_range_ps((__m512)(d), _mm512_set1_ps(1.f), 2))
#endif
#elif ISA_AVX2
#define VMIN(a, b) ((VEC)_mm256_min_ps((__m256)(a), (__m256)(b)))
#define VMAX(a, b) ((VEC)_mm256_max_ps((__m256)(a), (__m256)(b)))
#define VFMA(a, b, c) ((VEC)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#endif
#ifdef STORE_RUNS_F
#define STORE_RUNS store_runs_f
#define TRANSPOSE_BLOCK transpose_block_f
#endif
#include "adder_cpu_body.h"
#undef STORE_RUNS
#undef TRANSPOSE_BLOCK
#undef T
#undef SUF
#undef IT
#undef VL
#undef VMIN
#undef VMAX
#undef VFMA
#undef VCLAMP1

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
