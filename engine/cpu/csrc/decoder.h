// A whole stack of Llama/Qwen2 decoder layers over quantized weights, for passes of T <= MAX_ROWS tokens
// (decode steps, draft steps and verify passes), in one call: at that width the per-operation cost of
// running norms, rope, attention and residuals as separate framework ops (~10 us each, ~300 a step) is a
// fifth of the step. Torch-free; bindings.cpp wraps it.
#pragma once
#include <cstdint>
#include <vector>

#include "isa.h"
#include "quant.h"

namespace sq {

struct Lin {  // y = x W^T (+ bias) for packed W (N, K)
    int qtype;
    const uint8_t* packed;
    int64_t N, K;
    const float* bias;  // (N,) or null
    bool exact;         // fp32 activations (F16/F32 weights always)
};

struct Layer {
    const float* attn_norm;  // (C,)
    const float* mlp_norm;   // (C,)
    std::vector<Lin> qkv;    // parts whose outputs sit side by side: q (H*D) | k (Hkv*D) | v (Hkv*D)
    Lin o;
    std::vector<Lin> gate_up;  // gate (I) | up (I)
    Lin down;
};

struct Stack {
    int C, H, Hkv, D, I;
    float eps;
    const float* cos;  // (P, D) rotary tables, rows by position
    const float* sin;
    int64_t P;
    const float* final_norm;  // (C,)
    std::vector<Layer> layers;
};

struct Cache {  // one sequence's view of the pool (L, Hkv, slots, D) for this pass
    void* k;
    void* v;
    KvType kv;             // the pool's element type
    int64_t slots;         // slots per layer and KV head
    const int64_t* write;  // (T,) slots of the new positions
    const int64_t* read;   // (S,) slots of positions 0..S-1, or null: base + j
    int64_t base, S;       // S = positions after this pass
};

// y (R, N) = x (R, K) W^T for R <= MAX_ROWS rows.
void linear(const Lin& w, const float* x, int R, float* y, const IsaFns& f, int nthreads);

// x (T, C): embeddings in, final-normed hidden states out. Writes the T new positions' K/V into the cache.
void decode(const Stack& st, const Cache& c, float* x, int T, int64_t start, const IsaFns& f, int nthreads);

}  // namespace sq
