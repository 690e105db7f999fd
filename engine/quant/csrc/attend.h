// Causal attention of T <= 16 queries over a layer's cached keys, and the MLP's SiLU, included once per
// instruction set inside its namespace (after the file's `#pragma GCC target`). Written with GCC vector types rather than
// intrinsics: every lane does the same IEEE multiply and add in the same order under every target (no FMA:
// -ffp-contract=off), so all ISAs give the same bits.
//
// Batch invariance: each (query, head) pair is computed whole by one thread, over exactly the keys that query
// may see, in ascending key order. Its result therefore does not depend on T, on the other queries, or on
// which thread ran it: a verify pass of K+1 queries gives each position the bits a one-token step gives it.

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

void attend(const AttnArgs& a) {
    const int G = a.H / a.Hkv, D = a.D, DV = a.D / 8;
    const int64_t pairs = static_cast<int64_t>(a.T) * a.H;
#pragma omp parallel num_threads(a.nthreads)
    {
        std::vector<float> s(static_cast<size_t>(a.S + 8));
#pragma omp for schedule(static)
        for (int64_t th = 0; th < pairs; ++th) {
            const int t = static_cast<int>(th / a.H), h = static_cast<int>(th % a.H), g = h / G;
            const int64_t n = a.S - a.T + t + 1;  // keys this query may see
            const float* q = a.q + th * D;
            float mx = -INFINITY;
            for (int64_t j = 0; j < n; ++j) {
                const int64_t slot = a.read ? a.read[j] : a.base + j;
                const float* k = a.k + (slot * a.Hkv + g) * D;
                f8 acc = {};
                for (int d = 0; d < D; d += 8) acc += load8(q + d) * load8(k + d);
                s[j] = hsum8(acc) * a.scale;
                mx = std::fmax(mx, s[j]);
            }
            for (int64_t j = 0; j < n; j += 8) {  // s has room for the last partial vector
                const f8 e = exp8(load8(&s[j]) - mx);
                std::memcpy(&s[j], &e, sizeof e);
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < n; ++j) sum += s[j];
            f8 o[MAX_HEAD_DIM / 8] = {};
            for (int64_t j = 0; j < n; ++j) {
                const int64_t slot = a.read ? a.read[j] : a.base + j;
                const float* v = a.v + (slot * a.Hkv + g) * D;
                const float p = s[j];
                for (int c = 0; c < DV; ++c) o[c] += p * load8(v + 8 * c);
            }
            float* out = a.out + th * D;
            for (int c = 0; c < DV; ++c) {
                const f8 r = o[c] / sum;
                std::memcpy(out + 8 * c, &r, sizeof r);
            }
        }
    }
}
