// SPDX-License-Identifier: GPL-2.0
/*
 * vmtier migration: a target's private anonymous ranges are moved in batches
 * with the exported device-migration API (migrate_vma_setup() on system
 * memory), the copy done by the CPU or DMA engine in between:
 *
 *   mmap_read_lock -> classify PMDs (holes and THPs left out) and read the
 *   PTEs (pages on the target, pinned, shared or under writeback left
 *   mapped) -> migrate_vma_setup (unmap) per run of pages to move ->
 *   allocate + copy the whole batch -> migrate_vma_pages +
 *   migrate_vma_finalize (remap) -> mmap_read_unlock -> next batch
 *
 * The page-table read is a hint that decides what is worth unmapping; what
 * migrate_vma_setup() returns, with the source pages locked, decides what is
 * copied.
 *
 * With the CPU engine a call runs on several threads ("lanes"): work items
 * queued to housekeeping CPUs each take chunks of the ranges from a shared
 * cursor and run the whole pipeline above for their own batches, each taking
 * mmap_lock for read itself, while the caller waits. Unmap and remap cost as
 * much as the copy, so splitting only the copy would leave most of the work
 * on one thread. No thread waits for another while holding mmap_lock: a read
 * lock taken behind a queued writer would then deadlock. The caller never
 * frees what a lane may still touch: it waits for every lane, and on a
 * signal first tells them to stop after their current page.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpuset.h>
#include <linux/cred.h>
#include <linux/ktime.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/nodemask.h>
#include <linux/page-flags.h>
#include <linux/pgtable.h>
#include <linux/pid.h>
#include <linux/rcupdate.h>
#include <linux/sched/coredump.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/swapops.h>
#include <linux/vmstat.h>

#include "vmtier_priv.h"

/* Owner cookie passed to MMU notifiers: unique to this module. */
static const char vt_owner_cookie;

/* migrate_vma_setup() calls per batch at most; a batch ends early past it. */
#define VT_MAX_RUNS	64

enum vt_pmd_kind { VT_PMD_HOLE, VT_PMD_THP, VT_PMD_BUSY, VT_PMD_PTE };

/*
 * What the page-table read found for one base page. The first group may sit
 * inside a run handed to migrate_vma_setup(), which skips them without
 * unmapping anything; the second group must stay out of every run.
 */
enum vt_class {
	VT_C_MOVE,		/* to be moved */
	VT_C_HOLE,		/* pte_none or the zero page */
	VT_C_NOTPRESENT,	/* swap or migration entry */
	VT_C_LARGE,		/* PTE-mapped large folio */
	VT_C_ON_TARGET,
	VT_C_PINNED,
	VT_C_SHARERS,
	VT_C_WRITEBACK,
	VT_C_THP,		/* PMD-mapped THP: setup would split it */
	VT_C_PMD_HOLE,		/* empty PMD: a THP may be faulted in there */
	VT_C_PMD_BUSY,		/* PMD neither a table nor a THP */
};

static bool vt_class_in_run(u8 cls)
{
	return cls <= VT_C_LARGE;
}

/* What one lane did, merged into the call's struct vmtier_migrate at the end. */
struct vt_out {
	u64 unmapped;
	u64 batches;
	u64 unmap_ns;
	u64 copy_ns;
	u64 remap_ns;
	u64 dma_fallbacks;
	u64 dma_abandoned;
	u64 workers_used;
	u64 engine_used;	/* 0 until a batch of the lane copied */
};

struct vt_ctx;

/* One thread's share of a call: the caller's or a work item's. */
struct vt_lane {
	struct vt_ctx *c;
	struct work_struct work;
	bool worker;		/* a work item, not the calling thread */
	struct vt_out out;
	struct vmtier_batch b;
	struct migrate_vma runs[VT_MAX_RUNS];
};

/* A call: read-only while the lanes run, except the cursor and the results. */
struct vt_ctx {
	struct vmtier_migrate *arg;	/* (in) fields only until the end */
	struct vmtier_range *ranges;
	unsigned long nr_ranges;
	struct task_struct *task;
	struct task_struct *caller;	/* waits for the lanes: stays valid */
	struct mm_struct *mm;
	int nid;
	unsigned long batch;		/* pages per batch of one lane */
	unsigned long chunk;		/* pages a lane takes at a time */
	unsigned int cpu_threads;	/* copy threads of one batch */
	unsigned int nlanes;
	bool dma;
	struct vt_lane *lanes;
	spinlock_t lock;		/* the cursor, ranges' (out), err */
	unsigned long ri;		/* cursor: range index and address */
	unsigned long addr;
	int err;			/* first error of any lane */
	bool abort;			/* lanes stop after their batch */
	atomic_t pending;		/* queued lanes not finished */
	struct completion done;
};

/*
 * The checks of __ptrace_may_access(PTRACE_MODE_READ_REALCREDS), which is not
 * exported: same thread group, or matching real credentials or CAP_SYS_PTRACE
 * in the target's user namespace, and a dumpable mm unless CAP_SYS_PTRACE.
 * The LSM hooks (security_ptrace_access_check(), security_task_movememory())
 * are not exported either: the device is root-only, the caller needs
 * CAP_SYS_NICE on top, and vmtier's userspace runs the kernel's own checks
 * with a zero-page move_pages(2) first (docs/kmod.md).
 */
