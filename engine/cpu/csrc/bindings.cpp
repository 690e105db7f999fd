// Python bindings and run-time dispatch. The only file that includes torch, and only ATen's core and the
// pybind11 glue: <torch/extension.h> would pull in all of libtorch's C++ API and quadruple the build time.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "decoder.h"
#include "isa.h"
#include "quant.h"

namespace {

using namespace sq;

// Bad arguments raise ValueError (std::invalid_argument through pybind11). Not TORCH_CHECK: some torch builds
// (seen with 2.11 on a CI host) crash instead of raising when an extension throws c10::Error.
template <typename... A>
void require(bool ok, const A&... parts) {
    if (ok) return;
    std::ostringstream msg;
    (msg << ... << parts);
    throw std::invalid_argument(msg.str());
}

int g_isa = best_isa();  // the instruction set the kernels run: an index into ISAS

std::vector<std::pair<std::string, std::string>> isa_table() {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Isa& i : ISAS) out.emplace_back(i.name, i.display);
    return out;
}

std::vector<std::string> supported_isas() {
    std::vector<std::string> out;
    for (const Isa& i : ISAS)
        if (i.supported()) out.emplace_back(i.name);
    return out;
}

void set_isa(const std::string& name) {
    std::string names;
    for (int i = 0; i < N_ISAS; ++i) {
        if (name == ISAS[i].name) {
            require(ISAS[i].supported(), "this CPU does not support ", name);
            g_isa = i;
            return;
        }
        names += (i ? ", " : "") + std::string(ISAS[i].name);
    }
    require(false, "unknown instruction set ", name, " (", names, ")");
}

Layout checked_layout(int64_t qtype) {
    Layout L;
    require(layout_of(static_cast<int>(qtype), &L), "unsupported ggml type ", qtype);
    return L;
}

Layout checked_layout(int64_t qtype, int64_t K) {
    const Layout L = checked_layout(qtype);
    require(K > 0 && K % L.unit_k == 0, "input features ", K, " must be a multiple of ", L.unit_k);
    return L;
}

// Bytes of a buffer (a numpy array, a memory map) in C order: read in place.
const uint8_t* c_bytes(const pybind11::buffer_info& b, const char* what) {
    require(b.itemsize == 1, what, ": bytes expected, got items of ", b.itemsize);
    int64_t stride = 1;
    for (int64_t i = b.ndim - 1; i >= 0; stride *= b.shape[i--])
        require(b.shape[i] == 1 || b.strides[i] == stride, what, ": C-contiguous bytes expected");
    return static_cast<const uint8_t*>(b.ptr);
}

// raw: the GGUF rows, (rows, row_bytes) bytes. out: where to write (a contiguous uint8 slice of the right size,
// e.g. a fused layer's part), else a new tensor.
at::Tensor py_repack(const pybind11::buffer& raw, int64_t qtype, int64_t N, int64_t K, std::optional<at::Tensor> rows,
                     int64_t nthreads, std::optional<at::Tensor> out) {
    const Layout L = checked_layout(qtype, K);
    const int64_t row_bytes = K / L.blk * L.blk_bytes;
    const pybind11::buffer_info b = raw.request();
    const uint8_t* rb = c_bytes(b, "raw");
    require(b.size % row_bytes == 0, "raw: rows of ", row_bytes, " bytes, got ", b.size, " bytes");
    const int64_t* rp = nullptr;
    if (rows) {
        require(rows->dtype() == at::kLong && rows->is_contiguous() && rows->numel() == N, "rows: (N,) int64");
        rp = rows->data_ptr<int64_t>();
    }
    at::Tensor packed = out ? *out : at::empty({packed_bytes(qtype, N, K)}, at::kByte);
    require(packed.dtype() == at::kByte && packed.is_contiguous() && packed.numel() == packed_bytes(qtype, N, K),
            "out: (", packed_bytes(qtype, N, K), ",) contiguous uint8");
    {
        pybind11::gil_scoped_release nogil;
        sq::repack(static_cast<int>(qtype), rb, b.size / row_bytes, N, K, rp, packed.data_ptr<uint8_t>(),
                   static_cast<int>(nthreads));
    }
    return packed;
}

