/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * vmtier: batched migration of a process's private anonymous memory between
 * NUMA nodes, with a multi-threaded CPU copy or DMA engine copy.
 *
 * This header is the whole ABI of /dev/vmtier. Every field is a fixed-size
 * __u64 (user pointers included) marked (in) or (out).
 *
 * Growth: the kernel dispatches on the ioctl's type and number and takes the
 * structure's size from the command (_IOC_SIZE), which must also be the value
 * of its leading size field. A smaller structure from an older program (at
 * least the first version's size) is zero-extended and gets back only the
 * fields it knows; a larger one from a newer program is accepted when its
 * extra bytes are zero (-E2BIG otherwise). Flags the kernel does not know and
 * nonzero reserved fields are refused with -EINVAL. New fields are appended;
 * struct vmtier_range keeps its size and grows into its reserved fields.
 */
#ifndef _UAPI_LINUX_VMTIER_H
#define _UAPI_LINUX_VMTIER_H

#include <linux/const.h>
#include <linux/ioctl.h>
#include <linux/types.h>

/*
 * 1: first version. 2: ioctl size from the command, pre-filtered unmap,
 * skipped_pinned/skipped_sharers, VMTIER_MIGRATE_SHARED, the v2 tails of
 * struct vmtier_migrate and struct vmtier_query.
 */
#define VMTIER_ABI_VERSION	2

/* Copy engines (struct vmtier_migrate.engine). */
#define VMTIER_ENGINE_AUTO	0	/* the module picks per batch */
#define VMTIER_ENGINE_CPU	1	/* worker threads on housekeeping CPUs */
#define VMTIER_ENGINE_DMA	2	/* dmaengine DMA_MEMCPY channels */
#define VMTIER_NR_ENGINES	3

/* struct vmtier_migrate.flags */
/*
 * Count pages of VMAs that this path cannot move (shared, file, hugetlb,
 * VM_IO/PFNMAP) as skipped_shared instead of failing with -EOPNOTSUPP.
 */
#define VMTIER_MIGRATE_SKIP_UNSUPPORTED	_BITULL(0)
/*
 * Also move pages mapped by other processes too (copy-on-write after fork)
 * and KSM pages. Moving such a page moves it for every process that maps
 * it; without this flag they are counted in skipped_sharers. (ABI 2)
 */
#define VMTIER_MIGRATE_SHARED		_BITULL(1)
#define VMTIER_MIGRATE_FLAGS_ALL	(VMTIER_MIGRATE_SKIP_UNSUPPORTED | \
					 VMTIER_MIGRATE_SHARED)

/* Limits (also reported by VMTIER_IOC_QUERY). */
#define VMTIER_MAX_RANGES	4096
#define VMTIER_MAX_BATCH	65536	/* base pages per batch */
#define VMTIER_DEFAULT_BATCH	4096
#define VMTIER_MAX_WORKERS	64
#define VMTIER_MAX_DMA_CHANS	8
#define VMTIER_DMA_NAME_LEN	32

/**
 * struct vmtier_range - one virtual address range and what happened to it
 * @start:		(in) first byte, page aligned
 * @len:		(in) length in bytes, page aligned, nonzero
 * @moved:		(out) base pages now on the destination that were not
 * @on_target:		(out) base pages that already were on the destination
 *			(left mapped: not unmapped, not copied)
 * @skipped_hole:	(out) base pages not populated (never touched, zero page)
 * @skipped_thp:	(out) base pages of PMD-mapped transparent huge pages,
 *			left whole (use move_pages(2) for them)
 * @skipped_busy:	(out) base pages busy (locked, under writeback, with
 *			transient extra references), swapped out, in a
 *			PTE-mapped large folio, or whose DMA copy was given up;
 *			worth retrying later
 * @skipped_shared:	(out) base pages of VMAs this path cannot move
 *			(only with VMTIER_MIGRATE_SKIP_UNSUPPORTED)
 * @failed:		(out) base pages that could not move: no memory on the
 *			destination, or a copy error (machine check)
 * @skipped_pinned:	(out) base pages pinned for DMA (pin_user_pages(),
 *			e.g. VFIO, io_uring fixed buffers): left mapped; they
 *			will not move until unpinned, so back off (ABI 2)
 * @skipped_sharers:	(out) base pages also mapped by another process
 *			(copy-on-write after fork) or merged by KSM, left
 *			mapped (ABI 2; moved with VMTIER_MIGRATE_SHARED)
 * @reserved:		(in) must be zero
 *
 * A range may span several VMAs. Overlapping ranges are allowed; their pages
 * are then counted in each (as on_target the second time). Every base page
 * of a fully processed range is in exactly one of the counts.
 */
