/* Peak throughput of the adder kernels' instruction mixes on this CPU, per core: AVX2 + FMA, and AVX-512
 * (F/BW/DQ) when built for a CPU that has it. Measures the clock with a chain of dependent integer adds
 * (1 cycle each) and, in thread CPU time, each mix over independent accumulators held in registers (6
 * for AVX2's 16 registers, 12 for AVX-512's 32); the kernels' throughput in docs/benchmarks.md is quoted
 * as a fraction of these; the "store" lines time the forward's stores of short NCHW runs (AVX2). Build and run:
 *     cc -O3 -march=native scripts/cpu_peak.c -o /tmp/cpu_peak && /tmp/cpu_peak
 * (6 chains cap the AVX2 fma-only line at 12 of the 16 lanes/cycle two FMA pipes give; 12 chains do not).
 * The "sad" lines are the integer kernel's inner step (adder_int.c): vpsadbw (32 or 64 absolute byte
 * differences summed into 64-bit lanes) and vpaddq into the accumulator, in absolute differences. The
 * "int8 conv" lines are what an int8 CNN's convolution runs (oneDNN): vpdpbusd with AVX-512 VNNI (64 u8 x s8
 * products accumulated into 32-bit lanes, one instruction), else vpmaddubsw, vpmaddwd, vpaddd; in
 * multiply-accumulates, the unit the "sad" lines compare with. The "gin + weight grad" line is the input
 * gradient's mix with the FMA that also sums g*x for the weight gradient (one more per term), with the subtraction
 * as a plain add on every core, as that kernel tile issues it (adder_cpu.c), and with 512-bit vectors the same with the
 * clamp as one vrangeps (the tile's form on other than AMD CPUs); "gin: sub, range, fma" is the input gradient alone
 * in that form. The "fwd min form" lines are the forward's
 * tile on layers with more than one tap, its loads included (MIN_FORM below), with the add on the FMA pipes (as the
 * kernels issue it on AMD CPUs) and as a plain add (on other CPUs, where it can also run on the FP adders). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 400000000L /* elements per mix */

