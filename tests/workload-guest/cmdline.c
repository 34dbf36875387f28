/*
 * cmdline.c - parse "key=value key=value ..." into struct wg_config.
 *
 * The parameter table is the single place that lists every key, its kind
 * and its range; docs/workload-guest.md mirrors it. Any unknown key or bad
 * value is fatal: a test that asked for something the guest does not do
 * must fail loudly rather than run a different workload.
 */
#include <stddef.h>

#include "config.h"
#include "lib.h"

enum param_kind {
	KIND_NUM,	/* plain number: decimal or 0x hex */
	KIND_SIZE,	/* number with optional K, M or G suffix (powers of 2) */
	KIND_PATTERN,	/* uniform | zipf | seq */
};

struct param {
	const char *name;
	enum param_kind kind;
	size_t offset;		/* field in struct wg_config */
	uint32_t max;
};

#define PARAM(id, key, kind, max) \
	[id] = { #key, kind, offsetof(struct wg_config, key), max }

/* Seconds are bounded so that milliseconds still fit in 32 bits. */
#define MAX_SECONDS	4000000u

static const struct param params[P_COUNT] = {
	PARAM(P_HOT,		hot,		KIND_SIZE,	0xffffffffu),
	PARAM(P_HOT_OFFSET,	hot_offset,	KIND_SIZE,	0xffffffffu),
	PARAM(P_PATTERN,	pattern,	KIND_PATTERN,	WG_PATTERN_SEQ),
	PARAM(P_ZIPF_S,		zipf_s,		KIND_NUM,	1000),
	PARAM(P_SHIFT_AFTER,	shift_after,	KIND_NUM,	MAX_SECONDS),
	PARAM(P_SHIFT_TO,	shift_to,	KIND_SIZE,	0xffffffffu),
	PARAM(P_DURATION,	duration,	KIND_NUM,	MAX_SECONDS),
	PARAM(P_REPORT,		report,		KIND_NUM,	MAX_SECONDS),
	PARAM(P_SEED,		seed,		KIND_NUM,	0xffffffffu),
	PARAM(P_WRITE_PCT,	write_pct,	KIND_NUM,	100),
	PARAM(P_INJECT,		inject,		KIND_NUM,	1),
	PARAM(P_SWEEP_EVERY,	sweep_every,	KIND_NUM,	1000000),
	PARAM(P_MAX_REPORTS,	max_reports,	KIND_NUM,	0xffffffffu),
	PARAM(P_WARM,		warm,		KIND_SIZE,	0xffffffffu),
	PARAM(P_WARM_OFFSET,	warm_offset,	KIND_SIZE,	0xffffffffu),
	PARAM(P_WARM_PCT,	warm_pct,	KIND_NUM,	100),
	PARAM(P_SCAN_AT,	scan_at,	KIND_NUM,	MAX_SECONDS),
	PARAM(P_SCAN_FOR,	scan_for,	KIND_NUM,	MAX_SECONDS),
	PARAM(P_HINTS,		hints,		KIND_NUM,	2),
};

static const char *const pattern_names[] = {
	[WG_PATTERN_UNIFORM]	= "uniform",
	[WG_PATTERN_ZIPF]	= "zipf",
	[WG_PATTERN_SEQ]	= "seq",
};

const char *config_pattern_name(uint32_t pattern)
{
	return pattern_names[pattern];
}

static void config_defaults(struct wg_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->pattern = WG_PATTERN_UNIFORM;
	cfg->zipf_s = 99;
	cfg->report = 1;
	cfg->seed = 1;
	cfg->write_pct = 50;
	cfg->sweep_every = 64;
	cfg->max_reports = 10000;
	cfg->warm_pct = 20;
	/* hot and shift_to depend on the fill area: resolved by the caller */
}

/* Compare the token [s, s+len) with a NUL-terminated name. */
static bool token_is(const char *s, size_t len, const char *name)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (name[i] != s[i])
			return false;
	return name[len] == '\0';
}

