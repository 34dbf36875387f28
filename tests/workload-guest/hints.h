/*
 * hints.h - the vmtier hint protocol v1 (docs/hint-protocol.md) on COM2:
 * a well-behaved sender of the hot set's guest-physical range, and a
 * malicious one that tries every bad frame class.
 */
#ifndef WG_HINTS_H
#define WG_HINTS_H

#include <stdint.h>

enum wg_hints_mode {
	WG_HINTS_OFF,
	WG_HINTS_ON,	/* HELLO, then the hot set every second */
	WG_HINTS_EVIL,	/* garbage, oversize, version games, replays, floods */
};

void hints_init(uint32_t mode, uint32_t ram_top);
/* Once per loop turn: sends what is due at `now_ms`. */
void hints_tick(uint32_t now_ms, uint32_t hot_gpa, uint32_t hot_bytes);

#endif /* WG_HINTS_H */
