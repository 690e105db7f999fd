// GGUF blocks -> packed units (layout in quant.h), and the exact dequantizer over packed units.
// Runs once per tensor at load: plain C++ (a whole unit of Q4_K, Q5_K or Q6_K in SSE2), parallel over groups.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "quant.h"
#include "unit.h"

namespace sq {

namespace {

// GGUF blocks as the file has them (ggml's block_q4_K, ...). Byte fields only: a block may sit at any address.
struct BlockQ4K {
    static constexpr int K = 256;
    uint8_t d[2], dmin[2];  // f16
    uint8_t scales[12];     // 8 six-bit scale/min pairs (kquant_scales)
    uint8_t qs[128];        // 4-bit: chunk i of 32 bytes holds sub-block 2i (low nibbles) and 2i + 1 (high nibbles)
};
struct BlockQ5K {
    static constexpr int K = 256;
    uint8_t d[2], dmin[2], scales[12];
    uint8_t qh[32];  // bit j of byte i: 5th bit of input i of sub-block j
    uint8_t qs[128];
};
struct BlockQ6K {
    static constexpr int K = 256;
    uint8_t ql[128];    // low 4 bits of each input (q6_half)
    uint8_t qh[64];     // top 2 bits
    int8_t scales[16];  // one per 16 inputs
    uint8_t d[2];
};
struct BlockQ80 {
    static constexpr int K = 32;
    uint8_t d[2];
    int8_t qs[32];
};
struct BlockQ50 {
    static constexpr int K = 32;
    uint8_t d[2];
    uint8_t qh[4];   // u32: bit i = 5th bit of input i
    uint8_t qs[16];  // low nibbles inputs 0-15, high nibbles 16-31
};
struct BlockQ40 {
    static constexpr int K = 32;
    uint8_t d[2];
    uint8_t qs[16];  // low nibbles inputs 0-15, high nibbles 16-31
};
struct BlockF16 {
    static constexpr int K = 1;
    uint8_t w[2];
};
struct BlockBF16 {
    static constexpr int K = 1;
    uint8_t w[2];
};
struct BlockF32 {
    static constexpr int K = 1;
    uint8_t w[4];
};
static_assert(sizeof(BlockQ4K) == 144 && sizeof(BlockQ5K) == 176 && sizeof(BlockQ6K) == 210 && sizeof(BlockQ80) == 34 &&
              sizeof(BlockQ50) == 22 && sizeof(BlockQ40) == 18, "GGUF block sizes (gguf.GGML_QUANT_SIZES)");

template <class U, class B>
constexpr Layout layout() {
    return {U::K, static_cast<int>(sizeof(U)), B::K, static_cast<int>(sizeof(B))};
}

}  // namespace

bool layout_of(int qtype, Layout* out) {
    switch (qtype) {
        case Q4_K: *out = layout<UnitQ4K, BlockQ4K>(); return true;
        case Q5_K: *out = layout<UnitQ5K, BlockQ5K>(); return true;
        case Q6_K: *out = layout<UnitQ6K, BlockQ6K>(); return true;
        case Q8_0: *out = layout<UnitQ80, BlockQ80>(); return true;
        case Q5_0: *out = layout<UnitQ50, BlockQ50>(); return true;
        case Q4_0: *out = layout<UnitQ40, BlockQ40>(); return true;
        case F16: *out = layout<UnitF16, BlockF16>(); return true;
        case BF16: *out = layout<UnitBF16, BlockBF16>(); return true;
        case F32: *out = layout<UnitF32, BlockF32>(); return true;
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

// Round to nearest even: add the exponent bias difference and half an ulp (plus the kept bit, for ties) to the
// float's bits, or, below the half range's normals, let one float addition of a power of two do the rounding.
uint16_t float_to_half(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7FFFFFFFu;
    if (u >= 0x47800000u) return static_cast<uint16_t>(sign | (u > 0x7F800000u ? 0x7E00u : 0x7C00u));  // inf, nan
    if (u < 0x38800000u) {  // below 2^-14: a half subnormal, or zero
        const uint32_t magic_bits = 0x3F000000u;  // 0.5: its ulp is 2^-24, the half subnormals' step
        float x, magic;
        std::memcpy(&x, &u, 4);
        std::memcpy(&magic, &magic_bits, 4);
        x += magic;
        uint32_t r;
        std::memcpy(&r, &x, 4);
        return static_cast<uint16_t>(sign | (r - magic_bits));
    }
    u += 0xC8000FFFu + ((u >> 13) & 1u);  // (15 - 127) << 23, wrapping, plus half an ulp less one, plus odd
    return static_cast<uint16_t>(sign | (u >> 13));
}

int64_t packed_bytes(int qtype, int64_t N, int64_t K) {
    Layout L;
    if (!layout_of(qtype, &L) || K % L.unit_k) return -1;
    return (N + GROUP - 1) / GROUP * (K / L.unit_k) * L.unit_bytes;
}

namespace {

// Repacking runs once per tensor at load (~1.6 GB for the embedded pair, where the first touch of the new
// buffer alone costs ~0.6 ms per MB), so it moves 4 quants at a time as 32-bit words: a "step" word holds
// one column's quants of 4 consecutive inputs, one per byte, exactly as a unit stores them. These words are the
// reference; where 8 columns fill a unit, the K-quants' units are packed 16 bytes at a time (below), the same bytes
// (the exact-weight tests pack both ways: full groups and a padded one).

inline uint32_t ld32(const void* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline void st32(void* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline uint16_t rd16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
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

// Half a Q6_K block (sub-blocks 8h..8h+7) into column c of the unit's vectors: input r of the half has its low
// 4 bits in ql[r % 64] (high nibble when r >= 64) and its top 2 bits in qh[r % 32] at bit 2 * (r / 32).
inline void q6_half(const uint8_t* ql, const uint8_t* qh, uint8_t (*qv)[3][STEP], int c) {
#pragma GCC unroll 8
    for (int jj = 0; jj < 8; ++jj) {  // sub-block: 16 inputs from r = 16 * jj, 4 step words
        uint32_t st[4];
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
            const int r = 16 * jj + 4 * s;
            st[s] = ((ld32(ql + r % 64) >> (4 * (r / 64))) & LO4) | ((ld32(qh + r % 32) >> (2 * (r / 32))) & LO2) << 4;
        }
        st32(qv[jj][0] + 4 * c, st[0] | ((st[2] >> 4) & LO2) << 6);
        st32(qv[jj][1] + 4 * c, st[1] | ((st[3] >> 4) & LO2) << 6);
        st32(qv[jj][2] + 4 * c, (st[2] & LO4) | (st[3] & LO4) << 4);
    }
}

// One GGUF block into column c of the unit: each of the column's steps is a 32-bit word at 4c of its vector.
// `quants` false: the scales, mins and 5th bits only (pack_q45k_unit does the 4-bit quants of all 8 columns).
template <bool Q5, bool quants = true>
void pack_q45k(const uint8_t* blk, void* unit, int c) {
    using B = std::conditional_t<Q5, BlockQ5K, BlockQ4K>;
    const B& b = *reinterpret_cast<const B*>(blk);
    UnitQ4K& u = *static_cast<UnitQ4K*>(unit);  // a Q5_K unit begins with one
    u.d[c] = rd16(b.d), u.dmin[c] = rd16(b.dmin);
    uint8_t sc[8], m[8];
    kquant_scales(b.scales, sc, m);
    for (int j = 0; j < 8; ++j) {
        u.sc[j][c] = sc[j], u.m[j][c] = m[j];
        uint32_t h = 0;
        for (int t = 0; t < 4; ++t) {  // low nibbles: step t, high: step t + 4
            if constexpr (quants) {
                const uint8_t* src = b.qs + 32 * (j / 2);  // sub-block j: nibble half j % 2 of chunk j / 2
                const int sh = 4 * (j % 2);
                const uint32_t lo = (ld32(src + 4 * t) >> sh) & LO4, hi = (ld32(src + 4 * t + 16) >> sh) & LO4;
                st32(u.qs[j][t] + 4 * c, lo | hi << 4);
            }
            if constexpr (Q5) h |= ((ld32(b.qh + 4 * t) >> j) & BIT0) << t | ((ld32(b.qh + 4 * t + 16) >> j) & BIT0) << (t + 4);
        }
        if constexpr (Q5) st32(static_cast<UnitQ5K*>(unit)->qh[j] + 4 * c, h);
    }
}

// `quants` false: the scale and the sub-block scales only (pack_q6k_unit does the quants of all 8 columns).
template <bool quants = true>
void pack_q6k(const uint8_t* blk, void* unit, int c) {
    const auto& b = *reinterpret_cast<const BlockQ6K*>(blk);
    auto& u = *static_cast<UnitQ6K*>(unit);
    u.d[c] = rd16(b.d);
    for (int j = 0; j < 16; ++j) u.sc[j][c] = b.scales[j];
    if constexpr (quants)
        for (int h = 0; h < 2; ++h)  // each half of the block: 128 inputs, ql[64], qh[32]
            q6_half(b.ql + 64 * h, b.qh + 32 * h, u.qv + 8 * h, c);
}

#if defined(__SSE2__)
// Words t of 8 columns side by side (x[c]: column c's 4 words): two 4x4 transposes of 32-bit words, st[4 * h + t]
// holding word t of columns 4h..4h+3 -- a unit's step t, in halves.
inline void transpose_steps(const __m128i* x, __m128i* st) {
    for (int h = 0; h < 2; ++h) {
        const __m128i* v = x + 4 * h;
        const __m128i lo01 = _mm_unpacklo_epi32(v[0], v[1]), lo23 = _mm_unpacklo_epi32(v[2], v[3]);
        const __m128i hi01 = _mm_unpackhi_epi32(v[0], v[1]), hi23 = _mm_unpackhi_epi32(v[2], v[3]);
        __m128i* o = st + 4 * h;
        o[0] = _mm_unpacklo_epi64(lo01, lo23), o[1] = _mm_unpackhi_epi64(lo01, lo23);
        o[2] = _mm_unpacklo_epi64(hi01, hi23), o[3] = _mm_unpackhi_epi64(hi01, hi23);
    }
}
inline void store16(uint8_t* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

inline void store_steps(const __m128i* x, uint8_t (*qs)[STEP]) {
    __m128i st[8];
    transpose_steps(x, st);
    for (int h = 0; h < 2; ++h)
        for (int t = 0; t < 4; ++t) store16(qs[t] + 16 * h, st[4 * h + t]);
}

// The 4-bit quants of a whole Q4_K/Q5_K unit, 16 bytes of a column at a time, in the SSE2 every x86-64 CPU has:
// the same bytes as pack_q45k's words (a chunk's low nibbles are sub-block 2k, its high ones 2k + 1; inputs 16-31
// go to the high nibble of a step's byte). The words one column at a time made this most of the load's repacking.
template <bool Q5>
void pack_q45k_unit(const uint8_t* const* blk, void* unit) {
    using B = std::conditional_t<Q5, BlockQ5K, BlockQ4K>;
    UnitQ4K& u = *static_cast<UnitQ4K*>(unit);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
        __m128i even[GROUP], odd[GROUP];
        for (int c = 0; c < GROUP; ++c) {
            const uint8_t* q = reinterpret_cast<const B*>(blk[c])->qs + 32 * k;
            const __m128i a = load16(q), b = load16(q + 16);  // inputs 0-15 of both sub-blocks, then 16-31
            even[c] = _mm_or_si128(_mm_and_si128(a, m4), _mm_slli_epi16(_mm_and_si128(b, m4), 4));
            odd[c] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), m4), _mm_andnot_si128(m4, b));
        }
        store_steps(even, u.qs[2 * k]);
        store_steps(odd, u.qs[2 * k + 1]);
    }
    for (int c = 0; c < GROUP; ++c) pack_q45k<Q5, false>(blk[c], unit, c);
}

// A whole Q6_K unit: per sub-block, each column's 16 six-bit quants as bytes (q6_half's words), transposed to steps,
// then folded into the unit's three vectors as pack_q6k folds the words (steps 2 and 3 give their top 2 bits to
// steps 0 and 1, and share a byte in their low 4).
void pack_q6k_unit(const uint8_t* const* blk, void* unit) {
    UnitQ6K& u = *static_cast<UnitQ6K*>(unit);
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(0x03), m30 = _mm_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h)  // each half of the block: 128 inputs, ql[64], qh[32]
        for (int i = 0; i < 8; ++i) {  // sub-block 8h + i: inputs 16i.. of the half
            const __m128i lo_shift = _mm_cvtsi32_si128(4 * (i / 4)), hi_shift = _mm_cvtsi32_si128(2 * (i / 2));
            __m128i q[GROUP];
            for (int c = 0; c < GROUP; ++c) {
                const BlockQ6K& b = *reinterpret_cast<const BlockQ6K*>(blk[c]);
                const __m128i lo = _mm_and_si128(_mm_srl_epi16(load16(b.ql + 64 * h + 16 * (i % 4)), lo_shift), m4);
                const __m128i hi = _mm_and_si128(_mm_srl_epi16(load16(b.qh + 32 * h + 16 * (i % 2)), hi_shift), m2);
                q[c] = _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
            }
            __m128i st[8];
            transpose_steps(q, st);
            for (int half = 0; half < 2; ++half) {
                const __m128i* s = st + 4 * half;
                const __m128i top2 = _mm_slli_epi16(_mm_and_si128(s[2], m30), 2), top3 = _mm_slli_epi16(_mm_and_si128(s[3], m30), 2);
                store16(u.qv[8 * h + i][0] + 16 * half, _mm_or_si128(s[0], top2));
                store16(u.qv[8 * h + i][1] + 16 * half, _mm_or_si128(s[1], top3));
                store16(u.qv[8 * h + i][2] + 16 * half,
                        _mm_or_si128(_mm_and_si128(s[2], m4), _mm_slli_epi16(_mm_and_si128(s[3], m4), 4)));
            }
        }
    for (int c = 0; c < GROUP; ++c) pack_q6k<false>(blk[c], unit, c);
}
#endif

void pack_q80(const uint8_t* blk, void* unit, int c) {
    const auto& b = *reinterpret_cast<const BlockQ80*>(blk);
    auto& u = *static_cast<UnitQ80*>(unit);
    u.d[c] = rd16(b.d);
    for (int s = 0; s < 8; ++s) st32(u.q[s] + 4 * c, ld32(b.qs + 4 * s));
}

void pack_q50(const uint8_t* blk, void* unit, int c) {
    const auto& b = *reinterpret_cast<const BlockQ50*>(blk);
    auto& u = *static_cast<UnitQ50*>(unit);
    u.d[c] = rd16(b.d);
    const uint32_t qh = ld32(b.qh);
    uint32_t h = 0;
    for (int t = 0; t < 4; ++t) {  // steps t (inputs 4t..) and t + 4 (inputs 16 + 4t..)
        const uint32_t v = ld32(b.qs + 4 * t);
        st32(u.qs[t] + 4 * c, (v & LO4) | (v >> 4 & LO4) << 4);
        h |= spread4(qh >> (4 * t) & 15) << t | spread4(qh >> (4 * t + 16) & 15) << (t + 4);
    }
    st32(u.qh + 4 * c, h);
}

void pack_q40(const uint8_t* blk, void* unit, int c) {
    const auto& b = *reinterpret_cast<const BlockQ40*>(blk);
    auto& u = *static_cast<UnitQ40*>(unit);
    u.d[c] = rd16(b.d);
    for (int t = 0; t < 4; ++t) {  // steps t (inputs 4t..) and t + 4 (inputs 16 + 4t..)
        const uint32_t v = ld32(b.qs + 4 * t);
        st32(u.qs[t] + 4 * c, (v & LO4) | (v >> 4 & LO4) << 4);
    }
}

// The 32 inputs of one F16/F32 column: w[k][c]
template <class U>
void pack_plain(const uint8_t* blk, void* unit, int c) {
    auto& u = *static_cast<U*>(unit);
    for (int k = 0; k < U::K; ++k) std::memcpy(&u.w[k][c], blk + sizeof(u.w[0][0]) * k, sizeof(u.w[0][0]));
}

using PackFn = void (*)(const uint8_t*, void*, int);

PackFn pack_fn(int qtype) {
    switch (qtype) {
        case Q4_K: return pack_q45k<false>;
        case Q5_K: return pack_q45k<true>;
        case Q6_K: return pack_q6k<>;
        case Q8_0: return pack_q80;
        case Q5_0: return pack_q50;
        case Q4_0: return pack_q40;
        case F16: return pack_plain<UnitF16>;
        case BF16: return pack_plain<UnitBF16>;
        case F32: return pack_plain<UnitF32>;
        default: return nullptr;
    }
}

using PackUnitFn = void (*)(const uint8_t* const*, void*);  // 8 columns' blocks into one unit

PackUnitFn pack_unit_fn(int qtype) {  // nullptr: column by column
#if defined(__SSE2__)
    if (qtype == Q4_K) return pack_q45k_unit<false>;
    if (qtype == Q5_K) return pack_q45k_unit<true>;
    if (qtype == Q6_K) return pack_q6k_unit;
#endif
    (void)qtype;
    return nullptr;
}

}  // namespace

