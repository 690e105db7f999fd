// The instruction sets the kernels are built for, in one table: the name Python and SPECLENS_QUANT_ISA use, the
// name shown to the user, the CPU check and the kernels. Python reads it through the module's isa_table().
#pragma once
#include "quant.h"

namespace sq {

struct IsaFns {  // the dispatched kernels of one instruction set
    void (*quantize_acts)(const float*, int, int64_t, int8_t*, float*, float*, int32_t*, int32_t*);
    void (*matmul_q8)(const MatArgs*, int, const ActQ&);
    void (*matmul_f32)(const MatArgs&, const float*, int);
    void (*attend)(const AttnArgs&);
    void (*silu_mul)(const float*, int, int64_t, float*, int);
    void (*gelu_tanh_mul)(const float*, int, int64_t, float*, int);
    void (*requant_q40)(int, const uint8_t*, int64_t, int64_t, uint8_t*, int);
    void (*to_half)(const float*, int64_t, uint16_t*);  // fp32 -> fp16, nearest even (a KV row into an fp16 pool)
};

struct Isa {
    const char* name;     // e.g. "avx512vnni"
    const char* display;  // e.g. "AVX-512 VNNI"
    bool (*supported)();  // this CPU runs it
    IsaFns fns;
};

constexpr int N_ISAS = 4;
extern const Isa ISAS[N_ISAS];  // in order of preference, last best
int best_isa();                 // index of the best one this CPU runs

// The AVX-512 kernels' choice of tile: the row count from which they take two 8-column groups per 512-bit register
// (0: each block type's default; MAX_ROWS + 1: never). Either gives the same bits; the faster one depends on the CPU.
extern int g_pair_from;

// Whether a call over 1-6 rows (one stream of weights per thread) asks for each unit 6 KB ahead (1) or leaves the
// stream to the hardware prefetcher (0, the default). Either gives the same bits; the faster one depends on the CPU.
extern int g_stream_prefetch;

}  // namespace sq
