// GGUF blocks -> packed units (layout in quant.h), and the exact dequantizer over packed units.
// Runs once per tensor at load: plain C++, parallel over groups.
#include <omp.h>

#include <cstring>

#include "quant.h"
#include "unit.h"

namespace sq {

bool layout_of(int qtype, Layout* out) {
    switch (qtype) {
        case Q4_K: *out = {256, 1184, 256, 144}; return true;
        case Q5_K: *out = {256, 1440, 256, 176}; return true;
        case Q6_K: *out = {256, 1680, 256, 210}; return true;
        case Q8_0: *out = {32, 272, 32, 34}; return true;
        case Q5_0: *out = {32, 176, 32, 22}; return true;
        case F16: *out = {32, 512, 1, 2}; return true;
        case F32: *out = {32, 1024, 1, 4}; return true;
        default: return false;
    }
}

float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);  // inf / nan
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do { man <<= 1; ++e; } while (!(man & 0x400));
        bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((man & 0x3FF) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

int64_t packed_bytes(int qtype, int64_t N, int64_t K) {
    Layout L;
    if (!layout_of(qtype, &L) || K % L.unit_k) return -1;
    return (N + GROUP - 1) / GROUP * (K / L.unit_k) * L.unit_bytes;
}

namespace {

// Repacking runs once per tensor at load (~1.6 GB for the embedded pair, where the first touch of the new
// buffer alone costs ~0.6 ms per MB), so it moves 4 quants at a time as 32-bit words: a "step" word holds
// one column's quants of 4 consecutive inputs, one per byte, exactly as a unit stores them.

inline uint32_t ld32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline void st32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
constexpr uint32_t LO4 = 0x0F0F0F0Fu, BIT0 = 0x01010101u, LO2 = 0x03030303u;

// spread4(v): bit i of a 4-bit v moved to bit 0 of byte i
constexpr uint32_t spread_bits(uint32_t v) { return (v & 1) | (v >> 1 & 1) << 8 | (v >> 2 & 1) << 16 | (v >> 3 & 1) << 24; }
constexpr uint32_t SPREAD4[16] = {spread_bits(0), spread_bits(1), spread_bits(2), spread_bits(3), spread_bits(4),
    spread_bits(5), spread_bits(6), spread_bits(7), spread_bits(8), spread_bits(9), spread_bits(10), spread_bits(11),
    spread_bits(12), spread_bits(13), spread_bits(14), spread_bits(15)};
inline uint32_t spread4(uint32_t v) { return SPREAD4[v]; }

void kquant_scales(const uint8_t* s, uint8_t sc[8], uint8_t m[8]) {  // the 12-byte 6-bit scale/min packing
    for (int j = 0; j < 4; ++j) {
        sc[j] = s[j] & 63, m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4), m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

// Half a Q6_K block (sub-blocks 8h..8h+7) into the unit's vectors: input r of the half has its low 4 bits in
// ql[r % 64] (high nibble when r >= 64) and its top 2 bits in qh[r % 32] at bit 2 * (r / 32).
inline void q6_half(const uint8_t* ql, const uint8_t* qh, uint8_t* dst) {
#pragma GCC unroll 8
    for (int jj = 0; jj < 8; ++jj) {  // sub-block: 16 inputs from r = 16 * jj, 4 step words
        uint32_t st[4];
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
            const int r = 16 * jj + 4 * s;
            st[s] = ((ld32(ql + r % 64) >> (4 * (r / 64))) & LO4) | ((ld32(qh + r % 32) >> (2 * (r / 32))) & LO2) << 4;
        }
        uint8_t* v = dst + 96 * jj;
        st32(v, st[0] | ((st[2] >> 4) & LO2) << 6);
        st32(v + 32, st[1] | ((st[3] >> 4) & LO2) << 6);
        st32(v + 64, (st[2] & LO4) | (st[3] & LO4) << 4);
    }
}

// One GGUF block (column c's inputs of this unit) into the unit. `col` = u + 4c: the column's word in
// every 32-byte vector.
void pack_column(int qtype, const uint8_t* p, uint8_t* u, int c) {
    uint8_t* col = u + 4 * c;
    uint8_t q6sc[16];
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            put16(u + 2 * c, rd16(p)), put16(u + 16 + 2 * c, rd16(p + 2));
            uint8_t sc[8], m[8];
            kquant_scales(p + 4, sc, m);
            const uint8_t* qh = p + 16;
            const uint8_t* qs = p + (qtype == Q5_K ? 48 : 16);
            for (int j = 0; j < 8; ++j) {
                u[32 + 8 * j + c] = sc[j], u[96 + 8 * j + c] = m[j];
                const uint8_t* src = qs + 32 * (j / 2);  // sub-block j: nibble half j % 2 of chunk j / 2
                const int sh = 4 * (j % 2);
                uint32_t h = 0;
                for (int t = 0; t < 4; ++t) {  // low nibbles: step t, high: step t + 4
                    const uint32_t lo = (ld32(src + 4 * t) >> sh) & LO4, hi = (ld32(src + 4 * t + 16) >> sh) & LO4;
                    st32(col + 160 + 128 * j + 32 * t, lo | hi << 4);
                    if (qtype == Q5_K) h |= ((ld32(qh + 4 * t) >> j) & BIT0) << t | ((ld32(qh + 4 * t + 16) >> j) & BIT0) << (t + 4);
                }
                if (qtype == Q5_K) st32(col + 1184 + 32 * j, h);
            }
            break;
        }
        case Q6_K: {
            put16(u + 2 * c, rd16(p + 208));
            std::memcpy(q6sc, p + 192, 16);
            for (int j = 0; j < 16; ++j) u[16 + 8 * j + c] = q6sc[j];
            for (int h = 0; h < 2; ++h)  // each half of the block: 128 inputs, ql[64], qh[32]
                q6_half(p + 64 * h, p + 128 + 32 * h, col + 144 + 96 * 8 * h);
            break;
        }
        case Q8_0:
            put16(u + 2 * c, rd16(p));
            for (int s = 0; s < 8; ++s) st32(col + 16 + 32 * s, ld32(p + 2 + 4 * s));
            break;
        case Q5_0: {
            put16(u + 2 * c, rd16(p));
            const uint32_t qh = ld32(p + 2);
            uint32_t h = 0;
            for (int t = 0; t < 4; ++t) {  // steps t (inputs 4t..) and t + 4 (inputs 16 + 4t..)
                st32(col + 16 + 32 * t, (ld32(p + 6 + 4 * t) & LO4) | (ld32(p + 6 + 4 * t) >> 4 & LO4) << 4);
                h |= spread4(qh >> (4 * t) & 15) << t | spread4(qh >> (4 * t + 16) & 15) << (t + 4);
            }
            st32(col + 144, h);
            break;
        }
        default:
            break;
    }
}

}  // namespace

