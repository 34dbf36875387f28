//! A connection to libvirt: running domains, their vmtier metadata, and the events that say
//! when to look again (lifecycle, metadata change, device added or removed — memory hotplug
//! arrives as a `dimm` device).
//!
//! Events need libvirt's event loop: [`Libvirt::open`] registers the default implementation
//! once per process and runs it on a thread of its own; callbacks only send an [`Event`] down
//! a channel, which the daemon drains between ticks.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, OnceLock};

use log::{debug, warn};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::ErrorNumber;

use crate::metadata::{Tiering, KEY, NAMESPACE};

/// The URI vmtierd and vmtierctl use unless told otherwise.
pub const DEFAULT_URI: &str = "qemu:///system";

/// Error talking to libvirt.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The connection could not be opened.
    #[error("Cannot connect to libvirt at {0}")]
    Open(String, #[source] virt::error::Error),
    /// libvirt's event loop could not start.
    #[error("Cannot start libvirt's event loop: {0}")]
    EventLoop(String),
    /// A libvirt call failed.
    #[error("Libvirt {0} failed")]
    Call(&'static str, #[source] virt::error::Error),
    /// No domain has this name or UUID.
    #[error("No libvirt domain {0}")]
    NoDomain(String, #[source] virt::error::Error),
}

/// What happened to a domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A lifecycle event (`VIR_DOMAIN_EVENT_*`: started, stopped, crashed, suspended for
    /// migration...), with libvirt's event and detail numbers.
    Lifecycle {
        /// `virDomainEventType`.
        event: i32,
        /// The event's detail.
        detail: i32,
    },
    /// Its `<metadata>` changed (any namespace).
    Metadata,
    /// A device was added (memory hotplug: a `dimm`).
    DeviceAdded(String),
    /// A device was removed.
    DeviceRemoved(String),
}

/// An event of one domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The domain's name.
    pub domain: String,
    /// What happened.
    pub kind: EventKind,
}

impl Event {
    /// `started`, `stopped (destroyed)`, `metadata changed`...
    pub fn describe(&self) -> String {
        match &self.kind {
            EventKind::Lifecycle { event, detail } => {
                let what = match u32::try_from(*event).unwrap_or(u32::MAX) {
                    virt_sys::VIR_DOMAIN_EVENT_DEFINED => "defined",
                    virt_sys::VIR_DOMAIN_EVENT_UNDEFINED => "undefined",
                    virt_sys::VIR_DOMAIN_EVENT_STARTED => "started",
                    virt_sys::VIR_DOMAIN_EVENT_SUSPENDED => "suspended",
                    virt_sys::VIR_DOMAIN_EVENT_RESUMED => "resumed",
                    virt_sys::VIR_DOMAIN_EVENT_STOPPED => "stopped",
                    virt_sys::VIR_DOMAIN_EVENT_SHUTDOWN => "shut down",
                    virt_sys::VIR_DOMAIN_EVENT_PMSUSPENDED => "PM-suspended",
                    virt_sys::VIR_DOMAIN_EVENT_CRASHED => "crashed",
                    _ => "lifecycle event",
                };
                format!("{what} (event {event}, detail {detail})")
            }
            EventKind::Metadata => "metadata changed".into(),
            EventKind::DeviceAdded(a) => format!("device {a} added"),
            EventKind::DeviceRemoved(a) => format!("device {a} removed"),
        }
    }
}

/// A running domain as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainState {
    /// Name.
    pub name: String,
    /// UUID, as text.
    pub uuid: String,
    /// libvirt's id of the running domain.
    pub id: u32,
    /// Whether its vCPUs run (`VIR_DOMAIN_RUNNING`): a domain being started or migrated in is
    /// paused, and libvirt holds its monitor until it resumes.
    pub running: bool,
    /// vmtier's metadata element, if the domain has one.
    pub metadata: Option<String>,
}

