// SPDX-License-Identifier: GPL-2.0
/*
 * vmtier_test_dma: TEST ONLY. A software dmaengine provider with DMA_MEMCPY
 * channels whose "hardware" is a CPU memcpy in a work item, so that vmtier's
 * DMA client path (mapping, submission, completion, errors, timeouts,
 * terminate) runs for real where no DMA engine exists (the QEMU testbed).
 *
 * It assumes dma-direct mapping (no IOMMU) and is never built for or
 * installed on a production host.
 *
 * Knobs (module parameters, writable at run time), one per fault mode:
 *   chans        channels to register (load time)
 *   fail_every   error completion: every Nth descriptor scribbles over its
 *                destination and completes with DMA_TRANS_WRITE_FAILED
 *   stall_every  every Nth descriptor stalls for stall_ms before it runs, or
 *                until the client terminates the channel (0: never)
 *   stall_ms     length of a stall
 *   terminate    0: device_terminate_all refuses (-EINVAL), as on engines
 *                without it (IOAT, IDXD on 6.12): stalled descriptors then
 *                complete late, writing their destination after the
 *                client's timeout
 *   stuck        1: the channels run nothing until it is cleared again
 * Counters (read only): completed, failed, stalled_completions,
 * refused_terminates.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-direct.h>
#include <linux/dma-mapping.h>
#include <linux/dmaengine.h>
#include <linux/module.h>
#include <linux/platform_device.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#define VTD_NAME	"vmtier_test_dma"
#define VTD_MAX_CHANS	8

static unsigned int chans = 2;
module_param(chans, uint, 0444);
MODULE_PARM_DESC(chans, "DMA_MEMCPY channels to register (1-8)");

static unsigned int fail_every;
module_param(fail_every, uint, 0644);
MODULE_PARM_DESC(fail_every, "Fail every Nth descriptor (0: never)");

static unsigned int stall_every;
module_param(stall_every, uint, 0644);
MODULE_PARM_DESC(stall_every, "Stall every Nth descriptor (0: never)");

static unsigned int stall_ms = 5000;
module_param(stall_ms, uint, 0644);
MODULE_PARM_DESC(stall_ms, "Length of a stall (ms)");

static bool terminate = true;
module_param(terminate, bool, 0644);
MODULE_PARM_DESC(terminate, "Implement terminate (0: refuse it like IOAT/IDXD)");

static int vtd_set_stuck(const char *val, const struct kernel_param *kp);
static const struct kernel_param_ops vtd_stuck_ops = {
	.set = vtd_set_stuck,
	.get = param_get_bool,
};

static bool stuck;
module_param_cb(stuck, &vtd_stuck_ops, &stuck, 0644);
MODULE_PARM_DESC(stuck, "Run nothing until cleared (a hung engine)");

static atomic_t completed = ATOMIC_INIT(0);
module_param_named(completed, completed.counter, int, 0444);
MODULE_PARM_DESC(completed, "Descriptors completed");

static atomic_t failed = ATOMIC_INIT(0);
module_param_named(failed, failed.counter, int, 0444);
MODULE_PARM_DESC(failed, "Descriptors completed with an error");

static atomic_t stalled_completions = ATOMIC_INIT(0);
module_param_named(stalled_completions, stalled_completions.counter, int, 0444);
MODULE_PARM_DESC(stalled_completions, "Stalled descriptors that ran after their stall");

static atomic_t refused_terminates = ATOMIC_INIT(0);
module_param_named(refused_terminates, refused_terminates.counter, int, 0444);
MODULE_PARM_DESC(refused_terminates, "Terminate requests refused");

static atomic_t vtd_seq = ATOMIC_INIT(0);

struct vtd_desc {
	struct dma_async_tx_descriptor tx;
	struct list_head node;
	dma_addr_t src;
	dma_addr_t dst;
	size_t len;
};

struct vtd_chan {
	struct dma_chan chan;
	spinlock_t lock;		/* protects the lists and cookies */
	struct list_head submitted;
	struct list_head issued;
	struct work_struct work;
	wait_queue_head_t wq;
	bool abort;
};

struct vtd_dev {
	struct dma_device dd;
	struct vtd_chan chan[VTD_MAX_CHANS];
};

static struct platform_device *vtd_pdev;
static struct vtd_dev *vtd_dev;
static unsigned int vtd_nchans;

static struct vtd_chan *to_vtd_chan(struct dma_chan *c)
{
	return container_of(c, struct vtd_chan, chan);
}

static dma_cookie_t vtd_tx_submit(struct dma_async_tx_descriptor *tx)
{
	struct vtd_chan *vc = to_vtd_chan(tx->chan);
	struct vtd_desc *d = container_of(tx, struct vtd_desc, tx);
	unsigned long flags;
	dma_cookie_t cookie;

	spin_lock_irqsave(&vc->lock, flags);
	cookie = vc->chan.cookie + 1;
	if (cookie < DMA_MIN_COOKIE)
		cookie = DMA_MIN_COOKIE;
	vc->chan.cookie = cookie;
	tx->cookie = cookie;
	list_add_tail(&d->node, &vc->submitted);
	spin_unlock_irqrestore(&vc->lock, flags);
	return cookie;
}

