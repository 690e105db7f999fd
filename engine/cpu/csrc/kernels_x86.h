// x86 kernels, included once per instruction set inside its own namespace, after a `#pragma GCC target`.
// The int8-activation tiles are written once, over a register-width type V (as ggml's CPU backend writes its
// per-ISA code from one source): V256 holds one group (8 columns) per register, V512 (SQ_ZMM = 1, AVX-512) two
// groups side by side. SQ_VNNI = 1 swaps the AVX2 integer dot (maddubs -> int16 sums -> madd) for vpdpbusd
// (the AVX-512 VL encoding, or with SQ_AVXVNNI the VEX one of AVX-VNNI CPUs without AVX-512: Alder Lake and
// later); V512 always has it. The semantics (and so the bits) are those of kernels_scalar.cpp.
//
// Why int16 sums: maddubs gives per column pairs q*x + q'*x' as int16; adding several steps before
// widening with madd halves the multiply-port work. The number of steps per int16 sum is bounded so it
// cannot overflow: |pair| <= 2*qmax*127, so Q4 (qmax 15) takes 8 steps, Q5 (31) 4, Q6 (63) 2.
// Q8_0 uses the sign trick (|w| times sign(w)*x, pair <= 2*128*127) and widens every step.
//
// The rows of a pass (R <= 16) run against the weight steps while those sit in registers, in tiles whose row count
// is a compile-time constant (per-row sums in registers; groups_q8). Threads take chunks of output groups (quant.h),
// never parts of K.

struct Tile {  // the call's quantized activations, positioned at the current unit
    const int8_t* q;
    const float* dx;
    const float* xs;
    const int32_t* bs16;
    const int32_t* bs32;
    int64_t qs, bs;  // block strides of q (bytes) and of the per-block arrays; rows are adjacent
};

static inline __m128i ld8(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
using Word = int32_t __attribute__((may_alias, aligned(1)));  // 4 activations, read in place
static inline int32_t rd4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// ---- register widths: loads of unit fields, and the operations the tiles use ---------------------------
// A load takes a field of the unit at hand; V512 loads the same field of the next group's unit (`next` bytes on)
// into the upper half. Lanes are columns: int32 / float per column, or 4 bytes (a step) per column.

struct V256 {
    using I = __m256i;
    using F = __m256;
    static constexpr int G = 1;  // groups per register
    static constexpr bool vnni = SQ_VNNI;
    explicit V256(int64_t /* next: one group only */ = 0) {}

    static I ld(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
    static I u8(const void* p) { return _mm256_cvtepu8_epi32(ld8(p)); }  // a byte per column -> int32
    static I i8(const void* p) { return _mm256_cvtepi8_epi32(ld8(p)); }
    static F ph(const void* p) { return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p))); }  // f16
    // int16 pairs (a_c, b_c) per column, from two byte-per-column fields
    static I u8_pairs(const void* a, const void* b) { return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(ld8(a), ld8(b))); }
    static I i8_pairs(const void* a, const void* b) { return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(ld8(a), ld8(b))); }
    static __m256 group(F a, int /* i */) { return a; }  // the 8 columns of group i

    static I zero() { return _mm256_setzero_si256(); }
    static F zerof() { return _mm256_setzero_ps(); }
    static F set1(float v) { return _mm256_set1_ps(v); }
    static I set1_32(int32_t v) { return _mm256_set1_epi32(v); }
    static I set1_16(int16_t v) { return _mm256_set1_epi16(v); }
    static I set1_8(char v) { return _mm256_set1_epi8(v); }
    static I bc4(const int8_t* x) { return _mm256_set1_epi32(rd4(x)); }  // 4 activations in every column
    static I and_(I a, I b) { return _mm256_and_si256(a, b); }
    static I or_(I a, I b) { return _mm256_or_si256(a, b); }
    static I xor_(I a, I b) { return _mm256_xor_si256(a, b); }
    static I srl16(I a, int n) { return _mm256_srli_epi16(a, n); }
    static I sll16(I a, int n) { return _mm256_slli_epi16(a, n); }
    static I add32(I a, I b) { return _mm256_add_epi32(a, b); }
    static I sub32(I a, I b) { return _mm256_sub_epi32(a, b); }
    static I mul32(I a, I b) { return _mm256_mullo_epi32(a, b); }
    static I madd16(I a, I b) { return _mm256_madd_epi16(a, b); }
    static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a * b
