// Portable kernels: the reference semantics every vectorized variant reproduces bit for bit.
//
// int8 activations, per output element (row r, column c), acc = 0, then per unit:
//   Q4_K/Q5_K  S = Mn = 0; per 32-input block b (= sub-block j): I = sc_j * sum(q * xq)
//              S = fma(I, dx_b, S); Mn = fma(m_j, xs_b, Mn);  then acc = fma(d, S, acc); acc = fma(-dmin, Mn, acc)
//   Q6_K       S = 0; per block b: I = sum over its two 16-sub-blocks of sc_j * sum((q - 32) * xq)
//              S = fma(I, dx_b, S);  then acc = fma(d, S, acc)
//   Q8_0/Q5_0/Q4_0  I = sum(w * xq) (Q5_0: w = q - 16, Q4_0: w = q - 8); acc = fma(I, d * dx_b, acc)
// All integer sums are exact (|I| < 2^24), so only the float steps above round, in this order, whatever
// the number of rows or threads. That is what makes the kernels batch-invariant.
//
// fp32 activations: a[0..3] = 0; a[k % 4] = fma(w_k, x_k, a[k % 4]) for k = 0..K-1; out = (a0 + a1) + (a2 + a3),
// with w_k the gguf-exact dequantized weight.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant.h"
#include "unit.h"

namespace sq::scalar {

void quantize_acts(const float* x, int R, int64_t K, int8_t* q, float* dx, float* xs, int32_t* bs16,
                   int32_t* bs32) {
    const int64_t nb = K / ABLK;
    for (int64_t b = 0; b < nb; ++b)
        for (int r = 0; r < R; ++r) {
            const float* xb = x + r * K + b * ABLK;
            const int64_t o = b * R + r;  // block-major (quant.h)
            float amax = 0.0f;
            for (int i = 0; i < ABLK; ++i) amax = std::max(amax, std::fabs(xb[i]));  // a NaN input is passed over
            const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
            int half[2] = {0, 0};
            for (int i = 0; i < ABLK; ++i) {
                const int v = static_cast<int>(std::nearbyint(xb[i] * id));
                q[o * ABLK + i] = static_cast<int8_t>(v);
                half[i / 16] += v;
            }
            dx[o] = d;
            bs32[o] = half[0] + half[1];
            xs[o] = d * static_cast<float>(bs32[o]);
            bs16[o] = static_cast<int32_t>((static_cast<uint32_t>(half[0]) & 0xFFFF) | (static_cast<uint32_t>(half[1]) << 16));
        }
}

namespace {

// Row r's activations within one unit: inputs and per-block values, from the block-major layout.
struct RowView {
    const int8_t* q;  // the unit's first block, row 0
    const float *dx, *xs;
    int R, r;
    int x(int k) const { return q[((k / ABLK) * R + r) * ABLK + k % ABLK]; }
    float d(int b) const { return dx[b * R + r]; }
    float s(int b) const { return xs[b * R + r]; }
};

// One column's contribution from one unit, int8 activations (semantics above).
float unit_q8(int qtype, const uint8_t* u, int c, const RowView& xv, float acc) {
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            float S = 0.0f, Mn = 0.0f;
            for (int j = 0; j < 8; ++j) {
                int dot = 0;
                for (int k = 32 * j; k < 32 * j + 32; ++k) dot += unit_q(qtype, u, c, k) * xv.x(k);
                const int I = unit_sc(qtype, u, j, c) * dot;
                S = std::fma(static_cast<float>(I), xv.d(j), S);
                Mn = std::fma(static_cast<float>(unit_m(u, j, c)), xv.s(j), Mn);
            }
            acc = std::fma(unit_d(qtype, u, c), S, acc);
            return std::fma(-unit_dmin(u, c), Mn, acc);
        }
        case Q6_K: {
            float S = 0.0f;
            for (int b = 0; b < 8; ++b) {
                int I = 0;
                for (int j = 2 * b; j < 2 * b + 2; ++j) {
                    int dot = 0;
                    for (int k = 16 * j; k < 16 * j + 16; ++k) dot += (unit_q(qtype, u, c, k) - 32) * xv.x(k);
                    I += unit_sc(qtype, u, j, c) * dot;
                }
                S = std::fma(static_cast<float>(I), xv.d(b), S);
            }
            return std::fma(unit_d(qtype, u, c), S, acc);
        }
        case Q8_0:
        case Q5_0:
        case Q4_0: {
            const int off = qtype == Q5_0 ? 16 : qtype == Q4_0 ? 8 : 0;
            int I = 0;
            for (int k = 0; k < 32; ++k) I += (unit_q(qtype, u, c, k) - off) * xv.x(k);
            return std::fma(static_cast<float>(I), unit_d(qtype, u, c) * xv.d(0), acc);
        }
        default:
            return acc;
    }
}

}  // namespace

static void matmul_q8_one(const MatArgs& a, const ActQ& x) {
    Layout L;
    layout_of(a.qtype, &L);
    const Packing P(L, a.N, a.K);
    const int64_t groups = P.groups, units = P.units;
    const int bpu = L.unit_k / ABLK;  // activation blocks per unit
#pragma omp parallel for schedule(dynamic, chunk_of(groups, a.nthreads)) num_threads(a.nthreads)
    for (int64_t g = 0; g < groups; ++g)
        for (int r = 0; r < x.R; ++r)
            for (int c = 0; c < GROUP; ++c) {
                const int64_t n = g * GROUP + c;
                if (n >= a.N) break;
                float acc = 0.0f;
                for (int64_t u = 0; u < units; ++u) {
                    const uint8_t* unit = a.packed + P.at(g, u) * L.unit_bytes;
                    const int64_t b0 = u * bpu * x.R;  // the unit's first block
                    acc = unit_q8(a.qtype, unit, c, RowView{x.q + ABLK * b0, x.dx + b0, x.xs + b0, x.R, r}, acc);
                }
                a.out[r * a.row_stride() + n] = a.bias ? acc + a.bias[n] : acc;
            }
}

void matmul_q8(const MatArgs* parts, int n, const ActQ& x) {
    for (int i = 0; i < n; ++i) matmul_q8_one(parts[i], x);
}

void matmul_f32(const MatArgs& a, const float* x, int R) {
    Layout L;
    layout_of(a.qtype, &L);
    const Packing P(L, a.N, a.K);
    const int64_t groups = P.groups, units = P.units;
#pragma omp parallel for schedule(dynamic, chunk_of(groups, a.nthreads)) num_threads(a.nthreads)
    for (int64_t g = 0; g < groups; ++g)
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < GROUP; ++c) {
                const int64_t n = g * GROUP + c;
                if (n >= a.N) break;
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (int64_t u = 0; u < units; ++u) {
                    const uint8_t* unit = a.packed + P.at(g, u) * L.unit_bytes;
                    for (int k = 0; k < L.unit_k; ++k) {
                        const int64_t kk = u * L.unit_k + k;
                        acc[kk & 3] = std::fma(unit_w(a.qtype, unit, c, k), x[r * a.K + kk], acc[kk & 3]);
                    }
                }
                const float y = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                a.out[r * a.row_stride() + n] = a.bias ? y + a.bias[n] : y;
            }
}

// The fp16 KV pool's rows: written rounded to nearest even, read back exactly (attend.h widens them)
void to_half(const float* x, int64_t n, uint16_t* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_half(x[i]);
}
static inline void widen_halves(const uint16_t* h, int n, float* out) {
    for (int i = 0; i < n; ++i) out[i] = half_to_float(h[i]);
}

#include "attend.h"

}  // namespace sq::scalar
