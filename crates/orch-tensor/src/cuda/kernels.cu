// orch-tensor CUDA kernels, compiled at run time by NVRTC once per device and process
// (see cuda/mod.rs). Every kernel takes dense inputs unless its name says `strided`; element
// counts are below 2^31 (checked on the host). No headers: NVRTC provides the math builtins.

#define MAXR 6

// Shapes and strides of up to MAXR dims, passed by value (mirrors `Strided2` in ops.rs).
struct Strided2 {
    unsigned int rank;
    unsigned int dims[MAXR];
    unsigned int s0[MAXR];
    unsigned int s1[MAXR];
};

__device__ __forceinline__ float nan_f() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ float neg_inf_f() { return __int_as_float(0xff800000); }

__device__ __forceinline__ void strided_offsets(unsigned int i, const Strided2& s, unsigned int* o0, unsigned int* o1) {
    unsigned int a = 0, b = 0;
    for (int d = (int)s.rank - 1; d >= 0; --d) {
        unsigned int dim = s.dims[d];
        unsigned int r = i % dim;
        i /= dim;
        a += r * s.s0[d];
        b += r * s.s1[d];
    }
    *o0 = a;
    *o1 = b;
}

#define GRID_STRIDE(i, n) \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)

__device__ __forceinline__ float gelu_f(float x) {
    const float c = 0.7978845608f, a = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(c * (x + a * x * x * x)));
}

__device__ __forceinline__ float gelu_grad_f(float x) {
    const float c = 0.7978845608f, a = 0.044715f;
    float t = tanhf(c * (x + a * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * a * x * x);
}

// ---- elementwise --------------------------------------------------------------------------

// The elementwise kernels are generated from the op table (ops/table.rs): one `UNARY(u_<name>,
// expr)` or `BINARY(b_<name>, expr)` line per op is appended to this file before NVRTC compiles
// it (cuda/mod.rs, `kernel_source`). Unary kernels all take two scalar parameters `p0`, `p1`
// (the op's parameters, 0 when unused).
#define UNARY(name, expr) \
    extern "C" __global__ void name(const float* __restrict__ x, float* __restrict__ y, unsigned int n, \
                                    float p0, float p1) { \
        GRID_STRIDE(i, n) { float v = x[i]; y[i] = (expr); } \
    }

extern "C" __global__ void fill(float* __restrict__ y, unsigned int n, float value) {
    GRID_STRIDE(i, n) { y[i] = value; }
}

// `x` is the left operand, `z` the right; the *_grad ops take (upstream gradient, saved value).
#define BINARY(name, expr) \
    extern "C" __global__ void name##_contig(const float* __restrict__ a, const float* __restrict__ b, \
                                             float* __restrict__ y, unsigned int n) { \
        GRID_STRIDE(i, n) { float x = a[i]; float z = b[i]; y[i] = (expr); } \
    } \
    extern "C" __global__ void name##_strided(const float* __restrict__ a, const float* __restrict__ b, \
                                              float* __restrict__ y, unsigned int n, Strided2 s) { \
        GRID_STRIDE(i, n) { \
            unsigned int oa, ob; \
            strided_offsets(i, s, &oa, &ob); \
            float x = a[oa]; float z = b[ob]; y[i] = (expr); \
        } \
    }

// dst[strided s1] = src[strided s0] for n elements (gather when s1 is dense, scatter when s0 is).
extern "C" __global__ void copy_strided(const float* __restrict__ src, float* __restrict__ dst,
                                        unsigned int n, Strided2 s) {
    GRID_STRIDE(i, n) {
        unsigned int os, od;
        strided_offsets(i, s, &os, &od);
        dst[od] = src[os];
    }
}

// ---- block reductions ---------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block, returned to every thread. blockDim.x is a multiple of 32.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

__device__ float block_max(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : neg_inf_f();
    return warp_max(v);
}

// One block per row of `n` elements: [rows, n] -> [rows].
extern "C" __global__ void reduce_sum_rows(const float* __restrict__ x, float* __restrict__ y,
                                           unsigned int rows, unsigned int n) {
    unsigned int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = x + (size_t)r * n;
    float acc = 0.0f;
    for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) acc += row[j];
    acc = block_sum(acc);
    if (threadIdx.x == 0) y[r] = acc;
}

extern "C" __global__ void reduce_max_rows(const float* __restrict__ x, float* __restrict__ y,
                                           unsigned int rows, unsigned int n) {
    unsigned int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = x + (size_t)r * n;
    float acc = neg_inf_f();
    for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) acc = fmaxf(acc, row[j]);
    acc = block_max(acc);
    if (threadIdx.x == 0) y[r] = acc;
}

