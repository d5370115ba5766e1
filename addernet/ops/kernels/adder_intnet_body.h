/* The integer network's layer step for one lane type, included by adder_int.c with
 *   T (uint8_t or uint16_t), SUF (name suffix), TILE (the PT x OT sum-of-absolute-differences tile).
 * See adder_int.c ("Integer network") for the op descriptor and the buffers. */

/* Rows of the tile's PT pixels gathered from a zero-bordered plane [H+2B][W+2B][C] (row stride rs), pixel t's
 * patch at element at[t]: kh runs of R = kw*C elements, then zeros up to Kp. */
static void CAT(gather_hwc_, SUF)(const T *x, int64_t kh, int64_t R, int64_t rs, int64_t Kp, const int64_t *at,
                                  T *rows) {
    for (int t = 0; t < PT; t++) {
        const T *src = x + at[t];
        T *r = rows + t * Kp;
        for (int64_t i = 0; i < kh; i++, r += R) copy_bytes(r, src + i * rs, sizeof(T) * (size_t)R);
        zero_bytes(r, sizeof(T) * (size_t)(Kp - kh * R));
    }
}

/* acc = a tile of OT filters w at the tile's pixels: patches read in place from plane src at at[] (direct; a kernel
 * row's weights Rp apart), or the gathered rows src. */
static inline __attribute__((always_inline)) void CAT(tile_, SUF)(const T *src, int64_t direct, const int64_t *at,
                                                                 const T *w, int64_t Kp, int64_t kh, int64_t R,
                                                                 int64_t rs, int64_t Rp, int32_t acc[PT][OT]) {
#ifdef DIRECT_TILE
    if (direct) {
        const T *xs[PT];
        for (int t = 0; t < PT; t++) xs[t] = src + at[t];
        DIRECT_TILE(xs, rs, kh, R, w, Kp, Rp, acc);
        return;
    }
#endif
    (void)direct, (void)at, (void)kh, (void)R, (void)rs, (void)Rp;
    TILE(src, w, Kp, acc);
}

/* Zero the border of a plane [h+2B][w+2B][c] (its interior is written pixel by pixel). */
static void CAT(zero_border_, SUF)(T *x, int64_t h, int64_t w, int64_t c, int64_t B) {
    if (!B) return;
    const int64_t wp = w + 2 * B;
    memset(x, 0, sizeof(T) * (size_t)(B * wp * c));
    memset(x + (h + B) * wp * c, 0, sizeof(T) * (size_t)(B * wp * c));
    for (int64_t y = B; y < h + B; y++) {
        memset(x + y * wp * c, 0, sizeof(T) * (size_t)(B * c));
        memset(x + (y * wp + w + B) * c, 0, sizeof(T) * (size_t)(B * c));
    }
}

/* An op's epilogue operands for one image, read once into a local: T is a character type for uint8_t, so each store
 * of a quantised value may alias any memory, and operands read through op and bufs were loaded again after every
 * store (a chain of dependent loads per 4 outputs). */
typedef struct {
    const double *alpha, *beta;
    const float *res; /* residual [pixels][O], or NULL */
    float *out;       /* float output [pixels][O], or NULL */
    T *q[MAXQ];       /* the quantised outputs, bordered planes */
    double inv[MAXQ], lv;
    int64_t n_q, relu;
} CAT(epi_, SUF);

static inline __attribute__((always_inline)) CAT(epi_, SUF) CAT(epi_of_, SUF)(const intnet_op *op, void **bufs) {
    CAT(epi_, SUF) ep = {op->alpha, op->beta, op->res_buf >= 0 ? bufs[op->res_buf] : NULL,
                          op->out_buf >= 0 ? bufs[op->out_buf] : NULL, {0}, {0}, (double)op->lv, op->n_q, op->relu};
    for (int64_t k = 0; k < op->n_q; k++) ep.q[k] = bufs[op->q_buf[k]], ep.inv[k] = op->inv[k];
    return ep;
}

