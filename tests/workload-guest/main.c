/*
 * main.c - boot, memory layout and the run loop of the workload guest.
 *
 * Physical layout (identity, no paging):
 *
 *   1 MiB      image (.text .data .bss, stack in .bss)
 *   __end      version table: one byte per 64-byte line of the fill area
 *              zipf tables (pattern=zipf only)
 *   fill_start next 2 MiB boundary
 *   ...        the fill area: every byte is part of the verified pattern
 *   fill_end   end of the RAM region that holds the image (page aligned)
 *
 * The tables are ours too, so they stay below the fill area; a fault in
 * them still shows up, as a data line that no longer matches its version.
 */
#include "clock.h"
#include "config.h"
#include "hints.h"
#include "hotset.h"
#include "io.h"
#include "lib.h"
#include "multiboot.h"
#include "pattern.h"

#define CMDLINE_MAX	1024
/* Hot touches between two looks at the clock. */
#define TOUCH_BATCH	64u
#define FOUR_GIB	0x100000000ull

extern char __end[];

static char cmdline[CMDLINE_MAX];

struct ram_info {
	uint32_t bytes;		/* usable RAM below 4 GiB, all regions */
	uint32_t top;		/* end of the region that holds the image */
};

struct run_state {
	uint64_t tsc0;		/* start of the run loop */
	uint64_t touches;
	uint32_t sweeps;
	uint32_t sweep_page;
	uint32_t area_pages;
	uint32_t fill_start;
	uint32_t touch_rng;
	uint32_t write_pct;
	uint32_t warm_first;	/* second hot set: first page, pages */
	uint32_t warm_pages;
	uint32_t warm_pct;
	uint32_t warm_rng;
	uint32_t scanned;	/* pages swept by the scan phase */
};

static void __attribute__((noreturn)) fail(const char *msg)
{
	kprintf("WG error %s\n", msg);
	wg_exit(WG_EXIT_ERROR);
}

/* Copy the command line before anything can overwrite the boot info. */
static void read_cmdline(const struct mb_info *mbi)
{
	const char *src;
	uint32_t i;

	if (!(mbi->flags & MB_INFO_CMDLINE))
		return;
	src = (const char *)(uintptr_t)mbi->cmdline;
	for (i = 0; i < CMDLINE_MAX - 1 && src[i]; i++)
		cmdline[i] = src[i];
	cmdline[i] = '\0';
	if (src[i])
		fail("command line too long");
}

/* Find usable RAM from the memory map, else from mem_upper. */
static void read_ram(const struct mb_info *mbi, struct ram_info *ram)
{
	uint32_t off;

	ram->bytes = 0;
	ram->top = 0;
	if (!(mbi->flags & MB_INFO_MMAP)) {
		if (!(mbi->flags & MB_INFO_MEM))
			fail("no memory information from the boot loader");
		ram->top = SZ_1M + mbi->mem_upper * 1024u;
		ram->bytes = mbi->mem_lower * 1024u + mbi->mem_upper * 1024u;
		return;
	}
	for (off = 0; off < mbi->mmap_length;) {
		const struct mb_mmap_entry *e = (const void *)(uintptr_t)
			(mbi->mmap_addr + off);
		uint64_t start = e->addr, end = e->addr + e->len;

		off += e->size + 4;
		if (e->type != MB_MMAP_RAM || start >= FOUR_GIB)
			continue;
		if (end > FOUR_GIB - PAGE_SIZE)
			end = FOUR_GIB - PAGE_SIZE;	/* keep u32 math */
		ram->bytes += (uint32_t)(end - start);
		if (start <= SZ_1M && end > SZ_1M)
			ram->top = (uint32_t)end;
	}
	if (!ram->top)
		fail("no RAM region at 1 MiB in the memory map");
}

/*
 * Fill in the defaults that depend on the fill area and check what the
 * user asked for fits. Offsets wrap inside the area, sizes must fit.
 */
static void resolve_hot(struct wg_config *cfg, uint32_t fill_bytes)
{
	if (!CONFIG_GIVEN(cfg, P_HOT))
		cfg->hot = ALIGN_DOWN(fill_bytes / 8, PAGE_SIZE);
	if (cfg->hot > fill_bytes) {
		kprintf("WG error hot=%u exceeds the fill area of %u bytes\n",
			cfg->hot, fill_bytes);
		wg_exit(WG_EXIT_ERROR);
	}
	cfg->hot_offset %= fill_bytes;
	if (!CONFIG_GIVEN(cfg, P_SHIFT_TO))
		cfg->shift_to = cfg->hot_offset + cfg->hot -
			(cfg->hot_offset + cfg->hot >= fill_bytes ? fill_bytes : 0);
	cfg->shift_to %= fill_bytes;
	if (cfg->warm > fill_bytes) {
		kprintf("WG error warm=%u exceeds the fill area of %u bytes\n",
			cfg->warm, fill_bytes);
		wg_exit(WG_EXIT_ERROR);
	}
	if (!CONFIG_GIVEN(cfg, P_WARM_OFFSET))
		cfg->warm_offset = fill_bytes / 2;
	cfg->warm_offset = ALIGN_DOWN(cfg->warm_offset % fill_bytes, PAGE_SIZE);
}

