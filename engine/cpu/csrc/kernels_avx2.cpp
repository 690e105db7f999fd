// AVX2 + FMA + F16C kernels (Haswell / Zen and later). Compiled for that target by the pragma, so the
// build itself needs no -march flag and runs anywhere; the dispatcher calls it only where supported.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "isa.h"
#include "quant.h"

namespace sq::avx2 {
#define SQ_VNNI 0
#include "kernels_x86.h"
#include "attend.h"
#undef SQ_VNNI
}  // namespace sq::avx2