#if SQ_VNNI && SQ_AVXVNNI
    static I dot4(I acc, I w, I x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
    static I dotx(I acc, I w, const int8_t* x) { return dot4(acc, w, bc4(x)); }
#elif SQ_VNNI
    // acc + w . (x[0..3] in every column), the 4 activations broadcast from memory inside the dot (EVEX {1to8}):
    // one instruction where GCC emits two; a pass over several rows is bound by these (instruction count)
    static I dotx(I acc, I w, const int8_t* x) {
        asm("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const Word*>(x)));
        return acc;
    }
#endif
    // the AVX2 dot
    static I maddubs(I w, I x) { return _mm256_maddubs_epi16(w, x); }
    static I add16(I a, I b) { return _mm256_add_epi16(a, b); }
    static I abs8(I a) { return _mm256_abs_epi8(a); }
    static I sign8(I a, I b) { return _mm256_sign_epi8(a, b); }
};

#if SQ_ZMM
// Two groups side by side, 16 columns per register: each instruction does the work of two. On Zen 5, whose
// 512-bit units run at the 256-bit rate, a 1536->8960 Q4_K layer over 5 / 9 / 16 rows took 23 / 30 / 37% less time.
struct V512 {
    using I = __m512i;
    using F = __m512;
    static constexpr int G = 2;
    static constexpr bool vnni = true;
    explicit V512(int64_t next) : next(next) {}

    I ld(const void* p) const { return _mm512_inserti64x4(_mm512_castsi256_si512(V256::ld(p)), V256::ld(at(p)), 1); }
    I u8(const void* p) const { return _mm512_cvtepu8_epi32(cat8(p)); }
    I i8(const void* p) const { return _mm512_cvtepi8_epi32(cat8(p)); }
    F ph(const void* p) const {
        const __m128i lo = _mm_loadu_si128(static_cast<const __m128i*>(p));
        const __m128i hi = _mm_loadu_si128(static_cast<const __m128i*>(at(p)));
        return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
    }
    I i8_pairs(const void* a, const void* b) const {
        const __m128i lo = _mm_unpacklo_epi8(ld8(a), ld8(b)), hi = _mm_unpacklo_epi8(ld8(at(a)), ld8(at(b)));
        return _mm512_cvtepi8_epi16(_mm256_set_m128i(hi, lo));
    }
    static __m256 group(F a, int i) {
        return i ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)) : _mm512_castps512_ps256(a);
    }

    static I zero() { return _mm512_setzero_si512(); }
    static F zerof() { return _mm512_setzero_ps(); }
    static F set1(float v) { return _mm512_set1_ps(v); }
    static I set1_32(int32_t v) { return _mm512_set1_epi32(v); }
    static I set1_16(int16_t v) { return _mm512_set1_epi16(v); }
    static I set1_8(char v) { return _mm512_set1_epi8(v); }
    static I bc4(const int8_t* x) { return _mm512_set1_epi32(rd4(x)); }
    static I and_(I a, I b) { return _mm512_and_si512(a, b); }
    static I or_(I a, I b) { return _mm512_or_si512(a, b); }
    static I xor_(I a, I b) { return _mm512_xor_si512(a, b); }
    static I srl16(I a, int n) { return _mm512_srli_epi16(a, n); }
    static I sll16(I a, int n) { return _mm512_slli_epi16(a, n); }
    static I add32(I a, I b) { return _mm512_add_epi32(a, b); }
    static I sub32(I a, I b) { return _mm512_sub_epi32(a, b); }
    static I mul32(I a, I b) { return _mm512_mullo_epi32(a, b); }
    static I madd16(I a, I b) { return _mm512_madd_epi16(a, b); }
    static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
    static I dotx(I acc, I w, const int8_t* x) {  // as V256::dotx, {1to16}
        asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const Word*>(x)));
        return acc;
    }

   private:
    int64_t next;  // bytes from a group's unit to the next group's
    const void* at(const void* p) const { return static_cast<const uint8_t*>(p) + next; }
    __m128i cat8(const void* p) const { return _mm_unpacklo_epi64(ld8(p), ld8(at(p))); }
};
#endif  // SQ_ZMM

// ---- decoding steps, any width --------------------------------------------------------------------------

// A loaded vector kept in its register: left to itself GCC folds the load into each instruction that reads the
// value (a nibble's shift and its mask), loading the same weights twice, and a one-row tile is bound by loads.
template <class I>
static inline I pinned(I v) {
    asm("" : "+v"(v));
    return v;
}

template <class V>
static inline typename V::I nib(typename V::I q, int hi) {
    const typename V::I m4 = V::set1_8(15);
    return hi ? V::and_(V::srl16(q, 4), m4) : V::and_(q, m4);
}
// bit `bit` of every byte of h, moved to bit position `to` (mask `m` keeps it)
template <class V>
static inline typename V::I hbits(typename V::I h, int bit, int to, int m) {
    const typename V::I s = bit < to ? V::sll16(h, to - bit) : V::srl16(h, bit - to);
    return V::and_(s, V::set1_8(static_cast<char>(m)));
}
// The 4 steps of a Q6_K sub-block from its 3 vectors (UnitQ6K)
template <class V>
static inline void q6_steps(const V& v, const uint8_t (*qv)[STEP], typename V::I* w) {
    using I = typename V::I;
    const I m6 = V::set1_8(63), m4 = V::set1_8(15), m30 = V::set1_8(0x30);
    const I v0 = pinned(v.ld(qv[0])), v1 = pinned(v.ld(qv[1])), v2 = pinned(v.ld(qv[2]));
    w[0] = V::and_(v0, m6);
    w[1] = V::and_(v1, m6);
    w[2] = V::or_(V::and_(v2, m4), V::and_(V::srl16(v0, 2), m30));
    w[3] = V::or_(V::and_(V::srl16(v2, 4), m4), V::and_(V::srl16(v1, 2), m30));
}

// ---- int8-activation tiles: one unit (V::G units side by side), RT <= 16 rows, into acc[RT] ------------
// Loop order: decode the 8 steps of one scale block into registers, then run every row against them.
// (Rows inside the step loop made GCC keep all products alive and spill them.)

// A byte-per-column scale as the block dot takes it: with VNNI int32 lanes that multiply the dot, else the
// int16 pairs (s_c, s_c) that madd widens the int16 sums with (dot8)
template <class V>
static inline typename V::I scale_u8(const V& v, const uint8_t* s) {
    if constexpr (V::vnni) return v.u8(s);
    else return v.u8_pairs(s, s);
}
template <class V>
static inline typename V::I scale_i8(const V& v, const int8_t* s) {
    if constexpr (V::vnni) return v.i8(s);
    else return v.i8_pairs(s, s);
}

