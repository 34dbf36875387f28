/*
 * hotset.c - choose hot-set pages: uniform, zipf or sequential.
 *
 * The hot set is `pages` consecutive pages of the fill area starting at page
 * `first`, wrapping at the area end so that any offset works. Selection
 * works on a hot-set index h in [0, pages); the page is (first + h) mod the
 * area size, so moving the hot set (hot_move) keeps the access distribution.
 *
 * Zipf: rank r has weight (r + 1)^-s. A cumulative table over all ranks is
 * searched with a guide table (one entry per 2^20 slice of the random
 * number), so a sample costs a couple of probes instead of log2(pages).
 * Ranks are then scattered over the hot set by the fixed permutation
 * h = (r * A + B) mod pages with gcd(A, pages) = 1: the hottest pages are
 * not neighbours, as in a real heap. Weights use integer log2/exp2 tables
 * (256 entries each) so that building the table stays cheap under TCG,
 * where every floating-point operation is a soft-float helper call.
 */
#include "config.h"
#include "hotset.h"
#include "lib.h"

#define GUIDE_BITS	12
#define GUIDE_SLOTS	(1u << GUIDE_BITS)
#define TAB_BITS	8
#define TAB_SIZE	(1u << TAB_BITS)

static struct {
	uint32_t pattern;
	uint32_t area_pages;
	uint32_t first;
	uint32_t pages;
	uint32_t cursor;	/* seq */
	uint32_t rng;
	/* zipf */
	uint32_t *cdf;		/* pages entries, cumulative weight */
	uint32_t *guide;	/* GUIDE_SLOTS + 1 entries */
	uint32_t total;
	uint32_t perm_a;
	uint32_t perm_b;
} hs;

static uint32_t log2_tab[TAB_SIZE];	/* log2(1 + i/256), Q16 */
static uint32_t exp2_tab[TAB_SIZE];	/* 2^(-i/256), Q30 */

uint32_t hot_table_bytes(uint32_t pattern, uint32_t max_pages)
{
	if (pattern != WG_PATTERN_ZIPF)
		return 0;
	return ALIGN_UP((max_pages + GUIDE_SLOTS + 1) * 4u, PAGE_SIZE);
}

/* ln(m) for m in [1, 2] from the atanh series; t <= 1/3 converges fast. */
static double ln_1_2(double m)
{
	double t = (m - 1.0) / (m + 1.0), t2 = t * t, term = t, sum = 0.0;
	int k;

	for (k = 1; k < 40; k += 2) {
		sum += term / k;
		term *= t2;
	}
	return 2.0 * sum;
}

/* exp(x) for |x| < 1 from its Taylor series. */
static double exp_small(double x)
{
	double sum = 1.0, term = 1.0;
	int k;

	for (k = 1; k < 25; k++) {
		term *= x / k;
		sum += term;
	}
	return sum;
}

static void math_tables_init(void)
{
	double ln2 = ln_1_2(2.0);
	uint32_t i;

	for (i = 0; i < TAB_SIZE; i++) {
		double f = (double)(int)i / TAB_SIZE;

		log2_tab[i] = (uint32_t)(int)(ln_1_2(1.0 + f) / ln2 * 65536.0 +
					      0.5);
		exp2_tab[i] = (uint32_t)(int)(exp_small(-f * ln2) *
					      1073741824.0 + 0.5);
	}
}

/* log2(x) in Q16 for x >= 1, to 8 bits of mantissa. */
static uint32_t log2_q16(uint32_t x)
{
	uint32_t e = 31 - (uint32_t)__builtin_clz(x);
	uint32_t m = x << (31 - e);	/* leading one now at bit 31 */

	return (e << 16) + log2_tab[(m >> (31 - TAB_BITS)) & (TAB_SIZE - 1)];
}

/* (r + 1)^(-s/100) in Q30; s <= 1000 keeps the product below 2^31. */
static uint32_t zipf_weight(uint32_t r, uint32_t s)
{
	uint32_t y = log2_q16(r + 1) * s / 100;
	uint32_t ip = y >> 16;

	if (ip >= 31)
		return 0;
	return exp2_tab[(y >> (16 - TAB_BITS)) & (TAB_SIZE - 1)] >> ip;
}