void repack(int qtype, const uint8_t* raw, int64_t raw_rows, int64_t N, int64_t K, const int64_t* rows,
            uint8_t* packed, int nthreads) {
    Layout L;
    layout_of(qtype, &L);
    const int64_t groups = (N + GROUP - 1) / GROUP, units = K / L.unit_k;
    const int64_t row_bytes = K / L.blk * L.blk_bytes;
    const bool plain = qtype == F16 || qtype == F32;
#pragma omp parallel for schedule(dynamic, chunk_of(groups, nthreads)) num_threads(nthreads)
    for (int64_t g = 0; g < groups; ++g) {
        for (int64_t u = 0; u < units; ++u) {
            uint8_t* dst = packed + (g * units + u) * L.unit_bytes;
            if (g * GROUP + GROUP > N || rows) std::memset(dst, 0, L.unit_bytes);  // padding columns stay zero
            for (int c = 0; c < GROUP; ++c) {
                const int64_t n = g * GROUP + c;
                const int64_t src = n < N ? (rows ? rows[n] : n) : -1;
                if (src < 0 || src >= raw_rows) continue;
                const uint8_t* p = raw + src * row_bytes + u * (L.unit_k / L.blk) * L.blk_bytes;
                if (plain) {  // 32 inputs of one column: w[k][c]
                    const int es = L.blk_bytes;
                    for (int k = 0; k < 32; ++k) std::memcpy(dst + es * (8 * k + c), p + es * k, es);
                } else {
                    pack_column(qtype, p, dst, c);
                }
            }
        }
    }
}

void dequant_cols(int qtype, const uint8_t* packed, int64_t N, int64_t K, const int64_t* idx, int64_t n_idx,
                  float* out) {
    Layout L;
    layout_of(qtype, &L);
    const int64_t units = K / L.unit_k;
    for (int64_t i = 0; i < n_idx; ++i) {
        const int64_t n = idx[i], g = n / GROUP;
        const int c = static_cast<int>(n % GROUP);
        float* o = out + i * K;
        for (int64_t u = 0; u < units; ++u) {
            const uint8_t* unit = packed + (g * units + u) * L.unit_bytes;
            for (int k = 0; k < L.unit_k; ++k) o[u * L.unit_k + k] = unit_w(qtype, unit, c, k);
        }
    }
}

}  // namespace sq