struct vmtier_range {
	__u64 start;
	__u64 len;
	__u64 moved;
	__u64 on_target;
	__u64 skipped_hole;
	__u64 skipped_thp;
	__u64 skipped_busy;
	__u64 skipped_shared;
	__u64 failed;
	__u64 skipped_pinned;
	__u64 skipped_sharers;
	__u64 reserved;
};

/**
 * struct vmtier_migrate - argument of VMTIER_IOC_MIGRATE
 * @size:		(in) sizeof(struct vmtier_migrate) as the caller knows
 *			it; must equal the size encoded in the command
 * @flags:		(in) VMTIER_MIGRATE_* flags
 * @pid:		(in) target process id in the caller's pid namespace,
 *			0 for the caller itself
 * @node:		(in) destination NUMA node
 * @ranges:		(in) user pointer to an array of struct vmtier_range;
 *			the (out) fields are written back, also when the call
 *			stops early with -EINTR or -ESRCH
 * @nr_ranges:		(in) number of ranges, 1..VMTIER_MAX_RANGES
 * @engine:		(in) VMTIER_ENGINE_*
 * @workers:		(in) CPU threads or DMA channels, 0 for the default
 *			(CPU: min(4, housekeeping CPUs) or the cpu_workers
 *			module parameter)
 * @batch:		(in) base pages unmapped at a time, over all threads
 *			(mmap_lock is held per batch), 0 for
 *			VMTIER_DEFAULT_BATCH, at most VMTIER_MAX_BATCH; with
 *			the CPU engine each of N threads runs batches of
 *			batch / N pages
 * @engine_used:	(out) engine of the last batch that copied
 * @workers_used:	(out) CPU engine: threads (the calling one included)
 *			that copied; DMA: most channels (or CPU threads, on
 *			a fallback) that copied in one batch
 * @moved:		(out) sum of the ranges' moved
 * @skipped:		(out) sum of the ranges' skipped_*, on_target
 * @failed:		(out) sum of the ranges' failed
 * @dma_fallbacks:	(out) pages whose DMA copy failed or timed out and
 *			were copied by the CPU instead
 * @copy_ns:		(out) time spent allocating and copying, summed over
 *			the threads that run batches
 * @total_ns:		(out) wall time of the call
 * @reserved:		(in) must be zero
 * @unmapped:		(out) base pages handed to migrate_vma_setup(), which
 *			replaces their mappings by migration entries (and tells
 *			the MMU notifiers) for the copy, passing over holes and
 *			absent entries between them; pages found on the target,
 *			pinned, shared or under writeback, and THPs, are not
 *			(ABI 2)
 * @dma_abandoned:	(out) pages left in place because their DMA copy had
 *			neither completed nor could be stopped; their
 *			destination stays reserved until the engine finishes
 *			(ABI 2)
 * @batches:		(out) batches that unmapped something (ABI 2)
 * @unmap_ns:		(out) time spent unmapping (migrate_vma_setup()),
 *			summed like copy_ns (ABI 2)
 * @remap_ns:		(out) time spent remapping (migrate_vma_pages() and
 *			migrate_vma_finalize()), summed like copy_ns (ABI 2)
 *
 * Returns 0 when every range was processed (per-page outcomes are in the
 * ranges), or a negative errno: -EINVAL (bad argument, unknown flag or
 * engine, nonzero reserved, size field not matching the command), -E2BIG
 * (too many ranges, or a larger structure with nonzero extra bytes), -EFAULT
 * (bad pointer, or a range not fully mapped), -EOPNOTSUPP (a range covers a
 * VMA that is not private anonymous), -ESRCH (no such process, or it exited
 * during the call), -EPERM (no CAP_SYS_NICE, or no ptrace access to the
 * target), -ENODEV (node has no memory, or no DMA channel for
 * VMTIER_ENGINE_DMA), -EACCES (node not in the target's or the caller's
 * cpuset), -EINTR (a signal arrived; the ranges' counts are valid for what
 * was done, the batch in progress was put back unmoved).
 */
