// SPDX-License-Identifier: GPL-2.0
/*
 * vmtier CPU copy engine: destination pages allocated and copied by the
 * calling thread and work items on an unbound workqueue. Unbound workers run
 * only on the workqueue's unbound cpumask, which excludes isolated CPUs
 * (isolcpus=, nohz_full=, isolated cpuset partitions); the work items of a
 * batch are queued to housekeeping CPUs spread over NUMA nodes and cores, so
 * that they land in different pods (LLCs) rather than beside the caller.
 *
 * The caller waits interruptibly; on a signal it raises the batch's abort
 * flag, cancels the shares that have not started and waits for the running
 * ones, which stop after their current page. Nothing a worker may still touch
 * is freed before it has finished.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/cpumask.h>
#include <linux/gfp.h>
#include <linux/highmem.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/pagemap.h>
#include <linux/sched.h>
#include <linux/sched/isolation.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/topology.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>

#include "vmtier_priv.h"

/* Fewer entries than this per thread are not worth handing to a worker. */
#define VT_MIN_PAGES_PER_WORKER	32
/* Entries a thread takes at a time from the batch's shared cursor. */
#define VT_GRAB			32
/* Default threads per call: min(this, housekeeping CPUs). */
#define VT_DEFAULT_THREADS	4

/* What the threads of one vmtier_cpu_run() share. */
struct vt_share {
	struct vmtier_batch *b;
	atomic_long_t next;	/* first entry nobody has taken yet */
	bool alloc;
	bool copy;
	atomic_t pending;	/* queued shares not finished */
	atomic_t worked;	/* threads that took entries */
	struct completion done;
};

struct vt_chunk {
	struct work_struct work;
	struct vt_share *sh;
};

static struct workqueue_struct *vt_wq;

struct page *vmtier_alloc_dst(int nid)
{
	struct page *page;

	page = alloc_pages_node(nid, GFP_HIGHUSER_MOVABLE | __GFP_THISNODE |
				__GFP_NORETRY | __GFP_NOWARN, 0);
	if (!page)
		return NULL;
	/* A fresh page nobody else can see: a plain lock is enough. */
	__folio_set_locked(page_folio(page));
	vt_stat_add(VT_STAT_DST_ALLOCATED, 1);
	return page;
}

void vmtier_free_dst(struct page *page)
{
	unlock_page(page);
	__free_page(page);
	vt_stat_add(VT_STAT_DST_FREED, 1);
}

/* Machine-check-safe copy of one base page; false if the source is poisoned. */
bool vmtier_copy_page(struct page *dst, struct page *src)
{
	void *d = kmap_local_page(dst);
	void *s = kmap_local_page(src);
	unsigned long left = copy_mc_to_kernel(d, s, PAGE_SIZE);

	kunmap_local(s);
	kunmap_local(d);
	return left == 0;
}

/* Destination pages for every TODO entry in [from, to) still without one. */
static void vt_alloc_range(struct vmtier_batch *b, unsigned long from,
			   unsigned long to)
{
	struct page *pages[64];
	unsigned long i = from;

	while (i < to) {
		unsigned long want = 0, got, k, j;

		memset(pages, 0, sizeof(pages));
		for (j = i; j < to && want < ARRAY_SIZE(pages); j++)
			want += b->state[j] == VT_PAGE_TODO && !b->dpage[j];
		got = want ? alloc_pages_bulk_array_node(GFP_HIGHUSER_MOVABLE |
							 __GFP_THISNODE |
							 __GFP_NORETRY |
							 __GFP_NOWARN,
							 b->nid, want, pages) : 0;
		for (k = 0; i < j; i++) {
			if (b->state[i] != VT_PAGE_TODO || b->dpage[i])
				continue;
			if (k < got && pages[k]) {
				__folio_set_locked(page_folio(pages[k]));
				vt_stat_add(VT_STAT_DST_ALLOCATED, 1);
				b->dpage[i] = pages[k++];
			} else {
				b->dpage[i] = vmtier_alloc_dst(b->nid);
			}
			if (!b->dpage[i]) {
				b->state[i] = VT_PAGE_FAILED;
				atomic_long_inc(&b->nomem);
			}
		}
		/* The bulk allocator fills in order; nothing is left over. */
		cond_resched();
	}
}

