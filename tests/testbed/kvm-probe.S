/*
 * A multiboot kernel that only writes 0x2a to the isa-debug-exit port: QEMU then exits
 * with status (0x2a << 1) | 1 = 85. `run` boots it with -accel kvm to learn whether
 * /dev/kvm runs standard guests on this host.
 */
	.section .multiboot, "a"
	.align 4
	.long 0x1badb002
	.long 0
	.long -0x1badb002

	.text
	.globl _start
_start:
	movw $0xf4, %dx
	movb $0x2a, %al
	outb %al, %dx
1:	hlt
	jmp 1b
