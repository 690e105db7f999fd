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
// Units (offsets in bytes; q is the file's unsigned quant, c the column, e = k % 4):
//   Q4_K (256 k, 1184 B): d[8] f16 | dmin[8] f16 | sc[8 sub][8 c] u8 | m[8][8] u8 |
//                         qs[8 sub][4 t][32]: low nibble = step t, high nibble = step t+4 of the sub-block
//   Q5_K (256 k, 1440 B): Q4_K's unit, then qh[8 sub][32]: bit s = 5th bit of step s
//   Q6_K (256 k, 1680 B): d[8] f16 | sc[16 sub][8 c] i8 | qv[16 sub][3][32], for steps s0..s3 of the sub-block:
//                         v0 = q(s0) | hi2(s2) << 6, v1 = q(s1) | hi2(s3) << 6, v2 = lo4(s2) | lo4(s3) << 4
//                         (9 ops decode 4 steps, half of a nibble + 2-bit-plane split)
//   Q8_0 (32 k, 272 B):   d[8] f16 | q[8 steps][32] i8
//   Q5_0 (32 k, 176 B):   d[8] f16 | qs[4 t][32] (low = step t, high = step t+4) | qh[32]: bit s of step s
//   F16  (32 k, 512 B):   w[32 k][8 c] f16        F32 (32 k, 1024 B): w[32 k][8 c] f32
// Bits per weight equal the file's except Q4_K/Q5_K (+0.125: their 6-bit scales are kept as bytes).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sq {

// GGML type ids (gguf.GGMLQuantizationType)
enum QType : int { F32 = 0, F16 = 1, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

constexpr int GROUP = 8;   // output columns per group
constexpr int ABLK = 32;   // inputs per activation-quantization block
constexpr int MAX_ROWS = 16;

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
bool layout_of(int qtype, Layout* out);

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
    float* out;            // (R, N)
    int nthreads;
};

// Causal attention of T queries (the last T of S positions) over one layer's cache, in attend.h.
constexpr int MAX_HEAD_DIM = 256;
struct AttnArgs {
    const float* q;        // (T, H, D)
    const float* k;        // this layer's key slots (slots, Hkv, D)
    const float* v;        // this layer's value slots
    const int64_t* read;   // (S,) slot of position j, or null: slot = base + j
    int64_t base, S;
    int T, H, Hkv, D;      // D a multiple of 8, at most MAX_HEAD_DIM
    float scale;
    float* out;            // (T, H, D)
    int nthreads;
};

// f16 <-> f32 without F16C (exact; used by scalar code and repacking)
float half_to_float(uint16_t h);

// Repacking and exact (file-identical) dequantization, in repack.cpp
int64_t packed_bytes(int qtype, int64_t N, int64_t K);
// rows: GGUF row of output column n, or null for the identity. raw: (rows, row_bytes) GGUF blocks.
void repack(int qtype, const uint8_t* raw, int64_t raw_rows, int64_t N, int64_t K, const int64_t* rows,
            uint8_t* packed, int nthreads);
void dequant_cols(int qtype, const uint8_t* packed, int64_t N, int64_t K, const int64_t* idx, int64_t n_idx,
                  float* out);

// One namespace per instruction set; all produce bitwise identical results (same integer sums, same
// float operations in the same order per output element).
#define SQ_DECLARE_ISA(ns)                                                                   \
    namespace ns {                                                                           \
    void quantize_acts(const float* x, int R, int64_t K, int8_t* q, float* dx, float* xs,    \
                       int32_t* bs16, int32_t* bs32);                                        \
    void matmul_q8(const MatArgs& a, const ActQ& x);                                         \
    void matmul_f32(const MatArgs& a, const float* x, int R);                                \
    void attend(const AttnArgs& a);                                                          \
    void silu_mul(const float* gu, int T, int64_t I, float* out, int nthreads);              \
    }
SQ_DECLARE_ISA(scalar)
SQ_DECLARE_ISA(avx2)
SQ_DECLARE_ISA(avxvnni)
SQ_DECLARE_ISA(avx512)
#undef SQ_DECLARE_ISA

}  // namespace sq
