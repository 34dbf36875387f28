/*
 * hints.c - guest hints over the second serial port (COM2, I/O port 0x2f8).
 *
 * The host end is a QEMU chardev socket that vmtierd reads
 * (docs/hint-protocol.md). Frames are written byte by byte, polling the
 * transmitter; nothing is read back (the host's replies are not needed,
 * and a guest that ignores them is one of the cases the host must bear).
 *
 * WG_HINTS_ON: once a second a HELLO and a HINTS frame (REPLACE) naming
 * the hot set as HOT, weight 255, source GUEST_DAMON. After a hot-set
 * shift the next frame names the new range.
 *
 * WG_HINTS_EVIL: one frame or more of every class the host must drop and
 * count: garbage bytes, HINTS before HELLO (after a BYE), a HELLO with no
 * common version, HINTS of another version, an oversize header, an unknown
 * type, a bad length, invalid and out-of-RAM ranges, a replayed sequence
 * number, a claim that all RAM is pinned, and a flood of header-only frames
 * beyond the rate limit. Two kinds of batch take turns, each at most 5
 * admitted frames that matter, then a flood, after EVIL_QUIET_MS of quiet.
 * The host refills its frame bucket when it reads and takes the frames of
 * one read in order, so frames that follow a quiet longer than the host's
 * gap between reads get a full bucket before the flood drains it; sent
 * straight after the previous flood, they lost to the rate limit at random
 * (a replay is only seen when the claim it repeats was admitted too).
 */
#include "hints.h"
#include "clock.h"
#include "io.h"
#include "lib.h"

#define COM2		0x2f8
#define UART_THR	0
#define UART_IER	1
#define UART_FCR	2
#define UART_LCR	3
#define UART_MCR	4
#define UART_LSR	5
#define LSR_THRE	0x20

#define T_HELLO		1
#define T_HINTS		3
#define T_BYE		6
#define KIND_HOT	1
#define KIND_PINNED	4
#define SRC_GUEST_DAMON	4
#define FLAG_REPLACE	1
#define EVIL_FLOOD	20
/*
 * The testbed gives the evil VM frames_per_s = 5 (tbcheck hints --evil): its
 * bucket holds 5 frames. vmtierd reads once a tick, and on a loaded testbed
 * host a tick took up to 3.4 s.
 */
#define EVIL_QUIET_MS		3500

static uint32_t mode, top, seq, epoch, next_ms;
static uint8_t frame[16 + 16 + 24 * 4];

static void put(uint8_t b)
{
	while (!(inb(COM2 + UART_LSR) & LSR_THRE))
		;
	outb(COM2 + UART_THR, b);
}

static void send(const uint8_t *p, uint32_t n)
{
	while (n--)
		put(*p++);
}

