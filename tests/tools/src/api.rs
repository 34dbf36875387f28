//! vmtierd's HTTP API end to end: the workload guest under QEMU managed by the real vmtierd,
//! driven by curl over the API's unix socket and over TCP with a bearer token. A budget set
//! through the API is judged from outside (where every page of the guest is); refused
//! requests (no token, wrong token, malformed, too large, too many) are checked to change
//! nothing; `/metrics` is scraped and checked by promtool; schemathesis checks the live API
//! against docs/openapi.yaml.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use vmtier_backends::qemu::QemuBackend;
use vmtier_core::{ByteSize, NodeId};

use crate::check::Checks;
use crate::daemon::Daemon;
use crate::guest::{num, Guest, GuestPages};

#[derive(clap::Args, Debug)]
pub struct ApiArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: PathBuf,
    /// Guest RAM.
    #[arg(long, default_value = "128M")]
    ram: ByteSize,
    /// Hot-set size.
    #[arg(long, default_value = "16M")]
    hot: ByteSize,
    /// Budget at attach.
    #[arg(long, default_value = "48M")]
    budget: ByteSize,
    /// Budget set through the API.
    #[arg(long, default_value = "8M")]
    lower_budget: ByteSize,
    /// TCP port of the API on the loopback interface.
    #[arg(long, default_value_t = 9464)]
    port: u16,
    /// Also run schemathesis against the live API (minutes under TCG: the suite runs it as
    /// the separate case `api-contract`).
    #[arg(long)]
    contract: bool,
    /// schemathesis' `st`; default: the venv tools/install-deps makes under target/.
    #[arg(long)]
    schemathesis: Option<PathBuf>,
    /// Examples schemathesis generates per operation and phase.
    #[arg(long, default_value_t = 10)]
    examples: u32,
    /// schemathesis' phases.
    #[arg(long, default_value = "examples,coverage,fuzzing")]
    phases: String,
}

/// An HTTP answer: status and body.
struct Answer {
    status: u16,
    body: String,
}

/// One request with curl: over the unix socket `unix`, or over TCP to `tcp` with `token`.
fn curl(via: &Via<'_>, method: &str, path: &str, body: Option<&str>, auth: Option<&str>) -> Answer {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "60",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
    let url = match via {
        Via::Unix(p) => {
            cmd.arg("--unix-socket").arg(p);
            format!("http://vmtierd{path}")
        }
        Via::Tcp(port) => format!("http://127.0.0.1:{port}{path}"),
    };
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    if let Some(a) = auth {
        cmd.args(["-H", &format!("Authorization: {a}")]);
    }
    cmd.arg(url);
    match cmd.output() {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
            Answer {
                status: code.trim().parse().unwrap_or(0),
                body: body.to_owned(),
            }
        }
        Err(e) => Answer {
            status: 0,
            body: format!("curl: {e}"),
        },
    }
}

/// What, where, method, path, body, authorization, status wanted.
type Refusal<'a> = (
    &'a str,
    &'a Via<'a>,
    &'a str,
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
    u16,
);

enum Via<'a> {
    Unix(&'a Path),
    Tcp(u16),
}

/// Guest RAM in DRAM (node 0), measured from outside; also the hot set's share.
fn dram(pages: &GuestPages, hot: (u64, u64)) -> (u64, u64) {
    match pages.sample() {
        Ok(p) => (
            p.bytes_on(NodeId::new(0)),
            p.gpa_bytes_on(NodeId::new(0), hot.0, hot.1),
        ),
        Err(_) => (u64::MAX, 0),
    }
}

/// The value of the first sample line starting with `prefix`.
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
}

