/*
 * A sample qsm stand plugin: PackBits run-length coding, the format of TIFF and of Apple's
 * MacPaint. Built by qsm-stand's tests to prove the plugin ABI end to end:
 *
 *     cc -shared -fPIC -O2 -o libsample.so sample.c
 *
 * With -DSAMPLE_BROKEN its decoder flips one bit, and qsm stand must refuse its times.
 */
#include <string.h>

#include "qsm_stand_plugin.h"

uint32_t qsm_stand_abi(void) { return QSM_STAND_ABI; }

const char *qsm_stand_kind(void) { return "compressor"; }

/* One header byte per 128 literals, plus one. */
size_t qsm_stand_bound(size_t in_size) { return in_size + in_size / 128 + 1; }

static long fail(char *error, const char *message) {
    strncpy(error, message, QSM_STAND_ERROR_LEN - 1);
    error[QSM_STAND_ERROR_LEN - 1] = '\0';
    return -1;
}

/* Writes the staged literals as one literal run; 0 when they do not fit. */
static int flush(unsigned char *out, size_t out_size, size_t *o, const unsigned char *lit,
                 size_t *nlit) {
    if (*nlit == 0) return 1;
    if (*o + 1 + *nlit > out_size) return 0;
    out[(*o)++] = (unsigned char)(*nlit - 1);
    memcpy(out + *o, lit, *nlit);
    *o += *nlit;
    *nlit = 0;
    return 1;
}

long qsm_stand_encode(const unsigned char *in, size_t in_size, unsigned char *out,
                      size_t out_size, unsigned int node, qsm_stand_allocator alloc,
                      char *error) {
    /* Literals are staged in memory from the pool, as a real codec would keep its tables. */
    unsigned char *lit = alloc(128, node);
    size_t o = 0, i = 0, nlit = 0;
    if (lit == NULL) return fail(error, "the allocator returned no memory");
    while (i < in_size) {
        size_t run = 1;
        while (i + run < in_size && run < 128 && in[i + run] == in[i]) run++;
        if (run >= 3) {
            if (!flush(out, out_size, &o, lit, &nlit) || o + 2 > out_size)
                return fail(error, "output buffer too small");
            out[o++] = (unsigned char)(257 - run);
            out[o++] = in[i];
            i += run;
        } else {
            if (nlit == 128 && !flush(out, out_size, &o, lit, &nlit))
                return fail(error, "output buffer too small");
            lit[nlit++] = in[i++];
        }
    }
    if (!flush(out, out_size, &o, lit, &nlit)) return fail(error, "output buffer too small");
    return (long)o;
}

long qsm_stand_decode(const unsigned char *in, size_t in_size, unsigned char *out,
                      size_t out_size, unsigned int node, qsm_stand_allocator alloc,
                      char *error) {
    size_t i = 0, o = 0;
    (void)node;
    (void)alloc;
    while (i < in_size) {
        unsigned char h = in[i++];
        if (h < 128) {
            size_t n = (size_t)h + 1;
            if (i + n > in_size || o + n > out_size) return fail(error, "corrupt literal run");
            memcpy(out + o, in + i, n);
            i += n;
            o += n;
        } else if (h > 128) {
            size_t n = 257 - (size_t)h;
            if (i >= in_size || o + n > out_size) return fail(error, "corrupt repeat run");
            memset(out + o, in[i++], n);
            o += n;
        }
    }
#ifdef SAMPLE_BROKEN
    if (o > 0) out[o / 2] ^= 1;
#endif
    return (long)o;
}
