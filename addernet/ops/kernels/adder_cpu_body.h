/* Body of the adder CPU kernels, included by adder_cpu.c once per element type T (suffix SUF,
 * integer type IT of the same width, VL lanes per vector). The layer's shape comes as an
 * adder_geometry (geometry.h; Cgp and Opad are multiples of VL, Kp is unused).
 * Tensor strides (xs, ys, gs, gxs) are in elements, so NCHW and channels-last both work. */

typedef T FN(vec_t) __attribute__((vector_size(VBYTES)));
typedef IT FN(ivec_t) __attribute__((vector_size(VBYTES)));
#define VEC FN(vec_t)
#define IVEC FN(ivec_t)

/* VMIN(a, b) = a < b ? a : b and VMAX(a, b) = a > b ? a : b per lane, as x86's minps / maxps: when a lane of
 * either is NaN, the lane of b. Callers pass the value that may be NaN as b, so that it propagates. */
#ifndef VMIN /* portable select fallback (no AVX): slower but correct on any target */
#define VMIN(a, b) ((VEC)((((IVEC)((a) < (b))) & (IVEC)(a)) | (~((IVEC)((a) < (b))) & (IVEC)(b))))
#define VMAX(a, b) ((VEC)((((IVEC)((a) > (b))) & (IVEC)(a)) | (~((IVEC)((a) > (b))) & (IVEC)(b))))
#endif

#if defined(VFMA) && ADDERNET_SUB_ON_FMA /* a + nb (nb = -b) as fma(a, one, nb): same rounding, on the FMA pipes */
#define VSUBN(a, nb, one) VFMA(a, one, nb)
#define VACC(acc, m, one) VFMA(m, one, acc) /* acc + m on the FMA pipes */
#else
#define VSUBN(a, nb, one) ((a) + (nb))
#define VACC(acc, m, one) ((acc) + (m))
#endif

/* The forward sums min(x, w) where a vector min instruction exists (AVX2, AVX-512): see fwd_tile. */
#if defined(VFMA)
#define FWD_MIN 1
#else
#define FWD_MIN 0
#endif

/* (VEC) 1 hidden from the optimiser, which would otherwise fold fma(a, 1, b) back into a + b. */
static inline VEC FN(opaque_one)(void) {
    VEC one = (VEC){0} + 1;
#if defined(VFMA) && ADDERNET_SUB_ON_FMA && defined(ADDERNET_EMULATE_AVX512)
    __asm__("" : "+m"(one)); /* emulated AVX-512: a 64-byte vector is no register of the AVX2 target */
#elif defined(VFMA) && ADDERNET_SUB_ON_FMA
    __asm__("" : "+v"(one));
#endif
    return one;
}

static inline VEC FN(ld)(const T *p) { VEC v; memcpy(&v, p, sizeof v); return v; }
static inline void FN(st)(T *p, VEC v) { memcpy(p, &v, sizeof v); }
static inline VEC FN(vabs)(VEC v) {
    const IVEC m = (IVEC){0} + (IT)(((uint64_t)1 << (8 * sizeof(T) - 1)) - 1);
    return (VEC)((IVEC)v & m);
}

/* Zero groups g0..g1-1 of the channels-last scratch buf[Hp][Wp][G][Cgp]: a thread's share of it. */
static void FN(zero_groups)(const adder_geometry *s, T *buf, int64_t g0, int64_t g1) {
    const int64_t pixels = (s->H + 2 * s->ph) * (s->W + 2 * s->pw), Ct = s->G * s->Cgp;
    if (g1 - g0 == s->G) { /* all groups: one contiguous block */
        memset(buf, 0, sizeof(T) * (size_t)(pixels * Ct));
        return;
    }
    for (int64_t q = 0; q < pixels; q++) memset(buf + q * Ct + g0 * s->Cgp, 0, sizeof(T) * (size_t)((g1 - g0) * s->Cgp));
}

/* Copy channels c0..c1-1 of one image (x already offset to it) into the interior of a zero-bordered copy buf with
 * channel, row and pixel strides cs, rs, ps (the border is not written). */
static void FN(copy_interior)(const T *x, const int64_t *xs, const adder_geometry *s, T *buf, int64_t cs, int64_t rs,
                              int64_t ps, int64_t c0, int64_t c1) {
    const int64_t H = s->H, W = s->W;
    T *b = buf + s->ph * rs + s->pw * ps;
    if (cs == 1 && xs[1] == 1) /* channels-last into channels-last: a run of channels per pixel */
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++) {
                const T *src = x + h * xs[2] + w * xs[3];
                T *dst = b + h * rs + w * ps;
                for (int64_t c = c0; c < c1; c++) dst[c] = src[c];
            }
    else if (ps == 1 && xs[3] == 1) /* planes into planes: a run of pixels per row */
        for (int64_t c = c0; c < c1; c++)
            for (int64_t h = 0; h < H; h++) {
                const T *src = x + c * xs[1] + h * xs[2];
                T *dst = b + c * cs + h * rs;
                for (int64_t w = 0; w < W; w++) dst[w] = src[w];
            }
    else /* a transpose (NCHW into channels-last), in blocks of 16 pixels so that both sides touch few cache lines
          * (a plain channel-major or pixel-major loop thrashes L1 on 4 KiB-strided NCHW planes) */
        for (int64_t h = 0; h < H; h++)
            for (int64_t w0 = 0; w0 < W; w0 += 16) {
                const int64_t w1 = W - w0 < 16 ? W : w0 + 16;
                int64_t cv = c0, wv = w0; /* channels c0..cv-1 of pixels w0..wv-1 copied in blocks */
#ifdef TRANSPOSE_BLOCK /* 8 channels x 8 pixels transposed in registers */
                if (cs == 1 && xs[3] == 1) {
                    cv = c0 + (c1 - c0) / 8 * 8, wv = w0 + (w1 - w0) / 8 * 8;
                    for (int64_t c = c0; c < cv; c += 8)
                        for (int64_t v = w0; v < wv; v += 8)
                            TRANSPOSE_BLOCK(x + c * xs[1] + h * xs[2] + v, xs[1], b + h * rs + v * ps + c, ps);
                }
#endif
                for (int64_t c = c0; c < c1; c++) {
                    const T *src = x + c * xs[1] + h * xs[2];
                    T *dst = b + c * cs + h * rs;
                    for (int64_t w = c < cv ? wv : w0; w < w1; w++) dst[w * ps] = src[w * xs[3]];
                }
            }
}

/* Copy groups g0..g1-1 of one image (x already offset to it) into zero-padded channels-last scratch
 * buf[Hp][Wp][G][Cgp]; channels Cg..Cgp-1 of those groups are zero, the other groups are not written. */
static void FN(pad_image)(const T *x, const int64_t *xs, const adder_geometry *s, T *buf, int64_t g0, int64_t g1) {
    const int64_t Cg = s->Cg, Cgp = s->Cgp, Ct = s->G * Cgp, Wp = s->W + 2 * s->pw, ph = s->ph, pw = s->pw;
    if (Cgp == Cg && g1 - g0 == s->G) { /* the copy writes the interior: zero the border only (rows, then columns) */
        const int64_t H = s->H, row = Wp * Ct;
        memset(buf, 0, sizeof(T) * (size_t)(ph * row));
        memset(buf + (ph + H) * row, 0, sizeof(T) * (size_t)(ph * row));
        for (int64_t h = ph; h < ph + H && pw; h++) {
            memset(buf + h * row, 0, sizeof(T) * (size_t)(pw * Ct));
            memset(buf + h * row + (pw + s->W) * Ct, 0, sizeof(T) * (size_t)(pw * Ct));
        }
    } else if (ph || pw || Cgp > Cg)
        FN(zero_groups)(s, buf, g0, g1); /* else the copy writes every element */
    for (int64_t g = g0; g < g1; g++) FN(copy_interior)(x + g * Cg * xs[1], xs, s, buf + g * Cgp, 1, Wp * Ct, Ct, 0, Cg);
}

