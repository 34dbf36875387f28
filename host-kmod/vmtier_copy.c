// SPDX-License-Identifier: GPL-2.0
/*
 * vmtier CPU copy engine: destination pages allocated and copied by a pool of
 * worker kthreads, one per online CPU, ordered so that the first workers of a
 * batch land on different NUMA nodes and on different cores before SMT
 * siblings are used.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/cpumask.h>
#include <linux/gfp.h>
#include <linux/highmem.h>
#include <linux/kthread.h>
#include <linux/llist.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/pagemap.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/topology.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "vmtier_priv.h"

/* Fewer entries than this per thread are not worth handing to a worker. */
#define VT_MIN_PAGES_PER_WORKER	32

struct vt_chunk {
	struct llist_node node;
	struct vmtier_batch *b;
	unsigned long from;
	unsigned long to;
	bool alloc;
	bool copy;
	atomic_t *pending;
	struct completion *done;
};

struct vt_worker {
	struct task_struct *task;
	struct llist_head queue;
	wait_queue_head_t wq;
	int cpu;
};

static struct vt_worker *vt_workers;
static unsigned int vt_nr_workers;

struct page *vmtier_alloc_dst(int nid)
{
	struct page *page;

	page = alloc_pages_node(nid, GFP_HIGHUSER_MOVABLE | __GFP_THISNODE |
				__GFP_NORETRY | __GFP_NOWARN, 0);
	if (!page)
		return NULL;
	lock_page(page);
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

static void vt_process(struct vmtier_batch *b, unsigned long from,
		       unsigned long to, bool alloc, bool copy)
{
	unsigned long i;

	for (i = from; i < to; i++) {
		if (b->state[i] != VT_PAGE_TODO)
			continue;
		if (alloc && !b->dpage[i]) {
			b->dpage[i] = vmtier_alloc_dst(b->nid);
			if (!b->dpage[i]) {
				b->state[i] = VT_PAGE_FAILED;
				atomic_long_inc(&b->nomem);
				continue;
			}
		}
		if (!copy)
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

static int vt_worker_fn(void *data)
{
	struct vt_worker *w = data;
	struct vt_chunk *c, *next;
	struct llist_node *list;

	while (!kthread_should_stop()) {
		wait_event_interruptible(w->wq, !llist_empty(&w->queue) ||
					 kthread_should_stop());
		list = llist_reverse_order(llist_del_all(&w->queue));
		llist_for_each_entry_safe(c, next, list, node) {
			vt_process(c->b, c->from, c->to, c->alloc, c->copy);
			/* c may be freed by its owner once pending drops to 0. */
			if (atomic_dec_and_test(c->pending))
				complete(c->done);
		}
	}
	return 0;
}

/**
 * vmtier_cpu_run() - allocate and/or copy the TODO entries of a batch
 * @b:		the batch
 * @threads:	threads to use, the calling one included
 * @alloc:	allocate missing destination pages
 * @copy:	copy the pages
 *
 * The caller takes the first share; the others go to pool workers that do not
 * run on the caller's CPU.
 */
static void vmtier_cpu_run(struct vmtier_batch *b, unsigned int threads,
			   bool alloc, bool copy)
{
	DECLARE_COMPLETION_ONSTACK(done);
	struct vt_chunk *chunks;
	atomic_t pending;
	unsigned long per, from;
	unsigned int k, w, me;

	threads = clamp_t(unsigned int, threads, 1, vt_nr_workers + 1);
	if (threads > 1 && b->npages / threads < VT_MIN_PAGES_PER_WORKER)
		threads = max_t(unsigned long, 1,
				b->npages / VT_MIN_PAGES_PER_WORKER);
	chunks = threads > 1 ? kcalloc(threads, sizeof(*chunks), GFP_KERNEL) :
			       NULL;
	if (!chunks) {
		vt_process(b, 0, b->npages, alloc, copy);
		return;
	}
	per = DIV_ROUND_UP(b->npages, threads);
	atomic_set(&pending, threads - 1);
	me = raw_smp_processor_id();
	w = 0;
	for (k = 1; k < threads; k++) {
		struct vt_worker *wk;

		/* Skip the worker sitting on the caller's CPU when possible. */
		if (vt_workers[w % vt_nr_workers].cpu == me &&
		    threads <= vt_nr_workers)
			w++;
		wk = &vt_workers[w++ % vt_nr_workers];
		from = min(b->npages, k * per);
		chunks[k] = (struct vt_chunk) {
			.b = b, .from = from, .to = min(b->npages, from + per),
			.alloc = alloc, .copy = copy,
			.pending = &pending, .done = &done,
		};
		if (llist_add(&chunks[k].node, &wk->queue))
			wake_up(&wk->wq);
	}
	vt_process(b, 0, min(b->npages, per), alloc, copy);
	wait_for_completion(&done);
	kfree(chunks);
}

void vmtier_cpu_copy(struct vmtier_batch *b, unsigned int threads, bool alloc)
{
	vmtier_cpu_run(b, threads, alloc, true);
}

unsigned long vmtier_alloc_batch(struct vmtier_batch *b)
{
	vmtier_cpu_run(b, vmtier_default_cpu_workers, true, false);
	return atomic_long_read(&b->nomem);
}

unsigned int vmtier_nr_workers(void)
{
	return min_t(unsigned int, vt_nr_workers + 1, VMTIER_MAX_WORKERS);
}

static bool vt_is_sibling(int cpu)
{
	return cpumask_first(topology_sibling_cpumask(cpu)) != cpu;
}

/*
 * Online CPUs in the order workers are handed out: round-robin over nodes,
 * the first SMT thread of every core before any sibling.
 */
static unsigned int vt_cpu_order(int *order, unsigned int max)
{
	unsigned int n = 0, round, r;
	int sibling, nid, cpu;
	bool any;

	for (sibling = 0; sibling < 2; sibling++) {
		for (round = 0, any = true; any && n < max; round++) {
			any = false;
			for_each_node_with_cpus(nid) {
				r = 0;
				for_each_cpu_and(cpu, cpumask_of_node(nid),
						 cpu_online_mask) {
					if (vt_is_sibling(cpu) != sibling ||
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

int vmtier_workers_init(void)
{
	unsigned int max = min_t(unsigned int, num_online_cpus(),
				 VMTIER_MAX_WORKERS - 1);
	int *order;
	unsigned int i, n;

	order = kcalloc(max, sizeof(*order), GFP_KERNEL);
	vt_workers = kcalloc(max, sizeof(*vt_workers), GFP_KERNEL);
	if (!order || !vt_workers) {
		kfree(order);
		kfree(vt_workers);
		return -ENOMEM;
	}
	n = vt_cpu_order(order, max);
	for (i = 0; i < n; i++) {
		struct vt_worker *w = &vt_workers[i];
		struct task_struct *t;

		init_llist_head(&w->queue);
		init_waitqueue_head(&w->wq);
		w->cpu = order[i];
		t = kthread_create_on_node(vt_worker_fn, w, cpu_to_node(w->cpu),
					   "vmtier/%d", w->cpu);
		if (IS_ERR(t))
			break;
		set_cpus_allowed_ptr(t, cpumask_of(w->cpu));
		w->task = t;
		wake_up_process(t);
		vt_nr_workers++;
	}
	kfree(order);
	if (!vt_nr_workers) {
		kfree(vt_workers);
		return -ENOMEM;
	}
	return 0;
}

void vmtier_workers_exit(void)
{
	unsigned int i;

	for (i = 0; i < vt_nr_workers; i++)
		kthread_stop(vt_workers[i].task);
	kfree(vt_workers);
	vt_nr_workers = 0;
}
