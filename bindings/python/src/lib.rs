//! `gatehouse._native`: the PyO3 adapter between the Python package and the gatehouse crate.
//!
//! It builds only on the crate's public facade. It owns one tokio runtime per `Gateway`; every
//! wait on Rust (registering, releasing, shutting down, a full progress queue) happens with the
//! GIL released (`Python::detach`). Python tools never run on the runtime's workers: a sync
//! call goes to the gateway's `ToolPool` (persistent threads attached to the interpreter once,
//! waiting for work detached), a coroutine call to its event loop's `LoopPort` (a bounded queue
//! the loop drains when a byte arrives on a socket it watches), so neither path makes a thread
//! state per call nor needs the GIL on the runtime's side.
//!
//! Fork safety: every object remembers the pid that made it. In a forked child each call
//! raises `GatewayStopped`, and dropping the objects leaks their Rust state instead of running
//! destructors that would touch locks and threads the child does not have (the Python package
//! also closes the inherited listening socket; see `gatehouse/_fork.py`).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use gatehouse::{
    Config, Gateway, GatewayError, InProcessTool, Limits, Registration, RegistrationSpec, Root,
    ToolContext, ToolError, ToolResult, LOG_LEVELS,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyType};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Notifications a tool's context may queue before `report_progress`/`log` wait for room.
const NOTE_QUEUE: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A `gatehouse._errors` exception class by name, with `msg`.
fn py_err(py: Python<'_>, class: &str, msg: String) -> PyErr {
    let ty = py
        .import("gatehouse._errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match ty {
        Ok(ty) => PyErr::from_type(ty, msg),
        Err(e) => e,
    }
}

fn gateway_err(py: Python<'_>, e: GatewayError) -> PyErr {
    match e {
        GatewayError::InvalidSpec(m) if m.contains("matches no tool") => py_err(
            py,
            "UnknownGrant",
            format!(
                "{m}. Pass a @gatehouse.tool function itself in tools=[...], grant a tool added \
                 with gw.add_tool(), or declare the upstream in the config"
            ),
        ),
        GatewayError::InvalidSpec(m) if m.starts_with("bad grant") => py_err(py, "UnknownGrant", m),
        GatewayError::InvalidSpec(m) => py_err(py, "RegistrationError", m),
        GatewayError::Config(e) => py_err(py, "BadConfig", e.to_string()),
        GatewayError::Bind { addr, source } => py_err(
            py,
            "BindError",
            format!(
                "cannot bind the data listener {addr}: {source}; pass listen=\"127.0.0.1:0\" \
                 (any free port) or another address to gatehouse.Gateway"
            ),
        ),
        GatewayError::Audit(e) => py_err(
            py,
            "AuditError",
            format!(
                "the audit cannot be written ({e}); tool calls are refused until it can. Check \
                 the audit path (audit_path= or [audit] path) and its directory's permissions"
            ),
        ),
        GatewayError::ShuttingDown => stopped(py),
        // Only with `[store] backend = "sqlite"` (the binding's default is `memory`).
        GatewayError::Store(e) => py_err(py, "RegistrationError", e.to_string()),
    }
}

fn stopped(py: Python<'_>) -> PyErr {
    py_err(
        py,
        "GatewayStopped",
        "this gatehouse.Gateway was closed; create a new gatehouse.Gateway to register again"
            .into(),
    )
}

fn forked(py: Python<'_>, parent: u32) -> PyErr {
    py_err(
        py,
        "GatewayStopped",
        format!(
            "this gatehouse.Gateway was created in process {parent} and this process ({}) is a \
             fork of it: a forked child never serves its parent's socket or registrations. \
             Create a new gatehouse.Gateway in the child",
            std::process::id()
        ),
    )
}

/// What a `Gateway` and its registrations share: the runtime outlives every registration.
struct Shared {
    pid: u32,
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    gateway: Mutex<Option<Gateway>>,
    closed: std::sync::atomic::AtomicBool,
    /// The threads of sync Python tools.
    pool: Arc<ToolPool>,
}

impl Shared {
    fn check(&self, py: Python<'_>) -> PyResult<Gateway> {
        if self.pid != std::process::id() {
            return Err(forked(py, self.pid));
        }
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(stopped(py));
        }
        lock(&self.gateway).clone().ok_or_else(|| stopped(py))
    }

    /// Graceful stop: releases every registration, stops the server, flushes the audit.
    fn close(&self) {
        if self.closed.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let gw = lock(&self.gateway).clone();
        if let Some(gw) = gw {
            self.handle.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(30), gw.shutdown()).await;
            });
        }
        self.pool.close(Some(CLOSE_WAIT));
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let rt = lock(&self.rt).take();
        let gw = lock(&self.gateway).take();
        if self.pid != std::process::id() {
            // A forked child: the runtime's threads and the locks' holders are the parent's.
            std::mem::forget(gw);
            std::mem::forget(rt);
            return;
        }
        let in_runtime = tokio::runtime::Handle::try_current().is_ok();
        if !in_runtime && !self.closed.load(std::sync::atomic::Ordering::Acquire) {
            if let Some(gw) = &gw {
                let handle = self.handle.clone();
                let gw = gw.clone();
                Python::attach(|py| {
                    py.detach(move || {
                        handle.block_on(async {
                            let _ =
                                tokio::time::timeout(Duration::from_secs(10), gw.shutdown()).await;
                        })
                    })
                });
            }
        }
        drop(gw);
        self.pool.close(None);
        if let Some(rt) = rt {
            rt.shutdown_background();
        }
    }
}

