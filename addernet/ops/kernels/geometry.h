/* The geometry of one adder layer call, passed by pointer to every kernel of both libraries (the float
 * kernels of adder_cpu.c and the integer kernel of adder_int.c); build.py's Geometry mirrors it field for
 * field, and adder_geometry_size() lets the loader check that they agree. */
#ifndef ADDERNET_GEOMETRY_H
#define ADDERNET_GEOMETRY_H
#include <stdint.h>

typedef struct {
    int64_t N, C, H, W;             /* input: images, channels, height, width */
    int64_t G, Cg, Og;              /* groups; input and output channels per group */
    int64_t kh, kw;                 /* kernel height, width */
    int64_t sh, sw, ph, pw, dh, dw; /* stride, zero padding, dilation (height, width) */
    int64_t Ho, Wo;                 /* output height, width */
    int64_t Cgp;  /* float kernels: channels per group in the padded scratch image (>= Cg) */
    int64_t Kp;   /* integer kernel: length of a gathered patch row (kh*kw*Cg rounded up to the row alignment) */
    int64_t Opad; /* Og rounded up to the output-channel block (float: the vector width; integer: the filter tile) */
    int64_t wimg; /* float kernels: 0, one weight for every image; 1, a weight per image (its groups follow image n's
                   * at group n*G): l1_scores' keys */
    int64_t ygs;  /* float kernels: elements between groups of the output (forward) or output gradient (input
                   * gradient) tensor; 0: Og times its channel stride */
} adder_geometry;

int adder_geometry_size(void) { return (int)sizeof(adder_geometry); }

#endif