/* v = alpha * a + beta (+ residual) (ReLU) -> float output and quantised outputs clamp(round_half_even(v / s_k), 0,
 * lv), at element e of the float buffers and element eq of the (bordered) planes. */
static inline __attribute__((always_inline)) void CAT(emit1_, SUF)(const CAT(epi_, SUF) *ep, double a, int64_t slot,
                                                                  int64_t e, int64_t eq) {
    double v = fma(ep->alpha[slot], a, ep->beta[slot]);
    if (ep->res) v += ep->res[e];
    if (ep->relu && v < 0) v = 0;
    if (ep->out) ep->out[e] = (float)v;
    for (int64_t k = 0; k < ep->n_q; k++) {
        double r = nearbyint(v * ep->inv[k]);
        r = r < 0 ? 0 : (r > ep->lv ? ep->lv : r);
        ep->q[k][eq] = (T)r;
    }
}

#if ISA_AVX2
/* The same for 4 consecutive elements e..e+3 of slots with factors al and terms be, in double lanes: the results
 * equal emit1's exactly (fma is correctly rounded either way). v4 is the value after the residual and the ReLU,
 * also written as the float output; q4 is quantised output k as int32: v / s_k capped at lv, rounded to nearest
 * even by the conversion (the rounding mode adder_intnet_forward sets). Values below 0, including those too
 * negative for int32, saturate to 0 in the unsigned packs: clamp(round(.), 0, lv) in 3 instructions, not 5. */
static inline __attribute__((always_inline)) __m256d CAT(v4_, SUF)(const CAT(epi_, SUF) *ep, __m256d a, __m256d al,
                                                                  __m256d be, int64_t e, const int RES,
                                                                  const int OUT) {
    __m256d v = _mm256_fmadd_pd(al, a, be);
    if (RES) v = _mm256_add_pd(v, _mm256_cvtps_pd(_mm_loadu_ps(ep->res + e)));
    if (ep->relu) v = _mm256_max_pd(v, _mm256_setzero_pd());
    if (OUT) _mm_storeu_ps(ep->out + e, _mm256_cvtpd_ps(v));
    return v;
}

static inline __attribute__((always_inline)) __m128i CAT(q4_, SUF)(const CAT(epi_, SUF) *ep, __m256d v, int64_t k) {
    return _mm256_cvtpd_epi32(_mm256_min_pd(_mm256_mul_pd(v, _mm256_set1_pd(ep->inv[k])), _mm256_set1_pd(ep->lv)));
}

static inline __attribute__((always_inline)) void CAT(emit4_, SUF)(const CAT(epi_, SUF) *ep, __m256d a, __m256d al,
                                                                  __m256d be, int64_t e, int64_t eq, const int RES,
                                                                  const int OUT, const int NQ) {
    const __m256d v = CAT(v4_, SUF)(ep, a, al, be, e, RES, OUT);
    for (int64_t k = 0; k < (NQ < 2 ? NQ : ep->n_q); k++) {
        const __m128i i32 = CAT(q4_, SUF)(ep, v, k), i16 = _mm_packus_epi32(i32, i32);
        T *dst = ep->q[k] + eq;
        if (sizeof(T) == 1) {
            const int32_t four = _mm_cvtsi128_si32(_mm_packus_epi16(i16, i16));
            memcpy(dst, &four, 4);
        } else {
            _mm_storel_epi64((__m128i *)dst, i16);
        }
    }
}

/* emit4 for 8 consecutive elements in two halves (e..e+3 and e+4..e+7, factors al0, al1, terms be0, be1): each
 * quantised output packed and stored once for the 8. */