/// The embedded gateway (wrapped by `gatehouse.Gateway`).
#[pyclass(frozen, module = "gatehouse._native")]
struct NativeGateway {
    shared: Arc<Shared>,
}

#[pymethods]
impl NativeGateway {
    /// `config_path` (TOML or mcpServers JSON read by the core), else `config_toml`, else the
    /// defaults; then the overrides; `self_exe` is what `command = "@self"` upstreams run.
    #[new]
    #[pyo3(signature = (config_path=None, config_toml=None, listen=None, audit_path=None, linger_ms=None, public_url=None, self_exe=None, worker_threads=2, tool_threads=64))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments, one per override
    fn new(
        py: Python<'_>,
        config_path: Option<String>,
        config_toml: Option<String>,
        listen: Option<String>,
        audit_path: Option<String>,
        linger_ms: Option<u64>,
        public_url: Option<String>,
        self_exe: Option<String>,
        worker_threads: usize,
        tool_threads: usize,
    ) -> PyResult<Self> {
        let mut config = match (&config_path, &config_toml) {
            (Some(p), _) => Config::from_file(std::path::Path::new(p))
                .map_err(|e| py_err(py, "BadConfig", e.to_string()))?,
            (None, Some(t)) => {
                Config::from_toml_str(t).map_err(|e| py_err(py, "BadConfig", e.to_string()))?
            }
            (None, None) => Config::default(),
        };
        if let Some(l) = listen {
            config.listen = l;
        }
        if let Some(a) = audit_path {
            config.audit.path = a.into();
        }
        if let Some(l) = linger_ms {
            config.linger_ms = l;
        }
        if public_url.is_some() {
            config.public_url = public_url;
        }
        for u in &mut config.upstreams {
            if u.command.as_deref() == Some("@self") {
                match &self_exe {
                    Some(exe) => u.command = Some(exe.clone()),
                    None => {
                        return Err(py_err(
                            py,
                            "BadConfig",
                            format!(
                                "upstream {:?} has command = \"@self\" (the gatehouse binary), \
                                 which a Python process cannot resolve: put `gatehouse` on \
                                 PATH, set GATEHOUSE_SELF_EXE, or pass gatehouse_exe= to \
                                 gatehouse.Gateway",
                                u.id
                            ),
                        ))
                    }
                }
            }
        }
        config
            .validate()
            .map_err(|e| py_err(py, "BadConfig", e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.max(1))
            .max_blocking_threads(tool_threads.max(1))
            .thread_name("gatehouse")
            .enable_all()
            .build()
            .map_err(|e| py_err(py, "GatehouseError", format!("cannot start a runtime: {e}")))?;
        let handle = rt.handle().clone();
        let gateway = {
            let _enter = handle.enter();
            py.detach(|| Gateway::new(config))
                .map_err(|e| gateway_err(py, e))?
        };
        Ok(NativeGateway {
            shared: Arc::new(Shared {
                pid: std::process::id(),
                rt: Mutex::new(Some(rt)),
                handle,
                gateway: Mutex::new(Some(gateway)),
                closed: std::sync::atomic::AtomicBool::new(false),
                pool: ToolPool::new(tool_threads),
            }),
        })
    }

    /// Whether the data listener is up (a registration is live, or lingering after the last).
    #[getter]
    fn serving(&self, py: Python<'_>) -> PyResult<bool> {
        if self.shared.pid != std::process::id() {
            return Ok(false);
        }
        Ok(self
            .shared
            .check(py)
            .ok()
            .and_then(|g| g.local_addr())
            .is_some())
    }

    /// `"host:port"` of the data listener, or None.
    #[getter]
    fn local_addr(&self, py: Python<'_>) -> PyResult<Option<String>> {
        if self.shared.pid != std::process::id() {
            return Ok(None);
        }
        Ok(self
            .shared
            .check(py)
            .ok()
            .and_then(|g| g.local_addr())
            .map(|a| a.to_string()))
    }

    #[getter]
    fn server_starts(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.shared.check(py)?.server_starts())
    }

    /// The pid of the process that created this gateway.
    #[getter]
    fn pid(&self) -> u32 {
        self.shared.pid
    }