/* Whether an image with strides ts (in elements) already has the scratch layout [H][W][G][Cgp] (channels-last,
 * no padding, no channel padding): the kernels then read x, or write gx, in place instead of through a copy. */
static int FN(is_scratch)(const int64_t *ts, const adder_geometry *s) {
    const int64_t Ct = s->G * s->Cgp;
    return !s->ph && !s->pw && s->Cgp == s->Cg && ts[1] == 1 && (s->W == 1 || ts[3] == Ct) &&
           (s->H == 1 || ts[2] == s->W * Ct);
}

/* Per-pixel offsets, computed once per call: xo[q] into the image read (row stride rs, pixel stride ps) and to[q]
 * into the output / output-gradient tensor (strides ts) for q < L = Ho*Wo; entries L..L+P-1 repeat the last
 * pixel so the micro-kernels can always read a full tile. Returns xo; to = xo + L + P. */
static int64_t *FN(pixel_offsets)(const adder_geometry *s, int64_t rs, int64_t ps, const int64_t *ts, int P) {
    const int64_t Wo = s->Wo, L = s->Ho * Wo;
    int64_t *xo = malloc(sizeof(int64_t) * 2 * (size_t)(L + P));
    if (!xo) return NULL;
    for (int64_t q = 0; q < L + P; q++) {
        const int64_t r = q < L ? q : L - 1, oy = r / Wo, ox = r % Wo;
        xo[q] = oy * s->sh * rs + ox * s->sw * ps;
        xo[L + P + q] = oy * ts[2] + ox * ts[3];
    }
    return xo;
}

#define FWD_DIRECT 0     /* the direct form, weights packed negated */
#define FWD_MIN_SUMS 1   /* the min form, weights packed as they are */
#define FWD_DIRECT_POS 2 /* the direct form, weights packed as they are */

/* Forward micro-kernel for P pixels x V*VL output channels of the packed weight: in MODE FWD_MIN_SUMS (weights w),
 * acc[p][v] = sum_{i,j,c} min(x, w), which fwd_combine turns into -sum |x - w| = 2 sum min(x, w) - sum x - sum w; in
 * FWD_DIRECT (weights -w) and FWD_DIRECT_POS (weights w: a min-form layer's tile whose sums are not finite),
 * acc[p][v] = sum_{i,j,c} |x - w| (sub, abs, add). A min and an add per term, one on each pair of pipes (VACC: the
 * add on the FMA pipes of an AMD core), against a sub, an and and an add: the forward of ResNet-20's 3x3 layers ran
 * 1.14-1.26x as fast on a Zen 3 (docs/adder_layer.md). min(x, w) is exact, so the rewrite's float32 error stays within
 * a small factor of the direct sum's where x is large against w (post-ReLU inputs), which 2 max(x, w) - x - w does
 * not. */
static inline __attribute__((always_inline)) void FN(fwd_tile)(
    const T *buf, const int64_t *off, const T *wt, const adder_geometry *s, int64_t ob, VEC (*out)[2],
    const int P, const int V, const int64_t cs, const int64_t di, const int64_t dj, const int MODE) {
    const int64_t Cg = s->Cg, kh = s->kh, kw = s->kw;
    VEC acc[FWD_P1][2];
    const VEC one = FN(opaque_one)();
#pragma GCC unroll 32
    for (int p = 0; p < P; p++)
#pragma GCC unroll 2
        for (int v = 0; v < V; v++) out[p][v] = (VEC){0};
    for (int64_t i = 0; i < kh; i++)
        for (int64_t j = 0; j < kw; j++) {
            const T *xb = buf + i * di + j * dj;
            const T *wb = wt + ob * kh * kw * Cg + (i * kw + j) * Cg * V * VL;
            /* two-level sum: registers over at most FWD_KC channels, then into `out`, so that
             * rounding grows with FWD_KC + K/FWD_KC terms instead of K (matches the unfold
             * reference's accuracy) for one extra add per FWD_KC steps */
            for (int64_t c0 = 0; c0 < Cg; c0 += FWD_KC) {
                const int64_t c1 = Cg - c0 < FWD_KC ? Cg : c0 + FWD_KC;
#pragma GCC unroll 32
                for (int p = 0; p < P; p++)
#pragma GCC unroll 2
                    for (int v = 0; v < V; v++) acc[p][v] = (VEC){0};
                for (int64_t c = c0; c < c1; c++) {
                    VEC wv[2]; /* w, or -w for the direct form's x + (-w) (fma(x, 1, -w) on AMD: "Port balance") */
#pragma GCC unroll 2
                    for (int v = 0; v < V; v++) {
                        wv[v] = FN(ld)(wb + (c * V + v) * VL);
                        if (MODE == FWD_DIRECT_POS) wv[v] = -wv[v];
                    }
#pragma GCC unroll 32
                    for (int p = 0; p < P; p++) {
                        const VEC xv = xb[off[p] + c * cs] - (VEC){0}; /* broadcast (x - 0 folds away) */
#pragma GCC unroll 2
                        for (int v = 0; v < V; v++)
                            if (FWD_MIN && MODE == FWD_MIN_SUMS) /* x is the second operand: a NaN in x stays NaN */
                                acc[p][v] = VACC(acc[p][v], VMIN(wv[v], xv), one);
                            else
                                acc[p][v] += FN(vabs)(VSUBN(xv, wv[v], one));
                    }
                }
#pragma GCC unroll 32
                for (int p = 0; p < P; p++)
#pragma GCC unroll 2
                    for (int v = 0; v < V; v++) out[p][v] += acc[p][v];
            }
        }
}

/* y = -acc for the n valid pixels and the valid channels of this block: whole vectors when the
 * output is channels-last (channel stride 1: AdderLinear's rows), runs of 8 pixels per channel transposed in
 * registers when the pixels are consecutive in y (float, with AVX2 or AVX-512: adder_cpu.c), else one element at a
 * time. */
static void FN(fwd_tile_store)(VEC (*acc)[2], int V, int64_t n, const int64_t *to, T *y,
                               const int64_t *ys, const adder_geometry *s, int64_t ob) {
    const int64_t no = s->Og - ob < V * VL ? s->Og - ob : V * VL; /* valid channels in this block */
#ifdef STORE_RUNS
    if (ys[1] != 1 && ys[3] == 1 && to[n - 1] - to[0] == n - 1) {
        for (int v = 0; v * VL < no; v++)
            for (int64_t p0 = 0; p0 < n; p0 += 8) {
                const T *rows[8];
                for (int64_t p = 0; p < 8; p++) rows[p] = (const T *)&acc[p0 + p < n ? p0 + p : n - 1][v];
                STORE_RUNS(rows, y + (ob + v * VL) * ys[1] + to[p0], ys[1], n - p0 < 8 ? (int)(n - p0) : 8,
                           no - v * VL < VL ? (int)(no - v * VL) : VL);
            }
        return;
    }
#endif
    int64_t k0 = 0;
    if (ys[1] == 1)
        for (; k0 + VL <= no; k0 += VL)
            for (int64_t p = 0; p < n; p++) FN(st)(y + ob + k0 + to[p], -acc[p][k0 / VL]);
    for (int64_t k = k0; k < no; k++) {
        T *yo = y + (ob + k) * ys[1];
        for (int64_t p = 0; p < n; p++) yo[to[p]] = -acc[p][k / VL][k % VL];
    }
}

/* The forward's tiles for a channel stride other than 1 (an image read plane by plane), out of line: inlined beside
 * the channels-last tiles they cost those 8-10% with AVX2 code (register allocation of the shared function). */
#define FWD_OUT_OF_LINE(name, P, V, MODE)                                                                              \
    static __attribute__((noinline)) void FN(name)(const T *buf, const int64_t *off, const T *wt,                      \
                                                   const adder_geometry *s, int64_t ob, VEC (*out)[2], const int64_t cs, \
                                                   const int64_t di, const int64_t dj) {                               \
        FN(fwd_tile)(buf, off, wt, s, ob, out, P, V, cs, di, dj, MODE);                                                \
    }
