//! TLS for the gateway's outgoing HTTPS (issue 46): HTTP upstreams and the OTLP exporter.
//!
//! rustls with the `ring` provider, in every build (no OpenSSL). The roots are the platform's
//! (rustls-native-certs: `SSL_CERT_FILE` / `SSL_CERT_DIR` when set, else the system store),
//! loaded once per process; an upstream's `tls_ca_file` replaces them for that upstream (a
//! private CA, as `curl --cacert` does). `tls_client_cert_file` + `tls_client_key_file` give a
//! client certificate (mTLS); `tls_server_name` is the name the certificate is checked
//! against instead of the URL's host (the connection still goes to the URL's address, and
//! SNI still carries the URL's host name when it is one). Nothing turns verification off.
//!
//! A TLS failure is found by walking the error's source chain to the rustls error, and named
//! (unknown issuer, name mismatch, expired, client certificate refused) with what to fix.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::config::UpstreamTls;

/// The platform's roots, loaded at first use (a few ms: the system bundle is parsed).
fn platform_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let loaded = rustls_native_certs::load_native_certs();
            for err in &loaded.errors {
                tracing::warn!(error = %err, "some of the platform's TLS roots could not be read");
            }
            let mut store = RootCertStore::empty();
            let (added, ignored) = store.add_parsable_certificates(loaded.certs);
            if added == 0 {
                tracing::warn!(ignored, "no platform TLS roots found (set SSL_CERT_FILE or a tls_ca_file): HTTPS to public hosts will fail with an unknown issuer");
            }
            Arc::new(store)
        })
        .clone()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client config trusting the platform's roots (the OTLP exporter).
pub fn platform_client_config() -> Result<ClientConfig, String> {
    build(&UpstreamTls::default())
}

/// Reads a PEM file of certificates; the error names the key and says what to fix.
fn read_certs(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "{key} = {:?}: cannot read it ({e}): fix the path",
            path.display()
        )
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{key} = {:?}: not a PEM file ({e})", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{key} = {:?}: holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")",
            path.display()
        ));
    }
    Ok(certs)
}

/// The rustls config of an upstream's TLS settings (`UpstreamTls::default()`: the platform's
/// roots, no client certificate). Reads the files each time: a replaced certificate is used
/// by the next connection. Errors name the key at fault and say what to fix.
pub fn build(tls: &UpstreamTls) -> Result<ClientConfig, String> {
    let provider = provider();
    let roots = match &tls.ca_file {
        None => platform_roots(),
        Some(path) => {
            let mut store = RootCertStore::empty();
            for cert in read_certs("tls_ca_file", path)? {
                store.add(cert).map_err(|e| {
                    format!(
                        "tls_ca_file = {:?}: a certificate in it is not a usable CA ({e})",
                        path.display()
                    )
                })?;
            }
            Arc::new(store)
        }
    };
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| format!("the TLS verifier cannot be built: {e}"))?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("the TLS config cannot be built: {e}"))?;
    let builder = match &tls.server_name {
        None => builder.with_webpki_verifier(verifier),
        Some(name) => {
            let name = ServerName::try_from(name.clone())
                .map_err(|_| format!("tls_server_name = {name:?}: not a DNS name or IP address"))?;
            // Full verification, against the configured name instead of the URL's host.
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NamedVerifier {
                    inner: verifier,
                    name,
                }))
        }
    };
    match (&tls.client_cert_file, &tls.client_key_file) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let certs = read_certs("tls_client_cert_file", cert)?;
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                format!(
                    "tls_client_key_file = {:?}: no PEM private key read from it ({e}): fix the path or the file",
                    key.display()
                )
            })?;
            builder.with_client_auth_cert(certs, key_der).map_err(|e| {
                format!(
                    "tls_client_cert_file/tls_client_key_file: the key does not fit the certificate or is not supported ({e})"
                )
            })
        }
        _ => Err("tls_client_cert_file and tls_client_key_file go together: set both".into()),
    }
}

/// Whether an upstream asked for a client certificate in a handshake (one per transport):
/// an upstream that requires one and gets none may close the connection without an alert
/// (TLS 1.3: the client's handshake is already done), which is then named by this.
#[derive(Debug, Clone, Default)]
pub struct ClientCertAsked(Arc<AtomicBool>);

