// SPDX-License-Identifier: GPL-2.0
/*
 * vmtier DMA copy engine: dmaengine DMA_MEMCPY channels (IOAT, IDXD in
 * dmaengine mode, PTDMA, ...). A batch is split in contiguous shares, one per
 * channel; each page is DMA-mapped and copied by one descriptor; completion is
 * awaited with a timeout. A page whose descriptor fails, times out or cannot
 * be prepared stays to be copied, and the caller copies it with the CPU.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/dma-mapping.h>
#include <linux/dmaengine.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/slab.h>

#include "vmtier_priv.h"

struct vmtier_dma {
	unsigned int n;
	struct dma_chan *chans[VMTIER_MAX_DMA_CHANS];
};

enum { VT_DMA_IDLE, VT_DMA_SUBMITTED, VT_DMA_OK, VT_DMA_ERR };

struct vt_dma_wait {
	atomic_t pending;
	struct completion done;
};

struct vt_dma_op {
	dma_addr_t src;
	dma_addr_t dst;
	struct device *dev;
	u8 state;
	struct vt_dma_wait *wait;
};

struct vmtier_dma *vmtier_dma_get(unsigned int want)
{
	struct vmtier_dma *d;
	dma_cap_mask_t mask;

	want = clamp_t(unsigned int, want, 1, VMTIER_MAX_DMA_CHANS);
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d)
		return NULL;
	dma_cap_zero(mask);
	dma_cap_set(DMA_MEMCPY, mask);
	while (d->n < want) {
		struct dma_chan *chan = dma_request_chan_by_mask(&mask);

		if (IS_ERR(chan))
			break;
		d->chans[d->n++] = chan;
	}
	if (!d->n) {
		kfree(d);
		return NULL;
	}
	return d;
}

void vmtier_dma_put(struct vmtier_dma *d)
{
	unsigned int i;

	for (i = 0; i < d->n; i++)
		dma_release_channel(d->chans[i]);
	kfree(d);
}

unsigned int vmtier_dma_nr_chans(struct vmtier_dma *d)
{
	return d->n;
}

static void vt_dma_done(void *param, const struct dmaengine_result *res)
{
	struct vt_dma_op *op = param;
	struct vt_dma_wait *w = op->wait;

	WRITE_ONCE(op->state, res && res->result != DMA_TRANS_NOERROR ?
		   VT_DMA_ERR : VT_DMA_OK);
	if (atomic_dec_and_test(&w->pending))
		complete(&w->done);
}

/* Maps and submits entry i of the batch on chan; false leaves it to the CPU. */
static bool vt_dma_submit(struct dma_chan *chan, struct vmtier_batch *b,
			  unsigned long i, struct vt_dma_op *op)
{
	struct device *dev = chan->device->dev;
	struct dma_async_tx_descriptor *tx;
	dma_cookie_t cookie;

	op->dev = dev;
	op->src = dma_map_page(dev, migrate_pfn_to_page(b->src[i]), 0,
			       PAGE_SIZE, DMA_TO_DEVICE);
	if (dma_mapping_error(dev, op->src))
		return false;
	op->dst = dma_map_page(dev, b->dpage[i], 0, PAGE_SIZE, DMA_FROM_DEVICE);
	if (dma_mapping_error(dev, op->dst))
		goto unmap_src;
	tx = dmaengine_prep_dma_memcpy(chan, op->dst, op->src, PAGE_SIZE,
				       DMA_PREP_INTERRUPT | DMA_CTRL_ACK);
	if (!tx)
		goto unmap_dst;
	tx->callback_result = vt_dma_done;
	tx->callback_param = op;
	op->state = VT_DMA_SUBMITTED;
	atomic_inc(&op->wait->pending);
	cookie = dmaengine_submit(tx);
	if (dma_submit_error(cookie)) {
		atomic_dec(&op->wait->pending);
		op->state = VT_DMA_IDLE;
		goto unmap_dst;
	}
	return true;

unmap_dst:
	dma_unmap_page(dev, op->dst, PAGE_SIZE, DMA_FROM_DEVICE);
unmap_src:
	dma_unmap_page(dev, op->src, PAGE_SIZE, DMA_TO_DEVICE);
	return false;
}

/**
 * vmtier_dma_copy() - copy the TODO entries of a batch by DMA
 * @d:	channels
 * @b:	batch whose TODO entries have destination pages
 *
 * Entries copied become VT_PAGE_DONE; the others stay VT_PAGE_TODO.
 *
 * Return: entries left to the CPU.
 */
unsigned long vmtier_dma_copy(struct vmtier_dma *d, struct vmtier_batch *b)
{
	struct vt_dma_wait wait;
	struct vt_dma_op *ops;
	unsigned long i, per, left = 0, errors = 0;
	unsigned int c;
	bool timed_out = false;

	ops = kvcalloc(b->npages, sizeof(*ops), GFP_KERNEL);
	if (!ops)
		return b->npages;
	atomic_set(&wait.pending, 1);	/* held until every page is submitted */
	init_completion(&wait.done);
	per = DIV_ROUND_UP(b->npages, d->n);
	for (i = 0; i < b->npages; i++) {
		ops[i].wait = &wait;
		if (b->state[i] != VT_PAGE_TODO || !b->dpage[i])
			continue;
		vt_dma_submit(d->chans[min_t(unsigned long, i / per, d->n - 1)],
			      b, i, &ops[i]);
	}
	for (c = 0; c < d->n; c++)
		dma_async_issue_pending(d->chans[c]);
	if (!atomic_dec_and_test(&wait.pending) &&
	    !wait_for_completion_timeout(&wait.done,
					 msecs_to_jiffies(vmtier_dma_timeout_ms))) {
		/* After terminate_sync no callback runs any more. */
		for (c = 0; c < d->n; c++)
			dmaengine_terminate_sync(d->chans[c]);
		timed_out = true;
		vt_stat_add(VT_STAT_DMA_TIMEOUTS, 1);
	}
	for (i = 0; i < b->npages; i++) {
		struct vt_dma_op *op = &ops[i];
		u8 state = READ_ONCE(op->state);

		if (state == VT_DMA_IDLE) {
			if (b->state[i] == VT_PAGE_TODO)
				left++;
			continue;
		}
		dma_unmap_page(op->dev, op->dst, PAGE_SIZE, DMA_FROM_DEVICE);
		dma_unmap_page(op->dev, op->src, PAGE_SIZE, DMA_TO_DEVICE);
		if (state == VT_DMA_OK) {
			b->state[i] = VT_PAGE_DONE;
		} else {
			errors += state == VT_DMA_ERR;
			left++;
		}
	}
	if (errors)
		vt_stat_add(VT_STAT_DMA_ERRORS, errors);
	if (timed_out || errors)
		pr_debug("DMA batch: %lu errors, timeout %d, %lu pages to CPU\n",
			 errors, timed_out, left);
	kvfree(ops);
	return left;
}

int vmtier_dma_query(struct vmtier_query *q)
{
	struct vmtier_dma *d = vmtier_dma_get(VMTIER_MAX_DMA_CHANS);
	unsigned int i;

	q->nr_dma_chans = 0;
	if (!d)
		return 0;
	q->nr_dma_chans = d->n;
	for (i = 0; i < d->n; i++)
		strscpy(q->dma_names[i], dma_chan_name(d->chans[i]),
			VMTIER_DMA_NAME_LEN);
	vmtier_dma_put(d);
	return 0;
}