FWD_OUT_OF_LINE(fwd_tile_planes1, FWD_P1, 1, FWD_DIRECT)
FWD_OUT_OF_LINE(fwd_tile_planes2, FWD_P2, 2, FWD_DIRECT)
#if FWD_MIN
FWD_OUT_OF_LINE(fwd_tile_planes1_min, FWD_P1, 1, FWD_MIN_SUMS)
FWD_OUT_OF_LINE(fwd_tile_planes2_min, FWD_P2M, 2, FWD_MIN_SUMS)
FWD_OUT_OF_LINE(fwd_tile_planes1_pos, FWD_P1, 1, FWD_DIRECT_POS)
FWD_OUT_OF_LINE(fwd_tile_planes2_pos, FWD_P2, 2, FWD_DIRECT_POS)
/* and the channels-last tiles of the min form, out of line too: inlined as well, they slowed the direct form's
 * channels-last tiles (AdderLinear's) by 6-10% */
FWD_OUT_OF_LINE(fwd_tile_last1_min, FWD_P1, 1, FWD_MIN_SUMS)
FWD_OUT_OF_LINE(fwd_tile_last2_min, FWD_P2M, 2, FWD_MIN_SUMS)
FWD_OUT_OF_LINE(fwd_tile_last1_pos, FWD_P1, 1, FWD_DIRECT_POS)
FWD_OUT_OF_LINE(fwd_tile_last2_pos, FWD_P2, 2, FWD_DIRECT_POS)
#endif
#undef FWD_OUT_OF_LINE

/* A min-form tile's sums of min(x, w) -> sum x + sum w - 2 sum min(x, w) = sum |x - w| (fwd_tile_store negates it), from
 * the pixels' patch sums sx and the block's weight sums sw. */
static inline void FN(fwd_combine)(VEC (*acc)[2], int P, int V, const T *sx, const T *sw) {
    for (int p = 0; p < P; p++)
        for (int v = 0; v < V; v++) acc[p][v] = (sx[p] + FN(ld)(sw + v * VL)) - (acc[p][v] + acc[p][v]);
}

/* sx[q - q0] = the sum of output pixel q's patch (every tap and channel of the group, the zero border included) for
 * q0 <= q < q1, then the last one repeated FWD_P1 times (a tile's pixels past q1 repeat it too), through the sum over
 * the group's channels of each pixel of the image read (col, Hr x Wr pixels with strides cs, rs, ps), in double and in
 * the same order for either layout (channel by channel, then tap by tap), so both give the same bits; row is scratch
 * for Wo doubles. */
static void FN(patch_sums)(const T *bg, int64_t cs, int64_t rs, int64_t ps, int64_t Hr, int64_t Wr,
                           const adder_geometry *s, int64_t q0, int64_t q1, double *col, double *row, T *sx) {
    const int64_t Cg = s->Cg, Wo = s->Wo;
    if (cs == 1) /* channels-last: a pixel's channels are a run */
        for (int64_t h = 0; h < Hr; h++)
            for (int64_t w = 0; w < Wr; w++) {
                const T *px = bg + h * rs + w * ps;
                double t = px[0];
                for (int64_t c = 1; c < Cg; c++) t += px[c];
                col[h * Wr + w] = t;
            }
    else /* planes: a row of a plane at a time (the loops for consecutive pixels written out, so that they vectorise) */
        for (int64_t h = 0; h < Hr; h++) {
            double *o = col + h * Wr;
            const T *r = bg + h * rs;
            if (ps == 1) {
                for (int64_t w = 0; w < Wr; w++) o[w] = r[w];
                for (int64_t c = 1; c < Cg; c++)
                    for (int64_t w = 0; w < Wr; w++) o[w] += r[c * cs + w];
                continue;
            }
            for (int64_t w = 0; w < Wr; w++) o[w] = r[w * ps];
            for (int64_t c = 1; c < Cg; c++)
                for (int64_t w = 0; w < Wr; w++) o[w] += r[c * cs + w * ps];
        }
    for (int64_t q = q0; q < q1;) { /* along output rows */
        const int64_t oy = q / Wo, ox0 = q % Wo, n = Wo - ox0 < q1 - q ? Wo - ox0 : q1 - q;
        const double *c0 = col + oy * s->sh * Wr + ox0 * s->sw;
        int64_t k0 = 0;
        /* 8 pixels' sums in registers over the taps (through row in memory: a chain of loads and stores) */
        if (s->sw == 1)
            for (; k0 + 8 <= n; k0 += 8) {
                double t[8] = {0};
                for (int64_t i = 0; i < s->kh; i++)
                    for (int64_t j = 0; j < s->kw; j++)
                        for (int k = 0; k < 8; k++) t[k] += c0[i * s->dh * Wr + j * s->dw + k0 + k];
                for (int k = 0; k < 8; k++) row[k0 + k] = t[k];
            }
        for (int64_t k = k0; k < n; k++) row[k] = 0;
        for (int64_t i = 0; i < s->kh; i++)
            for (int64_t j = 0; j < s->kw; j++)
                for (int64_t k = k0; k < n; k++) row[k] += c0[i * s->dh * Wr + j * s->dw + k * s->sw];
        for (int64_t k = 0; k < n; k++) sx[q - q0 + k] = (T)row[k];
        q += n;
    }
    for (int64_t k = 0; k < FWD_P1; k++) sx[q1 - q0 + k] = sx[q1 - q0 - 1];
}

/* sw[o] = sum_k w[o, k] for the Opad output channels of one group's packed weight wg (blocks of 2*VL channels, the
 * last one VL wide when Opad is an odd multiple of VL, each [K][block width]), in double. Returns 1 when every sum is
 * finite. */
static int FN(weight_sums)(const T *wg, int64_t K, int64_t Opad, double *acc, T *sw) {
    int finite = 1;
    for (int64_t ob = 0; ob < Opad;) {
        const int64_t width = ob + 2 * VL <= Opad ? 2 * VL : VL;
        const T *b = wg + ob * K;
        for (int64_t l = 0; l < width; l++) acc[l] = 0;
        for (int64_t k = 0; k < K; k++)
            for (int64_t l = 0; l < width; l++) acc[l] += b[k * width + l];
        for (int64_t l = 0; l < width; l++) {
            sw[ob + l] = (T)acc[l];
            finite &= isfinite(sw[ob + l]) != 0;
        }
        ob += width;
    }
    return finite;
}

#define PV_OGP(s) (((s)->Og + FWD_PO - 1) / FWD_PO * FWD_PO) /* output channels of pv_weight's rows */
#define PK_OGP(s) (((s)->Og + FWD_PK - 1) / FWD_PK * FWD_PK) /* output channels of pk_tile's weight rows */
#if defined(VFMA) /* AVX2, AVX-512 */
#define FWD_PV 1
/* A 1x1 layer on NCHW planes, vectorised along the pixels instead of the output channels: PO output channels x 2*VL
 * consecutive pixels, acc[k][v] = sum_c |x[c, pixels] - w[o0 + k, c]| with the weight (negated: the direct form)
 * broadcast and the pixels loaded as whole vectors from their plane, so the output is stored as whole vectors of its
 * planes instead of being transposed from channel vectors; the same terms summed in the same order (FWD_KC channels in
 * registers, then into the output) as fwd_tile, so the same bits. xp: channel 0 of the first pixel (channel stride
 * xcs); wp: w(-)[o0, c = 0] with channel stride wcs, its PO output channels consecutive (pv_weight); yp: y[o0, first
 * pixel] with channel stride ycs; no <= PO: the valid output channels. */