static uint32_t hot_start_gpa(const struct run_state *rs)
{
	return rs->fill_start + (hot_first() << PAGE_SHIFT);
}

static void touch_batch(struct run_state *rs, uint32_t n)
{
	uint32_t pages[TOUCH_BATCH];

	hot_next_pages(pages, n);
	if (rs->warm_pages) {
		uint32_t i;

		/* warm_pct of the touches go to the second set, uniformly. */
		for (i = 0; i < n; i++) {
			uint32_t p;

			if (scale_u32(rng_next(&rs->warm_rng), 100) >=
			    rs->warm_pct)
				continue;
			p = rs->warm_first +
			    scale_u32(rng_next(&rs->warm_rng), rs->warm_pages);
			pages[i] = p >= rs->area_pages ? p - rs->area_pages : p;
		}
	}
	pat_touch_batch(pages, n, &rs->touch_rng, rs->write_pct);
	rs->touches += n;
}

static void sweep_one(struct run_state *rs)
{
	pat_check_page(rs->sweep_page);
	if (++rs->sweep_page == rs->area_pages) {
		rs->sweep_page = 0;
		rs->sweeps++;
	}
}

static void print_progress(const struct run_state *rs, uint32_t now)
{
	kprintf("WG progress t_ms=%u touches=%llu sweeps=%u verified_bytes=%llu"
		" corrupted=%llu hot_start=0x%x\n", now, rs->touches,
		rs->sweeps, pat_stats.verified_bytes, pat_stats.corrupted,
		hot_start_gpa(rs));
}

/*
 * Hot touches with one page of background sweep every sweep_every
 * touches, until the duration is over or the host sends 'q'. The clock is read once per batch:
 * rdtsc is a helper call under TCG and need not run per touch.
 */
static void run_loop(const struct wg_config *cfg, struct run_state *rs)
{
	uint32_t next_report = cfg->report * 1000u;
	uint32_t until_sweep = cfg->sweep_every;
	bool shift_pending = cfg->shift_after != 0;
	bool hot = hot_pages() != 0;
	uint32_t scan_start = cfg->scan_at * 1000u;
	uint32_t scan_end = scan_start + cfg->scan_for * 1000u;
	bool scanning = false, scan_done = !cfg->scan_at || !cfg->scan_for;

	for (;;) {
		uint32_t n = TOUCH_BATCH, now;

		if (until_sweep && until_sweep < n)
			n = until_sweep;
		if (hot)
			touch_batch(rs, n);
		/* Without a hot set there is nothing but the sweep to run. */
		if (!hot || (until_sweep && !(until_sweep -= n))) {
			sweep_one(rs);
			until_sweep = cfg->sweep_every;
		}

		/* The scan phase sweeps one page per hot touch. */
		if (scanning) {
			uint32_t i;

			for (i = 0; i < n; i++)
				sweep_one(rs);
			rs->scanned += n;
		}

		now = clock_ms_since(rs->tsc0);
		if (!scan_done && !scanning && now >= scan_start) {
			scanning = true;
			kprintf("WG scan start t_ms=%u\n", now);
		}
		if (scanning && now >= scan_end) {
			scanning = false;
			scan_done = true;
			kprintf("WG scan end t_ms=%u pages=%u\n", now,
				rs->scanned);
		}
		hints_tick(now, hot_start_gpa(rs), hot_pages() << PAGE_SHIFT);
		if (cfg->report && now >= next_report) {
			print_progress(rs, now);
			next_report = now - now % (cfg->report * 1000u) +
				      cfg->report * 1000u;
		}
		if (shift_pending && now >= cfg->shift_after * 1000u) {
			shift_pending = false;
			hot_move(cfg->shift_to >> PAGE_SHIFT);
			kprintf("WG hotshift t_ms=%u hot_start=0x%x\n", now,
				hot_start_gpa(rs));
		}
		if (cfg->duration && now >= cfg->duration * 1000u)
			return;
		switch (console_getc()) {
		case 'q':
			kprintf("WG stop t_ms=%u\n", now);
			return;
		case 's':	/* move the hot set now (once) */
			if (shift_pending || !cfg->shift_after) {
				shift_pending = false;
				hot_move(cfg->shift_to >> PAGE_SHIFT);
				kprintf("WG hotshift t_ms=%u hot_start=0x%x\n",
					now, hot_start_gpa(rs));
			}
			break;
		case 'c':	/* start a scan phase of scan_for seconds now */
			if (!scanning && cfg->scan_for) {
				scanning = true;
				scan_done = true;
				scan_end = now + cfg->scan_for * 1000u;
				kprintf("WG scan start t_ms=%u\n", now);
			}
			break;
		default:
			break;
		}
	}
}

