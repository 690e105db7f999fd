// GGUF blocks -> packed units (layout in quant.h), and the exact dequantizer over packed units.
// Runs once per tensor at load: plain C++, parallel over groups.
#include <omp.h>

#include <cstring>
#include <vector>

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

// One GGUF block decoded to unsigned quants and integer scales (fields unused by a type stay zero).
struct Block {
    uint16_t d = 0, dmin = 0;
    uint8_t q[256] = {};
    int8_t sc[16] = {};  // Q6_K: 16 signed scales; Q4_K/Q5_K: 8 unsigned 6-bit scales
    uint8_t m[8] = {};
};

void kquant_scales(const uint8_t* s, Block* b) {  // the 12-byte 6-bit scale/min packing
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            b->sc[j] = static_cast<int8_t>(s[j] & 63);
            b->m[j] = s[j + 4] & 63;
        } else {
            b->sc[j] = static_cast<int8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
            b->m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
}

void decode_block(int qtype, const uint8_t* p, Block* b) {
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            b->d = rd16(p), b->dmin = rd16(p + 2);
            kquant_scales(p + 4, b);
            const uint8_t* qh = p + 16;
            const uint8_t* qs = p + (qtype == Q5_K ? 48 : 16);
            for (int k = 0; k < 256; ++k) {
                const int j = k / 32, i = k % 32;
                int q = (qs[32 * (j / 2) + i] >> (4 * (j % 2))) & 15;
                if (qtype == Q5_K) q |= ((qh[i] >> j) & 1) << 4;
                b->q[k] = static_cast<uint8_t>(q);
            }
            break;
        }
        case Q6_K: {
            const uint8_t *ql = p, *qh = p + 128;
            for (int j = 0; j < 16; ++j) b->sc[j] = static_cast<int8_t>(p[192 + j]);
            b->d = rd16(p + 208);
            for (int k = 0; k < 256; ++k) {
                const int half = k / 128, r = k % 128;
                const int lo = (ql[64 * half + r % 64] >> (4 * (r / 64))) & 15;
                const int hi = (qh[32 * half + r % 32] >> (2 * (r / 32))) & 3;
                b->q[k] = static_cast<uint8_t>(lo | hi << 4);
            }
            break;
        }
        case Q8_0:
            b->d = rd16(p);
            std::memcpy(b->q, p + 2, 32);
            break;
        case Q5_0: {
            b->d = rd16(p);
            uint32_t qh;
            std::memcpy(&qh, p + 2, 4);
            for (int k = 0; k < 32; ++k)
                b->q[k] = static_cast<uint8_t>(((p[6 + k % 16] >> (4 * (k / 16))) & 15) | ((qh >> k) & 1) << 4);
            break;
        }
        default:
            break;
    }
}

void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Fill one unit from the blocks of its 8 columns (null: a padding column, left all zero).
void pack_unit(int qtype, const Block* blk[GROUP], uint8_t* u) {
    for (int c = 0; c < GROUP; ++c) {
        const Block* b = blk[c];
        if (!b) continue;
        switch (qtype) {
            case Q4_K:
            case Q5_K:
                put16(u + 2 * c, b->d), put16(u + 16 + 2 * c, b->dmin);
                for (int j = 0; j < 8; ++j) u[32 + 8 * j + c] = static_cast<uint8_t>(b->sc[j]), u[96 + 8 * j + c] = b->m[j];
                for (int j = 0; j < 8; ++j)
                    for (int s = 0; s < 8; ++s)
                        for (int e = 0; e < 4; ++e) {
                            const int q = b->q[32 * j + 4 * s + e], byte = step_byte(c, e);
                            u[160 + 128 * j + 32 * (s & 3) + byte] |= static_cast<uint8_t>((q & 15) << (s & 4));
                            if (qtype == Q5_K) u[1184 + 32 * j + byte] |= static_cast<uint8_t>(((q >> 4) & 1) << s);
                        }
                break;
            case Q6_K:
                put16(u + 2 * c, b->d);
                for (int j = 0; j < 16; ++j) u[16 + 8 * j + c] = static_cast<uint8_t>(b->sc[j]);
                for (int j = 0; j < 16; ++j)
                    for (int e = 0; e < 4; ++e) {
                        const uint8_t* q = b->q + 16 * j + e;  // q[4 * s]: step s
                        uint8_t* v = u + 144 + 96 * j + step_byte(c, e);
                        v[0] = static_cast<uint8_t>(q[0] | (q[8] >> 4) << 6);
                        v[32] = static_cast<uint8_t>(q[4] | (q[12] >> 4) << 6);
                        v[64] = static_cast<uint8_t>((q[8] & 15) | (q[12] & 15) << 4);
                    }
                break;
            case Q8_0:
                put16(u + 2 * c, b->d);
                for (int k = 0; k < 32; ++k) u[16 + 32 * (k / 4) + step_byte(c, k % 4)] = b->q[k];
                break;
            case Q5_0:
                put16(u + 2 * c, b->d);
                for (int s = 0; s < 8; ++s)
                    for (int e = 0; e < 4; ++e) {
                        const int q = b->q[4 * s + e], byte = step_byte(c, e);
                        u[16 + 32 * (s & 3) + byte] |= static_cast<uint8_t>((q & 15) << (s & 4));
                        u[144 + byte] |= static_cast<uint8_t>(((q >> 4) & 1) << s);
                    }
                break;
            default:
                break;
        }
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
    std::memset(packed, 0, static_cast<size_t>(groups * units * L.unit_bytes));
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < groups; ++g) {
        Block blocks[GROUP];
        const Block* use[GROUP];
        for (int64_t u = 0; u < units; ++u) {
            uint8_t* dst = packed + (g * units + u) * L.unit_bytes;
            for (int c = 0; c < GROUP; ++c) {
                const int64_t n = g * GROUP + c;
                const int64_t src = n < N ? (rows ? rows[n] : n) : -1;
                if (src < 0 || src >= raw_rows) {
                    use[c] = nullptr;
                    continue;
                }
                const uint8_t* p = raw + src * row_bytes + u * (L.unit_k / L.blk) * L.blk_bytes;
                if (plain) {  // 32 inputs of one column: w[k][c]
                    const int es = L.blk_bytes;
                    for (int k = 0; k < 32; ++k) std::memcpy(dst + es * (8 * k + c), p + es * k, es);
                    use[c] = nullptr;
                } else {
                    decode_block(qtype, p, &blocks[c]);
                    use[c] = &blocks[c];
                }
            }
            if (!plain) pack_unit(qtype, use, dst);
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
