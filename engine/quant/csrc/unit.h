// Element access to a packed unit (see quant.h), one column at a time. Used by the scalar kernels,
// repacking's exact dequantizer and nothing vectorized: clarity over speed.
#pragma once
#include <cstring>

#include "quant.h"

namespace sq {

inline uint16_t rd16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// Byte of step s (4 inputs from 4*s) for column c, input e = 0..3 within the step.
inline int step_byte(int c, int e) { return 4 * c + e; }

// Unsigned quant of column c at input k of the unit: Q4_K 0..15, Q5_K/Q5_0 0..31, Q6_K 0..63,
// Q8_0 the signed int8 value.
inline int unit_q(int qtype, const uint8_t* u, int c, int k) {
    const int e = k & 3, b = step_byte(c, e);
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            const int j = k / 32, s = (k % 32) / 4;  // sub-block, step
            int q = (u[160 + 128 * j + 32 * (s & 3) + b] >> (s & 4)) & 15;
            if (qtype == Q5_K) q |= ((u[1184 + 32 * j + b] >> s) & 1) << 4;
            return q;
        }
        case Q6_K: {
            const uint8_t* v = u + 144 + 96 * (k / 16) + b;
            switch ((k % 16) / 4) {  // step
                case 0: return v[0] & 63;
                case 1: return v[32] & 63;
                case 2: return (v[64] & 15) | (v[0] >> 6) << 4;
                default: return (v[64] >> 4) | (v[32] >> 6) << 4;
            }
        }
        case Q8_0:
            return static_cast<int8_t>(u[16 + 32 * (k / 4) + b]);
        case Q5_0: {
            const int s = k / 4;
            const int lo = (u[16 + 32 * (s & 3) + b] >> (s & 4)) & 15;
            return lo | ((u[144 + b] >> s) & 1) << 4;
        }
        default:
            return 0;
    }
}

inline float unit_d(const uint8_t* u, int c) { return half_to_float(rd16(u + 2 * c)); }
inline float unit_dmin(const uint8_t* u, int c) { return half_to_float(rd16(u + 16 + 2 * c)); }
inline int unit_sc(int qtype, const uint8_t* u, int j, int c) {  // sub-block scale
    return qtype == Q6_K ? static_cast<int8_t>(u[16 + 8 * j + c]) : u[32 + 8 * j + c];
}
inline int unit_m(const uint8_t* u, int j, int c) { return u[96 + 8 * j + c]; }  // Q4_K/Q5_K mins

// The weight exactly as gguf.quants.dequantize computes it, operation by operation in float32
// (build with -ffp-contract=off so that d*q - m is never fused).
inline float unit_w(int qtype, const uint8_t* u, int c, int k) {
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            const int j = k / 32;
            const float D = unit_d(u, c) * static_cast<float>(unit_sc(qtype, u, j, c));
            const float M = unit_dmin(u, c) * static_cast<float>(unit_m(u, j, c));
            return D * static_cast<float>(unit_q(qtype, u, c, k)) - M;
        }
        case Q6_K: {
            const float D = unit_d(u, c) * static_cast<float>(unit_sc(qtype, u, k / 16, c));
            return D * static_cast<float>(unit_q(qtype, u, c, k) - 32);
        }
        case Q8_0:
            return static_cast<float>(unit_q(qtype, u, c, k)) * unit_d(u, c);
        case Q5_0:
            return unit_d(u, c) * static_cast<float>(unit_q(qtype, u, c, k) - 16);
        case F16:
            return half_to_float(rd16(u + 2 * (8 * k + c)));
        case F32: {
            float w;
            std::memcpy(&w, u + 4 * (8 * k + c), 4);
            return w;
        }
        default:
            return 0.0f;
    }
}

}  // namespace sq
