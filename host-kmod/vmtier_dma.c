// SPDX-License-Identifier: GPL-2.0
/*
 * vmtier DMA copy engine: dmaengine DMA_MEMCPY channels (IOAT, IDXD in
 * dmaengine mode, PTDMA, ...).
 *
 * Channels are requested on first use and kept across calls; they are
 * released after dma_idle_ms without use (so that a DMA driver can unload)
 * and when vmtier unloads. Copies are serialized on them: one batch at a time
 * owns every channel, so a timeout only ever stops the batch's own
 * descriptors.
 *
 * A batch is split in contiguous shares, one per channel; each page is
 * DMA-mapped (on dmaengine_get_dma_device()) and copied by one descriptor.
 * The per-batch state lives in a reference-counted transfer that every
 * descriptor in flight holds, never on the stack. When the wait times out:
 *
 *  - channels whose terminate succeeds run no callback any more: their
 *    unfinished pages are copied by the CPU into the same destination;
 *  - channels that cannot terminate (no device_terminate_all, as IOAT and
 *    IDXD on 6.12) get one more timeout to finish. Descriptors still running
 *    after that are abandoned: their destination page, the DMA mappings and a
 *    reference on the source page stay with the transfer until the engine
 *    completes them; the source page is put back in place (dst = 0), the
 *    channel is retired, and the module cannot unload until the last one
 *    completes.
 *
 * So no page is unmapped, freed or mapped into the target while a descriptor
 * that writes it may still run.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/device.h>
#include <linux/dma-mapping.h>
#include <linux/dmaengine.h>
#include <linux/jiffies.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pagemap.h>
#include <linux/rcupdate.h>
#include <linux/refcount.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#include "vmtier_priv.h"

enum {
	VT_DMA_IDLE,		/* not submitted: the CPU copies it */
	VT_DMA_SUBMITTED,	/* in flight */
	VT_DMA_OK,		/* completed */
	VT_DMA_ERR,		/* completed with an error */
	VT_DMA_TERMINATED,	/* stopped by a successful terminate */
	VT_DMA_ABANDONED,	/* may still run; the transfer keeps its pages */
};

struct vt_dma_xfer;

struct vt_dma_op {
	dma_addr_t src;
	dma_addr_t dst;
	struct page *spage;	/* referenced while abandoned */
	struct page *dpage;	/* owned while abandoned */
	struct vt_dma_xfer *x;
	atomic_t state;
	u8 chan;
};

/**
 * struct vt_dma_xfer - the DMA side of one batch
 * @ref:	one for the submitter, one per descriptor submitted
 * @pending:	descriptors whose callback has not run, plus one while
 *		submitting
 * @done:	completed when @pending drops to zero
 * @chans:	channels used, by index in vt_dma_op.chan
 * @dev:	their DMA devices
 * @nchans:	channels used
 * @retired:	channels this transfer owns because they could not stop
 * @module_ref:	a module reference is held while callbacks may come
 * @free_work:	frees the transfer (and what it owns) in process context
 * @n:		entries in @ops
 * @ops:	one per batch entry
 */
struct vt_dma_xfer {
	refcount_t ref;
	atomic_t pending;
	struct completion done;
	struct dma_chan *chans[VMTIER_MAX_DMA_CHANS];
	struct device *dev[VMTIER_MAX_DMA_CHANS];
	unsigned int nchans;
	unsigned long retired;
	bool module_ref;
	struct work_struct free_work;
	unsigned long n;
	struct vt_dma_op ops[] __counted_by(n);
};

/* The channel set; vt_dma_lock also serializes copies. */
static DEFINE_MUTEX(vt_dma_lock);
static struct dma_chan *vt_chans[VMTIER_MAX_DMA_CHANS];
static unsigned int vt_nchans;
static unsigned long vt_dma_last_use;
/* Ask for more channels: at first, and after a retired one was released. */
static bool vt_dma_topup = true;
static struct workqueue_struct *vt_dma_wq;

static void vt_dma_idle_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(vt_dma_idle, vt_dma_idle_fn);

/*
 * Requests channels when none are held, or more after a retired one came
 * back. Called with vt_dma_lock held.
 */
static void vt_dma_ensure(void)
{
	dma_cap_mask_t mask;

	lockdep_assert_held(&vt_dma_lock);
	if (vt_nchans && !READ_ONCE(vt_dma_topup))
		return;
	WRITE_ONCE(vt_dma_topup, false);
	dma_cap_zero(mask);
	dma_cap_set(DMA_MEMCPY, mask);
	while (vt_nchans < VMTIER_MAX_DMA_CHANS) {
		struct dma_chan *chan = dma_request_chan_by_mask(&mask);

		if (IS_ERR(chan))
			break;
		vt_chans[vt_nchans++] = chan;
		vt_stat_add(VT_STAT_DMA_CHAN_REQUESTS, 1);
		vt_stat_add(VT_STAT_DMA_CHANS_HELD, 1);
	}
}

