//! The console's static files, embedded in the binary (no build chain, no CDN), and the
//! headers every one of them is served with: a strict Content-Security-Policy (no inline
//! script or style, no eval, nothing from another origin), no framing, no sniffing, no cache,
//! no referrer.

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/console.js");

/// The files under `/ui/`: name, content type, body.
const FILES: [(&str, &str, &str); 3] = [
    ("console.js", "text/javascript; charset=utf-8", SCRIPT),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("ui/console.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("ui/favicon.svg"),
    ),
];

/// The page's policy: its own script and style only, images from itself or `data:`, fetches
/// to its own origin, never framed, no `<base>`, no form submission.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The headers of every `/ui` response (the 404 under `/ui/` included).
fn with_headers(status: StatusCode, content_type: &'static str, body: &'static str) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    r
}

async fn index() -> Response {
    with_headers(StatusCode::OK, "text/html; charset=utf-8", INDEX)
}

/// A file of [`FILES`] by name; 404 (with the same headers) for any other path under `/ui/`.
async fn file(uri: axum::http::Uri) -> Response {
    let name = uri.path().strip_prefix("/ui/").unwrap_or_default();
    match FILES.iter().find(|(n, ..)| *n == name) {
        Some((_, content_type, body)) => with_headers(StatusCode::OK, content_type, body),
        None => with_headers(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n",
        ),
    }
}

/// The public routes of the console: the page and its three files. For the admin router
/// only (never the data listener); merged outside the admin token check, since the page is
/// the login itself and holds no data.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/{*name}", get(file))
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_no_inline_script_style_or_handler() {
        let lower = INDEX.to_ascii_lowercase();
        // One script, by URL; no inline code, no inline style, no event attribute.
        assert_eq!(lower.matches("<script").count(), 1);
        assert!(lower.contains("<script src=\"/ui/console.js\" defer></script>"));
        assert!(!lower.contains("style="));
        assert!(!lower.contains("<style"));
        for handler in [
            "onclick", "onload", "onerror", "onsubmit", "oninput", "onchange", "onfocus",
        ] {
            assert!(!lower.contains(handler), "{handler}");
        }
        assert!(!lower.contains("javascript:"));
        // The script never parses data as HTML nor evaluates text.
        for banned in [
            "innerhtml",
            "outerhtml",
            "insertadjacenthtml",
            "eval(",
            "new function",
            "document.write",
        ] {
            assert!(!SCRIPT.to_ascii_lowercase().contains(banned), "{banned}");
        }
    }
}
