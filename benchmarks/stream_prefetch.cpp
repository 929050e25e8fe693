// Does a core's arithmetic overlap its memory reads? The question behind patch 0009
// (packaging/llama-patches/0009-cpu-sgemm-narrow-tiles-stream-ahead.patch), asked without llama.cpp.
//
// Each thread (one per core by default) streams its own 256 MB of F16 weight rows (k = 576, the
// SmolLM2-135M width) as tinyBLAS's one-row tile does: per 16 weights one vcvtph2ps and one FMA
// for each of N tokens (N accumulators, the activations in L1). It runs every prefetch style in
// turn, seven rounds, and prints one JSON line per N with each style's median milliseconds, beside
// the same arithmetic on 512 KB that stays in L2 (no memory reads) and the stream with no
// arithmetic (N = 0): the time a style takes against those two says how much of one hid the other.
//
//     g++ -O3 -mavx512f -mavx512bw -mavx512vl -mf16c -mfma -pthread -o /tmp/stream_prefetch benchmarks/stream_prefetch.cpp
//     /tmp/stream_prefetch [threads]
//
// Styles: "next_row_step" takes 16 weights a step and fetches the next row at the same offset into
// L1 every step (the one-row tile of 0006-0008); the others walk a cache line a step: "next_row_l1"
// fetches the next row into L1 twice a line, "none" nothing, "ahead_2k_l1" 2 KB ahead into L1 once
// a line, "ahead_8k_l2" 8 KB ahead into L2 once a line (0009).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr int K = 576;
constexpr size_t STREAM_BYTES = size_t(256) << 20;
constexpr size_t CACHED_BYTES = size_t(512) << 10;

enum Style { NEXT_ROW_STEP, NEXT_ROW_L1, NONE, AHEAD_2K_L1, AHEAD_8K_L2 };
const char *const STYLE_NAMES[] = {"next_row_step", "next_row_l1", "none", "ahead_2k_l1", "ahead_8k_l2"};

template <int N, Style S>
__attribute__((noinline)) float stream(const uint16_t *A, size_t rows, const float *B, float *out) {
    for (size_t r = 0; r < rows; ++r) {
        __m512 c[N > 0 ? N : 1];
        for (int j = 0; j < (N > 0 ? N : 1); ++j) c[j] = _mm512_setzero_ps();
        const uint16_t *a = A + r * K;
        if (S == NEXT_ROW_STEP) {  // 16 weights a step, the next row fetched at the same offset (0001-0008)
            for (int l = 0; l < K; l += 16) {
                _mm_prefetch((const char *)(a + K + l), _MM_HINT_T0);
                const __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + l)));
#pragma GCC unroll 16
                for (int j = 0; j < N; ++j) c[j] = _mm512_fmadd_ps(w, _mm512_loadu_ps(B + j * K + l), c[j]);
            }
        } else {
            for (int l = 0; l < K; l += 32) {  // one 64-byte line of F16 weights a step
                if (S == NEXT_ROW_L1) _mm_prefetch((const char *)(a + K + l), _MM_HINT_T0);
                if (S == AHEAD_2K_L1) _mm_prefetch((const char *)(a + l) + 2048, _MM_HINT_T0);
                if (S == AHEAD_8K_L2) _mm_prefetch((const char *)(a + l) + 8192, _MM_HINT_T1);
                for (int h = 0; h < 32; h += 16) {
                    if (S == NEXT_ROW_L1 && h) _mm_prefetch((const char *)(a + K + l + h), _MM_HINT_T0);
                    const __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + l + h)));
                    if (N == 0) c[0] = _mm512_add_ps(c[0], w);  // the stream alone
#pragma GCC unroll 16
                    for (int j = 0; j < N; ++j) c[j] = _mm512_fmadd_ps(w, _mm512_loadu_ps(B + j * K + l + h), c[j]);
                }
            }
        }
        float s = 0;
        for (int j = 0; j < (N > 0 ? N : 1); ++j) s += _mm512_reduce_add_ps(c[j]);
        out[r] = s;
    }
    return out[0];
}

using Fn = float (*)(const uint16_t *, size_t, const float *, float *);

struct Worker {
    uint16_t *A;
    float *B;
    float *out;
};

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// every thread runs fn over its own buffer (cached: the first 512 KB, as many times as the stream's rows)
double timed(std::vector<Worker> &workers, Fn fn, bool cached) {
    const size_t rows = STREAM_BYTES / 2 / K, cached_rows = CACHED_BYTES / 2 / K;
    const double start = now_ms();
    std::vector<std::thread> threads;
    for (Worker &w : workers)
        threads.emplace_back([&w, fn, cached, rows, cached_rows] {
            if (cached)
                for (size_t done = 0; done + cached_rows <= rows; done += cached_rows) fn(w.A, cached_rows, w.B, w.out);
            else
                fn(w.A, rows, w.B, w.out);
        });
    for (std::thread &t : threads) t.join();
    return now_ms() - start;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <int N>
void run_n(std::vector<Worker> &workers, int rounds) {
    const Fn styles[] = {stream<N, NEXT_ROW_STEP>, stream<N, NEXT_ROW_L1>, stream<N, NONE>, stream<N, AHEAD_2K_L1>,
                         stream<N, AHEAD_8K_L2>};
    constexpr int STYLES = 5;
    std::vector<std::vector<double>> t(STYLES + 2);
    for (int r = 0; r < rounds; ++r) {  // the styles in turn each round, so a slow spell touches all
        for (int s = 0; s < STYLES; ++s) t[s].push_back(timed(workers, styles[s], false));
        t[STYLES].push_back(timed(workers, stream<N, NONE>, true));
        t[STYLES + 1].push_back(timed(workers, stream<0, NONE>, false));
    }
    printf("{\"tokens\": %d, \"threads\": %zu, \"stream_mb_per_thread\": %zu, \"ms\": {", N, workers.size(),
           STREAM_BYTES >> 20);
    for (int s = 0; s < STYLES; ++s) printf("\"%s\": %.2f, ", STYLE_NAMES[s], median(t[s]));
    printf("\"arithmetic_in_l2\": %.2f, \"stream_alone\": %.2f}}\n", median(t[STYLES]), median(t[STYLES + 1]));
    fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
    const int n_threads = argc > 1 ? atoi(argv[1]) : 2;
    std::vector<Worker> workers(n_threads);
    for (Worker &w : workers) {
        w.A = (uint16_t *)aligned_alloc(64, STREAM_BYTES + 16384);
        for (size_t i = 0; i < (STREAM_BYTES + 16384) / 2; ++i) w.A[i] = 0x3c00 + (i & 7);
        w.B = (float *)aligned_alloc(64, 8 * K * sizeof(float));
        for (int i = 0; i < 8 * K; ++i) w.B[i] = 1e-3f * (i % 13);
        w.out = (float *)malloc(STREAM_BYTES / 2 / K * sizeof(float));
    }
    run_n<1>(workers, 7);
    run_n<3>(workers, 7);
    run_n<5>(workers, 7);
    run_n<8>(workers, 7);
    return 0;
}
