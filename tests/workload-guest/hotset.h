/*
 * hotset.h - which page of the hot set the next touch goes to.
 */
#ifndef WG_HOTSET_H
#define WG_HOTSET_H

#include <stdint.h>

struct wg_config;

/* Bytes of tables hot_init() needs for a hot set of up to max_pages. */
uint32_t hot_table_bytes(uint32_t pattern, uint32_t max_pages);

void hot_init(const struct wg_config *cfg, uint32_t area_pages,
	      uint32_t first, uint32_t pages, void *tables);
void hot_move(uint32_t first);
uint32_t hot_first(void);
uint32_t hot_pages(void);
void hot_next_pages(uint32_t *pages, uint32_t n);

#endif /* WG_HOTSET_H */
