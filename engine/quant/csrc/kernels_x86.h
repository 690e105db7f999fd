// x86 kernels, included once per instruction set inside its own namespace, after a `#pragma GCC target`.
// SQ_VNNI = 1 swaps the AVX2 integer dot (maddubs -> int16 sums -> madd) for vpdpbusd (the AVX-512 VL encoding,
// or with SQ_AVXVNNI the VEX one of AVX-VNNI CPUs without AVX-512: Alder Lake and later); everything else
// is shared. The semantics (and so the bits) are those of kernels_scalar.cpp.
//
// Why int16 sums: maddubs gives per column pairs q*x + q'*x' as int16; adding several steps before
// widening with madd halves the multiply-port work. The number of steps per int16 sum is bounded so it
// cannot overflow: |pair| <= 2*qmax*127, so Q4 (qmax 15) takes 8 steps, Q5 (31) 4, Q6 (63) 2.
// Q8_0 uses the sign trick (|w| times sign(w)*x, pair <= 2*128*127) and widens every step.
//
// All R <= 16 rows run against the weight steps while those sit in registers; the row loop is a plain loop
// (per-row state lives in L1). Threads take chunks of output groups (quant.h), never parts of K.
// SQ_ZMM = 1 (AVX-512) adds tiles of two groups in 512-bit registers (below).

struct Tile {  // the call's quantized activations, positioned at the current unit
    const int8_t* q;
    const float* dx;
    const float* xs;
    const int32_t* bs16;
    const int32_t* bs32;
    int64_t qs, bs;  // block strides of q (bytes) and of the per-block arrays; rows are adjacent
};

static inline __m256i bc4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
static inline __m256i ld(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
static inline __m256 ph8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline __m128i ld8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
static inline __m256i u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(ld8(p)); }
static inline __m256i i8x8(const uint8_t* p) { return _mm256_cvtepi8_epi32(ld8(p)); }
// 8 scale bytes -> int16 pairs (s_c, s_c) per column, for madd
static inline __m256i pairs_u8(const uint8_t* p) { const __m128i v = ld8(p); return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, v)); }
static inline __m256i pairs_i8(const uint8_t* p) { const __m128i v = ld8(p); return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v)); }
// The 4 steps of a Q6_K sub-block from its 3 vectors (layout in quant.h)
static inline void q6_steps(const uint8_t* v, __m256i* w) {
    const __m256i m6 = _mm256_set1_epi8(63), m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    const __m256i v0 = ld(v), v1 = ld(v + 32), v2 = ld(v + 64);
    w[0] = _mm256_and_si256(v0, m6);
    w[1] = _mm256_and_si256(v1, m6);
    w[2] = _mm256_or_si256(_mm256_and_si256(v2, m4), _mm256_and_si256(_mm256_srli_epi16(v0, 2), m30));
    w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v2, 4), m4), _mm256_and_si256(_mm256_srli_epi16(v1, 2), m30));
}
static inline __m256i nib(__m256i v, int hi) {
    const __m256i m4 = _mm256_set1_epi8(15);
    return hi ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
}
// bit `bit` of every byte of h, moved to bit position `to` (mask `m` keeps it)
static inline __m256i hbits(__m256i h, int bit, int to, int m) {
    const __m256i s = bit < to ? _mm256_slli_epi16(h, to - bit) : _mm256_srli_epi16(h, bit - to);
    return _mm256_and_si256(s, _mm256_set1_epi8(static_cast<char>(m)));
}

#if SQ_VNNI && SQ_AVXVNNI
static inline __m256i dot4(__m256i acc, __m256i w, __m256i x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
#elif SQ_VNNI
static inline __m256i dot4(__m256i acc, __m256i w, __m256i x) { return _mm256_dpbusd_epi32(acc, w, x); }
#endif
static inline __m256i mad2(__m256i w0, __m256i x0, __m256i w1, __m256i x1) {  // int16 pair sums of 2 steps
    return _mm256_add_epi16(_mm256_maddubs_epi16(w0, x0), _mm256_maddubs_epi16(w1, x1));
}

// ---- int8-activation tiles: one unit, RT <= 16 rows, accumulate into acc[RT] (8 columns each) ---------
// Loop order: decode the 8 steps of one scale block into registers, then run every row against them.
// (Rows inside the step loop made GCC keep all products alive and spill them.)

// sum over the 8 steps of one 32-input block, int16 sums of `per` steps widened with madd by `sc2`
template <int per>
static inline __m256i dot8(const __m256i* w, const int8_t* x, __m256i sc2) {
#if SQ_VNNI
    (void)sc2;
    __m256i acc = _mm256_setzero_si256();
    for (int s = 0; s < 8; ++s) acc = dot4(acc, w[s], bc4(x + 4 * s));
    return acc;  // not yet scaled: the caller multiplies by the scale
#else
    __m256i I = _mm256_setzero_si256();
    for (int s0 = 0; s0 < 8; s0 += per) {
        __m256i p = _mm256_maddubs_epi16(w[s0], bc4(x + 4 * s0));
        for (int s = s0 + 1; s < s0 + per; ++s) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[s], bc4(x + 4 * s)));
        I = _mm256_add_epi32(I, _mm256_madd_epi16(p, sc2));
    }
    return I;
