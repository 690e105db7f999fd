// AVX-VNNI kernels (Intel Alder Lake and later client CPUs, which dropped AVX-512): the AVX2 kernels with the
// int8 dot done by the VEX-encoded vpdpbusd.
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "isa.h"
#include "quant.h"

namespace sq::avxvnni {
#define SQ_VNNI 1
#define SQ_AVXVNNI 1
#include "kernels_x86.h"
#include "attend.h"
#undef SQ_AVXVNNI
#undef SQ_VNNI
}  // namespace sq::avxvnni