// One thread per output of [outer, n, inner] -> [outer, inner]; reads coalesce along `inner`.
extern "C" __global__ void reduce_sum_cols(const float* __restrict__ x, float* __restrict__ y,
                                           unsigned int outer, unsigned int n, unsigned int inner) {
    GRID_STRIDE(idx, outer * inner) {
        unsigned int o = idx / inner, i = idx % inner;
        const float* p = x + (size_t)o * n * inner + i;
        float acc = 0.0f;
        for (unsigned int k = 0; k < n; ++k) acc += p[(size_t)k * inner];
        y[idx] = acc;
    }
}

extern "C" __global__ void reduce_max_cols(const float* __restrict__ x, float* __restrict__ y,
                                           unsigned int outer, unsigned int n, unsigned int inner) {
    GRID_STRIDE(idx, outer * inner) {
        unsigned int o = idx / inner, i = idx % inner;
        const float* p = x + (size_t)o * n * inner + i;
        float acc = neg_inf_f();
        for (unsigned int k = 0; k < n; ++k) acc = fmaxf(acc, p[(size_t)k * inner]);
        y[idx] = acc;
    }
}

extern "C" __global__ void argmax_cols(const float* __restrict__ x, float* __restrict__ y,
                                       unsigned int outer, unsigned int n, unsigned int inner) {
    GRID_STRIDE(idx, outer * inner) {
        unsigned int o = idx / inner, i = idx % inner;
        const float* p = x + (size_t)o * n * inner + i;
        unsigned int best = 0;
        float best_value = neg_inf_f();
        for (unsigned int k = 0; k < n; ++k) {
            float v = p[(size_t)k * inner];
            if (v > best_value || (k == 0 && v != v)) { best = k; best_value = v; }
        }
        y[idx] = (float)best;
    }
}

// ---- softmax and cross-entropy (one block per row) ----------------------------------------

extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y,
                                        unsigned int rows, unsigned int n, int log_mode) {
    unsigned int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = x + (size_t)r * n;
    float* out = y + (size_t)r * n;
    float m = neg_inf_f();
    for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m);
    float s = 0.0f;
    for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) s += expf(row[j] - m);
    s = block_sum(s);
    if (log_mode) {
        float lse = m + logf(s);
        for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) out[j] = row[j] - lse;
    } else {
        float inv = 1.0f / s;
        for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) out[j] = expf(row[j] - m) * inv;
    }
}

// Class index of a label value, or -1 when it is not an integer in [0, classes).
__device__ __forceinline__ int label_index(float label, unsigned int classes) {
    if (!(label >= 0.0f) || label != floorf(label) || label >= (float)classes) return -1;
    return (int)label;
}

// loss[r] = logsumexp(x_r) - x_r[label_r]; 0 for an ignored label (has_ignore and label ==
// ignore); NaN for an invalid label.
extern "C" __global__ void ce_fwd(const float* __restrict__ x, const float* __restrict__ labels,
                                  float* __restrict__ loss, unsigned int rows, unsigned int classes,
                                  int has_ignore, float ignore) {
    unsigned int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = x + (size_t)r * classes;
    float m = neg_inf_f();
    for (unsigned int j = threadIdx.x; j < classes; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m);
    float s = 0.0f;
    for (unsigned int j = threadIdx.x; j < classes; j += blockDim.x) s += expf(row[j] - m);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        float label = labels[r];
        int k = label_index(label, classes);
        loss[r] = (has_ignore && label == ignore) ? 0.0f : (k < 0 ? nan_f() : m + logf(s) - row[k]);
    }
}

// dx = (softmax(x_r) - onehot(label_r)) * g[0] * inv_rows; 0 for an ignored label.
extern "C" __global__ void ce_bwd(const float* __restrict__ x, const float* __restrict__ labels,
                                  const float* __restrict__ g, float* __restrict__ dx,
                                  unsigned int rows, unsigned int classes, float inv_rows,
                                  int has_ignore, float ignore) {
    unsigned int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = x + (size_t)r * classes;
    float* out = dx + (size_t)r * classes;
    float m = neg_inf_f();
    for (unsigned int j = threadIdx.x; j < classes; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m);
    float s = 0.0f;
    for (unsigned int j = threadIdx.x; j < classes; j += blockDim.x) s += expf(row[j] - m);
    s = block_sum(s);
    float label = labels[r];
    int k = label_index(label, classes);
    int ignored = has_ignore && label == ignore;
    float scale = g[0] * inv_rows;
    float inv = 1.0f / s;
    for (unsigned int j = threadIdx.x; j < classes; j += blockDim.x) {
        float p = expf(row[j] - m) * inv - ((int)j == k ? 1.0f : 0.0f);
        out[j] = ignored ? 0.0f : (k < 0 ? nan_f() : p * scale);
    }
}

// ---- fused optimizer updates --------------------------------------------------------------

