//! How the CLI verbs reach the admin API: `--admin-url` / `GATEHOUSE_ADMIN_URL` (default: the
//! config's `admin_listen`), and the admin token from `GATEHOUSE_ADMIN_TOKEN` or the config's
//! `admin_token_file` (written by `gatehouse serve`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use crate::config_load;

#[derive(Debug, Args, Clone)]
pub struct AdminConn {
    /// Admin API base URL. Default: $GATEHOUSE_ADMIN_URL, else http://<admin_listen of the config>.
    #[arg(long)]
    pub admin_url: Option<String>,
    /// Config whose admin_listen and admin_token_file are used.
    /// Default: $GATEHOUSE_CONFIG, else config/gatehouse.toml.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// A resolved admin endpoint.
pub struct AdminClient {
    base: String,
    token: String,
    http: reqwest::Client,
}

/// The reply of an admin call: status and JSON body (`Null` when empty).
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    /// The server's `error` message, or the status.
    pub fn message(&self) -> String {
        self.body
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("HTTP {}", self.status))
    }
}

impl AdminConn {
    /// A verb that is one exchange answering 200 (`body`: the request's JSON, if any):
    /// `show` is given the reply; any other answer is the error (`verb: message`) and a
    /// failing exit.
    pub fn run_ok(
        &self,
        verb: &str,
        (method, path, body): (reqwest::Method, &str, Option<Value>),
        show: impl FnOnce(Reply) -> Result<(), String>,
    ) -> std::process::ExitCode {
        block_on(async {
            let r = self.client()?.call(method, path, body.as_ref()).await?;
            if r.status != 200 {
                return Err(format!("{verb}: {}", r.message()));
            }
            show(r)
        })
    }

    pub fn client(&self) -> Result<AdminClient, String> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let url = self
            .admin_url
            .clone()
            .or_else(|| env("GATEHOUSE_ADMIN_URL"));
        let token = env("GATEHOUSE_ADMIN_TOKEN");
        let config = if url.is_none() || token.is_none() {
            let path = config_load::resolve_path(self.config.clone());
            Some(config_load::load(&path).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let base = match (url, &config) {
            (Some(u), _) => u,
            (None, Some(c)) => format!("http://{}", c.admin_listen),
            (None, None) => return Err("no admin URL".into()),
        };
        let token = match (token, &config) {
            (Some(t), _) => t,
            (None, Some(c)) => std::fs::read_to_string(&c.admin_token_file)
                .map(|t| t.trim().to_string())
                .map_err(|e| {
                    format!(
                        "no admin token: GATEHOUSE_ADMIN_TOKEN is unset and {} cannot be read ({e})",
                        c.admin_token_file.display()
                    )
                })?,
            (None, None) => return Err("no admin token".into()),
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(AdminClient {
            base: base.trim_end_matches('/').to_string(),
            token,
            http,
        })
    }
}

impl AdminClient {
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("cannot reach the admin API at {}: {e}", self.base))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        Ok(Reply { status, body })
    }
}

/// Runs one admin exchange on a small runtime; prints errors; maps them to exit code 1.
pub fn block_on<F>(f: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<(), String>>,
{
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gatehouse: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(f) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gatehouse: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Parses a duration: `600`, `90s`, `10m`, `2h`, `1d` → seconds.
pub fn parse_ttl(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a duration like 600, 90s, 10m, 2h"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: unit must be s, m, h or d")),
    };
    match n.checked_mul(mult) {
        Some(v) if v > 0 => Ok(v),
        _ => Err(format!("{s:?}: must be positive")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_ttl;

    #[test]
    fn ttl_units() {
        assert_eq!(parse_ttl("600"), Ok(600));
        assert_eq!(parse_ttl("90s"), Ok(90));
        assert_eq!(parse_ttl("10m"), Ok(600));
        assert_eq!(parse_ttl("2h"), Ok(7200));
        assert!(parse_ttl("0").is_err());
        assert!(parse_ttl("5x").is_err());
        assert!(parse_ttl("m").is_err());
    }
}