// packed: units of qtype for an (N, K) matrix -> the same matrix as packed Q4_0 units (IsaFns::requant_q40)
at::Tensor py_requant_q40(const at::Tensor& packed, int64_t qtype, int64_t N, int64_t K, int64_t nthreads,
                          std::optional<at::Tensor> out) {
    checked_layout(qtype, K);
    require(K % 32 == 0, "Q4_0 needs input features in multiples of 32, got ", K);
    require(packed.dtype() == at::kByte && packed.is_contiguous() && packed.numel() == packed_bytes(qtype, N, K),
            "packed: (", packed_bytes(qtype, N, K), ",) contiguous uint8");
    const int64_t n = packed_bytes(sq::Q4_0, N, K);
    at::Tensor dst = out ? *out : at::empty({n}, at::kByte);
    require(dst.dtype() == at::kByte && dst.is_contiguous() && dst.numel() == n, "out: (", n, ",) contiguous uint8");
    {
        pybind11::gil_scoped_release nogil;
        ISAS[g_isa].fns.requant_q40(static_cast<int>(qtype), packed.data_ptr<uint8_t>(), N, K, dst.data_ptr<uint8_t>(),
                        static_cast<int>(nthreads));
    }
    return dst;
}

at::Tensor py_dequant_cols(const at::Tensor& packed, int64_t qtype, int64_t N, int64_t K, const at::Tensor& idx) {
    checked_layout(qtype, K);
    require(idx.dtype() == at::kLong && idx.dim() == 1, "idx: (n,) int64");
    auto ix = idx.contiguous();
    const int64_t* ip = ix.data_ptr<int64_t>();
    for (int64_t i = 0; i < ix.numel(); ++i) require(ip[i] >= 0 && ip[i] < N, "index ", ip[i], " out of range ", N);
    auto out = at::empty({ix.numel(), K}, at::kFloat);
    sq::dequant_cols(static_cast<int>(qtype), packed.data_ptr<uint8_t>(), N, K, ip, ix.numel(), out.data_ptr<float>());
    return out;
}

// y = x W^T (+ bias) for x (..., K) -> (..., N); exact: fp32 activations, else int8 per 32-input block.
// Reshaping, casting and the thread count (torch's, when nthreads <= 0) happen here rather than in Python:
// a decode step makes ~150 of these calls, and each Python-side tensor call costs microseconds.
at::Tensor matmul(const at::Tensor& packed, int64_t qtype, int64_t N, int64_t K, const at::Tensor& x_in,
                     const std::optional<at::Tensor>& bias, bool exact, int64_t nthreads) {
    checked_layout(qtype, K);
    require(packed.dtype() == at::kByte && packed.numel() == packed_bytes(qtype, N, K), "packed weight size");
    require(x_in.dim() >= 1 && x_in.size(-1) == K, "x: (..., ", K, ")");
    require(exact || (qtype != F16 && qtype != BF16 && qtype != F32), "F16/BF16/F32 weights run only with exact activations");
    const bool plain = x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.is_contiguous();
    const at::Tensor xc = plain ? x_in : x_in.reshape({-1, K}).to(at::kFloat).contiguous();  // (R, K)
    if (nthreads <= 0) nthreads = at::get_num_threads();
    const int64_t R = xc.size(0);
    std::vector<int64_t> shape(x_in.sizes().begin(), x_in.sizes().end());
    shape.back() = N;
    auto out = at::empty(shape, at::TensorOptions().dtype(at::kFloat));  // (..., N)
    const float* bp = nullptr;
    at::Tensor bc;
    if (bias) {
        bc = bias->contiguous();
        require(bc.dtype() == at::kFloat && bc.numel() == N, "bias: (N,) float32");
        bp = bc.data_ptr<float>();
    }
    if (R == 0) return out;
    const IsaFns& f = ISAS[g_isa].fns;
    const Lin w{static_cast<int>(qtype), packed.data_ptr<uint8_t>(), N, K, bp, exact};
    pybind11::gil_scoped_release nogil;
    // Rows are independent, so chunks of MAX_ROWS give every row the same result as any other batching.
    for (int64_t r0 = 0; r0 < R; r0 += MAX_ROWS) {
        const int rn = static_cast<int>(std::min<int64_t>(MAX_ROWS, R - r0));
        linear(w, xc.data_ptr<float>() + r0 * K, rn, out.data_ptr<float>() + r0 * N, f, static_cast<int>(nthreads));
    }
    return out;
}

