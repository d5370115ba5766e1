/* Integer adder kernel for quantised layers: plain C (no torch headers), compiled on first use
 * and loaded with ctypes like adder_cpu.c (see build.py).
 *
 *   y[n,o,p] = sum_{i,j,c} |xpad[n, p*s + (i,j)*d, c] - w[o,c,i,j]|      (int32, no sign, no scale)
 *
 * x and w are unsigned 8-bit (bits <= 8) or 16-bit (bits 9..16) integers; zero padding counts as
 * input 0. The caller rescales and adds the bias terms (addernet/quant/qadder.py).
 *
 * Per image, the input is copied into a zero-padded channels-last scratch buf[Hp][Wp][C]; then for
 * each tile of PT pixels the kh*kw*Cg patch values are gathered into contiguous rows of Kp bytes
 * (Kp = K rounded up to the vector width, zero tail on both sides, so it adds nothing), and each
 * row is compared with OT filters at once. For 8-bit lanes the inner step is one sum-of-absolute-
 * differences instruction per 16/32 bytes (psadbw / vpsadbw: 8 absolute differences summed into
 * a 64-bit lane), so no widening is needed; the 64-bit lanes of OT accumulators are folded into
 * OT int32 outputs at the end of a row. The 16-bit path is a plain C loop that -O3 vectorises.
 *
 * The layer's shape comes as an adder_geometry (geometry.h; Kp is the row length, Opad is Og rounded up
 * to OT, Cgp is unused). x is NCHW contiguous; w is packed [G][Opad][Kp] with K in (i, j, c) order; y is
 * NCHW contiguous. */
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

#include "geometry.h"
#include "isa.h"

#if ISA_AVX2
#define SADB 32 /* row alignment: the AVX-512 tile steps 64 bytes, with one 32-byte step at the end */
#else
#define SADB 16
#endif

/* PT pixels x OT filters per tile: 4 x 4 64-bit-lane accumulators + 4 weights + 1 row fit the 32 zmm
 * registers; 2 x 4 + 4 + 1 fit the 16 ymm/xmm ones. ADDERNET_INT_PT sets it instead (the tests build the AVX2 path
 * with AVX-512's 4, to run AVX-512's tile shapes on any AVX2 host). */
#if defined(ADDERNET_INT_PT)
#define PT ADDERNET_INT_PT
#elif ISA_AVX512
#define PT 4
#else
#define PT 2
#endif
#define OT 4 /* filters per tile */

/* memcpy for the short runs of gather: 16-byte moves instead of a libc call per kernel tap. */
static inline void copy_bytes(void *dst, const void *src, size_t n) {
    uint8_t *d = dst;
    const uint8_t *p = src;
    size_t k = 0;
#if ISA_SSE2
    for (; k + 16 <= n; k += 16) _mm_storeu_si128((__m128i *)(d + k), _mm_loadu_si128((const __m128i *)(p + k)));
#endif
    for (; k < n; k++) d[k] = p[k];
}

/* memset for the short zero tail of a gathered row: 16-byte stores instead of a libc call per pixel. */
static inline void zero_bytes(void *dst, size_t n) {
    uint8_t *d = dst;
    size_t k = 0;
#if ISA_SSE2
    for (; k + 16 <= n; k += 16) _mm_storeu_si128((__m128i *)(d + k), _mm_setzero_si128());
#endif
    for (; k < n; k++) d[k] = 0;
}

/* Zero-padded channels-last copy of one NCHW image: buf[(h+ph)*Wp + w + pw][c] = x[c][h][w]. */
#define PAD_IMAGE(T)                                                                                 \
    static void pad_image_##T(const T *x, const adder_geometry *s, T *buf) {                         \
        const int64_t C = s->C, H = s->H, W = s->W, ph = s->ph, pw = s->pw, Wp = W + 2 * pw;         \
        memset(buf, 0, sizeof(T) * (size_t)((H + 2 * ph) * Wp * C));                                 \
        for (int64_t c = 0; c < C; c++)                                                              \
            for (int64_t h = 0; h < H; h++) {                                                        \
                const T *xr = x + (c * H + h) * W;                                                   \
                T *br = buf + ((h + ph) * Wp + pw) * C + c;                                          \
                for (int64_t w = 0; w < W; w++) br[w * C] = xr[w];                                   \
            }                                                                                        \
    }

