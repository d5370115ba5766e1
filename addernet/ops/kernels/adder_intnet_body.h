/* The integer network's layer step for one lane type, included by adder_int.c with
 *   T (uint8_t or uint16_t), SUF (name suffix), TILE (the PT x OT sum-of-absolute-differences tile).
 * See adder_int.c ("Integer network") for the op descriptor and the buffers. */

/* Rows of the tile's PT pixels (pixel q0+t, the last pixel repeated past L) read from an unpadded
 * channels-last plane [H][W][C]; taps outside the image read 0 (zero padding). */
static void CAT(gather_hwc_, SUF)(const T *x, const intnet_op *op, int64_t q0, T *rows) {
    const int64_t C = op->C, H = op->H, W = op->W, L = op->Ho * op->Wo, Kp = op->Kp;
    for (int t = 0; t < PT; t++) {
        const int64_t q = q0 + t < L ? q0 + t : L - 1, oy = q / op->Wo, ox = q % op->Wo;
        const int64_t x0 = ox * op->sw - op->pw;
        T *r = rows + t * Kp;
        for (int64_t i = 0; i < op->kh; i++) {
            const int64_t y = oy * op->sh - op->ph + i;
            if (y < 0 || y >= H) {
                memset(r, 0, sizeof(T) * (size_t)(op->kw * C));
            } else if (x0 >= 0 && x0 + op->kw <= W) { /* the kw taps of a row are contiguous */
                copy_bytes(r, x + (y * W + x0) * C, sizeof(T) * (size_t)(op->kw * C));
            } else {
                for (int64_t j = 0; j < op->kw; j++) {
                    const int64_t xx = x0 + j;
                    if (xx < 0 || xx >= W) memset(r + j * C, 0, sizeof(T) * (size_t)C);
                    else copy_bytes(r + j * C, x + (y * W + xx) * C, sizeof(T) * (size_t)C);
                }
            }
            r += op->kw * C;
        }
        memset(r, 0, sizeof(T) * (size_t)(Kp - op->kh * op->kw * C));
    }
}

/* Quantised outputs of one value v at element e: clamp(round_half_even(v / s_k), 0, lv). */
static inline void CAT(emit_q1_, SUF)(const intnet_op *op, void **bufs, double v, int64_t e) {
    for (int64_t k = 0; k < op->n_q; k++) {
        double r = nearbyint(v * op->inv[k]);
        r = r < 0 ? 0 : (r > op->lv ? op->lv : r);
        ((T *)bufs[op->q_buf[k]])[e] = (T)r;
    }
}

/* v = alpha * a + beta (+ residual) (ReLU) -> float output and quantised outputs, at element e. */
static inline void CAT(emit1_, SUF)(const intnet_op *op, void **bufs, double a, int64_t slot, int64_t e) {
    double v = fma(op->alpha[slot], a, op->beta[slot]);
    if (op->res_buf >= 0) v += ((const float *)bufs[op->res_buf])[e];
    if (op->relu && v < 0) v = 0;
    if (op->out_buf >= 0) ((float *)bufs[op->out_buf])[e] = (float)v;
    CAT(emit_q1_, SUF)(op, bufs, v, e);
}

#if ISA_AVX2
/* The same for 4 consecutive elements e..e+3 (slots slot..slot+3), in double lanes: the results
 * equal emit1's exactly (fma is correctly rounded either way). */
static inline void CAT(emit4_, SUF)(const intnet_op *op, void **bufs, __m256d a, int64_t slot, int64_t e) {
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
        T *dst = (T *)bufs[op->q_buf[k]] + e;
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

/* One op over the output pixels [q0, q1) of one image (q0 a multiple of PT for adder layers). */
static void CAT(run_op_, SUF)(const intnet_op *op, void **bufs, int64_t q0, int64_t q1, T *rows) {
    if (op->kind == OP_ENTRY) { /* per-channel affine (folded BatchNorm), ReLU, float copy, quantise */
        const float *x = bufs[op->in_buf];
        for (int64_t p = q0; p < q1; p++) {
            int64_t c = 0;
#ifdef HAVE_EMIT4
            for (; c + 4 <= op->C; c += 4)
                CAT(emit4_, SUF)(op, bufs, _mm256_cvtps_pd(_mm_loadu_ps(x + p * op->C + c)), c, p * op->C + c);
#endif
            for (; c < op->C; c++) CAT(emit1_, SUF)(op, bufs, x[p * op->C + c], c, p * op->C + c);
        }
        return;
    }
    const int64_t O = op->O, Kp = op->Kp;
    const T *w = op->w;
    int32_t acc[PT][OT];
    for (int64_t q = q0; q < q1; q += PT) {
        const int64_t np = q1 - q < PT ? q1 - q : PT;
        for (int64_t p = 0; p < op->n_planes; p++)
            CAT(gather_hwc_, SUF)((const T *)bufs[op->in_planes[p]], op, q, rows + p * PT * Kp);
        for (int64_t b = 0; b < op->n_tiles; b++) {
            TILE(rows + op->tile_plane[b] * PT * Kp, w + b * OT * Kp, Kp, acc);
            const int64_t first = op->tile_first[b];
            for (int64_t t = 0; t < np; t++) {
#ifdef HAVE_EMIT4
                if (first >= 0) { /* OT = 4 consecutive output channels */
                    CAT(emit4_, SUF)(op, bufs, _mm256_cvtepi32_pd(_mm_loadu_si128((const __m128i *)acc[t])), b * OT,
                                     (q + t) * O + first);
                    continue;
                }
#endif
                for (int64_t o = 0; o < OT; o++) {
                    const int64_t ch = op->chan[b * OT + o];
                    if (ch >= 0) CAT(emit1_, SUF)(op, bufs, acc[t][o], b * OT + o, (q + t) * O + ch);
                }
            }
        }
    }
}
#undef HAVE_EMIT4
