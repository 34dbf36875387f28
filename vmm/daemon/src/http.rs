//! The HTTP API (docs/api.md, docs/openapi.yaml) and `/metrics` (docs/metrics.md).
//!
//! A thread runs a single-threaded tokio runtime with axum. Every handler turns its request
//! into a control API [`Request`], checks it as the control socket does
//! ([`check_request`]), and hands it to the engine thread over the control socket's channel:
//! the engine answers between ticks and stays the only owner of the VMs.
//!
//! Served on a unix socket (mode 0600, in a directory only vmtierd's user controls, as the
//! control socket) and, when `[api] listen` is set, on TCP, where every request must carry
//! the bearer token of `[api] token_file` (401 otherwise). Bodies larger than
//! `max_body_bytes` get 413; more than `rate_limit_per_s` requests per second (over all
//! clients) get 429.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Request as HttpRequest, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, MethodRouter};
use axum::{Json, Router};
use log::{debug, error, info, warn};
use vmtier_api::proto::{
    check_request, ApiError, DaemonMetrics, Health, Message, Reply, Request, Response,
    TieringChange, VmList,
};
use vmtier_api::vm::VmConfig;
use vmtier_core::VmId;

use crate::config::ApiConfig;
use crate::server::{self, Call, SocketFile};

/// Error starting the HTTP API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The unix socket could not be made.
    #[error("Cannot serve the HTTP API")]
    Socket(#[source] server::Error),
    /// The TCP address could not be bound.
    #[error("Cannot listen on {0}")]
    Listen(std::net::SocketAddr, #[source] std::io::Error),
    /// The token file is missing, unreadable, badly formed or readable by others.
    #[error("Bad token file {0}: {1}")]
    Token(PathBuf, String),
    /// The runtime could not start.
    #[error("Cannot start the HTTP runtime")]
    Runtime(#[source] std::io::Error),
}

/// Longest time a request waits for the engine (a tick plus a migration batch).
const ENGINE_TIMEOUT: Duration = Duration::from_secs(60);

/// Shortest and longest bearer token, characters.
const TOKEN_LEN: std::ops::RangeInclusive<usize> = 16..=4096;

/// The running HTTP API.
#[derive(Debug)]
pub struct ApiServer {
    unix: SocketFile,
    tcp: Option<std::net::SocketAddr>,
    thread: thread::JoinHandle<()>,
}

impl ApiServer {
    /// The unix socket's path.
    pub fn path(&self) -> &Path {
        self.unix.path()
    }

    /// The TCP address, if any (with the port the kernel chose for port 0).
    pub fn tcp(&self) -> Option<std::net::SocketAddr> {
        self.tcp
    }

    /// Whether the server thread still runs.
    pub fn is_running(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Removes the unix socket file if it is still ours.
    pub fn remove(&self) {
        self.unix.remove();
    }
}

/// Starts the HTTP API on `cfg.socket` (and `cfg.listen`), passing requests to `engine`.
pub fn spawn(cfg: &ApiConfig, engine: Sender<Call>) -> Result<ApiServer, Error> {
    let token = match (&cfg.listen, &cfg.token_file) {
        (Some(_), Some(f)) => Some(read_token(f)?),
        (Some(_), None) => {
            return Err(Error::Token(
                PathBuf::new(),
                "TCP needs [api] token_file".into(),
            ))
        }
        (None, _) => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(MAX_IN_FLIGHT)
        .build()
        .map_err(Error::Runtime)?;
    let (std_unix, file) = server::bind(&cfg.socket).map_err(Error::Socket)?;
    let limits = Limits {
        max_body: usize::try_from(cfg.max_body_bytes).unwrap_or(usize::MAX),
        rate: RateLimit::new(cfg.rate_limit_per_s),
    };
    let app = App::new(engine);
    let unix_router = router(app.clone(), &limits, None);
    let (tcp, tcp_router) = match cfg.listen {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr).map_err(|e| Error::Listen(addr, e))?;
            let local = l.local_addr().map_err(|e| Error::Listen(addr, e))?;
            (Some((l, local)), Some(router(app, &limits, token)))
        }
        None => (None, None),
    };
    let tcp_addr = tcp.as_ref().map(|(_, a)| *a);
    let thread = thread::Builder::new()
        .name("vmtierd-http".into())
        .spawn(move || {
            rt.block_on(async move {
                let unix = async {
                    std_unix.set_nonblocking(true)?;
                    let l = tokio::net::UnixListener::from_std(std_unix)?;
                    axum::serve(l, unix_router).await
                };
                let tcp = async {
                    match (tcp, tcp_router) {
                        (Some((l, _)), Some(r)) => {
                            l.set_nonblocking(true)?;
                            let l = tokio::net::TcpListener::from_std(l)?;
                            axum::serve(l, r).await
                        }
                        _ => std::future::pending().await,
                    }
                };
                let r = tokio::select! { r = unix => r, r = tcp => r };
                if let Err(e) = r {
                    error!("HTTP API stopped: {e}");
                }
            });
        })
        .map_err(Error::Runtime)?;
    info!(
        "HTTP API on {}{}",
        file.path().display(),
        tcp_addr
            .map(|a| format!(" and tcp {a} (bearer token)"))
            .unwrap_or_default()
    );
    Ok(ApiServer {
        unix: file,
        tcp: tcp_addr,
        thread,
    })
}

/// Reads and checks a bearer token file: one line of printable ASCII, not readable or
/// writable by group or others.
fn read_token(path: &Path) -> Result<Arc<str>, Error> {
    use std::os::unix::fs::MetadataExt;
    let bad = |why: String| Error::Token(path.into(), why);
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "group or others may access it (mode {:04o}); chmod 600 it",
            meta.mode() & 0o7777
        )));
    }
    if meta.len() > 8192 {
        return Err(bad("longer than 8 KiB".into()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let token = text.trim_end_matches(['\n', '\r']);
    if !TOKEN_LEN.contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(format!(
            "give one line of {} to {} printable characters without spaces",
            TOKEN_LEN.start(),
            TOKEN_LEN.end()
        )));
    }
    Ok(Arc::from(token))
}