static bool vt_may_access(struct task_struct *task)
{
	const struct cred *cred, *tcred;
	struct mm_struct *mm;
	bool ok;

	if (same_thread_group(task, current))
		return true;
	rcu_read_lock();
	cred = current_cred();
	tcred = __task_cred(task);
	ok = uid_eq(cred->uid, tcred->euid) && uid_eq(cred->uid, tcred->suid) &&
	     uid_eq(cred->uid, tcred->uid) && gid_eq(cred->gid, tcred->egid) &&
	     gid_eq(cred->gid, tcred->sgid) && gid_eq(cred->gid, tcred->gid);
	if (!ok)
		ok = ns_capable(tcred->user_ns, CAP_SYS_PTRACE);
	rcu_read_unlock();
	if (!ok)
		return false;
	task_lock(task);
	mm = task->mm;
	if (mm && get_dumpable(mm) != SUID_DUMP_USER &&
	    !ns_capable(mm->user_ns, CAP_SYS_PTRACE))
		ok = false;
	task_unlock(task);
	return ok;
}

/*
 * The node must be allowed by the target's cpuset (its mems_allowed, what its
 * allocator honours; cpuset_mems_allowed() is not exported) and by the
 * caller's, whose allocations the copy threads make on its behalf.
 */
static bool vt_node_allowed(struct task_struct *task,
			    struct task_struct *caller, int nid)
{
	bool ok;

	task_lock(task);
	ok = node_isset(nid, task->mems_allowed);
	task_unlock(task);
	if (ok && task != caller) {
		task_lock(caller);
		ok = node_isset(nid, caller->mems_allowed);
		task_unlock(caller);
	}
	return ok;
}

/* Private anonymous and nothing else: shared/file/hugetlb/IO/DAX are refused. */
static bool vt_vma_ok(struct vm_area_struct *vma)
{
	if (!vma_is_anonymous(vma))
		return false;
	if (vma->vm_flags & (VM_SHARED | VM_IO | VM_PFNMAP | VM_MIXEDMAP |
			     VM_HUGETLB))
		return false;
	return !vma_is_dax(vma);
}

static bool vt_target_gone(struct vt_ctx *c)
{
	return (READ_ONCE(c->task->flags) & PF_EXITING) ||
	       atomic_read(&c->mm->mm_users) <= 1;
}

/* What the PMD covering addr maps; read locklessly under mmap_read_lock. */
static enum vt_pmd_kind vt_pmd_kind(struct mm_struct *mm, unsigned long addr,
				    pmd_t **pmdpp)
{
	pgd_t *pgd = pgd_offset(mm, addr);
	p4d_t *p4d;
	pud_t *pud, pudv;
	pmd_t pmdv, *pmdp;

	if (pgd_none(READ_ONCE(*pgd)) || pgd_bad(READ_ONCE(*pgd)))
		return VT_PMD_HOLE;
	p4d = p4d_offset(pgd, addr);
	if (p4d_none(READ_ONCE(*p4d)) || p4d_bad(READ_ONCE(*p4d)))
		return VT_PMD_HOLE;
	pud = pud_offset(p4d, addr);
	pudv = READ_ONCE(*pud);
	if (pud_none(pudv))
		return VT_PMD_HOLE;
	if (pud_leaf(pudv))
		return VT_PMD_THP;
	if (!pud_present(pudv) || pud_bad(pudv))
		return VT_PMD_BUSY;
	pmdp = pmd_offset(pud, addr);
	pmdv = pmdp_get_lockless(pmdp);
	if (pmd_none(pmdv))
		return VT_PMD_HOLE;
	if (pmd_trans_huge(pmdv) || pmd_devmap(pmdv) || pmd_leaf(pmdv))
		return VT_PMD_THP;
	if (!pmd_present(pmdv))
		return is_pmd_migration_entry(pmdv) ? VT_PMD_THP : VT_PMD_BUSY;
	*pmdpp = pmdp;
	return VT_PMD_PTE;
}

/* What one present or absent PTE maps, as far as a lockless read can tell. */
static u8 vt_pte_class(struct vt_ctx *c, pte_t pte)
{
	bool prefilter = READ_ONCE(vmtier_prefilter);
	struct folio *folio;
	struct page *page;
	unsigned long pfn;

	if (pte_none(pte))
		return VT_C_HOLE;
	if (!pte_present(pte))
		return VT_C_NOTPRESENT;
	pfn = pte_pfn(pte);
	if (is_zero_pfn(pfn))
		return VT_C_HOLE;
	if (!pfn_valid(pfn))
		return VT_C_NOTPRESENT;
	page = pfn_to_page(pfn);
	folio = page_folio(page);
	if (folio_test_large(folio))
		return VT_C_LARGE;
	/* The node of a pfn never changes: this read needs no reference. */
	if (prefilter && page_to_nid(page) == c->nid)
		return VT_C_ON_TARGET;
	/* Sharers are only seen here: setup unmaps them from every process. */
	if (!(c->arg->flags & VMTIER_MIGRATE_SHARED) &&
	    (folio_test_ksm(folio) || folio_mapcount(folio) > 1))
		return VT_C_SHARERS;
	if (!prefilter)
		return VT_C_MOVE;
	if (folio_maybe_dma_pinned(folio))
		return VT_C_PINNED;
	if (folio_test_writeback(folio))
		return VT_C_WRITEBACK;
	return VT_C_MOVE;
}

