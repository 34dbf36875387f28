// SPDX-License-Identifier: GPL-2.0
/*
 * vmtier: /dev/vmtier, a misc device that migrates a process's private
 * anonymous memory between NUMA nodes in batches (unmap batch, parallel copy
 * by CPU threads or DMA engines, remap batch) without a kernel patch.
 *
 * See include/uapi/linux/vmtier.h for the ABI and docs/kmod.md for the design.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/debugfs.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "vmtier_priv.h"

atomic64_t vmtier_stats[VT_NR_STATS];

static const char * const vt_stat_names[VT_NR_STATS] = {
	[VT_STAT_CALLS] = "calls",
	[VT_STAT_CALLS_FAILED] = "calls_failed",
	[VT_STAT_ACTIVE] = "active",
	[VT_STAT_BATCHES] = "batches",
	[VT_STAT_WORKER_BATCHES] = "batches_by_workers",
	[VT_STAT_UNMAPPED] = "pages_unmapped",
	[VT_STAT_MOVED] = "pages_moved",
	[VT_STAT_ON_TARGET] = "pages_on_target",
	[VT_STAT_SKIP_HOLE] = "pages_skipped_hole",
	[VT_STAT_SKIP_THP] = "pages_skipped_thp",
	[VT_STAT_SKIP_BUSY] = "pages_skipped_busy",
	[VT_STAT_SKIP_SHARED] = "pages_skipped_shared",
	[VT_STAT_SKIP_PINNED] = "pages_skipped_pinned",
	[VT_STAT_SKIP_SHARERS] = "pages_skipped_sharers",
	[VT_STAT_SKIP_WRITEBACK] = "pages_skipped_writeback",
	[VT_STAT_WRITEBACK_UNMAPPED] = "pages_writeback_after_unmap",
	[VT_STAT_FAILED] = "pages_failed",
	[VT_STAT_NOMEM] = "pages_nomem",
	[VT_STAT_MC_ERRORS] = "pages_copy_mc_errors",
	[VT_STAT_CPU_PAGES] = "pages_copied_cpu",
	[VT_STAT_DMA_PAGES] = "pages_copied_dma",
	[VT_STAT_DMA_ERRORS] = "dma_errors",
	[VT_STAT_DMA_TIMEOUTS] = "dma_timeouts",
	[VT_STAT_DMA_TERMINATE_FAILED] = "dma_terminate_failed",
	[VT_STAT_DMA_FALLBACKS] = "dma_fallback_pages",
	[VT_STAT_DMA_ABANDONED] = "dma_abandoned_pages",
	[VT_STAT_DMA_ABANDONED_LIVE] = "dma_abandoned_live",
	[VT_STAT_DMA_CHANS_HELD] = "dma_chans_held",
	[VT_STAT_DMA_CHANS_SICK] = "dma_chans_retired",
	[VT_STAT_DMA_CHAN_REQUESTS] = "dma_chan_requests",
	[VT_STAT_DST_ALLOCATED] = "dst_allocated",
	[VT_STAT_DST_FREED] = "dst_freed_unplaced",
	[VT_STAT_DST_PLACED_FAILED] = "dst_placed_failed",
	[VT_STAT_DST_ABANDONED_FREED] = "dst_abandoned_freed",
	[VT_STAT_ABORTED_PAGES] = "pages_aborted",
	[VT_STAT_INTERRUPTED] = "calls_interrupted",
	[VT_STAT_TARGET_EXITED] = "calls_target_exited",
};

unsigned int vmtier_dma_timeout_ms = 2000;
module_param_named(dma_timeout_ms, vmtier_dma_timeout_ms, uint, 0644);
MODULE_PARM_DESC(dma_timeout_ms, "Wait for a DMA batch before falling back to the CPU (ms)");

unsigned int vmtier_dma_idle_ms = 5000;
module_param_named(dma_idle_ms, vmtier_dma_idle_ms, uint, 0644);
MODULE_PARM_DESC(dma_idle_ms, "Release the DMA channels after this long unused (ms)");

unsigned int vmtier_auto_dma_min_pages = 4096;
module_param_named(auto_dma_min_pages, vmtier_auto_dma_min_pages, uint, 0644);
MODULE_PARM_DESC(auto_dma_min_pages, "Engine auto: smallest batch (base pages) copied by DMA");

unsigned int vmtier_default_cpu_workers;
module_param_named(cpu_workers, vmtier_default_cpu_workers, uint, 0644);
MODULE_PARM_DESC(cpu_workers, "Default CPU copy threads (0: min(4, housekeeping CPUs))");

bool vmtier_prefilter = true;
module_param_named(prefilter, vmtier_prefilter, bool, 0644);
MODULE_PARM_DESC(prefilter, "Keep pages on the target, pinned or under writeback out of the unmap (N: tests and comparisons)");

static struct dentry *vt_debugfs;

/*
 * Copies a structure in whose size the command encodes: an older (smaller)
 * one is zero-extended, a newer (larger) one must have zero extra bytes, and
 * its leading size field must match the command.
 */