void repack(int qtype, const uint8_t* raw, int64_t raw_rows, int64_t N, int64_t K, const int64_t* rows,
            uint8_t* packed, int nthreads) {
    Layout L;
    layout_of(qtype, &L);
    const Packing P(L, N, K);
    const int64_t groups = P.groups, units = P.units;
    const int64_t row_bytes = K / L.blk * L.blk_bytes;
    const PackFn pack = pack_fn(qtype);
    const PackUnitFn pack_unit = pack_unit_fn(qtype);
#pragma omp parallel for schedule(dynamic, chunk_of(groups, nthreads)) num_threads(nthreads)
    for (int64_t g = 0; g < groups; ++g) {
        int64_t src[GROUP];  // each column's row in raw; -1: a padding column
        bool whole = true;
        for (int c = 0; c < GROUP; ++c) {
            const int64_t n = g * GROUP + c;
            src[c] = n < N ? (rows ? rows[n] : n) : -1;
            if (src[c] < 0 || src[c] >= raw_rows) src[c] = -1, whole = false;
        }
        for (int64_t u = 0; u < units; ++u) {
            uint8_t* dst = packed + P.at(g, u) * L.unit_bytes;
            const int64_t at = u * (L.unit_k / L.blk) * L.blk_bytes;
            if (whole && pack_unit) {
                const uint8_t* blk[GROUP];
                for (int c = 0; c < GROUP; ++c) blk[c] = raw + src[c] * row_bytes + at;
                pack_unit(blk, dst);
                continue;
            }
            if (!whole || rows) std::memset(dst, 0, L.unit_bytes);  // padding columns stay zero
            for (int c = 0; c < GROUP; ++c)
                if (src[c] >= 0) pack(raw + src[c] * row_bytes + at, dst, c);
        }
    }
}