static inline __attribute__((always_inline)) void CAT(emit4x2_, SUF)(const CAT(epi_, SUF) *ep, __m256d a0, __m256d a1,
                                                                    __m256d al0, __m256d be0, __m256d al1,
                                                                    __m256d be1, int64_t e, int64_t eq, const int RES,
                                                                    const int OUT, const int NQ) {
    const __m256d v0 = CAT(v4_, SUF)(ep, a0, al0, be0, e, RES, OUT);
    const __m256d v1 = CAT(v4_, SUF)(ep, a1, al1, be1, e + 4, RES, OUT);
    for (int64_t k = 0; k < (NQ < 2 ? NQ : ep->n_q); k++) {
        const __m128i i16 = _mm_packus_epi32(CAT(q4_, SUF)(ep, v0, k), CAT(q4_, SUF)(ep, v1, k));
        T *dst = ep->q[k] + eq;
        if (sizeof(T) == 1) _mm_storel_epi64((__m128i *)dst, _mm_packus_epi16(i16, i16));
        else _mm_storeu_si128((__m128i *)dst, i16);
    }
}
#define HAVE_EMIT4 1
#endif

#if ISA_AVX512
/* The same for 8 consecutive elements in one register of double lanes (equal to emit1's results too): capped at
 * lv, rounded to nearest even in the conversion, then negatives to 0 (the packs below saturate unsigned). */
static inline __attribute__((always_inline)) void CAT(emit8_, SUF)(const CAT(epi_, SUF) *ep, __m512d a, __m512d al,
                                                                  __m512d be, int64_t e, int64_t eq, const int RES,
                                                                  const int OUT, const int NQ) {
    __m512d v = _mm512_fmadd_pd(al, a, be);
    if (RES) v = _mm512_add_pd(v, _mm512_cvtps_pd(_mm256_loadu_ps(ep->res + e)));
    if (ep->relu) v = _mm512_max_pd(v, _mm512_setzero_pd());
    if (OUT) _mm256_storeu_ps(ep->out + e, _mm512_cvtpd_ps(v));
    for (int64_t k = 0; k < (NQ < 2 ? NQ : ep->n_q); k++) {
        const __m512d r = _mm512_min_pd(_mm512_mul_pd(v, _mm512_set1_pd(ep->inv[k])), _mm512_set1_pd(ep->lv));
        const __m256i i32 = _mm256_max_epi32(
            _mm512_cvt_roundpd_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), _mm256_setzero_si256());
        T *dst = ep->q[k] + eq;
        if (sizeof(T) == 1) _mm_storel_epi64((__m128i *)dst, _mm256_cvtusepi32_epi8(i32));
        else _mm_storeu_si128((__m128i *)dst, _mm256_cvtusepi32_epi16(i32));
    }
}
#define HAVE_EMIT8 1
#endif

/* The epilogues of a pixel tile's np pixels q.. (planes at pq[]) over every filter tile's sums acc; RES, OUT and NQ
 * (0, 1, or 2 for the op's n_q) are constants in each copy, so the per-4-output code has no tests of the op. */
static inline __attribute__((always_inline)) void CAT(epi_tiles_, SUF)(const CAT(epi_, SUF) *ep, int32_t (*acc)[PT][OT],
                                                                      int64_t n_tiles, const int64_t *first,
                                                                      const int64_t *chan, int64_t q, int64_t np,
                                                                      int64_t O, const int64_t *pq, const int RES,
                                                                      const int OUT, const int NQ) {
    (void)RES, (void)OUT, (void)NQ;
    for (int64_t b = 0; b < n_tiles; b++) {
        const int eight = first[b] >= 0 && b + 1 < n_tiles && first[b + 1] == first[b] + OT; /* 8 channels */
        (void)eight;
#ifdef HAVE_EMIT8
        if (eight) {
            const __m512d al = _mm512_loadu_pd(ep->alpha + b * OT), be = _mm512_loadu_pd(ep->beta + b * OT);
            for (int64_t t = 0; t < np; t++) {
                const __m256i a = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)acc[b][t])),
                    _mm_loadu_si128((const __m128i *)acc[b + 1][t]), 1);
                CAT(emit8_, SUF)(ep, _mm512_cvtepi32_pd(a), al, be, (q + t) * O + first[b], pq[t] + first[b], RES, OUT,
                                 NQ);
            }
            b++;
            continue;
        }
