/*
 * pattern.c - fill, verify, rewrite and repair the fill area.
 *
 * Cost matters more than anything here: nested under two levels of TCG,
 * every guest instruction costs dozens of host instructions. So the hot
 * loops use 16-byte SSE2 loads and stores (one softmmu lookup per 8 bytes
 * instead of per 4), expected values come from vector adds rather than a
 * per-word hash, and the common verify path is an OR-reduction of XORs
 * over a whole 4 KiB page with a single test at the end. Only a page that
 * fails is re-scanned word by word to report and repair the bad words.
 *
 * All accesses to the fill area go through volatile pointers: the host
 * changes this memory behind the compiler's back (that is what we test),
 * so every check must really load from RAM.
 */
#include "lib.h"
#include "pattern.h"

/* may_alias: the version table is written as bytes and read as vectors. */
typedef uint32_t v4u __attribute__((vector_size(16), may_alias));

/* Golden-ratio multiplier: odd, so l -> l * K is a bijection mod 2^32. */
#define PAT_K		0x9e3779b1u
/* Versions live above the 24 line-number bits, see pattern.h. */
#define PAT_KV		(PAT_K << 24)

#define LOAD(p)		(*(const volatile v4u *)(p))
#define STORE(p, v)	(*(volatile v4u *)(p) = (v))
#define WORDS(p)	((volatile uint32_t *)(p))

static const v4u lane0 = { 0, 1, 2, 3 };
static const v4u lane1 = { 4, 5, 6, 7 };
static const v4u lane2 = { 8, 9, 10, 11 };
static const v4u lane3 = { 12, 13, 14, 15 };

struct pat_stats pat_stats;

static struct {
	uint8_t *mem;		/* fill area start (identity mapped) */
	uint32_t pages;
	uint8_t *ver;		/* one version byte per line */
	uint32_t base0;		/* base() of the first line, version 0 */
	uint32_t max_reports;
} area;

static inline v4u splat(uint32_t x)
{
	return (v4u){ x, x, x, x };
}

/*
 * Hide a vector constant from the optimiser. Otherwise gcc folds chains
 * of adds into three more constants and, short of XMM registers on
 * x86-32, reloads them from memory inside the loop: one more emulated
 * access each.
 */
#define OPAQUE(v)	asm("" : "+x"(v))

/* Any bit set? pcmpeqd + pmovmskb: three ops instead of four extracts. */
static inline bool any_set(v4u v)
{
	typedef char v16c __attribute__((vector_size(16)));

	return __builtin_ia32_pmovmskb128((v16c)(v == splat(0))) != 0xffff;
}

/* base() of line idx of the area with version v. */
static inline uint32_t line_base(uint32_t idx, uint32_t v)
{
	return area.base0 + idx * PAT_K + v * PAT_KV;
}

uint32_t pat_table_bytes(uint32_t fill_bytes)
{
	return ALIGN_UP(fill_bytes >> LINE_SHIFT, PAGE_SIZE);
}

void pat_init(uint32_t fill_start, uint32_t fill_end, uint8_t *versions,
	      uint32_t seed, uint32_t max_reports)
{
	area.mem = (uint8_t *)fill_start;
	area.pages = (fill_end - fill_start) >> PAGE_SHIFT;
	area.ver = versions;
	/* The seed moves the whole pattern so runs with seeds differ. */
	area.base0 = (fill_start >> LINE_SHIFT) * PAT_K +
		     rng_seed(seed, 0x5eed);
	area.max_reports = max_reports;
}

/*
 * Zero the version table, then write every line with version 0. Consecutive
 * lines' bases differ by exactly K, so the expected vectors advance with
 * one add each and no per-line multiply.
 */
void pat_fill(void)
{
	uint32_t lines = area.pages * LINES_PER_PAGE, i;
	uint8_t *p = area.mem;
	v4u k = splat(PAT_K), b = splat(line_base(0, 0));
	v4u e0 = b + lane0, e1 = b + lane1, e2 = b + lane2, e3 = b + lane3;
	v4u zero = splat(0);

	for (i = 0; i < lines; i += 64)
		for (uint32_t j = 0; j < 64; j += 16)
			*(v4u *)(area.ver + i + j) = zero;

	for (i = 0; i < lines; i++, p += LINE_SIZE) {
		STORE(p, e0);
		STORE(p + 16, e1);
		STORE(p + 32, e2);
		STORE(p + 48, e3);
		e0 += k;
		e1 += k;
		e2 += k;
		e3 += k;
	}
}

/*
 * Count one corrupt word and put the expected value back, so a word is
 * reported once per corruption event and not on every later sweep.
 */
static void report_and_repair(volatile uint32_t *w, uint32_t expected,
			      uint32_t found)
{
	uint64_t n = ++pat_stats.corrupted;

	if (!area.max_reports || n <= area.max_reports)
		kprintf("WG corrupt gpa=0x%08x expected=0x%08x found=0x%08x\n",
			(uint32_t)(uintptr_t)w, expected, found);
	else if (n == (uint64_t)area.max_reports + 1)
		kprintf("WG suppress corrupt_reports=%u\n", area.max_reports);
	*w = expected;
}

