/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * vmtier: batched migration of a process's private anonymous memory between
 * NUMA nodes, with a multi-threaded CPU copy or DMA engine copy.
 *
 * This header is the whole ABI of /dev/vmtier. Every field is a fixed-size
 * __u64 (user pointers included) marked (in) or (out). Each ioctl structure
 * starts with its size, so that it can grow: the kernel accepts a smaller
 * (older) structure and a larger one whose extra bytes are zero. Flags the
 * kernel does not know and nonzero reserved fields are refused with -EINVAL.
 */
#ifndef _UAPI_LINUX_VMTIER_H
#define _UAPI_LINUX_VMTIER_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define VMTIER_ABI_VERSION	1

/* Copy engines (struct vmtier_migrate.engine). */
#define VMTIER_ENGINE_AUTO	0	/* the module picks per batch */
#define VMTIER_ENGINE_CPU	1	/* worker kthreads across CPUs/nodes */
#define VMTIER_ENGINE_DMA	2	/* dmaengine DMA_MEMCPY channels */
#define VMTIER_NR_ENGINES	3

/* struct vmtier_migrate.flags */
/*
 * Count pages of VMAs that this path cannot move (shared, file, hugetlb,
 * VM_IO/PFNMAP) as skipped_shared instead of failing with -EOPNOTSUPP.
 */
#define VMTIER_MIGRATE_SKIP_UNSUPPORTED	(1ULL << 0)
#define VMTIER_MIGRATE_FLAGS_ALL	VMTIER_MIGRATE_SKIP_UNSUPPORTED

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
 * @skipped_hole:	(out) base pages not populated (never touched, zero page)
 * @skipped_thp:	(out) base pages of PMD-mapped transparent huge pages,
 *			left whole (use move_pages(2) for them)
 * @skipped_busy:	(out) base pages busy, pinned, swapped out or in a
 *			PTE-mapped large folio; worth retrying later
 * @skipped_shared:	(out) base pages of VMAs this path cannot move
 *			(only with VMTIER_MIGRATE_SKIP_UNSUPPORTED)
 * @failed:		(out) base pages that could not move: no memory on the
 *			destination, or a copy error (machine check)
 * @reserved:		(in) must be zero
 *
 * A range may span several VMAs. Overlapping ranges are allowed; their pages
 * are then counted in each (as on_target the second time).
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
	__u64 reserved[3];
};

/**
 * struct vmtier_migrate - argument of VMTIER_IOC_MIGRATE
 * @size:		(in) sizeof(struct vmtier_migrate) as the caller knows it
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
 * @batch:		(in) base pages per batch (mmap_lock is held per batch),
 *			0 for VMTIER_DEFAULT_BATCH, at most VMTIER_MAX_BATCH
 * @engine_used:	(out) engine of the last batch that copied
 * @workers_used:	(out) threads or channels of that batch
 * @moved:		(out) sum of the ranges' moved
 * @skipped:		(out) sum of the ranges' skipped_* and on_target
 * @failed:		(out) sum of the ranges' failed
 * @dma_fallbacks:	(out) pages whose DMA copy failed or timed out and
 *			were copied by the CPU instead
 * @copy_ns:		(out) time spent allocating and copying
 * @total_ns:		(out) wall time of the call
 * @reserved:		(in) must be zero
 *
 * Returns 0 when every range was processed (per-page outcomes are in the
 * ranges), or a negative errno: -EINVAL (bad argument, unknown flag or
 * engine, nonzero reserved), -E2BIG (too many ranges, or a larger structure
 * with nonzero extra bytes), -EFAULT (bad pointer, or a range not fully
 * mapped), -EOPNOTSUPP (a range covers a VMA that is not private anonymous),
 * -ESRCH (no such process, or it exited during the call), -EPERM (no
 * CAP_SYS_NICE, or no ptrace access to the target), -ENODEV (node has no
 * memory, or no DMA channel for VMTIER_ENGINE_DMA), -EACCES (node not in the
 * target's cpuset), -EINTR (fatal signal; the ranges' counts are valid).
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
};

/**
 * struct vmtier_query - argument of VMTIER_IOC_QUERY
 * @size:		(in) sizeof(struct vmtier_query) as the caller knows it
 * @abi_version:	(out) VMTIER_ABI_VERSION
 * @engines:		(out) bit (1 << VMTIER_ENGINE_*) per usable engine
 * @max_ranges:		(out) VMTIER_MAX_RANGES
 * @max_batch:		(out) VMTIER_MAX_BATCH
 * @default_batch:	(out) VMTIER_DEFAULT_BATCH
 * @max_workers:	(out) CPU worker threads available
 * @nr_dma_chans:	(out) DMA_MEMCPY channels found (at most
 *			VMTIER_MAX_DMA_CHANS are named below)
 * @dma_names:		(out) NUL-terminated channel names (dma_chan_name())
 * @reserved:		(in) must be zero
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
};

#define VMTIER_IOC_MAGIC	0xB7
#define VMTIER_IOC_QUERY	_IOWR(VMTIER_IOC_MAGIC, 0x00, struct vmtier_query)
#define VMTIER_IOC_MIGRATE	_IOWR(VMTIER_IOC_MAGIC, 0x01, struct vmtier_migrate)

#endif /* _UAPI_LINUX_VMTIER_H */
