/* The integer network's layer step for one lane type, included by adder_int.c with
 *   T (uint8_t or uint16_t), SUF (name suffix), TILE (the PT x OT sum-of-absolute-differences tile).
 * See adder_int.c ("Integer network") for the op descriptor and the buffers. */

/* Rows of the tile's PT pixels gathered from a zero-bordered plane [H+2B][W+2B][C], pixel t's patch at
 * element at[t]: kh runs of kw*C elements, then zeros up to Kp. */
static void CAT(gather_hwc_, SUF)(const T *x, const intnet_op *op, const int64_t *at, T *rows) {
    const int64_t Kp = op->Kp, R = op->kw * op->C, rs = (op->W + 2 * op->border) * op->C;
    for (int t = 0; t < PT; t++) {
        const T *src = x + at[t];
        T *r = rows + t * Kp;
        for (int64_t i = 0; i < op->kh; i++, r += R) copy_bytes(r, src + i * rs, sizeof(T) * (size_t)R);
        memset(r, 0, sizeof(T) * (size_t)(Kp - op->kh * R));
    }
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

/* Quantised outputs of one value v at element e of the planes: clamp(round_half_even(v / s_k), 0, lv). */
static inline void CAT(emit_q1_, SUF)(const intnet_op *op, void **bufs, double v, int64_t e) {
    for (int64_t k = 0; k < op->n_q; k++) {
        double r = nearbyint(v * op->inv[k]);
        r = r < 0 ? 0 : (r > op->lv ? op->lv : r);
        ((T *)bufs[op->q_buf[k]])[e] = (T)r;
    }
}

/* v = alpha * a + beta (+ residual) (ReLU) -> float output and quantised outputs, at element e of the float
 * buffers and element eq of the (bordered) planes. */
static inline void CAT(emit1_, SUF)(const intnet_op *op, void **bufs, double a, int64_t slot, int64_t e, int64_t eq) {
    double v = fma(op->alpha[slot], a, op->beta[slot]);
    if (op->res_buf >= 0) v += ((const float *)bufs[op->res_buf])[e];
    if (op->relu && v < 0) v = 0;
    if (op->out_buf >= 0) ((float *)bufs[op->out_buf])[e] = (float)v;
    CAT(emit_q1_, SUF)(op, bufs, v, eq);
}

#if ISA_AVX2
/* The same for 4 consecutive elements e..e+3 (slots slot..slot+3), in double lanes: the results
 * equal emit1's exactly (fma is correctly rounded either way). */
static inline void CAT(emit4_, SUF)(const intnet_op *op, void **bufs, __m256d a, int64_t slot, int64_t e,
                                    int64_t eq) {
    __m256d v = _mm256_fmadd_pd(_mm256_loadu_pd(op->alpha + slot), a, _mm256_loadu_pd(op->beta + slot));
    if (op->res_buf >= 0) v = _mm256_add_pd(v, _mm256_cvtps_pd(_mm_loadu_ps((const float *)bufs[op->res_buf] + e)));
    if (op->relu) v = _mm256_max_pd(v, _mm256_setzero_pd());
    if (op->out_buf >= 0) _mm_storeu_ps((float *)bufs[op->out_buf] + e, _mm256_cvtpd_ps(v));
    for (int64_t k = 0; k < op->n_q; k++) {
        __m256d r = _mm256_round_pd(_mm256_mul_pd(v, _mm256_set1_pd(op->inv[k])),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_min_pd(_mm256_max_pd(r, _mm256_setzero_pd()), _mm256_set1_pd((double)op->lv));
        const __m128i i32 = _mm256_cvtpd_epi32(r);
        const __m128i i16 = _mm_packus_epi32(i32, i32);
        T *dst = (T *)bufs[op->q_buf[k]] + eq;
        if (sizeof(T) == 1) {
            const int32_t four = _mm_cvtsi128_si32(_mm_packus_epi16(i16, i16));
            memcpy(dst, &four, 4);
        } else {
            _mm_storel_epi64((__m128i *)dst, i16);
        }
    }
}
#define HAVE_EMIT4 1
#endif

#if ISA_AVX512
/* The same for 8 consecutive elements in one register of double lanes (equal to emit1's results too). */
static inline void CAT(emit8_, SUF)(const intnet_op *op, void **bufs, __m512d a, int64_t slot, int64_t e, int64_t eq) {
    __m512d v = _mm512_fmadd_pd(_mm512_loadu_pd(op->alpha + slot), a, _mm512_loadu_pd(op->beta + slot));
    if (op->res_buf >= 0) v = _mm512_add_pd(v, _mm512_cvtps_pd(_mm256_loadu_ps((const float *)bufs[op->res_buf] + e)));
    if (op->relu) v = _mm512_max_pd(v, _mm512_setzero_pd());
    if (op->out_buf >= 0) _mm256_storeu_ps((float *)bufs[op->out_buf] + e, _mm512_cvtpd_ps(v));
    for (int64_t k = 0; k < op->n_q; k++) {
        __m512d r = _mm512_roundscale_pd(_mm512_mul_pd(v, _mm512_set1_pd(op->inv[k])),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_pd(_mm512_max_pd(r, _mm512_setzero_pd()), _mm512_set1_pd((double)op->lv));
        const __m256i i32 = _mm512_cvtpd_epi32(r);
        T *dst = (T *)bufs[op->q_buf[k]] + eq;
        if (sizeof(T) == 1) _mm_storel_epi64((__m128i *)dst, _mm256_cvtusepi32_epi8(i32));
        else _mm_storeu_si128((__m128i *)dst, _mm256_cvtusepi32_epi16(i32));
    }
}
#define HAVE_EMIT8 1
#endif

/* acc = tile b of an adder op at the tile's pixels (patches at at[] in place, or the gathered rows). */
static inline void CAT(tile_, SUF)(const intnet_op *op, void **bufs, int64_t b, const int64_t *at, const T *rows,
                                  int64_t Rp, int32_t acc[PT][OT]) {
    const T *w = (const T *)op->w + b * OT * op->Kp;
#ifdef DIRECT_TILE
    if (op->direct) {
        const T *plane = bufs[op->in_planes[op->tile_plane[b]]], *xs[PT];
        for (int t = 0; t < PT; t++) xs[t] = plane + at[t];
        DIRECT_TILE(xs, (op->W + 2 * op->border) * op->C, op->kh, op->kw * op->C, w, op->Kp, Rp, acc);
        return;
    }
#endif
    (void)bufs, (void)at, (void)Rp;
    TILE(rows + op->tile_plane[b] * PT * op->Kp, w, op->Kp, acc);
}

/* One op over the output pixels [q0, q1) of one image (q0 a multiple of PT for adder layers); the op that
 * covers pixel 0 zeroes its planes' borders. */
static void CAT(run_op_, SUF)(const intnet_op *op, void **bufs, int64_t q0, int64_t q1, T *rows) {
    const int64_t B = op->border, O = op->O;
    const int64_t ho = op->kind == OP_ENTRY ? op->H : op->Ho, wo = op->kind == OP_ENTRY ? op->W : op->Wo;
    if (q0 == 0)
        for (int64_t k = 0; k < op->n_q; k++) CAT(zero_border_, SUF)(bufs[op->q_buf[k]], ho, wo, O, B);
    if (op->kind == OP_ENTRY) { /* per-channel affine (folded BatchNorm), ReLU, float copy, quantise */
        const float *x = bufs[op->in_buf];
        for (int64_t p = q0; p < q1; p++) {
            const int64_t pq = ((p / wo + B) * (wo + 2 * B) + p % wo + B) * O;
            int64_t c = 0;
#ifdef HAVE_EMIT4
            for (; c + 4 <= O; c += 4)
                CAT(emit4_, SUF)(op, bufs, _mm256_cvtps_pd(_mm_loadu_ps(x + p * O + c)), c, p * O + c, pq + c);
#endif
            for (; c < O; c++) CAT(emit1_, SUF)(op, bufs, x[p * O + c], c, p * O + c, pq + c);
        }
        return;
    }
    const int64_t Kp = op->Kp, L = op->Ho * op->Wo, Rp = Kp / op->kh; /* Rp: in place, a kernel row's weights */
    int32_t acc[PT][OT];
    int64_t oy = q0 / wo, ox = q0 % wo; /* the pixel q's coordinates, stepped along */
    for (int64_t q = q0; q < q1; q += PT) {
        const int64_t np = q1 - q < PT ? q1 - q : PT;
        int64_t at[PT], pq[PT];
        for (int t = 0; t < PT; t++) { /* pixels past L repeat the last one */
            at[t] = ((oy * op->sh + B - op->ph) * (op->W + 2 * B) + ox * op->sw + B - op->pw) * op->C;
            pq[t] = ((oy + B) * (wo + 2 * B) + ox + B) * O;
            if (q + t + 1 < L && ++ox == wo) ox = 0, oy++;
        }
        if (!op->direct)
            for (int64_t p = 0; p < op->n_planes; p++)
                CAT(gather_hwc_, SUF)((const T *)bufs[op->in_planes[p]], op, at, rows + p * PT * Kp);
        for (int64_t b = 0; b < op->n_tiles; b++) {
            CAT(tile_, SUF)(op, bufs, b, at, rows, Rp, acc);
            const int64_t first = op->tile_first[b];
            (void)first;
#ifdef HAVE_EMIT8
            if (first >= 0 && b + 1 < op->n_tiles && op->tile_first[b + 1] == first + OT) { /* 8 channels */
                int32_t acc2[PT][OT];
                CAT(tile_, SUF)(op, bufs, b + 1, at, rows, Rp, acc2);
                for (int64_t t = 0; t < np; t++) {
                    const __m256i a = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)acc[t])),
                                                              _mm_loadu_si128((const __m128i *)acc2[t]), 1);
                    CAT(emit8_, SUF)(op, bufs, _mm512_cvtepi32_pd(a), b * OT, (q + t) * O + first, pq[t] + first);
                }
                b++;
                continue;
            }
#endif
            for (int64_t t = 0; t < np; t++) {
#ifdef HAVE_EMIT4
                if (first >= 0) { /* OT = 4 consecutive output channels */
                    CAT(emit4_, SUF)(op, bufs, _mm256_cvtepi32_pd(_mm_loadu_si128((const __m128i *)acc[t])), b * OT,
                                     (q + t) * O + first, pq[t] + first);
                    continue;
                }
#endif
                for (int64_t o = 0; o < OT; o++) {
                    const int64_t ch = op->chan[b * OT + o];
                    if (ch >= 0) CAT(emit1_, SUF)(op, bufs, acc[t][o], b * OT + o, (q + t) * O + ch, pq[t] + ch);
                }
            }
        }
    }
}
#undef HAVE_EMIT4
#undef HAVE_EMIT8
