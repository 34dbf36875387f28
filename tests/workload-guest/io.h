/*
 * io.h - x86 port I/O, time stamp counter and CPU stop helpers.
 */
#ifndef WG_IO_H
#define WG_IO_H

#include <stdint.h>

static inline void outb(uint16_t port, uint8_t val)
{
	asm volatile("outb %0, %1" : : "a"(val), "Nd"(port));
}

static inline uint8_t inb(uint16_t port)
{
	uint8_t val;

	asm volatile("inb %1, %0" : "=a"(val) : "Nd"(port));
	return val;
}

static inline uint64_t rdtsc(void)
{
	uint32_t lo, hi;

	asm volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
}

/* Stop for good: with IF=0 only an NMI could wake us, and then we loop. */
static inline __attribute__((noreturn)) void cpu_halt_forever(void)
{
	for (;;)
		asm volatile("cli; hlt");
}

#endif /* WG_IO_H */