/// Most requests waiting for the engine at once.
const MAX_IN_FLIGHT: usize = 16;

/// The handlers' state: the way to the engine.
#[derive(Clone, Debug)]
struct App {
    engine: Sender<Call>,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl App {
    fn new(engine: Sender<Call>) -> Self {
        Self {
            engine,
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        }
    }

    /// Checks `req` as the control socket does and has the engine answer it.
    async fn call(&self, req: Request) -> Result<Reply, Failure> {
        check_request(&req).map_err(|e| Failure::bad(vmtier_core::error_chain(&e)))?;
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| Failure::unavailable("vmtierd is shutting down"))?;
        let engine = self.engine.clone();
        debug!("http request: {req:?}");
        let answer = tokio::task::spawn_blocking(move || {
            let (tx, rx) = mpsc::channel();
            engine.send((req, tx)).ok()?;
            rx.recv_timeout(ENGINE_TIMEOUT).ok()
        })
        .await;
        match answer {
            Ok(Some(Response::Ok(reply))) => Ok(reply),
            Ok(Some(Response::Error(msg))) => Err(Failure::refused(msg)),
            Ok(None) => Err(Failure::unavailable(
                "vmtierd did not answer in time, or is shutting down",
            )),
            Err(_) => Err(Failure::unavailable("Internal error")),
        }
    }
}

/// An error answer: a status and `{"error": "..."}`.
#[derive(Debug)]
struct Failure(StatusCode, String);

impl Failure {
    fn bad(msg: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, msg.into())
    }

    fn unavailable(msg: impl Into<String>) -> Self {
        Self(StatusCode::SERVICE_UNAVAILABLE, msg.into())
    }

    /// The engine refused: which status its message means.
    fn refused(msg: String) -> Self {
        Self(refusal_status(&msg), msg)
    }

    fn unexpected(reply: &Reply) -> Self {
        warn!("HTTP API: unexpected engine reply {reply:?}");
        Self(StatusCode::INTERNAL_SERVER_ERROR, "Internal error".into())
    }
}

/// The status of an engine refusal, from the engine's error messages (engine::Error).
fn refusal_status(msg: &str) -> StatusCode {
    if msg.starts_with("No VM named ") {
        StatusCode::NOT_FOUND
    } else if msg.ends_with(" is already managed") {
        StatusCode::CONFLICT
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> HttpResponse {
        (self.0, Json(ApiError { error: self.1 })).into_response()
    }
}

impl From<JsonRejection> for Failure {
    fn from(r: JsonRejection) -> Self {
        let status = r.status();
        let text = r.body_text();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "Request body too large".to_owned()
        } else {
            format!("Invalid request: {}", text.replace('\n', " "))
        };
        Self(status, msg)
    }
}

fn vm_id(name: &str) -> Result<VmId, Failure> {
    name.parse()
        .map_err(|e| Failure::bad(format!("Invalid VM name: {e}")))
}

async fn health(State(app): State<App>) -> Result<Json<Health>, Failure> {
    let t = Instant::now();
    let reply = app.call(Request::List {}).await?;
    let Reply::List { vms } = reply else {
        return Err(Failure::unexpected(&reply));
    };
    Ok(Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        vms: vms.len() as u64,
        failed: vms.iter().filter(|v| v.state.starts_with("failed")).count() as u64,
        engine_latency_us: u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX),
    }))
}

async fn list(State(app): State<App>) -> Result<Json<VmList>, Failure> {
    match app.call(Request::List {}).await? {
        Reply::List { vms } => Ok(Json(VmList { vms })),
        r => Err(Failure::unexpected(&r)),
    }
}

async fn attach(
    State(app): State<App>,
    body: Result<Json<VmConfig>, JsonRejection>,
) -> Result<(StatusCode, Json<Message>), Failure> {
    let Json(vm) = body?;
    match app.call(Request::Attach { vm }).await? {
        Reply::Done { message } => Ok((StatusCode::CREATED, Json(Message { message }))),
        r => Err(Failure::unexpected(&r)),
    }
}

async fn status(
    State(app): State<App>,
    UrlPath(vm): UrlPath<String>,
) -> Result<HttpResponse, Failure> {
    let vm = vm_id(&vm)?;
    match app.call(Request::Status { vm }).await? {
        Reply::Status(s) => Ok(Json(*s).into_response()),
        r => Err(Failure::unexpected(&r)),
    }
}

async fn detach(
    State(app): State<App>,
    UrlPath(vm): UrlPath<String>,
) -> Result<Json<Message>, Failure> {
    let vm = vm_id(&vm)?;
    match app.call(Request::Detach { vm }).await? {
        Reply::Done { message } => Ok(Json(Message { message })),
        r => Err(Failure::unexpected(&r)),
    }
}

async fn tiering(
    State(app): State<App>,
    UrlPath(vm): UrlPath<String>,
) -> Result<HttpResponse, Failure> {
    let vm = vm_id(&vm)?;
    match app.call(Request::Tiering { vm }).await? {
        Reply::Tiering(t) => Ok(Json(t).into_response()),
        r => Err(Failure::unexpected(&r)),
    }
}