// Sum over the 8 steps of one 32-input block. VNNI: the plain dot, which the caller multiplies by the scale;
// else int16 sums of `per` steps, widened with madd by the scale pairs sc2. `rows`: the tile's row count.
template <class V, int per>
static inline typename V::I dot8(const typename V::I* w, const int8_t* x, typename V::I sc2, int rows) {
    typename V::I dot = V::zero();
    if constexpr (V::vnni) {
        // vpdpbusd's latency (4-5 cycles) would bound one row's chain of eight: four chains of two, then. Several
        // rows hide it, and two chains of four take fewer instructions (integer sums: any order, same result).
        if (rows == 1) {
            typename V::I c[4];
            for (int s = 0; s < 4; ++s) c[s] = V::dotx(V::dotx(dot, w[s], x + 4 * s), w[s + 4], x + 4 * s + 16);
            dot = V::add32(V::add32(c[0], c[1]), V::add32(c[2], c[3]));
        } else {
            typename V::I c[2] = {dot, dot};
            for (int s = 0; s < 8; ++s) c[s & 1] = V::dotx(c[s & 1], w[s], x + 4 * s);
            dot = V::add32(c[0], c[1]);
        }
    } else {
        for (int s0 = 0; s0 < 8; s0 += per) {
            typename V::I p = V::maddubs(w[s0], V::bc4(x + 4 * s0));
            for (int s = s0 + 1; s < s0 + per; ++s) p = V::add16(p, V::maddubs(w[s], V::bc4(x + 4 * s)));
            dot = V::add32(dot, V::madd16(p, sc2));
        }
    }
    return dot;
}

template <class V>  // int16 pair sums of 2 steps
static inline typename V::I mad2(typename V::I w0, typename V::I x0, typename V::I w1, typename V::I x1) {
    return V::add16(V::maddubs(w0, x0), V::maddubs(w1, x1));
}

template <class V, bool Q5>
[[gnu::always_inline]] static inline void tile_q45k(const V& v, const void* unit, const Tile& x, int RT, typename V::F* acc) {
    using I = typename V::I;
    using F = typename V::F;
    const UnitQ4K& u = *static_cast<const UnitQ4K*>(unit);  // a Q5_K unit begins with one
    F S[MAX_ROWS];
    for (int r = 0; r < RT; ++r) S[r] = V::zerof();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
        const I h = Q5 ? v.ld(static_cast<const UnitQ5K*>(unit)->qh[j]) : V::zero();
        I w[8];
        for (int t = 0; t < 4; ++t) {  // steps t and t + 4
            const I q = pinned(v.ld(u.qs[j][t]));
            w[t] = nib<V>(q, 0), w[t + 4] = nib<V>(q, 1);
            if (Q5) w[t] = V::or_(w[t], hbits<V>(h, t, 4, 0x10)), w[t + 4] = V::or_(w[t + 4], hbits<V>(h, t + 4, 4, 0x10));
        }
        const I sc = scale_u8(v, u.sc[j]);
        for (int r = 0; r < RT; ++r) {
            I dot = dot8<V, Q5 ? 4 : 8>(w, x.q + r * 32 + j * x.qs, sc, RT);
            if constexpr (V::vnni) dot = V::mul32(dot, sc);
            S[r] = V::fma(V::cvt(dot), V::set1(x.dx[r + j * x.bs]), S[r]);
        }
    }
    // the mins after the scale blocks, each row's in a register: Mn = sum_j m_j * xs_j (done here, the 8 decoded
    // steps no longer compete with RT of them for registers)
    F mf[8];
    for (int j = 0; j < 8; ++j) mf[j] = V::cvt(v.u8(u.m[j]));
    const F d = v.ph(u.d), dmin = v.ph(u.dmin);
    for (int r = 0; r < RT; ++r) {
        F m = V::zerof();
        for (int j = 0; j < 8; ++j) m = V::fma(mf[j], V::set1(x.xs[r + j * x.bs]), m);
        acc[r] = V::fnma(dmin, m, V::fma(d, S[r], acc[r]));
    }
}

// sc_a * sum(w[0..3] . x[0..15]) + sc_b * sum(w[4..7] . x[16..31]) for one row: the two sub-blocks of a block
template <class V>
static inline typename V::I q6_dot(const typename V::I* w, const int8_t* x, typename V::I sa, typename V::I sb) {
    using I = typename V::I;
    if constexpr (V::vnni) {
        I pa = V::zero(), pb = V::zero();
        for (int s = 0; s < 4; ++s) pa = V::dotx(pa, w[s], x + 4 * s), pb = V::dotx(pb, w[s + 4], x + 16 + 4 * s);
        return V::add32(V::mul32(pa, sa), V::mul32(pb, sb));
    } else {
        I dot = V::madd16(mad2<V>(w[0], V::bc4(x), w[1], V::bc4(x + 4)), sa);
        dot = V::add32(dot, V::madd16(mad2<V>(w[2], V::bc4(x + 8), w[3], V::bc4(x + 12)), sa));
        dot = V::add32(dot, V::madd16(mad2<V>(w[4], V::bc4(x + 16), w[5], V::bc4(x + 20)), sb));
        return V::add32(dot, V::madd16(mad2<V>(w[6], V::bc4(x + 24), w[7], V::bc4(x + 28)), sb));
    }
}