#endif
}

template <bool Q5>
static void tile_q45k(const uint8_t* u, const Tile& x, int RT, __m256* acc) {
    __m256 S[MAX_ROWS], Mn[MAX_ROWS];
    // the mins first, each row in a register: Mn = sum_j m_j * xs_j (a separate pass keeps the main
    // row loop free of a second load-fma-store per row)
    __m256 mf[8];
    for (int j = 0; j < 8; ++j) mf[j] = _mm256_cvtepi32_ps(u8x8(u + 96 + 8 * j));
    for (int r = 0; r < RT; ++r) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 8; ++j) m = _mm256_fmadd_ps(mf[j], _mm256_set1_ps(x.xs[r + j * x.bs]), m);
        Mn[r] = m;
        S[r] = _mm256_setzero_ps();
    }
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
        const uint8_t* qs = u + 160 + 128 * j;
        const __m256i h = Q5 ? ld(u + 1184 + 32 * j) : _mm256_setzero_si256();
        __m256i w[8];
        for (int t = 0; t < 4; ++t) {  // steps t and t + 4
            const __m256i v = ld(qs + 32 * t);
            w[t] = nib(v, 0), w[t + 4] = nib(v, 1);
            if (Q5) w[t] = _mm256_or_si256(w[t], hbits(h, t, 4, 0x10)), w[t + 4] = _mm256_or_si256(w[t + 4], hbits(h, t + 4, 4, 0x10));
        }
#if SQ_VNNI
        const __m256i sc = u8x8(u + 32 + 8 * j), sc2 = sc;
#else
        const __m256i sc2 = pairs_u8(u + 32 + 8 * j);
#endif
        for (int r = 0; r < RT; ++r) {
            __m256i I = dot8<Q5 ? 4 : 8>(w, x.q + r * 32 + j * x.qs, sc2);
#if SQ_VNNI
            I = _mm256_mullo_epi32(I, sc);
#endif
            S[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_set1_ps(x.dx[r + j * x.bs]), S[r]);
        }
    }
    const __m256 d = ph8(u), dmin = ph8(u + 16);
    for (int r = 0; r < RT; ++r) acc[r] = _mm256_fnmadd_ps(dmin, Mn[r], _mm256_fmadd_ps(d, S[r], acc[r]));
}

static void tile_q6k(const uint8_t* u, const Tile& x, int RT, __m256* acc) {
    __m256 S[MAX_ROWS];
    for (int r = 0; r < RT; ++r) S[r] = _mm256_setzero_ps();
#pragma GCC unroll 1
    for (int b = 0; b < 8; ++b) {  // activation block = sub-blocks 2b, 2b+1: steps 0-3 and 4-7
        __m256i w[8];
        q6_steps(u + 144 + 192 * b, w);       // sub-block 2b
        q6_steps(u + 144 + 192 * b + 96, w + 4);  // sub-block 2b + 1
        // the -32 offset of Q6_K: 32 * (sc_a * sum_a(xq) + sc_b * sum_b(xq)), as one madd
        const __m128i sab = _mm_unpacklo_epi8(ld8(u + 16 + 16 * b), ld8(u + 24 + 16 * b));
        const __m256i off = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sab), 5);
