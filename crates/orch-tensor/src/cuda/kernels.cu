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

// ---- layer ops (storage/nn.rs, cuda/layers.rs) ------------------------------------------------
// The CUDA paths of conv2d, pooling, layer / batch norm and attention; the maths is the CPU
// kernels' (cpu/conv.rs, pool.rs, norm.rs, attention.rs). Products go to cuBLAS (cuda/blas.rs).

// Mirrors `ConvGeom` in cuda/layers.rs: one sample's geometry.
struct ConvGeom {
    unsigned int c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw;
};

// One sample `x` [C, H, W] into its column matrix `col` [C*kh*kw, OH*OW] (zero padding).
extern "C" __global__ void im2col(const float* __restrict__ x, float* __restrict__ col, ConvGeom g) {
    unsigned int l = g.oh * g.ow;
    GRID_STRIDE(t, g.c * g.kh * g.kw * l) {
        unsigned int row = t / l, p = t % l;
        unsigned int j = row % g.kw, i = (row / g.kw) % g.kh, c = row / (g.kw * g.kh);
        int ih = (int)((p / g.ow) * g.sh + i * g.dh) - (int)g.ph;
        int iw = (int)((p % g.ow) * g.sw + j * g.dw) - (int)g.pw;
        bool inside = ih >= 0 && iw >= 0 && ih < (int)g.h && iw < (int)g.w;
        col[t] = inside ? x[((size_t)c * g.h + ih) * g.w + iw] : 0.0f;
    }
}

// The input gradient of one sample [C, H, W] from its column gradient `col` [C*kh*kw, OH*OW]:
// each input element gathers the column entries it fed (no atomics; overwrites `dx`).
extern "C" __global__ void col2im(const float* __restrict__ col, float* __restrict__ dx, ConvGeom g) {
    unsigned int l = g.oh * g.ow;
    GRID_STRIDE(t, g.c * g.h * g.w) {
        unsigned int iw = t % g.w, ih = (t / g.w) % g.h, c = t / (g.w * g.h);
        float acc = 0.0f;
        for (unsigned int i = 0; i < g.kh; ++i) {
            int th = (int)(ih + g.ph) - (int)(i * g.dh);
            if (th < 0 || th % (int)g.sh != 0) continue;
            unsigned int oh = (unsigned int)th / g.sh;
            if (oh >= g.oh) continue;
            for (unsigned int j = 0; j < g.kw; ++j) {
                int tw = (int)(iw + g.pw) - (int)(j * g.dw);
                if (tw < 0 || tw % (int)g.sw != 0) continue;
                unsigned int ow = (unsigned int)tw / g.sw;
                if (ow >= g.ow) continue;
                unsigned int row = (c * g.kh + i) * g.kw + j;
                acc += col[(size_t)row * l + oh * g.ow + ow];
            }
        }
        dx[t] = acc;
    }
}

// y [N, O, L] += bias[o].
extern "C" __global__ void conv_bias_add(float* __restrict__ y, const float* __restrict__ bias,
                                         unsigned int n, unsigned int o, unsigned int l) {
    GRID_STRIDE(t, n) { y[t] += bias[(t / l) % o]; }
}

// One block per output channel: db[o] = sum over samples and positions of dy [N, O, L].
extern "C" __global__ void conv_bias_grad(const float* __restrict__ dy, float* __restrict__ db,
                                          unsigned int n, unsigned int o, unsigned int l) {
    unsigned int ch = blockIdx.x;
    if (ch >= o) return;
    float acc = 0.0f;
    for (unsigned int j = threadIdx.x; j < n * l; j += blockDim.x)
        acc += dy[((size_t)(j / l) * o + ch) * l + j % l];
    acc = block_sum(acc);
    if (threadIdx.x == 0) db[ch] = acc;
}

// Mirrors `PoolGeom` in cuda/layers.rs: planes (N*C) of [H, W] pooled to [OH, OW].
struct PoolGeom {
    unsigned int planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};