static inline __attribute__((always_inline)) void FN(pv_tile)(const T *xp, int64_t xcs, const T *wp, int64_t wcs,
                                                             int64_t Cg, T *yp, int64_t ycs, int64_t no, const int PO) {
    VEC acc[FWD_PO][2];
    for (int64_t c0 = 0; c0 < Cg; c0 += FWD_KC) {
        const int64_t c1 = Cg - c0 < FWD_KC ? Cg : c0 + FWD_KC;
#pragma GCC unroll 16
        for (int k = 0; k < PO; k++) acc[k][0] = acc[k][1] = (VEC){0};
        for (int64_t c = c0; c < c1; c++) {
            const VEC x0 = FN(ld)(xp + c * xcs), x1 = FN(ld)(xp + c * xcs + VL);
#pragma GCC unroll 16
            for (int k = 0; k < PO; k++) {
                const VEC nw = wp[c * wcs + k] - (VEC){0}; /* broadcast */
                acc[k][0] += FN(vabs)(x0 + nw); /* a plain add: the FMA form overwrites x and costs a copy */
                acc[k][1] += FN(vabs)(x1 + nw);
            }
        }
        for (int k = 0; k < no; k++) /* the running sum lives in y: out + acc as fwd_tile adds it, negated at the end */
            for (int v = 0; v < 2; v++) {
                T *yv = yp + k * ycs + v * VL;
                const VEC t = c0 ? FN(ld)(yv) + acc[k][v] : acc[k][v];
                FN(st)(yv, c1 == Cg ? -t : t);
            }
    }
}

/* pv_tile over the pixels off[0..nq-1] (nq a multiple of 2*VL, offsets into the group's image bg of channel stride cs)
 * of one image and group, every output channel, 2*VL pixels at a time: copied into xc (Cg x 2*VL) unless consecutive
 * in x (gather = 0), and the next 2*VL pixels' cache lines prefetched meanwhile (the copy stalled on them: a strided
 * view's image is read from beyond L2). */
static void FN(pv_pixels)(const T *bg, int64_t cs, const int64_t *off, int gather, T *xc, const T *wpv,
                          const adder_geometry *s, T *yg, int64_t ycs, int64_t nq) {
    const int64_t Cg = s->Cg, Og = s->Og, Ogp = PV_OGP(s);
    for (int64_t q = 0; q < nq; q += 2 * VL) {
        if (q + 2 * VL < nq)
            for (int64_t c = 0; c < Cg; c++)
                for (int k = 0; k < 2 * VL; k += VL / 2) __builtin_prefetch(bg + c * cs + off[q + 2 * VL + k]);
        if (gather)
            for (int64_t c = 0; c < Cg; c++)
                for (int k = 0; k < 2 * VL; k++) xc[c * 2 * VL + k] = bg[c * cs + off[q + k]];
        const T *xp = gather ? xc : bg + off[q];
        const int64_t xcs = gather ? 2 * VL : cs;
        for (int64_t o0 = 0; o0 < Og; o0 += FWD_PO)
            FN(pv_tile)(xp, xcs, wpv + o0, Ogp, Cg, yg + o0 * ycs + q, ycs, Og - o0 < FWD_PO ? Og - o0 : FWD_PO, FWD_PO);
    }
}
/* wpv[k][o] = the packed weight wg of one group (adder_forward: negated for the direct form), k over the K = kh*kw*Cg
 * (tap, channel) pairs, Og output channels padded to Ogp. */
static void FN(pv_weight)(const T *wg, const adder_geometry *s, int64_t Ogp, T *wpv) {
    const int64_t K = s->kh * s->kw * s->Cg, Og = s->Og, Opad = s->Opad;
    for (int64_t o = 0; o < Ogp; o++) {
        const int64_t blk = o / (2 * VL) * (2 * VL), width = blk + 2 * VL <= Opad ? 2 * VL : VL;
        for (int64_t k = 0; k < K; k++) wpv[k * Ogp + o] = o < Og ? wg[blk * K + k * width + (o - blk)] : 0;
    }
}

/* pk_tile's two vectors of one output channel (at offset o from ya and yb) into the running sum in y (first: the
 * sum so far is none), and with the last tap combined into -sum |x - w| (fwd_combine's arithmetic). */
static inline __attribute__((always_inline)) void FN(pk_store)(const VEC *acc, T *ya, T *yb, int64_t o, int first,
                                                              int last, const T *sxa, const T *sxb, T swk) {
    for (int v = 0; v < 2; v++) {
        T *yv = (v ? yb : ya) + o;
        VEC r = first ? acc[v] : FN(ld)(yv) + acc[v];
        if (last) r = -((FN(ld)(v ? sxb : sxa) + (swk - (VEC){0})) - (r + r));
        FN(st)(yv, r);
    }
}

/* A min-form layer (more than one tap) on NCHW planes, vectorised along the pixels as pv_tile is: FWD_PK output
 * channels x 2 vectors of VL consecutive pixels of an output row each, the weight broadcast and each vector of pixels
 * loaded whole from its plane at every tap, the output stored as whole vectors of its planes. fwd_tile's register tile
 * instead broadcasts every pixel through its own pointer, which on 16-channel planes ran at about 40% of the min form's
 * peak. The same terms in the same order as fwd_tile (tap by tap, FWD_KC channels in registers, then into the running
 * sum, kept in y) and fwd_combine's combination, so the same bits. xa, xb: the two vectors' first pixels at tap (0, 0),
 * channel 0 (channel stride cs); tap: the taps' offsets; wp: w[o0] at tap 0, channel 0, stride Ogp per (tap,
 * channel); ya, yb: the outputs of channel o0 (channel stride ycs); sxa, sxb: the pixels' patch sums; sw: the output
 * channels' weight sums; no <= FWD_PK: the valid output channels. */
static inline __attribute__((always_inline)) void FN(pk_tile)(const T *xa, const T *xb, int64_t cs, const int64_t *tap,
                                                             int64_t taps, const T *wp, int64_t Ogp, int64_t Cg, T *ya,
                                                             T *yb, int64_t ycs, const T *sxa, const T *sxb,
                                                             const T *sw, int64_t no) {
    VEC acc[FWD_PK][2];
    const VEC one = FN(opaque_one)();
    for (int64_t t = 0; t < taps; t++) {
        const T *a = xa + tap[t], *b = xb + tap[t], *wt = wp + t * Cg * Ogp;
        for (int64_t c0 = 0; c0 < Cg; c0 += FWD_KC) {
            const int64_t c1 = Cg - c0 < FWD_KC ? Cg : c0 + FWD_KC;
#pragma GCC unroll 16
            for (int k = 0; k < FWD_PK; k++) acc[k][0] = acc[k][1] = (VEC){0};
            for (int64_t c = c0; c < c1; c++) {
                const VEC x0 = FN(ld)(a + c * cs), x1 = FN(ld)(b + c * cs);
#pragma GCC unroll 16
                for (int k = 0; k < FWD_PK; k++) {
                    const VEC wv = wt[c * Ogp + k] - (VEC){0}; /* broadcast; x the second operand of min: NaN stays */
                    acc[k][0] = VACC(acc[k][0], VMIN(wv, x0), one);
                    acc[k][1] = VACC(acc[k][1], VMIN(wv, x1), one);
                }
            }
            const int first = t == 0 && c0 == 0, last = t == taps - 1 && c1 == Cg;
            /* unrolled, so that acc stays in registers (a loop to no spilled it to the stack after every tap) */
#pragma GCC unroll 16
            for (int k = 0; k < FWD_PK; k++)
                if (k < no) FN(pk_store)(acc[k], ya, yb, k * ycs, first, last, sxa, sxb, sw[k]);
        }
    }
}

/* pk_tile over the output pixels q = 0, 2*VL, ... < nq of one image and group (off, to: their offsets into the image
 * read, bg, and the output, yg; sx their patch sums), every output channel. Out of line, so that adder_forward's code
 * for the other layers stays as it was (inlined, the 1x1 forward measured 2-4% slower in medians, within noise). */
static __attribute__((noinline)) void FN(pk_pixels)(const T *bg, int64_t cs, const int64_t *off, const int64_t *to,
                                                    const int64_t *tap, const T *wpk, const adder_geometry *s, T *yg,
                                                    int64_t ycs, const T *sx, const T *sw, int64_t nq) {
    const int64_t Cg = s->Cg, Og = s->Og, Ogp = PK_OGP(s), taps = s->kh * s->kw;
    for (int64_t q = 0; q < nq; q += 2 * VL)
        for (int64_t o0 = 0; o0 < Og; o0 += FWD_PK)
            FN(pk_tile)(bg + off[q], bg + off[q + VL], cs, tap, taps, wpk + o0, Ogp, Cg, yg + o0 * ycs + to[q],
                        yg + o0 * ycs + to[q + VL], ycs, sx + q, sx + q + VL, sw + o0,
                        Og - o0 < FWD_PK ? Og - o0 : FWD_PK);
}
#else
#define FWD_PV 0
#endif

