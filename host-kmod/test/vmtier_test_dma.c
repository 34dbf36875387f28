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
 * Knobs (module parameters, writable at run time):
 *   chans        channels to register (load time)
 *   fail_every   every Nth descriptor completes with DMA_TRANS_WRITE_FAILED
 *                without copying (0: never)
 *   stall_every  every Nth descriptor stalls for stall_ms before it runs,
 *                or until the client terminates the channel (0: never)
 *   stall_ms     length of a stall
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

	for (;;) {
		spin_lock_irqsave(&vc->lock, flags);
		d = list_first_entry_or_null(&vc->issued, struct vtd_desc, node);
		if (d)
			list_del(&d->node);
		spin_unlock_irqrestore(&vc->lock, flags);
		if (!d)
			return;
		n = atomic_inc_return(&vtd_seq);
		if (stall_every && !(n % stall_every)) {
			wait_event_timeout(vc->wq, READ_ONCE(vc->abort),
					   msecs_to_jiffies(stall_ms));
			if (READ_ONCE(vc->abort)) {
				kfree(d);
				continue;
			}
		}
		res.residue = 0;
		if (fail_every && !(n % fail_every)) {
			res.result = DMA_TRANS_WRITE_FAILED;
		} else {
			memcpy(phys_to_virt(dma_to_phys(dev, d->dst)),
			       phys_to_virt(dma_to_phys(dev, d->src)), d->len);
			res.result = DMA_TRANS_NOERROR;
		}
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

static int vtd_terminate_all(struct dma_chan *chan)
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
	vtd_terminate_all(chan);
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
	dev_info(&pdev->dev, "TEST ONLY software DMA_MEMCPY provider, %u channels\n",
		 i);
	return 0;
}

static void vtd_remove(struct platform_device *pdev)
{
	struct vtd_dev *vd = platform_get_drvdata(pdev);

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