// The window of output (oh, ow) clipped to the input: rows [*r0, *r1), cols [*c0, *c1).
__device__ __forceinline__ void pool_window(const PoolGeom& g, unsigned int oh, unsigned int ow,
                                            unsigned int* r0, unsigned int* r1, unsigned int* c0,
                                            unsigned int* c1) {
    unsigned int sr = oh * g.sh, sc = ow * g.sw;
    *r0 = sr > g.ph ? sr - g.ph : 0;
    *r1 = sr + g.kh > g.ph ? min(sr + g.kh - g.ph, g.h) : 0;
    *c0 = sc > g.pw ? sc - g.pw : 0;
    *c1 = sc + g.kw > g.pw ? min(sc + g.kw - g.pw, g.w) : 0;
}

// One thread per output: the first maximum of the window (NaN wins), its offset in the plane
// (ih * W + iw) stored as u32 bits in `idx`.
extern "C" __global__ void max_pool_fwd(const float* __restrict__ x, float* __restrict__ y,
                                        float* __restrict__ idx, PoolGeom g) {
    unsigned int op = g.oh * g.ow;
    GRID_STRIDE(t, g.planes * op) {
        unsigned int p = t / op, oh = (t % op) / g.ow, ow = t % g.ow;
        unsigned int r0, r1, c0, c1;
        pool_window(g, oh, ow, &r0, &r1, &c0, &c1);
        const float* plane = x + (size_t)p * g.h * g.w;
        float best = neg_inf_f();
        unsigned int at = r0 * g.w + c0;
        for (unsigned int ih = r0; ih < r1; ++ih)
            for (unsigned int iw = c0; iw < c1; ++iw) {
                float v = plane[ih * g.w + iw];
                if (v > best || v != v) { best = v; at = ih * g.w + iw; }
            }
        y[t] = best;
        idx[t] = __uint_as_float(at);
    }
}

// The output positions whose windows may hold input row (col) `i`: [*lo, *hi).
__device__ __forceinline__ void pool_reach(unsigned int i, unsigned int pad, unsigned int k,
                                           unsigned int s, unsigned int out, unsigned int* lo,
                                           unsigned int* hi) {
    unsigned int top = i + pad;  // the window starting at o*s covers top when o*s <= top < o*s+k
    *lo = top + 1 > k ? (top + 1 - k + s - 1) / s : 0;
    *hi = min(top / s + 1, out);
}

// One thread per input: the sum of the gradients of the windows whose argmax it is, in output
// order (the CPU's order of additions). An index outside the plane matches no input.
extern "C" __global__ void max_pool_bwd(const float* __restrict__ dy, const float* __restrict__ idx,
                                        float* __restrict__ dx, PoolGeom g) {
    unsigned int plane = g.h * g.w, op = g.oh * g.ow;
    GRID_STRIDE(t, g.planes * plane) {
        unsigned int p = t / plane, at = t % plane, ih = at / g.w, iw = at % g.w;
        unsigned int oh0, oh1, ow0, ow1;
        pool_reach(ih, g.ph, g.kh, g.sh, g.oh, &oh0, &oh1);
        pool_reach(iw, g.pw, g.kw, g.sw, g.ow, &ow0, &ow1);
        float acc = 0.0f;
        for (unsigned int oh = oh0; oh < oh1; ++oh)
            for (unsigned int ow = ow0; ow < ow1; ++ow) {
                size_t o = (size_t)p * op + oh * g.ow + ow;
                if (__float_as_uint(idx[o]) == at) acc += dy[o];
            }
        dx[t] = acc;
    }
}

// One thread per output: the window's sum over kh * kw (padding counted).
extern "C" __global__ void avg_pool_fwd(const float* __restrict__ x, float* __restrict__ y, PoolGeom g) {
    unsigned int op = g.oh * g.ow;
    float scale = 1.0f / (float)(g.kh * g.kw);
    GRID_STRIDE(t, g.planes * op) {
        unsigned int p = t / op, oh = (t % op) / g.ow, ow = t % g.ow;
        unsigned int r0, r1, c0, c1;
        pool_window(g, oh, ow, &r0, &r1, &c0, &c1);
        const float* plane = x + (size_t)p * g.h * g.w;
        float total = 0.0f;
        for (unsigned int ih = r0; ih < r1; ++ih) {
            float row = 0.0f;
            for (unsigned int iw = c0; iw < c1; ++iw) row += plane[ih * g.w + iw];
            total += row;
        }
        y[t] = total * scale;
    }
}

