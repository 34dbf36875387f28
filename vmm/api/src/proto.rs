//! The control API: one JSON request per line on vmtierd's unix socket, one JSON response
//! line back. Requests are staged and applied by the engine between ticks.
//!
//! ```text
//! → {"cmd":"set-budget","vm":"web1","budget":"64M"}
//! ← {"ok":{"kind":"done","message":"Budget of web1 set to 64 MiB"}}
//! → {"cmd":"status","vm":"nope"}
//! ← {"error":"No VM named nope"}
//! ```

use serde::{Deserialize, Serialize};
use vmtier_core::{ByteSize, NodeId, VmId};

use crate::vm::{self, VmConfig};

/// Longest request line in bytes, without its newline. The server never buffers more.
pub const MAX_REQUEST_LINE: usize = 64 << 10;

/// Why a request line was refused.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The line is longer than [`MAX_REQUEST_LINE`].
    #[error("Request longer than {MAX_REQUEST_LINE} bytes")]
    TooLong,
    /// Not UTF-8 JSON, or not one of the requests.
    #[error("Invalid request")]
    Json(#[source] serde_json::Error),
    /// Well-formed, but a value is out of bounds (the configuration's checks).
    #[error("Invalid request: {0}")]
    Invalid(String),
}

/// Decodes one request line (without its newline): `Ok(None)` for a blank line, else the
/// request, checked as the daemon's configuration is (a VM to attach must be a valid `[[vm]]`, a
/// budget at most [`vm::MAX_BUDGET`]). The server calls it for every line it reads; the
/// `control` fuzz target calls it with arbitrary bytes. Never panics, allocates in
/// proportion to the line.
pub fn decode_request(line: &[u8]) -> Result<Option<Request>, DecodeError> {
    if line.len() > MAX_REQUEST_LINE {
        return Err(DecodeError::TooLong);
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let req: Request = serde_json::from_slice(line).map_err(DecodeError::Json)?;
    check_request(&req)?;
    Ok(Some(req))
}

/// Checks a decoded request as the configuration is checked; the control socket
/// ([`decode_request`]) and the HTTP API call it for every request.
pub fn check_request(req: &Request) -> Result<(), DecodeError> {
    match req {
        Request::Attach { vm } => vm
            .validate()
            .map_err(|vm::Error::Invalid(reason)| DecodeError::Invalid(reason))?,
        Request::SetBudget { vm, budget } if budget.0 > vm::MAX_BUDGET => {
            return Err(DecodeError::Invalid(format!(
                "budget {budget} for {vm} is above the largest, {}",
                ByteSize(vm::MAX_BUDGET)
            )));
        }
        Request::Heatmap { vm, ticks: Some(n) } if !(1..=crate::heatmap::MAX_TICKS).contains(n) => {
            return Err(DecodeError::Invalid(format!(
                "ticks {n} for {vm} is out of range: 1 to {}",
                crate::heatmap::MAX_TICKS
            )));
        }
        Request::SetTiering { vm, change } => match change.budget {
            Some(budget) if budget.0 > vm::MAX_BUDGET => {
                return Err(DecodeError::Invalid(format!(
                    "budget {budget} for {vm} is above the largest, {}",
                    ByteSize(vm::MAX_BUDGET)
                )));
            }
            _ if change.is_empty() => {
                return Err(DecodeError::Invalid(format!(
                    "nothing to change for {vm}: give budget, policy, params, enabled or pins"
                )));
            }
            _ => {}
        },
        _ => {}
    }
    Ok(())
}

/// A request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// All managed VMs. (A struct variant, so that unknown fields are refused.)
    List {},
    /// Detailed state of one VM.
    Status {
        /// The VM.
        vm: VmId,
    },
    /// Changes a VM's DRAM budget; takes effect at the next tick.
    SetBudget {
        /// The VM.
        vm: VmId,
        /// The new budget.
        budget: ByteSize,
    },
    /// Starts managing a VM.
    Attach {
        /// The VM, as in a `[[vm]]` table.
        vm: VmConfig,
    },
    /// Stops managing a VM (its pages stay where they are).
    Detach {
        /// The VM.
        vm: VmId,
    },
    /// From the libvirt hook: a domain is being prepared, started or released; vmtierd
    /// looks at libvirt's domains again at once (with `[libvirt]`; refused without).
    LibvirtHook {
        /// The domain's name, as libvirt passes it to the hook.
        domain: String,
        /// The hook's operation (`prepare`, `start`, `started`, `stopped`, `release`...).
        op: String,
    },
    /// A VM's tiering settings.
    Tiering {
        /// The VM.
        vm: VmId,
    },
    /// Changes a VM's tiering settings, all or nothing; omitted fields keep their value.
    SetTiering {
        /// The VM.
        vm: VmId,
        /// The change.
        change: TieringChange,
    },
    /// Every VM's status and the daemon's tick statistics, for `/metrics`.
    Metrics {},
    /// A VM's last ticks over its guest-physical address space (the tick ring).
    Heatmap {
        /// The VM.
        vm: VmId,
        /// At most this many of the newest ticks; default all the ring holds.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "crate::no_null"
        )]
        ticks: Option<u32>,
    },
}