extern "C" __global__ void sgd_step(float* __restrict__ p, const float* __restrict__ g, float* buf,
                                    unsigned int n, float lr, float momentum, float wd, int nesterov) {
    GRID_STRIDE(i, n) {
        float d = g[i] + wd * p[i];
        if (momentum != 0.0f) {
            float b = momentum * buf[i] + d;
            buf[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        p[i] -= lr * d;
    }
}

extern "C" __global__ void adam_step(float* __restrict__ p, const float* __restrict__ g,
                                     float* __restrict__ m, float* __restrict__ v, unsigned int n,
                                     float lr, float beta1, float beta2, float eps, float wd,
                                     int decoupled, float bias1, float bias2) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float pi = p[i];
        if (decoupled) {
            pi -= lr * wd * pi;
        } else {
            gi += wd * pi;
        }
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - lr * (mi / bias1) / (sqrtf(vi / bias2) + eps);
    }
}

// ---- lookups by index ([outer, n, inner] around the indexed axis) -----------------------------
// Indices are f32, checked on the host before launch; an invalid one is still refused here (NaN
// read, nothing written). `total` threads run over the index-driven side, [outer, k, inner].

// y[o, j, i] = x[o, idx[j], i].
extern "C" __global__ void index_select(const float* __restrict__ x, const float* __restrict__ idx,
                                        float* __restrict__ y, unsigned int total, unsigned int n,
                                        unsigned int k, unsigned int inner) {
    GRID_STRIDE(t, total) {
        unsigned int i = t % inner, j = (t / inner) % k, o = t / (inner * k);
        int r = label_index(idx[j], n);
        y[t] = r < 0 ? nan_f() : x[((size_t)o * n + r) * inner + i];
    }
}

// y[o, idx[j], i] += g[o, j, i]; y is zeroed first. Float atomics: the order of the additions
// (and so the last bits of a sum of duplicates) can differ between runs.
extern "C" __global__ void index_add(const float* __restrict__ g, const float* __restrict__ idx,
                                     float* __restrict__ y, unsigned int total, unsigned int n,
                                     unsigned int k, unsigned int inner) {
    GRID_STRIDE(t, total) {
        unsigned int i = t % inner, j = (t / inner) % k, o = t / (inner * k);
        int r = label_index(idx[j], n);
        if (r >= 0) atomicAdd(&y[((size_t)o * n + r) * inner + i], g[t]);
    }
}

// y[o, j, i] = x[o, idx[o, j, i], i].
extern "C" __global__ void gather_axis(const float* __restrict__ x, const float* __restrict__ idx,
                                       float* __restrict__ y, unsigned int total, unsigned int n,
                                       unsigned int k, unsigned int inner) {
    GRID_STRIDE(t, total) {
        unsigned int i = t % inner, o = t / (inner * k);
        int r = label_index(idx[t], n);
        y[t] = r < 0 ? nan_f() : x[((size_t)o * n + r) * inner + i];
    }
}

// y[o, idx[o, j, i], i] += g[o, j, i]; y is zeroed first.
extern "C" __global__ void scatter_add(const float* __restrict__ g, const float* __restrict__ idx,
                                       float* __restrict__ y, unsigned int total, unsigned int n,
                                       unsigned int k, unsigned int inner) {
    GRID_STRIDE(t, total) {
        unsigned int i = t % inner, o = t / (inner * k);
        int r = label_index(idx[t], n);
        if (r >= 0) atomicAdd(&y[((size_t)o * n + r) * inner + i], g[t]);
    }
}

// ---- dropout ---------------------------------------------------------------------------------
// The mask of ops::DropoutMask (ops/mod.rs), bit for bit: element e of row r is kept when the
// top 24 bits of the hash of (seed, step, site, offset + r, e), as a fraction, are >= p.

__device__ __forceinline__ unsigned long long splitmix_finalize(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void dropout(const float* __restrict__ x, float* __restrict__ y, unsigned int n,
                                   unsigned int per, unsigned long long seed, unsigned long long step,
                                   unsigned long long site, unsigned long long offset, float p,
                                   float scale) {
    const unsigned long long G = 0x9E3779B97F4A7C15ull;
    GRID_STRIDE(t, n) {
        unsigned long long r = t / per, e = t % per;
        unsigned long long k = splitmix_finalize(seed + G);
        k = splitmix_finalize(k ^ (step + G));
        k = splitmix_finalize(k ^ (site + G));
        k = splitmix_finalize(k ^ (offset + r + G));
        unsigned long long bits = splitmix_finalize(k + (e + 1ull) * G);
        float u = (float)(bits >> 40) * (1.0f / 16777216.0f);
        y[t] = u >= p ? x[t] * scale : 0.0f;
    }
}