/* Layers that take the min form: those with more than one tap. A 1x1 layer's patch sums cost as much as the min form
 * saves (with it, ResNet-20's 1x1 stride-2 shortcuts ran 0.89-0.95x as fast and AdderLinear's forward 0.89-1.08x, Zen
 * 3). */
#define MIN_FORM(s) ((s)->kh * (s)->kw > 1)

/* 1 when the forward of this layer takes the min form: its weights are then packed as they are, else negated. */
int FN(adder_forward_min_form)(const adder_geometry *s) { return FWD_MIN && MIN_FORM(s); }

/* Prefetch the rows of n pixels, len elements each from base + off[p] (to be written, with write): the next tile's,
 * while this one computes. A 1x1 layer read in place (AdderLinear's rows, l1_scores' queries) gets its input from the
 * op before it, out of L2: from a cold cache its forward and input gradient ran at 0.80x and 0.76x their warm speed
 * (an Intel Xeon, 1 thread), and a tile's broadcasts wait on each new line. */
static inline __attribute__((always_inline)) void FN(prefetch_rows)(const T *base, const int64_t *off, int64_t n,
                                                                   int64_t len, const int write) {
    for (int64_t p = 0; p < n; p++)
        for (int64_t c = 0; c < len; c += 64 / (int64_t)sizeof(T)) {
            if (write) __builtin_prefetch(base + off[p] + c, 1, 3);
            else __builtin_prefetch(base + off[p] + c, 0, 3);
        }
}

/* The forward's prefetch of the tile of up to P pixels from q (none from q1 on): their input rows of Cg channels and,
 * with ow > 0, their channels-last output rows of ow elements from y. */
static inline __attribute__((always_inline)) void FN(fwd_prefetch)(const T *bg, const int64_t *xo, T *y,
                                                                  const int64_t *to, int64_t q, int64_t q1, int64_t P,
                                                                  int64_t Cg, int64_t ow) {
    if (q >= q1) return;
    const int64_t n = q1 - q < P ? q1 - q : P;
    FN(prefetch_rows)(bg, xo + q, n, Cg, 0);
    if (ow) FN(prefetch_rows)(y, to + q, n, ow, 1);
}

/* 1 when sx[0..n) are all finite. */
static inline int FN(finite_run)(const T *sx, int64_t n) {
    int finite = 1;
    for (int64_t k = 0; k < n; k++) finite &= isfinite(sx[k]) != 0;
    return finite;
}

/* y[n0:n1, groups g0:g1, pixels q0:q1] = -sum |xpad - w|. wt is the weight w (one per image with wimg), negated when
 * the layer does not take the min form (adder_forward_min_form), packed
 * per group as blocks of 2*VL output channels (the last block VL wide when Opad is an odd multiple of VL), each block
 * [kh][kw][Cg][block width] and starting at element ob*K of the group (zero in Og..Opad-1); y is written through
 * strides ys. Only a tile's broadcasts touch x, so any layout serves: a layer without padding reads x in place through
 * its strides (channels-last, or NCHW up to PLANES_CHANNELS and PLANES_BYTES, a strided view too); a padded one reads a
 * zero-bordered copy of each image in the input's own order (runs of channels or of pixels: no transpose), and a large
 * NCHW image is copied channels-last. Returns 0, or 1 when scratch memory cannot be allocated. */
