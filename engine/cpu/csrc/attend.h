// Causal attention of T <= 16 queries over a layer's cached keys, and the MLP's SiLU and GELU, included once per
// instruction set inside its namespace (after the file's `#pragma GCC target`). Written with GCC vector types rather than
// intrinsics: every lane does the same IEEE multiply and add in the same order under every target (no FMA:
// -ffp-contract=off), so all ISAs give the same bits.
//
// Keys are taken in chunks of KEY_CHUNK positions, fixed by position (chunk c holds keys c*KEY_CHUNK ..), as in
// split-K "flash decoding". One work item is a (chunk, KV head), for all the queries of the call: there is work for
// every core even for one query. Inside it, keys go KEY_BLOCK at a time through the queries and the G query heads
// that share the KV head, so each block of K and V rows comes from L2 or memory once and from L1 T * G times (a pass
// per query head read them G times: 2x slower at 2000 positions over the whole cache; a chunk per query head from
// L2, ~8% slower than blocks from L1). Each (query, head, chunk) keeps its own max, sum and unnormalised output; a
// second loop merges the chunks in order. The cache is head-major (Hkv, slots, D) per layer, so an item reads one
// contiguous stretch of K and one of V: with slots interleaving the heads, each item read every other half of each
// slot, and after 1500 positions one-token draft steps took ~27% longer, the target's ~10%.
//
// An fp16 pool's rows are widened to fp32 once per block into a scratch block (widen_halves, from the including file),
// which every query and head then reads: widening inside the dot products did it T * G times, and a 5-token pass took
// ~12% longer than over fp32 rows. The widening is exact, so the bits are those of an fp32 pool holding the same values.
//
// Batch invariance: a (query, head, chunk) result depends only on the query, the head and the keys of the chunk
// the query may see, in ascending order, and the merge runs over chunks in ascending order. So a position's bits
// do not depend on T, on the other queries, or on which thread ran what: a verify pass of K+1 queries gives each
// position the bits a one-token step gives it.
//
// A sliding window (Mistral, Gemma 3's local layers) moves the first key a query sees to max(0, p - window + 1): a
// chunk then holds, for each query, one contiguous run of the keys it sees (the chunks are still fixed by position),
// the query's work skips the chunks wholly before its window, and its merge starts at its first chunk. Which keys a
// query sees depends on its position alone, so the argument above holds unchanged.

typedef float f8 __attribute__((vector_size(32)));