async fn set_tiering(
    State(app): State<App>,
    UrlPath(vm): UrlPath<String>,
    body: Result<Json<TieringChange>, JsonRejection>,
) -> Result<HttpResponse, Failure> {
    let vm = vm_id(&vm)?;
    let Json(change) = body?;
    match app.call(Request::SetTiering { vm, change }).await? {
        Reply::Tiering(t) => Ok(Json(t).into_response()),
        r => Err(Failure::unexpected(&r)),
    }
}

async fn stats(
    State(app): State<App>,
    UrlPath(vm): UrlPath<String>,
) -> Result<HttpResponse, Failure> {
    let vm = vm_id(&vm)?;
    match app.call(Request::Status { vm }).await? {
        Reply::Status(s) => Ok(Json(s.metrics).into_response()),
        r => Err(Failure::unexpected(&r)),
    }
}

async fn nodes(
    State(app): State<App>,
    UrlPath(vm): UrlPath<String>,
) -> Result<HttpResponse, Failure> {
    let vm = vm_id(&vm)?;
    match app.call(Request::Status { vm }).await? {
        Reply::Status(s) => Ok(Json(s.per_node).into_response()),
        r => Err(Failure::unexpected(&r)),
    }
}

/// `?ticks=N`, the only query a heatmap takes.
fn heatmap_ticks(query: Option<&str>) -> Result<Option<u32>, Failure> {
    let Some(q) = query.filter(|q| !q.is_empty()) else {
        return Ok(None);
    };
    match q.split_once('=') {
        Some(("ticks", n)) if !n.contains('&') => n
            .parse::<u32>()
            .map(Some)
            .map_err(|_| Failure::bad(format!("Invalid request: ticks {n:?} is not a count"))),
        _ => Err(Failure::bad(format!(
            "Invalid request: unknown query {q:?} (give ticks=N or nothing)"
        ))),
    }
}

async fn heatmap(
    State(app): State<App>,
    UrlPath(vm): UrlPath<String>,
    uri: axum::http::Uri,
) -> Result<HttpResponse, Failure> {
    let vm = vm_id(&vm)?;
    let ticks = heatmap_ticks(uri.query())?;
    match app.call(Request::Heatmap { vm, ticks }).await? {
        Reply::Heatmap(h) => Ok(Json(*h).into_response()),
        r => Err(Failure::unexpected(&r)),
    }
}

async fn metrics(State(app): State<App>) -> Result<HttpResponse, Failure> {
    let m: DaemonMetrics = match app.call(Request::Metrics {}).await? {
        Reply::Metrics(m) => *m,
        r => return Err(Failure::unexpected(&r)),
    };
    let text = crate::metrics::encode(&m).map_err(|e| {
        warn!("metrics: {e}");
        Failure(StatusCode::INTERNAL_SERVER_ERROR, "Internal error".into())
    })?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        )],
        text,
    )
        .into_response())
}

async fn not_found() -> Failure {
    Failure(StatusCode::NOT_FOUND, "No such endpoint".into())
}

/// Every route: method, path (axum syntax, as in docs/openapi.yaml) and handler. The
/// router is built from this table, and the OpenAPI test walks it.
fn routes() -> Vec<(Method, &'static str, MethodRouter<App>)> {
    use axum::routing::{delete, patch, post};
    vec![
        (Method::GET, "/v1/health", get(health)),
        (Method::GET, "/v1/vms", get(list)),
        (Method::POST, "/v1/vms", post(attach)),
        (Method::GET, "/v1/vms/{vm}", get(status)),
        (Method::DELETE, "/v1/vms/{vm}", delete(detach)),
        (Method::GET, "/v1/vms/{vm}/tiering", get(tiering)),
        (Method::PATCH, "/v1/vms/{vm}/tiering", patch(set_tiering)),
        (Method::GET, "/v1/vms/{vm}/stats", get(stats)),
        (Method::GET, "/v1/vms/{vm}/nodes", get(nodes)),
        (Method::GET, "/metrics", get(metrics)),
        (Method::GET, "/v1/vms/{vm}/heatmap", get(heatmap)),
    ]
}

/// Request limits shared by the unix and TCP routers.
#[derive(Clone, Debug)]
struct Limits {
    max_body: usize,
    rate: RateLimit,
}

/// A token bucket over all clients: `per_s` tokens a second, at most `per_s` saved.
#[derive(Clone, Debug)]
struct RateLimit {
    per_s: f64,
    bucket: Arc<Mutex<(f64, Instant)>>,
}

impl RateLimit {
    fn new(per_s: u32) -> Self {
        let per_s = f64::from(per_s.max(1));
        Self {
            per_s,
            bucket: Arc::new(Mutex::new((per_s, Instant::now()))),
        }
    }