impl ClientCertAsked {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The configured client-certificate resolver, noting that the server asked.
#[derive(Debug)]
struct AskedResolver {
    inner: Arc<dyn ResolvesClientCert>,
    asked: ClientCertAsked,
}

impl ResolvesClientCert for AskedResolver {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.asked.0.store(true, Ordering::Relaxed);
        self.inner.resolve(root_hint_subjects, sigschemes)
    }

    fn only_raw_public_keys(&self) -> bool {
        self.inner.only_raw_public_keys()
    }

    fn has_certs(&self) -> bool {
        self.inner.has_certs()
    }
}

/// [`build`], noting whether the server asks for a client certificate.
pub fn build_observed(tls: &UpstreamTls) -> Result<(ClientConfig, ClientCertAsked), String> {
    let mut config = build(tls)?;
    let asked = ClientCertAsked::default();
    config.client_auth_cert_resolver = Arc::new(AskedResolver {
        inner: config.client_auth_cert_resolver.clone(),
        asked: asked.clone(),
    });
    Ok((config, asked))
}

/// The failure of a connection whose server asked for a client certificate and then closed
/// it before any answer (no alert to name the cause): `has_cert`, whether one is configured.
pub fn client_cert_refused(has_cert: bool, err: &(dyn std::error::Error + 'static)) -> String {
    let seen = chain(err);
    if has_cert {
        format!("client certificate refused by the upstream: it asked for our client certificate (tls_client_cert_file) and then closed the connection ({seen}); check that the upstream trusts the certificate's issuer and that it is still valid")
    } else {
        format!("client certificate refused by the upstream: it asked for a client certificate, none is configured, and it closed the connection ({seen}); set tls_client_cert_file and tls_client_key_file to a certificate the upstream trusts")
    }
}

/// The webpki verifier, checking the certificate against `name` whatever the URL's host.
#[derive(Debug)]
struct NamedVerifier {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for NamedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The rustls error somewhere in `err`'s source chain. An `io::Error` wrapping another error is
/// looked into (its `source()` skips the wrapped error itself), nested ones too: hyper-rustls
/// wraps tokio-rustls's `io::Error` around the rustls error in another `io::Error`.
fn rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    // Bounded: a chain is a handful of links.
    for _ in 0..32 {
        let e = cur?;
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        cur = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// `err` and its sources, `: `-joined (reqwest's own message is "error sending request").
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    for _ in 0..16 {
        let Some(e) = cur else { break };
        let s = e.to_string();
        if !out.ends_with(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

/// A TLS failure in `err`'s source chain, named with what to fix; `None` when the failure is
/// not TLS. `host` is the name the certificate was checked against.
pub fn describe_failure(err: &(dyn std::error::Error + 'static), host: &str) -> Option<String> {
    use rustls::AlertDescription as A;
    let tls = rustls_error(err)?;
    let text = match tls {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer => "unknown issuer: the upstream's certificate is not signed by a CA this gateway trusts; set tls_ca_file to the CA that signed it (or add that CA to the system store / SSL_CERT_FILE)".to_owned(),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => format!("name mismatch: the upstream's certificate is not valid for {host:?} ({cert}); use a URL with a name the certificate carries, or set tls_server_name to it"),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => format!("expired: the upstream's certificate has expired ({cert}); renew it on the upstream (or fix this machine's clock)"),
            CertificateError::BadSignature => "bad signature: the upstream's certificate does not verify against the trusted CA of its issuer's name (a different CA of the same name?); set tls_ca_file to the CA that signed it".to_owned(),
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => format!("not yet valid: the upstream's certificate is not valid yet ({cert}); check this machine's clock and the certificate's dates"),
            other => format!("certificate refused: {other}; fix the upstream's certificate or tls_ca_file"),
        },
        rustls::Error::AlertReceived(
            A::CertificateRequired | A::BadCertificate | A::UnknownCA | A::CertificateUnknown | A::AccessDenied | A::UnsupportedCertificate | A::CertificateRevoked | A::CertificateExpired,
        ) => format!("client certificate refused by the upstream ({tls}); set tls_client_cert_file and tls_client_key_file to a certificate the upstream trusts"),
        other => format!("TLS handshake failed: {other}"),
    };
    Some(text)
}