/*
 * Classifies the PTEs of [addr, end), all under one PMD, into cls[]. The PTE
 * table is read as __pte_offset_map() does (not exported): under RCU, from a
 * PMD value read once and checked to point to a table. mmap_lock is held for
 * read, so an anonymous VMA's PTE table cannot be freed under us (6.12 frees
 * them only with mmap_lock held for write, or for file VMAs). Returns false
 * if the PMD no longer points to a table.
 */
static bool vt_read_ptes(struct vt_ctx *c, pmd_t *pmdp, unsigned long addr,
			 unsigned long end, u8 *cls)
{
	pmd_t pmdv;
	pte_t *ptep;
	unsigned long i = 0;

	rcu_read_lock();
	pmdv = pmdp_get_lockless(pmdp);
	if (pmd_none(pmdv) || !pmd_present(pmdv) || pmd_trans_huge(pmdv) ||
	    pmd_devmap(pmdv) || pmd_leaf(pmdv) || pmd_bad(pmdv)) {
		rcu_read_unlock();
		return false;
	}
	ptep = __pte_map(&pmdv, addr);
	for (; addr < end; addr += PAGE_SIZE, i++)
		cls[i] = vt_pte_class(c, ptep_get_lockless(ptep + i));
	pte_unmap(ptep);
	return true;
}

static void vt_count_class(struct vmtier_range *r, u8 cls)
{
	switch (cls) {
	case VT_C_HOLE:
		r->skipped_hole++;
		break;
	case VT_C_ON_TARGET:
		r->on_target++;
		break;
	case VT_C_PINNED:
		r->skipped_pinned++;
		break;
	case VT_C_SHARERS:
		r->skipped_sharers++;
		break;
	case VT_C_THP:
		r->skipped_thp++;
		break;
	case VT_C_PMD_HOLE:
		r->skipped_hole++;
		break;
	case VT_C_WRITEBACK:
		vt_stat_add(VT_STAT_SKIP_WRITEBACK, 1);
		fallthrough;
	default:
		r->skipped_busy++;
		break;
	}
}

/* Copies the TODO entries of the batch with the chosen engine. */
static void vt_copy_batch(struct vt_lane *l, unsigned long todo)
{
	struct vt_ctx *c = l->c;
	struct vmtier_migrate *arg = c->arg;
	struct vt_out *out = &l->out;
	struct vmtier_batch *b = &l->b;
	unsigned int engine = arg->engine;
	struct vmtier_dma_result res;
	unsigned long i;

	if (engine == VMTIER_ENGINE_AUTO)
		engine = c->dma && todo >= vmtier_auto_dma_min_pages ?
			 VMTIER_ENGINE_DMA : VMTIER_ENGINE_CPU;
	if (engine == VMTIER_ENGINE_DMA) {
		vmtier_alloc_batch(b);
		if (READ_ONCE(b->abort))
			return;		/* signal: the batch is put back */
		if (vmtier_dma_copy(b, arg->engine == VMTIER_ENGINE_DMA &&
				    arg->workers ? arg->workers :
				    VMTIER_MAX_DMA_CHANS, &res)) {
			if (res.fallbacks) {
				/* DMA errors, timeouts: the CPU copies those. */
				vmtier_cpu_copy(b, false);
				out->dma_fallbacks += res.fallbacks;
				vt_stat_add(VT_STAT_DMA_FALLBACKS,
					    res.fallbacks);
			}
			out->dma_abandoned += res.abandoned;
			vt_stat_add(VT_STAT_DMA_PAGES, res.copied);
			out->engine_used = VMTIER_ENGINE_DMA;
			out->workers_used = max_t(u64, out->workers_used,
						  res.chans);
			return;
		}
		/* No channel after all (provider gone): the CPU does it. */
	}
	out->workers_used = max_t(u64, out->workers_used,
				  vmtier_cpu_copy(b, true));
	out->engine_used = VMTIER_ENGINE_CPU;
	for (i = 0; i < b->npages; i++)
		if (b->state[i] == VT_PAGE_DONE)
			vt_stat_add(VT_STAT_CPU_PAGES, 1);
}

/*
 * Collects [start, end) of one VMA into runs for migrate_vma_setup(): runs
 * span pages to move and the cheap entries between them; pages that must not
 * be unmapped end a run. The page-table read is done per PMD into a
 * classification kept in the batch's state array. Returns the address up to
 * which the batch was classified (earlier than end when the runs ran out)
 * and the pages of the runs in *npagesp.
 */