namespace {

// Column c's exact weights at inputs k0..k0+31 of a unit: unit_w's operations, with each block's scales read once
// (per weight, they made re-quantizing the embedded draft take ~1 s).
void column_block(int qtype, const uint8_t* u, int c, int k0, float* x) {
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            const int j = k0 / 32;
            const float D = unit_d(qtype, u, c) * static_cast<float>(unit_sc(qtype, u, j, c));
            const float M = unit_dmin(u, c) * static_cast<float>(unit_m(u, j, c));
            for (int i = 0; i < 32; ++i) x[i] = D * static_cast<float>(unit_q(qtype, u, c, k0 + i)) - M;
            return;
        }
        case Q6_K:
            for (int h = 0; h < 2; ++h) {
                const float D = unit_d(qtype, u, c) * static_cast<float>(unit_sc(qtype, u, k0 / 16 + h, c));
                for (int i = 16 * h; i < 16 * h + 16; ++i) x[i] = D * static_cast<float>(unit_q(qtype, u, c, k0 + i) - 32);
            }
            return;
        case Q8_0: {
            const float d = unit_d(qtype, u, c);
            for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(unit_q(qtype, u, c, i)) * d;
            return;
        }
        case Q5_0:
        case Q4_0: {
            const float d = unit_d(qtype, u, c);
            const int off = qtype == Q5_0 ? 16 : 8;
            for (int i = 0; i < 32; ++i) x[i] = d * static_cast<float>(unit_q(qtype, u, c, i) - off);
            return;
        }
        default:
            for (int i = 0; i < 32; ++i) x[i] = unit_w(qtype, u, c, k0 + i);
    }
}

}  // namespace