int FN(adder_forward)(const T *x, const int64_t *xs, const T *wt, T *y, const int64_t *ys,
                      const adder_geometry *s, int64_t n0, int64_t n1, int64_t q0, int64_t q1, int64_t g0,
                      int64_t g1) {
    const int64_t G = s->G, C = s->C, Cg = s->Cg, Og = s->Og, kh = s->kh, kw = s->kw, Opad = s->Opad;
    const int64_t Hp = s->H + 2 * s->ph, Wp = s->W + 2 * s->pw;
    const int64_t K = kh * kw * Cg, L = s->Ho * s->Wo;
    /* An image read plane by plane (channel stride > 1) is as many streams as it has channels: many of them defeat
     * the prefetchers (a 256-channel 56x56 image in place ran at 0.6x its channels-last copy), so an image of more
     * than PLANES_CHANNELS channels or PLANES_BYTES is copied channels-last. */
    /* A 1x1 layer without padding from NCHW planes into NCHW planes goes along its pixels (pv_pixels), which reads whole
     * vectors of each plane, so its planes are read in place whatever their number (up to PV_CHANNELS per group). */
    const int pv_layer = FWD_PV && kh == 1 && kw == 1 && !s->ph && !s->pw && xs[1] != 1 && Cg <= PV_CHANNELS &&
                         ys[1] != 1 && ys[3] == 1 && (s->Ho == 1 || ys[2] == s->Wo);
    const int planes = xs[1] != 1 && (pv_layer || (C <= PLANES_CHANNELS &&
                                                   (size_t)(C * s->H * s->W) * sizeof(T) <= PLANES_BYTES));
    const int copy = s->ph || s->pw || !(xs[1] == 1 || planes);
    /* channel, row and pixel strides of the image read: x's own, or the copy's (planes or channels-last) */
    const int64_t cs = !copy ? xs[1] : planes ? Hp * Wp : 1;
    const int64_t ps = !copy ? xs[3] : planes ? 1 : C, rs = !copy ? xs[2] : planes ? Wp : Wp * C;
    const size_t img = copy ? (size_t)(Hp * Wp * C) : 0;
    const int64_t Hr = copy ? Hp : s->H, Wr = copy ? Wp : s->W; /* the pixels of the image read */
    T *buf = calloc(img + 16, sizeof(T)); /* zero: the copy's border stays so */
    int64_t *xo = FN(pixel_offsets)(s, rs, ps, ys, FWD_P1);
    /* the min form's sums: each pixel's over its channels (col), each output pixel's over its patch (sx), each output
     * channel's over its weights (sw, per group; one group's at a time with a weight per image; and sacc, 2*VL lanes
     * summed), and whether each group's weight sums are finite (wfin) */
    const int64_t wgroups = s->wimg ? 1 : G;
    double *col = FWD_MIN ? malloc(sizeof(double) * (size_t)(Hr * Wr + 2 * VL + s->Wo)) : NULL;
    double *sacc = col ? col + Hr * Wr : NULL, *orow = col ? sacc + 2 * VL : NULL;
    T *sx = FWD_MIN ? malloc(sizeof(T) * (size_t)(L + FWD_P1 + wgroups * Opad)) : NULL, *sw = sx ? sx + L + FWD_P1 : NULL;
    int *wfin = FWD_MIN ? malloc(sizeof(int) * (size_t)wgroups) : NULL;
    /* such a layer's scratch (pv_pixels): 2*VL pixels of each channel, then the weight transposed (pv_weight) */
    const int pv = pv_layer && q1 - q0 >= 2 * VL;
    /* a min-form layer of few channels read plane by plane at horizontal stride 1 into NCHW planes, with output rows
     * of whole vectors: pk_pixels, where the sums of x and w are finite; its scratch: the weight transposed, then the
     * taps' offsets */
    const int pk = FWD_PV && MIN_FORM(s) && Cg <= PK_CHANNELS && cs != 1 && ps == 1 && s->sw == 1 && ys[1] != 1 &&
                   ys[3] == 1 && s->Wo % VL == 0 && q0 % VL == 0 && q1 - q0 >= 2 * VL;
    T *pvx = pv ? malloc(sizeof(T) * (size_t)(Cg * 2 * VL + Cg * PV_OGP(s))) : NULL;
    T *pkw = pk ? malloc(sizeof(T) * (size_t)(K * PK_OGP(s)) + sizeof(int64_t) * (size_t)(kh * kw)) : NULL;
    if (!buf || !xo || (FWD_MIN && (!col || !sx || !wfin)) || (pv && !pvx) || (pk && !pkw)) {
        free(buf), free(xo), free(col), free(sx), free(wfin), free(pvx), free(pkw);
        return 1;
    }
    const int64_t *to = xo + L + FWD_P1, di = s->dh * rs, dj = s->dw * ps;
    int64_t *taps = pk ? (int64_t *)(pkw + K * PK_OGP(s)) : NULL;
    for (int64_t i = 0; pk && i < kh; i++)
        for (int64_t j = 0; j < kw; j++) taps[i * kw + j] = i * di + j * dj;
    int pk_ready = 0; /* pkw holds the weight of a layer with one group */
    const int fetch = kh * kw == 1 && !copy && cs == 1; /* a 1x1 layer's channels-last rows, read in place */
    (void)pk_ready, (void)taps;
    VEC acc[FWD_P1][2];
    for (int64_t n = n0; n < n1; n++) {
        const T *img_n = copy ? buf : x + n * xs[0];
        if (copy) FN(copy_interior)(x + n * xs[0], xs, s, buf, cs, rs, ps, g0 * Cg, g1 * Cg);
        for (int64_t g = g0; g < g1; g++) {
            const T *wg = wt + (s->wimg * n * G + g) * K * Opad, *bg = img_n + g * Cg * cs;
            T *yg = y + n * ys[0] + g * (s->ygs ? s->ygs : Og * ys[1]);
            /* the min form where the sums of x and w are finite (else an infinity would cancel into NaN), per tile; the
             * weight sums once per call, or per image with a weight per image */
            const int min_form = FWD_MIN && MIN_FORM(s);
            const int64_t gw = s->wimg ? 0 : g;
            T *swg = min_form ? sw + gw * Opad : NULL;
            int xfin = 0;
            int64_t qs = q0; /* the first pixel of the tiles below */
            if (min_form) {
                if (s->wimg || n == n0) wfin[gw] = FN(weight_sums)(wg, K, Opad, sacc, swg);
                FN(patch_sums)(bg, cs, rs, ps, Hr, Wr, s, q0, q1, col, orow, sx);
                xfin = FN(finite_run)(sx, q1 - q0);
            }
#if FWD_PV
            if (pv) { /* whole vectors of pixels here, the rest (fewer than 2*VL) in the tiles below */
                const int64_t nq = (q1 - q0) / (2 * VL) * (2 * VL);
                /* the pixels copied when they are not consecutive in x (a strided view) */
                const int gather = !(s->sw * ps == 1 && (s->Ho == 1 || s->sh * rs == s->Wo));
                T *wpv = pvx + Cg * 2 * VL;
                if (n == n0 || g1 - g0 > 1 || s->wimg) FN(pv_weight)(wg, s, PV_OGP(s), wpv); /* one group at a time */
                FN(pv_pixels)(bg, cs, xo + q0, gather, pvx, wpv, s, yg + to[q0], ys[1], nq);
                qs = q0 + nq;
            }
            if (pk && xfin && wfin[gw]) {
                const int64_t nq = (q1 - q0) / (2 * VL) * (2 * VL);
                if (!pk_ready || g1 - g0 > 1 || s->wimg) FN(pv_weight)(wg, s, PK_OGP(s), pkw); /* one group's */
                pk_ready = 1;
                FN(pk_pixels)(bg, cs, xo + q0, to + q0, taps, pkw, s, yg, ys[1], sx, swg, nq);
                qs = q0 + nq;
            }
#endif
            int64_t ob = 0;
            for (; ob + 2 * VL <= Opad; ob += 2 * VL) {
                const int bfin = min_form && (wfin[gw] || FN(finite_run)(swg + ob, 2 * VL));
                for (int64_t q = qs, P; q < q1; q += P) {
                    const int mode = !min_form ? FWD_DIRECT
                                     : bfin && (xfin || FN(finite_run)(sx + (q - q0), FWD_P2M)) ? FWD_MIN_SUMS
                                                                                              : FWD_DIRECT_POS;
                    P = mode == FWD_MIN_SUMS ? FWD_P2M : FWD_P2;
                    if (fetch) FN(fwd_prefetch)(bg, xo, yg + ob, to, q + P, q1, P, Cg, ys[1] == 1 ? 2 * VL : 0);
                    if (mode == FWD_DIRECT) {
                        if (cs == 1) FN(fwd_tile)(bg, xo + q, wg, s, ob, acc, FWD_P2, 2, 1, di, dj, FWD_DIRECT);
                        else FN(fwd_tile_planes2)(bg, xo + q, wg, s, ob, acc, cs, di, dj);
                    }
#if FWD_MIN
                    else if (mode == FWD_MIN_SUMS) {
                        if (cs == 1) FN(fwd_tile_last2_min)(bg, xo + q, wg, s, ob, acc, 1, di, dj);
                        else FN(fwd_tile_planes2_min)(bg, xo + q, wg, s, ob, acc, cs, di, dj);
                        FN(fwd_combine)(acc, FWD_P2M, 2, sx + (q - q0), swg + ob);
                    } else if (cs == 1)
                        FN(fwd_tile_last2_pos)(bg, xo + q, wg, s, ob, acc, 1, di, dj);
                    else
                        FN(fwd_tile_planes2_pos)(bg, xo + q, wg, s, ob, acc, cs, di, dj);
#endif
                    FN(fwd_tile_store)(acc, 2, q1 - q < P ? q1 - q : P, to + q, yg, ys, s, ob);
                }
            }
            for (; ob < Opad; ob += VL) {
                const int bfin = min_form && (wfin[gw] || FN(finite_run)(swg + ob, VL));
                for (int64_t q = qs; q < q1; q += FWD_P1) {
                    if (fetch) FN(fwd_prefetch)(bg, xo, yg + ob, to, q + FWD_P1, q1, FWD_P1, Cg, ys[1] == 1 ? VL : 0);
                    const int mode = !min_form ? FWD_DIRECT
                                     : bfin && (xfin || FN(finite_run)(sx + (q - q0), FWD_P1)) ? FWD_MIN_SUMS
                                                                                             : FWD_DIRECT_POS;
                    if (mode == FWD_DIRECT) {
                        if (cs == 1) FN(fwd_tile)(bg, xo + q, wg, s, ob, acc, FWD_P1, 1, 1, di, dj, FWD_DIRECT);
                        else FN(fwd_tile_planes1)(bg, xo + q, wg, s, ob, acc, cs, di, dj);
                    }
#if FWD_MIN
                    else if (mode == FWD_MIN_SUMS) {
                        if (cs == 1) FN(fwd_tile_last1_min)(bg, xo + q, wg, s, ob, acc, 1, di, dj);
                        else FN(fwd_tile_planes1_min)(bg, xo + q, wg, s, ob, acc, cs, di, dj);
                        FN(fwd_combine)(acc, FWD_P1, 1, sx + (q - q0), swg + ob);
                    } else if (cs == 1)
                        FN(fwd_tile_last1_pos)(bg, xo + q, wg, s, ob, acc, 1, di, dj);
                    else
                        FN(fwd_tile_planes1_pos)(bg, xo + q, wg, s, ob, acc, cs, di, dj);
#endif
                    FN(fwd_tile_store)(acc, 1, q1 - q < FWD_P1 ? q1 - q : FWD_P1, to + q, yg, ys, s, ob);
                }
            }
        }
    }
    free(pkw);
    free(pvx);
    free(wfin);
    free(sx);
    free(col);
    free(xo);
    free(buf);
    return 0;
}

/* Input-gradient micro-kernel for GIN_P pixels x VL channels at one kernel tap:
 * acc[p] = sum_o g[p, o] * clamp(w[o, c] - x[p, c], -1, 1), added into the padded grad buffer.
 * The clamp is computed on w - x directly (sub, max, min, fma): the cheaper rewrite
 * clamp(w, x - 1, x + 1) - x cancels against x * sum_o g and loses float32 accuracy. w - x is the
 * second operand of both max and min, so a NaN in x or w stays NaN (HardTanh(NaN) = NaN), at no cost.
 * With wgrad, the same operands also give the weight gradient's product term: dw[o, c] += sum_p g[p, o] x[p, c]
 * (one FMA per term more, in place of a separate convolution weight-gradient pass over x and g). */
