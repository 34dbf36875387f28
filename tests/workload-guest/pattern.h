/*
 * pattern.h - the verifiable fill of guest RAM.
 *
 * The fill area is an array of 64-byte lines. Line l (l = gpa >> 6, counted
 * from address 0, not from the area start) with version v holds the sixteen
 * 32-bit words
 *
 *	word[j] = base(l, v) + j,	base(l, v) = (l + (v << 24)) * K + S
 *
 * K is an odd constant, S is derived from the seed and v is the line's
 * 8-bit version kept in a table outside the fill area.
 */
#ifndef WG_PATTERN_H
#define WG_PATTERN_H

#include <stdbool.h>
#include <stdint.h>

struct pat_stats {
	uint64_t corrupted;		/* corrupt words found (and repaired) */
	uint64_t verified_bytes;	/* bytes compared, all paths */
};

extern struct pat_stats pat_stats;

/* Bytes of version table needed for a fill area of fill_bytes. */
uint32_t pat_table_bytes(uint32_t fill_bytes);

void pat_init(uint32_t fill_start, uint32_t fill_end, uint8_t *versions,
	      uint32_t seed, uint32_t max_reports);
void pat_fill(void);
void pat_check_page(uint32_t page);
void pat_touch_batch(const uint32_t *pages, uint32_t n, uint32_t *rng,
		     uint32_t write_pct);
uint32_t pat_inject(uint32_t word, uint32_t bit);

#endif /* WG_PATTERN_H */
