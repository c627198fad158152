/* Locally generated training data (see spmd/data.h). */
#include "spmd/data.h"
#include "base/error.h"
#include "base/rng.h"

spmd_status spmd_data_sequences(uint64_t seed, int64_t first, int batch, int seq, int vocab,
                                int32_t *input, int32_t *targets)
{
    if (batch <= 0 || seq <= 0 || vocab < 2 || !input || !targets)
        return base_error(SPMD_ERR_INVALID,
                          "data: sequences need batch, seq > 0, vocab >= 2 and buffers "
                          "(got batch %d, seq %d, vocab %d)", batch, seq, vocab);
    uint64_t stream = base_rng_stream("data.sequences");
    for (int b = 0; b < batch; b++) {
        uint64_t sample = (uint64_t)(first + b);
        uint64_t r = base_rng_bits(seed, stream, sample);
        int64_t start = (int64_t)(r % (uint64_t)vocab);
        /* Strides 1..8 keep the task learnable by a small model. */
        int64_t stride = 1 + (int64_t)((r >> 32) % 8);
        for (int t = 0; t < seq; t++) {
            input[(int64_t)b * seq + t] = (int32_t)((start + t * stride) % vocab);
            targets[(int64_t)b * seq + t] = (int32_t)((start + (t + 1) * stride) % vocab);
        }
    }
    return SPMD_OK;
}
