/*
 * boot.S - multiboot v1 entry of the workload guest.
 *
 * QEMU's multiboot loader (or GRUB) enters _start in 32-bit protected mode
 * with flat segments, paging off and interrupts off; %eax holds the
 * bootloader magic and %ebx the physical address of the multiboot info.
 * We only need our own stack, a zeroed .bss and SSE switched on before any
 * C code runs, because the C code is compiled with -msse2.
 */

#define MB_HEADER_MAGIC	0x1badb002
/* bit 0: page-align modules, bit 1: we want mem_* and the memory map */
#define MB_HEADER_FLAGS	0x00000003

#define CR0_MP		(1 << 1)
#define CR0_EM		(1 << 2)
#define CR4_OSFXSR	(1 << 9)
#define CR4_OSXMMEXCPT	(1 << 10)

	.section .multiboot, "a"
	.balign 4
	.long MB_HEADER_MAGIC
	.long MB_HEADER_FLAGS
	.long -(MB_HEADER_MAGIC + MB_HEADER_FLAGS)

	.section .bss
	.balign 16
boot_stack:
	.skip 65536
boot_stack_top:

	.text
	.globl _start
	.type _start, @function
_start:
	cli
	cld
	movl $boot_stack_top, %esp
	movl %eax, %ebp			/* keep the magic; %ebx stays intact */

	/* The loader zeroes .bss for ELF images, but do not rely on it. */
	movl $__bss_start, %edi
	movl $__bss_end, %ecx
	subl %edi, %ecx
	shrl $2, %ecx
	xorl %eax, %eax
	rep stosl

	/* No x87 emulation trap (EM=0), monitor coprocessor (MP=1). */
	movl %cr0, %eax
	andl $~CR0_EM, %eax
	orl $CR0_MP, %eax
	movl %eax, %cr0
	/* Allow SSE instructions and report SIMD FP exceptions as #XM. */
	movl %cr4, %eax
	orl $(CR4_OSFXSR | CR4_OSXMMEXCPT), %eax
	movl %eax, %cr4
	fninit

	/*
	 * gcc assumes a 16-byte aligned stack at every call (it may spill
	 * SSE registers with movaps): two pushes plus 8 bytes of padding keep
	 * %esp 16-byte aligned at the call instruction.
	 */
	subl $8, %esp
	pushl %ebx
	pushl %ebp
	call wg_main

	/* wg_main never returns; if it does, stop the CPU for good. */
1:	cli
	hlt
	jmp 1b
	.size _start, . - _start