// One thread per input: the scaled gradients of every window covering it.
extern "C" __global__ void avg_pool_bwd(const float* __restrict__ dy, float* __restrict__ dx, PoolGeom g) {
    unsigned int plane = g.h * g.w, op = g.oh * g.ow;
    float scale = 1.0f / (float)(g.kh * g.kw);
    GRID_STRIDE(t, g.planes * plane) {
        unsigned int p = t / plane, ih = (t % plane) / g.w, iw = t % g.w;
        unsigned int oh0, oh1, ow0, ow1;
        pool_reach(ih, g.ph, g.kh, g.sh, g.oh, &oh0, &oh1);
        pool_reach(iw, g.pw, g.kw, g.sw, g.ow, &ow0, &ow1);
        float acc = 0.0f;
        for (unsigned int oh = oh0; oh < oh1; ++oh)
            for (unsigned int ow = ow0; ow < ow1; ++ow) acc += dy[(size_t)p * op + oh * g.ow + ow] * scale;
        dx[t] = acc;
    }
}

// One block per row of `n`: y = (x - mean) * rstd * w + b (w, b when has_w, has_b), the row's
// mean and rstd saved. Biased variance, two passes.
extern "C" __global__ void layer_norm_fwd(const float* __restrict__ x, const float* __restrict__ w,
                                          const float* __restrict__ b, float* __restrict__ y,
                                          float* __restrict__ mean, float* __restrict__ rstd,
                                          unsigned int rows, unsigned int n, float eps, int has_w,
                                          int has_b) {
    unsigned int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = x + (size_t)r * n;
    float* out = y + (size_t)r * n;
    float count = (float)max(n, 1u);
    float s = 0.0f;
    for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) s += row[j];
    float m = block_sum(s) / count;
    float q = 0.0f;
    for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) q += (row[j] - m) * (row[j] - m);
    float rs = 1.0f / sqrtf(block_sum(q) / count + eps);
    for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) {
        float v = (row[j] - m) * rs;
        if (has_w) v *= w[j];
        if (has_b) v += b[j];
        out[j] = v;
    }
    if (threadIdx.x == 0) { mean[r] = m; rstd[r] = rs; }
}

// One block per row: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
extern "C" __global__ void layer_norm_bwd_dx(const float* __restrict__ x, const float* __restrict__ w,
                                             const float* __restrict__ mean, const float* __restrict__ rstd,
                                             const float* __restrict__ dy, float* __restrict__ dx,
                                             unsigned int rows, unsigned int n, int has_w) {
    unsigned int r = blockIdx.x;
    if (r >= rows) return;
    size_t base = (size_t)r * n;
    float m = mean[r], rs = rstd[r];
    float count = (float)max(n, 1u);
    float sg = 0.0f, sgx = 0.0f;
    for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) {
        float g = dy[base + j] * (has_w ? w[j] : 1.0f);
        sg += g;
        sgx += g * (x[base + j] - m) * rs;
    }
    float mg = block_sum(sg) / count;
    float mgx = block_sum(sgx) / count;
    for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) {
        float g = dy[base + j] * (has_w ? w[j] : 1.0f);
        float xhat = (x[base + j] - m) * rs;
        dx[base + j] = rs * (g - mg - xhat * mgx);
    }
}

// One thread per column: dw[j] = sum_r dy * xhat, db[j] = sum_r dy, in row order (written when
// want_w, want_b).
extern "C" __global__ void layer_norm_bwd_params(const float* __restrict__ x, const float* __restrict__ mean,
                                                 const float* __restrict__ rstd, const float* __restrict__ dy,
                                                 float* __restrict__ dw, float* __restrict__ db,
                                                 unsigned int rows, unsigned int n, int want_w, int want_b) {
    GRID_STRIDE(j, n) {
        float sw = 0.0f, sb = 0.0f;
        for (unsigned int r = 0; r < rows; ++r) {
            size_t at = (size_t)r * n + j;
            sw += dy[at] * (x[at] - mean[r]) * rstd[r];
            sb += dy[at];
        }
        if (want_w) dw[j] = sw;
        if (want_b) db[j] = sb;
    }
}

