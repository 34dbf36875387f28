/*
 * lib.h - the few C library pieces a freestanding guest needs.
 *
 * There is no 32-bit libgcc, so 64-bit division must never reach the
 * compiler's "/" or "%": use div_u64_rem(), which divides by a 32-bit
 * divisor with two native divl instructions.
 */
#ifndef WG_LIB_H
#define WG_LIB_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PAGE_SHIFT	12
#define PAGE_SIZE	(1u << PAGE_SHIFT)
#define LINE_SHIFT	6
#define LINE_SIZE	(1u << LINE_SHIFT)
#define LINES_PER_PAGE	(PAGE_SIZE / LINE_SIZE)
#define SZ_1M		(1u << 20)
#define SZ_2M		(2u << 20)

#define ALIGN_UP(x, a)		(((x) + ((a) - 1)) & ~((a) - 1))
#define ALIGN_DOWN(x, a)	((x) & ~((a) - 1))

void *memset(void *dst, int c, size_t n);
void *memcpy(void *dst, const void *src, size_t n);
size_t strlen(const char *s);

/* n / d with the remainder in *rem; d must not be 0. */
static inline uint64_t div_u64_rem(uint64_t n, uint32_t d, uint32_t *rem)
{
	uint32_t hi = (uint32_t)(n >> 32), lo = (uint32_t)n;
	uint32_t qhi = hi / d, r = hi % d, qlo;

	/* r < d, so the quotient of r:lo / d fits in 32 bits: no #DE. */
	asm("divl %4" : "=a"(qlo), "=d"(r) : "a"(lo), "d"(r), "rm"(d));
	*rem = r;
	return ((uint64_t)qhi << 32) | qlo;
}

/* Scale a uniform 32-bit random number into [0, n) without dividing. */
static inline uint32_t scale_u32(uint32_t r, uint32_t n)
{
	return (uint32_t)(((uint64_t)r * n) >> 32);
}

/* xorshift32: a tiny generator is enough to spread touches around. */
static inline uint32_t rng_next(uint32_t *state)
{
	uint32_t x = *state;

	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	*state = x;
	return x;
}

/*
 * Derive a non-zero generator state from the user seed and a stream id.
 * The murmur3 finaliser makes neighbouring seeds give unrelated streams.
 */
static inline uint32_t rng_seed(uint32_t seed, uint32_t stream)
{
	uint32_t x = seed + stream * 0x9e3779b9u;

	x ^= x >> 16;
	x *= 0x85ebca6bu;
	x ^= x >> 13;
	x *= 0xc2b2ae35u;
	x ^= x >> 16;
	return x ? x : 0x6d2b79f5u;
}

/* Serial console on COM1. */
void console_init(void);
void kprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int console_getc(void);

/* isa-debug-exit values: QEMU exits with status (value << 1) | 1. */
#define WG_EXIT_CLEAN		0
#define WG_EXIT_CORRUPT		1
#define WG_EXIT_ERROR		2

void __attribute__((noreturn)) wg_exit(uint32_t code);

#endif /* WG_LIB_H */
