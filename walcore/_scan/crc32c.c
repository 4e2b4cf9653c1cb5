/* CRC-32C (Castagnoli), reflected polynomial 0x82F63B78: SSE4.2's crc32 instruction where the CPU has it,
 * else slicing-by-8 tables. */
#include "scan.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
#endif

static uint32_t table[8][256];

static void make_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

static uint32_t crc_soft(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
              table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^ table[2][(w >> 40) & 0xFF] ^
              table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#ifdef HAVE_SSE42_PATH
/* Three independent streams hide the instruction's 3-cycle latency (about three times one stream's speed);
 * they are joined by shifting the first two over the lengths that follow them. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw_one(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n--)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}

/* x^(8*len) mod P applied to crc: the crc of `crc` followed by len zero bytes, for joining streams. */
static uint32_t gf2_multiply(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    for (int i = 0; i < 32; i++) {
        if (a & 0x80000000u)
            product ^= b;
        a <<= 1;
        b = b & 1 ? (b >> 1) ^ 0x82F63B78u : b >> 1;
    }
    return product;
}

enum { LANE = 4096 };
static uint32_t shift_lane; /* x^(8*LANE) mod P in reflected form */

static uint32_t xpow8n(size_t n)
{
    /* x^(8n) by squaring, reflected: 0x80000000 is x^0. */
    uint32_t result = 0x80000000u, base = 0x00800000u; /* x^8 */
    while (n) {
        if (n & 1)
            result = gf2_multiply(result, base);
        base = gf2_multiply(base, base);
        n >>= 1;
    }
    return result;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n >= 3 * LANE) {
        uint64_t c0 = crc, c1 = 0, c2 = 0;
        for (size_t i = 0; i < LANE; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + LANE + i, 8);
            memcpy(&w2, p + 2 * LANE + i, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        crc = gf2_multiply((uint32_t)c0, shift_lane) ^ (uint32_t)c1;
        crc = gf2_multiply(crc, shift_lane) ^ (uint32_t)c2;
        p += 3 * LANE;
        n -= 3 * LANE;
    }
    return crc_hw_one(crc, p, n);
}
#endif

static int use_hw;

void scan_crc32c_init(void)
{
    make_tables();
#ifdef HAVE_SSE42_PATH
    /* WALVAULT_SOFT_CRC=1 takes the table path on any CPU (the tests compare the two). */
    use_hw = __builtin_cpu_supports("sse4.2") && !(getenv("WALVAULT_SOFT_CRC") && *getenv("WALVAULT_SOFT_CRC") == '1');
    shift_lane = xpow8n(LANE);
#endif
}

uint32_t scan_crc32c(uint32_t crc, const unsigned char *p, size_t n)
{
#ifdef HAVE_SSE42_PATH
    if (use_hw)
        return crc_hw(crc, p, n);
#endif
    return crc_soft(crc, p, n);
}
