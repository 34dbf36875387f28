// SPDX-License-Identifier: GPL-2.0
/*
 * vmtier migration: a target's private anonymous ranges are moved in batches
 * with the exported device-migration API (migrate_vma_setup() on system
 * memory), the copy done by the CPU or DMA engine in between:
 *
 *   mmap_read_lock -> classify PMDs (holes and THPs left out) ->
 *   migrate_vma_setup (unmap) per run of PTE tables -> allocate + copy the
 *   whole batch -> migrate_vma_pages + migrate_vma_finalize (remap) ->
 *   mmap_read_unlock -> next batch
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpuset.h>
#include <linux/cred.h>
#include <linux/ktime.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/nodemask.h>
#include <linux/pgtable.h>
#include <linux/pid.h>
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

enum vt_pmd_kind { VT_PMD_HOLE, VT_PMD_THP, VT_PMD_BUSY, VT_PMD_PTE };

struct vt_ctx {
	struct vmtier_migrate *arg;
	struct task_struct *task;
	struct mm_struct *mm;
	int nid;
	unsigned long batch;
	unsigned int cpu_threads;
	struct vmtier_dma *dma;
	struct vmtier_batch b;
	struct migrate_vma *runs;
	unsigned long max_runs;
};

/*
 * The checks of __ptrace_may_access(PTRACE_MODE_READ_REALCREDS), which is not
 * exported: same thread group, or matching real credentials or CAP_SYS_PTRACE
 * in the target's user namespace, and a dumpable mm unless CAP_SYS_PTRACE.
 * The LSM hook (Yama, SELinux) cannot be called from a module; the device is
 * root-only and the caller needs CAP_SYS_NICE on top.
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

/* The cpuset's nodes as the allocator sees them (cpuset_mems_allowed() is not exported). */
static bool vt_node_allowed(struct task_struct *task, int nid)
{
	bool ok;

	task_lock(task);
	ok = node_isset(nid, task->mems_allowed);
	task_unlock(task);
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
static enum vt_pmd_kind vt_pmd_kind(struct mm_struct *mm, unsigned long addr)
{
	pgd_t *pgd = pgd_offset(mm, addr);
	p4d_t *p4d;
	pud_t *pud, pudv;
	pmd_t pmdv;

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
	pmdv = pmdp_get_lockless(pmd_offset(pud, addr));
	if (pmd_none(pmdv))
		return VT_PMD_HOLE;
	if (pmd_trans_huge(pmdv) || pmd_devmap(pmdv) || pmd_leaf(pmdv))
		return VT_PMD_THP;
	if (!pmd_present(pmdv))
		return is_pmd_migration_entry(pmdv) ? VT_PMD_THP : VT_PMD_BUSY;
	return VT_PMD_PTE;
}

/* Copies the TODO entries of the batch with the chosen engine. */
static void vt_copy_batch(struct vt_ctx *c, unsigned long todo)
{
	struct vmtier_migrate *arg = c->arg;
	struct vmtier_batch *b = &c->b;
	unsigned int engine = arg->engine;
	unsigned long i, left = 0;

	if (engine == VMTIER_ENGINE_AUTO)
		engine = c->dma && todo >= vmtier_auto_dma_min_pages ?
			 VMTIER_ENGINE_DMA : VMTIER_ENGINE_CPU;
	if (engine == VMTIER_ENGINE_DMA && c->dma) {
		vmtier_alloc_batch(b);
		vmtier_dma_copy(c->dma, b);
		for (i = 0; i < b->npages; i++)
			left += b->state[i] == VT_PAGE_TODO;
		if (left) {
			/* DMA errors and timeouts: the CPU copies those pages. */
			vmtier_cpu_copy(b, c->cpu_threads, false);
			arg->dma_fallbacks += left;
			vt_stat_add(VT_STAT_DMA_FALLBACKS, left);
		}
		vt_stat_add(VT_STAT_DMA_PAGES, todo - left);
		arg->engine_used = VMTIER_ENGINE_DMA;
		arg->workers_used = vmtier_dma_nr_chans(c->dma);
	} else {
		vmtier_cpu_copy(b, c->cpu_threads, true);
		vt_stat_add(VT_STAT_CPU_PAGES, todo);
		arg->engine_used = VMTIER_ENGINE_CPU;
		arg->workers_used = min(c->cpu_threads, vmtier_nr_workers());
	}
}

/*
 * One batch [start, end) inside one VMA, mmap_lock held for read.
 */
static int vt_migrate_batch(struct vt_ctx *c, struct vm_area_struct *vma,
			    unsigned long start, unsigned long end,
			    struct vmtier_range *r)
{
	struct vmtier_batch *b = &c->b;
	unsigned long addr, next, npages = 0, nruns = 0, i, todo = 0;
	unsigned long moved = 0, failed = 0;
	u64 t0;
	int k, ret = 0;

	atomic_long_set(&b->nomem, 0);
	atomic_long_set(&b->mc_errors, 0);

	/* Collect: runs of PTE-mapped PMDs go to migrate_vma_setup(). */
	for (addr = start; addr < end; addr = next) {
		enum vt_pmd_kind kind = vt_pmd_kind(c->mm, addr);
		unsigned long n;
		struct migrate_vma *m;

		next = min(end, pmd_addr_end(addr, end));
		n = (next - addr) >> PAGE_SHIFT;
		switch (kind) {
		case VT_PMD_HOLE:
			r->skipped_hole += n;
			continue;
		case VT_PMD_THP:
			r->skipped_thp += n;
			continue;
		case VT_PMD_BUSY:
			r->skipped_busy += n;
			continue;
		case VT_PMD_PTE:
			break;
		}
		m = nruns ? &c->runs[nruns - 1] : NULL;
		if (m && m->end == addr) {
			m->end = next;
		} else {
			if (WARN_ON_ONCE(nruns >= c->max_runs))
				return -EINVAL;
			m = &c->runs[nruns++];
			*m = (struct migrate_vma) {
				.vma = vma, .start = addr, .end = next,
				.src = b->src + npages, .dst = b->dst + npages,
				.pgmap_owner = (void *)&vt_owner_cookie,
				.flags = MIGRATE_VMA_SELECT_SYSTEM,
			};
		}
		npages += n;
	}
	if (!nruns)
		return 0;

	/* Unmap: migration entries replace the PTEs of the pages collected. */
	for (k = 0; k < nruns; k++) {
		ret = migrate_vma_setup(&c->runs[k]);
		if (ret) {
			/* Nothing of this run is isolated: counted busy below. */
			memset(c->runs[k].src, 0, sizeof(unsigned long) *
			       ((c->runs[k].end - c->runs[k].start) >> PAGE_SHIFT));
			c->runs[k].cpages = 0;
			ret = 0;
		}
	}

	b->npages = npages;
	for (i = 0; i < npages; i++) {
		unsigned long s = b->src[i];

		b->dst[i] = 0;
		b->dpage[i] = NULL;
		b->state[i] = VT_PAGE_NONE;
		if (!(s & MIGRATE_PFN_MIGRATE)) {
			r->skipped_busy++;
		} else if (!(s & MIGRATE_PFN_VALID)) {
			r->skipped_hole++;	/* pte_none or zero page: dst stays 0 */
		} else if (page_to_nid(migrate_pfn_to_page(s)) == c->nid) {
			r->on_target++;		/* dst 0: finalize restores it */
		} else {
			b->state[i] = VT_PAGE_TODO;
			todo++;
		}
	}

	/* Copy. */
	if (todo) {
		t0 = ktime_get_ns();
		vt_copy_batch(c, todo);
		c->arg->copy_ns += ktime_get_ns() - t0;
	}

	/* Place the copies; free what cannot be placed. */
	for (i = 0; i < npages; i++) {
		if (b->state[i] == VT_PAGE_DONE) {
			b->dst[i] = migrate_pfn(page_to_pfn(b->dpage[i]));
		} else if (b->state[i] == VT_PAGE_FAILED) {
			if (b->dpage[i])
				vmtier_free_dst(b->dpage[i]);
			failed++;
		} else if (b->dpage[i]) {
			vmtier_free_dst(b->dpage[i]);
		}
	}

	/* Remap: the new pages replace the old in the page tables. */
	for (k = 0; k < nruns; k++)
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
		migrate_vma_finalize(&c->runs[k]);

	r->moved += moved;
	r->failed += failed;
	count_vm_events(PGMIGRATE_SUCCESS, moved);
	count_vm_events(PGMIGRATE_FAIL, failed);
	vt_stat_add(VT_STAT_NOMEM, atomic_long_read(&b->nomem));
	vt_stat_add(VT_STAT_MC_ERRORS, atomic_long_read(&b->mc_errors));
	vt_stat_add(VT_STAT_BATCHES, 1);
	return 0;
}

/* Every range: aligned, fully mapped, and private anonymous unless skipped. */
static int vt_validate(struct vt_ctx *c, struct vmtier_range *ranges,
		       unsigned long nr)
{
	unsigned long i, addr, end;
	struct vm_area_struct *vma;
	int ret = 0;

	for (i = 0; i < nr; i++) {
		struct vmtier_range *r = &ranges[i];

		if (r->reserved[0] || r->reserved[1] || r->reserved[2])
			return -EINVAL;
		if (!r->len || !PAGE_ALIGNED(r->start) || !PAGE_ALIGNED(r->len) ||
		    r->start + r->len < r->start || r->start + r->len > TASK_SIZE)
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
	int ret = 0;

	for (i = 0; i < nr; i++) {
		struct vmtier_range *r = &ranges[i];

		addr = r->start;
		end = r->start + r->len;
		while (addr < end) {
			if (fatal_signal_pending(current)) {
				vt_stat_add(VT_STAT_INTERRUPTED, 1);
				return -EINTR;
			}
			if (vt_target_gone(c)) {
				vt_stat_add(VT_STAT_TARGET_EXITED, 1);
				return -ESRCH;
			}
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
			ret = vt_migrate_batch(c, vma, addr, bend, r);
			mmap_read_unlock(c->mm);
			if (ret)
				return ret;
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
				r->skipped_busy + r->skipped_shared;
		arg->failed += r->failed;
		vt_stat_add(VT_STAT_MOVED, r->moved);
		vt_stat_add(VT_STAT_ON_TARGET, r->on_target);
		vt_stat_add(VT_STAT_SKIP_HOLE, r->skipped_hole);
		vt_stat_add(VT_STAT_SKIP_THP, r->skipped_thp);
		vt_stat_add(VT_STAT_SKIP_BUSY, r->skipped_busy);
		vt_stat_add(VT_STAT_SKIP_SHARED, r->skipped_shared);
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

	c->max_runs = c->batch / PTRS_PER_PMD + 2;
	b->src = kvcalloc(c->batch, sizeof(*b->src), GFP_KERNEL);
	b->dst = kvcalloc(c->batch, sizeof(*b->dst), GFP_KERNEL);
	b->dpage = kvcalloc(c->batch, sizeof(*b->dpage), GFP_KERNEL);
	b->state = kvzalloc(c->batch, GFP_KERNEL);
	c->runs = kvcalloc(c->max_runs, sizeof(*c->runs), GFP_KERNEL);
	if (!b->src || !b->dst || !b->dpage || !b->state || !c->runs)
		return -ENOMEM;
	return 0;
}

static void vt_free_arrays(struct vt_ctx *c)
{
	kvfree(c->b.src);
	kvfree(c->b.dst);
	kvfree(c->b.dpage);
	kvfree(c->b.state);
	kvfree(c->runs);
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
	struct vt_ctx c = { .arg = arg };
	u64 t0 = ktime_get_ns();
	unsigned int want;
	int ret;

	if (arg->node >= MAX_NUMNODES || !node_state(arg->node, N_MEMORY))
		return -ENODEV;
	c.nid = arg->node;
	c.b.nid = c.nid;
	c.batch = arg->batch ? arg->batch : VMTIER_DEFAULT_BATCH;
	c.cpu_threads = arg->engine == VMTIER_ENGINE_CPU && arg->workers ?
			arg->workers : vmtier_default_cpu_workers;

	c.task = vt_get_task(arg->pid);
	if (!c.task)
		return -ESRCH;
	ret = -EPERM;
	if (!vt_may_access(c.task))
		goto put_task;
	ret = -EACCES;
	if (!vt_node_allowed(c.task, c.nid))
		goto put_task;
	ret = (c.task->flags & PF_KTHREAD) ? -EINVAL : -ESRCH;
	c.mm = get_task_mm(c.task);
	if (!c.mm)
		goto put_task;

	ret = vt_validate(&c, ranges, arg->nr_ranges);
	if (ret)
		goto put_mm;

	if (arg->engine != VMTIER_ENGINE_CPU) {
		want = arg->engine == VMTIER_ENGINE_DMA && arg->workers ?
		       arg->workers : VMTIER_MAX_DMA_CHANS;
		c.dma = vmtier_dma_get(want);
		ret = -ENODEV;
		if (!c.dma && arg->engine == VMTIER_ENGINE_DMA)
			goto put_mm;
	}
	ret = vt_alloc_arrays(&c);
	if (!ret)
		ret = vt_run(&c, ranges, arg->nr_ranges);
	vt_free_arrays(&c);
	vt_sum(arg, ranges, arg->nr_ranges);
	if (c.dma)
		vmtier_dma_put(c.dma);
put_mm:
	mmput(c.mm);
put_task:
	put_task_struct(c.task);
	arg->total_ns = ktime_get_ns() - t0;
	return ret;
}