// gu (T, 2I) = gate | up -> act(gate) * up (T, I), the decoder stack's MLP activation on its own (for tests)
at::Tensor gated(const at::Tensor& gu, const std::string& activation, int64_t nthreads) {
    require(gu.dim() == 2 && gu.scalar_type() == at::kFloat && gu.size(1) % 16 == 0, "gu: (T, 2I) float32, I % 8 == 0");
    require(activation == "silu" || activation == "gelu_tanh", "activation ", activation,
            " is not one of silu, gelu_tanh");
    const at::Tensor x = gu.contiguous();
    const int64_t T = x.size(0), I = x.size(1) / 2;
    auto out = at::empty({T, I}, at::kFloat);
    if (T == 0) return out;
    const IsaFns& f = ISAS[g_isa].fns;
    pybind11::gil_scoped_release nogil;
    (activation == "silu" ? f.silu_mul : f.gelu_tanh_mul)(x.data_ptr<float>(), static_cast<int>(T), I,
                                                          out.data_ptr<float>(), static_cast<int>(std::max<int64_t>(nthreads, 1)));
    return out;
}

// Python's view of a decoder stack: the tensors it points into are kept alive here.
using LinT = std::tuple<at::Tensor, int64_t, int64_t, int64_t, std::optional<at::Tensor>, bool>;
using LayerT = std::tuple<at::Tensor, at::Tensor, std::vector<LinT>, LinT, std::vector<LinT>, LinT>;
using OptT = std::optional<at::Tensor>;
// A layer's optional parts (decoder.h's Layer): q_norm, k_norm, post_attn_norm, post_mlp_norm, window (0: none),
// its own cos and sin tables (None: the stack's)
using FeatT = std::tuple<OptT, OptT, OptT, OptT, int64_t, OptT, OptT>;

class PyStack {
   public:
    // features: one entry per layer, or none (no layer has any). rotary_dim 0: D. attn_scale 0: 1 / sqrt(D).
    PyStack(int64_t C, int64_t H, int64_t Hkv, int64_t D, int64_t I, double eps, const at::Tensor& cos,
            const at::Tensor& sin, const at::Tensor& final_norm, const std::vector<LayerT>& layers,
            const std::vector<FeatT>& features, int64_t rotary_dim, double attn_scale, const std::string& activation,
            double residual_scale) {
        require(H > 0 && Hkv > 0 && H % Hkv == 0, "heads ", H, " must be a multiple of kv heads ", Hkv);
        require(D > 0 && D % 8 == 0 && D <= MAX_HEAD_DIM, "head_dim must be a multiple of 8 up to ", MAX_HEAD_DIM);
        require(I > 0 && I % 8 == 0, "intermediate size ", I, " must be a multiple of 8");
        const int64_t R = rotary_dim ? rotary_dim : D;
        require(R >= 2 && R <= D && R % 2 == 0, "rotary_dim ", rotary_dim, " must be even, at most head_dim ", D);
        require(cos.dim() == 2 && cos.size(1) == R && sin.sizes() == cos.sizes(), "rotary tables: (P, ", R, ")");
        const double scale = attn_scale != 0.0 ? attn_scale : 1.0 / std::sqrt(static_cast<double>(D));
        require(std::isfinite(scale) && scale > 0.0, "attention scale ", attn_scale, " must be positive");
        require(activation == "silu" || activation == "gelu_tanh", "activation ", activation,
                " is not one of silu, gelu_tanh");
        require(std::isfinite(residual_scale) && residual_scale > 0.0, "residual scale ", residual_scale,
                " must be positive");
        require(features.empty() || features.size() == layers.size(), "features for ", features.size(),
                " layers, the stack has ", layers.size());
        const float *cp = vec(cos, cos.numel()), *sp = vec(sin, sin.numel());
        st_ = Stack{static_cast<int>(C), static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(D),
                    static_cast<int>(I), static_cast<float>(eps), cos.size(0), static_cast<int>(R),
                    static_cast<float>(scale), activation == "gelu_tanh" ? ACT_GELU_TANH : ACT_SILU,
                    vec(final_norm, C), {}, static_cast<float>(residual_scale)};
        for (size_t li = 0; li < layers.size(); ++li) {
            const auto& [an, mn, qkv, o, gu, down] = layers[li];
            Layer L{vec(an, C), vec(mn, C), {}, lin(o, H * D, C), {}, lin(down, I, C)};
            int64_t n = 0;
            for (const auto& p : qkv) L.qkv.push_back(lin(p, C, -1)), n += L.qkv.back().N;
            require(n == (H + 2 * Hkv) * D, "q|k|v parts give ", n, " outputs");
            n = 0;
            for (const auto& p : gu) L.gate_up.push_back(lin(p, C, -1)), n += L.gate_up.back().N;
            require(n == 2 * I, "gate|up parts give ", n, " outputs");
            L.cos = cp, L.sin = sp;
            if (!features.empty()) {
                const auto& [qn, kn, pan, pmn, window, lcos, lsin] = features[li];
                L.q_norm = opt_vec(qn, D), L.k_norm = opt_vec(kn, D);
                L.post_attn_norm = opt_vec(pan, C), L.post_mlp_norm = opt_vec(pmn, C);
                require(window >= 0, "window ", window, " must be 0 (none) or positive");
                L.window = window;
                require(lcos.has_value() == lsin.has_value(), "a layer's cos and sin tables come together");
                if (lcos) {
                    require(lcos->sizes() == cos.sizes() && lsin->sizes() == cos.sizes(), "a layer's rotary tables: (",
                            cos.size(0), ", ", R, ")");
                    L.cos = vec(*lcos, lcos->numel()), L.sin = vec(*lsin, lsin->numel());
                }
            }
            st_.layers.push_back(std::move(L));
        }
    }

