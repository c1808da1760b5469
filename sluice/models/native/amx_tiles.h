/* What every AMX kernel here needs before its first tile instruction: the
 * kernel's permission to use the tile registers, and each thread's tile
 * configuration (8 tiles of 16 rows x 64 bytes). Include it only where the
 * compiler targets AMX (the including file's guard). */
#ifndef SLUICE_AMX_TILES_H
#define SLUICE_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Linux hands out the tile registers' state only on request, once per
 * process (every thread then has it). `state`: the including file's own,
 * 0: not asked yet, 1: granted, -1: refused. Returns whether granted. */
static inline int amx_tiles_granted(int *state) {
    int granted = __atomic_load_n(state, __ATOMIC_ACQUIRE);
    if (granted == 0) {
        granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(state, granted, __ATOMIC_RELEASE);
    }
    return granted == 1;
}

struct amx_tile_config {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64)));

/* Every thread loads the configuration before its first tile instruction. */
static inline void amx_configure_tiles(void) {
    struct amx_tile_config config;
    memset(&config, 0, sizeof config);
    config.palette_id = 1;
    for (int tile = 0; tile < 8; tile++) {
        config.rows[tile] = 16;
        config.colsb[tile] = 64;
    }
    _tile_loadconfig(&config);
}

#endif