static int vt_copy_in(void *kbuf, size_t ksize, size_t minsize,
		      void __user *ubuf, size_t usize)
{
	int ret;

	if (usize < minsize)
		return -EINVAL;
	if (usize > PAGE_SIZE)
		return -E2BIG;
	ret = copy_struct_from_user(kbuf, ksize, ubuf, usize);
	if (ret)
		return ret;
	/* Every structure starts with its size. */
	if (*(u64 *)kbuf != usize)
		return -EINVAL;
	return 0;
}

static bool vt_zero(const u64 *v, unsigned int n)
{
	while (n--)
		if (v[n])
			return false;
	return true;
}

static long vt_ioctl_query(void __user *uarg, size_t usize)
{
	struct vmtier_query q;
	int ret;

	ret = vt_copy_in(&q, sizeof(q), VMTIER_QUERY_SIZE_VER1, uarg, usize);
	if (ret)
		return ret;
	if (!vt_zero(q.reserved, ARRAY_SIZE(q.reserved)))
		return -EINVAL;
	memset(&q, 0, sizeof(q));
	q.size = usize;
	q.abi_version = VMTIER_ABI_VERSION;
	q.max_ranges = VMTIER_MAX_RANGES;
	q.max_batch = VMTIER_MAX_BATCH;
	q.default_batch = VMTIER_DEFAULT_BATCH;
	q.max_workers = vmtier_max_threads();
	q.default_workers = vmtier_default_threads();
	q.housekeeping_cpus = vmtier_housekeeping_cpus();
	q.migrate_flags = VMTIER_MIGRATE_FLAGS_ALL;
	vmtier_dma_query(&q);
	q.engines = BIT(VMTIER_ENGINE_AUTO) | BIT(VMTIER_ENGINE_CPU);
	if (q.nr_dma_chans)
		q.engines |= BIT(VMTIER_ENGINE_DMA);
	if (copy_to_user(uarg, &q, min(usize, sizeof(q))))
		return -EFAULT;
	return 0;
}

