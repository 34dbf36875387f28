//! vmtierd's guest hint channel, from the bytes a guest writes to the ones the policy acts
//! on: the protocol's incremental decoder, the session rules, the token buckets, the range
//! checks against the VM's RAM (`HintChannel::ingest`, the function the socket reader
//! calls), then the trust side (`HintTracker::step`) over a hotness store.
//!
//! Besides "no panic": the decoder holds at most one frame, pending replies and live ranges
//! stay within their bounds, every live range lies in guest RAM, the policy's hints are
//! sorted, disjoint, inside the VM and their hot part within the budget share; and every
//! frame the decoder accepts re-encodes to a frame that decodes to itself.

#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use vmtier_core::policy::HintKind;
use vmtier_core::{Backing, GranuleSize, GuestMemoryLayout, GuestPhysAddr, GuestRamRange};
use vmtier_core::{HostVirtAddr, ProcessId, RegionAccess};
use vmtier_daemon::hints::{HintChannel, HintTracker, HintsConfig, MAX_PENDING_REPLY_BYTES};
use vmtier_hint_proto::{Decoder, MAX_FRAME_BYTES, MAX_LIVE_RANGES};
use vmtier_sources::store::{HotnessStore, StoreConfig};

const MIB: u64 = 1 << 20;

/// 8 MiB at GPA 0 and 8 MiB at 4 GiB: in-RAM, between-range and beyond-RAM ranges all exist.
fn layout() -> GuestMemoryLayout {
    let r = |name: &str, gpa: u64, hva: u64| GuestRamRange {
        name: name.into(),
        gpa: GuestPhysAddr(gpa),
        hva: HostVirtAddr::new(hva),
        len: 8 * MIB,
        backing: Backing::PrivateAnon,
    };
    GuestMemoryLayout::new(
        ProcessId::new(1),
        vec![
            r("low", 0, 0x7f00_0000_0000),
            r("high", 4 << 30, 0x7f00_0080_0000),
        ],
    )
    .expect("a valid layout")
}

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, stream)) = data.split_first() else {
        return;
    };
    let l = layout();
    // The stream arrives in chunks of 1..=64 bytes, 0..=1.5 s apart (the token buckets
    // refill with time).
    let chunk = usize::from(knobs & 0x3f) + 1;
    let gap = Duration::from_millis(u64::from(knobs >> 6) * 500);
    let mut cfg = HintsConfig::new("/nonexistent/vmtier-fuzz.sock".into());
    cfg.frames_per_s = 1000;
    let t0 = Instant::now();
    let mut ch = HintChannel::new("fuzz", cfg, t0);
    let mut now = t0;
    for c in stream.chunks(chunk) {
        now += gap;
        ch.ingest(c, &l, now);
        assert!(ch.buffered_bytes() <= MAX_FRAME_BYTES);
        assert!(ch.pending_reply_bytes() <= MAX_PENDING_REPLY_BYTES);
    }
    let live = ch.live().to_vec();
    assert!(live.len() <= MAX_LIVE_RANGES);
    for r in &live {
        let r = r.range;
        assert!(
            l.ranges
                .iter()
                .any(|m| m.gpa.0 <= r.gpa && r.gpa + r.len <= m.gpa.0 + m.len),
            "{r:?} outside RAM"
        );
    }

    // The trust side over 4 KiB granules, some of them hot.
    let mut store = HotnessStore::new(
        &l,
        StoreConfig {
            granule: GranuleSize::BASE,
            ..StoreConfig::default()
        },
    )
    .expect("a store");
    store.observe(&[RegionAccess {
        start: HostVirtAddr::new(0x7f00_0000_0000),
        len: 2 * MIB,
        hits: 20,
        samples: 20,
    }]);
    let budget = u64::from(knobs) * 16;
    let mut t = HintTracker::new(2, 50);
    for _ in 0..3 {
        let hints = t.step(&live, &store, budget);
        let mut end = 0u64;
        let mut hot = 0u64;
        for h in hints {
            assert!(u64::from(h.start.0) >= end, "sorted and disjoint");
            assert!(h.len > 0 && h.weight > 0);
            end = u64::from(h.start.0) + u64::from(h.len);
            assert!(end <= store.len() as u64, "inside the VM");
            if matches!(h.kind, HintKind::Hot | HintKind::Pinned) {
                hot += u64::from(h.len);
            }
        }
        assert!(hot <= budget / 2, "{hot} hot granules, budget {budget}");
        store.tick();
    }

    // The decoder alone: what it accepts re-encodes to what decodes to the same frame.
    let mut d = Decoder::new();
    let mut again = Decoder::new();
    let mut buf = Vec::new();
    let mut off = 0;
    while off < stream.len() {
        off += d.feed(&stream[off..]);
        while let Some(r) = d.next_frame(|_| true) {
            let Ok(f) = r else { continue };
            buf.clear();
            f.encode(&mut buf).expect("a decoded frame encodes");
            assert_eq!(again.feed(&buf), buf.len());
            assert_eq!(again.next_frame(|_| true), Some(Ok(f)));
            assert_eq!(again.buffered(), 0);
        }
    }
});
