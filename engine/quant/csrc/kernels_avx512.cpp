// AVX-512 VNNI kernels (Ice Lake / Sapphire Rapids / Zen 4 and later): the AVX2 kernels with the int8 dot
// done by vpdpbusd on 256-bit registers (AVX512VL). 256 bits keep the packed layout shared with AVX2
// and avoid the frequency drop some CPUs take on 512-bit integer work.
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant.h"

namespace sq::avx512 {
#define SQ_VNNI 1
#include "kernels_x86.h"
#include "attend.h"
#undef SQ_VNNI
}  // namespace sq::avx512