    // x (T, C) embeddings -> (T, C) final-normed hidden states; k, v: the pool (L, Hkv, slots, D), float32 or float16.
    at::Tensor forward(const at::Tensor& x, int64_t start, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& write, const std::optional<at::Tensor>& read, int64_t base, int64_t S,
                       int64_t nthreads) {
        const int64_t T = x.dim() == 2 ? x.size(0) : -1;
        require(T >= 1 && T <= MAX_ROWS && x.size(1) == st_.C && x.scalar_type() == at::kFloat, "x: (T <= ",
                MAX_ROWS, ", ", st_.C, ") float32");
        require(start >= 0 && start + T <= st_.P, "positions ", start, "..", start + T, " beyond the rotary table");
        const int64_t L = static_cast<int64_t>(st_.layers.size());
        for (const at::Tensor* p : {&k, &v})
            require(p->dim() == 4 && p->size(0) == L && p->size(1) == st_.Hkv && p->size(3) == st_.D &&
                        (p->scalar_type() == at::kFloat || p->scalar_type() == at::kHalf) && p->is_contiguous(),
                    "cache: (", L, ", ", st_.Hkv, ", slots, ", st_.D, ") contiguous float32 or float16");
        require(k.sizes() == v.sizes() && k.scalar_type() == v.scalar_type(), "k and v caches differ in shape or type");
        const int64_t slots = k.size(2);
        require(S >= T, "sequence length ", S, " < pass width ", T);
        auto in_range = [&](const at::Tensor& idx, int64_t n, const char* what) {
            require(idx.scalar_type() == at::kLong && idx.dim() == 1 && idx.numel() == n && idx.is_contiguous(),
                    what, ": (", n, ",) int64");
            const int64_t* p = idx.data_ptr<int64_t>();
            for (int64_t i = 0; i < n; ++i) require(p[i] >= 0 && p[i] < slots, what, " slot out of range");
            return p;
        };
        const int64_t* wp = in_range(write, T, "write");
        const int64_t* rp = read ? in_range(*read, S, "read") : nullptr;
        require(rp || (base >= 0 && base + S <= slots), "contiguous read beyond the cache");
        at::Tensor out = x.contiguous().clone();
        if (nthreads <= 0) nthreads = at::get_num_threads();
        const Cache c{k.data_ptr(), v.data_ptr(), k.scalar_type() == at::kHalf ? KV_F16 : KV_F32, slots, wp, rp, base, S};
        pybind11::gil_scoped_release nogil;
        decode(st_, c, out.data_ptr<float>(), static_cast<int>(T), start, ISAS[g_isa].fns,
               static_cast<int>(nthreads));
        return out;
    }

