/* The check both decode attention kernels make of a paged cache's tables
 * before reading through them. */
#ifndef SLUICE_PAGED_TABLES_H
#define SLUICE_PAGED_TABLES_H

#include <stdint.h>

/* 0 when every sequence's length is within its table and every block id it
 * reads names a block of the cache; -1 otherwise. */
static inline int check_tables(const int64_t *block_ids, const int64_t *seq_lens, int64_t num_seqs,
                        int64_t blocks_per_seq, int64_t num_blocks, int64_t block_size) {
    for (int64_t b = 0; b < num_seqs; b++) {
        const int64_t len = seq_lens[b];
        if (len < 1 || len > blocks_per_seq * block_size) return -1;
        for (int64_t i = 0; i < (len + block_size - 1) / block_size; i++) {
            const int64_t block = block_ids[b * blocks_per_seq + i];
            if (block < 0 || block >= num_blocks) return -1;
        }
    }
    return 0;
}

#endif
