/* AVX-512 intrinsics on a host without AVX-512, for tests: ADDERNET_CPU_ISA=avx512-emulated compiles the AVX-512 path
 * of both kernel libraries for AVX2 with this header (isa.h), so an AVX2-only host runs that path's code and the tests
 * check it (docs/testing.md). SIMDe (github.com/simd-everywhere/simde; Debian's libsimde-dev) implements the
 * intrinsics with AVX2 instructions or portable C; the few the kernels use that its release 0.7.4 lacks are defined
 * below, lane by lane, with the instruction's documented result. Slow: for tests, never for speed. */
#ifndef ADDERNET_EMULATE_AVX512_H
#define ADDERNET_EMULATE_AVX512_H

#if !__has_include(<simde/x86/avx512.h>)
#error "ADDERNET_CPU_ISA=avx512-emulated needs SIMDe's headers: apt install libsimde-dev, or put simde/ on CPATH"
#endif
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EMU_LANES(type, n, name, v) \
    type name[n];                   \
    memcpy(name, &(v), sizeof(name))
#define EMU_RETURN(vtype, lanes) \
    do {                         \
        vtype r_;                \
        memset(&r_, 0, sizeof(r_)); \
        memcpy(&r_, lanes, sizeof(lanes)); \
        return r_;               \
    } while (0)

#ifndef _mm256_cvtusepi32_epi16
static inline __m128i emu_mm256_cvtusepi32_epi16(__m256i a) { /* unsigned saturation */
    EMU_LANES(uint32_t, 8, v, a);
    uint16_t r[8];
    for (int i = 0; i < 8; i++) r[i] = v[i] > 0xffffu ? 0xffffu : (uint16_t)v[i];
    EMU_RETURN(__m128i, r);
}
#define _mm256_cvtusepi32_epi16 emu_mm256_cvtusepi32_epi16
#endif

#ifndef _mm256_cvtusepi32_epi8
static inline __m128i emu_mm256_cvtusepi32_epi8(__m256i a) { /* 8 bytes, upper 8 zero */
    EMU_LANES(uint32_t, 8, v, a);
    uint8_t r[16] = {0};
    for (int i = 0; i < 8; i++) r[i] = v[i] > 0xffu ? 0xffu : (uint8_t)v[i];
    EMU_RETURN(__m128i, r);
}
#define _mm256_cvtusepi32_epi8 emu_mm256_cvtusepi32_epi8
#endif

/* Round to nearest even whatever the rounding mode (the kernels ask for _MM_FROUND_TO_NEAREST_INT); NaN and values
 * out of int32's range give INT32_MIN, the instruction's "integer indefinite". */
static inline int32_t emu_round_even_i32(double v) {
    if (!(v >= -2147483648.0 && v < 2147483647.5)) return INT32_MIN;
    double f = floor(v), d = v - f;
    if (d > 0.5 || (d == 0.5 && fmod(f, 2.0) != 0.0)) f += 1.0;
    return (int32_t)f;
}

static inline __m256i emu_mm512_cvt_roundpd_epi32(__m512d a, int rounding) {
    (void)rounding; /* the kernels use _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC only */
    EMU_LANES(double, 8, v, a);
    int32_t r[8];
    for (int i = 0; i < 8; i++) r[i] = emu_round_even_i32(v[i]);
    EMU_RETURN(__m256i, r);
}
#undef _mm512_cvt_roundpd_epi32
#define _mm512_cvt_roundpd_epi32 emu_mm512_cvt_roundpd_epi32

#ifndef _mm512_cvtepi32_pd
static inline __m512d emu_mm512_cvtepi32_pd(__m256i a) {
    EMU_LANES(int32_t, 8, v, a);
    double r[8];
    for (int i = 0; i < 8; i++) r[i] = v[i];
    EMU_RETURN(__m512d, r);
}
#define _mm512_cvtepi32_pd emu_mm512_cvtepi32_pd
#endif

#ifndef _mm512_cvtpd_ps
static inline __m256 emu_mm512_cvtpd_ps(__m512d a) { /* rounded by the current mode, as the instruction */
    EMU_LANES(double, 8, v, a);
    float r[8];
    for (int i = 0; i < 8; i++) r[i] = (float)v[i];
    EMU_RETURN(__m256, r);
}
#define _mm512_cvtpd_ps emu_mm512_cvtpd_ps
#endif

#ifndef _mm512_cvtps_pd
static inline __m512d emu_mm512_cvtps_pd(__m256 a) {
    EMU_LANES(float, 8, v, a);
    double r[8];
    for (int i = 0; i < 8; i++) r[i] = v[i];
    EMU_RETURN(__m512d, r);
}
#define _mm512_cvtps_pd emu_mm512_cvtps_pd
#endif

#ifndef _mm512_maskz_loadu_epi8
static inline __m512i emu_mm512_maskz_loadu_epi8(__mmask64 k, const void *p) { /* masked-off bytes not read */
    const uint8_t *s = p;
    uint8_t r[64];
    for (int i = 0; i < 64; i++) r[i] = (k >> i) & 1 ? s[i] : 0;
    EMU_RETURN(__m512i, r);
}
#define _mm512_maskz_loadu_epi8 emu_mm512_maskz_loadu_epi8
#endif

#ifndef _mm512_zextsi256_si512
static inline __m512i emu_mm512_zextsi256_si512(__m256i a) {
    EMU_LANES(uint8_t, 32, v, a);
    EMU_RETURN(__m512i, v);
}
#define _mm512_zextsi256_si512 emu_mm512_zextsi256_si512
#endif

#ifndef _mm512_extractf32x8_ps
static inline __m256 emu_mm512_extractf32x8_ps(__m512 a, int half) {
    EMU_LANES(float, 16, v, a);
    float r[8];
    memcpy(r, v + 8 * (half & 1), sizeof(r));
    EMU_RETURN(__m256, r);
}
#define _mm512_extractf32x8_ps emu_mm512_extractf32x8_ps
#endif

#ifndef _mm256_mask_storeu_ps
static inline void emu_mm256_mask_storeu_ps(float *p, __mmask8 k, __m256 a) { /* masked-off lanes not written */
    EMU_LANES(float, 8, v, a);
    for (int i = 0; i < 8; i++)
        if ((k >> i) & 1) p[i] = v[i];
}
#define _mm256_mask_storeu_ps emu_mm256_mask_storeu_ps
#endif

#endif