static long vt_ioctl_migrate(void __user *uarg, size_t usize)
{
	struct vmtier_range __user *uranges;
	struct vmtier_range *ranges;
	struct vmtier_migrate m;
	size_t bytes;
	long ret;

	ret = vt_copy_in(&m, sizeof(m), VMTIER_MIGRATE_SIZE_VER1, uarg, usize);
	if (ret)
		return ret;
	if (m.flags & ~VMTIER_MIGRATE_FLAGS_ALL ||
	    !vt_zero(m.reserved, ARRAY_SIZE(m.reserved)) ||
	    m.engine >= VMTIER_NR_ENGINES || m.workers > VMTIER_MAX_WORKERS ||
	    m.batch > VMTIER_MAX_BATCH || !m.nr_ranges)
		return -EINVAL;
	if (m.nr_ranges > VMTIER_MAX_RANGES)
		return -E2BIG;
	/* (out) fields start from zero whatever the caller left in them. */
	m.engine_used = 0;
	m.workers_used = 0;
	m.moved = 0;
	m.skipped = 0;
	m.failed = 0;
	m.dma_fallbacks = 0;
	m.copy_ns = 0;
	m.total_ns = 0;
	m.unmapped = 0;
	m.dma_abandoned = 0;
	m.batches = 0;
	m.unmap_ns = 0;
	m.remap_ns = 0;

	uranges = u64_to_user_ptr(m.ranges);
	bytes = m.nr_ranges * sizeof(*ranges);
	ranges = kvmalloc(bytes, GFP_KERNEL);
	if (!ranges)
		return -ENOMEM;
	if (copy_from_user(ranges, uranges, bytes)) {
		ret = -EFAULT;
		goto out;
	}
	for (u64 i = 0; i < m.nr_ranges; i++) {
		struct vmtier_range *r = &ranges[i];

		r->moved = 0;
		r->on_target = 0;
		r->skipped_hole = 0;
		r->skipped_thp = 0;
		r->skipped_busy = 0;
		r->skipped_shared = 0;
		r->failed = 0;
		r->skipped_pinned = 0;
		r->skipped_sharers = 0;
	}

	vt_stat_add(VT_STAT_CALLS, 1);
	vt_stat_add(VT_STAT_ACTIVE, 1);
	ret = vmtier_do_migrate(&m, ranges);
	vt_stat_add(VT_STAT_ACTIVE, -1);
	if (ret)
		vt_stat_add(VT_STAT_CALLS_FAILED, 1);

	/* Results go back on success and on a partial run alike. */
	if (copy_to_user(uranges, ranges, bytes) ||
	    copy_to_user(uarg, &m, min(usize, sizeof(m))))
		ret = ret ?: -EFAULT;
out:
	kvfree(ranges);
	return ret;
}

/*
 * Dispatched on the command's type and number; its size field is the size of
 * the caller's structure, so that older and newer ones reach the handler.
 */
static long vt_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	if (_IOC_TYPE(cmd) != VMTIER_IOC_MAGIC ||
	    _IOC_DIR(cmd) != (_IOC_READ | _IOC_WRITE))
		return -ENOTTY;
	if (!capable(CAP_SYS_NICE))
		return -EPERM;
	switch (_IOC_NR(cmd)) {
	case VMTIER_IOC_NR_QUERY:
		return vt_ioctl_query(uarg, _IOC_SIZE(cmd));
	case VMTIER_IOC_NR_MIGRATE:
		return vt_ioctl_migrate(uarg, _IOC_SIZE(cmd));
	default:
		return -ENOTTY;
	}
}

static const struct file_operations vt_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = vt_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice vt_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "vmtier",
	.fops = &vt_fops,
	.mode = 0600,
};

static int vt_stats_show(struct seq_file *s, void *unused)
{
	int i;

	for (i = 0; i < VT_NR_STATS; i++)
		seq_printf(s, "%s %lld\n", vt_stat_names[i],
			   atomic64_read(&vmtier_stats[i]));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vt_stats);

static int __init vmtier_init(void)
{
	int ret;

	ret = vmtier_workers_init();
	if (ret)
		return ret;
	ret = vmtier_dma_init();
	if (ret)
		goto workers;
	ret = misc_register(&vt_misc);
	if (ret)
		goto dma;
	vt_debugfs = debugfs_create_dir("vmtier", NULL);
	debugfs_create_file("stats", 0444, vt_debugfs, NULL, &vt_stats_fops);
	pr_info("ready: %u housekeeping CPUs, %u copy threads by default, ABI %d\n",
		vmtier_housekeeping_cpus(), vmtier_default_threads(),
		VMTIER_ABI_VERSION);
	return 0;

dma:
	vmtier_dma_exit();
workers:
	vmtier_workers_exit();
	return ret;
}

static void __exit vmtier_exit(void)
{
	debugfs_remove_recursive(vt_debugfs);
	misc_deregister(&vt_misc);
	vmtier_dma_exit();
	vmtier_workers_exit();
}

module_init(vmtier_init);
module_exit(vmtier_exit);
MODULE_DESCRIPTION("vmtier: batched NUMA migration of VM memory with CPU and DMA copy engines");
MODULE_AUTHOR("vmtier authors");
MODULE_LICENSE("GPL");