static inline __attribute__((always_inline)) void FN(gin_rows)(const VEC nx[GIN_P], VEC acc[GIN_P], const T *wb,
                                                              const T *gt, int64_t gos, int64_t Og, T *dwb,
                                                              const int wgrad, const int RANGE) {
    (void)RANGE; /* without VCLAMP1 */
    const VEC one = (VEC){0} + 1, mone = (VEC){0} - 1, one_h = FN(opaque_one)();
    for (int64_t o = 0; o < Og; o++) {
        const VEC wv = FN(ld)(wb + o * VL);
        const T *go = gt + o * gos; /* g[p, o] = go[p]: packed, or the tensor's pixels read in place */
#pragma GCC unroll 32
        for (int p = 0; p < GIN_P; p++) {
            /* with wgrad the product term's FMAs fill the FMA pipes, so w - x is a plain add there ("Port balance"
             * in adder_cpu.c; both forms give the same bits) */
            const VEC d = wgrad ? wv + nx[p] : VSUBN(wv, nx[p], one_h);
#ifdef VCLAMP1
            if (RANGE) {
                acc[p] += go[p] * VCLAMP1(d);
                continue;
            }
#endif
            acc[p] += go[p] * VMIN(one, VMAX(mone, d));
        }
        if (wgrad) { /* dw += sum_p g x over the tile's pixels (a tail's missing pixels have g = 0), an FMA each */
            VEC t = FN(ld)(dwb + o * VL);
#pragma GCC unroll 32
            for (int p = 0; p < GIN_P; p++) t -= go[p] * nx[p];
            FN(st)(dwb + o * VL, t);
        }
    }
}

/* 1 when every lane of v[0..GIN_P) is finite. */
static inline int FN(finite_vecs)(const VEC v[GIN_P]) {
    VEC z = (VEC){0};
#pragma GCC unroll 32
    for (int p = 0; p < GIN_P; p++) z += v[p] * 0; /* 0, or NaN where a lane is infinite or NaN */
    int finite = 1;
    for (int k = 0; k < VL; k++) finite &= z[k] == 0;
    return finite;
}

/* 1 when the first nv vectors of each of the n pixels at x (pixel stride ps) are all finite. */
static int FN(finite_pixels)(const T *x, int64_t n, int64_t ps, int64_t nv) {
    VEC z[2] = {{0}, {0}}; /* 0, or NaN where a lane met an infinity or a NaN; two chains */
    for (int64_t q = 0; q < n; q++)
        for (int64_t v = 0; v < nv; v++) z[q & 1] += FN(ld)(x + q * ps + v * VL) * 0;
    int finite = 1;
    for (int k = 0; k < VL; k++) finite &= z[0][k] + z[1][k] == 0;
    return finite;
}

/* 1 when the n weights at wg let the input gradient's tiles take VCLAMP1: it is built and they are all finite. */
static inline int FN(clamp_weights)(const T *wg, int64_t n) {
#ifdef VCLAMP1
    return FN(finite_run)(wg, n);
#else
    (void)wg, (void)n;
    return 0;
#endif
}

/* With VCLAMP1 (one instruction for the clamp), a block whose x and weights are all finite takes it: w - x is then
 * never NaN, where VCLAMP1 and max/min differ. wfin: 2 when the weights and the whole image are finite, 1 when the
 * weights are (the block's x is checked here: per block, the check cost about 5% of a 16-channel layer's tile), 0. */
static inline __attribute__((always_inline)) void FN(gin_tile_body)(const T *x0, T *g0, const int64_t *off, int64_t n,
                                                                   const T *w0, const T *gt, int64_t gos, int64_t Og,
                                                                   T *dw0, const int64_t *boff, int64_t nb,
                                                                   const int wfin, const int once, const int wgrad) {
    (void)wfin;
    for (int64_t b = 0; b < nb; b++) { /* weight block b (Og*VL elements), at offset boff[b] of the images */
        const T *xb = x0 + boff[b], *wb = w0 + b * Og * VL;
        T *gb = g0 + boff[b], *dwb = wgrad ? dw0 + b * Og * VL : NULL;
        VEC nx[GIN_P], acc[GIN_P];
#pragma GCC unroll 32
        for (int p = 0; p < GIN_P; p++) {
            nx[p] = -FN(ld)(xb + off[p]);
            acc[p] = (VEC){0};
        }
#ifdef VCLAMP1
        if (wfin == 2 || (wfin && FN(finite_vecs)(nx)))
            FN(gin_rows)(nx, acc, wb, gt, gos, Og, dwb, wgrad, 1);
        else
#endif
            FN(gin_rows)(nx, acc, wb, gt, gos, Og, dwb, wgrad, 0);
        /* unrolled, so that acc stays in registers (a loop to n spilled it to the stack after every block) */
#pragma GCC unroll 32
        for (int p = 0; p < GIN_P; p++)
            if (p < n) FN(st)(gb + off[p], once ? acc[p] : FN(ld)(gb + off[p]) + acc[p]);
    }
}

static void FN(gin_tile)(const T *x0, T *g0, const int64_t *off, int64_t n, const T *w0, const T *gt, int64_t gos,
                         int64_t Og, const int64_t *boff, int64_t nb, int wfin, int once) {
    FN(gin_tile_body)(x0, g0, off, n, w0, gt, gos, Og, NULL, boff, nb, wfin, once, 0);
}

static __attribute__((noinline)) void FN(gin_tile_w)(const T *x0, T *g0, const int64_t *off, int64_t n, const T *w0,
                                                     const T *gt, int64_t gos, int64_t Og, T *dw0,
                                                     const int64_t *boff, int64_t nb, int wfin, int once) {
    FN(gin_tile_body)(x0, g0, off, n, w0, gt, gos, Og, dw0, boff, nb, wfin, once, 1);
}

/* gx[n0:n1, groups g0:g1] = input gradient (groups own disjoint channels, so group ranges may run in
 * parallel). w2 is the weight packed [G][kh][kw][Cgp/VL][Og][VL] (zero channel padding), so a tile
 * streams one contiguous block of it; g and gx are read / written through strides gs / gxs. A tile
 * of GIN_P consecutive output pixels of g (pixel stride 1: an NCHW row) that runs fewer than GIN_DIRECT_BLOCKS blocks
 * of the weight is read in place, any other packed first. With dw (not NULL), sum g x over these images and groups is
 * added into slot `slot` of dw, slots of G*kh*kw*Cgp*Og elements laid out as w2 (one slot per range: ranges run in
 * parallel). A tile runs every block of the weight in one call. Returns 0, or 1 when scratch memory cannot be
 * allocated. */