template <class V>
[[gnu::always_inline]] static inline void tile_q6k(const V& v, const void* unit, const Tile& x, int RT, typename V::F* acc) {
    using I = typename V::I;
    using F = typename V::F;
    const UnitQ6K& u = *static_cast<const UnitQ6K*>(unit);
    F S[MAX_ROWS];
    for (int r = 0; r < RT; ++r) S[r] = V::zerof();
#pragma GCC unroll 1
    for (int b = 0; b < 8; ++b) {  // activation block = sub-blocks 2b, 2b+1: steps 0-3 and 4-7
        I w[8];
        q6_steps(v, u.qv[2 * b], w);
        q6_steps(v, u.qv[2 * b + 1], w + 4);
        // the -32 offset of Q6_K: 32 * (sc_a * sum_a(xq) + sc_b * sum_b(xq)), as one madd
        const I off = V::sll16(v.i8_pairs(u.sc[2 * b], u.sc[2 * b + 1]), 5);
        const I sa = scale_i8(v, u.sc[2 * b]), sb = scale_i8(v, u.sc[2 * b + 1]);
        for (int r = 0; r < RT; ++r) {
            I dot = q6_dot<V>(w, x.q + r * 32 + b * x.qs, sa, sb);
            dot = V::sub32(dot, V::madd16(off, V::set1_32(x.bs16[r + b * x.bs])));
            S[r] = V::fma(V::cvt(dot), V::set1(x.dx[r + b * x.bs]), S[r]);
        }
    }
    const F d = v.ph(u.d);
    for (int r = 0; r < RT; ++r) acc[r] = V::fma(d, S[r], acc[r]);
}

template <class V>
[[gnu::always_inline]] static inline void tile_q80(const V& v, const void* unit, const Tile& x, int RT, typename V::F* acc) {
    using I = typename V::I;
    const UnitQ80& u = *static_cast<const UnitQ80*>(unit);
    I sum[MAX_ROWS];
    for (int r = 0; r < RT; ++r) sum[r] = V::zero();
#pragma GCC unroll 2  // left to itself GCC keeps this loop in the template: one-row calls took ~40% longer
    for (int half = 0; half < 8; half += 4) {  // 4 steps at a time keep weights and |weights| in registers
        I w[4], aw[4];
        for (int s = 0; s < 4; ++s) {
            w[s] = v.ld(u.q[half + s]);
            if constexpr (V::vnni) aw[s] = V::xor_(w[s], V::set1_8(static_cast<char>(0x80)));  // w + 128, unsigned
            else aw[s] = V::abs8(w[s]);
        }
        for (int r = 0; r < RT; ++r) {
            const int8_t* xr = x.q + r * 32 + 4 * half;
            if constexpr (V::vnni) {
                // two short chains, not one of 8 dependent dot products: a row alone waited on their latency
                // (the draft's Q8_0 LM head, 1 row: 2.04 -> 1.52 ms on Zen 5)
                const I z = V::zero();
                const I p = V::dotx(V::dotx(z, aw[0], xr), aw[1], xr + 4);
                const I p2 = V::dotx(V::dotx(z, aw[2], xr + 8), aw[3], xr + 12);
                sum[r] = V::add32(sum[r], V::add32(p, p2));
            } else {
                for (int s = 0; s < 4; ++s) {
                    const I sx = V::sign8(V::bc4(xr + 4 * s), w[s]);
                    sum[r] = V::add32(sum[r], V::madd16(V::maddubs(aw[s], sx), V::set1_16(1)));
                }
            }
        }
    }
    const typename V::F d = v.ph(u.d);
    for (int r = 0; r < RT; ++r) {
        if constexpr (V::vnni) sum[r] = V::sub32(sum[r], V::set1_32(128 * x.bs32[r]));
        acc[r] = V::fma(V::cvt(sum[r]), V::mul(d, V::set1(x.dx[r])), acc[r]);
    }
}

template <class V>
[[gnu::always_inline]] static inline void tile_q50(const V& v, const void* unit, const Tile& x, int RT, typename V::F* acc) {
    using I = typename V::I;
    const UnitQ50& u = *static_cast<const UnitQ50*>(unit);
    const I h = v.ld(u.qh);
    I w[8];
    for (int t = 0; t < 4; ++t) {  // steps t and t + 4
        const I q = pinned(v.ld(u.qs[t]));
        w[t] = V::or_(nib<V>(q, 0), hbits<V>(h, t, 4, 0x10));
        w[t + 4] = V::or_(nib<V>(q, 1), hbits<V>(h, t + 4, 4, 0x10));
    }
    const typename V::F d = v.ph(u.d);
    for (int r = 0; r < RT; ++r) {
        const I dot = V::sub32(dot8<V, 4>(w, x.q + r * 32, V::set1_16(1), RT), V::set1_32(16 * x.bs32[r]));
        acc[r] = V::fma(V::cvt(dot), V::mul(d, V::set1(x.dx[r])), acc[r]);
    }
}

template <class V>
[[gnu::always_inline]] static inline void tile_q40(const V& v, const void* unit, const Tile& x, int RT, typename V::F* acc) {
    using I = typename V::I;
    const UnitQ40& u = *static_cast<const UnitQ40*>(unit);
    I w[8];
    for (int t = 0; t < 4; ++t) {  // steps t and t + 4
        const I q = pinned(v.ld(u.qs[t]));
        w[t] = nib<V>(q, 0);
        w[t + 4] = nib<V>(q, 1);
    }
    const typename V::F d = v.ph(u.d);
    for (int r = 0; r < RT; ++r) {
        // 4-bit quants: 8 steps of int16 pair sums stay below 2^15 (8 * 2 * 15 * 128), as for Q4_K
        const I dot = V::sub32(dot8<V, 8>(w, x.q + r * 32, V::set1_16(1), RT), V::set1_32(8 * x.bs32[r]));
        acc[r] = V::fma(V::cvt(dot), V::mul(d, V::set1(x.dx[r])), acc[r]);
    }
}

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