static uint32_t gcd(uint32_t a, uint32_t b)
{
	while (b) {
		uint32_t t = a % b;

		a = b;
		b = t;
	}
	return a;
}

static void zipf_init(uint32_t s, uint32_t *tables)
{
	uint32_t n = hs.pages, r, g, shift = 0;
	uint64_t total = 0, cum = 0;

	math_tables_init();
	hs.cdf = tables;
	hs.guide = tables + n;

	/* Pass 1: weights; pass 2: prefix sums scaled to fit 32 bits. */
	for (r = 0; r < n; r++) {
		hs.cdf[r] = zipf_weight(r, s);
		total += hs.cdf[r];
	}
	while ((total >> shift) > 0xffffffffull)
		shift++;
	for (r = 0; r < n; r++) {
		cum += hs.cdf[r];
		hs.cdf[r] = (uint32_t)(cum >> shift);
	}
	hs.total = hs.cdf[n - 1];

	/* guide[g]: first rank whose cdf exceeds the lowest target of g. */
	for (g = 0, r = 0; g <= GUIDE_SLOTS; g++) {
		uint32_t t = (uint32_t)(((uint64_t)g << (32 - GUIDE_BITS)) *
					hs.total >> 32);

		while (r < n - 1 && hs.cdf[r] <= t)
			r++;
		hs.guide[g] = r;
	}

	/* A near n / golden ratio, made coprime with n. */
	hs.perm_a = scale_u32(0x9e3779b9u, n) | 1;
	while (gcd(hs.perm_a, n) != 1)
		hs.perm_a++;
	hs.perm_b = scale_u32(rng_next(&hs.rng), n);
}

static uint32_t zipf_index(void)
{
	uint32_t u = rng_next(&hs.rng), rem;
	uint32_t t = scale_u32(u, hs.total);
	uint32_t lo = hs.guide[u >> (32 - GUIDE_BITS)];
	uint32_t hi = hs.guide[(u >> (32 - GUIDE_BITS)) + 1];

	/* First rank with cdf > t; it lies in [lo, hi] by the guide. */
	while (lo < hi) {
		uint32_t mid = (lo + hi) >> 1;

		if (hs.cdf[mid] > t)
			hi = mid;
		else
			lo = mid + 1;
	}
	div_u64_rem((uint64_t)lo * hs.perm_a + hs.perm_b, hs.pages, &rem);
	return rem;
}

void hot_init(const struct wg_config *cfg, uint32_t area_pages,
	      uint32_t first, uint32_t pages, void *tables)
{
	hs.pattern = cfg->pattern;
	hs.area_pages = area_pages;
	hs.first = first;
	hs.pages = pages;
	hs.cursor = 0;
	hs.rng = rng_seed(cfg->seed, 0x407);
	if (pages && hs.pattern == WG_PATTERN_ZIPF)
		zipf_init(cfg->zipf_s, tables);
}

void hot_move(uint32_t first)
{
	hs.first = first;
}

uint32_t hot_first(void)
{
	return hs.first;
}

uint32_t hot_pages(void)
{
	return hs.pages;
}

/* Map a hot-set index to a page of the fill area, wrapping at its end. */
static inline uint32_t hot_page(uint32_t h)
{
	uint32_t page = hs.first + h;

	return page >= hs.area_pages ? page - hs.area_pages : page;
}

/*
 * Pages (from the fill-area start) of the next n touches; needs pages > 0.
 * One switch per batch, not per touch.
 */
void hot_next_pages(uint32_t *pages, uint32_t n)
{
	uint32_t i;

	switch (hs.pattern) {
	case WG_PATTERN_ZIPF:
		for (i = 0; i < n; i++)
			pages[i] = hot_page(zipf_index());
		break;
	case WG_PATTERN_SEQ:
		for (i = 0; i < n; i++) {
			pages[i] = hot_page(hs.cursor);
			if (++hs.cursor == hs.pages)
				hs.cursor = 0;
		}
		break;
	default:
		for (i = 0; i < n; i++)
			pages[i] = hot_page(scale_u32(rng_next(&hs.rng),
						      hs.pages));
		break;
	}
}