static void le16(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void le32(uint8_t *p, uint32_t v)
{
	le16(p, v);
	le16(p + 2, v >> 16);
}

static void le64(uint8_t *p, uint64_t v)
{
	le32(p, (uint32_t)v);
	le32(p + 4, (uint32_t)(v >> 32));
}

/* Header at frame[0..16]: magic, version, type, seq, payload length. */
static void header(uint32_t version, uint32_t type, uint32_t s, uint32_t len)
{
	frame[0] = 'V';
	frame[1] = 'M';
	frame[2] = 'T';
	frame[3] = 'H';
	le16(frame + 4, version);
	le16(frame + 6, type);
	le32(frame + 8, s);
	le32(frame + 12, len);
}

static void hello(uint32_t min_v, uint32_t max_v)
{
	static const char name[] = "workload-guest";
	uint32_t i;

	header(1, T_HELLO, 0, 40);
	le16(frame + 16, min_v);
	le16(frame + 18, max_v);
	le32(frame + 20, 0);
	for (i = 0; i < 32; i++)
		frame[24 + i] = i < sizeof(name) - 1 ? (uint8_t)name[i] : 0;
	send(frame, 56);
}

struct range {
	uint64_t gpa, len;
	uint8_t kind, weight;
};

/* A HINTS frame of up to 4 ranges (source GUEST_DAMON), version `v`. */
static void hints(uint32_t v, uint32_t s, const struct range *r, uint32_t n)
{
	uint32_t i, len = 16 + 24 * n;

	header(v, T_HINTS, s, len);
	le64(frame + 16, epoch);
	le32(frame + 24, n);
	le32(frame + 28, FLAG_REPLACE);
	for (i = 0; i < n; i++) {
		uint8_t *p = frame + 32 + 24 * i;

		le64(p, r[i].gpa);
		le64(p + 8, r[i].len);
		p[16] = r[i].kind;
		p[17] = r[i].weight;
		p[18] = SRC_GUEST_DAMON;
		memset(p + 19, 0, 5);
	}
	send(frame, 16 + len);
}

void hints_init(uint32_t m, uint32_t ram_top)
{
	mode = m;
	top = ram_top;
	if (mode == WG_HINTS_OFF)
		return;
	outb(COM2 + UART_IER, 0x00);
	outb(COM2 + UART_LCR, 0x80);
	outb(COM2 + 0, 0x01);
	outb(COM2 + 1, 0x00);
	outb(COM2 + UART_LCR, 0x03);
	outb(COM2 + UART_FCR, 0x07);
	outb(COM2 + UART_MCR, 0x03);
	next_ms = 0;
	kprintf("WG hints mode=%s\n", mode == WG_HINTS_ON ? "on" : "evil");
}

static void good(uint32_t hot_gpa, uint32_t hot_bytes)
{
	struct range r = { hot_gpa, hot_bytes, KIND_HOT, 255 };

	/*
	 * A HELLO before every batch: this guest never reads its port, so it
	 * cannot know whether vmtierd was connected when it sent the last one.
	 */
	hello(1, 1);
	epoch++;
	hints(1, ++seq, &r, 1);
}

/* Sends nothing for `ms`, so the host's frame bucket fills up. */
static void quiet(uint32_t ms)
{
	uint64_t t0 = rdtsc();

	while (clock_ms_since(t0) < ms)
		;
}

static void flood(void)
{
	uint32_t i;

	/*
	 * Header-only frames of an unknown type (16 bytes, the most frames a
	 * slow serial line can carry), each paying for admission.
	 */
	for (i = 0; i < EVIL_FLOOD; i++) {
		header(1, 7, ++seq, 0);
		send(frame, 16);
	}
}

static void evil(uint32_t hot_gpa, uint32_t hot_bytes)
{
	static const uint8_t junk[] = "\xde\xad\xbe\xef not a frame VMT VMTX";
	static uint32_t batch;
	struct range bad[4] = {
		{ 1ull << 40, 1 << 20, KIND_HOT, 255 },		/* beyond RAM */
		{ top, 1 << 21, KIND_HOT, 255 },		/* just past it */
		{ hot_gpa + 1, 4096, KIND_HOT, 255 },		/* unaligned */
		{ hot_gpa, hot_bytes, 9, 255 },			/* bad kind */
	};
	/* All RAM above the image's first MiB (the PC hole ends there). */
	struct range all = { 1 << 20, top - (1 << 20), KIND_PINNED, 255 };
	struct range one = { hot_gpa, 4096, KIND_HOT, 1 };
	uint32_t i;

	quiet(EVIL_QUIET_MS);
	if (batch++ % 2 == 0) {
		/*
		 * 5 frames: a session, a claim on all RAM, its replay, bad
		 * ranges, a bad length; an oversize header (its payload left as
		 * garbage; refused before admission).
		 */
		hello(1, 1);
		seq = 0;
		epoch++;
		hints(1, ++seq, &all, 1);
		hints(1, seq, &all, 1);
		hints(1, ++seq, bad, 4);
		header(1, T_HELLO, 0, 39);
		send(frame, 16);
		for (i = 0; i < 39; i++)
			put(0);
		header(1, T_HINTS, ++seq, 0x10000);
		send(frame, 16);
		send(junk, 8);
	} else {
		/*
		 * 5 frames: garbage, then BYE and HINTS before any HELLO; the
		 * version game: no common version, then a session and v2 frames.
		 */
		send(junk, sizeof(junk) - 1);
		header(1, T_BYE, 1, 4);
		le32(frame + 16, 0);
		send(frame, 20);
		hints(1, 1, &one, 1);
		hello(2, 9);
		hello(1, 1);
		seq = 0;
		epoch++;
		hints(2, ++seq, &one, 1);
	}
	flood();
}

void hints_tick(uint32_t now_ms, uint32_t hot_gpa, uint32_t hot_bytes)
{
	if (mode == WG_HINTS_OFF || now_ms < next_ms)
		return;
	next_ms = now_ms + 1000;
	if (mode == WG_HINTS_ON)
		good(hot_gpa, hot_bytes);
	else
		evil(hot_gpa, hot_bytes);
}
