// Shared definitions of the quantized-linear extension: type ids, the packed ("kernel") layout, the
// quantized-activation bundle and the per-ISA entry points. Kernel files include no torch headers, so
// they compile in seconds; only bindings.cpp sees torch.
//
// Packed layout. Output features (GGUF rows) are taken 8 at a time ("a group"); a group's weights over
// `unit_k` consecutive inputs form one "unit". Units are stored [group][unit along K], so a thread working
// through a chunk of groups streams one contiguous range of memory. Inside a unit, quants sit in "steps":
// 32 bytes = 8 columns x 4 consecutive k (bytes 4c..4c+3 are column c). One AVX2 register then holds a
// step, an int8 activation broadcast of 4 bytes multiplies it with maddubs, and every 32-bit lane ends
// up as one output column: no horizontal sums, and the weight step is decoded once for all R rows.
//
// The units are the structs below (each one's size and field offsets checked at compile time); q is the
// file's unsigned quant, c the column, e = k % 4. Bits per weight equal the file's except Q4_K/Q5_K (+0.125:
// their 6-bit scales are kept as bytes).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sq {

// GGML type ids (gguf.GGMLQuantizationType)
enum QType : int { F32 = 0, F16 = 1, Q4_0 = 2, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30 };

constexpr int GROUP = 8;   // output columns per group
constexpr int ABLK = 32;   // inputs per activation-quantization block
constexpr int MAX_ROWS = 16;
constexpr int STEP = 4 * GROUP;  // bytes of a step: 4 consecutive k of the 8 columns, column c in bytes 4c..4c+3

// ---- packed units (f16 fields hold the file's bits; [sub][c] arrays hold one byte per column) --------------

struct UnitQ4K {
    static constexpr int K = 256;
    uint16_t d[GROUP], dmin[GROUP];  // f16
    uint8_t sc[8][GROUP];            // [sub-block of 32 k][c]: 6-bit scale
    uint8_t m[8][GROUP];             // [sub-block][c]: 6-bit min
    uint8_t qs[8][4][STEP];          // [sub-block][t]: low nibble = step t, high nibble = step t + 4
};
struct UnitQ5K {  // Q4_K's unit, then the 5th bits
    static constexpr int K = 256;
    UnitQ4K k;
    uint8_t qh[8][STEP];  // [sub-block]: bit s = 5th bit of step s
};
// Q6_K's 4 steps s0..s3 of a sub-block in 3 vectors: v0 = q(s0) | hi2(s2) << 6, v1 = q(s1) | hi2(s3) << 6,
// v2 = lo4(s2) | lo4(s3) << 4 (9 ops decode 4 steps, half of a nibble + 2-bit-plane split)
struct UnitQ6K {
    static constexpr int K = 256;
    uint16_t d[GROUP];         // f16
    int8_t sc[16][GROUP];      // [sub-block of 16 k][c]
    uint8_t qv[16][3][STEP];   // [sub-block][v0, v1, v2]
};
struct UnitQ80 {
    static constexpr int K = 32;
    uint16_t d[GROUP];   // f16
    int8_t q[8][STEP];   // [step]
};
struct UnitQ50 {
    static constexpr int K = 32;
    uint16_t d[GROUP];    // f16
    uint8_t qs[4][STEP];  // [t]: low nibble = step t, high nibble = step t + 4
    uint8_t qh[STEP];     // bit s = 5th bit of step s
};
struct UnitQ40 {  // Q5_0's unit without the 5th bits
    static constexpr int K = 32;
    uint16_t d[GROUP];    // f16
    uint8_t qs[4][STEP];  // [t]: low nibble = step t, high nibble = step t + 4
};
struct UnitF16 {
    static constexpr int K = 32;
    uint16_t w[K][GROUP];  // f16
};
struct UnitBF16 {  // bf16 is fp32's upper half: widened exactly by a shift (a bf16 checkpoint in half the bytes)
    static constexpr int K = 32;
    uint16_t w[K][GROUP];  // bf16
};
struct UnitF32 {
    static constexpr int K = 32;
    float w[K][GROUP];
};