static unsigned long vt_collect(struct vt_lane *l, struct vm_area_struct *vma,
				unsigned long start, unsigned long end,
				struct vmtier_range *r, unsigned long *nrunsp,
				unsigned long *npagesp)
{
	struct vt_ctx *c = l->c;
	struct vmtier_batch *b = &l->b;
	u8 *cls = b->state;	/* reused: classification, then copy state */
	unsigned long addr, next, n, i, j, npages = 0, nruns = 0;
	unsigned long run_start = 0, run_end = 0;	/* page indices */
	bool in_run = false;
	pmd_t *pmdp;

	for (addr = start; addr < end; addr = next) {
		enum vt_pmd_kind kind = vt_pmd_kind(c->mm, addr, &pmdp);
		unsigned long base = (addr - start) >> PAGE_SHIFT;

		next = min(end, pmd_addr_end(addr, end));
		n = (next - addr) >> PAGE_SHIFT;
		if (kind == VT_PMD_PTE && !vt_read_ptes(c, pmdp, addr, next,
							cls + base))
			kind = VT_PMD_BUSY;
		switch (kind) {
		case VT_PMD_HOLE:
			memset(cls + base, VT_C_PMD_HOLE, n);
			break;
		case VT_PMD_THP:
			memset(cls + base, VT_C_THP, n);
			break;
		case VT_PMD_BUSY:
			memset(cls + base, VT_C_PMD_BUSY, n);
			break;
		case VT_PMD_PTE:
			break;
		}
		for (i = base; i < base + n; i++) {
			if (cls[i] == VT_C_MOVE) {
				if (!in_run) {
					if (nruns == VT_MAX_RUNS) {
						/* Out of runs: stop here. */
						end = start + (i << PAGE_SHIFT);
						goto out;
					}
					in_run = true;
					run_start = i;
				}
				run_end = i + 1;
				continue;
			}
			if (in_run && vt_class_in_run(cls[i]))
				continue;	/* decided after the run ends */
			if (in_run) {
				/* A page that must stay mapped ends the run. */
				l->runs[nruns++] = (struct migrate_vma) {
					.start = start + (run_start << PAGE_SHIFT),
					.end = start + (run_end << PAGE_SHIFT),
				};
				npages += run_end - run_start;
				in_run = false;
				/* Cheap entries after the run's last page. */
				for (j = run_end; j < i; j++)
					vt_count_class(r, cls[j]);
			}
			vt_count_class(r, cls[i]);
		}
	}
out:
	if (in_run) {
		l->runs[nruns++] = (struct migrate_vma) {
			.start = start + (run_start << PAGE_SHIFT),
			.end = start + (run_end << PAGE_SHIFT),
		};
		npages += run_end - run_start;
		for (j = run_end; j < ((end - start) >> PAGE_SHIFT); j++)
			vt_count_class(r, cls[j]);
	}
	/* Lay the runs out back to back in src/dst. */
	for (i = 0, n = 0; i < nruns; i++) {
		struct migrate_vma *m = &l->runs[i];

		m->vma = vma;
		m->src = b->src + n;
		m->dst = b->dst + n;
		m->pgmap_owner = (void *)&vt_owner_cookie;
		m->flags = MIGRATE_VMA_SELECT_SYSTEM;
		n += (m->end - m->start) >> PAGE_SHIFT;
	}
	*nrunsp = nruns;
	*npagesp = npages;
	return end;
}

/* What setup returned for one entry; decides whether it is copied. */
static void vt_classify_src(struct vt_lane *l, unsigned long i,
			    struct vmtier_range *r, unsigned long *todo)
{
	struct vt_ctx *c = l->c;
	struct vmtier_batch *b = &l->b;
	unsigned long s = b->src[i];
	struct folio *folio;

	b->dst[i] = 0;
	b->dpage[i] = NULL;
	b->state[i] = VT_PAGE_NONE;
	if (!(s & MIGRATE_PFN_MIGRATE)) {
		r->skipped_busy++;
		return;
	}
	if (!(s & MIGRATE_PFN_VALID)) {
		r->skipped_hole++;	/* pte_none or zero page: dst stays 0 */
		return;
	}
	/* The source is locked and unmapped: these flags are stable now. */
	folio = page_folio(migrate_pfn_to_page(s));
	if (folio_test_writeback(folio)) {
		/*
		 * A swap-cache folio re-mapped by a fault while its swap-out
		 * write still runs: __migrate_device_pages() would hit
		 * BUG_ON(folio_test_writeback()). With dst 0 it is put back.
		 */
		r->skipped_busy++;
		vt_stat_add(VT_STAT_SKIP_WRITEBACK, 1);
		vt_stat_add(VT_STAT_WRITEBACK_UNMAPPED, 1);
	} else if (folio_test_ksm(folio) &&
		   !(c->arg->flags & VMTIER_MIGRATE_SHARED)) {
		r->skipped_sharers++;	/* merged since the page-table read */
	} else if (folio_nid(folio) == c->nid) {
		r->on_target++;		/* dst 0: finalize restores it */
	} else {
		b->state[i] = VT_PAGE_TODO;
		(*todo)++;
	}
}

/*
 * One batch [start, end) inside one VMA, mmap_lock held for read. Returns
 * the address the next batch starts at.
 */