static void vt_dma_release_all(void)
{
	lockdep_assert_held(&vt_dma_lock);
	while (vt_nchans) {
		dma_release_channel(vt_chans[--vt_nchans]);
		vt_chans[vt_nchans] = NULL;
		vt_stat_add(VT_STAT_DMA_CHANS_HELD, -1);
	}
}

/* Marks the set used now and arms its release after dma_idle_ms. */
static void vt_dma_touch(void)
{
	lockdep_assert_held(&vt_dma_lock);
	vt_dma_last_use = jiffies;
	if (vt_nchans)
		mod_delayed_work(system_wq, &vt_dma_idle,
				 msecs_to_jiffies(READ_ONCE(vmtier_dma_idle_ms)));
}

static void vt_dma_idle_fn(struct work_struct *work)
{
	unsigned long idle = msecs_to_jiffies(READ_ONCE(vmtier_dma_idle_ms));

	mutex_lock(&vt_dma_lock);
	if (time_after_eq(jiffies, vt_dma_last_use + idle))
		vt_dma_release_all();
	else if (vt_nchans)
		mod_delayed_work(system_wq, &vt_dma_idle,
				 vt_dma_last_use + idle - jiffies);
	mutex_unlock(&vt_dma_lock);
}

/* Removes a channel from the set: the caller now owns it. */
static void vt_dma_retire(struct dma_chan *chan)
{
	unsigned int i;

	lockdep_assert_held(&vt_dma_lock);
	for (i = 0; i < vt_nchans; i++) {
		if (vt_chans[i] != chan)
			continue;
		vt_chans[i] = vt_chans[--vt_nchans];
		vt_chans[vt_nchans] = NULL;
		vt_stat_add(VT_STAT_DMA_CHANS_HELD, -1);
		vt_stat_add(VT_STAT_DMA_CHANS_SICK, 1);
		return;
	}
}

static void vt_dma_free_fn(struct work_struct *work)
{
	struct vt_dma_xfer *x = container_of(work, struct vt_dma_xfer,
					     free_work);
	bool module_ref = x->module_ref;
	unsigned long i, freed = 0;
	unsigned int c;

	for (i = 0; i < x->n; i++) {
		struct vt_dma_op *op = &x->ops[i];

		if (atomic_read(&op->state) != VT_DMA_ABANDONED)
			continue;
		/* The engine is done with it at last. */
		dma_unmap_page(x->dev[op->chan], op->dst, PAGE_SIZE,
			       DMA_FROM_DEVICE);
		dma_unmap_page(x->dev[op->chan], op->src, PAGE_SIZE,
			       DMA_TO_DEVICE);
		put_page(op->spage);
		vmtier_free_dst(op->dpage);
		freed++;
	}
	if (freed) {
		vt_stat_add(VT_STAT_DST_ABANDONED_FREED, freed);
		vt_stat_add(VT_STAT_DMA_ABANDONED_LIVE, -freed);
	}
	for (c = 0; c < x->nchans; c++) {
		if (!(x->retired & BIT(c)))
			continue;
		dma_release_channel(x->chans[c]);
		vt_stat_add(VT_STAT_DMA_CHANS_SICK, -1);
		WRITE_ONCE(vt_dma_topup, true);
	}
	kvfree(x);
	if (module_ref) {
		/* Let the last callback leave its RCU section first. */
		synchronize_rcu();
		module_put(THIS_MODULE);
	}
}

static void vt_xfer_put(struct vt_dma_xfer *x)
{
	if (refcount_dec_and_test(&x->ref))
		queue_work(vt_dma_wq, &x->free_work);
}

static void vt_dma_done(void *param, const struct dmaengine_result *res)
{
	struct vt_dma_op *op = param;
	struct vt_dma_xfer *x = op->x;
	int st = res && res->result != DMA_TRANS_NOERROR ? VT_DMA_ERR :
							   VT_DMA_OK;

	rcu_read_lock();
	/* An abandoned op stays abandoned: the free work cleans it up. */
	atomic_cmpxchg(&op->state, VT_DMA_SUBMITTED, st);
	if (atomic_dec_and_test(&x->pending))
		complete(&x->done);
	vt_xfer_put(x);
	rcu_read_unlock();
}

/* Maps and submits entry i of the batch on channel c; false leaves it. */
static bool vt_dma_submit(struct vt_dma_xfer *x, unsigned int c,
			  struct vmtier_batch *b, unsigned long i)
{
	struct vt_dma_op *op = &x->ops[i];
	struct device *dev = x->dev[c];
	struct dma_async_tx_descriptor *tx;
	dma_cookie_t cookie;

