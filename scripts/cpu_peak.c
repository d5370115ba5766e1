/* Peak throughput of the adder kernels' instruction mixes on this CPU (AVX2 + FMA), per core.
 * Measures the clock with a chain of dependent integer adds (1 cycle each) and, in thread CPU
 * time, each mix over 6 independent accumulators held in registers; the kernels' throughput in
 * docs/benchmarks.md is quoted as a fraction of these. Build and run:
 *     cc -O3 -march=native scripts/cpu_peak.c -o /tmp/cpu_peak && /tmp/cpu_peak
 * (the 6 chains cap the fma-only line at 12 of the 16 lanes/cycle two FMA pipes give).
 * The last line is the integer kernel's inner step (adder_int.c): vpsadbw (32 absolute byte
 * differences summed into 4 64-bit lanes) and vpaddq into the accumulator, in absolute differences. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 400000000L /* elements per mix */
#define K 6
int main(){
  long v=0; double t=now();
  for(long i=0;i<N;i+=8) __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0":"+r"(v));
  double dt=now()-t; double ghz=N/dt/1e9; printf("integer add chain (1 cycle each): %.2f GHz\n", ghz);
  __m256 acc[K], x[K]; __m256 m=_mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for(int k=0;k<K;k++){acc[k]=_mm256_setzero_ps(); x[k]=_mm256_set1_ps(k*0.1f);}
  __m256 w=_mm256_set1_ps(0.3f), one=_mm256_set1_ps(1.f), nw=_mm256_set1_ps(-0.3f), mo=_mm256_set1_ps(-1.f), g=_mm256_set1_ps(0.5f);
  float s;
#define RUN(label, body) for(int k=0;k<K;k++)acc[k]=_mm256_setzero_ps(); t=now(); \
  for(long i=0;i<N/K/8;i++){ __asm__("":"+x"(w),"+x"(nw),"+x"(one),"+x"(g)); _Pragma("GCC unroll 8") for(int k=0;k<K;k++) acc[k]=body; } \
  dt=now()-t; s=0; for(int k=0;k<K;k++) s+=acc[k][0]; \
  printf("%-28s %6.2f G elem/s = %.2f elem/cycle (%g)\n", label, N/dt/1e9, N/dt/1e9/ghz, s);
  RUN("fwd: sub, and, add", _mm256_add_ps(acc[k], _mm256_and_ps(_mm256_sub_ps(x[k],w),m)))
  RUN("fwd: fma(x,1,-w), and, add", _mm256_add_ps(acc[k], _mm256_and_ps(_mm256_fmadd_ps(x[k],one,nw),m)))
  RUN("gin: sub, max, min, fma", _mm256_fmadd_ps(g,_mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(w,x[k]),mo),one),acc[k]))
  RUN("gin: fma(w,1,-x),max,min,fma", _mm256_fmadd_ps(g,_mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(w,one,x[k]),mo),one),acc[k]))
  RUN("conv: fma", _mm256_fmadd_ps(w,x[k],acc[k]))
  RUN("add only", _mm256_add_ps(acc[k], x[k]))
  __m256i ia[K], ix[K], iw=_mm256_set1_epi8(3);
  for(int k=0;k<K;k++){ia[k]=_mm256_setzero_si256(); ix[k]=_mm256_set1_epi8((char)k);}
  t=now();
  for(long i=0;i<N/K/32;i++){ __asm__("":"+x"(iw)); _Pragma("GCC unroll 8") for(int k=0;k<K;k++) ia[k]=_mm256_add_epi64(ia[k],_mm256_sad_epu8(ix[k],iw)); }
  dt=now()-t; long long r=0; for(int k=0;k<K;k++) r+=_mm256_extract_epi64(ia[k],0);
  printf("%-28s %6.2f G elem/s = %.2f elem/cycle (%lld)\n", "sad: vpsadbw, vpaddq (u8)", N/dt/1e9, N/dt/1e9/ghz, r);
}
