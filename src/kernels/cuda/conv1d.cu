// Causal depthwise conv1d (+ SiLU where `silu`) over a packed varlen batch, with the last
// `k - 1` inputs of every request carried in its recurrent-state slot (with SiLU: Gated
// DeltaNet q|k|v, Mamba-2 x|B|C; without: LFM2's gated input B*x).
//
// Layout (all f32, row-major):
//   x      [T, x_stride]       conv input; channels 0..ch of each row (a column range of the
//                              fused in_proj output: the caller passes the offset pointer)
//   w      [ch, k]             depthwise weight (HF conv1d.weight [ch, 1, k])
//   bias   [ch] or NULL
//   state  [slots, k - 1, ch]  per slot: the last k - 1 inputs before the chunk, oldest first
//   out    [T, ch]
// Per token t: seq s = tok_seq[t]; the chunk of s occupies rows seq_start[s] .. + seq_len[s]
// and uses slot seq_slot[s]. A chunk starting at position 0 must have its slot zeroed first
// (zero_state_slots below), exactly like the CPU backend.
//
// Arithmetic per output (same order as kernels::cpu::recurrent::causal_conv):
//   acc = sum_{j=0..k-1} w[c,j] * in[p - (k-1) + j]   (from 0, j ascending), acc += bias[c],
//   out = silu ? acc / (1 + exp(-acc)) : acc.
// Each token's result is independent of the batch and of the chunking: the inputs before the
// chunk come from the state, in the same order.
//
// conv1d_f32 reads the state and must run (same stream) before conv1d_state_update_f32
// advances it. Launch: grid (T, ceil(ch / 256)), block (256); the others: grid-stride.

extern "C" __global__ void conv1d_f32(
    const float* __restrict__ x, int x_stride,
    const float* __restrict__ w,
    const float* __restrict__ bias,
    const float* __restrict__ state,
    const int* __restrict__ tok_seq,
    const int* __restrict__ seq_start,
    const int* __restrict__ seq_slot,
    float* __restrict__ out,
    int num_tokens, int ch, int k, int silu)
{
    const int hist = k - 1;
    const int t = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (t < num_tokens && c < ch) {
        const int s = tok_seq[t];
        const int r0 = seq_start[s];
        const int local = t - r0;
        const float* st = state + (size_t)seq_slot[s] * hist * ch;
        float acc = 0.0f;
        for (int j = 0; j < k; ++j) {
            // input position local - (k-1) + j, relative to the chunk start
            const int p = local + j;
            const float v = p >= hist ? x[(size_t)(r0 + p - hist) * x_stride + c]
                                      : st[(size_t)p * ch + c];
            acc = __fadd_rn(acc, __fmul_rn(w[(size_t)c * k + j], v));
        }
        if (bias != nullptr) {
            acc = __fadd_rn(acc, bias[c]);
        }
        out[(size_t)t * ch + c] = silu ? acc / (1.0f + expf(-acc)) : acc;
    }
}

// Advances each chunk's slot window to its last k - 1 inputs: one thread per (chunk,
// channel), positions in ascending order, so the in-place shift (when the chunk is shorter
// than k - 1) reads state entries before they are overwritten.
extern "C" __global__ void conv1d_state_update_f32(
    const float* __restrict__ x, int x_stride,
    float* __restrict__ state,
    const int* __restrict__ seq_start,
    const int* __restrict__ seq_len,
    const int* __restrict__ seq_slot,
    int num_seqs, int ch, int k)
{
    const long long total = (long long)num_seqs * ch;
    const int hist = k - 1;
    HSX_GRID_STRIDE(idx, total) {
        const int s = (int)(idx / ch);
        const int c = (int)(idx - (long long)s * ch);
        const int len = seq_len[s];
        const int r0 = seq_start[s];
        float* st = state + (size_t)seq_slot[s] * hist * ch;
        for (int p = 0; p < hist; ++p) {
            // position len + p of [old window | chunk]; >= hist means inside the chunk
            const int q = len + p;
            const float v = q >= hist ? x[(size_t)(r0 + q - hist) * x_stride + c]
                                      : st[(size_t)q * ch + c];
            st[(size_t)p * ch + c] = v;
        }
    }
}

// Zeroes the state of the listed slots in every recurrent layer:
//   buf [layers, slots, per_slot]; slots_list [n]. One launch per state kind (conv / SSM).
extern "C" __global__ void zero_state_slots_f32(
    float* __restrict__ buf,
    const int* __restrict__ slots_list,
    int n, int layers, int slots, long long per_slot)
{
    const long long total = (long long)layers * n * per_slot;
    HSX_GRID_STRIDE(idx, total) {
        const long long e = idx % per_slot;
        const long long li = idx / per_slot;
        const int i = (int)(li % n);
        const int l = (int)(li / n);
        buf[((size_t)l * slots + slots_list[i]) * per_slot + e] = 0.0f;
    }
}

// Prefix reuse: copies `n` slots of `per_slot` floats within one layer's `[slots, per_slot]`
// state, `pairs` = (from, to) interleaved. The host checks that no slot is both read and
// written, so the copies are independent.
extern "C" __global__ void copy_state_slots_f32(
    float* buf, const int* __restrict__ pairs, int n, long long per_slot)
{
    const long long total = (long long)n * per_slot;
    HSX_GRID_STRIDE(idx, total) {
        const long long e = idx % per_slot;
        const int i = (int)(idx / per_slot);
        buf[(size_t)pairs[2 * i + 1] * per_slot + e] = buf[(size_t)pairs[2 * i] * per_slot + e];
    }
}