static struct dma_async_tx_descriptor *
vtd_prep_memcpy(struct dma_chan *chan, dma_addr_t dst, dma_addr_t src,
		size_t len, unsigned long flags)
{
	struct vtd_desc *d = kzalloc(sizeof(*d), GFP_NOWAIT);

	if (!d)
		return NULL;
	dma_async_tx_descriptor_init(&d->tx, chan);
	d->tx.tx_submit = vtd_tx_submit;
	d->tx.flags = flags;
	d->src = src;
	d->dst = dst;
	d->len = len;
	return &d->tx;
}

static void vtd_issue_pending(struct dma_chan *chan)
{
	struct vtd_chan *vc = to_vtd_chan(chan);
	unsigned long flags;

	spin_lock_irqsave(&vc->lock, flags);
	list_splice_tail_init(&vc->submitted, &vc->issued);
	spin_unlock_irqrestore(&vc->lock, flags);
	queue_work(system_unbound_wq, &vc->work);
}

static void vtd_work(struct work_struct *work)
{
	struct vtd_chan *vc = container_of(work, struct vtd_chan, work);
	struct device *dev = vc->chan.device->dev;
	struct dmaengine_result res;
	dma_async_tx_callback_result cb_result;
	dma_async_tx_callback cb;
	void *cb_param;
	struct vtd_desc *d;
	unsigned long flags;
	unsigned int n;
	bool stalled;
	void *dst;

	for (;;) {
		if (READ_ONCE(stuck))
			return;		/* vtd_set_stuck() requeues */
		spin_lock_irqsave(&vc->lock, flags);
		d = list_first_entry_or_null(&vc->issued, struct vtd_desc, node);
		if (d)
			list_del(&d->node);
		spin_unlock_irqrestore(&vc->lock, flags);
		if (!d)
			return;
		n = atomic_inc_return(&vtd_seq);
		stalled = stall_every && !(n % stall_every);
		if (stalled) {
			wait_event_timeout(vc->wq, READ_ONCE(vc->abort),
					   msecs_to_jiffies(stall_ms));
			if (READ_ONCE(vc->abort)) {
				kfree(d);
				continue;
			}
		}
		res.residue = 0;
		dst = phys_to_virt(dma_to_phys(dev, d->dst));
		if (fail_every && !(n % fail_every)) {
			/* A failed write may leave anything behind. */
			memset(dst, 0x5a, d->len);
			res.result = DMA_TRANS_WRITE_FAILED;
			atomic_inc(&failed);
		} else {
			memcpy(dst, phys_to_virt(dma_to_phys(dev, d->src)),
			       d->len);
			res.result = DMA_TRANS_NOERROR;
		}
		atomic_inc(&completed);
		if (stalled)
			atomic_inc(&stalled_completions);
		spin_lock_irqsave(&vc->lock, flags);
		vc->chan.completed_cookie = d->tx.cookie;
		spin_unlock_irqrestore(&vc->lock, flags);
		cb = d->tx.callback;
		cb_result = d->tx.callback_result;
		cb_param = d->tx.callback_param;
		if (cb_result)
			cb_result(cb_param, &res);
		else if (cb)
			cb(cb_param);
		kfree(d);
	}
}

static enum dma_status vtd_tx_status(struct dma_chan *chan,
				     dma_cookie_t cookie,
				     struct dma_tx_state *state)
{
	struct vtd_chan *vc = to_vtd_chan(chan);
	dma_cookie_t used, done;
	unsigned long flags;

	spin_lock_irqsave(&vc->lock, flags);
	used = chan->cookie;
	done = chan->completed_cookie;
	spin_unlock_irqrestore(&vc->lock, flags);
	dma_set_tx_state(state, done, used, 0);
	return dma_async_is_complete(cookie, done, used);
}

static void vtd_free_list(struct list_head *list)
{
	struct vtd_desc *d, *tmp;

	list_for_each_entry_safe(d, tmp, list, node) {
		list_del(&d->node);
		kfree(d);
	}
}

static void vtd_kill_all(struct dma_chan *chan)
{
	struct vtd_chan *vc = to_vtd_chan(chan);
	unsigned long flags;
	LIST_HEAD(dead);

	spin_lock_irqsave(&vc->lock, flags);
	WRITE_ONCE(vc->abort, true);
	list_splice_init(&vc->submitted, &dead);
	list_splice_init(&vc->issued, &dead);
	spin_unlock_irqrestore(&vc->lock, flags);
	wake_up(&vc->wq);
	vtd_free_list(&dead);
}

static int vtd_terminate_all(struct dma_chan *chan)
{
	if (!READ_ONCE(terminate)) {
		/* What dmaengine_terminate_async() returns without the op. */
		atomic_inc(&refused_terminates);
		return -EINVAL;
	}
	vtd_kill_all(chan);
	return 0;
}

