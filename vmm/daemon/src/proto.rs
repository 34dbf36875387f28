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

use crate::config::VmConfig;

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