   private:
    const float* vec(const at::Tensor& t, int64_t n) {
        require(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n, "float32 vector of ", n);
        keep_.push_back(t);
        return t.data_ptr<float>();
    }
    const float* opt_vec(const OptT& t, int64_t n) { return t ? vec(*t, n) : nullptr; }
    Lin lin(const LinT& spec, int64_t K, int64_t N) {
        const auto& [packed, qtype, n, k, bias, exact] = spec;
        checked_layout(qtype, k);
        require(k == K && (N < 0 || n == N), "linear (", n, ", ", k, ") where (", N, ", ", K, ") is needed");
        require(packed.dtype() == at::kByte && packed.is_contiguous() && packed.numel() == packed_bytes(qtype, n, k),
                "packed weight size");
        require(exact || (qtype != F16 && qtype != BF16 && qtype != F32), "F16/BF16/F32 weights run only with exact activations");
        keep_.push_back(packed);
        return Lin{static_cast<int>(qtype), packed.data_ptr<uint8_t>(), n, k, bias ? vec(*bias, n) : nullptr, exact};
    }
    Stack st_{};
    std::vector<at::Tensor> keep_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "SpecLens quantized linear kernels (GGML block types, batch-invariant)";
    m.def("repack", &py_repack, "GGUF rows (a buffer: numpy array, memory map) -> packed units", pybind11::arg("raw"),
          pybind11::arg("qtype"), pybind11::arg("N"), pybind11::arg("K"), pybind11::arg("rows"),
          pybind11::arg("nthreads"), pybind11::arg("out") = pybind11::none());
    m.def("dequant_cols", &py_dequant_cols, "exact fp32 weights of the given output features");
    m.def("requant_q40", &py_requant_q40, "packed units -> the same matrix as packed Q4_0 units", pybind11::arg("packed"),
          pybind11::arg("qtype"), pybind11::arg("N"), pybind11::arg("K"), pybind11::arg("nthreads"),
          pybind11::arg("out") = pybind11::none());
    m.def("matmul", &matmul, "y = x W^T (+ bias)");
    m.def("gated", &gated, "act(gate) * up of (T, 2I) = gate | up, as the decoder stack's MLP computes it",
          pybind11::arg("gu"), pybind11::arg("activation"), pybind11::arg("nthreads") = 1);
    pybind11::class_<PyStack>(m, "Stack")
        .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const std::vector<LayerT>&, const std::vector<FeatT>&, int64_t, double,
                            const std::string&, double>(),
             pybind11::arg("C"), pybind11::arg("H"), pybind11::arg("Hkv"), pybind11::arg("D"), pybind11::arg("I"),
             pybind11::arg("eps"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("final_norm"),
             pybind11::arg("layers"), pybind11::arg("features") = std::vector<FeatT>{},
             pybind11::arg("rotary_dim") = 0, pybind11::arg("attn_scale") = 0.0,
             pybind11::arg("activation") = std::string("silu"), pybind11::arg("residual_scale") = 1.0)
        .def("forward", &PyStack::forward, "decoder layers + final norm for a pass of up to 16 tokens");
    m.def("isa", [] { return std::string(ISAS[g_isa].name); }, "the instruction set the kernels run");
    m.def("set_isa", &set_isa);
    m.def("set_pair_from", [](int64_t rows) {
        require(rows >= 0 && rows <= MAX_ROWS + 1, "pair_from: 0 (default) .. ", MAX_ROWS + 1, " (never), got ", rows);
        g_pair_from = static_cast<int>(rows);
    }, "rows from which the AVX-512 kernels pair groups (0: the default per block type; 17: never)");
    m.def("pair_from", [] { return g_pair_from; });
    m.def("set_stream_prefetch", [](int64_t on) {
        require(on == 0 || on == 1, "stream_prefetch: 0 (the hardware prefetcher alone) or 1 (ask 6 KB ahead), got ", on);
        g_stream_prefetch = static_cast<int>(on);
    }, "whether calls over 1-6 rows ask for their weights 6 KB ahead (1) or leave them to the hardware (0)");
    m.def("stream_prefetch", [] { return g_stream_prefetch; });
    m.def("supported_isas", &supported_isas, "names of the instruction sets this CPU runs, worst to best");
    m.def("isa_table", &isa_table, "(name, display name) of every instruction set built, worst to best");
    m.def("packed_bytes", [](int64_t qtype, int64_t N, int64_t K) { return packed_bytes(qtype, N, K); });
    m.def(
        "layout",
        [](int64_t qtype) {
            const Layout L = checked_layout(qtype);
            return std::make_tuple(L.unit_k, L.unit_bytes, L.blk, L.blk_bytes);
        },
        "(inputs per packed unit, bytes per packed unit, inputs per GGUF block, bytes per GGUF block)");
    m.def(
        "unit_at",
        [](int64_t qtype, int64_t N, int64_t K, int64_t g, int64_t u) {
            const Packing P(checked_layout(qtype), N, K);
            require(g >= 0 && g < P.groups && u >= 0 && u < P.units, "unit_at: no unit ", u, " of group ", g);
            return P.at(g, u);
        },
        "where unit u of output group g lies in a packed matrix, in units from its start");
    m.attr("SLICE_K") = SLICE_K;
    m.attr("RUN") = RUN;
}
