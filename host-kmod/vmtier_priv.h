/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vmtier: internal declarations shared by the module's files.
 */
#ifndef _VMTIER_H
#define _VMTIER_H

#include <linux/atomic.h>
#include <linux/mm_types.h>
#include <linux/types.h>
#include <linux/workqueue.h>
#include <uapi/linux/vmtier.h>

/* Per-page copy result, one byte per entry of a batch. */
enum vmtier_copy_state {
	VT_PAGE_NONE = 0,	/* nothing to copy */
	VT_PAGE_TODO,		/* destination allocated, copy pending */
	VT_PAGE_DONE,		/* copied */
	VT_PAGE_FAILED,		/* copy failed (poison) or no memory */
	VT_PAGE_GIVEN_UP,	/* left in place: DMA may still run, or aborted */
};

/**
 * struct vmtier_batch - one batch of base pages being copied
 * @src:	migrate_vma source entries
 * @dst:	migrate_vma destination entries, filled after the copy
 * @dpage:	destination page allocated for each entry, locked
 * @state:	enum vmtier_copy_state per entry
 * @npages:	entries
 * @nid:	destination node
 * @threads:	CPU threads (the caller included) for allocation and copy
 * @abort:	set when the caller got a signal: workers stop, entries not
 *		done are given up
 * @nomem:	entries whose destination could not be allocated
 * @mc_errors:	entries whose copy hit a machine check
 */
struct vmtier_batch {
	unsigned long *src;
	unsigned long *dst;
	struct page **dpage;
	u8 *state;
	unsigned long npages;
	int nid;
	unsigned int threads;
	bool abort;
	atomic_long_t nomem;
	atomic_long_t mc_errors;
};

/* Counters exported in debugfs (vmtier/stats). */
enum vmtier_stat {
	VT_STAT_CALLS,
	VT_STAT_CALLS_FAILED,
	VT_STAT_ACTIVE,
	VT_STAT_BATCHES,
	VT_STAT_WORKER_BATCHES,
	VT_STAT_UNMAPPED,
	VT_STAT_MOVED,
	VT_STAT_ON_TARGET,
	VT_STAT_SKIP_HOLE,
	VT_STAT_SKIP_THP,
	VT_STAT_SKIP_BUSY,
	VT_STAT_SKIP_SHARED,
	VT_STAT_SKIP_PINNED,
	VT_STAT_SKIP_SHARERS,
	VT_STAT_SKIP_WRITEBACK,
	VT_STAT_WRITEBACK_UNMAPPED,
	VT_STAT_FAILED,
	VT_STAT_NOMEM,
	VT_STAT_MC_ERRORS,
	VT_STAT_CPU_PAGES,
	VT_STAT_DMA_PAGES,
	VT_STAT_DMA_ERRORS,
	VT_STAT_DMA_TIMEOUTS,
	VT_STAT_DMA_TERMINATE_FAILED,
	VT_STAT_DMA_FALLBACKS,
	VT_STAT_DMA_ABANDONED,
	VT_STAT_DMA_ABANDONED_LIVE,
	VT_STAT_DMA_CHANS_HELD,
	VT_STAT_DMA_CHANS_SICK,
	VT_STAT_DMA_CHAN_REQUESTS,
	VT_STAT_DST_ALLOCATED,
	VT_STAT_DST_FREED,
	VT_STAT_DST_PLACED_FAILED,
	VT_STAT_DST_ABANDONED_FREED,
	VT_STAT_ABORTED_PAGES,
	VT_STAT_INTERRUPTED,
	VT_STAT_TARGET_EXITED,
	VT_NR_STATS,
};

extern atomic64_t vmtier_stats[VT_NR_STATS];

static inline void vt_stat_add(enum vmtier_stat s, long v)
{
	atomic64_add(v, &vmtier_stats[s]);
}

/* Module parameters. */
extern unsigned int vmtier_dma_timeout_ms;
extern unsigned int vmtier_dma_idle_ms;
extern unsigned int vmtier_auto_dma_min_pages;
extern unsigned int vmtier_default_cpu_workers;
extern bool vmtier_prefilter;

/* vmtier_migrate.c */
int vmtier_do_migrate(struct vmtier_migrate *arg, struct vmtier_range *ranges);

/* vmtier_copy.c: CPU engine */
int vmtier_workers_init(void);
void vmtier_workers_exit(void);
unsigned int vmtier_housekeeping_cpus(void);
unsigned int vmtier_max_threads(void);
unsigned int vmtier_default_threads(void);
struct page *vmtier_alloc_dst(int nid);
void vmtier_free_dst(struct page *page);
bool vmtier_copy_page(struct page *dst, struct page *src);
unsigned int vmtier_cpu_copy(struct vmtier_batch *b, bool alloc);
void vmtier_queue_spread(struct work_struct **works, unsigned int n,
			 bool self);
void vmtier_alloc_batch(struct vmtier_batch *b);

/* vmtier_dma.c: DMA engine */
struct vmtier_dma_result {
	unsigned int chans;		/* channels used */
	unsigned long copied;		/* entries copied by DMA */
	unsigned long fallbacks;	/* entries left TODO for the CPU */
	unsigned long abandoned;	/* entries given up (VT_PAGE_GIVEN_UP) */
};

int vmtier_dma_init(void);
void vmtier_dma_exit(void);
bool vmtier_dma_available(void);
bool vmtier_dma_copy(struct vmtier_batch *b, unsigned int want,
		     struct vmtier_dma_result *res);
int vmtier_dma_query(struct vmtier_query *q);

#endif /* _VMTIER_H */
