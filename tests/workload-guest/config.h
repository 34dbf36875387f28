/*
 * config.h - run parameters taken from the multiboot command line.
 */
#ifndef WG_CONFIG_H
#define WG_CONFIG_H

#include <stdint.h>

enum wg_pattern {
	WG_PATTERN_UNIFORM,
	WG_PATTERN_ZIPF,
	WG_PATTERN_SEQ,
};

/* Parameter ids; bit (1 << id) in wg_config.given says "set by the user". */
enum wg_param_id {
	P_HOT,
	P_HOT_OFFSET,
	P_PATTERN,
	P_ZIPF_S,
	P_SHIFT_AFTER,
	P_SHIFT_TO,
	P_DURATION,
	P_REPORT,
	P_SEED,
	P_WRITE_PCT,
	P_INJECT,
	P_SWEEP_EVERY,
	P_MAX_REPORTS,
	P_WARM,
	P_WARM_OFFSET,
	P_WARM_PCT,
	P_SCAN_AT,
	P_SCAN_FOR,
	P_HINTS,
	P_COUNT,
};

struct wg_config {
	uint32_t hot;		/* hot-set bytes (default: fill area / 8) */
	uint32_t hot_offset;	/* hot-set start, from the fill-area start */
	uint32_t pattern;	/* enum wg_pattern */
	uint32_t zipf_s;	/* zipf exponent in hundredths */
	uint32_t shift_after;	/* seconds until the hot set moves, 0 = never */
	uint32_t shift_to;	/* new hot_offset (default hot_offset + hot) */
	uint32_t duration;	/* seconds of run loop, 0 = forever */
	uint32_t report;	/* seconds between progress lines, 0 = none */
	uint32_t seed;
	uint32_t write_pct;	/* percent of hot touches that write */
	uint32_t inject;	/* test only: corrupt one word after the fill */
	uint32_t sweep_every;	/* hot touches per background-swept page */
	uint32_t max_reports;	/* WG corrupt lines printed at most, 0 = all */
	uint32_t warm;		/* second (uniform) hot set, bytes, 0 = none */
	uint32_t warm_offset;	/* its start, from the fill-area start */
	uint32_t warm_pct;	/* percent of touches that go to it */
	uint32_t scan_at;	/* seconds until a scan phase starts, 0 = none */
	uint32_t scan_for;	/* seconds the scan phase lasts */
	uint32_t hints;		/* enum wg_hints_mode: 0 off, 1 on, 2 evil */
	uint32_t given;		/* bitmap of enum wg_param_id */
};

#define CONFIG_GIVEN(cfg, id)	(((cfg)->given >> (id)) & 1u)

const char *config_pattern_name(uint32_t pattern);
int config_parse(struct wg_config *cfg, const char *cmdline);

#endif /* WG_CONFIG_H */