/* Every mix for vectors of W bits (256 or 512) over K accumulators; F(op) is the intrinsic _mmW_op. */
#define CAT3(a, b, c) a##b##c
#define F_(W, op) CAT3(_mm, W, op)
#define MIXES(W, K, LANES)                                                                                  \
  do {                                                                                                      \
    printf("%d-bit vectors, %d accumulators\n", W, K);                                                      \
    __m##W acc[K], x[K]; const __m##W m = F_(W, _castsi##W##_ps)(F_(W, _set1_epi32)(0x7fffffff));           \
    for (int k = 0; k < K; k++) x[k] = F_(W, _set1_ps)(k * 0.1f);                                           \
    __m##W w = F_(W, _set1_ps)(0.3f), one = F_(W, _set1_ps)(1.f), nw = F_(W, _set1_ps)(-0.3f);              \
    __m##W mo = F_(W, _set1_ps)(-1.f), g = F_(W, _set1_ps)(0.5f);                                           \
    RUN(W, K, LANES, "fwd: sub, and, add", F_(W, _add_ps)(acc[k], F_(W, _and_ps)(F_(W, _sub_ps)(x[k], w), m))) \
    RUN(W, K, LANES, "fwd: fma(x,1,-w), and, add",                                                         \
        F_(W, _add_ps)(acc[k], F_(W, _and_ps)(F_(W, _fmadd_ps)(x[k], one, nw), m)))                         \
    RUN(W, K, LANES, "gin: sub, max, min, fma",                                                            \
        F_(W, _fmadd_ps)(g, F_(W, _min_ps)(F_(W, _max_ps)(F_(W, _sub_ps)(w, x[k]), mo), one), acc[k]))      \
    RUN(W, K, LANES, "gin: fma(w,1,-x),max,min,fma",                                                       \
        F_(W, _fmadd_ps)(g, F_(W, _min_ps)(F_(W, _max_ps)(F_(W, _fmadd_ps)(w, one, x[k]), mo), one), acc[k])) \
    RUN(W, K, LANES, "gin + weight grad: +fma",                                                             \
        F_(W, _fmadd_ps)(g, x[k], F_(W, _fmadd_ps)(g, F_(W, _min_ps)(F_(W, _max_ps)(F_(W, _sub_ps)(w, x[k]), mo), one), acc[k]))) \
    GIN_RANGE##W(K)                                                                                         \
    RUN(W, K, LANES, "conv: fma", F_(W, _fmadd_ps)(w, x[k], acc[k]))                                        \
    min_form_##W(ghz);                                                                                      \
    min_form_add_##W(ghz);                                                                                  \
    RUN(W, K, LANES, "add only", F_(W, _add_ps)(acc[k], x[k]))                                              \
    __m##W##i ia[K], ix[K], iw = F_(W, _set1_epi8)(3);                                                      \
    for (int k = 0; k < K; k++) { ia[k] = F_(W, _setzero_si##W)(); ix[k] = F_(W, _set1_epi8)((char)k); }    \
    double t = now();                                                                                       \
    for (long i = 0; i < N / K / (W / 8); i++) {                                                            \
      __asm__("" : "+x"(iw));                                                                               \
      _Pragma("GCC unroll 12") for (int k = 0; k < K; k++) ia[k] = F_(W, _add_epi64)(ia[k], F_(W, _sad_epu8)(ix[k], iw)); \
    }                                                                                                       \
    double dt = now() - t; long long r = 0;                                                                 \
    for (int k = 0; k < K; k++) r += ia[k][0];                                                              \
    printf("%-28s %6.2f G elem/s = %.2f elem/cycle (%lld)\n", "sad: vpsadbw, vpaddq (u8)", N / dt / 1e9,    \
           N / dt / 1e9 / ghz, r);                                                                          \
    INT8_CONV##W(K);                                                                                        \
  } while (0)
/* The int8 convolution's step over the same registers (ia, ix, iw), timed as the sad line. */
#define INT8_TIMED(W, K, label, body)                                                                       \
  {                                                                                                         \
    for (int k = 0; k < K; k++) ia[k] = F_(W, _setzero_si##W)();                                            \
    double t8 = now();                                                                                      \
    for (long i = 0; i < N / K / (W / 8); i++) {                                                            \
      __asm__("" : "+x"(iw));                                                                               \
      _Pragma("GCC unroll 12") for (int k = 0; k < K; k++) ia[k] = body;                                    \
    }                                                                                                       \
    double d8 = now() - t8; long long r8 = 0;                                                               \
    for (int k = 0; k < K; k++) r8 += ia[k][0];                                                             \
    printf("%-28s %6.2f G elem/s = %.2f elem/cycle (%lld)\n", label, N / d8 / 1e9, N / d8 / 1e9 / ghz, r8); \
  }
#define INT8_CONV256(K)                                                                                     \
  INT8_TIMED(256, K, "int8 conv: maddubs, madd, add",                                                       \
             _mm256_add_epi32(ia[k], _mm256_madd_epi16(_mm256_maddubs_epi16(ix[k], iw), _mm256_set1_epi16(1))))
/* The same with the clamp as one vrangeps (AVX-512 on other than AMD CPUs: adder_cpu.c VCLAMP1). */
#define GIN_RANGE256(K)
#define GIN_RANGE512(K)                                                                                     \
  RUN(512, K, 16, "gin: sub, range, fma",                                                                   \
      _mm512_fmadd_ps(g, _mm512_range_ps(_mm512_sub_ps(w, x[k]), one, 2), acc[k]))                           \
  RUN(512, K, 16, "gin + weight grad: range",                                                               \
      _mm512_fmadd_ps(g, x[k], _mm512_fmadd_ps(g, _mm512_range_ps(_mm512_sub_ps(w, x[k]), one, 2), acc[k])))
#if defined(__AVX512VNNI__)
#define INT8_CONV512(K) INT8_TIMED(512, K, "int8 conv: vpdpbusd", _mm512_dpbusd_epi32(ia[k], ix[k], iw))
#else
#define INT8_CONV512(K)
#endif
/* The forward's min form as its tile runs it (adder_cpu_body.h fwd_tile): per channel step two weight vectors and one
 * broadcast input per pixel loaded, and per pixel and vector min(w, x) added into the accumulator (ADD), over
 * FWD_P2M pixels x 2 vectors (5 with AVX2's 16 registers, 8 with AVX-512's 32); the loads go through a pointer hidden
 * from the optimiser, so that they are issued every step as in the kernel. */
#define MIN_FORM(W, LANES, NAME, LABEL, ADD)                                                                 \
  static __attribute__((noinline)) void NAME(double ghz) { /* own registers: none live from the caller */   \
    enum { P = W == 256 ? 5 : 8 };                                                                          \
    static float src[2 * LANES + P] __attribute__((aligned(64)));                                           \
    for (int i = 0; i < 2 * LANES + P; i++) src[i] = i * 0.01f;                                             \
    __m##W am[P][2], one = F_(W, _set1_ps)(1.f);                                                            \
    for (int p = 0; p < P; p++) am[p][0] = am[p][1] = F_(W, _setzero_ps)();                                 \
    const float *sp = src;                                                                                  \
    double tm = now();                                                                                      \
    for (long i = 0; i < N / (2 * P) / LANES; i++) {                                                        \
      __asm__("" : "+r"(sp), "+x"(one));                                                                    \
      const __m##W w0 = F_(W, _loadu_ps)(sp), w1 = F_(W, _loadu_ps)(sp + LANES);                            \
      _Pragma("GCC unroll 8") for (int p = 0; p < P; p++) {                                                 \
        const __m##W xv = F_(W, _set1_ps)(sp[2 * LANES + p]);                                               \
        am[p][0] = ADD(W, F_(W, _min_ps)(w0, xv), one, am[p][0]);                                           \
        am[p][1] = ADD(W, F_(W, _min_ps)(w1, xv), one, am[p][1]);                                           \
      }                                                                                                     \
    }                                                                                                       \
    double dm = now() - tm; float sm = 0;                                                                   \
    for (int p = 0; p < P; p++) sm += am[p][0][0] + am[p][1][0];                                            \
    printf("%-28s %6.2f G elem/s = %.2f elem/cycle (%g)\n", LABEL, N / dm / 1e9,                           \
           N / dm / 1e9 / ghz, sm);                                                                         \
  }
#define ADD_FMA(W, m, one, acc) F_(W, _fmadd_ps)(m, one, acc)
#define ADD_PLAIN(W, m, one, acc) F_(W, _add_ps)(m, acc)
MIN_FORM(256, 8, min_form_256, "fwd min form: min, fma", ADD_FMA)
MIN_FORM(256, 8, min_form_add_256, "fwd min form: min, add", ADD_PLAIN)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
MIN_FORM(512, 16, min_form_512, "fwd min form: min, fma", ADD_FMA)
MIN_FORM(512, 16, min_form_add_512, "fwd min form: min, add", ADD_PLAIN)
#endif
#define RUN(W, K, LANES, label, body)                                                                       \
  {                                                                                                         \
    for (int k = 0; k < K; k++) acc[k] = F_(W, _setzero_ps)();                                              \
    double t = now();                                                                                       \
    for (long i = 0; i < N / K / LANES; i++) {                                                              \
      __asm__("" : "+x"(w), "+x"(nw), "+x"(one), "+x"(g));                                                  \
      _Pragma("GCC unroll 12") for (int k = 0; k < K; k++) acc[k] = body;                                   \
    }                                                                                                       \
    double dt = now() - t; float s = 0;                                                                     \
    for (int k = 0; k < K; k++) s += acc[k][0];                                                             \
    printf("%-28s %6.2f G elem/s = %.2f elem/cycle (%g)\n", label, N / dt / 1e9, N / dt / 1e9 / ghz, s);    \
  }

/* The forward's NCHW store of a run shorter than 8 lanes (adder_cpu.c): AVX2's masked store (vmaskmovps, 6 of 8
 * lanes), its plain parts of 4 and 2 lanes, and a plain 8-lane store, in cycles per store, over 128 rows of 64 bytes. */
static float rows[128 * 16] __attribute__((aligned(64)));
#define STORE_TIMED(label, body)                                                                           \
  {                                                                                                         \
    double ts = now();                                                                                      \
    for (long i = 0; i < N / 4; i++) {                                                                      \
      float *p = rows + (i & 127) * 16;                                                                     \
      body;                                                                                                 \
      __asm__ volatile("" : : "x"(v8) : "memory");                                                          \
    }                                                                                                       \
    printf("%-28s %6.2f cycles per store\n", label, (now() - ts) / (N / 4) * 1e9 * ghz);                    \
  }
#define STORES()                                                                                            \
  do {                                                                                                      \
    const __m256 v8 = _mm256_set1_ps(1.f);                                                                  \
    const __m256i m6 = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);                                     \
    STORE_TIMED("store: vmaskmovps, 6 lanes", _mm256_maskstore_ps(p, m6, v8))                               \
    STORE_TIMED("store: plain 4 + 2 lanes",                                                                 \
                (_mm_storeu_ps(p, _mm256_castps256_ps128(v8)),                                              \
                 _mm_storel_pi((__m64 *)(p + 4), _mm256_extractf128_ps(v8, 1))))                            \
    STORE_TIMED("store: plain 8 lanes", _mm256_storeu_ps(p, v8))                                            \
  } while (0)

int main(){
  long v=0; double t=now();
  for(long i=0;i<N;i+=8) __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0":"+r"(v));
  double dt=now()-t; double ghz=N/dt/1e9; printf("integer add chain (1 cycle each): %.2f GHz\n", ghz);
  MIXES(256, 6, 8);
  STORES();
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
  MIXES(512, 12, 16);
#endif
}