static unsigned long vt_migrate_batch(struct vt_lane *l,
				      struct vm_area_struct *vma,
				      unsigned long start, unsigned long end,
				      struct vmtier_range *r)
{
	struct vt_out *out = &l->out;
	struct vmtier_batch *b = &l->b;
	unsigned long npages, nruns, i, todo = 0, moved = 0, failed = 0;
	unsigned long given_up = 0, unmapped = 0;
	u64 t0;
	int k;

	atomic_long_set(&b->nomem, 0);
	atomic_long_set(&b->mc_errors, 0);
	end = vt_collect(l, vma, start, end, r, &nruns, &npages);
	if (!nruns)
		return end;

	/* Unmap: migration entries replace the PTEs of the pages collected. */
	t0 = ktime_get_ns();
	for (k = 0; k < nruns; k++) {
		struct migrate_vma *m = &l->runs[k];
		unsigned long want = (m->end - m->start) >> PAGE_SHIFT;

		if (migrate_vma_setup(m) || m->npages != want) {
			/*
			 * Refused, or the walk stopped short: what it did
			 * isolate is put back by finalize; every entry counts
			 * as busy and none is copied.
			 */
			if (m->npages > want)	/* cannot happen; be safe */
				m->npages = want;
			for (i = 0; i < m->npages; i++)
				m->dst[i] = 0;
			migrate_vma_pages(m);
			migrate_vma_finalize(m);
			memset(m->src, 0, want * sizeof(*m->src));
			m->npages = 0;
		}
		unmapped += m->npages;
	}
	out->unmap_ns += ktime_get_ns() - t0;

	b->npages = npages;
	for (i = 0; i < npages; i++)
		vt_classify_src(l, i, r, &todo);
	out->unmapped += unmapped;
	vt_stat_add(VT_STAT_UNMAPPED, unmapped);

	/* Copy. */
	if (todo) {
		t0 = ktime_get_ns();
		vt_copy_batch(l, todo);
		out->copy_ns += ktime_get_ns() - t0;
	}

	/* Place the copies; free what cannot be placed. */
	for (i = 0; i < npages; i++) {
		switch (b->state[i]) {
		case VT_PAGE_DONE:
			b->dst[i] = migrate_pfn(page_to_pfn(b->dpage[i]));
			break;
		case VT_PAGE_FAILED:
			if (b->dpage[i])
				vmtier_free_dst(b->dpage[i]);
			failed++;
			break;
		case VT_PAGE_GIVEN_UP:
			/* The DMA side owns an abandoned destination. */
			if (b->dpage[i])
				vmtier_free_dst(b->dpage[i]);
			given_up++;
			break;
		case VT_PAGE_TODO:
			/* Not copied: the copy was aborted by a signal. */
			if (b->dpage[i])
				vmtier_free_dst(b->dpage[i]);
			vt_stat_add(VT_STAT_ABORTED_PAGES, 1);
			given_up++;
			break;
		default:
			break;
		}
	}

	/* Remap: the new pages replace the old in the page tables. */
	t0 = ktime_get_ns();
	for (k = 0; k < nruns; k++)
		if (l->runs[k].npages)
			migrate_vma_pages(&l->runs[k]);
	for (i = 0; i < npages; i++) {
		if (!b->dst[i])
			continue;
		if (b->src[i] & MIGRATE_PFN_MIGRATE) {
			moved++;
		} else {
			failed++;	/* finalize frees the destination */
			vt_stat_add(VT_STAT_DST_PLACED_FAILED, 1);
		}
	}
	for (k = 0; k < nruns; k++)
		if (l->runs[k].npages)
			migrate_vma_finalize(&l->runs[k]);
	out->remap_ns += ktime_get_ns() - t0;

	r->moved += moved;
	r->failed += failed;
	r->skipped_busy += given_up;
	out->batches++;
	if (l->worker)
		vt_stat_add(VT_STAT_WORKER_BATCHES, 1);
	count_vm_events(PGMIGRATE_SUCCESS, moved);
	count_vm_events(PGMIGRATE_FAIL, failed);
	vt_stat_add(VT_STAT_NOMEM, atomic_long_read(&b->nomem));
	vt_stat_add(VT_STAT_MC_ERRORS, atomic_long_read(&b->mc_errors));
	vt_stat_add(VT_STAT_BATCHES, 1);
	return end;
}

/* Every range: aligned, inside the target's address space, fully mapped, and
 * private anonymous unless skipped.
 */