// Channel `ch`'s element `j` of x [N, C, S] (j over N*S).
__device__ __forceinline__ size_t bn_at(unsigned int j, unsigned int ch, unsigned int c, unsigned int s) {
    return ((size_t)(j / s) * c + ch) * s + j % s;
}

// Training statistics, one block per channel over N*S values (count > 0): the batch mean and
// rstd saved; the running mean and (unbiased) variance updated when has_running.
extern "C" __global__ void batch_norm_stats(const float* __restrict__ x, float* __restrict__ mean,
                                            float* __restrict__ rstd, float* running_mean,
                                            float* running_var, unsigned int n, unsigned int c,
                                            unsigned int s, float momentum, float eps, int has_running) {
    unsigned int ch = blockIdx.x;
    if (ch >= c) return;
    unsigned int count = n * s;
    float acc = 0.0f;
    for (unsigned int j = threadIdx.x; j < count; j += blockDim.x) acc += x[bn_at(j, ch, c, s)];
    float m = block_sum(acc) / (float)count;
    float q = 0.0f;
    for (unsigned int j = threadIdx.x; j < count; j += blockDim.x) {
        float d = x[bn_at(j, ch, c, s)] - m;
        q += d * d;
    }
    float var = block_sum(q) / (float)count;
    if (threadIdx.x == 0) {
        mean[ch] = m;
        rstd[ch] = 1.0f / sqrtf(var + eps);
        if (has_running) {
            float unbias = (float)count / (float)max(count - 1, 1u);
            running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * m;
            running_var[ch] = (1.0f - momentum) * running_var[ch] + momentum * var * unbias;
        }
    }
}

// Eval statistics: the running mean and 1 / sqrt(running var + eps), one thread per channel.
extern "C" __global__ void batch_norm_eval_stats(const float* __restrict__ running_mean,
                                                 const float* __restrict__ running_var,
                                                 float* __restrict__ mean, float* __restrict__ rstd,
                                                 unsigned int c, float eps) {
    GRID_STRIDE(ch, c) {
        mean[ch] = running_mean[ch];
        rstd[ch] = 1.0f / sqrtf(running_var[ch] + eps);
    }
}

// y = x * scale + shift per channel, scale = rstd * w, shift = b - mean * scale.
extern "C" __global__ void batch_norm_apply(const float* __restrict__ x, const float* __restrict__ w,
                                            const float* __restrict__ b, const float* __restrict__ mean,
                                            const float* __restrict__ rstd, float* __restrict__ y,
                                            unsigned int total, unsigned int c, unsigned int s,
                                            int has_w, int has_b) {
    GRID_STRIDE(t, total) {
        unsigned int ch = (t / s) % c;
        float scale = rstd[ch] * (has_w ? w[ch] : 1.0f);
        float shift = (has_b ? b[ch] : 0.0f) - mean[ch] * scale;
        y[t] = x[t] * scale + shift;
    }
}

// One block per channel: sums[ch] = sum dy, sums[c + ch] = sum dy * xhat.
extern "C" __global__ void batch_norm_bwd_sums(const float* __restrict__ x, const float* __restrict__ dy,
                                               const float* __restrict__ mean, const float* __restrict__ rstd,
                                               float* __restrict__ sums, unsigned int n, unsigned int c,
                                               unsigned int s) {
    unsigned int ch = blockIdx.x;
    if (ch >= c) return;
    float m = mean[ch], a = 0.0f, b = 0.0f;
    for (unsigned int j = threadIdx.x; j < n * s; j += blockDim.x) {
        size_t at = bn_at(j, ch, c, s);
        a += dy[at];
        b += dy[at] * (x[at] - m);
    }
    a = block_sum(a);
    b = block_sum(b);
    if (threadIdx.x == 0) { sums[ch] = a; sums[c + ch] = b * rstd[ch]; }
}