/* One complete pass over the area, from page 0, before reporting done. */
static void final_sweep(struct run_state *rs)
{
	uint64_t t0 = rdtsc();
	uint32_t page;

	for (page = 0; page < rs->area_pages; page++)
		pat_check_page(page);
	rs->sweeps++;
	kprintf("WG verified ms=%u bytes=%u\n", clock_ms_since(t0),
		rs->area_pages << PAGE_SHIFT);
}

static void inject_one(const struct wg_config *cfg, uint32_t fill_bytes)
{
	uint32_t rng = rng_seed(cfg->seed, 0x1ec7);
	uint32_t word = scale_u32(rng_next(&rng), fill_bytes / 4);
	uint32_t bit = rng_next(&rng) & 31;

	kprintf("WG inject gpa=0x%x\n", pat_inject(word, bit));
}

void __attribute__((noreturn)) wg_main(uint32_t magic,
				       const struct mb_info *mbi)
{
	static struct wg_config cfg;
	static struct run_state rs;
	struct ram_info ram;
	uint32_t meta, fill_start, fill_end, fill_bytes, area_pages;
	uint32_t ver_bytes, hot_bytes, hot_tables;
	uint64_t t0;

	console_init();
	if (magic != MB_BOOT_MAGIC)
		fail("not started by a multiboot loader");
	read_cmdline(mbi);
	read_ram(mbi, &ram);
	if (clock_init())
		fail("PIT calibration failed");
	if (config_parse(&cfg, cmdline))
		wg_exit(WG_EXIT_ERROR);

	/* Size the tables for the largest area they could describe. */
	meta = ALIGN_UP((uint32_t)(uintptr_t)__end, PAGE_SIZE);
	ver_bytes = pat_table_bytes(ram.top);
	hot_tables = hot_table_bytes(cfg.pattern, ram.top >> PAGE_SHIFT);
	fill_start = ALIGN_UP(meta + ver_bytes + hot_tables, SZ_2M);
	fill_end = ALIGN_DOWN(ram.top, PAGE_SIZE);
	if (fill_start >= fill_end || fill_end - fill_start < SZ_1M)
		fail("not enough RAM for a fill area");
	fill_bytes = fill_end - fill_start;
	area_pages = fill_bytes >> PAGE_SHIFT;

	resolve_hot(&cfg, fill_bytes);
	hot_bytes = ALIGN_UP(cfg.hot, PAGE_SIZE);
	hot_init(&cfg, area_pages, cfg.hot_offset >> PAGE_SHIFT,
		 hot_bytes >> PAGE_SHIFT, (void *)(meta + ver_bytes));
	pat_init(fill_start, fill_end, (uint8_t *)meta, cfg.seed,
		 cfg.max_reports);

	rs.fill_start = fill_start;
	rs.area_pages = area_pages;
	rs.touch_rng = rng_seed(cfg.seed, 0x70c);
	rs.write_pct = cfg.write_pct;
	rs.warm_first = cfg.warm_offset >> PAGE_SHIFT;
	rs.warm_pages = ALIGN_UP(cfg.warm, PAGE_SIZE) >> PAGE_SHIFT;
	rs.warm_pct = cfg.warm_pct;
	rs.warm_rng = rng_seed(cfg.seed, 0x3a7);
	kprintf("WG start ram_bytes=%u fill_start=0x%x fill_end=0x%x "
		"hot_start=0x%x hot_bytes=%u pattern=%s duration_s=%u "
		"warm_start=0x%x warm_bytes=%u\n",
		ram.bytes, fill_start, fill_end, hot_start_gpa(&rs), hot_bytes,
		config_pattern_name(cfg.pattern), cfg.duration,
		fill_start + cfg.warm_offset, rs.warm_pages << PAGE_SHIFT);

	t0 = rdtsc();
	pat_fill();
	kprintf("WG filled ms=%u\n", clock_ms_since(t0));
	if (cfg.inject)
		inject_one(&cfg, fill_bytes);

	hints_init(cfg.hints, fill_end);
	rs.tsc0 = rdtsc();
	run_loop(&cfg, &rs);
	final_sweep(&rs);
	kprintf("WG done corrupted=%llu sweeps=%u touches=%llu\n",
		pat_stats.corrupted, rs.sweeps, rs.touches);
	wg_exit(pat_stats.corrupted ? WG_EXIT_CORRUPT : WG_EXIT_CLEAN);
}