static int vt_validate(struct vt_ctx *c, struct vmtier_range *ranges,
		       unsigned long nr)
{
	unsigned long i, addr, end, task_size = c->mm->task_size;
	struct vm_area_struct *vma;
	int ret = 0;

	for (i = 0; i < nr; i++) {
		struct vmtier_range *r = &ranges[i];

		if (r->reserved)
			return -EINVAL;
		if (!r->len || !PAGE_ALIGNED(r->start) || !PAGE_ALIGNED(r->len) ||
		    r->start + r->len < r->start || r->start + r->len > task_size)
			return -EINVAL;
	}
	if (mmap_read_lock_killable(c->mm))
		return -EINTR;
	for (i = 0; i < nr && !ret; i++) {
		addr = ranges[i].start;
		end = addr + ranges[i].len;
		while (addr < end) {
			vma = vma_lookup(c->mm, addr);
			if (!vma) {
				ret = -EFAULT;
				break;
			}
			if (!vt_vma_ok(vma) &&
			    !(c->arg->flags & VMTIER_MIGRATE_SKIP_UNSUPPORTED)) {
				ret = -EOPNOTSUPP;
				break;
			}
			addr = vma->vm_end;
		}
	}
	mmap_read_unlock(c->mm);
	return ret;
}

/*
 * The next chunk of the ranges for a lane: [*startp, *endp) of range *rip,
 * at most c->chunk pages. False when none is left or the call is stopping.
 */
static bool vt_next_chunk(struct vt_ctx *c, unsigned long *rip,
			  unsigned long *startp, unsigned long *endp)
{
	unsigned long stride = c->chunk << PAGE_SHIFT, rend;
	bool ok = false;

	spin_lock(&c->lock);
	while (c->ri < c->nr_ranges && !c->abort) {
		rend = c->ranges[c->ri].start + c->ranges[c->ri].len;
		if (c->addr >= rend) {
			if (++c->ri < c->nr_ranges)
				c->addr = c->ranges[c->ri].start;
			continue;
		}
		*rip = c->ri;
		*startp = c->addr;
		*endp = min(rend, c->addr + stride);
		c->addr = *endp;
		ok = true;
		break;
	}
	spin_unlock(&c->lock);
	return ok;
}

/* Stops every lane after its current batch; the first error is returned. */
static void vt_stop(struct vt_ctx *c, int err)
{
	unsigned int k;

	spin_lock(&c->lock);
	if (!c->err)
		c->err = err;
	c->abort = true;
	spin_unlock(&c->lock);
	if (err == -EINTR) {
		/* A signal: copies in progress stop after their page too. */
		for (k = 0; k < c->nlanes; k++)
			WRITE_ONCE(c->lanes[k].b.abort, true);
	}
}

static void vt_range_add(struct vt_ctx *c, struct vmtier_range *to,
			 const struct vmtier_range *from)
{
	spin_lock(&c->lock);
	to->moved += from->moved;
	to->on_target += from->on_target;
	to->skipped_hole += from->skipped_hole;
	to->skipped_thp += from->skipped_thp;
	to->skipped_busy += from->skipped_busy;
	to->skipped_shared += from->skipped_shared;
	to->failed += from->failed;
	to->skipped_pinned += from->skipped_pinned;
	to->skipped_sharers += from->skipped_sharers;
	spin_unlock(&c->lock);
}

/*
 * Why a lane must not start another batch, or 0. Signals reach only the
 * caller, who stops the work items' lanes itself.
 */
static int vt_lane_check(struct vt_lane *l)
{
	struct vt_ctx *c = l->c;

	if (!l->worker && signal_pending(current))
		return -EINTR;
	if (vt_target_gone(c))
		return -ESRCH;
	/* The cpusets may have changed since the last batch. */
	if (!vt_node_allowed(c->task, c->caller, c->nid))
		return -EACCES;
	return 0;
}

/* Batches of [addr, end) inside range r until done or the call stops. */
static int vt_lane_chunk(struct vt_lane *l, unsigned long addr,
			 unsigned long end, struct vmtier_range *r)
{
	struct vt_ctx *c = l->c;
	struct vm_area_struct *vma;
	unsigned long bend;
	int err;

	while (addr < end) {
		if (READ_ONCE(c->abort))
			return 0;
		err = vt_lane_check(l);
		if (err)
			return err;
		if (mmap_read_lock_killable(c->mm))
			return -EINTR;
		vma = vma_lookup(c->mm, addr);
		if (!vma) {
			mmap_read_unlock(c->mm);
			return -EFAULT;
		}
		bend = min3(end, vma->vm_end, addr + c->batch * PAGE_SIZE);
		if (!vt_vma_ok(vma)) {
			mmap_read_unlock(c->mm);
			if (!(c->arg->flags & VMTIER_MIGRATE_SKIP_UNSUPPORTED))
				return -EOPNOTSUPP;
			r->skipped_shared += (bend - addr) >> PAGE_SHIFT;
			addr = bend;
			continue;
		}
		bend = vt_migrate_batch(l, vma, addr, bend, r);
		mmap_read_unlock(c->mm);
		if (READ_ONCE(l->b.abort))
			return -EINTR;
		addr = bend;
		cond_resched();
	}
	return 0;
}

/* A lane's loop: chunks from the cursor until none is left. */
static void vt_lane_run(struct vt_lane *l)
{
	struct vt_ctx *c = l->c;
	unsigned long ri, start, end;
	struct vmtier_range acc;
	int err;

	while (vt_next_chunk(c, &ri, &start, &end)) {
		memset(&acc, 0, sizeof(acc));
		err = vt_lane_chunk(l, start, end, &acc);
		vt_range_add(c, &c->ranges[ri], &acc);
		if (err) {
			vt_stop(c, err);
			break;
		}
	}
}