	op->chan = c;
	op->src = dma_map_page(dev, migrate_pfn_to_page(b->src[i]), 0,
			       PAGE_SIZE, DMA_TO_DEVICE);
	if (dma_mapping_error(dev, op->src))
		return false;
	op->dst = dma_map_page(dev, b->dpage[i], 0, PAGE_SIZE, DMA_FROM_DEVICE);
	if (dma_mapping_error(dev, op->dst))
		goto unmap_src;
	tx = dmaengine_prep_dma_memcpy(x->chans[c], op->dst, op->src, PAGE_SIZE,
				       DMA_PREP_INTERRUPT | DMA_CTRL_ACK);
	if (!tx)
		goto unmap_dst;
	tx->callback_result = vt_dma_done;
	tx->callback_param = op;
	atomic_set(&op->state, VT_DMA_SUBMITTED);
	refcount_inc(&x->ref);
	atomic_inc(&x->pending);
	cookie = dmaengine_submit(tx);
	if (dma_submit_error(cookie)) {
		atomic_dec(&x->pending);
		refcount_dec(&x->ref);
		atomic_set(&op->state, VT_DMA_IDLE);
		goto unmap_dst;
	}
	return true;

unmap_dst:
	dma_unmap_page(dev, op->dst, PAGE_SIZE, DMA_FROM_DEVICE);
unmap_src:
	dma_unmap_page(dev, op->src, PAGE_SIZE, DMA_TO_DEVICE);
	return false;
}

/* Stops descriptors the callbacks will never report; see the file comment. */
static unsigned long vt_dma_stop(struct vt_dma_xfer *x, struct vmtier_batch *b)
{
	unsigned long tmo = msecs_to_jiffies(READ_ONCE(vmtier_dma_timeout_ms));
	unsigned long stopped = 0, i, abandoned = 0;
	unsigned long term_ok = 0;
	unsigned int c;

	vt_stat_add(VT_STAT_DMA_TIMEOUTS, 1);
	for (c = 0; c < x->nchans; c++) {
		if (!dmaengine_terminate_sync(x->chans[c]))
			term_ok |= BIT(c);
		else
			vt_stat_add(VT_STAT_DMA_TERMINATE_FAILED, 1);
	}
	/* No callback comes any more from a terminated channel. */
	for (i = 0; i < x->n; i++) {
		struct vt_dma_op *op = &x->ops[i];

		if (!(term_ok & BIT(op->chan)) ||
		    atomic_cmpxchg(&op->state, VT_DMA_SUBMITTED,
				   VT_DMA_TERMINATED) != VT_DMA_SUBMITTED)
			continue;
		stopped++;
		refcount_dec(&x->ref);	/* the submitter still holds one */
	}
	if (stopped && atomic_sub_and_test(stopped, &x->pending))
		complete(&x->done);
	/* The others get one more timeout to finish. */
	if (atomic_read(&x->pending) > 0)
		wait_for_completion_timeout(&x->done, tmo);
	if (atomic_read(&x->pending) <= 0)
		return 0;
	for (i = 0; i < x->n; i++) {
		struct vt_dma_op *op = &x->ops[i];

		if (atomic_cmpxchg(&op->state, VT_DMA_SUBMITTED,
				   VT_DMA_ABANDONED) != VT_DMA_SUBMITTED)
			continue;
		/* The transfer keeps what the engine may still touch. */
		op->dpage = b->dpage[i];
		op->spage = migrate_pfn_to_page(b->src[i]);
		get_page(op->spage);
		b->dpage[i] = NULL;
		b->state[i] = VT_PAGE_GIVEN_UP;
		x->retired |= BIT(op->chan);
		abandoned++;
	}
	if (abandoned) {
		for (c = 0; c < x->nchans; c++)
			if (x->retired & BIT(c))
				vt_dma_retire(x->chans[c]);
		__module_get(THIS_MODULE);
		x->module_ref = true;
		vt_stat_add(VT_STAT_DMA_ABANDONED, abandoned);
		vt_stat_add(VT_STAT_DMA_ABANDONED_LIVE, abandoned);
		pr_warn_ratelimited("DMA: %lu pages abandoned to a channel that neither completes nor terminates\n",
				    abandoned);
	}
	return abandoned;
}

/**
 * vmtier_dma_copy() - copy the TODO entries of a batch by DMA
 * @b:		batch whose TODO entries have destination pages
 * @want:	channels to use at most
 * @res:	what happened
 *
 * Entries copied become VT_PAGE_DONE; entries given up become
 * VT_PAGE_GIVEN_UP with dpage NULL (the DMA side owns it); the others stay
 * VT_PAGE_TODO for the CPU.
 *
 * Return: false if no channel is available (nothing was done).
 */