int FN(adder_grad_input)(const T *x, const int64_t *xs, const T *w2, const T *g,
                         const int64_t *gs, T *gx, const int64_t *gxs, const adder_geometry *s, T *dw,
                         int64_t n0, int64_t n1, int64_t g0, int64_t g1, int64_t slot) {
    const int64_t H = s->H, W = s->W, G = s->G, Cg = s->Cg, Og = s->Og, kh = s->kh, kw = s->kw;
    const int64_t ph = s->ph, pw = s->pw, Cgp = s->Cgp;
    const int64_t Hp = H + 2 * ph, Wp = W + 2 * pw, Ct = G * Cgp, L = s->Ho * s->Wo;
    const int64_t di = s->dh * Wp * Ct, dj = s->dw * Ct, wo = kh * kw * Cgp;
    const size_t img = (size_t)(Hp * Wp * Ct);
    const int xin = FN(is_scratch)(xs, s), gin = FN(is_scratch)(gxs, s); /* x read, gx written in place */
    T *buf = malloc(sizeof(T) * ((xin ? 0 : img) + (gin ? 0 : img) + (size_t)(Og * GIN_P)) + 64);
    int64_t *xo = FN(pixel_offsets)(s, Wp * Ct, Ct, gs, GIN_P);
    const int64_t nb = kh * kw * (Cgp / VL); /* the weight's blocks [kh][kw][Cgp/VL], each Og*VL elements */
    int64_t *boff = malloc(sizeof(int64_t) * (size_t)nb);
    if (!buf || !xo || !boff) { free(buf); free(xo); free(boff); return 1; }
    for (int64_t b = 0; b < nb; b++) /* a block's offset into the scratch images: tap (i, j), channels cv.. */
        boff[b] = b / (kw * (Cgp / VL)) * di + b / (Cgp / VL) % kw * dj + b % (Cgp / VL) * VL;
    const int64_t *go = xo + L + GIN_P;
    T *gbuf = buf + (xin ? 0 : img), *gt = gbuf + (gin ? 0 : img);
    const int wall = !s->wimg && FN(clamp_weights)(w2, G * Og * wo); /* one weight for all images */
    /* a 1x1 layer of stride 1 without padding: each input pixel is one output pixel's, so every element of gx is
     * stored once (not zeroed and added into); read in place, its rows are prefetched a tile ahead (prefetch_rows) */
    const int once = kh * kw == 1 && s->sh == 1 && s->sw == 1 && !ph && !pw;
    const int fetch = once && xin && gin;
    for (int64_t n = n0; n < n1; n++) {
        const T *xi = xin ? x + n * xs[0] : buf;
        T *gi = gin ? gx + n * gxs[0] : gbuf;
        if (!xin) FN(pad_image)(x + n * xs[0], xs, s, buf, g0, g1);
        if (!once) FN(zero_groups)(s, gi, g0, g1);
        for (int64_t gr = g0; gr < g1; gr++) {
            const T *gg = g + n * gs[0] + gr * (s->ygs ? s->ygs : Og * gs[1]);
            const T *wgr = w2 + (s->wimg * n * G + gr) * Og * wo;
            T *dwg = dw ? dw + (slot * G + gr) * Og * wo : NULL;
            int wfin = s->wimg ? FN(clamp_weights)(wgr, Og * wo) : wall;
            /* and the group's image read all finite, checked once where that is cheaper than per block (a dozen
             * vector instructions, against one per vector of the image): then no check per block */
            if (wfin && (L + GIN_P - 1) / GIN_P * nb * 4 >= Hp * Wp * (Cgp / VL))
                wfin += FN(finite_pixels)(xi + gr * Cgp, Hp * Wp, Ct, Cgp / VL);
            for (int64_t q = 0; q < L; q += GIN_P) {
                const int64_t m = L - q < GIN_P ? L - q : GIN_P;
                if (fetch && q + GIN_P < L) {
                    const int64_t mn = L - q - GIN_P < GIN_P ? L - q - GIN_P : GIN_P;
                    FN(prefetch_rows)(xi + gr * Cgp, xo + q + GIN_P, mn, Cgp, 0);
                    FN(prefetch_rows)(gi + gr * Cgp, xo + q + GIN_P, mn, Cgp, 1);
                    if (gs[1] == 1) FN(prefetch_rows)(gg, go + q + GIN_P, mn, Og, 0);
                }
                int run = m == GIN_P; /* the tile's pixels consecutive in g */
                for (int p = 1; p < GIN_P; p++) run &= go[q + p] == go[q] + p;
                const int direct = run && nb < GIN_DIRECT_BLOCKS;
                const T *gtile = direct ? gg + go[q] : gt;
                const int64_t gos = direct ? gs[1] : GIN_P;
                if (!direct && run) /* pack g[tile, o]: a run of GIN_P elements per output channel */
                    for (int64_t o = 0; o < Og; o++) memcpy(gt + o * GIN_P, gg + o * gs[1] + go[q], sizeof(T) * GIN_P);
                else if (!direct) {
                    int64_t o0 = 0;
#ifdef TRANSPOSE_BLOCK
                    /* channels-last g, whole tile of uniformly spaced pixels: blocks of 8 pixels x 8 channels
                     * transposed in registers (element by element, packing took about a tenth of AdderLinear's
                     * input gradient with 8 pixels x 64 channels per tile) */
                    int even = GIN_P == 8 && m == GIN_P && gs[1] == 1;
                    for (int p = 1; even && p < GIN_P; p++) even = go[q + p] - go[q + p - 1] == go[q + 1] - go[q];
                    if (even)
                        for (; o0 + 8 <= Og; o0 += 8)
                            TRANSPOSE_BLOCK(gg + go[q] + o0, go[q + 1] - go[q], gt + o0 * GIN_P, GIN_P);
#endif
                    for (int64_t o = o0; o < Og; o++) /* element by element; zero past the tail */
                        for (int p = 0; p < GIN_P; p++) gt[o * GIN_P + p] = p < m ? gg[o * gs[1] + go[q + p]] : 0;
                }
                if (dwg)
                    FN(gin_tile_w)(xi + gr * Cgp, gi + gr * Cgp, xo + q, m, wgr, gtile, gos, Og, dwg, boff, nb, wfin,
                                   once);
                else
                    FN(gin_tile)(xi + gr * Cgp, gi + gr * Cgp, xo + q, m, wgr, gtile, gos, Og, boff, nb, wfin, once);
            }
        }
        for (int64_t h = 0; h < H * !gin; h++) /* copy the interior out, blocked as in pad_image */
            for (int64_t w0 = 0; w0 < W; w0 += 16) {
                const int64_t w1 = W - w0 < 16 ? W : w0 + 16;
                const T *bp = gbuf + ((h + ph) * Wp + pw) * Ct;
                for (int64_t gr = g0; gr < g1; gr++) {
                    T *gxr = gx + n * gxs[0] + gr * Cg * gxs[1] + h * gxs[2];
                    const T *bg = bp + gr * Cgp;
                    int64_t cv = 0, wv = w0; /* as in copy_interior */
#ifdef TRANSPOSE_BLOCK
                    if (gxs[3] == 1) {
                        cv = Cg / 8 * 8, wv = w0 + (w1 - w0) / 8 * 8;
                        for (int64_t c = 0; c < cv; c += 8)
                            for (int64_t v = w0; v < wv; v += 8)
                                TRANSPOSE_BLOCK(bg + v * Ct + c, Ct, gxr + c * gxs[1] + v, gxs[1]);
                    }
#endif
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t w = c < cv ? wv : w0; w < w1; w++) gxr[c * gxs[1] + w * gxs[3]] = bg[w * Ct + c];
                }
            }
    }
    free(boff);
    free(xo);
    free(buf);
    return 0;
}

/* The same over R ranges r[6k..6k+5] = (n0, n1, q0, q1, g0, g1) / r[5k..5k+4] = (n0, n1, g0, g1, slot), in parallel on
 * OpenMP's threads (torch's runtime, see build.py); serial when built without OpenMP. */
int FN(adder_forward_ranges)(const T *x, const int64_t *xs, const T *wt, T *y, const int64_t *ys,
                             const adder_geometry *s, const int64_t *r, int64_t R, int nt) {
    int err = 0;
#pragma omp parallel for num_threads(nt) schedule(static, 1) reduction(| : err)
    for (int64_t k = 0; k < R; k++)
        err |= FN(adder_forward)(x, xs, wt, y, ys, s, r[6 * k], r[6 * k + 1], r[6 * k + 2], r[6 * k + 3],
                                 r[6 * k + 4], r[6 * k + 5]);
    return err;
}

int FN(adder_grad_input_ranges)(const T *x, const int64_t *xs, const T *w2, const T *g,
                                const int64_t *gs, T *gx, const int64_t *gxs, const adder_geometry *s, T *dw,
                                const int64_t *r, int64_t R, int nt) {
    int err = 0;
#pragma omp parallel for num_threads(nt) schedule(static, 1) reduction(| : err)
    for (int64_t k = 0; k < R; k++)
        err |= FN(adder_grad_input)(x, xs, w2, g, gs, gx, gxs, s, dw, r[5 * k], r[5 * k + 1], r[5 * k + 2],
                                    r[5 * k + 3], r[5 * k + 4]);
    return err;
}

#undef VEC
#undef IVEC
#undef VSUBN
#undef VACC
#undef FWD_MIN