#endif
#if defined(HAVE_EMIT4) && !defined(HAVE_EMIT8)
        if (eight) {
            const __m256d al0 = _mm256_loadu_pd(ep->alpha + b * OT), be0 = _mm256_loadu_pd(ep->beta + b * OT);
            const __m256d al1 = _mm256_loadu_pd(ep->alpha + b * OT + OT), be1 = _mm256_loadu_pd(ep->beta + b * OT + OT);
            for (int64_t t = 0; t < np; t++)
                CAT(emit4x2_, SUF)(ep, _mm256_cvtepi32_pd(_mm_loadu_si128((const __m128i *)acc[b][t])),
                                   _mm256_cvtepi32_pd(_mm_loadu_si128((const __m128i *)acc[b + 1][t])), al0, be0, al1,
                                   be1, (q + t) * O + first[b], pq[t] + first[b], RES, OUT, NQ);
            b++;
            continue;
        }
#endif
#ifdef HAVE_EMIT4
        if (first[b] >= 0) { /* OT = 4 consecutive output channels */
            const __m256d al = _mm256_loadu_pd(ep->alpha + b * OT), be = _mm256_loadu_pd(ep->beta + b * OT);
            for (int64_t t = 0; t < np; t++)
                CAT(emit4_, SUF)(ep, _mm256_cvtepi32_pd(_mm_loadu_si128((const __m128i *)acc[b][t])), al, be,
                                 (q + t) * O + first[b], pq[t] + first[b], RES, OUT, NQ);
            continue;
        }
#endif
        for (int64_t t = 0; t < np; t++)
            for (int64_t o = 0; o < OT; o++) {
                const int64_t ch = chan[b * OT + o];
                if (ch >= 0) CAT(emit1_, SUF)(ep, acc[b][t][o], b * OT + o, (q + t) * O + ch, pq[t] + ch);
            }
    }
}

/* epi_tiles for this op's residual, float output and number of quantised outputs (inlined: ep stays a local of
 * run_op, which no quantised store may alias). */
static inline __attribute__((always_inline)) void CAT(epilogue_, SUF)(const CAT(epi_, SUF) *ep, int32_t (*acc)[PT][OT],
                                                                      int64_t n_tiles, const int64_t *first,
                                                                      const int64_t *chan, int64_t q, int64_t np,
                                                                      int64_t O, const int64_t *pq) {
#define EPI(R, F, N) CAT(epi_tiles_, SUF)(ep, acc, n_tiles, first, chan, q, np, O, pq, R, F, N)
#define EPI_NQ(R, F) (ep->n_q == 1 ? EPI(R, F, 1) : ep->n_q == 0 ? EPI(R, F, 0) : EPI(R, F, 2))
    if (ep->res) ep->out ? EPI_NQ(1, 1) : EPI_NQ(1, 0);
    else ep->out ? EPI_NQ(0, 1) : EPI_NQ(0, 0);
#undef EPI_NQ
#undef EPI
}

/* One op over the output pixels [q0, q1) of one image (q0 a multiple of PT for adder layers); the op that
 * covers pixel 0 zeroes its planes' borders. The op's fields are read into locals first (see epi_). */
