// AVX-512 VNNI kernels (Cascade Lake / Ice Lake / Sapphire Rapids / Zen 4 and later): the AVX2 kernels with
// the int8 dot done by vpdpbusd; the int8-activation matmul takes two 8-column groups at a time in 512-bit
// registers (SQ_ZMM), on the packed layout shared with AVX2.
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "isa.h"
#include "quant.h"

namespace sq::avx512 {
#define SQ_VNNI 1
#define SQ_ZMM 1
#include "kernels_x86.h"
#include "attend.h"
#undef SQ_ZMM
#undef SQ_VNNI
}  // namespace sq::avx512