// The rule, one column and block at a time (the vectorized ones in kernels_x86.h give these bits).
void scalar::requant_q40(int qtype, const uint8_t* packed, int64_t N, int64_t K, uint8_t* out, int nthreads) {
    Layout L;
    layout_of(qtype, &L);
    Layout L40;
    layout_of(Q4_0, &L40);
    const Packing P(L, N, K), P40(L40, N, K);
#pragma omp parallel for schedule(dynamic, chunk_of(P.groups, nthreads)) num_threads(nthreads)
    for (int64_t g = 0; g < P.groups; ++g)
        for (int64_t b = 0; b < P40.units; ++b) {
            const int64_t k0 = b * UnitQ40::K;
            const uint8_t* src = packed + P.at(g, k0 / L.unit_k) * L.unit_bytes;
            auto& dst = *reinterpret_cast<UnitQ40*>(out + P40.at(g, b) * sizeof(UnitQ40));
            std::memset(&dst, 0, sizeof(UnitQ40));
            for (int c = 0; c < GROUP; ++c) {
                float x[UnitQ40::K], amax = 0.0f, max = 0.0f;
                column_block(qtype, src, c, static_cast<int>(k0 % L.unit_k), x);
                for (int i = 0; i < UnitQ40::K; ++i)
                    if (amax < std::fabs(x[i])) amax = std::fabs(x[i]), max = x[i];
                const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                dst.d[c] = float_to_half(d);
                for (int i = 0; i < UnitQ40::K; ++i) {
                    const int q = std::min(15, static_cast<int>(static_cast<int8_t>(x[i] * id + 8.5f)));
                    const int s = (i % 16) / 4;  // inputs 0-15: low nibble of step s; 16-31: high nibble
                    dst.qs[s][step_byte(c, i % 4)] |= static_cast<uint8_t>(q << (i < 16 ? 0 : 4));
                }
            }
        }
}

void dequant_cols(int qtype, const uint8_t* packed, int64_t N, int64_t K, const int64_t* idx, int64_t n_idx,
                  float* out) {
    Layout L;
    layout_of(qtype, &L);
    const Packing P(L, N, K);
    for (int64_t i = 0; i < n_idx; ++i) {
        const int64_t n = idx[i], g = n / GROUP;
        const int c = static_cast<int>(n % GROUP);
        float* o = out + i * K;
        for (int64_t u = 0; u < P.units; ++u) {
            const uint8_t* unit = packed + P.at(g, u) * L.unit_bytes;
            for (int k = 0; k < L.unit_k; ++k) o[u * L.unit_k + k] = unit_w(qtype, unit, c, k);
        }
    }
}

}  // namespace sq