static_assert(sizeof(UnitQ4K) == 1184 && offsetof(UnitQ4K, dmin) == 16 && offsetof(UnitQ4K, sc) == 32 &&
              offsetof(UnitQ4K, m) == 96 && offsetof(UnitQ4K, qs) == 160, "Q4_K unit layout");
// offsetof(k) == 0: code that reads only the Q4_K fields takes a Q5_K unit as a Q4_K one
static_assert(sizeof(UnitQ5K) == 1440 && offsetof(UnitQ5K, k) == 0 && offsetof(UnitQ5K, qh) == 1184, "Q5_K unit layout");
static_assert(sizeof(UnitQ6K) == 1680 && offsetof(UnitQ6K, sc) == 16 && offsetof(UnitQ6K, qv) == 144, "Q6_K unit layout");
static_assert(sizeof(UnitQ80) == 272 && offsetof(UnitQ80, q) == 16, "Q8_0 unit layout");
static_assert(sizeof(UnitQ50) == 176 && offsetof(UnitQ50, qs) == 16 && offsetof(UnitQ50, qh) == 144, "Q5_0 unit layout");
static_assert(sizeof(UnitQ40) == 144 && offsetof(UnitQ40, qs) == 16, "Q4_0 unit layout");
static_assert(sizeof(UnitF16) == 512 && sizeof(UnitBF16) == 512 && sizeof(UnitF32) == 1024, "F16/BF16/F32 unit layout");

// Threads take output groups in chunks, about 8 per thread, first come first served: a thread the OS
// descheduled (a machine shared with other jobs) then delays a call by one chunk, not by its whole share.
// Which thread computes a group never changes its result.
inline int chunk_of(int64_t groups, int nthreads) {
    const int64_t c = groups / (8 * static_cast<int64_t>(nthreads > 0 ? nthreads : 1));
    return static_cast<int>(c < 1 ? 1 : c);
}

struct Layout {
    int unit_k;      // inputs per unit
    int unit_bytes;  // packed bytes per unit (8 columns)
    int blk;         // GGUF block size (inputs)
    int blk_bytes;   // GGUF bytes per block
};
bool layout_of(int qtype, Layout* out);  // false for a type the kernels do not run

// Where the units of a packed matrix lie. Over K <= SLICE_K inputs each group of 8 columns keeps its units back to
// back. A longer K stores the groups in runs of RUN, slice by slice: the run's units over the first SLICE_K inputs
// (group by group), then over the next. A pass over several rows takes a run through one slice at a time, so the
// slice's activations stay in L1 while the weights stream in the order they lie in memory (kernels_x86.h,
// groups_q8). One group's units within a slice are still back to back.
constexpr int64_t SLICE_K = 2048, RUN = 8;
struct Packing {
    int64_t groups = 0, units = 0, slice = 0;  // slice: units per slice (all of them when K <= SLICE_K)
    Packing() = default;
    Packing(const Layout& L, int64_t N, int64_t K)
        : groups((N + GROUP - 1) / GROUP), units(K / L.unit_k), slice(K > SLICE_K ? SLICE_K / L.unit_k : units) {}
    // the index of unit u of group g, counted in units from the start of the matrix
    int64_t at(int64_t g, int64_t u) const {
        if (slice >= units) return g * units + u;
        const int64_t r0 = g - g % RUN, n = std::min<int64_t>(RUN, groups - r0), s0 = u - u % slice;
        return r0 * units + s0 * n + (g - r0) * std::min(slice, units - s0) + (u - s0);
    }
};

// Quantized activations of R rows: q = round(x / dx) per 32-input block, |q| <= 127. Block-major (a block's
// R rows adjacent), so a kernel walks the rows of one block with a constant 32-byte stride.
struct ActQ {
    int R;
    int64_t K;
    const int8_t* q;      // (K/32, R, 32)
    const float* dx;      // (K/32, R)  block scale = amax / 127
    const float* xs;      // (K/32, R)  dx * sum(q) over the block (Q4_K/Q5_K mins)
    const int32_t* bs16;  // (K/32, R)  sums of q over the two 16-halves, packed as two int16
    const int32_t* bs32;  // (K/32, R)  sum of q over the block
};