static void vt_process(struct vmtier_batch *b, unsigned long from,
		       unsigned long to, bool alloc, bool copy)
{
	unsigned long i;

	if (alloc)
		vt_alloc_range(b, from, to);
	if (!copy)
		return;
	for (i = from; i < to; i++) {
		if (READ_ONCE(b->abort))
			return;
		if (b->state[i] != VT_PAGE_TODO || !b->dpage[i])
			continue;
		if (vmtier_copy_page(b->dpage[i],
				     migrate_pfn_to_page(b->src[i]))) {
			b->state[i] = VT_PAGE_DONE;
		} else {
			b->state[i] = VT_PAGE_FAILED;
			atomic_long_inc(&b->mc_errors);
		}
		if (!((i - from) & 63))
			cond_resched();
	}
}

/*
 * Takes VT_GRAB entries at a time until none are left, so that a thread that
 * starts late or runs slowly (a busy CPU) leaves its part to the others.
 */
static void vt_share_run(struct vt_share *sh)
{
	struct vmtier_batch *b = sh->b;
	unsigned long from;
	bool took = false;

	for (;;) {
		if (READ_ONCE(b->abort))
			return;
		from = atomic_long_fetch_add(VT_GRAB, &sh->next);
		if (from >= b->npages)
			return;
		if (!took) {
			took = true;
			atomic_inc(&sh->worked);
		}
		vt_process(b, from, min(b->npages, from + VT_GRAB), sh->alloc,
			   sh->copy);
	}
}

static void vt_chunk_fn(struct work_struct *work)
{
	struct vt_chunk *c = container_of(work, struct vt_chunk, work);
	struct vt_share *sh = c->sh;

	vt_share_run(sh);
	/* c and sh may be gone once pending drops to 0. */
	if (atomic_dec_and_test(&sh->pending))
		complete(&sh->done);
}

/* Online CPUs that are not isolated: what copy threads may use. */
static bool vt_housekeeping(int cpu)
{
	return cpu_online(cpu) && !cpu_is_isolated(cpu) &&
	       housekeeping_cpu(cpu, HK_TYPE_WQ) &&
	       housekeeping_cpu(cpu, HK_TYPE_KTHREAD);
}

unsigned int vmtier_housekeeping_cpus(void)
{
	unsigned int n = 0;
	int cpu;

	for_each_online_cpu(cpu)
		n += vt_housekeeping(cpu);
	return n;
}

unsigned int vmtier_max_threads(void)
{
	return clamp_t(unsigned int, vmtier_housekeeping_cpus(), 1,
		       VMTIER_MAX_WORKERS);
}

unsigned int vmtier_default_threads(void)
{
	unsigned int n = READ_ONCE(vmtier_default_cpu_workers);

	if (!n)
		n = min_t(unsigned int, VT_DEFAULT_THREADS,
			  vmtier_housekeeping_cpus());
	return clamp_t(unsigned int, n, 1, vmtier_max_threads());
}

static bool vt_is_sibling(int cpu)
{
	return cpumask_first(topology_sibling_cpumask(cpu)) != cpu;
}

/*
 * Housekeeping CPUs other than @skip in the order shares are queued to:
 * round-robin over nodes, the first SMT thread of every core before any
 * sibling.
 */
static unsigned int vt_cpu_order(int *order, unsigned int max, int skip)
{
	unsigned int n = 0, round, r;
	int sibling, nid, cpu;
	bool any;

	for (sibling = 0; sibling < 2; sibling++) {
		for (round = 0, any = true; any && n < max; round++) {
			any = false;
			for_each_node_with_cpus(nid) {
				r = 0;
				for_each_cpu(cpu, cpumask_of_node(nid)) {
					if (cpu == skip || !vt_housekeeping(cpu) ||
					    vt_is_sibling(cpu) != sibling ||
					    r++ != round)
						continue;
					if (n < max)
						order[n++] = cpu;
					any = true;
					break;
				}
			}
		}
	}
	return n;
}

