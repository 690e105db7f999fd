#include "isa.h"

namespace sq {

namespace {

bool avx2_ok() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
bool avxvnni_ok() { return avx2_ok() && __builtin_cpu_supports("avxvnni"); }
bool avx512vnni_ok() {
    return avx2_ok() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
bool always() { return true; }

}  // namespace

// Each instruction set's entry points, in IsaFns's order
#define SQ_FNS(ns) {ns::quantize_acts, ns::matmul_q8, ns::matmul_f32, ns::attend, ns::silu_mul, ns::gelu_tanh_mul, ns::requant_q40, ns::to_half}
constexpr Isa ISAS[N_ISAS] = {
    {"scalar", "scalar", always, SQ_FNS(scalar)},
    {"avx2", "AVX2", avx2_ok, SQ_FNS(avx2)},
    {"avxvnni", "AVX-VNNI", avxvnni_ok, SQ_FNS(avxvnni)},
    {"avx512vnni", "AVX-512 VNNI", avx512vnni_ok, SQ_FNS(avx512)},
};
#undef SQ_FNS

int g_pair_from = 0;
int g_stream_prefetch = 0;

int best_isa() {
    for (int i = N_ISAS - 1; i > 0; --i)
        if (ISAS[i].supported()) return i;
    return 0;
}

}  // namespace sq