/// A response: `{"ok": Reply}` or `{"error": "message"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Response {
    /// The request succeeded.
    Ok(Reply),
    /// The request failed; nothing changed.
    Error(String),
}

/// What a successful request returns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Reply {
    /// For `list`.
    List {
        /// One line per VM.
        vms: Vec<VmSummary>,
    },
    /// For `status`.
    Status(Box<VmStatus>),
    /// For changes.
    Done {
        /// What was done.
        message: String,
    },
    /// For `tiering` and `set-tiering` (the settings after the change).
    Tiering(Tiering),
    /// For `metrics`.
    Metrics(Box<DaemonMetrics>),
    /// For `heatmap`.
    Heatmap(Box<crate::heatmap::Heatmap>),
}

/// A VM's tiering settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tiering {
    /// DRAM budget, bytes.
    pub budget_bytes: u64,
    /// Placement policy in use.
    pub policy: String,
    /// The policy's parameters as last set through the API; `null`: the daemon's
    /// `[daemon.policy_params]` (or the policy's defaults).
    pub params: Option<serde_json::Map<String, serde_json::Value>>,
    /// Whether ticks place the VM's memory; a disabled VM's pages stay where they are.
    pub enabled: bool,
    /// Guest-physical ranges pinned to a tier.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<crate::pin::Pin>,
}

/// A change of tiering settings (`set-tiering`); every field is optional, at least one is
/// given. A new `policy` starts without state, with `params` (or its defaults); `params`
/// alone rebuilds the current policy with them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TieringChange {
    /// New DRAM budget.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::no_null"
    )]
    pub budget: Option<ByteSize>,
    /// New placement policy (a name from the registry).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::no_null"
    )]
    pub policy: Option<String>,
    /// The policy's parameters, as in `[daemon.policy_params]`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::no_null"
    )]
    pub params: Option<serde_json::Map<String, serde_json::Value>>,
    /// Start (`true`) or pause (`false`) placing the VM's memory.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::no_null"
    )]
    pub enabled: Option<bool>,
    /// New pinned ranges, replacing all of them (`[]` unpins everything).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::no_null"
    )]
    pub pins: Option<Vec<crate::pin::Pin>>,
}

impl TieringChange {
    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `GET /v1/health`: the engine answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// vmtierd's version.
    pub version: String,
    /// VMs managed (any state).
    pub vms: u64,
    /// VMs no longer managed because of an error (`failed: ...`).
    pub failed: u64,
    /// Time the engine took to answer, microseconds.
    pub engine_latency_us: u64,
}

/// `GET /v1/vms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmList {
    /// One entry per VM.
    pub vms: Vec<VmSummary>,
}

/// What a change (attach, detach) did, or why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// What was done.
    pub message: String,
}

/// An HTTP API error body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiError {
    /// Why; nothing changed.
    pub error: String,
}