/**
 * vmtier_cpu_run() - allocate and/or copy the TODO entries of a batch
 * @b:		the batch; b->threads threads, the calling one included
 * @alloc:	allocate missing destination pages
 * @copy:	copy the pages
 *
 * The caller works alongside work items on the unbound workqueue, queued to
 * housekeeping CPUs other than the caller's; all take entries from a shared
 * cursor until the batch is done.
 *
 * Return: threads that took entries (at least 1).
 */
static unsigned int vmtier_cpu_run(struct vmtier_batch *b, bool alloc,
				   bool copy)
{
	struct vt_chunk *chunks = NULL;
	unsigned int k, threads, ncpu, worked;
	struct vt_share *sh;
	int *order = NULL;

	threads = clamp_t(unsigned int, b->threads, 1, vmtier_max_threads());
	if (threads > 1 && b->npages / threads < VT_MIN_PAGES_PER_WORKER)
		threads = max_t(unsigned long, 1,
				b->npages / VT_MIN_PAGES_PER_WORKER);
	sh = kzalloc(sizeof(*sh), GFP_KERNEL);
	if (sh && threads > 1) {
		chunks = kcalloc(threads, sizeof(*chunks), GFP_KERNEL);
		order = kcalloc(threads, sizeof(*order), GFP_KERNEL);
	}
	if (!sh || !chunks || !order) {
		kfree(chunks);
		kfree(order);
		kfree(sh);
		vt_process(b, 0, b->npages, alloc, copy);
		return 1;
	}
	sh->b = b;
	sh->alloc = alloc;
	sh->copy = copy;
	atomic_long_set(&sh->next, 0);
	atomic_set(&sh->pending, threads - 1);
	init_completion(&sh->done);
	ncpu = vt_cpu_order(order, threads - 1, raw_smp_processor_id());
	for (k = 1; k < threads; k++) {
		chunks[k].sh = sh;
		INIT_WORK(&chunks[k].work, vt_chunk_fn);
		if (ncpu)
			queue_work_on(order[(k - 1) % ncpu], vt_wq,
				      &chunks[k].work);
		else
			queue_work(vt_wq, &chunks[k].work);
	}
	vt_share_run(sh);
	if (wait_for_completion_interruptible(&sh->done)) {
		/* Signal: stop the shares, wait only for the running ones. */
		WRITE_ONCE(b->abort, true);
		for (k = 1; k < threads; k++)
			if (cancel_work(&chunks[k].work) &&
			    atomic_dec_and_test(&sh->pending))
				complete(&sh->done);
		wait_for_completion(&sh->done);
	}
	worked = atomic_read(&sh->worked);
	kfree(order);
	kfree(chunks);
	kfree(sh);
	return max(worked, 1U);
}

/**
 * vmtier_queue_spread() - queue work items as copy shares are queued
 * @works:	the work items, initialized
 * @n:		how many
 * @self:	the caller sleeps until they finish: its CPU may take one,
 *		after the others
 *
 * To housekeeping CPUs in vt_cpu_order(), on the module's unbound workqueue.
 */
void vmtier_queue_spread(struct work_struct **works, unsigned int n,
			 bool self)
{
	int cpu = raw_smp_processor_id();
	unsigned int k, ncpu = 0;
	int *order;

	order = kcalloc(n, sizeof(*order), GFP_KERNEL);
	if (order) {
		ncpu = vt_cpu_order(order, n, cpu);
		if (self && ncpu < n && vt_housekeeping(cpu))
			order[ncpu++] = cpu;
	}
	for (k = 0; k < n; k++) {
		if (ncpu)
			queue_work_on(order[k % ncpu], vt_wq, works[k]);
		else
			queue_work(vt_wq, works[k]);
	}
	kfree(order);
}

unsigned int vmtier_cpu_copy(struct vmtier_batch *b, bool alloc)
{
	return vmtier_cpu_run(b, alloc, true);
}

void vmtier_alloc_batch(struct vmtier_batch *b)
{
	vmtier_cpu_run(b, true, false);
}

int vmtier_workers_init(void)
{
	vt_wq = alloc_workqueue("vmtier_copy", WQ_UNBOUND, VMTIER_MAX_WORKERS);
	return vt_wq ? 0 : -ENOMEM;
}

void vmtier_workers_exit(void)
{
	destroy_workqueue(vt_wq);
}