    #[getter]
    fn closed(&self) -> bool {
        self.shared
            .closed
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Adds a tool to the catalog: registrations then grant it by name.
    fn add_tool(&self, py: Python<'_>, tool: &NativeTool) -> PyResult<()> {
        self.shared.check(py)?.add_tool(tool.tool.clone());
        Ok(())
    }

    /// Registers an execution (the GIL is released while the gateway works).
    #[pyo3(signature = (agent_id, grants, tools, label=None, ttl_s=None, limits_json=None, roots_json=None, parent=None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments, one per spec field
    fn register(
        &self,
        py: Python<'_>,
        agent_id: String,
        grants: Vec<String>,
        tools: Vec<PyRef<'_, NativeTool>>,
        label: Option<String>,
        ttl_s: Option<u64>,
        limits_json: Option<String>,
        roots_json: Option<String>,
        parent: Option<String>,
    ) -> PyResult<NativeRegistration> {
        let gw = self.shared.check(py)?;
        let mut spec = RegistrationSpec::new(agent_id);
        if let Some(p) = parent {
            spec = spec.parent(p);
        }
        for g in grants {
            spec = spec.grant(g);
        }
        for t in &tools {
            spec = spec.with_tool(t.tool.clone());
        }
        if let Some(l) = label {
            spec = spec.label(l);
        }
        if let Some(t) = ttl_s {
            spec = spec.ttl_s(t);
        }
        if let Some(j) = limits_json {
            let limits: Limits = serde_json::from_str(&j).map_err(|e| {
                py_err(
                    py,
                    "RegistrationError",
                    format!(
                        "limits: {e} (allowed keys: max_calls, max_concurrent, call_timeout_s, calls_per_minute, tool_calls_per_minute, policy)"
                    ),
                )
            })?;
            spec = spec.limits(limits);
        }
        if let Some(j) = roots_json {
            // Built by the Python layer (`_roots_json`): a list of {"uri", "name"?}.
            let roots: Vec<Root> = serde_json::from_str(&j).map_err(|e| {
                py_err(
                    py,
                    "RegistrationError",
                    format!("roots: {e} (each root is {{\"uri\": \"file://...\", \"name\": ...}})"),
                )
            })?;
            spec = spec.roots(roots);
        }
        let handle = self.shared.handle.clone();
        let reg = py
            .detach(move || handle.block_on(gw.register(spec)))
            .map_err(|e| gateway_err(py, e))?;
        Ok(NativeRegistration {
            shared: self.shared.clone(),
            id: reg.id().to_string(),
            token: reg.token().to_string(),
            agent_id: reg.agent_id().to_string(),
            label: reg.label().map(str::to_string),
            tools: reg.tools(),
            base_url: reg.base_url().to_string(),
            sse_url: reg.sse_url(),
            mcp_url: reg.mcp_url(),
            reg: Mutex::new(Some(reg)),
        })
    }

    /// Extends a registration's lease; returns the new expiry (None without a lease).
    #[pyo3(signature = (id, ttl_s=None))]
    fn renew(&self, py: Python<'_>, id: String, ttl_s: Option<u64>) -> PyResult<Option<String>> {
        let gw = self.shared.check(py)?;
        let handle = self.shared.handle.clone();
        match py.detach(move || handle.block_on(gw.renew(&id, ttl_s))) {
            Some(expiry) => Ok(expiry),
            None => Err(py_err(
                py,
                "RegistrationError",
                "no such registration (released or expired)".into(),
            )),
        }
    }

    /// Shuts down: releases every registration, stops the server, flushes the audit.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.shared.pid != std::process::id() {
            return Ok(());
        }
        let shared = self.shared.clone();
        py.detach(move || shared.close());
        Ok(())
    }
}

/// A live registration (wrapped by `gatehouse.Registration`).
#[pyclass(frozen, module = "gatehouse._native")]
struct NativeRegistration {
    shared: Arc<Shared>,
    #[pyo3(get)]
    id: String,
    #[pyo3(get)]
    token: String,
    #[pyo3(get)]
    agent_id: String,
    #[pyo3(get)]
    label: Option<String>,
    #[pyo3(get)]
    tools: Vec<String>,
    #[pyo3(get)]
    base_url: String,
    #[pyo3(get)]
    sse_url: String,
    #[pyo3(get)]
    mcp_url: String,
    reg: Mutex<Option<Registration>>,
}

#[pymethods]
impl NativeRegistration {
    #[getter]
    fn released(&self) -> bool {
        lock(&self.reg).is_none()
    }

    #[getter]
    fn expires_at(&self) -> Option<String> {
        lock(&self.reg).as_ref().and_then(Registration::expires_at)
    }

    /// Releases now: cancels in-flight calls, ends streams, then records the release. Idempotent.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        if self.shared.pid != std::process::id() {
            return Err(forked(py, self.shared.pid));
        }
        let Some(reg) = lock(&self.reg).take() else {
            return Ok(());
        };
        if self
            .shared
            .closed
            .load(std::sync::atomic::Ordering::Acquire)
        {
            // The gateway's shutdown already released it: dropping it is a no-op.
            return Ok(());
        }
        let handle = self.shared.handle.clone();
        py.detach(move || handle.block_on(reg.release()));
        Ok(())
    }

    /// The probe (`Registration::probe`, issue 48) within `timeout_s`: its JSON, the same shape
    /// in every API, whether it succeeded or not (`ok`, `failure`).
    #[pyo3(signature = (timeout_s=5.0))]
    fn probe(&self, py: Python<'_>, timeout_s: f64) -> PyResult<String> {
        if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s <= 600.0) {
            return Err(PyValueError::new_err(
                "timeout_s: seconds, more than 0 and at most 600",
            ));
        }
        let gw = self.shared.check(py)?;
        let (id, url, token) = (self.id.clone(), self.mcp_url.clone(), self.token.clone());
        let handle = self.shared.handle.clone();
        let timeout = Duration::from_secs_f64(timeout_s);
        let probe = py.detach(move || {
            handle.block_on(async move {
                match gw.probe(&id, &url, &token, timeout).await {
                    Ok(p) => p,
                    Err(e) => *e.0,
                }
            })
        });
        serde_json::to_string(&probe).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    fn __repr__(&self) -> String {
        format!(
            "<gatehouse registration {} agent_id={:?}>",
            self.id, self.agent_id
        )
    }
}

impl Drop for NativeRegistration {
    fn drop(&mut self) {
        let reg = lock(&self.reg).take();
        let Some(reg) = reg else { return };
        if self.shared.pid != std::process::id() {
            // A forked child: the release path takes locks a parent thread may hold.
            std::mem::forget(reg);
            return;
        }
        // Dropping inside the runtime's context lets the release finish on it (audit record).
        let _enter = self.shared.handle.enter();
        drop(reg);
    }
}