/// Upper bounds of the tick duration histogram's buckets, seconds (`+Inf` is implied).
pub const TICK_BUCKETS_S: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Durations of whole engine ticks (all VMs), in the buckets of [`TICK_BUCKETS_S`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TickHistogram {
    /// Ticks per bucket, not cumulative: `counts[i]` took at most `TICK_BUCKETS_S[i]`
    /// and more than the bucket before; the last entry counts the longer ones.
    pub counts: Vec<u64>,
    /// Sum of all tick durations, seconds.
    pub sum_seconds: f64,
    /// Ticks.
    pub count: u64,
}

impl TickHistogram {
    /// Counts one tick of `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        if self.counts.len() != TICK_BUCKETS_S.len() + 1 {
            self.counts = vec![0; TICK_BUCKETS_S.len() + 1];
        }
        let i = TICK_BUCKETS_S
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(TICK_BUCKETS_S.len());
        self.counts[i] = self.counts[i].saturating_add(1);
        self.sum_seconds += seconds;
        self.count = self.count.saturating_add(1);
    }
}

/// What `metrics` returns: a snapshot taken between ticks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DaemonMetrics {
    /// Every managed VM's status (failed ones too).
    pub vms: Vec<VmStatus>,
    /// VMs whose tiering is paused (`enabled: false`).
    pub disabled: Vec<VmId>,
    /// Tick durations.
    pub ticks: TickHistogram,
}

/// One VM in `list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSummary {
    /// Name.
    pub name: VmId,
    /// `active`, or `failed: reason`.
    pub state: String,
    /// DRAM budget in bytes.
    pub budget_bytes: u64,
    /// Guest RAM in DRAM, bytes.
    pub fast_bytes: u64,
    /// Guest RAM in CXL, bytes.
    pub slow_bytes: u64,
    /// Guest RAM, bytes.
    pub total_bytes: u64,
}

/// Bytes of guest RAM on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeBytes {
    /// The node.
    pub node: NodeId,
    /// Bytes.
    pub bytes: u64,
}

/// Counters of one VM since it was attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VmMetrics {
    /// Ticks run.
    pub ticks: u64,
    /// Granules moved to DRAM completely (every page on the DRAM node).
    pub promoted_granules: u64,
    /// Bytes moved to DRAM: pages the migrator put there, not whole granules.
    pub promoted_bytes: u64,
    /// Granules moved to CXL completely.
    pub demoted_granules: u64,
    /// Bytes moved to CXL.
    pub demoted_bytes: u64,
    /// Pages that failed to move (no memory, fault, other errors).
    pub failed_pages: u64,
    /// Pages that were busy (locked, pinned, under I/O) and left for a retry.
    pub busy_pages: u64,
    /// Moves the rate limit deferred.
    pub deferred_granules: u64,
    /// Retries of granules whose previous move did not complete.
    pub retried_granules: u64,
    /// Granules waiting for a retry now (partly moved, or nothing moved and held back).
    pub pending_granules: u64,
    /// Migration calls that failed as a whole (nothing moved).
    pub migration_errors: u64,
    /// Pages the kernel module was meant to move that move_pages(2) moved instead.
    pub fallback_pages: u64,
    /// Module calls that failed as a whole, their pages moved by move_pages(2).
    pub fallback_errors: u64,
    /// Ticks whose hotness observation failed.
    pub source_errors: u64,
    /// Duration of the last tick, microseconds.
    pub last_tick_us: u64,
    /// Largest DRAM use seen at the end of a tick, bytes.
    pub max_fast_bytes: u64,
}

/// `status VM`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStatus {
    /// Summary.
    #[serde(flatten)]
    pub summary: VmSummary,
    /// How the VM is reached.
    pub backend: String,
    /// Hotness source in use.
    pub source: String,
    /// Policy in use.
    pub policy: String,
    /// Placement granule, bytes.
    pub granule_bytes: u64,
    /// Bytes per node, as last queried.
    pub per_node: Vec<NodeBytes>,
    /// Guest RAM per heat bucket, coldest first, bytes.
    pub heat_histogram: Vec<u64>,
    /// Counters.
    pub metrics: VmMetrics,
    /// The guest hint channel, if the VM has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints: Option<crate::hints::HintStatus>,
    /// Hybrid 2 MiB / 4 KiB tracking, if on (`[daemon] detail_percent` > 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<HybridStatus>,
}