static void decode_unit(int qtype, const void* unit, float* w) {
    using V = V256;
    const __m256 zero = _mm256_setzero_ps();
    switch (qtype) {
        case Q4_K:
        case Q5_K: {
            const UnitQ4K& u = *static_cast<const UnitQ4K*>(unit);  // a Q5_K unit begins with one
            const __m256 d = V::ph(u.d), dmin = V::ph(u.dmin);
            for (int j = 0; j < 8; ++j) {
                const __m256 D = _mm256_mul_ps(d, _mm256_cvtepi32_ps(V::u8(u.sc[j])));
                const __m256 M = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(V::u8(u.m[j])));
                const __m256i h = qtype == Q5_K ? V::ld(static_cast<const UnitQ5K*>(unit)->qh[j]) : V::zero();
                for (int t = 0; t < 4; ++t) {
                    const __m256i q = V::ld(u.qs[j][t]);
                    __m256i lo = nib<V>(q, 0), hi = nib<V>(q, 1);
                    if (qtype == Q5_K) lo = V::or_(lo, hbits<V>(h, t, 4, 0x10)), hi = V::or_(hi, hbits<V>(h, t + 4, 4, 0x10));
                    put_step(lo, 32 * j + 4 * t, D, M, true, 0, w);
                    put_step(hi, 32 * j + 4 * t + 16, D, M, true, 0, w);
                }
            }
            break;
        }
        case Q6_K: {
            const UnitQ6K& u = *static_cast<const UnitQ6K*>(unit);
            const __m256 d = V::ph(u.d);
            for (int j = 0; j < 16; ++j) {
                const __m256 D = _mm256_mul_ps(d, _mm256_cvtepi32_ps(V::i8(u.sc[j])));
                __m256i st[4];
                q6_steps(V(), u.qv[j], st);
                for (int s = 0; s < 4; ++s) put_step(st[s], 16 * j + 4 * s, D, zero, false, 32, w);
            }
            break;
        }
        case Q8_0: {
            const UnitQ80& u = *static_cast<const UnitQ80*>(unit);
            const __m256 d = V::ph(u.d);
            for (int s = 0; s < 8; ++s) {
                const __m256i sv = V::ld(u.q[s]);
                for (int e = 0; e < 4; ++e) {
                    const __m256i qi = _mm256_srai_epi32(_mm256_slli_epi32(sv, 24 - 8 * e), 24);
                    _mm256_store_ps(w + 8 * (4 * s + e), _mm256_mul_ps(_mm256_cvtepi32_ps(qi), d));
                }
            }
            break;
        }
        case Q5_0: {
            const UnitQ50& u = *static_cast<const UnitQ50*>(unit);
            const __m256 d = V::ph(u.d);
            const __m256i h = V::ld(u.qh);
            for (int t = 0; t < 4; ++t) {
                const __m256i q = V::ld(u.qs[t]);
                put_step(V::or_(nib<V>(q, 0), hbits<V>(h, t, 4, 0x10)), 4 * t, d, zero, false, 16, w);
                put_step(V::or_(nib<V>(q, 1), hbits<V>(h, t + 4, 4, 0x10)), 4 * t + 16, d, zero, false, 16, w);
            }
            break;
        }
        case Q4_0: {
            const UnitQ40& u = *static_cast<const UnitQ40*>(unit);
            const __m256 d = V::ph(u.d);
            for (int t = 0; t < 4; ++t) {
                const __m256i q = V::ld(u.qs[t]);
                put_step(nib<V>(q, 0), 4 * t, d, zero, false, 8, w);
                put_step(nib<V>(q, 1), 4 * t + 16, d, zero, false, 8, w);
            }
            break;
        }
        case F16: {
            const UnitF16& u = *static_cast<const UnitF16*>(unit);
            for (int k = 0; k < UnitF16::K; ++k) _mm256_store_ps(w + 8 * k, V::ph(u.w[k]));
            break;
        }
        case BF16: {  // the 16 bits into the top of each lane: exact
            const UnitBF16& u = *static_cast<const UnitBF16*>(unit);
            for (int k = 0; k < UnitBF16::K; ++k) {
                const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u.w[k])));
                _mm256_store_ps(w + 8 * k, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
            }
            break;
        }
        default:
            break;
    }
}

// ---- the fp16 KV pool's rows (F16C): written rounded to nearest even, as float_to_half; read back exactly --------

