/*
 * clock.h - milliseconds from the TSC, calibrated once against the PIT.
 */
#ifndef WG_CLOCK_H
#define WG_CLOCK_H

#include <stdint.h>

int clock_init(void);
uint32_t clock_tsc_khz(void);
uint32_t clock_ms_since(uint64_t tsc0);

#endif /* WG_CLOCK_H */
