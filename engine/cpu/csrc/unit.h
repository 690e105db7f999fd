// Element access to a packed unit (the structs of quant.h), one column at a time. Used by the scalar kernels,
// repacking's exact dequantizer and nothing vectorized: clarity over speed.
#pragma once
#include "quant.h"

namespace sq {

// Byte of step s (4 inputs from 4*s) for column c, input e = 0..3 within the step.
inline int step_byte(int c, int e) { return 4 * c + e; }

// Unsigned quant of column c at input k of the unit: Q4_K/Q4_0 0..15, Q5_K/Q5_0 0..31, Q6_K 0..63,
// Q8_0 the signed int8 value.
inline int unit_q(int qtype, const void* u, int c, int k) {
    const int b = step_byte(c, k & 3);
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            const int j = k / 32, s = (k % 32) / 4;  // sub-block, step
            int q = (static_cast<const UnitQ4K*>(u)->qs[j][s & 3][b] >> (s & 4)) & 15;
            if (qtype == Q5_K) q |= ((static_cast<const UnitQ5K*>(u)->qh[j][b] >> s) & 1) << 4;
            return q;
        }
        case Q6_K: {
            const auto& v = static_cast<const UnitQ6K*>(u)->qv[k / 16];
            switch ((k % 16) / 4) {  // step
                case 0: return v[0][b] & 63;
                case 1: return v[1][b] & 63;
                case 2: return (v[2][b] & 15) | (v[0][b] >> 6) << 4;
                default: return (v[2][b] >> 4) | (v[1][b] >> 6) << 4;
            }
        }
        case Q8_0:
            return static_cast<const UnitQ80*>(u)->q[k / 4][b];
        case Q4_0: {
            const int s = k / 4;
            return (static_cast<const UnitQ40*>(u)->qs[s & 3][b] >> (s & 4)) & 15;
        }
        case Q5_0: {
            const auto* q5 = static_cast<const UnitQ50*>(u);
            const int s = k / 4;
            return ((q5->qs[s & 3][b] >> (s & 4)) & 15) | ((q5->qh[b] >> s) & 1) << 4;
        }
        default:
            return 0;
    }
}

inline float unit_d(int qtype, const void* u, int c) {
    switch (qtype) {
        case Q4_K:
        case Q5_K: return half_to_float(static_cast<const UnitQ4K*>(u)->d[c]);
        case Q6_K: return half_to_float(static_cast<const UnitQ6K*>(u)->d[c]);
        case Q8_0: return half_to_float(static_cast<const UnitQ80*>(u)->d[c]);
        case Q5_0: return half_to_float(static_cast<const UnitQ50*>(u)->d[c]);
        case Q4_0: return half_to_float(static_cast<const UnitQ40*>(u)->d[c]);
        default: return 0.0f;
    }
}
inline float unit_dmin(const void* u, int c) { return half_to_float(static_cast<const UnitQ4K*>(u)->dmin[c]); }
inline int unit_sc(int qtype, const void* u, int j, int c) {  // sub-block scale
    return qtype == Q6_K ? static_cast<const UnitQ6K*>(u)->sc[j][c] : static_cast<const UnitQ4K*>(u)->sc[j][c];
}
inline int unit_m(const void* u, int j, int c) { return static_cast<const UnitQ4K*>(u)->m[j][c]; }  // Q4_K/Q5_K mins

// The weight exactly as gguf.quants.dequantize computes it, operation by operation in float32
// (build with -ffp-contract=off so that d*q - m is never fused).
inline float unit_w(int qtype, const void* u, int c, int k) {
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            const int j = k / 32;
            const float D = unit_d(qtype, u, c) * static_cast<float>(unit_sc(qtype, u, j, c));
            const float M = unit_dmin(u, c) * static_cast<float>(unit_m(u, j, c));
            return D * static_cast<float>(unit_q(qtype, u, c, k)) - M;
        }
        case Q6_K: {
            const float D = unit_d(qtype, u, c) * static_cast<float>(unit_sc(qtype, u, k / 16, c));
            return D * static_cast<float>(unit_q(qtype, u, c, k) - 32);
        }
        case Q8_0:
            return static_cast<float>(unit_q(qtype, u, c, k)) * unit_d(qtype, u, c);
        case Q5_0:
            return unit_d(qtype, u, c) * static_cast<float>(unit_q(qtype, u, c, k) - 16);
        case Q4_0:
            return unit_d(qtype, u, c) * static_cast<float>(unit_q(qtype, u, c, k) - 8);
        case F16:
            return half_to_float(static_cast<const UnitF16*>(u)->w[k][c]);
        case BF16:
            return bf16_to_float(static_cast<const UnitBF16*>(u)->w[k][c]);
        case F32:
            return static_cast<const UnitF32*>(u)->w[k][c];
        default:
            return 0.0f;
    }
}

}  // namespace sq