/* Rows of the tile's PT pixels (pixel q0+t, the last valid pixel repeated past L) for group g. */
#define GATHER(T)                                                                                    \
    static void gather_##T(const T *buf, const adder_geometry *s, int64_t g, int64_t q0, T *rows) {  \
        const int64_t C = s->C, Cg = s->Cg, kh = s->kh, kw = s->kw, Wp = s->W + 2 * s->pw;           \
        const int64_t Wo = s->Wo, L = s->Ho * Wo, Kp = s->Kp;                                        \
        for (int t = 0; t < PT; t++) {                                                               \
            const int64_t q = q0 + t < L ? q0 + t : L - 1, oy = q / Wo, ox = q % Wo;                 \
            T *r = rows + t * Kp;                                                                    \
            for (int64_t i = 0; i < kh; i++)                                                         \
                for (int64_t j = 0; j < kw; j++) {                                                   \
                    const int64_t pix = (oy * s->sh + i * s->dh) * Wp + ox * s->sw + j * s->dw;      \
                    copy_bytes(r, buf + pix * C + g * Cg, sizeof(T) * (size_t)Cg);                   \
                    r += Cg;                                                                         \
                }                                                                                    \
            memset(r, 0, sizeof(T) * (size_t)(Kp - kh * kw * Cg));                                   \
        }                                                                                            \
    }

PAD_IMAGE(uint8_t)
PAD_IMAGE(uint16_t)
GATHER(uint8_t)
GATHER(uint16_t)

/* acc[t][o] = sum_k |rows[t][k] - w[o][k]| for PT pixels x OT filters, plain C (any lane type). */
#define SAD_TILE_C(T)                                                                                \
    static void sad_tile_c_##T(const T *rows, const T *w, int64_t Kp, int32_t acc[PT][OT]) {         \
        for (int t = 0; t < PT; t++)                                                                 \
            for (int o = 0; o < OT; o++) {                                                           \
                const T *a = rows + t * Kp, *b = w + o * Kp;                                         \
                int32_t sum = 0;                                                                     \
                for (int64_t k = 0; k < Kp; k++) sum += abs((int32_t)a[k] - (int32_t)b[k]);          \
                acc[t][o] = sum;                                                                     \
            }                                                                                        \
    }
SAD_TILE_C(uint16_t)

#if ISA_AVX512
typedef __m512i svec;
#define SLOAD(p) _mm512_loadu_si512((const void *)(p))
#define SAD(a, b) _mm512_sad_epu8((a), (b))
#define ADD64(a, b) _mm512_add_epi64((a), (b))
#define ZERO() _mm512_setzero_si512()
#elif ISA_AVX2
typedef __m256i svec;
#define SLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define SAD(a, b) _mm256_sad_epu8((a), (b))
#define ADD64(a, b) _mm256_add_epi64((a), (b))
#define ZERO() _mm256_setzero_si256()
#elif ISA_SSE2
typedef __m128i svec;
#define SLOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define SAD(a, b) _mm_sad_epu8((a), (b))
#define ADD64(a, b) _mm_add_epi64((a), (b))
#define ZERO() _mm_setzero_si128()
#endif

