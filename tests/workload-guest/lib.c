/*
 * lib.c - memory/string primitives, the COM1 console and guest exit.
 *
 * gcc may emit calls to memset/memcpy on its own (struct copies, zeroing),
 * so they must exist even in a freestanding image.
 */
#include "io.h"
#include "lib.h"

#define COM1		0x3f8
#define UART_THR	0	/* transmit holding register */
#define UART_IER	1
#define UART_FCR	2
#define UART_LCR	3
#define UART_MCR	4
#define UART_RBR	0	/* receive buffer register */
#define UART_LSR	5
#define LSR_THRE	0x20	/* transmitter can take a byte */
#define LSR_DR		0x01	/* a received byte is waiting */

#define DEBUG_EXIT_PORT	0xf4

void *memset(void *dst, int c, size_t n)
{
	uint8_t *d = dst;

	while (n--)
		*d++ = (uint8_t)c;
	return dst;
}

void *memcpy(void *dst, const void *src, size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;

	while (n--)
		*d++ = *s++;
	return dst;
}

size_t strlen(const char *s)
{
	size_t n = 0;

	while (s[n])
		n++;
	return n;
}

void console_init(void)
{
	outb(COM1 + UART_IER, 0x00);	/* we poll, no interrupts */
	outb(COM1 + UART_LCR, 0x80);	/* DLAB on: divisor follows */
	outb(COM1 + 0, 0x01);		/* 115200 baud */
	outb(COM1 + 1, 0x00);
	outb(COM1 + UART_LCR, 0x03);	/* 8N1, DLAB off */
	outb(COM1 + UART_FCR, 0x07);	/* enable and clear FIFOs */
	outb(COM1 + UART_MCR, 0x03);	/* DTR, RTS */
}

/*
 * A byte typed on the serial line, or -1. The host asks the guest to finish
 * early by sending 'q' (see docs/workload-guest.md).
 */
int console_getc(void)
{
	if (!(inb(COM1 + UART_LSR) & LSR_DR))
		return -1;
	return inb(COM1 + UART_RBR);
}

static void console_putc(char c)
{
	/* One status poll per byte keeps us correct on slow backends. */
	while (!(inb(COM1 + UART_LSR) & LSR_THRE))
		;
	outb(COM1 + UART_THR, (uint8_t)c);
}

/* Format one unsigned number into the tail of buf, return its start. */
static char *fmt_u64(char *end, uint64_t v, uint32_t base)
{
	char *p = end;
	uint32_t digit;

	do {
		v = div_u64_rem(v, base, &digit);
		*--p = "0123456789abcdef"[digit];
	} while (v);
	return p;
}

static void put_padded(const char *s, int width, char pad)
{
	int len = (int)strlen(s);

	while (width-- > len)
		console_putc(pad);
	while (*s)
		console_putc(*s++);
}

/*
 * A small printf: %c %s %d %u %x with an optional 0 flag, a width and an
 * "ll" length. That is all the WG protocol lines need.
 */
void kprintf(const char *fmt, ...)
{
	char buf[24];
	va_list ap;

	va_start(ap, fmt);
	for (; *fmt; fmt++) {
		char pad = ' ';
		int width = 0, longs = 0;
		uint64_t v;

		if (*fmt != '%') {
			console_putc(*fmt);
			continue;
		}
		fmt++;
		if (*fmt == '0')
			pad = '0';
		while (*fmt >= '0' && *fmt <= '9')
			width = width * 10 + (*fmt++ - '0');
		while (*fmt == 'l') {
			longs++;
			fmt++;
		}
		buf[sizeof(buf) - 1] = '\0';
		switch (*fmt) {
		case 'c':
			console_putc((char)va_arg(ap, int));
			break;
		case 's':
			put_padded(va_arg(ap, const char *), width, ' ');
			break;
		case 'd': {
			int32_t sv = va_arg(ap, int32_t);
			uint32_t uv = (uint32_t)sv;

			if (sv < 0) {
				console_putc('-');
				uv = 0u - uv;
			}
			put_padded(fmt_u64(buf + sizeof(buf) - 1, uv, 10),
				   width, pad);
			break;
		}
		case 'u':
		case 'x':
			v = longs >= 2 ? va_arg(ap, uint64_t) :
					 va_arg(ap, uint32_t);
			put_padded(fmt_u64(buf + sizeof(buf) - 1, v,
					   *fmt == 'u' ? 10 : 16), width, pad);
			break;
		case '\0':
			fmt--;
			break;
		default:
			console_putc(*fmt);
			break;
		}
	}
	va_end(ap);
}

/*
 * Leave through QEMU's isa-debug-exit device. Without that device the
 * write is ignored and we stop with interrupts off, so a supervisor sees a
 * quiet guest instead of a reboot loop.
 */
void wg_exit(uint32_t code)
{
	outb(DEBUG_EXIT_PORT, (uint8_t)code);
	cpu_halt_forever();
}