struct MatArgs {
    int qtype;
    const uint8_t* packed;
    int64_t N, K;          // output and input features
    const float* bias;     // (N,) or null
    float* out;            // (R, N), rows ldo apart
    int nthreads;
    int64_t ldo = 0;       // out's row stride; 0: N
    int64_t row_stride() const { return ldo ? ldo : N; }
};

// matmul_q8 takes a layer made of up to this many parts (q | k | v stored as different block types) at once
constexpr int MAX_PARTS = 4;

// Causal attention of T queries (the last T of S positions) over one layer's cache, in attend.h, optionally
// within a sliding window.
constexpr int MAX_HEAD_DIM = 256;
// The offset, in elements, of KV head g's row at a slot in one layer's head-major (Hkv, slots, D) cache
inline int64_t kv_row(int g, int64_t slot, int64_t slots, int D) { return (g * slots + slot) * D; }
// The KV pool's element type: fp32, or IEEE fp16 (half the bytes a long context's attention reads; values are
// rounded to nearest even once, when written, and read back exactly)
enum KvType : int { KV_F32 = 0, KV_F16 = 1 };
inline int kv_bytes(KvType t) { return t == KV_F16 ? 2 : 4; }
struct AttnArgs {
    const float* q;        // (T, H, D)
    const void* k;         // this layer's key slots (Hkv, slots, D), of type kv
    const void* v;         // this layer's value slots
    KvType kv;
    int64_t slots;         // slots per KV head
    const int64_t* read;   // (S,) slot of position j, or null: slot = base + j
    int64_t base, S;
    int T, H, Hkv, D;      // D a multiple of 8, at most MAX_HEAD_DIM
    float scale;
    float* out;            // (T, H, D)
    int nthreads;
    int64_t window = 0;    // query at position p sees keys max(0, p - window + 1) .. p; 0: keys 0 .. p
};

// f16 <-> f32 without F16C (exact; used by scalar code and repacking); float_to_half rounds to nearest even, as F16C
// and torch do (a NaN stays a NaN, its payload aside)
float half_to_float(uint16_t h);
inline float bf16_to_float(uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
}
uint16_t float_to_half(float f);

// Repacking and exact (file-identical) dequantization, in repack.cpp
int64_t packed_bytes(int qtype, int64_t N, int64_t K);
// rows: GGUF row of output column n, or null for the identity. raw: (rows, row_bytes) GGUF blocks.
void repack(int qtype, const uint8_t* raw, int64_t raw_rows, int64_t N, int64_t K, const int64_t* rows,
            uint8_t* packed, int nthreads);
void dequant_cols(int qtype, const uint8_t* packed, int64_t N, int64_t K, const int64_t* idx, int64_t n_idx,
                  float* out);

// One namespace per instruction set; all produce bitwise identical results (same integer sums, same
// float operations in the same order per output element). matmul_q8: n <= MAX_PARTS matrices over the same
// activations, each into its own `out`. requant_q40: packed units of any type -> packed Q4_0
// units of the same matrix, each column's 32-input blocks of exact weights quantized by ggml's reference rule
// (d = the signed value of largest magnitude / -8); the scalar one is the statement of the rule (repack.cpp).
#define SQ_DECLARE_ISA(ns)                                                                   \
    namespace ns {                                                                           \
    void quantize_acts(const float* x, int R, int64_t K, int8_t* q, float* dx, float* xs,    \
                       int32_t* bs16, int32_t* bs32);                                        \
    void matmul_q8(const MatArgs* parts, int n, const ActQ& x);                              \
    void matmul_f32(const MatArgs& a, const float* x, int R);                                \
    void attend(const AttnArgs& a);                                                          \
    void silu_mul(const float* gu, int T, int64_t I, float* out, int nthreads);              \
    void gelu_tanh_mul(const float* gu, int T, int64_t I, float* out, int nthreads);         \
    void requant_q40(int qtype, const uint8_t* packed, int64_t N, int64_t K, uint8_t* out,   \
                     int nthreads);                                                          \
    void to_half(const float* x, int64_t n, uint16_t* out);                                  \
    }
SQ_DECLARE_ISA(scalar)
SQ_DECLARE_ISA(avx2)
SQ_DECLARE_ISA(avxvnni)
SQ_DECLARE_ISA(avx512)
#undef SQ_DECLARE_ISA

}  // namespace sq