#if ISA_SSE2
/* Fold four accumulators of 64-bit lanes (each lane < 2^32) into four int32 sums. */
static inline void fold4(svec a, svec b, svec c, svec d, int32_t *out) {
#if ISA_AVX512
    const __m512i ab = _mm512_or_si512(a, _mm512_slli_epi64(b, 32)); /* a0 b0 a1 b1 | ... (4 x 128 bits) */
    const __m512i cd = _mm512_or_si512(c, _mm512_slli_epi64(d, 32));
    const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    const __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
#elif ISA_AVX2
    const __m256i ab = _mm256_or_si256(a, _mm256_slli_epi64(b, 32)); /* a0 b0 a1 b1 | a2 b2 a3 b3 */
    const __m256i cd = _mm256_or_si256(c, _mm256_slli_epi64(d, 32));
    const __m256i s = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    const __m128i r = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
#else
    const __m128i ab = _mm_or_si128(a, _mm_slli_epi64(b, 32)); /* a0 b0 a1 b1 */
    const __m128i cd = _mm_or_si128(c, _mm_slli_epi64(d, 32));
    const __m128i r = _mm_add_epi32(_mm_unpacklo_epi64(ab, cd), _mm_unpackhi_epi64(ab, cd));
#endif
    _mm_storeu_si128((__m128i *)out, r);
}

/* 8-bit tile with sum-of-absolute-differences instructions: OT weight vectors stay in registers,
 * each pixel row vector is compared with all of them. */
static void sad_tile_u8(const uint8_t *rows, const uint8_t *w, int64_t Kp, int32_t acc[PT][OT]) {
    svec a[PT][OT];
#pragma GCC unroll 8
    for (int t = 0; t < PT; t++)
#pragma GCC unroll 8
        for (int o = 0; o < OT; o++) a[t][o] = ZERO();
    int64_t k = 0;
    for (; k + (int64_t)sizeof(svec) <= Kp; k += sizeof(svec)) {
        svec wv[OT];
#pragma GCC unroll 8
        for (int o = 0; o < OT; o++) wv[o] = SLOAD(w + o * Kp + k);
#pragma GCC unroll 8
        for (int t = 0; t < PT; t++) {
            const svec xv = SLOAD(rows + t * Kp + k);
#pragma GCC unroll 8
            for (int o = 0; o < OT; o++) a[t][o] = ADD64(a[t][o], SAD(xv, wv[o]));
        }
    }
#if ISA_AVX512
    if (k < Kp) { /* Kp is a multiple of 32: one 32-byte step left, zero-extended into the accumulators */
        __m256i wv[OT];
#pragma GCC unroll 8
        for (int o = 0; o < OT; o++) wv[o] = _mm256_loadu_si256((const __m256i *)(w + o * Kp + k));
#pragma GCC unroll 8
        for (int t = 0; t < PT; t++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(rows + t * Kp + k));
#pragma GCC unroll 8
            for (int o = 0; o < OT; o++)
                a[t][o] = ADD64(a[t][o], _mm512_zextsi256_si512(_mm256_sad_epu8(xv, wv[o])));
        }
    }
#endif
#pragma GCC unroll 8
    for (int t = 0; t < PT; t++) fold4(a[t][0], a[t][1], a[t][2], a[t][3], acc[t]);
}
#endif

#if ISA_AVX512
/* The integer network's AVX-512 tile without a gather: pixel t's patch is read in place from a zero-bordered
 * channels-last plane, kh runs of R = kw*C bytes rs bytes apart starting at xs[t]; filter o's weights
 * are kh runs of R bytes, each padded with zeros to Rp (a multiple of 64), Kp = kh*Rp apart. A run's last
 * partial vector is loaded under a byte mask, so no byte past the run is read into a sum. */