#if SQ_VNNI
        const __m256i sa = i8x8(u + 16 + 16 * b), sb = i8x8(u + 24 + 16 * b);
        for (int r = 0; r < RT; ++r) {
            const int8_t* xr = x.q + r * 32 + b * x.qs;
            __m256i pa = _mm256_setzero_si256(), pb = _mm256_setzero_si256();
            for (int s = 0; s < 4; ++s) pa = dot4(pa, w[s], bc4(xr + 4 * s)), pb = dot4(pb, w[s + 4], bc4(xr + 16 + 4 * s));
            __m256i I = _mm256_add_epi32(_mm256_mullo_epi32(pa, sa), _mm256_mullo_epi32(pb, sb));
#else
        const __m256i sa2 = pairs_i8(u + 16 + 16 * b), sb2 = pairs_i8(u + 24 + 16 * b);
        for (int r = 0; r < RT; ++r) {
            const int8_t* xr = x.q + r * 32 + b * x.qs;
            __m256i I = _mm256_madd_epi16(mad2(w[0], bc4(xr), w[1], bc4(xr + 4)), sa2);
            I = _mm256_add_epi32(I, _mm256_madd_epi16(mad2(w[2], bc4(xr + 8), w[3], bc4(xr + 12)), sa2));
            I = _mm256_add_epi32(I, _mm256_madd_epi16(mad2(w[4], bc4(xr + 16), w[5], bc4(xr + 20)), sb2));
            I = _mm256_add_epi32(I, _mm256_madd_epi16(mad2(w[6], bc4(xr + 24), w[7], bc4(xr + 28)), sb2));
#endif
            I = _mm256_sub_epi32(I, _mm256_madd_epi16(off, _mm256_set1_epi32(x.bs16[r + b * x.bs])));
            S[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_set1_ps(x.dx[r + b * x.bs]), S[r]);
        }
    }
    const __m256 d = ph8(u);
    for (int r = 0; r < RT; ++r) acc[r] = _mm256_fmadd_ps(d, S[r], acc[r]);
}

static void tile_q80(const uint8_t* u, const Tile& x, int RT, __m256* acc) {
    __m256i I[MAX_ROWS];
    for (int r = 0; r < RT; ++r) I[r] = _mm256_setzero_si256();
    for (int half = 0; half < 8; half += 4) {  // 4 steps at a time keep weights and |weights| in registers
        __m256i w[4], aw[4];
        for (int s = 0; s < 4; ++s) {
            w[s] = ld(u + 16 + 32 * (half + s));
#if SQ_VNNI
            aw[s] = _mm256_xor_si256(w[s], _mm256_set1_epi8(static_cast<char>(0x80)));  // w + 128, unsigned
#else
            aw[s] = _mm256_abs_epi8(w[s]);
#endif
        }
        for (int r = 0; r < RT; ++r) {
            const int8_t* xr = x.q + r * 32 + 4 * half;
#if SQ_VNNI
            // two short chains, not one of 8 dependent dot products: a row alone waited on their latency
            // (the draft's Q8_0 LM head, 1 row: 2.04 -> 1.52 ms on Zen 5)
            const __m256i z = _mm256_setzero_si256();
            const __m256i p = dot4(dot4(z, aw[0], bc4(xr)), aw[1], bc4(xr + 4));
            const __m256i p2 = dot4(dot4(z, aw[2], bc4(xr + 8)), aw[3], bc4(xr + 12));
            I[r] = _mm256_add_epi32(I[r], _mm256_add_epi32(p, p2));
#else
            for (int s = 0; s < 4; ++s) {
                const __m256i sx = _mm256_sign_epi8(bc4(xr + 4 * s), w[s]);
                I[r] = _mm256_add_epi32(I[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw[s], sx), _mm256_set1_epi16(1)));
            }
#endif
        }
    }
    const __m256 d = ph8(u);
    for (int r = 0; r < RT; ++r) {
#if SQ_VNNI
        I[r] = _mm256_sub_epi32(I[r], _mm256_set1_epi32(128 * x.bs32[r]));
#endif
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r]), _mm256_mul_ps(d, _mm256_set1_ps(x.dx[r])), acc[r]);
    }
}

static void tile_q50(const uint8_t* u, const Tile& x, int RT, __m256* acc) {
    const __m256i h = ld(u + 144);
    __m256i w[8];
    for (int t = 0; t < 4; ++t) {  // steps t and t + 4
        const __m256i v = ld(u + 16 + 32 * t);
        w[t] = _mm256_or_si256(nib(v, 0), hbits(h, t, 4, 0x10));
        w[t + 4] = _mm256_or_si256(nib(v, 1), hbits(h, t + 4, 4, 0x10));
    }
    const __m256 d = ph8(u);
    for (int r = 0; r < RT; ++r) {
        __m256i I = dot8<4>(w, x.q + r * 32, _mm256_set1_epi16(1));
        I = _mm256_sub_epi32(I, _mm256_set1_epi32(16 * x.bs32[r]));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(d, _mm256_set1_ps(x.dx[r])), acc[r]);
    }
}

#if SQ_ZMM
// ---- AVX-512: two groups side by side, 16 columns per register ---------------------------------------
// u0 and u1 are the units of groups g and g + 1 at the same place along K (the packed layout is the one
// above). Every column gets the integer sums and the float operations of the 8-column tiles, in the same
// order, so the bits are the same. Each instruction does the work of two: on Zen 5, whose 512-bit units run
// at the 256-bit rate, a 1536->8960 Q4_K layer over 5 / 9 / 16 rows took 23 / 30 / 37% less time.

