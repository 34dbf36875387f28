/*
 * multiboot.h - the parts of the multiboot v1 boot information we read.
 */
#ifndef WG_MULTIBOOT_H
#define WG_MULTIBOOT_H

#include <stdint.h>

#define MB_BOOT_MAGIC		0x2badb002u

#define MB_INFO_MEM		(1u << 0)	/* mem_lower/mem_upper valid */
#define MB_INFO_CMDLINE		(1u << 2)
#define MB_INFO_MMAP		(1u << 6)

#define MB_MMAP_RAM		1

struct mb_info {
	uint32_t flags;
	uint32_t mem_lower;	/* KiB below 1 MiB */
	uint32_t mem_upper;	/* KiB above 1 MiB, up to the first hole */
	uint32_t boot_device;
	uint32_t cmdline;
	uint32_t mods_count;
	uint32_t mods_addr;
	uint32_t syms[4];
	uint32_t mmap_length;
	uint32_t mmap_addr;
} __attribute__((packed));

/* `size` counts the bytes after itself, so entries may grow. */
struct mb_mmap_entry {
	uint32_t size;
	uint64_t addr;
	uint64_t len;
	uint32_t type;
} __attribute__((packed));

#endif /* WG_MULTIBOOT_H */
