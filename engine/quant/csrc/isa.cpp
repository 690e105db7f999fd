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

constexpr Isa ISAS[N_ISAS] = {
    {"scalar", "scalar", always,
     {scalar::quantize_acts, scalar::matmul_q8, scalar::matmul_f32, scalar::attend, scalar::silu_mul, scalar::requant_q40, scalar::to_half}},
    {"avx2", "AVX2", avx2_ok, {avx2::quantize_acts, avx2::matmul_q8, avx2::matmul_f32, avx2::attend, avx2::silu_mul, avx2::requant_q40, avx2::to_half}},
    {"avxvnni", "AVX-VNNI", avxvnni_ok,
     {avxvnni::quantize_acts, avxvnni::matmul_q8, avxvnni::matmul_f32, avxvnni::attend, avxvnni::silu_mul, avxvnni::requant_q40, avxvnni::to_half}},
    {"avx512vnni", "AVX-512 VNNI", avx512vnni_ok,
     {avx512::quantize_acts, avx512::matmul_q8, avx512::matmul_f32, avx512::attend, avx512::silu_mul, avx512::requant_q40, avx512::to_half}},
};

int g_pair_from = 0;

int best_isa() {
    for (int i = N_ISAS - 1; i > 0; --i)
        if (ISAS[i].supported()) return i;
    return 0;
}

}  // namespace sq