struct vmtier_migrate {
	__u64 size;
	__u64 flags;
	__u64 pid;
	__u64 node;
	__u64 ranges;
	__u64 nr_ranges;
	__u64 engine;
	__u64 workers;
	__u64 batch;
	__u64 engine_used;
	__u64 workers_used;
	__u64 moved;
	__u64 skipped;
	__u64 failed;
	__u64 dma_fallbacks;
	__u64 copy_ns;
	__u64 total_ns;
	__u64 reserved[4];
	/* ABI 2 */
	__u64 unmapped;
	__u64 dma_abandoned;
	__u64 batches;
	__u64 unmap_ns;
	__u64 remap_ns;
};

/* Size of the first version of struct vmtier_migrate (the smallest accepted). */
#define VMTIER_MIGRATE_SIZE_VER1	168

/**
 * struct vmtier_query - argument of VMTIER_IOC_QUERY
 * @size:		(in) sizeof(struct vmtier_query) as the caller knows it;
 *			must equal the size encoded in the command
 * @abi_version:	(out) VMTIER_ABI_VERSION
 * @engines:		(out) bit (1 << VMTIER_ENGINE_*) per usable engine
 * @max_ranges:		(out) VMTIER_MAX_RANGES
 * @max_batch:		(out) VMTIER_MAX_BATCH
 * @default_batch:	(out) VMTIER_DEFAULT_BATCH
 * @max_workers:	(out) most CPU copy threads a call may use
 * @nr_dma_chans:	(out) DMA_MEMCPY channels held (at most
 *			VMTIER_MAX_DMA_CHANS are named below)
 * @dma_names:		(out) NUL-terminated channel names (dma_chan_name())
 * @reserved:		(in) must be zero
 * @default_workers:	(out) CPU copy threads of a call with workers 0 (ABI 2)
 * @housekeeping_cpus:	(out) online CPUs copy threads may run on: not
 *			isolated (isolcpus, nohz_full, isolated cpuset
 *			partitions) (ABI 2)
 * @migrate_flags:	(out) VMTIER_MIGRATE_* flags this kernel knows (ABI 2)
 * @dma_drivers:	(out) NUL-terminated driver name of each channel's
 *			device, as dma_names (ABI 2)
 */
struct vmtier_query {
	__u64 size;
	__u64 abi_version;
	__u64 engines;
	__u64 max_ranges;
	__u64 max_batch;
	__u64 default_batch;
	__u64 max_workers;
	__u64 nr_dma_chans;
	char dma_names[VMTIER_MAX_DMA_CHANS][VMTIER_DMA_NAME_LEN];
	__u64 reserved[4];
	/* ABI 2 */
	__u64 default_workers;
	__u64 housekeeping_cpus;
	__u64 migrate_flags;
	char dma_drivers[VMTIER_MAX_DMA_CHANS][VMTIER_DMA_NAME_LEN];
};

/* Size of the first version of struct vmtier_query (the smallest accepted). */
#define VMTIER_QUERY_SIZE_VER1	352

#define VMTIER_IOC_MAGIC	0xB7
#define VMTIER_IOC_NR_QUERY	0x00
#define VMTIER_IOC_NR_MIGRATE	0x01
#define VMTIER_IOC_QUERY	_IOWR(VMTIER_IOC_MAGIC, VMTIER_IOC_NR_QUERY, \
				      struct vmtier_query)
#define VMTIER_IOC_MIGRATE	_IOWR(VMTIER_IOC_MAGIC, VMTIER_IOC_NR_MIGRATE, \
				      struct vmtier_migrate)

#endif /* _UAPI_LINUX_VMTIER_H */