static inline __m512i ld2(const uint8_t* a, const uint8_t* b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(ld(a)), ld(b), 1);
}
static inline __m128i cat8(const uint8_t* a, const uint8_t* b) { return _mm_unpacklo_epi64(ld8(a), ld8(b)); }
static inline __m512i u8x16(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepu8_epi32(cat8(a, b)); }
static inline __m512i i8x16(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepi8_epi32(cat8(a, b)); }
static inline __m512 ph16(const uint8_t* a, const uint8_t* b) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}
static inline __m512i bc4z(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
static inline __m512i nibz(__m512i v, int hi) {
    const __m512i m4 = _mm512_set1_epi8(15);
    return hi ? _mm512_and_si512(_mm512_srli_epi16(v, 4), m4) : _mm512_and_si512(v, m4);
}
static inline __m512i hbitsz(__m512i h, int bit, int to, int m) {
    const __m512i s = bit < to ? _mm512_slli_epi16(h, to - bit) : _mm512_srli_epi16(h, bit - to);
    return _mm512_and_si512(s, _mm512_set1_epi8(static_cast<char>(m)));
}
static inline void q6_stepsz(const uint8_t* a, const uint8_t* b, __m512i* w) {
    const __m512i m6 = _mm512_set1_epi8(63), m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i v0 = ld2(a, b), v1 = ld2(a + 32, b + 32), v2 = ld2(a + 64, b + 64);
    w[0] = _mm512_and_si512(v0, m6);
    w[1] = _mm512_and_si512(v1, m6);
    w[2] = _mm512_or_si512(_mm512_and_si512(v2, m4), _mm512_and_si512(_mm512_srli_epi16(v0, 2), m30));
    w[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v2, 4), m4), _mm512_and_si512(_mm512_srli_epi16(v1, 2), m30));
}
static inline __m512i dot8z(const __m512i* w, const int8_t* x) {
    __m512i acc = _mm512_setzero_si512();
    for (int s = 0; s < 8; ++s) acc = _mm512_dpbusd_epi32(acc, w[s], bc4z(x + 4 * s));
    return acc;
}

template <bool Q5>
static void tile2_q45k(const uint8_t* u0, const uint8_t* u1, const Tile& x, int RT, __m512* acc) {
    __m512 S[MAX_ROWS], Mn[MAX_ROWS];
    __m512 mf[8];
    for (int j = 0; j < 8; ++j) mf[j] = _mm512_cvtepi32_ps(u8x16(u0 + 96 + 8 * j, u1 + 96 + 8 * j));
    for (int r = 0; r < RT; ++r) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < 8; ++j) m = _mm512_fmadd_ps(mf[j], _mm512_set1_ps(x.xs[r + j * x.bs]), m);
        Mn[r] = m;
        S[r] = _mm512_setzero_ps();
    }
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
        const int qo = 160 + 128 * j, ho = 1184 + 32 * j;
        const __m512i h = Q5 ? ld2(u0 + ho, u1 + ho) : _mm512_setzero_si512();
        __m512i w[8];
        for (int t = 0; t < 4; ++t) {  // steps t and t + 4
            const __m512i v = ld2(u0 + qo + 32 * t, u1 + qo + 32 * t);
            w[t] = nibz(v, 0), w[t + 4] = nibz(v, 1);
            if (Q5) w[t] = _mm512_or_si512(w[t], hbitsz(h, t, 4, 0x10)), w[t + 4] = _mm512_or_si512(w[t + 4], hbitsz(h, t + 4, 4, 0x10));
        }
        const __m512i sc = u8x16(u0 + 32 + 8 * j, u1 + 32 + 8 * j);
        for (int r = 0; r < RT; ++r) {
            const __m512i I = _mm512_mullo_epi32(dot8z(w, x.q + r * 32 + j * x.qs), sc);
            S[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(x.dx[r + j * x.bs]), S[r]);
        }
    }
    const __m512 d = ph16(u0, u1), dmin = ph16(u0 + 16, u1 + 16);
    for (int r = 0; r < RT; ++r) acc[r] = _mm512_fnmadd_ps(dmin, Mn[r], _mm512_fmadd_ps(d, S[r], acc[r]));
}

