// Python bindings and run-time dispatch. The only file that includes torch, and only ATen's core and the
// pybind11 glue: <torch/extension.h> would pull in all of libtorch's C++ API and quadruple the build time.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

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

enum Isa { SCALAR = 0, AVX2 = 1, AVXVNNI = 2, AVX512 = 3 };  // in order of preference, last best
const char* const ISA_NAMES[] = {"scalar", "avx2", "avxvnni", "avx512vnni"};

bool isa_supported(int isa) {
    switch (isa) {
        case SCALAR: return true;
        case AVX2:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
        case AVXVNNI:
            return isa_supported(AVX2) && __builtin_cpu_supports("avxvnni");
        case AVX512:
            return isa_supported(AVX2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
        default: return false;
    }
}

int best_isa() {
    for (int i = AVX512; i > SCALAR; --i)
        if (isa_supported(i)) return i;
    return SCALAR;
}

int g_isa = best_isa();

std::string get_isa() { return ISA_NAMES[g_isa]; }

std::vector<std::string> supported_isas() {
    std::vector<std::string> out;
    for (int i = SCALAR; i <= AVX512; ++i)
        if (isa_supported(i)) out.emplace_back(ISA_NAMES[i]);
    return out;
}

void set_isa(const std::string& name) {
    for (int i = SCALAR; i <= AVX512; ++i)
        if (name == ISA_NAMES[i]) {
            require(isa_supported(i), "this CPU does not support ", name);
            g_isa = i;
            return;
        }
    require(false, "unknown instruction set ", name, " (scalar, avx2, avxvnni, avx512vnni)");
}

Layout checked_layout(int64_t qtype, int64_t K) {
    Layout L;
    require(layout_of(static_cast<int>(qtype), &L), "unsupported ggml type ", qtype);
    require(K > 0 && K % L.unit_k == 0, "input features ", K, " must be a multiple of ", L.unit_k);
    return L;
}

at::Tensor py_repack(int64_t raw_addr, int64_t raw_rows, int64_t qtype, int64_t N, int64_t K,
                     std::optional<at::Tensor> rows, int64_t nthreads) {
    checked_layout(qtype, K);
    const int64_t* rp = nullptr;
    if (rows) {
        require(rows->dtype() == at::kLong && rows->is_contiguous() && rows->numel() == N, "rows: (N,) int64");
        rp = rows->data_ptr<int64_t>();
    }
    auto packed = at::empty({packed_bytes(qtype, N, K)}, at::kByte);
    {
        pybind11::gil_scoped_release nogil;
        sq::repack(static_cast<int>(qtype), reinterpret_cast<const uint8_t*>(raw_addr), raw_rows, N, K, rp,
                   packed.data_ptr<uint8_t>(), static_cast<int>(nthreads));
    }
    return packed;
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
    require(exact || (qtype != F16 && qtype != F32), "F16/F32 weights run only with exact activations");
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
    const int isa = g_isa;
    const int64_t nb = K / ABLK;
    std::vector<int8_t> q(exact ? 0 : MAX_ROWS * K);
    std::vector<float> dx(exact ? 0 : MAX_ROWS * nb), xs(dx.size());
    std::vector<int32_t> bs16(dx.size()), bs32(dx.size());
    pybind11::gil_scoped_release nogil;
    // Rows are independent, so chunks of MAX_ROWS give every row the same result as any other batching.
    for (int64_t r0 = 0; r0 < R; r0 += MAX_ROWS) {
        const int rn = static_cast<int>(std::min<int64_t>(MAX_ROWS, R - r0));
        const float* xp = xc.data_ptr<float>() + r0 * K;
        MatArgs a{static_cast<int>(qtype), packed.data_ptr<uint8_t>(), N, K, bp, out.data_ptr<float>() + r0 * N,
                  static_cast<int>(nthreads)};
        if (exact) {
            (isa == AVX512 ? avx512::matmul_f32 : isa == AVXVNNI ? avxvnni::matmul_f32 : isa == AVX2 ? avx2::matmul_f32
                                                                                    : scalar::matmul_f32)(a, xp, rn);
            continue;
        }
        ActQ aq{rn, K, q.data(), dx.data(), xs.data(), bs16.data(), bs32.data()};
        (isa == AVX512 ? avx512::quantize_acts : isa == AVXVNNI ? avxvnni::quantize_acts : isa == AVX2 ? avx2::quantize_acts
                                                                                     : scalar::quantize_acts)(
            xp, rn, K, q.data(), dx.data(), xs.data(), bs16.data(), bs32.data());
        (isa == AVX512 ? avx512::matmul_q8 : isa == AVXVNNI ? avxvnni::matmul_q8 : isa == AVX2 ? avx2::matmul_q8
                                                                             : scalar::matmul_q8)(a, aq);
    }
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "SpecLens quantized linear kernels (GGML block types, batch-invariant)";
    m.def("repack", &py_repack, "GGUF blocks at raw_addr -> packed units");
    m.def("dequant_cols", &py_dequant_cols, "exact fp32 weights of the given output features");
    m.def("matmul", &matmul, "y = x W^T (+ bias)");
    m.def("isa", &get_isa);
    m.def("set_isa", &set_isa);
    m.def("supported_isas", &supported_isas);
    m.def("packed_bytes", [](int64_t qtype, int64_t N, int64_t K) { return packed_bytes(qtype, N, K); });
}