void to_half(const float* x, int64_t n, uint16_t* out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; ++i) out[i] = float_to_half(x[i]);
}
static inline void widen_halves(const uint16_t* h, int n, float* out) {  // n a multiple of 8 (head dims are)
    for (int i = 0; i < n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
}

// ---- re-quantization to Q4_0 (a cheaper draft) ------------------------------------------------------------
// scalar::requant_q40's rule with a group's 8 columns side by side: each unit decoded once to its exact weights
// (decode_unit), then per 32-input block the first largest magnitude, d = it / -8, q = min(15, trunc(x * (1/d) +
// 8.5)) with the multiply and the add each rounded as in the scalar code, and d to half by F16C (nearest even, as
// float_to_half). The scalar one, a column and a block at a time, took ~1.5 s of every load of the embedded pair.
void requant_q40(int qtype, const uint8_t* packed, int64_t N, int64_t K, uint8_t* out, int nthreads) {
    Layout L;
    layout_of(qtype, &L);
    Layout L40;
    layout_of(Q4_0, &L40);
    const Packing P(L, N, K), P40(L40, N, K);
    const int64_t groups = P.groups, units = P.units;
    const int per_unit = L.unit_k / UnitQ40::K;
#pragma omp parallel for schedule(dynamic, chunk_of(groups, nthreads)) num_threads(nthreads)
    for (int64_t g = 0; g < groups; ++g) {
        alignas(32) float w[256 * GROUP];
        const __m256 sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
        for (int64_t u = 0; u < units; ++u) {
            const uint8_t* unit = packed + P.at(g, u) * L.unit_bytes;
            const float* wu = w;
            if (qtype == F32) wu = reinterpret_cast<const UnitF32*>(unit)->w[0];  // read in place
            else decode_unit(qtype, unit, w);
            for (int b = 0; b < per_unit; ++b) {
                const float* x = wu + GROUP * UnitQ40::K * b;  // (32 inputs, 8 columns)
                __m256 amax = zero, mx = zero;
                for (int i = 0; i < UnitQ40::K; ++i) {
                    const __m256 v = _mm256_loadu_ps(x + GROUP * i), a = _mm256_andnot_ps(sign, v);
                    const __m256 more = _mm256_cmp_ps(amax, a, _CMP_LT_OQ);  // strictly: the first of equals stays
                    amax = _mm256_blendv_ps(amax, a, more);
                    mx = _mm256_blendv_ps(mx, v, more);
                }
                const __m256 d = _mm256_div_ps(mx, _mm256_set1_ps(-8.0f));
                const __m256 id = _mm256_and_ps(_mm256_cmp_ps(d, zero, _CMP_NEQ_UQ), _mm256_div_ps(_mm256_set1_ps(1.0f), d));
                auto& dst = *reinterpret_cast<UnitQ40*>(out + P40.at(g, u * per_unit + b) * sizeof(UnitQ40));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(dst.d), _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                __m256i q[UnitQ40::K];
                for (int i = 0; i < UnitQ40::K; ++i) {
                    const __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + GROUP * i), id), _mm256_set1_ps(8.5f));
                    q[i] = _mm256_min_epi32(_mm256_cvttps_epi32(t), _mm256_set1_epi32(15));
                }
                for (int t = 0; t < 4; ++t) {  // step t: inputs 4t..4t+3 in the low nibbles, 16 + 4t.. in the high
                    __m256i v = _mm256_setzero_si256();
                    for (int e = 0; e < 4; ++e) {
                        const __m256i byte = _mm256_or_si256(q[4 * t + e], _mm256_slli_epi32(q[16 + 4 * t + e], 4));
                        v = _mm256_or_si256(v, _mm256_slli_epi32(byte, 8 * e));  // column c's byte 4c + e
                    }
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst.qs[t]), v);
                }
            }
        }
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

template <class V>
using TileFn = void (*)(const V&, const void*, const Tile&, int, typename V::F*);

// Split R rows into balanced tiles of at most `most` rows; returns the number of tiles.
static int row_tiles(int R, int most, int* sizes) {
    const int n = (R + most - 1) / most;
    for (int i = 0; i < n; ++i) sizes[i] = R / n + (i < R % n ? 1 : 0);
    return n;
}

// Ask for the bytes 6 KB past this unit. Past the buffer's end it is harmless: prefetches do not fault.
// __builtin_prefetch, not _mm_prefetch: GCC 12 drops the latter (silently) inside an always_inline function.
constexpr int AHEAD = 6144;
static inline void prefetch_ahead(const uint8_t* unit, int bytes) {
    for (int off = 0; off < bytes; off += 64) __builtin_prefetch(unit + AHEAD + off, 0, 3);
}

static inline void store_group(const __m256* acc, int R, const MatArgs& a, int64_t g) {
    const int64_t n0 = g * GROUP, nv = std::min<int64_t>(GROUP, a.N - n0);
    const __m256 b = a.bias && nv == GROUP ? _mm256_loadu_ps(a.bias + n0) : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r) {
        float* o = a.out + r * a.row_stride() + n0;
        if (nv == GROUP) {
            _mm256_storeu_ps(o, a.bias ? _mm256_add_ps(acc[r], b) : acc[r]);
        } else {
            alignas(32) float t[GROUP];
            _mm256_store_ps(t, acc[r]);
            for (int c = 0; c < nv; ++c) o[c] = a.bias ? t[c] + a.bias[n0 + c] : t[c];
        }
    }
}

// The activations of row r0 of the unit at position u along K (block-major: its first block is u * blocks per
// unit * R).
static inline Tile tile_at(const ActQ& x, const Layout& L, int64_t u, int r0) {
    const int64_t b0 = u * (L.unit_k / ABLK) * x.R + r0;
    return Tile{x.q + 32 * b0, x.dx + b0, x.xs + b0, x.bs16 + b0, x.bs32 + b0, 32 * x.R, x.R};
}

// Rows a tile takes at once, named at compile time: the tile is inlined into the unit loop with its per-row sums in
// registers where they fit (no call per unit). More rows run as balanced tiles of at most this many, one after the
// other on each unit while it sits in L1. 256-bit builds: 9 rows (a verify pass of K <= 8 in one tile); in tiles of
// at most 4 or 6 rows, passes of 5-9 rows over Q4_K took up to 13% longer than in one (the unit decoded again for
// each tile), and Q6_K (3 more live scale registers) keeps one tile for all rows called with the count at run time
// (R = 0 below): inlined with a fixed count it spilled, and its passes of 3-9 rows took 30-70% longer on Zen 4's
// AVX2 path.
#if SQ_ZMM
constexpr int TILE_ROWS = MAX_ROWS;
#else
constexpr int TILE_ROWS = 9;
#endif

template <class V, TileFn<V> tile>
[[gnu::noinline]] static void tile_rows_any(const V& v, const void* unit, const Tile& x, int RT, typename V::F* acc) {
    tile(v, unit, x, RT, acc);
}