    /// Takes a token if there is one.
    fn take(&self) -> bool {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(b.1).as_secs_f64() * self.per_s;
        b.0 = (b.0 + refill).min(self.per_s);
        b.1 = now;
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

async fn rate_limit(State(rate): State<RateLimit>, req: HttpRequest, next: Next) -> HttpResponse {
    if rate.take() {
        return next.run(req).await;
    }
    let mut r = Failure(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many requests; try again later".into(),
    )
    .into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Whether `a` and `b` are equal, in time that depends only on their lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn bearer(State(token): State<Arc<str>>, req: HttpRequest, next: Next) -> HttpResponse {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|g| same(g.as_bytes(), token.as_bytes())) {
        return next.run(req).await;
    }
    let mut r = Failure(
        StatusCode::UNAUTHORIZED,
        "Missing or invalid bearer token".into(),
    )
    .into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// The router: the routes, the body limit, the token check (TCP), the rate limit (outermost,
/// so that unauthenticated requests count too).
fn router(app: App, limits: &Limits, token: Option<Arc<str>>) -> Router {
    let mut r = Router::new();
    for (_, path, handler) in routes() {
        r = r.route(path, handler);
    }
    let mut r = r
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limits.max_body))
        .with_state(app);
    if let Some(t) = token {
        r = r.layer(middleware::from_fn_with_state(t, bearer));
    }
    r.layer(middleware::from_fn_with_state(
        limits.rate.clone(),
        rate_limit,
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use axum::body::Body;
    pub(super) use tower::ServiceExt;
    use vmtier_api::proto::{Tiering, VmMetrics, VmStatus, VmSummary};

    /// An engine thread that knows one VM, `web1`, and records the requests it gets.
    pub(super) fn fake_engine() -> (Sender<Call>, Arc<Mutex<Vec<Request>>>) {
        let (tx, rx) = mpsc::channel::<Call>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        thread::spawn(move || {
            let mut tiering = Tiering {
                budget_bytes: 64 << 20,
                policy: "default".into(),
                params: None,
                enabled: true,
                pins: vec![],
            };
            for (req, reply) in rx {
                log.lock().unwrap().push(req.clone());
                let known = |vm: &VmId| vm.as_str() == "web1";
                let r = match req {
                    Request::List {} => Response::Ok(Reply::List {
                        vms: vec![example_status().summary],
                    }),
                    Request::Status { vm } if known(&vm) => {
                        Response::Ok(Reply::Status(Box::new(example_status())))
                    }
                    Request::Tiering { vm } if known(&vm) => {
                        Response::Ok(Reply::Tiering(tiering.clone()))
                    }
                    Request::SetTiering { vm, change } if known(&vm) => {
                        if let Some(b) = change.budget {
                            tiering.budget_bytes = b.0;
                        }
                        if let Some(e) = change.enabled {
                            tiering.enabled = e;
                        }
                        Response::Ok(Reply::Tiering(tiering.clone()))
                    }
                    Request::Attach { vm } if known(&vm.name) => {
                        Response::Error(format!("VM {} is already managed", vm.name))
                    }
                    Request::Attach { vm } => Response::Ok(Reply::Done {
                        message: format!("Attached {}", vm.name),
                    }),
                    Request::Detach { vm } if known(&vm) => Response::Ok(Reply::Done {
                        message: format!("Detached {vm}"),
                    }),
                    Request::Metrics {} => {
                        Response::Ok(Reply::Metrics(Box::new(crate::metrics::tests::example())))
                    }
                    Request::Heatmap { vm, ticks } if known(&vm) => {
                        Response::Ok(Reply::Heatmap(Box::new(example_heatmap(ticks))))
                    }
                    Request::Status { vm }
                    | Request::SetBudget { vm, .. }
                    | Request::Tiering { vm }
                    | Request::SetTiering { vm, .. }
                    | Request::Detach { vm }
                    | Request::Heatmap { vm, .. } => Response::Error(format!("No VM named {vm}")),
                    // Only the libvirt hook sends it, over the control socket.
                    Request::LibvirtHook { .. } => Response::Error("Not an HTTP request".into()),
                };
                let _ = reply.send(r);
            }
        });
        (tx, seen)
    }

    /// A heatmap as the engine would give it: two ranges, three buckets, `ticks` rows
    /// (default 2).
    pub(crate) fn example_heatmap(ticks: Option<u32>) -> vmtier_api::Heatmap {
        use vmtier_api::heatmap::{HeatmapBucket, HeatmapRange, TickRow};
        let n = ticks.unwrap_or(2).min(2);
        vmtier_api::Heatmap {
            vm: "web1".parse().unwrap(),
            policy: "default".into(),
            budget_bytes: 64 << 20,
            total_bytes: 256 << 20,
            granule_bytes: 2 << 20,
            interval_ms: 1000,
            capacity_ticks: 120,
            ranges: vec![
                HeatmapRange {
                    name: "pc.ram".into(),
                    gpa: 0,
                    bytes: 640 << 10,
                    first_bucket: 0,
                    buckets: 1,
                },
                HeatmapRange {
                    name: "pc.ram".into(),
                    gpa: 1 << 20,
                    bytes: (256 << 20) - (1 << 20),
                    first_bucket: 1,
                    buckets: 2,
                },
            ],
            buckets: vec![
                HeatmapBucket {
                    gpa: 0,
                    bytes: 640 << 10,
                },
                HeatmapBucket {
                    gpa: 1 << 20,
                    bytes: 127 << 20,
                },
                HeatmapBucket {
                    gpa: 128 << 20,
                    bytes: 128 << 20,
                },
            ],
            ticks: (0..u64::from(n))
                .map(|t| TickRow {
                    tick: 41 + t,
                    unix_ms: 1_795_000_000_000 + 1000 * t,
                    budget_bytes: 64 << 20,
                    fast_bytes: 62 << 20,
                    heat_max: vec![0, 31, 2],
                    heat_mean: vec![0, 200, 3],
                    dram: vec![0, 255, 10],
                })
                .collect(),
        }
    }

    /// A status as the engine would give it.
    pub(crate) fn example_status() -> VmStatus {
        VmStatus {
            summary: VmSummary {
                name: "web1".parse().unwrap(),
                state: "active".into(),
                budget_bytes: 64 << 20,
                fast_bytes: 60 << 20,
                slow_bytes: 196 << 20,
                total_bytes: 256 << 20,
            },
            backend: "QEMU pid 42".into(),
            source: "damon-vaddr".into(),
            policy: "default".into(),
            granule_bytes: 2 << 20,
            per_node: vec![
                vmtier_api::NodeBytes {
                    node: vmtier_core::NodeId::new(0),
                    bytes: 60 << 20,
                },
                vmtier_api::NodeBytes {
                    node: vmtier_core::NodeId::new(1),
                    bytes: 196 << 20,
                },
            ],
            heat_histogram: vec![128 << 20, 64 << 20, 64 << 20],
            metrics: VmMetrics {
                ticks: 7,
                promoted_bytes: 4 << 20,
                ..VmMetrics::default()
            },
            hints: None,
            hybrid: Some(vmtier_api::proto::HybridStatus {
                split_regions: 3,
                max_split_regions: 25,
                splits: 5,
                merges: 2,
                refused: 0,
            }),
        }
    }

    struct Call_ {
        method: Method,
        uri: &'static str,
        body: &'static str,
        auth: Option<&'static str>,
    }

    async fn send(r: &Router, c: &Call_) -> (StatusCode, String, axum::http::HeaderMap) {
        let mut b = axum::http::Request::builder()
            .method(c.method.clone())
            .uri(c.uri)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(a) = c.auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        let resp = r
            .clone()
            .oneshot(b.body(Body::from(c.body)).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap(), headers)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    pub(super) fn limits_for_test() -> Limits {
        limits(1000)
    }

    fn limits(rate: u32) -> Limits {
        Limits {
            max_body: 1024,
            rate: RateLimit::new(rate),
        }
    }

    const fn call(method: Method, uri: &'static str, body: &'static str) -> Call_ {
        Call_ {
            method,
            uri,
            body,
            auth: None,
        }
    }

    #[test]
    fn endpoints_answer_with_the_engine_s_replies_and_errors_map_to_statuses() {
        let (tx, seen) = fake_engine();
        let r = router(App::new(tx), &limits(1000), None);
        let big: &'static str = Box::leak(
            format!(r#"{{"budget":"1G","policy":"{}"}}"#, "x".repeat(2000)).into_boxed_str(),
        );
        let cases: Vec<(Call_, StatusCode, &str, bool)> = vec![
            (
                call(Method::GET, "/v1/health", ""),
                StatusCode::OK,
                r#""status":"ok""#,
                true,
            ),
            (
                call(Method::GET, "/v1/vms", ""),
                StatusCode::OK,
                r#"{"vms":[{"name":"web1""#,
                true,
            ),
            (
                call(Method::GET, "/v1/vms/web1", ""),
                StatusCode::OK,
                r#""per_node":[{"node":0,"bytes":62914560}"#,
                true,
            ),
            (
                call(Method::GET, "/v1/vms/nope", ""),
                StatusCode::NOT_FOUND,
                r#"{"error":"No VM named nope"}"#,
                true,
            ),
            (
                call(Method::GET, "/v1/vms/bad%20name", ""),
                StatusCode::BAD_REQUEST,
                "Invalid VM name",
                false,
            ),
            (
                call(Method::GET, "/v1/vms/web1/stats", ""),
                StatusCode::OK,
                r#""ticks":7"#,
                true,
            ),
            (
                call(Method::GET, "/v1/vms/web1/nodes", ""),
                StatusCode::OK,
                r#"[{"node":0,"bytes":62914560},{"node":1"#,
                true,
            ),
            (
                call(Method::GET, "/v1/vms/web1/tiering", ""),
                StatusCode::OK,
                r#""budget_bytes":67108864"#,
                true,
            ),
            (
                call(Method::PATCH, "/v1/vms/web1/tiering", r#"{"budget":"32M"}"#),
                StatusCode::OK,
                r#""budget_bytes":33554432"#,
                true,
            ),
            (
                call(Method::PATCH, "/v1/vms/web1/tiering", r#"{}"#),
                StatusCode::BAD_REQUEST,
                "nothing to change for web1",
                false,
            ),
            (
                call(
                    Method::PATCH,
                    "/v1/vms/web1/tiering",
                    r#"{"budget":"2000T"}"#,
                ),
                StatusCode::BAD_REQUEST,
                "above the largest",
                false,
            ),
            (
                call(
                    Method::PATCH,
                    "/v1/vms/web1/tiering",
                    r#"{"budget":"lots"}"#,
                ),
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid request",
                false,
            ),
            (
                call(Method::PATCH, "/v1/vms/web1/tiering", r#"{"budgte":"1G"}"#),
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown field",
                false,
            ),
            (
                call(Method::PATCH, "/v1/vms/web1/tiering", "{not json"),
                StatusCode::BAD_REQUEST,
                "Invalid request",
                false,
            ),
            (
                call(Method::PATCH, "/v1/vms/web1/tiering", big),
                StatusCode::PAYLOAD_TOO_LARGE,
                "Request body too large",
                false,
            ),
            (
                call(
                    Method::POST,
                    "/v1/vms",
                    r#"{"name":"db","budget":"1G","qmp":"/run/db.qmp"}"#,
                ),
                StatusCode::CREATED,
                r#"{"message":"Attached db"}"#,
                true,
            ),
            (
                call(
                    Method::POST,
                    "/v1/vms",
                    r#"{"name":"web1","budget":"1G","qmp":"/q"}"#,
                ),
                StatusCode::CONFLICT,
                "already managed",
                true,
            ),
            (
                call(Method::POST, "/v1/vms", r#"{"name":"db","budget":"1G"}"#),
                StatusCode::BAD_REQUEST,
                "give qmp",
                false,
            ),
            (
                call(Method::DELETE, "/v1/vms/web1", ""),
                StatusCode::OK,
                r#"{"message":"Detached web1"}"#,
                true,
            ),
            (
                call(Method::DELETE, "/v1/vms", ""),
                StatusCode::METHOD_NOT_ALLOWED,
                "",
                false,
            ),
            (
                call(Method::GET, "/v2/nothing", ""),
                StatusCode::NOT_FOUND,
                "No such endpoint",
                false,
            ),
            (
                call(Method::GET, "/metrics", ""),
                StatusCode::OK,
                "# TYPE vmtier_vm_budget_bytes gauge",
                true,
            ),
        ];
        rt().block_on(async {
            for (c, want_status, want_body, reaches_engine) in cases {
                let before = seen.lock().unwrap().len();
                let (status, body, _) = send(&r, &c).await;
                assert_eq!(status, want_status, "{} {}: {body}", c.method, c.uri);
                assert!(body.contains(want_body), "{} {}: {body}", c.method, c.uri);
                let after = seen.lock().unwrap().len();
                assert_eq!(after > before, reaches_engine, "{} {}", c.method, c.uri);
            }
        });
    }

    #[test]
    fn tcp_needs_the_bearer_token_and_refusals_change_nothing() {
        let (tx, seen) = fake_engine();
        let token: Arc<str> = Arc::from("s3cret-token-0123456789");
        let r = router(App::new(tx), &limits(1000), Some(token));
        let patch = |auth| Call_ {
            method: Method::PATCH,
            uri: "/v1/vms/web1/tiering",
            body: r#"{"budget":"8M"}"#,
            auth,
        };
        let cases = [
            (None, StatusCode::UNAUTHORIZED),
            (Some("Bearer wrong"), StatusCode::UNAUTHORIZED),
            (
                Some("Bearer s3cret-token-012345678"),
                StatusCode::UNAUTHORIZED,
            ),
            (Some("Basic czNjcmV0"), StatusCode::UNAUTHORIZED),
            (
                Some("bearer s3cret-token-0123456789"),
                StatusCode::UNAUTHORIZED,
            ),
            (Some("Bearer s3cret-token-0123456789"), StatusCode::OK),
        ];
        rt().block_on(async {
            for (auth, want) in cases {
                let before = seen.lock().unwrap().len();
                let (status, body, headers) = send(&r, &patch(auth)).await;
                assert_eq!(status, want, "{auth:?}: {body}");
                let reached = seen.lock().unwrap().len() > before;
                assert_eq!(reached, want == StatusCode::OK, "{auth:?}");
                if want == StatusCode::UNAUTHORIZED {
                    assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
                    assert!(body.contains("Missing or invalid bearer token"));
                }
            }
        });
    }

    #[test]
    fn requests_beyond_the_rate_get_429() {
        let (tx, _) = fake_engine();
        let r = router(App::new(tx), &limits(5), None);
        rt().block_on(async {
            let mut statuses = Vec::new();
            for _ in 0..8 {
                let (s, _, h) = send(&r, &call(Method::GET, "/v1/health", "")).await;
                if s == StatusCode::TOO_MANY_REQUESTS {
                    assert_eq!(h[header::RETRY_AFTER], "1");
                }
                statuses.push(s.as_u16());
            }
            // A burst of 5, then refusals (8 requests take far less than the 200 ms a
            // token takes to come back).
            assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
        });
    }

    #[test]
    fn token_files_are_checked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("vmtierd-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases: [(&str, u32, Option<&str>); 5] = [
            ("0123456789abcdef\n", 0o600, None),
            (
                "0123456789abcdef\n",
                0o644,
                Some("group or others may access it (mode 0644)"),
            ),
            ("short\n", 0o600, Some("give one line of 16 to 4096")),
            ("0123456789 abcdef\n", 0o600, Some("without spaces")),
            ("0123456789abcdef\nmore\n", 0o600, Some("printable")),
        ];
        for (i, (text, mode, want)) in cases.into_iter().enumerate() {
            let f = dir.join(format!("t{i}"));
            std::fs::write(&f, text).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            match (read_token(&f), want) {
                (Ok(t), None) => assert_eq!(&*t, "0123456789abcdef"),
                (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{e}"),
                (r, _) => panic!("{text:?}: {r:?}"),
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn refusals_map_to_statuses() {
        let cases = [
            ("No VM named a", StatusCode::NOT_FOUND),
            ("VM a is already managed", StatusCode::CONFLICT),
            (
                "Budget 2 GiB for a exceeds the DRAM node's 1 GiB",
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
        ];
        for (msg, want) in cases {
            assert_eq!(refusal_status(msg), want, "{msg}");
        }
        // The engine's own messages, so that a change of wording fails here.
        let a: VmId = "a".parse().unwrap();
        assert_eq!(
            refusal_status(&crate::engine::Error::NoSuchVm(a.clone()).to_string()),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            refusal_status(&crate::engine::Error::Exists(a).to_string()),
            StatusCode::CONFLICT
        );
    }
}

/// docs/openapi.yaml against the router: the same routes and methods, and every answer of
/// the handlers (to requests that reach each route, with every status they give) fits the
/// schema the document gives for that status.
#[cfg(test)]
mod openapi {
    use super::tests::*;
    use super::*;
    use serde_json::Value;

    const DOC: &str = include_str!("../../../docs/openapi.yaml");

    fn doc() -> Value {
        serde_yaml_ng::from_str(DOC).expect("docs/openapi.yaml parses")
    }

    /// Follows a `$ref` within the document.
    fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let ptr = r.strip_prefix('#').expect("local $ref");
                resolve(
                    doc,
                    doc.pointer(ptr).unwrap_or_else(|| panic!("{r} exists")),
                )
            }
            None => v,
        }
    }

    /// Checks `v` against `schema` (the subset of OpenAPI 3.0 schemas the document uses;
    /// an unknown keyword fails the test so that it cannot be silently ignored).
    fn validate(doc: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
        let s = resolve(doc, schema);
        let obj = s
            .as_object()
            .ok_or(format!("{at}: schema is not an object"))?;
        for key in obj.keys() {
            let known = [
                "type",
                "properties",
                "required",
                "additionalProperties",
                "items",
                "enum",
                "minimum",
                "maximum",
                "oneOf",
                "nullable",
                "description",
                "example",
                "pattern",
                "minProperties",
                "minItems",
            ];
            if !known.contains(&key.as_str()) {
                return Err(format!(
                    "{at}: schema keyword {key} not supported by this test"
                ));
            }
        }
        if v.is_null() && s.get("nullable") == Some(&Value::Bool(true)) {
            return Ok(());
        }
        if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
            let fits = alts
                .iter()
                .filter(|a| validate(doc, a, v, at).is_ok())
                .count();
            return if fits == 1 {
                Ok(())
            } else {
                Err(format!("{at}: {v} fits {fits} of oneOf"))
            };
        }
        let ty = s.get("type").and_then(Value::as_str);
        let ok = match ty {
            Some("object") => v.is_object(),
            Some("array") => v.is_array(),
            Some("string") => v.is_string(),
            Some("integer") => v.is_u64() || v.is_i64(),
            Some("number") => v.is_number(),
            Some("boolean") => v.is_boolean(),
            None => true,
            Some(t) => return Err(format!("{at}: type {t}?")),
        };
        if !ok {
            return Err(format!("{at}: {v} is not {ty:?}"));
        }
        if let Some(e) = s.get("enum").and_then(Value::as_array) {
            if !e.contains(v) {
                return Err(format!("{at}: {v} not in {e:?}"));
            }
        }
        if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_i64), v.as_i64()) {
            if n < min {
                return Err(format!("{at}: {n} < {min}"));
            }
        }
        if let Some(m) = v.as_object() {
            let props = s.get("properties").and_then(Value::as_object);
            for r in s
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let r = r.as_str().unwrap_or_default();
                if !m.contains_key(r) {
                    return Err(format!("{at}: required {r} missing in {v}"));
                }
            }
            for (k, val) in m {
                match props.and_then(|p| p.get(k)) {
                    Some(ps) => validate(doc, ps, val, &format!("{at}.{k}"))?,
                    None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                        return Err(format!("{at}: {k} is not in the schema"));
                    }
                    None => {}
                }
            }
        }
        if let (Some(min), Some(a)) = (s.get("minItems").and_then(Value::as_u64), v.as_array()) {
            if (a.len() as u64) < min {
                return Err(format!("{at}: fewer than {min} items"));
            }
        }
        if let (Some(min), Some(m)) = (
            s.get("minProperties").and_then(Value::as_u64),
            v.as_object(),
        ) {
            if (m.len() as u64) < min {
                return Err(format!("{at}: fewer than {min} properties"));
            }
        }
        if let (Some(items), Some(a)) = (s.get("items"), v.as_array()) {
            for (i, x) in a.iter().enumerate() {
                validate(doc, items, x, &format!("{at}[{i}]"))?;
            }
        }
        Ok(())
    }

    /// Requests that reach every route with the statuses their handlers give.
    fn requests() -> Vec<(Method, &'static str, &'static str)> {
        vec![
            (Method::GET, "/v1/health", ""),
            (Method::GET, "/v1/vms", ""),
            (
                Method::POST,
                "/v1/vms",
                r#"{"name":"db","budget":"1G","qmp":"/run/db.qmp"}"#,
            ),
            (
                Method::POST,
                "/v1/vms",
                r#"{"name":"web1","budget":4096,"qmp":"/q"}"#,
            ),
            (Method::POST, "/v1/vms", r#"{"name":"db","budget":"1G"}"#),
            (
                Method::POST,
                "/v1/vms",
                r#"{"name":"db","budget":"1G","qmp":"/q","x":1}"#,
            ),
            (Method::POST, "/v1/vms", "["),
            (Method::GET, "/v1/vms/web1", ""),
            (Method::GET, "/v1/vms/nope", ""),
            (Method::GET, "/v1/vms/bad%20name", ""),
            (Method::DELETE, "/v1/vms/web1", ""),
            (Method::DELETE, "/v1/vms/nope", ""),
            (Method::GET, "/v1/vms/web1/tiering", ""),
            (Method::GET, "/v1/vms/nope/tiering", ""),
            (
                Method::PATCH,
                "/v1/vms/web1/tiering",
                r#"{"budget":"32M","enabled":false}"#,
            ),
            (Method::PATCH, "/v1/vms/web1/tiering", r#"{}"#),
            (Method::PATCH, "/v1/vms/nope/tiering", r#"{"enabled":true}"#),
            (Method::GET, "/v1/vms/web1/stats", ""),
            (Method::GET, "/v1/vms/nope/stats", ""),
            (Method::GET, "/v1/vms/web1/nodes", ""),
            (Method::GET, "/v1/vms/nope/nodes", ""),
            (Method::GET, "/metrics", ""),
            (Method::GET, "/v1/vms/web1/heatmap", ""),
            (Method::GET, "/v1/vms/web1/heatmap?ticks=1", ""),
            (Method::GET, "/v1/vms/web1/heatmap?ticks=0", ""),
            (Method::GET, "/v1/vms/web1/heatmap?tick=1", ""),
            (Method::GET, "/v1/vms/nope/heatmap", ""),
        ]
    }

    #[test]
    fn openapi_document_matches_the_router() {
        let doc = doc();
        let paths = doc["paths"].as_object().expect("paths");
        let methods = ["get", "post", "put", "patch", "delete"];
        let mut in_router = Vec::new();
        for (m, path, _) in routes() {
            let m = m.as_str().to_ascii_lowercase();
            assert!(
                paths.get(path).and_then(|p| p.get(&m)).is_some(),
                "{m} {path} is in the router but not in docs/openapi.yaml"
            );
            in_router.push((m, path.to_owned()));
        }
        for (path, item) in paths {
            for m in methods.iter().filter(|m| item.get(**m).is_some()) {
                assert!(
                    in_router.contains(&((*m).to_owned(), path.clone())),
                    "{m} {path} is documented but not routed"
                );
            }
        }

        let (tx, _) = fake_engine();
        let r = router(App::new(tx), &limits_for_test(), None);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut reached = Vec::new();
        rt.block_on(async {
            for (m, uri, body) in requests() {
                let req = axum::http::Request::builder()
                    .method(m.clone())
                    .uri(uri)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(axum::body::Body::from(body))
                    .unwrap();
                let resp = r.clone().oneshot(req).await.unwrap();
                let status = resp.status().as_str().to_owned();
                let ctype = resp.headers()[header::CONTENT_TYPE]
                    .to_str()
                    .unwrap()
                    .to_owned();
                let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
                    .await
                    .unwrap();
                // The documented path this URI matches.
                let (path, _) = routes()
                    .into_iter()
                    .map(|(rm, p, _)| (p, rm))
                    .find(|(p, rm)| *rm == m && matches_path(p, uri))
                    .unwrap_or_else(|| panic!("{m} {uri} matches a route"));
                let op = &paths[path][m.as_str().to_ascii_lowercase()];
                let resp_doc = resolve(&doc, &op["responses"][&status]);
                assert!(
                    resp_doc.is_object(),
                    "{m} {uri}: status {status} is not documented"
                );
                let media = resp_doc["content"].as_object().expect("content");
                let (mt, content) = media.iter().next().unwrap();
                assert!(ctype.starts_with(mt.as_str()), "{m} {uri}: {ctype} vs {mt}");
                if mt == "application/json" {
                    let v: Value = serde_json::from_slice(&bytes).unwrap();
                    validate(&doc, &content["schema"], &v, &format!("{m} {uri} {status}")).unwrap();
                }
                if !body.is_empty() && status.starts_with('2') {
                    let v: Value = serde_json::from_str(body).unwrap();
                    let schema = &op["requestBody"]["content"]["application/json"]["schema"];
                    validate(&doc, schema, &v, &format!("{m} {uri} request")).unwrap();
                }
                reached.push((m.as_str().to_ascii_lowercase(), path.to_owned()));
            }
        });
        for route in &in_router {
            assert!(
                reached.contains(route),
                "{route:?} has a request in this test"
            );
        }
    }

    /// Whether `uri` matches the route `path` (`{vm}` matches one segment).
    fn matches_path(path: &str, uri: &str) -> bool {
        let uri = uri.split('?').next().unwrap_or(uri);
        let a: Vec<&str> = path.split('/').collect();
        let b: Vec<&str> = uri.split('/').collect();
        a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.starts_with('{') || x == y)
    }

    #[test]
    fn the_schema_checker_refuses_what_does_not_fit() {
        let doc = doc();
        let schemas = &doc["components"]["schemas"];
        let cases = [
            (
                "Tiering",
                r#"{"budget_bytes":1,"policy":"d","params":null,"enabled":true}"#,
                true,
            ),
            (
                "Tiering",
                r#"{"budget_bytes":1,"policy":"d","params":null}"#,
                false,
            ),
            (
                "Tiering",
                r#"{"budget_bytes":-1,"policy":"d","params":null,"enabled":true}"#,
                false,
            ),
            (
                "Tiering",
                r#"{"budget_bytes":1,"policy":"d","params":null,"enabled":1}"#,
                false,
            ),
            ("Message", r#"{"message":"x","extra":1}"#, false),
            ("Size", r#""64M""#, true),
            ("Size", "64", true),
            ("Size", "true", false),
            ("VmConfig", r#"{"name":"a","budget":1,"qmp":"/q"}"#, true),
            (
                "VmConfig",
                r#"{"name":"a","budget":1,"pid":3,"ranges":[{"start":"0x1000","len":4096}]}"#,
                true,
            ),
            (
                "VmConfig",
                r#"{"name":"a","budget":1,"qmp":"/q","ranges":[]}"#,
                false,
            ),
            (
                "VmConfig",
                r#"{"name":"a","budget":1,"pid":3,"ranges":[]}"#,
                false,
            ),
            ("VmConfig", r#"{"name":"a","budget":1}"#, false),
            ("TieringChange", "{}", false),
        ];
        for (name, json, want) in cases {
            let v: Value = serde_json::from_str(json).unwrap();
            let got = validate(&doc, &schemas[name], &v, name);
            assert_eq!(got.is_ok(), want, "{name} {json}: {got:?}");
        }
    }
}
