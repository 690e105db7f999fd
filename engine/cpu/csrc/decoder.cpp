// The decoder stack of decoder.h. Per layer, for T rows:
//   h = rmsnorm(x) ; q|k|v = h Wqkv ; [q, k = per-head rmsnorm(q), rmsnorm(k)] ; rope(q, k) over rotary_dim dims
//   cache[write] = k, v ; a = attend(q, cache, window) ; y = a Wo ; [y = rmsnorm(y)] ; x += y
//   h = rmsnorm(x) ; g|u = h Wgu ; y = (act(g) * u) Wdown ; [y = rmsnorm(y)] ; x += y
// (bracketed steps only in layers that have those norms: Qwen3's and Gemma 3's q/k norms, Gemma's sandwich norms).
// Every elementwise step and reduction here works on one row at a time in a fixed order, so like the
// kernels and attend.h it is batch-invariant: a row's bits never depend on T.
#include "decoder.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sq {

namespace {

// y (R, ldy): the columns of parts w[0..n) side by side, from x (R, K) quantized once; every part int8-activated
void linear_q8(const Lin* w, int n, const float* x, int R, float* y, int64_t ldy, const IsaFns& f, int nthreads) {
    const int64_t K = w[0].K, nb = K / ABLK;
    thread_local std::vector<int8_t> q;
    thread_local std::vector<float> dx, xs;
    thread_local std::vector<int32_t> b16, b32;
    q.resize(R * K);
    for (auto* v : {&dx, &xs}) v->resize(R * nb);
    for (auto* v : {&b16, &b32}) v->resize(R * nb);
    f.quantize_acts(x, R, K, q.data(), dx.data(), xs.data(), b16.data(), b32.data());
    MatArgs a[MAX_PARTS];
    int64_t col = 0;
    for (int i = 0; i < n; col += w[i++].N)
        a[i] = MatArgs{w[i].qtype, w[i].packed, w[i].N, K, w[i].bias, y + col, nthreads, ldy};
    f.matmul_q8(a, n, ActQ{R, K, q.data(), dx.data(), xs.data(), b16.data(), b32.data()});
}

// y (R, ldy): w's columns
void linear_into(const Lin& w, const float* x, int R, float* y, int64_t ldy, const IsaFns& f, int nthreads) {
    if (w.exact)
        f.matmul_f32(MatArgs{w.qtype, w.packed, w.N, w.K, w.bias, y, nthreads, ldy}, x, R);
    else
        linear_q8(&w, 1, x, R, y, ldy, f, nthreads);
}

}  // namespace

void linear(const Lin& w, const float* x, int R, float* y, const IsaFns& f, int nthreads) {
    linear_into(w, x, R, y, w.N, f, nthreads);
}

namespace {

// y = w * (x / sqrt(mean(x^2) + eps)), one row; the sum of squares runs in 8 lanes, then a fixed tree.
void rmsnorm(const float* x, const float* w, int C, float eps, float* y) {
    float lane[8] = {};
    int i = 0;
    for (; i + 8 <= C; i += 8)
        for (int l = 0; l < 8; ++l) lane[l] += x[i + l] * x[i + l];
    float ss = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; i < C; ++i) ss += x[i] * x[i];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    for (int j = 0; j < C; ++j) y[j] = w[j] * (x[j] * r);
}

// Rotate the first and second halves of the first R dims of each head of x (heads, D) at one position (Llama's
// rotate_half; R < D is partial rotary, as Phi-4-mini's: dims R..D pass through). cos, sin: R values.
void rope(float* x, int heads, int D, int R, const float* cos, const float* sin) {
    const int half = R / 2;
    for (int h = 0; h < heads; ++h) {
        float* v = x + static_cast<int64_t>(h) * D;
        float lo[MAX_HEAD_DIM / 2];
        std::memcpy(lo, v, sizeof(float) * half);
        for (int j = 0; j < half; ++j) v[j] = lo[j] * cos[j] - v[j + half] * sin[j];
        for (int j = half; j < R; ++j) v[j] = v[j] * cos[j] + lo[j - half] * sin[j];
    }
}

// Each of the heads (D values each) of x normed in place by the same (D,) weights (Qwen3's and Gemma 3's q/k norms)
void norm_heads(float* x, int heads, int D, const float* w, float eps) {
    float out[MAX_HEAD_DIM];
    for (int h = 0; h < heads; ++h) {
        float* v = x + static_cast<int64_t>(h) * D;
        rmsnorm(v, w, D, eps, out);
        std::memcpy(v, out, sizeof(float) * D);
    }
}