static void tile2_q6k(const uint8_t* u0, const uint8_t* u1, const Tile& x, int RT, __m512* acc) {
    __m512 S[MAX_ROWS];
    for (int r = 0; r < RT; ++r) S[r] = _mm512_setzero_ps();
#pragma GCC unroll 1
    for (int b = 0; b < 8; ++b) {
        const int vo = 144 + 192 * b, so = 16 + 16 * b;  // the two sub-blocks' quants; scales a at so, b at so + 8
        __m512i w[8];
        q6_stepsz(u0 + vo, u1 + vo, w);
        q6_stepsz(u0 + vo + 96, u1 + vo + 96, w + 4);
        const __m128i sab0 = _mm_unpacklo_epi8(ld8(u0 + so), ld8(u0 + so + 8));
        const __m128i sab1 = _mm_unpacklo_epi8(ld8(u1 + so), ld8(u1 + so + 8));
        const __m512i off = _mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_set_m128i(sab1, sab0)), 5);
        const __m512i sa = i8x16(u0 + so, u1 + so), sb = i8x16(u0 + so + 8, u1 + so + 8);
        for (int r = 0; r < RT; ++r) {
            const int8_t* xr = x.q + r * 32 + b * x.qs;
            __m512i pa = _mm512_setzero_si512(), pb = _mm512_setzero_si512();
            for (int s = 0; s < 4; ++s)
                pa = _mm512_dpbusd_epi32(pa, w[s], bc4z(xr + 4 * s)), pb = _mm512_dpbusd_epi32(pb, w[s + 4], bc4z(xr + 16 + 4 * s));
            __m512i I = _mm512_add_epi32(_mm512_mullo_epi32(pa, sa), _mm512_mullo_epi32(pb, sb));
            I = _mm512_sub_epi32(I, _mm512_madd_epi16(off, _mm512_set1_epi32(x.bs16[r + b * x.bs])));
            S[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(x.dx[r + b * x.bs]), S[r]);
        }
    }
    const __m512 d = ph16(u0, u1);
    for (int r = 0; r < RT; ++r) acc[r] = _mm512_fmadd_ps(d, S[r], acc[r]);
}

static void tile2_q80(const uint8_t* u0, const uint8_t* u1, const Tile& x, int RT, __m512* acc) {
    __m512i I[MAX_ROWS];
    for (int r = 0; r < RT; ++r) I[r] = _mm512_setzero_si512();
    for (int half = 0; half < 8; half += 4) {
        __m512i aw[4];
        for (int s = 0; s < 4; ++s) {
            const int o = 16 + 32 * (half + s);
            aw[s] = _mm512_xor_si512(ld2(u0 + o, u1 + o), _mm512_set1_epi8(static_cast<char>(0x80)));  // w + 128
        }
        for (int r = 0; r < RT; ++r) {
            const int8_t* xr = x.q + r * 32 + 4 * half;
            for (int s = 0; s < 4; ++s) I[r] = _mm512_dpbusd_epi32(I[r], aw[s], bc4z(xr + 4 * s));
        }
    }
    const __m512 d = ph16(u0, u1);
    for (int r = 0; r < RT; ++r) {
        const __m512i Ir = _mm512_sub_epi32(I[r], _mm512_set1_epi32(128 * x.bs32[r]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Ir), _mm512_mul_ps(d, _mm512_set1_ps(x.dx[r])), acc[r]);
    }
}

static void tile2_q50(const uint8_t* u0, const uint8_t* u1, const Tile& x, int RT, __m512* acc) {
    const __m512i h = ld2(u0 + 144, u1 + 144);
    __m512i w[8];
    for (int t = 0; t < 4; ++t) {
        const __m512i v = ld2(u0 + 16 + 32 * t, u1 + 16 + 32 * t);
        w[t] = _mm512_or_si512(nibz(v, 0), hbitsz(h, t, 4, 0x10));
        w[t + 4] = _mm512_or_si512(nibz(v, 1), hbitsz(h, t + 4, 4, 0x10));
    }
    const __m512 d = ph16(u0, u1);
    for (int r = 0; r < RT; ++r) {
        const __m512i I = _mm512_sub_epi32(dot8z(w, x.q + r * 32), _mm512_set1_epi32(16 * x.bs32[r]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, _mm512_set1_ps(x.dx[r])), acc[r]);
    }
}
#endif  // SQ_ZMM

// ---- exact (fp32-activation) path: decode a unit to fp32, then FMA ----------------------------------

// Unit -> w[unit_k][8] floats, each exactly gguf's value (see unit.h's unit_w for the operation order).
static inline void put_step(__m256i sv, int k0, __m256 D, __m256 M, bool sub, int off, float* w) {
    for (int e = 0; e < 4; ++e) {
        __m256i qi = _mm256_and_si256(_mm256_srli_epi32(sv, 8 * e), _mm256_set1_epi32(0xFF));
        if (off) qi = _mm256_sub_epi32(qi, _mm256_set1_epi32(off));
        __m256 v = _mm256_mul_ps(D, _mm256_cvtepi32_ps(qi));
        if (sub) v = _mm256_sub_ps(v, M);
        _mm256_store_ps(w + 8 * (k0 + e), v);
    }
}

