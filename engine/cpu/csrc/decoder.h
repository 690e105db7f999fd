// A whole stack of Llama-family decoder layers (Llama, Qwen2/3, Gemma 3, Phi-3, Mistral, SmolLM3, Granite) over quantized weights, for passes of T <= MAX_ROWS tokens
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
    const float* q_norm = nullptr;          // (D,) per-head RMSNorm of q before RoPE, or null (Qwen3, Gemma 3)
    const float* k_norm = nullptr;          // (D,) the same for k
    const float* post_attn_norm = nullptr;  // (C,) on the attention's output before its residual add, or null (Gemma)
    const float* post_mlp_norm = nullptr;   // (C,) on the MLP's output before its residual add, or null
    int64_t window = 0;                     // a query at p sees keys max(0, p - window + 1) .. p; 0: all of 0 .. p
    const float* cos = nullptr;             // this layer's (P, rotary_dim) rotary tables: the stack's or a local one
    const float* sin = nullptr;
};

enum Activation : int { ACT_SILU = 0, ACT_GELU_TANH = 1 };  // the gated MLP's act(gate) * up

struct Stack {
    int C, H, Hkv, D, I;
    float eps;
    int64_t P;                // positions in every layer's rotary tables
    int rotary_dim;           // RoPE turns the first rotary_dim dims of each head (even, <= D); the rest pass through
    float attn_scale;         // scores are q . k * attn_scale
    Activation act;
    const float* final_norm;  // (C,)
    std::vector<Layer> layers;
    float residual_scale = 1.0f;  // each sublayer's output times this before its residual add (Granite)
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