// R rows of n items of V::G groups from g on (V::G groups side by side), through all units of K a slice at a time
// (R = 0: x.R rows, one tile called with the count at run time): V::G streams of weights, one register per row.
// Against that run-time tile, passes of 3-9 rows over a Q4_K layer took 20-30% less time on Zen 4 (AVX-512), over a
// Q5_0 or Q8_0 layer 30-40% less. Where K is sliced the items are one run (Packing): each slice's activations are
// read by all of them while in L1, and the weights are read in the order they lie. A column's units still add up
// in K's order, so the bits are those of one pass over K.
template <class V, int R, TileFn<V> tile>
static void groups_q8(const MatArgs& a, const ActQ& x, const Layout& L, const Packing& P, int64_t g, int64_t n) {
    constexpr int nt = (R + TILE_ROWS - 1) / TILE_ROWS, rows = nt ? R / nt : 0, extra = nt ? R % nt : 0;  // nt tiles
    const int nrows = R ? R : x.R;
    typename V::F acc[RUN][R ? R : MAX_ROWS];
    for (int64_t i = 0; i < n; ++i)
        for (int r = 0; r < nrows; ++r) acc[i][r] = V::zerof();
    for (int64_t s0 = 0; s0 < P.units; s0 += P.slice) {
        const int64_t len = std::min(P.slice, P.units - s0), span = len * L.unit_bytes;
        const V v(span);  // a group's units over this slice, and so the distance to the next group's
        for (int64_t i = 0; i < n; ++i) {
            const uint8_t* unit = a.packed + P.at(g + i * V::G, s0) * L.unit_bytes;
            typename V::F sums[R ? R : MAX_ROWS];  // in registers through the slice
            for (int r = 0; r < nrows; ++r) sums[r] = acc[i][r];
            for (int64_t u = s0; u < s0 + len; ++u, unit += L.unit_bytes) {
                // AHEAD in each stream; with two, past their end into the next pair's (where this thread most
                // likely goes next) rather than into the other stream
                const int64_t skip = (u - s0) * L.unit_bytes + AHEAD >= span ? (V::G - 1) * span : 0;
                // Over 1-6 rows one stream per thread is left to the hardware prefetcher unless tune.py found the
                // requests faster here (g_stream_prefetch): on Zen 4 asking for each unit 6 KB ahead, or a few lines
                // per block, cost 3-5% at one row (a draft step, a target step) and up to 22% over 2-5 rows. Over 7
                // or more rows, and for pairs of streams, the requests streamed better (a Q4_K layer over 9 rows
                // from memory 20% faster).
                constexpr bool few = R >= 1 && R <= 6 && V::G == 1;
                if (!few || g_stream_prefetch)
                    for (int j = 0; j < V::G; ++j) prefetch_ahead(unit + j * span + skip, L.unit_bytes);
                if constexpr (R == 0) {
                    tile_rows_any<V, tile>(v, unit, tile_at(x, L, u, 0), nrows, sums);
                } else {
                    for (int t = 0, r0 = 0; t < nt; ++t) {  // `extra` tiles of rows + 1, then tiles of rows
                        const Tile tx = tile_at(x, L, u, r0);
                        // (a constant condition: no tile of rows + 1 is compiled where there is none, as at 16 rows)
                        if constexpr (extra > 0) {
                            if (t < extra) {
                                tile(v, unit, tx, rows + 1, sums + r0), r0 += rows + 1;
                                continue;
                            }
                        }
                        tile(v, unit, tx, rows, sums + r0), r0 += rows;
                    }
                }
            }
            for (int r = 0; r < nrows; ++r) acc[i][r] = sums[r];
        }
    }
    for (int64_t i = 0; i < n; ++i)
        for (int j = 0; j < V::G; ++j) {
            __m256 cols[MAX_ROWS];
            for (int r = 0; r < nrows; ++r) cols[r] = V::group(acc[i][r], j);
            store_group(cols, nrows, a, g + i * V::G + j);
        }
}

template <class V>
using GroupsFn = void (*)(const MatArgs&, const ActQ&, const Layout&, const Packing&, int64_t, int64_t);

template <class V, TileFn<V> tile, int... N>
static GroupsFn<V> by_rows(int rows, std::integer_sequence<int, N...>) {
    static constexpr GroupsFn<V> fns[] = {groups_q8<V, N + 1, tile>...};
    return fns[rows - 1];
}

template <class V>
static GroupsFn<V> groups_fn(int qtype, int rows) {  // rows 1 .. MAX_ROWS
    using Rows = std::make_integer_sequence<int, MAX_ROWS>;
    switch (qtype) {
        case Q4_K: return by_rows<V, tile_q45k<V, false>>(rows, Rows{});
        case Q5_K: return by_rows<V, tile_q45k<V, true>>(rows, Rows{});
        case Q6_K:  // the run-time row loop where its tiles do not fit the registers (TILE_ROWS above)
            return TILE_ROWS < MAX_ROWS && rows > 1 ? groups_q8<V, 0, tile_q6k<V>> : by_rows<V, tile_q6k<V>>(rows, Rows{});
        case Q8_0: return by_rows<V, tile_q80<V>>(rows, Rows{});
        case Q5_0: return by_rows<V, tile_q50<V>>(rows, Rows{});
        case Q4_0: return by_rows<V, tile_q40<V>>(rows, Rows{});
        default: return nullptr;
    }
}