static void decode_unit(int qtype, const uint8_t* u, float* w) {
    const __m256 zero = _mm256_setzero_ps();
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            const __m256 d = ph8(u), dmin = ph8(u + 16);
            for (int j = 0; j < 8; ++j) {
                const __m256 D = _mm256_mul_ps(d, _mm256_cvtepi32_ps(u8x8(u + 32 + 8 * j)));
                const __m256 M = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(u8x8(u + 96 + 8 * j)));
                const __m256i h = qtype == Q5_K ? ld(u + 1184 + 32 * j) : _mm256_setzero_si256();
                for (int t = 0; t < 4; ++t) {
                    const __m256i v = ld(u + 160 + 128 * j + 32 * t);
                    __m256i lo = nib(v, 0), hi = nib(v, 1);
                    if (qtype == Q5_K) lo = _mm256_or_si256(lo, hbits(h, t, 4, 0x10)), hi = _mm256_or_si256(hi, hbits(h, t + 4, 4, 0x10));
                    put_step(lo, 32 * j + 4 * t, D, M, true, 0, w);
                    put_step(hi, 32 * j + 4 * t + 16, D, M, true, 0, w);
                }
            }
            break;
        }
        case Q6_K: {
            const __m256 d = ph8(u);
            for (int j = 0; j < 16; ++j) {
                const __m256 D = _mm256_mul_ps(d, _mm256_cvtepi32_ps(i8x8(u + 16 + 8 * j)));
                __m256i st[4];
                q6_steps(u + 144 + 96 * j, st);
                for (int s = 0; s < 4; ++s) put_step(st[s], 16 * j + 4 * s, D, zero, false, 32, w);
            }
            break;
        }
        case Q8_0: {
            const __m256 d = ph8(u);
            for (int s = 0; s < 8; ++s) {
                const __m256i sv = ld(u + 16 + 32 * s);
                for (int e = 0; e < 4; ++e) {
                    const __m256i qi = _mm256_srai_epi32(_mm256_slli_epi32(sv, 24 - 8 * e), 24);
                    _mm256_store_ps(w + 8 * (4 * s + e), _mm256_mul_ps(_mm256_cvtepi32_ps(qi), d));
                }
            }
            break;
        }
        case Q5_0: {
            const __m256 d = ph8(u);
            const __m256i h = ld(u + 144);
            for (int t = 0; t < 4; ++t) {
                const __m256i v = ld(u + 16 + 32 * t);
                put_step(_mm256_or_si256(nib(v, 0), hbits(h, t, 4, 0x10)), 4 * t, d, zero, false, 16, w);
                put_step(_mm256_or_si256(nib(v, 1), hbits(h, t + 4, 4, 0x10)), 4 * t + 16, d, zero, false, 16, w);
            }
            break;
        }
        case F16:
            for (int k = 0; k < 32; ++k) _mm256_store_ps(w + 8 * k, ph8(u + 16 * k));
            break;
        default:
            break;
    }
}

// RT rows x 8 columns over n inputs; a[r][e] accumulates inputs k with k % 4 == e, across units.
template <int RT>
static void fma_tile(const float* w, int n, const float* x, int64_t xstride, __m256* a) {
    __m256 A[RT][4];
    for (int r = 0; r < RT; ++r)
        for (int e = 0; e < 4; ++e) A[r][e] = a[4 * r + e];
    for (int k = 0; k < n; k += 4)
        for (int e = 0; e < 4; ++e) {
            const __m256 wv = _mm256_loadu_ps(w + 8 * (k + e));  // F32 units are read in place
            for (int r = 0; r < RT; ++r) A[r][e] = _mm256_fmadd_ps(wv, _mm256_set1_ps(x[r * xstride + k + e]), A[r][e]);
        }
    for (int r = 0; r < RT; ++r)
        for (int e = 0; e < 4; ++e) a[4 * r + e] = A[r][e];
}

// ---- drivers ------------------------------------------------------------------------------------------

using TileFn = void (*)(const uint8_t*, const Tile&, int, __m256*);

static TileFn tile_fn(int qtype) {
    switch (qtype) {
        case Q4_K: return tile_q45k<false>;
        case Q5_K: return tile_q45k<true>;
        case Q6_K: return tile_q6k;
        case Q8_0: return tile_q80;
        case Q5_0: return tile_q50;
        default: return nullptr;
    }
}

// Split R rows into balanced tiles of at most `most` rows; returns the number of tiles.
static int row_tiles(int R, int most, int* sizes) {
    const int n = (R + most - 1) / most;
    for (int i = 0; i < n; ++i) sizes[i] = R / n + (i < R % n ? 1 : 0);
    return n;
}