static void sad_direct_u8(const uint8_t *const xs[PT], int64_t rs, int64_t kh, int64_t R, const uint8_t *w,
                          int64_t Kp, int64_t Rp, int32_t acc[PT][OT]) {
    const int64_t full = R / (int64_t)sizeof(svec) * (int64_t)sizeof(svec);
    svec a[PT][OT];
#pragma GCC unroll 8
    for (int t = 0; t < PT; t++)
#pragma GCC unroll 8
        for (int o = 0; o < OT; o++) a[t][o] = ZERO();
    const __mmask64 tail = R > full ? (~(__mmask64)0) >> (64 - (R - full)) : 0;
    for (int64_t i = 0; i < kh; i++) {
        const uint8_t *wi = w + i * Rp;
        const int64_t xo = i * rs;
        int64_t k = 0;
        for (; k < full; k += sizeof(svec)) {
            svec wv[OT];
#pragma GCC unroll 8
            for (int o = 0; o < OT; o++) wv[o] = SLOAD(wi + o * Kp + k);
#pragma GCC unroll 8
            for (int t = 0; t < PT; t++) {
                const svec xv = SLOAD(xs[t] + xo + k);
#pragma GCC unroll 8
                for (int o = 0; o < OT; o++) a[t][o] = ADD64(a[t][o], SAD(xv, wv[o]));
            }
        }
        if (tail) {
            svec wv[OT];
#pragma GCC unroll 8
            for (int o = 0; o < OT; o++) wv[o] = SLOAD(wi + o * Kp + k);
#pragma GCC unroll 8
            for (int t = 0; t < PT; t++) {
                const svec xv = _mm512_maskz_loadu_epi8(tail, xs[t] + xo + k);
#pragma GCC unroll 8
                for (int o = 0; o < OT; o++) a[t][o] = ADD64(a[t][o], SAD(xv, wv[o]));
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < PT; t++) fold4(a[t][0], a[t][1], a[t][2], a[t][3], acc[t]);
}
#endif

#if ISA_AVX2
/* The integer network's 256-bit tile with the filters across the lanes (AVX2, and AVX-512 on AMD CPUs:
 * int_cpu.lanes): the 4 64-bit lanes of a vpsadbw are 4
 * filters, so 8 bytes of a pixel's patch, broadcast to every lane, meet 8 bytes of 4 filters at once and each
 * lane sums one output: no fold across lanes at the end, and K needs no padding past a multiple of 8. Pixel t's
 * patch is read in place, kh runs of R = kw*C bytes rs apart from xs[t]; filter tile g's weights (at w + g*ts) are
 * K/8 steps of [OT][8] bytes in the patch's (i, j, c) order. GB filter tiles at once: PT x GB accumulators (of
 * AVX-512's 32 registers 16 with its 4 pixels, of AVX2's 16 registers 8 with its 2). */
static inline __attribute__((always_inline)) void lanes_block(const uint8_t *const xs[PT], int64_t rs, int64_t kh,
                                                             int64_t R, const uint8_t *w, int64_t ts, const int GB,
                                                             int32_t (*acc)[PT][OT]) {
    __m256i a[PT][4];
#pragma GCC unroll 8
    for (int t = 0; t < PT; t++)
#pragma GCC unroll 8
        for (int g = 0; g < GB; g++) a[t][g] = _mm256_setzero_si256();
    for (int64_t i = 0; i < kh; i++) {
        const uint8_t *wi = w + i * R * OT;
        for (int64_t k = 0; k < R; k += 8) {
            __m256i xv[PT];
#pragma GCC unroll 8
            for (int t = 0; t < PT; t++) {
                int64_t v;
                memcpy(&v, xs[t] + i * rs + k, 8);
                xv[t] = _mm256_set1_epi64x(v);
            }
#pragma GCC unroll 8
            for (int g = 0; g < GB; g++) {
                const __m256i wv = _mm256_loadu_si256((const __m256i *)(wi + g * ts + k * OT));
#pragma GCC unroll 8
                for (int t = 0; t < PT; t++) a[t][g] = _mm256_add_epi64(a[t][g], _mm256_sad_epu8(xv[t], wv));
            }
        }
    }
    _Static_assert(PT % 2 == 0, "the tile stores two pixels' sums per filter tile at once");
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
#pragma GCC unroll 8
    for (int g = 0; g < GB; g++)
#pragma GCC unroll 8
        for (int t = 0; t < PT; t += 2) { /* lanes < 2^32: pixel t's sums in the low halves, pixel t+1's in the high */
            const __m256i both = _mm256_or_si256(a[t][g], _mm256_slli_epi64(a[t + 1][g], 32));
            _mm256_storeu_si256((__m256i *)acc[g][t], _mm256_permutevar8x32_epi32(both, order));
        }
}

/* acc[0..n) for n <= 4 filter tiles that read the same planes (each count its own unrolled block). */
static void sad_lanes_u8(const uint8_t *const xs[PT], int64_t rs, int64_t kh, int64_t R, const uint8_t *w, int64_t ts,
                         int64_t n, int32_t (*acc)[PT][OT]) {
    switch (n) {
    case 4: lanes_block(xs, rs, kh, R, w, ts, 4, acc); break;
    case 3: lanes_block(xs, rs, kh, R, w, ts, 3, acc); break;
    case 2: lanes_block(xs, rs, kh, R, w, ts, 2, acc); break;
    default: lanes_block(xs, rs, kh, R, w, ts, 1, acc);
    }
}
#define LANES_TILES 4 /* filter tiles per sad_lanes_u8 call */
#endif

/* 1 when the integer network's tiles can read a kh x kw layer with C input channels in place with the filters
 * across the lanes (sad_lanes_u8; its weights packed per filter tile as K/8 steps of [OT][8] bytes), else 0: 8-bit
 * lanes on AVX2 or AVX-512 and kw*C a multiple of 8. On AVX-512 the caller chooses between it and the kernel-row
 * tile (int_cpu.lanes). */
int adder_intnet_lanes(int64_t C, int64_t kh, int64_t kw, int bytes) {
    (void)kh;
    return ISA_AVX2 && bytes == 1 && (kw * C) % 8 == 0;
}

/* Weight row stride per kernel row (Rp) when the integer network's AVX-512 tiles read a kh x kw layer with C
 * input channels in place (sad_direct_u8), or 0: 8-bit lanes, and no more vector steps per pixel than the
 * gathered row's (AVX2, and AVX-512 on AMD CPUs, read in place with the filters across the lanes instead:
 * adder_intnet_lanes). */
int adder_intnet_direct_row(int64_t C, int64_t kh, int64_t kw, int bytes) {
#if ISA_AVX512
    const int64_t R = kw * C, V = sizeof(svec);
    const int64_t direct = kh * ((R + V - 1) / V), gathered = ((kh * R + SADB - 1) / SADB * SADB + V - 1) / V;
    if (bytes != 1 || direct > gathered) return 0;
    return (int)((R + V - 1) / V * V);
#else
    (void)C, (void)kh, (void)kw, (void)bytes;
    return 0;
#endif
}

#if !ISA_SSE2
SAD_TILE_C(uint8_t)
#define sad_tile_u8 sad_tile_c_uint8_t
#endif
#define sad_tile_u16 sad_tile_c_uint16_t

/* y[n0:n1, :, pixels q0:q1] for one lane type. Returns 0, or 1 when scratch cannot be allocated. */
#define FORWARD(T, TILE)                                                                             \
    static int forward_##T(const T *x, const T *w, int32_t *y, const adder_geometry *s, int64_t n0,  \
                           int64_t n1, int64_t q0, int64_t q1) {                                     \
        const int64_t C = s->C, G = s->G, Og = s->Og, Kp = s->Kp, Opad = s->Opad;                    \
        const int64_t Hp = s->H + 2 * s->ph, Wp = s->W + 2 * s->pw, L = s->Ho * s->Wo;               \
        T *buf = malloc(sizeof(T) * (size_t)(Hp * Wp * C + PT * Kp) + 64);                           \
        if (!buf) return 1;                                                                          \
        T *rows = buf + Hp * Wp * C;                                                                 \
        int32_t acc[PT][OT];                                                                         \
        for (int64_t n = n0; n < n1; n++) {                                                          \
            pad_image_##T(x + n * C * s->H * s->W, s, buf);                                          \
            for (int64_t g = 0; g < G; g++) {                                                        \
                const T *wg = w + g * Opad * Kp;                                                     \
                int32_t *yg = y + (n * G + g) * Og * L;                                              \
                for (int64_t q = q0; q < q1; q += PT) {                                              \
                    const int64_t np = q1 - q < PT ? q1 - q : PT;                                    \
                    gather_##T(buf, s, g, q, rows);                                                  \
                    for (int64_t ob = 0; ob < Opad; ob += OT) {                                      \
                        TILE(rows, wg + ob * Kp, Kp, acc);                                           \
                        const int64_t no = Og - ob < OT ? Og - ob : OT;                              \
                        for (int64_t o = 0; o < no; o++)                                             \
                            for (int64_t t = 0; t < np; t++) yg[(ob + o) * L + q + t] = acc[t][o];   \
                    }                                                                                \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        free(buf);                                                                                   \
        return 0;                                                                                    \
    }
FORWARD(uint8_t, sad_tile_u8)
FORWARD(uint16_t, sad_tile_u16)

/* Over R ranges r[4k..4k+3] = (n0, n1, q0, q1), in parallel on OpenMP's threads (torch's runtime,
 * see build.py); serial when built without OpenMP. bytes = 1 (uint8) or 2 (uint16). */
int adder_int_forward(const void *x, const void *w, int32_t *y, const adder_geometry *s, int bytes,
                      const int64_t *r, int64_t R, int nt) {
    int err = 0;
#pragma omp parallel for num_threads(nt) schedule(static, 1) reduction(| : err)
    for (int64_t k = 0; k < R; k++)
        err |= bytes == 1 ? forward_uint8_t(x, w, y, s, r[4 * k], r[4 * k + 1], r[4 * k + 2], r[4 * k + 3])
                          : forward_uint16_t(x, w, y, s, r[4 * k], r[4 * k + 1], r[4 * k + 2], r[4 * k + 3]);
    return err;
}

/* Row alignment in elements (Python pads K to a multiple of it), the tile's filter and pixel counts. */
int adder_int_row_align(void) { return SADB; }
int adder_int_filter_tile(void) { return OT; }
int adder_int_pixel_tile(void) { return PT; }

/* ---- Integer network --------------------------------------------------------------------------
 * A quantised network's integer region in one call (addernet/quant/intnet.py builds the ops).
 * Activations between adder layers are unsigned integers in channels-last planes [H][W][C]; each
 * adder layer reads its input planes and, in its epilogue, applies one per-channel affine map
 * v = alpha * sum + beta (the scale, the constant c, the bias term and BatchNorm folded, in double),
 * optionally adds a float residual [H][W][O] and applies ReLU, then writes a float copy and/or the
 * next layers' inputs: clamp(round_half_even(v * inv_k), 0, lv) for every scale s_k = 1 / inv_k they
 * read. An entry op does the same for a float input (the stem's output) with one affine per channel.
 * A layer with several scales reads one plane per scale (buffers in_planes[p]): its filters are
 * packed plane by plane (each run padded to OT), and tile b reads plane tile_plane[b].
 * Buffers per image: 0 the float input, 1 the float output, 2.. at buf_off[] in a workspace. */
#define OP_ADDER 0
#define OP_ENTRY 1
#define MAXQ 8
#define MAXBUF 256 /* buffers per image */
_Static_assert(OT == 4, "the vector epilogue writes 4 channels");
typedef struct {
    int64_t kind, C, H, W, O, kh, kw, sh, sw, ph, pw, Ho, Wo, Kp, n_tiles, n_planes;
    int64_t in_buf, out_buf, res_buf, relu, n_q, lv;
    int64_t border, direct; /* zero border of every integer plane; adder tiles read planes in place: 1 by kernel
                             * rows (sad_direct_u8), 2 with the filters across lanes (sad_lanes_u8); 0: gathered */
    int64_t q_buf[MAXQ];
    double inv[MAXQ];
    const void *w;              /* [n_tiles * OT][Kp] packed unsigned weights */
    const int64_t *in_planes;   /* [n_planes] buffers of the input planes (entry: in_buf, a float buffer) */
    const int64_t *tile_plane;  /* [n_tiles] input plane of each filter tile */
    const int64_t *tile_first;  /* [n_tiles] first channel when the tile's OT channels are consecutive, else -1 */
    const int64_t *chan;        /* [n_tiles * OT] output channel of each slot, -1 for padding */
    const double *alpha, *beta; /* [n_tiles * OT] per slot (entry: [C] per channel) */
} intnet_op;

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define T uint8_t
#define SUF u8
#define TILE sad_tile_u8
#if ISA_AVX512
#define DIRECT_TILE sad_direct_u8
#endif
#ifdef LANES_TILES
#define LANES_TILE sad_lanes_u8
#endif
#include "adder_intnet_body.h"
#undef T
#undef SUF
#undef TILE
#undef DIRECT_TILE
#undef LANES_TILE
#define T uint16_t
#define SUF u16
#define TILE sad_tile_u16
#include "adder_intnet_body.h"
#undef T
#undef SUF
#undef TILE

static int64_t op_pixels(const intnet_op *op) { return op->kind == OP_ENTRY ? op->H * op->W : op->Ho * op->Wo; }

static void run_op(const intnet_op *op, void **bufs, int64_t q0, int64_t q1, void *rows, int bytes) {
    if (bytes == 1) run_op_u8(op, bufs, q0, q1, rows);
    else run_op_u16(op, bufs, q0, q1, rows);
}

/* The n_ops ops over N images: x [N][x_stride] float, out [N][out_stride] float. ws holds nt
 * per-thread areas of ws_bytes: the buffers at buf_off[b] (b >= 2), then the gather rows at
 * rows_off. N >= nt: each thread runs whole images; otherwise (batch 1) every op's output pixels
 * are split across the threads, with a barrier between ops. Returns 0. */
int adder_intnet_forward(const intnet_op *ops, int64_t n_ops, int bytes, const float *x, int64_t x_stride,
                         float *out, int64_t out_stride, int64_t N, const int64_t *buf_off, int64_t n_bufs,
                         uint8_t *ws, int64_t ws_bytes, int64_t rows_off, int nt) {
    if (N >= nt) {
#pragma omp parallel num_threads(nt)
        {
            const int mode = fegetround(); /* the quantiser rounds half to even, whatever the caller had set */
            fesetround(FE_TONEAREST);
#pragma omp for schedule(dynamic, 1)
            for (int64_t n = 0; n < N; n++) {
                uint8_t *area = ws + (int64_t)omp_get_thread_num() * ws_bytes;
                void *bufs[MAXBUF];
                bufs[0] = (void *)(x + n * x_stride);
                bufs[1] = out + n * out_stride;
                for (int64_t b = 2; b < n_bufs; b++) bufs[b] = area + buf_off[b];
                for (int64_t i = 0; i < n_ops; i++)
                    run_op(&ops[i], bufs, 0, op_pixels(&ops[i]), area + rows_off, bytes);
            }
            fesetround(mode);
        }
        return 0;
    }
#pragma omp parallel num_threads(nt)
    {
        const int mode = fegetround();
        fesetround(FE_TONEAREST);
        uint8_t *rows = ws + (int64_t)omp_get_thread_num() * ws_bytes + rows_off;
        void *bufs[MAXBUF];
        for (int64_t n = 0; n < N; n++) {
            bufs[0] = (void *)(x + n * x_stride);
            bufs[1] = out + n * out_stride;
            for (int64_t b = 2; b < n_bufs; b++) bufs[b] = ws + buf_off[b];
            for (int64_t i = 0; i < n_ops; i++) { /* each thread one run of whole tiles: one call, one setup */
                const int64_t L = op_pixels(&ops[i]), n_tiles = (L + PT - 1) / PT;
                const int64_t me = omp_get_thread_num(), all = omp_get_num_threads();
                const int64_t k0 = n_tiles * me / all, k1 = n_tiles * (me + 1) / all;
                if (k0 < k1) run_op(&ops[i], bufs, k0 * PT, k1 * PT < L ? k1 * PT : L, rows, bytes);
#pragma omp barrier
            }
        }
        fesetround(mode);
    }
    return 0;
}

int adder_intnet_op_size(void) { return (int)sizeof(intnet_op); }
