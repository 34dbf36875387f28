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

struct vt_ctx {
	struct vmtier_migrate *arg;
	struct task_struct *task;
	struct mm_struct *mm;
	int nid;
	unsigned long batch;
	unsigned int cpu_threads;
	bool dma;
	struct vmtier_batch b;
	struct migrate_vma runs[VT_MAX_RUNS];
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
static bool vt_node_allowed(struct task_struct *task, int nid)
{
	bool ok;

	task_lock(task);
	ok = node_isset(nid, task->mems_allowed);
	task_unlock(task);
	if (ok && task != current) {
		task_lock(current);
		ok = node_isset(nid, current->mems_allowed);
		task_unlock(current);
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
static void vt_copy_batch(struct vt_ctx *c, unsigned long todo)
{
	struct vmtier_migrate *arg = c->arg;
	struct vmtier_batch *b = &c->b;
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
				arg->dma_fallbacks += res.fallbacks;
				vt_stat_add(VT_STAT_DMA_FALLBACKS,
					    res.fallbacks);
			}
			arg->dma_abandoned += res.abandoned;
			vt_stat_add(VT_STAT_DMA_PAGES, res.copied);
			arg->engine_used = VMTIER_ENGINE_DMA;
			arg->workers_used = max_t(u64, arg->workers_used,
						  res.chans);
			return;
		}
		/* No channel after all (provider gone): the CPU does it. */
	}
	arg->workers_used = max_t(u64, arg->workers_used,
				  vmtier_cpu_copy(b, true));
	arg->engine_used = VMTIER_ENGINE_CPU;
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
static unsigned long vt_collect(struct vt_ctx *c, struct vm_area_struct *vma,
				unsigned long start, unsigned long end,
				struct vmtier_range *r, unsigned long *nrunsp,
				unsigned long *npagesp)
{
	struct vmtier_batch *b = &c->b;
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
				c->runs[nruns++] = (struct migrate_vma) {
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
		c->runs[nruns++] = (struct migrate_vma) {
			.start = start + (run_start << PAGE_SHIFT),
			.end = start + (run_end << PAGE_SHIFT),
		};
		npages += run_end - run_start;
		for (j = run_end; j < ((end - start) >> PAGE_SHIFT); j++)
			vt_count_class(r, cls[j]);
	}
	/* Lay the runs out back to back in src/dst. */
	for (i = 0, n = 0; i < nruns; i++) {
		struct migrate_vma *m = &c->runs[i];

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
static void vt_classify_src(struct vt_ctx *c, unsigned long i,
			    struct vmtier_range *r, unsigned long *todo)
{
	struct vmtier_batch *b = &c->b;
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
static unsigned long vt_migrate_batch(struct vt_ctx *c,
				      struct vm_area_struct *vma,
				      unsigned long start, unsigned long end,
				      struct vmtier_range *r)
{
	struct vmtier_migrate *arg = c->arg;
	struct vmtier_batch *b = &c->b;
	unsigned long npages, nruns, i, todo = 0, moved = 0, failed = 0;
	unsigned long given_up = 0, unmapped = 0;
	u64 t0;
	int k;

	atomic_long_set(&b->nomem, 0);
	atomic_long_set(&b->mc_errors, 0);
	b->abort = false;
	end = vt_collect(c, vma, start, end, r, &nruns, &npages);
	if (!nruns)
		return end;

	/* Unmap: migration entries replace the PTEs of the pages collected. */
	t0 = ktime_get_ns();
	for (k = 0; k < nruns; k++) {
		struct migrate_vma *m = &c->runs[k];
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
	arg->unmap_ns += ktime_get_ns() - t0;

	b->npages = npages;
	for (i = 0; i < npages; i++)
		vt_classify_src(c, i, r, &todo);
	arg->unmapped += unmapped;
	vt_stat_add(VT_STAT_UNMAPPED, unmapped);

	/* Copy. */
	if (todo) {
		t0 = ktime_get_ns();
		vt_copy_batch(c, todo);
		arg->copy_ns += ktime_get_ns() - t0;
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
		if (c->runs[k].npages)
			migrate_vma_pages(&c->runs[k]);
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
		if (c->runs[k].npages)
			migrate_vma_finalize(&c->runs[k]);
	arg->remap_ns += ktime_get_ns() - t0;

	r->moved += moved;
	r->failed += failed;
	r->skipped_busy += given_up;
	arg->batches++;
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

static int vt_run(struct vt_ctx *c, struct vmtier_range *ranges,
		  unsigned long nr)
{
	struct vm_area_struct *vma;
	unsigned long i, addr, end, bend;

	for (i = 0; i < nr; i++) {
		struct vmtier_range *r = &ranges[i];

		addr = r->start;
		end = r->start + r->len;
		while (addr < end) {
			if (signal_pending(current)) {
				vt_stat_add(VT_STAT_INTERRUPTED, 1);
				return -EINTR;
			}
			if (vt_target_gone(c)) {
				vt_stat_add(VT_STAT_TARGET_EXITED, 1);
				return -ESRCH;
			}
			/* The cpusets may have changed since the last batch. */
			if (!vt_node_allowed(c->task, c->nid))
				return -EACCES;
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
			bend = vt_migrate_batch(c, vma, addr, bend, r);
			mmap_read_unlock(c->mm);
			if (c->b.abort) {
				vt_stat_add(VT_STAT_INTERRUPTED, 1);
				return -EINTR;
			}
			addr = bend;
			cond_resched();
		}
	}
	return 0;
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

static int vt_alloc_arrays(struct vt_ctx *c)
{
	struct vmtier_batch *b = &c->b;

	b->src = kvcalloc(c->batch, sizeof(*b->src), GFP_KERNEL);
	b->dst = kvcalloc(c->batch, sizeof(*b->dst), GFP_KERNEL);
	b->dpage = kvcalloc(c->batch, sizeof(*b->dpage), GFP_KERNEL);
	b->state = kvzalloc(c->batch, GFP_KERNEL);
	if (!b->src || !b->dst || !b->dpage || !b->state)
		return -ENOMEM;
	return 0;
}

static void vt_free_arrays(struct vt_ctx *c)
{
	kvfree(c->b.src);
	kvfree(c->b.dst);
	kvfree(c->b.dpage);
	kvfree(c->b.state);
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
	c->nid = arg->node;
	c->b.nid = c->nid;
	c->batch = arg->batch ? arg->batch : VMTIER_DEFAULT_BATCH;
	c->cpu_threads = arg->engine == VMTIER_ENGINE_CPU && arg->workers ?
			 arg->workers : vmtier_default_threads();
	c->b.threads = c->cpu_threads;

	ret = -ESRCH;
	c->task = vt_get_task(arg->pid);
	if (!c->task)
		goto free_ctx;
	ret = -EPERM;
	if (!vt_may_access(c->task))
		goto put_task;
	ret = -EACCES;
	if (!vt_node_allowed(c->task, c->nid))
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
	ret = vt_alloc_arrays(c);
	if (!ret)
		ret = vt_run(c, ranges, arg->nr_ranges);
	vt_free_arrays(c);
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
