//! `gatehouse._native`: the PyO3 adapter between the Python package and the gatehouse crate.
//!
//! It builds only on the crate's public facade. It owns one tokio runtime per `Gateway`; every
//! wait on Rust (registering, releasing, shutting down, a full progress queue) happens with the
//! GIL released (`Python::detach`). Python tools run off the runtime's worker threads: the
//! handler hands the call to a blocking thread (`spawn_blocking`), which attaches to the
//! interpreter and calls the package's invoker; a sync tool runs right there, a coroutine is
//! submitted to an event loop and the handler awaits its `concurrent.futures.Future` through a
//! done-callback, so no thread is held while it runs.
//!
//! Fork safety: every object remembers the pid that made it. In a forked child each call
//! raises `GatewayStopped`, and dropping the objects leaks their Rust state instead of running
//! destructors that would touch locks and threads the child does not have (the Python package
//! also closes the inherited listening socket; see `gatehouse/_fork.py`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gatehouse::{
    Config, Gateway, GatewayError, InProcessTool, Limits, Registration, RegistrationSpec,
    ToolContext, ToolError, ToolResult, LOG_LEVELS,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
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
    #[pyo3(signature = (agent_id, grants, tools, label=None, ttl_s=None, limits_json=None))]
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
    ) -> PyResult<NativeRegistration> {
        let gw = self.shared.check(py)?;
        let mut spec = RegistrationSpec::new(agent_id);
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
                        "limits: {e} (allowed keys: max_calls, max_concurrent, call_timeout_s)"
                    ),
                )
            })?;
            spec = spec.limits(limits);
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
    /// `invoker(arguments_json, ctx)` returns the `CallToolResult` as a JSON string, or a
    /// `concurrent.futures.Future` of one (a coroutine submitted to an event loop).
    #[new]
    #[pyo3(signature = (name, description, input_schema_json, invoker, annotations_json=None))]
    fn new(
        name: String,
        description: String,
        input_schema_json: String,
        invoker: Py<PyAny>,
        annotations_json: Option<String>,
    ) -> PyResult<Self> {
        let schema: Value = serde_json::from_str(&input_schema_json)
            .map_err(|e| PyValueError::new_err(format!("input_schema is not JSON: {e}")))?;
        let invoker = Arc::new(invoker);
        let mut tool = InProcessTool::new(&name, &description, schema, move |args, ctx| {
            call_python(invoker.clone(), args, ctx)
        });
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

/// Calls `fut.result()` when an event loop's task ends and hands the JSON to the handler.
#[pyclass(frozen, module = "gatehouse._native")]
struct Done {
    tx: Mutex<Option<oneshot::Sender<Result<String, String>>>>,
}

impl Done {
    fn send(&self, r: Result<String, String>) {
        if let Some(tx) = lock(&self.tx).take() {
            let _ = tx.send(r);
        }
    }
}

#[pymethods]
impl Done {
    fn __call__(&self, fut: &Bound<'_, PyAny>) {
        let r = fut
            .call_method0("result")
            .and_then(|v| v.extract::<String>())
            .map_err(|e| e.to_string());
        self.send(r);
    }
}

/// Cancels the Python future of an async tool when its call ends first (cancel, release,
/// timeout, or the request going away).
struct CancelOnDrop {
    fut: Arc<Mutex<Option<Py<PyAny>>>>,
    finished: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let fut = self.fut.clone();
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            drop(h.spawn_blocking(move || {
                if let Some(f) = lock(&fut).take() {
                    Python::attach(|py| {
                        let _ = f.call_method0(py, "cancel");
                    });
                }
            }));
        }
    }
}

async fn call_python(
    invoker: Arc<Py<PyAny>>,
    args: Value,
    ctx: ToolContext,
) -> Result<ToolResult, ToolError> {
    let (note_tx, mut note_rx) = mpsc::channel(NOTE_QUEUE);
    let (done_tx, mut done_rx) = oneshot::channel::<Result<String, String>>();
    let pyctx = CallContext {
        agent_id: ctx.agent_id.to_string(),
        registration_id: ctx.registration_id.to_string(),
        label: ctx.label.as_deref().map(str::to_string),
        session_id: ctx.session_id.as_deref().map(str::to_string),
        wants_progress: ctx.wants_progress(),
        cancel: ctx.cancel.clone(),
        notes: note_tx,
        handle: tokio::runtime::Handle::current(),
    };
    let pending: Arc<Mutex<Option<Py<PyAny>>>> = Arc::new(Mutex::new(None));
    let mut guard = CancelOnDrop {
        fut: pending.clone(),
        finished: false,
    };
    let args_json = args.to_string();
    let blocking = tokio::task::spawn_blocking(move || {
        Python::attach(|py| {
            let done = match Py::new(
                py,
                Done {
                    tx: Mutex::new(Some(done_tx)),
                },
            ) {
                Ok(d) => d,
                Err(e) => return Err(e.to_string()),
            };
            let out = invoker
                .call1(py, (args_json, pyctx))
                .map_err(|e| e.to_string());
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    done.get().send(Err(e));
                    return Ok(());
                }
            };
            if let Ok(s) = out.extract::<String>(py) {
                done.get().send(Ok(s));
                return Ok(());
            }
            *lock(&pending) = Some(out.clone_ref(py));
            if let Err(e) = out.call_method1(py, "add_done_callback", (done.clone_ref(py),)) {
                done.get().send(Err(e.to_string()));
            }
            Ok(())
        })
    });
    drop(blocking);
    let mut notes_open = true;
    let outcome = loop {
        tokio::select! {
            biased;
            n = note_rx.recv(), if notes_open => match n {
                Some(n) => forward(&ctx, n).await,
                None => notes_open = false,
            },
            r = &mut done_rx => {
                guard.finished = true;
                while let Ok(n) = note_rx.try_recv() {
                    forward(&ctx, n).await;
                }
                break r;
            }
            _ = ctx.cancel.cancelled() => return Err(ToolError::new("cancelled")),
        }
    };
    let json = match outcome {
        Ok(Ok(json)) => json,
        Ok(Err(e)) => return Err(ToolError::new(e)),
        Err(_) => return Err(ToolError::new("the tool ended without a result")),
    };
    match serde_json::from_str::<Value>(&json) {
        Ok(v) if v.is_object() => Ok(ToolResult(v)),
        _ => Err(ToolError::new("the tool's result is not a JSON object")),
    }
}

async fn forward(ctx: &ToolContext, n: Note) {
    match n {
        Note::Progress(p, t, m) => ctx.progress(p, t, m.as_deref()).await,
        Note::Log(level, message) => ctx.log(&level, &message).await,
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeGateway>()?;
    m.add_class::<NativeRegistration>()?;
    m.add_class::<NativeTool>()?;
    m.add_class::<CallContext>()?;
    m.add_class::<Done>()?;
    m.add_function(wrap_pyfunction!(echo_tool, m)?)?;
    m.add("LOG_LEVELS", LOG_LEVELS.to_vec())?;
    Ok(())
}
