// Causal attention of T <= 16 queries over a layer's cached keys, included once per instruction set inside
// its namespace (after the file's `#pragma GCC target`). Written with GCC vector types rather than
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

void attend(const AttnArgs& a) {
    const int G = a.H / a.Hkv, D = a.D, DV = a.D / 8;
    const int64_t pairs = static_cast<int64_t>(a.T) * a.H;
#pragma omp parallel num_threads(a.nthreads)
    {
        std::vector<float> s(static_cast<size_t>(a.S));
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
            float sum = 0.0f;
            for (int64_t j = 0; j < n; ++j) {
                s[j] = std::exp(s[j] - mx);
                sum += s[j];
            }
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