static void vt_lane_fn(struct work_struct *work)
{
	struct vt_lane *l = container_of(work, struct vt_lane, work);
	struct vt_ctx *c = l->c;

	vt_lane_run(l);
	/* The context may be gone once pending drops to 0. */
	if (atomic_dec_and_test(&c->pending))
		complete(&c->done);
}

/*
 * Runs the call: one lane in the calling thread, or c->nlanes work items
 * while the caller waits. The caller does not run a lane beside them: a
 * thread of the target's process (the caller moving its own memory) would
 * keep the target's mm loaded on its CPU, and every TLB flush of the other
 * lanes would interrupt it; asleep, its CPU runs a lane's work item in lazy
 * TLB mode, which flushes skip. Returns the first error.
 */
static int vt_run(struct vt_ctx *c)
{
	struct work_struct **works = NULL;
	unsigned int k, n = c->nlanes;

	if (n > 1)
		works = kcalloc(n, sizeof(*works), GFP_KERNEL);
	if (!works) {
		/* One lane does it all; the others stay empty. */
		vt_lane_run(&c->lanes[0]);
		goto out;
	}
	atomic_set(&c->pending, n);
	init_completion(&c->done);
	for (k = 0; k < n; k++) {
		c->lanes[k].worker = true;
		INIT_WORK(&c->lanes[k].work, vt_lane_fn);
		works[k] = &c->lanes[k].work;
	}
	vmtier_queue_spread(works, n, true);
	if (wait_for_completion_interruptible(&c->done)) {
		/* Signal: lanes not started never will; wait for the rest. */
		vt_stop(c, -EINTR);
		for (k = 0; k < n; k++)
			if (cancel_work(works[k]) &&
			    atomic_dec_and_test(&c->pending))
				complete(&c->done);
		wait_for_completion(&c->done);
	}
	kfree(works);
out:
	if (c->err == -EINTR)
		vt_stat_add(VT_STAT_INTERRUPTED, 1);
	else if (c->err == -ESRCH)
		vt_stat_add(VT_STAT_TARGET_EXITED, 1);
	return c->err;
}

/* The lanes' results into the call's (out) fields. */
static void vt_merge_out(struct vt_ctx *c)
{
	struct vmtier_migrate *arg = c->arg;
	u64 lanes_copied = 0;
	unsigned int k;

	for (k = 0; k < c->nlanes; k++) {
		struct vt_out *o = &c->lanes[k].out;

		arg->unmapped += o->unmapped;
		arg->batches += o->batches;
		arg->unmap_ns += o->unmap_ns;
		arg->copy_ns += o->copy_ns;
		arg->remap_ns += o->remap_ns;
		arg->dma_fallbacks += o->dma_fallbacks;
		arg->dma_abandoned += o->dma_abandoned;
		if (o->engine_used) {
			arg->engine_used = o->engine_used;
			lanes_copied++;
		}
		arg->workers_used = max(arg->workers_used, o->workers_used);
	}
	/* Lanes copy with one thread each: the threads are the lanes. */
	if (c->nlanes > 1)
		arg->workers_used = lanes_copied;
}

static void vt_sum(struct vmtier_migrate *arg, struct vmtier_range *ranges,
		   unsigned long nr)
{
	unsigned long i;

	arg->moved = 0;
	arg->skipped = 0;
	arg->failed = 0;
	for (i = 0; i < nr; i++) {
		struct vmtier_range *r = &ranges[i];

		arg->moved += r->moved;
		arg->skipped += r->on_target + r->skipped_hole + r->skipped_thp +
				r->skipped_busy + r->skipped_shared +
				r->skipped_pinned + r->skipped_sharers;
		arg->failed += r->failed;
		vt_stat_add(VT_STAT_MOVED, r->moved);
		vt_stat_add(VT_STAT_ON_TARGET, r->on_target);
		vt_stat_add(VT_STAT_SKIP_HOLE, r->skipped_hole);
		vt_stat_add(VT_STAT_SKIP_THP, r->skipped_thp);
		vt_stat_add(VT_STAT_SKIP_BUSY, r->skipped_busy);
		vt_stat_add(VT_STAT_SKIP_SHARED, r->skipped_shared);
		vt_stat_add(VT_STAT_SKIP_PINNED, r->skipped_pinned);
		vt_stat_add(VT_STAT_SKIP_SHARERS, r->skipped_sharers);
		vt_stat_add(VT_STAT_FAILED, r->failed);
	}
}

static struct task_struct *vt_get_task(u64 pid)
{
	struct task_struct *task;
	struct pid *p;

	if (!pid) {
		get_task_struct(current);
		return current;
	}
	if (pid > PID_MAX_LIMIT)
		return NULL;
	p = find_get_pid(pid);
	if (!p)
		return NULL;
	task = get_pid_task(p, PIDTYPE_PID);
	put_pid(p);
	return task;
}