/// Hybrid tracking of one VM: how many regions carry 4 KiB detail now and how that changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HybridStatus {
    /// Regions split into 4 KiB detail now.
    pub split_regions: u64,
    /// The most regions that may be split at a time (`detail_percent` of the regions).
    pub max_split_regions: u64,
    /// Splits since the VM was attached.
    pub splits: u64,
    /// Merges (detail dropped when a region's pages became uniform) since attach.
    pub merges: u64,
    /// Mixed regions left whole because the cap was reached, counted once per tick each.
    pub refused: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_unknown_fields_are_refused() {
        let cases = [
            (r#"{"cmd":"list"}"#, Some(Request::List {})),
            (
                r#"{"cmd":"set-budget","vm":"web1","budget":"64M"}"#,
                Some(Request::SetBudget {
                    vm: "web1".parse().unwrap(),
                    budget: ByteSize(64 << 20),
                }),
            ),
            (
                r#"{"cmd":"detach","vm":"a"}"#,
                Some(Request::Detach {
                    vm: "a".parse().unwrap(),
                }),
            ),
            (
                r#"{"cmd":"set-tiering","vm":"a","change":{"budget":"1M","enabled":false}}"#,
                Some(Request::SetTiering {
                    vm: "a".parse().unwrap(),
                    change: TieringChange {
                        budget: Some(ByteSize(1 << 20)),
                        enabled: Some(false),
                        ..TieringChange::default()
                    },
                }),
            ),
            (r#"{"cmd":"metrics"}"#, Some(Request::Metrics {})),
            (
                r#"{"cmd":"heatmap","vm":"a","ticks":30}"#,
                Some(Request::Heatmap {
                    vm: "a".parse().unwrap(),
                    ticks: Some(30),
                }),
            ),
            (
                r#"{"cmd":"heatmap","vm":"a"}"#,
                Some(Request::Heatmap {
                    vm: "a".parse().unwrap(),
                    ticks: None,
                }),
            ),
            (r#"{"cmd":"heatmap","vm":"a","ticks":null}"#, None),
            (r#"{"cmd":"heatmap","vm":"a","ticks":-1}"#, None),
            (
                r#"{"cmd":"tiering","vm":"a"}"#,
                Some(Request::Tiering {
                    vm: "a".parse().unwrap(),
                }),
            ),
            // null is not "leave it": a client that sends it is told.
            (
                r#"{"cmd":"set-tiering","vm":"a","change":{"enabled":null}}"#,
                None,
            ),
            (
                r#"{"cmd":"set-tiering","vm":"a","change":{"budgte":"1M"}}"#,
                None,
            ),
            (r#"{"cmd":"set-tiering","vm":"a","budget":"1M"}"#, None),
            (
                r#"{"cmd":"attach","vm":{"name":"a","budget":1,"qmp":"/q","pid":null}}"#,
                None,
            ),
            (r#"{"cmd":"list","extra":1}"#, None),
            (r#"{"cmd":"explode"}"#, None),
            (r#"{"cmd":"status","vm":"bad name"}"#, None),
        ];
        for (text, want) in cases {
            let got = serde_json::from_str::<Request>(text).ok();
            assert_eq!(got, want, "{text}");
            if let Some(r) = got {
                let back: Request =
                    serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
                assert_eq!(back, r);
            }
        }
    }

    #[test]
    fn request_lines_are_decoded_and_checked() {
        let long = format!("{{\"cmd\":\"list\"}}{}", " ".repeat(MAX_REQUEST_LINE));
        type Want = Result<Option<Request>, &'static str>;
        let cases: [(&[u8], Want); 15] = [
            (br#"{"cmd":"heatmap","vm":"a","ticks":0}"#, Err("Invalid request: ticks 0 for a is out of range: 1 to 100000")),
            (br#"{"cmd":"heatmap","vm":"a","ticks":100000}"#, Ok(Some(Request::Heatmap { vm: "a".parse().unwrap(), ticks: Some(100_000) }))),
            (b"", Ok(None)),
            (b" \t\r", Ok(None)),
            (br#"{"cmd":"list"}"#, Ok(Some(Request::List {}))),
            (br#" {"cmd":"list"} "#, Ok(Some(Request::List {}))),
            (b"\xff\xfe", Err("Invalid request")),
            (br#"{"cmd":"set-budget","vm":"a","budget":"1025T"}"#, Err("Invalid request: budget 1025 TiB for a is above the largest, 1024 TiB")),
            (br#"{"cmd":"attach","vm":{"name":"a","budget":"1G","pid":0,"ranges":[{"start":4096,"len":4096}]}}"#, Err("Invalid request: VM a: pid 0 is not a process id")),
            (br#"{"cmd":"attach","vm":{"name":"a","budget":"1G"}}"#, Err("Invalid request: VM a: give qmp")),
            (br#"{"cmd":"attach","vm":{"name":"a","budget":"1G","qmp":"/q"}}"#, Ok(Some(Request::Attach { vm: VmConfig { name: "a".parse().unwrap(), budget: ByteSize(1 << 30), qmp: Some("/q".into()), pid: None, ranges: vec![], hints: None, pins: vec![] } }))),
            (long.as_bytes(), Err("Request longer than 65536 bytes")),
            (br#"{"cmd":"set-tiering","vm":"a","change":{}}"#, Err("Invalid request: nothing to change for a")),
            (br#"{"cmd":"set-tiering","vm":"a","change":{"budget":"1025T"}}"#, Err("Invalid request: budget 1025 TiB for a is above the largest")),
            (br#"{"cmd":"set-tiering","vm":"a","change":{"policy":"memtierd","params":{"x":1}}}"#, Ok(Some(Request::SetTiering { vm: "a".parse().unwrap(), change: TieringChange { policy: Some("memtierd".into()), params: serde_json::json!({"x": 1}).as_object().cloned(), ..TieringChange::default() } }))),
        ];
        for (line, want) in cases {
            let got = decode_request(line);
            match (&got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, &w, "{line:?}"),
                (Err(e), Err(w)) => {
                    let msg = vmtier_core::error_chain(e);
                    assert!(msg.starts_with(w), "{msg} vs {w}");
                }
                _ => panic!("{:?}: {got:?}", String::from_utf8_lossy(line)),
            }
        }
    }

    #[test]
    fn tick_durations_land_in_their_buckets() {
        // (durations, (bucket, count) pairs, total)
        type Case = (&'static [f64], &'static [(usize, u64)], u64);
        let cases: [Case; 3] = [
            (&[], &[], 0),
            (&[0.0, 0.001, 0.0011], &[(0, 2), (1, 1)], 3),
            (&[5.0, 5.1, f64::INFINITY], &[(11, 1), (12, 2)], 3),
        ];
        for (secs, want, count) in cases {
            let mut h = TickHistogram::default();
            for &s in secs {
                h.observe(s);
            }
            assert_eq!(h.count, count, "{secs:?}");
            for &(i, n) in want {
                assert_eq!(h.counts[i], n, "{secs:?} bucket {i}");
            }
            assert_eq!(h.counts.iter().sum::<u64>(), count, "{secs:?}");
        }
    }

    #[test]
    fn responses_have_ok_or_error() {
        let ok = Response::Ok(Reply::Done {
            message: "x".into(),
        });
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"ok":{"kind":"done","message":"x"}}"#
        );
        let err = Response::Error("No VM named a".into());
        assert_eq!(
            serde_json::to_string(&err).unwrap(),
            r#"{"error":"No VM named a"}"#
        );
    }
}