bool vmtier_dma_copy(struct vmtier_batch *b, unsigned int want,
		     struct vmtier_dma_result *res)
{
	unsigned long tmo = msecs_to_jiffies(READ_ONCE(vmtier_dma_timeout_ms));
	unsigned long i, per, errors = 0;
	struct vt_dma_xfer *x;
	unsigned int c;

	memset(res, 0, sizeof(*res));
	if (mutex_lock_interruptible(&vt_dma_lock))
		return false;
	vt_dma_ensure();
	if (!vt_nchans) {
		mutex_unlock(&vt_dma_lock);
		return false;
	}
	x = kvzalloc(struct_size(x, ops, b->npages), GFP_KERNEL);
	if (!x) {
		vt_dma_touch();
		mutex_unlock(&vt_dma_lock);
		for (i = 0; i < b->npages; i++)
			res->fallbacks += b->state[i] == VT_PAGE_TODO;
		return true;
	}
	x->n = b->npages;
	refcount_set(&x->ref, 1);
	atomic_set(&x->pending, 1);	/* held until every page is submitted */
	init_completion(&x->done);
	INIT_WORK(&x->free_work, vt_dma_free_fn);
	x->nchans = clamp_t(unsigned int, want, 1, vt_nchans);
	for (c = 0; c < x->nchans; c++) {
		x->chans[c] = vt_chans[c];
		x->dev[c] = dmaengine_get_dma_device(vt_chans[c]);
	}
	res->chans = x->nchans;

	per = DIV_ROUND_UP(b->npages, x->nchans);
	for (i = 0; i < b->npages; i++) {
		x->ops[i].x = x;
		if (b->state[i] != VT_PAGE_TODO || !b->dpage[i])
			continue;
		vt_dma_submit(x, min_t(unsigned long, i / per, x->nchans - 1),
			      b, i);
	}
	for (c = 0; c < x->nchans; c++)
		dma_async_issue_pending(x->chans[c]);
	if (!atomic_dec_and_test(&x->pending) &&
	    !wait_for_completion_timeout(&x->done, tmo))
		res->abandoned = vt_dma_stop(x, b);

	for (i = 0; i < b->npages; i++) {
		struct vt_dma_op *op = &x->ops[i];
		int state = atomic_read(&op->state);

		if (b->state[i] != VT_PAGE_TODO)
			continue;
		if (state == VT_DMA_IDLE) {
			res->fallbacks++;
			continue;
		}
		dma_unmap_page(x->dev[op->chan], op->dst, PAGE_SIZE,
			       DMA_FROM_DEVICE);
		dma_unmap_page(x->dev[op->chan], op->src, PAGE_SIZE,
			       DMA_TO_DEVICE);
		if (state == VT_DMA_OK) {
			b->state[i] = VT_PAGE_DONE;
			res->copied++;
		} else {
			/* Error or terminated: the CPU rewrites the page. */
			errors += state == VT_DMA_ERR;
			res->fallbacks++;
		}
	}
	if (errors)
		vt_stat_add(VT_STAT_DMA_ERRORS, errors);
	vt_dma_touch();
	mutex_unlock(&vt_dma_lock);
	vt_xfer_put(x);
	return true;
}

bool vmtier_dma_available(void)
{
	bool any;

	mutex_lock(&vt_dma_lock);
	vt_dma_ensure();
	any = vt_nchans > 0;
	vt_dma_touch();
	mutex_unlock(&vt_dma_lock);
	return any;
}

int vmtier_dma_query(struct vmtier_query *q)
{
	unsigned int i;

	mutex_lock(&vt_dma_lock);
	vt_dma_ensure();
	q->nr_dma_chans = vt_nchans;
	for (i = 0; i < vt_nchans; i++) {
		strscpy(q->dma_names[i], dma_chan_name(vt_chans[i]),
			VMTIER_DMA_NAME_LEN);
		strscpy(q->dma_drivers[i],
			dev_driver_string(vt_chans[i]->device->dev),
			VMTIER_DMA_NAME_LEN);
	}
	vt_dma_touch();
	mutex_unlock(&vt_dma_lock);
	return 0;
}

int vmtier_dma_init(void)
{
	vt_dma_wq = alloc_workqueue("vmtier_dma", WQ_UNBOUND, 0);
	return vt_dma_wq ? 0 : -ENOMEM;
}

/*
 * Unload: no call is running and no transfer is left with descriptors in
 * flight (each holds a module reference).
 */
void vmtier_dma_exit(void)
{
	cancel_delayed_work_sync(&vt_dma_idle);
	mutex_lock(&vt_dma_lock);
	vt_dma_release_all();
	mutex_unlock(&vt_dma_lock);
	/* Callbacks that completed the last calls have left vt_dma_done(). */
	synchronize_rcu();
	destroy_workqueue(vt_dma_wq);
}