/* Precise word-by-word pass over lines [idx, idx + n). */
static void rescan_lines(uint32_t idx, uint32_t n)
{
	for (; n--; idx++) {
		volatile uint32_t *w = WORDS(area.mem + idx * LINE_SIZE);
		uint32_t base = line_base(idx, area.ver[idx]), j;

		for (j = 0; j < LINE_SIZE / 4; j++) {
			uint32_t found = w[j];

			if (found != base + j)
				report_and_repair(&w[j], base + j, found);
		}
	}
}

/*
 * Fast page check when all 64 lines still have version 0 (cold pages), the
 * hottest loop of the guest. The expected vector walks +4, +4, +4 through
 * a line and the next line starts K further. Measured under TCG, this form
 * beat both a four-vector version and a hand-written asm loop with one
 * long dependency chain: TCG keeps XMM registers in memory, so the host
 * runs faster when the guest's vector ops do not all depend on each other.
 */
static v4u page_diff_v0(const uint8_t *p, uint32_t base)
{
	v4u k = splat(PAT_K), four = splat(4), acc = splat(0);
	v4u e = splat(base) + lane0, t;
	uint32_t i;

	OPAQUE(k);
	OPAQUE(four);
	for (i = 0; i < LINES_PER_PAGE; i++, p += LINE_SIZE) {
		t = e;
		acc |= LOAD(p) ^ t;
		t += four;
		acc |= LOAD(p + 16) ^ t;
		t += four;
		acc |= LOAD(p + 32) ^ t;
		t += four;
		acc |= LOAD(p + 48) ^ t;
		e += k;
	}
	return acc;
}

/* General page check: each line has its own version offset. */
static v4u page_diff(const uint8_t *p, uint32_t idx)
{
	const uint8_t *ver = area.ver + idx;
	uint32_t base = line_base(idx, 0), i;
	v4u four = splat(4), acc = splat(0);

	OPAQUE(four);
	for (i = 0; i < LINES_PER_PAGE; i++, p += LINE_SIZE, base += PAT_K) {
		v4u e = splat(base + ver[i] * PAT_KV) + lane0;

		acc |= LOAD(p) ^ e;
		e += four;
		acc |= LOAD(p + 16) ^ e;
		e += four;
		acc |= LOAD(p + 32) ^ e;
		e += four;
		acc |= LOAD(p + 48) ^ e;
	}
	return acc;
}

/* Verify one page of the area (page index from the area start). */
void pat_check_page(uint32_t page)
{
	uint32_t idx = page * LINES_PER_PAGE;
	const uint8_t *p = area.mem + (page << PAGE_SHIFT);
	const v4u *vt = (const v4u *)(area.ver + idx);
	v4u diff;

	/* 64 version bytes = four vectors; all zero is the cold case. */
	if (any_set(vt[0] | vt[1] | vt[2] | vt[3]))
		diff = page_diff(p, idx);
	else
		diff = page_diff_v0(p, line_base(idx, 0));
	pat_stats.verified_bytes += PAGE_SIZE;
	if (any_set(diff))
		rescan_lines(idx, LINES_PER_PAGE);
}

/*
 * A batch of hot touches: for each page, pick a line and verify it; for a
 * write, bump the line's version and rewrite it. The version goes to the
 * table before the data: if either store is lost (say, by a botched
 * migration of its page) the line no longer matches its version and the
 * next check reports it. Batching keeps call and spill overhead out of
 * the per-touch path, which matters at 30x nested emulation.
 */
void pat_touch_batch(const uint32_t *pages, uint32_t n, uint32_t *rng,
		     uint32_t write_pct)
{
	/* Locals, so that byte stores to ver[] do not force reloads. */
	uint8_t *mem = area.mem, *ver = area.ver;
	uint32_t base0 = area.base0, state = *rng, i;
	v4u four = splat(4);

	OPAQUE(four);
	for (i = 0; i < n; i++) {
		uint32_t r = rng_next(&state);
		/* top 6 bits pick the line, the low 16 read or write */
		uint32_t idx = pages[i] * LINES_PER_PAGE + (r >> 26);
		uint32_t base = base0 + idx * PAT_K;
		uint8_t *p = mem + idx * LINE_SIZE;
		v4u e = splat(base + ver[idx] * PAT_KV) + lane0, acc;

		acc = LOAD(p) ^ e;
		e += four;
		acc |= LOAD(p + 16) ^ e;
		e += four;
		acc |= LOAD(p + 32) ^ e;
		e += four;
		acc |= LOAD(p + 48) ^ e;
		if (any_set(acc))
			rescan_lines(idx, 1);
		if ((((r & 0xffff) * 100u) >> 16) >= write_pct)
			continue;
		e = splat(base + ++ver[idx] * PAT_KV) + lane0;
		STORE(p, e);
		e += four;
		STORE(p + 16, e);
		e += four;
		STORE(p + 32, e);
		e += four;
		STORE(p + 48, e);
	}
	*rng = state;
	pat_stats.verified_bytes += n * LINE_SIZE;
}

/*
 * Test only: flip one bit of word `word` of the area without touching the
 * version table, as a faulty migration would. Returns its address.
 */
uint32_t pat_inject(uint32_t word, uint32_t bit)
{
	volatile uint32_t *w = WORDS(area.mem) + word;

	*w ^= 1u << (bit & 31);
	return (uint32_t)(uintptr_t)w;
}
