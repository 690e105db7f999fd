// The integer-dot peak of this CPU, as the int8-activation kernels use it: independent chains of the dot
// instruction the kernels' ISA has (vpdpbusd in 256 and 512 bits where there is VNNI, else AVX2's vpmaddubsw,
// 32 products each), on T threads at once, and the core clock from a chain of dependent adds. Built and run by
// scripts/pass_bound.py (g++ -O2 -march=native); one line per measurement:
//   clock <GHz>
//   dot <name> <threads> <G products a second, all threads>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One add a cycle: the loop's add and its counter are each a chain of one-cycle steps.
double clock_ghz(int64_t iters) {
    int64_t x = 0, n = iters;
    const auto t0 = Clock::now();
    asm volatile("1: add $1, %0\n\tdec %1\n\tjnz 1b" : "+r"(x), "+r"(n));
    return static_cast<double>(iters) / seconds_since(t0) / 1e9;
}

// CHAINS accumulators, each updated once per iteration: enough in flight to cover the dot's latency (4-5 cycles) at
// two a cycle. Named one by one so each stays in its register (as an array, GCC kept them in memory or copied them
// every iteration). The accumulators and operands pass through empty asm statements, so the compiler can neither
// merge the chains nor fold or hoist the dots. Returns the dot instructions run.
constexpr int CHAINS = 12;
template <class V, class Step>
int64_t chains(int64_t iters, V zero, Step step) {
    V a0 = zero, a1 = zero, a2 = zero, a3 = zero, a4 = zero, a5 = zero, a6 = zero, a7 = zero, a8 = zero, a9 = zero,
      a10 = zero, a11 = zero;
    asm("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));  // twelve chains, not one
    asm("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    for (int64_t i = 0; i < iters; ++i) {
        a0 = step(a0), a1 = step(a1), a2 = step(a2), a3 = step(a3), a4 = step(a4), a5 = step(a5);
        a6 = step(a6), a7 = step(a7), a8 = step(a8), a9 = step(a9), a10 = step(a10), a11 = step(a11);
    }
    asm volatile("" : : "v"(a0), "v"(a1), "v"(a2), "v"(a3), "v"(a4), "v"(a5));
    asm volatile("" : : "v"(a6), "v"(a7), "v"(a8), "v"(a9), "v"(a10), "v"(a11));
    return iters * CHAINS;
}

// a value the compiler cannot see through; `volatile`: nor hoist out of a loop, nor merge with another
template <class V>
V opaque(V v) {
    asm volatile("" : "+v"(v));
    return v;
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
int64_t dots_vnni256(int64_t iters) {
    const __m256i w = opaque(_mm256_set1_epi8(3)), x = opaque(_mm256_set1_epi8(5));
    return 32 * chains(iters, _mm256_setzero_si256(), [&](__m256i a) { return _mm256_dpbusd_epi32(a, w, x); });
}
int64_t dots_vnni512(int64_t iters) {
    const __m512i w = opaque(_mm512_set1_epi8(3)), x = opaque(_mm512_set1_epi8(5));
    return 64 * chains(iters, _mm512_setzero_si512(), [&](__m512i a) { return _mm512_dpbusd_epi32(a, w, x); });
}
#elif defined(__AVXVNNI__)
int64_t dots_vnni256(int64_t iters) {
    const __m256i w = opaque(_mm256_set1_epi8(3)), x = opaque(_mm256_set1_epi8(5));
    return 32 * chains(iters, _mm256_setzero_si256(), [&](__m256i a) { return _mm256_dpbusd_avx_epi32(a, w, x); });
}
#endif

#if defined(__AVX2__)
// AVX2 has no 4-way dot: vpmaddubsw makes int16 pair sums (32 products), which the kernels add up in int16 and widen
// every few steps; the widening and the adds run beside it, so the products' rate is vpmaddubsw's.
int64_t dots_maddubs(int64_t iters) {
    const __m256i w = opaque(_mm256_set1_epi8(3)), x = opaque(_mm256_set1_epi8(5));
    // w made opaque at every step: the product does not depend on the accumulator, and would be hoisted out
    return 32 * chains(iters, _mm256_setzero_si256(),
                       [&](__m256i a) { return _mm256_add_epi16(a, _mm256_maddubs_epi16(opaque(w), x)); });
}
#endif

// G products a second over `threads` threads running fn at once
double rate(int64_t (*fn)(int64_t), int threads, int64_t iters) {
    std::vector<std::thread> team;
    std::vector<int64_t> products(threads);
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) team.emplace_back([&, t] { products[t] = fn(iters); });
    for (auto& th : team) th.join();
    const double s = seconds_since(t0);
    int64_t total = 0;
    for (int64_t p : products) total += p;
    return static_cast<double>(total) / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
    const int64_t iters = argc > 2 ? std::atoll(argv[2]) : 40'000'000;
    struct Dot {
        const char* name;
        int64_t (*fn)(int64_t);
    };
    std::vector<Dot> dots;
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
    dots.push_back({"vpdpbusd-256", dots_vnni256});
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    dots.push_back({"vpdpbusd-512", dots_vnni512});
#endif
#if defined(__AVX2__)
    if (dots.empty()) dots.push_back({"vpmaddubsw-256", dots_maddubs});
#endif
    if (dots.empty()) {
        std::fprintf(stderr, "no AVX2 on this CPU: the kernels run their scalar code\n");
        return 2;
    }
    for (const Dot& d : dots) {
        double best = 0;  // the best of three: a core the hypervisor just woke, or lent away, runs slower
        for (int i = 0; i < 3; ++i) best = std::max(best, rate(d.fn, threads, iters));
        std::printf("dot %s %d %.1f\n", d.name, threads, best);
    }
    double ghz = 0;  // after the dots, the core awake; the best of three, as above
    for (int i = 0; i < 3; ++i) ghz = std::max(ghz, clock_ghz(iters * 10));
    std::printf("clock %.3f\n", ghz);
    return 0;
}