// Ask for the bytes 6 KB past this unit: one-row calls stream the weights, and the hardware prefetcher
// alone leaves ~15% of the bandwidth unused (measured, Q4_K/Q6_K/Q8_0/Q5_0). Past the buffer's end it is
// harmless: prefetches do not fault.
constexpr int AHEAD = 6144;
static inline void prefetch_ahead(const uint8_t* unit, int bytes) {
    for (int off = 0; off < bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(unit + AHEAD + off), _MM_HINT_T0);
}

static inline void store_group(const __m256* acc, int R, const MatArgs& a, int64_t g) {
    const int64_t n0 = g * GROUP, nv = std::min<int64_t>(GROUP, a.N - n0);
    const __m256 b = a.bias && nv == GROUP ? _mm256_loadu_ps(a.bias + n0) : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r) {
        float* o = a.out + r * a.N + n0;
        if (nv == GROUP) {
            _mm256_storeu_ps(o, a.bias ? _mm256_add_ps(acc[r], b) : acc[r]);
        } else {
            alignas(32) float t[GROUP];
            _mm256_store_ps(t, acc[r]);
            for (int c = 0; c < nv; ++c) o[c] = a.bias ? t[c] + a.bias[n0 + c] : t[c];
        }
    }
}

// The activations of the unit at position u along K (block-major: its first block is u * blocks per unit * R).
static inline Tile tile_at(const ActQ& x, const Layout& L, int64_t u) {
    const int64_t b0 = u * (L.unit_k / ABLK) * x.R;
    return Tile{x.q + 32 * b0, x.dx + b0, x.xs + b0, x.bs16 + b0, x.bs32 + b0, 32 * x.R, x.R};
}

// One group (8 columns) through all units of K.
static void group_q8(const MatArgs& a, const ActQ& x, const Layout& L, int64_t units, TileFn fn, int64_t g) {
    __m256 acc[MAX_ROWS];
    for (int r = 0; r < x.R; ++r) acc[r] = _mm256_setzero_ps();
    const uint8_t* unit = a.packed + g * units * L.unit_bytes;
    for (int64_t u = 0; u < units; ++u, unit += L.unit_bytes) {
        prefetch_ahead(unit, L.unit_bytes);
        fn(unit, tile_at(x, L, u), x.R, acc);
    }
    store_group(acc, x.R, a, g);
}

#if SQ_ZMM
// Pairs of groups from this many rows on. Below, a call is bound by memory, and two streams per thread read it
// ~10-40% slower than one; from 3 rows on (Q6_K, with its larger units: 7) the halved instruction count wins
// (measured on Zen 5 with scripts/bench_kernels.py --isa avxvnni,avx512vnni).
static int pair_rows(int qtype) { return qtype == Q6_K ? 7 : 3; }
using Tile2Fn = void (*)(const uint8_t*, const uint8_t*, const Tile&, int, __m512*);

static Tile2Fn tile2_fn(int qtype) {
    switch (qtype) {
        case Q4_K: return tile2_q45k<false>;
        case Q5_K: return tile2_q45k<true>;
        case Q6_K: return tile2_q6k;
        case Q8_0: return tile2_q80;
        case Q5_0: return tile2_q50;
        default: return nullptr;
    }
}

// Groups g and g + 1 (16 columns) through all units of K: two streams of weights, one register per row.
static void pair_q8(const MatArgs& a, const ActQ& x, const Layout& L, int64_t units, Tile2Fn fn, int64_t g) {
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < x.R; ++r) acc[r] = _mm512_setzero_ps();
    const int64_t gbytes = units * L.unit_bytes;
    const uint8_t* u0 = a.packed + g * gbytes;
    const uint8_t* u1 = u0 + gbytes;
    for (int64_t u = 0; u < units; ++u, u0 += L.unit_bytes, u1 += L.unit_bytes) {
        // AHEAD in each stream as group_q8 does in its one, into the next pair past a group's end (where this
        // thread most likely goes next): the hardware prefetcher alone leaves bandwidth unused.
        const int64_t next = u * L.unit_bytes + AHEAD >= gbytes ? gbytes : 0;
        prefetch_ahead(u0 + next, L.unit_bytes);
        prefetch_ahead(u1 + next, L.unit_bytes);
        fn(u0, u1, tile_at(x, L, u), x.R, acc);
    }
    __m256 lo[MAX_ROWS], hi[MAX_ROWS];
    for (int r = 0; r < x.R; ++r) {
        lo[r] = _mm512_castps512_ps256(acc[r]);
        hi[r] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1));
    }
    store_group(lo, x.R, a, g);
    store_group(hi, x.R, a, g + 1);
}
#endif

