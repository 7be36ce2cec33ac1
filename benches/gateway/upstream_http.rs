//! The proxy section's HTTP upstreams (issue 46): a minimal Streamable HTTP MCP echo server,
//! over plain `http://` and over `https://` (rustls, `ring`, a certificate from a CA the bench
//! makes at start with the `openssl` command), each behind its own gateway upstream
//! (`url`, and `tls_ca_file` for the HTTPS one). Only built when `--targets` names one of
//! their rows, so the ordinary bench output is unchanged.
//!
//! The server runs on its own runtime, threads named `upstream`, in this process: its cost is
//! not the gateway's, so `bench/callgrind_tls.sh` leaves its threads out (each of its threads
//! runs [`bench_role_upstream_thread`] once, which names it in a callgrind file), and
//! `server_cpu_ticks` counts only `server*` threads anyway.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use gatehouse::config::UpstreamConfig;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use tokio::runtime::Runtime;

/// Runs once at the start of every thread of the load client's runtime: a symbol that
/// `bench/callgrind_tls.sh` finds in that thread's callgrind file, to leave it out of the
/// gateway's count. (`role::Client`, which bench/callgrind.sh looks for, is hyper's client
/// role: the gateway's own threads run it too once its upstream is an HTTP one.)
#[inline(never)]
pub fn bench_role_client_thread() {
    // Distinct bodies, so that the two markers are not merged into one symbol.
    std::hint::black_box(0xc11e_u32);
}

/// As [`bench_role_client_thread`], for the in-process upstream's threads.
#[inline(never)]
pub fn bench_role_upstream_thread() {
    std::hint::black_box(0x0b57_u64);
}

/// The upstream's runtime: one worker, threads named `upstream` (not `server*`).
pub fn upstream_runtime() -> Result<Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("upstream")
        .on_thread_start(bench_role_upstream_thread)
        .enable_all()
        .build()?)
}

/// The rows these upstreams serve, named as `--targets` selects them (lower case).
pub const HTTP_ROW: &str = "gateway → http upstream, Streamable HTTP";
pub const HTTPS_ROW: &str = "gateway → https upstream, Streamable HTTP";

/// Which of the two rows `--targets` asks for (an entry containing "http upstream",
/// "https upstream"): (http, https).
pub fn wanted(targets: &[String]) -> (bool, bool) {
    let has = |s: &str| targets.iter().any(|t| t.contains(s));
    (has("http upstream"), has("https upstream"))
}

/// The upstreams asked for, started; their rows and the gateway's upstream configs (`plain`
/// over http, `https` over https with `tls_ca_file`). The servers live as long as `rt`.
pub fn start(
    rt: &Runtime,
    dir: &Path,
    (http, https): (bool, bool),
) -> Result<Vec<(&'static str, UpstreamConfig)>> {
    let mut ups = Vec::new();
    if http {
        let addr = rt.block_on(serve(None))?;
        let up = serde_json::from_value(json!({
            "id": "plain", "url": format!("http://{addr}/mcp"),
        }))?;
        ups.push((HTTP_ROW, up));
    }
    if https {
        let pki = make_pki(&dir.join("pki"))?;
        let addr = rt.block_on(serve(Some(server_config(&pki)?)))?;
        let up = serde_json::from_value(json!({
            "id": "https", "url": format!("https://{addr}/mcp"),
            "tls_ca_file": pki.ca,
        }))?;
        ups.push((HTTPS_ROW, up));
    }
    Ok(ups)
}

struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A CA and a server certificate for 127.0.0.1 signed by it (EC P-256), made with the
/// `openssl` command (OpenSSL 3), valid for two days.
fn make_pki(dir: &Path) -> Result<Pki> {
    std::fs::create_dir_all(dir)?;
    let p = |name: &str| dir.join(name);
    let ext = p("leaf.ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )?;
    let s = |name: &str| p(name).to_string_lossy().into_owned();
    let (ca_key, ca_pem, leaf_key, leaf_csr, leaf_pem, ext) = (
        s("ca.key"),
        s("ca.pem"),
        s("leaf.key"),
        s("leaf.csr"),
        s("leaf.pem"),
        ext.to_string_lossy().into_owned(),
    );
    const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let steps: [Vec<&str>; 3] = [
        [
            &["req", "-x509", "-nodes"][..],
            &EC,
            &["-keyout", &ca_key, "-out", &ca_pem],
        ]
        .concat(),
        [
            &["req", "-nodes"][..],
            &EC,
            &["-keyout", &leaf_key, "-out", &leaf_csr],
        ]
        .concat(),
        vec![
            "x509",
            "-req",
            "-in",
            &leaf_csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-set_serial",
            "2",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &leaf_pem,
        ],
    ];
    let extra: [&[&str]; 3] = [
        &[
            "-days",
            "2",
            "-subj",
            "/CN=gatehouse bench CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        &["-subj", "/CN=127.0.0.1"],
        &[],
    ];
    for (args, extra) in steps.iter().zip(extra) {
        let out = Command::new("openssl")
            .args(args)
            .args(extra)
            .output()
            .context(
            "the HTTPS upstream row needs the `openssl` command (Debian: apt-get install openssl)",
        )?;
        if !out.status.success() {
            bail!(
                "openssl {:?}: {}",
                args.first(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(Pki {
        ca: p("ca.pem"),
        cert: p("leaf.pem"),
        key: p("leaf.key"),
    })
}

fn server_config(pki: &Pki) -> Result<Arc<rustls::ServerConfig>> {
    let chain = CertificateDer::pem_file_iter(&pki.cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&pki.key)?;
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    // No resumption: every handshake is a full one (x25519 and the certificate's ECDSA check),
    // so that two runs with the same number of handshakes (bench/callgrind_tls.sh checks it)
    // did the same handshake work, however the pooled connections raced for a ticket.
    let mut cfg = cfg;
    cfg.send_tls13_tickets = 0;
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(Arc::new(cfg))
}

/// Serves the echo server on 127.0.0.1 (TLS when `tls` is given); answers with one JSON body.
async fn serve(tls: Option<Arc<rustls::ServerConfig>>) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(answer);
                let http = hyper::server::conn::http1::Builder::new();
                match acceptor {
                    Some(a) => {
                        if let Ok(s) = a.accept(stream).await {
                            let _ = http.serve_connection(TokioIo::new(s), svc).await;
                        }
                    }
                    None => {
                        let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                    }
                }
            });
        }
    });
    Ok(addr)
}

fn reply(status: u16, body: Option<Value>) -> http::Response<Full<Bytes>> {
    let mut b = http::Response::builder().status(status);
    let body = match body {
        Some(v) => {
            b = b.header("content-type", "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    b.body(Full::new(body)).unwrap()
}

/// One POSTed JSON-RPC message, answered as `gatehouse echo-upstream` answers it on stdio
/// (the same tool and results); notifications and responses get 202, a DELETE 200.
async fn answer(req: Request<Incoming>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    match *req.method() {
        http::Method::POST => {}
        http::Method::DELETE => return Ok(reply(200, None)),
        _ => return Ok(reply(405, None)),
    }
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        return Ok(reply(400, None));
    };
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return Ok(reply(400, None));
    };
    let (Some(id), Some(method)) = (msg.get("id"), msg.get("method").and_then(Value::as_str))
    else {
        return Ok(reply(202, None));
    };
    let params = msg.get("params");
    let result = match method {
        "initialize" => Ok(json!({
            "protocolVersion": params
                .and_then(|p| p.get("protocolVersion"))
                .cloned()
                .unwrap_or(json!("2025-06-18")),
            "capabilities": { "tools": {} },
            "serverInfo": { "name": "gatehouse-bench-http-echo", "version": "0" },
        })),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": [{
            "name": "echo",
            "description": "Return the message unchanged.",
            "inputSchema": {
                "type": "object",
                "properties": { "message": { "type": "string" } },
                "required": ["message"],
                "additionalProperties": false
            },
            "annotations": { "readOnlyHint": true, "openWorldHint": false }
        }] })),
        "tools/call" => {
            let message = params
                .and_then(|p| p.get("arguments"))
                .and_then(|a| a.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("");
            Ok(json!({ "content": [{ "type": "text", "text": message }], "isError": false }))
        }
        other => Err(json!({ "code": -32601, "message": format!("Method not found: {other}") })),
    };
    let body = match result {
        Ok(r) => json!({ "jsonrpc": "2.0", "id": id, "result": r }),
        Err(e) => json!({ "jsonrpc": "2.0", "id": id, "error": e }),
    };
    Ok(reply(200, Some(body)))
}