// x (T, C) += y, or += rmsnorm(y) by the layer's post-norm where it has one (Gemma's sandwich norms), times scale
// (Granite's residual multiplier; 1 elsewhere, where the product is skipped)
void add_residual(float* x, float* y, int T, int C, const float* post_norm, float eps, float* tmp, float scale) {
    if (post_norm) {
        for (int t = 0; t < T; ++t) rmsnorm(y + t * C, post_norm, C, eps, tmp + t * C);
        y = tmp;
    }
    const int64_t n = static_cast<int64_t>(T) * C;
    if (scale == 1.0f) {
        for (int64_t i = 0; i < n; ++i) x[i] += y[i];
    } else {
        for (int64_t i = 0; i < n; ++i) x[i] += y[i] * scale;
    }
}

// Linear layers made of parts (q|k|v stored as different block types): each part into its columns, all in one call
// to the kernels where every part takes int8 activations, else part by part.
void linear_parts(const std::vector<Lin>& parts, const float* x, int R, float* y, int64_t ldy, const IsaFns& f,
                  int nthreads) {
    const int n = static_cast<int>(parts.size());
    if (n <= MAX_PARTS && std::none_of(parts.begin(), parts.end(), [](const Lin& p) { return p.exact; })) {
        linear_q8(parts.data(), n, x, R, y, ldy, f, nthreads);
        return;
    }
    int64_t col = 0;
    for (const Lin& p : parts) linear_into(p, x, R, y + col, ldy, f, nthreads), col += p.N;
}

// One row of D values into the pool, as its element type
void put_row(const float* x, int D, void* dst, KvType kv, const IsaFns& f) {
    if (kv == KV_F16) f.to_half(x, D, static_cast<uint16_t*>(dst));
    else std::memcpy(dst, x, sizeof(float) * D);
}

}  // namespace

void decode(const Stack& st, const Cache& c, float* x, int T, int64_t start, const IsaFns& f, int nthreads) {
    const int C = st.C, H = st.H, Hkv = st.Hkv, D = st.D, I = st.I, R = st.rotary_dim;
    const int64_t nq = static_cast<int64_t>(H) * D, nkv = static_cast<int64_t>(Hkv) * D, nqkv = nq + 2 * nkv;
    std::vector<float> h(T * C), qkv(T * nqkv), att(T * nq), y(T * C), gu(T * 2 * I), act(T * I);
    std::vector<float> q(T * nq);
    const int64_t esize = kv_bytes(c.kv), layer_bytes = c.slots * nkv * esize;
    for (size_t li = 0; li < st.layers.size(); ++li) {
        const Layer& L = st.layers[li];
        char* kc = static_cast<char*>(c.k) + li * layer_bytes;
        char* vc = static_cast<char*>(c.v) + li * layer_bytes;
        for (int t = 0; t < T; ++t) rmsnorm(x + t * C, L.attn_norm, C, st.eps, h.data() + t * C);
        linear_parts(L.qkv, h.data(), T, qkv.data(), nqkv, f, nthreads);
        for (int t = 0; t < T; ++t) {
            float* row = qkv.data() + t * nqkv;
            if (L.q_norm) norm_heads(row, H, D, L.q_norm, st.eps);
            if (L.k_norm) norm_heads(row + nq, Hkv, D, L.k_norm, st.eps);
            const float* cs = L.cos + (start + t) * R;
            const float* sn = L.sin + (start + t) * R;
            rope(row, H, D, R, cs, sn);
            rope(row + nq, Hkv, D, R, cs, sn);
            std::memcpy(q.data() + t * nq, row, sizeof(float) * nq);
            for (int g = 0; g < Hkv; ++g) {
                const int64_t at = kv_row(g, c.write[t], c.slots, D) * esize;
                put_row(row + nq + g * D, D, kc + at, c.kv, f);
                put_row(row + nq + nkv + g * D, D, vc + at, c.kv, f);
            }
        }
        f.attend(AttnArgs{q.data(), kc, vc, c.kv, c.slots, c.read, c.base, c.S, T, H, Hkv, D, st.attn_scale,
                          att.data(), nthreads, L.window});
        linear(L.o, att.data(), T, y.data(), f, nthreads);
        add_residual(x, y.data(), T, C, L.post_attn_norm, st.eps, h.data(), st.residual_scale);
        for (int t = 0; t < T; ++t) rmsnorm(x + t * C, L.mlp_norm, C, st.eps, h.data() + t * C);
        linear_parts(L.gate_up, h.data(), T, gu.data(), 2 * I, f, nthreads);
        if (st.act == ACT_GELU_TANH) f.gelu_tanh_mul(gu.data(), T, I, act.data(), nthreads);
        else f.silu_mul(gu.data(), T, I, act.data(), nthreads);
        linear(L.down, act.data(), T, y.data(), f, nthreads);
        add_residual(x, y.data(), T, C, L.post_mlp_norm, st.eps, h.data(), st.residual_scale);
    }
    for (int t = 0; t < T; ++t) {
        rmsnorm(x + t * C, st.final_norm, C, st.eps, h.data() + t * C);
        std::memcpy(x + t * C, h.data() + t * C, sizeof(float) * C);
    }
}

}  // namespace sq