/// A tool: a Python callable behind the package's invoker, or the built-in Rust echo tool.
#[pyclass(frozen, module = "gatehouse._native")]
struct NativeTool {
    tool: InProcessTool,
}

#[pymethods]
impl NativeTool {
    /// A sync tool (`gateway=`): `invoker(arguments, ctx)` runs on one of the gateway's tool
    /// threads and returns the result (`str`: its one text block; `bytes`: the whole
    /// `CallToolResult` as JSON). An async tool (`port=`, the `LoopPort` of its event loop):
    /// `invoker(arguments, ctx, done)` runs on the loop and returns the result at once (bad
    /// arguments) or the task it created, which reports through `done`. `arguments` is a
    /// dict (what `json.loads` gives); `ctx` is None unless `wants_ctx`.
    #[new]
    #[pyo3(signature = (name, description, input_schema_json, invoker, annotations_json=None, gateway=None, port=None, wants_ctx=true))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn new(
        name: String,
        description: String,
        input_schema_json: String,
        invoker: Py<PyAny>,
        annotations_json: Option<String>,
        gateway: Option<PyRef<'_, NativeGateway>>,
        port: Option<PyRef<'_, LoopPort>>,
        wants_ctx: bool,
    ) -> PyResult<Self> {
        let schema: Value = serde_json::from_str(&input_schema_json)
            .map_err(|e| PyValueError::new_err(format!("input_schema is not JSON: {e}")))?;
        let invoker = Arc::new(invoker);
        let mut tool = match (port, gateway) {
            (Some(port), _) => {
                let port = port.port.clone();
                InProcessTool::new(&name, &description, schema, move |args, ctx| {
                    call_async(port.clone(), invoker.clone(), wants_ctx, args, ctx)
                })
            }
            (None, Some(gw)) => {
                let pool = gw.shared.pool.clone();
                InProcessTool::new(&name, &description, schema, move |args, ctx| {
                    call_sync(pool.clone(), invoker.clone(), wants_ctx, args, ctx)
                })
            }
            (None, None) => {
                return Err(PyValueError::new_err(
                    "a Python tool needs gateway= (sync: the gateway's tool threads) or port= \
                     (async: its event loop's LoopPort)",
                ))
            }
        };
        if let Some(a) = annotations_json {
            let a: Value = serde_json::from_str(&a)
                .map_err(|e| PyValueError::new_err(format!("annotations are not JSON: {e}")))?;
            tool = tool.with_annotations(a);
        }
        Ok(NativeTool { tool })
    }

    #[getter]
    fn name(&self) -> String {
        self.tool.name().to_string()
    }

    #[getter]
    fn descriptor_json(&self) -> String {
        self.tool.descriptor().to_string()
    }
}

/// The built-in Rust in-process tool `name` (echoes its `text` argument): the baseline the
/// benchmark compares Python tools with.
#[pyfunction]
#[pyo3(signature = (name="rust_echo".to_string()))]
fn echo_tool(name: String) -> NativeTool {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"]
    });
    NativeTool {
        tool: InProcessTool::new(
            &name,
            "Echoes text (Rust)",
            schema,
            |args, _ctx| async move {
                let text = args.get("text").and_then(Value::as_str).unwrap_or("");
                Ok(ToolResult::text(text))
            },
        ),
    }
}

/// Queued from Python, sent in order by the call's handler.
enum Note {
    Progress(f64, Option<f64>, Option<String>),
    Log(String, String),
}

/// What a Python tool sees of its call (wrapped by nothing: it is `gatehouse.CallContext`).
#[pyclass(frozen, module = "gatehouse._native", name = "CallContext")]
struct CallContext {
    #[pyo3(get)]
    agent_id: String,
    #[pyo3(get)]
    registration_id: String,
    #[pyo3(get)]
    label: Option<String>,
    #[pyo3(get)]
    session_id: Option<String>,
    #[pyo3(get)]
    wants_progress: bool,
    cancel: CancellationToken,
    notes: mpsc::Sender<Note>,
    handle: tokio::runtime::Handle,
}

impl CallContext {
    /// The call's context for a tool that takes one, and the receiver of its notifications.
    fn maybe(wants: bool, ctx: &ToolContext) -> (Option<Self>, Option<mpsc::Receiver<Note>>) {
        if !wants {
            return (None, None);
        }
        let (tx, rx) = mpsc::channel(NOTE_QUEUE);
        (Some(CallContext::of(ctx, tx)), Some(rx))
    }

    fn of(ctx: &ToolContext, notes: mpsc::Sender<Note>) -> Self {
        CallContext {
            agent_id: ctx.agent_id.to_string(),
            registration_id: ctx.registration_id.to_string(),
            label: ctx.label.as_deref().map(str::to_string),
            session_id: ctx.session_id.as_deref().map(str::to_string),
            wants_progress: ctx.wants_progress(),
            cancel: ctx.cancel.clone(),
            notes,
            handle: tokio::runtime::Handle::current(),
        }
    }

    fn send(&self, py: Python<'_>, note: Note) {
        match self.notes.try_send(note) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(note)) => {
                let tx = self.notes.clone();
                let _ = py.detach(move || tx.blocking_send(note));
            }
        }
    }
}