static void CAT(run_op_, SUF)(const intnet_op *op, void **bufs, int64_t q0, int64_t q1, T *rows) {
    const int64_t B = op->border, O = op->O;
    const int64_t ho = op->kind == OP_ENTRY ? op->H : op->Ho, wo = op->kind == OP_ENTRY ? op->W : op->Wo;
    if (q0 == 0)
        for (int64_t k = 0; k < op->n_q; k++) CAT(zero_border_, SUF)(bufs[op->q_buf[k]], ho, wo, O, B);
    const CAT(epi_, SUF) ep = CAT(epi_of_, SUF)(op, bufs);
    if (op->kind == OP_ENTRY) { /* per-channel affine (folded BatchNorm), ReLU, float copy, quantise */
        const float *x = bufs[op->in_buf];
        int64_t pq = ((q0 / wo + B) * (wo + 2 * B) + q0 % wo + B) * O, ox = q0 % wo; /* stepped: no division */
        for (int64_t p = q0; p < q1; p++, pq += O) {
            if (p > q0 && ox++ == wo - 1) ox = 0, pq += 2 * B * O; /* the next row's first pixel */
            int64_t c = 0;
#ifdef HAVE_EMIT4
            for (; c + 4 <= O; c += 4)
                CAT(emit4_, SUF)(&ep, _mm256_cvtps_pd(_mm_loadu_ps(x + p * O + c)), _mm256_loadu_pd(ep.alpha + c),
                                 _mm256_loadu_pd(ep.beta + c), p * O + c, pq + c, ep.res != NULL, ep.out != NULL, 2);
#endif
            for (; c < O; c++) CAT(emit1_, SUF)(&ep, x[p * O + c], c, p * O + c, pq + c);
        }
        return;
    }
    const int64_t Kp = op->Kp, L = op->Ho * op->Wo, kh = op->kh, R = op->kw * op->C, rs = (op->W + 2 * B) * op->C;
    const int64_t Rp = Kp / kh; /* in place: a kernel row's weights */
    const int64_t n_tiles = op->n_tiles, n_planes = op->n_planes, direct = op->direct, C = op->C;
    const int64_t sh = op->sh, sw = op->sw, ph = op->ph, pw = op->pw, W = op->W;
    const int64_t *chan = op->chan;
    const T *w = op->w;
    /* tile b reads src[b]: its input plane (in place) or its plane's gathered rows; gathered from planes gp[] */
    const T *src[n_tiles], *gp[n_planes];
    int64_t first[n_tiles];
    for (int64_t b = 0; b < n_tiles; b++) {
        src[b] = direct ? (const T *)bufs[op->in_planes[op->tile_plane[b]]] : rows + op->tile_plane[b] * PT * Kp;
        first[b] = op->tile_first[b];
    }
    for (int64_t p = 0; p < n_planes; p++) gp[p] = bufs[op->in_planes[p]];
    int32_t acc[n_tiles][PT][OT]; /* every tile's sums for the pixel tile, then the epilogue over all of them: run
                                    * tile by tile, each epilogue waited on its tile's sums */
    int64_t oy = q0 / wo, ox = q0 % wo; /* the pixel q's coordinates, stepped along */
    for (int64_t q = q0; q < q1; q += PT) {
        const int64_t np = q1 - q < PT ? q1 - q : PT;
        int64_t at[PT], pq[PT];
        for (int t = 0; t < PT; t++) { /* pixels past L repeat the last one */
            at[t] = ((oy * sh + B - ph) * (W + 2 * B) + ox * sw + B - pw) * C;
            pq[t] = ((oy + B) * (wo + 2 * B) + ox + B) * O;
            if (q + t + 1 < L && ++ox == wo) ox = 0, oy++;
        }
        if (!direct)
            for (int64_t p = 0; p < n_planes; p++) CAT(gather_hwc_, SUF)(gp[p], kh, R, rs, Kp, at, rows + p * PT * Kp);
#ifdef LANES_TILE
        if (direct == 2) /* runs of up to LANES_TILES filter tiles on one plane */
            for (int64_t b = 0, e; b < n_tiles; b = e) {
                for (e = b + 1; e < n_tiles && e - b < LANES_TILES && op->tile_plane[e] == op->tile_plane[b]; e++) {
                }
                const T *xs[PT];
                for (int t = 0; t < PT; t++) xs[t] = src[b] + at[t];
                LANES_TILE(xs, rs, kh, R, w + b * OT * Kp, OT * Kp, e - b, acc + b);
            }
        else
#endif
            for (int64_t b = 0; b < n_tiles; b++)
                CAT(tile_, SUF)(src[b], direct, at, w + b * OT * Kp, Kp, kh, R, rs, Rp, acc[b]);
        CAT(epilogue_, SUF)(&ep, acc, n_tiles, first, chan, q, np, O, pq);
    }
}
#undef HAVE_EMIT4
#undef HAVE_EMIT8