static int vtd_set_stuck(const char *val, const struct kernel_param *kp)
{
	unsigned int i;
	int ret = param_set_bool(val, kp);

	if (ret || READ_ONCE(stuck) || !vtd_dev)
		return ret;
	for (i = 0; i < vtd_nchans; i++)
		queue_work(system_unbound_wq, &vtd_dev->chan[i].work);
	return 0;
}

static void vtd_synchronize(struct dma_chan *chan)
{
	struct vtd_chan *vc = to_vtd_chan(chan);

	flush_work(&vc->work);
	WRITE_ONCE(vc->abort, false);
}

static int vtd_alloc_chan_resources(struct dma_chan *chan)
{
	return 0;
}

static void vtd_free_chan_resources(struct dma_chan *chan)
{
	struct vtd_chan *vc = to_vtd_chan(chan);
	unsigned long flags;
	LIST_HEAD(dead);

	if (!READ_ONCE(terminate)) {
		/*
		 * An engine that cannot be stopped: what was issued still runs
		 * (and calls back), even after the client let go of the channel.
		 */
		spin_lock_irqsave(&vc->lock, flags);
		list_splice_init(&vc->submitted, &dead);
		spin_unlock_irqrestore(&vc->lock, flags);
		vtd_free_list(&dead);
		return;
	}
	vtd_kill_all(chan);
	vtd_synchronize(chan);
}

static int vtd_probe(struct platform_device *pdev)
{
	struct vtd_dev *vd;
	struct dma_device *dd;
	unsigned int i;
	int ret;

	ret = dma_coerce_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		return ret;
	vd = devm_kzalloc(&pdev->dev, sizeof(*vd), GFP_KERNEL);
	if (!vd)
		return -ENOMEM;
	dd = &vd->dd;
	dd->dev = &pdev->dev;
	INIT_LIST_HEAD(&dd->channels);
	dma_cap_set(DMA_MEMCPY, dd->cap_mask);
	dd->device_alloc_chan_resources = vtd_alloc_chan_resources;
	dd->device_free_chan_resources = vtd_free_chan_resources;
	dd->device_prep_dma_memcpy = vtd_prep_memcpy;
	dd->device_issue_pending = vtd_issue_pending;
	dd->device_tx_status = vtd_tx_status;
	dd->device_terminate_all = vtd_terminate_all;
	dd->device_synchronize = vtd_synchronize;
	for (i = 0; i < clamp(chans, 1U, (unsigned int)VTD_MAX_CHANS); i++) {
		struct vtd_chan *vc = &vd->chan[i];

		spin_lock_init(&vc->lock);
		INIT_LIST_HEAD(&vc->submitted);
		INIT_LIST_HEAD(&vc->issued);
		INIT_WORK(&vc->work, vtd_work);
		init_waitqueue_head(&vc->wq);
		vc->chan.device = dd;
		vc->chan.cookie = DMA_MIN_COOKIE;
		vc->chan.completed_cookie = DMA_MIN_COOKIE;
		list_add_tail(&vc->chan.device_node, &dd->channels);
	}
	ret = dma_async_device_register(dd);
	if (ret)
		return ret;
	platform_set_drvdata(pdev, vd);
	vtd_nchans = i;
	WRITE_ONCE(vtd_dev, vd);
	dev_info(&pdev->dev, "TEST ONLY software DMA_MEMCPY provider, %u channels\n",
		 i);
	return 0;
}

static void vtd_remove(struct platform_device *pdev)
{
	struct vtd_dev *vd = platform_get_drvdata(pdev);
	unsigned int i;

	WRITE_ONCE(vtd_dev, NULL);
	/* Whatever still runs must be gone before the channels are. */
	for (i = 0; i < vtd_nchans; i++) {
		vtd_kill_all(&vd->chan[i].chan);
		vtd_synchronize(&vd->chan[i].chan);
	}
	dma_async_device_unregister(&vd->dd);
}

static struct platform_driver vtd_driver = {
	.driver = { .name = VTD_NAME },
	.probe = vtd_probe,
	.remove = vtd_remove,
};

static int __init vtd_init(void)
{
	int ret = platform_driver_register(&vtd_driver);

	if (ret)
		return ret;
	vtd_pdev = platform_device_register_simple(VTD_NAME, -1, NULL, 0);
	if (IS_ERR(vtd_pdev)) {
		platform_driver_unregister(&vtd_driver);
		return PTR_ERR(vtd_pdev);
	}
	return 0;
}

static void __exit vtd_exit(void)
{
	platform_device_unregister(vtd_pdev);
	platform_driver_unregister(&vtd_driver);
}

module_init(vtd_init);
module_exit(vtd_exit);
MODULE_DESCRIPTION("TEST ONLY: software dmaengine DMA_MEMCPY provider for vmtier's testbed");
MODULE_LICENSE("GPL");