// dx = k * (dy - [sum_dy / count + xhat * sum_dyx / count] in training), k = w * rstd.
extern "C" __global__ void batch_norm_bwd_dx(const float* __restrict__ x, const float* __restrict__ w,
                                             const float* __restrict__ mean, const float* __restrict__ rstd,
                                             const float* __restrict__ sums, const float* __restrict__ dy,
                                             float* __restrict__ dx, unsigned int total, unsigned int c,
                                             unsigned int s, float count, int has_w, int train) {
    GRID_STRIDE(t, total) {
        unsigned int ch = (t / s) % c;
        float rs = rstd[ch];
        float k = rs * (has_w ? w[ch] : 1.0f);
        float g = dy[t];
        if (train) g -= sums[ch] / count + (x[t] - mean[ch]) * rs * (sums[c + ch] / count);
        dx[t] = k * g;
    }
}

// Mirrors `AttnGeom` in cuda/layers.rs. The mask (when has_mask) is read at
// b*m0 + h*m1 + t*m2 + j*m3 (0 strides broadcast); kind 0 adds it, kind 1 masks out zeros.
struct AttnGeom {
    unsigned int heads, h, t, s, causal, has_mask, kind, m0, m1, m2, m3;
};

// The masked score of key j for row r (b, h, t) of the scaled scores.
__device__ __forceinline__ float attn_masked(float v, const float* mask, const AttnGeom& g,
                                             unsigned int r, unsigned int j) {
    unsigned int t = r % g.t, head = r / g.t, b = head / g.h, h = head % g.h;
    if (g.has_mask) {
        float m = mask[(size_t)b * g.m0 + (size_t)h * g.m1 + (size_t)t * g.m2 + (size_t)j * g.m3];
        if (g.kind == 0) v += m;
        else if (m == 0.0f) v = neg_inf_f();
    }
    if (g.causal && j > t) v = neg_inf_f();
    return v;
}

// One block per score row (B*H*T rows of S): the scaled scores `p` are masked and turned into
// probabilities in place. Forward (backward = 0): softmax, the row's logsumexp written to `lse`
// (-inf and zero probabilities when the row sees no key). Backward: P = exp(s - lse) from the
// saved logsumexp.
extern "C" __global__ void attn_probs(float* __restrict__ p, const float* __restrict__ mask,
                                      float* __restrict__ lse, AttnGeom g, int backward) {
    unsigned int r = blockIdx.x;
    if (r >= g.heads * g.t) return;
    float* row = p + (size_t)r * g.s;
    for (unsigned int j = threadIdx.x; j < g.s; j += blockDim.x) row[j] = attn_masked(row[j], mask, g, r, j);
    float l;
    if (backward) {
        l = lse[r];
    } else {
        float m = neg_inf_f();
        for (unsigned int j = threadIdx.x; j < g.s; j += blockDim.x) m = fmaxf(m, row[j]);
        m = block_max(m);
        if (m == neg_inf_f()) {
            l = m;
        } else {
            float sum = 0.0f;
            for (unsigned int j = threadIdx.x; j < g.s; j += blockDim.x) sum += expf(row[j] - m);
            l = m + logf(block_sum(sum));
        }
        if (threadIdx.x == 0) lse[r] = l;
    }
    for (unsigned int j = threadIdx.x; j < g.s; j += blockDim.x)
        row[j] = l == neg_inf_f() ? 0.0f : expf(fminf(row[j] - l, 0.0f));
}

// One block per score row: dS = P * (dP - D) * scale into `dp`, D = rowsum(dO * O).
extern "C" __global__ void attn_dscores(const float* __restrict__ p, float* __restrict__ dp,
                                        const float* __restrict__ out, const float* __restrict__ dout,
                                        unsigned int rows, unsigned int s, unsigned int dv, float scale) {
    unsigned int r = blockIdx.x;
    if (r >= rows) return;
    float acc = 0.0f;
    for (unsigned int j = threadIdx.x; j < dv; j += blockDim.x)
        acc += dout[(size_t)r * dv + j] * out[(size_t)r * dv + j];
    float d = block_sum(acc);
    for (unsigned int j = threadIdx.x; j < s; j += blockDim.x) {
        size_t at = (size_t)r * s + j;
        dp[at] = p[at] * (dp[at] - d) * scale;
    }
}
