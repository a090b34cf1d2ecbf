/*
 * qsm stand plugin ABI, version 1.
 *
 * A block algorithm measured by `qsm stand` without its source: build it as a shared library
 * exporting the functions below and name it in a plan as `plugin:PATH/libNAME.so`. The entry
 * points follow the STAND paper's (input, input size, output, output size, NUMA node,
 * allocator, error buffer; bytes written or -1).
 *
 * Contract, which qsm stand relies on for memory safety:
 * - `encode` and `decode` read at most `in_size` bytes from `in`, write at most `out_size`
 *   bytes to `out`, and return the number written, or -1 after writing a NUL-terminated
 *   message of at most QSM_STAND_ERROR_LEN bytes (NUL included) to `error`.
 * - Memory from `alloc` is valid until the call returns; never free it. `alloc` returns NULL
 *   when the pool (16 MiB per call) is exhausted. The pool lives on NUMA node `node`.
 * - Calls come from one thread at a time; keep no state between calls that a test of one
 *   block could not reproduce.
 * - `decode(encode(x)) == x` for every x: qsm stand verifies every output, and a plugin that
 *   gets it wrong gets no time.
 */
#ifndef QSM_STAND_PLUGIN_H
#define QSM_STAND_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#define QSM_STAND_ABI 1
#define QSM_STAND_ERROR_LEN 256

typedef void *(*qsm_stand_allocator)(size_t size, unsigned int node);

/* Required: returns QSM_STAND_ABI. */
uint32_t qsm_stand_abi(void);
/* Optional: "compressor" (the default: measured by compress and decompress) or "cipher"
 * (measured by encrypt and decrypt). */
const char *qsm_stand_kind(void);
/* Required: the largest output `encode` can write for an input of `in_size` bytes. */
size_t qsm_stand_bound(size_t in_size);
/* Required: compress or encrypt one block. */
long qsm_stand_encode(const unsigned char *in, size_t in_size, unsigned char *out,
                      size_t out_size, unsigned int node, qsm_stand_allocator alloc,
                      char *error);
/* Required: the inverse of encode. */
long qsm_stand_decode(const unsigned char *in, size_t in_size, unsigned char *out,
                      size_t out_size, unsigned int node, qsm_stand_allocator alloc,
                      char *error);

#endif