#if SQ_ZMM
// Pairs of groups from this many rows on. Below, a call is bound by memory, and two streams per thread read it
// ~10-40% slower than one; from 3 rows on (Q6_K, with its larger units: 7) the halved instruction count wins on
// Zen 5 (python -m scripts.bench.kernels --isa avxvnni,avx512vnni). Zen 4 runs a 512-bit operation as two halves, and
// there pairs made passes of 3-7 tokens 5-15% slower: engine/cpu/tune.py times both on the machine and sets
// g_pair_from (isa.h).
static int pair_rows(int qtype) { return g_pair_from ? g_pair_from : qtype == Q6_K ? 7 : 3; }
#endif

// One parallel loop over the output groups of all parts: a layer stored as parts of different block types (q | k | v
// of a Q4_K_M file) then costs one fork/join and one tail, not one per part.
void matmul_q8(const MatArgs* parts, int n, const ActQ& x) {
    struct Part {
        Layout L;
        Packing P;
        int64_t span, items;  // groups per item: a run where K is sliced, else one group or pair
        GroupsFn<V256> one;
#if SQ_ZMM
        GroupsFn<V512> two;  // null: one group per register
#endif
    } p[MAX_PARTS];
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
        const MatArgs& a = parts[i];
        Part& q = p[i];
        layout_of(a.qtype, &q.L);
        q.P = Packing(q.L, a.N, a.K);
        q.one = groups_fn<V256>(a.qtype, x.R);
        q.span = q.P.slice < q.P.units ? RUN : 1;
#if SQ_ZMM
        q.two = x.R >= pair_rows(a.qtype) ? groups_fn<V512>(a.qtype, x.R) : nullptr;
        if (q.two) q.span = std::max<int64_t>(q.span, 2);
#endif
        q.items = (q.P.groups + q.span - 1) / q.span;
        total += q.items;
    }
    const int nthreads = parts[0].nthreads;
    // Guided: each grab takes a share of what is left (half, then a quarter, ... with two threads) down to a quarter
    // of chunk_of's chunk, so a thread streams long runs of weights and takes the shared counter ~6 times a call,
    // and the tail still splits finely. Against chunk_of's equal chunks (16 grabs), a one-token target step took
    // 0-8% less time on Zen 4, a draft step 2-14% (in one process, the schedules taking turns).
#pragma omp parallel for schedule(guided, std::max(1, chunk_of(total, nthreads) / 4)) num_threads(nthreads)
    for (int64_t it = 0; it < total; ++it) {
        int i = 0;
        int64_t j = it;
        while (j >= p[i].items) j -= p[i++].items;
        const Part& q = p[i];
        const int64_t g = j * q.span, count = std::min(q.span, q.P.groups - g);
#if SQ_ZMM
        if (q.two) {  // an odd last group goes alone
            if (count >= 2) q.two(parts[i], x, q.L, q.P, g, count / 2);
            if (count % 2) q.one(parts[i], x, q.L, q.P, g + count - 1, 1);
            continue;
        }
#endif
        q.one(parts[i], x, q.L, q.P, g, count);
    }
}

void matmul_f32(const MatArgs& a, const float* x, int R) {
    Layout L;
    layout_of(a.qtype, &L);
    const Packing P(L, a.N, a.K);
    const int64_t groups = P.groups, units = P.units;
    int sizes[MAX_ROWS];
    const int ntiles = row_tiles(R, 3, sizes);
#pragma omp parallel for schedule(dynamic, chunk_of(groups, a.nthreads)) num_threads(a.nthreads)
    for (int64_t g = 0; g < groups; ++g) {
        alignas(32) float w[256 * GROUP];
        __m256 acc4[4 * MAX_ROWS];
        for (int i = 0; i < 4 * R; ++i) acc4[i] = _mm256_setzero_ps();
        for (int64_t u = 0; u < units; ++u) {
            const uint8_t* unit = a.packed + P.at(g, u) * L.unit_bytes;
            prefetch_ahead(unit, L.unit_bytes);
            const float* wu = w;
            if (a.qtype == F32) {
                wu = reinterpret_cast<const UnitF32*>(unit)->w[0];
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

// Per 32-input block of a row: the scalar rule (kernels_scalar.cpp) in 8 lanes. The horizontal max and sums are
// exact in any order, so they reduce in registers (std::fmax had compiled to a libm call per lane); |x| goes first
// into max_ps so that, as with fmax, a NaN input never becomes the block's amax.
void quantize_acts(const float* x, int R, int64_t K, int8_t* q, float* dx, float* xs, int32_t* bs16, int32_t* bs32) {
    const int64_t nb = K / ABLK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int r = 0; r < R; ++r)  // row by row, x read in order: block by block across rows, an 8960 -> 1536 layer over
        for (int64_t b = 0; b < nb; ++b) {  // 5 rows took ~13 us longer (x in L3, alternating processes, Zen 4)
            const float* xb = x + r * K + b * ABLK;
            const int64_t o = b * R + r;  // block-major: a block's rows are adjacent
            __m256 v[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i), m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
            __m256i qi[4];
            for (int i = 0; i < 4; ++i)
                qi[i] = _mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(id)),
                                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            const __m256i p16 = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
            const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b), order);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + o * ABLK), p8);
            // the two 16-input halves' sums: two rounds of pairwise adds leave [h0 h1 h0 h1] partial sums in each 128-bit half
            __m256i h = _mm256_hadd_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
            h = _mm256_hadd_epi32(h, h);
            const __m128i h4 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            const int h0 = _mm_cvtsi128_si32(h4), h1 = _mm_extract_epi32(h4, 1);
            dx[o] = d;
            bs32[o] = h0 + h1;
            xs[o] = d * static_cast<float>(bs32[o]);
            bs16[o] = static_cast<int32_t>((static_cast<uint32_t>(h0) & 0xFFFF) | (static_cast<uint32_t>(h1) << 16));
        }
}