/// Starts libvirt's default event loop on its own thread, once per process.
fn event_loop() -> Result<(), Error> {
    static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
    STARTED
        .get_or_init(|| {
            virt::event::event_register_default_impl().map_err(|e| e.to_string())?;
            std::thread::Builder::new()
                .name("libvirt-events".into())
                .spawn(|| loop {
                    if let Err(e) = virt::event::event_run_default_impl() {
                        warn!("libvirt event loop: {e}");
                        std::thread::sleep(std::time::Duration::from_secs(1));
                    }
                })
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(Error::EventLoop)
}

/// The domain's name, or `?`.
///
/// # Safety
/// `dom` is a domain pointer libvirt passed to an event callback (valid for the call).
unsafe fn dom_name(dom: virt_sys::virDomainPtr) -> String {
    // SAFETY: the caller passes a valid domain; libvirt returns a string it owns (or NULL).
    let p = unsafe { virt_sys::virDomainGetName(dom) };
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: non-NULL, NUL-terminated, valid as long as `dom`.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// # Safety
/// `opaque` is the `Sender<Event>` registered with the callback.
unsafe fn send(opaque: *mut c_void, ev: Event) {
    // SAFETY: registered as a leaked Box<Sender<Event>>, freed only by `free_sender` after
    // libvirt stops calling back.
    let tx = unsafe { &*(opaque as *const Sender<Event>) };
    debug!("libvirt event: {} {}", ev.domain, ev.describe());
    let _ = tx.send(ev);
}

unsafe extern "C" fn on_lifecycle(
    _conn: virt_sys::virConnectPtr,
    dom: virt_sys::virDomainPtr,
    event: c_int,
    detail: c_int,
    opaque: *mut c_void,
) {
    // SAFETY: called by libvirt with a valid domain and our registered opaque pointer.
    unsafe {
        let domain = dom_name(dom);
        send(
            opaque,
            Event {
                domain,
                kind: EventKind::Lifecycle { event, detail },
            },
        );
    }
}

unsafe extern "C" fn on_metadata(
    _conn: virt_sys::virConnectPtr,
    dom: virt_sys::virDomainPtr,
    _kind: c_int,
    _nsuri: *const c_char,
    opaque: *mut c_void,
) {
    // SAFETY: called by libvirt with a valid domain and our registered opaque pointer.
    unsafe {
        let domain = dom_name(dom);
        send(
            opaque,
            Event {
                domain,
                kind: EventKind::Metadata,
            },
        );
    }
}

unsafe fn alias(p: *const c_char) -> String {
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: libvirt passes a NUL-terminated string valid for the call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

unsafe extern "C" fn on_device_added(
    _conn: virt_sys::virConnectPtr,
    dom: virt_sys::virDomainPtr,
    dev: *const c_char,
    opaque: *mut c_void,
) {
    // SAFETY: called by libvirt with a valid domain, alias and our opaque pointer.
    unsafe {
        let ev = Event {
            domain: dom_name(dom),
            kind: EventKind::DeviceAdded(alias(dev)),
        };
        send(opaque, ev);
    }
}

unsafe extern "C" fn on_device_removed(
    _conn: virt_sys::virConnectPtr,
    dom: virt_sys::virDomainPtr,
    dev: *const c_char,
    opaque: *mut c_void,
) {
    // SAFETY: called by libvirt with a valid domain, alias and our opaque pointer.
    unsafe {
        let ev = Event {
            domain: dom_name(dom),
            kind: EventKind::DeviceRemoved(alias(dev)),
        };
        send(opaque, ev);
    }
}

unsafe extern "C" fn free_sender(opaque: *mut c_void) {
    // SAFETY: `opaque` is the Box<Sender<Event>> leaked at registration; libvirt calls this
    // once, after the callback is deregistered.
    drop(unsafe { Box::from_raw(opaque.cast::<Sender<Event>>()) });
}

/// A connection to libvirt with event callbacks registered.
#[derive(Debug)]
pub struct Libvirt {
    conn: Arc<Connect>,
    uri: String,
    events: Receiver<Event>,
    callbacks: Vec<c_int>,
}

type Generic = unsafe extern "C" fn(virt_sys::virConnectPtr, virt_sys::virDomainPtr, *mut c_void);

impl Libvirt {
    /// Connects to `uri` (read-write: vmtierctl writes metadata) and registers for events.
    pub fn open(uri: &str) -> Result<Self, Error> {
        event_loop()?;
        // libvirt prints every error to stderr by default; ours are returned and logged.
        virt::error::clear_error_callback();
        let conn = Connect::open(Some(uri)).map_err(|e| Error::Open(uri.to_owned(), e))?;
        let (tx, events) = mpsc::channel();
        let mut lv = Self {
            conn: Arc::new(conn),
            uri: uri.to_owned(),
            events,
            callbacks: Vec::new(),
        };
        // The event-specific callbacks, cast to the generic type libvirt's API takes (its
        // VIR_DOMAIN_EVENT_CALLBACK macro does the same); libvirt calls each back with the
        // signature of its event id.
        // SAFETY: casts between `unsafe extern "C"` function pointers of the same size;
        // libvirt calls each with the arguments of the event it was registered for.
        let cbs: [(u32, Generic); 4] = unsafe {
            [
                (
                    virt_sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                    std::mem::transmute::<
                        unsafe extern "C" fn(
                            virt_sys::virConnectPtr,
                            virt_sys::virDomainPtr,
                            c_int,
                            c_int,
                            *mut c_void,
                        ),
                        Generic,
                    >(on_lifecycle),
                ),
                (
                    virt_sys::VIR_DOMAIN_EVENT_ID_METADATA_CHANGE,
                    std::mem::transmute::<
                        unsafe extern "C" fn(
                            virt_sys::virConnectPtr,
                            virt_sys::virDomainPtr,
                            c_int,
                            *const c_char,
                            *mut c_void,
                        ),
                        Generic,
                    >(on_metadata),
                ),
                (
                    virt_sys::VIR_DOMAIN_EVENT_ID_DEVICE_ADDED,
                    std::mem::transmute::<
                        unsafe extern "C" fn(
                            virt_sys::virConnectPtr,
                            virt_sys::virDomainPtr,
                            *const c_char,
                            *mut c_void,
                        ),
                        Generic,
                    >(on_device_added),
                ),
                (
                    virt_sys::VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
                    std::mem::transmute::<
                        unsafe extern "C" fn(
                            virt_sys::virConnectPtr,
                            virt_sys::virDomainPtr,
                            *const c_char,
                            *mut c_void,
                        ),
                        Generic,
                    >(on_device_removed),
                ),
            ]
        };
        for (id, cb) in cbs {
            let opaque = Box::into_raw(Box::new(tx.clone())).cast::<c_void>();
            // SAFETY: a live connection; NULL domain = all domains; `opaque` is owned by
            // libvirt from here on and freed through `free_sender`.
            let r = unsafe {
                virt_sys::virConnectDomainEventRegisterAny(
                    lv.conn.as_ptr(),
                    std::ptr::null_mut(),
                    c_int::try_from(id).unwrap_or(c_int::MAX),
                    Some(cb),
                    opaque,
                    Some(free_sender),
                )
            };
            if r < 0 {
                // SAFETY: libvirt did not take `opaque` when registration failed.
                unsafe { free_sender(opaque) };
                return Err(Error::Call(
                    "event registration",
                    virt::error::Error::last_error(),
                ));
            }
            lv.callbacks.push(r);
        }
        // Keepalive messages detect a dead libvirtd (they need the event loop above).
        if let Err(e) = lv.conn.set_keep_alive(5, 3) {
            debug!("libvirt keepalive: {e}");
        }
        Ok(lv)
    }

    /// The URI.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The connection (shared with backends).
    pub fn connect(&self) -> Arc<Connect> {
        Arc::clone(&self.conn)
    }

    /// Events received since the last call.
    pub fn events(&self) -> Vec<Event> {
        self.events.try_iter().collect()
    }

    /// Whether the connection still works.
    pub fn is_alive(&self) -> bool {
        self.conn.is_alive().unwrap_or(false)
    }

    /// The running domains, with their vmtier metadata.
    pub fn running(&self) -> Result<Vec<DomainState>, Error> {
        let doms = self
            .conn
            .list_all_domains(virt_sys::VIR_CONNECT_LIST_DOMAINS_ACTIVE)
            .map_err(|e| Error::Call("list domains", e))?;
        let mut out = Vec::with_capacity(doms.len());
        for d in doms {
            // A domain that stops while being listed is skipped; its event follows.
            let (Ok(name), Ok(uuid), Some(id)) = (d.get_name(), d.get_uuid_string(), d.get_id())
            else {
                continue;
            };
            let metadata = match metadata(&d, true) {
                Ok(m) => m,
                Err(e) => {
                    debug!("{name}: {e}");
                    continue;
                }
            };
            let running = d
                .get_state()
                .is_ok_and(|(st, _)| st == virt_sys::VIR_DOMAIN_RUNNING);
            out.push(DomainState {
                name,
                uuid,
                id,
                running,
                metadata,
            });
        }
        Ok(out)
    }

    /// The domain with this name or UUID.
    pub fn lookup(&self, name_or_uuid: &str) -> Result<Domain, Error> {
        Domain::lookup_by_name(&self.conn, name_or_uuid)
            .or_else(|_| Domain::lookup_by_uuid_string(&self.conn, name_or_uuid))
            .map_err(|e| Error::NoDomain(name_or_uuid.to_owned(), e))
    }
}

impl Drop for Libvirt {
    fn drop(&mut self) {
        for &id in &self.callbacks {
            // SAFETY: ids returned by virConnectDomainEventRegisterAny on this connection.
            unsafe { virt_sys::virConnectDomainEventDeregisterAny(self.conn.as_ptr(), id) };
        }
    }
}

/// vmtier's metadata element of `dom`: of the running domain (`live`) or of its persistent
/// definition; `None` when it has none.
pub fn metadata(dom: &Domain, live: bool) -> Result<Option<String>, Error> {
    let flags = if live {
        virt_sys::VIR_DOMAIN_AFFECT_LIVE
    } else {
        virt_sys::VIR_DOMAIN_AFFECT_CONFIG
    };
    match dom.get_metadata(
        c_int::try_from(virt_sys::VIR_DOMAIN_METADATA_ELEMENT).unwrap_or(2),
        Some(NAMESPACE),
        flags,
    ) {
        Ok(xml) => Ok(Some(xml)),
        Err(e) if e.code() == ErrorNumber::NoDomainMetadata => Ok(None),
        Err(e) => Err(Error::Call("get metadata", e)),
    }
}

/// Writes (or with `None` removes) vmtier's metadata element of `dom`, in the running
/// domain (`live`) and/or its persistent definition (`config`).
pub fn set_metadata(
    dom: &Domain,
    tiering: Option<&Tiering>,
    live: bool,
    config: bool,
) -> Result<(), Error> {
    let mut flags = 0;
    if live {
        flags |= virt_sys::VIR_DOMAIN_AFFECT_LIVE;
    }
    if config {
        flags |= virt_sys::VIR_DOMAIN_AFFECT_CONFIG;
    }
    let xml = tiering.map(Tiering::to_xml);
    dom.set_metadata(
        c_int::try_from(virt_sys::VIR_DOMAIN_METADATA_ELEMENT).unwrap_or(2),
        xml.as_deref(),
        xml.as_ref().map(|_| KEY),
        Some(NAMESPACE),
        flags,
    )
    .map(|_| ())
    .map_err(|e| Error::Call("set metadata", e))
}