static int vt_alloc_lanes(struct vt_ctx *c)
{
	unsigned int k;

	c->lanes = kcalloc(c->nlanes, sizeof(*c->lanes), GFP_KERNEL);
	if (!c->lanes)
		return -ENOMEM;
	for (k = 0; k < c->nlanes; k++) {
		struct vt_lane *l = &c->lanes[k];
		struct vmtier_batch *b = &l->b;

		l->c = c;
		b->nid = c->nid;
		b->threads = c->nlanes > 1 ? 1 : c->cpu_threads;
		b->src = kvcalloc(c->batch, sizeof(*b->src), GFP_KERNEL);
		b->dst = kvcalloc(c->batch, sizeof(*b->dst), GFP_KERNEL);
		b->dpage = kvcalloc(c->batch, sizeof(*b->dpage), GFP_KERNEL);
		b->state = kvzalloc(c->batch, GFP_KERNEL);
		if (!b->src || !b->dst || !b->dpage || !b->state)
			return -ENOMEM;
	}
	return 0;
}

static void vt_free_lanes(struct vt_ctx *c)
{
	unsigned int k;

	for (k = 0; c->lanes && k < c->nlanes; k++) {
		kvfree(c->lanes[k].b.src);
		kvfree(c->lanes[k].b.dst);
		kvfree(c->lanes[k].b.dpage);
		kvfree(c->lanes[k].b.state);
	}
	kfree(c->lanes);
}

/* Lanes at least this many pages each; fewer are not worth a thread. */
#define VT_MIN_LANE_PAGES	256

/*
 * How the call is split: with the CPU engine (asked for, or auto without DMA
 * channels) each copy thread is a lane of whole batches, the batch size split
 * between them so that at most @batch pages are unmapped at a time, and the
 * chunks sized so that every lane gets a few; with DMA one lane, the
 * channels (or copy threads, on a fallback) splitting each batch.
 */
static void vt_plan_lanes(struct vt_ctx *c, unsigned long batch,
			  const struct vmtier_range *ranges, unsigned long nr)
{
	unsigned long pages = 0, i, lanes;

	for (i = 0; i < nr; i++)
		pages += ranges[i].len >> PAGE_SHIFT;
	lanes = c->dma ? 1 : c->cpu_threads;
	lanes = clamp_t(unsigned long, min(lanes, pages / VT_MIN_LANE_PAGES),
			1, vmtier_max_threads());
	lanes = min(lanes, batch);
	c->nlanes = lanes;
	c->batch = batch / lanes;
	c->chunk = lanes == 1 ? c->batch :
		   clamp_t(unsigned long, DIV_ROUND_UP(pages, 2 * lanes), 1,
			   c->batch);
}

/**
 * vmtier_do_migrate() - VMTIER_IOC_MIGRATE once the arguments are copied in
 * @arg:	the request, header fields already checked; (out) fields filled
 * @ranges:	nr_ranges ranges; (out) fields filled, also on -EINTR/-ESRCH
 *
 * Return: 0 or a negative errno as documented in the uapi header.
 */
int vmtier_do_migrate(struct vmtier_migrate *arg, struct vmtier_range *ranges)
{
	struct vt_ctx *c;
	u64 t0 = ktime_get_ns();
	int ret;

	if (arg->node >= MAX_NUMNODES || !node_state(arg->node, N_MEMORY))
		return -ENODEV;
	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c)
		return -ENOMEM;
	c->arg = arg;
	c->caller = current;
	c->ranges = ranges;
	c->nr_ranges = arg->nr_ranges;
	c->addr = ranges[0].start;
	spin_lock_init(&c->lock);
	c->nid = arg->node;
	c->cpu_threads = arg->engine == VMTIER_ENGINE_CPU && arg->workers ?
			 arg->workers : vmtier_default_threads();

	ret = -ESRCH;
	c->task = vt_get_task(arg->pid);
	if (!c->task)
		goto free_ctx;
	ret = -EPERM;
	if (!vt_may_access(c->task))
		goto put_task;
	ret = -EACCES;
	if (!vt_node_allowed(c->task, current, c->nid))
		goto put_task;
	ret = (c->task->flags & PF_KTHREAD) ? -EINVAL : -ESRCH;
	c->mm = get_task_mm(c->task);
	if (!c->mm)
		goto put_task;

	ret = vt_validate(c, ranges, arg->nr_ranges);
	if (ret)
		goto put_mm;

	if (arg->engine != VMTIER_ENGINE_CPU) {
		c->dma = vmtier_dma_available();
		ret = -ENODEV;
		if (!c->dma && arg->engine == VMTIER_ENGINE_DMA)
			goto put_mm;
	}
	vt_plan_lanes(c, arg->batch ? arg->batch : VMTIER_DEFAULT_BATCH,
		      ranges, arg->nr_ranges);
	ret = vt_alloc_lanes(c);
	if (!ret) {
		ret = vt_run(c);
		vt_merge_out(c);
	}
	vt_free_lanes(c);
	vt_sum(arg, ranges, arg->nr_ranges);
put_mm:
	/* The last reference may tear down a whole VM: not in this thread. */
	mmput_async(c->mm);
put_task:
	put_task_struct(c->task);
free_ctx:
	kfree(c);
	arg->total_ns = ktime_get_ns() - t0;
	return ret;
}