#[allow(clippy::too_many_lines)]
pub fn run(c: &mut Checks, a: &ApiArgs) {
    let t0 = Instant::now();
    let run_dir = std::env::var("VMTIER_RUN")
        .map_or_else(|_| std::env::temp_dir(), PathBuf::from)
        .join("api");
    let _ = std::fs::create_dir_all(&run_dir);
    // Unix sockets and the token cannot live on the 9p share that holds the run directory.
    let tmp = std::env::temp_dir().join(format!("vmtier-api-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&tmp);
    let lo = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status();
    if !lo.as_ref().is_ok_and(|s| s.success()) {
        return c.fatal("bring up the loopback interface", format!("{lo:?}"));
    }
    let token = format!(
        "vmtier-test-{:x}-{:x}",
        std::process::id(),
        t0.elapsed().as_nanos()
    );
    let token_file = tmp.join("token");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .and_then(|mut f| writeln!(f, "{token}"));
        if let Err(e) = f {
            return c.fatal("write the token file", e);
        }
    }

    let append = format!("hot={}K report=1", a.hot.0 >> 10);
    let mut g = match Guest::start("qemu-system-x86_64", &a.elf, a.ram, 1, &append) {
        Ok(g) => g,
        Err(e) => return c.fatal("start QEMU", e),
    };
    g.echo = false;
    let Some(start) = g.wait_for("WG start", Duration::from_secs(60)) else {
        return c.fatal("guest starts", "no 'WG start'");
    };
    let hot = (
        num(&start, "hot_start").unwrap_or(0),
        num(&start, "hot_bytes").unwrap_or(0),
    );
    if g.wait_for("WG filled", Duration::from_secs(600)).is_none() {
        return c.fatal("guest fills its RAM", "no 'WG filled'");
    }
    let layout = match QemuBackend::connect(&g.qmp, Duration::from_secs(10))
        .and_then(|mut b| b.discover())
    {
        Ok(l) => l,
        Err(e) => return c.fatal("locate guest RAM through QMP", e),
    };
    let pages = GuestPages::new(&layout);

    let socket = tmp.join("ctl.sock");
    let api = tmp.join("api.sock");
    let config = format!(
        "[daemon]\nsocket = \"{}\"\ninterval_ms = 500\nrate_limit_mbps = 2000\n\n\
         [api]\nsocket = \"{}\"\nlisten = \"127.0.0.1:{}\"\ntoken_file = \"{}\"\n\
         max_body_bytes = 4096\nrate_limit_per_s = 20\nheatmap_ticks = 600\n\n\
         [[vm]]\nname = \"guest\"\nqmp = \"{}\"\nbudget = \"{}K\"\n",
        socket.display(),
        api.display(),
        a.port,
        token_file.display(),
        g.qmp.display(),
        a.budget.0 >> 10
    );
    let mut d = match Daemon::start(&run_dir, &socket, &config) {
        Ok(d) => d,
        Err(e) => return c.fatal("start vmtierd", e),
    };
    let unix = Via::Unix(&api);
    let tcp = Via::Tcp(a.port);
    let bearer = format!("Bearer {token}");

    // The API answers on its unix socket, which is 0600.
    let h = curl(&unix, "GET", "/v1/health", None, None);
    let hj = json(&h.body);
    c.check(
        h.status == 200 && hj["status"] == "ok" && hj["vms"] == 1,
        "GET /v1/health over the unix socket",
        format!("{} {}", h.status, h.body),
    );
    let mode = std::fs::symlink_metadata(&api).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.mode() & 0o777
    });
    c.check(
        mode.as_ref().is_ok_and(|m| *m == 0o600),
        "the API socket is 0600",
        format!("{mode:?}"),
    );
    let l = curl(&unix, "GET", "/v1/vms", None, None);
    c.check(
        l.status == 200 && json(&l.body)["vms"][0]["name"] == "guest",
        "GET /v1/vms lists the guest",
        &l.body,
    );

    // Promotion under the attach budget, seen from outside.
    let t = Instant::now();
    let mut last = (0, 0);
    let mut max_dram = 0;
    while t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        last = dram(&pages, hot);
        max_dram = max_dram.max(last.0);
        if last.1 * 10 >= hot.1 * 9 {
            break;
        }
    }
    c.check(
        last.1 * 10 >= hot.1 * 9 && max_dram <= a.budget.0,
        "the hot set reaches DRAM under the attach budget",
        format!(
            "{} of {} hot set in DRAM, max DRAM {} ≤ {}, {:.1} s",
            ByteSize(last.1),
            ByteSize(hot.1),
            ByteSize(max_dram),
            a.budget,
            t.elapsed().as_secs_f64()
        ),
    );

    // The tick ring shows the hot set where it is (tests/tools/src/heatmap.rs), judged over
    // ticks that all follow the placement: the payback rule places a 2 MiB hot set at its
    // third tick, so the ring's first ticks show it still on the slow tier.
    let ring_len = |body: &str| json(body)["ticks"].as_array().map_or(0, Vec::len);
    let mut hm = curl(&unix, "GET", "/v1/vms/guest/heatmap", None, None);
    let placed_at = ring_len(&hm.body);
    let t = Instant::now();
    while ring_len(&hm.body) < placed_at + crate::heatmap::JUDGED_TICKS
        && t.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(500));
        hm = curl(&unix, "GET", "/v1/vms/guest/heatmap", None, None);
    }
    last = dram(&pages, hot);
    c.check(
        hm.status == 200,
        "GET /v1/vms/guest/heatmap",
        format!("{} ({} bytes)", hm.status, hm.body.len()),
    );
    #[allow(clippy::cast_precision_loss)]
    let outside = last.1 as f64 / hot.1.max(1) as f64;
    let _ = std::fs::write(run_dir.join("heatmap-promoted.json"), &hm.body);
    crate::heatmap::check(c, &d, &hm.body, hot, outside, &run_dir, "promoted");
    let attach_budget_ticks = json(&hm.body)["ticks"].as_array().map_or(0, Vec::len);

    // Set the budget through the API: DRAM follows.
    let low = a.lower_budget.0;
    let body = format!(r#"{{"budget":"{}K"}}"#, low >> 10);
    let p = curl(&unix, "PATCH", "/v1/vms/guest/tiering", Some(&body), None);
    c.check(
        p.status == 200 && json(&p.body)["budget_bytes"] == low,
        "PATCH /v1/vms/guest/tiering sets the budget",
        format!("{} {}", p.status, p.body),
    );
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(500));
        last = dram(&pages, hot);
        if last.0 <= low {
            break;
        }
    }
    c.check(
        last.0 <= low,
        "DRAM use follows the budget set through the API",
        format!(
            "{} ≤ {} after {:.1} s",
            ByteSize(last.0),
            a.lower_budget,
            t.elapsed().as_secs_f64()
        ),
    );

    // vmtierctl's views of the same state (control socket).
    let (ok, top) = d.ctl(&["top", "--count", "2", "--interval-ms", "500"]);
    let (ok2, tiering) = d.ctl(&["tiering", "guest"]);
    c.check(
        ok && top
            .lines()
            .any(|l| l.starts_with("guest ") && l.contains(" 8 MiB "))
            && ok2
            && tiering.contains("budget 8 MiB"),
        "vmtierctl top and tiering show the budget set through the API",
        format!(
            "{} | {}",
            top.lines()
                .rfind(|l| l.starts_with("guest"))
                .unwrap_or("")
                .trim(),
            tiering.trim()
        ),
    );

    // Refused requests change nothing.
    let big = format!(r#"{{"budget":"64M","policy":"{}"}}"#, "x".repeat(8192));
    let refusals: Vec<Refusal<'_>> = vec![
        (
            "TCP without a token",
            &tcp,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some(r#"{"budget":"64M"}"#),
            None,
            401,
        ),
        (
            "TCP with a wrong token",
            &tcp,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some(r#"{"budget":"64M"}"#),
            Some("Bearer not-the-token-0000"),
            401,
        ),
        (
            "TCP detach without a token",
            &tcp,
            "DELETE",
            "/v1/vms/guest",
            None,
            None,
            401,
        ),
        (
            "TCP metrics without a token",
            &tcp,
            "GET",
            "/metrics",
            None,
            None,
            401,
        ),
        (
            "malformed JSON",
            &unix,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some(r#"{"budget":"#),
            None,
            400,
        ),
        (
            "unknown field",
            &unix,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some(r#"{"budgte":"64M"}"#),
            None,
            422,
        ),
        (
            "bad size",
            &unix,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some(r#"{"budget":"lots"}"#),
            None,
            422,
        ),
        (
            "null",
            &unix,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some(r#"{"budget":null}"#),
            None,
            422,
        ),
        (
            "empty change",
            &unix,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some("{}"),
            None,
            400,
        ),
        (
            "budget above the DRAM node",
            &unix,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some(r#"{"budget":"512G","enabled":false}"#),
            None,
            422,
        ),
        (
            "unknown policy with a budget",
            &unix,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some(r#"{"budget":"64M","policy":"nope"}"#),
            None,
            422,
        ),
        (
            "body over max_body_bytes",
            &unix,
            "PATCH",
            "/v1/vms/guest/tiering",
            Some(&big),
            None,
            413,
        ),
        (
            "bad VM name",
            &unix,
            "DELETE",
            "/v1/vms/gu%20est",
            None,
            None,
            400,
        ),
        (
            "attach of an unreachable QEMU",
            &unix,
            "POST",
            "/v1/vms",
            Some(r#"{"name":"ghost","budget":"8M","qmp":"/nonexistent/qmp.sock"}"#),
            None,
            422,
        ),
        (
            "attach of a managed name",
            &unix,
            "POST",
            "/v1/vms",
            Some(r#"{"name":"guest","budget":"8M","qmp":"/nonexistent/qmp.sock"}"#),
            None,
            409,
        ),
    ];
    let mut wrong = Vec::new();
    for (what, via, method, path, body, auth, want) in &refusals {
        let r = curl(via, method, path, *body, *auth);
        let is_json_error = json(&r.body)["error"].is_string();
        if r.status != *want || !is_json_error {
            wrong.push(format!("{what}: {} {}", r.status, r.body));
        }
    }
    c.check(
        wrong.is_empty(),
        "unauthenticated and malformed requests are refused with their status",
        if wrong.is_empty() {
            format!("{} requests", refusals.len())
        } else {
            wrong.join("; ")
        },
    );
    std::thread::sleep(Duration::from_millis(1500));
    let tier = json(&curl(&unix, "GET", "/v1/vms/guest/tiering", None, None).body);
    let list = json(&curl(&unix, "GET", "/v1/vms", None, None).body);
    let after = dram(&pages, hot);
    c.check(
        tier["budget_bytes"] == low
            && tier["enabled"] == true
            && tier["policy"] == "default"
            && list["vms"].as_array().map(Vec::len) == Some(1)
            && after.0 <= low,
        "refused requests changed nothing",
        format!(
            "budget {}, enabled {}, policy {}, {} VMs, DRAM {} ≤ {}",
            tier["budget_bytes"],
            tier["enabled"],
            tier["policy"],
            list["vms"].as_array().map_or(0, Vec::len),
            ByteSize(after.0),
            a.lower_budget
        ),
    );

    // Over the rate: one curl process sends 150 requests back to back.
    let out = Command::new("curl")
        .args(["-s", "-w", "%{http_code}\n", "--unix-socket"])
        .arg(&api)
        // `-o` goes with the URL after it.
        .args((0..150).flat_map(|_| ["-o", "/dev/null", "http://vmtierd/v1/health"]))
        .output();
    let codes = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let n429 = codes.lines().filter(|l| *l == "429").count();
    let n200 = codes.lines().filter(|l| *l == "200").count();
    c.check(
        n429 > 0 && n200 >= 20 && n200 + n429 == 150,
        "requests over rate_limit_per_s get 429",
        format!("{n200} × 200, {n429} × 429 of 150 back to back"),
    );
    std::thread::sleep(Duration::from_millis(1500));

    // TCP with the token works.
    let h = curl(&tcp, "GET", "/v1/vms/guest", None, Some(&bearer));
    let st = json(&h.body);
    c.check(
        h.status == 200 && st["name"] == "guest" && st["budget_bytes"] == low,
        "TCP with the bearer token reads the VM's status",
        format!("{} budget_bytes {}", h.status, st["budget_bytes"]),
    );

    // /metrics: promtool accepts it, and its figures are the daemon's state and agree with
    // what is seen from outside.
    let m = curl(&unix, "GET", "/metrics", None, None);
    let prom = run_dir.join("metrics.txt");
    let _ = std::fs::write(&prom, &m.body);
    let (ok, why) =
        crate::check::output(Command::new("promtool").args(["check", "metrics"]).stdin(
            std::fs::File::open(&prom).map_or_else(|_| std::process::Stdio::null(), Into::into),
        ));
    c.check(
        m.status == 200 && ok,
        "promtool check metrics accepts /metrics",
        format!("{} lines; {}", m.body.lines().count(), why.trim()),
    );
    let now = dram(&pages, hot);
    let budget = metric(&m.body, r#"vmtier_vm_budget_bytes{vm="guest"}"#);
    let node0 = metric(
        &m.body,
        r#"vmtier_vm_node_memory_bytes{vm="guest",node="0"}"#,
    );
    let promoted = metric(&m.body, r#"vmtier_vm_promoted_bytes_total{vm="guest"}"#);
    let demoted = metric(&m.body, r#"vmtier_vm_demoted_bytes_total{vm="guest"}"#);
    let ticks = metric(&m.body, "vmtier_tick_duration_seconds_count");
    #[allow(clippy::cast_precision_loss)]
    let near =
        |x: Option<f64>, y: u64| x.is_some_and(|x| (x - y as f64).abs() <= f64::from(4u32 << 20));
    #[allow(clippy::cast_precision_loss)]
    let budget_ok = budget == Some(low as f64);
    c.check(
        budget_ok
            && near(node0, now.0)
            && promoted.is_some_and(|p| p > 0.0)
            && demoted.is_some_and(|d| d > 0.0)
            && ticks.is_some_and(|t| t >= 10.0),
        "/metrics has the budget, node bytes as seen from outside, moves and ticks",
        format!(
            "budget {budget:?}, node 0 {node0:?} vs {} outside, promoted {promoted:?}, demoted {demoted:?}, ticks {ticks:?}",
            now.0
        ),
    );

    // The ring recorded the budget cut: ticks at the attach budget, then at the lower one.
    let cut = curl(&unix, "GET", "/v1/vms/guest/heatmap", None, None).body;
    let _ = std::fs::write(run_dir.join("heatmap-budget-cut.json"), &cut);
    let hm = json(&cut);
    let budgets: Vec<u64> = hm["ticks"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|r| r["budget_bytes"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    let (ok_img, img) = d.ctl(&[
        "heatmap",
        "guest",
        "--out",
        &run_dir.join("heatmap-budget-cut.svg").to_string_lossy(),
    ]);
    c.check(
        attach_budget_ticks > 0
            && budgets.first() == Some(&a.budget.0)
            && budgets.last() == Some(&low)
            && budgets.windows(2).all(|w| w[0] >= w[1])
            && ok_img,
        "the heatmap's ticks record the budget cut",
        format!(
            "{} ticks: budget {} then {}; {}",
            budgets.len(),
            ByteSize(budgets.first().copied().unwrap_or(0)),
            ByteSize(budgets.last().copied().unwrap_or(0)),
            img.trim()
        ),
    );

    if a.contract {
        contract(c, a, &tmp, &run_dir, &bearer);
        // schemathesis may have used up the rate: wait for the bucket to refill.
        std::thread::sleep(Duration::from_millis(1500));
        // It may have changed the guest's settings (it learns names from answers): the
        // guest is still managed, and a budget set again is honoured again.
        let r = curl(&unix, "GET", "/v1/vms/guest/tiering", None, None);
        let body = format!(
            r#"{{"budget":"{}K","policy":"default","enabled":true}}"#,
            low >> 10
        );
        let p = curl(&unix, "PATCH", "/v1/vms/guest/tiering", Some(&body), None);
        let t = Instant::now();
        let mut now = dram(&pages, hot);
        while now.0 > low && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(500));
            now = dram(&pages, hot);
        }
        c.check(
            r.status == 200 && p.status == 200 && now.0 <= low,
            "after the contract test the guest is managed and follows its budget again",
            format!(
                "settings after fuzzing {}; DRAM {} ≤ {} {:.1} s after resetting them",
                r.body,
                ByteSize(now.0),
                a.lower_budget,
                t.elapsed().as_secs_f64()
            ),
        );
    }

    g.request_stop();
    let done = g
        .wait_for("WG done", Duration::from_secs(300))
        .unwrap_or_default();
    c.check(
        num(&done, "corrupted") == Some(0),
        "guest reports zero corrupted words",
        &done,
    );
    let code = d.stop();
    c.check(
        code == Some(0) && !api.exists(),
        "vmtierd stops cleanly and removes the API socket",
        format!("exit {code:?}, socket left: {}", api.exists()),
    );
    let _ = std::fs::remove_dir_all(&tmp);
    println!(
        "api: {:.0} s ({})",
        t0.elapsed().as_secs_f64(),
        crate::check::clock()
    );
}

/// schemathesis against the live API (TCP, with the token): every answer fits the document.
fn contract(c: &mut Checks, a: &ApiArgs, tmp: &Path, run_dir: &Path, bearer: &str) {
    let st = a
        .schemathesis
        .clone()
        .unwrap_or_else(|| crate::daemon::bin_dir().join("../schemathesis-venv/bin/st"));
    let doc = std::env::var("VMTIER_REPO").map_or_else(
        |_| PathBuf::from("docs/openapi.yaml"),
        |r| Path::new(&r).join("docs/openapi.yaml"),
    );
    let t = Instant::now();
    let (ok, mut text) = crate::check::output(
        Command::new(&st)
            .current_dir(tmp)
            .env("HOME", tmp)
            .arg("run")
            .arg(&doc)
            .args(["--url", &format!("http://127.0.0.1:{}", a.port)])
            .args(["-H", &format!("Authorization: {bearer}")])
            .args([
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
            ])
            .args(["--max-examples", &a.examples.to_string(), "--workers", "1"])
            .args(["--phases", &a.phases, "--rate-limit", "15/s"])
            // Attaching generated processes would let it move arbitrary processes' pages;
            // detaching the guest (whose name it learns from answers) would end the test.
            .args(["--exclude-operation-id", "attachVm"])
            .args(["--exclude-operation-id", "detachVm", "--no-color"]),
    );
    if !ok && text.contains("No such file") {
        text.push_str(" (run tools/install-deps)");
    }
    let _ = std::fs::write(run_dir.join("schemathesis.txt"), &text);
    let summary = text
        .lines()
        .rfind(|l| l.contains("generated") || l.contains("passed") || l.contains("failures"))
        .unwrap_or("")
        .trim()
        .to_owned();
    c.check(
        ok,
        "schemathesis: the live API answers as docs/openapi.yaml says",
        format!(
            "{summary} in {:.0} s (log api/schemathesis.txt)",
            t.elapsed().as_secs_f64()
        ),
    );
    if !ok {
        for l in text.lines().filter(|l| !l.trim().is_empty()).take(60) {
            println!("    {l}");
        }
    }
}