#[pymethods]
impl CallContext {
    /// True once the call is cancelled (client `notifications/cancelled`, release, timeout).
    #[getter]
    fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Sleeps (GIL released) until the call is cancelled or `timeout` seconds pass; returns
    /// whether it was cancelled.
    #[pyo3(signature = (timeout=None))]
    fn wait_cancelled(&self, py: Python<'_>, timeout: Option<f64>) -> bool {
        let token = self.cancel.clone();
        let handle = self.handle.clone();
        py.detach(move || {
            handle.block_on(async {
                match timeout {
                    Some(t) if t.is_finite() && t >= 0.0 => {
                        tokio::time::timeout(Duration::from_secs_f64(t), token.cancelled())
                            .await
                            .is_ok()
                    }
                    _ => {
                        token.cancelled().await;
                        true
                    }
                }
            })
        })
    }

    /// Sends `notifications/progress` if the caller asked for progress.
    #[pyo3(signature = (progress, total=None, message=None))]
    fn report_progress(
        &self,
        py: Python<'_>,
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    ) {
        if self.wants_progress {
            self.send(py, Note::Progress(progress, total, message));
        }
    }

    /// Sends `notifications/message`; `level` is one of `gatehouse.LOG_LEVELS`.
    fn log(&self, py: Python<'_>, level: String, message: String) -> PyResult<()> {
        if !LOG_LEVELS.contains(&level.as_str()) {
            return Err(PyValueError::new_err(format!(
                "log level {level:?}: use one of {}",
                LOG_LEVELS.join(", ")
            )));
        }
        self.send(py, Note::Log(level, message));
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "<gatehouse.CallContext agent_id={:?} registration_id={:?}>",
            self.agent_id, self.registration_id
        )
    }
}

// ---------------------------------------------------------------- sync tools: the tool pool

/// How long an idle tool thread waits for a call before it ends.
const IDLE_KEEP: Duration = Duration::from_secs(10);
/// How long `Gateway.close` waits for its idle tool threads to end (a sync tool still running
/// after the shutdown cancelled its call keeps its thread until it returns; close does not
/// wait for those).
const CLOSE_WAIT: Duration = Duration::from_secs(2);