static inline f8 load8(const float* p) {
    f8 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
static inline float hsum8(f8 a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

typedef int32_t i8v __attribute__((vector_size(32)));

// e^x in 8 lanes, Cephes' expf scheme (within ~2 ulp): x = n ln2 + r, a degree-6 polynomial in r, times 2^n.
// Vectorized because a step evaluates ~300k of them (SiLU of every MLP row, attention softmaxes), where the
// C library's scalar expf cost ~10% of a 9-token pass. Same bits on every target: plain lane arithmetic.
static inline f8 exp8(f8 x) {
    const f8 hi = {88.3762626647949f, 88.3762626647949f, 88.3762626647949f, 88.3762626647949f,
                   88.3762626647949f, 88.3762626647949f, 88.3762626647949f, 88.3762626647949f};
    x = x < -hi ? -hi : x;  // also maps -inf to the smallest normal result
    x = x > hi ? hi : x;
    const f8 magic = f8{} + 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to nearest
    const f8 n = (x * 1.44269504088896341f + magic) - magic;
    const f8 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    f8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const i8v bits = (__builtin_convertvector(n, i8v) + 127) << 23;
    f8 scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// out (T, I) = silu(gate) * up for gu (T, 2I) = gate | up; I a multiple of 8.
void silu_mul(const float* gu, int T, int64_t I, float* out, int nthreads) {
    const int64_t per_row = I / 8, n = T * per_row;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n; ++i) {
        const int64_t t = i / per_row, c = 8 * (i % per_row);
        const f8 g = load8(gu + t * 2 * I + c), u = load8(gu + t * 2 * I + I + c);
        const f8 r = g / (1.0f + exp8(-g)) * u;
        std::memcpy(out + t * I + c, &r, sizeof r);
    }
}

// out (T, I) = gelu_tanh(gate) * up for gu (T, 2I) = gate | up; I a multiple of 8. gelu_tanh(x) =
// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x / (1 + e^(-2u)) (the same function:
// 1 + tanh(u) = 2 / (1 + e^(-2u))), which needs only exp8 and has no cancellation where tanh(u) nears -1.
// Gemma's MLP activation (HF's gelu_pytorch_tanh).
void gelu_tanh_mul(const float* gu, int T, int64_t I, float* out, int nthreads) {
    const int64_t per_row = I / 8, n = T * per_row;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n; ++i) {
        const int64_t t = i / per_row, c = 8 * (i % per_row);
        const f8 g = load8(gu + t * 2 * I + c), u = load8(gu + t * 2 * I + I + c);
        const f8 inner = (g + (g * g * g) * 0.044715f) * 0.7978845608028654f;  // sqrt(2/pi)
        const f8 r = g / (1.0f + exp8(inner * -2.0f)) * u;
        std::memcpy(out + t * I + c, &r, sizeof r);
    }
}

constexpr int KEY_CHUNK = 128;  // keys per work item: K and V rows of one KV head, 128 KB at D = 128 in fp32
constexpr int KEY_BLOCK = 32;   // keys whose K or V rows serve all G heads from L1: 16 KB at D = 128
constexpr int KEYS_AHEAD = 16;  // how far ahead scores() prefetches keys (8 measured alike, 32 and 64 a little worse)

// Maxima here never hold a NaN (the lanes start at -inf and keep theirs against one), so std::max, which passes over a
// NaN second argument as fmax does, gives fmax's result without its libm call.
static inline float hmax8(f8 a) {
    return std::max(std::max(std::max(a[0], a[1]), std::max(a[2], a[3])),
                    std::max(std::max(a[4], a[5]), std::max(a[6], a[7])));
}

// [hsum8(c[0]), ..., hsum8(c[7])]: each lane is summed in hsum8's order, ((0+1)+(2+3))+((4+5)+(6+7)),
// by three rounds of pairwise adds across the eight vectors instead of eight separate reductions.
static inline f8 hsum8x8(const f8* c) {
    typedef int32_t m8 __attribute__((vector_size(32)));
    const auto pair = [](f8 x, f8 y) {  // [x0+x1, x2+x3, y0+y1, y2+y3, x4+x5, x6+x7, y4+y5, y6+y7]
        return __builtin_shuffle(x, y, m8{0, 2, 8, 10, 4, 6, 12, 14}) + __builtin_shuffle(x, y, m8{1, 3, 9, 11, 5, 7, 13, 15});
    };
    const f8 lo_hi0 = pair(pair(c[0], c[1]), pair(c[2], c[3]));  // [lo(c0..c3), hi(c0..c3)]
    const f8 lo_hi1 = pair(pair(c[4], c[5]), pair(c[6], c[7]));
    return __builtin_shuffle(lo_hi0, lo_hi1, m8{0, 1, 2, 3, 8, 9, 10, 11}) +
           __builtin_shuffle(lo_hi0, lo_hi1, m8{4, 5, 6, 7, 12, 13, 14, 15});
}

// max, then e_j = exp(s_j - max) in place, and their sum (8 lanes, hsum8, then the tail): part[0..1] = max, sum.
static void softmax_part(float* s, int64_t n, float* part) {
    const int64_t full = n / 8 * 8;
    f8 m8 = f8{} - INFINITY;
    for (int64_t j = 0; j < full; j += 8) {
        const f8 v = load8(s + j);
        m8 = v > m8 ? v : m8;
    }
    float mx = hmax8(m8);  // max is exact whatever the order
    for (int64_t j = full; j < n; ++j) mx = std::max(mx, s[j]);
    f8 l8 = {};
    for (int64_t j = 0; j < n; j += 8) {  // s has room for the last partial vector
        const f8 e = exp8(load8(s + j) - mx);
        std::memcpy(s + j, &e, sizeof e);
        if (j < full) l8 += e;
    }
    float sum = hsum8(l8);
    for (int64_t j = full; j < n; ++j) sum += s[j];
    part[0] = mx, part[1] = sum;
}

// The two loops of a work item, as functions of their own: inlined into attend_queries' loops over queries and heads,
// GCC ran out of registers and kept the sums on the stack, and a pass took 10-30% longer than with one item per
// query. One query through them measured 0.87-1.06 of its time with the loops inline (within the host's noise).

// s[i] = (q . k_i) * scale for the n keys whose rows are given: the dot product in 8 lanes in d order, then hsum8;
// eight keys at a time (hsum8x8 sums each lane in hsum8's order), then one at a time.
// ahead (or null): the pool's contiguous rows KEYS_AHEAD keys after rows[0], of which nahead exist, `esize` bytes an
// element. While a group of 8 keys is scored, the rows of the group KEYS_AHEAD on are asked for, esize of their lines
// per d step (all of them over the D / 8 steps): the hardware prefetcher misses the order a group's rows are read in
// (8 rows, a vector of each at a time), and a one-token pass over a long cache waited on them.
template <int DV_>
[[gnu::noinline]] static void scores(const float* q, const float* const* rows, int64_t n, int DV, float scale,
                                     float* s, const char* ahead, int64_t nahead, int esize) {
    if (DV_) DV = DV_;
    const int64_t full = n / 8 * 8;
    for (int64_t i = 0; i < full; i += 8) {
        const float* const* k = rows + i;
        const char* pf = ahead && i + 8 <= nahead ? ahead + i * 8 * DV * esize : nullptr;
        f8 c[8] = {};
        for (int d = 0; d < DV; ++d) {
            if (pf)
                for (int l = 0; l < esize; ++l) __builtin_prefetch(pf + 64 * (esize * d + l));
            const f8 qd = load8(q + 8 * d);
#pragma GCC unroll 8
            for (int u = 0; u < 8; ++u) c[u] += qd * load8(k[u] + 8 * d);
        }
        const f8 r = hsum8x8(c) * scale;
        std::memcpy(s + i, &r, sizeof r);
    }
    for (int64_t i = full; i < n; ++i) {
        f8 c = {};
        for (int d = 0; d < DV; ++d) c += load8(q + 8 * d) * load8(rows[i] + 8 * d);
        s[i] = hsum8(c) * scale;
    }
}

// o += sum_j p[j] * v_j in ascending j over the n keys whose rows are given, for the `step` output vectors from
// vector c0 on; o is read from and written back to out (zero first when fresh).
template <int DV_>
[[gnu::noinline]] static void values(const float* p, const float* const* rows, int64_t n, int c0, int step, float* out,
                                     bool fresh) {
    if (DV_) step = 8;
    // vector by vector in and out: a memcpy of the whole array kept it on the stack, not in registers
    f8 o[DV_ ? 8 : MAX_HEAD_DIM / 8];
#pragma GCC unroll 8
    for (int c = 0; c < step; ++c) o[c] = fresh ? f8{} : load8(out + 8 * c);
    for (int64_t j = 0; j < n; ++j) {
        const float* v = rows[j] + 8 * c0;
        const float pj = p[j];
#pragma GCC unroll 8
        for (int c = 0; c < step; ++c) o[c] += pj * load8(v + 8 * c);
    }
#pragma GCC unroll 8
    for (int c = 0; c < step; ++c) std::memcpy(out + 8 * c, &o[c], sizeof o[c]);
}

// The first key query t of the call (at position S - T + t) sees: 0, or the start of its window
static inline int64_t first_key(const AttnArgs& a, int t) {
    return a.window > 0 ? std::max<int64_t>(a.S - a.T + t + 1 - a.window, 0) : 0;
}

// One work item: the queries of the call over one (chunk, KV head), each with the G query heads that share the KV
// head. s: scratch of T * G * (KEY_CHUNK + 8) floats; P: the (T, chunks, H, stride) rows of max | sum |
// unnormalised output (D). DV = D / 8 when it is 8 or 16 (compile-time loops, registers), else 0 (any D): the same
// operations in the same order either way. Keys go KEY_BLOCK at a time through every query and head, so a block's
// K (then V) rows are found once, read from L2 or memory once and from L1 T * G times. For a verify pass of 2-16
// queries this took 0.69-0.92 of the time of one item per query (each reading the chunk again), bits equal.
template <int DV_>
[[gnu::noinline]] static void attend_queries(const AttnArgs& a, int64_t c, int g, float* s, float* P, int64_t chunks,
                                             int64_t stride) {
    const int G = a.H / a.Hkv, DV = DV_ ? DV_ : a.D / 8, D = a.D;
    const int64_t SS = KEY_CHUNK + 8, j0 = c * KEY_CHUNK;
    const int64_t jend = std::min<int64_t>(j0 + KEY_CHUNK, a.S);  // the last query sees up to key S - 1
    const int64_t nmax = jend - j0;
    // the keys of query t here: [from(t), seen(t)) counted from j0, both rising with t
    const auto seen = [&](int t) { return std::min<int64_t>(jend, a.S - a.T + t + 1) - j0; };
    const auto from = [&](int t) { return std::max<int64_t>(first_key(a, t) - j0, 0); };
    int t0 = 0;  // the first query that sees any key of this chunk
    while (t0 < a.T && a.S - a.T + t0 + 1 <= j0) ++t0;
    int t1 = t0;  // past the last one
    while (t1 < a.T && first_key(a, t1) < jend) ++t1;
    if (t0 >= t1) return;
    const int64_t bfirst = from(t0) / KEY_BLOCK * KEY_BLOCK;  // blocks before it no query here sees
    const int esize = kv_bytes(a.kv);
    const float* rows[KEY_BLOCK];
    alignas(32) float widened[KEY_BLOCK * MAX_HEAD_DIM];  // an fp16 pool's block of rows, as fp32
    const auto find_rows = [&](const void* base, int64_t b0, int64_t b1) {
        for (int64_t j = b0; j < b1; ++j) {
            const int64_t slot = a.read ? a.read[j0 + j] : a.base + j0 + j, at = kv_row(g, slot, a.slots, a.D);
            if (a.kv == KV_F16) {
                float* row = widened + (j - b0) * D;
                widen_halves(static_cast<const uint16_t*>(base) + at, D, row);
                rows[j - b0] = row;
            } else {
                rows[j - b0] = static_cast<const float*>(base) + at;
            }
        }
    };
    for (int64_t b0 = bfirst; b0 < nmax; b0 += KEY_BLOCK) {
        find_rows(a.k, b0, std::min<int64_t>(b0 + KEY_BLOCK, nmax));
        // a contiguous cache's rows KEYS_AHEAD keys on (through a read table they are elsewhere: no prefetch)
        const char* ahead = a.read ? nullptr
                                   : static_cast<const char*>(a.k) +
                                         kv_row(g, a.base + j0 + b0 + KEYS_AHEAD, a.slots, a.D) * esize;
        for (int t = t0; t < t1; ++t) {
            const int64_t k0 = std::max(b0, from(t)), b1 = std::min<int64_t>(b0 + KEY_BLOCK, seen(t));
            if (b1 <= k0) continue;
            const float* qt = a.q + (static_cast<int64_t>(t) * a.H + g * G) * D;
            for (int h = 0; h < G; ++h) {  // the block's first call reads it from memory: that one prefetches
                scores<DV_>(qt + static_cast<int64_t>(h) * D, rows + (k0 - b0), b1 - k0, DV, a.scale,
                            s + (t * G + h) * SS + k0, ahead, a.S - (j0 + b0 + KEYS_AHEAD), esize);
                ahead = nullptr;
            }
        }
    }
    for (int t = t0; t < t1; ++t)
        for (int h = 0; h < G; ++h)
            softmax_part(s + (t * G + h) * SS + from(t), seen(t) - from(t),
                         P + ((t * chunks + c) * a.H + g * G + h) * stride);
    const int step = DV_ ? 8 : DV;
    for (int c0 = 0; c0 < DV; c0 += step) {
        for (int64_t b0 = bfirst; b0 < nmax; b0 += KEY_BLOCK) {
            find_rows(a.v, b0, std::min<int64_t>(b0 + KEY_BLOCK, nmax));
            for (int t = t0; t < t1; ++t) {
                const int64_t k0 = std::max(b0, from(t)), b1 = std::min<int64_t>(b0 + KEY_BLOCK, seen(t));
                if (b1 <= k0) continue;
                for (int h = 0; h < G; ++h)  // fresh: the query's first block here
                    values<DV_>(s + (t * G + h) * SS + k0, rows + (k0 - b0), b1 - k0, c0, step,
                                P + ((t * chunks + c) * a.H + g * G + h) * stride + 2 + 8 * c0, k0 == from(t));
            }
        }
    }
}

void attend(const AttnArgs& a) {
    const int G = a.H / a.Hkv, D = a.D, DV = a.D / 8;
    const int64_t chunks = (a.S + KEY_CHUNK - 1) / KEY_CHUNK, stride = D + 2;
    thread_local std::vector<float> parts;  // (T, chunks, H, stride)
    parts.resize(static_cast<size_t>(a.T) * chunks * a.H * stride);
    float* P = parts.data();
#pragma omp parallel num_threads(a.nthreads)
    {
        std::vector<float> s(static_cast<size_t>(G) * (KEY_CHUNK + 8) * a.T);
        // Items handed out one at a time: the last chunk is partial, so equal shares of items are unequal work (at 150
        // positions a static split gave one thread both full chunks and left the other idle ~70% of the call).
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < chunks * a.Hkv; ++it) {
            const int64_t c = it / a.Hkv;
            const int g = static_cast<int>(it % a.Hkv);
            if (D == 128)
                attend_queries<16>(a, c, g, s.data(), P, chunks, stride);
            else if (D == 64)
                attend_queries<8>(a, c, g, s.data(), P, chunks, stride);
            else
                attend_queries<0>(a, c, g, s.data(), P, chunks, stride);
        }
        // merge each (query, head) over its chunks, in chunk order
#pragma omp for schedule(static)
        for (int64_t th = 0; th < static_cast<int64_t>(a.T) * a.H; ++th) {
            const int64_t t = th / a.H, h = th % a.H, n = a.S - a.T + t + 1, used = (n + KEY_CHUNK - 1) / KEY_CHUNK;
            const int64_t c_first = first_key(a, static_cast<int>(t)) / KEY_CHUNK;  // the chunk of its first key
            const float* first = P + (t * chunks * a.H + h) * stride;
            float mx = first[c_first * a.H * stride];
            for (int64_t c = c_first + 1; c < used; ++c) mx = std::max(mx, first[c * a.H * stride]);
            float sum = 0.0f;
            f8 o[MAX_HEAD_DIM / 8] = {};
            for (int64_t c = c_first; c < used; ++c) {
                const float* part = first + c * a.H * stride;
                const float w = exp8(f8{} + (part[0] - mx))[0];
                sum += w * part[1];
                for (int k = 0; k < DV; ++k) o[k] += w * load8(part + 2 + 8 * k);
            }
            float* out = a.out + th * D;
            for (int k = 0; k < DV; ++k) {
                const f8 r = o[k] / sum;
                std::memcpy(out + 8 * k, &r, sizeof r);
            }
        }
    }
}
