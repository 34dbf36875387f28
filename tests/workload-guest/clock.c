/*
 * clock.c - TSC calibration against PIT channel 2.
 *
 * Channel 2 is the one whose output we can read back (port 0x61 bit 5)
 * without interrupts. We load it in mode 0 (one shot) and count TSC ticks
 * until its output goes high. Under TCG both the guest TSC and the PIT
 * follow the host clock, so the result is a wall-clock rate even when the
 * guest runs nested and slowly.
 */
#include "clock.h"
#include "io.h"
#include "lib.h"

#define PIT_HZ		1193182u
#define PIT_CH2		0x42
#define PIT_CMD		0x43
#define PORT_B		0x61
#define PORT_B_GATE2	0x01	/* gate of channel 2 */
#define PORT_B_SPKR	0x02	/* speaker data enable */
#define PORT_B_OUT2	0x20	/* output of channel 2 (read only) */

/* 50 ms: long enough to hide the cost of the port reads when nested. */
#define CAL_MS		50u
#define CAL_COUNT	(PIT_HZ * CAL_MS / 1000u)
/* Give up if the output never rises (no PIT): ~forever even nested. */
#define CAL_MAX_POLLS	50000000u

static uint32_t tsc_per_ms;

int clock_init(void)
{
	uint64_t t0, t1;
	uint32_t polls = 0, rem;
	uint8_t b;

	/* Gate high (count), speaker off (silence). */
	b = inb(PORT_B);
	outb(PORT_B, (uint8_t)((b & ~PORT_B_SPKR) | PORT_B_GATE2));

	/* Channel 2, lobyte/hibyte access, mode 0, binary. */
	outb(PIT_CMD, 0xb0);
	outb(PIT_CH2, CAL_COUNT & 0xff);
	outb(PIT_CH2, (CAL_COUNT >> 8) & 0xff);
	/* Counting starts once the high byte is written. */
	t0 = rdtsc();
	while (!(inb(PORT_B) & PORT_B_OUT2))
		if (++polls == CAL_MAX_POLLS)
			return -1;
	t1 = rdtsc();

	tsc_per_ms = (uint32_t)div_u64_rem(t1 - t0, CAL_MS, &rem);
	return tsc_per_ms ? 0 : -1;
}

uint32_t clock_tsc_khz(void)
{
	return tsc_per_ms;
}

uint32_t clock_ms_since(uint64_t tsc0)
{
	uint32_t rem;

	return (uint32_t)div_u64_rem(rdtsc() - tsc0, tsc_per_ms, &rem);
}