void matmul_q8(const MatArgs& a, const ActQ& x) {
    Layout L;
    layout_of(a.qtype, &L);
    const int64_t groups = (a.N + GROUP - 1) / GROUP, units = a.K / L.unit_k;
    const TileFn fn = tile_fn(a.qtype);
#if SQ_ZMM
    if (x.R >= pair_rows(a.qtype)) {
        const Tile2Fn fn2 = tile2_fn(a.qtype);
        const int64_t items = (groups + 1) / 2;  // an odd last group goes alone
#pragma omp parallel for schedule(dynamic, chunk_of(items, a.nthreads)) num_threads(a.nthreads)
        for (int64_t i = 0; i < items; ++i) {
            if (2 * i + 1 < groups)
                pair_q8(a, x, L, units, fn2, 2 * i);
            else
                group_q8(a, x, L, units, fn, 2 * i);
        }
        return;
    }
#endif
#pragma omp parallel for schedule(dynamic, chunk_of(groups, a.nthreads)) num_threads(a.nthreads)
    for (int64_t g = 0; g < groups; ++g) group_q8(a, x, L, units, fn, g);
}

void matmul_f32(const MatArgs& a, const float* x, int R) {
    Layout L;
    layout_of(a.qtype, &L);
    const int64_t groups = (a.N + GROUP - 1) / GROUP, units = a.K / L.unit_k;
    int sizes[MAX_ROWS];
    const int ntiles = row_tiles(R, 3, sizes);
#pragma omp parallel for schedule(dynamic, chunk_of(groups, a.nthreads)) num_threads(a.nthreads)
    for (int64_t g = 0; g < groups; ++g) {
        alignas(32) float w[256 * GROUP];
        __m256 acc4[4 * MAX_ROWS];
        for (int i = 0; i < 4 * R; ++i) acc4[i] = _mm256_setzero_ps();
        for (int64_t u = 0; u < units; ++u) {
            const uint8_t* unit = a.packed + (g * units + u) * L.unit_bytes;
            prefetch_ahead(unit, L.unit_bytes);
            const float* wu = w;
            if (a.qtype == F32) {
                wu = reinterpret_cast<const float*>(unit);
            } else {
                decode_unit(a.qtype, unit, w);
            }
            for (int i = 0, r0 = 0; i < ntiles; r0 += sizes[i++]) {
                const float* xr = x + r0 * a.K + u * L.unit_k;
                switch (sizes[i]) {
                    case 1: fma_tile<1>(wu, L.unit_k, xr, a.K, acc4 + 4 * r0); break;
                    case 2: fma_tile<2>(wu, L.unit_k, xr, a.K, acc4 + 4 * r0); break;
                    default: fma_tile<3>(wu, L.unit_k, xr, a.K, acc4 + 4 * r0); break;
                }
            }
        }
        __m256 acc[MAX_ROWS];
        for (int r = 0; r < R; ++r)
            acc[r] = _mm256_add_ps(_mm256_add_ps(acc4[4 * r], acc4[4 * r + 1]), _mm256_add_ps(acc4[4 * r + 2], acc4[4 * r + 3]));
        store_group(acc, R, a, g);
    }
}

void quantize_acts(const float* x, int R, int64_t K, int8_t* q, float* dx, float* xs, int32_t* bs16, int32_t* bs32) {
    const int64_t nb = K / ABLK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; ++b)
        for (int r = 0; r < R; ++r) {
            const float* xb = x + r * K + b * ABLK;
            const int64_t o = b * R + r;  // block-major: a block's rows are adjacent
            __m256 v[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i), m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
            alignas(32) float mm[8];
            _mm256_store_ps(mm, m);
            float amax = 0.0f;
            for (float f : mm) amax = std::fmax(amax, f);
            const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
            __m256i qi[4];
            for (int i = 0; i < 4; ++i)
                qi[i] = _mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(id)),
                                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            const __m256i p16 = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
            const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + o * ABLK), p8);
            alignas(32) int32_t s[8];
            _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_add_epi32(qi[0], qi[1]));
            int h0 = 0, h1 = 0;
            for (int i : s) h0 += i;
            _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_add_epi32(qi[2], qi[3]));
            for (int i : s) h1 += i;
            dx[o] = d;
            bs32[o] = h0 + h1;
            xs[o] = d * static_cast<float>(bs32[o]);
            bs16[o] = static_cast<int32_t>((static_cast<uint32_t>(h0) & 0xFFFF) | (static_cast<uint32_t>(h1) << 16));
        }
}