thread_local! {
    /// Set on the pool's own threads (a close from a tool must not wait for itself).
    static IN_POOL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Persistent threads that run sync Python tools. Each is attached to the interpreter once
/// (its thread state lives as long as the thread) and waits for work detached (GIL released),
/// so a call costs one wake and a GIL acquisition, not a thread state created and destroyed
/// per call (which, through `PyGILState_Ensure` on a runtime blocking thread, mmapped and
/// unmapped Python's frame stack every call). At most `max` threads: a call first takes one of
/// `permits` (`max` of them, waited for within the call's timeout and cancellation), so every
/// job has a thread (an idle one, or a new one) and no job ever queues.
struct ToolPool {
    permits: Arc<Semaphore>,
    state: Mutex<PoolState>,
    exited: Condvar,
}

#[derive(Default)]
struct PoolState {
    /// Idle threads, the most recently idle last (it is handed the next job: warm caches).
    idle: Vec<Arc<Worker>>,
    threads: usize,
    closed: bool,
}

/// One tool thread's mailbox.
#[derive(Default)]
struct Worker {
    slot: Mutex<Slot>,
    wake: Condvar,
}

#[derive(Default)]
struct Slot {
    job: Option<SyncJob>,
    stop: bool,
}

struct SyncJob {
    invoker: Arc<Py<PyAny>>,
    args: Value,
    ctx: Option<CallContext>,
    done: oneshot::Sender<Result<Out, String>>,
    /// Held until the thread is idle again (see `ToolPool`).
    permit: OwnedSemaphorePermit,
}

impl SyncJob {
    /// Runs the tool (GIL held); gives the permit back to be released once the thread is idle.
    fn run(self, py: Python<'_>) -> OwnedSemaphorePermit {
        let SyncJob {
            invoker,
            args,
            ctx,
            done,
            permit,
        } = self;
        if done.is_closed() {
            return permit; // the call ended (cancel, release, timeout) before its turn
        }
        let r = py_args(py, &args)
            .and_then(|args| invoker.bind(py).call1((args, ctx)))
            .map_err(|e| e.to_string())
            .and_then(|out| Out::of(&out));
        let _ = done.send(r);
        permit
    }
}

impl Worker {
    fn give(&self, job: SyncJob) {
        lock(&self.slot).job = Some(job);
        self.wake.notify_one();
    }

    fn stop(&self) {
        lock(&self.slot).stop = true;
        self.wake.notify_one();
    }

    /// The next job; None when told to stop or after `keep` without one.
    fn wait(&self, keep: Duration) -> Option<SyncJob> {
        let deadline = std::time::Instant::now() + keep;
        let mut slot = lock(&self.slot);
        loop {
            if let Some(job) = slot.job.take() {
                return Some(job);
            }
            let now = std::time::Instant::now();
            if slot.stop || now >= deadline {
                return None;
            }
            slot = match self.wake.wait_timeout(slot, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

impl ToolPool {
    fn new(max: usize) -> Arc<Self> {
        Arc::new(ToolPool {
            permits: Arc::new(Semaphore::new(max.max(1))),
            state: Mutex::new(PoolState::default()),
            exited: Condvar::new(),
        })
    }

    /// A permit to run one sync tool: waits while `max` are running (the call's timeout and
    /// cancellation end the wait, as they end the call).
    async fn permit(&self) -> Result<OwnedSemaphorePermit, ToolError> {
        self.permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ToolError::new("the gateway is closed"))
    }

    /// Hands `job` to an idle thread, or starts a thread for it (the permit guarantees room).
    fn submit(self: &Arc<Self>, job: SyncJob) -> Result<(), ToolError> {
        let mut st = lock(&self.state);
        if st.closed {
            return Err(ToolError::new("the gateway is closed"));
        }
        if let Some(w) = st.idle.pop() {
            drop(st);
            w.give(job);
            return Ok(());
        }
        st.threads += 1;
        drop(st);
        let pool = self.clone();
        let spawned = std::thread::Builder::new()
            .name("gatehouse-py".into())
            // The pool owns the thread: it counts it, and `close` stops and waits for it.
            .spawn(move || pool.thread_main(job));
        match spawned {
            Ok(_detached) => Ok(()),
            Err(e) => {
                self.exit_one();
                Err(ToolError::new(format!("cannot start a tool thread: {e}")))
            }
        }
    }

    fn thread_main(self: Arc<Self>, first: SyncJob) {
        IN_POOL.with(|f| f.set(true));
        let me = Arc::new(Worker::default());
        // Attached once for the thread's life; detached (GIL released) whenever it waits.
        Python::attach(|py| py.detach(|| self.serve(&me, first)));
    }

    fn serve(&self, me: &Arc<Worker>, first: SyncJob) {
        let mut next = Some(first);
        loop {
            let job = match next.take() {
                Some(job) => job,
                None => match me.wait(IDLE_KEEP) {
                    Some(job) => job,
                    None if self.retire(me) => return,
                    None => continue, // handed a job as it timed out: the slot has it
                },
            };
            let permit = Python::attach(|py| job.run(py));
            let mut st = lock(&self.state);
            if st.closed {
                drop(st);
                drop(permit);
                self.exit_one();
                return;
            }
            st.idle.push(me.clone()); // bounded: at most `max` threads exist
            drop(st);
            drop(permit); // after going idle: a permit always finds an idle thread or room
        }
    }

    /// Whether the idle thread `me` ends now (closed, or idle too long and still unclaimed).
    fn retire(&self, me: &Arc<Worker>) -> bool {
        let mut st = lock(&self.state);
        if !st.closed {
            match st.idle.iter().position(|w| Arc::ptr_eq(w, me)) {
                Some(i) => {
                    st.idle.remove(i);
                }
                None => return false,
            }
        }
        drop(st);
        self.exit_one();
        true
    }

    fn exit_one(&self) {
        let mut st = lock(&self.state);
        st.threads = st.threads.saturating_sub(1);
        drop(st);
        self.exited.notify_all();
    }

    /// Stops the pool: idle threads end now, busy ones when their tool returns; waits up to
    /// `wait` for the idle ones (never on a pool thread itself), so they have let go of the
    /// interpreter before it finalizes.
    fn close(&self, wait: Option<Duration>) {
        self.permits.close();
        let (idle, busy) = {
            let mut st = lock(&self.state);
            st.closed = true;
            let idle = std::mem::take(&mut st.idle);
            let busy = st.threads.saturating_sub(idle.len());
            (idle, busy)
        };
        for w in idle {
            w.stop();
        }
        let Some(wait) = wait else { return };
        if IN_POOL.with(|f| f.get()) {
            return;
        }
        let deadline = std::time::Instant::now() + wait;
        let mut st = lock(&self.state);
        while st.threads > busy {
            let now = std::time::Instant::now();
            if now >= deadline {
                return;
            }
            st = match self.exited.wait_timeout(st, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

async fn call_sync(
    pool: Arc<ToolPool>,
    invoker: Arc<Py<PyAny>>,
    wants_ctx: bool,
    args: Value,
    ctx: ToolContext,
) -> Result<ToolResult, ToolError> {
    let (pyctx, note_rx) = CallContext::maybe(wants_ctx, &ctx);
    let (done_tx, done_rx) = oneshot::channel();
    let permit = tokio::select! {
        biased;
        p = pool.permit() => p?,
        _ = ctx.cancel.cancelled() => return Err(ToolError::new("cancelled")),
    };
    pool.submit(SyncJob {
        invoker,
        args,
        ctx: pyctx,
        done: done_tx,
        permit,
    })?;
    outcome(&ctx, note_rx, done_rx, None).await
}

// ---------------------------------------------------------------- async tools: the loop port

/// Coroutine submissions a loop port holds before a call waits for room (within its timeout).
const PORT_ROOM: usize = 1024;

/// The way into one event loop for coroutine tools: the runtime's threads queue a job and, if
/// no wake is pending, write one byte to a socket the loop watches (`loop.add_reader`); the
/// loop's callback (`drain`) takes every queued job in one go and starts their tasks. No GIL on
/// the Rust side, one loop wake per batch, no thread between the runtime and the loop. A cancel
/// goes the same way (after its call's start, so the task exists or is skipped).
struct Port {
    queue: Mutex<PortQueue>,
    /// `PORT_ROOM` starts queued at most; a start's permit is released when the loop takes it.
    room: Arc<Semaphore>,
    tx: UnixStream,
    rx: UnixStream,
    pid: u32,
}

#[derive(Default)]
struct PortQueue {
    jobs: VecDeque<PortJob>,
    wake_pending: bool,
}

// A start is moved in and out of the queue once per call; boxing it would cost an allocation
// per call to save bytes in a queue that is usually empty.
#[allow(clippy::large_enum_variant)]
enum PortJob {
    Start(AsyncJob),
    Cancel(Arc<AsyncCall>),
}

struct AsyncJob {
    invoker: Arc<Py<PyAny>>,
    args: Value,
    ctx: Option<CallContext>,
    call: Arc<AsyncCall>,
    _room: OwnedSemaphorePermit,
}

/// One async call as the loop and the handler share it.
struct AsyncCall {
    done: Mutex<Option<oneshot::Sender<Result<Out, String>>>>,
    /// The asyncio task, once started (taken when it ends or is cancelled).
    task: Mutex<Option<Py<PyAny>>>,
    cancelled: std::sync::atomic::AtomicBool,
}

impl AsyncCall {
    fn finish(&self, r: Result<Out, String>) {
        if let Some(tx) = lock(&self.done).take() {
            let _ = tx.send(r);
        }
    }
}

impl Port {
    fn push(&self, job: PortJob) {
        let wake = {
            let mut q = lock(&self.queue);
            // bounded: starts hold one of PORT_ROOM permits until drained; a cancel is pushed
            // at most once per start.
            q.jobs.push_back(job);
            !std::mem::replace(&mut q.wake_pending, true)
        };
        if wake {
            // Non-blocking: a full socket buffer means a wake is already there to be read.
            let _ = (&self.tx).write(&[1]);
        }
    }

    /// Runs on the loop's thread (GIL held): starts and cancels what was queued.
    fn drain(&self, py: Python<'_>) {
        let mut buf = [0u8; 256];
        while let Ok(n) = (&self.rx).read(&mut buf) {
            if n < buf.len() {
                break;
            }
        }
        let jobs = {
            let mut q = lock(&self.queue);
            q.wake_pending = false;
            std::mem::take(&mut q.jobs)
        };
        for job in jobs {
            match job {
                PortJob::Start(job) => job.start(py),
                PortJob::Cancel(call) => {
                    let task = lock(&call.task).take();
                    if let Some(task) = task {
                        let _ = task.call_method0(py, "cancel");
                    }
                }
            }
        }
    }
}

impl AsyncJob {
    fn start(self, py: Python<'_>) {
        let AsyncJob {
            invoker,
            args,
            ctx,
            call,
            _room,
        } = self;
        drop(_room);
        if call.cancelled.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let done = match Py::new(py, Done { call: call.clone() }) {
            Ok(d) => d,
            Err(e) => return call.finish(Err(e.to_string())),
        };
        // The starter checks the arguments and returns the result at once (str or bytes, see
        // `Out`), or creates the task (which reports through `done`) and returns it.
        let started = py_args(py, &args).and_then(|args| invoker.bind(py).call1((args, ctx, done)));
        match started {
            Err(e) => call.finish(Err(e.to_string())),
            Ok(out) if out.is_instance_of::<PyString>() || out.is_instance_of::<PyBytes>() => {
                call.finish(Out::of(&out))
            }
            Ok(task) => *lock(&call.task) = Some(task.unbind()),
        }
    }
}

/// The loop side of a port (wrapped by `gatehouse._gateway`, one per event loop): the loop
/// watches `fileno()` with `add_reader` and calls `drain()`.
#[pyclass(frozen, module = "gatehouse._native")]
struct LoopPort {
    port: Arc<Port>,
}

#[pymethods]
impl LoopPort {
    #[new]
    fn new() -> PyResult<Self> {
        let io = |e: std::io::Error| PyValueError::new_err(format!("cannot make a loop port: {e}"));
        let (tx, rx) = UnixStream::pair().map_err(io)?;
        tx.set_nonblocking(true).map_err(io)?;
        rx.set_nonblocking(true).map_err(io)?;
        Ok(LoopPort {
            port: Arc::new(Port {
                queue: Mutex::new(PortQueue::default()),
                room: Arc::new(Semaphore::new(PORT_ROOM)),
                tx,
                rx,
                pid: std::process::id(),
            }),
        })
    }

    fn fileno(&self) -> i32 {
        self.port.rx.as_raw_fd()
    }

    #[getter]
    fn pid(&self) -> u32 {
        self.port.pid
    }

    /// The loop's reader callback.
    fn drain(&self, py: Python<'_>) {
        if self.port.pid == std::process::id() {
            self.port.drain(py);
        }
    }
}

/// How an async tool's task reports: `done(result)` (str or bytes, see `Out`) when its
/// coroutine returns, `done.cancelled()` when it ends by `CancelledError` (or a
/// `BaseException`). Called from inside the task, so no done-callback round is needed; once the
/// call has ended (cancelled, timed out) both are no-ops.
#[pyclass(frozen, module = "gatehouse._native")]
struct Done {
    call: Arc<AsyncCall>,
}

impl Done {
    fn report(&self, r: Result<Out, String>) {
        let task = lock(&self.call.task).take();
        drop(task);
        self.call.finish(r);
    }
}

#[pymethods]
impl Done {
    fn __call__(&self, result: &Bound<'_, PyAny>) {
        self.report(Out::of(result));
    }

    fn cancelled(&self) {
        self.report(Err("cancelled".into()));
    }
}

/// Cancels an async tool's task when its call ends first (client cancel, release, timeout, or
/// the request going away): through the port, so the Rust side never needs the GIL.
struct CancelOnDrop {
    port: Arc<Port>,
    call: Arc<AsyncCall>,
    finished: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.call
            .cancelled
            .store(true, std::sync::atomic::Ordering::Release);
        self.port.push(PortJob::Cancel(self.call.clone()));
    }
}

async fn call_async(
    port: Arc<Port>,
    invoker: Arc<Py<PyAny>>,
    wants_ctx: bool,
    args: Value,
    ctx: ToolContext,
) -> Result<ToolResult, ToolError> {
    let (pyctx, note_rx) = CallContext::maybe(wants_ctx, &ctx);
    let (done_tx, done_rx) = oneshot::channel();
    let room = tokio::select! {
        biased;
        r = port.room.clone().acquire_owned() => {
            r.map_err(|_| ToolError::new("the event loop's port is closed"))?
        }
        _ = ctx.cancel.cancelled() => return Err(ToolError::new("cancelled")),
    };
    let call = Arc::new(AsyncCall {
        done: Mutex::new(Some(done_tx)),
        task: Mutex::new(None),
        cancelled: std::sync::atomic::AtomicBool::new(false),
    });
    port.push(PortJob::Start(AsyncJob {
        invoker,
        args,
        ctx: pyctx,
        call: call.clone(),
        _room: room,
    }));
    let mut guard = CancelOnDrop {
        port,
        call,
        finished: false,
    };
    outcome(&ctx, note_rx, done_rx, Some(&mut guard)).await
}

/// Forwards the call's notifications in order until its result, then the result.
async fn outcome(
    ctx: &ToolContext,
    note_rx: Option<mpsc::Receiver<Note>>,
    mut done_rx: oneshot::Receiver<Result<Out, String>>,
    guard: Option<&mut CancelOnDrop>,
) -> Result<ToolResult, ToolError> {
    let outcome = match note_rx {
        None => tokio::select! {
            biased;
            r = &mut done_rx => r,
            _ = ctx.cancel.cancelled() => return Err(ToolError::new("cancelled")),
        },
        Some(mut note_rx) => {
            let mut notes_open = true;
            loop {
                tokio::select! {
                    biased;
                    n = note_rx.recv(), if notes_open => match n {
                        Some(n) => forward(ctx, n).await,
                        None => notes_open = false,
                    },
                    r = &mut done_rx => {
                        while let Ok(n) = note_rx.try_recv() {
                            forward(ctx, n).await;
                        }
                        break r;
                    }
                    _ = ctx.cancel.cancelled() => return Err(ToolError::new("cancelled")),
                }
            }
        }
    };
    if let Some(g) = guard {
        g.finished = true;
    }
    match outcome {
        Ok(Ok(Out::Text(text))) => Ok(ToolResult::text(text)),
        Ok(Ok(Out::Json(json))) => match serde_json::from_slice::<Value>(&json) {
            Ok(v) if v.is_object() => Ok(ToolResult(v)),
            _ => Err(ToolError::new("the tool's result is not a JSON object")),
        },
        Ok(Err(e)) => Err(ToolError::new(e)),
        Err(_) => Err(ToolError::new("the tool ended without a result")),
    }
}

/// What a Python tool's invoker returns: `str` is the text of a one-text-block result (the
/// common case, built here), `bytes` the whole `CallToolResult` as JSON.
enum Out {
    Text(String),
    Json(Vec<u8>),
}

impl Out {
    fn of(v: &Bound<'_, PyAny>) -> Result<Out, String> {
        if let Ok(s) = v.cast::<PyString>() {
            return s
                .to_str()
                .map(|s| Out::Text(s.to_owned()))
                .map_err(|e| e.to_string());
        }
        if let Ok(b) = v.cast::<PyBytes>() {
            return Ok(Out::Json(b.as_bytes().to_vec()));
        }
        Err("the tool's invoker returned neither str nor bytes".into())
    }
}

/// The call's arguments as Python objects (what `json.loads` would give; none → `{}`).
fn py_args<'py>(py: Python<'py>, args: &Value) -> PyResult<Bound<'py, PyAny>> {
    match args {
        Value::Null => Ok(PyDict::new(py).into_any()),
        v => py_of(py, v),
    }
}

fn py_of<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let list = PyList::empty(py);
            for x in a {
                list.append(py_of(py, x)?)?;
            }
            list.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, py_of(py, x)?)?;
            }
            d.into_any()
        }
    })
}

async fn forward(ctx: &ToolContext, n: Note) {
    match n {
        Note::Progress(p, t, m) => ctx.progress(p, t, m.as_deref()).await,
        Note::Log(level, message) => ctx.log(&level, &message).await,
    }
}

/// The `gatehouse` command of the wheel (`gatehouse._cli`): runs `argv` (program name first)
/// through the same CLI as the binary, every verb `serve` included, with the GIL released
/// while it runs. Returns the exit status.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> u8 {
    let code = py.detach(move || gatehouse::cli::run_args(argv));
    // `ExitCode` keeps its number to itself; every status it can hold is one of these.
    (0..=u8::MAX)
        .find(|n| std::process::ExitCode::from(*n) == code)
        .unwrap_or(1)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeGateway>()?;
    m.add_class::<NativeRegistration>()?;
    m.add_class::<NativeTool>()?;
    m.add_class::<CallContext>()?;
    m.add_class::<Done>()?;
    m.add_class::<LoopPort>()?;
    m.add_function(wrap_pyfunction!(echo_tool, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add("LOG_LEVELS", LOG_LEVELS.to_vec())?;
    Ok(())
}