static int digit_value(char c, uint32_t base)
{
	int d;

	if (c >= '0' && c <= '9')
		d = c - '0';
	else if (c >= 'a' && c <= 'f')
		d = c - 'a' + 10;
	else if (c >= 'A' && c <= 'F')
		d = c - 'A' + 10;
	else
		return -1;
	return (uint32_t)d < base ? d : -1;
}

/* Parse a number (and size suffix for KIND_SIZE); -1 if malformed. */
static int parse_number(const char *s, size_t len, bool size, uint64_t *out)
{
	uint32_t base = 10;
	uint64_t v = 0;
	size_t i = 0;
	int d;

	if (len > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		i = 2;
	}
	if (i == len || digit_value(s[i], base) < 0)
		return -1;
	for (; i < len && (d = digit_value(s[i], base)) >= 0; i++) {
		v = v * base + (uint32_t)d;
		if (v > 0xffffffffull)
			return -1;
	}
	if (i < len && size) {
		switch (s[i++]) {
		case 'k': case 'K': v <<= 10; break;
		case 'm': case 'M': v <<= 20; break;
		case 'g': case 'G': v <<= 30; break;
		default: return -1;
		}
	}
	if (i != len)
		return -1;
	*out = v;
	return 0;
}

static int parse_value(const struct param *p, const char *s, size_t len,
		       uint32_t *out)
{
	uint64_t v;
	uint32_t i;

	if (p->kind == KIND_PATTERN) {
		for (i = 0; i <= WG_PATTERN_SEQ; i++) {
			if (token_is(s, len, pattern_names[i])) {
				*out = i;
				return 0;
			}
		}
		return -1;
	}
	if (parse_number(s, len, p->kind == KIND_SIZE, &v) || v > p->max)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static void print_span(const char *s, size_t len)
{
	while (len--)
		kprintf("%c", *s++);
}

static int config_error(const char *what, const char *s, size_t len)
{
	kprintf("WG error %s ", what);
	print_span(s, len);
	kprintf("\n");
	return -1;
}

/* Apply one "key=value" token. */
static int parse_token(struct wg_config *cfg, const char *tok, size_t len)
{
	size_t klen = 0;
	uint32_t id;

	while (klen < len && tok[klen] != '=')
		klen++;
	if (klen == len || klen == 0)
		return config_error("malformed parameter", tok, len);
	for (id = 0; id < P_COUNT; id++) {
		const struct param *p = &params[id];

		if (!token_is(tok, klen, p->name))
			continue;
		if (parse_value(p, tok + klen + 1, len - klen - 1,
				(uint32_t *)((char *)cfg + p->offset)))
			return config_error("bad value", tok, len);
		cfg->given |= 1u << id;
		return 0;
	}
	return config_error("unknown parameter", tok, klen);
}

/*
 * By multiboot convention the command line starts with the image path
 * (QEMU passes "<kernel> <append>"); skip it. A path never looks like
 * key=value with a plain key, so a first word that has a '/' or no '=' is
 * the path.
 */
static bool is_image_path(const char *tok, size_t len)
{
	bool eq = false;
	size_t i;

	for (i = 0; i < len; i++) {
		if (tok[i] == '/')
			return true;
		if (tok[i] == '=')
			eq = true;
	}
	return !eq;
}

int config_parse(struct wg_config *cfg, const char *cmdline)
{
	const char *s = cmdline;
	bool first = true;

	config_defaults(cfg);
	for (;;) {
		const char *tok;
		size_t len;

		while (*s == ' ' || *s == '\t')
			s++;
		if (!*s)
			return 0;
		tok = s;
		while (*s && *s != ' ' && *s != '\t')
			s++;
		len = (size_t)(s - tok);
		if (first && is_image_path(tok, len)) {
			first = false;
			continue;
		}
		first = false;
		if (parse_token(cfg, tok, len))
			return -1;
	}
}
